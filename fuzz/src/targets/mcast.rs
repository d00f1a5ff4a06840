//! `mcast_wire` and `mcast_member`: the datagrams of multicast groups
//! (`rdmx_ud::mcast::wire::Header::parse`) and the member that consumes them
//! (`rdmx_ud::mcast::Member::handle_datagram`: its subscriber streams, reassembly, repair
//! requests, and its own publisher's statuses, repairs and removals), sans-I/O.

use std::time::{Duration, Instant};

use rdmx_ud::Seq;
use rdmx_ud::mcast::wire::{self, HEADER_LEN, Header, Kind};
use rdmx_ud::mcast::{Dest, McastConfig, Member};

use super::{FnRunner, Runner, Target, numbered};
use crate::records;

pub(crate) const WIRE: Target = Target {
    name: "mcast_wire",
    about: "rdmx-ud multicast datagram header",
    max_alloc: 0,
    max_total: 0,
    max_len: 2048,
    framed: false,
    seeds: wire_seeds,
    runner: wire_runner,
};

pub(crate) const MEMBER: Target = Target {
    name: "mcast_member",
    about: "rdmx-ud multicast Member fed with hostile datagrams (records), with timers",
    // A message being reassembled may reserve up to what its first segment may bring in
    // (64 KiB), whatever length it announces.
    max_alloc: 128 * 1024,
    max_total: 16 << 20,
    max_len: 16 * 1024,
    framed: true,
    seeds: member_seeds,
    runner: member_runner,
};

fn wire_runner() -> Box<dyn Runner> {
    Box::new(FnRunner(run_wire))
}

fn run_wire(input: &[u8]) {
    let _ = wire::is_mcast(input);
    if let Ok((h, payload)) = Header::parse(input) {
        let mut again = [0u8; HEADER_LEN];
        h.write(&mut again);
        assert_eq!(again[..], input[..HEADER_LEN], "header round trip");
        assert_eq!(usize::from(h.len), payload.len());
        if h.kind != Kind::Data {
            assert!(payload.is_empty() && h.flags == 0);
        }
    }
}

fn wire_seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let (mut ms, now) = group();
    exchange(&mut ms, now, &mut |d| out.push(d.to_vec()));
    out.sort();
    out.dedup();
    numbered("datagram", out)
}

// ----------------------------------------------------------------------------- member

const VICTIM: u32 = 10;

fn config() -> McastConfig {
    McastConfig {
        group: wire::group_id("fuzz"),
        max_datagram: 256,
        window: 32,
        pack_max: 48,
        ..McastConfig::default()
    }
}

fn victim(now: Instant) -> Member {
    let mut m = Member::new(config(), VICTIM, 1000, Seq(u32::MAX - 2), now);
    // Its own stream, so that statuses, repair requests and removals reach a publisher.
    for msg in [&b"from the victim"[..], &[3u8; 600][..], b"v"] {
        let _ = m.publish(msg);
    }
    m
}

/// The victim and two other members (the seeds' publishers).
fn group() -> (Vec<Member>, Instant) {
    let now = Instant::now();
    let others = (1..3u32).map(|i| Member::new(config(), VICTIM + i, 1000 + i, Seq(i * 77), now));
    let mut ms = vec![victim(now)];
    ms.extend(others);
    (ms, now)
}

/// The other members publish (small, packed, segmented messages), one leaves; everything
/// moves over a perfect net, and every datagram the victim (member 0) receives goes to
/// `record`.
fn exchange(ms: &mut [Member], now: Instant, record: &mut dyn FnMut(&[u8])) {
    let big: Vec<u8> = (0..2000u32).map(|i| (i * 7) as u8).collect();
    for m in ms.iter_mut().skip(1) {
        for msg in [&b"hi"[..], b"a", b"bb", &big[..], b"last"] {
            let _ = m.publish(msg);
        }
    }
    let mut buf = vec![0u8; 4096];
    let mut t = now;
    for round in 0..100 {
        let mut moved = false;
        if round == 50 {
            ms[2].leave();
        }
        for i in 0..ms.len() {
            while let Some((dest, n)) = ms[i].poll_transmit(t, &mut buf) {
                moved = true;
                let d = buf[..n].to_vec();
                let Ok((h, p)) = Header::parse(&d) else {
                    continue;
                };
                for (j, m) in ms.iter_mut().enumerate() {
                    let to_j = match dest {
                        Dest::Group => j != i,
                        Dest::Member(id) => m.id() == id,
                    };
                    if to_j {
                        if j == 0 {
                            record(&d);
                        }
                        m.handle_datagram(t, &h, p);
                    }
                }
            }
            while ms[i].recv().is_some() {}
        }
        t += Duration::from_millis(1);
        for m in ms.iter_mut() {
            m.handle_timeout(t);
        }
        if !moved && round > 60 {
            break;
        }
    }
}

/// Control bits of a member record.
mod ctrl {
    /// Bits 0-1: how far time moves before the record ([`super::STEPS`]).
    pub(super) const TIME: u8 = 3;
    /// The application takes every message after the record.
    pub(super) const RECV: u8 = 4;
    /// The record is a message the victim publishes, not a datagram.
    pub(super) const PUBLISH: u8 = 8;
    /// The victim leaves the group.
    pub(super) const LEAVE: u8 = 16;
}

const STEPS: [Duration; 4] = [
    Duration::ZERO,
    Duration::from_micros(300),
    Duration::from_millis(30),
    Duration::from_secs(2),
];

struct MemberRunner {
    t0: Instant,
    member: Option<Member>,
    buf: Vec<u8>,
}

fn member_runner() -> Box<dyn Runner> {
    Box::new(MemberRunner {
        t0: Instant::now(),
        member: None,
        buf: vec![0u8; 4096],
    })
}

impl Runner for MemberRunner {
    fn reset(&mut self) {
        let mut m = victim(self.t0);
        // Its first datagrams go out before the others' come in, as when the seeds were
        // recorded.
        drive(&mut m, self.t0, &mut self.buf);
        self.member = Some(m);
    }

    fn run(&mut self, input: &[u8]) {
        let Some(m) = self.member.as_mut() else {
            return;
        };
        let mut now = self.t0;
        for r in records::parse(input) {
            now += STEPS[usize::from(r.ctrl & ctrl::TIME)];
            if r.ctrl & ctrl::PUBLISH != 0 {
                let _ = m.publish(r.data);
            } else if let Ok((h, p)) = Header::parse(r.data) {
                m.handle_datagram(now, &h, p);
            }
            if r.ctrl & ctrl::LEAVE != 0 {
                m.leave();
            }
            if r.ctrl & ctrl::RECV != 0 {
                while m.recv().is_some() {}
            }
            drive(m, now, &mut self.buf);
        }
        for _ in 0..8 {
            let Some(t) = m.poll_timeout() else { break };
            now = now.max(t);
            m.handle_timeout(now);
            drive(m, now, &mut self.buf);
        }
        while m.poll_event().is_some() {}
        let _ = (m.stats(), m.flushed(), m.take_moved(), m.queued_bytes());
    }
}

fn drive(m: &mut Member, now: Instant, buf: &mut [u8]) {
    for _ in 0..64 {
        let Some((_, n)) = m.poll_transmit(now, buf) else {
            break;
        };
        assert!(
            Header::parse(&buf[..n]).is_ok(),
            "the member's own datagram parses"
        );
    }
    if m.poll_timeout().is_some_and(|t| t <= now) {
        m.handle_timeout(now);
    }
    for _ in 0..64 {
        if m.poll_event().is_none() {
            break;
        }
    }
}

fn member_seeds() -> Vec<(String, Vec<u8>)> {
    let (mut ms, now) = group();
    let mut recs = Vec::new();
    exchange(&mut ms, now, &mut |d| recs.push(d.to_vec()));
    let mut out = vec![(
        "exchange".to_owned(),
        records::encode(recs.iter().map(|d| (ctrl::RECV, &d[..]))),
    )];
    out.push((
        "reversed".to_owned(),
        records::encode(recs.iter().rev().map(|d| (ctrl::RECV | 1, &d[..]))),
    ));
    // Half of them, with time passing: repair requests, statuses, timeouts.
    out.push((
        "lossy".to_owned(),
        records::encode(
            recs.iter()
                .enumerate()
                .filter(|(i, _)| i % 2 == 0)
                .map(|(i, d)| ((i % 4) as u8 | ctrl::RECV, &d[..])),
        ),
    ));
    let mut mixed = Vec::new();
    for (i, d) in recs.iter().enumerate() {
        records::push(&mut mixed, 1, d);
        if i % 5 == 0 {
            records::push(&mut mixed, ctrl::PUBLISH | ctrl::RECV, b"published");
        }
    }
    records::push(&mut mixed, ctrl::LEAVE | 2, b"");
    out.push(("mixed".to_owned(), mixed));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recorded datagrams, replayed into a fresh victim, deliver both publishers'
    /// messages.
    #[test]
    fn the_recorded_exchange_replays_cleanly() {
        let t0 = Instant::now();
        let mut m = victim(t0);
        let (name, input) = member_seeds().remove(0);
        assert_eq!(name, "exchange");
        let mut got = 0;
        for r in records::parse(&input) {
            let (h, p) = Header::parse(r.data).expect("a recorded datagram parses");
            m.handle_datagram(t0, &h, p);
            while m.recv().is_some() {
                got += 1;
            }
        }
        assert_eq!(m.stats().refused, 0, "{:?}", m.stats());
        assert_eq!(got, 10);
    }
}
