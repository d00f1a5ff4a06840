//! The user-facing context: a worker (`rdmx_core::worker`) and its transports — the RC/XRC
//! transport (`rdmx_rc::RcTransport`) always, and the UD transport (`rdmx_ud::UdTransport`)
//! when the configuration asks for UD — in one worker (one device, protection domain, pool,
//! completion channel and progress thread). [`connect`](Context::connect) and
//! [`listen`](Context::listen) pick the transport from the configuration;
//! [`recv`](Context::recv) serves every endpoint of every transport.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use rdmx_core::bootstrap::Transport;
use rdmx_core::pool::PoolStats;
use rdmx_core::worker::{Batch, Worker, WorkerHandle};
use rdmx_core::{Arrival, Buf, Config, Event, Message, RegCacheStats, Result};
use rdmx_rc::{ContextParts, FromParts, LocalRegion, RcTransport, RemoteAccess, Stats};
use rdmx_ud::UdTransport;
use rdmx_verbs::NicCounters;

use crate::endpoint::Endpoint;

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
    /// The UD transport, when the configuration's transport is UD.
    ud: Option<UdTransport>,
}

impl FromParts for Context {
    fn from_parts(p: ContextParts) -> Result<Self> {
        let cfg = p.cfg;
        cfg.validate()?;
        let ud = cfg.transport == Transport::Ud;
        // Every transport's receive-buffer class goes in the one pool (UD's for multicast
        // groups too: a class costs nothing until used).
        let classes = vec![cfg.recv_buf_size(), UdTransport::RECV_BUF_SIZE];
        let (w, node) = rdmx_rc::open_worker(&cfg, p.options, p.node, &classes)?;
        let rc = RcTransport::attach(&w, &cfg, node.as_ref())?;
        let ud = ud.then(|| UdTransport::attach(&w, &cfg)).transpose()?;
        let handle = w.start()?;
        Ok(Self { handle, rc, ud })
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

    /// The UD transport, when the configuration's transport is UD.
    pub fn ud(&self) -> Option<&UdTransport> {
        self.ud.as_ref()
    }

    /// Joins multicast group `name` with reliable delivery and the default options (see
    /// [`Group`](crate::Group)): every message published by a member reaches every live
    /// member once and in order. Whatever the endpoints' transport.
    ///
    /// # Errors
    /// `Verbs` when the group's queue pair cannot be made or attached.
    pub fn join(&self, name: &str) -> Result<crate::Group> {
        self.join_with(name, crate::McastConfig::default())
    }

    /// [`join`](Self::join) with options (every member of a group should use the same;
    /// `reliable: false` for a group that prefers loss to waiting).
    ///
    /// # Errors
    /// As [`join`](Self::join).
    pub fn join_with(&self, name: &str, options: crate::McastConfig) -> Result<crate::Group> {
        crate::Group::join(self.worker(), self.config(), name, options)
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
        let inner = match &self.ud {
            Some(ud) => ListenerInner::Ud(ud.listen(addr)?),
            None => ListenerInner::Rc(self.rc.listen(addr, &self.handle)?),
        };
        Ok(Listener {
            inner,
            ctx: self.clone(),
        })
    }

    /// Connects an endpoint to a listener at `addr`, over the configured transport.
    ///
    /// # Errors
    /// `Bootstrap` when the exchange fails (refused, garbage, version mismatch, timeout),
    /// `Verbs` when the queue pair cannot be set up.
    pub fn connect(&self, addr: impl ToSocketAddrs) -> Result<Endpoint> {
        self.connect_with(addr, &[])
    }

    /// [`connect`](Self::connect), sending `data` with the connection (at most 4 KiB: a
    /// role, a node id, what `rdma_cm` calls private data), so that the accepting side
    /// knows who connected without a first message; it sees `data` as the accepted
    /// endpoint's [`Endpoint::peer_data`], and this endpoint's `peer_data` is what the
    /// listener answered with ([`Listener::set_accept_data`]).
    ///
    /// # Errors
    /// As `connect`; `InvalidArgument` for more than 4 KiB.
    pub fn connect_with(&self, addr: impl ToSocketAddrs, data: &[u8]) -> Result<Endpoint> {
        match &self.ud {
            Some(ud) => ud.connect_with(addr, data).map(Endpoint::from),
            None => self.rc.connect_with(addr, data).map(Endpoint::from),
        }
    }

    /// [`connect`](Self::connect), retrying while nobody answers at `addr` yet (the
    /// connection is refused, the address unreachable, the exchange unanswered or cut):
    /// processes that start in any order find each other. Waits 10 ms after the first
    /// failure, then twice as long after each (at most 500 ms), until `timeout` has passed.
    /// A peer that answers and refuses (another transport, another protocol version, a
    /// rejection) is not asked again.
    ///
    /// # Errors
    /// The last failure once `timeout` has passed (`Timeout` when nothing was tried); a
    /// refusal at once; `Bootstrap` when `addr` does not resolve.
    pub fn connect_retry(&self, addr: impl ToSocketAddrs, timeout: Duration) -> Result<Endpoint> {
        let addrs = resolve_all(addr)?;
        let start = std::time::Instant::now();
        let mut pause = Duration::from_millis(10);
        loop {
            let err = match self.connect(&addrs[..]) {
                Ok(ep) => return Ok(ep),
                Err(e) => e,
            };
            let again = matches!(
                &err,
                rdmx_core::Error::Bootstrap(
                    rdmx_core::bootstrap::BootstrapError::Io { .. }
                        | rdmx_core::bootstrap::BootstrapError::Timeout { .. }
                        | rdmx_core::bootstrap::BootstrapError::Closed
                        | rdmx_core::bootstrap::BootstrapError::Truncated { .. }
                ) | rdmx_core::Error::Timeout(_)
            );
            let left = timeout.saturating_sub(start.elapsed());
            if !again || left.is_zero() {
                return Err(err);
            }
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// [`connect`](Self::connect) without blocking the runtime (feature `tokio`): the
    /// exchange runs on tokio's blocking pool. Dropping the future does not stop an exchange
    /// under way; the endpoint it makes is then dropped (closed) at once.
    ///
    /// # Errors
    /// As `connect`.
    #[cfg(feature = "tokio")]
    pub async fn connect_async(&self, addr: impl ToSocketAddrs) -> Result<Endpoint> {
        self.connect_with_async(addr, &[]).await
    }

    /// [`connect_with`](Self::connect_with) without blocking the runtime (see
    /// [`connect_async`](Self::connect_async)).
    ///
    /// # Errors
    /// As `connect_with`.
    #[cfg(feature = "tokio")]
    pub async fn connect_with_async(
        &self,
        addr: impl ToSocketAddrs,
        data: &[u8],
    ) -> Result<Endpoint> {
        let addrs = resolve_all(addr)?;
        let (ctx, data) = (self.clone(), data.to_vec());
        match tokio::task::spawn_blocking(move || ctx.connect_with(&addrs[..], &data)).await {
            Ok(r) => r,
            Err(e) => Err(rdmx_core::Error::InvalidArgument(format!(
                "the connect task ended without an answer: {e}"
            ))),
        }
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

    /// Number of endpoints (including ones that are down but not yet dropped), of every
    /// transport.
    pub fn endpoint_count(&self) -> usize {
        self.rc.endpoint_count() + self.ud.as_ref().map_or(0, UdTransport::endpoint_count)
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

/// Accepts endpoints on a TCP address, over the context's transport.
#[derive(Debug)]
pub struct Listener {
    inner: ListenerInner,
    ctx: Context,
}

#[derive(Debug)]
enum ListenerInner {
    Rc(rdmx_rc::Listener),
    Ud(rdmx_ud::Listener),
}

impl Listener {
    /// Sets the connection data the context's listeners answer with from now on (at most
    /// 4 KiB; a role, a node id): connecting endpoints see it as their
    /// [`Endpoint::peer_data`].
    ///
    /// # Errors
    /// `InvalidArgument` for more than 4 KiB.
    pub fn set_accept_data(&self, data: &[u8]) -> Result<()> {
        match &self.inner {
            ListenerInner::Rc(l) => l.set_accept_data(data),
            ListenerInner::Ud(l) => l.set_accept_data(data),
        }
    }

    /// The address it listens on (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        match &self.inner {
            ListenerInner::Rc(l) => l.local_addr(),
            ListenerInner::Ud(l) => l.local_addr(),
        }
    }

    /// Waits for the next peer and sets up an endpoint with it (see
    /// [`rdmx_rc::Listener::accept`]).
    ///
    /// # Errors
    /// `Bootstrap` for a failed exchange, `Verbs` for queue pair set-up failures.
    pub fn accept(&self) -> Result<Endpoint> {
        match &self.inner {
            ListenerInner::Rc(l) => l.accept().map(Endpoint::from),
            ListenerInner::Ud(l) => l.accept().map(Endpoint::from),
        }
    }

    /// [`accept`](Self::accept), giving up with `Timeout` when no peer connects within
    /// `timeout`.
    ///
    /// # Errors
    /// `Timeout`, or as `accept`.
    pub fn accept_timeout(&self, timeout: Duration) -> Result<Endpoint> {
        match &self.inner {
            ListenerInner::Rc(l) => l.accept_timeout(timeout).map(Endpoint::from),
            ListenerInner::Ud(l) => l.accept_timeout(timeout).map(Endpoint::from),
        }
    }

    /// [`accept`](Self::accept) without blocking the runtime (see
    /// [`rdmx_rc::Listener::accept_async`]; a UD listener accepts on a blocking task).
    ///
    /// # Errors
    /// As `accept`.
    #[cfg(feature = "tokio")]
    pub async fn accept_async(&self) -> Result<Endpoint> {
        match &self.inner {
            ListenerInner::Rc(l) => l.accept_async().await.map(Endpoint::from),
            ListenerInner::Ud(l) => loop {
                // (Short slices, so that the runtime's other tasks run between them.)
                match l.accept_timeout(Duration::from_millis(5)) {
                    Err(rdmx_core::Error::Timeout(_)) => tokio::task::yield_now().await,
                    other => return other.map(Endpoint::from),
                }
            },
        }
    }

    /// The context it belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

/// The addresses `addr` names.
fn resolve_all(addr: impl ToSocketAddrs) -> Result<Vec<SocketAddr>> {
    Ok(addr
        .to_socket_addrs()
        .map_err(|error| {
            rdmx_core::Error::Bootstrap(rdmx_core::bootstrap::BootstrapError::Io {
                op: "resolving the address",
                error,
            })
        })?
        .collect())
}

#[cfg(all(test, feature = "tokio"))]
mod async_tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connect_async_with_data_on_rc_and_ud() {
        for t in [Transport::Rc, Transport::Ud] {
            let s = Context::builder().transport(t).build().expect("server");
            let c = Context::builder().transport(t).build().expect("client");
            let listener = s.listen("127.0.0.1:0").expect("listen");
            listener.set_accept_data(b"srv").expect("accept data");
            let addr = listener.local_addr();
            let (ep, sep) =
                tokio::join!(c.connect_with_async(addr, b"cli"), listener.accept_async());
            let (ep, sep) = (ep.expect("connect"), sep.expect("accept"));
            assert_eq!(
                (&ep.peer_data()[..], &sep.peer_data()[..]),
                (&b"srv"[..], &b"cli"[..])
            );
            ep.send(b"x").expect("send");
            assert_eq!(&sep.recv_async().await.expect("recv")[..], b"x");
            let plain = c.connect_async(addr);
            let (plain, _accepted) = tokio::join!(plain, listener.accept_async());
            assert!(plain.expect("connect").peer_data().starts_with(b"srv"));
        }
    }
}
