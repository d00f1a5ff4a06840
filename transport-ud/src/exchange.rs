//! Setting UD endpoints up over the bootstrap side channel (TCP): the connecting side sends
//! its session's description (`Hello`), the listening side opens its session and answers
//! with its own (`Accept`), or a `Reject` that says why. The deadlines of these exchanges
//! are the host's time (the protocol itself runs on the worker's clock).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

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
pub(crate) fn connect(u: &UdRef, addr: SocketAddr) -> Result<Endpoint> {
    let deadline = deadline(u);
    let mut stream = bootstrap::connect(addr, deadline)?;
    let h = u.reserve()?;
    let r = (|| {
        bootstrap::send_frame(&mut stream, &Frame::Hello(u.describe(&h)?), deadline)?;
        let info = bootstrap::expect_accept(&mut stream, deadline)?;
        let peer = peer_half(&info)?;
        u.open(h, &peer)
    })();
    if r.is_err() {
        u.unreserve(&h);
    }
    r
}

/// The listening side of one exchange, on a connection just accepted.
fn answer(u: &UdRef, mut stream: TcpStream, deadline: Instant) -> Result<Endpoint> {
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
        let mine = u.describe(&h)?;
        let ep = u.open(h, &peer)?;
        bootstrap::send_frame(&mut stream, &Frame::Accept(mine), deadline)?;
        Ok(ep)
    })();
    if r.is_err() {
        // (An opened session whose Accept could not be sent goes with its endpoint.)
        u.unreserve(&h);
    }
    r
}

/// Accepts the next endpoint on `tcp`, waiting at most `timeout` (`None`: for ever). A
/// connection whose exchange fails (garbage, another transport, a peer that gives up) is
/// logged and the next one is waited for.
pub(crate) fn accept(u: &UdRef, tcp: &TcpListener, timeout: Option<Duration>) -> Result<Endpoint> {
    let end = timeout.map(|t| host_now() + t);
    loop {
        let (stream, from) = match end {
            None => bootstrap::accept(tcp)?,
            Some(end) => match bootstrap::accept_until(tcp, end)? {
                Some(c) => c,
                None => return Err(Error::Timeout(timeout.unwrap_or_default())),
            },
        };
        match answer(u, stream, deadline(u)) {
            Ok(ep) => return Ok(ep),
            Err(e) => tracing::debug!(%from, "UD exchange failed: {e}"),
        }
        if end.is_some_and(|e| host_now() >= e) {
            return Err(Error::Timeout(timeout.unwrap_or_default()));
        }
    }
}
