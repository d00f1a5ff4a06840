//! Tag-matching SRQs: eager messages into matching tagged buffers (mask, order of
//! addition), unexpected and untagged messages into ordinary receives, phase
//! synchronisation, tag deletion (and the error when a message took the tag first), the
//! rendezvous read with its FIN, and the list operations' limits.

use crate::common::{self, PeerInfo, Side, wait_cq};

use rdmx_verbs::{
    AccessFlags as A, CompletionQueue, Context, MemoryRegion, Mtu, OpsWr, PostError,
    ProtectionDomain, QpInitAttr, QueuePair, RecvWr, Rkey, Rvh, SendWr, SharedReceiveQueue,
    SrqInitAttr, TmCaps, Tmh, TmhOp, WcFlags, WcOpcode, WcStatus, WorkCompletion,
};

/// The receiving side: a tag-matching SRQ and one RC QP on it.
struct Receiver {
    ctx: Context,
    _pd: ProtectionDomain,
    cq: CompletionQueue,
    srq: SharedReceiveQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

const TAGS: TmCaps = TmCaps {
    max_num_tags: 8,
    max_ops: 4,
};

/// A sender connected to a receiver on a tag-matching SRQ; `None` (skipped) where the
/// device has no tag matching.
fn setup(test: &str) -> Option<(Side, Receiver)> {
    let ctx = common::open_test_device();
    if ctx.query_device().max_num_tags == 0 {
        common::skip(test, "the device has no tag-matching SRQs");
        return None;
    }
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let srq = pd
        .create_srq_tm(
            &SrqInitAttr {
                max_wr: 64,
                max_sge: 2,
                srq_limit: 0,
            },
            TAGS,
            &cq,
        )
        .unwrap();
    let mut attr = QpInitAttr::rc(&cq, &cq);
    attr.srq = Some(&srq);
    let qp = pd.create_qp(&attr).unwrap();
    let mr = pd.reg_mr(1 << 16, A::LOCAL_WRITE).unwrap();
    let a = Side::new(1 << 16, 100);
    let me = PeerInfo {
        qpn: qp.qp_num().0,
        psn: 500,
        gid: ctx.query_gid(1, 0).unwrap().0,
        udp_port: common::udp_port(&ctx, 1),
        addr: mr.addr(),
        rkey: mr.rkey().0,
    };
    a.connect(&me);
    common::connect_qp(&qp, 500, &a.info(), Mtu::Mtu1024, 14);
    Some((
        a,
        Receiver {
            ctx,
            _pd: pd,
            cq,
            srq,
            qp,
            mr,
        },
    ))
}

/// Sends `data` behind a header of kind `op` with `tag` and context `ctx`.
fn send_tagged(a: &Side, op: TmhOp, tag: u64, ctx: u32, data: &[u8]) {
    let h = Tmh {
        op,
        app_ctx: ctx,
        tag,
    }
    .to_bytes();
    a.mr.write(0, &h).unwrap();
    a.mr.write(16, data).unwrap();
    let s = [a.mr.sge(0, 16 + data.len())];
    a.qp.post_send(&SendWr::send(1, &s).signaled()).unwrap();
    assert!(a.wait(1)[0].is_ok());
}

fn add(r: &Receiver, wr_id: u64, recv_wr_id: u64, off: usize, tag: u64, mask: u64) -> u32 {
    let s = [r.mr.sge(off, 4096)];
    let h = r
        .srq
        .post_srq_ops(&[OpsWr::add(wr_id, recv_wr_id, &s, tag, mask)])
        .unwrap();
    let wc = wait_cq(&r.cq, 1)[0];
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status),
        (wr_id, WcOpcode::TmAdd, WcStatus::Success)
    );
    h[0]
}

fn ordinary(r: &Receiver, n: u64) {
    for i in 0..n {
        let s = [r.mr.sge(32_768 + i as usize * 1024, 1024)];
        r.srq.post_recv(&RecvWr::new(900 + i, &s)).unwrap();
    }
}

#[test]
fn eager_messages_land_in_the_first_matching_tag() {
    let Some((a, r)) = setup("eager_messages_land_in_the_first_matching_tag") else {
        return;
    };
    ordinary(&r, 4);
    add(&r, 1, 11, 0, 0x100, 0xF00);
    add(&r, 2, 12, 4096, 0x1AB, !0);
    add(&r, 3, 13, 8192, 0x7, !0);
    // 0x1AB matches both the masked 0x100 entry and the exact one: the first added wins.
    send_tagged(&a, TmhOp::Eager, 0x1AB, 77, b"first match");
    let wc = wait_cq(&r.cq, 1)[0];
    assert_eq!(
        (wc.opcode, wc.wr_id, wc.byte_len),
        (WcOpcode::TmRecv, 11, 11)
    );
    assert!(
        wc.wc_flags
            .contains(WcFlags::TM_MATCH | WcFlags::TM_DATA_VALID)
    );
    assert_eq!((wc.tm.tag, wc.tm.app_ctx), (0x1AB, 77));
    assert_eq!(r.mr.to_vec(0, 11).unwrap(), b"first match");
    // Now the exact entry takes the next one; 0x7 its own.
    send_tagged(&a, TmhOp::Eager, 0x7, 1, b"seven");
    send_tagged(&a, TmhOp::Eager, 0x1AB, 2, b"second");
    let wc = wait_cq(&r.cq, 2);
    assert_eq!((wc[0].wr_id, wc[0].byte_len), (13, 5));
    assert_eq!((wc[1].wr_id, wc[1].byte_len), (12, 6));
    assert_eq!(r.mr.to_vec(8192, 5).unwrap(), b"seven");
    assert_eq!(r.mr.to_vec(4096, 6).unwrap(), b"second");
    // An untagged message goes to an ordinary receive, whole.
    send_tagged(&a, TmhOp::NoTag, 0, 0, b"plain");
    let wc = wait_cq(&r.cq, 1)[0];
    assert_eq!(
        (wc.opcode, wc.wr_id, wc.byte_len),
        (WcOpcode::TmNoTag, 900, 21)
    );
    assert_eq!(r.mr.to_vec(32_768 + 16, 5).unwrap(), b"plain");
}

#[test]
fn unexpected_messages_and_phase_synchronisation() {
    let Some((a, r)) = setup("unexpected_messages_and_phase_synchronisation") else {
        return;
    };
    ordinary(&r, 4);
    // No tag: unexpected, delivered whole (header included) for software matching.
    send_tagged(&a, TmhOp::Eager, 0x99, 5, b"early");
    let wc = wait_cq(&r.cq, 1)[0];
    assert_eq!(
        (wc.opcode, wc.wr_id, wc.byte_len),
        (WcOpcode::Recv, 900, 21)
    );
    assert!(wc.wc_flags.contains(WcFlags::TM_SYNC_REQ));
    let h = Tmh::parse(&r.mr.to_vec(32_768, 16).unwrap()).unwrap();
    assert_eq!((h.op, h.tag, h.app_ctx), (TmhOp::Eager, 0x99, 5));
    // A tag added before the application reports the unexpected message does not match
    // (the list is out of phase): the next 0x99 message is unexpected too.
    let s = [r.mr.sge(0, 4096)];
    r.srq
        .post_srq_ops(&[OpsWr::add(1, 21, &s, 0x99, !0)])
        .unwrap();
    let wc = wait_cq(&r.cq, 1)[0];
    assert_eq!(wc.opcode, WcOpcode::TmAdd);
    assert!(wc.wc_flags.contains(WcFlags::TM_SYNC_REQ));
    send_tagged(&a, TmhOp::Eager, 0x99, 6, b"again");
    let wc = wait_cq(&r.cq, 1)[0];
    assert_eq!((wc.opcode, wc.wr_id), (WcOpcode::Recv, 901));
    // Reporting both brings it back in phase; the tag matches from then on.
    r.srq.post_srq_ops(&[OpsWr::sync(2, 2)]).unwrap();
    let wc = wait_cq(&r.cq, 1)[0];
    assert_eq!(wc.opcode, WcOpcode::TmSync);
    assert!(!wc.wc_flags.contains(WcFlags::TM_SYNC_REQ));
    send_tagged(&a, TmhOp::Eager, 0x99, 7, b"in phase");
    let wc = wait_cq(&r.cq, 1)[0];
    assert_eq!(
        (wc.opcode, wc.wr_id, wc.tm.app_ctx),
        (WcOpcode::TmRecv, 21, 7)
    );
    assert_eq!(r.mr.to_vec(0, 8).unwrap(), b"in phase");
}

#[test]
fn deleting_a_tag_and_the_list_limits() {
    let Some((a, r)) = setup("deleting_a_tag_and_the_list_limits") else {
        return;
    };
    let h = add(&r, 1, 31, 0, 0x5, !0);
    r.srq.post_srq_ops(&[OpsWr::del(2, h)]).unwrap();
    let wc = wait_cq(&r.cq, 1)[0];
    assert_eq!((wc.opcode, wc.status), (WcOpcode::TmDel, WcStatus::Success));
    // A tag consumed by a message cannot be deleted: TM error (completes even unsignaled).
    let h = add(&r, 3, 32, 0, 0x6, !0);
    send_tagged(&a, TmhOp::Eager, 0x6, 0, b"taken");
    assert_eq!(wait_cq(&r.cq, 1)[0].wr_id, 32);
    let mut del = OpsWr::del(4, h);
    del.flags = rdmx_verbs::OpsFlags::EMPTY;
    r.srq.post_srq_ops(&[del]).unwrap();
    let wc = wait_cq(&r.cq, 1)[0];
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status),
        (4, WcOpcode::TmDel, WcStatus::TmErr)
    );
    // The list holds `max_num_tags`; one call carries at most `max_ops`.
    let s = [r.mr.sge(0, 64)];
    let mut handles = Vec::new();
    for i in 0..TAGS.max_num_tags {
        let mut op = OpsWr::add(10, 10, &s, u64::from(i), !0);
        op.flags = rdmx_verbs::OpsFlags::EMPTY;
        handles.push(r.srq.post_srq_ops(&[op]).unwrap()[0]);
    }
    let full = r.srq.post_srq_ops(&[OpsWr::add(10, 10, &s, 99, !0)]);
    assert!(
        matches!(full, Err((0, PostError::QueueFull { .. }))),
        "{full:?}"
    );
    let many: Vec<_> = (0..=TAGS.max_ops)
        .map(|i| OpsWr::del(0, handles[i as usize]))
        .collect();
    assert!(matches!(
        r.srq.post_srq_ops(&many),
        Err((_, PostError::QueueFull { .. }))
    ));
    // A plain SRQ has no tag list.
    let plain = r
        .ctx
        .alloc_pd()
        .unwrap()
        .create_srq(&SrqInitAttr::default())
        .unwrap();
    assert!(plain.post_srq_ops(&[OpsWr::sync(0, 0)]).is_err());
    let _ = &r.qp;
}

#[test]
fn rendezvous_reads_the_senders_buffer_and_sends_fin() {
    let Some((a, r)) = setup("rendezvous_reads_the_senders_buffer_and_sends_fin") else {
        return;
    };
    // The sender's buffer, readable by the peer, and a receive for the FIN.
    let big =
        a.pd.reg_mr(10_000, A::LOCAL_WRITE | A::REMOTE_READ)
            .unwrap();
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
    big.write(0, &data).unwrap();
    let fin = [a.mr.sge(20_000, 64)];
    a.qp.post_recv(&RecvWr::new(55, &fin)).unwrap();
    let s = [r.mr.sge(0, 16_384)];
    r.srq
        .post_srq_ops(&[OpsWr::add(1, 41, &s, 0xABC, !0)])
        .unwrap();
    assert_eq!(wait_cq(&r.cq, 1)[0].opcode, WcOpcode::TmAdd);
    let rvh = Rvh {
        va: big.addr(),
        rkey: Rkey(big.rkey().0),
        len: 10_000,
    };
    send_tagged(&a, TmhOp::Rndv, 0xABC, 9, &rvh.to_bytes());
    let wc: Vec<WorkCompletion> = wait_cq(&r.cq, 2);
    assert_eq!((wc[0].opcode, wc[0].wr_id), (WcOpcode::TmRecv, 41));
    assert!(wc[0].wc_flags.contains(WcFlags::TM_MATCH));
    assert!(!wc[0].wc_flags.contains(WcFlags::TM_DATA_VALID));
    assert_eq!(
        (wc[1].opcode, wc[1].status, wc[1].byte_len),
        (WcOpcode::TmRecv, WcStatus::Success, 10_000)
    );
    assert!(wc[1].wc_flags.contains(WcFlags::TM_DATA_VALID));
    assert_eq!((wc[1].tm.tag, wc[1].tm.app_ctx), (0xABC, 9));
    assert_eq!(r.mr.to_vec(0, 10_000).unwrap(), data);
    // The sender learns its buffer is free.
    let f = a.wait(1)[0];
    assert_eq!((f.wr_id, f.byte_len), (55, 16));
    let h = Tmh::parse(&a.mr.to_vec(20_000, 16).unwrap()).unwrap();
    assert_eq!((h.op, h.tag, h.app_ctx), (TmhOp::Fin, 0xABC, 9));
}
