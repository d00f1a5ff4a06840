//! The RC context: a worker (`rdmx_core::worker`: device, protection domain, completion
//! channel, buffer pool, waits and the background thread) with the RC transport attached
//! ([`RcTransport`]: completion queue, shared receive queue, mailbox and endpoint table).
//! The `rdmx` facade composes the same pieces (with the other transports); this context is
//! the RC-only one, which rdmx-rc's own tests use.

use std::marker::PhantomData;
use std::net::ToSocketAddrs;
use std::time::Duration;

use rdmx_core::bootstrap::Transport;
use rdmx_core::pool::PoolStats;
use rdmx_core::worker::{Batch, Worker, WorkerHandle};
use rdmx_core::{
    Arrival, Buf, Config, ConfigBuilder, Error, Event, Message, RegCacheStats, Result,
};
use rdmx_verbs::{DeviceOptions, NicCounters};

use crate::attach::{Listener, RcTransport};
use crate::endpoint::{Endpoint, LocalRegion, RemoteAccess};
use crate::node::Node;
use crate::state::Stats;

pub use crate::state::MAX_ENDPOINTS;

/// Builds a [`Context`]. Every method has an `RDMX_*` environment variable (see
/// `rdmx_core::config`); values set here win.
///
/// `C` is what it builds: this crate's [`Context`], or a context of the `rdmx` facade (any
/// [`FromParts`]).
#[derive(Debug, Clone)]
#[must_use]
pub struct ContextBuilder<C = Context> {
    cfg: ConfigBuilder,
    options: Option<DeviceOptions>,
    node: Option<Node>,
    _builds: PhantomData<fn() -> C>,
}

impl<C> Default for ContextBuilder<C> {
    fn default() -> Self {
        Self {
            cfg: ConfigBuilder::default(),
            options: None,
            node: None,
            _builds: PhantomData,
        }
    }
}

/// What a [`ContextBuilder`] resolved, for the context type it builds.
#[derive(Debug)]
#[non_exhaustive]
pub struct ContextParts {
    /// The configuration (builder values, then `RDMX_*` variables, then defaults).
    pub cfg: Config,
    /// Options for opening the device, if given.
    pub options: Option<DeviceOptions>,
    /// The XRC node to build on, if given.
    pub node: Option<Node>,
}

/// A context a [`ContextBuilder`] can build.
pub trait FromParts: Sized {
    /// Opens the device and sets everything up.
    ///
    /// # Errors
    /// `Config` for bad settings, `Verbs` when the device cannot be opened or a resource
    /// cannot be created.
    fn from_parts(parts: ContextParts) -> Result<Self>;
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

impl<C: FromParts> ContextBuilder<C> {
    /// The device to open (`RDMX_DEVICE`; default `soft:127.0.0.1`).
    pub fn device(mut self, name: impl Into<String>) -> Self {
        self.cfg = self.cfg.device(name);
        self
    }
    forward!(
        /// The transport of endpoints (`RDMX_TRANSPORT`).
        transport: Transport
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
    forward!(
        /// The GID index endpoints use on every port (`RDMX_GID_INDEX`; default: the
        /// port's RoCE v2 IPv4-mapped entry).
        gid_index: u32
    );

    /// The bootstrap's shared secret (`RDMX_AUTH_KEY`, at least 16 bytes): connections
    /// are made only between contexts that hold the same one (a challenge-response before
    /// anything is set up; see `rdmx_core::bootstrap::auth`).
    pub fn auth_key(mut self, key: impl AsRef<[u8]>) -> Self {
        self.cfg = self.cfg.auth_key(key);
        self
    }

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
        self.cfg = self.cfg.transport(Transport::Xrc);
        self
    }

    /// Opens the device and sets everything up.
    ///
    /// # Errors
    /// `Config` for bad settings, `Verbs` when the device cannot be opened or a resource
    /// cannot be created.
    pub fn build(self) -> Result<C> {
        C::from_parts(self.resolve_parts()?)
    }

    /// What [`build`](Self::build) hands to the context type: the configuration resolved
    /// (builder values, then the environment, then the defaults), and the options.
    ///
    /// # Errors
    /// `Config` for an unparsable variable or values that do not fit together.
    pub fn resolve_parts(self) -> Result<ContextParts> {
        Ok(ContextParts {
            cfg: self.cfg.resolve()?,
            options: self.options,
            node: self.node,
        })
    }
}

impl FromParts for Context {
    fn from_parts(p: ContextParts) -> Result<Self> {
        Self::open(p.cfg, p.options, p.node)
    }
}

/// An rdmx context over RC (or XRC) queue pairs: one per process (or per group of threads).
/// Cheap to clone; endpoints keep what they need alive on their own.
#[derive(Debug, Clone)]
pub struct Context {
    /// Keeps the background thread (see `WorkerHandle`).
    handle: WorkerHandle,
    rc: RcTransport,
}

/// The worker an RC or XRC context of `cfg` runs on, and its XRC node: an XRC context lives
/// on a node (`node`, or one opened from `cfg`: `Config::xrc_domain` names a node shared by
/// processes) and runs on the node's device; an RC one opens a device of its own. The pool
/// gets the size classes `recv_classes` (every transport's receive buffers; RC's is
/// `cfg.recv_buf_size()`).
///
/// # Errors
/// `Verbs` when the device, node or a resource cannot be opened.
pub fn open_worker(
    cfg: &Config,
    options: Option<DeviceOptions>,
    node: Option<Node>,
    recv_classes: &[usize],
) -> Result<(Worker, Option<Node>)> {
    let mut options = options;
    let node = match (cfg.transport, node) {
        (Transport::Xrc, Some(n)) => Some(n),
        (Transport::Xrc, None) => Some(match (options.take(), &cfg.xrc_domain) {
            (Some(o), Some(f)) => Node::open_shared_with(&cfg.device, o, f)?,
            (None, Some(f)) => Node::open_shared(&cfg.device, f)?,
            (Some(o), None) => Node::open_with(&cfg.device, o)?,
            (None, None) => Node::open(&cfg.device)?,
        }),
        // (A UD context's worker is a plain one too: `rdmx::Context` attaches rdmx-ud.)
        (Transport::Rc | Transport::Ud, _) => None,
    };
    let w = match &node {
        Some(n) => Worker::over(cfg, n.inner.vctx.clone(), n.inner.pd.clone(), recv_classes)?,
        None => Worker::open(cfg, options, recv_classes)?,
    };
    Ok((w, node))
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
        if cfg.transport == Transport::Ud {
            return Err(Error::Config(
                "transport ud: rdmx_rc::Context makes RC and XRC endpoints only; UD endpoints \
                 are rdmx-ud's"
                    .into(),
            ));
        }
        let (w, node) = open_worker(&cfg, options, node, &[cfg.recv_buf_size()])?;
        let rc = RcTransport::attach(&w, &cfg, node.as_ref())?;
        let handle = w.start()?;
        Ok(Self { handle, rc })
    }

    pub(crate) fn from_parts(handle: WorkerHandle, rc: RcTransport) -> Self {
        Self { handle, rc }
    }

    /// The worker underneath (progress, waits, events, the pool).
    pub fn worker(&self) -> &Worker {
        self.handle.worker()
    }

    /// The RC transport of this context.
    pub fn transport(&self) -> &RcTransport {
        &self.rc
    }

    /// The effective configuration (see [`RcTransport::config`]).
    pub fn config(&self) -> &Config {
        self.rc.config()
    }

    /// The largest payload actually sent inline (the configured threshold, capped by the
    /// device).
    pub fn inline_max(&self) -> usize {
        self.rc.inline_max()
    }

    /// Starts accepting endpoints on `addr` (the TCP side channel).
    ///
    /// # Errors
    /// `Bootstrap` when the address cannot be bound.
    pub fn listen(&self, addr: impl ToSocketAddrs) -> Result<Listener> {
        self.rc.listen(addr, &self.handle)
    }

    /// Connects an endpoint to a listener at `addr`.
    ///
    /// # Errors
    /// As [`RcTransport::connect`].
    pub fn connect(&self, addr: impl ToSocketAddrs) -> Result<Endpoint> {
        self.rc.connect(addr)
    }

    /// [`connect`](Self::connect) with connection data (see
    /// [`RcTransport::connect_with`]).
    ///
    /// # Errors
    /// As [`RcTransport::connect_with`].
    pub fn connect_with(&self, addr: impl ToSocketAddrs, data: &[u8]) -> Result<Endpoint> {
        self.rc.connect_with(addr, data)
    }

    /// Waits for the next message from any endpoint of this context (see
    /// [`Worker::recv`]).
    ///
    /// # Errors
    /// As [`Worker::recv`].
    pub fn recv(&self) -> Result<Message> {
        self.worker().recv()
    }

    /// [`recv`](Self::recv) giving up after `timeout`.
    ///
    /// # Errors
    /// `Timeout` when no endpoint had a message in time.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Message> {
        self.worker().recv_timeout(timeout)
    }

    /// The next message of any endpoint already received, without polling the device (see
    /// [`Worker::try_take`]).
    pub fn try_take(&self) -> Option<Message> {
        self.worker().try_take()
    }

    /// The next message of any endpoint if one is there now.
    ///
    /// # Errors
    /// `WouldBlock` when no endpoint has a message.
    pub fn try_recv(&self) -> Result<Message> {
        self.worker().try_recv()
    }

    /// A buffer from the registered pool, waiting (up to the connect timeout) while the pool
    /// is at its cap.
    ///
    /// # Errors
    /// As [`Worker::alloc`].
    pub fn alloc(&self, len: usize) -> Result<Buf> {
        self.worker().alloc(len)
    }

    /// A buffer from the registered pool, or `WouldBlock` when the pool is at its cap.
    ///
    /// # Errors
    /// As [`Worker::try_alloc`].
    pub fn try_alloc(&self, len: usize) -> Result<Buf> {
        self.worker().try_alloc(len)
    }

    /// Registers `len` zeroed bytes that peers may read, write and use atomics on.
    ///
    /// # Errors
    /// `Verbs` when registration fails.
    pub fn register(&self, len: usize) -> Result<LocalRegion> {
        self.rc.register(len)
    }

    /// Registers `len` zeroed bytes that peers may access as `access` allows (a region
    /// peers only read is [`RemoteAccess::Read`]: a peer that writes it fails).
    ///
    /// # Errors
    /// `Verbs` when registration fails.
    pub fn register_with(&self, len: usize, access: RemoteAccess) -> Result<LocalRegion> {
        self.rc.register_with(len, access)
    }

    /// The registration cache's counters (zero-copy sends with
    /// [`Endpoint::send_shared`]).
    pub fn regcache_stats(&self) -> RegCacheStats {
        self.rc.regcache_stats()
    }

    /// Deregisters every cached registration no send is using; returns how many.
    pub fn flush_regcache(&self) -> usize {
        self.rc.flush_regcache()
    }

    /// Runs the progress engine once (completions, credits, rendezvous); returns how many
    /// completions it handled. Blocking calls do this themselves; call it when only polling
    /// with `try_*` calls.
    pub fn progress(&self) -> usize {
        self.worker().progress()
    }

    /// The next event (path migrations, disconnects), if any (see [`Worker::poll_event`]).
    pub fn poll_event(&self) -> Option<Event> {
        self.worker().poll_event()
    }

    /// Waits up to `timeout` for the next event.
    pub fn wait_event(&self, timeout: Duration) -> Option<Event> {
        self.worker().wait_event(timeout)
    }

    /// Waits for the next message of any endpoint or the next event, whichever comes first
    /// (see [`Worker::recv_or_event`]): one loop serves messages and learns of peers' ends.
    ///
    /// # Errors
    /// None: it waits until there is one.
    pub fn recv_or_event(&self) -> Result<Arrival> {
        self.worker().recv_or_event()
    }

    /// [`recv_or_event`](Self::recv_or_event) giving up after `timeout`.
    ///
    /// # Errors
    /// `Timeout` when neither came in time.
    pub fn recv_or_event_timeout(&self, timeout: Duration) -> Result<Arrival> {
        self.worker().recv_or_event_timeout(timeout)
    }

    /// [`recv_or_event`](Self::recv_or_event) without blocking the thread.
    ///
    /// # Errors
    /// As `recv_or_event`.
    #[cfg(feature = "tokio")]
    pub async fn recv_or_event_async(&self) -> Result<Arrival> {
        self.worker().recv_or_event_async().await
    }

    /// The next event without blocking the thread, woken when one is queued (to
    /// `select!` on a peer's end); a cancelled future leaves it queued.
    ///
    /// # Errors
    /// None: it waits until there is one.
    #[cfg(feature = "tokio")]
    pub async fn next_event_async(&self) -> Result<Event> {
        self.worker().next_event_async().await
    }

    /// Counters of the message layer.
    pub fn stats(&self) -> Stats {
        self.rc.stats()
    }

    /// Counters of the buffer pool.
    pub fn pool_stats(&self) -> PoolStats {
        self.worker().pool_stats()
    }

    /// Counters of the device (RNR NAKs, retransmissions, ...).
    pub fn device_counters(&self) -> NicCounters {
        self.worker().device_counters()
    }

    /// Number of endpoints in the table (including ones that are down but not yet dropped).
    pub fn endpoint_count(&self) -> usize {
        self.rc.endpoint_count()
    }

    /// Queue pairs this context created for its endpoints (see
    /// [`RcTransport::queue_pairs`]).
    pub fn queue_pairs(&self) -> usize {
        self.rc.queue_pairs()
    }

    /// Receive buffers posted on the shared receive queue now.
    pub fn posted_receives(&self) -> u64 {
        self.rc.posted_receives()
    }

    /// The verbs context underneath (for device queries).
    pub fn verbs_context(&self) -> &rdmx_verbs::Context {
        self.worker().verbs_context()
    }

    /// Opens a send batch on this thread (see [`Worker::batch`]): until the returned guard
    /// is dropped, messages this thread sends may be held by the device and leave together,
    /// and small ones (up to the inline threshold) of one endpoint share packed frames: one
    /// SEND, one credit and one receive buffer for many messages. Delivery, order and errors
    /// are those of the same sends made one by one; what changes is the cost: on the soft
    /// provider, a system call per batch instead of one per message (see
    /// `docs/MESSAGING.md`, "Send batches").
    ///
    /// Waiting inside a batch is fine (a send that waits for a credit, or a receive, makes
    /// progress, which sends what is held). Do not keep a batch open while blocked on
    /// something else: held messages wait with it.
    pub fn batch(&self) -> Batch<'_> {
        self.worker().batch()
    }
}

impl Listener {
    /// The context it belongs to (a new handle to it).
    pub fn context(&self) -> Context {
        Context::from_parts(self.handle.clone(), self.rc.clone())
    }
}
