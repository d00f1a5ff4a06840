//! A multicast group member over a worker: the protocol of [`crate::mcast`] on a UD queue
//! pair of its own, attached to the group's multicast address. Each joined group is a
//! transport of the worker (its own completion queue on the worker's channel, its timers);
//! members' unicast addresses (for statuses) are learned from the completions of their
//! datagrams.

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdmx_core::bootstrap::DatagramKey;
use rdmx_core::pool::{BufferPool, PostKey};
use rdmx_core::worker::{
    Cx, Message, Transport, TransportId, Wait, WaitSlot, Worker, WorkerState, wait_until,
};
use rdmx_core::{Buf, Config, Error, Result};
use rdmx_verbs::ah::{GRH_LEN, grh_source};
use rdmx_verbs::{
    AddressHandle, AhAttr, AsyncEvent, CompletionQueue, Gid, ProtectionDomain, Qpn, QueuePair,
    RecvWr, SendWr, WcStatus, WorkCompletion,
};
use slab::Slab;

use crate::attach::{QKEY, UdTransport, ud_qp};
use crate::mcast::wire::{Header, group_id};
use crate::mcast::{Dest, McastConfig, McastEvent, McastStats, Member};
use crate::seq::Seq;
use crate::session::SendError;

/// Work-request ids of sends carry this bit.
const SEND_TAG: u64 = 1 << 63;
/// Completions polled per round.
const POLL_BATCH: usize = 32;
/// Members whose address a group remembers (a flood of made-up member ids cannot grow it).
const MAX_MEMBERS: usize = 4096;

/// The multicast address of group `id` (an IPv4 `239.x.y.z`: administratively scoped).
pub fn group_addr(id: u32) -> Ipv4Addr {
    let [_, b, c, d] = id.to_be_bytes();
    Ipv4Addr::new(239, b.max(1), c, d)
}

/// What never changes.
#[derive(Debug)]
struct Fixed {
    tid: TransportId,
    post_key: PostKey,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    pool: BufferPool,
    to_group: AddressHandle,
    mgid: Gid,
    sq_depth: usize,
    /// With an authentication key (`Config::auth_key`): the group's datagram key. Every
    /// datagram then ends with a tag over the sender's queue pair number and the datagram
    /// (so that a datagram replayed from another queue pair does not pass), and one without
    /// a valid tag is dropped first (`unauthenticated`).
    mac: Option<DatagramKey>,
}

/// What changes, under the worker's lock.
#[derive(Debug)]
struct GroupState {
    member: Member,
    recv_slots: Slab<Buf>,
    send_slots: Slab<Buf>,
    /// Members' unicast addresses, from their first datagrams: a member id is bound to the
    /// address it was first heard from until it leaves or is removed.
    members: HashMap<u32, Peer>,
    events: VecDeque<McastEvent>,
    wait: WaitSlot,
    wc: Vec<WorkCompletion>,
    scratch: Vec<u8>,
    /// Datagrams that could not be posted (no buffer or send slot; no address yet).
    send_dropped: u64,
    /// Messages published inside a send batch, not handed to the protocol's sending yet.
    batched: bool,
    /// Datagrams not of the multicast format.
    malformed: u64,
    /// Datagrams naming a member heard from elsewhere.
    forged: u64,
    /// Datagrams without a valid tag of the group's key (with a key).
    unauthenticated: u64,
    left: bool,
}

/// Where a member's datagrams come from (IP address, UDP port of its device, queue pair),
/// and how to answer it.
#[derive(Debug)]
struct Peer {
    from: Origin,
    ah: AddressHandle,
    qpn: Qpn,
}

/// The sender of a datagram, as its completion and GRH tell.
type Origin = (std::net::IpAddr, u16, Qpn);

/// The group as its worker holds it.
#[derive(Debug)]
struct GroupTransport {
    f: Arc<Fixed>,
    st: GroupState,
}

/// A member of a multicast group (see [`crate::mcast`] for what delivery it gives).
/// Cheap to clone; the group is left when [`leave`](Self::leave) is called or the last
/// clone is dropped.
#[derive(Debug, Clone)]
pub struct Group {
    w: Worker,
    f: Arc<Fixed>,
    _leave: Arc<LeaveOnDrop>,
}

#[derive(Debug)]
struct LeaveOnDrop {
    w: Worker,
    f: Arc<Fixed>,
}

impl Drop for LeaveOnDrop {
    fn drop(&mut self) {
        leave(&self.w, &self.f);
    }
}

fn with<R>(w: &Worker, f: &Fixed, g: impl FnOnce(&Fixed, &mut GroupState, &mut Cx<'_>) -> R) -> R {
    let mut ws = w.lock();
    let (t, core) = ws
        .transport::<GroupTransport>(f.tid)
        .expect("a group is in its worker");
    let mut cx = core.cx(w, f.tid);
    g(f, &mut t.st, &mut cx)
}

fn leave(w: &Worker, f: &Fixed) {
    with(w, f, |f, st, cx| {
        if !st.left {
            st.member.leave();
            let now = cx.now();
            f.transmit(st, now);
            st.left = true;
            let _ = f.qp.detach_mcast(f.mgid, 0);
        }
    });
}

impl Group {
    /// Joins group `name` on `worker` (a UD queue pair of its own with `cfg.srq_depth`
    /// receive buffers, or a window's if that is more, of [`UdTransport::RECV_BUF_SIZE`]
    /// from the worker's pool, attached to the group's multicast address). `options` says how the group behaves (its `group`
    /// and `max_datagram` are set here); every member should use the same.
    ///
    /// # Errors
    /// `Verbs` when a resource cannot be made or the group cannot be joined.
    pub fn join(w: &Worker, cfg: &Config, name: &str, options: McastConfig) -> Result<Self> {
        let id = group_id(name);
        let mgid = Gid::from_ip(std::net::IpAddr::V4(group_addr(id)));
        let mut made = None;
        w.add_transport(|tid, post_key| {
            let vctx = w.verbs_context().clone();
            let pd = w.pd(post_key).clone();
            let pool = w.pool().clone();
            let port = vctx.query_port(1)?;
            // With a key, each datagram ends with the group's tag: the protocol has that
            // much less room.
            let mac = cfg
                .auth_key
                .as_ref()
                .map(|k| k.datagram_key(b"multicast group", name.as_bytes()));
            let tag_len = if mac.is_some() {
                DatagramKey::TAG_LEN
            } else {
                0
            };
            let max_datagram = port
                .active_mtu
                .bytes()
                .min(UdTransport::RECV_BUF_SIZE - GRH_LEN)
                - tag_len;
            // At least a window of receives: a publisher may send a whole window at once,
            // and a datagram that finds no receive posted is dropped (then repaired).
            let depth = cfg.srq_depth.max(64).max(options.window.min(8192));
            // Datagrams in flight at most: beyond them, what is published waits in the
            // queue and leaves packed once sends complete (small messages, 1 sub, 1 M
            // messages: 256 B 1.3 M msg/s with 256 in flight, 1.6 M with 32; 8 B 2.7 M and
            // 5 M; 4,000 B no worse).
            let sq_depth = 32u32;
            let cq = vctx.create_cq(((depth + sq_depth) * 2) as usize, Some(w.channel()))?;
            let qp = ud_qp(&pd, &cq, sq_depth, depth)?;
            qp.attach_mcast(mgid, 0)?;
            let to_group = pd.create_ah(&AhAttr::new(mgid))?;
            pool.reserve(pool.footprint_of(depth as usize, UdTransport::RECV_BUF_SIZE));
            let f = Arc::new(Fixed {
                tid,
                post_key,
                pd,
                cq,
                qp,
                pool,
                to_group,
                mgid,
                sq_depth: sq_depth as usize,
                mac,
            });
            let mcfg = McastConfig {
                group: id,
                max_datagram,
                ..options
            };
            let r = rdmx_verbs::random_u64();
            let member = Member::new(
                mcfg,
                r as u32 | 1,
                (r >> 32) as u32,
                Seq(rdmx_verbs::random_u64() as u32),
                w.now(),
            );
            let mut st = GroupState {
                member,
                recv_slots: Slab::new(),
                send_slots: Slab::new(),
                members: HashMap::new(),
                events: VecDeque::new(),
                wait: WaitSlot::new(0),
                wc: vec![WorkCompletion::EMPTY; POLL_BATCH],
                scratch: vec![0; max_datagram],
                send_dropped: 0,
                batched: false,
                malformed: 0,
                forged: 0,
                unauthenticated: 0,
                left: false,
            };
            for _ in 0..depth {
                let buf = f.pool.try_alloc(UdTransport::RECV_BUF_SIZE)?;
                f.post_recv(&mut st, buf)?;
            }
            made = Some(f.clone());
            Ok(GroupTransport { f, st })
        })?;
        let f = made.ok_or_else(|| Error::Config("the group was not made".into()))?;
        with(w, &f, |f, st, cx| {
            let now = cx.now();
            f.after(st, cx, now);
        });
        Ok(Self {
            w: w.clone(),
            f: f.clone(),
            _leave: Arc::new(LeaveOnDrop { w: w.clone(), f }),
        })
    }

    /// This member's id (what other members see as the publisher of its messages).
    pub fn member_id(&self) -> u32 {
        with(&self.w, &self.f, |_, st, _| st.member.id())
    }

    /// Publishes a message to every member.
    ///
    /// # Errors
    /// `WouldBlock` while the queue is full (the slowest member paces it); `MessageTooLarge`;
    /// `Disconnected` after leaving.
    pub fn try_publish(&self, msg: &[u8]) -> Result<()> {
        with(&self.w, &self.f, |f, st, cx| {
            f.publish(st, cx, msg).unwrap_or(Err(Error::WouldBlock))
        })
    }

    /// Publishes, waiting up to `timeout` for room.
    ///
    /// # Errors
    /// As [`try_publish`](Self::try_publish), and `Timeout`.
    pub fn publish_timeout(&self, msg: &[u8], timeout: Duration) -> Result<()> {
        // While there is room, no progress first (it polls the device: a system call on
        // the soft provider); waiting makes progress.
        if let Some(r) = self.publish_on(&mut self.w.lock(), msg) {
            return r;
        }
        // (Woken when a member moves on.)
        let wait = Wait::message(self.f.tid, 0);
        wait_until(&self.w, wait, Some(timeout), |ws| self.publish_on(ws, msg))
    }

    /// Publishes, waiting for room without blocking the thread (feature `tokio`).
    /// Cancellation is safe: a message is copied when it is accepted.
    ///
    /// # Errors
    /// As [`try_publish`](Self::try_publish).
    #[cfg(feature = "tokio")]
    pub async fn publish_async(&self, msg: &[u8]) -> Result<()> {
        rdmx_core::worker::wait_async(&self.w, |ws| self.publish_on(ws, msg)).await
    }

    /// One attempt to publish, the worker's lock held (`None`: no room yet).
    fn publish_on(&self, ws: &mut WorkerState, msg: &[u8]) -> Option<Result<()>> {
        let (t, core) = ws.transport::<GroupTransport>(self.f.tid)?;
        let mut cx = core.cx(&self.w, self.f.tid);
        let GroupTransport { f, st } = t;
        f.publish(st, &mut cx, msg)
    }

    /// Publishes a pooled buffer (copied into the publisher's window, which keeps what it
    /// sent until every live member has it, as UD endpoints copy theirs), waiting up to
    /// `timeout` for room; the buffer goes back to its pool.
    ///
    /// # Errors
    /// As [`publish_timeout`](Self::publish_timeout).
    pub fn publish_buf_timeout(&self, buf: Buf, timeout: Duration) -> Result<()> {
        self.publish_timeout(&buf, timeout)
    }

    /// Publishes a pooled buffer if there is room now: `Ok(None)` published, `Ok(Some(buf))`
    /// no room (the buffer handed back).
    ///
    /// # Errors
    /// As [`try_publish`](Self::try_publish), other than `WouldBlock`.
    pub fn try_publish_buf(&self, buf: Buf) -> Result<Option<Buf>> {
        match self.try_publish(&buf) {
            Ok(()) => Ok(None),
            Err(Error::WouldBlock) => Ok(Some(buf)),
            Err(e) => Err(e),
        }
    }

    /// Opens a send batch on this thread (as [`Worker::batch`] does): until the guard is
    /// dropped, what this thread publishes is queued, and leaves when the batch ends (or
    /// the queue fills), small messages packed together in datagrams, the datagrams
    /// together. Delivery and order are those of messages published one by one.
    pub fn batch(&self) -> rdmx_core::worker::Batch<'_> {
        self.w.batch()
    }

    /// Waits up to `timeout` until every message this member published was sent and taken
    /// by the application of every live member (members removed meanwhile are not waited
    /// for). Call it before leaving to be sure the members have everything: leaving does
    /// not wait, and members report a publisher that left with messages still on their
    /// way as gone.
    ///
    /// # Errors
    /// `Timeout`.
    pub fn flush_timeout(&self, timeout: Duration) -> Result<()> {
        let wait = Wait::message(self.f.tid, 0);
        wait_until(&self.w, wait, Some(timeout), |ws| self.flushed_on(ws))
    }

    /// [`flush_timeout`](Self::flush_timeout) without blocking the thread (feature `tokio`).
    ///
    /// # Errors
    /// None yet (the signature leaves room for the group's end).
    #[cfg(feature = "tokio")]
    pub async fn flush_async(&self) -> Result<()> {
        rdmx_core::worker::wait_async(&self.w, |ws| self.flushed_on(ws)).await
    }

    fn flushed_on(&self, ws: &mut WorkerState) -> Option<Result<()>> {
        let (t, _) = ws.transport::<GroupTransport>(self.f.tid)?;
        t.st.member.flushed().then_some(Ok(()))
    }

    /// The next message of any publisher, with the publisher's member id.
    ///
    /// # Errors
    /// `WouldBlock` when none is there.
    pub fn try_recv(&self) -> Result<(u32, Vec<u8>)> {
        with(&self.w, &self.f, |f, st, cx| {
            if let Some(m) = st.member.recv() {
                let now = cx.now();
                f.after(st, cx, now);
                return Ok(m);
            }
            f.progress(st, cx);
            st.member.recv().ok_or(Error::WouldBlock)
        })
    }

    /// The next message of any publisher, waiting up to `timeout`.
    ///
    /// # Errors
    /// `Timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<(u32, Vec<u8>)> {
        // A message already there is taken without progress first (which polls the device);
        // waiting makes progress.
        if let Some(r) = self.recv_on(&mut self.w.lock()) {
            return r;
        }
        let wait = Wait::message(self.f.tid, 0);
        wait_until(&self.w, wait, Some(timeout), |ws| self.recv_on(ws))
    }

    /// The next message of any publisher, without blocking the thread (feature `tokio`).
    /// Cancellation is safe: a message not taken stays queued.
    ///
    /// # Errors
    /// None yet (the signature leaves room for the group's end).
    #[cfg(feature = "tokio")]
    pub async fn recv_async(&self) -> Result<(u32, Vec<u8>)> {
        rdmx_core::worker::wait_async(&self.w, |ws| self.recv_on(ws)).await
    }

    /// One look for a message, the worker's lock held.
    fn recv_on(&self, ws: &mut WorkerState) -> Option<Result<(u32, Vec<u8>)>> {
        let (t, core) = ws.transport::<GroupTransport>(self.f.tid)?;
        let mut cx = core.cx(&self.w, self.f.tid);
        let GroupTransport { f, st } = t;
        let m = st.member.recv()?;
        let now = cx.now();
        f.after(st, &mut cx, now);
        Some(Ok(m))
    }

    /// The next event of the group (members removed, publishers joined or gone, losses).
    pub fn poll_event(&self) -> Option<McastEvent> {
        with(&self.w, &self.f, |_, st, _| st.events.pop_front())
    }

    /// Counters: the protocol's, and the datagrams this member dropped on the way in
    /// (malformed, forged) or could not send.
    pub fn stats(&self) -> McastStats {
        with(&self.w, &self.f, |_, st, _| McastStats {
            malformed: st.malformed,
            forged: st.forged,
            unauthenticated: st.unauthenticated,
            send_dropped: st.send_dropped,
            ..st.member.stats()
        })
    }

    /// Members this member's stream is paced by (those it heard of).
    pub fn receivers(&self) -> usize {
        with(&self.w, &self.f, |_, st, _| st.member.receivers())
    }

    /// Leaves the group now (the others are told); later calls fail.
    pub fn leave(&self) {
        leave(&self.w, &self.f);
    }
}

impl Fixed {
    /// One attempt to publish `msg` (`None`: no room yet). Inside a send batch the message
    /// waits for the batch's end, unless the queue is full.
    fn publish(&self, st: &mut GroupState, cx: &mut Cx<'_>, msg: &[u8]) -> Option<Result<()>> {
        let mut r = st.member.publish(msg);
        if r == Err(SendError::WouldBlock) && st.batched {
            // The batch filled the queue: what it holds goes now.
            st.batched = false;
            let now = cx.now();
            self.after(st, cx, now);
            r = st.member.publish(msg);
        }
        match r {
            Ok(()) => {
                if cx.worker().batch_open() {
                    st.batched = true;
                } else {
                    let now = cx.now();
                    self.after(st, cx, now);
                }
                Some(Ok(()))
            }
            Err(SendError::WouldBlock) => None,
            Err(SendError::TooLarge { len, max }) => Some(Err(Error::MessageTooLarge { len, max })),
            Err(SendError::Closed) => {
                Some(Err(Error::InvalidArgument("the group was left".into())))
            }
        }
    }

    fn post_recv(&self, st: &mut GroupState, mut buf: Buf) -> Result<()> {
        let cap = buf.capacity();
        buf.set_len(cap)?;
        let slot = st.recv_slots.vacant_key();
        let sge = [buf.sge(self.post_key)];
        self.qp.post_recv(&RecvWr::new(slot as u64, &sge))?;
        st.recv_slots.insert(buf);
        Ok(())
    }

    /// Polls the completion queue, hands datagrams to the member, then sends.
    fn progress(&self, st: &mut GroupState, cx: &mut Cx<'_>) -> usize {
        let mut wc = std::mem::take(&mut st.wc);
        let n = self.cq.poll(&mut wc);
        let now = cx.now();
        for c in wc.iter().take(n) {
            if c.wr_id & SEND_TAG != 0 {
                st.send_slots.try_remove((c.wr_id & !SEND_TAG) as usize);
                continue;
            }
            let Some(buf) = st.recv_slots.try_remove(c.wr_id as usize) else {
                continue;
            };
            if c.status == WcStatus::Success && !st.left {
                let len = (c.byte_len as usize).min(buf.len());
                let grh = buf.get(..GRH_LEN).unwrap_or_default();
                let data = buf.get(GRH_LEN..len).unwrap_or_default();
                // With a key, nothing looks at a datagram before its tag is checked.
                let body = match &self.mac {
                    None => Some(data),
                    Some(key) => authentic(key, c.src_qp, data),
                };
                match body.map(Header::parse) {
                    Some(Ok((h, payload))) => {
                        if self.admit(st, c, grh, &h) {
                            st.member.handle_datagram(now, &h, payload);
                        }
                    }
                    Some(Err(_)) => st.malformed += 1,
                    None => st.unauthenticated += 1,
                }
            }
            if c.status != WcStatus::WrFlushErr
                && let Err(e) = self.post_recv(st, buf)
            {
                tracing::warn!("reposting a group receive buffer failed: {e}");
            }
        }
        st.wc = wc;
        self.after(st, cx, now);
        n
    }

    /// Whether a datagram from `source` may reach the protocol: a member id is bound to the
    /// address it was first heard from (learned here), and datagrams naming it from another
    /// address are forgeries (counted and dropped).
    fn admit(&self, st: &mut GroupState, c: &WorkCompletion, grh: &[u8], h: &Header) -> bool {
        let Some(ip) = grh_source(grh) else {
            st.malformed += 1;
            return false;
        };
        let origin: Origin = (ip, c.slid, c.src_qp);
        if h.source == st.member.id() {
            // Our own datagrams come back from the group; another queue pair using our id
            // is a forger.
            if c.src_qp != self.qp.qp_num() {
                st.forged += 1;
            }
            return false;
        }
        if let Some(p) = st.members.get(&h.source) {
            if p.from != origin {
                st.forged += 1;
                return false;
            }
            return true;
        }
        if st.members.len() < MAX_MEMBERS
            && let Ok(ah) = AddressHandle::from_work_completion(&self.pd, 1, c, grh)
        {
            st.members.insert(
                h.source,
                Peer {
                    from: origin,
                    ah,
                    qpn: c.src_qp,
                },
            );
        }
        true
    }

    /// Sends what the member has to send, passes its events on, wakes waiters.
    fn after(&self, st: &mut GroupState, cx: &mut Cx<'_>, now: Instant) {
        self.transmit(st, now);
        let mut any = false;
        while let Some(e) = st.member.poll_event() {
            if let McastEvent::PublisherGone { publisher, .. }
            | McastEvent::MemberRemoved {
                member: publisher, ..
            } = &e
            {
                st.members.remove(publisher);
            }
            st.events.push_back(e);
            any = true;
        }
        if st.member.has_message() || any {
            cx.touch(&mut st.wait);
            cx.mark_ready(&mut st.wait);
        } else if st.member.take_moved() {
            // Room for a waiting publisher, perhaps: it looks again.
            cx.touch(&mut st.wait);
        }
        if let Some(t) = st.member.poll_timeout() {
            cx.schedule(t);
        }
    }

    fn transmit(&self, st: &mut GroupState, now: Instant) {
        while st.send_slots.len() < self.sq_depth {
            let Some((dest, n)) = st.member.poll_transmit(now, &mut st.scratch) else {
                return;
            };
            let (ah, qpn) = match dest {
                Dest::Group => (&self.to_group, Qpn::MULTICAST),
                Dest::Member(m) => match st.members.get(&m) {
                    Some(p) => (&p.ah, p.qpn),
                    None => {
                        st.send_dropped += 1;
                        continue;
                    }
                },
            };
            let tag_len = self.mac.as_ref().map_or(0, |_| DatagramKey::TAG_LEN);
            let Ok(mut buf) = self.pool.try_alloc(n + tag_len) else {
                st.send_dropped += 1;
                return;
            };
            let datagram = &st.scratch[..n];
            match &self.mac {
                Some(key) => {
                    let tag = key.tag(&[&self.qp.qp_num().0.to_be_bytes(), datagram]);
                    buf[..n].copy_from_slice(datagram);
                    buf[n..].copy_from_slice(&tag);
                }
                None => buf.copy_from_slice(datagram),
            }
            let slot = st.send_slots.vacant_key();
            let sge = [buf.sge(self.post_key)];
            let wr = SendWr::send(slot as u64 | SEND_TAG, &sge)
                .signaled()
                .to(ah, qpn, QKEY);
            match self.qp.post_send(&wr) {
                Ok(()) => {
                    st.send_slots.insert(buf);
                }
                Err(e) => {
                    tracing::debug!("posting a group datagram failed: {e}");
                    st.send_dropped += 1;
                    return;
                }
            }
        }
    }
}

/// The datagram of `data` (what precedes its tag) if the tag is the group key's over the
/// sender's queue pair number `src_qp` and the datagram.
fn authentic<'a>(key: &DatagramKey, src_qp: Qpn, data: &'a [u8]) -> Option<&'a [u8]> {
    let at = data.len().checked_sub(DatagramKey::TAG_LEN)?;
    let (body, tag) = data.split_at(at);
    key.verify(&[&src_qp.0.to_be_bytes(), body], tag)
        .then_some(body)
}

#[expect(
    unsafe_code,
    reason = "implementing `Transport` vouches for the posting rules below"
)]
// SAFETY: a group names a pool buffer in a work request only once it moved into its tables
// (`GroupState::recv_slots` while posted, until its completion or flush; `send_slots` until
// the send's completion: every send is signaled). No buffer is offered to a peer for RDMA,
// no buffer the application holds is ever posted (messages reach it as copies), and the key
// never leaves `Fixed`.
unsafe impl Transport for GroupTransport {
    fn arm(&self) {
        self.f.cq.req_notify(false);
    }

    fn progress(&mut self, cx: &mut Cx<'_>) -> usize {
        self.f.progress(&mut self.st, cx)
    }

    fn handle_event(&mut self, _cx: &mut Cx<'_>, _ev: AsyncEvent) {}

    fn next_timer(&self) -> Option<Instant> {
        if self.st.left {
            return None;
        }
        self.st.member.poll_timeout()
    }

    fn handle_timer(&mut self, cx: &mut Cx<'_>, now: Instant) {
        if self.st.left {
            return;
        }
        if self.st.member.poll_timeout().is_some_and(|t| t <= now) {
            self.st.member.handle_timeout(now);
        }
        self.f.after(&mut self.st, cx, now);
    }

    fn take_back(&mut self, _cx: &mut Cx<'_>, buf: Buf) {
        drop(buf);
    }

    fn hand_over(&mut self, _cx: &mut Cx<'_>) {}

    fn take_message(&mut self, _cx: &mut Cx<'_>, _key: usize) -> Option<Message> {
        // (Group messages are taken from the group, not from the worker's receive.)
        None
    }

    fn wait_slot(&mut self, key: usize) -> Option<&mut WaitSlot> {
        (key == 0).then_some(&mut self.st.wait)
    }

    fn flush_batch(&mut self, cx: &mut Cx<'_>) {
        if std::mem::take(&mut self.st.batched) {
            let now = cx.now();
            self.f.after(&mut self.st, cx, now);
        }
    }

    fn is_idle(&self) -> bool {
        self.st.left && self.st.send_slots.is_empty()
    }
}
