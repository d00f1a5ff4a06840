//! The state shared by a context and its endpoints, and the progress engine that drives it.
//!
//! Everything mutable lives in one [`State`] behind one lock. Any thread that needs something
//! (a message, a credit, a buffer) takes the lock, runs [`Shared::progress`] — which polls the
//! completion queue and routes each completion to its endpoint — and looks again. There is no
//! hand-off to another thread on the latency path: the thread that waits is the thread that
//! polls. A background thread (see `progress.rs`) only takes over when nobody is polling.
//!
//! This file holds the state and the completion routing; the rest of the engine's methods
//! live next to it: `grants.rs` (receive buffers and credits), `rndv.rs` (rendezvous reads
//! and mailboxes), `recall.rs` (credit recall), `send.rs` (sending, packed frames),
//! `teardown.rs` (failing and removing endpoints) and `progress.rs` (waiting, and the
//! context's threads).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdmx_core::credit::Budget;
use rdmx_core::header::{HEADER_LEN, Header, Kind, PackedEntries, RtsInfo};
use rdmx_core::pool::BufferPool;
use rdmx_core::regcache::RegCache;
use rdmx_core::worker::{Cx, TransportId, Wait, Worker, WorkerState};
use rdmx_core::{Buf, Config, DisconnectCause};
use rdmx_verbs::{
    CompletionQueue, MemoryRegion, ProtectionDomain, SharedReceiveQueue, WcOpcode, WcStatus,
    WorkCompletion,
};
use slab::Slab;

use crate::ep::{Ep, Hold, Inbound, OpResult, OpSource, Status, wrid};
use crate::wire::{Mailbox, Signal};

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
    /// Sends that found no credit (or no send slot, pool buffer or room in the rendezvous
    /// window) at first and had to wait or give up with `WouldBlock`.
    pub credit_waits: u64,
    /// Receive buffers posted on the shared receive queue.
    pub recv_posted: u64,
    /// Receive completions with an unknown or finished queue pair (buffer reposted).
    pub stray_completions: u64,
    /// Protocol violations by peers (their endpoint was closed).
    pub protocol_errors: u64,
    /// Credits idle peers gave back on request (credit recall).
    pub credits_recalled: u64,
    /// Credits given back unasked by idle endpoints while another endpoint to the same
    /// peer context starved (so that the peer grants them to it).
    pub credits_lent: u64,
    /// Recall requests and answers sent as signals (RDMA WRITE with immediate), which the
    /// peer acts on at once instead of at its next tick.
    pub recall_signals: u64,
    /// Small messages sent packed into a shared frame (inside send batches).
    pub sent_packed: u64,
    /// Packed frames sent (each one SEND, one receive buffer and one credit at the peer).
    pub packed_frames: u64,
    /// Rendezvous reads reported as signals (the sender had asked, its rendezvous window
    /// being full), which wake the sender at once.
    pub read_done_signals: u64,
    /// Events dropped because the application let [`MAX_EVENTS`](crate::MAX_EVENTS) pile up without calling
    /// `Context::poll_event` (the oldest go first).
    pub events_dropped: u64,
    /// Now, not a count: receive buffers held by messages the application has not dropped
    /// yet or that wait in inboxes (eager messages, and packed frames with a message
    /// alive). While it is a receive queue's worth or more, the queue does not refill.
    pub recv_held: u64,
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
    /// Endpoints whose peer closes with no credit left and waits for one
    /// (`RecallState::close_wanted`): each may have one buffer posted beyond the bound
    /// that `held` sets, so that a Close gets through even when the application holds a
    /// full queue's worth of messages.
    pub(crate) close_wanted: u64,
    pub(crate) needy: VecDeque<usize>,
    /// A peer starved at the last recall scan: scan again after `recall::PRESSURE_SCAN`.
    pub(crate) recall_pressure: bool,
    /// Every posted buffer backs a credit and some endpoint holds none: scan the starving
    /// flags every `recall_watch_every`.
    pub(crate) recall_watch: bool,
    /// The watch interval: `recall::WATCH_SCAN` when the watch starts or a peer starved,
    /// doubling after every scan that finds none, up to the tick.
    pub(crate) recall_watch_every: Duration,
    /// When the starving flags were last looked at (by the background thread, or by an
    /// application thread in `after`).
    pub(crate) recall_scanned_at: Option<Instant>,
    /// Receive completions so far, and their number at the last watch scan: a context that
    /// received nothing since keeps backing its watch off.
    pub(crate) recv_seen: u64,
    pub(crate) recv_at_watch: u64,
    /// Endpoints with a mailbox update to write.
    pub(crate) dirty: Vec<usize>,
    /// Endpoints with rendezvous buffers out (their mailbox is watched).
    pub(crate) rndv_watch: Vec<usize>,
    /// Endpoints with a rendezvous request waiting for a destination buffer.
    pub(crate) rndv_wait: Vec<usize>,
    /// Endpoints with a packed frame open (see `send.rs`).
    pub(crate) packs: Vec<usize>,
    /// When the pack flusher posts the open packed frames: set when a frame opens and none
    /// is due yet.
    pub(crate) pack_due: Option<Instant>,
    pub(crate) next_id: u64,
    pub(crate) stats: Stats,
    /// Some endpoint is closing, or down with its handle gone: `reap` has work.
    pub(crate) reap_pending: bool,
    /// XRC: this context's initiator towards each remote node.
    pub(crate) initiators: HashMap<u64, crate::xrc::Initiator>,
    /// When the background tick next runs keepalives (see `transport.rs`).
    pub(crate) next_keepalive: Instant,
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
            close_wanted: 0,
            needy: VecDeque::new(),
            recall_pressure: false,
            recall_watch: false,
            recall_watch_every: crate::recall::WATCH_SCAN,
            recall_scanned_at: None,
            recv_seen: 0,
            recv_at_watch: 0,
            dirty: Vec::new(),
            rndv_watch: Vec::new(),
            rndv_wait: Vec::new(),
            packs: Vec::new(),
            pack_due: None,
            next_id: 1,
            stats: Stats::default(),
            reap_pending: false,
            initiators: HashMap::new(),
            next_keepalive: Instant::now(),
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
    /// This transport's number in its worker.
    pub(crate) tid: TransportId,
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
}

/// An RC transport as its handles (context, endpoints, listener) reach it: the worker it
/// lives in, and its shared resources. (The worker holds the transport's mutable state, and
/// the transport holds the shared resources: the resources do not hold the worker.)
#[derive(Debug, Clone)]
pub(crate) struct RcRef {
    pub(crate) w: Worker,
    pub(crate) sh: Arc<Shared>,
}

impl RcRef {
    /// Runs `f` on the transport under the worker's lock.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&Shared, &mut State, &mut Cx<'_>) -> R) -> R {
        let mut ws = self.w.lock();
        self.on(&mut ws, f)
    }

    /// Runs `f` on the transport, the worker's lock held (`ws`).
    pub(crate) fn on<R>(
        &self,
        ws: &mut WorkerState,
        f: impl FnOnce(&Shared, &mut State, &mut Cx<'_>) -> R,
    ) -> R {
        // The RC transport was added at `tid` when the context was made, and transports
        // are never removed (they go with the worker, which this handle keeps alive).
        let (t, core) = ws
            .transport::<crate::transport::RcTransport>(self.sh.tid)
            .expect("the RC transport of a context is in its worker");
        let mut cx = core.cx(&self.w, self.sh.tid);
        f(&self.sh, &mut t.st, &mut cx)
    }

    /// A wait for a message (or the end) on endpoint `k`.
    pub(crate) fn wait_message(&self, k: usize) -> Wait {
        Wait::message(self.sh.tid, k)
    }

    /// A wait for something else of endpoint `k` (credits, send slots, operations).
    pub(crate) fn wait_endpoint(&self, k: usize) -> Wait {
        Wait::endpoint(self.sh.tid, k)
    }
}

impl Shared {
    /// Something happened on endpoint `k` (a message, a completion, credits, a state
    /// change): its waiters spin on, and its sleepers wake ([`Cx::touch`]).
    pub(crate) fn touch(st: &mut State, cx: &mut Cx<'_>, k: usize) {
        if let Some(ep) = st.eps.get_mut(k) {
            cx.touch(&mut ep.wait);
        }
    }

    /// Records activity on endpoint `k` without waking its sleepers ([`Cx::stir`]).
    pub(crate) fn stir(st: &mut State, cx: &mut Cx<'_>, k: usize) {
        if let Some(ep) = st.eps.get_mut(k) {
            cx.stir(&mut ep.wait);
        }
    }

    /// The background thread's tick (keepalives, credit recall).
    pub(crate) fn keepalive_tick(&self) -> Duration {
        (self.cfg.peer_timeout / 4).min(Duration::from_millis(100))
    }

    // ----------------------------------------------------------------- progress

    /// Polls the completion queue dry (bounded), routes completions, then does the
    /// follow-up work: refill the shared receive queue, hand out credits, write mailboxes,
    /// post deferred rendezvous reads. Returns the number of completions handled.
    pub(crate) fn progress(&self, st: &mut State, cx: &mut Cx<'_>) -> usize {
        let mut total = 0;
        for _ in 0..8 {
            let mut wc = std::mem::take(&mut st.wc);
            let n = self.cq.poll(&mut wc);
            for c in &wc[..n] {
                self.on_completion(st, cx, c);
            }
            st.wc = wc;
            total += n;
            if n < POLL_BATCH {
                break;
            }
        }
        self.check_mailboxes(st, cx);
        self.after(st, cx);
        total
    }

    /// Follow-up work after state changed.
    pub(crate) fn after(&self, st: &mut State, cx: &mut Cx<'_>) {
        // Whoever makes progress (a thread that waits or polls, the background thread)
        // sends the packed frames still open: they wait for no more than that.
        if !st.packs.is_empty() {
            self.flush_packs(st);
        }
        // While every buffer is promised and some endpoint is below its window (or a peer
        // starves), a thread that makes progress anyway also looks at the starving flags,
        // every WATCH_SCAN (PRESSURE_SCAN): the background thread backs off to its tick
        // while nothing arrives, and a newcomer with no credit would wait for it. (The
        // condition is checked here too, not only at the scans that set `recall_watch`: a
        // context whose last buffer was just promised must not wait for a tick to start.)
        let scarce = st.budget.spare() == 0 && !st.needy.is_empty();
        if st.recall_watch || st.recall_pressure || scarce {
            let now = Instant::now();
            let every = if st.recall_pressure {
                crate::recall::PRESSURE_SCAN
            } else {
                crate::recall::WATCH_SCAN
            };
            if st
                .recall_scanned_at
                .is_none_or(|t| now.duration_since(t) >= every)
            {
                st.recall_scanned_at = Some(now);
                crate::recall::tick(self, st, cx, now);
            }
        }
        if self.batch_posts {
            // Posting may be a round trip to another process: grant what is already
            // posted first, so that senders do not wait on it.
            self.distribute(st);
        }
        self.refill(st);
        self.distribute(st);
        self.post_deferred_reads(st, cx);
        self.flush_mailboxes(st);
        if st.reap_pending {
            self.reap(st, cx);
        }
    }

    fn on_completion(&self, st: &mut State, cx: &mut Cx<'_>, c: &WorkCompletion) {
        match wrid::kind(c.wr_id) {
            wrid::RECV => self.on_recv(st, cx, c),
            wrid::SEND => self.on_send(st, cx, c),
            wrid::READ => self.on_read(st, cx, c),
            _ => {}
        }
    }

    /// An RDMA WRITE with immediate: a [`Signal`] (the only use rdmx makes of them). It
    /// used a credit and a receive buffer, which goes back to the queue untouched.
    fn on_signal(&self, st: &mut State, cx: &mut Cx<'_>, c: &WorkCompletion, buf: Buf) {
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
                    cx,
                    k,
                    DisconnectCause::Protocol("unexpected RDMA WRITE with immediate".into()),
                );
            }
            self.repost(st, buf);
            return;
        };
        Self::touch(st, cx, k);
        let credited = Self::take_credit(st, k);
        self.repost(st, buf);
        if !credited {
            st.stats.protocol_errors += 1;
            self.fail(
                st,
                cx,
                k,
                DisconnectCause::Protocol("signal without a credit".into()),
            );
            return;
        }
        self.mark_needy(st, k);
        match sig {
            // The mailbox word landed before the completion.
            Signal::ReadDone => self.read_mailbox(st, cx, k),
            Signal::RecallReturned => crate::recall::on_signal(self, st, cx, k, true),
            Signal::RecallRequest => crate::recall::on_signal(self, st, cx, k, false),
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

    fn on_recv(&self, st: &mut State, cx: &mut Cx<'_>, c: &WorkCompletion) {
        let slot = wrid::key(c.wr_id);
        let Some(mut buf) = st.recv_slots.try_remove(slot) else {
            return;
        };
        st.budget.posted = st.budget.posted.saturating_sub(1);
        st.recv_seen += 1;
        let qpn = c.qp_num.0;
        if c.status == WcStatus::Success && c.opcode == WcOpcode::RecvRdmaWithImm {
            self.on_signal(st, cx, c, buf);
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
                    self.fail(st, cx, k, cause);
                }
                self.repost(st, buf);
                return;
            }
        };
        let Some(k) = key else { return };
        // A rendezvous request wakes nobody: its message is deliverable only once read, and
        // the read completion wakes the receiver then (a thread waiting for a message used to
        // wake here for nothing, then again for the read). Senders it gives credits to are
        // woken below.
        if hdr.kind == Kind::Rts {
            Self::stir(st, cx, k);
        } else {
            Self::touch(st, cx, k);
        }
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
                cx,
                k,
                DisconnectCause::Protocol("message without a credit".into()),
            );
            self.repost(st, buf);
            return;
        }
        self.mark_needy(st, k);
        let freed = self.apply_peer_counters(
            st,
            k,
            Mailbox {
                grant: hdr.grant,
                rndv_done: hdr.rndv_done,
            },
        );
        if freed && hdr.kind == Kind::Rts {
            Self::touch(st, cx, k);
        }
        match hdr.kind {
            Kind::Data => {
                st.held += 1;
                st.eps[k].inbox.push_back(Inbound::Msg {
                    buf,
                    off: HEADER_LEN,
                });
                if let Some(ep) = st.eps.get_mut(k) {
                    cx.mark_ready(&mut ep.wait);
                }
            }
            Kind::Packed => {
                let end = HEADER_LEN + hdr.len as usize;
                let Some((_, count)) = buf.get(HEADER_LEN..end).and_then(PackedEntries::parse)
                else {
                    st.stats.protocol_errors += 1;
                    self.fail(
                        st,
                        cx,
                        k,
                        DisconnectCause::Protocol("malformed packed frame".into()),
                    );
                    self.repost(st, buf);
                    return;
                };
                tracing::trace!(endpoint = st.eps[k].id, count, "received a packed frame");
                st.held += 1;
                st.eps[k].inbox.push_back(Inbound::Packed {
                    frame: Arc::new(buf),
                    off: HEADER_LEN,
                    end,
                });
                if let Some(ep) = st.eps.get_mut(k) {
                    cx.mark_ready(&mut ep.wait);
                }
            }
            Kind::Rts => {
                let rts = RtsInfo::parse(&buf);
                self.repost(st, buf);
                let Some(rts) = rts else { return };
                if hdr.len as usize > self.cfg.max_message {
                    st.stats.protocol_errors += 1;
                    self.fail(
                        st,
                        cx,
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

    fn on_send(&self, st: &mut State, cx: &mut Cx<'_>, c: &WorkCompletion) {
        let k = wrid::key(c.wr_id);
        Self::touch(st, cx, k);
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
                self.fail_qp(st, cx, c.qp_num.0, cause);
            }
        }
    }

    /// A queue pair broke: every endpoint sending on it goes down (one for RC; all the
    /// endpoints behind an XRC initiator), and a broken initiator is forgotten so the next
    /// connection to that node makes a new one.
    pub(crate) fn fail_qp(
        &self,
        st: &mut State,
        cx: &mut Cx<'_>,
        qpn: u32,
        cause: DisconnectCause,
    ) {
        let keys: Vec<usize> = st
            .eps
            .iter()
            .filter(|(_, e)| e.qpn == qpn)
            .map(|(k, _)| k)
            .collect();
        let broken: Vec<u64> = st
            .initiators
            .iter()
            .filter(|(_, i)| i.qp.qp_num().0 == qpn)
            .map(|(&node, _)| node)
            .collect();
        st.initiators.retain(|_, i| i.qp.qp_num().0 != qpn);
        for k in keys {
            self.fail(st, cx, k, cause.clone());
        }
        for peer_node in broken {
            self.drop_targets_of(peer_node);
        }
    }

    /// Our XRC initiator towards `peer_node` broke, and with it every endpoint of ours to
    /// that node; those endpoints' peers may be alive (a process of a shared node died,
    /// and the others' receive queues went with nothing of theirs). They cannot be told
    /// through the broken initiator, and their own initiators still reach our targets, so
    /// they would wait for ever. Tearing down the targets that receive from that node
    /// makes their sends and keepalives exhaust their retries: they see `PeerUnreachable`
    /// within their peer timeout. Only when this context is alone on its node: another
    /// context of the node may have live endpoints behind the same targets.
    fn drop_targets_of(&self, peer_node: u64) {
        let Some(node) = &self.node else { return };
        let alone = {
            let mut ctxs = node.contexts.lock();
            ctxs.retain(|w| w.strong_count() > 0);
            ctxs.len() <= 1
        };
        if alone {
            let n = node.drop_targets_from(peer_node);
            tracing::debug!(
                peer_node,
                n,
                "XRC initiator broke: its node's targets dropped"
            );
        }
    }
}
