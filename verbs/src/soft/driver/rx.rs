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

/// A read of at least this many datagrams is a burst (switches UDP GRO on). A ping-pong can
/// find a request, an ACK and a credit write queued together: three is no stream.
const GRO_BURST: usize = 4;
/// While UDP GRO is on, a port socket with no burst for this long switches it off.
const GRO_IDLE_NS: u64 = 2_000_000;
/// After GRO goes off, datagrams are checked for batches coalesced before the switch (see
/// [`blind_segment`]) until a read finds the socket empty at least this long after it (a
/// batch being coalesced as the switch happens can be queued a little after it: the check
/// and the enqueue are not atomic with `setsockopt`).
const GRO_GRACE_NS: u64 = 1_000_000;

/// How one port's socket is read.
///
/// UDP GRO saves work when packets stream in (one read for up to 64 KiB of datagrams), but
/// a socket with GRO on must be read with `recvmsg` to learn the segment size, and on this
/// machine an empty `recvmsg` costs ~390 ns against ~275 ns for `recvfrom`. A busy poll is
/// mostly empty reads, and a ping-pong sees one packet at a time, so a port starts with GRO
/// off and reads with `recvfrom`. The first burst (a batched read returning at least
/// [`GRO_BURST`] datagrams, or a coalesced batch) switches GRO on; an empty read
/// [`GRO_IDLE_NS`] after the last burst switches it off again.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct PortRx {
    /// UDP GRO is on.
    gro: bool,
    /// The kernel refused UDP GRO: never ask again.
    no_gro: bool,
    /// While on: the last burst. While off: when it went off (0: never on).
    since: u64,
    /// GRO went off, and no read has found the socket empty since (after the grace): a
    /// batch coalesced before may still be queued.
    suspect: bool,
}

impl PortRx {
    /// Only `recvfrom` (blind to GRO batches) is chosen.
    fn plain(&self) -> bool {
        !self.gro
    }

    /// A datagram read without a segment size may be a batch (see [`blind_segment`]).
    fn suspect(&self) -> bool {
        self.suspect
    }

    /// A read returned `n` datagrams, `coalesced` of them GRO batches.
    fn read(&mut self, fd: RawFd, now: u64, n: usize, coalesced: bool) {
        if n >= GRO_BURST || coalesced {
            if !self.gro && !self.no_gro {
                if sys::set_gro(fd, true) {
                    self.gro = true;
                    // (While on, the kernel gives every batch's segment size, also of one
                    // coalesced before it went off.)
                    self.suspect = false;
                } else {
                    self.no_gro = true;
                    tracing::debug!("UDP GRO not available");
                }
            }
            if self.gro {
                self.since = now.max(1);
            }
        } else if n == 0 && self.gro && now.saturating_sub(self.since) >= GRO_IDLE_NS {
            // Switched at an empty read, off the latency path. If the kernel refuses, GRO
            // stays on and the next empty read tries again.
            if sys::set_gro(fd, false) {
                self.gro = false;
                self.since = now.max(1);
                self.suspect = true;
            }
        } else if n == 0 && self.suspect && now.saturating_sub(self.since) >= GRO_GRACE_NS {
            self.suspect = false;
        }
    }
}

/// The size of the packets of a GRO batch that the kernel returned as one datagram without
/// its segment size, or `None` when `data` is one packet (or a batch it cannot split).
///
/// A batch coalesced while a socket's UDP GRO was on and still queued when GRO goes off is
/// returned whole, and without the `UDP_GRO` control message, by `recvmsg` as by
/// `recvfrom`: the kernel reports segments only while GRO is on. Read as one packet, it
/// failed the ICRC check, and the sender retransmitted it after its ACK timeout (~134 ms;
/// found by a test running 100 KB rendezvous ping-pongs side by side in a debug build,
/// where readers are late enough for such a batch to wait in the queue).
///
/// A datagram whose ICRC holds is one packet. Otherwise, if it is a batch, it comes from one
/// GSO send: every packet but the last has the first one's size, its headers, a path-MTU
/// payload (at most `port_mtu`) and the ICRC; the MTU is the one for which that first
/// packet's ICRC holds. Only datagrams read while a port is suspect are looked at
/// ([`PortRx::suspect`]), so a stream pays nothing for this.
fn blind_segment(data: &[u8], src: SocketAddr, dst: IpAddr, port_mtu: usize) -> Option<usize> {
    use crate::soft::wire::{IcrcPath, PacketHeaders, ROCE_UDP_PORT, icrc};
    let path = IcrcPath::new(src, SocketAddr::new(dst, ROCE_UDP_PORT));
    if icrc::verify(&path, data) {
        return None;
    }
    let (_, payload) = PacketHeaders::parse(data).ok()?;
    let headers = (payload.as_ptr() as usize).checked_sub(data.as_ptr() as usize)?;
    [4096, 2048, 1024, 512, 256]
        .into_iter()
        .filter(|&mtu| mtu <= port_mtu)
        .find_map(|mtu| {
            let seg = headers + mtu + icrc::ICRC_LEN;
            (seg < data.len() && icrc::verify(&path, data.get(..seg)?)).then_some(seg)
        })
}

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
    /// batch comes back with at most one, then go back to single, cheaper calls.
    pub(super) burst: bool,
    /// How each port's socket is read (group sockets never have GRO on: always plain).
    pub(super) ports: Vec<PortRx>,
    /// Each port's active MTU in bytes (see [`blind_segment`]).
    pub(super) port_mtus: Vec<usize>,
}

impl Shared {
    /// Makes port `port` receive multicast group `group` (one socket per group and port,
    /// bound to `group:4791` with address reuse, so several devices on a host each get a
    /// copy, spec §1.6). Reference counted per attached QP.
    pub(crate) fn join_group(&self, port: usize, group: IpAddr) -> Result<(), VerbsError> {
        let io = |op| move |error| VerbsError::Io { op, error };
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
            ports,
            port_mtus,
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
        for (i, &(port, dst, fd)) in sources.iter().enumerate() {
            if slot == bufs.len() {
                emptied = false;
                break;
            }
            batch.clear();
            let room = bufs.len() - slot;
            // The first `ports.len()` sources are the port sockets, in order.
            let mut mode = ports.get_mut(i);
            let n = if *burst {
                let n = sys::recv_batch(fd, &mut bufs[slot..], scratch, batch).unwrap_or(0);
                *burst = n > 1;
                n
            } else {
                let plain = mode.as_ref().is_none_or(|m| m.plain());
                let got = if plain {
                    sys::recv_plain(fd, &mut bufs[slot])
                } else {
                    sys::recv_one(fd, &mut bufs[slot])
                };
                match got {
                    Ok(Some(r)) => {
                        batch.push(r);
                        *burst = true;
                        1
                    }
                    _ => 0,
                }
            };
            if let Some(m) = mode.as_mut() {
                let coalesced = batch.iter().any(|&(len, _, seg)| seg < len);
                m.read(fd, now, n, coalesced);
            }
            if n == room {
                emptied = false;
            }
            let suspect = mode.as_ref().is_some_and(|m| m.suspect());
            let mtu = port_mtus.get(port).copied().unwrap_or(4096);
            for (k, &(len, src, seg)) in batch.iter().enumerate() {
                // Soon after GRO went off, a datagram with no segment size may be a batch
                // coalesced before.
                let seg = match bufs.get(slot + k) {
                    Some(b) if suspect && seg >= len => {
                        blind_segment(b.get(..len).unwrap_or_default(), src, dst, mtu)
                            .unwrap_or(seg)
                    }
                    _ => seg,
                };
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

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    use std::net::SocketAddr;

    use super::{GRO_BURST, GRO_GRACE_NS, GRO_IDLE_NS, PortRx, blind_segment};
    use crate::soft::driver::sys;
    use crate::soft::wire::{
        BthRepr, IcrcPath, Opcode, PacketHeaders, ROCE_UDP_PORT, finish_packet,
    };

    /// Sends `count` datagrams of `seg` bytes as one GSO batch and returns what the
    /// receiving socket yields, read with `recvmsg` (which reports GRO segments) until the
    /// whole batch is in: (length, segment size) per read.
    fn gso_round(tx: &UdpSocket, rx: &UdpSocket, count: usize, seg: usize) -> Vec<(usize, usize)> {
        let payload: Vec<Vec<u8>> = (0..count).map(|i| vec![i as u8; seg]).collect();
        let slices: Vec<&[u8]> = payload.iter().map(Vec::as_slice).collect();
        let dst = socket2::SockAddr::from(rx.local_addr().unwrap());
        sys::send_gso(tx.as_raw_fd(), &dst, &slices, seg as u16).unwrap();
        let mut buf = vec![0u8; 65_536];
        let mut reads = Vec::new();
        let mut total = 0;
        for _ in 0..2_000 {
            if total == count * seg {
                break;
            }
            match sys::recv_one(rx.as_raw_fd(), &mut buf).unwrap() {
                Some((len, _, s)) => {
                    // Every segment of the batch arrives with its own bytes, in order.
                    for (k, chunk) in buf[..len].chunks(s).enumerate() {
                        let i = (total / seg) + k;
                        assert!(chunk.iter().all(|&b| b == i as u8), "segment {i}");
                    }
                    total += len;
                    reads.push((len, s));
                }
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        assert_eq!(total, count * seg, "the whole batch arrived");
        reads
    }

    #[test]
    fn gro_follows_bursts() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_nonblocking(true).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let fd = rx.as_raw_fd();
        let mut m = PortRx::default();
        let t0 = 1_000_000_000;

        // A new port reads blind: GRO is off, so the kernel splits a GSO batch.
        assert!(m.plain());
        assert_eq!(gso_round(&tx, &rx, 4, 1000), vec![(1000, 1000); 4]);

        // An empty read, a single datagram, or a few (a ping-pong's request, ACK and credit
        // write) are no burst.
        m.read(fd, t0, 0, false);
        m.read(fd, t0, 1, false);
        m.read(fd, t0, GRO_BURST - 1, false);
        assert!(m.plain());

        // A burst switches GRO on: batches now arrive whole, with their segment size.
        m.read(fd, t0, GRO_BURST, false);
        if m.no_gro {
            eprintln!("skipped: this kernel has no UDP GRO");
            return;
        }
        assert!(!m.plain());
        assert_eq!(gso_round(&tx, &rx, 4, 1000), vec![(4000, 1000)]);

        // A further burst restarts the idle clock; a hit after the idle time leaves GRO on
        // (no system call on the latency path); an empty read then switches it off.
        m.read(fd, t0 + GRO_IDLE_NS / 2, 32, false);
        m.read(fd, t0 + GRO_IDLE_NS, 0, false);
        assert!(!m.plain());
        let idle = t0 + GRO_IDLE_NS / 2 + GRO_IDLE_NS;
        m.read(fd, idle, 1, false);
        assert!(!m.plain());
        m.read(fd, idle, 0, false);
        assert!(m.plain());
        // Datagrams are looked at for batches coalesced before the switch until a read
        // finds the socket empty, the grace period after it.
        assert!(m.suspect());
        m.read(fd, idle + GRO_GRACE_NS - 1, 0, false);
        assert!(m.suspect());
        m.read(fd, idle + 100 * GRO_GRACE_NS, 3, false);
        assert!(m.suspect());
        m.read(fd, idle + 100 * GRO_GRACE_NS, 0, false);
        assert!(!m.suspect());
        // ... or until GRO comes back on.
        m.read(fd, idle + 100 * GRO_GRACE_NS, GRO_BURST, false);
        let back = idle + 100 * GRO_GRACE_NS + GRO_IDLE_NS;
        m.read(fd, back, 0, false);
        assert!(m.plain() && m.suspect());
        m.read(fd, back, GRO_BURST, false);
        assert!(!m.plain() && !m.suspect());
        m.read(fd, back + GRO_IDLE_NS, 0, false);
        assert_eq!(gso_round(&tx, &rx, 4, 1000), vec![(1000, 1000); 4]);

        // A coalesced read counts as a burst even when it is the only one.
        m.read(fd, idle, 1, true);
        assert!(!m.plain());
        assert_eq!(gso_round(&tx, &rx, 3, 500), vec![(1500, 500)]);
    }

    /// RC SEND packets of one message, `mtu` bytes of payload each but the last, with valid
    /// ICRCs for `path`.
    fn send_packets(path: &IcrcPath, mtu: usize, len: usize) -> Vec<Vec<u8>> {
        let n = len.div_ceil(mtu);
        (0..n)
            .map(|i| {
                let opcode = match (i, n) {
                    (_, 1) => Opcode::RC_SEND_ONLY,
                    (0, _) => Opcode::RC_SEND_FIRST,
                    (i, n) if i + 1 == n => Opcode::RC_SEND_LAST,
                    _ => Opcode::RC_SEND_MIDDLE,
                };
                let headers = PacketHeaders::new(BthRepr {
                    opcode,
                    solicited: false,
                    mig_req: true,
                    pad_count: 0,
                    pkey: 0xFFFF,
                    fecn: false,
                    becn: false,
                    dest_qp: 0x42,
                    ack_req: false,
                    psn: 100 + i as u32,
                });
                let payload = mtu.min(len - i * mtu);
                let mut buf = vec![0u8; 64 + payload];
                let h = headers.emit(&mut buf).unwrap();
                for (k, b) in buf[h..h + payload].iter_mut().enumerate() {
                    *b = (i * 7 + k) as u8;
                }
                let total = finish_packet(&mut buf, h + payload, path).unwrap();
                buf.truncate(total);
                buf
            })
            .collect()
    }

    #[test]
    fn a_batch_still_queued_when_gro_goes_off_is_split_by_its_first_packet() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_nonblocking(true).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let fd = rx.as_raw_fd();
        if !sys::set_gro(fd, true) {
            eprintln!("skipped: this kernel has no UDP GRO");
            return;
        }
        let src = tx.local_addr().unwrap();
        let dst = rx.local_addr().unwrap().ip();
        let path = IcrcPath::new(src, SocketAddr::new(dst, ROCE_UDP_PORT));
        for (mtu, len) in [(1024, 3000), (4096, 9000), (1024, 1025)] {
            let packets = send_packets(&path, mtu, len);
            let slices: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
            let seg = packets[0].len();
            let to = socket2::SockAddr::from(rx.local_addr().unwrap());
            sys::set_gro(fd, true);
            sys::send_gso(tx.as_raw_fd(), &to, &slices, seg as u16).unwrap();
            // Queued whole; then GRO goes off, and the batch is read without its segment
            // size, even by recvmsg.
            std::thread::sleep(Duration::from_millis(20));
            assert!(sys::set_gro(fd, false));
            let mut buf = vec![0u8; 65_536];
            let (got, _, reported) = sys::recv_one(fd, &mut buf).unwrap().expect("the batch");
            let total: usize = packets.iter().map(Vec::len).sum();
            assert_eq!(got, total, "mtu {mtu}: one datagram for the whole batch");
            assert_eq!(reported, got, "mtu {mtu}: no segment size");
            // A port with a larger MTU than the path's still finds the right size.
            for port_mtu in [mtu, 4096] {
                assert_eq!(
                    blind_segment(&buf[..got], src, dst, port_mtu),
                    Some(seg),
                    "mtu {mtu}, port mtu {port_mtu}"
                );
            }
            for (p, chunk) in packets.iter().zip(buf[..got].chunks(seg)) {
                assert_eq!(p.as_slice(), chunk);
            }
        }
        // A single packet, full-size or not, is not split.
        for p in send_packets(&path, 1024, 1024)
            .iter()
            .chain(&send_packets(&path, 1024, 100))
            .chain(&send_packets(&path, 4096, 4096))
        {
            assert_eq!(blind_segment(p, src, dst, 1024), None);
            assert_eq!(blind_segment(p, src, dst, 4096), None);
        }
        // Bytes that are no packet, or a batch with a broken first packet, are left whole.
        assert_eq!(blind_segment(&[0u8; 9000], src, dst, 4096), None);
        let mut bad: Vec<u8> = send_packets(&path, 1024, 3000).concat();
        bad[40] ^= 1;
        assert_eq!(blind_segment(&bad, src, dst, 1024), None);
    }

    #[test]
    fn plain_reads_report_length_and_source() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_nonblocking(true).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut buf = vec![0u8; 2048];
        assert!(sys::recv_plain(rx.as_raw_fd(), &mut buf).unwrap().is_none());
        // Waits up to a second for the datagram just sent.
        let read = |buf: &mut [u8]| {
            (0..1_000).find_map(|_| {
                let got = sys::recv_plain(rx.as_raw_fd(), buf).unwrap();
                if got.is_none() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                got
            })
        };
        tx.send_to(b"hello", rx.local_addr().unwrap()).unwrap();
        assert_eq!(read(&mut buf), Some((5, tx.local_addr().unwrap(), 5)));
        assert_eq!(&buf[..5], b"hello");
        // An empty datagram is a read of length 0 (segment size 1, as recv_one reports).
        tx.send_to(b"", rx.local_addr().unwrap()).unwrap();
        assert_eq!(read(&mut buf), Some((0, tx.local_addr().unwrap(), 1)));
    }
}
