//! The context: a worker (`rdmx_core::worker`: device, protection domain, completion
//! channel, buffer pool, waits and the background thread) with the RC transport in it
//! (completion queue, shared receive queue, mailbox and endpoint table); the listener.

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdmx_core::bootstrap::{self, TransportKind};
use rdmx_core::header::{HEADER_LEN, RTS_LEN};
use rdmx_core::pool::PoolStats;
use rdmx_core::worker::{Batch, Wait, Worker, WorkerHandle, wait_until};
use rdmx_core::{Buf, Config, ConfigBuilder, Error, Event, Message, Result};
use rdmx_verbs::{AccessFlags, DeviceOptions, NicCounters, SrqInitAttr};

use crate::endpoint::{Endpoint, LocalRegion};
use crate::node::Node;
use crate::state::{RcRef, RcTransport, Shared, State, Stats};
use crate::util::{far, random_u64, resolve};
use crate::wire::MAILBOX_LEN;

pub use crate::state::MAX_ENDPOINTS;

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

/// An rdmx context: one per process (or per group of threads). Cheap to clone; endpoints
/// keep what they need alive on their own.
#[derive(Debug, Clone)]
pub struct Context {
    /// Keeps the background thread (see `WorkerHandle`).
    _handle: WorkerHandle,
    rc: RcRef,
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
        let mut cfg = cfg;
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
        let w = match &node {
            Some(n) => Worker::over(
                &cfg,
                n.inner.vctx.clone(),
                n.inner.pd.clone(),
                &[cfg.recv_buf_size()],
            )?,
            None => Worker::open(&cfg, options, &[cfg.recv_buf_size()])?,
        };
        let vctx = w.verbs_context().clone();
        let pd = w.pd().clone();
        let pool = w.pool().clone();
        let dev = vctx.query_device();
        let cqe = (cfg.srq_depth as usize * 2 + 64 * 1024).min(dev.max_cqe.max(1) as usize);
        let cq = vctx.create_cq(cqe, Some(w.channel()))?;
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
        let max_inline_data = ((cfg.inline_threshold + HEADER_LEN).max(RTS_LEN) as u32)
            .min(dev.max_inline_data.max(RTS_LEN as u32));
        let inline_max = cfg
            .inline_threshold
            .min((max_inline_data as usize).saturating_sub(HEADER_LEN));
        // What `config()` reports is what applies: the inline threshold as the device caps
        // it, and the largest message as the pool can hold one beside the receive buffers
        // (which stay posted for the context's life). A bigger message could never be
        // received: its rendezvous read would wait for a buffer for ever.
        cfg.inline_threshold = inline_max;
        pool.reserve(pool.footprint_of(cfg.srq_depth as usize, cfg.recv_buf_size()));
        let largest = pool.largest();
        if cfg.max_message > largest {
            tracing::info!(
                max_message = cfg.max_message,
                largest,
                pool_max = cfg.pool_max,
                "max_message lowered to the largest buffer the pool can hold beside the \
                 receive buffers"
            );
            cfg.max_message = largest;
        }
        let port = vctx.query_port(1)?;
        let regcache = rdmx_core::RegCache::new(pd.clone(), cfg.regcache_max);
        let batch_posts = node.as_ref().is_some_and(|n| n.inner.xrcd.is_remote());
        let mut made = None;
        w.add_transport(|tid| {
            let st = State::new(&cfg);
            let shared = Arc::new(Shared {
                vctx,
                pd,
                cq,
                srq,
                mailbox,
                pool,
                regcache,
                tid,
                inline_max,
                max_inline_data,
                mtu_bytes: port.active_mtu.bytes() as u32,
                ports: dev.phys_port_cnt,
                node: node.map(|n| n.inner),
                node_events: Arc::new(Mutex::new(std::collections::VecDeque::new())),
                xrc_lock: Mutex::new(()),
                batch_posts,
                context_id: random_u64(),
                cfg,
            });
            made = Some(shared.clone());
            Ok(RcTransport { sh: shared, st })
        })?;
        let shared = made.ok_or_else(|| Error::Config("the RC transport was not made".into()))?;
        let rc = RcRef { w, sh: shared };
        rc.with(|sh, st, cx| sh.after(st, cx));
        if let Some(n) = &rc.sh.node {
            n.contexts.lock().push(Arc::downgrade(&rc.sh.node_events));
        }
        let handle = rc.w.start()?;
        Ok(Self {
            _handle: handle,
            rc,
        })
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.rc.sh
    }

    /// The transport and its worker.
    pub(crate) fn rc(&self) -> &RcRef {
        &self.rc
    }

    /// The effective configuration.
    pub fn config(&self) -> &Config {
        &self.rc.sh.cfg
    }

    /// The largest payload actually sent inline (the configured threshold, capped by the
    /// device).
    pub fn inline_max(&self) -> usize {
        self.rc.sh.inline_max
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
            .map_err(|error| bootstrap::BootstrapError::Io {
                op: "local_addr",
                error,
            })?;
        Ok(Listener {
            ctx: self.clone(),
            tcp,
            local,
            exchanges: Arc::new(crate::accept::Exchanges::new()),
        })
    }

    /// Connects an endpoint to a listener at `addr`.
    ///
    /// # Errors
    /// `Bootstrap` when the exchange fails (refused, garbage, version mismatch, timeout),
    /// `Verbs` when the queue pair cannot be set up.
    pub fn connect(&self, addr: impl ToSocketAddrs) -> Result<Endpoint> {
        let addr = resolve(addr)?;
        let e = crate::conn::connect(&self.rc, addr)?;
        Ok(Endpoint::new(self.rc.clone(), e.key, e.id, addr))
    }

    /// A buffer from the registered pool, waiting (up to the connect timeout) while the pool
    /// is at its cap.
    ///
    /// # Errors
    /// `PoolCapacity` when `len` can never fit; `Timeout` when no buffer came back in time.
    pub fn alloc(&self, len: usize) -> Result<Buf> {
        let sh = self.shared();
        wait_until(
            &self.rc.w,
            Wait::WORKER,
            Some(sh.cfg.connect_timeout),
            |_| match sh.pool.try_alloc(len) {
                Err(Error::WouldBlock) => None,
                r => Some(r),
            },
        )
    }

    /// A buffer from the registered pool, or `WouldBlock` when the pool is at its cap.
    ///
    /// # Errors
    /// As [`BufferPool::try_alloc`](rdmx_core::BufferPool::try_alloc).
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
        self.rc.w.progress()
    }

    /// The next event (path migrations, disconnects), if any. The context keeps the latest
    /// [`MAX_EVENTS`](crate::MAX_EVENTS) for an application that does not ask; older ones
    /// are dropped and counted in [`Stats::events_dropped`].
    pub fn poll_event(&self) -> Option<Event> {
        let w = &self.rc.w;
        let mut ws = w.lock();
        w.progress_locked(&mut ws);
        ws.pop_event()
    }

    /// Waits up to `timeout` for the next event.
    pub fn wait_event(&self, timeout: Duration) -> Option<Event> {
        wait_until(&self.rc.w, Wait::WORKER, Some(timeout), |ws| {
            ws.pop_event().map(Ok)
        })
        .ok()
    }

    /// Counters of the message layer.
    pub fn stats(&self) -> Stats {
        let mut ws = self.rc.w.lock();
        let events_dropped = ws.events_dropped();
        self.rc.on(&mut ws, |_, st, _| Stats {
            recv_held: st.held,
            events_dropped,
            ..st.stats
        })
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
        self.rc.with(|_, st, _| st.eps.len())
    }

    /// Queue pairs this context created for its endpoints: one per endpoint with RC, one
    /// initiator per remote node with XRC (the node's target queue pairs are counted by
    /// [`Node::target_qps`]).
    pub fn queue_pairs(&self) -> usize {
        self.rc.with(|sh, st, _| {
            if sh.node.is_some() {
                st.initiators.len()
            } else {
                st.eps.len()
            }
        })
    }

    /// Receive buffers posted on the shared receive queue now.
    pub fn posted_receives(&self) -> u64 {
        self.rc.with(|_, st, _| st.budget.posted)
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
        self.rc.w.batch()
    }
}

/// Accepts endpoints on a TCP address.
#[derive(Debug)]
pub struct Listener {
    pub(crate) ctx: Context,
    pub(crate) tcp: TcpListener,
    local: SocketAddr,
    /// Exchanges with peers under way (`accept.rs`).
    pub(crate) exchanges: Arc<crate::accept::Exchanges>,
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
    /// Exchanges with several peers run at once (up to 64, each on a thread of its own),
    /// and their endpoints come out in the order the peers connected, except that an
    /// exchange still running after 20 ms holds back no other: a peer that connects and
    /// then says nothing does not stop the others. An exchange still running when the call returns goes
    /// on, and a later call returns its endpoint; one still running when the listener is
    /// dropped ends, and its endpoint is closed.
    ///
    /// An XRC context runs its exchanges one at a time. When another one (this context's own
    /// connect, say) does not finish within 20 ms, the peer is asked to connect again
    /// (`bootstrap::REJECT_BUSY`) and this call goes on to the next connection, so that two
    /// contexts connecting to each other at once do not wait for each other.
    ///
    /// # Errors
    /// `Bootstrap` for a failed exchange, `Verbs` for queue pair set-up failures.
    pub fn accept(&self) -> Result<Endpoint> {
        loop {
            if let Some(ep) =
                crate::accept::accept_until(self.ctx.rc(), &self.tcp, &self.exchanges, None)?
            {
                return Ok(ep);
            }
        }
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
        match crate::accept::accept_until(
            self.ctx.rc(),
            &self.tcp,
            &self.exchanges,
            Some(far(start, timeout)),
        )? {
            Some(ep) => Ok(ep),
            None => Err(Error::Timeout(start.elapsed())),
        }
    }

    /// The context it belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl Context {
    /// Waits for the next message from any endpoint of this context. Endpoints with
    /// messages waiting take turns (one message each, round robin); the messages of one
    /// endpoint arrive in order. [`Message::endpoint`] says which endpoint sent it (the
    /// [`Endpoint::id`](crate::Endpoint::id) the application got from `connect` or
    /// `accept`).
    ///
    /// This never reports a disconnect: endpoints that go down show up as
    /// [`Event::Disconnected`] in
    /// [`poll_event`](Self::poll_event). A peer's orderly close is reported once the last
    /// message it sent before closing has been taken, so an application may drop the
    /// endpoint when the event comes. Messages of an endpoint whose handle was dropped
    /// are not delivered. It can be mixed with [`Endpoint::recv`](crate::Endpoint::recv) on
    /// the same endpoints: a
    /// message goes to whichever call takes it first.
    ///
    /// # Errors
    /// None: it waits until some endpoint has a message. (The `Result` matches the other
    /// receive calls; [`recv_timeout`](Self::recv_timeout) and
    /// [`try_recv`](Self::try_recv) do return errors.)
    pub fn recv(&self) -> Result<Message> {
        let w = &self.rc().w;
        wait_until(w, Wait::ANY_MESSAGE, None, |ws| w.take_any(ws).map(Ok))
    }

    /// [`recv`](Self::recv) giving up after `timeout`.
    ///
    /// # Errors
    /// `Timeout` when no endpoint had a message in time.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Message> {
        let w = &self.rc().w;
        wait_until(w, Wait::ANY_MESSAGE, Some(timeout), |ws| {
            w.take_any(ws).map(Ok)
        })
    }

    /// The next message of any endpoint if one is there now (after one round of
    /// progress).
    ///
    /// # Errors
    /// `WouldBlock` when no endpoint has a message.
    pub fn try_recv(&self) -> Result<Message> {
        let w = &self.rc().w;
        let mut ws = w.lock();
        if let Some(m) = w.take_any(&mut ws) {
            return Ok(m);
        }
        if w.progress_locked(&mut ws) > 0 {
            w.wake_all();
        }
        w.take_any(&mut ws).ok_or(Error::WouldBlock)
    }
}

impl Context {
    /// Registers `len` zeroed bytes that peers may read, write and use atomics on.
    ///
    /// # Errors
    /// `Verbs` when registration fails.
    pub fn register(&self, len: usize) -> Result<LocalRegion> {
        let mr = self.shared().pd.reg_mr(
            len,
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        )?;
        Ok(LocalRegion { mr })
    }
}
