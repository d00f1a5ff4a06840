//! Memory windows: type 1 (bound with `bind_mw`, key tag advancing, any QP of the domain)
//! and type 2 (bound by a work request, one QP, invalidated locally or by the peer's send
//! with invalidate); access through a closed, rebound, foreign or too-narrow window fails
//! with a remote access error; a region with bound windows is not deregistered from under
//! them.

use crate::common::{self, PeerInfo, Side, wait_cq};

use rdmx_verbs::{
    AccessFlags as A, CompletionQueue, Context, MemoryRegion, MemoryWindow, Mtu, MwBind, MwType,
    PostError, ProtectionDomain, QpCap, QpInitAttr, QueuePair, RecvWr, Rkey, SendWr, VerbsError,
    WcOpcode, WcStatus, WrOpcode,
};

/// The side that owns the memory: windows live in its protection domain.
struct Host {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    /// The region windows open (registered with `MW_BIND`).
    mr: MemoryRegion,
}

const ALL: A = A(A::LOCAL_WRITE.0 | A::REMOTE_WRITE.0 | A::REMOTE_READ.0 | A::REMOTE_ATOMIC.0);

fn host() -> Host {
    let ctx = common::open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024, None).unwrap();
    let mr = pd.reg_mr(1 << 16, ALL | A::MW_BIND).unwrap();
    Host { ctx, pd, cq, mr }
}

/// A peer connected to a new QP of the host. The host's QP grants all remote access (the
/// windows decide what is reachable).
fn link(h: &Host, psn: u32) -> (Side, QueuePair) {
    let a = Side::new(1 << 16, psn);
    let mut attr = QpInitAttr::rc(&h.cq, &h.cq);
    attr.cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        ..QpCap::default()
    };
    let qp = h.pd.create_qp(&attr).unwrap();
    let info = PeerInfo {
        qpn: qp.qp_num().0,
        psn: psn + 1000,
        gid: h.ctx.query_gid(1, 0).unwrap().0,
        udp_port: common::udp_port(&h.ctx, 1),
        addr: h.mr.addr(),
        rkey: h.mr.rkey().0,
    };
    a.connect(&info);
    common::connect_qp(&qp, psn + 1000, &a.info(), Mtu::Mtu1024, 14);
    (a, qp)
}

/// An RDMA write of `data` from `a` to `addr` under `rkey`; its completion status.
fn write(a: &Side, addr: u64, rkey: Rkey, data: &[u8]) -> WcStatus {
    a.mr.write(0, data).unwrap();
    let s = [a.mr.sge(0, data.len())];
    let op = WrOpcode::RdmaWrite {
        remote_addr: addr,
        rkey,
    };
    a.qp.post_send(&SendWr::new(1, op, &s).signaled()).unwrap();
    a.wait(1)[0].status
}

/// An RDMA read of `len` bytes at `addr` under `rkey` into `a`; status and bytes.
fn read(a: &Side, addr: u64, rkey: Rkey, len: usize) -> (WcStatus, Vec<u8>) {
    let d = [a.mr.sge(4096, len)];
    let op = WrOpcode::RdmaRead {
        remote_addr: addr,
        rkey,
    };
    a.qp.post_send(&SendWr::new(2, op, &d).signaled()).unwrap();
    let st = a.wait(1)[0].status;
    (st, a.mr.to_vec(4096, len).unwrap())
}

/// Posts a type 2 bind (or any local operation) on `qp` and returns its completion.
fn post_local(h: &Host, qp: &QueuePair, op: WrOpcode) -> rdmx_verbs::WorkCompletion {
    qp.post_send(&SendWr::new(7, op, &[]).signaled()).unwrap();
    wait_cq(&h.cq, 1)[0]
}

fn alloc(h: &Host, t: MwType) -> Option<MemoryWindow> {
    match h.pd.alloc_mw(t) {
        Ok(mw) => Some(mw),
        Err(VerbsError::Unsupported(why)) => {
            common::skip("memory windows", why);
            None
        }
        Err(e) => panic!("alloc_mw: {e}"),
    }
}

#[test]
fn type1_window_opens_a_range_and_rebinding_retires_the_old_key() {
    let h = host();
    let Some(mw) = alloc(&h, MwType::Type1) else {
        return;
    };
    assert_eq!(mw.mw_type(), MwType::Type1);
    let (a, qp) = link(&h, 100);
    let base = h.mr.addr() + 8192;
    let k1 = qp
        .bind_mw(
            &mw,
            &MwBind::new(1, &h.mr, 8192, 4096, A::REMOTE_READ | A::REMOTE_WRITE),
        )
        .unwrap();
    assert_eq!(k1, mw.rkey());
    let wc = wait_cq(&h.cq, 1)[0];
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::BindMw)
    );
    assert_eq!(k1.0 >> 8, mw.rkey().0 >> 8);
    // Through the window: a write lands in the region, a read returns it.
    assert_eq!(
        write(&a, base + 100, k1, b"through a window"),
        WcStatus::Success
    );
    assert_eq!(h.mr.to_vec(8192 + 100, 16).unwrap(), b"through a window");
    assert_eq!(
        read(&a, base + 100, k1, 16),
        (WcStatus::Success, b"through a window".to_vec())
    );
    // The region cannot be deregistered while the window is bound.
    let mr2 = h.pd.reg_mr(4096, ALL | A::MW_BIND).unwrap();
    let mw2 = alloc(&h, MwType::Type1).unwrap();
    qp.bind_mw(&mw2, &MwBind::new(2, &mr2, 0, 4096, A::REMOTE_READ))
        .unwrap();
    assert!(wait_cq(&h.cq, 1)[0].is_ok());
    let (mr2, e) = mr2.deregister().unwrap_err();
    assert!(matches!(e, VerbsError::Busy(_)), "{e}");
    // Dropping it keeps the registration for the window: a peer still reads through it.
    mr2.write(0, b"kept alive").unwrap();
    let addr2 = mr2.addr();
    drop(mr2);
    assert_eq!(
        read(&a, addr2, mw2.rkey(), 10),
        (WcStatus::Success, b"kept alive".to_vec())
    );
    drop(mw2);
    // Rebinding gives a new key; the old one stops working.
    let k2 = qp
        .bind_mw(&mw, &MwBind::new(3, &h.mr, 8192, 4096, A::REMOTE_READ))
        .unwrap();
    assert_ne!(k2, k1);
    assert_eq!(k2.0 & !0xFF, k1.0 & !0xFF, "same window, new tag");
    assert!(wait_cq(&h.cq, 1)[0].is_ok());
    assert_eq!(read(&a, base, k2, 8).0, WcStatus::Success);
    // The new binding is read-only: a write through it is refused.
    assert_eq!(write(&a, base, k2, b"nope"), WcStatus::RemAccessErr);
}

#[test]
fn type1_window_refuses_the_old_key_and_out_of_range_access() {
    let h = host();
    let Some(mw) = alloc(&h, MwType::Type1) else {
        return;
    };
    let (a, qp) = link(&h, 200);
    let base = h.mr.addr() + 1024;
    let k1 = qp
        .bind_mw(&mw, &MwBind::new(1, &h.mr, 1024, 512, A::REMOTE_WRITE))
        .unwrap();
    let k2 = qp
        .bind_mw(&mw, &MwBind::new(2, &h.mr, 1024, 512, A::REMOTE_WRITE))
        .unwrap();
    assert_eq!(k2, k1.inc());
    assert!(wait_cq(&h.cq, 2).iter().all(|w| w.is_ok()));
    assert_eq!(
        write(&a, base + 508, k2, b"12345678"),
        WcStatus::RemAccessErr,
        "past the end"
    );
    // A fresh connection (the failed access moved both QPs to the error state).
    let (a, _qp) = link(&h, 300);
    assert_eq!(write(&a, base, k1, b"old key"), WcStatus::RemAccessErr);
    let (a, _qp) = link(&h, 400);
    assert_eq!(write(&a, base, k2, b"new key"), WcStatus::Success);
    assert_eq!(h.mr.to_vec(1024, 7).unwrap(), b"new key");
    // Unbinding closes it.
    let (a, qp) = link(&h, 500);
    qp.bind_mw(&mw, &MwBind::unbind(3)).unwrap();
    assert!(wait_cq(&h.cq, 1)[0].is_ok());
    assert_eq!(
        write(&a, base, mw.rkey(), b"closed"),
        WcStatus::RemAccessErr
    );
}

#[test]
fn type2_window_belongs_to_one_qp_and_is_invalidated() {
    let h = host();
    let Some(mw) = alloc(&h, MwType::Type2) else {
        return;
    };
    assert!(
        matches!(
            alloc(&h, MwType::Type2).unwrap().bind_wr(
                mw.rkey().inc(),
                &h.mr,
                0,
                64,
                A::REMOTE_READ
            ),
            Err(VerbsError::InvalidArgument(_))
        ),
        "a key of another window"
    );
    let (a, qp) = link(&h, 600);
    let (c, _other) = link(&h, 700);
    let key = mw.rkey().inc();
    let bind = mw
        .bind_wr(key, &h.mr, 0, 4096, A::REMOTE_READ | A::REMOTE_WRITE)
        .unwrap();
    let wc = post_local(&h, &qp, WrOpcode::BindMw(bind));
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::BindMw)
    );
    assert_eq!(
        write(&a, h.mr.addr() + 64, key, b"type two"),
        WcStatus::Success
    );
    assert_eq!(h.mr.to_vec(64, 8).unwrap(), b"type two");
    // Another QP of the same domain cannot use it.
    assert_eq!(
        write(&c, h.mr.addr() + 64, key, b"foreign"),
        WcStatus::RemAccessErr
    );
    // Local invalidate closes it.
    let wc = post_local(&h, &qp, WrOpcode::LocalInv { rkey: key });
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::LocalInv)
    );
    assert_eq!(
        write(&a, h.mr.addr() + 64, key, b"closed"),
        WcStatus::RemAccessErr
    );
    // It can be bound again (on a new connection) under the next key.
    let (a, qp) = link(&h, 800);
    let key2 = key.inc();
    let bind = mw.bind_wr(key2, &h.mr, 0, 4096, A::REMOTE_READ).unwrap();
    assert!(post_local(&h, &qp, WrOpcode::BindMw(bind)).is_ok());
    assert_eq!(read(&a, h.mr.addr() + 64, key2, 8).0, WcStatus::Success);
    // Binding it again without invalidating is a bind error (and ends the QP).
    let again = mw
        .bind_wr(key2.inc(), &h.mr, 0, 64, A::REMOTE_READ)
        .unwrap();
    assert_eq!(
        post_local(&h, &qp, WrOpcode::BindMw(again)).status,
        WcStatus::MwBindErr
    );
}

#[test]
fn send_with_invalidate_closes_the_peers_window() {
    let h = host();
    let Some(mw) = alloc(&h, MwType::Type2) else {
        return;
    };
    let (a, qp) = link(&h, 900);
    let key = mw.rkey().inc();
    let bind = mw.bind_wr(key, &h.mr, 0, 4096, A::REMOTE_WRITE).unwrap();
    assert!(post_local(&h, &qp, WrOpcode::BindMw(bind)).is_ok());
    assert_eq!(write(&a, h.mr.addr(), key, b"before"), WcStatus::Success);
    // The peer sends "done" and invalidates the window with the same message.
    let r = [h.mr.sge(60_000, 64)];
    qp.post_recv(&RecvWr::new(5, &r)).unwrap();
    a.mr.write(0, b"done").unwrap();
    let s = [a.mr.sge(0, 4)];
    a.qp.post_send(&SendWr::new(3, WrOpcode::SendWithInv { rkey: key }, &s).signaled())
        .unwrap();
    assert!(a.wait(1)[0].is_ok());
    let wc = wait_cq(&h.cq, 1)[0];
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 4));
    assert_eq!(wc.invalidated_rkey(), Some(key));
    assert_eq!(wc.imm(), None);
    assert_eq!(
        write(&a, h.mr.addr(), key, b"after"),
        WcStatus::RemAccessErr
    );
    assert_eq!(h.mr.to_vec(0, 6).unwrap(), b"before");
}

#[test]
fn send_with_invalidate_of_a_foreign_key_is_an_invalid_request() {
    let h = host();
    if alloc(&h, MwType::Type2).is_none() {
        return;
    }
    let (a, qp) = link(&h, 1100);
    let r = [h.mr.sge(0, 64)];
    qp.post_recv(&RecvWr::new(5, &r)).unwrap();
    let s = [a.mr.sge(0, 4)];
    // The region's own key is not a window bound to this QP.
    let op = WrOpcode::SendWithInv { rkey: h.mr.rkey() };
    a.qp.post_send(&SendWr::new(3, op, &s).signaled()).unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::RemInvReqErr);
    assert_ne!(wait_cq(&h.cq, 1)[0].status, WcStatus::Success);
}

#[test]
fn binds_are_checked_at_post_time() {
    let h = host();
    let (Some(t1), Some(t2)) = (alloc(&h, MwType::Type1), alloc(&h, MwType::Type2)) else {
        return;
    };
    let (_a, qp) = link(&h, 1200);
    let plain = h.pd.reg_mr(4096, ALL).unwrap();
    let e = qp
        .bind_mw(&t1, &MwBind::new(1, &plain, 0, 64, A::REMOTE_READ))
        .unwrap_err();
    assert!(
        matches!(e, PostError::InvalidWorkRequest(_)),
        "no MW_BIND: {e:?}"
    );
    let e = qp
        .bind_mw(&t1, &MwBind::new(1, &h.mr, 1 << 16, 1, A::REMOTE_READ))
        .unwrap_err();
    assert!(
        matches!(e, PostError::InvalidWorkRequest(_)),
        "out of range: {e:?}"
    );
    let e = qp
        .bind_mw(&t1, &MwBind::new(1, &h.mr, 0, 64, A::LOCAL_WRITE))
        .unwrap_err();
    assert!(
        matches!(e, PostError::InvalidWorkRequest(_)),
        "local access: {e:?}"
    );
    let e = qp
        .bind_mw(&t2, &MwBind::new(1, &h.mr, 0, 64, A::REMOTE_READ))
        .unwrap_err();
    assert!(
        matches!(e, PostError::InvalidWorkRequest(_)),
        "type 2 via bind_mw: {e:?}"
    );
    assert!(
        t1.bind_wr(t1.rkey().inc(), &h.mr, 0, 64, A::REMOTE_READ)
            .is_err()
    );
    let other_pd = h.ctx.alloc_pd().unwrap();
    let foreign = other_pd.reg_mr(4096, ALL | A::MW_BIND).unwrap();
    assert!(
        t2.bind_wr(t2.rkey().inc(), &foreign, 0, 64, A::REMOTE_READ)
            .is_err()
    );
}
