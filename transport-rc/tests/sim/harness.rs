//! The simulation's machinery: contexts (a worker and its RC transport each) on soft devices
//! on one simulated net, driven on its virtual clock by one thread, and a trace of what
//! happened whose hash two runs of a seed must agree on.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use rdmx_core::Config;
use rdmx_core::worker::Worker;
use rdmx_rc::RcTransport;
use rdmx_verbs::DeviceOptions;
use rdmx_verbs::soft::engine::Rng;
use rdmx_verbs::soft::{SimLink, SimNet};

/// One context of the simulation.
pub(crate) struct Node {
    pub(crate) w: Worker,
    pub(crate) t: RcTransport,
    pub(crate) ip: IpAddr,
    /// Dead nodes are no longer driven, and the net drops what they send or are sent.
    pub(crate) alive: bool,
    /// Pool bytes in use once the transport was set up (its posted receive buffers).
    pub(crate) baseline_in_use: usize,
}

/// Contexts on a simulated net, and the seeded randomness of the workload.
pub(crate) struct Sim {
    pub(crate) net: SimNet,
    pub(crate) nodes: Vec<Node>,
    pub(crate) rng: Rng,
    pub(crate) steps: u64,
    /// Steps whose clock would not move (a timer already due): a few are normal, many mean
    /// a timer that never stops being due.
    pub(crate) stuck_steps: u64,
    trace: u64,
}

impl Sim {
    /// `n` contexts configured by `cfg` on a net with `link`, everything drawn from `seed`.
    pub(crate) fn new(seed: u64, link: SimLink, cfg: &Config, n: usize) -> Result<Self, String> {
        let net = SimNet::new(seed, link);
        let mut nodes = Vec::new();
        for i in 0..n {
            let mut cfg = cfg.clone();
            cfg.device = format!("soft:10.0.0.{}", i + 1);
            let w = Worker::open(
                &cfg,
                Some(DeviceOptions::default().with_sim(&net)),
                &[cfg.recv_buf_size()],
            )
            .map_err(|e| format!("worker {i}: {e}"))?;
            let t = RcTransport::attach(&w, &cfg, None).map_err(|e| format!("attach {i}: {e}"))?;
            let baseline_in_use = w.pool_stats().in_use_bytes;
            nodes.push(Node {
                w,
                t,
                ip: IpAddr::from([10, 0, 0, i as u8 + 1]),
                alive: true,
                baseline_in_use,
            });
        }
        Ok(Self {
            net,
            nodes,
            rng: Rng::new(seed ^ 0xa5a5_5a5a_0f0f_f0f0),
            steps: 0,
            stuck_steps: 0,
            trace: 0xcbf2_9ce4_8422_2325,
        })
    }

    /// Virtual time since the start.
    pub(crate) fn elapsed(&self) -> Duration {
        self.net.elapsed()
    }

    /// One step: every live context does its background duties (progress, device events,
    /// due timers), then the clock moves to the next event, at most `quantum` ahead (the
    /// application's next look).
    pub(crate) fn step(&mut self, quantum: Duration) {
        let mut next = self.net.next_event();
        for n in self.nodes.iter().filter(|n| n.alive) {
            if let Some(t) = n.w.drive() {
                next = Some(next.map_or(t, |x: Instant| x.min(t)));
            }
        }
        let now = self.net.clock().now();
        let cap = now + quantum;
        let mut t = next.map_or(cap, |t| t.min(cap));
        if t <= now {
            self.stuck_steps += 1;
            t = now + Duration::from_micros(1);
        }
        self.net.advance_to(t);
        self.steps += 1;
    }

    /// Node `i` dies: the net drops everything from and to it, and it is no longer driven.
    pub(crate) fn kill(&mut self, i: usize) {
        self.net.set_host_down(self.nodes[i].ip, true);
        self.nodes[i].alive = false;
        self.note(0xdead ^ i as u64);
    }

    /// A draw in `0..n`.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.rng.below(n)
    }

    /// One of `items`.
    pub(crate) fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.rng.below(items.len() as u64) as usize]
    }

    /// Records `v` in the trace.
    pub(crate) fn note(&mut self, v: u64) {
        for b in v.to_le_bytes() {
            self.trace ^= u64::from(b);
            self.trace = self.trace.wrapping_mul(0x0100_0000_01b3);
        }
    }

    /// The trace's hash, with the net's counters and the time.
    pub(crate) fn trace(&self) -> u64 {
        let s = self.net.stats();
        let mut h = self.trace;
        for v in [
            s.sent,
            s.delivered,
            s.lost,
            s.duplicated,
            self.elapsed().as_nanos() as u64,
        ] {
            h = (h ^ v).wrapping_mul(0x0100_0000_01b3);
        }
        h
    }
}
