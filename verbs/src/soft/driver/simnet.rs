//! A simulated network for soft devices: no sockets, no engine thread, a virtual clock.
//!
//! Soft devices opened on a [`SimNet`] (`DeviceOptions::with_sim`) hand the packets they send
//! to the net instead of a UDP socket; the net holds them on a seeded link (latency, jitter
//! that reorders, loss, duplication, corruption) and delivers them when whoever drives the
//! simulation moves the virtual clock past their arrival ([`SimNet::advance_to`]). The
//! devices' timers (retransmission, RNR waits, held ACKs and posts) run on the same clock
//! and are part of [`SimNet::next_event`]. Nothing happens between two calls: a simulation
//! that runs on one thread, with its randomness seeded ([`crate::os::seed_thread_random`],
//! which [`SimNet::new`] does), replays exactly from its seed.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use super::Shared;
use crate::error::VerbsError;
use crate::os::Clock;
use crate::soft::engine::Rng;

/// Virtual time at which a net starts (not 0, which the driver reads as "never").
const START_NS: u64 = 1_000_000;

/// How a simulated link treats every packet (each direction, each packet drawn on its own).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimLink {
    /// Fixed one-way delay.
    pub latency: Duration,
    /// Extra delay drawn uniformly from `0..=jitter` per packet: packets overtake each
    /// other when it exceeds their spacing.
    pub jitter: Duration,
    /// Probability that a packet is lost.
    pub loss: f64,
    /// Probability that a packet (not lost) arrives twice, each copy with its own delay.
    pub duplicate: f64,
    /// Probability that a copy arrives with one bit flipped (the ICRC check drops it).
    pub corrupt: f64,
}

impl Default for SimLink {
    /// A clean link with 5 µs latency.
    fn default() -> Self {
        Self {
            latency: Duration::from_micros(5),
            jitter: Duration::ZERO,
            loss: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
        }
    }
}

/// What a net did with the packets it was given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Packets the devices sent.
    pub sent: u64,
    /// Packets (copies) handed to a device.
    pub delivered: u64,
    /// Packets lost by the link.
    pub lost: u64,
    /// Extra copies made by the link.
    pub duplicated: u64,
    /// Copies with a bit flipped.
    pub corrupted: u64,
    /// Packets dropped because their source or destination host was down, or nobody had
    /// the destination address.
    pub unroutable: u64,
}

/// One packet in flight.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct InFlight {
    at: u64,
    seq: u64,
    src: SocketAddr,
    dst: SocketAddr,
    data: Vec<u8>,
}

#[derive(Debug)]
struct NetState {
    link: SimLink,
    rng: Rng,
    seq: u64,
    queue: BinaryHeap<Reverse<InFlight>>,
    /// Devices by port address: (address, device, port index).
    hosts: Vec<(SocketAddr, Weak<Shared>, usize)>,
    /// Hosts (IP addresses) that are down: nothing leaves or reaches them.
    down: Vec<IpAddr>,
    stats: SimStats,
}

#[derive(Debug)]
struct NetInner {
    clock: Clock,
    state: Mutex<NetState>,
}

/// A simulated network on a virtual clock (see the module docs). Cheap to clone.
#[derive(Debug, Clone)]
pub struct SimNet {
    inner: Arc<NetInner>,
}

impl SimNet {
    /// A net whose link behaviour is drawn from `seed`. Also seeds the calling thread's
    /// randomness ([`crate::os::seed_thread_random`]) with `seed`, so that the devices and
    /// the layers above created on this thread draw their keys, PSNs and identifiers from
    /// it: run the simulation on this thread.
    pub fn new(seed: u64, link: SimLink) -> Self {
        crate::os::seed_thread_random(Some(seed ^ 0x5eed_5eed_5eed_5eed));
        let clock = Clock::new_virtual();
        clock.advance_to(START_NS);
        Self {
            inner: Arc::new(NetInner {
                clock,
                state: Mutex::new(NetState {
                    link,
                    rng: Rng::new(seed),
                    seq: 0,
                    queue: BinaryHeap::new(),
                    hosts: Vec::new(),
                    down: Vec::new(),
                    stats: SimStats::default(),
                }),
            }),
        }
    }

    /// The net's virtual clock (every device on the net reads it).
    pub fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    /// Virtual time since the net started.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.now_ns() - START_NS)
    }

    /// Virtual nanoseconds on the net's clock.
    pub(crate) fn now_ns(&self) -> u64 {
        self.inner.clock.virtual_nanos().unwrap_or(START_NS)
    }

    /// Changes the link behaviour from now on (packets in flight keep their fate).
    pub fn set_link(&self, link: SimLink) {
        self.inner.state.lock().link = link;
    }

    /// Takes host `ip` down (`true`: every packet from or to it is dropped, including those
    /// in flight, as when a machine dies or is cut off) or brings it back.
    pub fn set_host_down(&self, ip: IpAddr, down: bool) {
        let mut st = self.inner.state.lock();
        st.down.retain(|d| *d != ip);
        if down {
            st.down.push(ip);
        }
    }

    /// Counters.
    pub fn stats(&self) -> SimStats {
        self.inner.state.lock().stats
    }

    /// Packets in flight.
    pub fn in_flight(&self) -> usize {
        self.inner.state.lock().queue.len()
    }

    /// When something next happens on the net (a packet arrives, a device timer expires),
    /// as an instant of [`clock`](Self::clock); `None` when nothing is pending.
    pub fn next_event(&self) -> Option<std::time::Instant> {
        let (pkt, devices) = {
            let st = self.inner.state.lock();
            let pkt = st.queue.peek().map(|Reverse(p)| p.at);
            (pkt, Self::devices(&st))
        };
        let timers = devices.iter().filter_map(|d| d.sim_deadline()).min();
        let next = match (pkt, timers) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }?;
        Some(self.inner.clock.instant_at(next.max(self.now_ns())))
    }

    /// Moves the clock to `t` (never backwards), delivering in order every packet that
    /// arrives by then and running the devices' timers as they come due. Returns the
    /// number of packets delivered.
    pub fn advance_to(&self, t: std::time::Instant) -> usize {
        let target = self
            .inner
            .clock
            .nanos_of(t)
            .unwrap_or(START_NS)
            .max(self.now_ns());
        let mut delivered = 0;
        // Rounds that moved neither the clock nor a packet: a timer that stays due after it
        // ran would spin here for ever.
        let mut stalled = 0;
        let mut last = (self.now_ns(), u64::MAX);
        loop {
            // The next thing before `target`: a packet or a device timer, in time order.
            let (pkt_at, devices) = {
                let st = self.inner.state.lock();
                (st.queue.peek().map(|Reverse(p)| p.at), Self::devices(&st))
            };
            let timer_at = devices.iter().filter_map(|d| d.sim_deadline()).min();
            let next = match (pkt_at, timer_at) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => match a.or(b) {
                    Some(x) => x,
                    None => break,
                },
            };
            if next > target {
                break;
            }
            if (next, pkt_at.unwrap_or(u64::MAX)) == last {
                stalled += 1;
                if stalled > 1_000 {
                    tracing::warn!(
                        at = next,
                        "simulated net: a device timer stays due; moving on"
                    );
                    break;
                }
            } else {
                stalled = 0;
                last = (next, pkt_at.unwrap_or(u64::MAX));
            }
            self.inner.clock.advance_to(next);
            let now = self.now_ns();
            // Every packet due now, then an idle look by each device (held ACKs, timers).
            while let Some((dev, port, src, dst, data)) = self.pop_due(now) {
                dev.sim_deliver(port, src, dst.ip(), &data);
                delivered += 1;
            }
            for d in &devices {
                d.sim_idle(now);
            }
        }
        self.inner.clock.advance_to(target);
        let now = self.now_ns();
        // (Collected before the calls: a device calls back into the net when it sends.)
        let devices = Self::devices(&self.inner.state.lock());
        for d in &devices {
            d.sim_idle(now);
        }
        delivered
    }

    /// The live devices on the net, each once.
    fn devices(st: &NetState) -> Vec<Arc<Shared>> {
        let mut out: Vec<Arc<Shared>> = Vec::new();
        for (_, w, _) in &st.hosts {
            if let Some(d) = w.upgrade()
                && !out.iter().any(|o| Arc::ptr_eq(o, &d))
            {
                out.push(d);
            }
        }
        out
    }

    /// The next packet due by `now` whose destination exists and is up; others are counted
    /// and dropped.
    #[expect(clippy::type_complexity, reason = "a private tuple")]
    fn pop_due(&self, now: u64) -> Option<(Arc<Shared>, usize, SocketAddr, SocketAddr, Vec<u8>)> {
        let mut st = self.inner.state.lock();
        loop {
            if st.queue.peek().is_none_or(|Reverse(p)| p.at > now) {
                return None;
            }
            let Reverse(p) = st.queue.pop()?;
            if st.down.contains(&p.dst.ip()) || st.down.contains(&p.src.ip()) {
                st.stats.unroutable += 1;
                continue;
            }
            let host = st
                .hosts
                .iter()
                .find(|h| h.0 == p.dst)
                .and_then(|h| Some((h.1.upgrade()?, h.2)));
            match host {
                Some((dev, port)) => {
                    st.stats.delivered += 1;
                    return Some((dev, port, p.src, p.dst, p.data));
                }
                None => st.stats.unroutable += 1,
            }
        }
    }

    /// Puts a packet a device sent on the link.
    pub(crate) fn send(&self, src: SocketAddr, dst: SocketAddr, data: &[u8]) {
        let now = self.now_ns();
        let mut st = self.inner.state.lock();
        st.stats.sent += 1;
        if st.down.contains(&src.ip()) {
            st.stats.unroutable += 1;
            return;
        }
        let link = st.link;
        if st.rng.next_f64() < link.loss {
            st.stats.lost += 1;
            return;
        }
        let copies = if st.rng.next_f64() < link.duplicate {
            st.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut pkt = data.to_vec();
            if !pkt.is_empty() && st.rng.next_f64() < link.corrupt {
                st.stats.corrupted += 1;
                let bit = st.rng.below(pkt.len() as u64 * 8);
                if let Some(b) = pkt.get_mut((bit / 8) as usize) {
                    *b ^= 1 << (bit % 8);
                }
            }
            let jitter = link.jitter.as_nanos().min(u128::from(u64::MAX / 4)) as u64;
            let delay = link.latency.as_nanos().min(u128::from(u64::MAX / 4)) as u64
                + st.rng.below(jitter.saturating_add(1));
            st.seq += 1;
            let seq = st.seq;
            st.queue.push(Reverse(InFlight {
                at: now + delay.max(1),
                seq,
                src,
                dst,
                data: pkt,
            }));
        }
    }

    /// Registers a device's ports; an address already on the net is refused.
    pub(crate) fn attach(&self, dev: &Arc<Shared>, addrs: &[SocketAddr]) -> Result<(), VerbsError> {
        let mut st = self.inner.state.lock();
        st.hosts.retain(|h| h.1.strong_count() > 0);
        for a in addrs {
            if st.hosts.iter().any(|h| h.0 == *a) {
                return Err(VerbsError::InvalidArgument(format!(
                    "address {a} is already on this simulated net"
                )));
            }
        }
        for (port, a) in addrs.iter().enumerate() {
            st.hosts.push((*a, Arc::downgrade(dev), port));
        }
        Ok(())
    }
}

impl Shared {
    /// Hands a packet from the net to the engine (as a socket read would).
    fn sim_deliver(&self, port: usize, src: SocketAddr, dst: IpAddr, data: &[u8]) {
        let mut nic = self.nic.lock();
        let now = self.now();
        if let Some(p) = super::pcap() {
            let to = SocketAddr::new(dst, crate::soft::wire::ROCE_UDP_PORT);
            let _ = p.lock().write_frame(super::clock::wall(), src, to, data);
        }
        match &self.faults {
            Some(f) => {
                let mut f = f.lock();
                f.handle_frame(now, (port, src, dst), data);
                while let Some(((port, src, dst), frame)) = f.poll_frame(now) {
                    nic.handle_datagram(now, port, src, dst, &frame);
                }
            }
            None => nic.handle_datagram(now, port, src, dst, data),
        }
        self.flush(nic, now);
    }

    /// What the driver does when its sockets are empty: release held ACKs, run due timers,
    /// send held posts whose time is up.
    fn sim_idle(&self, now: u64) {
        if self.doorbell.deadline().is_some_and(|t| t <= now) {
            self.flush_held();
        }
        let _ = self.drain_at(now);
    }

    /// The device's next deadline on the net's clock: engine timers, delayed fault-injected
    /// frames and held posts.
    fn sim_deadline(&self) -> Option<u64> {
        let t = self.next_deadline();
        match (t, self.doorbell.deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}
