//! The context: device, protection domain, completion queue, shared receive queue, buffer
//! pool and endpoint table, plus the background thread that takes over progress when no
//! application thread is polling.

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rdmx_core::bootstrap::{self, TransportKind};
use rdmx_core::header::{HEADER_LEN, MAILBOX_LEN, RTS_LEN};
use rdmx_core::pool::{BufferPool, PoolConfig, PoolStats};
use rdmx_core::{Buf, Config, ConfigBuilder, Error, Event, Result};
use rdmx_verbs::{AccessFlags, AsyncEvent, Device, DeviceOptions, NicCounters, SrqInitAttr};

use crate::endpoint::Endpoint;
use crate::shared::{Shared, State, Stats};
use crate::xrc::Node;

/// Most endpoints a context can hold (one mailbox slot each).
pub const MAX_ENDPOINTS: usize = 1 << 16;

/// Builds a [`Context`]. Every method has an `RDMX_*` environment variable (see
/// `rdmx_core::config`); values set here win.
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct ContextBuilder {
    cfg: ConfigBuilder,
    options: Option<DeviceOptions>,
    node: Option<Node>,
}

macro_rules! forward {
    ($(#[$doc:meta])* $name:ident: $ty:ty) => {
        $(#[$doc])*
        pub fn $name(mut self, v: $ty) -> Self {
            self.cfg = self.cfg.$name(v);
            self
        }
    };
}

impl ContextBuilder {
    /// The device to open (`RDMX_DEVICE`; default `soft:127.0.0.1`).
    pub fn device(mut self, name: impl Into<String>) -> Self {
        self.cfg = self.cfg.device(name);
        self
    }
    forward!(
        /// The transport of endpoints (`RDMX_TRANSPORT`).
        transport: TransportKind
    );
    forward!(
        /// Largest payload sent inline (`RDMX_INLINE_THRESHOLD`).
        inline_threshold: usize
    );
    forward!(
        /// Smallest payload sent by rendezvous (`RDMX_RNDV_THRESHOLD`).
        rndv_threshold: usize
    );
    forward!(
        /// Receive credits per endpoint (`RDMX_CREDITS`).
        credits: u32
    );
    forward!(
        /// Rendezvous messages per endpoint awaiting the peer's read before a further one
        /// waits (`RDMX_RNDV_WINDOW`).
        rndv_window: u32
    );
    forward!(
        /// Receive buffers on the shared receive queue (`RDMX_SRQ_DEPTH`).
        srq_depth: u32
    );
    forward!(
        /// Cap of the buffer pool in bytes (`RDMX_POOL_MAX`).
        pool_max: usize
    );
    forward!(
        /// Cap of the registration cache in bytes (`RDMX_REGCACHE_MAX`; 0 disables it).
        regcache_max: usize
    );
    forward!(
        /// Largest message (`RDMX_MAX_MESSAGE`).
        max_message: usize
    );
    forward!(
        /// Busy-poll time of blocking calls (`RDMX_BUSY_POLL_US`).
        busy_poll: Duration
    );
    forward!(
        /// Time to declare a silent peer dead (`RDMX_PEER_TIMEOUT_MS`).
        peer_timeout: Duration
    );
    forward!(
        /// Connect deadline (`RDMX_CONNECT_TIMEOUT_MS`).
        connect_timeout: Duration
    );

    /// XRC: join the node of every process that names the same domain file
    /// (`RDMX_XRC_DOMAIN`; see [`Node::open_shared`]) instead of being a node of its own.
    pub fn xrc_domain(mut self, file: impl Into<std::path::PathBuf>) -> Self {
        self.cfg = self.cfg.xrc_domain(file);
        self
    }

    /// Options for opening the device (soft provider: a fault-injection plan). Without them
    /// the provider's own environment variables apply (`RDMX_FAULTS`).
    pub fn device_options(mut self, options: DeviceOptions) -> Self {
        self.options = Some(options);
        self
    }

    /// Builds an XRC context on `node` (sets the transport to XRC): the contexts of one node
    /// share its device and XRC domain, and with it one connection per remote node.
    pub fn node(mut self, node: &Node) -> Self {
        self.node = Some(node.clone());
        self.cfg = self.cfg.transport(TransportKind::Xrc);
        self
    }

    /// Opens the device and sets everything up.
    ///
    /// # Errors
    /// `Config` for bad settings, `Verbs` when the device cannot be opened or a resource
    /// cannot be created.
    pub fn build(self) -> Result<Context> {
        let cfg = self.cfg.resolve()?;
        Context::open(cfg, self.options, self.node)
    }
}

#[derive(Debug)]
struct Handle {
    shared: Arc<Shared>,
    bg: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        // The background thread notices within one tick and exits on its own (joining it
        // here would make every drop wait for the tick). The pack flusher is woken.
        self.shared.stop.store(true, Ordering::Release);
        {
            let _st = self.shared.state.lock();
            self.shared.pack_cond.notify_all();
        }
        drop(self.bg.lock().take());
    }
}

/// An rdmx context: one per process (or per group of threads). Cheap to clone; endpoints
/// keep what they need alive on their own.
#[derive(Debug, Clone)]
pub struct Context {
    handle: Arc<Handle>,
}

impl Context {
    /// A builder with every value unset (environment, then defaults).
    pub fn builder() -> ContextBuilder {
        ContextBuilder::default()
    }

    /// A context configured from the environment alone.
    ///
    /// # Errors
    /// As [`ContextBuilder::build`].
    pub fn new() -> Result<Self> {
        Self::builder().build()
    }

    /// A context with an explicit configuration.
    ///
    /// # Errors
    /// As [`ContextBuilder::build`].
    pub fn with_config(cfg: Config) -> Result<Self> {
        Self::open(cfg, None, None)
    }

    fn open(cfg: Config, options: Option<DeviceOptions>, node: Option<Node>) -> Result<Self> {
        cfg.validate()?;
        // XRC contexts live on a node (given, or one of their own).
        let mut options = options;
        let node = match (cfg.transport, node) {
            (TransportKind::Xrc, Some(n)) => Some(n),
            (TransportKind::Xrc, None) => Some(match (options.take(), &cfg.xrc_domain) {
                (Some(o), Some(f)) => Node::open_shared_with(&cfg.device, o, f)?,
                (None, Some(f)) => Node::open_shared(&cfg.device, f)?,
                (Some(o), None) => Node::open_with(&cfg.device, o)?,
                (None, None) => Node::open(&cfg.device)?,
            }),
            (TransportKind::Rc, _) => None,
        };
        let (vctx, pd) = match &node {
            Some(n) => (n.inner.vctx.clone(), n.inner.pd.clone()),
            None => {
                let vctx = match options {
                    Some(o) => Device::open_with(&cfg.device, o)?,
                    None => Device::open(&cfg.device)?,
                };
                let pd = vctx.alloc_pd()?;
                (vctx, pd)
            }
        };
        let dev = vctx.query_device();
        let cqe = (cfg.srq_depth as usize * 2 + 64 * 1024).min(dev.max_cqe.max(1) as usize);
        let cq = vctx.create_cq(cqe, None)?;
        let srq_attr = SrqInitAttr {
            max_wr: cfg.srq_depth,
            max_sge: 1,
            srq_limit: (cfg.srq_depth / 4).max(1),
        };
        let srq = match &node {
            Some(n) => pd.create_xrc_srq(&n.inner.xrcd, &cq, &srq_attr)?,
            None => pd.create_srq(&srq_attr)?,
        };
        let mailbox = pd.reg_mr(
            MAX_ENDPOINTS * MAILBOX_LEN,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )?;
        let pool = BufferPool::new(
            &pd,
            PoolConfig {
                max_bytes: cfg.pool_max,
                remote_read_min: cfg.rndv_threshold,
                extra_class: Some(cfg.recv_buf_size()),
            },
        );
        let max_inline_data = ((cfg.inline_threshold + HEADER_LEN).max(RTS_LEN) as u32)
            .min(dev.max_inline_data.max(RTS_LEN as u32));
        let inline_max = cfg
            .inline_threshold
            .min((max_inline_data as usize).saturating_sub(HEADER_LEN));
        let port = vctx.query_port(1)?;
        let state = State::new(&cfg);
        let regcache = rdmx_core::RegCache::new(pd.clone(), cfg.regcache_max);
        let batch_posts = node.as_ref().is_some_and(|n| n.inner.xrcd.is_remote());
        let shared = Arc::new(Shared {
            vctx,
            pd,
            cq,
            srq,
            mailbox,
            pool,
            regcache,
            state: Mutex::new(state),
            cond: Condvar::new(),
            inline_max,
            max_inline_data,
            mtu_bytes: port.active_mtu.bytes() as u32,
            ports: dev.phys_port_cnt,
            node: node.map(|n| n.inner),
            node_events: Mutex::new(std::collections::VecDeque::new()),
            xrc_lock: Mutex::new(()),
            batch_posts,
            context_id: random_u64(),
            start: Instant::now(),
            last_app_poll: AtomicU64::new(0),
            sleepers: std::sync::atomic::AtomicUsize::new(0),
            #[cfg(feature = "tokio")]
            notify: tokio::sync::Notify::new(),
            stop: AtomicBool::new(false),
            pack_cond: Condvar::new(),
            cfg,
        });
        {
            let mut st = shared.state.lock();
            shared.after(&mut st);
        }
        if let Some(n) = &shared.node {
            n.contexts.lock().push(Arc::downgrade(&shared));
        }
        let bg_shared = shared.clone();
        let bg = std::thread::Builder::new()
            .name("rdmx-progress".into())
            .spawn(move || background(&bg_shared))
            .map_err(|e| Error::Config(format!("cannot start the progress thread: {e}")))?;
        let flusher_shared = shared.clone();
        std::thread::Builder::new()
            .name("rdmx-packs".into())
            .spawn(move || pack_flusher(&flusher_shared))
            .map_err(|e| Error::Config(format!("cannot start the pack flusher: {e}")))?;
        Ok(Self {
            handle: Arc::new(Handle {
                shared,
                bg: Mutex::new(Some(bg)),
            }),
        })
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.handle.shared
    }

    /// The effective configuration.
    pub fn config(&self) -> &Config {
        &self.handle.shared.cfg
    }

    /// The largest payload actually sent inline (the configured threshold, capped by the
    /// device).
    pub fn inline_max(&self) -> usize {
        self.handle.shared.inline_max
    }

    /// Starts accepting endpoints on `addr` (the TCP side channel).
    ///
    /// # Errors
    /// `Bootstrap` when the address cannot be bound.
    pub fn listen(&self, addr: impl ToSocketAddrs) -> Result<Listener> {
        let addr = resolve(addr)?;
        let tcp = bootstrap::listen(addr)?;
        let local = tcp
            .local_addr()
            .map_err(|source| bootstrap::BootstrapError::Io {
                op: "local_addr",
                source,
            })?;
        Ok(Listener {
            ctx: self.clone(),
            tcp,
            local,
        })
    }

    /// Connects an endpoint to a listener at `addr`.
    ///
    /// # Errors
    /// `Bootstrap` when the exchange fails (refused, garbage, version mismatch, timeout),
    /// `Verbs` when the queue pair cannot be set up.
    pub fn connect(&self, addr: impl ToSocketAddrs) -> Result<Endpoint> {
        let addr = resolve(addr)?;
        crate::conn::connect(self, addr)
    }

    /// A buffer from the registered pool, waiting (up to the connect timeout) while the pool
    /// is at its cap.
    ///
    /// # Errors
    /// `PoolCapacity` when `len` can never fit; `Timeout` when no buffer came back in time.
    pub fn alloc(&self, len: usize) -> Result<Buf> {
        let sh = self.shared();
        wait_until(sh, Some(sh.cfg.connect_timeout), |_| {
            match sh.pool.try_alloc(len) {
                Err(Error::WouldBlock) => None,
                r => Some(r),
            }
        })
    }

    /// A buffer from the registered pool, or `WouldBlock` when the pool is at its cap.
    ///
    /// # Errors
    /// As [`BufferPool::try_alloc`].
    pub fn try_alloc(&self, len: usize) -> Result<Buf> {
        self.shared().pool.try_alloc(len)
    }

    /// The registration cache's counters (zero-copy sends with
    /// [`Endpoint::send_shared`]).
    pub fn regcache_stats(&self) -> rdmx_core::RegCacheStats {
        self.shared().regcache.stats()
    }

    /// Deregisters every cached registration of application bytes that no send is using
    /// (and so releases the cache's references to those bytes); returns how many.
    pub fn flush_regcache(&self) -> usize {
        self.shared().regcache.flush()
    }

    /// Runs the progress engine once (completions, credits, rendezvous); returns how many
    /// completions it handled. Blocking calls do this themselves; call it when only polling
    /// with `try_*` calls.
    pub fn progress(&self) -> usize {
        let sh = self.shared();
        let mut st = sh.state.lock();
        sh.last_app_poll.store(sh.now_nanos(), Ordering::Relaxed);
        let n = sh.progress(&mut st);
        if n > 0 {
            sh.wake_all();
        }
        n
    }

    /// The next event (path migrations, disconnects), if any.
    pub fn poll_event(&self) -> Option<Event> {
        let sh = self.shared();
        let mut st = sh.state.lock();
        sh.progress(&mut st);
        st.events.pop_front()
    }

    /// Waits up to `timeout` for the next event.
    pub fn wait_event(&self, timeout: Duration) -> Option<Event> {
        let sh = self.shared();
        wait_until(sh, Some(timeout), |st| st.events.pop_front().map(Ok)).ok()
    }

    /// Counters of the message layer.
    pub fn stats(&self) -> Stats {
        self.shared().state.lock().stats
    }

    /// Counters of the buffer pool.
    pub fn pool_stats(&self) -> PoolStats {
        self.shared().pool.stats()
    }

    /// Counters of the device (RNR NAKs, retransmissions, ...).
    pub fn device_counters(&self) -> NicCounters {
        self.shared().vctx.counters()
    }

    /// Number of endpoints in the table (including ones that are down but not yet dropped).
    pub fn endpoint_count(&self) -> usize {
        self.shared().state.lock().eps.len()
    }

    /// Queue pairs this context created for its endpoints: one per endpoint with RC, one
    /// initiator per remote node with XRC (the node's target queue pairs are counted by
    /// [`Node::target_qps`]).
    pub fn queue_pairs(&self) -> usize {
        let st = self.shared().state.lock();
        if self.shared().node.is_some() {
            st.initiators.len()
        } else {
            st.eps.len()
        }
    }

    /// Receive buffers posted on the shared receive queue now.
    pub fn posted_receives(&self) -> u64 {
        self.shared().state.lock().budget.posted
    }

    /// The verbs context underneath (for device queries).
    pub fn verbs_context(&self) -> &rdmx_verbs::Context {
        &self.shared().vctx
    }

    /// Opens a send batch on this thread: until the returned guard is dropped, messages this
    /// thread sends (on any endpoint of this context) may be held by the device and leave
    /// together, and small ones (up to the inline threshold) of one endpoint share packed
    /// frames: one SEND, one credit and one receive buffer for many messages. Delivery,
    /// order and errors are those of the same sends made one by one; what changes is the
    /// cost: on the soft provider, a system call per batch instead of one per message
    /// (see `docs/MESSAGING.md`, "Send batches").
    ///
    /// Waiting inside a batch is fine (a send that waits for a credit, or a receive, makes
    /// progress, which sends what is held). Do not keep a batch open while blocked on
    /// something else: held messages wait with it.
    pub fn batch(&self) -> Batch<'_> {
        let sh: &Shared = self.shared();
        OPEN_BATCHES.with(|b| b.borrow_mut().push(std::ptr::from_ref(sh) as usize));
        Batch {
            sh,
            _posts: sh.vctx.batch_posts(),
            _not_send: std::marker::PhantomData,
        }
    }
}

thread_local! {
    /// The contexts (by address) with a send batch open on this thread, innermost last.
    static OPEN_BATCHES: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// True when the calling thread has a send batch open on the context of `sh`.
pub(crate) fn batch_open(sh: &Shared) -> bool {
    let me = std::ptr::from_ref(sh) as usize;
    OPEN_BATCHES.with(|b| b.borrow().contains(&me))
}

/// An open send batch ([`Context::batch`]); dropping it sends what it held.
#[derive(Debug)]
#[must_use = "the batch ends when the guard is dropped"]
pub struct Batch<'a> {
    sh: &'a Shared,
    // Dropped after `drop` below has posted the packed frames, so that they leave with
    // the rest of the batch.
    _posts: rdmx_verbs::PostBatch<'a>,
    // The open batch is recorded per thread.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        let me = std::ptr::from_ref(self.sh) as usize;
        OPEN_BATCHES.with(|b| {
            let mut b = b.borrow_mut();
            if let Some(i) = b.iter().rposition(|&x| x == me) {
                b.remove(i);
            }
        });
        let mut st = self.sh.state.lock();
        if !st.packs.is_empty() {
            self.sh.flush_packs(&mut st);
        }
    }
}

/// Accepts endpoints on a TCP address.
#[derive(Debug)]
pub struct Listener {
    pub(crate) ctx: Context,
    pub(crate) tcp: TcpListener,
    local: SocketAddr,
}

impl Listener {
    /// The address it listens on (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Waits for the next peer and sets up an endpoint with it. A peer that misbehaves
    /// during the exchange gives an error (and is told why when possible); the listener stays
    /// usable.
    ///
    /// # Errors
    /// `Bootstrap` for a failed exchange, `Verbs` for queue pair set-up failures.
    pub fn accept(&self) -> Result<Endpoint> {
        let (stream, peer) = bootstrap::accept(&self.tcp)?;
        crate::conn::accept(&self.ctx, stream, peer)
    }

    /// [`accept`](Self::accept), giving up with `Timeout` when no peer connects within
    /// `timeout` (the exchange with a peer that does connect has its own deadline, the
    /// connect timeout). Do not call `accept` on the same listener from another thread
    /// meanwhile.
    ///
    /// # Errors
    /// `Timeout`, or as `accept`.
    pub fn accept_timeout(&self, timeout: Duration) -> Result<Endpoint> {
        let start = Instant::now();
        match bootstrap::accept_until(&self.tcp, start + timeout)? {
            Some((stream, peer)) => crate::conn::accept(&self.ctx, stream, peer),
            None => Err(Error::Timeout(start.elapsed())),
        }
    }

    /// The context it belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

pub(crate) fn resolve(addr: impl ToSocketAddrs) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .map_err(|e| Error::InvalidArgument(format!("bad address: {e}")))?
        .next()
        .ok_or_else(|| Error::InvalidArgument("the address resolved to nothing".into()))
}

pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

/// Polls between two looks at the clock while spinning.
const CLOCK_EVERY: u32 = 16;

/// Waits until `f` returns `Some`, driving progress: polls for the busy-poll time, then
/// sleeps on the context's condition variable (the background thread, or any thread that
/// makes progress, wakes it). `timeout = None` waits forever; the busy-poll time and the
/// timeout count from the first look that fails.
pub(crate) fn wait_until<T>(
    sh: &Shared,
    timeout: Option<Duration>,
    mut f: impl FnMut(&mut State) -> Option<Result<T>>,
) -> Result<T> {
    // The clock is read only once a look has failed (a call that finds what it wants at
    // once reads it only for the poll stamp): at a million messages a second, each read
    // (~22 ns here) is a percent of the time. Spin time and timeout count from there.
    let mut start: Option<Instant> = None;
    let mut sleep = Duration::from_micros(100);
    // Reading the clock costs about as much as an empty poll here, so the spin looks at it
    // only every few polls.
    let mut polls = 0u32;
    loop {
        {
            let mut st = sh.state.lock();
            if polls.is_multiple_of(CLOCK_EVERY) {
                sh.last_app_poll.store(sh.now_nanos(), Ordering::Relaxed);
            }
            if sh.progress(&mut st) > 0 {
                sh.wake_all();
            }
            if let Some(r) = f(&mut st) {
                return r;
            }
            polls = polls.wrapping_add(1);
            if !polls.is_multiple_of(CLOCK_EVERY) && start.is_some() {
                drop(st);
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            let begun = *start.get_or_insert(now);
            if let Some(t) = timeout
                && now >= begun + t
            {
                return Err(Error::Timeout(now - begun));
            }
            if now >= begun + sh.cfg.busy_poll {
                // Sleep: arm the completion queue (the background thread sleeps on its
                // channel), look once more to close the race, then wait. Credits that arrive
                // by RDMA WRITE raise no completion, so the sleep is also bounded.
                sh.cq.req_notify(false);
                if sh.progress(&mut st) > 0 {
                    sh.wake_all();
                }
                if let Some(r) = f(&mut st) {
                    return r;
                }
                let mut t = sleep;
                if let Some(timeout) = timeout {
                    t = t.min((begun + timeout).saturating_duration_since(now));
                }
                // Stop claiming the device's reception, so the soft provider's engine thread
                // processes packets while we sleep.
                sh.vctx.yield_polling();
                sh.sleepers.fetch_add(1, Ordering::AcqRel);
                sh.cond.wait_for(&mut st, t);
                sh.sleepers.fetch_sub(1, Ordering::AcqRel);
                sleep = (sleep * 2).min(Duration::from_millis(5));
                continue;
            }
        }
        std::hint::spin_loop();
    }
}

/// The pack flusher: posts packed frames that stayed open `PACK_HOLD` (a thread holding a
/// send batch while it blocks on something other than rdmx). It sleeps on its condition
/// variable without a timeout while no frame is open, so an idle context or one that never
/// batches pays nothing; while frames keep opening it wakes once per `PACK_HOLD`.
fn pack_flusher(sh: &Shared) {
    let mut st = sh.state.lock();
    while !sh.stop.load(Ordering::Acquire) {
        match st.pack_due {
            None => sh.pack_cond.wait(&mut st),
            Some(due) => {
                if Instant::now() < due {
                    sh.pack_cond.wait_until(&mut st, due);
                    continue;
                }
                st.pack_due = None;
                if !st.packs.is_empty() {
                    sh.flush_packs(&mut st);
                    if !st.packs.is_empty() {
                        // No send slot now: look again soon.
                        st.pack_due = Some(Instant::now() + crate::send::PACK_HOLD);
                    }
                }
            }
        };
    }
}

/// The background thread: progress when no application thread polls, keepalives, device
/// events. It sleeps on the completion channel and never spins.
fn background(sh: &Shared) {
    let tick = sh.keepalive_tick();
    let mut next_keepalive = Instant::now() + tick;
    let mut sleep;
    while !sh.stop.load(Ordering::Acquire) {
        // Sleep on the completion channel armed when no application thread is polling, or
        // when one is waiting for us to wake it.
        let idle = sh
            .now_nanos()
            .saturating_sub(sh.last_app_poll.load(Ordering::Relaxed))
            > 2_000_000
            || sh.sleepers.load(Ordering::Acquire) > 0;
        if idle {
            sh.cq.req_notify(false);
        }
        {
            let mut st = sh.state.lock();
            if sh.progress(&mut st) > 0 {
                sh.wake_all();
            }
            while let Some(ev) = sh.vctx.get_async_event(Duration::ZERO) {
                match &sh.node {
                    // The contexts of a node share its device: every one of them hears
                    // every event and acts on what concerns it.
                    Some(n) => n.share_event(ev),
                    None => on_async_event(sh, &mut st, ev),
                }
            }
            let mine: Vec<AsyncEvent> = sh.node_events.lock().drain(..).collect();
            for ev in mine {
                on_async_event(sh, &mut st, ev);
            }
            let now = Instant::now();
            if now >= next_keepalive {
                rearm(sh, &mut st, None);
                crate::conn::keepalive(sh, &mut st, now);
                next_keepalive = now + tick;
                st.recall_scanned_at = Some(now);
            } else if st.recall_pressure || st.recall_watch {
                st.recall_scanned_at = Some(now);
                crate::recall::tick(sh, &mut st, now, tick, false);
            }
            sleep = if st.recall_pressure {
                crate::recall::PRESSURE_SCAN.min(tick)
            } else if st.recall_watch {
                st.recall_watch_every.min(tick)
            } else {
                tick
            };
        }
        // While an application thread polls, stay asleep for a whole tick: a thread that
        // stops polling to sleep arms the completion queue first, which wakes us at once,
        // and waking up more often only steals the polling thread's CPU. While a peer
        // starves for credits, look again sooner.
        let _ = sh.cq.channel().wait_spin(sleep, Duration::ZERO);
    }
    // The context is going away: endpoints that still exist keep working through their own
    // progress calls.
}

/// Loads the path an endpoint migrated away from as its new alternate, once that path's
/// local port is active and a tick has passed since the migration (`port`: a port that just
/// became active; `None`: check them all). Called on every tick and on `PortActive`.
fn rearm(sh: &Shared, st: &mut State, port: Option<u8>) {
    let mut rearmed = Vec::new();
    for (_, ep) in st.eps.iter_mut() {
        let (Some(p), Some(paths)) = (ep.rearm_port, &ep.paths) else {
            continue;
        };
        if port.is_some_and(|q| q != p) || !matches!(ep.status, crate::ep::Status::Open) {
            continue;
        }
        if ep.rearm_after.is_some_and(|t| Instant::now() < t) {
            continue;
        }
        let up = sh
            .vctx
            .query_port(p)
            .is_ok_and(|a| a.state == rdmx_verbs::PortState::Active);
        if !up {
            continue;
        }
        // Port 1 reaches the peer's primary address, port 2 its alternate.
        let target = &paths[usize::from(p) - 1];
        match crate::conn::load_alternate(sh, &ep.qp, target, p) {
            Ok(()) => {
                ep.rearm_port = None;
                rearmed.push(ep.id);
            }
            Err(e) => tracing::debug!(endpoint = ep.id, "re-arming failed: {e}"),
        }
    }
    for endpoint in rearmed {
        st.events.push_back(Event::PathRearmed { endpoint });
    }
}

fn on_async_event(sh: &Shared, st: &mut State, ev: AsyncEvent) {
    match ev {
        AsyncEvent::SrqLimitReached(_) => {
            sh.after(st);
            let _ = sh.srq.arm_limit((sh.cfg.srq_depth / 4).max(1));
        }
        AsyncEvent::PathMigrated(qpn) => {
            // The queue pair an endpoint sends on (its RC QP, or a shared XRC initiator):
            // every endpoint on it moved. (A node's XRC target QPs migrate on their own;
            // the endpoints hear of it through their initiators.)
            let mut any = false;
            for (_, ep) in st.eps.iter_mut().filter(|(_, e)| e.qpn == qpn.0) {
                ep.on_alt = !ep.on_alt;
                // The path left behind leaves from port 1 when we are now on the alternate.
                ep.rearm_port = Some(if ep.on_alt { 1 } else { 2 });
                ep.rearm_after = Some(Instant::now() + sh.keepalive_tick());
                tracing::info!(endpoint = ep.id, "path migrated");
                st.events.push_back(Event::PathMigrated { endpoint: ep.id });
                any = true;
            }
            if any {
                sh.wake_all();
            }
        }
        AsyncEvent::PortActive(port) => rearm(sh, st, Some(port)),
        AsyncEvent::SrqError(srq) if srq == sh.srq.handle() => {
            // Nothing can arrive any more: the receive queue every endpoint shares is gone
            // (for a node shared by processes, the process hosting its domain went away).
            tracing::warn!("the context's shared receive queue failed; every endpoint is down");
            let keys: Vec<usize> = st.eps.iter().map(|(k, _)| k).collect();
            for k in keys {
                sh.fail(
                    st,
                    k,
                    rdmx_core::DisconnectCause::TransportError(
                        "the context's shared receive queue failed (SrqError; on a node \
                         shared by processes, its domain's host went away)"
                            .into(),
                    ),
                );
            }
            sh.wake_all();
        }
        AsyncEvent::QpFatal(qpn)
        | AsyncEvent::QpAccessError(qpn)
        | AsyncEvent::QpRequestError(qpn) => {
            if let Some(&k) = st.by_qpn.get(&qpn.0) {
                sh.fail(
                    st,
                    k,
                    rdmx_core::DisconnectCause::TransportError(format!("{ev:?}")),
                );
            }
        }
        other => tracing::debug!(event = ?other, "device event"),
    }
}
