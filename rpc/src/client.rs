//! The calling side: a [`Client`] over one link, any number of calls in flight, answered in
//! any order (a reader thread matches responses to calls by id).
//!
//! A call waits at most its timeout, which travels to the server as the call's deadline;
//! when it passes, the call fails `DeadlineExceeded` and the server is told (`Cancel`).
//! A [`PendingCall`] dropped before its response, or an async call dropped, is cancelled
//! the same way. When the link ends (the peer closed, or died: within the transport's peer
//! timeout) every pending call fails `Unavailable`, and so do later ones.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use serde::Serialize;
use serde::de::DeserializeOwned;

use rdmx_core::Buf;

use crate::codec::{decode, encode_framed};
use crate::link::{Conn, Link};
use crate::method::Method;
use crate::payload::{Attach, Payload};
use crate::server::{Limits, alloc_from};
use crate::status::Status;
use crate::wire::{HEADER_LEN, Header, Kind, frame, seal};

/// How a client behaves.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// The timeout of [`Client::call`] (and the deadline it sends).
    pub timeout: Duration,
    /// Size limits.
    pub limits: Limits,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            limits: Limits::default(),
        }
    }
}

/// What a response is, for the call that waits for it: its frame and its payload.
type Reply<F> = Result<(F, Option<Payload>), Status>;

/// Where a blocking caller's reply is left, and where it is nudged to take the reading
/// over (the caller that read for everybody got its own response and left). One small
/// allocation per call (a channel cost a block of slots).
struct Mailbox<F> {
    slot: Mutex<Slot<F>>,
    cv: Condvar,
}

struct Slot<F> {
    reply: Option<Reply<F>>,
    lead: bool,
}

impl<F> Mailbox<F> {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            slot: Mutex::new(Slot {
                reply: None,
                lead: false,
            }),
            cv: Condvar::new(),
        })
    }

    fn take_reply(&self) -> Option<Reply<F>> {
        self.slot.lock().reply.take()
    }

    /// Waits up to `t` for the reply or a nudge; the reply if it came.
    fn wait(&self, t: Duration) -> Option<Reply<F>> {
        let mut s = self.slot.lock();
        if s.reply.is_none() && !s.lead {
            self.cv.wait_for(&mut s, t);
        }
        s.lead = false;
        s.reply.take()
    }
}

/// How long a caller that reads for everybody waits for a frame before it looks at its
/// deadline again (a frame ends the wait at once).
const LEAD_SLICE: Duration = Duration::from_millis(10);
/// How long a caller that waits for its reply sleeps before it looks whether it may read
/// (a nudge, or its reply, wakes it sooner).
const FOLLOW_SLICE: Duration = Duration::from_millis(1);

/// Where a call's response goes.
enum Waiter<F> {
    Blocking(Arc<Mailbox<F>>),
    #[cfg(feature = "tokio")]
    Async(tokio::sync::oneshot::Sender<Reply<F>>),
}

impl<F> Waiter<F> {
    /// Asks a blocking caller to take the reading over (`false`: not a blocking caller).
    fn nudge(&self) -> bool {
        match self {
            Self::Blocking(mb) => {
                mb.slot.lock().lead = true;
                mb.cv.notify_one();
                true
            }
            #[cfg(feature = "tokio")]
            Self::Async(_) => false,
        }
    }

    fn give(self, r: Reply<F>) {
        match self {
            Self::Blocking(mb) => {
                mb.slot.lock().reply = Some(r);
                mb.cv.notify_one();
            }
            #[cfg(feature = "tokio")]
            Self::Async(tx) => {
                let _ = tx.send(r);
            }
        }
    }
}

struct Shared<L: Link> {
    link: Conn<L>,
    /// Held by the one thread that reads the link (a waiting caller, or the async reader).
    read_token: Mutex<()>,
    /// Async calls waiting (the reader thread reads for them).
    #[cfg(feature = "tokio")]
    async_pending: std::sync::atomic::AtomicUsize,
    #[cfg(feature = "tokio")]
    reader: Mutex<Option<std::thread::Thread>>,
    cfg: ClientConfig,
    next_id: AtomicU64,
    pending: Mutex<HashMap<u64, Waiter<L::Frame>>>,
    /// Set once the link ended: why later calls fail.
    gone: Mutex<Option<Status>>,
    stop: AtomicBool,
    /// Responses that matched no call (late, after a timeout or a cancel).
    strays: AtomicU64,
    /// Frames that broke the protocol.
    bad_frames: AtomicU64,
}

/// A client of the service behind one link. Cheap to clone; the reader thread ends and
/// the link closes once every clone is dropped.
pub struct Client<L: Link> {
    sh: Arc<Shared<L>>,
    _stop: Arc<StopOnDrop<L>>,
}

impl<L: Link> Clone for Client<L> {
    fn clone(&self) -> Self {
        Self {
            sh: Arc::clone(&self.sh),
            _stop: Arc::clone(&self._stop),
        }
    }
}

impl<L: Link> std::fmt::Debug for Client<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("in_flight", &self.in_flight())
            .field("gone", &*self.sh.gone.lock())
            .finish_non_exhaustive()
    }
}

struct StopOnDrop<L: Link>(Arc<Shared<L>>);

impl<L: Link> Drop for StopOnDrop<L> {
    fn drop(&mut self) {
        self.0.stop.store(true, Ordering::Release);
        self.0.link.link.start_close();
    }
}

/// Counters of a client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Calls waiting for their response now.
    pub in_flight: usize,
    /// Responses that matched no call (they came after their call gave up).
    pub strays: u64,
    /// Frames that broke the protocol (dropped).
    pub bad_frames: u64,
}

impl<L: Link> Client<L> {
    /// A client over `link`, with a reader thread of its own.
    ///
    /// # Errors
    /// The OS's, when the thread cannot be started.
    pub fn new(link: L, cfg: ClientConfig) -> std::io::Result<Self> {
        let sh = Arc::new(Shared {
            link: Conn::new(link),
            read_token: Mutex::new(()),
            #[cfg(feature = "tokio")]
            async_pending: std::sync::atomic::AtomicUsize::new(0),
            #[cfg(feature = "tokio")]
            reader: Mutex::new(None),
            cfg,
            next_id: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            gone: Mutex::new(None),
            stop: AtomicBool::new(false),
            strays: AtomicU64::new(0),
            bad_frames: AtomicU64::new(0),
        });
        // Blocking calls read the link themselves (the first one waiting reads for all, so
        // a call costs no hand-over between threads); async calls have a reader thread.
        #[cfg(feature = "tokio")]
        {
            let reader = Arc::clone(&sh);
            let t = std::thread::Builder::new()
                .name("rdmx-rpc-client".into())
                .spawn(move || read_for_async(&reader))?;
            *sh.reader.lock() = Some(t.thread().clone());
        }
        Ok(Self {
            _stop: Arc::new(StopOnDrop(Arc::clone(&sh))),
            sh,
        })
    }

    /// Calls `m` with `req`, waiting at most the configured timeout.
    ///
    /// # Errors
    /// The call's [`Status`].
    pub fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        m: Method<Req, Resp>,
        req: &Req,
    ) -> Result<Resp, Status> {
        self.call_timeout(m, req, self.sh.cfg.timeout)
    }

    /// Calls `m` with `req`, waiting at most `timeout` (the deadline the server gets).
    ///
    /// # Errors
    /// The call's [`Status`].
    pub fn call_timeout<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        m: Method<Req, Resp>,
        req: &Req,
        timeout: Duration,
    ) -> Result<Resp, Status> {
        self.start(m, req, timeout)?.wait()
    }

    /// Starts a call and returns at once: [`PendingCall::wait`] gives its outcome (calls
    /// started one after another are in flight together). Dropping the pending call before
    /// its response cancels it at the server.
    ///
    /// # Errors
    /// A [`Status`] when the call cannot even start (too large, the link is gone).
    pub fn start<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        m: Method<Req, Resp>,
        req: &Req,
        timeout: Duration,
    ) -> Result<PendingCall<L, Resp>, Status> {
        self.start_with(m, req, None, timeout)
    }

    /// Calls `m` with `req` and `payload` beside it (raw bytes: a pool buffer or shared
    /// bytes, sent without a copy at rendezvous sizes on RC and XRC; the handler takes it
    /// with `CallContext::take_payload`), waiting at most the configured timeout. Gives the
    /// response and the payload the handler attached to it, if any.
    ///
    /// # Errors
    /// The call's [`Status`].
    pub fn call_with<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        m: Method<Req, Resp>,
        req: &Req,
        payload: Option<Attach>,
    ) -> Result<(Resp, Option<Payload>), Status> {
        self.start_with(m, req, payload, self.sh.cfg.timeout)?
            .wait_with()
    }

    /// [`start`](Self::start) with a payload beside the request (see
    /// [`call_with`](Self::call_with)).
    ///
    /// # Errors
    /// A [`Status`] when the call cannot even start (too large, the link is gone).
    pub fn start_with<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        m: Method<Req, Resp>,
        req: &Req,
        payload: Option<Attach>,
        timeout: Duration,
    ) -> Result<PendingCall<L, Resp>, Status> {
        let mailbox = Mailbox::new();
        let waiter = Waiter::Blocking(Arc::clone(&mailbox));
        let id = self.send_request(m.id(), m.name(), req, payload, timeout, waiter)?;
        Ok(PendingCall {
            sh: Arc::clone(&self.sh),
            mailbox,
            id,
            method: m.id(),
            timeout,
            done: false,
            _resp: PhantomData,
        })
    }

    /// Calls `m` with `req` without blocking the thread (feature `tokio`), waiting at most
    /// the configured timeout. Dropping the future before it completes cancels the call at
    /// the server.
    ///
    /// # Errors
    /// The call's [`Status`].
    #[cfg(feature = "tokio")]
    pub async fn call_async<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        m: Method<Req, Resp>,
        req: &Req,
    ) -> Result<Resp, Status> {
        Ok(self.call_with_async(m, req, None).await?.0)
    }

    /// [`call_with`](Self::call_with) without blocking the thread (feature `tokio`).
    ///
    /// # Errors
    /// The call's [`Status`].
    #[cfg(feature = "tokio")]
    pub async fn call_with_async<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        m: Method<Req, Resp>,
        req: &Req,
        payload: Option<Attach>,
    ) -> Result<(Resp, Option<Payload>), Status> {
        let timeout = self.sh.cfg.timeout;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let _counted = AsyncCount::new(&self.sh);
        let waiter = Waiter::Async(tx);
        let id = self.send_request(m.id(), m.name(), req, payload, timeout, waiter)?;
        // Cancels the call if this future is dropped before the response.
        let mut guard = CancelGuard {
            sh: Arc::clone(&self.sh),
            id,
            method: m.id(),
            armed: true,
        };
        let reply = tokio::time::timeout(timeout, rx).await;
        let r = match reply {
            Ok(Ok(r)) => {
                guard.armed = false;
                r
            }
            Ok(Err(_)) => {
                guard.armed = false;
                Err(self.gone_status())
            }
            Err(_) => Err(Status::deadline_exceeded(format!(
                "no response from {} within {timeout:?}",
                m.name()
            ))),
        };
        let (f, p) = r?;
        Ok((decode_response(&f, self.sh.cfg.limits.max_response)?, p))
    }

    /// A buffer of `len` bytes from the link's registered pool, to fill and send as a
    /// payload ([`call_with`](Self::call_with)) without a copy.
    ///
    /// # Errors
    /// `ResourceExhausted` when the pool has no room now; `Unimplemented` when the link has
    /// no pool (it is not an rdmx endpoint).
    pub fn alloc(&self, len: usize) -> Result<Buf, Status> {
        alloc_from(self.sh.link.link.pool().as_ref(), len)
    }

    /// Opens a send batch on this thread, if the link has them: calls started until the
    /// guard drops may leave together, packed (many small calls started in a row cost a
    /// few sends instead of one each).
    pub fn batch(&self) -> Option<rdmx_core::worker::Batch<'_>> {
        self.sh.link.link.batch()
    }

    /// Calls waiting for their response now.
    pub fn in_flight(&self) -> usize {
        self.sh.pending.lock().len()
    }

    /// Its counters.
    pub fn stats(&self) -> ClientStats {
        ClientStats {
            in_flight: self.in_flight(),
            strays: self.sh.strays.load(Ordering::Relaxed),
            bad_frames: self.sh.bad_frames.load(Ordering::Relaxed),
        }
    }

    #[cfg(feature = "tokio")]
    fn gone_status(&self) -> Status {
        self.sh
            .gone
            .lock()
            .clone()
            .unwrap_or_else(|| Status::unavailable("the client's link ended"))
    }

    /// Encodes and sends a request, its waiter registered first.
    fn send_request<Req: Serialize>(
        &self,
        method: u32,
        name: &str,
        req: &Req,
        payload: Option<Attach>,
        timeout: Duration,
        waiter: Waiter<L::Frame>,
    ) -> Result<u64, Status> {
        let max = self.sh.cfg.limits.max_request;
        let mut f = encode_framed(req, max).map_err(|e| {
            Status::resource_exhausted(format!(
                "the request to {name} does not encode within {max} bytes: {e}"
            ))
        })?;
        let size = f.len() - HEADER_LEN + payload.as_ref().map_or(0, |p| p.len());
        if size > max {
            return Err(Status::resource_exhausted(format!(
                "a request of {size} bytes to {name}; the client sends at most {max}"
            )));
        }
        if let Some(s) = self.sh.gone.lock().clone() {
            return Err(s);
        }
        let id = self.sh.next_id.fetch_add(1, Ordering::Relaxed);
        let budget_us = u32::try_from(timeout.as_micros())
            .unwrap_or(u32::MAX)
            .max(1);
        seal(
            Header {
                kind: Kind::Request,
                status: None,
                method,
                id,
                budget_us,
                len: 0,
                attached: payload.is_some(),
            },
            &mut f,
        );
        self.sh.pending.lock().insert(id, waiter);
        if let Err(e) = self.sh.link.send(&f, payload, timeout) {
            self.sh.pending.lock().remove(&id);
            return Err(Status::from_transport(&e));
        }
        Ok(id)
    }
}

/// Tells the server a call is no longer waited for.
fn cancel<L: Link>(sh: &Shared<L>, id: u64, method: u32) {
    if sh.pending.lock().remove(&id).is_none() {
        return;
    }
    let f = frame(
        Header {
            kind: Kind::Cancel,
            status: None,
            method,
            id,
            budget_us: 0,
            len: 0,
            attached: false,
        },
        &[],
    );
    let _ = sh.link.send(&f, None, Duration::from_millis(100));
}

/// Counts an async call while it waits, and wakes the reader thread for it.
#[cfg(feature = "tokio")]
struct AsyncCount<'a, L: Link>(&'a Shared<L>);

#[cfg(feature = "tokio")]
impl<'a, L: Link> AsyncCount<'a, L> {
    fn new(sh: &'a Shared<L>) -> Self {
        sh.async_pending.fetch_add(1, Ordering::AcqRel);
        if let Some(t) = sh.reader.lock().as_ref() {
            t.unpark();
        }
        Self(sh)
    }
}

#[cfg(feature = "tokio")]
impl<L: Link> Drop for AsyncCount<'_, L> {
    fn drop(&mut self) {
        self.0.async_pending.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(feature = "tokio")]
struct CancelGuard<L: Link> {
    sh: Arc<Shared<L>>,
    id: u64,
    method: u32,
    armed: bool,
}

#[cfg(feature = "tokio")]
impl<L: Link> Drop for CancelGuard<L> {
    fn drop(&mut self) {
        if self.armed {
            cancel(&self.sh, self.id, self.method);
        }
    }
}

/// A call under way ([`Client::start`]).
pub struct PendingCall<L: Link, Resp> {
    sh: Arc<Shared<L>>,
    mailbox: Arc<Mailbox<L::Frame>>,
    id: u64,
    method: u32,
    timeout: Duration,
    done: bool,
    _resp: PhantomData<fn() -> Resp>,
}

impl<L: Link, Resp> std::fmt::Debug for PendingCall<L, Resp> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingCall")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl<L: Link, Resp: DeserializeOwned> PendingCall<L, Resp> {
    /// Its id (the client's number for it).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Waits for the outcome (at most the call's timeout, counted from now).
    ///
    /// # Errors
    /// The call's [`Status`].
    pub fn wait(self) -> Result<Resp, Status> {
        Ok(self.wait_with()?.0)
    }

    /// Waits for the outcome (at most the call's timeout, counted from now): the response
    /// and the payload the handler attached to it, if any.
    ///
    /// # Errors
    /// The call's [`Status`].
    pub fn wait_with(mut self) -> Result<(Resp, Option<Payload>), Status> {
        let deadline = Instant::now() + self.timeout;
        let r = loop {
            if let Some(r) = self.mailbox.take_reply() {
                break r;
            }
            let now = Instant::now();
            if now >= deadline {
                // (Not done: dropping `self` tells the server.)
                return Err(Status::deadline_exceeded(format!(
                    "no response within {:?}",
                    self.timeout
                )));
            }
            let left = deadline - now;
            if let Some(token) = self.sh.read_token.try_lock() {
                // We read for everybody until our response comes.
                if let Err(s) = read_one(&self.sh, left.min(LEAD_SLICE)) {
                    drop(token);
                    break Err(s);
                }
                if let Some(r) = self.mailbox.take_reply() {
                    drop(token);
                    nudge_one(&self.sh);
                    break r;
                }
                continue;
            }
            if let Some(r) = self.mailbox.wait(left.min(FOLLOW_SLICE)) {
                break r;
            }
        };
        self.done = true;
        let (f, p) = r?;
        Ok((decode_response(&f, self.sh.cfg.limits.max_response)?, p))
    }

    /// The outcome if it is there (`None`: not yet).
    ///
    /// # Errors
    /// The call's [`Status`].
    pub fn try_wait(&mut self) -> Option<Result<Resp, Status>> {
        // Nobody may be reading: read what is there (without waiting) if we may.
        if let Some(_token) = self.sh.read_token.try_lock() {
            let _ = read_one(&self.sh, Duration::ZERO);
        }
        let r = self.mailbox.take_reply()?;
        self.done = true;
        Some(r.and_then(|(f, _)| decode_response(&f, self.sh.cfg.limits.max_response)))
    }
}

impl<L: Link, Resp> Drop for PendingCall<L, Resp> {
    fn drop(&mut self) {
        if !self.done {
            cancel(&self.sh, self.id, self.method);
        }
    }
}

/// A response frame's outcome.
pub(crate) fn decode_response<T: DeserializeOwned>(f: &[u8], limit: usize) -> Result<T, Status> {
    let (h, body) =
        Header::parse(f).map_err(|e| Status::internal(format!("a bad response frame: {e}")))?;
    match h.status {
        None => decode(body, limit)
            .map_err(|e| Status::internal(format!("the response does not decode: {e}"))),
        Some(code) => Err(Status::new(code, String::from_utf8_lossy(body))),
    }
}

/// Reads one frame, waiting up to `timeout`, and gives it to its call. `Err`: the link
/// ended (every waiting call has been failed with the returned status).
fn read_one<L: Link>(sh: &Shared<L>, timeout: Duration) -> Result<(), Status> {
    if let Some(s) = sh.gone.lock().clone() {
        return Err(s);
    }
    let got = match sh.link.recv(timeout) {
        Ok(m) => m,
        Err(rdmx_core::Error::Timeout(_) | rdmx_core::Error::WouldBlock) => return Ok(()),
        Err(e) => return Err(end(sh, &Status::from_transport(&e))),
    };
    let (m, payload) = (got.frame, got.payload);
    let id = match got.header {
        Ok(h) if h.kind == Kind::Response => h.id,
        Ok(_) | Err(_) => {
            sh.bad_frames.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
    };
    let w = sh.pending.lock().remove(&id);
    let Some(w) = w else {
        sh.strays.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    };
    let size = m.len().saturating_sub(HEADER_LEN) + payload.as_ref().map_or(0, |p| p.len());
    if size > sh.cfg.limits.max_response {
        w.give(Err(Status::resource_exhausted(format!(
            "a response of {size} bytes; the client takes at most {}",
            sh.cfg.limits.max_response
        ))));
    } else {
        w.give(Ok((m, payload)));
    }
    Ok(())
}

/// The link ended because of `why`: every call waiting, and every later one, fails.
fn end<L: Link>(sh: &Shared<L>, why: &Status) -> Status {
    let why = Status::unavailable(format!("the link ended: {}", why.message));
    *sh.gone.lock() = Some(why.clone());
    let waiting: Vec<Waiter<L::Frame>> = sh.pending.lock().drain().map(|(_, w)| w).collect();
    for w in waiting {
        w.give(Err(why.clone()));
    }
    why
}

/// A caller that read for everybody leaves: one blocking caller still waiting takes over.
fn nudge_one<L: Link>(sh: &Shared<L>) {
    let pending = sh.pending.lock();
    for w in pending.values() {
        if w.nudge() {
            return;
        }
    }
}

/// The reader thread of async calls: reads while any waits, else sleeps.
#[cfg(feature = "tokio")]
fn read_for_async<L: Link>(sh: &Shared<L>) {
    while !sh.stop.load(Ordering::Acquire) {
        if sh.async_pending.load(Ordering::Acquire) == 0 {
            std::thread::park_timeout(Duration::from_millis(100));
            continue;
        }
        let _token = sh.read_token.lock();
        if read_one(sh, LEAD_SLICE).is_err() {
            return;
        }
    }
}
