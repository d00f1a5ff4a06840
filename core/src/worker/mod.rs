//! The worker: the transport-neutral progress engine every transport plugs into.
//!
//! A [`Worker`] owns one device, protection domain, completion channel and buffer pool, and
//! the machinery around them that does not depend on a transport:
//!
//! * how a blocking call waits ([`wait_until`]): it polls, spinning for the busy-poll time
//!   after every change on what it waits for, then sleeps; the first thread to sleep (the
//!   leader) sleeps on the completion channel, the others on condition variables;
//! * the background thread (started by [`Worker::start`]), which makes progress while no application
//!   thread does, runs the transports' timers and hears the device's asynchronous events;
//! * the event queue ([`EventQueue`], at most [`MAX_EVENTS`]);
//! * received messages ([`Message`]), whose buffers go back to their transport on drop;
//! * send batches ([`Batch`]).
//!
//! A transport (RC/XRC in `rdmx-rc`, UD in `rdmx-ud`) implements [`Transport`] and is
//! registered with [`Worker::add_transport`]. Its mutable state lives inside the worker's
//! one lock, so a progress round of the worker is one dynamic call per transport (never one
//! per completion: each transport polls its own completion queues, created on the worker's
//! channel). Every call into a transport gets a [`Cx`]: the worker's side of the state
//! (events, wake-ups, the ready queue that [`Worker::take_any`] serves).
//!
//! ```text
//!   application threads ──wait_until──┐        background thread
//!                                     ▼               │
//!                         Mutex<WorkerState> ◄────────┘
//!                          ├─ CoreState: events, ready queue, leader, activity
//!                          └─ transports: [Box<dyn Transport>] ── progress(cx) per round
//! ```
//!
//! Lock order: the worker lock comes before anything a transport locks inside its calls.
//! Nothing here calls into a transport without the worker lock held.

mod api;
pub use api::Arrival;
#[cfg(feature = "tokio")]
mod async_timer;
#[cfg(feature = "tokio")]
mod asyncio;
mod background;
mod batch;
mod events;
mod message;
mod wait;

use std::any::Any;
use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};
use rdmx_verbs::{AsyncEvent, Clock, CompletionChannel, DeviceOptions, ProtectionDomain};

use crate::pool::{BufferPool, PoolConfig, PostKey};
use crate::{Buf, Config, Error, Event, Result};

#[cfg(feature = "tokio")]
pub use asyncio::wait_async;
pub use batch::Batch;
pub use events::{EventQueue, MAX_EVENTS};
pub use message::{Body, IntoBufError, Message};
pub use wait::{Wait, wait_until};

/// `Shared::last_app_poll` before any application thread polled. (Zero would be "at
/// start": a worker started and sent to at once had its background thread sleep with the
/// queues unarmed, taking the application for a poller, until its first tick.)
const NEVER_POLLED: u64 = u64::MAX;

/// A transport's number within its worker (the order it was added in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransportId(usize);

impl TransportId {
    /// The index of the transport in its worker.
    pub fn index(self) -> usize {
        self.0
    }
}

/// What a transport does for the worker. Every method runs with the worker's lock held, so
/// it must not block; each gets a [`Cx`] for the worker's side of the state.
///
/// # Safety
///
/// A transport gets the worker's [`PostKey`]: the right to name pool buffers in work
/// requests and to offer them to peers. Implementing this trait is the promise that it uses
/// that right soundly, since the application holds plain `&[u8]` / `&mut [u8]` views of
/// pool buffers (`Buf`, `Message`):
///
/// * it names a buffer in a work request (or offers it to a peer) only once the application
///   can no longer reach it (the buffer moved into the transport's tables), and never hands
///   the key out;
/// * it hands a buffer back to the application (a `Message`, a one-sided result) or to the
///   pool only after the work requests that name it have completed or been flushed, or
///   their queue pair was destroyed, so that the NIC no longer reads or writes it.
#[expect(
    unsafe_code,
    reason = "a contract, not an unsafe operation: implementors vouch for their posting"
)]
pub unsafe trait Transport: Any + Send + fmt::Debug {
    /// Arms the transport's completion queues (`req_notify`): the worker's channel fires at
    /// their next completion. Called before a thread sleeps on the channel.
    fn arm(&self);

    /// Polls the transport's completion queues (a bounded number of completions), routes
    /// them, and does the follow-up work. Returns the number of completions handled.
    fn progress(&mut self, cx: &mut Cx<'_>) -> usize;

    /// A device event (every transport hears every event, and acts on those that concern
    /// it).
    fn handle_event(&mut self, cx: &mut Cx<'_>, ev: AsyncEvent);

    /// When [`handle_timer`](Self::handle_timer) next has work, if ever.
    fn next_timer(&self) -> Option<Instant>;

    /// Runs the timers due at `now` (keepalives, deadlines). Called by the background
    /// thread at every round, due or not: a call with nothing due must be cheap.
    fn handle_timer(&mut self, cx: &mut Cx<'_>, now: Instant);

    /// While `Some(d)`: something no completion announces may need a look (credits an idle
    /// peer holds, say), and one sleeping application thread at a time wakes every `d` to
    /// make progress. (The background thread wakes at [`next_timer`](Self::next_timer).)
    fn watch(&self) -> Option<Duration> {
        None
    }

    /// The receive buffer of a dropped message comes back.
    fn take_back(&mut self, cx: &mut Cx<'_>, buf: Buf);

    /// A receive buffer was handed to the application for good ([`Message::into_buf`]).
    fn hand_over(&mut self, cx: &mut Cx<'_>);

    /// The next deliverable message of endpoint `key`, for a receive on the whole worker
    /// (`None`: nothing deliverable, or the endpoint is gone or its handle dropped).
    fn take_message(&mut self, cx: &mut Cx<'_>, key: usize) -> Option<Message>;

    /// The wait slot of endpoint `key` (see [`WaitSlot`]).
    fn wait_slot(&mut self, key: usize) -> Option<&mut WaitSlot>;

    /// Sends what a send batch holds (the batch ended, or a thread makes progress).
    fn flush_batch(&mut self, cx: &mut Cx<'_>);

    /// Nothing of the application is left: no endpoint, no handle. The background thread
    /// ends once every transport is idle and the worker's own handles are gone.
    fn is_idle(&self) -> bool;
}

/// What a thread blocked on one endpoint sleeps on, kept in the transport's endpoint: its
/// condition variable, how many sleep there, what has happened (the activity count a
/// waiter spins on), and whether it is in the worker's ready queue.
#[derive(Debug)]
pub struct WaitSlot {
    key: usize,
    cond: Arc<Condvar>,
    sleepers: u32,
    activity: u32,
    in_ready: bool,
}

impl WaitSlot {
    /// The slot of endpoint `key`.
    pub fn new(key: usize) -> Self {
        Self {
            key,
            cond: Arc::new(Condvar::new()),
            sleepers: 0,
            activity: 0,
            in_ready: false,
        }
    }

    /// The endpoint's key.
    pub fn key(&self) -> usize {
        self.key
    }

    /// Threads asleep on the endpoint now.
    pub fn sleepers(&self) -> u32 {
        self.sleepers
    }
}

/// The worker's side of the state, beside the transports'.
#[derive(Debug, Default)]
pub struct CoreState {
    events: EventQueue,
    /// Bumped with every endpoint's activity (see [`Cx::stir`]), for waits on the worker
    /// as a whole.
    activity: u32,
    /// Endpoints with a deliverable message, for receives on the whole worker: each at
    /// most once (`WaitSlot::in_ready`); stale entries are dropped when they come up.
    ready: VecDeque<(TransportId, usize)>,
    /// A thread blocked in `wait_until` sleeps on the completion channel in the background
    /// thread's place (see `wait.rs`, "The leader").
    leader: bool,
    /// While the leader sleeps: the endpoint it waits for (`None`: the worker). What wakes
    /// that endpoint's (or the worker's) sleepers interrupts its sleep too.
    leader_asleep: Option<Option<(TransportId, usize)>>,
    /// When the leader last went to sleep on the channel, or left it.
    leader_slept_at: Option<Instant>,
    /// The background thread sleeps on the completion channel (a new leader moves it off).
    bg_on_channel: bool,
    /// The background thread sleeps until its next timer while a leader sleeps: a leader
    /// whose wait ends wakes it.
    bg_sleeps_long: bool,
    /// A sleeping thread has taken the turn to wake for the transports' watch (one at a
    /// time, not every sleeper).
    watcher_asleep: bool,
    /// While the background thread sleeps: until when (see [`Cx::schedule`]).
    bg_until: Option<Instant>,
    /// Waits satisfied by what was already there, without a progress round, since the
    /// last round (see `wait_until`): bounded, so that the device is still looked at.
    pub(crate) unpolled_takes: u32,
}

/// All mutable state of a worker: its own, and its transports'.
#[derive(Debug, Default)]
pub struct WorkerState {
    core: CoreState,
    transports: Vec<Box<dyn Transport>>,
}

impl WorkerState {
    /// Transport `tid` as its concrete type, with the worker's side of the state.
    pub fn transport<T: Transport>(&mut self, tid: TransportId) -> Option<(&mut T, CoreRef<'_>)> {
        let t = self.transports.get_mut(tid.0)?;
        let t = (t.as_mut() as &mut dyn Any).downcast_mut::<T>()?;
        Some((t, CoreRef(&mut self.core)))
    }

    /// The next event, if any.
    pub fn pop_event(&mut self) -> Option<Event> {
        self.core.events.pop_front()
    }

    /// Events dropped because the application let [`MAX_EVENTS`] pile up.
    pub fn events_dropped(&self) -> u64 {
        self.core.events.dropped()
    }

    /// Runs `f` on every transport.
    fn each(&mut self, w: &Worker, mut f: impl FnMut(&mut dyn Transport, &mut Cx<'_>)) {
        let Self { core, transports } = self;
        for (i, t) in transports.iter_mut().enumerate() {
            let mut cx = Cx {
                core,
                worker: w,
                tid: TransportId(i),
            };
            f(t.as_mut(), &mut cx);
        }
    }

    /// Runs `f` on transport `tid`, if there is one.
    fn on(
        &mut self,
        w: &Worker,
        tid: TransportId,
        f: impl FnOnce(&mut dyn Transport, &mut Cx<'_>),
    ) {
        let Self { core, transports } = self;
        if let Some(t) = transports.get_mut(tid.0) {
            let mut cx = Cx {
                core,
                worker: w,
                tid,
            };
            f(t.as_mut(), &mut cx);
        }
    }

    fn activity(&mut self, on: Option<(TransportId, usize)>) -> u32 {
        match on {
            Some((tid, key)) => self
                .transports
                .get_mut(tid.0)
                .and_then(|t| t.wait_slot(key))
                .map_or(0, |s| s.activity),
            None => self.core.activity,
        }
    }

    fn wait_slot(&mut self, tid: TransportId, key: usize) -> Option<&mut WaitSlot> {
        self.transports.get_mut(tid.0)?.wait_slot(key)
    }
}

/// The worker's side of the state, borrowed beside a transport's (see
/// [`WorkerState::transport`]); [`CoreRef::cx`] makes the [`Cx`] a transport's code needs.
#[derive(Debug)]
pub struct CoreRef<'a>(&'a mut CoreState);

impl<'a> CoreRef<'a> {
    /// The context for calls into transport `tid` of `worker`.
    pub fn cx(self, worker: &'a Worker, tid: TransportId) -> Cx<'a> {
        Cx {
            core: self.0,
            worker,
            tid,
        }
    }
}

/// What a transport's code gets from the worker while it runs under the worker's lock:
/// events, wake-ups, the ready queue.
#[derive(Debug)]
pub struct Cx<'a> {
    core: &'a mut CoreState,
    worker: &'a Worker,
    tid: TransportId,
}

impl Cx<'_> {
    /// The transport this context is for.
    pub fn tid(&self) -> TransportId {
        self.tid
    }

    /// The worker.
    pub fn worker(&self) -> &Worker {
        self.worker
    }

    /// Now, on the worker's clock (see [`Worker::now`]).
    pub fn now(&self) -> Instant {
        self.worker.now()
    }

    /// Queues an event for the application and wakes the worker's waiters (a thread or a
    /// future waiting for a message or an event sees it at once; events are rare).
    pub fn push_event(&mut self, ev: Event) {
        self.core.events.push(ev);
        self.worker.wake_all();
    }

    /// Wakes every waiter of the worker: threads asleep on the worker as a whole, pending
    /// futures, and the leader when it waits on the worker.
    pub fn wake_all(&self) {
        self.worker.wake_all();
    }

    /// Something happened on the endpoint of `slot` (a message, a completion, credits, a
    /// state change): records it ([`stir`](Self::stir)) and wakes its sleepers.
    pub fn touch(&mut self, slot: &mut WaitSlot) {
        self.stir(slot);
        self.wake_sleepers(slot);
    }

    /// Records activity on the endpoint of `slot` without waking its sleepers: threads
    /// spinning on it (or on the worker) spin on for their busy-poll time. For what makes
    /// nothing deliverable yet but announces more to come (a rendezvous request whose read
    /// is now posted).
    pub fn stir(&mut self, slot: &mut WaitSlot) {
        self.core.activity = self.core.activity.wrapping_add(1);
        slot.activity = slot.activity.wrapping_add(1);
    }

    /// Wakes the threads sleeping on the endpoint of `slot`, the leader among them.
    pub fn wake_sleepers(&self, slot: &WaitSlot) {
        if slot.sleepers > 0 {
            slot.cond.notify_all();
        }
        self.nudge_leader(slot.key);
    }

    /// Interrupts the leader's sleep if it waits for endpoint `key` of this transport.
    pub fn nudge_leader(&self, key: usize) {
        if self.core.leader_asleep == Some(Some((self.tid, key))) {
            self.worker.shared.channel.interrupt();
        }
    }

    /// A timer of this transport is due at `at` (its [`Transport::next_timer`] says so from
    /// now on): wakes the background thread if it sleeps past that.
    pub fn schedule(&mut self, at: Instant) {
        if self.core.bg_until.is_some_and(|u| u > at) {
            self.core.bg_until = None;
            if self.core.bg_on_channel {
                self.worker.shared.channel.interrupt();
            } else {
                self.worker.shared.bg_cond.notify_one();
            }
        }
    }

    /// Queues the endpoint of `slot` for receives on the whole worker (unless it is queued
    /// already).
    pub fn mark_ready(&mut self, slot: &mut WaitSlot) {
        if !slot.in_ready {
            slot.in_ready = true;
            self.core.ready.push_back((self.tid, slot.key));
        }
    }

    /// Wraps a received payload of endpoint `endpoint` (its public id) for the
    /// application: its buffer goes back to this transport when the message is dropped.
    pub fn message(&self, body: Body, endpoint: u64) -> Message {
        Message::new(body, endpoint, self.worker.clone(), self.tid)
    }
}

/// A worker: see the [module documentation](self). Cheap to clone.
#[derive(Clone)]
pub struct Worker {
    shared: Arc<Shared>,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("device", &self.shared.vctx.name())
            .finish_non_exhaustive()
    }
}

/// What a worker owns.
struct Shared {
    cfg: Config,
    vctx: rdmx_verbs::Context,
    pd: ProtectionDomain,
    channel: CompletionChannel,
    pool: BufferPool,
    state: Mutex<WorkerState>,
    /// Threads waiting on the worker as a whole sleep here.
    cond: Condvar,
    /// The background thread sleeps here while a leader sleeps on the channel.
    bg_cond: Condvar,
    /// The device's clock: every time the worker and its transports act on comes from it
    /// (virtual on a simulated net).
    clock: Clock,
    start: Instant,
    /// Nanoseconds since `start` of the last progress call by an application thread
    /// ([`NEVER_POLLED`] before the first).
    last_app_poll: AtomicU64,
    /// Application threads (or futures) asleep waiting for progress.
    sleepers: AtomicUsize,
    /// Application threads busy-polling now, and how many may (see `wait::SpinSlot`).
    spinners: AtomicUsize,
    spin_slots: usize,
    /// Mirrors `CoreState::leader_asleep` being `Some(None)`, for [`Worker::wake_all`],
    /// which runs without the state.
    leader_waits_any: AtomicBool,
    /// Received messages alive (they need the worker to give their buffers back).
    messages: AtomicUsize,
    /// Every handle of the application is gone (see [`WorkerHandle`]).
    handle_gone: AtomicBool,
    stop: AtomicBool,
    /// Wakes pending futures (feature `tokio`).
    #[cfg(feature = "tokio")]
    notify: tokio::sync::Notify,
}

impl Worker {
    /// A worker on a device it opens (`cfg.device`), with a protection domain and buffer
    /// pool of its own. The pool gets the size classes `recv_classes` besides the powers of
    /// two (the transports' receive buffers).
    ///
    /// # Errors
    /// `Verbs` when the device cannot be opened or a resource cannot be created.
    pub fn open(
        cfg: &Config,
        options: Option<DeviceOptions>,
        recv_classes: &[usize],
    ) -> Result<Self> {
        let vctx = match options {
            Some(o) => rdmx_verbs::Device::open_with(&cfg.device, o)?,
            None => rdmx_verbs::Device::open(&cfg.device)?,
        };
        let pd = vctx.alloc_pd()?;
        Self::over(cfg, vctx, pd, recv_classes)
    }

    /// A worker over a device and protection domain that are already open (the contexts of
    /// an XRC node share theirs).
    ///
    /// # Errors
    /// `Verbs` when the completion channel cannot be created.
    pub fn over(
        cfg: &Config,
        vctx: rdmx_verbs::Context,
        pd: ProtectionDomain,
        recv_classes: &[usize],
    ) -> Result<Self> {
        let channel = vctx.create_comp_channel()?;
        let clock = vctx.clock();
        let pool = BufferPool::new(
            &pd,
            PoolConfig {
                max_bytes: cfg.pool_max,
                remote_read_min: cfg.rndv_threshold,
                extra_classes: recv_classes.to_vec(),
            },
        );
        Ok(Self {
            shared: Arc::new(Shared {
                cfg: cfg.clone(),
                vctx,
                pd,
                channel,
                pool,
                state: Mutex::new(WorkerState::default()),
                cond: Condvar::new(),
                bg_cond: Condvar::new(),
                start: clock.now(),
                clock,
                last_app_poll: AtomicU64::new(NEVER_POLLED),
                sleepers: AtomicUsize::new(0),
                spinners: AtomicUsize::new(0),
                spin_slots: 8 * std::thread::available_parallelism().map_or(1, usize::from),
                leader_waits_any: AtomicBool::new(false),
                messages: AtomicUsize::new(0),
                handle_gone: AtomicBool::new(false),
                stop: AtomicBool::new(false),
                #[cfg(feature = "tokio")]
                notify: tokio::sync::Notify::new(),
            }),
        })
    }

    /// Adds the transport `make` builds with its id and the worker's [`PostKey`] (see the
    /// safety contract of [`Transport`]); it is called from the next progress round on.
    /// Transports are never removed: they go with the worker.
    ///
    /// # Errors
    /// What `make` returns.
    pub fn add_transport<T: Transport>(
        &self,
        make: impl FnOnce(TransportId, PostKey) -> Result<T>,
    ) -> Result<TransportId> {
        let mut st = self.shared.state.lock();
        let tid = TransportId(st.transports.len());
        st.transports.push(Box::new(make(tid, PostKey::new())?));
        Ok(tid)
    }

    /// Starts the background thread, and returns the handle whose last clone's drop lets it
    /// end (once every transport is idle and no message is alive).
    ///
    /// # Errors
    /// `Config` when the thread cannot be started.
    pub fn start(&self) -> Result<WorkerHandle> {
        let w = self.clone();
        std::thread::Builder::new()
            .name("rdmx-progress".into())
            .spawn(move || background::run(&w))
            .map_err(|e| Error::Config(format!("cannot start the progress thread: {e}")))?;
        Ok(WorkerHandle(Arc::new(HandleInner(self.clone()))))
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &Config {
        &self.shared.cfg
    }

    /// The device.
    pub fn verbs_context(&self) -> &rdmx_verbs::Context {
        &self.shared.vctx
    }

    /// The protection domain the pool registers in, for a transport (queue pairs in the
    /// pool's domain may reach pool buffers: see [`PostKey`]).
    pub fn pd(&self, _: PostKey) -> &ProtectionDomain {
        &self.shared.pd
    }

    /// The completion channel every transport creates its completion queues on.
    pub fn channel(&self) -> &CompletionChannel {
        &self.shared.channel
    }

    /// The registered buffer pool.
    pub fn pool(&self) -> &BufferPool {
        &self.shared.pool
    }

    /// Takes the worker's lock.
    pub fn lock(&self) -> MutexGuard<'_, WorkerState> {
        self.shared.state.lock()
    }

    /// Runs `f` on transport `tid` under the worker's lock (`None` when `tid` is not a
    /// `T`).
    pub fn with<T: Transport, R>(
        &self,
        tid: TransportId,
        f: impl FnOnce(&mut T, &mut Cx<'_>) -> R,
    ) -> Option<R> {
        let mut st = self.lock();
        let (t, core) = st.transport::<T>(tid)?;
        let mut cx = core.cx(self, tid);
        Some(f(t, &mut cx))
    }

    /// One progress round: every transport polls its completion queues. Returns the
    /// number of completions handled.
    pub fn progress_locked(&self, st: &mut WorkerState) -> usize {
        st.core.unpolled_takes = 0;
        let mut n = 0;
        st.each(self, |t, cx| n += t.progress(cx));
        n
    }

    /// A progress round by an application thread (it claims the device's reception for a
    /// while): returns the number of completions, and wakes the waiters when there were
    /// any.
    pub fn progress(&self) -> usize {
        let mut st = self.lock();
        self.shared
            .last_app_poll
            .store(self.now_nanos(), Ordering::Relaxed);
        let n = self.progress_locked(&mut st);
        if n > 0 {
            self.wake_all();
        }
        n
    }

    /// The next message of any endpoint of any transport whose handle is alive, endpoints
    /// taking turns.
    pub fn take_any(&self, st: &mut WorkerState) -> Option<Message> {
        // Every key is looked at once at most: those with nothing ready leave the queue.
        for _ in 0..st.core.ready.len() {
            let (tid, key) = st.core.ready.pop_front()?;
            let Some(slot) = st.wait_slot(tid, key) else {
                continue;
            };
            slot.in_ready = false;
            let mut got = None;
            st.on(self, tid, |t, cx| got = t.take_message(cx, key));
            if got.is_some() {
                return got;
            }
        }
        None
    }

    /// Sends what every transport's send batch holds.
    pub fn flush_batches(&self, st: &mut WorkerState) {
        st.each(self, |t, cx| t.flush_batch(cx));
    }

    /// Wakes every waiter of the worker: threads asleep on the worker as a whole, pending
    /// futures, and the leader when it waits on the worker.
    pub fn wake_all(&self) {
        self.shared.cond.notify_all();
        #[cfg(feature = "tokio")]
        self.shared.notify.notify_waiters();
        if self.shared.leader_waits_any.load(Ordering::Acquire) {
            self.shared.channel.interrupt();
        }
    }

    /// Application threads (or futures) asleep now.
    pub fn sleepers(&self) -> usize {
        self.shared.sleepers.load(Ordering::Acquire)
    }

    /// Arms every transport's completion queues.
    fn arm(&self, st: &WorkerState) {
        for t in &st.transports {
            t.arm();
        }
    }

    /// The shortest watch interval of the transports (see [`Transport::watch`]).
    fn watch(st: &WorkerState) -> Option<Duration> {
        st.transports.iter().filter_map(|t| t.watch()).min()
    }

    fn now_nanos(&self) -> u64 {
        self.now()
            .saturating_duration_since(self.shared.start)
            .as_nanos() as u64
    }

    /// The clock the worker runs on (its device's: virtual on a simulated net).
    pub fn clock(&self) -> &Clock {
        &self.shared.clock
    }

    /// Now, on the worker's clock: what transports compare their deadlines with.
    pub fn now(&self) -> Instant {
        self.shared.clock.now()
    }

    /// Marks the worker's reception as claimed by an application thread now.
    fn stamp_app_poll(&self) {
        self.shared
            .last_app_poll
            .store(self.now_nanos(), Ordering::Relaxed);
    }

    /// The identity of this worker, for the per-thread record of open send batches.
    fn id(&self) -> usize {
        Arc::as_ptr(&self.shared) as usize
    }

    /// For the async waits of the `tokio` feature: the notifier that wakes pending futures.
    #[cfg(feature = "tokio")]
    pub fn notify(&self) -> &tokio::sync::Notify {
        &self.shared.notify
    }

    /// Counts a future asleep in an async wait until the returned guard is dropped. Call it
    /// under the worker's lock, after arming: the background thread decides under the lock
    /// whether to re-arm before it sleeps, and must see the future.
    pub fn sleeper(&self) -> Sleeper {
        self.shared.sleepers.fetch_add(1, Ordering::AcqRel);
        Sleeper(self.clone())
    }

    /// Arms every transport's completion queues (before a future sleeps: see
    /// [`sleeper`](Self::sleeper)).
    pub fn arm_locked(&self, st: &WorkerState) {
        self.arm(st);
    }
}

/// Counts a sleeping future for as long as it waits (also when it is dropped mid-wait).
#[derive(Debug)]
pub struct Sleeper(Worker);

impl Drop for Sleeper {
    fn drop(&mut self) {
        self.0.shared.sleepers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The application's hold on a worker: while a clone lives, the background thread does too;
/// after the last one is dropped it ends within a tick once every transport is idle and no
/// message is alive (endpoints that outlive the handle keep their duties until then).
#[derive(Debug, Clone)]
pub struct WorkerHandle(Arc<HandleInner>);

#[derive(Debug)]
struct HandleInner(Worker);

impl Drop for HandleInner {
    fn drop(&mut self) {
        self.0.shared.handle_gone.store(true, Ordering::Release);
        self.0.shared.bg_cond.notify_all();
    }
}

impl WorkerHandle {
    /// The worker.
    pub fn worker(&self) -> &Worker {
        &self.0.0
    }
}
