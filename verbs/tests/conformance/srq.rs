//! Shared receive queues through the public API over real sockets: eight RC QPs on one SRQ,
//! completions routed by QP number, and the limit event (once, then re-armed).

use crate::common;

use std::time::Duration;

use common::PeerInfo;
use rdmx_verbs::{
    AccessFlags, AsyncEvent, QpCap, QpInitAttr, RecvWr, SendWr, SrqInitAttr, WcStatus,
};

#[test]
fn eight_rc_qps_on_one_srq_and_the_limit_event() {
    // Receiver: one device, one SRQ, eight QPs on it.
    let rctx = common::open_test_device();
    let rpd = rctx.alloc_pd().unwrap();
    let rcq = rctx.create_cq(1024, None).unwrap();
    let srq = rpd
        .create_srq(&SrqInitAttr {
            max_wr: 128,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let rmr = rpd.reg_mr(128 * 256, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..40u64 {
        srq.post_recv(&RecvWr::new(i, &[rmr.sge(i as usize * 256, 256)]))
            .unwrap();
    }
    srq.arm_limit(10).unwrap();
    assert_eq!(srq.query().unwrap().srq_limit, 10);
    // Senders: eight RC QPs on another device.
    let sctx = common::open_test_device();
    let spd = sctx.alloc_pd().unwrap();
    let scq = sctx.create_cq(1024, None).unwrap();
    let smr = spd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mut pairs = Vec::new();
    for k in 0..8u32 {
        let mut ra = QpInitAttr::rc(&rcq, &rcq);
        ra.srq = Some(&srq);
        ra.cap = QpCap {
            max_recv_wr: 0,
            ..QpCap::default()
        };
        let rqp = rpd.create_qp(&ra).unwrap();
        let sqp = spd.create_qp(&QpInitAttr::rc(&scq, &scq)).unwrap();
        let info = |ctx: &rdmx_verbs::Context, qpn: u32, psn: u32| PeerInfo {
            qpn,
            psn,
            gid: ctx.query_gid(1, 0).unwrap().0,
            udp_port: common::udp_port(ctx, 1),
            addr: 0,
            rkey: 0,
        };
        let (rinfo, sinfo) = (
            info(&rctx, rqp.qp_num().0, 100 + k),
            info(&sctx, sqp.qp_num().0, 200 + k),
        );
        common::connect_qp(&rqp, rinfo.psn, &sinfo, rdmx_verbs::Mtu::Mtu1024, 14);
        common::connect_qp(&sqp, sinfo.psn, &rinfo, rdmx_verbs::Mtu::Mtu1024, 14);
        // Posting to a QP's own receive queue is refused: it has an SRQ.
        assert!(rqp.post_recv(&RecvWr::new(0, &[rmr.sge(0, 8)])).is_err());
        pairs.push((rqp, sqp));
    }
    // Each sender sends 4 messages tagged with its index: 32 receives taken, 8 left < 10.
    for (k, (_, sqp)) in pairs.iter().enumerate() {
        for m in 0..4u8 {
            let off = (k * 4 + m as usize) * 16;
            smr.write(off, &[k as u8, m]).unwrap();
            sqp.post_send(&SendWr::send(m as u64, &[smr.sge(off, 2)]).signaled())
                .unwrap();
        }
    }
    let wcs = common::wait_cq(&rcq, 32);
    for wc in &wcs {
        assert_eq!(wc.status, WcStatus::Success);
        let k = pairs
            .iter()
            .position(|(r, _)| r.qp_num() == wc.qp_num)
            .expect("one of ours");
        let tag = rmr.to_vec(wc.wr_id as usize * 256, 2).unwrap();
        assert_eq!(
            tag[0] as usize, k,
            "completion routed to the QP that received it"
        );
    }
    assert_eq!(common::wait_cq(&scq, 32).len(), 32);
    let mut limit_events = 0;
    while let Some(e) = rctx.get_async_event(Duration::from_millis(100)) {
        if e == AsyncEvent::SrqLimitReached(srq.handle()) {
            limit_events += 1;
        }
    }
    assert_eq!(limit_events, 1, "the limit event fires exactly once");
    assert_eq!(srq.query().unwrap().srq_limit, 0, "and disarms");
    // More traffic does not fire it again until it is re-armed.
    let (_, sqp) = &pairs[0];
    sqp.post_send(&SendWr::send(9, &[smr.sge(0, 2)]).signaled())
        .unwrap();
    common::wait_cq(&rcq, 1);
    assert!(rctx.get_async_event(Duration::from_millis(100)).is_none());
    for i in 40..50u64 {
        srq.post_recv(&RecvWr::new(i, &[rmr.sge(i as usize * 256, 256)]))
            .unwrap();
    }
    srq.arm_limit(17).unwrap();
    sqp.post_send(&SendWr::send(10, &[smr.sge(0, 2)]).signaled())
        .unwrap();
    common::wait_cq(&rcq, 1);
    let e = rctx.get_async_event(Duration::from_secs(2));
    assert_eq!(e, Some(AsyncEvent::SrqLimitReached(srq.handle())));
    // Destroying a QP on an SRQ... the receive side QP going to ERR raises last WQE reached.
    let (rqp, _) = &pairs[1];
    let err = rdmx_verbs::QpAttr {
        qp_state: rdmx_verbs::QpState::Err,
        ..Default::default()
    };
    rqp.modify(&err, rdmx_verbs::QpAttrMask::STATE).unwrap();
    let e = rctx.get_async_event(Duration::from_secs(2));
    assert_eq!(e, Some(AsyncEvent::QpLastWqeReached(rqp.qp_num())));
}

#[test]
fn an_initial_limit_is_armed_or_the_srq_is_refused() {
    let ctx = common::open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let srq = pd
        .create_srq(&SrqInitAttr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 4,
        })
        .unwrap();
    assert_eq!(srq.query().unwrap().srq_limit, 4);
    // A limit above the queue depth is refused with a clear error.
    let e = pd
        .create_srq(&SrqInitAttr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 17,
        })
        .unwrap_err();
    assert!(
        matches!(e, rdmx_verbs::VerbsError::InvalidAttribute { .. }),
        "{e}"
    );
}
