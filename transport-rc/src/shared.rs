//! The state shared by a context and its endpoints, and the progress engine that drives it.
//!
//! Everything mutable lives in one [`State`] behind one lock. Any thread that needs something
//! (a message, a credit, a buffer) takes the lock, runs [`Shared::progress`] — which polls the
//! completion queue and routes each completion to its endpoint — and looks again. There is no
//! hand-off to another thread on the latency path: the thread that waits is the thread that
//! polls. A background thread (see `context.rs`) only takes over when nobody is polling.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rdmx_core::credit::Budget;
use rdmx_core::header::{HEADER_LEN, Header, Kind, MAILBOX_LEN, Mailbox, RtsInfo, Signal};
use rdmx_core::pool::BufferPool;
use rdmx_core::regcache::RegCache;
use rdmx_core::{Buf, Config, DisconnectCause, Event};
use rdmx_verbs::{
    CompletionQueue, MemoryRegion, ProtectionDomain, QpAttr, QpAttrMask, QpState, RecvWr, SendWr,
    SharedReceiveQueue, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};
use slab::Slab;

use crate::ep::{Ep, Hold, Inbound, OpResult, OpSource, Status, wrid};
use crate::send::{PostData, post_on};

/// Completions taken per poll.
const POLL_BATCH: usize = 32;

/// Counters of a context (see `Context::stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Messages sent inline.
    pub sent_inline: u64,
    /// Messages sent eagerly from a pooled buffer.
    pub sent_eager: u64,
    /// Messages sent by rendezvous.
    pub sent_rndv: u64,
    /// Of those, messages the peer read straight from application bytes (`send_shared`).
    pub sent_zero_copy: u64,
    /// Messages delivered to the application.
    pub delivered: u64,
    /// Credit updates written into peers' mailboxes.
    pub mailbox_writes: u64,
    /// Sends that found no credit (or no send slot or pool buffer) at first and had to wait
    /// or give up with `WouldBlock`.
    pub credit_waits: u64,
    /// Receive buffers posted on the shared receive queue.
    pub recv_posted: u64,
    /// Receive completions with an unknown or finished queue pair (buffer reposted).
    pub stray_completions: u64,
    /// Protocol violations by peers (their endpoint was closed).
    pub protocol_errors: u64,
    /// Credits idle peers gave back on request (credit recall).
    pub credits_recalled: u64,
    /// Recall requests and answers sent as signals (RDMA WRITE with immediate), which the
    /// peer acts on at once instead of at its next tick.
    pub recall_signals: u64,
    /// Rendezvous reads reported as signals (the sender had asked, its rendezvous window
    /// being full), which wake the sender at once.
    pub read_done_signals: u64,
}

/// All mutable state of a context.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) eps: Slab<Ep>,
    pub(crate) by_qpn: HashMap<u32, usize>,
    pub(crate) recv_slots: Slab<Buf>,
    /// Receive slots waiting to be posted together (`Shared::batch_posts`).
    pub(crate) pending_posts: Vec<usize>,
    pub(crate) budget: Budget,
    /// Eager receive buffers held by the application or queued in inboxes.
    pub(crate) held: u64,
    pub(crate) needy: VecDeque<usize>,
    /// A peer starved at the last recall scan: scan again after `recall::PRESSURE_SCAN`.
    pub(crate) recall_pressure: bool,
    /// Every posted buffer backs a credit and some endpoint holds none: scan the starving
    /// flags every `recall_watch_every`.
    pub(crate) recall_watch: bool,
    /// The watch interval: `recall::WATCH_SCAN` when the watch starts or a peer starved,
    /// doubling after every scan that finds none, up to the tick.
    pub(crate) recall_watch_every: Duration,
    /// Receive completions so far, and their number at the last watch scan: a context that
    /// received nothing since keeps backing its watch off.
    pub(crate) recv_seen: u64,
    pub(crate) recv_at_watch: u64,
    /// Endpoints with a deliverable message, for `Context::recv` (see `inbox.rs`).
    pub(crate) ready: VecDeque<usize>,
    /// Endpoints with a mailbox update to write.
    pub(crate) dirty: Vec<usize>,
    /// Endpoints with rendezvous buffers out (their mailbox is watched).
    pub(crate) rndv_watch: Vec<usize>,
    /// Endpoints with a rendezvous request waiting for a destination buffer.
    pub(crate) rndv_wait: Vec<usize>,
    pub(crate) events: VecDeque<Event>,
    pub(crate) next_id: u64,
    pub(crate) stats: Stats,
    /// Some endpoint is closing, or down with its handle gone: `reap` has work.
    pub(crate) reap_pending: bool,
    /// XRC: this context's initiator towards each remote node.
    pub(crate) initiators: HashMap<u64, crate::xrc::Initiator>,
    wc: Vec<WorkCompletion>,
}

impl State {
    pub(crate) fn new(cfg: &Config) -> Self {
        Self {
            eps: Slab::new(),
            by_qpn: HashMap::new(),
            recv_slots: Slab::with_capacity(cfg.srq_depth as usize),
            pending_posts: Vec::new(),
            budget: Budget::new(cfg.srq_depth, cfg.credits),
            held: 0,
            needy: VecDeque::new(),
            recall_pressure: false,
            recall_watch: false,
            recall_watch_every: crate::recall::WATCH_SCAN,
            recv_seen: 0,
            recv_at_watch: 0,
            ready: VecDeque::new(),
            dirty: Vec::new(),
            rndv_watch: Vec::new(),
            rndv_wait: Vec::new(),
            events: VecDeque::new(),
            next_id: 1,
            stats: Stats::default(),
            reap_pending: false,
            initiators: HashMap::new(),
            wc: vec![WorkCompletion::EMPTY; POLL_BATCH],
        }
    }
}

/// What the context owns; endpoints and messages hold an `Arc` of it.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) cfg: Config,
    pub(crate) vctx: rdmx_verbs::Context,
    pub(crate) pd: ProtectionDomain,
    pub(crate) cq: CompletionQueue,
    pub(crate) srq: SharedReceiveQueue,
    pub(crate) mailbox: MemoryRegion,
    pub(crate) pool: BufferPool,
    /// Registrations of application bytes sent zero-copy (`send_shared`).
    pub(crate) regcache: RegCache,
    pub(crate) state: Mutex<State>,
    pub(crate) cond: Condvar,
    /// Post receive buffers in batches rather than one by one: set when posting is a round
    /// trip to another process (an XRC SRQ of a node whose domain another process hosts).
    pub(crate) batch_posts: bool,
    /// Inline payload limit actually usable (config capped by the device, less the header).
    pub(crate) inline_max: usize,
    pub(crate) max_inline_data: u32,
    pub(crate) mtu_bytes: u32,
    /// Ports of the device (two give endpoints an alternate path).
    pub(crate) ports: u8,
    /// XRC: the node (device and XRC domain) the context lives on.
    pub(crate) node: Option<Arc<crate::xrc::NodeInner>>,
    /// Device events of this context's node, shared out by whichever context of the node
    /// read them from the device (`NodeInner::share_event`).
    pub(crate) node_events: Mutex<VecDeque<rdmx_verbs::AsyncEvent>>,
    /// XRC: one connection exchange at a time per context (they share initiators).
    pub(crate) xrc_lock: Mutex<()>,
    pub(crate) context_id: u64,
    pub(crate) start: Instant,
    /// Nanoseconds since `start` of the last progress call by an application thread.
    pub(crate) last_app_poll: AtomicU64,
    /// Application threads (or futures) asleep waiting for progress (the background thread
    /// sleeps on the completion channel while there are any, and wakes them).
    pub(crate) sleepers: std::sync::atomic::AtomicUsize,
    /// Wakes pending futures (feature `tokio`).
    #[cfg(feature = "tokio")]
    pub(crate) notify: tokio::sync::Notify,
    pub(crate) stop: AtomicBool,
}

impl Shared {
    /// Wakes every waiter: threads asleep in `wait_until` and pending futures.
    pub(crate) fn wake_all(&self) {
        self.cond.notify_all();
        #[cfg(feature = "tokio")]
        self.notify.notify_waiters();
    }

    /// The background thread's tick (keepalives, credit recall).
    pub(crate) fn keepalive_tick(&self) -> Duration {
        (self.cfg.peer_timeout / 4).min(Duration::from_millis(100))
    }

    pub(crate) fn now_nanos(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    // ----------------------------------------------------------------- progress

    /// Polls the completion queue dry (bounded), routes completions, then does the
    /// follow-up work: refill the shared receive queue, hand out credits, write mailboxes,
    /// post deferred rendezvous reads. Returns the number of completions handled.
    pub(crate) fn progress(&self, st: &mut State) -> usize {
        let mut total = 0;
        for _ in 0..8 {
            let mut wc = std::mem::take(&mut st.wc);
            let n = self.cq.poll(&mut wc);
            for c in &wc[..n] {
                self.on_completion(st, c);
            }
            st.wc = wc;
            total += n;
            if n < POLL_BATCH {
                break;
            }
        }
        self.check_mailboxes(st);
        self.after(st);
        total
    }

    /// Follow-up work after state changed.
    pub(crate) fn after(&self, st: &mut State) {
        if self.batch_posts {
            // Posting may be a round trip to another process: grant what is already
            // posted first, so that senders do not wait on it.
            self.distribute(st);
        }
        self.refill(st);
        self.distribute(st);
        self.post_deferred_reads(st);
        self.flush_mailboxes(st);
        if st.reap_pending {
            self.reap(st);
        }
    }

    fn on_completion(&self, st: &mut State, c: &WorkCompletion) {
        match wrid::kind(c.wr_id) {
            wrid::RECV => self.on_recv(st, c),
            wrid::SEND => self.on_send(st, c),
            wrid::READ => self.on_read(st, c),
            _ => {}
        }
    }

    /// An RDMA WRITE with immediate: a [`Signal`] (the only use rdmx makes of them). It
    /// used a credit and a receive buffer, which goes back to the queue untouched.
    fn on_signal(&self, st: &mut State, c: &WorkCompletion, buf: Buf) {
        let qpn = c.qp_num.0;
        let routed = c.imm().and_then(Signal::from_imm).and_then(|(sig, tag)| {
            let k = usize::from(tag);
            st.eps
                .get(k)
                .is_some_and(|e| e.recv_qpn == qpn)
                .then_some((sig, k))
        });
        let Some((sig, k)) = routed else {
            st.stats.stray_completions += 1;
            st.stats.protocol_errors += 1;
            tracing::debug!(qpn, imm = ?c.imm(), "unexpected RDMA WRITE with immediate");
            if let Some(&k) = st.by_qpn.get(&qpn) {
                self.fail(
                    st,
                    k,
                    DisconnectCause::Protocol("unexpected RDMA WRITE with immediate".into()),
                );
            }
            self.repost(st, buf);
            return;
        };
        let credited = Self::take_credit(st, k);
        self.repost(st, buf);
        if !credited {
            st.stats.protocol_errors += 1;
            self.fail(
                st,
                k,
                DisconnectCause::Protocol("signal without a credit".into()),
            );
            return;
        }
        self.mark_needy(st, k);
        match sig {
            // The mailbox word landed before the completion.
            Signal::ReadDone => self.read_mailbox(st, k),
            Signal::RecallReturned => crate::recall::on_signal(self, st, k, true),
            Signal::RecallRequest => crate::recall::on_signal(self, st, k, false),
        }
    }

    /// The peer of endpoint `k` used one of our credits (its buffer was already counted as
    /// consumed). False when it had none: a protocol violation.
    fn take_credit(st: &mut State, k: usize) -> bool {
        let ok = st.eps.get_mut(k).is_some_and(|ep| ep.recv.on_receive());
        if ok {
            st.budget.outstanding = st.budget.outstanding.saturating_sub(1);
        }
        ok
    }

    fn on_recv(&self, st: &mut State, c: &WorkCompletion) {
        let slot = wrid::key(c.wr_id);
        let Some(mut buf) = st.recv_slots.try_remove(slot) else {
            return;
        };
        st.budget.posted = st.budget.posted.saturating_sub(1);
        st.recv_seen += 1;
        let qpn = c.qp_num.0;
        if c.status == WcStatus::Success && c.opcode == WcOpcode::RecvRdmaWithImm {
            self.on_signal(st, c, buf);
            return;
        }
        // Route by the header's tag (XRC needs it: one target queue pair carries the messages
        // of every endpoint behind a remote initiator), checked against the queue pair the
        // message came through. An RC message whose header is unreadable is still traced to
        // its endpoint by its queue pair, to take that endpoint down.
        let parsed = if c.status == WcStatus::Success && buf.set_len(c.byte_len as usize).is_ok() {
            Some(Header::parse(&buf))
        } else {
            None
        };
        let by_tag = match &parsed {
            Some(Ok(h)) => Some(usize::from(h.tag)),
            _ => st.by_qpn.get(&qpn).copied(),
        };
        let key = by_tag.filter(|&k| st.eps.get(k).is_some_and(|e| e.recv_qpn == qpn));
        let hdr = match (parsed, key) {
            (Some(Ok(h)), Some(_)) => h,
            (parsed, key) => {
                st.stats.stray_completions += 1;
                tracing::debug!(
                    status = ?c.status,
                    qpn,
                    opcode = ?c.opcode,
                    byte_len = c.byte_len,
                    tag = ?by_tag,
                    recv_qpn = ?by_tag.and_then(|k| st.eps.get(k)).map(|e| e.recv_qpn),
                    header_ok = matches!(parsed, Some(Ok(_))),
                    "stray receive completion"
                );
                let cause = match parsed {
                    Some(Err(e)) => {
                        st.stats.protocol_errors += 1;
                        Some(DisconnectCause::Protocol(e.to_string()))
                    }
                    None if c.status != WcStatus::WrFlushErr => {
                        tracing::debug!(status = ?c.status, qpn, "receive completion error");
                        Some(DisconnectCause::TransportError(format!("{:?}", c.status)))
                    }
                    _ => None,
                };
                if let (Some(k), Some(cause)) = (key, cause) {
                    self.fail(st, k, cause);
                }
                self.repost(st, buf);
                return;
            }
        };
        let Some(k) = key else { return };
        // The peer used one of our credits.
        let credited = {
            let ep = &mut st.eps[k];
            ep.last_rx = Instant::now();
            ep.keepalive_at = None;
            Self::take_credit(st, k)
        };
        if !credited {
            st.stats.protocol_errors += 1;
            self.fail(
                st,
                k,
                DisconnectCause::Protocol("message without a credit".into()),
            );
            self.repost(st, buf);
            return;
        }
        self.mark_needy(st, k);
        self.apply_peer_counters(
            st,
            k,
            Mailbox {
                grant: hdr.grant,
                rndv_done: hdr.rndv_done,
            },
        );
        match hdr.kind {
            Kind::Data => {
                st.held += 1;
                st.eps[k].inbox.push_back(Inbound::Msg {
                    buf,
                    off: HEADER_LEN,
                    eager: true,
                });
                st.mark_ready(k);
            }
            Kind::Rts => {
                let rts = RtsInfo::parse(&buf);
                self.repost(st, buf);
                let Some(rts) = rts else { return };
                if hdr.len as usize > self.cfg.max_message {
                    st.stats.protocol_errors += 1;
                    self.fail(
                        st,
                        k,
                        DisconnectCause::Protocol(format!(
                            "rendezvous message of {} bytes exceeds max_message",
                            hdr.len
                        )),
                    );
                    return;
                }
                let ep = &mut st.eps[k];
                ep.rndv_queued += 1;
                ep.rndv_in_seen = ep.rndv_in_seen.wrapping_add(1);
                if hdr.flags & Header::WAKE_ON_READ != 0 {
                    let outstanding = ep.rndv_in_seen.wrapping_sub(ep.rndv_in_done);
                    ep.rndv_wake_at = Some(ep.rndv_in_done.wrapping_add(outstanding.div_ceil(2)));
                }
                st.eps[k].inbox.push_back(Inbound::Rndv {
                    len: hdr.len,
                    rts,
                    dest: None,
                    posted: false,
                    done: false,
                });
                if !st.rndv_wait.contains(&k) {
                    st.rndv_wait.push(k);
                }
            }
            Kind::Close => {
                self.repost(st, buf);
                let ep = &mut st.eps[k];
                ep.peer_closed = true;
                ep.inbox.push_back(Inbound::Closed);
                if ep.status == Status::Open {
                    // Answer with our own Close once our sends drain (see `reap`).
                    ep.status = Status::Closing;
                }
                st.reap_pending = true;
            }
        }
    }

    fn on_send(&self, st: &mut State, c: &WorkCompletion) {
        let k = wrid::key(c.wr_id);
        let seq = wrid::seq(c.wr_id);
        let Some(ep) = st.eps.get_mut(k) else { return };
        if ep.qpn != c.qp_num.0 {
            return;
        }
        ep.signaled_out = ep.signaled_out.saturating_sub(1);
        // On an RC queue pair completions are in order: everything up to `seq` is done.
        while let Some((s, _)) = ep.inflight.front() {
            let s = *s;
            if rdmx_core::header::seq_after(s, seq) {
                break;
            }
            let Some((s, hold)) = ep.inflight.pop_front() else {
                break;
            };
            if let Hold::Op(src) = hold {
                let buf = match src {
                    OpSource::Buf(b) => Some(b),
                    OpSource::None | OpSource::Shared(_) => None,
                };
                let status = if s == seq {
                    c.status
                } else {
                    WcStatus::Success
                };
                ep.ops_done.push(OpResult {
                    seq: s,
                    status,
                    buf,
                });
            }
        }
        if c.status != WcStatus::Success {
            let cause = match c.status {
                WcStatus::RetryExcErr => {
                    DisconnectCause::PeerUnreachable("transport retries exhausted".into())
                }
                WcStatus::RnrRetryExcErr => {
                    DisconnectCause::PeerUnreachable("receiver not ready, retries exhausted".into())
                }
                WcStatus::RemAccessErr if c.opcode == WcOpcode::RdmaWrite => {
                    // A one-sided write the application asked for: reported to the caller,
                    // but the QP is in the error state now, so the endpoint is down too.
                    DisconnectCause::TransportError("remote access error".into())
                }
                s => DisconnectCause::TransportError(format!("{s:?}")),
            };
            if c.status != WcStatus::WrFlushErr || ep.is_open() {
                self.fail_qp(st, c.qp_num.0, cause);
            }
        }
    }

    /// A queue pair broke: every endpoint sending on it goes down (one for RC; all the
    /// endpoints behind an XRC initiator), and a broken initiator is forgotten so the next
    /// connection to that node makes a new one.
    fn fail_qp(&self, st: &mut State, qpn: u32, cause: DisconnectCause) {
        let keys: Vec<usize> = st
            .eps
            .iter()
            .filter(|(_, e)| e.qpn == qpn)
            .map(|(k, _)| k)
            .collect();
        st.initiators.retain(|_, i| i.qp.qp_num().0 != qpn);
        for k in keys {
            self.fail(st, k, cause.clone());
        }
    }

    fn on_read(&self, st: &mut State, c: &WorkCompletion) {
        let k = wrid::key(c.wr_id);
        let Some(ep) = st.eps.get_mut(k) else { return };
        if ep.qpn != c.qp_num.0 {
            return;
        }
        ep.signaled_out = ep.signaled_out.saturating_sub(1);
        // Reads complete in the order they were posted: the first posted, unfinished one.
        let at = ep.inbox.iter().position(|i| {
            matches!(
                i,
                Inbound::Rndv {
                    posted: true,
                    done: false,
                    ..
                }
            )
        });
        if let Some(at) = at {
            if c.status == WcStatus::Success {
                if let Some(Inbound::Rndv { done, .. }) = ep.inbox.get_mut(at) {
                    *done = true;
                }
            } else {
                // The message never arrived: it must not be delivered with whatever its
                // buffer held. The read is over, so the NIC no longer writes the buffer.
                ep.inbox.remove(at);
                ep.rndv_queued = ep.rndv_queued.saturating_sub(1);
            }
        }
        ep.inflight.retain(|(s, _)| *s != wrid::seq(c.wr_id));
        if c.status == WcStatus::Success {
            ep.rndv_in_done = ep.rndv_in_done.wrapping_add(1);
            if !st.dirty.contains(&k) {
                st.dirty.push(k);
            }
            if at.is_some() {
                st.mark_ready(k);
            }
        } else if c.status != WcStatus::WrFlushErr {
            self.fail_qp(
                st,
                c.qp_num.0,
                DisconnectCause::TransportError(format!("rendezvous read: {:?}", c.status)),
            );
        }
    }

    /// Applies cumulative counters from the peer (piggybacked or from the mailbox).
    fn apply_peer_counters(&self, st: &mut State, k: usize, m: Mailbox) {
        let ep = &mut st.eps[k];
        ep.send.update(m.grant);
        while rdmx_core::header::seq_after(m.rndv_done, ep.rndv_out_done) {
            if ep.rndv_out.pop_front().is_none() {
                break;
            }
            ep.rndv_out_done = ep.rndv_out_done.wrapping_add(1);
        }
        if ep.rndv_out.is_empty() {
            st.rndv_watch.retain(|&x| x != k);
        }
    }

    /// Reads the mailbox slot of one endpoint and applies it.
    pub(crate) fn read_mailbox(&self, st: &mut State, k: usize) {
        let Some(ep) = st.eps.get(k) else { return };
        let mut b = [0u8; 8];
        if self.mailbox.read(ep.mailbox_off, &mut b).is_err() {
            return;
        }
        let m = Mailbox::from_word(u64::from_be_bytes(b));
        if m != ep.mailbox_seen {
            st.eps[k].mailbox_seen = m;
            self.apply_peer_counters(st, k, m);
        }
    }

    fn check_mailboxes(&self, st: &mut State) {
        let watch = std::mem::take(&mut st.rndv_watch);
        for &k in &watch {
            self.read_mailbox(st, k);
        }
        for k in watch {
            if st.eps.get(k).is_some_and(|e| !e.rndv_out.is_empty()) && !st.rndv_watch.contains(&k)
            {
                st.rndv_watch.push(k);
            }
        }
    }

    // ----------------------------------------------------------------- receive buffers

    /// Puts a receive buffer back on the shared receive queue (or back in the pool when the
    /// queue is full). With `batch_posts` it joins the pending batch, posted by
    /// [`flush_posts`](Self::flush_posts) once a sixteenth of the queue is waiting or at the
    /// end of the next progress.
    pub(crate) fn repost(&self, st: &mut State, buf: Buf) {
        if st.budget.posted + st.pending_posts.len() as u64 >= u64::from(self.cfg.srq_depth) {
            return;
        }
        let slot = st.recv_slots.insert(buf);
        if self.batch_posts {
            st.pending_posts.push(slot);
            if st.pending_posts.len() as u64 >= (u64::from(self.cfg.srq_depth) / 16).max(1) {
                self.flush_posts(st);
            }
            return;
        }
        let Some(buf) = st.recv_slots.get(slot) else {
            return;
        };
        let sge = buf.sge_at(0, buf.capacity());
        let wr = RecvWr::new(wrid::make(wrid::RECV, slot, 0), std::slice::from_ref(&sge));
        match self.srq.post_recv(&wr) {
            Ok(()) => {
                st.budget.on_post(1);
                st.stats.recv_posted += 1;
            }
            Err(e) => {
                tracing::warn!("posting a receive buffer failed: {e}");
                st.recv_slots.remove(slot);
            }
        }
    }

    /// Posts the pending batch of receive buffers with one call.
    pub(crate) fn flush_posts(&self, st: &mut State) {
        if st.pending_posts.is_empty() {
            return;
        }
        let slots = std::mem::take(&mut st.pending_posts);
        let sges: Vec<_> = slots
            .iter()
            .filter_map(|&s| st.recv_slots.get(s).map(|b| b.sge_at(0, b.capacity())))
            .collect();
        let wrs: Vec<RecvWr<'_>> = slots
            .iter()
            .zip(&sges)
            .map(|(&slot, sge)| {
                RecvWr::new(wrid::make(wrid::RECV, slot, 0), std::slice::from_ref(sge))
            })
            .collect();
        let posted = match self.srq.post_recv_list(&wrs) {
            Ok(()) => wrs.len(),
            Err((i, e)) => {
                tracing::warn!(
                    "posting receive buffers failed at {i} of {}: {e}",
                    wrs.len()
                );
                i
            }
        };
        drop(wrs);
        for &slot in &slots[posted..] {
            st.recv_slots.try_remove(slot);
        }
        st.budget.on_post(posted as u64);
        st.stats.recv_posted += posted as u64;
    }

    /// An eager message buffer came back from the application.
    pub(crate) fn recycle(&self, st: &mut State, buf: Buf) {
        st.held = st.held.saturating_sub(1);
        self.repost(st, buf);
    }

    /// Keeps the shared receive queue full from the pool, as long as the application does not
    /// hold more than a queue's worth of buffers (beyond that, senders wait for credits).
    ///
    /// It waits until a sixteenth of the queue is missing and then posts them together, so
    /// the receive path does not post a buffer per message (a lone endpoint's credits come
    /// from the spare buffers meanwhile). Below the queue's SRQ limit the SRQ-limit event
    /// triggers it too.
    fn refill(&self, st: &mut State) {
        // Batched posting: buffers wait until a sixteenth of the queue is missing (below),
        // or at once when every posted buffer is promised to a sender.
        if !st.pending_posts.is_empty() && st.budget.spare() == 0 {
            self.flush_posts(st);
        }
        let depth = u64::from(self.cfg.srq_depth);
        let batch = (depth / 16).max(1);
        if st.budget.posted + batch > depth && st.budget.spare() > 0 {
            return;
        }
        loop {
            let queued = st.budget.posted + st.pending_posts.len() as u64;
            if queued >= depth || queued + st.held >= 2 * depth {
                break;
            }
            match self.pool.try_alloc(self.cfg.recv_buf_size()) {
                Ok(b) => {
                    let before = st.budget.posted + st.pending_posts.len() as u64;
                    self.repost(st, b);
                    if st.budget.posted + st.pending_posts.len() as u64 == before {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        self.flush_posts(st);
    }

    pub(crate) fn mark_needy(&self, st: &mut State, k: usize) {
        if let Some(ep) = st.eps.get_mut(k)
            && !ep.in_needy
        {
            ep.in_needy = true;
            st.needy.push_back(k);
        }
    }

    /// Hands spare posted buffers to endpoints below their target window.
    fn distribute(&self, st: &mut State) {
        let mut rounds = st.needy.len();
        while st.budget.spare() > 0 && rounds > 0 {
            rounds -= 1;
            let Some(k) = st.needy.pop_front() else { break };
            let Some(ep) = st.eps.get_mut(k) else {
                continue;
            };
            if !ep.is_open() && ep.status != Status::Closing {
                ep.in_needy = false;
                continue;
            }
            let target = st.budget.target();
            // Undelivered rendezvous messages occupy the window like unread eager ones.
            let window = target.saturating_sub(ep.rndv_queued);
            while ep.recv.outstanding() < window && st.budget.spare() > 0 {
                st.budget.grant(&mut ep.recv);
            }
            let told = ep.recv.advertised.wrapping_sub(ep.recv.received);
            // Tell the peer once it is down to half its window, and then only with a
            // quarter window's worth, unless it has nothing left: a write per freed buffer
            // (the silly-window pattern) costs the receiver a send per message once the
            // sender runs ahead of it.
            let unadvertised = ep.recv.unadvertised();
            let worth = told == 0 || unadvertised >= (target / 4).max(1);
            if unadvertised > 0 && told <= target / 2 && worth && !st.dirty.contains(&k) {
                st.dirty.push(k);
            }
            if ep.recv.outstanding() < window {
                st.needy.push_back(k);
            } else {
                ep.in_needy = false;
            }
        }
    }

    /// Writes pending grants and rendezvous-done counts into peers' mailboxes.
    fn flush_mailboxes(&self, st: &mut State) {
        let dirty = std::mem::take(&mut st.dirty);
        for k in dirty {
            let Some(ep) = st.eps.get_mut(k) else {
                continue;
            };
            if !matches!(ep.status, Status::Open | Status::Closing) {
                continue;
            }
            if ep.recv.unadvertised() == 0 && ep.rndv_in_done == ep.rndv_in_adv {
                continue;
            }
            if ep.sq_used() + 1 >= ep.sq_depth {
                st.dirty.push(k);
                continue;
            }
            let m = Mailbox {
                grant: ep.recv.advertise(),
                rndv_done: ep.rndv_in_done,
            };
            // A sender whose rendezvous window is full asked to be woken once half of it is
            // read; that takes a credit (without one, it finds out by polling).
            let wake = ep
                .rndv_wake_at
                .is_some_and(|at| !rdmx_core::header::seq_after(at, ep.rndv_in_done));
            if wake {
                ep.rndv_wake_at = None;
            }
            ep.rndv_in_adv = ep.rndv_in_done;
            let bytes = m.to_word().to_be_bytes();
            let (addr, rkey) = ep.peer_mailbox;
            let remote_addr = addr;
            let rkey = rdmx_verbs::Rkey(rkey);
            let op = if wake && ep.is_open() && ep.send.take() {
                st.stats.read_done_signals += 1;
                WrOpcode::RdmaWriteWithImm {
                    remote_addr,
                    rkey,
                    imm: Signal::ReadDone.to_imm(ep.peer_tag),
                }
            } else {
                WrOpcode::RdmaWrite { remote_addr, rkey }
            };
            if let Err(e) = post_on(ep, op, PostData::Inline(&bytes), Hold::None, false) {
                tracing::debug!("mailbox write failed: {e}");
                continue;
            }
            st.stats.mailbox_writes += 1;
        }
    }

    /// Allocates destinations for waiting rendezvous requests and posts their reads, in order.
    fn post_deferred_reads(&self, st: &mut State) {
        if st.rndv_wait.is_empty() {
            return;
        }
        let waiting = std::mem::take(&mut st.rndv_wait);
        for k in waiting {
            let Some(ep) = st.eps.get_mut(k) else {
                continue;
            };
            let mut blocked = false;
            for entry in ep.inbox.iter_mut() {
                let Inbound::Rndv {
                    len,
                    rts,
                    dest,
                    posted,
                    ..
                } = entry
                else {
                    continue;
                };
                if *posted {
                    continue;
                }
                if ep.inflight.len() as u32 + 1 >= ep.sq_depth {
                    blocked = true;
                    break;
                }
                if dest.is_none() {
                    match self.pool.try_alloc(*len as usize) {
                        Ok(b) => *dest = Some(b),
                        Err(_) => {
                            blocked = true;
                            break;
                        }
                    }
                }
                let Some(d) = dest.as_ref() else { break };
                let sge = d.sge();
                let seq = ep.next_seq;
                ep.next_seq = ep.next_seq.wrapping_add(1);
                let mut wr = SendWr::new(
                    wrid::make(wrid::READ, k, seq),
                    WrOpcode::RdmaRead {
                        remote_addr: rts.addr,
                        rkey: rdmx_verbs::Rkey(rts.rkey),
                    },
                    std::slice::from_ref(&sge),
                )
                .signaled();
                wr.remote_srqn = ep.remote_srqn;
                match ep.qp.post_send(&wr) {
                    Ok(()) => {
                        ep.inflight.push_back((seq, Hold::None));
                        ep.signaled_out += 1;
                        *posted = true;
                    }
                    Err(e) => {
                        tracing::debug!("posting a rendezvous read failed: {e}");
                        blocked = true;
                        break;
                    }
                }
            }
            if blocked {
                st.rndv_wait.push(k);
            }
        }
    }

    // ----------------------------------------------------------------- endpoint life

    /// Takes an endpoint down: its queue pair goes to the error state (flushing what is
    /// posted), the application is told.
    pub(crate) fn fail(&self, st: &mut State, k: usize, cause: DisconnectCause) {
        let Some(ep) = st.eps.get_mut(k) else { return };
        if matches!(ep.status, Status::Down(_)) {
            return;
        }
        tracing::debug!(endpoint = ep.id, %cause, "endpoint down");
        ep.status = Status::Down(cause.clone());
        // A shared XRC initiator stays up for the other endpoints (it is failed as a whole
        // by `fail_qp` when it breaks).
        if Arc::strong_count(&ep.qp) == 1 {
            let _ = ep.qp.modify(
                &QpAttr {
                    qp_state: QpState::Err,
                    ..QpAttr::default()
                },
                QpAttrMask::STATE,
            );
        }
        ep.signaled_out = 0;
        // Operations still waiting get an error now. Their buffers, like every buffer a
        // posted work request names, stay in the endpoint until the flush completion of that
        // request arrives or the queue pair is destroyed: a NIC may still be using them.
        for (s, hold) in ep.inflight.iter_mut() {
            if let Hold::Op(src) = hold {
                ep.ops_done.push(OpResult {
                    seq: *s,
                    status: WcStatus::WrFlushErr,
                    buf: None,
                });
                *hold = match std::mem::replace(src, OpSource::None) {
                    OpSource::None => Hold::None,
                    OpSource::Buf(b) => Hold::Buf(b),
                    OpSource::Shared(r) => Hold::Shared(r),
                };
            }
        }
        // Rendezvous buffers stay too (released with the queue pair); nobody needs to
        // watch for their release any more.
        st.rndv_watch.retain(|&x| x != k);
        st.events.push_back(Event::Disconnected {
            endpoint: ep.id,
            cause,
        });
        st.reap_pending = true;
        self.wake_all();
    }

    /// Sends the Close of endpoints that are closing and drained; removes endpoints that are
    /// down and whose handle is gone.
    fn reap(&self, st: &mut State) {
        // A closing endpoint whose last send used its last credit needs the peer's next
        // grant for its Close, and grants written into the mailbox are only noticed when
        // read: nothing else reads it once the application stopped sending.
        let starved: Vec<usize> = st
            .eps
            .iter()
            .filter(|(_, ep)| {
                ep.status == Status::Closing && !ep.close_sent && ep.send.available() == 0
            })
            .map(|(k, _)| k)
            .collect();
        for k in starved {
            self.read_mailbox(st, k);
        }
        let mut remove = Vec::new();
        for (k, ep) in st.eps.iter_mut() {
            if ep.status == Status::Closing
                && !ep.close_sent
                && ep.drained()
                && ep.send.available() > 0
            {
                let h = Header {
                    kind: Kind::Close,
                    tag: ep.peer_tag,
                    grant: ep.recv.advertise(),
                    rndv_done: ep.rndv_in_done,
                    len: 0,
                    flags: 0,
                };
                ep.rndv_in_adv = ep.rndv_in_done;
                ep.send.take();
                if post_on(
                    ep,
                    WrOpcode::Send,
                    PostData::Inline(&h.to_bytes()),
                    Hold::None,
                    true,
                )
                .is_ok()
                {
                    ep.close_sent = true;
                }
            }
            if ep.status == Status::Closing
                && ep.close_sent
                && ep.peer_closed
                && ep.signaled_out == 0
            {
                ep.status = Status::Down(DisconnectCause::PeerClosed);
                // The event comes after the last message the peer sent before closing has
                // been taken (see `inbox.rs`): an application that drops the endpoint on the
                // event loses nothing.
                if ep.has_pending_messages() {
                    ep.close_event_due = true;
                } else {
                    st.events.push_back(Event::Disconnected {
                        endpoint: ep.id,
                        cause: DisconnectCause::PeerClosed,
                    });
                }
            }
            if ep.detached && matches!(ep.status, Status::Down(_)) {
                remove.push(k);
            }
        }
        for k in remove {
            self.remove(st, k);
        }
        st.reap_pending = st.eps.iter().any(|(_, e)| {
            e.status == Status::Closing || (e.detached && matches!(e.status, Status::Down(_)))
        });
    }

    /// Destroys an endpoint's queue pair and frees its credits and buffers.
    pub(crate) fn remove(&self, st: &mut State, k: usize) {
        let Some(ep) = st.eps.try_remove(k) else {
            return;
        };
        if st.by_qpn.get(&ep.qpn) == Some(&k) {
            st.by_qpn.remove(&ep.qpn);
        }
        st.budget.remove_endpoint(&ep.recv);
        st.needy.retain(|&x| x != k);
        st.ready.retain(|&x| x != k);
        st.dirty.retain(|&x| x != k);
        st.rndv_watch.retain(|&x| x != k);
        st.rndv_wait.retain(|&x| x != k);
        let _ = self.mailbox.write(ep.mailbox_off, &[0; MAILBOX_LEN]);
        // Eager buffers still queued go back to the receive queue.
        let mut ep = ep;
        for i in ep.inbox.drain(..) {
            if let Inbound::Msg {
                buf, eager: true, ..
            } = i
            {
                st.held = st.held.saturating_sub(1);
                self.repost(st, buf);
            }
        }
        // Dropping the queue pair destroys it; the verbs layer guarantees the NIC no longer
        // touches the buffers held by its work requests once that returns.
        drop(ep);
    }
}
