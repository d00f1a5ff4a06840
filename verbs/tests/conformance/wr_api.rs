//! Batch posting (`ibv_wr_*`): a mixed batch posts in order with per-request ids and flags;
//! the calling rules are reported at `complete` with nothing posted; a batch the queue
//! cannot hold, or with one bad request, posts none of its requests; `abort` posts nothing;
//! `send_ops` limits what a QP's batches may hold; UD and memory-window batches.

use std::time::Duration;

use crate::common::{self, Side, on_soft, wait_cq};

use rdmx_verbs::{
    AccessFlags as A, CompletionQueue, MwType, PostError, QpCap, QpInitAttr, Qpn, RecvWr,
    SendFlags, SendOps, WcOpcode, WcStatus, WorkCompletion, WrError,
};

fn pair() -> (Side, Side) {
    let a = Side::new(1 << 16, 10);
    let b = Side::new(1 << 16, 20);
    a.connect(&b.info());
    b.connect(&a.info());
    (a, b)
}

/// Nothing arrives on `cq` within a short while.
fn quiet(cq: &CompletionQueue) {
    let mut wc = [WorkCompletion::EMPTY; 4];
    let n = cq
        .poll_blocking(&mut wc, Duration::from_millis(100))
        .unwrap();
    assert_eq!(n, 0, "unexpected completion {:?}", &wc[..n]);
}

#[test]
fn a_mixed_batch_posts_in_order() {
    let (a, b) = pair();
    let peer = b.info();
    let rkey = b.mr.rkey();
    for i in 0..3 {
        let r = [b.mr.sge(40_000 + i * 1024, 1024)];
        b.qp.post_recv(&RecvWr::new(i as u64, &r)).unwrap();
    }
    a.mr.write(0, b"written in a batch").unwrap();
    b.mr.write(30_000, b"read back").unwrap();
    b.mr.write_u64(32_000, 40).unwrap();
    let mut x = a.qp.wr_start();
    x.wr_id = 1;
    x.rdma_write(rkey, peer.addr + 100).set_sge(a.mr.sge(0, 18));
    x.wr_id = 2;
    x.wr_flags = SendFlags::SIGNALED;
    x.rdma_write_imm(rkey, peer.addr + 200, 0xAB)
        .set_sge_list(&[a.mr.sge(0, 7), a.mr.sge(10, 8)]);
    x.wr_id = 3;
    x.send().set_inline_data_list(&[b"inline ", b"parts"]);
    x.wr_id = 4;
    x.rdma_read(rkey, peer.addr + 30_000)
        .set_sge(a.mr.sge(1000, 9));
    x.wr_id = 5;
    x.atomic_fetch_add(rkey, peer.addr + 32_000, 2)
        .set_sge(a.mr.sge(2000, 8));
    x.wr_id = 6;
    x.send_imm(7).set_sge(a.mr.sge(0, 4));
    assert_eq!(x.len(), 6);
    x.complete().unwrap();
    let wc = a.wait(5);
    let ids: Vec<_> = wc.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(
        ids,
        [2, 3, 4, 5, 6].map(|i| (i, WcStatus::Success)),
        "the unsignaled write completes silently, the rest in order"
    );
    assert_eq!(wc[2].opcode, WcOpcode::RdmaRead);
    assert_eq!(a.mr.to_vec(1000, 9).unwrap(), b"read back");
    assert_eq!(a.mr.read_u64(2000).unwrap(), 40);
    assert_eq!(b.mr.read_u64(32_000).unwrap(), 42);
    let rb = b.wait(3);
    assert_eq!(
        (rb[0].opcode, rb[0].imm(), rb[0].byte_len),
        (WcOpcode::RecvRdmaWithImm, Some(0xAB), 15)
    );
    assert_eq!(b.mr.to_vec(100, 18).unwrap(), b"written in a batch");
    assert_eq!(b.mr.to_vec(200, 15).unwrap(), b"written a batch");
    // (The write with immediate took receive 0.)
    assert_eq!((rb[1].byte_len, rb[1].wr_id), (12, 1));
    assert_eq!(b.mr.to_vec(41_024, 12).unwrap(), b"inline parts");
    assert_eq!((rb[2].imm(), rb[2].byte_len), (Some(7), 4));
}

fn rule(res: Result<(), WrError>) -> (usize, &'static str) {
    match res {
        Err(WrError::Invalid { index, reason }) => (index, reason),
        other => panic!("expected a rule error, got {other:?}"),
    }
}

#[test]
fn calling_rules_are_reported_at_complete_and_nothing_is_posted() {
    let (a, b) = pair();
    let r = [b.mr.sge(0, 64)];
    b.qp.post_recv(&RecvWr::new(1, &r)).unwrap();
    let rkey = b.mr.rkey();
    let sge = a.mr.sge(0, 8);
    // A setter before any builder.
    let mut x = a.qp.wr_start();
    x.set_sge(sge);
    x.send();
    assert_eq!(rule(x.complete()).0, 0);
    // A second data setter (request 1: the send before it is fine).
    let mut x = a.qp.wr_start();
    x.send().set_sge(sge);
    x.send().set_sge(sge).set_inline_data(b"twice");
    assert_eq!(rule(x.complete()).0, 1);
    // Data on a local invalidate; inline data on a read.
    let mut x = a.qp.wr_start();
    x.local_inv(rkey).set_sge(sge);
    assert!(rule(x.complete()).1.contains("no data"));
    let mut x = a.qp.wr_start();
    x.rdma_read(rkey, 0).set_inline_data(b"x");
    assert!(rule(x.complete()).1.contains("inline"));
    // A UD setter on an RC QP.
    let ah =
        a.pd.create_ah(&rdmx_verbs::AhAttr::new(a.ctx.query_gid(1, 0).unwrap()))
            .unwrap();
    let mut x = a.qp.wr_start();
    x.send().set_sge(sge).set_ud_addr(&ah, Qpn(5), 1);
    assert!(rule(x.complete()).1.contains("UD"));
    // Aborting (explicitly or by dropping) posts nothing either.
    let mut x = a.qp.wr_start();
    x.wr_flags = SendFlags::SIGNALED;
    x.send().set_sge(sge);
    x.abort();
    {
        let mut x = a.qp.wr_start();
        x.send().set_sge(sge);
    }
    quiet(&b.cq);
    quiet(&a.cq);
    // The QP is fine: the next batch goes.
    let mut x = a.qp.wr_start();
    x.wr_flags = SendFlags::SIGNALED;
    x.send().set_inline_data(b"after all");
    x.complete().unwrap();
    assert!(a.wait(1)[0].is_ok());
    assert_eq!(b.wait(1)[0].byte_len, 9);
}

#[test]
fn a_batch_is_posted_whole_or_not_at_all() {
    let a = Side::new(1 << 16, 10);
    let b = Side::new(1 << 16, 20);
    // A QP with room for 8 requests.
    let mut attr = QpInitAttr::rc(&a.cq, &a.cq);
    attr.cap = QpCap {
        max_send_wr: 8,
        max_inline_data: 64,
        ..QpCap::default()
    };
    let qp = a.pd.create_qp(&attr).unwrap();
    common::connect_qp(&qp, 10, &b.info(), rdmx_verbs::Mtu::Mtu1024, 14);
    let mut me = a.info();
    me.qpn = qp.qp_num().0;
    b.connect(&me);
    for i in 0..16u64 {
        let r = [b.mr.sge(i as usize * 64, 64)];
        b.qp.post_recv(&RecvWr::new(i, &r)).unwrap();
    }
    let cap = qp.query().unwrap().1.max_send_wr as usize;
    let mut x = qp.wr_start();
    x.wr_flags = SendFlags::SIGNALED;
    for _ in 0..=cap {
        x.send().set_inline_data(b"one of many");
    }
    match x.complete() {
        Err(WrError::Post {
            error: PostError::QueueFull { .. },
            ..
        }) => {}
        other => panic!("a batch past the queue's room: {other:?}"),
    }
    // A bad request in the middle (inline data past the limit).
    if on_soft() {
        let mut x = qp.wr_start();
        x.wr_flags = SendFlags::SIGNALED;
        x.send().set_inline_data(b"fine");
        x.send().set_inline_data(&[0u8; 4096]);
        x.send().set_inline_data(b"fine too");
        match x.complete() {
            Err(WrError::Post {
                index: 1,
                error: PostError::InlineTooLong { .. },
            }) => {}
            other => panic!("an oversized inline request: {other:?}"),
        }
    }
    quiet(&b.cq);
    quiet(&a.cq);
    // A batch that fits goes whole.
    let mut x = qp.wr_start();
    x.wr_flags = SendFlags::SIGNALED;
    for i in 0..cap.min(8) {
        x.wr_id = i as u64;
        x.send().set_inline_data(b"fits");
    }
    x.complete().unwrap();
    let wc = wait_cq(&a.cq, cap.min(8));
    assert!(
        wc.iter()
            .enumerate()
            .all(|(i, w)| w.is_ok() && w.wr_id == i as u64)
    );
    assert_eq!(b.wait(cap.min(8)).len(), cap.min(8));
}

#[test]
fn send_ops_limit_what_a_batch_may_hold() {
    let a = Side::new(1 << 16, 10);
    let b = Side::new(1 << 16, 20);
    let mut attr = QpInitAttr::rc(&a.cq, &a.cq);
    attr.send_ops = SendOps::SEND | SendOps::SEND_WITH_IMM;
    let qp = a.pd.create_qp(&attr).unwrap();
    common::connect_qp(&qp, 10, &b.info(), rdmx_verbs::Mtu::Mtu1024, 14);
    let mut me = a.info();
    me.qpn = qp.qp_num().0;
    b.connect(&me);
    let mut x = qp.wr_start();
    x.send().set_sge(a.mr.sge(0, 8));
    x.rdma_write(b.mr.rkey(), b.info().addr)
        .set_sge(a.mr.sge(0, 8));
    let (i, why) = rule(x.complete());
    assert_eq!(i, 1);
    assert!(why.contains("send_ops"), "{why}");
    let r = [b.mr.sge(0, 64)];
    b.qp.post_recv(&RecvWr::new(1, &r)).unwrap();
    let mut x = qp.wr_start();
    x.wr_flags = SendFlags::SIGNALED;
    x.send_imm(3).set_inline_data(b"allowed");
    x.complete().unwrap();
    assert!(wait_cq(&a.cq, 1)[0].is_ok());
    assert_eq!(b.wait(1)[0].imm(), Some(3));
}

#[test]
fn ud_batches_need_an_address_and_uc_has_no_reads() {
    let ctx = common::open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let ud = pd.create_qp(&QpInitAttr::ud(&cq, &cq)).unwrap();
    common::bring_up_ud(&ud, 0x1111, 0);
    let mr = pd.reg_mr(4096, A::LOCAL_WRITE).unwrap();
    let rq = pd.create_qp(&QpInitAttr::ud(&cq, &cq)).unwrap();
    common::bring_up_ud(&rq, 0x1111, 0);
    let r = [mr.sge(0, 1024)];
    rq.post_recv(&RecvWr::new(9, &r)).unwrap();
    let mut x = ud.wr_start();
    x.send().set_inline_data(b"where to?");
    assert!(rule(x.complete()).1.contains("set_ud_addr"));
    let mut x = ud.wr_start();
    x.rdma_write(mr.rkey(), 0);
    assert!(rule(x.complete()).1.contains("QP type"));
    let mut attr = rdmx_verbs::AhAttr::new(ctx.query_gid(1, 0).unwrap());
    attr.udp_port = common::udp_port(&ctx, 1);
    let ah = pd.create_ah(&attr).unwrap();
    let mut x = ud.wr_start();
    x.wr_flags = SendFlags::SIGNALED;
    x.send_imm(5)
        .set_inline_data(b"datagram")
        .set_ud_addr(&ah, rq.qp_num(), 0x1111);
    x.complete().unwrap();
    let wc = wait_cq(&cq, 2);
    let recv = wc.iter().find(|w| w.opcode == WcOpcode::Recv).unwrap();
    assert_eq!(
        (recv.wr_id, recv.byte_len, recv.imm()),
        (9, 40 + 8, Some(5))
    );
    // UC: no RDMA read or atomics.
    let uc = pd.create_qp(&QpInitAttr::uc(&cq, &cq)).unwrap();
    let mut x = uc.wr_start();
    x.rdma_read(mr.rkey(), 0).set_sge(mr.sge(0, 8));
    assert!(rule(x.complete()).1.contains("QP type"));
}

#[test]
fn windows_bound_and_invalidated_in_a_batch() {
    let (a, b) = pair();
    let mr =
        b.pd.reg_mr(4096, A::LOCAL_WRITE | A::REMOTE_WRITE | A::MW_BIND)
            .unwrap();
    let mw = match b.pd.alloc_mw(MwType::Type2) {
        Ok(mw) => mw,
        Err(e) => return common::skip("windows_bound_and_invalidated_in_a_batch", &e.to_string()),
    };
    let key = mw.rkey().inc();
    let mut x = b.qp.wr_start();
    x.wr_flags = SendFlags::SIGNALED;
    x.wr_id = 1;
    x.bind_mw(mw.bind_wr(key, &mr, 0, 4096, A::REMOTE_WRITE).unwrap());
    x.complete().unwrap();
    let wc = b.wait(1)[0];
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status),
        (1, WcOpcode::BindMw, WcStatus::Success)
    );
    a.mr.write(0, b"via window").unwrap();
    let mut x = a.qp.wr_start();
    x.wr_flags = SendFlags::SIGNALED;
    x.rdma_write(key, mr.addr() + 8).set_sge(a.mr.sge(0, 10));
    x.complete().unwrap();
    assert!(a.wait(1)[0].is_ok());
    assert_eq!(mr.to_vec(8, 10).unwrap(), b"via window");
    let mut x = b.qp.wr_start();
    x.wr_flags = SendFlags::SIGNALED;
    x.local_inv(key);
    x.complete().unwrap();
    assert_eq!(b.wait(1)[0].opcode, WcOpcode::LocalInv);
}
