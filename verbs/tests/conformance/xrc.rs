//! XRC through the public API: one initiator QP in one process reaches four XRC SRQs behind
//! one target QP in another process.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use rdmx_verbs::{
    AccessFlags, AhAttr, CompletionQueue, Context, Gid, MemoryRegion, Mtu, PostError, QpAttr,
    QpAttrMask as M, QpInitAttr, QpState, QueuePair, RecvWr, Rkey, SendWr, SharedReceiveQueue,
    SrqInitAttr, WcStatus, WorkCompletion, WrOpcode, XrcDomain,
};

fn wait(cq: &CompletionQueue, n: usize) -> Vec<WorkCompletion> {
    common::wait_cq(cq, n)
}

fn ah(gid: [u8; 16], port: u16) -> AhAttr {
    AhAttr::new(Gid(gid)).with_udp_port(port)
}

/// Brings an XRC initiator to RTS towards target `peer_qpn` (also checks that it refuses the
/// responder attributes RC needs).
pub(crate) fn connect_ini(qp: &QueuePair, peer_qpn: u32, peer: AhAttr, psn: u32, peer_psn: u32) {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
        .unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: peer,
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: peer_qpn,
        rq_psn: peer_psn,
        ..QpAttr::default()
    };
    // An XRC initiator must not get the responder attributes RC needs.
    let e = qp.modify(
        &rtr,
        M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MIN_RNR_TIMER,
    );
    assert!(e.is_err());
    qp.modify(
        &rtr,
        M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
    )
    .unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        sq_psn: psn,
        max_rd_atomic: 4,
        ..QpAttr::default()
    };
    qp.modify(
        &rts,
        M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
}

/// Brings an XRC target to RTS for initiator `peer_qpn` (remote write, read and atomics
/// allowed).
pub(crate) fn connect_tgt(qp: &QueuePair, peer_qpn: u32, peer: AhAttr, psn: u32, peer_psn: u32) {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        ..QpAttr::default()
    };
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
        .unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: peer,
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: peer_qpn,
        rq_psn: peer_psn,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        ..QpAttr::default()
    };
    qp.modify(
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
        timeout: 14,
        sq_psn: psn,
        ..QpAttr::default()
    };
    qp.modify(&rts, M::STATE | M::TIMEOUT | M::SQ_PSN).unwrap();
}

/// The target side: an XRC domain with 4 SRQs (each with its own CQ) and one target QP.
struct Target {
    ctx: Context,
    _xrcd: XrcDomain,
    cqs: Vec<CompletionQueue>,
    srqs: Vec<SharedReceiveQueue>,
    tgt: QueuePair,
    mr: MemoryRegion,
}

fn target() -> Target {
    let ctx = common::open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let xrcd = ctx.open_xrcd().unwrap();
    let mr = pd
        .reg_mr(
            1 << 20,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    let mut cqs = Vec::new();
    let mut srqs = Vec::new();
    for k in 0..4usize {
        let cq = ctx.create_cq(256, None).unwrap();
        let srq = pd
            .create_xrc_srq(&xrcd, &cq, &SrqInitAttr::default())
            .unwrap();
        for i in 0..16u64 {
            let s = [mr.sge((k * 16 + i as usize) * 4096, 4096)];
            srq.post_recv(&RecvWr::new(k as u64 * 100 + i, &s)).unwrap();
        }
        cqs.push(cq);
        srqs.push(srq);
    }
    let tgt = pd.create_xrc_target_qp(&xrcd).unwrap();
    // A target QP has no queues of its own.
    let s = [mr.sge(0, 8)];
    assert!(matches!(
        tgt.post_recv(&RecvWr::new(1, &s)),
        Err(PostError::InvalidWorkRequest(_))
    ));
    Target {
        ctx,
        _xrcd: xrcd,
        cqs,
        srqs,
        tgt,
        mr,
    }
}

/// What the initiator needs from the target process.
fn target_info(t: &Target) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&t.tgt.qp_num().0.to_be_bytes());
    v.extend_from_slice(&t.ctx.query_gid(1, 0).unwrap().0);
    v.extend_from_slice(&common::udp_port(&t.ctx, 1).to_be_bytes());
    for s in &t.srqs {
        v.extend_from_slice(&s.srq_num().to_be_bytes());
    }
    v.extend_from_slice(&t.mr.addr().to_be_bytes());
    v.extend_from_slice(&t.mr.rkey().0.to_be_bytes());
    v
}

const INFO_LEN: usize = 4 + 16 + 2 + 16 + 8 + 4;

struct TargetInfo {
    qpn: u32,
    gid: [u8; 16],
    port: u16,
    srqns: [u32; 4],
    addr: u64,
    rkey: u32,
}

fn parse_info(b: &[u8]) -> TargetInfo {
    let u32_at = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().unwrap());
    TargetInfo {
        qpn: u32_at(0),
        gid: b[4..20].try_into().unwrap(),
        port: u16::from_be_bytes(b[20..22].try_into().unwrap()),
        srqns: [u32_at(22), u32_at(26), u32_at(30), u32_at(34)],
        addr: u64::from_be_bytes(b[38..46].try_into().unwrap()),
        rkey: u32_at(46),
    }
}

/// Four rounds of one tagged message to each SRQ through the one initiator QP; all succeed.
fn send_to_each_srq(ini: &QueuePair, cq: &CompletionQueue, mr: &MemoryRegion, srqns: &[u32; 4]) {
    for round in 0..4u8 {
        for (k, &srqn) in srqns.iter().enumerate() {
            let off = (round as usize * 4 + k) * 256;
            mr.write(off, &[k as u8, round, 0xC3]).unwrap();
            let s = [mr.sge(off, 3)];
            ini.post_send(&SendWr::send(off as u64, &s).signaled().to_srq(srqn))
                .unwrap();
        }
    }
    let wcs = wait(cq, 16);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
}

fn check_target(t: &Target) {
    for (k, cq) in t.cqs.iter().enumerate() {
        let wcs = wait(cq, 4);
        for (round, wc) in wcs.iter().enumerate() {
            assert_eq!(wc.status, WcStatus::Success);
            assert_eq!(
                wc.qp_num,
                t.tgt.qp_num(),
                "completions report the target QP"
            );
            assert_eq!(wc.wr_id / 100, k as u64, "landed in SRQ {k}");
            let off = (wc.wr_id % 100 + k as u64 * 16) as usize * 4096;
            assert_eq!(
                t.mr.to_vec(off, 3).unwrap(),
                vec![k as u8, round as u8, 0xC3]
            );
        }
        common::check_srq_posted(&t.srqs[k], 12);
    }
}

#[test]
fn one_initiator_reaches_four_srqs_in_one_process() {
    if !common::open_test_device().query_device().xrc {
        return common::skip(
            "one_initiator_reaches_four_srqs_in_one_process",
            "the device does not support XRC",
        );
    }
    let t = target();
    let info = parse_info(&target_info(&t));
    let ctx = common::open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let ini = pd.create_qp(&QpInitAttr::xrc_send(&cq)).unwrap();
    let me = ah(ctx.query_gid(1, 0).unwrap().0, common::udp_port(&ctx, 1));
    connect_tgt(&t.tgt, ini.qp_num().0, me, 7000, 100);
    connect_ini(&ini, info.qpn, ah(info.gid, info.port), 100, 7000);
    let mr = pd.reg_mr(1 << 16, AccessFlags::LOCAL_WRITE).unwrap();
    // An XRC send must name the remote SRQ.
    let s = [mr.sge(0, 8)];
    assert!(matches!(
        ini.post_send(&SendWr::send(1, &s)),
        Err(PostError::InvalidWorkRequest(_))
    ));
    send_to_each_srq(&ini, &cq, &mr, &info.srqns);
    check_target(&t);
    // A wrong SRQ number is a remote access error; the connection then fails.
    let s = [mr.sge(0, 3)];
    ini.post_send(&SendWr::send(60, &s).signaled().to_srq(0x00AB_CDEF))
        .unwrap();
    let wc = wait(&cq, 1)[0];
    assert_eq!((wc.wr_id, wc.status), (60, WcStatus::RemAccessErr));
}

const CHILD_ENV: &str = "RDMX_XRC_CHILD_ADDR";

#[test]
#[ignore = "run by xrc_across_two_processes as the target process"]
fn xrc_target_child() {
    let Ok(addr) = std::env::var(CHILD_ENV) else {
        return;
    };
    let t = target();
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    tcp.write_all(&target_info(&t)).unwrap();
    let mut b = [0u8; 4 + 16 + 2];
    tcp.read_exact(&mut b).unwrap();
    let ini_qpn = u32::from_be_bytes(b[0..4].try_into().unwrap());
    let gid: [u8; 16] = b[4..20].try_into().unwrap();
    let port = u16::from_be_bytes(b[20..22].try_into().unwrap());
    connect_tgt(&t.tgt, ini_qpn, ah(gid, port), 7000, 100);
    tcp.write_all(b"c").unwrap();
    check_target(&t);
    let mut done = [0u8; 1];
    tcp.read_exact(&mut done).unwrap();
    assert_eq!(t.mr.to_vec(900_000, 9).unwrap(), b"xrc write");
    tcp.write_all(b"k").unwrap();
}

#[test]
fn xrc_across_two_processes() {
    if !common::open_test_device().query_device().xrc {
        return common::skip(
            "xrc_across_two_processes",
            "the device does not support XRC",
        );
    }
    common::with_peer_process("xrc::xrc_target_child", CHILD_ENV, |mut tcp| {
        let mut b = [0u8; INFO_LEN];
        tcp.read_exact(&mut b).unwrap();
        let t = parse_info(&b);
        // Create the initiator, tell the target who we are, wait until it is connected.
        let ctx = common::open_test_device();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(256, None).unwrap();
        let ini = pd.create_qp(&QpInitAttr::xrc_send(&cq)).unwrap();
        let mut me = Vec::new();
        me.extend_from_slice(&ini.qp_num().0.to_be_bytes());
        me.extend_from_slice(&ctx.query_gid(1, 0).unwrap().0);
        me.extend_from_slice(&common::udp_port(&ctx, 1).to_be_bytes());
        tcp.write_all(&me).unwrap();
        let mut c = [0u8; 1];
        tcp.read_exact(&mut c).unwrap();
        let mr = pd.reg_mr(1 << 16, AccessFlags::LOCAL_WRITE).unwrap();
        connect_ini(&ini, t.qpn, ah(t.gid, t.port), 100, 7000);
        send_to_each_srq(&ini, &cq, &mr, &t.srqns);
        mr.write(8192, b"xrc write").unwrap();
        let s = [mr.sge(8192, 9)];
        let w = WrOpcode::RdmaWrite {
            remote_addr: t.addr + 900_000,
            rkey: Rkey(t.rkey),
        };
        ini.post_send(&SendWr::new(50, w, &s).signaled().to_srq(t.srqns[0]))
            .unwrap();
        let d = [mr.sge(16384, 9)];
        let r = WrOpcode::RdmaRead {
            remote_addr: t.addr + 900_000,
            rkey: Rkey(t.rkey),
        };
        ini.post_send(&SendWr::new(51, r, &d).signaled().to_srq(t.srqns[0]))
            .unwrap();
        let wcs = wait(&cq, 2);
        assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
        assert_eq!(mr.to_vec(16384, 9).unwrap(), b"xrc write");
        tcp.write_all(b"d").unwrap();
        let mut ok = [0u8; 1];
        tcp.read_exact(&mut ok).unwrap();
    });
}

/// Batch posting on an XRC initiator: each request names its SRQ (`set_xrc_srqn`), and a
/// batch that leaves one out posts nothing.
#[test]
fn xrc_batches_name_their_srq() {
    if !common::open_test_device().query_device().xrc {
        return common::skip(
            "xrc_batches_name_their_srq",
            "the device does not support XRC",
        );
    }
    let t = target();
    let info = parse_info(&target_info(&t));
    let ctx = common::open_test_device();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256, None).unwrap();
    let ini = pd.create_qp(&QpInitAttr::xrc_send(&cq)).unwrap();
    let me = ah(ctx.query_gid(1, 0).unwrap().0, common::udp_port(&ctx, 1));
    connect_tgt(&t.tgt, ini.qp_num().0, me, 7000, 100);
    connect_ini(&ini, info.qpn, ah(info.gid, info.port), 100, 7000);
    let mut x = ini.wr_start();
    x.send().set_inline_data(b"no srq");
    match x.complete() {
        Err(rdmx_verbs::WrError::Invalid { reason, .. }) => {
            assert!(reason.contains("set_xrc_srqn"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let mut x = ini.wr_start();
    x.wr_flags = rdmx_verbs::SendFlags::SIGNALED;
    for (k, &srqn) in info.srqns.iter().enumerate() {
        x.wr_id = k as u64;
        x.send()
            .set_inline_data(&[k as u8, 0xB7])
            .set_xrc_srqn(srqn);
    }
    x.complete().unwrap();
    let wcs = wait(&cq, 4);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    for (k, cq) in t.cqs.iter().enumerate() {
        let wc = wait(cq, 1)[0];
        assert_eq!((wc.status, wc.wr_id / 100), (WcStatus::Success, k as u64));
        let off = (wc.wr_id % 100 + k as u64 * 16) as usize * 4096;
        assert_eq!(t.mr.to_vec(off, 2).unwrap(), vec![k as u8, 0xB7]);
    }
}
