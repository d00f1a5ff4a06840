//! The serving side: a [`Service`] (handlers by method) run by a [`Server`] on a pool of
//! threads, for any number of links. A reader thread per link takes its requests and hands
//! them to the pool; handlers never run on the reader or on a progress thread.
//!
//! A request whose deadline passed before a pool thread took it is answered
//! `DeadlineExceeded` without running; a cancelled one (the caller sent `Cancel`, or the
//! link went away) is dropped; a handler that panics answers `Internal` and the server goes
//! on; a request over the size limit answers `ResourceExhausted`, one that does not decode
//! `InvalidArgument`, one for a method the service lacks `Unimplemented`.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};
use parking_lot::Mutex;
use serde::Serialize;
use serde::de::DeserializeOwned;
use thiserror::Error;

use rdmx_core::{Buf, BufferPool};

use crate::codec::{decode, encode_framed};
use crate::link::{Conn, Incoming, Link};
use crate::method::Method;
use crate::payload::{Attach, Payload};
use crate::status::Status;
use crate::wire::{HEADER_LEN, Header, Kind, frame, seal};

/// What a handler knows of its call, and where it finds the call's payload and leaves its
/// response's.
#[derive(Debug)]
pub struct CallContext {
    method: &'static str,
    deadline: Option<Instant>,
    /// (`None`: nothing can cancel it but its deadline: a handler inline on its link's
    /// reader, which reads nothing else meanwhile.)
    cancelled: Option<Arc<AtomicBool>>,
    payload: Mutex<Option<Payload>>,
    attach: Mutex<Option<Attach>>,
    pool: Option<BufferPool>,
}

impl CallContext {
    /// The method called.
    pub fn method(&self) -> &'static str {
        self.method
    }

    /// When the caller stops waiting (`None`: it did not say).
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Whether the caller stopped waiting: it cancelled, its deadline passed, or its link
    /// went away. A long handler looks now and then and gives up.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Relaxed))
            || self.deadline.is_some_and(|d| Instant::now() > d)
    }

    /// Takes the payload the caller sent beside the request (`Client::call_with`), if any:
    /// at rendezvous sizes on RC and XRC, in a pool buffer of its own
    /// ([`Payload::into_buf`] gives it without a copy).
    pub fn take_payload(&self) -> Option<Payload> {
        self.payload.lock().take()
    }

    /// Sends `payload` beside the response (if the handler succeeds): a pool buffer (see
    /// [`alloc`](Self::alloc)) or shared bytes, not copied at rendezvous sizes on RC and
    /// XRC. A second call replaces the first.
    pub fn attach(&self, payload: impl Into<Attach>) {
        *self.attach.lock() = Some(payload.into());
    }

    /// A buffer of `len` bytes from the link's registered pool, to fill and
    /// [`attach`](Self::attach).
    ///
    /// # Errors
    /// `ResourceExhausted` when the pool has no room now; `Unimplemented` when the link has
    /// no pool (it is not an rdmx endpoint).
    pub fn alloc(&self, len: usize) -> Result<Buf, Status> {
        alloc_from(self.pool.as_ref(), len)
    }
}

/// A buffer of `len` bytes from `pool`.
pub(crate) fn alloc_from(pool: Option<&BufferPool>, len: usize) -> Result<Buf, Status> {
    let Some(pool) = pool else {
        return Err(Status::unimplemented(
            "this link has no registered buffer pool (it is not an rdmx endpoint)",
        ));
    };
    pool.try_alloc(len)
        .map_err(|e| Status::resource_exhausted(format!("no pool buffer of {len} bytes now: {e}")))
}

/// A type-erased handler: request bytes in, the response out (encoded after room for its
/// frame's header: see `encode_framed`).
type Handler = dyn Fn(&CallContext, &[u8], &Limits) -> Result<Vec<u8>, Status> + Send + Sync;

/// The handlers of a service, by method id.
pub struct Service {
    handlers: HashMap<u32, (&'static str, Arc<Handler>)>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&str> = self.handlers.values().map(|(n, _)| *n).collect();
        names.sort_unstable();
        f.debug_struct("Service").field("methods", &names).finish()
    }
}

/// Why a service could not be built.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// Two methods with one id (the same name, or names whose hashes collide).
    #[error("methods {first:?} and {second:?} share the id {id:#010x}")]
    DuplicateMethod {
        /// The one registered first.
        first: &'static str,
        /// The other.
        second: &'static str,
        /// Their id.
        id: u32,
    },
}

/// Builds a [`Service`] one method at a time.
#[derive(Default)]
pub struct ServiceBuilder {
    handlers: HashMap<u32, (&'static str, Arc<Handler>)>,
    error: Option<ServiceError>,
}

impl std::fmt::Debug for ServiceBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceBuilder")
            .field("methods", &self.handlers.len())
            .finish_non_exhaustive()
    }
}

impl Service {
    /// A builder.
    pub fn builder() -> ServiceBuilder {
        ServiceBuilder::default()
    }

    /// The names of its methods.
    pub fn methods(&self) -> Vec<&'static str> {
        let mut v: Vec<&'static str> = self.handlers.values().map(|(n, _)| *n).collect();
        v.sort_unstable();
        v
    }
}

impl ServiceBuilder {
    /// Registers `handler` for method `m`: it gets the decoded request and gives the
    /// response, or a [`Status`].
    pub fn method<Req, Resp, F>(mut self, m: Method<Req, Resp>, handler: F) -> Self
    where
        Req: DeserializeOwned + 'static,
        Resp: Serialize + 'static,
        F: Fn(&CallContext, Req) -> Result<Resp, Status> + Send + Sync + 'static,
    {
        let name = m.name();
        let h: Arc<Handler> = Arc::new(move |cx: &CallContext, body: &[u8], lim: &Limits| {
            let req: Req = decode(body, lim.max_request).map_err(|e| {
                Status::invalid_argument(format!("the request of {name} does not decode: {e}"))
            })?;
            let resp = handler(cx, req)?;
            encode_framed(&resp, lim.max_response).map_err(|e| {
                Status::resource_exhausted(format!(
                    "the response of {name} does not encode within {} bytes: {e}",
                    lim.max_response
                ))
            })
        });
        if let Some((first, _)) = self.handlers.get(&m.id()) {
            self.error.get_or_insert(ServiceError::DuplicateMethod {
                first,
                second: name,
                id: m.id(),
            });
        } else {
            self.handlers.insert(m.id(), (name, h));
        }
        self
    }

    /// The service.
    ///
    /// # Errors
    /// [`ServiceError::DuplicateMethod`].
    pub fn build(self) -> Result<Service, ServiceError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(Service {
                handlers: self.handlers,
            }),
        }
    }
}

/// Size limits (bytes of a request or response body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest request body.
    pub max_request: usize,
    /// Largest response body.
    pub max_response: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_request: 16 << 20,
            max_response: 16 << 20,
        }
    }
}

/// How a server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Threads that run handlers. 0: each link's handlers run on its reader thread, one call
    /// at a time per link (no hand-over between threads: the lowest latency, for handlers
    /// that are short; a slow one holds its link's other calls back).
    pub threads: usize,
    /// Calls waiting for a thread at most (beyond: `ResourceExhausted`).
    pub queue: usize,
    /// Size limits.
    pub limits: Limits,
    /// How long a response may wait for room on its link.
    pub send_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            threads: 4,
            queue: 4096,
            limits: Limits::default(),
            send_timeout: Duration::from_secs(5),
        }
    }
}

/// Counters of a server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Requests taken.
    pub requests: u64,
    /// Answered with a response.
    pub ok: u64,
    /// Answered with a failure status.
    pub failed: u64,
    /// Dropped unrun, their deadline past (answered `DeadlineExceeded`).
    pub expired: u64,
    /// Dropped unrun or unanswered, cancelled by the caller or its link's end.
    pub cancelled: u64,
    /// Handlers that panicked.
    pub panics: u64,
    /// Frames that broke the protocol (dropped).
    pub bad_frames: u64,
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
    expired: AtomicU64,
    cancelled: AtomicU64,
    panics: AtomicU64,
    bad_frames: AtomicU64,
}

type Job = Box<dyn FnOnce() + Send>;

#[derive(Debug)]
struct Shared {
    service: Service,
    cfg: ServerConfig,
    counters: Counters,
    stop: AtomicBool,
}

/// Runs a [`Service`] for links handed to [`serve`](Self::serve). Cheap to clone; the
/// threads end once every clone is dropped and the links it serves end.
#[derive(Debug, Clone)]
pub struct Server {
    sh: Arc<Shared>,
    jobs: Sender<Job>,
    _pool: Arc<Pool>,
}

#[derive(Debug)]
struct Pool {
    threads: Vec<JoinHandle<()>>,
    stop: Sender<Job>,
}

impl Drop for Pool {
    fn drop(&mut self) {
        // (The job channel closes once every sender, readers' included, is gone; the
        // threads then end. They are not joined here: a handler may still be running.)
        let _ = &self.stop;
        self.threads.clear();
    }
}

impl Server {
    /// A server of `service` with `cfg`'s threads.
    ///
    /// # Errors
    /// The OS's, when a thread cannot be started.
    pub fn new(service: Service, cfg: ServerConfig) -> std::io::Result<Self> {
        let (tx, rx): (Sender<Job>, Receiver<Job>) = bounded(cfg.queue.max(1));
        let mut threads = Vec::new();
        for i in 0..cfg.threads {
            let rx = rx.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("rdmx-rpc-{i}"))
                    .spawn(move || {
                        while let Ok(job) = rx.recv() {
                            job();
                        }
                    })?,
            );
        }
        let sh = Arc::new(Shared {
            service,
            cfg,
            counters: Counters::default(),
            stop: AtomicBool::new(false),
        });
        Ok(Self {
            sh,
            jobs: tx.clone(),
            _pool: Arc::new(Pool { threads, stop: tx }),
        })
    }

    /// Serves `link` until it ends (the peer closes or dies): a reader thread of its own
    /// takes its requests and hands them to the pool.
    ///
    /// # Errors
    /// The OS's, when the thread cannot be started.
    pub fn serve<L: Link>(&self, link: L) -> std::io::Result<JoinHandle<()>> {
        let (sh, jobs) = (Arc::clone(&self.sh), self.jobs.clone());
        std::thread::Builder::new()
            .name("rdmx-rpc-link".into())
            .spawn(move || read_link(&sh, &jobs, Arc::new(Conn::new(link))))
    }

    /// Serves every link of `set` on `threads` reader threads, all taking messages from
    /// `recv` (a [`SetRecv`]: an `rdmx::Context`, or a closure that gives the next message
    /// of any link with the link's id, such as
    /// `move |t| ctx.recv_timeout(t).map(|m| (m.endpoint(), m))`). Links come and go in the
    /// set while it is served; a message of a link not in it is dropped and counted. With
    /// `threads` handler threads 0, handlers run on these reader threads.
    ///
    /// # Errors
    /// The OS's, when a thread cannot be started.
    pub fn serve_set<L, R>(
        &self,
        set: Arc<LinkSet<L>>,
        recv: R,
        threads: usize,
    ) -> std::io::Result<Vec<JoinHandle<()>>>
    where
        L: Link,
        R: SetRecv<L::Frame>,
    {
        // (One thread at a time receives and pairs a frame with its payload: the payload is
        // the next message of its link, wherever it comes in the shared receive.)
        let recv = Arc::new(Mutex::new(recv));
        (0..threads.max(1))
            .map(|i| {
                let (sh, jobs, set, recv) = (
                    Arc::clone(&self.sh),
                    self.jobs.clone(),
                    Arc::clone(&set),
                    Arc::clone(&recv),
                );
                std::thread::Builder::new()
                    .name(format!("rdmx-rpc-set-{i}"))
                    .spawn(move || serve_set_thread(&sh, &jobs, &set, &*recv))
            })
            .collect()
    }

    /// Its counters.
    pub fn stats(&self) -> ServerStats {
        let c = &self.sh.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ServerStats {
            requests: l(&c.requests),
            ok: l(&c.ok),
            failed: l(&c.failed),
            expired: l(&c.expired),
            cancelled: l(&c.cancelled),
            panics: l(&c.panics),
            bad_frames: l(&c.bad_frames),
        }
    }

    /// Asks the readers to stop taking requests (each notices within 100 ms).
    pub fn shutdown(&self) {
        self.sh.stop.store(true, Ordering::Release);
    }
}

/// Calls of one link under way, by id: their cancel flags.
type InFlight = Arc<Mutex<HashMap<u64, Arc<AtomicBool>>>>;

/// How long a message of a link not (yet) in a [`LinkSet`] waits for it to be added.
const LINK_GRACE: Duration = Duration::from_secs(1);

/// Links whose messages all come from one receive call (such as `rdmx::Context::recv`,
/// which serves every endpoint of a context), each known by the id that receive tags its
/// messages with: served by [`Server::serve_set`] on a few threads instead of a thread per
/// link.
pub struct LinkSet<L: Link> {
    links: parking_lot::RwLock<HashMap<u64, Arc<SetEntry<L>>>>,
}

/// A link of a [`LinkSet`].
struct SetEntry<L: Link> {
    conn: Arc<Conn<L>>,
    in_flight: InFlight,
    /// A frame whose payload has not come yet.
    announced: Mutex<Option<L::Frame>>,
}

impl<L: Link> std::fmt::Debug for LinkSet<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkSet")
            .field("links", &self.links.read().len())
            .finish()
    }
}

impl<L: Link> LinkSet<L> {
    /// An empty set.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            links: parking_lot::RwLock::new(HashMap::new()),
        })
    }

    /// Adds `link`, whose messages the receive tags with `id`.
    pub fn insert(&self, id: u64, link: L) {
        let entry = SetEntry {
            conn: Arc::new(Conn::new(link)),
            in_flight: InFlight::default(),
            announced: Mutex::new(None),
        };
        self.links.write().insert(id, Arc::new(entry));
    }

    /// Removes link `id` (its calls under way are cancelled); whether it was there.
    pub fn remove(&self, id: u64) -> bool {
        let Some(entry) = self.links.write().remove(&id) else {
            return false;
        };
        for flag in entry.in_flight.lock().values() {
            flag.store(true, Ordering::Relaxed);
        }
        true
    }

    /// Keeps the links for which `keep` is true (for instance those still connected); the
    /// calls under way of the others are cancelled. How many were removed.
    pub fn retain(&self, keep: impl Fn(&L) -> bool) -> usize {
        let gone: Vec<Arc<SetEntry<L>>> = {
            let mut links = self.links.write();
            let ids: Vec<u64> = links
                .iter()
                .filter(|(_, e)| !keep(&e.conn.link))
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| links.remove(id)).collect()
        };
        for e in &gone {
            for flag in e.in_flight.lock().values() {
                flag.store(true, Ordering::Relaxed);
            }
        }
        gone.len()
    }

    /// Link `id`, waiting a little for it: a client may send its first request the moment
    /// it is connected, before whoever accepted it has added it.
    fn wait_for(&self, id: u64) -> Option<Arc<SetEntry<L>>> {
        let until = Instant::now() + LINK_GRACE;
        loop {
            if let Some(l) = self.links.read().get(&id).cloned() {
                return Some(l);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Links in the set.
    pub fn len(&self) -> usize {
        self.links.read().len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where the messages of a [`LinkSet`] come from: one receive for all its links, each
/// message with its link's id.
pub trait SetRecv<F>: Send + Sync + 'static {
    /// The next message of any link, waiting up to `timeout`.
    ///
    /// # Errors
    /// `Timeout` (or `WouldBlock`) when none came; other errors are logged and the readers
    /// go on (an endpoint's end may come this way).
    fn recv_timeout(&self, timeout: Duration) -> rdmx_core::Result<(u64, F)>;

    /// The next message already received, without polling for more (`None`: none is
    /// queued; the default has no such queue, and polls with a zero timeout instead).
    fn try_take(&self) -> Option<(u64, F)> {
        self.recv_timeout(Duration::ZERO).ok()
    }
}

/// A closure that receives: `|timeout| -> Result<(link id, frame)>`.
impl<F, R> SetRecv<F> for R
where
    R: Fn(Duration) -> rdmx_core::Result<(u64, F)> + Send + Sync + 'static,
{
    fn recv_timeout(&self, timeout: Duration) -> rdmx_core::Result<(u64, F)> {
        self(timeout)
    }
}

/// Messages a reader of a [`LinkSet`] takes in one turn when more are waiting (handled
/// after its turn, their responses in one send batch).
const SET_DRAIN: usize = 64;

/// A message of a [`LinkSet`]'s link, taken with its link.
type Taken<L> = (Arc<SetEntry<L>>, Incoming<<L as Link>::Frame>);

/// One reader thread of [`Server::serve_set`]: in its turn at the shared receive, it takes
/// a message (waiting) and whatever else has already come (not polling for more: when
/// nothing has, the answers go at once), paired with their payloads; then it handles them,
/// their responses in one send batch.
fn serve_set_thread<L, R>(sh: &Arc<Shared>, jobs: &Sender<Job>, set: &LinkSet<L>, recv: &Mutex<R>)
where
    L: Link,
    R: SetRecv<L::Frame>,
{
    let mut got: Vec<Taken<L>> = Vec::new();
    while !sh.stop.load(Ordering::Acquire) {
        {
            let turn = recv.lock();
            let mut first = true;
            while got.len() < SET_DRAIN {
                let next = if first {
                    turn.recv_timeout(Duration::from_millis(100))
                } else {
                    turn.try_take().ok_or(rdmx_core::Error::WouldBlock)
                };
                let (id, m) = match next {
                    Ok(x) => x,
                    Err(rdmx_core::Error::Timeout(_) | rdmx_core::Error::WouldBlock) => break,
                    Err(e) => {
                        // (An endpoint's end comes as an error of the receive: the others
                        // go on.)
                        tracing::debug!("serve_set: {e}");
                        if got.is_empty() {
                            drop(turn);
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        break;
                    }
                };
                first = false;
                let Some(entry) = set.wait_for(id) else {
                    sh.counters.bad_frames.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                if let Some(incoming) = entry.pair(m) {
                    got.push((entry, incoming));
                }
            }
        }
        let Some((first, _)) = got.first() else {
            continue;
        };
        let first = Arc::clone(first);
        let _batch = first.conn.link.batch();
        for (entry, incoming) in got.drain(..) {
            if !take_frame(sh, jobs, &entry.conn, &entry.in_flight, incoming) {
                return;
            }
        }
    }
}

impl<L: Link> SetEntry<L> {
    /// Message `m` of this link, paired: `None` while it is a frame whose payload has not
    /// come (it is kept until it does).
    fn pair(&self, m: L::Frame) -> Option<Incoming<L::Frame>> {
        let mut announced = self.announced.lock();
        if let Some(frame) = announced.take() {
            let header = Header::parse(&frame).map(|(h, _)| h);
            return Some(Incoming {
                frame,
                header,
                payload: Some(m.into()),
            });
        }
        let header = Header::parse(&m).map(|(h, _)| h);
        if header.as_ref().is_ok_and(|h| h.attached) {
            *announced = Some(m);
            return None;
        }
        Some(Incoming {
            frame: m,
            header,
            payload: None,
        })
    }
}

/// A handler's outcome: the response (a frame with room for its header) and its payload,
/// or a failure.
type Outcome = Result<(Vec<u8>, Option<Attach>), Status>;

fn reply<L: Link>(sh: &Shared, conn: &Conn<L>, id: u64, method: u32, r: Outcome) {
    let header = |status, attached| Header {
        kind: Kind::Response,
        status,
        method,
        id,
        budget_us: 0,
        len: 0,
        attached,
    };
    let (f, payload) = match r {
        Ok((mut f, p)) => {
            sh.counters.ok.fetch_add(1, Ordering::Relaxed);
            seal(header(None, p.is_some()), &mut f);
            (f, p)
        }
        Err(s) => {
            sh.counters.failed.fetch_add(1, Ordering::Relaxed);
            (
                frame(header(Some(s.code), false), s.message.as_bytes()),
                None,
            )
        }
    };
    if let Err(e) = conn.send(&f, payload, sh.cfg.send_timeout) {
        tracing::debug!("an RPC response could not be sent: {e}");
    }
}

/// Frames an inline reader takes in one go when more are waiting (their responses leave
/// in one send batch).
const INLINE_DRAIN: usize = 64;

fn read_link<L: Link>(sh: &Arc<Shared>, jobs: &Sender<Job>, link: Arc<Conn<L>>) {
    let in_flight: InFlight = Arc::default();
    'link: while !sh.stop.load(Ordering::Acquire) {
        let m = match link.recv(Duration::from_millis(100)) {
            Ok(m) => m,
            Err(rdmx_core::Error::Timeout(_)) => continue,
            Err(_) => break,
        };
        if sh.cfg.threads > 0 {
            if !take_frame(sh, jobs, &link, &in_flight, m) {
                break;
            }
            continue;
        }
        // Inline: this call, and those that are already waiting behind it, their
        // responses in one send batch.
        let _batch = link.link.batch();
        let mut next = Some(m);
        let mut taken = 0;
        while let Some(m) = next.take() {
            if !take_frame(sh, jobs, &link, &in_flight, m) {
                break 'link;
            }
            taken += 1;
            if taken < INLINE_DRAIN {
                // What has already come, not a poll for more: when nothing has, the
                // answers go now (the batch ends) and the next receive polls.
                next = match link.try_take() {
                    Some(Ok(m)) => Some(m),
                    Some(Err(_)) => break 'link,
                    None => None,
                };
            }
        }
    }
    // The link ended (or the server stops): its calls are nobody's any more.
    for flag in in_flight.lock().values() {
        flag.store(true, Ordering::Relaxed);
    }
    link.link.start_close();
}

/// Takes one frame of `link`: a request is answered at once (no such method, too large),
/// run here (inline) or handed to the pool; a cancel marks its call. `false`: the pool is
/// gone.
fn take_frame<L: Link>(
    sh: &Arc<Shared>,
    jobs: &Sender<Job>,
    link: &Arc<Conn<L>>,
    in_flight: &InFlight,
    m: Incoming<L::Frame>,
) -> bool {
    let Incoming {
        frame: m,
        header,
        payload,
    } = m;
    let h = match header {
        Ok(h) => h,
        Err(e) => {
            tracing::debug!("a bad RPC frame: {e}");
            sh.counters.bad_frames.fetch_add(1, Ordering::Relaxed);
            return true;
        }
    };
    match h.kind {
        Kind::Request => {}
        Kind::Cancel => {
            if let Some(flag) = in_flight.lock().get(&h.id) {
                flag.store(true, Ordering::Relaxed);
            }
            return true;
        }
        Kind::Response => {
            sh.counters.bad_frames.fetch_add(1, Ordering::Relaxed);
            return true;
        }
    }
    sh.counters.requests.fetch_add(1, Ordering::Relaxed);
    let arrived = Instant::now();
    let Some((name, handler)) = sh.service.handlers.get(&h.method) else {
        let r = Err(Status::unimplemented(format!(
            "no method {:#010x} here",
            h.method
        )));
        reply(sh, &**link, h.id, h.method, r);
        return true;
    };
    let lim = sh.cfg.limits;
    let size = m.len().saturating_sub(HEADER_LEN) + payload.as_ref().map_or(0, |p| p.len());
    if size > lim.max_request {
        drop(payload);
        let r = Err(Status::resource_exhausted(format!(
            "a request of {size} bytes to {name}; the server takes at most {}",
            lim.max_request
        )));
        reply(sh, &**link, h.id, h.method, r);
        return true;
    }
    let deadline =
        (h.budget_us > 0).then(|| arrived + Duration::from_micros(u64::from(h.budget_us)));
    if sh.cfg.threads == 0 {
        // Inline: on this reader thread (nothing can cancel it meanwhile: the reader is
        // busy here).
        run_call(sh, link, &h, &m, payload, name, &**handler, deadline, None);
        return true;
    }
    let flag = Arc::new(AtomicBool::new(false));
    in_flight.lock().insert(h.id, Arc::clone(&flag));
    let job = {
        let (sh, link, in_flight) = (Arc::clone(sh), Arc::clone(link), Arc::clone(in_flight));
        let (name, handler) = (*name, Arc::clone(handler));
        move || {
            run_call(
                &sh,
                &link,
                &h,
                &m,
                payload,
                name,
                &*handler,
                deadline,
                Some(&flag),
            );
            in_flight.lock().remove(&h.id);
        }
    };
    match jobs.try_send(Box::new(job)) {
        Ok(()) => true,
        Err(TrySendError::Full(_)) => {
            in_flight.lock().remove(&h.id);
            let r = Err(Status::resource_exhausted(format!(
                "the server's queue is full ({} calls wait)",
                sh.cfg.queue
            )));
            reply(sh, &**link, h.id, h.method, r);
            true
        }
        Err(TrySendError::Disconnected(_)) => false,
    }
}

#[expect(
    clippy::too_many_arguments,
    reason = "one call's parts, taken apart once"
)]
fn run_call<L: Link>(
    sh: &Shared,
    link: &Conn<L>,
    h: &Header,
    m: &L::Frame,
    payload: Option<Payload>,
    name: &'static str,
    handler: &Handler,
    deadline: Option<Instant>,
    flag: Option<&Arc<AtomicBool>>,
) {
    let cancelled = || flag.is_some_and(|f| f.load(Ordering::Relaxed));
    if cancelled() {
        sh.counters.cancelled.fetch_add(1, Ordering::Relaxed);
        return;
    }
    if deadline.is_some_and(|d| Instant::now() > d) {
        sh.counters.expired.fetch_add(1, Ordering::Relaxed);
        let r = Err(Status::deadline_exceeded(format!(
            "{name} waited past its deadline for a server thread"
        )));
        reply(sh, link, h.id, h.method, r);
        return;
    }
    let body = m.get(HEADER_LEN..).unwrap_or_default();
    let cx = CallContext {
        method: name,
        deadline,
        cancelled: flag.map(Arc::clone),
        payload: Mutex::new(payload),
        attach: Mutex::new(None),
        pool: link.link.pool(),
    };
    let lim = sh.cfg.limits;
    let r = match catch_unwind(AssertUnwindSafe(|| handler(&cx, body, &lim))) {
        Ok(Ok(b)) => {
            let p = cx.attach.lock().take();
            let size = b.len().saturating_sub(HEADER_LEN) + p.as_ref().map_or(0, |p| p.len());
            if size > lim.max_response {
                Err(Status::resource_exhausted(format!(
                    "the response of {name} has {size} bytes; the server sends at most {}",
                    lim.max_response
                )))
            } else {
                Ok((b, p))
            }
        }
        Ok(Err(s)) => Err(s),
        Err(p) => {
            sh.counters.panics.fetch_add(1, Ordering::Relaxed);
            let what = p
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            Err(Status::internal(format!(
                "the handler of {name} panicked: {what}"
            )))
        }
    };
    if cancelled() {
        // Cancelled while it ran: nobody waits for the answer.
        sh.counters.cancelled.fetch_add(1, Ordering::Relaxed);
        return;
    }
    reply(sh, link, h.id, h.method, r);
}
