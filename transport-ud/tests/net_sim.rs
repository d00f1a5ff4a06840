//! Seeded simulation of UD endpoints over the worker: two or three contexts (a worker and
//! its UD transport each) on soft devices on one simulated net (seeded loss, duplication,
//! reordering and delay), on a virtual clock, driven by one thread, so that a seed replays
//! exactly. Each seed draws the link, the credits and receive queue (often far fewer
//! buffers than the sessions' windows: the shared budget grants, waits and recalls), one to
//! six endpoint pairs with messages of every size each way, slow readers, and how each pair
//! ends: one side closes, both do, one drops its endpoint, or a context dies.
//!
//! Checked for every seed: each direction delivers exactly what was accepted for sending,
//! once, in order, byte for byte (a prefix of it when a context died); the disconnect
//! causes; a context's death is reported to its peers within the peer timeout (and a
//! retransmission timeout); once every endpoint is dropped the transports forget every
//! session; no datagram finds a receive queue empty; the run ends in bounded steps.
//!
//! `RDMX_UD_NET_SEEDS=<n>` (default 300), `RDMX_UD_NET_SEED=<n>` replays one seed (twice: it
//! must replay identically).
//!
//! Found with it: seed 38 (of the default range) hung — endpoints closed in order but kept
//! by the application held their share of the receive budget for ever, and the sessions
//! waiting in line behind them starved (recalling them is no use: their peers send
//! nothing). A session whose peer's `Fin` came gives its share back now.
#![expect(
    clippy::indexing_slicing,
    reason = "test harness: sides and nodes by index"
)]

use std::net::IpAddr;
use std::time::{Duration, Instant};

use rdmx_core::worker::Worker;
use rdmx_core::{Config, DisconnectCause, Error};
use rdmx_ud::{Endpoint, UdTransport};
use rdmx_verbs::DeviceOptions;
use rdmx_verbs::soft::engine::Rng;
use rdmx_verbs::soft::{SimLink, SimNet};

/// Counters summed over the seeds: a workload that stopped exercising one tests nothing
/// about it.
const COVERAGE: [&str; 6] = [
    "retransmits",
    "duplicates",
    "out of order",
    "credit waits",
    "recalls",
    "deaths reported",
];

struct Node {
    w: Worker,
    t: UdTransport,
    ip: IpAddr,
    alive: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Side 0 closes once it sent everything.
    OneCloses,
    /// Both close once they sent everything.
    BothClose,
    /// Side 0 drops its endpoint once it sent everything (what it did not read is lost).
    DropOne,
}

#[derive(Debug, Default)]
struct Dir {
    goal: u32,
    sent: u32,
    got: u32,
}

struct Pair {
    /// The nodes of side 0 and side 1.
    nodes: [usize; 2],
    eps: [Option<Endpoint>; 2],
    /// Direction `i`: from side `i` to the other.
    dirs: [Dir; 2],
    read_p: [f64; 2],
    sizes: Vec<usize>,
    ending: Ending,
    closed: [bool; 2],
    /// Why each side ended (as its endpoint reported it once its messages were taken).
    cause: [Option<DisconnectCause>; 2],
}

/// What a seed did, for the replay check and the coverage.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    steps: u64,
    messages: u64,
    elapsed: Duration,
    coverage: [u64; COVERAGE.len()],
}

fn message(pair: usize, dir: usize, seq: u32, len: usize) -> Vec<u8> {
    let mut m: Vec<u8> = (0..len)
        .map(|i| (i as u32 * 7 + seq * 13 + pair as u32 * 31 + dir as u32) as u8)
        .collect();
    if len >= 4 {
        m[..4].copy_from_slice(&seq.to_le_bytes());
    }
    m
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn pick<T: Copy>(r: &mut Rng, items: &[T]) -> T {
    items[r.below(items.len() as u64) as usize]
}

fn chance(r: &mut Rng, p: f64) -> bool {
    p > 0.0 && r.next_f64() < p
}

/// Runs one seed.
fn run(seed: u64) -> Result<Outcome, String> {
    let mut r = Rng::new(seed ^ 0x5eed_0f0d_5eed);
    let link = SimLink {
        loss: pick(&mut r, &[0.0, 0.01, 0.05]),
        duplicate: pick(&mut r, &[0.0, 0.02]),
        jitter: Duration::from_micros(pick(&mut r, &[0, 50, 500])),
        ..SimLink::default()
    };
    let srq_depth = pick(&mut r, &[32u32, 64, 256]);
    // (The budget is the receive queue less its control reserve: at least one window.)
    let credits = pick(&mut r, &[1u32, 4, 16]);
    let cfg = Config {
        credits,
        srq_depth,
        pool_max: 64 << 20,
        peer_timeout: Duration::from_millis(600),
        ..Config::default()
    };
    let net = SimNet::new(seed, link);
    let n_nodes = pick(&mut r, &[2usize, 3]);
    let mut nodes = Vec::new();
    for i in 0..n_nodes {
        let mut c = cfg.clone();
        c.device = format!("soft:10.0.0.{}", i + 1);
        let w = Worker::open(
            &c,
            Some(DeviceOptions::default().with_sim(&net)),
            &[UdTransport::RECV_BUF_SIZE],
        )
        .map_err(|e| format!("worker {i}: {e}"))?;
        let t = UdTransport::attach(&w, &c).map_err(|e| format!("attach {i}: {e}"))?;
        nodes.push(Node {
            w,
            t,
            ip: IpAddr::from([10, 0, 0, i as u8 + 1]),
            alive: true,
        });
    }
    let n_pairs = 1 + r.below(6) as usize;
    let mut pairs = Vec::new();
    for _ in 0..n_pairs {
        let a = r.below(n_nodes as u64) as usize;
        let b = (a + 1 + r.below(n_nodes as u64 - 1) as usize) % n_nodes;
        let (ea, eb) = nodes[a]
            .t
            .connect_local(&nodes[b].t)
            .map_err(|e| format!("connect {a} -> {b}: {e}"))?;
        let max = 4096 - 40 - 32;
        pairs.push(Pair {
            nodes: [a, b],
            eps: [Some(ea), Some(eb)],
            dirs: [
                Dir {
                    goal: r.below(150) as u32,
                    ..Dir::default()
                },
                Dir {
                    goal: r.below(150) as u32,
                    ..Dir::default()
                },
            ],
            read_p: [
                pick(&mut r, &[1.0, 0.3, 0.05]),
                pick(&mut r, &[1.0, 0.3, 0.05]),
            ],
            sizes: vec![0, 1, 8, 100, max - 8, max, max + 1, 3 * max + 5, 20_000],
            ending: pick(
                &mut r,
                &[Ending::OneCloses, Ending::BothClose, Ending::DropOne],
            ),
            closed: [false; 2],
            cause: [None, None],
        });
    }
    // A context dies at some step in a fifth of the seeds.
    let kill = chance(&mut r, 0.2).then(|| (r.below(n_nodes as u64) as usize, 1 + r.below(3000)));
    let mut killed_at: Option<Instant> = None;
    let quantum = Duration::from_micros(pick(&mut r, &[20, 200, 1000]));
    let limit = cfg.peer_timeout + Duration::from_millis(200 + 10);
    let mut steps = 0u64;
    let mut messages = 0u64;
    let mut deaths = 0u64;
    let ctx = format!(
        "{link:?} credits {credits} srq {srq_depth} nodes {n_nodes} pairs {n_pairs} kill {kill:?}"
    );
    loop {
        steps += 1;
        if steps > 400_000 {
            let state: Vec<String> = pairs
                .iter()
                .map(|p| {
                    format!(
                        "{:?} {:?} {:?}/{:?} {:?} closed {:?}",
                        p.nodes, p.ending, p.dirs[0], p.dirs[1], p.cause, p.closed
                    )
                })
                .collect();
            return Err(format!("not done after {steps} steps ({ctx}): {state:?}"));
        }
        if let Some((k, at)) = kill
            && steps == at
        {
            net.set_host_down(nodes[k].ip, true);
            nodes[k].alive = false;
            killed_at = Some(net.clock().now());
        }
        // The applications.
        for (pi, p) in pairs.iter_mut().enumerate() {
            for side in 0..2 {
                if !nodes[p.nodes[side]].alive {
                    continue;
                }
                let Some(ep) = p.eps[side].as_ref() else {
                    continue;
                };
                // Send.
                let d = &mut p.dirs[side];
                while d.sent < d.goal && !p.closed[side] {
                    let len = p.sizes[r.below(p.sizes.len() as u64) as usize];
                    match ep.try_send(&message(pi, side, d.sent, len)) {
                        Ok(()) => d.sent += 1,
                        Err(Error::WouldBlock | Error::Disconnected(_)) => break,
                        Err(e) => return Err(format!("pair {pi} side {side} send: {e}")),
                    }
                }
                // Read (slow readers now and then).
                if p.cause[side].is_none() && chance(&mut r, p.read_p[side]) {
                    loop {
                        match ep.try_recv() {
                            Ok(m) => {
                                let d = &mut p.dirs[1 - side];
                                let want = message(pi, 1 - side, d.got, m.len());
                                if m[..] != want[..] {
                                    return Err(format!(
                                        "pair {pi} side {side}: message {} wrong ({} bytes) ({ctx})",
                                        d.got,
                                        m.len()
                                    ));
                                }
                                d.got += 1;
                                messages += 1;
                            }
                            Err(Error::WouldBlock) => break,
                            Err(Error::Disconnected(c)) => {
                                p.cause[side] = Some(c);
                                break;
                            }
                            Err(e) => return Err(format!("pair {pi} side {side} recv: {e}")),
                        }
                    }
                }
                // Close once everything is sent.
                let done_sending = p.dirs[side].sent == p.dirs[side].goal;
                if done_sending && !p.closed[side] {
                    match (p.ending, side) {
                        (Ending::OneCloses, 0) | (Ending::BothClose, _) => {
                            ep.start_close();
                            p.closed[side] = true;
                        }
                        (Ending::DropOne, 0) => {
                            p.eps[0] = None;
                            p.closed[0] = true;
                        }
                        _ => {}
                    }
                }
            }
        }
        // Done: every live side of every pair knows how its endpoint ended.
        let done = pairs.iter().all(|p| {
            (0..2).all(|s| {
                !nodes[p.nodes[s]].alive
                    || p.eps[s].is_none()
                    || p.cause[s].is_some()
                    || (p.closed[s]
                        && p.eps[s]
                            .as_ref()
                            .and_then(Endpoint::disconnect_cause)
                            .is_some())
            })
        });
        if done {
            break;
        }
        if let Some(t) = killed_at {
            // (Only the pairs with a side on the dead context must be over by then.)
            let noticed = pairs
                .iter()
                .filter(|p| p.nodes.iter().any(|&n| !nodes[n].alive))
                .all(|p| {
                    (0..2).all(|s| {
                        !nodes[p.nodes[s]].alive
                            || p.eps[s].is_none()
                            || p.cause[s].is_some()
                            || p.eps[s]
                                .as_ref()
                                .and_then(Endpoint::disconnect_cause)
                                .is_some()
                    })
                });
            let waited = net.clock().now().saturating_duration_since(t);
            if waited > limit && !noticed {
                return Err(format!(
                    "{waited:?} after context {:?} died, a peer has not noticed ({ctx})",
                    kill.map(|k| k.0)
                ));
            }
        }
        step(&net, &nodes, quantum);
    }
    // What arrived: everything accepted, unless a context died (then a prefix, checked as it
    // came) or the reader dropped its endpoint.
    for (pi, p) in pairs.iter_mut().enumerate() {
        let dead = p.nodes.iter().any(|&n| !nodes[n].alive);
        for side in 0..2 {
            if !nodes[p.nodes[side]].alive {
                continue;
            }
            let cause = p.cause[side]
                .clone()
                .or_else(|| p.eps[side].as_ref().and_then(Endpoint::disconnect_cause));
            if dead {
                if matches!(cause, Some(DisconnectCause::PeerUnreachable(_))) {
                    deaths += 1;
                }
                continue;
            }
            let reader_dropped = p.eps[side].is_none();
            let d = &p.dirs[1 - side];
            if !reader_dropped && d.got != d.sent {
                return Err(format!(
                    "pair {pi}: side {side} got {} of {} ({:?}, {cause:?}) ({ctx})",
                    d.got, d.sent, p.ending
                ));
            }
            let ok = match (p.ending, side, &cause) {
                (_, _, None) => reader_dropped,
                (Ending::OneCloses | Ending::DropOne, 1, Some(c)) => {
                    *c == DisconnectCause::PeerClosed
                }
                (_, _, Some(c)) => {
                    matches!(c, DisconnectCause::LocalClose | DisconnectCause::PeerClosed)
                }
            };
            if !ok {
                return Err(format!(
                    "pair {pi} side {side} ({:?}) ended with {cause:?} ({ctx})",
                    p.ending
                ));
            }
        }
    }
    // Every endpoint dropped: the transports forget every session in time.
    for p in &mut pairs {
        p.eps = [None, None];
    }
    let mut settle = 0;
    while nodes.iter().any(|n| n.alive && n.t.endpoint_count() > 0) {
        settle += 1;
        if settle > 200_000 {
            let left: Vec<usize> = nodes.iter().map(|n| n.t.endpoint_count()).collect();
            return Err(format!(
                "sessions left after every endpoint was dropped: {left:?} ({ctx})"
            ));
        }
        step(&net, &nodes, Duration::from_millis(1));
    }
    let mut coverage = [0u64; COVERAGE.len()];
    for n in nodes.iter().filter(|n| n.alive) {
        let s = n.t.stats();
        let nic = n.w.verbs_context().counters();
        if nic.rx_no_recv > 0 {
            return Err(format!(
                "{} datagrams found no receive buffer ({s:?}) ({ctx})",
                nic.rx_no_recv
            ));
        }
        for (c, v) in coverage.iter_mut().zip([
            s.retransmits,
            s.duplicates,
            s.out_of_order,
            s.credit_waits,
            s.recalls,
            0,
        ]) {
            *c += v;
        }
    }
    coverage[5] = deaths;
    Ok(Outcome {
        steps: steps + settle,
        messages,
        elapsed: net.elapsed(),
        coverage,
    })
}

/// One step: every live context does its background duties, then the clock moves to the
/// next event, at most `quantum` ahead (the applications' next look).
fn step(net: &SimNet, nodes: &[Node], quantum: Duration) {
    let mut next = net.next_event();
    for n in nodes.iter().filter(|n| n.alive) {
        if let Some(t) = n.w.drive() {
            next = Some(next.map_or(t, |x: Instant| x.min(t)));
        }
    }
    let now = net.clock().now();
    let t = next.map_or(now + quantum, |t| t.min(now + quantum));
    net.advance_to(t.max(now + Duration::from_micros(1)));
}

fn fail(seed: u64, e: &str) -> String {
    format!(
        "seed {seed} failed: {e}\n  replay: RDMX_UD_NET_SEED={seed} cargo test -p rdmx-ud --test net_sim"
    )
}

#[test]
fn seeds() {
    if let Some(seed) = env_u64("RDMX_UD_NET_SEED") {
        let a = run(seed).unwrap_or_else(|e| panic!("{}", fail(seed, &e)));
        let b = run(seed).unwrap_or_else(|e| panic!("{}", fail(seed, &e)));
        assert_eq!(a, b, "seed {seed} does not replay identically");
        eprintln!("seed {seed}: {a:?}");
        return;
    }
    let n = env_u64("RDMX_UD_NET_SEEDS").unwrap_or(300);
    let start = Instant::now();
    let (mut steps, mut messages) = (0, 0);
    let mut coverage = [0u64; COVERAGE.len()];
    let mut failures = Vec::new();
    for seed in 1..=n {
        match run(seed) {
            Ok(o) => {
                steps += o.steps;
                messages += o.messages;
                for (c, v) in coverage.iter_mut().zip(o.coverage) {
                    *c += v;
                }
            }
            Err(e) => {
                eprintln!("{}", fail(seed, &e));
                failures.push(seed);
            }
        }
    }
    let covered: Vec<String> = COVERAGE
        .iter()
        .zip(coverage)
        .map(|(name, v)| format!("{name} {v}"))
        .collect();
    eprintln!(
        "{n} seeds in {:?}: {steps} steps, {messages} messages; {}",
        start.elapsed(),
        covered.join(", ")
    );
    assert!(failures.is_empty(), "failing seeds: {failures:?}");
    if n >= 100 {
        for (name, v) in COVERAGE.iter().zip(coverage) {
            assert!(v > 0, "no seed exercised: {name}");
        }
    }
}

/// The same seed twice gives the same run: what makes a failing seed a regression test.
#[test]
fn a_seed_replays_identically() {
    for seed in [2, 11] {
        let a = run(seed).unwrap_or_else(|e| panic!("{}", fail(seed, &e)));
        let b = run(seed).unwrap_or_else(|e| panic!("{}", fail(seed, &e)));
        assert_eq!(a, b, "seed {seed} does not replay identically");
    }
}
