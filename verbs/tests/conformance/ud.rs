//! UD queue pairs and multicast over the soft provider on loopback, through the public API.

use crate::common;

use std::time::Duration;

use rdmx_verbs::ah::{GRH_LEN, grh_destination, grh_source};
use rdmx_verbs::{
    AccessFlags, AddressHandle, AhAttr, CompletionQueue, Context, Gid, MemoryRegion, PostError,
    ProtectionDomain, QpAttr, QpAttrMask as M, QpInitAttr, QpState, QpType, Qpn, QueuePair, RecvWr,
    SendWr, SrqInitAttr, WcFlags, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

const QKEY: u32 = 0x1111_2222;

struct Ud {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn ud_side(qkey: u32) -> Ud {
    let ctx = common::open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024, None).unwrap();
    let mut a = QpInitAttr::ud(&cq, &cq);
    a.cap.max_recv_wr = 256;
    a.cap.max_send_wr = 256;
    let qp = pd.create_qp(&a).unwrap();
    assert_eq!(qp.qp_type(), QpType::Ud);
    bring_up(&qp, qkey);
    let mr = pd.reg_mr(1 << 20, AccessFlags::LOCAL_WRITE).unwrap();
    Ud {
        ctx,
        pd,
        cq,
        qp,
        mr,
    }
}

fn bring_up(qp: &QueuePair, qkey: u32) {
    // A UD QP needs QKEY at RESET->INIT; ACCESS_FLAGS is not allowed.
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qkey,
        ..QpAttr::default()
    };
    let e = qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS);
    assert!(e.is_err());
    common::bring_up_ud(qp, qkey, 77);
}

fn ah_to(from: &Ud, to: &Ud) -> AddressHandle {
    let attr =
        AhAttr::new(to.ctx.query_gid(1, 0).unwrap()).with_udp_port(common::udp_port(&to.ctx, 1));
    from.pd.create_ah(&attr).unwrap()
}

fn wait(cq: &CompletionQueue, n: usize) -> Vec<WorkCompletion> {
    common::wait_cq(cq, n)
}

/// Nothing more arrives within `ms`.
fn quiet(cq: &CompletionQueue, ms: u64) -> Vec<WorkCompletion> {
    let mut buf = [WorkCompletion::EMPTY; 64];
    let k = cq
        .poll_blocking(&mut buf, Duration::from_millis(ms))
        .unwrap();
    buf[..k].to_vec()
}

#[test]
fn ud_ping_pong_reply_through_an_ah_from_the_completion() {
    let a = ud_side(QKEY);
    let b = ud_side(QKEY);
    let r = [b.mr.sge(0, 4096)];
    b.qp.post_recv(&RecvWr::new(1, &r)).unwrap();
    a.mr.write(0, b"ping over UD").unwrap();
    let s = [a.mr.sge(0, 12)];
    let ah = ah_to(&a, &b);
    let wr = SendWr::new(5, WrOpcode::SendWithImm { imm: 42 }, &s)
        .signaled()
        .to(&ah, b.qp.qp_num(), QKEY);
    a.qp.post_send(&wr).unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    let wc = wait(&b.cq, 1)[0];
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(wc.opcode, WcOpcode::Recv);
    assert_eq!(wc.byte_len as usize, GRH_LEN + 12);
    assert!(wc.wc_flags.contains(WcFlags::GRH));
    assert_eq!(wc.imm(), Some(42));
    assert_eq!(wc.src_qp, a.qp.qp_num());
    assert_eq!(wc.qp_num, b.qp.qp_num());
    // The GRH: 20 zero bytes then the IPv4 header, source = A's address, dest = B's.
    let grh = b.mr.to_vec(0, GRH_LEN).unwrap();
    assert!(grh[..20].iter().all(|&x| x == 0));
    assert_eq!(grh[20], 0x45);
    assert_eq!(grh_source(&grh), Some(common::port_ip(&a.ctx, 1)));
    assert_eq!(grh_destination(&grh), Some(common::port_ip(&b.ctx, 1)));
    assert_eq!(b.mr.to_vec(GRH_LEN, 12).unwrap(), b"ping over UD");
    // Reply to whoever sent it.
    let back = AddressHandle::from_work_completion(&b.pd, 1, &wc, &grh).unwrap();
    let ra = [a.mr.sge(8192, 4096)];
    a.qp.post_recv(&RecvWr::new(2, &ra)).unwrap();
    b.mr.write(100, b"pong").unwrap();
    let s = [b.mr.sge(100, 4)];
    b.qp.post_send(&SendWr::send(6, &s).to(&back, wc.src_qp, QKEY))
        .unwrap();
    let wc = wait(&a.cq, 1)[0];
    assert_eq!(
        (wc.status, wc.byte_len),
        (WcStatus::Success, (GRH_LEN + 4) as u32)
    );
    assert_eq!(a.mr.to_vec(8192 + GRH_LEN, 4).unwrap(), b"pong");
}

#[test]
fn ud_errors_and_drops() {
    let a = ud_side(QKEY);
    let b = ud_side(QKEY);
    let ah = ah_to(&a, &b);
    // Larger than the path MTU: a clear error at post time.
    let big = [a.mr.sge(0, 4097)];
    let e =
        a.qp.post_send(&SendWr::send(1, &big).to(&ah, b.qp.qp_num(), QKEY))
            .unwrap_err();
    assert!(
        matches!(
            e,
            PostError::MessageTooLong {
                len: 4097,
                max: 4096
            }
        ),
        "{e}"
    );
    // No address handle: a clear error.
    let s = [a.mr.sge(0, 16)];
    assert!(matches!(
        a.qp.post_send(&SendWr::send(1, &s)),
        Err(PostError::InvalidWorkRequest(_))
    ));
    // RDMA operations are not UD operations.
    let w = WrOpcode::RdmaWrite {
        remote_addr: 0,
        rkey: rdmx_verbs::Rkey(0),
    };
    assert!(
        a.qp.post_send(&SendWr::new(1, w, &s).to(&ah, b.qp.qp_num(), QKEY))
            .is_err()
    );
    // No receive posted: dropped silently and counted.
    a.qp.post_send(&SendWr::send(2, &s).signaled().to(&ah, b.qp.qp_num(), QKEY))
        .unwrap();
    assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
    assert!(quiet(&b.cq, 100).is_empty());
    assert_eq!(b.ctx.counters().rx_no_recv, 1);
    // Wrong Q_Key: dropped and counted, the receive stays posted.
    let r = [b.mr.sge(0, 4096)];
    b.qp.post_recv(&RecvWr::new(9, &r)).unwrap();
    a.qp.post_send(&SendWr::send(3, &s).to(&ah, b.qp.qp_num(), QKEY + 1))
        .unwrap();
    assert!(quiet(&b.cq, 100).is_empty());
    assert_eq!(b.ctx.counters().rx_qkey_violations, 1);
    // A controlled Q_Key (bit 31) makes the sender use its own Q_Key: accepted.
    a.qp.post_send(&SendWr::send(4, &s).to(&ah, b.qp.qp_num(), 0x8000_0000))
        .unwrap();
    let wc = wait(&b.cq, 1)[0];
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::Success));
    // A receive buffer shorter than GRH + payload: LOC_LEN_ERR.
    let small = [b.mr.sge(0, GRH_LEN + 8)];
    b.qp.post_recv(&RecvWr::new(10, &small)).unwrap();
    a.qp.post_send(&SendWr::send(5, &s).to(&ah, b.qp.qp_num(), QKEY))
        .unwrap();
    let wc = wait(&b.cq, 1)[0];
    assert_eq!((wc.wr_id, wc.status), (10, WcStatus::LocLenErr));
    // A datagram for a QP that does not exist is counted.
    let before = b.ctx.counters().rx_no_qp;
    a.qp.post_send(&SendWr::send(6, &s).to(&ah, Qpn(0x00AB_CDEF), QKEY))
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(quiet(&b.cq, 50).is_empty());
    assert_eq!(b.ctx.counters().rx_no_qp, before + 1);
}

#[test]
fn ud_qps_on_an_srq() {
    let ctx = common::open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let srq = pd
        .create_srq(&SrqInitAttr {
            max_wr: 64,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let mr = pd.reg_mr(64 * 1024, AccessFlags::LOCAL_WRITE).unwrap();
    let mut qps = Vec::new();
    for _ in 0..3 {
        let mut a = QpInitAttr::ud(&cq, &cq);
        a.srq = Some(&srq);
        let qp = pd.create_qp(&a).unwrap();
        bring_up(&qp, QKEY);
        qps.push(qp);
    }
    for i in 0..6u64 {
        let r = [mr.sge(i as usize * 1024, 1024)];
        srq.post_recv(&RecvWr::new(i, &r)).unwrap();
    }
    let a = ud_side(QKEY);
    let attr = AhAttr::new(ctx.query_gid(1, 0).unwrap()).with_udp_port(common::udp_port(&ctx, 1));
    let ah = a.pd.create_ah(&attr).unwrap();
    let s = [a.mr.sge(0, 8)];
    for q in &qps {
        a.qp.post_send(&SendWr::send(1, &s).to(&ah, q.qp_num(), QKEY))
            .unwrap();
    }
    let wcs = wait(&cq, 3);
    let mut got: Vec<Qpn> = wcs.iter().map(|w| w.qp_num).collect();
    got.sort();
    let mut want: Vec<Qpn> = qps.iter().map(QueuePair::qp_num).collect();
    want.sort();
    assert_eq!(got, want);
    common::check_srq_posted(&srq, 3);
}

/// A multicast group unique to this process and test.
fn group(n: u8) -> Gid {
    let pid = std::process::id();
    Gid::from(std::net::Ipv4Addr::new(239, 77, (pid % 250) as u8, n))
}

#[test]
fn multicast_reaches_every_attached_qp_and_stops_after_detach() {
    if common::open_test_device().query_device().max_mcast_grp == 0 {
        return common::skip(
            "multicast_reaches_every_attached_qp_and_stops_after_detach",
            "the device supports no multicast groups",
        );
    }
    let g = group(1);
    let receivers: Vec<Ud> = (0..3).map(|_| ud_side(QKEY)).collect();
    for r in &receivers {
        r.qp.attach_mcast(g, 0).unwrap();
        for i in 0..64u64 {
            let s = [r.mr.sge(i as usize * 2048, 2048)];
            r.qp.post_recv(&RecvWr::new(i, &s)).unwrap();
        }
    }
    // The sender is not a member.
    let sender = ud_side(QKEY);
    let ah = sender.pd.create_ah(&AhAttr::new(g)).unwrap();
    for i in 0..20u8 {
        sender.mr.write(i as usize * 16, &[i; 16]).unwrap();
        let s = [sender.mr.sge(i as usize * 16, 16)];
        sender
            .qp
            .post_send(&SendWr::send(i as u64, &s).to(&ah, Qpn::MULTICAST, QKEY))
            .unwrap();
    }
    for r in &receivers {
        let wcs = wait(&r.cq, 20);
        for (k, wc) in wcs.iter().enumerate() {
            assert_eq!(wc.status, WcStatus::Success);
            assert_eq!(wc.src_qp, sender.qp.qp_num());
            let grh = r.mr.to_vec(wc.wr_id as usize * 2048, GRH_LEN).unwrap();
            assert_eq!(grh_destination(&grh), Some(g.to_ip()));
            let body = r.mr.to_vec(wc.wr_id as usize * 2048 + GRH_LEN, 16).unwrap();
            assert_eq!(body, vec![k as u8; 16], "datagram {k} in order");
        }
    }
    // Detach the first receiver: it gets nothing more, the others still do.
    receivers[0].qp.detach_mcast(g, 0).unwrap();
    let s = [sender.mr.sge(0, 16)];
    sender
        .qp
        .post_send(&SendWr::send(99, &s).to(&ah, Qpn::MULTICAST, QKEY))
        .unwrap();
    for r in &receivers[1..] {
        assert_eq!(wait(&r.cq, 1)[0].status, WcStatus::Success);
    }
    assert!(quiet(&receivers[0].cq, 100).is_empty());
    // Detaching twice, or attaching an RC QP, is a clear error.
    assert!(receivers[0].qp.detach_mcast(g, 0).is_err());
    let rc = receivers[0]
        .pd
        .create_qp(&QpInitAttr::rc(&receivers[0].cq, &receivers[0].cq))
        .unwrap();
    assert!(rc.attach_mcast(g, 0).is_err());
    assert!(
        receivers[0]
            .qp
            .attach_mcast(Gid::from(std::net::Ipv4Addr::new(10, 1, 1, 1)), 0)
            .is_err()
    );
}

#[test]
fn multicast_to_a_group_nobody_joined_is_counted() {
    if common::open_test_device().query_device().max_mcast_grp == 0 {
        return common::skip(
            "multicast_to_a_group_nobody_joined_is_counted",
            "the device supports no multicast groups",
        );
    }
    let g = group(2);
    let other = group(3);
    let r = ud_side(QKEY);
    r.qp.attach_mcast(g, 0).unwrap();
    let s = [r.mr.sge(0, 2048)];
    r.qp.post_recv(&RecvWr::new(1, &s)).unwrap();
    let sender = ud_side(QKEY);
    let ah = sender.pd.create_ah(&AhAttr::new(other)).unwrap();
    let d = [sender.mr.sge(0, 8)];
    sender
        .qp
        .post_send(&SendWr::send(1, &d).signaled().to(&ah, Qpn::MULTICAST, QKEY))
        .unwrap();
    assert_eq!(wait(&sender.cq, 1)[0].status, WcStatus::Success);
    assert!(quiet(&r.cq, 100).is_empty());
}
