//! Setting UD endpoints up over the bootstrap side channel (TCP): the connecting side sends
//! its session's description (`Hello`), the listening side opens its session and answers
//! with its own (`Accept`), or a `Reject` that says why. The deadlines of these exchanges
//! are the host's time (the protocol itself runs on the worker's clock).

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use rdmx_core::bootstrap::{self, Frame};
use rdmx_core::{Error, Result};

use crate::endpoint::Endpoint;
use crate::setup::{Half, peer_half};
use crate::state::UdRef;

/// The host's clock, for the side channel's deadlines only.
fn host_now() -> Instant {
    Instant::now()
}

/// The deadline of an exchange that starts now.
fn deadline(u: &UdRef) -> Instant {
    host_now() + u.sh.cfg.connect_timeout
}

/// The connecting side.
pub(crate) fn connect(u: &UdRef, addr: SocketAddr, data: &[u8]) -> Result<Endpoint> {
    let deadline = deadline(u);
    let mut stream = bootstrap::connect(addr, deadline)?;
    let mac = bootstrap::auth::connector(&mut stream, u.sh.cfg.auth_key.as_ref(), deadline)?;
    let h = u.reserve()?;
    let r = (|| {
        let hello = Frame::Hello(u.describe(&h, data.to_vec())?);
        bootstrap::send_frame(&mut stream, &hello, deadline)?;
        let info = bootstrap::expect_accept(&mut stream, deadline)?;
        let peer = peer_half(&info)?;
        u.open(h, &peer, mac)
    })();
    if r.is_err() {
        u.unreserve(&h);
    }
    r
}

/// The listening side of one exchange, on a connection just accepted.
fn answer(u: &UdRef, mut stream: TcpStream, deadline: Instant) -> Result<Endpoint> {
    let mac = bootstrap::auth::listener(&mut stream, u.sh.cfg.auth_key.as_ref(), deadline)?;
    let info = bootstrap::expect_hello(&mut stream, deadline)?;
    let peer = match peer_half(&info) {
        Ok(p) => p,
        Err(e) => {
            let _ = bootstrap::reject(&mut stream, &e.to_string(), deadline);
            return Err(e);
        }
    };
    let h: Half = match u.reserve() {
        Ok(h) => h,
        Err(e) => {
            let _ = bootstrap::reject(&mut stream, &e.to_string(), deadline);
            return Err(e);
        }
    };
    let r = (|| {
        let data = u.sh.accept_data.lock().clone();
        let mine = u.describe(&h, data)?;
        let ep = u.open(h, &peer, mac)?;
        bootstrap::send_frame(&mut stream, &Frame::Accept(mine), deadline)?;
        Ok(ep)
    })();
    if r.is_err() {
        // (An opened session whose Accept could not be sent goes with its endpoint.)
        u.unreserve(&h);
    }
    r
}

/// Exchanges a listener runs at once at most; further connections wait in the TCP
/// backlog.
const MAX_EXCHANGES: usize = 64;

/// Exchanges one source address may have running at once: half of [`MAX_EXCHANGES`].
/// Its further connections are held until one ends (see [`bootstrap::Admission`]).
const MAX_PER_ADDRESS: u32 = (MAX_EXCHANGES / 2) as u32;

/// Failed exchanges (a wrong key, garbage, silence until the deadline) a source address
/// may have in [`FAILURE_WINDOW`] before its connections are closed at once.
const MAX_FAILURES: u32 = 32;

/// See [`MAX_FAILURES`].
const FAILURE_WINDOW: Duration = Duration::from_secs(60);

/// Connections of busy addresses held at most (beyond, they are closed).
const MAX_HELD: usize = 256;

/// How often a waiting `accept` looks for a finished exchange while no connection comes.
const ACCEPT_SLICE: Duration = Duration::from_millis(10);

/// The exchanges of one listener: each runs on a thread of its own, so that a peer that
/// connects and says nothing (or reads its reject slowly) holds up only its own exchange;
/// one source address runs at most half of them, and one that fails too often is shut out
/// for a while.
#[derive(Debug)]
pub(crate) struct Exchanges {
    state: Mutex<ExchangeState>,
    done: Condvar,
    admission: bootstrap::Admission,
}

impl Exchanges {
    /// A listener's exchanges; a held connection waits at most `hold_for` (the connect
    /// timeout: its connector has given up by then).
    pub(crate) fn new(hold_for: Duration) -> Self {
        let gate = bootstrap::Gate::with(MAX_PER_ADDRESS, MAX_FAILURES, FAILURE_WINDOW);
        Self {
            state: Mutex::new(ExchangeState::default()),
            done: Condvar::new(),
            admission: bootstrap::Admission::new(gate, MAX_HELD, hold_for),
        }
    }
}

#[derive(Debug, Default)]
struct ExchangeState {
    running: usize,
    ready: VecDeque<Endpoint>,
}

/// Accepts the next endpoint on `tcp`, waiting at most `timeout` (`None`: for ever). A
/// connection whose exchange fails (garbage, another transport, a peer that gives up) is
/// logged; the exchanges run concurrently (see [`Exchanges`]).
pub(crate) fn accept(
    u: &UdRef,
    tcp: &TcpListener,
    ex: &Arc<Exchanges>,
    timeout: Option<Duration>,
) -> Result<Endpoint> {
    let end = timeout.map(|t| host_now() + t);
    loop {
        if let Some(ep) = ex.state.lock().ready.pop_front() {
            return Ok(ep);
        }
        let now = host_now();
        if end.is_some_and(|e| now >= e) {
            return Err(Error::Timeout(timeout.unwrap_or_default()));
        }
        // Held connections whose address has room again.
        let room = MAX_EXCHANGES.saturating_sub(ex.state.lock().running);
        for admitted in ex.admission.ready(now, room) {
            start(u, ex, admitted);
        }
        if ex.state.lock().running >= MAX_EXCHANGES {
            // Full: new connections wait in the TCP backlog until an exchange ends.
            let mut st = ex.state.lock();
            if st.ready.is_empty() && st.running >= MAX_EXCHANGES {
                ex.done.wait_for(&mut st, ACCEPT_SLICE);
            }
            continue;
        }
        // Wait for a connection a slice at a time, looking at finished exchanges between.
        let slice = end.map_or(now + ACCEPT_SLICE, |e| e.min(now + ACCEPT_SLICE));
        let Some((stream, from)) = bootstrap::accept_until(tcp, slice)? else {
            let mut st = ex.state.lock();
            if st.ready.is_empty() && st.running > 0 {
                // (Woken early by an exchange that finishes.)
                ex.done.wait_for(&mut st, Duration::from_millis(1));
            }
            continue;
        };
        // Started, held (its address is busy) or closed (it failed too often lately).
        if let Some(admitted) = ex.admission.offer(stream, from, host_now()) {
            start(u, ex, admitted);
        }
    }
}

/// Runs the exchange of an admitted connection on a thread of its own.
fn start(u: &UdRef, ex: &Arc<Exchanges>, (stream, from, ticket): bootstrap::Admitted) {
    ex.state.lock().running += 1;
    let (u2, ex2) = (u.clone(), Arc::clone(ex));
    let spawned = std::thread::Builder::new()
        .name("rdmx-ud-exchange".into())
        .spawn(move || {
            let r = answer(&u2, stream, deadline(&u2));
            if r.is_err() {
                ticket.failed(host_now());
            }
            drop(ticket);
            let mut st = ex2.state.lock();
            st.running -= 1;
            match r {
                Ok(ep) => st.ready.push_back(ep),
                Err(e) => tracing::debug!(%from, "UD exchange failed: {e}"),
            }
            ex2.done.notify_all();
        });
    if let Err(e) = spawned {
        ex.state.lock().running -= 1;
        tracing::warn!("cannot start a UD exchange thread: {e}");
    }
}
