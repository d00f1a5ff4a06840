//! The listener's guard against floods: what one source address may make it do.
//!
//! [`Gate`] counts, per source address, the exchanges running and the exchanges that failed
//! in a window. An address over its failures has its connections closed at once (counted)
//! until the window passes. An address with its share of exchanges running has its next
//! connections *deferred* by [`Admission`]: held (a bounded number, for a bounded time)
//! and started as its running exchanges end. So a flood from one address takes at most its
//! share of the listener's exchanges, whatever it does, while many legitimate clients
//! behind one address (a NAT, one test host) are slowed down, not refused.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Bounds on what one source address may make a listener do.
#[derive(Debug)]
pub struct Gate {
    /// Exchanges one address may have running at once.
    pub max_running: u32,
    /// Failed exchanges one address may have in `window` before its connections are
    /// closed at once until the window passes.
    pub max_failures: u32,
    /// The failure window.
    pub window: Duration,
    state: Mutex<GateState>,
}

#[derive(Debug, Default)]
struct GateState {
    by_ip: HashMap<IpAddr, Source>,
    refused: u64,
}

#[derive(Debug, Clone, Copy)]
struct Source {
    running: u32,
    failures: u32,
    since: Instant,
}

/// Addresses remembered at most (the oldest idle ones are forgotten first).
const MAX_SOURCES: usize = 4096;

/// Why [`Gate::admit`] did not admit an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The address has [`Gate::max_running`] exchanges running: not now.
    Busy,
    /// The address failed [`Gate::max_failures`] times in the window: not until it passes.
    Failing,
    /// Every remembered address has exchanges running: no room to remember another.
    Full,
}

/// An admitted exchange: its address's slot is given back when this is dropped.
#[derive(Debug)]
pub struct Ticket {
    gate: Arc<Gate>,
    ip: IpAddr,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut st = self.gate.state.lock();
        if let Some(s) = st.by_ip.get_mut(&self.ip) {
            s.running = s.running.saturating_sub(1);
        }
    }
}

impl Ticket {
    /// The exchange failed (a wrong key, garbage, a timeout): counted against its address.
    pub fn failed(&self, now: Instant) {
        let mut st = self.gate.state.lock();
        let window = self.gate.window;
        if let Some(s) = st.by_ip.get_mut(&self.ip) {
            if now.duration_since(s.since) > window {
                s.failures = 0;
                s.since = now;
            }
            s.failures = s.failures.saturating_add(1);
        }
    }
}

impl Gate {
    /// The defaults: 8 exchanges at once and 32 failures a minute per address.
    pub fn new() -> Arc<Self> {
        Self::with(8, 32, Duration::from_secs(60))
    }

    /// A gate with these bounds.
    pub fn with(max_running: u32, max_failures: u32, window: Duration) -> Arc<Self> {
        Arc::new(Self {
            max_running,
            max_failures,
            window,
            state: Mutex::new(GateState::default()),
        })
    }

    /// Admits an exchange from `ip` now, or says why not. (Only [`Refusal::Failing`] and
    /// [`Refusal::Full`] count as refused: a busy address is asked again.)
    ///
    /// # Errors
    /// The [`Refusal`].
    pub fn admit(self: &Arc<Self>, ip: IpAddr, now: Instant) -> Result<Ticket, Refusal> {
        let mut st = self.state.lock();
        if !st.by_ip.contains_key(&ip) && st.by_ip.len() >= MAX_SOURCES {
            // Forget an idle address (the one whose window started longest ago).
            let oldest = st
                .by_ip
                .iter()
                .filter(|(_, s)| s.running == 0)
                .min_by_key(|(_, s)| s.since)
                .map(|(ip, _)| *ip);
            match oldest {
                Some(o) => {
                    st.by_ip.remove(&o);
                }
                None => {
                    st.refused += 1;
                    return Err(Refusal::Full);
                }
            }
        }
        let window = self.window;
        let s = st.by_ip.entry(ip).or_insert(Source {
            running: 0,
            failures: 0,
            since: now,
        });
        if now.duration_since(s.since) > window {
            s.failures = 0;
            s.since = now;
        }
        if s.failures >= self.max_failures {
            st.refused += 1;
            return Err(Refusal::Failing);
        }
        if s.running >= self.max_running {
            return Err(Refusal::Busy);
        }
        s.running += 1;
        Ok(Ticket {
            gate: Arc::clone(self),
            ip,
        })
    }

    /// Connections closed at once so far (failing addresses, no room).
    pub fn refused(&self) -> u64 {
        self.state.lock().refused
    }
}

/// A connection to start: its stream, its peer and its ticket.
pub type Admitted = (TcpStream, SocketAddr, Ticket);

/// A [`Gate`] with the connections of busy addresses held until they have room.
#[derive(Debug)]
pub struct Admission {
    gate: Arc<Gate>,
    /// Connections held at most (beyond, a busy address's connection is closed).
    max_deferred: usize,
    /// How long a connection is held at most (then it is closed: its connector has given
    /// up, or soon will).
    defer_for: Duration,
    deferred: Mutex<Deferred>,
}

#[derive(Debug, Default)]
struct Deferred {
    queue: VecDeque<(TcpStream, SocketAddr, Instant)>,
    /// Connections deferred, ever.
    deferred: u64,
    /// Deferred connections closed (the queue full, or held too long).
    dropped: u64,
}

impl Admission {
    /// Admission through `gate`, holding at most `max_deferred` connections of busy
    /// addresses for at most `defer_for` each.
    pub fn new(gate: Arc<Gate>, max_deferred: usize, defer_for: Duration) -> Self {
        Self {
            gate,
            max_deferred,
            defer_for,
            deferred: Mutex::new(Deferred::default()),
        }
    }

    /// The gate.
    pub fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }

    /// A new connection: to start now (with its ticket), or `None` when it was held (its
    /// address is busy; [`ready`](Self::ready) hands it out later) or closed (the address
    /// is failing, or nothing more can be held).
    pub fn offer(&self, stream: TcpStream, peer: SocketAddr, now: Instant) -> Option<Admitted> {
        match self.gate.admit(peer.ip(), now) {
            Ok(t) => Some((stream, peer, t)),
            Err(Refusal::Busy) => {
                let mut d = self.deferred.lock();
                if d.queue.len() < self.max_deferred {
                    d.queue.push_back((stream, peer, now));
                    d.deferred += 1;
                } else {
                    d.dropped += 1;
                    tracing::debug!(%peer, "connection closed: too many held already");
                }
                None
            }
            Err(why) => {
                tracing::debug!(%peer, ?why, "connection refused");
                None
            }
        }
    }

    /// Up to `room` held connections whose address has room now, oldest first; those held
    /// longer than the limit are closed.
    pub fn ready(&self, now: Instant, room: usize) -> Vec<Admitted> {
        let mut d = self.deferred.lock();
        if d.queue.is_empty() || room == 0 {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut keep = VecDeque::with_capacity(d.queue.len());
        while let Some((stream, peer, since)) = d.queue.pop_front() {
            if now.duration_since(since) > self.defer_for {
                d.dropped += 1;
                continue;
            }
            if out.len() < room {
                match self.gate.admit(peer.ip(), now) {
                    Ok(t) => {
                        out.push((stream, peer, t));
                        continue;
                    }
                    Err(Refusal::Busy) => {}
                    // Failing since: closed.
                    Err(_) => continue,
                }
            }
            keep.push_back((stream, peer, since));
        }
        d.queue = keep;
        out
    }

    /// Connections held now.
    pub fn held(&self) -> usize {
        self.deferred.lock().queue.len()
    }

    /// Connections deferred so far, and those of them closed without starting.
    pub fn deferred(&self) -> (u64, u64) {
        let d = self.deferred.lock();
        (d.deferred, d.dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn the_gate_bounds_running_and_failures_per_address() {
        let g = Gate::with(2, 3, Duration::from_secs(10));
        let t0 = Instant::now();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let t1 = g.admit(a, t0).unwrap();
        let t2 = g.admit(a, t0).unwrap();
        assert_eq!(g.admit(a, t0).err(), Some(Refusal::Busy), "two at once");
        assert!(g.admit(b, t0).is_ok(), "another address is not held back");
        drop(t1);
        let t3 = g.admit(a, t0).unwrap();
        for t in [&t2, &t3] {
            t.failed(t0);
        }
        drop((t2, t3));
        let t4 = g.admit(a, t0).unwrap();
        t4.failed(t0);
        drop(t4);
        assert_eq!(
            g.admit(a, t0).err(),
            Some(Refusal::Failing),
            "three failures"
        );
        assert!(
            g.admit(a, t0 + Duration::from_secs(11)).is_ok(),
            "the window passed"
        );
        assert_eq!(g.refused(), 1);
    }

    /// Connected pairs over loopback (the server's side, as a listener gets them).
    fn streams(n: usize) -> Vec<(TcpStream, SocketAddr)> {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut out = Vec::new();
        let mut clients = Vec::new();
        for _ in 0..n {
            clients.push(TcpStream::connect(addr).unwrap());
            out.push(l.accept().unwrap());
        }
        // The clients may go: the server's ends stay open.
        drop(clients);
        out
    }

    #[test]
    fn a_busy_address_is_held_then_started_in_order() {
        let a = Admission::new(
            Gate::with(2, 100, Duration::from_secs(60)),
            3,
            Duration::from_secs(5),
        );
        let t0 = Instant::now();
        let mut s = streams(6).into_iter();
        let mut started = Vec::new();
        for _ in 0..2 {
            let (st, p) = s.next().unwrap();
            started.push(a.offer(st, p, t0).expect("room"));
        }
        let mut held_ports = Vec::new();
        for _ in 0..3 {
            let (st, p) = s.next().unwrap();
            held_ports.push(p.port());
            assert!(a.offer(st, p, t0).is_none(), "held");
        }
        assert_eq!(a.held(), 3);
        // The queue is full: the next one is closed.
        let (st, p) = s.next().unwrap();
        assert!(a.offer(st, p, t0).is_none());
        assert_eq!(a.held(), 3);
        assert_eq!(a.deferred(), (3, 1));
        // Nothing ready while the address is busy, or with no room.
        assert!(a.ready(t0, 8).is_empty());
        started.pop();
        assert!(a.ready(t0, 0).is_empty());
        let r = a.ready(t0, 8);
        assert_eq!(r.len(), 1, "one slot freed");
        assert_eq!(r[0].1.port(), held_ports[0], "the oldest first");
        drop(started);
        let r2 = a.ready(t0, 1);
        assert_eq!(r2.len(), 1, "at most `room`");
        assert_eq!(r2[0].1.port(), held_ports[1]);
        drop(r2);
        // Held too long: closed, not started.
        assert!(a.ready(t0 + Duration::from_secs(6), 8).is_empty());
        assert_eq!(a.held(), 0);
        assert_eq!(a.deferred(), (3, 2));
    }

    #[test]
    fn a_failing_address_is_closed_not_held() {
        let a = Admission::new(
            Gate::with(1, 1, Duration::from_secs(60)),
            8,
            Duration::from_secs(5),
        );
        let t0 = Instant::now();
        let mut s = streams(3).into_iter();
        let (st, p) = s.next().unwrap();
        let (_, _, t) = a.offer(st, p, t0).unwrap();
        let (st, p) = s.next().unwrap();
        assert!(a.offer(st, p, t0).is_none());
        assert_eq!(a.held(), 1);
        t.failed(t0);
        drop(t);
        // Its held connection is closed when looked at; new ones are refused.
        assert!(a.ready(t0, 8).is_empty());
        assert_eq!(a.held(), 0);
        let (st, p) = s.next().unwrap();
        assert!(a.offer(st, p, t0).is_none());
        assert_eq!(a.held(), 0);
        assert_eq!(a.gate().refused(), 2, "the held one and the new one");
    }
}
