//! Reception: the receive buffers, the sockets of joined multicast groups, and draining
//! the sockets into the engine (by a polling thread or by the engine thread).

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;

use socket2::{Domain, Protocol, Socket, Type};

use super::{SOCKET_BUFFER, Shared, clock, pcap, sys};
use crate::error::VerbsError;

/// An idle poll releases ACKs held at least this long (see `Nic::flush_acks`).
const ACK_IDLE_NS: u64 = 50_000;

/// A socket receiving one multicast group on one port.
#[derive(Debug)]
pub(super) struct GroupSock {
    ip: IpAddr,
    port: usize,
    pub(super) sock: UdpSocket,
    /// QPs of this device attached to the group through this port.
    refs: usize,
}

/// Receive buffers, used by whichever thread is draining the sockets.
#[derive(Debug)]
pub(super) struct RxState {
    pub(super) bufs: Vec<Vec<u8>>,
    pub(super) scratch: sys::RecvScratch,
    pub(super) batch: Vec<sys::Received>,
    /// (port, source, destination, buffer, offset, length) of every datagram read.
    pub(super) got: Vec<(usize, SocketAddr, IpAddr, usize, usize, usize)>,
    /// (port, destination address, fd) of every socket to read.
    pub(super) sources: Vec<(usize, IpAddr, RawFd)>,
    /// The last read found more than one datagram: read in batches (`recvmmsg`) until a
    /// batch comes back with at most one, then go back to single, cheaper `recvmsg` calls.
    pub(super) burst: bool,
}

impl Shared {
    /// Makes port `port` receive multicast group `group` (one socket per group and port,
    /// bound to `group:4791` with address reuse, so several devices on a host each get a
    /// copy, spec §1.6). Reference counted per attached QP.
    pub(crate) fn join_group(&self, port: usize, group: IpAddr) -> Result<(), VerbsError> {
        let io = |op| move |source| VerbsError::Io { op, source };
        let mut groups = self.groups.lock();
        if let Some(g) = groups.iter_mut().find(|g| g.ip == group && g.port == port) {
            g.refs += 1;
            return Ok(());
        }
        let local = *self
            .addrs
            .get(port)
            .ok_or(VerbsError::NoSuchObject("port"))?;
        let (IpAddr::V4(g4), IpAddr::V4(l4)) = (group, local.ip()) else {
            return Err(VerbsError::Unsupported("IPv6 multicast groups"));
        };
        let s =
            Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).map_err(io("socket"))?;
        s.set_reuse_address(true).map_err(io("SO_REUSEADDR"))?;
        let bind_to = SocketAddr::new(group, crate::soft::wire::ROCE_UDP_PORT);
        s.bind(&bind_to.into())
            .map_err(io("bind multicast group"))?;
        s.join_multicast_v4(&g4, &l4)
            .map_err(io("IP_ADD_MEMBERSHIP"))?;
        s.set_nonblocking(true).map_err(io("set_nonblocking"))?;
        sys::set_buffers(s.as_raw_fd(), SOCKET_BUFFER);
        groups.push(GroupSock {
            ip: group,
            port,
            sock: s.into(),
            refs: 1,
        });
        self.group_count.store(groups.len(), Ordering::Relaxed);
        drop(groups);
        // The engine thread must add the new socket to its poll set.
        self.wake.signal();
        Ok(())
    }

    /// Drops one reference to a joined group; the socket closes (leaving the group) with the
    /// last one.
    pub(crate) fn leave_group(&self, port: usize, group: IpAddr) {
        let mut groups = self.groups.lock();
        if let Some(i) = groups.iter().position(|g| g.ip == group && g.port == port) {
            groups[i].refs -= 1;
            if groups[i].refs == 0 {
                groups.swap_remove(i);
            }
        }
        self.group_count.store(groups.len(), Ordering::Relaxed);
    }

    /// Reads up to a batch of datagrams from every socket (non-blocking) and runs them and
    /// any due timers through the engine. Returns the number of datagrams handled. Only one
    /// thread drains at a time; others return 0 at once.
    pub(super) fn drain(&self) -> usize {
        self.drain_at(self.now())
    }

    /// [`drain`](Self::drain) with the time already read by the caller (one clock read per
    /// poll: on this VM a read costs about a tenth of an empty poll).
    pub(super) fn drain_at(&self, now: u64) -> usize {
        let Some(mut rx) = self.rx.try_lock() else {
            return 0;
        };
        let RxState {
            bufs,
            scratch,
            batch,
            got,
            sources,
            burst,
        } = &mut *rx;
        got.clear();
        sources.clear();
        for (port, sock) in self.sockets.iter().enumerate() {
            sources.push((port, self.addrs[port].ip(), sock.as_raw_fd()));
        }
        if self.group_count.load(Ordering::Relaxed) > 0 {
            for g in self.groups.lock().iter() {
                sources.push((g.port, g.ip, g.sock.as_raw_fd()));
            }
        }
        let mut slot = 0;
        let mut emptied = true;
        for &(port, dst, fd) in sources.iter() {
            if slot == bufs.len() {
                emptied = false;
                break;
            }
            batch.clear();
            let room = bufs.len() - slot;
            let n = if *burst {
                let n = sys::recv_batch(fd, &mut bufs[slot..], scratch, batch).unwrap_or(0);
                *burst = n > 1;
                n
            } else {
                match sys::recv_one(fd, &mut bufs[slot]) {
                    Ok(Some(r)) => {
                        batch.push(r);
                        *burst = true;
                        1
                    }
                    _ => 0,
                }
            };
            if n == room {
                emptied = false;
            }
            for (k, &(len, src, seg)) in batch.iter().enumerate() {
                if len == 0 {
                    // An empty datagram: still handed to the engine, which counts it.
                    got.push((port, src, dst, slot + k, 0, 0));
                }
                let mut off = 0;
                while off < len {
                    let n = seg.min(len - off);
                    got.push((port, src, dst, slot + k, off, n));
                    off += n;
                }
            }
            slot += n;
        }
        let mut nic = self.nic.lock();
        if got.is_empty() {
            // An idle poll: nothing more to coalesce with, so acknowledge now (doing it here,
            // not right after the packets were handled, keeps the ACK off the latency path:
            // the application sees its completion, and may answer, first). Then timers.
            let acks = emptied && nic.has_held_acks();
            if acks {
                nic.flush_acks(now, ACK_IDLE_NS);
            }
            let due = nic.poll_timeout().is_some_and(|t| t <= now);
            if due {
                nic.handle_timeout(now);
            }
            drop(rx);
            if acks || due {
                self.flush(nic, now);
            }
            return 0;
        }
        let pcap = pcap();
        let ts = pcap.is_some().then(clock::wall);
        let mut handled = 0;
        for &(port, src, dst, b, off, len) in got.iter() {
            let data = &bufs[b][off..off + len];
            if let (Some(p), Some(ts)) = (pcap, ts) {
                let to = SocketAddr::new(dst, crate::soft::wire::ROCE_UDP_PORT);
                let _ = p.lock().write_frame(ts, src, to, data);
            }
            match &self.faults {
                Some(f) => f.lock().handle_frame(now, (port, src, dst), data),
                None => {
                    nic.handle_datagram(now, port, src, dst, data);
                    handled += 1;
                }
            }
        }
        if let Some(f) = &self.faults {
            let mut f = f.lock();
            while let Some(((port, src, dst), frame)) = f.poll_frame(now) {
                nic.handle_datagram(now, port, src, dst, &frame);
                handled += 1;
            }
        }
        if nic.poll_timeout().is_some_and(|t| t <= now) {
            nic.handle_timeout(now);
        }
        let read = got.len();
        drop(rx);
        self.flush(nic, now);
        handled.max(read)
    }
}
