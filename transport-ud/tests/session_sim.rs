//! Seeded simulation of two UD sessions over a link that loses, duplicates, reorders and
//! delays datagrams, on a virtual clock; hostile datagrams (forged tokens, acknowledgements
//! of what was never sent, sequence numbers far off, garbage) are thrown in.
//!
//! Checked for every seed: each direction delivers exactly what was accepted for sending,
//! once, in order, byte for byte; the receiver never holds more than its window; an orderly
//! close from either side or both ends both sessions with the right causes; a peer cut off
//! is declared unreachable within the peer timeout (and a bit); the run ends in bounded
//! steps.
//!
//! In half the seeds a budget plays the transport's part: sessions start with no window or
//! a full one, a side grants its window only some time after the peer asked (`WANT`), and
//! now and then takes it away and recalls the credit already told.
//!
//! `RDMX_UD_SIM_SEEDS=<n>` (default 2,000), `RDMX_UD_SIM_SEED=<n>` replays one.
#![expect(
    clippy::indexing_slicing,
    clippy::needless_range_loop,
    reason = "test: the two sides by index"
)]

mod common;

use common::Rng;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use rdmx_ud::wire::{HEADER_LEN, Header};
use rdmx_ud::{Cause, SendError, Seq, Session, SessionConfig};

/// A datagram on the link: (arrival in ns since the start, order, destination side, bytes).
type InFlight = Reverse<(u64, u64, usize, Vec<u8>)>;

#[derive(Clone, Copy, Debug)]
struct Link {
    loss: f64,
    dup: f64,
    jitter_us: u64,
    latency_us: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Side 0 closes once it sent everything; side 1 answers.
    OneCloses,
    /// Both close once done, whenever that is.
    BothClose,
    /// Side 1 is cut off (no datagram either way) at a random step.
    Cutoff,
}

fn message(side: usize, n: u32, len: usize) -> Vec<u8> {
    let mut m = vec![0u8; len];
    for (i, b) in m.iter_mut().enumerate() {
        *b = (n as usize * 131 + i * 7 + side * 3) as u8;
    }
    if len >= 4 {
        m[..4].copy_from_slice(&n.to_be_bytes());
    }
    m
}

struct Side {
    s: Session,
    goal: u32,
    sent: u32,
    got: u32,
    read_p: f64,
    closed: bool,
    sizes: Vec<usize>,
    /// The peer asked for credit and this side has not granted it yet (budget seeds).
    asked: bool,
}

/// Runs one seed; `Err` says what failed.
fn run(seed: u64) -> Result<(u64, u64, u64), String> {
    let mut r = Rng(seed);
    let link = Link {
        // (At 20 % loss, 8 tries in a row fail now and then: the peer is then rightly
        // reported unreachable, which is not what these seeds test.)
        loss: r.pick(&[0.0, 0.01, 0.05, 0.1]),
        dup: r.pick(&[0.0, 0.02, 0.1]),
        jitter_us: r.pick(&[0, 20, 500]),
        latency_us: r.pick(&[2, 10, 100]),
    };
    let cfg = SessionConfig {
        max_datagram: r.pick(&[128, 512, 1024, 4096]),
        max_message: 30_000,
        send_window: r.pick(&[1, 4, 32]) as u32,
        recv_window: r.pick(&[1, 2, 8, 64]) as u32,
        max_queued: r.pick(&[1, 10_000, 1 << 20]),
        pack_max: r.pick(&[0, 64, 256]),
        rto: Duration::from_millis(r.pick(&[1, 5])),
        max_rto: Duration::from_millis(100),
        ack_delay: Duration::from_micros(r.pick(&[0, 50, 500])),
        peer_timeout: Duration::from_millis(r.pick(&[300, 2000])),
    };
    let ending = r.pick(&[Ending::OneCloses, Ending::BothClose, Ending::Cutoff]);
    let budget = r.chance(0.5);
    let window0 = |r: &mut Rng| {
        if budget {
            r.pick(&[0, cfg.recv_window])
        } else {
            cfg.recv_window
        }
    };
    let (win0, win1) = (window0(&mut r), window0(&mut r));
    let cut_at = 1 + r.below(2_000);
    let t0 = Instant::now();
    let mut now = t0 + Duration::from_millis(1);
    let (first0, first1) = (Seq(r.next() as u32), Seq(r.next() as u32));
    let (tok0, tok1) = (r.next() as u32, r.next() as u32);
    let sizes_for = |r: &mut Rng, max_dgram: usize| {
        vec![
            0,
            1,
            5,
            r.below(64) as usize,
            200,
            max_dgram.saturating_sub(36),
            max_dgram,
            3 * max_dgram + 7,
            r.below(10_000) as usize,
            30_000,
        ]
    };
    let mut sides = [
        Side {
            s: Session::new(
                cfg.clone(),
                tok0,
                (1, tok1),
                (first0, first1),
                (win0, win1),
                now,
            ),
            goal: r.below(300) as u32,
            sent: 0,
            got: 0,
            read_p: r.pick(&[1.0, 0.3, 0.02]),
            closed: false,
            sizes: sizes_for(&mut r, cfg.max_datagram),
            asked: false,
        },
        Side {
            s: Session::new(
                cfg.clone(),
                tok1,
                (0, tok0),
                (first1, first0),
                (win1, win0),
                now,
            ),
            goal: r.below(300) as u32,
            sent: 0,
            got: 0,
            read_p: r.pick(&[1.0, 0.3, 0.02]),
            closed: false,
            sizes: sizes_for(&mut r, cfg.max_datagram),
            asked: false,
        },
    ];
    // In flight: (arrival in ns since t0, order, destination side, bytes).
    let mut wire: BinaryHeap<InFlight> = BinaryHeap::new();
    let mut order = 0u64;
    let mut buf = vec![0u8; cfg.max_datagram.max(HEADER_LEN)];
    let mut cut = false;
    let mut cut_time = None;
    let mut steps = 0u64;
    let ns = |t: Instant| t.duration_since(t0).as_nanos() as u64;
    let ctx = format!("{link:?} {cfg:?} {ending:?} budget {budget}");
    loop {
        steps += 1;
        if steps > 3_000_000 {
            if std::env::var_os("RDMX_UD_SIM_DUMP").is_some() {
                eprintln!("side 0: {:#?}\nside 1: {:#?}", sides[0].s, sides[1].s);
            }
            return Err(format!(
                "not finished after {steps} steps at {:?}: sent/got {}/{} {}/{} ({ctx})",
                now - t0,
                sides[0].sent,
                sides[1].got,
                sides[1].sent,
                sides[0].got
            ));
        }
        if ending == Ending::Cutoff && !cut && steps >= cut_at {
            cut = true;
            cut_time = Some(now);
        }
        // The applications.
        for i in 0..2 {
            if cut && i == 1 {
                continue;
            }
            let side = &mut sides[i];
            while side.sent < side.goal && !side.closed {
                let len = side.sizes[r.below(side.sizes.len() as u64) as usize];
                match side.s.send(&message(i, side.sent, len)) {
                    Ok(()) => side.sent += 1,
                    Err(SendError::WouldBlock) => break,
                    Err(SendError::Closed) => break,
                    Err(e) => return Err(format!("side {i} send: {e}")),
                }
            }
            if r.chance(side.read_p) {
                while let Some(m) = side.s.recv() {
                    let want = message(1 - i, side.got, m.len());
                    if m != want {
                        return Err(format!(
                            "side {i}: message {} wrong ({} bytes) ({ctx})",
                            side.got,
                            m.len()
                        ));
                    }
                    side.got += 1;
                }
            }
            // The budget: grants some time after the request, takes windows away.
            if budget {
                side.asked |= side.s.take_want();
                if side.asked && r.chance(0.2) {
                    side.s.set_window(cfg.recv_window);
                    side.asked = false;
                } else if side.s.window() > 0 && r.chance(0.002) {
                    side.s.set_window(0);
                    side.s.recall(now);
                }
            }
            // Memory: the window, and at most one message that completed beyond it.
            let per = cfg.max_datagram - HEADER_LEN;
            let biggest = (cfg.max_message + 4).div_ceil(per) as u32;
            if side.s.held_packets() > cfg.recv_window + biggest
                || side.s.held_ahead() > cfg.recv_window as usize
            {
                return Err(format!(
                    "side {i} holds {} packets and {} ahead, window {}",
                    side.s.held_packets(),
                    side.s.held_ahead(),
                    cfg.recv_window
                ));
            }
        }
        // Endings.
        match ending {
            Ending::OneCloses => {
                if !sides[0].closed && sides[0].sent == sides[0].goal {
                    sides[0].s.close();
                    sides[0].closed = true;
                }
            }
            Ending::BothClose => {
                for (i, side) in sides.iter_mut().enumerate() {
                    if !side.closed && side.sent == side.goal && (i == 0 || r.chance(0.5)) {
                        side.s.close();
                        side.closed = true;
                    }
                }
            }
            Ending::Cutoff => {}
        }
        // Readers drain at the end so that closes can finish.
        let done = match ending {
            Ending::Cutoff => {
                if cut {
                    // Side 0 must give up on side 1 within the peer timeout (plus the
                    // retransmission timeout it may be waiting out).
                    match sides[0].s.cause() {
                        Some(Cause::PeerUnreachable) => true,
                        Some(Cause::PeerClosed | Cause::LocalClose) => true,
                        Some(other) => return Err(format!("cut off: side 0 ended with {other:?}")),
                        None => {
                            let waited = now - cut_time.unwrap_or(now);
                            if waited > cfg.peer_timeout + cfg.max_rto + Duration::from_millis(10) {
                                return Err(format!(
                                    "side 0 still waits {waited:?} after the cut ({ctx})"
                                ));
                            }
                            false
                        }
                    }
                } else {
                    false
                }
            }
            _ => sides.iter().all(|s| s.s.is_finished()),
        };
        if done {
            break;
        }
        if ending != Ending::Cutoff
            && sides.iter().any(|s| {
                matches!(
                    s.s.cause(),
                    Some(Cause::PeerUnreachable | Cause::Protocol(_))
                )
            })
        {
            return Err(format!(
                "a session failed: {:?} / {:?} ({ctx})",
                sides[0].s.cause(),
                sides[1].s.cause()
            ));
        }
        // Datagrams out.
        for i in 0..2 {
            while let Some(n) = sides[i].s.poll_transmit(now, &mut buf) {
                if cut || r.chance(link.loss) {
                    continue;
                }
                let copies = if r.chance(link.dup) { 2 } else { 1 };
                for _ in 0..copies {
                    let at = ns(now) + 1_000 * (link.latency_us + r.below(link.jitter_us + 1));
                    order += 1;
                    wire.push(Reverse((at, order, 1 - i, buf[..n].to_vec())));
                }
                // Now and then a hostile datagram towards the same side.
                if r.chance(0.01) {
                    let mut bad = buf[..n].to_vec();
                    match r.below(4) {
                        0 => bad[8] ^= 0x55,                       // forged token
                        1 => bad[16] = bad[16].wrapping_add(0x40), // ack of the unsent
                        2 => bad[12] = bad[12].wrapping_add(0x40), // seq far off
                        _ => {
                            let k = r.below(bad.len() as u64) as usize;
                            bad.truncate(k);
                        }
                    }
                    order += 1;
                    wire.push(Reverse((ns(now) + 1_000, order, 1 - i, bad)));
                }
            }
        }
        // The next event.
        let mut next = wire
            .peek()
            .map(|Reverse((at, ..))| t0 + Duration::from_nanos(*at));
        for side in &sides {
            if let Some(t) = side.s.poll_timeout() {
                next = Some(next.map_or(t, |n: Instant| n.min(t)));
            }
        }
        let app = now + Duration::from_micros(r.pick(&[10, 100, 1_000]));
        now = next.map_or(app, |n| n.min(app)).max(now);
        while let Some(Reverse((at, ..))) = wire.peek() {
            if *at > ns(now) {
                break;
            }
            let Some(Reverse((_, _, to, d))) = wire.pop() else {
                break;
            };
            if cut {
                continue;
            }
            // (A transport routes by the destination session id; here there is one.)
            if let Ok((h, p)) = Header::parse(&d) {
                sides[to].s.handle_datagram(now, &h, p);
            }
        }
        for side in &mut sides {
            if side.s.poll_timeout().is_some_and(|t| t <= now) {
                side.s.handle_timeout(now);
            }
        }
    }
    // What each side got is exactly what the other sent (unless cut off).
    if ending != Ending::Cutoff {
        for i in 0..2 {
            // Whatever is left arrives before the close.
            while let Some(m) = sides[i].s.recv() {
                let want = message(1 - i, sides[i].got, m.len());
                if m != want {
                    return Err(format!("side {i}: late message {} wrong", sides[i].got));
                }
                sides[i].got += 1;
            }
            if sides[i].got != sides[1 - i].sent {
                return Err(format!(
                    "side {i} got {} of {} ({ctx})",
                    sides[i].got,
                    sides[1 - i].sent
                ));
            }
        }
        // A side whose peer's Fin came before its own close answers it: PeerClosed.
        let causes = (sides[0].s.cause(), sides[1].s.cause());
        let ok = match ending {
            Ending::OneCloses => causes == (Some(Cause::LocalClose), Some(Cause::PeerClosed)),
            _ => matches!(
                causes,
                (
                    Some(Cause::LocalClose),
                    Some(Cause::LocalClose | Cause::PeerClosed)
                ) | (Some(Cause::PeerClosed), Some(Cause::LocalClose))
            ),
        };
        if !ok {
            return Err(format!("causes {causes:?} after {ending:?} ({ctx})"));
        }
    }
    let st = sides[0].s.stats();
    let skipped = st.skipped + sides[1].s.stats().skipped;
    Ok((steps, st.sent, skipped))
}

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn sessions_deliver_exactly_once_in_order_whatever_the_link() {
    if let Some(seed) = env("RDMX_UD_SIM_SEED") {
        let a = run(seed);
        assert_eq!(a, run(seed), "seed {seed} does not replay");
        if let Err(e) = a {
            panic!("seed {seed}: {e}");
        }
        return;
    }
    let n = env("RDMX_UD_SIM_SEEDS").unwrap_or(2_000);
    let mut failed = Vec::new();
    let start = Instant::now();
    let mut steps = 0;
    let mut skipped = 0;
    for seed in 1..=n {
        match run(seed) {
            Ok((s, _, k)) => {
                steps += s;
                skipped += k;
            }
            Err(e) => {
                eprintln!("seed {seed}: {e}\n  replay: RDMX_UD_SIM_SEED={seed}");
                failed.push(seed);
            }
        }
    }
    eprintln!(
        "{n} seeds, {steps} steps, {skipped} numbers given back, {:?}",
        start.elapsed()
    );
    assert!(failed.is_empty(), "failing seeds: {failed:?}");
    assert!(n < 100 || skipped > 0, "no recall ever completed");
}
