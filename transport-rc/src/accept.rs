//! Accepting endpoints: exchanges with several peers at once.
//!
//! A listener used to take one TCP connection at a time and run its exchange to the end, so
//! a peer that connected and then said nothing held every other peer back for the whole
//! connect timeout (5 s by default): their connects timed out. Now each exchange runs on
//! a thread of its own, at most [`MAX_EXCHANGES`] at once.
//!
//! Outcomes (an endpoint, or the error of a peer that misbehaved) are handed out in the
//! order the connections came, as a sequential client expects (it pairs its endpoints with
//! the server's by order), except that an exchange still running after [`STUCK`] no longer
//! holds back those behind it.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdmx_core::{Result, bootstrap};

use crate::endpoint::Endpoint;
use crate::state::RcRef;

/// Most exchanges a listener runs at once; further connections wait in the TCP backlog.
pub(crate) const MAX_EXCHANGES: usize = 64;

/// While exchanges run, how often the accepting thread looks at both new connections and
/// finished exchanges: an endpoint is returned at most this long after its exchange ended
/// (5 ms made a message from a new peer reach `Context::recv` that much before `accept`
/// returned the peer's endpoint).
const SLICE: Duration = Duration::from_millis(1);

/// How long an exchange may hold back the outcomes of later connections (an exchange takes
/// about a millisecond; a silent peer's takes the connect timeout).
const STUCK: Duration = Duration::from_millis(20);

/// What one exchange gave: an endpoint, nothing (the peer was asked to come again), or an
/// error.
type Outcome = Result<Option<Endpoint>>;

#[derive(Debug, Default)]
struct Order {
    /// Sequence number of the next connection.
    next: u64,
    /// Exchanges under way: when each started.
    running: BTreeMap<u64, Instant>,
    /// Outcomes not handed out yet.
    finished: BTreeMap<u64, Outcome>,
}

/// The exchanges of one listener that are under way, and their outcomes.
#[derive(Debug)]
pub(crate) struct Exchanges {
    done_tx: mpsc::Sender<(u64, Outcome)>,
    done_rx: Mutex<mpsc::Receiver<(u64, Outcome)>>,
    order: Mutex<Order>,
    /// Per source address: one that fails [`MAX_FAILURES`] times in [`FAILURE_WINDOW`] (a
    /// wrong key, garbage, silence until the deadline) has its connections closed at once
    /// until the window passes; one with [`MAX_PER_ADDRESS`] exchanges running has its next
    /// connections held until one ends (many clients may share an address: they wait,
    /// while a flood from one address leaves the other half of the exchanges to others).
    admission: bootstrap::Admission,
}

/// Exchanges one source address may have running at once: half of [`MAX_EXCHANGES`].
pub(crate) const MAX_PER_ADDRESS: u32 = (MAX_EXCHANGES / 2) as u32;

/// Connections of busy addresses held at most (beyond, they are closed).
pub(crate) const MAX_HELD: usize = 256;

/// Failed exchanges a source address may have in [`FAILURE_WINDOW`].
pub(crate) const MAX_FAILURES: u32 = 32;
/// See [`MAX_FAILURES`].
pub(crate) const FAILURE_WINDOW: Duration = Duration::from_secs(60);

impl Exchanges {
    /// A listener's exchanges; a held connection waits at most `hold_for` (the connect
    /// timeout: its connector has given up by then).
    pub(crate) fn new(hold_for: Duration) -> Self {
        let (done_tx, done_rx) = mpsc::channel();
        let gate = bootstrap::Gate::with(MAX_PER_ADDRESS, MAX_FAILURES, FAILURE_WINDOW);
        Self {
            done_tx,
            done_rx: Mutex::new(done_rx),
            order: Mutex::new(Order::default()),
            admission: bootstrap::Admission::new(gate, MAX_HELD, hold_for),
        }
    }

    /// Exchanges started whose outcome was not handed out yet.
    fn pending(&self) -> usize {
        let o = self.order.lock();
        o.running.len() + o.finished.len()
    }

    /// Moves finished exchanges' outcomes from the channel into the order, waiting for one
    /// until `until` (not at all when `None`).
    fn collect(&self, until: Option<Instant>) {
        let rx = self.done_rx.lock();
        let first = match until {
            None => rx.try_recv().ok(),
            Some(t) => rx
                .recv_timeout(t.saturating_duration_since(crate::util::host_now()))
                .ok(),
        };
        let mut o = self.order.lock();
        for (seq, outcome) in first
            .into_iter()
            .chain(std::iter::from_fn(|| rx.try_recv().ok()))
        {
            o.running.remove(&seq);
            o.finished.insert(seq, outcome);
        }
    }

    /// The next outcome to hand out: the earliest finished one, if every connection before
    /// it has finished too or is stuck.
    fn next_outcome(&self) -> Option<Outcome> {
        let mut o = self.order.lock();
        let (&seq, _) = o.finished.iter().next()?;
        let now = crate::util::host_now();
        let held_back = o
            .running
            .range(..seq)
            .any(|(_, &started)| now.duration_since(started) < STUCK);
        if held_back {
            return None;
        }
        o.finished.remove(&seq)
    }

    /// Runs the exchange with a peer that just connected, on a thread of its own.
    fn start(&self, rc: &RcRef, stream: TcpStream, peer: SocketAddr, ticket: bootstrap::Ticket) {
        let seq = {
            let mut o = self.order.lock();
            let seq = o.next;
            o.next += 1;
            o.running.insert(seq, crate::util::host_now());
            seq
        };
        let rc = rc.clone();
        let tx = self.done_tx.clone();
        let spawned = std::thread::Builder::new()
            .name("rdmx-accept".into())
            .spawn(move || {
                let r = crate::conn::accept(&rc, stream, peer)
                    .map(|e| e.map(|e| Endpoint::new(rc.clone(), e.key, e.id, peer)));
                if r.is_err() {
                    ticket.failed(crate::util::host_now());
                }
                drop(ticket);
                // The listener may be gone: the endpoint is then dropped, which closes it.
                let _ = tx.send((seq, r));
            });
        if let Err(e) = spawned {
            // The connection went with the closure that could not start: the peer's
            // connect fails, and `accept` reports why.
            let _ = self.done_tx.send((
                seq,
                Err(rdmx_core::Error::Config(format!(
                    "cannot start a thread for the exchange with {peer}: {e}"
                ))),
            ));
        }
    }
}

/// The next endpoint from `tcp`, or `None` once `deadline` passes (`None`: no deadline).
/// Exchanges started here and not finished by then go on, and a later call returns them.
pub(crate) fn accept_until(
    rc: &RcRef,
    tcp: &TcpListener,
    ex: &Exchanges,
    deadline: Option<Instant>,
) -> Result<Option<Endpoint>> {
    loop {
        ex.collect(None);
        if let Some(o) = ex.next_outcome() {
            match o? {
                Some(ep) => return Ok(Some(ep)),
                None => continue,
            }
        }
        let now = crate::util::host_now();
        if deadline.is_some_and(|d| now >= d) {
            return Ok(None);
        }
        // Held connections whose address has room again.
        let room = MAX_EXCHANGES.saturating_sub(ex.pending());
        for (stream, peer, ticket) in ex.admission.ready(now, room) {
            ex.start(rc, stream, peer, ticket);
        }
        let pending = ex.pending();
        if pending >= MAX_EXCHANGES {
            let until = deadline.map_or(now + SLICE, |d| d.min(now + SLICE));
            ex.collect(Some(until));
            continue;
        }
        // While exchanges run, look for new peers in short slices so that a finished
        // exchange is returned soon; with none running, wait for a peer for as long as
        // the caller does.
        let until = match (pending > 0, deadline) {
            (true, Some(d)) => Some(d.min(now + SLICE)),
            (true, None) => Some(now + SLICE),
            (false, d) => d,
        };
        let got = match until {
            Some(t) => bootstrap::accept_until(tcp, t)?,
            None => Some(bootstrap::accept(tcp)?),
        };
        // Started, held (its address is busy) or closed (it failed too often lately).
        if let Some((stream, peer)) = got
            && let Some((stream, peer, ticket)) =
                ex.admission.offer(stream, peer, crate::util::host_now())
        {
            ex.start(rc, stream, peer, ticket);
        }
    }
}
