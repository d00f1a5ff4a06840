//! The user-facing context: a worker (`rdmx_core::worker`) and its transports. Today the
//! RC/XRC transport (`rdmx_rc::RcTransport`); the UD transport joins it in the same worker
//! (one device, protection domain, pool, completion channel and progress thread).
//! [`connect`](Context::connect) and [`listen`](Context::listen) pick the transport from the
//! configuration; [`recv`](Context::recv) serves every endpoint of every transport.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use rdmx_core::pool::PoolStats;
use rdmx_core::worker::{Batch, Worker, WorkerHandle};
use rdmx_core::{Buf, Config, Event, Message, RegCacheStats, Result};
use rdmx_rc::{ContextParts, Endpoint, FromParts, LocalRegion, RcTransport, Stats};
use rdmx_verbs::NicCounters;

/// Builds a [`Context`]. Every method has an `RDMX_*` environment variable (see
/// `rdmx_core::config`); values set here win.
pub type ContextBuilder = rdmx_rc::ContextBuilder<Context>;

/// An rdmx context: one per process (or per group of threads). Cheap to clone; endpoints
/// keep what they need alive on their own.
#[derive(Debug, Clone)]
pub struct Context {
    /// Keeps the background thread (see `WorkerHandle`).
    handle: WorkerHandle,
    rc: RcTransport,
}

impl FromParts for Context {
    fn from_parts(p: ContextParts) -> Result<Self> {
        let cfg = p.cfg;
        cfg.validate()?;
        // Every transport's receive-buffer class goes in the one pool.
        let (w, node) = rdmx_rc::open_worker(&cfg, p.options, p.node, &[cfg.recv_buf_size()])?;
        let rc = RcTransport::attach(&w, &cfg, node.as_ref())?;
        let handle = w.start()?;
        Ok(Self { handle, rc })
    }
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
        let mut parts = Self::builder().resolve_parts()?;
        parts.cfg = cfg;
        Self::from_parts(parts)
    }

    /// The worker underneath (progress, waits, events, the pool).
    pub fn worker(&self) -> &Worker {
        self.handle.worker()
    }

    /// The RC/XRC transport.
    pub fn rc(&self) -> &RcTransport {
        &self.rc
    }

    /// The effective configuration of the endpoints' transport.
    pub fn config(&self) -> &Config {
        self.rc.config()
    }

    /// The largest payload actually sent inline (the configured threshold, capped by the
    /// device).
    pub fn inline_max(&self) -> usize {
        self.rc.inline_max()
    }

    /// Starts accepting endpoints on `addr` (the TCP side channel), over the configured
    /// transport.
    ///
    /// # Errors
    /// `Bootstrap` when the address cannot be bound.
    pub fn listen(&self, addr: impl ToSocketAddrs) -> Result<Listener> {
        Ok(Listener {
            inner: self.rc.listen(addr, &self.handle)?,
            ctx: self.clone(),
        })
    }

    /// Connects an endpoint to a listener at `addr`, over the configured transport.
    ///
    /// # Errors
    /// `Bootstrap` when the exchange fails (refused, garbage, version mismatch, timeout),
    /// `Verbs` when the queue pair cannot be set up.
    pub fn connect(&self, addr: impl ToSocketAddrs) -> Result<Endpoint> {
        self.rc.connect(addr)
    }

    /// Waits for the next message from any endpoint of any transport (see
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

    /// The next message of any endpoint if one is there now.
    ///
    /// # Errors
    /// `WouldBlock` when no endpoint has a message.
    pub fn try_recv(&self) -> Result<Message> {
        self.worker().try_recv()
    }

    /// Waits for the next message from any endpoint without blocking the thread.
    ///
    /// # Errors
    /// As [`recv`](Self::recv).
    #[cfg(feature = "tokio")]
    pub async fn recv_async(&self) -> Result<Message> {
        self.worker().recv_async().await
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

    /// The registration cache's counters (zero-copy sends with
    /// [`Endpoint::send_shared`]).
    pub fn regcache_stats(&self) -> RegCacheStats {
        self.rc.regcache_stats()
    }

    /// Deregisters every cached registration no send is using; returns how many.
    pub fn flush_regcache(&self) -> usize {
        self.rc.flush_regcache()
    }

    /// Runs the progress engine once; returns how many completions it handled. Blocking
    /// calls do this themselves; call it when only polling with `try_*` calls.
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

    /// Number of endpoints (including ones that are down but not yet dropped).
    pub fn endpoint_count(&self) -> usize {
        self.rc.endpoint_count()
    }

    /// Queue pairs this context created for its endpoints (see
    /// [`RcTransport::queue_pairs`]).
    pub fn queue_pairs(&self) -> usize {
        self.rc.queue_pairs()
    }

    /// Receive buffers posted on the RC shared receive queue now.
    pub fn posted_receives(&self) -> u64 {
        self.rc.posted_receives()
    }

    /// The verbs context underneath (for device queries).
    pub fn verbs_context(&self) -> &rdmx_verbs::Context {
        self.worker().verbs_context()
    }

    /// Opens a send batch on this thread (see [`Worker::batch`]): until the returned guard
    /// is dropped, messages this thread sends may leave together, and small ones of one
    /// endpoint share packed frames. Do not keep a batch open while blocked on something
    /// other than rdmx: held messages wait with it.
    pub fn batch(&self) -> Batch<'_> {
        self.worker().batch()
    }
}

/// Accepts endpoints on a TCP address.
#[derive(Debug)]
pub struct Listener {
    inner: rdmx_rc::Listener,
    ctx: Context,
}

impl Listener {
    /// The address it listens on (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    /// Waits for the next peer and sets up an endpoint with it (see
    /// [`rdmx_rc::Listener::accept`]).
    ///
    /// # Errors
    /// `Bootstrap` for a failed exchange, `Verbs` for queue pair set-up failures.
    pub fn accept(&self) -> Result<Endpoint> {
        self.inner.accept()
    }

    /// [`accept`](Self::accept), giving up with `Timeout` when no peer connects within
    /// `timeout`.
    ///
    /// # Errors
    /// `Timeout`, or as `accept`.
    pub fn accept_timeout(&self, timeout: Duration) -> Result<Endpoint> {
        self.inner.accept_timeout(timeout)
    }

    /// [`accept`](Self::accept) without blocking the runtime (see
    /// [`rdmx_rc::Listener::accept_async`]).
    ///
    /// # Errors
    /// As `accept`.
    #[cfg(feature = "tokio")]
    pub async fn accept_async(&self) -> Result<Endpoint> {
        self.inner.accept_async().await
    }

    /// The context it belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}
