//! What a context's RC transport is made of: its resources ([`Shared`], immutable and shared
//! with the handles), its mutable state ([`State`], inside the worker's lock, in an
//! [`Rc`]), and how handles reach both ([`RcRef`]). The bottom layer of the crate:
//! it knows the per-endpoint state (`ep.rs`) and the XRC node (`node.rs`), nothing above.
//!
//! Everything mutable lives in one [`State`] behind the worker's one lock. Any thread that
//! needs something (a message, a credit, a buffer) takes the lock, runs the worker's
//! progress (for this transport, `Shared::progress` in `engine/`, which polls the
//! completion queue and routes each completion to its endpoint) and looks again. There is
//! no hand-off to another thread on the latency path: the thread that waits is the thread
//! that polls.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdmx_core::credit::Budget;
use rdmx_core::pool::{BufferPool, PostKey};
use rdmx_core::regcache::RegCache;
use rdmx_core::worker::{Cx, TransportId, Wait, Worker, WorkerState};
use rdmx_core::{Buf, Config};
use rdmx_verbs::{
    CompletionQueue, MemoryRegion, ProtectionDomain, SharedReceiveQueue, WorkCompletion,
};
use slab::Slab;

use crate::ep::Ep;
use crate::node::{Initiator, NodeEvents, NodeInner};
use crate::timers::{Timer, TimerQueue};

/// How often a context first looks at the starving flags once every posted buffer backs a
/// credit and some endpoint holds none (a sender there can only wait to be noticed). While
/// the context receives nothing, the interval doubles after each look that finds nobody
/// starving, up to the tick; it starts again here when someone starves or messages arrive.
pub(crate) const WATCH_SCAN: Duration = Duration::from_millis(10);

/// Most endpoints a context can hold (one mailbox slot each).
pub const MAX_ENDPOINTS: usize = 1 << 16;

/// The RC transport inside its worker: its shared resources and its mutable state, which
/// only calls under the worker's lock touch (its `Transport` implementation is in
/// `transport.rs`; applications reach it through `RcTransport`).
#[derive(Debug)]
pub(crate) struct Rc {
    pub(crate) sh: Arc<Shared>,
    pub(crate) st: State,
}

/// Completions taken per poll.
pub(crate) const POLL_BATCH: usize = 32;

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
    /// XRC endpoints that went down here, told their peer (`GONE`) and were answered: their
    /// key, slot and buffers went at the answer.
    pub gone_answered: u64,
    /// XRC endpoints that went down here, told their peer and had no answer within the
    /// wait (the peer timeout, at least 250 ms): they went without it.
    pub gone_unanswered: u64,
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
    /// Packed frames sent (each one SEND, one receive buffer and one credit at the peer). A
    /// frame that holds a single message leaves as that message, inline, and is not
    /// counted here.
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
    /// Now, not a count: credits granted to peers and neither used nor given back (each
    /// is a posted receive buffer promised to an endpoint). Zero once no endpoint is left.
    pub credits_outstanding: u64,
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
    pub(crate) next_id: u64,
    pub(crate) stats: Stats,
    /// Some endpoint is closing, or down with its handle gone: `reap` has work.
    pub(crate) reap_pending: bool,
    /// XRC: this context's initiator towards each remote node.
    pub(crate) initiators: HashMap<u64, Initiator>,
    /// When the background tick next looks at the peers' recall words (see `recall.rs`).
    pub(crate) next_scan: Instant,
    /// When endpoints' timers next need a look (`timers.rs`).
    pub(crate) timer_queue: TimerQueue,
    pub(crate) wc: Vec<WorkCompletion>,
}

impl State {
    pub(crate) fn new(cfg: &Config, now: Instant) -> Self {
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
            recall_watch_every: WATCH_SCAN,
            recall_scanned_at: None,
            recv_seen: 0,
            recv_at_watch: 0,
            dirty: Vec::new(),
            rndv_watch: Vec::new(),
            rndv_wait: Vec::new(),
            packs: Vec::new(),
            next_id: 1,
            stats: Stats::default(),
            reap_pending: false,
            initiators: HashMap::new(),
            next_scan: now,
            timer_queue: TimerQueue::default(),
            wc: vec![WorkCompletion::EMPTY; POLL_BATCH],
        }
    }
}

impl State {
    /// Sets timer `t` of endpoint `k` to `at`, queueing a wake (and telling the worker)
    /// when that is earlier than the endpoint's next one.
    pub(crate) fn arm(&mut self, cx: &mut Cx<'_>, k: usize, t: Timer, at: Instant) {
        let Some(ep) = self.eps.get_mut(k) else {
            return;
        };
        if let Some(w) = ep.timers.set(t, at) {
            self.timer_queue.push(w, k, ep.id);
            cx.schedule(w);
        }
    }

    /// [`arm`](Self::arm), unless the timer is set already (a deadline that must not move).
    pub(crate) fn arm_once(&mut self, cx: &mut Cx<'_>, k: usize, t: Timer, at: Instant) {
        if self.eps.get(k).is_some_and(|ep| ep.timers.get(t).is_none()) {
            self.arm(cx, k, t, at);
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
    /// The mailbox slots of confined endpoints (`ep::Slot::InRegion`), which peers write
    /// only through windows; a single unused slot where each endpoint registers its own.
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
    pub(crate) node: Option<Arc<NodeInner>>,
    /// Device events of this context's node, shared out by whichever context of the node
    /// read them from the device (`NodeInner::share_event`).
    pub(crate) node_events: Arc<NodeEvents>,
    /// XRC: one connection exchange at a time per context (they share initiators).
    pub(crate) xrc_lock: Mutex<()>,
    /// The connection data this context's listeners answer with (`Listener::set_accept_data`).
    pub(crate) accept_data: Mutex<Vec<u8>>,
    pub(crate) context_id: u64,
    /// The right to post pool buffers (see the safety contract of `Transport`, which
    /// `transport.rs` implements).
    pub(crate) post_key: PostKey,
    /// Rendezvous sources are opened to their peer through a type 2 memory window bound to
    /// the endpoint's queue pair, for that transfer only (RC on a device with windows; see
    /// `send_rndv`). Otherwise the peer gets the registration's own key.
    pub(crate) confine: bool,
    /// XRC on a device with windows, its domain hosted here: each rendezvous buffer is
    /// opened through a type 1 window over exactly that buffer, closed when the transfer
    /// ends (type 1: reachable from any queue pair of the domain with the key, but only
    /// that range and only until then).
    pub(crate) confine_xrc: bool,
    /// The GID index of ports 1 and 2 (`Config::gid_index`, else the port's RoCE v2
    /// IPv4-mapped entry): the GID advertised for the port and the source of its paths.
    pub(crate) gid_index: [u32; 2],
}

impl Shared {
    /// The memory of endpoint slot `slot`, and its offset there.
    pub(crate) fn slot_mem<'a>(&'a self, slot: &'a crate::ep::Slot) -> (&'a MemoryRegion, usize) {
        match slot {
            crate::ep::Slot::InRegion(off) => (&self.mailbox, *off),
            crate::ep::Slot::Own(mr) => (mr, 0),
        }
    }

    /// The GID index of local port `port`.
    pub(crate) fn gid_index(&self, port: u8) -> u32 {
        self.gid_index[usize::from(port.clamp(1, 2)) - 1]
    }
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
            .transport::<Rc>(self.sh.tid)
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
