//! Unit tests of a group's members over a perfect (or deliberately lossy) in-memory net.

use std::time::{Duration, Instant};

use super::wire::{Header, group_id};
use super::{Dest, McastConfig, McastEvent, Member};
use crate::seq::Seq;

/// (One message per datagram: the tests lose datagrams one by one.)
fn cfg() -> McastConfig {
    McastConfig {
        group: group_id("test"),
        max_datagram: 512,
        pack_max: 0,
        ..McastConfig::default()
    }
}

fn members(cfg: &McastConfig, n: u32, now: Instant) -> Vec<Member> {
    (0..n)
        .map(|i| Member::new(cfg.clone(), 10 + i, 1000 + i, Seq(i * 77), now))
        .collect()
}

/// Moves everything members have to send, dropping the copies `lose` says; returns how
/// many datagrams were sent.
fn pump(
    ms: &mut [Member],
    now: Instant,
    lose: &mut dyn FnMut(usize, usize, &Header) -> bool,
) -> usize {
    let mut buf = vec![0u8; 4096];
    let mut sent = 0;
    loop {
        let mut moved = false;
        for i in 0..ms.len() {
            while let Some((dest, n)) = ms[i].poll_transmit(now, &mut buf) {
                moved = true;
                sent += 1;
                let d = buf[..n].to_vec();
                let (h, p) = Header::parse(&d).expect("our own datagram parses");
                for (j, mj) in ms.iter_mut().enumerate() {
                    let to_j = match dest {
                        Dest::Group => j != i,
                        Dest::Member(m) => mj.id() == m,
                    };
                    if to_j && !lose(i, j, &h) {
                        mj.handle_datagram(now, &h, p);
                    }
                }
            }
        }
        if !moved {
            return sent;
        }
    }
}

fn drain(m: &mut Member) -> Vec<(u32, Vec<u8>)> {
    std::iter::from_fn(|| m.recv()).collect()
}

#[test]
fn one_loss_seen_by_every_member_is_repaired_once() {
    let cfg = cfg();
    let t0 = Instant::now();
    let mut ms = members(&cfg, 5, t0);
    pump(&mut ms, t0, &mut |_, _, _| false);
    for i in 0..20u32 {
        ms[0].publish(&i.to_be_bytes()).unwrap();
    }
    // The publisher's 6th data datagram reaches nobody.
    let mut data = 0;
    let lost_seq = std::cell::Cell::new(None);
    pump(&mut ms, t0, &mut |i, _, h| {
        if i == 0 && h.kind == super::wire::Kind::Data {
            if lost_seq.get().is_none() {
                data += 1;
                if data == 6 * 4 {
                    lost_seq.set(Some(h.seq));
                }
            }
            return lost_seq.get() == Some(h.seq);
        }
        false
    });
    assert!(lost_seq.get().is_some());
    // Time passes: the members ask (after their random delays), the publisher repairs.
    let mut now = t0;
    for _ in 0..200 {
        now += Duration::from_micros(100);
        for m in &mut ms {
            m.handle_timeout(now);
        }
        pump(&mut ms, now, &mut |_, _, _| false);
    }
    for m in ms.iter_mut().skip(1) {
        let got: Vec<u32> = drain(m)
            .into_iter()
            .map(|(p, b)| {
                assert_eq!(p, 10);
                u32::from_be_bytes(b[..4].try_into().unwrap())
            })
            .collect();
        assert_eq!(got, (0..20).collect::<Vec<_>>());
    }
    // Some asked, the others heard them (or the repair) first; one repair served all.
    let asked: u64 = ms.iter().map(|m| m.stats().naks_sent).sum();
    assert!((1..4).contains(&asked), "{asked} requests for one loss");
    assert_eq!(ms[0].stats().repairs_sent, 1, "one repair for four members");
}

#[test]
fn an_unreliable_group_skips_what_it_lost_and_says_so() {
    let cfg = McastConfig {
        reliable: false,
        window: 4,
        ..cfg()
    };
    let t0 = Instant::now();
    let mut ms = members(&cfg, 2, t0);
    pump(&mut ms, t0, &mut |_, _, _| false);
    for i in 0..12u32 {
        ms[0].publish(&i.to_be_bytes()).unwrap();
    }
    // The 3rd to 8th datagrams are lost: more than the window the publisher keeps.
    let mut k = 0;
    pump(&mut ms, t0, &mut |_, _, h| {
        if h.kind == super::wire::Kind::Data {
            k += 1;
            return (3..=8).contains(&k);
        }
        false
    });
    // What cannot come any more is given up on at once; the last gap after a short wait.
    let later = t0 + cfg.nak_delay + Duration::from_millis(1);
    ms[1].handle_timeout(later);
    let got: Vec<u32> = drain(&mut ms[1])
        .into_iter()
        .map(|(_, b)| u32::from_be_bytes(b[..4].try_into().unwrap()))
        .collect();
    assert_eq!(got, vec![0, 1, 8, 9, 10, 11]);
    let lost: u64 = std::iter::from_fn(|| ms[1].poll_event())
        .filter_map(|e| match e {
            McastEvent::Lost { datagrams, .. } => Some(datagrams),
            _ => None,
        })
        .sum();
    assert_eq!(lost, 6);
    assert_eq!(ms[1].stats().naks_sent, 0);
}

#[test]
fn a_member_that_leaves_is_forgotten_and_reported() {
    let cfg = cfg();
    let t0 = Instant::now();
    let mut ms = members(&cfg, 3, t0);
    pump(&mut ms, t0, &mut |_, _, _| false);
    ms[1].publish(b"hello").unwrap();
    pump(&mut ms, t0, &mut |_, _, _| false);
    assert_eq!(ms[1].receivers(), 2);
    assert!(ms[1].paces(12));
    ms[2].leave();
    ms[1].leave();
    pump(&mut ms, t0, &mut |_, _, _| false);
    assert_eq!(
        ms[1].publish(b"late"),
        Err(crate::session::SendError::Closed)
    );
    let events: Vec<McastEvent> = std::iter::from_fn(|| ms[0].poll_event()).collect();
    assert!(events.contains(&McastEvent::PublisherGone {
        publisher: 11,
        why: "left the group".into()
    }));
    assert_eq!(drain(&mut ms[0]), vec![]);
}

#[test]
fn foreign_and_forged_datagrams_are_refused() {
    let cfg = cfg();
    let t0 = Instant::now();
    let mut ms = members(&cfg, 2, t0);
    let mut other = Member::new(
        McastConfig {
            group: group_id("other"),
            ..cfg.clone()
        },
        99,
        1,
        Seq(0),
        t0,
    );
    other.publish(b"not yours").unwrap();
    let mut buf = vec![0u8; 4096];
    while let Some((_, n)) = other.poll_transmit(t0, &mut buf) {
        let (h, p) = Header::parse(&buf[..n]).unwrap();
        ms[0].handle_datagram(t0, &h, p);
    }
    // A datagram of member 11's stream sent by member 10's address (forged source).
    let forged = Header {
        kind: super::wire::Kind::Heartbeat,
        flags: 0,
        group: cfg.group,
        source: 10,
        stream: 11,
        seq: Seq(5),
        aux: 5,
        epoch: 1,
        len: 0,
    };
    ms[0].handle_datagram(t0, &forged, &[]);
    ms[1].handle_datagram(t0, &forged, &[]);
    assert!(ms[0].stats().refused >= 2, "{:?}", ms[0].stats());
    assert!(ms[1].stats().refused >= 1, "{:?}", ms[1].stats());
    assert!(std::iter::from_fn(|| ms[0].poll_event()).next().is_none());
}

#[test]
fn a_publisher_is_flushed_once_every_member_took_everything() {
    let cfg = cfg();
    let t0 = Instant::now();
    let mut ms = members(&cfg, 3, t0);
    pump(&mut ms, t0, &mut |_, _, _| false);
    assert!(ms[0].flushed(), "nothing published: flushed");
    for i in 0..10u32 {
        ms[0].publish(&i.to_be_bytes()).unwrap();
    }
    assert!(!ms[0].flushed());
    pump(&mut ms, t0, &mut |_, _, _| false);
    // Delivered, not taken by member 2's application yet: statuses say so.
    assert_eq!(drain(&mut ms[1]).len(), 10);
    let t1 = t0 + cfg.status_interval * 2;
    for m in &mut ms {
        m.handle_timeout(t1);
    }
    pump(&mut ms, t1, &mut |_, _, _| false);
    assert!(!ms[0].flushed(), "member 2 has not taken its messages");
    assert_eq!(drain(&mut ms[2]).len(), 10);
    let t2 = t1 + cfg.status_interval * 2;
    for m in &mut ms {
        m.handle_timeout(t2);
    }
    pump(&mut ms, t2, &mut |_, _, _| false);
    assert!(ms[0].flushed());
}

#[test]
fn a_late_joiner_whose_start_moved_on_has_lost_nothing() {
    let cfg = McastConfig { window: 8, ..cfg() };
    let t0 = Instant::now();
    let mut ms = members(&cfg, 2, t0);
    pump(&mut ms, t0, &mut |_, _, _| false);
    for i in 0..30u32 {
        ms[0].publish(&i.to_be_bytes()).unwrap();
    }
    let mut taken = 0;
    let mut t = t0;
    for _ in 0..40 {
        pump(&mut ms, t, &mut |_, _, _| false);
        taken += drain(&mut ms[1]).len();
        t += cfg.status_interval;
        for m in ms.iter_mut() {
            m.handle_timeout(t);
        }
    }
    assert_eq!(taken, 30);
    // A newcomer hears the stream first at a datagram far from the oldest kept; the
    // publisher goes on (it does not wait for a member it has not heard of) and the floor
    // passes the newcomer's start before any repair comes.
    // (The newcomer never speaks: the publisher does not know of it.)
    let mut late = Member::new(cfg.clone(), 99, 5, Seq(0), t0);
    let mut buf = vec![0u8; 4096];
    let mut missed_one = false;
    for i in 30..60u32 {
        ms[0].publish(&i.to_be_bytes()).unwrap();
        for _ in 0..4 {
            t += cfg.status_interval;
            for m in ms.iter_mut() {
                m.handle_timeout(t);
            }
            while let Some((_, n)) = ms[0].poll_transmit(t, &mut buf) {
                let (h, p) = Header::parse(&buf[..n]).unwrap();
                // The newcomer misses the first data datagram it hears of.
                if h.kind == super::wire::Kind::Data && !missed_one {
                    missed_one = true;
                } else {
                    late.handle_datagram(t, &h, p);
                }
                ms[1].handle_datagram(t, &h, p);
            }
            drain(&mut ms[1]);
            while let Some((_, n)) = ms[1].poll_transmit(t, &mut buf) {
                let (h, p) = Header::parse(&buf[..n]).unwrap();
                ms[0].handle_datagram(t, &h, p);
            }
        }
    }
    // Now the newcomer speaks: it asks for what it misses from where it stands.
    ms.push(late);
    let mut got = Vec::new();
    for _ in 0..20 {
        t += cfg.status_interval;
        for m in ms.iter_mut() {
            m.handle_timeout(t);
        }
        pump(&mut ms, t, &mut |_, _, _| false);
        drain(&mut ms[1]);
        got.extend(drain(&mut ms[2]));
    }
    let mut late = ms.pop().unwrap();
    assert!(!got.is_empty(), "{late:#?}");
    let firsts: Vec<u32> = got
        .iter()
        .map(|(_, m)| u32::from_be_bytes(m[..4].try_into().unwrap()))
        .collect();
    let start = firsts[0];
    let end = start + firsts.len() as u32;
    assert_eq!(firsts, (start..end).collect::<Vec<_>>(), "a gapless run");
    assert!(start > 31, "it started where the publisher was ({start})");
    assert_eq!(late.stats().lost, 0, "its start moved on: nothing lost");
    assert!(
        !std::iter::from_fn(|| late.poll_event()).any(|e| matches!(e, McastEvent::Lost { .. })),
        "no loss reported"
    );
}
