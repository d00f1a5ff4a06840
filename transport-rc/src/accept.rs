//! Accepting endpoints: exchanges with several peers at once.
//!
//! A listener used to take one TCP connection at a time and run its exchange to the end, so
//! a peer that connected and then said nothing held every other peer back for the whole
//! connect timeout (5 s by default): their connects timed out. Now each exchange runs on
//! a thread of its own, at most [`MAX_EXCHANGES`] at once, and `accept` returns whichever
//! finishes first (an endpoint, or the error of a peer that misbehaved).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdmx_core::{Result, bootstrap};

use crate::context::Context;
use crate::endpoint::Endpoint;

/// Most exchanges a listener runs at once; further connections wait in the TCP backlog.
pub(crate) const MAX_EXCHANGES: usize = 64;

/// While exchanges run, how often the accepting thread looks at both new connections and
/// finished exchanges: an endpoint is returned at most this long after its exchange ended
/// (5 ms made a message from a new peer reach `Context::recv` that much before `accept`
/// returned the peer's endpoint).
const SLICE: Duration = Duration::from_millis(1);

/// What one exchange gave: an endpoint, nothing (the peer was asked to come again), or an
/// error.
type Outcome = Result<Option<Endpoint>>;

/// The exchanges of one listener that are under way, and their outcomes.
#[derive(Debug)]
pub(crate) struct Exchanges {
    done_tx: mpsc::Sender<Outcome>,
    done_rx: Mutex<mpsc::Receiver<Outcome>>,
    running: AtomicUsize,
}

impl Exchanges {
    pub(crate) fn new() -> Self {
        let (done_tx, done_rx) = mpsc::channel();
        Self {
            done_tx,
            done_rx: Mutex::new(done_rx),
            running: AtomicUsize::new(0),
        }
    }

    /// A finished exchange's outcome, waiting for one until `until` (not at all when
    /// `until` has passed).
    fn finished(&self, until: Option<Instant>) -> Option<Outcome> {
        let rx = self.done_rx.lock();
        match until {
            None => rx.try_recv().ok(),
            Some(t) => rx
                .recv_timeout(t.saturating_duration_since(Instant::now()))
                .ok(),
        }
    }

    /// Runs the exchange with a peer that just connected, on a thread of its own.
    fn start(&self, ctx: &Context, stream: TcpStream, peer: SocketAddr) {
        let ctx2 = ctx.clone();
        let tx = self.done_tx.clone();
        // Counted until its outcome is taken from the channel (see `take`).
        self.running.fetch_add(1, Ordering::AcqRel);
        let spawned = std::thread::Builder::new()
            .name("rdmx-accept".into())
            .spawn(move || {
                let r = crate::conn::accept(&ctx2, stream, peer);
                // The listener may be gone: the endpoint is then dropped, which closes it.
                let _ = tx.send(r);
            });
        if let Err(e) = spawned {
            // The connection went with the closure that could not start: the peer's
            // connect fails, and `accept` reports why.
            let _ = self.done_tx.send(Err(rdmx_core::Error::Config(format!(
                "cannot start a thread for the exchange with {peer}: {e}"
            ))));
        }
    }

    /// Counts an outcome taken from the channel.
    fn take(&self, o: Option<Outcome>) -> Option<Outcome> {
        if o.is_some() {
            self.running.fetch_sub(1, Ordering::AcqRel);
        }
        o
    }
}

/// The next endpoint from `tcp`, or `None` once `deadline` passes (`None`: no deadline).
/// Exchanges started here and not finished by then go on, and a later call returns them.
pub(crate) fn accept_until(
    ctx: &Context,
    tcp: &TcpListener,
    ex: &Exchanges,
    deadline: Option<Instant>,
) -> Result<Option<Endpoint>> {
    loop {
        // Exchanges started and whose outcome was not taken yet.
        let running = ex.running.load(Ordering::Acquire);
        if let Some(o) = ex.take(ex.finished(None)) {
            match o? {
                Some(ep) => return Ok(Some(ep)),
                None => continue,
            }
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Ok(None);
        }
        if running >= MAX_EXCHANGES {
            let until = deadline.map_or(now + SLICE, |d| d.min(now + SLICE));
            if let Some(o) = ex.take(ex.finished(Some(until))) {
                match o? {
                    Some(ep) => return Ok(Some(ep)),
                    None => continue,
                }
            }
            continue;
        }
        // While exchanges run, look for new peers in short slices so that a finished
        // exchange is returned soon; with none running, wait for a peer for as long as
        // the caller does.
        let until = match (running > 0, deadline) {
            (true, Some(d)) => Some(d.min(now + SLICE)),
            (true, None) => Some(now + SLICE),
            (false, d) => d,
        };
        let got = match until {
            Some(t) => bootstrap::accept_until(tcp, t)?,
            None => Some(bootstrap::accept(tcp)?),
        };
        if let Some((stream, peer)) = got {
            ex.start(ctx, stream, peer);
        }
    }
}
