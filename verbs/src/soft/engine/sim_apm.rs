//! Automatic path migration on a simulated two-link topology: two NICs with two ports each,
//! link k joining port k of both. Links can be cut; the migration must lose, duplicate and
//! reorder nothing.

use std::collections::BinaryHeap;

use super::*;
use crate::soft::engine::{AsyncEvent, QpConfig};
use crate::types::{Lkey, MigState, QpType};

struct TwoLinks {
    now: u64,
    nics: [Nic; 2],
    /// addrs[nic][port]
    addrs: [[SocketAddr; 2]; 2],
    queue: BinaryHeap<Pending>,
    up: [bool; 2],
    rng: Rng,
    drop: f64,
    seq: u64,
    buf: Vec<u8>,
}

impl TwoLinks {
    fn new(seed: u64, drop: f64) -> Self {
        let a = |x: u8, y: u8| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, x, y)), 4791);
        let addrs = [[a(0, 1), a(1, 1)], [a(0, 2), a(1, 2)]];
        let nic = |i: usize| {
            let mut c = NicConfig::single_port(addrs[i][0], seed ^ i as u64);
            c.ports = addrs[i].to_vec();
            c.port_mtus = vec![Mtu::Mtu4096; 2];
            Nic::new(c)
        };
        Self {
            now: 1_000,
            nics: [nic(0), nic(1)],
            addrs,
            queue: BinaryHeap::new(),
            up: [true, true],
            rng: Rng::new(seed),
            drop,
            seq: 0,
            buf: vec![0u8; 8192],
        }
    }

    fn flush(&mut self) {
        for i in 0..2 {
            while let Some(t) = self.nics[i].poll_transmit(self.now, &mut self.buf) {
                let link = t.port;
                let j = 1 - i;
                let Some(k) = (0..2).find(|&k| self.addrs[j][k].ip() == t.dst.ip()) else {
                    continue;
                };
                // A packet only crosses its own link, and only while it is up.
                if k != link || !self.up[link] || self.rng.next_f64() < self.drop {
                    continue;
                }
                self.seq += 1;
                let pkt = self.buf[..t.len].to_vec();
                let at = self.now + 5_000 + self.rng.below(2_000);
                self.queue
                    .push(Reverse((at, self.seq, j * 2 + k, self.addrs[i][link], pkt)));
            }
        }
    }

    fn step(&mut self) -> bool {
        self.flush();
        let next_pkt = self.queue.peek().map(|Reverse(p)| p.0);
        let next_timer = self.nics.iter_mut().filter_map(Nic::poll_timeout).min();
        let next = match (next_pkt, next_timer) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(t) => t,
                None => return false,
            },
        };
        self.now = self.now.max(next);
        while self.queue.peek().is_some_and(|Reverse(p)| p.0 <= self.now) {
            let Some(Reverse((_, _, to, src, pkt))) = self.queue.pop() else {
                break;
            };
            let (j, k) = (to / 2, to % 2);
            if self.up[k] {
                let dst = self.addrs[j][k].ip();
                self.nics[j].handle_datagram(self.now, k, src, dst, &pkt);
            }
        }
        for n in &mut self.nics {
            if n.poll_timeout().is_some_and(|t| t <= self.now) {
                n.handle_timeout(self.now);
            }
        }
        self.flush();
        true
    }

    fn run_until(&mut self, max: usize, mut done: impl FnMut(&mut Self) -> bool) {
        for _ in 0..max {
            if done(self) {
                return;
            }
            if !self.step() && !done(self) {
                for n in &self.nics {
                    eprintln!("{}", n.debug_dump());
                }
                panic!("went idle at t={}", self.now);
            }
        }
        panic!("did not converge (t={})", self.now);
    }

    fn events(&mut self, i: usize) -> Vec<AsyncEvent> {
        std::iter::from_fn(|| self.nics[i].poll_event()).collect()
    }
}

/// Connects an RC pair with the primary path on link 0 and the alternate on link 1, both
/// REARMed. `retry_cnt` 3, timeout 8 (1.05 ms).
fn connect_apm(s: &mut TwoLinks) -> [End; 2] {
    let mut ends = Vec::new();
    for n in &mut s.nics {
        let pd = n.alloc_pd();
        let cq = n.create_cq(1 << 16);
        let cap = QpCap {
            max_send_wr: 4096,
            max_recv_wr: 4096,
            ..QpCap::default()
        };
        let qpn = n
            .create_qp(&QpConfig {
                cap,
                ..QpConfig::rc(pd, cq)
            })
            .unwrap();
        let mr = Arc::new(RegisteredMemory::new(1 << 20).unwrap());
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
        let mut attrs = rc_attrs(ends[j].qpn, s.addrs[j][0].ip(), 1000, 1000, Mtu::Mtu1024);
        attrs[2].0.retry_cnt = 3;
        for (a, m) in attrs {
            s.nics[i].modify_qp(s.now, ends[i].qpn, &a, m).unwrap();
        }
        let mut alt = QpAttr {
            qp_state: QpState::Rts,
            path_mig_state: MigState::Rearm,
            alt_port_num: 2,
            alt_timeout: 8,
            ..QpAttr::default()
        };
        alt.alt_ah_attr = AhAttr::new(Gid::from_ip(s.addrs[j][1].ip()));
        s.nics[i]
            .modify_qp(
                s.now,
                ends[i].qpn,
                &alt,
                M::STATE | M::ALT_PATH | M::PATH_MIG_STATE,
            )
            .unwrap();
    }
    let b = ends.pop().unwrap();
    let a = ends.pop().unwrap();
    [a, b]
}

fn mig_state(s: &TwoLinks, i: usize, q: Qpn) -> MigState {
    s.nics[i].query_qp(q).unwrap().0.path_mig_state
}

/// Posts `n` sends of 100 bytes numbered `first..`, each into its own receive.
fn stream(s: &mut TwoLinks, a: &End, b: &End, first: u32, n: u32) {
    for k in first..first + n {
        let off = (k as usize % 4096) * 200;
        b.mr.write(off, &[0u8; 8]);
        let r = [sge(b, off, 200)];
        s.nics[1]
            .post_recv(b.qpn, &RecvWr::new(k as u64, &r))
            .unwrap();
        a.mr.write(off, &k.to_be_bytes());
        let sg = [sge(a, off, 100)];
        s.nics[0]
            .post_send(s.now, a.qpn, &SendWr::send(k as u64, &sg).signaled())
            .unwrap();
    }
}

/// Every message `first..first + n` arrived exactly once, in order, with its number.
fn check_stream(s: &mut TwoLinks, a: &End, b: &End, first: u32, n: u32) {
    let mut got = Vec::new();
    let mut sent = 0;
    s.run_until(2_000_000, |s| {
        let mut w = [WorkCompletion::EMPTY; 64];
        loop {
            let k = s.nics[1].poll_cq(b.cq, &mut w);
            if k == 0 {
                break;
            }
            got.extend_from_slice(&w[..k]);
        }
        loop {
            let k = s.nics[0].poll_cq(a.cq, &mut w);
            if k == 0 {
                break;
            }
            assert!(
                w[..k].iter().all(|x| x.status == WcStatus::Success),
                "{:?}",
                &w[..k]
            );
            sent += k;
        }
        got.len() >= n as usize && sent >= n as usize
    });
    assert_eq!(got.len(), n as usize, "duplicates delivered");
    for (i, wc) in got.iter().enumerate() {
        let i = i + first as usize;
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(wc.wr_id, i as u64, "reordered");
        let mut v = [0u8; 4];
        b.mr.read((i % 4096) * 200, &mut v);
        assert_eq!(u32::from_be_bytes(v), i as u32, "message {i} content");
    }
}

#[test]
fn rearm_then_armed_after_traffic() {
    let mut s = TwoLinks::new(1, 0.0);
    let [a, b] = connect_apm(&mut s);
    assert_eq!(mig_state(&s, 0, a.qpn), MigState::Rearm);
    stream(&mut s, &a, &b, 0, 5);
    check_stream(&mut s, &a, &b, 0, 5);
    assert_eq!(mig_state(&s, 0, a.qpn), MigState::Armed);
    assert_eq!(mig_state(&s, 1, b.qpn), MigState::Armed);
}

#[test]
fn link_failure_mid_stream_migrates_without_loss() {
    for seed in 0..5 {
        let mut s = TwoLinks::new(seed, 0.02);
        for n in &mut s.nics {
            n.set_infinite_retry_at_7(false);
        }
        let [a, b] = connect_apm(&mut s);
        stream(&mut s, &a, &b, 0, 10);
        s.run_until(100_000, |s| {
            mig_state(s, 0, a.qpn) == MigState::Armed && mig_state(s, 1, b.qpn) == MigState::Armed
        });
        stream(&mut s, &a, &b, 10, 300);
        for _ in 0..20 {
            s.step();
        }
        let cut = s.now;
        s.up[0] = false;
        s.run_until(1_000_000, |s| mig_state(s, 0, a.qpn) == MigState::Migrated);
        // Failover within 2 x timeout x (retry_cnt + 1) = 2 x 1.05 ms x 4.
        let took = s.now - cut;
        assert!(
            took < 2 * 1_048_576 * 4,
            "seed {seed}: failover took {took} ns"
        );
        check_stream(&mut s, &a, &b, 0, 310);
        let ev_a = s.events(0);
        let ev_b = s.events(1);
        assert!(
            ev_a.contains(&AsyncEvent::PathMigrated(a.qpn)),
            "seed {seed}: {ev_a:?}"
        );
        assert!(
            ev_b.contains(&AsyncEvent::PathMigrated(b.qpn)),
            "seed {seed}: {ev_b:?}"
        );
        assert_eq!(mig_state(&s, 0, a.qpn), MigState::Migrated);
        assert!(s.nics[0].query_qp(a.qpn).unwrap().0.port_num == 2);
    }
}

#[test]
fn manual_migration_and_port_down() {
    let mut s = TwoLinks::new(7, 0.0);
    let [a, b] = connect_apm(&mut s);
    stream(&mut s, &a, &b, 0, 3);
    check_stream(&mut s, &a, &b, 0, 3);
    // Manual migration from ARMED (RTS -> RTS with PATH_MIG_STATE = MIGRATED).
    let m = QpAttr {
        qp_state: QpState::Rts,
        path_mig_state: MigState::Migrated,
        ..QpAttr::default()
    };
    s.nics[0]
        .modify_qp(s.now, a.qpn, &m, M::STATE | M::PATH_MIG_STATE)
        .unwrap();
    assert_eq!(s.events(0), vec![AsyncEvent::PathMigrated(a.qpn)]);
    // Migrating again without re-arming is refused (nothing armed); ARMED cannot be set.
    let armed = QpAttr {
        qp_state: QpState::Rts,
        path_mig_state: MigState::Armed,
        ..QpAttr::default()
    };
    assert!(
        s.nics[0]
            .modify_qp(s.now, a.qpn, &armed, M::STATE | M::PATH_MIG_STATE)
            .is_err()
    );
    // The peer follows when it sees M = 1 on the new path.
    s.up[0] = false;
    stream(&mut s, &a, &b, 3, 3);
    check_stream(&mut s, &a, &b, 3, 3);
    assert!(s.events(1).contains(&AsyncEvent::PathMigrated(b.qpn)));
    // Re-arm back onto link 0 (now the alternate) and fail link 1 through the port-down path.
    s.up[0] = true;
    for (i, q) in [(0, a.qpn), (1, b.qpn)] {
        let r = QpAttr {
            qp_state: QpState::Rts,
            path_mig_state: MigState::Rearm,
            ..QpAttr::default()
        };
        s.nics[i]
            .modify_qp(s.now, q, &r, M::STATE | M::PATH_MIG_STATE)
            .unwrap();
    }
    stream(&mut s, &a, &b, 6, 3);
    check_stream(&mut s, &a, &b, 6, 3);
    assert_eq!(mig_state(&s, 0, a.qpn), MigState::Armed);
    s.up[1] = false;
    s.nics[0].handle_port_down(s.now, 1);
    let ev = s.events(0);
    assert!(
        ev.contains(&AsyncEvent::PortError(2)) && ev.contains(&AsyncEvent::PathMigrated(a.qpn)),
        "{ev:?}"
    );
    stream(&mut s, &a, &b, 9, 3);
    check_stream(&mut s, &a, &b, 9, 3);
}

#[test]
fn both_links_down_is_a_migration_error() {
    let mut s = TwoLinks::new(9, 0.0);
    let [a, b] = connect_apm(&mut s);
    stream(&mut s, &a, &b, 0, 2);
    check_stream(&mut s, &a, &b, 0, 2);
    s.up = [false, false];
    let sg = [sge(&a, 0, 10)];
    s.nics[0]
        .post_send(s.now, a.qpn, &SendWr::send(99, &sg).signaled())
        .unwrap();
    let mut wcs = Vec::new();
    s.run_until(1_000_000, |s| {
        let mut w = [WorkCompletion::EMPTY; 8];
        let k = s.nics[0].poll_cq(a.cq, &mut w);
        wcs.extend_from_slice(&w[..k]);
        !wcs.is_empty()
    });
    assert_eq!(wcs[0].status, WcStatus::RetryExcErr);
    let ev = s.events(0);
    assert!(ev.contains(&AsyncEvent::PathMigrated(a.qpn)), "{ev:?}");
    assert!(
        ev.contains(&AsyncEvent::PathMigrationError(a.qpn)),
        "{ev:?}"
    );
}

/// An XRC initiator on NIC 0 and an XRC target with one XRC SRQ on NIC 1, primary path on
/// link 0, alternate on link 1, both REARMed. Returns (initiator, target, srq, its cq, MRs).
struct XrcPair {
    ini: Qpn,
    ini_cq: u32,
    tgt: Qpn,
    srq: u32,
    srq_cq: u32,
    a_mr: Arc<RegisteredMemory>,
    a_key: u32,
    b_mr: Arc<RegisteredMemory>,
    b_key: u32,
}

fn connect_xrc_apm(s: &mut TwoLinks) -> XrcPair {
    let (now, addrs) = (s.now, s.addrs);
    // Initiator side.
    let n0 = &mut s.nics[0];
    let pd0 = n0.alloc_pd();
    let ini_cq = n0.create_cq(1 << 16);
    let cap = QpCap {
        max_send_wr: 4096,
        max_recv_wr: 0,
        ..QpCap::default()
    };
    let ini = n0
        .create_qp(&QpConfig {
            qp_type: QpType::XrcSend,
            cap,
            ..QpConfig::rc(pd0, ini_cq)
        })
        .unwrap();
    let a_mr = Arc::new(RegisteredMemory::new(1 << 20).unwrap());
    let a_key = n0.reg_mr(pd0, a_mr.clone(), AccessFlags::LOCAL_WRITE);
    // Target side.
    let n1 = &mut s.nics[1];
    let pd1 = n1.alloc_pd();
    let srq_cq = n1.create_cq(1 << 16);
    let xrcd = n1.alloc_xrcd();
    let srq = n1.create_xrc_srq(pd1, xrcd, srq_cq, 4096, 1).unwrap();
    let tgt = n1
        .create_qp(&QpConfig {
            qp_type: QpType::XrcRecv,
            xrcd: Some(xrcd),
            cap: QpCap::default(),
            ..QpConfig::rc(pd1, srq_cq)
        })
        .unwrap();
    let b_mr = Arc::new(RegisteredMemory::new(1 << 20).unwrap());
    let b_key = n1.reg_mr(pd1, b_mr.clone(), AccessFlags::LOCAL_WRITE);
    let av = |ip: IpAddr| AhAttr::new(Gid::from_ip(ip));
    // Initiator: INIT, RTR, RTS (no responder attributes).
    let n0 = &mut s.nics[0];
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    n0.modify_qp(
        now,
        ini,
        &init,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )
    .unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: av(addrs[1][0].ip()),
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: tgt.0,
        rq_psn: 0,
        ..QpAttr::default()
    };
    n0.modify_qp(
        now,
        ini,
        &rtr,
        M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
    )
    .unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout: 8,
        retry_cnt: 3,
        rnr_retry: 7,
        sq_psn: 1000,
        max_rd_atomic: 4,
        ..QpAttr::default()
    };
    n0.modify_qp(
        now,
        ini,
        &rts,
        M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
    // Target: INIT, RTR, RTS.
    let n1 = &mut s.nics[1];
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE,
        ..QpAttr::default()
    };
    n1.modify_qp(
        now,
        tgt,
        &init,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )
    .unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: av(addrs[0][0].ip()),
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: ini.0,
        rq_psn: 1000,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        ..QpAttr::default()
    };
    n1.modify_qp(
        now,
        tgt,
        &rtr,
        M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER,
    )
    .unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout: 8,
        sq_psn: 0,
        ..QpAttr::default()
    };
    n1.modify_qp(now, tgt, &rts, M::STATE | M::TIMEOUT | M::SQ_PSN)
        .unwrap();
    // Alternate paths over link 1, REARM.
    for (i, q, peer) in [(0usize, ini, 1usize), (1, tgt, 0)] {
        let mut alt = QpAttr {
            qp_state: QpState::Rts,
            path_mig_state: MigState::Rearm,
            alt_port_num: 2,
            alt_timeout: 8,
            ..QpAttr::default()
        };
        alt.alt_ah_attr = av(addrs[peer][1].ip());
        s.nics[i]
            .modify_qp(now, q, &alt, M::STATE | M::ALT_PATH | M::PATH_MIG_STATE)
            .unwrap();
    }
    XrcPair {
        ini,
        ini_cq,
        tgt,
        srq,
        srq_cq,
        a_mr,
        a_key,
        b_mr,
        b_key,
    }
}

fn xrc_stream(s: &mut TwoLinks, p: &XrcPair, first: u32, n: u32) {
    for k in first..first + n {
        let off = (k as usize % 4096) * 200;
        p.b_mr.write(off, &[0u8; 8]);
        let r = [Sge {
            addr: p.b_mr.addr() + off as u64,
            length: 200,
            lkey: Lkey(p.b_key),
        }];
        s.nics[1]
            .post_srq_recv(p.srq, &RecvWr::new(k as u64, &r))
            .unwrap();
        p.a_mr.write(off, &k.to_be_bytes());
        let sg = [Sge {
            addr: p.a_mr.addr() + off as u64,
            length: 100,
            lkey: Lkey(p.a_key),
        }];
        s.nics[0]
            .post_send(
                s.now,
                p.ini,
                &SendWr::send(k as u64, &sg).signaled().to_srq(p.srq),
            )
            .unwrap();
    }
}

/// XRC through a link failure: the initiator and the target migrate, and every message
/// arrives in the XRC SRQ exactly once and in order.
#[test]
fn xrc_link_failure_mid_stream_migrates_without_loss() {
    for seed in 0..20 {
        let mut s = TwoLinks::new(seed, 0.02);
        for n in &mut s.nics {
            n.set_infinite_retry_at_7(false);
        }
        let p = connect_xrc_apm(&mut s);
        xrc_stream(&mut s, &p, 0, 10);
        s.run_until(100_000, |s| {
            mig_state(s, 0, p.ini) == MigState::Armed && mig_state(s, 1, p.tgt) == MigState::Armed
        });
        xrc_stream(&mut s, &p, 10, 300);
        for _ in 0..20 {
            s.step();
        }
        s.up[0] = false;
        let mut got = Vec::new();
        let mut sent = 0usize;
        s.run_until(2_000_000, |s| {
            let mut w = [WorkCompletion::EMPTY; 64];
            loop {
                let k = s.nics[1].poll_cq(p.srq_cq, &mut w);
                if k == 0 {
                    break;
                }
                got.extend_from_slice(&w[..k]);
            }
            loop {
                let k = s.nics[0].poll_cq(p.ini_cq, &mut w);
                if k == 0 {
                    break;
                }
                assert!(
                    w[..k].iter().all(|x| x.status == WcStatus::Success),
                    "seed {seed}: {:?}",
                    &w[..k]
                );
                sent += k;
            }
            got.len() >= 310 && sent >= 310
        });
        assert_eq!(got.len(), 310, "seed {seed}: duplicates delivered");
        for (i, wc) in got.iter().enumerate() {
            assert_eq!(wc.status, WcStatus::Success, "seed {seed}");
            assert_eq!(wc.wr_id, i as u64, "seed {seed}: lost or reordered at {i}");
            let mut v = [0u8; 4];
            p.b_mr.read((i % 4096) * 200, &mut v);
            assert_eq!(u32::from_be_bytes(v), i as u32, "seed {seed}: message {i}");
        }
        assert_eq!(mig_state(&s, 0, p.ini), MigState::Migrated, "seed {seed}");
        assert_eq!(mig_state(&s, 1, p.tgt), MigState::Migrated, "seed {seed}");
    }
}

#[test]
fn an_alternate_port_that_cannot_carry_the_path_mtu_is_refused() {
    // Port 2 of the first NIC carries 1024-byte packets only; the QPs use 2048. Loading
    // that port as the alternate path is refused, as the primary would be at RTR (it was
    // accepted, and the QP went on sending 2048-byte packets there after migrating).
    let mut s = TwoLinks::new(3, 0.0);
    let mut c = NicConfig::single_port(s.addrs[0][0], 3);
    c.ports = s.addrs[0].to_vec();
    c.port_mtus = vec![Mtu::Mtu4096, Mtu::Mtu1024];
    s.nics[0] = Nic::new(c);
    let n = &mut s.nics[0];
    let pd = n.alloc_pd();
    let cq = n.create_cq(64);
    let qpn = n.create_qp(&QpConfig::rc(pd, cq)).unwrap();
    let attrs = rc_attrs(Qpn(0x77), s.addrs[1][0].ip(), 1000, 1000, Mtu::Mtu2048);
    for (a, m) in attrs {
        n.modify_qp(s.now, qpn, &a, m).unwrap();
    }
    let mut alt = QpAttr {
        qp_state: QpState::Rts,
        path_mig_state: MigState::Rearm,
        alt_port_num: 2,
        alt_timeout: 8,
        ..QpAttr::default()
    };
    alt.alt_ah_attr = AhAttr::new(Gid::from_ip(s.addrs[1][1].ip()));
    let e = n
        .modify_qp(s.now, qpn, &alt, M::STATE | M::ALT_PATH | M::PATH_MIG_STATE)
        .unwrap_err();
    assert!(
        matches!(
            &e,
            crate::VerbsError::InvalidAttribute {
                attr: "ALT_PATH",
                ..
            }
        ),
        "{e:?}"
    );
    // The same alternate on port 1's MTU (a QP at 1024) is taken.
    let qp2 = n.create_qp(&QpConfig::rc(pd, cq)).unwrap();
    for (a, m) in rc_attrs(Qpn(0x78), s.addrs[1][0].ip(), 1000, 1000, Mtu::Mtu1024) {
        n.modify_qp(s.now, qp2, &a, m).unwrap();
    }
    n.modify_qp(s.now, qp2, &alt, M::STATE | M::ALT_PATH | M::PATH_MIG_STATE)
        .unwrap();
}
