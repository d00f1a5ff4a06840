//! UC on the simulated link: completion on transmit, no acknowledgements, messages lost
//! whole on a lossy link (never delivered damaged, duplicated or out of order), receive
//! WQEs kept for the next message, and the drops RC would answer with a NAK.

use super::*;
use crate::error::PostError;
use crate::types::{QpType, WcOpcode};

/// A connected UC pair with `mem_len`-byte MRs; B's MR allows remote writes.
fn uc_pair(sim: &mut Sim, mtu: Mtu, mem_len: usize) -> [End; 2] {
    let cap = QpCap {
        max_send_wr: 4096,
        max_recv_wr: 4096,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    };
    let mut ends = Vec::new();
    for n in &mut sim.nics {
        let pd = n.alloc_pd();
        let cq = n.create_cq(1 << 16);
        let qpn = n
            .create_qp(&QpConfig {
                cap,
                qp_type: QpType::Uc,
                ..QpConfig::rc(pd, cq)
            })
            .unwrap();
        let mr = Arc::new(RegisteredMemory::new(mem_len).unwrap());
        let key = n.reg_mr(
            pd,
            mr.clone(),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        );
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
        let init = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            ..QpAttr::default()
        };
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            ah_attr: AhAttr::new(Gid::from_ip(sim.addrs[j].ip())),
            path_mtu: mtu,
            dest_qp_num: ends[j].qpn.0,
            rq_psn: 100 * j as u32,
            ..QpAttr::default()
        };
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: 100 * i as u32,
            ..QpAttr::default()
        };
        let q = ends[i].qpn;
        let n = &mut sim.nics[i];
        n.modify_qp(
            sim.now,
            q,
            &init,
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
        )
        .unwrap();
        n.modify_qp(
            sim.now,
            q,
            &rtr,
            M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
        )
        .unwrap();
        n.modify_qp(sim.now, q, &rts, M::STATE | M::SQ_PSN).unwrap();
    }
    let b = ends.pop().unwrap();
    let a = ends.pop().unwrap();
    [a, b]
}

/// Message `i`'s bytes: its number, then a pattern derived from it.
fn message(i: u32, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len).map(|k| (k as u32 * 7 + i * 13) as u8).collect();
    v[..4].copy_from_slice(&i.to_be_bytes());
    v
}

/// Receive WQEs posted and not consumed: those queued, and the one a message still open
/// (its last packet lost, no later message yet) holds.
fn posted_receives(sim: &Sim, i: usize, qpn: Qpn) -> usize {
    sim.nics[i].qps.get(&qpn.0).map_or(0, |q| {
        q.resp.rq.len() + usize::from(q.resp.uc_wqe.is_some())
    })
}

#[test]
fn sends_and_writes_complete_on_transmit_without_acks() {
    let mut sim = Sim::new(7, LinkCfg::clean());
    let [a, b] = uc_pair(&mut sim, Mtu::Mtu256, 1 << 16);
    let len = 1000; // four packets
    for k in 0..4u32 {
        let r = sge(&b, k as usize * 1024, 1024);
        sim.nics[1]
            .post_recv(b.qpn, &RecvWr::new(u64::from(k), &[r]))
            .unwrap();
        a.mr.write(k as usize * 1024, &message(k, len));
        let s = [sge(&a, k as usize * 1024, len)];
        let wr = SendWr::send(u64::from(k), &s).signaled();
        sim.nics[0].post_send(sim.now, a.qpn, &wr).unwrap();
    }
    // The requester completes as the packets leave, before anything reaches B.
    sim.flush();
    let mut wc = Vec::new();
    drain(&mut sim, 0, a.cq, &mut wc);
    assert_eq!(wc.len(), 4, "completed on transmit");
    assert!(wc.iter().all(|w| w.status == WcStatus::Success));
    // A write with immediate, then a plain write.
    a.mr.write(8192, b"uc write");
    let s = sge(&a, 8192, 8);
    let w = WrOpcode::RdmaWriteWithImm {
        remote_addr: b.mr.addr() + 20_000,
        rkey: Rkey(b.key),
        imm: 0xC0FFEE,
    };
    let r = sge(&b, 60_000, 0);
    sim.nics[1]
        .post_recv(b.qpn, &RecvWr::new(99, &[r]))
        .unwrap();
    sim.nics[0]
        .post_send(sim.now, a.qpn, &SendWr::new(50, w, &[s]).signaled())
        .unwrap();
    let mut got = Vec::new();
    sim.run_until(10_000, |s| {
        drain(s, 1, b.cq, &mut got);
        got.len() == 5
    });
    for (k, w) in got[..4].iter().enumerate() {
        assert_eq!(
            (w.status, w.wr_id, w.byte_len),
            (WcStatus::Success, k as u64, 1000)
        );
        let mut m = vec![0u8; len];
        b.mr.read(k * 1024, &mut m);
        assert_eq!(m, message(k as u32, len));
    }
    assert_eq!(
        (got[4].opcode, got[4].imm_data, got[4].wr_id),
        (WcOpcode::RecvRdmaWithImm, 0xC0FFEE, 99)
    );
    let mut m = [0u8; 8];
    b.mr.read(20_000, &mut m);
    assert_eq!(&m, b"uc write");
    while sim.step() {}
    for n in &sim.nics {
        assert_eq!(n.counters().acks_sent, 0, "UC never acknowledges");
        assert_eq!(n.counters().retransmits, 0);
    }
    assert_eq!(sim.nics[0].poll_timeout(), None, "no timer left behind");
}

#[test]
fn a_lossy_link_loses_whole_messages_and_keeps_the_receives() {
    for_seeds(0..8, |seed| {
        // Every fourth seed reorders too: to UC a late packet is a lost one.
        let link = LinkCfg {
            latency: 5_000,
            jitter: if seed % 4 == 3 { 3_000 } else { 0 },
            drop: 0.08,
            dup: 0.0,
            corrupt: 0.01,
        };
        let mut sim = Sim::new(seed, link);
        let [a, b] = uc_pair(&mut sim, Mtu::Mtu256, 1 << 20);
        let (n, len) = (200u32, 600usize); // three packets each
        for k in 0..n {
            let r = sge(&b, k as usize * 1024, 1024);
            sim.nics[1]
                .post_recv(b.qpn, &RecvWr::new(u64::from(1000 + k), &[r]))
                .unwrap();
        }
        let mut sent = Vec::new();
        for k in 0..n {
            a.mr.write(k as usize * 1024, &message(k, len));
            let s = sge(&a, k as usize * 1024, len);
            sim.nics[0]
                .post_send(sim.now, a.qpn, &SendWr::send(u64::from(k), &[s]).signaled())
                .unwrap();
            // Pace the sender so that the link, not a burst, decides what is lost.
            for _ in 0..3 {
                sim.step();
            }
            drain(&mut sim, 0, a.cq, &mut sent);
        }
        while sim.step() {}
        drain(&mut sim, 0, a.cq, &mut sent);
        assert_eq!(sent.len(), n as usize, "every send completes");
        assert!(sent.iter().all(|w| w.status == WcStatus::Success));
        let mut got = Vec::new();
        drain(&mut sim, 1, b.cq, &mut got);
        assert!(
            !got.is_empty() && got.len() < n as usize,
            "seed {seed}: {}",
            got.len()
        );
        if link.jitter == 0 {
            // About 0.92^3 of the messages keep all three packets.
            assert!(
                got.len() > n as usize / 2,
                "seed {seed}: only {}",
                got.len()
            );
        }
        // Receives complete in posting order; each holds one whole message, the messages
        // in sending order with none twice.
        let mut last = None;
        for (slot, w) in got.iter().enumerate() {
            assert_eq!(w.status, WcStatus::Success);
            assert_eq!(w.wr_id, 1000 + slot as u64, "WQEs are used in order");
            assert_eq!(w.byte_len as usize, len);
            let mut m = vec![0u8; len];
            b.mr.read(slot * 1024, &mut m);
            let id = u32::from_be_bytes(m[..4].try_into().unwrap());
            assert_eq!(m, message(id, len), "seed {seed}: message {id} damaged");
            assert!(last.is_none_or(|l| id > l), "out of order or twice");
            last = Some(id);
        }
        // A lost message gave its receive WQE back.
        assert_eq!(posted_receives(&sim, 1, b.qpn), n as usize - got.len());
        let c = sim.nics[1].counters();
        assert!(c.rx_uc_dropped + c.rx_dropped_seq > 0);
        assert_eq!(c.acks_sent, 0);
        assert_eq!(
            sim.nics[1].query_qp(b.qpn).unwrap().0.qp_state,
            QpState::Rts
        );
    });
}

#[test]
fn drops_instead_of_naks() {
    let mut sim = Sim::new(3, LinkCfg::clean());
    let [a, b] = uc_pair(&mut sim, Mtu::Mtu256, 1 << 16);
    let s = sge(&a, 0, 300);
    // No receive posted: the send is dropped (no RNR NAK), the sender succeeds.
    sim.nics[0]
        .post_send(sim.now, a.qpn, &SendWr::send(1, &[s]).signaled())
        .unwrap();
    // A write to a key B never registered: dropped, no NAK.
    let bad = WrOpcode::RdmaWrite {
        remote_addr: b.mr.addr(),
        rkey: Rkey(b.key ^ 0x55),
    };
    sim.nics[0]
        .post_send(sim.now, a.qpn, &SendWr::new(2, bad, &[s]).signaled())
        .unwrap();
    while sim.step() {}
    let mut wc = Vec::new();
    drain(&mut sim, 0, a.cq, &mut wc);
    assert_eq!(wc.len(), 2);
    assert!(wc.iter().all(|w| w.status == WcStatus::Success));
    let c = sim.nics[1].counters();
    assert_eq!((c.rx_no_recv, c.rx_uc_dropped), (1, 1));
    assert_eq!(c.rnr_naks_sent + c.acks_sent, 0);
    // B is still connected: the next message with a receive posted arrives.
    let r = sge(&b, 4096, 512);
    sim.nics[1].post_recv(b.qpn, &RecvWr::new(7, &[r])).unwrap();
    a.mr.write(0, &message(5, 300));
    sim.nics[0]
        .post_send(sim.now, a.qpn, &SendWr::send(3, &[s]))
        .unwrap();
    let mut got = Vec::new();
    sim.run_until(1_000, |s| {
        drain(s, 1, b.cq, &mut got);
        !got.is_empty()
    });
    assert_eq!((got[0].wr_id, got[0].byte_len), (7, 300));
    // RDMA read and atomics do not exist on UC.
    let d = sge(&a, 0, 8);
    for op in [
        WrOpcode::RdmaRead {
            remote_addr: b.mr.addr(),
            rkey: Rkey(b.key),
        },
        WrOpcode::AtomicFetchAdd {
            remote_addr: b.mr.addr(),
            rkey: Rkey(b.key),
            add: 1,
        },
    ] {
        let e = sim.nics[0]
            .post_send(sim.now, a.qpn, &SendWr::new(9, op, &[d]))
            .unwrap_err();
        assert!(matches!(e, PostError::InvalidWorkRequest(_)), "{e:?}");
    }
}

#[test]
fn a_send_longer_than_its_receive_is_a_local_length_error() {
    let mut sim = Sim::new(4, LinkCfg::clean());
    let [a, b] = uc_pair(&mut sim, Mtu::Mtu256, 1 << 16);
    let r = sge(&b, 0, 100);
    sim.nics[1].post_recv(b.qpn, &RecvWr::new(1, &[r])).unwrap();
    sim.nics[1].post_recv(b.qpn, &RecvWr::new(2, &[r])).unwrap();
    let s = sge(&a, 0, 300);
    sim.nics[0]
        .post_send(sim.now, a.qpn, &SendWr::send(1, &[s]))
        .unwrap();
    while sim.step() {}
    let mut got = Vec::new();
    drain(&mut sim, 1, b.cq, &mut got);
    assert_eq!(
        got.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::LocLenErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(
        sim.nics[1].query_qp(b.qpn).unwrap().0.qp_state,
        QpState::Err
    );
}

/// Binds and invalidations interleaved with sends on a lossy link: they take effect in
/// queue order, complete in order, and a go-back-N over them neither repeats nor stalls
/// them.
#[test]
fn binds_between_sends_under_loss() {
    for_seeds(0..6, |seed| {
        let link = LinkCfg {
            latency: 5_000,
            jitter: 2_000,
            drop: 0.1,
            dup: 0.02,
            corrupt: 0.0,
        };
        let mut sim = Sim::new(seed, link);
        for n in &mut sim.nics {
            n.set_infinite_retry_at_7(true);
        }
        let [a, b] = connect(&mut sim, Mtu::Mtu256, 1 << 16, [10, 20]);
        let n0 = &mut sim.nics[0];
        let win_mem = Arc::new(RegisteredMemory::new(4096).unwrap());
        let win_key = n0.reg_mr(
            a.pd,
            win_mem.clone(),
            AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
        );
        let (mw, mut key) = n0.alloc_mw(a.pd, crate::types::MwType::Type2).unwrap();
        for k in 0..40u64 {
            let r = sge(&b, k as usize * 1024, 1024);
            sim.nics[1].post_recv(b.qpn, &RecvWr::new(k, &[r])).unwrap();
        }
        let mut expect = Vec::new();
        for k in 0..20u64 {
            let s = [sge(&a, 0, 700)];
            sim.nics[0]
                .post_send(sim.now, a.qpn, &SendWr::send(k * 10, &s).signaled())
                .unwrap();
            expect.push((k * 10, WcOpcode::Send));
            key = Rkey(key).inc().0;
            let bind = crate::wr::MwBindWr {
                mw,
                rkey: Rkey(key),
                lkey: crate::types::Lkey(win_key),
                addr: win_mem.addr(),
                length: 4096,
                access: AccessFlags::REMOTE_READ,
                type1: false,
            };
            let wr = SendWr::new(k * 10 + 1, WrOpcode::BindMw(bind), &[]).signaled();
            sim.nics[0].post_send(sim.now, a.qpn, &wr).unwrap();
            expect.push((k * 10 + 1, WcOpcode::BindMw));
            let inv = WrOpcode::LocalInv { rkey: Rkey(key) };
            let wr = SendWr::new(k * 10 + 2, inv, &[]).signaled();
            sim.nics[0].post_send(sim.now, a.qpn, &wr).unwrap();
            expect.push((k * 10 + 2, WcOpcode::LocalInv));
            for _ in 0..2 {
                sim.step();
            }
        }
        let mut got = Vec::new();
        sim.run_until(200_000, |s| {
            drain(s, 0, a.cq, &mut got);
            got.len() >= expect.len()
        });
        let seen: Vec<_> = got.iter().map(|w| (w.wr_id, w.opcode)).collect();
        assert_eq!(seen, expect, "seed {seed}: completions in posting order");
        assert!(
            got.iter().all(|w| w.status == WcStatus::Success),
            "seed {seed}"
        );
        assert_eq!(
            sim.nics[0].query_qp(a.qpn).unwrap().0.qp_state,
            QpState::Rts
        );
    });
}
