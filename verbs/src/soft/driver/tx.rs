//! Transmission: sending what the engine produced, in order and in GSO batches where
//! possible, and turning send results into port state changes.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Weak;
use std::sync::atomic::Ordering;

use parking_lot::MutexGuard;

use super::{Shared, clock, pcap, sys};
use crate::soft::engine::Nic;

/// Largest UDP payload we send or accept (4096 MTU + headers + pad + ICRC, rounded up).
const MAX_PACKET: usize = 4096 + 256;
/// Largest GSO batch: segments and bytes.
const GSO_MAX_SEGS: usize = 64;
const GSO_MAX_BYTES: usize = 65_000;

/// Packets collected under the NIC lock and sent after it is released (in order).
#[derive(Debug, Default)]
pub(super) struct TxBatch {
    bufs: Vec<Vec<u8>>,
    meta: Vec<(usize, SocketAddr, usize)>,
}

/// Send errors that mean the port's link or route is gone (not a transient buffer shortage).
fn is_link_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENETUNREACH | libc::ENETDOWN | libc::EHOSTUNREACH | libc::EADDRNOTAVAIL)
    )
}

impl Shared {
    /// Drains everything the NIC has produced and sends the packets, in order, after
    /// releasing the NIC lock (the TX lock keeps the order between threads).
    pub(super) fn flush(&self, mut nic: MutexGuard<'_, Nic>, now: u64) {
        // Everything the NIC has, held posts included, leaves now.
        self.doorbell.clear();
        let mut tx = self.tx.lock();
        let mut n = 0;
        loop {
            if tx.bufs.len() <= n {
                tx.bufs.push(vec![0u8; MAX_PACKET]);
            }
            let Some(t) = nic.poll_transmit(now, &mut tx.bufs[n]) else {
                break;
            };
            tx.meta.push((t.port, t.dst, t.len));
            n += 1;
        }
        let mut notify = Vec::new();
        while let Some(cq) = nic.poll_cq_notify() {
            notify.push(cq);
        }
        let mut events = Vec::new();
        while let Some(e) = nic.poll_event() {
            events.push(e);
        }
        let hosting = self.xrc.hosting();
        let mut forwarded = Vec::new();
        if hosting {
            nic.take_forwarded(&mut forwarded);
        }
        drop(nic);
        let pcap = pcap();
        let TxBatch { bufs, meta } = &mut *tx;
        if let Some(p) = pcap {
            let ts = clock::wall();
            let mut p = p.lock();
            for (i, &(port, dst, len)) in meta.iter().enumerate() {
                let src = self.addrs[port];
                let dst4791 = SocketAddr::new(dst.ip(), crate::soft::wire::ROCE_UDP_PORT);
                let _ = p.write_frame(ts, src, dst4791, &bufs[i][..len]);
            }
        }
        // Ports whose sends worked / failed for lack of a route or link (bit per port).
        let (mut sent_ok, mut link_err) = (0u64, 0u64);
        if let Some(net) = &self.sim {
            for (k, &(port, dst, len)) in meta.iter().enumerate() {
                net.send(self.addrs[port], dst, &bufs[k][..len]);
            }
            meta.clear();
        }
        let mut i = 0;
        while i < meta.len() {
            let (port, dst, len) = meta[i];
            // A run of packets to one destination, all of one size but the last: one GSO
            // send (every segment is a complete RoCE packet).
            let mut j = i + 1;
            let mut total = len;
            if self.gso.load(Ordering::Relaxed) {
                while j < meta.len()
                    && j - i < GSO_MAX_SEGS
                    && meta[j].0 == port
                    && meta[j].1 == dst
                    && meta[j].2 <= len
                    && total + meta[j].2 <= GSO_MAX_BYTES
                {
                    total += meta[j].2;
                    j += 1;
                    if meta[j - 1].2 < len {
                        break;
                    }
                }
            }
            let Some(sock) = self.sockets.get(port) else {
                i = j;
                continue;
            };
            if j - i >= 2 {
                let segs: Vec<&[u8]> = (i..j).map(|k| &bufs[k][..meta[k].2]).collect();
                let to = socket2::SockAddr::from(dst);
                match sys::send_gso(sock.as_raw_fd(), &to, &segs, len as u16) {
                    Ok(_) => {
                        sent_ok |= 1 << port.min(63);
                        i = j;
                        continue;
                    }
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) => {
                        tracing::debug!("UDP GSO unavailable ({e}); sending packets one by one");
                        self.gso.store(false, Ordering::Relaxed);
                    }
                    Err(_) => {}
                }
            }
            for k in i..j {
                match sock.send_to(&bufs[k][..meta[k].2], meta[k].1) {
                    Ok(_) => sent_ok |= 1 << port.min(63),
                    Err(e) => {
                        self.tx_errors.fetch_add(1, Ordering::Relaxed);
                        if is_link_error(&e) {
                            // A routing error is a port failure only when the port's own
                            // link is down; otherwise this destination is unreachable.
                            let down = self
                                .ifnames
                                .get(port)
                                .and_then(Option::as_deref)
                                .is_some_and(sys::interface_link_down);
                            if down {
                                link_err |= 1 << port.min(63);
                            } else {
                                self.tx_unreachable.fetch_add(1, Ordering::Relaxed);
                            }
                        } else if e.raw_os_error() == Some(libc::EMSGSIZE) {
                            tracing::warn!(
                                port = port + 1,
                                len = meta[k].2,
                                "packet larger than the link MTU (path MTU above the port's \
                                 active MTU?); dropped"
                            );
                        }
                    }
                }
            }
            i = j;
        }
        meta.clear();
        // Still under the TX lock, so forwarded completions keep the NIC's order.
        if hosting && (!forwarded.is_empty() || !events.is_empty()) {
            self.xrc.forward(&mut forwarded, &mut events);
        }
        drop(tx);
        self.track_ports(sent_ok & !link_err, link_err, now);
        if !notify.is_empty() {
            let chans = self.channels.lock();
            for cq in notify {
                if let Some(ch) = chans.get(&cq).and_then(Weak::upgrade) {
                    ch.ready.lock().push_back(cq);
                    ch.fd.signal();
                }
            }
        }
        if !events.is_empty() {
            for e in &events {
                tracing::debug!(?e, "async event");
            }
            self.events.lock().extend(events);
            self.event_fd.signal();
        }
    }

    /// Turns send results into port state changes: a port whose sends fail with a link or
    /// routing error goes down (`PortError`, and QPs with an armed alternate migrate at
    /// once); a down port whose sends work again comes back (`PortActive`).
    pub(super) fn track_ports(&self, ok: u64, failed: u64, now: u64) {
        let mut changed = Vec::new();
        for port in 0..self.addrs.len().min(64) {
            let bit = 1u64 << port;
            let was_down = self.port_down.load(Ordering::Relaxed) & bit != 0;
            if failed & bit != 0 && !was_down {
                self.port_down.fetch_or(bit, Ordering::Relaxed);
                changed.push((port, false));
            } else if ok & bit != 0 && was_down {
                self.port_down.fetch_and(!bit, Ordering::Relaxed);
                changed.push((port, true));
            }
        }
        if changed.is_empty() {
            return;
        }
        let mut nic = self.nic.lock();
        for (port, up) in changed {
            tracing::info!(port = port + 1, up, "soft port state changed");
            if up {
                nic.handle_port_up(port);
            } else {
                nic.handle_port_down(now, port);
            }
        }
        self.flush(nic, now);
    }
}
