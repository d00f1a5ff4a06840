//! Shared receive queues on the simulated link: many RC QPs on one SRQ, routing by QP
//! number, the limit event, last-WQE-reached, and SRQ under loss.

use super::*;
use crate::soft::engine::{AsyncEvent, QpConfig};

/// `n` RC QPs on NIC 0, each connected to a QP on NIC 1 that takes its receives from one
/// SRQ. Returns (senders, receivers' QPNs, the SRQ, NIC 1's CQ).
fn srq_fan_in(
    sim: &mut Sim,
    n: usize,
) -> (Vec<End>, Vec<Qpn>, u32, u32, Arc<RegisteredMemory>, u32) {
    let access = AccessFlags::LOCAL_WRITE;
    let pd1 = sim.nics[1].alloc_pd();
    let cq1 = sim.nics[1].create_cq(1 << 16);
    let srq = sim.nics[1].create_srq(pd1, 256, 2).unwrap();
    let rmem = Arc::new(RegisteredMemory::new(256 * 512).unwrap());
    let rkey = sim.nics[1].reg_mr(pd1, rmem.clone(), access);
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for k in 0..n {
        let n0 = &mut sim.nics[0];
        let pd = n0.alloc_pd();
        let cq = n0.create_cq(4096);
        let qpn = n0.create_qp(&QpConfig::rc(pd, cq)).unwrap();
        let mr = Arc::new(RegisteredMemory::new(4096).unwrap());
        let key = n0.reg_mr(pd, mr.clone(), access);
        let rq = sim.nics[1]
            .create_qp(&QpConfig {
                srq: Some(srq),
                ..QpConfig::rc(pd1, cq1)
            })
            .unwrap();
        for (i, me, peer, ip) in [
            (0, qpn, rq, sim.addrs[1].ip()),
            (1, rq, qpn, sim.addrs[0].ip()),
        ] {
            let psn = k as u32 * 10;
            for (a, m) in rc_attrs(peer, ip, psn, psn, Mtu::Mtu256) {
                sim.nics[i].modify_qp(sim.now, me, &a, m).unwrap();
            }
        }
        senders.push(End {
            pd,
            cq,
            qpn,
            mr,
            key,
        });
        receivers.push(rq);
    }
    (senders, receivers, srq, cq1, rmem, rkey)
}

fn post_srq(
    sim: &mut Sim,
    srq: u32,
    mem: &Arc<RegisteredMemory>,
    key: u32,
    ids: std::ops::Range<u64>,
) {
    for id in ids {
        let s = [Sge {
            addr: mem.addr() + (id % 256) * 512,
            length: 512,
            lkey: crate::types::Lkey(key),
        }];
        sim.nics[1]
            .post_srq_recv(srq, &RecvWr::new(id, &s))
            .unwrap();
    }
}

fn events(sim: &mut Sim, i: usize) -> Vec<AsyncEvent> {
    let mut v = Vec::new();
    while let Some(e) = sim.nics[i].poll_event() {
        v.push(e);
    }
    v
}

#[test]
fn eight_qps_share_one_srq_and_completions_name_the_qp() {
    let mut sim = Sim::new(21, LinkCfg::clean());
    let (senders, receivers, srq, cq1, rmem, rkey) = srq_fan_in(&mut sim, 8);
    post_srq(&mut sim, srq, &rmem, rkey, 0..64);
    sim.nics[1].modify_srq(srq, None, Some(16)).unwrap();
    // Each sender sends 5 messages tagged with its index.
    for (k, e) in senders.iter().enumerate() {
        for m in 0..5u8 {
            e.mr.write(m as usize * 64, &[k as u8, m, 0xAA]);
            let s = [sge(e, m as usize * 64, 3)];
            sim.nics[0]
                .post_send(sim.now, e.qpn, &SendWr::send(m as u64, &s).signaled())
                .unwrap();
        }
    }
    let mut wcs = Vec::new();
    sim.run_until(100_000, |s| {
        drain(s, 1, cq1, &mut wcs);
        wcs.len() >= 40
    });
    for wc in &wcs {
        assert_eq!(wc.status, WcStatus::Success);
        let k = receivers
            .iter()
            .position(|q| *q == wc.qp_num)
            .expect("a receiving QP");
        let mut b = [0u8; 3];
        rmem.read((wc.wr_id % 256) as usize * 512, &mut b);
        assert_eq!(b[0] as usize, k, "completion routed to the wrong QP");
        assert_eq!(b[2], 0xAA);
    }
    // 40 of 64 taken: 24 left, above the limit of 16, so no event yet.
    assert!(
        events(&mut sim, 1)
            .iter()
            .all(|e| !matches!(e, AsyncEvent::SrqLimitReached(_)))
    );
    // 10 more: 14 left < 16: exactly one event, and the limit reads 0 afterwards.
    for (k, e) in senders.iter().take(2).enumerate() {
        for m in 0..5u8 {
            e.mr.write(m as usize * 64, &[k as u8, m, 0xAA]);
            let s = [sge(e, m as usize * 64, 3)];
            sim.nics[0]
                .post_send(sim.now, e.qpn, &SendWr::send(m as u64, &s).signaled())
                .unwrap();
        }
    }
    sim.run_until(100_000, |s| {
        drain(s, 1, cq1, &mut wcs);
        wcs.len() >= 50
    });
    let ev = events(&mut sim, 1);
    let limits: Vec<_> = ev
        .iter()
        .filter(|e| matches!(e, AsyncEvent::SrqLimitReached(s) if *s == srq))
        .collect();
    assert_eq!(limits.len(), 1, "{ev:?}");
    assert_eq!(sim.nics[1].query_srq(srq).unwrap().srq_limit, 0);
    // Draining further does not fire again until re-armed.
    for e in senders.iter().take(1) {
        let s = [sge(e, 0, 3)];
        sim.nics[0]
            .post_send(sim.now, e.qpn, &SendWr::send(99, &s).signaled())
            .unwrap();
    }
    sim.run_until(100_000, |s| {
        drain(s, 1, cq1, &mut wcs);
        wcs.len() >= 51
    });
    assert!(events(&mut sim, 1).is_empty());
    // 13 left + 10 posted = 23; armed at 23, the next message leaves 22 < 23.
    post_srq(&mut sim, srq, &rmem, rkey, 100..110);
    assert_eq!(sim.nics[1].query_srq(srq).unwrap().posted, Some(23));
    sim.nics[1].modify_srq(srq, None, Some(23)).unwrap();
    let e = &senders[0];
    let s = [sge(e, 0, 3)];
    sim.nics[0]
        .post_send(sim.now, e.qpn, &SendWr::send(100, &s).signaled())
        .unwrap();
    sim.run_until(100_000, |s| {
        drain(s, 1, cq1, &mut wcs);
        wcs.len() >= 52
    });
    assert_eq!(events(&mut sim, 1), vec![AsyncEvent::SrqLimitReached(srq)]);
    // A QP on an SRQ going to ERR raises last-WQE-reached; posting to its own RQ is refused.
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    sim.nics[1]
        .modify_qp(sim.now, receivers[3], &err, M::STATE)
        .unwrap();
    assert_eq!(
        events(&mut sim, 1),
        vec![AsyncEvent::QpLastWqeReached(receivers[3])]
    );
    let r = [Sge::default()];
    assert!(
        sim.nics[1]
            .post_recv(receivers[3], &RecvWr::new(1, &r))
            .is_err()
    );
    // The SRQ cannot be destroyed while QPs use it.
    assert!(sim.nics[1].destroy_srq(srq).is_err());
}

#[test]
fn srq_under_loss_delivers_everything_exactly_once() {
    for seed in 300..310 {
        let link = LinkCfg {
            latency: 5_000,
            jitter: 15_000,
            drop: 0.1,
            dup: 0.05,
            corrupt: 0.0,
        };
        let mut sim = Sim::new(seed, link);
        for n in &mut sim.nics {
            n.set_infinite_retry_at_7(true);
        }
        let (senders, receivers, srq, cq1, rmem, rkey) = srq_fan_in(&mut sim, 4);
        post_srq(&mut sim, srq, &rmem, rkey, 0..200);
        for m in 0..40u8 {
            for (k, e) in senders.iter().enumerate() {
                // A source buffer must stay untouched until its send completes (a
                // retransmission reads it again), so every message has its own.
                let off = m as usize * 64;
                e.mr.write(off, &[k as u8, m, 0x55]);
                let s = [sge(e, off, 3)];
                sim.nics[0]
                    .post_send(sim.now, e.qpn, &SendWr::send(m as u64, &s).signaled())
                    .unwrap();
            }
            sim.step();
        }
        let mut wcs = Vec::new();
        sim.run_until(2_000_000, |s| {
            drain(s, 1, cq1, &mut wcs);
            wcs.len() >= 160
        });
        // Per QP, messages 0..40 exactly once and in order.
        for (k, q) in receivers.iter().enumerate() {
            let seq: Vec<u8> = wcs
                .iter()
                .filter(|w| w.qp_num == *q)
                .map(|w| {
                    let mut b = [0u8; 3];
                    rmem.read((w.wr_id % 256) as usize * 512, &mut b);
                    assert_eq!(b[0] as usize, k, "seed {seed}");
                    b[1]
                })
                .collect();
            assert_eq!(seq, (0..40u8).collect::<Vec<_>>(), "seed {seed} QP {k}");
        }
    }
}
