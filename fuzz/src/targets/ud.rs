//! `ud_wire` and `ud_session`: the datagrams of UD sessions (`rdmx_ud::wire`:
//! `Header::parse`, `packed_entries`, `is_ack`) and the session that consumes them
//! (`rdmx_ud::session::Session::handle_datagram`, then its timers, transmissions and
//! deliveries), which is sans-I/O and runs without a network.

use std::time::{Duration, Instant};

use rdmx_ud::Seq;
use rdmx_ud::session::{Session, SessionConfig};
use rdmx_ud::wire::{self, HEADER_LEN, Header, Kind};

use super::{FnRunner, Runner, Target, numbered};
use crate::records;

pub(crate) const WIRE: Target = Target {
    name: "ud_wire",
    about: "rdmx-ud session datagram header and packed payloads",
    max_alloc: 64 * 1024,
    max_total: 1 << 20,
    max_len: 2048,
    framed: false,
    seeds: wire_seeds,
    runner: wire_runner,
};

pub(crate) const SESSION: Target = Target {
    name: "ud_session",
    about: "rdmx-ud Session fed with hostile datagrams (records), with timers and app calls",
    // The reassembly buffer of a message (max_message here) and the session's queues.
    max_alloc: 256 * 1024,
    max_total: 16 << 20,
    max_len: 16 * 1024,
    framed: true,
    seeds: session_seeds,
    runner: session_runner,
};

fn wire_runner() -> Box<dyn Runner> {
    Box::new(FnRunner(run_wire))
}

fn run_wire(input: &[u8]) {
    let _ = wire::is_ack(input);
    if let Ok((h, payload)) = Header::parse(input) {
        let mut again = [0u8; HEADER_LEN];
        assert!(h.write(&mut again));
        assert_eq!(again[..], input[..HEADER_LEN], "header round trip");
        assert_eq!(usize::from(h.len), payload.len());
        if h.kind == Kind::Packed {
            packed(payload);
        }
    }
    packed(input);
}

fn packed(payload: &[u8]) {
    if let Some(entries) = wire::packed_entries(payload) {
        assert!(!entries.is_empty());
        let covered: usize = entries
            .iter()
            .map(|e| e.len() + wire::PACKED_ENTRY_LEN)
            .sum();
        assert_eq!(covered, payload.len(), "entries cover the payload");
    }
}

fn wire_seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let (mut a, mut b, now) = pair();
    exchange(&mut a, &mut b, now, &mut |d| out.push(d.to_vec()));
    out.sort();
    out.dedup();
    numbered("datagram", out)
}

// ---------------------------------------------------------------------------- session

/// The session configuration of both sides: small datagrams and windows, so that a few
/// records reach segmentation, packing, credit stalls and window edges.
fn config() -> SessionConfig {
    SessionConfig {
        max_datagram: 256,
        max_message: 64 * 1024,
        send_window: 8,
        recv_window: 8,
        max_queued: 64 * 1024,
        pack_max: 48,
        ..SessionConfig::default()
    }
}

/// The session under test (tokens and sequence numbers as the recorded peer expects).
fn victim(now: Instant) -> Session {
    let cfg = config();
    let mut s = Session::new(
        cfg.clone(),
        22,
        (1, 11),
        (Seq(5), Seq(u32::MAX - 3)),
        (cfg.recv_window, cfg.recv_window),
        now,
    );
    // Something in flight, so that acknowledgements, credit and retransmission matter.
    for m in [&b"first"[..], &[7u8; 700][..], b"x", b"y"] {
        let _ = s.send(m);
    }
    s
}

/// The peer the seeds were recorded from.
fn peer(now: Instant) -> Session {
    let cfg = config();
    Session::new(
        cfg.clone(),
        11,
        (2, 22),
        (Seq(u32::MAX - 3), Seq(5)),
        (cfg.recv_window, cfg.recv_window),
        now,
    )
}

fn pair() -> (Session, Session, Instant) {
    let now = Instant::now();
    (peer(now), victim(now), now)
}

/// The peer sends a mix of messages and closes; every datagram it sends to the victim goes
/// to `record`. The two exchange until both are quiet.
fn exchange(peer: &mut Session, victim: &mut Session, now: Instant, record: &mut dyn FnMut(&[u8])) {
    let big: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
    for m in [&b"hello"[..], b"a", b"bb", b"ccc", &big[..], b"after"] {
        let _ = peer.send(m);
    }
    peer.close();
    let mut buf = vec![0u8; 4096];
    for _ in 0..200 {
        let mut moved = false;
        while let Some(n) = peer.poll_transmit(now, &mut buf) {
            moved = true;
            record(&buf[..n]);
            if let Ok((h, p)) = Header::parse(&buf[..n]) {
                victim.handle_datagram(now, &h, p);
            }
        }
        while victim.recv().is_some() {}
        while let Some(n) = victim.poll_transmit(now, &mut buf) {
            moved = true;
            if let Ok((h, p)) = Header::parse(&buf[..n]) {
                peer.handle_datagram(now, &h, p);
            }
        }
        while peer.recv().is_some() {}
        if !moved {
            break;
        }
    }
}

/// Control bits of a session record.
mod ctrl {
    /// Bits 0-1: how far time moves before the record ([`super::STEPS`]).
    pub(super) const TIME: u8 = 3;
    /// The application takes every message after the record.
    pub(super) const RECV: u8 = 4;
    /// The record is a message the application sends, not a datagram.
    pub(super) const SEND: u8 = 8;
    /// The transport recalls credit.
    pub(super) const RECALL: u8 = 16;
    /// The application closes.
    pub(super) const CLOSE: u8 = 32;
    /// The transport looks at the peer's request for credit and sets the window.
    pub(super) const WINDOW: u8 = 64;
}

/// Time steps a record's control bits choose from.
const STEPS: [Duration; 4] = [
    Duration::ZERO,
    Duration::from_micros(100),
    Duration::from_millis(20),
    Duration::from_secs(3),
];

struct SessionRunner {
    t0: Instant,
    session: Option<Session>,
    buf: Vec<u8>,
}

fn session_runner() -> Box<dyn Runner> {
    Box::new(SessionRunner {
        t0: Instant::now(),
        session: None,
        buf: vec![0u8; 4096],
    })
}

impl Runner for SessionRunner {
    fn reset(&mut self) {
        let mut s = victim(self.t0);
        // Its first datagrams go out before the peer's (which acknowledge them) come in,
        // as when the seeds were recorded.
        drive(&mut s, self.t0, &mut self.buf);
        self.session = Some(s);
    }

    fn run(&mut self, input: &[u8]) {
        let Some(s) = self.session.as_mut() else {
            return;
        };
        let mut now = self.t0;
        for r in records::parse(input) {
            now += STEPS[usize::from(r.ctrl & ctrl::TIME)];
            if r.ctrl & ctrl::SEND != 0 {
                let _ = s.send(r.data);
            } else if let Ok((h, p)) = Header::parse(r.data) {
                s.handle_datagram(now, &h, p);
            }
            if r.ctrl & ctrl::RECALL != 0 {
                s.recall(now);
            }
            if r.ctrl & ctrl::CLOSE != 0 {
                s.close();
            }
            if r.ctrl & ctrl::WINDOW != 0 && s.take_want() {
                s.set_window(r.data.len() as u32 % 32);
            }
            if r.ctrl & ctrl::RECV != 0 {
                while s.recv().is_some() {}
            }
            drive(s, now, &mut self.buf);
        }
        // Let the timers run a while: retransmissions, probes, the verdict on the peer.
        for _ in 0..8 {
            let Some(t) = s.poll_timeout() else { break };
            now = now.max(t);
            s.handle_timeout(now);
            drive(s, now, &mut self.buf);
        }
        let _ = (
            s.stats(),
            s.cause(),
            s.queued_bytes(),
            s.in_flight(),
            s.held_ahead(),
        );
    }
}

/// Sends what the session has to send (into the void) and runs due timers.
fn drive(s: &mut Session, now: Instant, buf: &mut [u8]) {
    for _ in 0..64 {
        let Some(n) = s.poll_transmit(now, buf) else {
            break;
        };
        assert!(
            Header::parse(&buf[..n]).is_ok(),
            "the session's own datagram parses"
        );
    }
    if s.poll_timeout().is_some_and(|t| t <= now) {
        s.handle_timeout(now);
    }
}

fn session_seeds() -> Vec<(String, Vec<u8>)> {
    let (mut a, mut b, now) = pair();
    let mut recs = Vec::new();
    exchange(&mut a, &mut b, now, &mut |d| recs.push(d.to_vec()));
    let whole = records::encode(recs.iter().map(|d| (ctrl::RECV, &d[..])));
    let mut out = vec![("exchange".to_owned(), whole)];
    // The same datagrams without the application reading: the window fills.
    out.push((
        "no_reader".to_owned(),
        records::encode(recs.iter().map(|d| (0, &d[..]))),
    ));
    // Reordered: last first.
    out.push((
        "reversed".to_owned(),
        records::encode(recs.iter().rev().map(|d| (ctrl::RECV | 1, &d[..]))),
    ));
    // Application calls between datagrams.
    let mut mixed = Vec::new();
    for (i, d) in recs.iter().enumerate() {
        records::push(&mut mixed, ctrl::RECV | (i as u8 & 1), d);
        if i % 3 == 0 {
            records::push(&mut mixed, ctrl::SEND | ctrl::WINDOW, b"reply");
        }
    }
    records::push(&mut mixed, ctrl::RECALL | ctrl::CLOSE | 2, b"");
    out.push(("mixed".to_owned(), mixed));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recorded datagrams, replayed into a fresh victim, deliver the peer's messages
    /// and its close: the seeds reach the session's every path, not its refusals.
    #[test]
    fn the_recorded_exchange_replays_cleanly() {
        let t0 = Instant::now();
        let mut s = victim(t0);
        let mut buf = vec![0u8; 4096];
        drive(&mut s, t0, &mut buf);
        let (name, input) = session_seeds().remove(0);
        assert_eq!(name, "exchange");
        let mut got = 0;
        for r in records::parse(&input) {
            let (h, p) = Header::parse(r.data).expect("a recorded datagram parses");
            s.handle_datagram(t0, &h, p);
            while s.recv().is_some() {
                got += 1;
            }
            drive(&mut s, t0, &mut buf);
        }
        assert_eq!(s.stats().refused, 0, "{:?}", s.stats());
        assert_eq!(got, 6);
        assert!(s.peer_done());
    }
}
