//! One seed's workload and what must hold whatever the seed: endpoints between two or three
//! contexts exchange messages of every size class (inline, eager, packed in send batches,
//! rendezvous) in both directions, with slow readers, tight credits shared by several
//! endpoints (lending and recall), narrow rendezvous windows; each pair ends with an orderly
//! close from either side, from both at once, by a dropped handle, mid-traffic, or by the
//! death of a context.
//!
//! Checked: each direction delivers a gap-free, duplicate-free, in-order prefix of what was
//! accepted for sending, every byte intact; a peer that closed in order had everything it
//! sent delivered; an endpoint whose peer died goes down within the bound of the peer
//! timeout, with a cause that says so; every endpoint of a live context is reaped and every
//! pool buffer comes back; the run ends within bounded virtual time and steps.

use std::time::Duration;

use rdmx_core::{Config, DisconnectCause, Error};
use rdmx_rc::Endpoint;
use rdmx_verbs::soft::SimLink;

use crate::harness::Sim;

/// Most steps one seed may take.
const MAX_STEPS: u64 = 400_000;

/// How a pair's life ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// Each side closes once it has sent and received everything (`start_close` or a
    /// dropped handle); both at once when they finish together.
    Done,
    /// One side closes at a random step, traffic still flowing.
    EarlyClose(usize),
    /// Both sides close at the same step, traffic still flowing.
    BothAtOnce,
    /// The context of side 1 dies at a random step.
    Death,
}

/// One direction of a pair.
#[derive(Debug, Default)]
struct Dir {
    /// Messages to send.
    goal: u32,
    /// Accepted by `try_send`.
    sent: u32,
    /// Received and checked.
    got: u32,
    /// The sender stopped (closed, or its endpoint went down).
    sender_done: bool,
    /// The receiver saw its endpoint down with this cause.
    ended: Option<DisconnectCause>,
    /// Probability that the receiver reads at a step (a slow reader leaves the credits
    /// with the messages it does not take).
    read_p: f64,
    /// Probability that a step's sends happen inside a send batch (packed frames).
    batch_p: f64,
}

/// Two endpoints, on contexts `node[0]` and `node[1]`.
struct Pair {
    node: [usize; 2],
    ep: [Option<Endpoint>; 2],
    /// `dir[i]`: from side `i` to side `1 - i`.
    dir: [Dir; 2],
    ending: Ending,
    /// The step at which the ending's event happens (early closes, death).
    at_step: u64,
    /// Side `i` closed (or dropped its handle), and how.
    closed: [Option<&'static str>; 2],
    /// Side `i` saw its endpoint down (with a cause), at this virtual time.
    down_at: [Option<Duration>; 2],
}

/// The sizes a message is drawn from: around the inline, eager (packed and not) and
/// rendezvous limits of `cfg`, and multi-packet rendezvous.
fn sizes(cfg: &Config) -> Vec<usize> {
    let r = cfg.rndv_threshold;
    vec![
        16,
        40,
        cfg.inline_threshold.max(16),
        300,
        1500,
        r.saturating_sub(40).max(16),
        r + 1,
        3 * r,
        20_000,
        70_000,
    ]
}

/// A message's bytes: stream tag, sequence number, length, then a pattern of all three.
fn message(tag: u32, seq: u32, len: usize) -> Vec<u8> {
    let mut m = vec![0u8; len.max(12)];
    m[..4].copy_from_slice(&tag.to_le_bytes());
    m[4..8].copy_from_slice(&seq.to_le_bytes());
    let n = m.len() as u32;
    m[8..12].copy_from_slice(&n.to_le_bytes());
    for (i, b) in m.iter_mut().enumerate().skip(12) {
        *b = (seq.wrapping_mul(31) as usize + i * 7 + tag as usize) as u8;
    }
    m
}

/// Checks a received message: what it says it is, and every byte.
fn check(m: &[u8], tag: u32, seq: u32) -> Result<(), String> {
    if m.len() < 12 {
        return Err(format!("stream {tag}: a {}-byte message", m.len()));
    }
    let word = |i: usize| u32::from_le_bytes([m[i], m[i + 1], m[i + 2], m[i + 3]]);
    let (t, s, l) = (word(0), word(4), word(8));
    if t != tag || s != seq || l as usize != m.len() {
        return Err(format!(
            "stream {tag}: expected message {seq}, got stream {t} message {s} (length {} says {l})",
            m.len()
        ));
    }
    if m != message(tag, seq, m.len()).as_slice() {
        return Err(format!("stream {tag} message {seq}: payload corrupted"));
    }
    Ok(())
}

/// The configuration and link of a seed.
fn setup(sim_seed: u64) -> (Config, SimLink, usize) {
    let mut r = rdmx_verbs::soft::engine::Rng::new(sim_seed);
    let mut pick = |v: &[u64]| v[r.below(v.len() as u64) as usize];
    let cfg = Config {
        credits: pick(&[1, 2, 4, 8, 32]) as u32,
        srq_depth: pick(&[8, 16, 32, 64]) as u32,
        rndv_threshold: pick(&[1024, 4096, 16384]) as usize,
        rndv_window: pick(&[1, 2, 8]) as u32,
        inline_threshold: pick(&[0, 64, 188]) as usize,
        peer_timeout: Duration::from_millis(pick(&[300, 500, 2000])),
        pool_max: 64 << 20,
        regcache_max: 8 << 20,
        ..Config::default()
    };
    let link = SimLink {
        latency: Duration::from_micros(pick(&[2, 5, 50])),
        jitter: Duration::from_micros(pick(&[0, 0, 10, 100])),
        loss: [0.0, 0.0, 0.002, 0.01, 0.03][pick(&[0, 1, 2, 3, 4]) as usize],
        duplicate: [0.0, 0.005, 0.02][pick(&[0, 1, 2]) as usize],
        corrupt: [0.0, 0.0, 0.002][pick(&[0, 1, 2]) as usize],
    };
    let nodes = pick(&[2, 2, 3]) as usize;
    (cfg, link, nodes)
}

/// What one seed did, for the replay check.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) trace: u64,
    pub(crate) steps: u64,
    pub(crate) messages: u64,
    /// How often the mechanisms the simulation is for ran (see [`COVERAGE`]).
    pub(crate) coverage: [u64; COVERAGE.len()],
}

/// The mechanisms the workload must exercise, as the transport counts them.
pub(crate) const COVERAGE: [&str; 7] = [
    "rendezvous sends",
    "packed messages",
    "credits recalled",
    "credits lent",
    "recall signals",
    "read-done signals",
    "credit waits",
];

/// Runs seed `seed`. `Err` says which property failed, and how.
pub(crate) fn run(seed: u64) -> Result<Outcome, String> {
    let (cfg, link, n) = setup(seed);
    let ctx = format!("{n} contexts, {cfg:?}, {link:?}");
    run_with(seed, &cfg, link, n).map_err(|e| format!("{e}\n  ({ctx})"))
}

fn run_with(seed: u64, cfg: &Config, link: SimLink, n: usize) -> Result<Outcome, String> {
    let mut sim = Sim::new(seed, link, cfg, n)?;
    let sizes = sizes(cfg);
    // Pairs between random distinct contexts: endpoints of one context share its credit
    // budget, which is what lending and recall redistribute.
    let npairs = 1 + sim.below(4) as usize;
    let mut pairs = Vec::new();
    for _ in 0..npairs {
        let a = sim.below(n as u64) as usize;
        let b = (a + 1 + sim.below(n as u64 - 1) as usize) % n;
        let (ea, eb) = sim.nodes[a]
            .t
            .connect_local(&sim.nodes[b].t)
            .map_err(|e| format!("connect {a}->{b}: {e}"))?;
        let mut dir = [Dir::default(), Dir::default()];
        for d in &mut dir {
            d.goal = sim.below(60) as u32;
            d.read_p = sim.pick(&[1.0, 1.0, 0.3, 0.05]);
            d.batch_p = sim.pick(&[0.0, 0.5, 1.0]);
        }
        let ending = match sim.below(8) {
            0..=3 => Ending::Done,
            4 | 5 => Ending::EarlyClose(sim.below(2) as usize),
            6 => Ending::BothAtOnce,
            _ => Ending::Death,
        };
        let at_step = 1 + sim.below(3_000);
        pairs.push(Pair {
            node: [a, b],
            ep: [Some(ea), Some(eb)],
            dir,
            ending,
            at_step,
            closed: [None, None],
            down_at: [None, None],
        });
    }
    // At most one death per run (the context of side 1 of the first pair that draws it);
    // the other pairs that drew it end as `Done` (unless that context is one of theirs).
    let death = pairs
        .iter()
        .position(|p| p.ending == Ending::Death)
        .map(|i| (pairs[i].at_step, pairs[i].node[1]));
    for p in &mut pairs {
        if p.ending == Ending::Death && death.is_some_and(|(_, n)| !p.node.contains(&n)) {
            p.ending = Ending::Done;
        }
    }
    let mut dead: Option<(usize, Duration)> = None;
    let mut messages = 0u64;
    // Everything ends within this much virtual time after the last event that could hold it
    // up: a close deadline or a peer death is one peer timeout, detection a few more.
    let bound = cfg.peer_timeout * 4 + Duration::from_secs(2);
    loop {
        if sim.steps >= MAX_STEPS {
            return Err(format!(
                "not finished after {MAX_STEPS} steps ({:?} virtual): {}",
                sim.elapsed(),
                describe(&pairs)
            ));
        }
        if let Some((at, node)) = death
            && dead.is_none()
            && sim.steps >= at
        {
            sim.kill(node);
            dead = Some((node, sim.elapsed()));
        }
        let mut busy = false;
        for (pi, p) in pairs.iter_mut().enumerate() {
            busy |= drive_pair(
                &mut sim,
                p,
                pi as u32,
                &sizes,
                dead.map(|d| d.0),
                &mut messages,
            )?;
        }
        if !busy {
            break;
        }
        if let Some((_, at)) = dead
            && sim.elapsed() > at + bound
        {
            let stuck: Vec<String> = pairs
                .iter()
                .filter(|p| p.node.contains(&dead.map_or(usize::MAX, |d| d.0)))
                .filter_map(|p| {
                    let live = if Some(p.node[0]) == dead.map(|d| d.0) {
                        1
                    } else {
                        0
                    };
                    p.down_at[live]
                        .is_none()
                        .then(|| format!("endpoint on context {} still up", p.node[live]))
                })
                .collect();
            if !stuck.is_empty() {
                return Err(format!(
                    "peer death at {at:?} not detected by {:?}: {}",
                    sim.elapsed(),
                    stuck.join(", ")
                ));
            }
        }
        if sim.elapsed() > Duration::from_secs(600) {
            return Err(format!(
                "not finished after {:?} virtual: {}",
                sim.elapsed(),
                describe(&pairs)
            ));
        }
        let quantum = Duration::from_micros(sim.pick(&[5, 50, 500, 5_000]));
        sim.step(quantum);
    }
    // Every endpoint handle is gone: a live context reaps its endpoints and has its pool
    // buffers back within the bound.
    drop(pairs);
    let deadline = sim.elapsed() + bound;
    loop {
        let pending: Vec<String> = sim
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.alive)
            .filter_map(|(i, n)| {
                let eps = n.t.endpoint_count();
                let in_use = n.w.pool_stats().in_use_bytes;
                let s = n.t.stats();
                (eps > 0
                    || in_use != n.baseline_in_use
                    || s.credits_outstanding > 0
                    || s.recv_held > 0)
                    .then(|| {
                        format!(
                            "context {i}: {eps} endpoints, {in_use} pool bytes in use ({} at \
                             start), {} credits outstanding, {} receive buffers held",
                            n.baseline_in_use, s.credits_outstanding, s.recv_held
                        )
                    })
            })
            .collect();
        if pending.is_empty() {
            break;
        }
        if sim.elapsed() > deadline || sim.steps >= MAX_STEPS {
            return Err(format!(
                "not cleaned up {bound:?} after the last handle went: {}",
                pending.join("; ")
            ));
        }
        sim.step(Duration::from_millis(10));
    }
    let mut coverage = [0; COVERAGE.len()];
    for (i, n) in sim.nodes.iter().enumerate() {
        let s = n.t.stats();
        if n.alive && s.protocol_errors > 0 {
            return Err(format!(
                "context {i}: {} protocol errors",
                s.protocol_errors
            ));
        }
        let counts = [
            s.sent_rndv,
            s.sent_packed,
            s.credits_recalled,
            s.credits_lent,
            s.recall_signals,
            s.read_done_signals,
            s.credit_waits,
        ];
        for (c, v) in coverage.iter_mut().zip(counts) {
            *c += v;
        }
    }
    Ok(Outcome {
        trace: sim.trace(),
        steps: sim.steps,
        messages,
        coverage,
    })
}

/// One step's application work on a pair. Returns whether the pair still has work.
fn drive_pair(
    sim: &mut Sim,
    p: &mut Pair,
    tag: u32,
    sizes: &[usize],
    dead: Option<usize>,
    messages: &mut u64,
) -> Result<bool, String> {
    let now = sim.elapsed();
    // Endings that happen at a step.
    if sim.steps == p.at_step {
        match p.ending {
            Ending::EarlyClose(side) => close(sim, p, side),
            Ending::BothAtOnce => {
                close(sim, p, 0);
                close(sim, p, 1);
            }
            _ => {}
        }
    }
    for side in 0..2 {
        if dead == Some(p.node[side]) {
            // A dead context's application does nothing more.
            p.ep[side] = None;
            p.dir[side].sender_done = true;
            continue;
        }
        let node = p.node[side];
        // Sends.
        let d = &mut p.dir[side];
        if !d.sender_done && p.closed[side].is_none() && d.sent < d.goal {
            let batch = sim.rng.next_f64() < d.batch_p;
            let w = sim.nodes[node].w.clone();
            let _guard = batch.then(|| w.batch());
            let burst = 1 + sim.below(8);
            for _ in 0..burst {
                let d = &mut p.dir[side];
                if d.sent >= d.goal {
                    break;
                }
                let len = sim.pick(sizes);
                let m = message(tag * 2 + side as u32, d.sent, len);
                let Some(ep) = &p.ep[side] else { break };
                match ep.try_send(&m) {
                    Ok(()) => {
                        let d = &mut p.dir[side];
                        d.sent += 1;
                        sim.note(u64::from(tag) << 40 | (side as u64) << 32 | u64::from(d.sent));
                    }
                    Err(Error::WouldBlock) => break,
                    Err(Error::Disconnected(_)) => {
                        p.dir[side].sender_done = true;
                        break;
                    }
                    Err(e) => return Err(format!("stream {}: send: {e}", tag * 2 + side as u32)),
                }
            }
        }
        // Receives (side `side` reads what the other side sent).
        let from = 1 - side;
        let Some(ep) = &p.ep[side] else { continue };
        let read_p = if p.closed.iter().any(Option::is_some) {
            1.0
        } else {
            p.dir[from].read_p
        };
        if sim.rng.next_f64() < read_p {
            for _ in 0..64 {
                match ep.try_recv() {
                    Ok(m) => {
                        let d = &mut p.dir[from];
                        check(&m, tag * 2 + from as u32, d.got)?;
                        if d.got >= d.sent {
                            // (The sender's count is updated as it sends: one more
                            // than it accepted would be a duplicate or invention.)
                            return Err(format!(
                                "stream {}: message {} received, only {} were sent",
                                tag * 2 + from as u32,
                                d.got,
                                d.sent
                            ));
                        }
                        let d = &mut p.dir[from];
                        d.got += 1;
                        *messages += 1;
                        sim.note(u64::from(tag) << 40 | 1 << 39 | u64::from(d.got));
                    }
                    Err(Error::WouldBlock) => break,
                    Err(Error::Disconnected(cause)) => {
                        p.dir[from].ended.get_or_insert(cause);
                        break;
                    }
                    Err(e) => return Err(format!("recv: {e}")),
                }
            }
        }
        if let Some(ep) = &p.ep[side]
            && p.down_at[side].is_none()
            && let Some(cause) = ep.disconnect_cause()
        {
            p.down_at[side] = Some(now);
            p.dir[side].sender_done = true;
            let cause = Some(cause);
            sim.note(0xd0 ^ u64::from(tag) << 8 ^ side as u64);
            check_cause(p, side, cause, dead)?;
        }
    }
    // The Done ending: a side closes once it sent all and got all of the other's.
    if p.ending == Ending::Done {
        for side in 0..2 {
            let from = 1 - side;
            if p.closed[side].is_none()
                && p.down_at[side].is_none()
                && p.dir[side].sent >= p.dir[side].goal
                && p.dir[from].got >= p.dir[from].goal
            {
                close(sim, p, side);
            }
        }
    }
    // What must hold once a side's endpoint is down and drained.
    for side in 0..2 {
        let from = 1 - side;
        if let Some(DisconnectCause::PeerClosed) = &p.dir[from].ended {
            let d = &p.dir[from];
            if d.got != d.sent {
                return Err(format!(
                    "stream {}: the peer closed in order after {} messages, {} delivered",
                    tag * 2 + from as u32,
                    d.sent,
                    d.got
                ));
            }
        }
    }
    // Work left: a live side whose endpoint is not yet down or not yet drained.
    let busy = (0..2).any(|side| {
        dead != Some(p.node[side])
            && p.ep[side].is_some()
            && (p.down_at[side].is_none() || p.dir[1 - side].ended.is_none())
    });
    if !busy {
        // Both handles go (a dropped one that is already down changes nothing).
        p.ep = [None, None];
    }
    Ok(busy)
}

/// Side `side` closes: `start_close`, or (one time in three) by dropping its handle, after
/// which it no longer reads.
fn close(sim: &mut Sim, p: &mut Pair, side: usize) {
    if p.closed[side].is_some() || p.ep[side].is_none() {
        return;
    }
    p.dir[side].sender_done = true;
    if sim.below(3) == 0 {
        p.ep[side] = None;
        p.closed[side] = Some("dropped");
        // Nobody will read on this side any more.
        p.dir[1 - side]
            .ended
            .get_or_insert(DisconnectCause::LocalClose);
        p.down_at[side] = Some(sim.elapsed());
    } else if let Some(ep) = &p.ep[side] {
        ep.start_close();
        p.closed[side] = Some("start_close");
    }
    sim.note(0xc105e ^ side as u64);
}

/// The cause an endpoint went down with must fit what happened to it.
fn check_cause(
    p: &Pair,
    side: usize,
    cause: Option<DisconnectCause>,
    dead: Option<usize>,
) -> Result<(), String> {
    let peer_dead = dead == Some(p.node[1 - side]);
    let ok = match &cause {
        None => false,
        Some(DisconnectCause::LocalClose) => p.closed[side].is_some(),
        // (The closing side hears the peer's answering Close: PeerClosed too.)
        Some(DisconnectCause::PeerClosed) => p.closed.iter().any(Option::is_some),
        Some(DisconnectCause::PeerUnreachable(_) | DisconnectCause::TransportError(_)) => {
            peer_dead || p.closed.iter().any(Option::is_some)
        }
        Some(DisconnectCause::PeerAborted) => p.closed[1 - side].is_some(),
        Some(_) => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "endpoint on context {} went down with {cause:?} (closed: {:?}, dead context: \
             {dead:?})",
            p.node[side], p.closed
        ))
    }
}

fn describe(pairs: &[Pair]) -> String {
    pairs
        .iter()
        .map(|p| {
            format!(
                "[{:?} {:?}: {:?} closed {:?} down {:?} up {:?}]",
                p.node,
                p.ending,
                p.dir
                    .iter()
                    .map(|d| (d.sent, d.goal, d.got, d.ended.clone()))
                    .collect::<Vec<_>>(),
                p.closed,
                p.down_at,
                p.ep.iter()
                    .map(|e| e.as_ref().map(Endpoint::is_connected))
                    .collect::<Vec<_>>()
            )
        })
        .collect()
}
