//! Error paths of the RC engine, on the simulated link.

use super::*;
use crate::error::PostError;
use crate::vocab::QpConfig;

const MS: u64 = 1_000_000;

fn pair(seed: u64) -> (Sim, [End; 2]) {
    let mut sim = Sim::new(seed, LinkCfg::clean());
    let ends = connect(&mut sim, Mtu::Mtu1024, 64 * 1024, [100, 200]);
    (sim, ends)
}

fn wait_wcs(sim: &mut Sim, i: usize, cq: u32, n: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    sim.run_until(1_000_000, |s| {
        drain(s, i, cq, &mut out);
        out.len() >= n
    });
    out
}

fn qp_state(sim: &Sim, i: usize, qpn: Qpn) -> QpState {
    sim.nics[i].query_qp(qpn).unwrap().0.qp_state
}

#[test]
fn bad_rkey_is_remote_access_error_and_both_qps_fail() {
    let (mut sim, [a, b]) = pair(1);
    let s = [sge(&a, 0, 16)];
    let bad = WrOpcode::RdmaWrite {
        remote_addr: b.mr.addr(),
        rkey: Rkey(b.key ^ 0x55),
    };
    sim.nics[0]
        .post_send(sim.now, a.qpn, &SendWr::new(7, bad, &s).signaled())
        .unwrap();
    // A second WR behind it is flushed.
    sim.nics[0]
        .post_send(sim.now, a.qpn, &SendWr::send(8, &s).signaled())
        .unwrap();
    let wcs = wait_wcs(&mut sim, 0, a.cq, 2);
    assert_eq!(wcs[0].wr_id, 7);
    assert_eq!(wcs[0].status, WcStatus::RemAccessErr);
    assert_eq!(wcs[1].status, WcStatus::WrFlushErr);
    assert_eq!(qp_state(&sim, 0, a.qpn), QpState::Err);
    assert_eq!(qp_state(&sim, 1, b.qpn), QpState::Err);
    // Out of bounds with a valid key is an access error too.
    let (mut sim, [a, b]) = pair(2);
    let s = [sge(&a, 0, 16)];
    let oob = WrOpcode::RdmaRead {
        remote_addr: b.mr.addr() + 64 * 1024 - 8,
        rkey: Rkey(b.key),
    };
    sim.nics[0]
        .post_send(sim.now, a.qpn, &SendWr::new(1, oob, &s).signaled())
        .unwrap();
    let wcs = wait_wcs(&mut sim, 0, a.cq, 1);
    assert_eq!(wcs[0].status, WcStatus::RemAccessErr);
}

#[test]
fn posting_in_the_wrong_state_fails() {
    let mut sim = Sim::new(3, LinkCfg::clean());
    let n = &mut sim.nics[0];
    let pd = n.alloc_pd();
    let cq = n.create_cq(16);
    let qpn = n
        .create_qp(&QpConfig {
            cap: QpCap::default(),
            ..QpConfig::rc(pd, cq)
        })
        .unwrap();
    let wr = SendWr::send_inline(1, b"hi");
    assert!(matches!(
        n.post_send(0, qpn, &wr),
        Err(PostError::InvalidState {
            state: QpState::Reset,
            ..
        })
    ));
    let r = n.post_recv(qpn, &RecvWr::new(1, &[]));
    assert!(matches!(r, Err(PostError::InvalidState { .. })));
    let [(init, m), (rtr, rm), _] = rc_attrs(Qpn(99), sim.addrs[1].ip(), 1, 2, Mtu::Mtu1024);
    let n = &mut sim.nics[0];
    n.modify_qp(0, qpn, &init, m).unwrap();
    assert!(matches!(
        n.post_send(0, qpn, &wr),
        Err(PostError::InvalidState { .. })
    ));
    n.post_recv(qpn, &RecvWr::new(1, &[])).unwrap();
    // INIT -> RTS is illegal; RTR without the AV names the missing attribute.
    let e = n.modify_qp(
        0,
        qpn,
        &QpAttr {
            qp_state: QpState::Rts,
            ..QpAttr::default()
        },
        M::STATE,
    );
    assert!(
        matches!(e, Err(crate::VerbsError::IllegalTransition { .. })),
        "{e:?}"
    );
    let e = n.modify_qp(0, qpn, &rtr, rm & !M::AV);
    assert!(
        matches!(
            e,
            Err(crate::VerbsError::MissingAttribute { attr: "AV", .. })
        ),
        "{e:?}"
    );
    n.modify_qp(0, qpn, &rtr, rm).unwrap();
    assert!(matches!(
        n.post_send(0, qpn, &wr),
        Err(PostError::InvalidState { .. })
    ));
}

#[test]
fn receive_buffer_too_small_is_local_length_error() {
    let (mut sim, [a, b]) = pair(4);
    let r = [sge(&b, 0, 100)];
    sim.nics[1].post_recv(b.qpn, &RecvWr::new(5, &r)).unwrap();
    let s = [sge(&a, 0, 3000)];
    sim.nics[0]
        .post_send(sim.now, a.qpn, &SendWr::send(6, &s).signaled())
        .unwrap();
    let rw = wait_wcs(&mut sim, 1, b.cq, 1);
    assert_eq!(rw[0].wr_id, 5);
    assert_eq!(rw[0].status, WcStatus::LocLenErr);
    let sw = wait_wcs(&mut sim, 0, a.cq, 1);
    assert_eq!(sw[0].status, WcStatus::RemInvReqErr);
}

#[test]
fn dead_peer_gives_retry_exceeded_in_bounded_time() {
    let (mut sim, [a, _b]) = pair(5);
    sim.dead[1] = true;
    let start = sim.now;
    let s = [sge(&a, 0, 64)];
    sim.nics[0]
        .post_send(sim.now, a.qpn, &SendWr::send(9, &s).signaled())
        .unwrap();
    let wcs = wait_wcs(&mut sim, 0, a.cq, 1);
    assert_eq!(wcs[0].status, WcStatus::RetryExcErr);
    // timeout 8 = 1.05 ms; 1 + 7 retries.
    let elapsed = sim.now - start;
    assert!((8 * MS..=10 * MS).contains(&elapsed), "took {elapsed} ns");
    assert_eq!(qp_state(&sim, 0, a.qpn), QpState::Err);
    assert!(sim.nics[0].counters().ack_timeouts >= 8);
}

#[test]
fn rnr_then_recovery_once_a_receive_is_posted() {
    let (mut sim, [a, b]) = pair(6);
    let s = [sge(&a, 0, 64)];
    a.mr.write(0, &[0xAB; 64]);
    sim.nics[0]
        .post_send(sim.now, a.qpn, &SendWr::send(1, &s).signaled())
        .unwrap();
    // Let it bounce off a few RNR NAKs (min_rnr_timer 1 = 10 us).
    let until = sim.now + MS;
    sim.run_until(100_000, |s| s.now >= until);
    assert!(sim.nics[0].counters().rnr_naks_received >= 3);
    assert!(sim.nics[1].counters().rnr_naks_sent >= 3);
    let r = [sge(&b, 0, 64)];
    sim.nics[1].post_recv(b.qpn, &RecvWr::new(2, &r)).unwrap();
    let rw = wait_wcs(&mut sim, 1, b.cq, 1);
    assert_eq!(rw[0].status, WcStatus::Success);
    let mut v = [0u8; 64];
    b.mr.read(0, &mut v);
    assert_eq!(v, [0xAB; 64]);
    let sw = wait_wcs(&mut sim, 0, a.cq, 1);
    assert_eq!(sw[0].status, WcStatus::Success);
}

#[test]
fn rnr_retry_exhaustion() {
    let mut sim = Sim::new(7, LinkCfg::clean());
    let [a, _b] = connect(&mut sim, Mtu::Mtu1024, 4096, [1, 2]);
    let rts = QpAttr {
        qp_state: QpState::Rts,
        rnr_retry: 2,
        ..QpAttr::default()
    };
    // Lower rnr_retry through SQD -> RTS is not allowed for RNR_RETRY; use a fresh pair.
    let _ = rts;
    let mut sim = Sim::new(8, LinkCfg::clean());
    let cap = QpCap::default();
    let mut ends = Vec::new();
    for n in &mut sim.nics {
        let pd = n.alloc_pd();
        let cq = n.create_cq(64);
        let qpn = n
            .create_qp(&QpConfig {
                cap,
                ..QpConfig::rc(pd, cq)
            })
            .unwrap();
        let mr = Arc::new(RegisteredMemory::new(4096).unwrap());
        let key = n.reg_mr(pd, mr.clone(), AccessFlags::LOCAL_WRITE);
        ends.push(End {
            pd,
            cq,
            qpn,
            mr,
            key,
        });
    }
    for i in 0..2 {
        let j = 1 - i;
        let mut attrs = rc_attrs(ends[j].qpn, sim.addrs[j].ip(), 10, 10, Mtu::Mtu1024);
        attrs[2].0.rnr_retry = 2;
        for (at, m) in attrs {
            sim.nics[i].modify_qp(sim.now, ends[i].qpn, &at, m).unwrap();
        }
    }
    let s = [sge(&ends[0], 0, 8)];
    sim.nics[0]
        .post_send(sim.now, ends[0].qpn, &SendWr::send(3, &s).signaled())
        .unwrap();
    let wcs = wait_wcs(&mut sim, 0, ends[0].cq, 1);
    assert_eq!(wcs[0].status, WcStatus::RnrRetryExcErr);
    assert_eq!(sim.nics[0].counters().rnr_naks_received, 3);
    let _ = a;
}

#[test]
fn error_state_flushes_receives_and_later_posts() {
    let (mut sim, [a, _b]) = pair(9);
    let r = [sge(&a, 0, 64)];
    sim.nics[0].post_recv(a.qpn, &RecvWr::new(11, &r)).unwrap();
    sim.nics[0].post_recv(a.qpn, &RecvWr::new(12, &r)).unwrap();
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    sim.nics[0]
        .modify_qp(sim.now, a.qpn, &err, M::STATE)
        .unwrap();
    sim.nics[0]
        .post_send(sim.now, a.qpn, &SendWr::send(13, &r).signaled())
        .unwrap();
    let wcs = wait_wcs(&mut sim, 0, a.cq, 3);
    assert!(wcs.iter().all(|w| w.status == WcStatus::WrFlushErr));
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, vec![11, 12, 13]);
}

#[test]
fn misaligned_atomic_and_missing_permission_are_invalid_requests() {
    let (mut sim, [a, b]) = pair(10);
    let s = [sge(&a, 0, 8)];
    let op = WrOpcode::AtomicFetchAdd {
        remote_addr: b.mr.addr() + 4,
        rkey: Rkey(b.key),
        add: 1,
    };
    sim.nics[0]
        .post_send(sim.now, a.qpn, &SendWr::new(1, op, &s).signaled())
        .unwrap();
    let wcs = wait_wcs(&mut sim, 0, a.cq, 1);
    assert_eq!(wcs[0].status, WcStatus::RemInvReqErr);
}

#[test]
fn local_protection_error_for_a_bad_lkey() {
    let (mut sim, [a, _b]) = pair(11);
    let mut s = sge(&a, 0, 8);
    s.lkey = crate::types::Lkey(a.key.wrapping_add(1));
    sim.nics[0]
        .post_send(sim.now, a.qpn, &SendWr::send(1, &[s]).signaled())
        .unwrap();
    let wcs = wait_wcs(&mut sim, 0, a.cq, 1);
    assert_eq!(wcs[0].status, WcStatus::LocProtErr);
    assert_eq!(qp_state(&sim, 0, a.qpn), QpState::Err);
}

#[test]
fn write_with_immediate_and_solicited_flags() {
    let (mut sim, [a, b]) = pair(12);
    let r = [sge(&b, 0, 0)];
    sim.nics[1].post_recv(b.qpn, &RecvWr::new(77, &r)).unwrap();
    a.mr.write(0, &[7u8; 5000]);
    let s = [sge(&a, 0, 5000)];
    let op = WrOpcode::RdmaWriteWithImm {
        remote_addr: b.mr.addr() + 100,
        rkey: Rkey(b.key),
        imm: 0xDEAD_BEEF,
    };
    sim.nics[0]
        .post_send(sim.now, a.qpn, &SendWr::new(1, op, &s).signaled())
        .unwrap();
    let rw = wait_wcs(&mut sim, 1, b.cq, 1);
    assert_eq!(rw[0].opcode, crate::types::WcOpcode::RecvRdmaWithImm);
    assert_eq!(rw[0].imm(), Some(0xDEAD_BEEF));
    assert_eq!(rw[0].byte_len, 5000);
    let mut v = vec![0u8; 5000];
    b.mr.read(100, &mut v);
    assert!(v.iter().all(|&x| x == 7));
}

#[test]
fn fence_waits_for_earlier_reads() {
    let mut sim = Sim::new(
        13,
        LinkCfg {
            latency: 50_000,
            ..LinkCfg::clean()
        },
    );
    let [a, b] = connect(&mut sim, Mtu::Mtu1024, 8192, [5, 6]);
    b.mr.write(0, &[9u8; 8]);
    let d = [sge(&a, 0, 8)];
    let rd = WrOpcode::RdmaRead {
        remote_addr: b.mr.addr(),
        rkey: Rkey(b.key),
    };
    sim.nics[0]
        .post_send(sim.now, a.qpn, &SendWr::new(1, rd, &d).signaled())
        .unwrap();
    // A fenced write of what we just read must carry the read's result.
    let s = [sge(&a, 0, 8)];
    let wr = WrOpcode::RdmaWrite {
        remote_addr: b.mr.addr() + 64,
        rkey: Rkey(b.key),
    };
    let w = SendWr::new(2, wr, &s).signaled().flags(SendFlags::FENCE);
    sim.nics[0].post_send(sim.now, a.qpn, &w).unwrap();
    // Before the read returns, the fenced write must not have gone out.
    sim.flush();
    assert_eq!(sim.nics[0].counters().tx_packets, 1);
    wait_wcs(&mut sim, 0, a.cq, 2);
    let mut v = [0u8; 8];
    b.mr.read(64, &mut v);
    assert_eq!(v, [9u8; 8]);
}

#[test]
fn many_qps_idle_ones_leave_the_timer_set() {
    let mut sim = Sim::new(14, LinkCfg::clean());
    let mut pairs = Vec::new();
    for k in 0..200u32 {
        pairs.push(connect(&mut sim, Mtu::Mtu1024, 256, [k, k + 1000]));
    }
    for (i, [a, b]) in pairs.iter().enumerate() {
        let r = [sge(b, 0, 64)];
        sim.nics[1]
            .post_recv(b.qpn, &RecvWr::new(i as u64, &r))
            .unwrap();
        let s = [sge(a, 0, 64)];
        sim.nics[0]
            .post_send(sim.now, a.qpn, &SendWr::send(i as u64, &s).signaled())
            .unwrap();
    }
    let mut done = 0;
    sim.run_until(100_000, |s| {
        for [a, _] in &pairs {
            let mut out = Vec::new();
            drain(s, 0, a.cq, &mut out);
            done += out.len();
        }
        done == pairs.len()
    });
    // Let the held ACKs and timers run out; then no QP is left in the timer set.
    sim.run_until(100_000, |s| {
        s.nics.iter_mut().all(|n| n.poll_timeout().is_none())
    });
    assert!(sim.nics.iter().all(|n| n.timed.is_empty()));
}
