//! A CM agent: one UDP socket that sends and receives framed CM MADs for the IDs that use
//! it (a listener and the connections it accepted, or one connecting ID), and hands each
//! MAD to the ID it is for. The channel thread calls [`Agent::receive`] when the socket is
//! readable; the IDs send through [`Agent::send`] from any thread.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::Mutex;
use socket2::{Domain, Protocol, Socket, Type};

use super::error::CmError;
use super::id::IdInner;
use super::mad::{CmMsg, Mad, MadError};
use super::msg::{Ids, REJ_ARI_LEN, REJ_PRIVATE_LEN, Rej, msg_kind, reason};
use crate::os::clock;
use crate::soft::wire::IcrcPath;

/// Datagrams read per wake-up of the channel thread, at most (the rest wait for the next).
const RX_BATCH: usize = 64;

/// Counters of one CM socket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CmStats {
    /// MADs sent (first sends, retransmissions and answers).
    pub tx_mads: u64,
    /// Well-formed CM MADs received.
    pub rx_mads: u64,
    /// Datagrams dropped as malformed: not RoCEv2, not a GSI datagram, bad ICRC, not a
    /// 256-byte CM Send MAD, or an attribute not handled here.
    pub rx_malformed: u64,
    /// MADs for a communication ID nobody here has (answered as the IB CM does: a DREQ with
    /// a DREP, a REP with a REJ; others dropped).
    pub rx_unknown_comm_id: u64,
    /// REQs that found no listener or the wrong service ID (answered with a REJ).
    pub rx_no_listener: u64,
    /// REQs dropped because the listener's backlog was full (the sender retries).
    pub rx_backlog_full: u64,
}

#[derive(Debug, Default)]
struct Counters {
    tx: AtomicU64,
    rx: AtomicU64,
    malformed: AtomicU64,
    unknown: AtomicU64,
    no_listener: AtomicU64,
    backlog_full: AtomicU64,
}

/// One CM socket and the IDs behind it.
#[derive(Debug)]
pub(crate) struct Agent {
    sock: UdpSocket,
    local: SocketAddr,
    /// IDs by their local communication ID.
    ids: Mutex<HashMap<u32, Weak<IdInner>>>,
    /// Passive connections by (peer's CM address, peer's communication ID), to find the
    /// one a duplicate REQ belongs to.
    reqs: Mutex<HashMap<(SocketAddr, u32), u32>>,
    listener: Mutex<Option<Weak<IdInner>>>,
    psn: AtomicU32,
    counters: Counters,
}

impl Agent {
    /// Binds a CM socket at `addr` (port 0: an ephemeral port).
    pub(crate) fn bind(addr: SocketAddr) -> Result<Arc<Self>, CmError> {
        let io = |op| move |error| CmError::Io { op, error };
        let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))
            .map_err(io("create the CM socket"))?;
        // DF and IPv4 ID 0, so that the ICRC we compute is the one of the packet on the wire.
        let _ = crate::soft::driver::sys::set_pmtudisc_do(sock.as_raw_fd(), addr.is_ipv6());
        sock.set_nonblocking(true)
            .map_err(io("make the CM socket non-blocking"))?;
        sock.bind(&addr.into()).map_err(io("bind the CM socket"))?;
        let sock: UdpSocket = sock.into();
        let local = sock
            .local_addr()
            .map_err(io("read the CM socket's address"))?;
        Ok(Arc::new(Self {
            sock,
            local,
            ids: Mutex::new(HashMap::new()),
            reqs: Mutex::new(HashMap::new()),
            listener: Mutex::new(None),
            psn: AtomicU32::new((crate::os::random_u64() as u32) & 0x00FF_FFFF),
            counters: Counters::default(),
        }))
    }

    /// The socket's address.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// The counters.
    pub(crate) fn stats(&self) -> CmStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CmStats {
            tx_mads: get(&c.tx),
            rx_mads: get(&c.rx),
            rx_malformed: get(&c.malformed),
            rx_unknown_comm_id: get(&c.unknown),
            rx_no_listener: get(&c.no_listener),
            rx_backlog_full: get(&c.backlog_full),
        }
    }

    /// Registers `id` under a fresh, non-zero communication ID and returns it.
    pub(crate) fn alloc_comm_id(&self, id: &Arc<IdInner>) -> u32 {
        let mut ids = self.ids.lock();
        // Bounded: a 32-bit space holding at most a few thousand live IDs.
        for _ in 0..64 {
            let c = crate::os::random_u64() as u32;
            if c != 0 && !ids.contains_key(&c) {
                ids.insert(c, Arc::downgrade(id));
                return c;
            }
        }
        // Unlucky draws: of the first `len + 1` IDs at least one is free.
        let last = u32::try_from(ids.len()).map_or(u32::MAX, |n| n.saturating_add(1));
        let c = (1..=last).find(|c| !ids.contains_key(c)).unwrap_or(last);
        ids.insert(c, Arc::downgrade(id));
        c
    }

    /// Notes that the REQ `(peer, remote_comm_id)` created communication `local`.
    pub(crate) fn note_req(&self, peer: SocketAddr, remote_comm_id: u32, local: u32) {
        self.reqs.lock().insert((peer, remote_comm_id), local);
    }

    /// Forgets communication `local` (and its REQ).
    pub(crate) fn unregister(&self, local: u32) {
        self.ids.lock().remove(&local);
        self.reqs.lock().retain(|_, l| *l != local);
    }

    /// Makes `id` the listener of this socket (`None`: no listener).
    pub(crate) fn set_listener(&self, id: Option<&Arc<IdInner>>) {
        *self.listener.lock() = id.map(Arc::downgrade);
    }

    /// Sends `mad` to the CM socket at `to`. Errors are logged and counted as losses: the
    /// retransmission timer recovers them.
    pub(crate) fn send(&self, mad: &Mad, to: SocketAddr) {
        let src = if self.local.ip().is_unspecified() {
            SocketAddr::new(
                source_ip_for(to.ip()).unwrap_or(self.local.ip()),
                self.local.port(),
            )
        } else {
            self.local
        };
        let psn = self.psn.fetch_add(1, Ordering::Relaxed) & 0x00FF_FFFF;
        let frame = mad.to_frame(psn, &IcrcPath::new(src, to));
        tracing::trace!(msg = mad.msg.name(), %to, "rdma_cm send");
        match self.sock.send_to(&frame, to) {
            Ok(_) => {
                self.counters.tx.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::debug!(error = %e, %to, "rdma_cm send failed"),
        }
    }

    /// Reads what the socket holds (at most [`RX_BATCH`] datagrams) and dispatches it.
    pub(crate) fn receive(self: &Arc<Self>, buf: &mut [u8]) {
        for _ in 0..RX_BATCH {
            let (n, from) = match self.sock.recv_from(buf) {
                Ok(r) => r,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    // ICMP errors of earlier sends surface here; nothing to read.
                    tracing::trace!(error = %e, "rdma_cm recv");
                    continue;
                }
            };
            let frame = buf.get(..n).unwrap_or_default();
            self.handle_datagram(clock::monotonic(), from, frame);
        }
    }

    /// One received datagram.
    pub(crate) fn handle_datagram(self: &Arc<Self>, now: Instant, from: SocketAddr, frame: &[u8]) {
        let path = (!self.local.ip().is_unspecified()).then(|| IcrcPath::new(from, self.local));
        let mad = match Mad::from_frame(frame, path.as_ref()) {
            Ok(m) => m,
            Err(e) => {
                self.count_malformed(&e, from);
                return;
            }
        };
        self.counters.rx.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(msg = mad.msg.name(), %from, "rdma_cm recv");
        if let CmMsg::Req(req) = &mad.msg {
            let dup = self.reqs.lock().get(&(from, req.local_comm_id)).copied();
            if let Some(id) = dup.and_then(|l| self.lookup(l)) {
                id.handle_mad(now, &mad, from);
                return;
            }
            let listener = self.listener.lock().as_ref().and_then(Weak::upgrade);
            match listener {
                Some(l) => l.handle_req(now, self, from, &mad, req),
                None => self.reject_req(&mad, from, reason::INVALID_SERVICE_ID),
            }
            return;
        }
        match self.lookup(mad.msg.remote_comm_id()) {
            Some(id) => id.handle_mad(now, &mad, from),
            None => self.unknown_comm_id(&mad, from),
        }
    }

    fn lookup(&self, comm_id: u32) -> Option<Arc<IdInner>> {
        self.ids.lock().get(&comm_id).and_then(Weak::upgrade)
    }

    fn count_malformed(&self, e: &MadError, from: SocketAddr) {
        self.counters.malformed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(error = %e, %from, "rdma_cm: dropped a malformed datagram");
    }

    /// Refuses a REQ nobody here takes.
    pub(crate) fn reject_req(&self, req: &Mad, to: SocketAddr, why: u16) {
        if why == reason::INVALID_SERVICE_ID {
            self.counters.no_listener.fetch_add(1, Ordering::Relaxed);
        }
        let rej = Mad {
            tid: req.tid,
            msg: CmMsg::Rej(Box::new(Rej {
                local_comm_id: 0,
                remote_comm_id: req.msg.local_comm_id(),
                message_rejected: msg_kind::REQ,
                reject_info_len: 0,
                reason: why,
                ari: [0; REJ_ARI_LEN],
                private_data: [0; REJ_PRIVATE_LEN],
            })),
        };
        self.send(&rej, to);
    }

    /// Counts a REQ dropped for a full backlog.
    pub(crate) fn count_backlog_full(&self) {
        self.counters.backlog_full.fetch_add(1, Ordering::Relaxed);
    }

    /// A MAD for a communication ID we do not have: a DREQ gets its DREP (the connection is
    /// gone anyway), a REP a REJ (so the peer does not wait for an RTU), others are dropped.
    fn unknown_comm_id(&self, mad: &Mad, from: SocketAddr) {
        self.counters.unknown.fetch_add(1, Ordering::Relaxed);
        let ids = Ids {
            local_comm_id: mad.msg.remote_comm_id(),
            remote_comm_id: mad.msg.local_comm_id(),
            remote_qpn: 0,
        };
        match &mad.msg {
            CmMsg::Dreq(_) => self.send(
                &Mad {
                    tid: mad.tid,
                    msg: CmMsg::Drep(ids),
                },
                from,
            ),
            CmMsg::Rep(_) => self.send(
                &Mad {
                    tid: mad.tid,
                    msg: CmMsg::Rej(Box::new(Rej {
                        local_comm_id: ids.local_comm_id,
                        remote_comm_id: ids.remote_comm_id,
                        message_rejected: msg_kind::REP,
                        reject_info_len: 0,
                        reason: reason::INVALID_COMM_ID,
                        ari: [0; REJ_ARI_LEN],
                        private_data: [0; REJ_PRIVATE_LEN],
                    })),
                },
                from,
            ),
            _ => tracing::debug!(msg = mad.msg.name(), %from, "rdma_cm: unknown communication ID"),
        }
    }
}

/// The source address the kernel would use to reach `dst` (a routing lookup through a
/// connected UDP socket; nothing is sent).
pub(crate) fn source_ip_for(dst: IpAddr) -> io::Result<IpAddr> {
    let any: SocketAddr = if dst.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let s = UdpSocket::bind(any)?;
    s.connect((dst, 9))?;
    Ok(s.local_addr()?.ip())
}
