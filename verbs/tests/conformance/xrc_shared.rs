//! XRC domains shared through a file (`Context::open_xrcd_file`): a target QP one device or
//! process creates delivers into the XRC SRQs of every device and process that opened the
//! same file, and RDMA reaches their registered memory through it.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

use rdmx_verbs::{
    AccessFlags, AhAttr, AsyncEvent, CompletionQueue, Context, Gid, MemoryRegion, QpInitAttr,
    QpState, QueuePair, RecvWr, Rkey, SendWr, SharedReceiveQueue, SrqInitAttr, VerbsError,
    WcOpcode, WcStatus, WrOpcode, XrcDomain,
};

/// A fresh domain file for one test.
fn domain_file(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let p = std::env::temp_dir().join(format!("rdmx-xrcd-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn ah_to(addr: std::net::SocketAddr) -> AhAttr {
    AhAttr::new(Gid::from_ip(addr.ip())).with_udp_port(addr.port())
}

/// The initiator sends from PSN 100, the target from 300.
fn connect_ini(qp: &QueuePair, tgt_qpn: u32, tgt: AhAttr) {
    crate::xrc::connect_ini(qp, tgt_qpn, tgt, 100, 300);
}

fn connect_tgt(qp: &QueuePair, ini_qpn: u32, ini: AhAttr) {
    crate::xrc::connect_tgt(qp, ini_qpn, ini, 300, 100);
    assert_eq!(qp.state(), QpState::Rts, "state as the host reports it");
}

/// One participant's receive side in the shared domain.
struct Side {
    ctx: Context,
    xrcd: XrcDomain,
    cq: CompletionQueue,
    srq: SharedReceiveQueue,
    mr: MemoryRegion,
}

const SLOT: usize = 8192;
const RECVS: u64 = 8;

fn side(path: &PathBuf) -> Side {
    let ctx = rdmx_verbs::Device::open("soft:127.0.0.1").unwrap();
    let xrcd = ctx.open_xrcd_file(path).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd
        .reg_mr(
            1 << 20,
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        )
        .unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let srq = pd
        .create_xrc_srq(&xrcd, &cq, &SrqInitAttr::default())
        .unwrap();
    // One list: a single request to the host for a member.
    let sges: Vec<_> = (0..RECVS)
        .map(|i| [mr.sge(i as usize * SLOT, SLOT)])
        .collect();
    let wrs: Vec<_> = sges
        .iter()
        .enumerate()
        .map(|(i, s)| RecvWr::new(i as u64, s))
        .collect();
    srq.post_recv_list(&wrs).unwrap();
    Side {
        ctx,
        xrcd,
        cq,
        srq,
        mr,
    }
}

fn payload(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// The message sizes sent to each side: one packet, and several (MTU 1024).
const SIZES: [usize; 3] = [100, 3000, 5000];

/// Sends the test messages to `srqn`, then an RDMA WRITE, READ and fetch-and-add on the
/// memory behind it (named through `srqn`, whose PD the target uses).
fn drive(ini: &QueuePair, cq: &CompletionQueue, mr: &MemoryRegion, srqn: u32, remote: (u64, u32)) {
    for (i, &len) in SIZES.iter().enumerate() {
        let off = i * SLOT;
        mr.write(off, &payload(srqn as u8 ^ i as u8, len)).unwrap();
        let s = [mr.sge(off, len)];
        ini.post_send(&SendWr::send(i as u64, &s).signaled().to_srq(srqn))
            .unwrap();
    }
    let (addr, rkey) = remote;
    mr.write(40_000, b"written through a shared target")
        .unwrap();
    let s = [mr.sge(40_000, 31)];
    let w = WrOpcode::RdmaWrite {
        remote_addr: addr + 900_000,
        rkey: Rkey(rkey),
    };
    ini.post_send(&SendWr::new(10, w, &s).signaled().to_srq(srqn))
        .unwrap();
    let d = [mr.sge(50_000, 31)];
    let r = WrOpcode::RdmaRead {
        remote_addr: addr + 900_000,
        rkey: Rkey(rkey),
    };
    ini.post_send(&SendWr::new(11, r, &d).signaled().to_srq(srqn))
        .unwrap();
    let a = [mr.sge(60_000, 8)];
    let f = WrOpcode::AtomicFetchAdd {
        remote_addr: addr + 950_000,
        rkey: Rkey(rkey),
        add: 5,
    };
    ini.post_send(&SendWr::new(12, f, &a).signaled().to_srq(srqn))
        .unwrap();
    let wcs = common::wait_cq(cq, SIZES.len() + 3);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    assert_eq!(
        mr.to_vec(50_000, 31).unwrap(),
        b"written through a shared target",
        "READ returns what the WRITE put there"
    );
    assert_eq!(
        u64::from_ne_bytes(mr.to_vec(60_000, 8).unwrap().try_into().unwrap()),
        0,
        "fetch-and-add returns the original word"
    );
}

/// What the receiving side checks after `drive`.
fn check_side(s: &Side, srqn: u32, tgt: u32) {
    let wcs = common::wait_cq(&s.cq, SIZES.len());
    for (i, wc) in wcs.iter().enumerate() {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        assert_eq!(wc.opcode, WcOpcode::Recv);
        assert_eq!(wc.qp_num.0, tgt, "completions name the target QP");
        assert_eq!(wc.wr_id, i as u64, "receives are taken in order");
        assert_eq!(wc.byte_len as usize, SIZES[i]);
        assert_eq!(
            s.mr.to_vec(i * SLOT, SIZES[i]).unwrap(),
            payload(srqn as u8 ^ i as u8, SIZES[i]),
            "message {i} landed intact in this side's memory"
        );
    }
    assert_eq!(
        s.mr.to_vec(900_000, 31).unwrap(),
        b"written through a shared target"
    );
    assert_eq!(
        u64::from_ne_bytes(s.mr.to_vec(950_000, 8).unwrap().try_into().unwrap()),
        5,
        "fetch-and-add applied to this side's memory"
    );
    let q = s.srq.query().unwrap();
    assert_eq!(q.posted, Some(RECVS as u32 - SIZES.len() as u32));
}

fn soft_only(test: &str) -> bool {
    if !common::on_soft() {
        common::skip(test, "shared XRC domains are tested on the soft provider");
        return false;
    }
    true
}

#[test]
fn one_target_delivers_into_two_devices_srqs() {
    if !soft_only("one_target_delivers_into_two_devices_srqs") {
        return;
    }
    let path = domain_file("devices");
    let host = side(&path);
    let member = side(&path);
    assert!(!host.xrcd.is_remote() && member.xrcd.is_remote());
    assert_eq!(
        member.xrcd.target_addr(1).unwrap(),
        host.xrcd.target_addr(1).unwrap(),
        "the member's targets receive at the host"
    );
    // The member creates the target; it lives in the host's NIC.
    let mpd = member.ctx.alloc_pd().unwrap();
    let tgt = mpd.create_xrc_target_qp(&member.xrcd).unwrap();
    // Both sides see the target; nobody sees a QP number that is not one of the domain's.
    assert!(member.xrcd.has_target(tgt.qp_num()).unwrap());
    assert!(host.xrcd.has_target(tgt.qp_num()).unwrap());
    let other = rdmx_verbs::Qpn(tgt.qp_num().0 ^ 0x5A5A5A);
    assert!(!member.xrcd.has_target(other).unwrap());
    assert!(!host.xrcd.has_target(other).unwrap());
    let ctx = rdmx_verbs::Device::open("soft:127.0.0.1").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let ini = pd.create_qp(&QpInitAttr::xrc_send(&cq)).unwrap();
    connect_tgt(&tgt, ini.qp_num().0, ah_to(ctx.port_addr(1).unwrap()));
    connect_ini(
        &ini,
        tgt.qp_num().0,
        ah_to(member.xrcd.target_addr(1).unwrap()),
    );
    let mr = pd.reg_mr(1 << 17, AccessFlags::LOCAL_WRITE).unwrap();
    for s in [&member, &host] {
        let srqn = s.srq.srq_num();
        drive(&ini, &cq, &mr, srqn, (s.mr.addr(), s.mr.rkey().0));
        check_side(s, srqn, tgt.qp_num().0);
    }
    // Nothing landed on the wrong side.
    assert_eq!(
        host.cq
            .poll_blocking(
                &mut [rdmx_verbs::WorkCompletion::EMPTY; 4],
                Duration::from_millis(50)
            )
            .unwrap(),
        0
    );
    // A list that overflows a member's SRQ stops at the first receive that does not fit.
    let small = mpd
        .create_xrc_srq(
            &member.xrcd,
            &member.cq,
            &SrqInitAttr {
                max_wr: 4,
                ..SrqInitAttr::default()
            },
        )
        .unwrap();
    let one = [member.mr.sge(0, 64)];
    let six: Vec<_> = (0..6).map(|i| RecvWr::new(100 + i, &one)).collect();
    let e = small.post_recv_list(&six).unwrap_err();
    assert!(
        matches!(e, (4, rdmx_verbs::PostError::QueueFull { .. })),
        "{e:?}"
    );
    assert_eq!(small.query().unwrap().posted, Some(4));
    drop(small);
    // The member's SRQ limit event reaches the member's context.
    member.srq.arm_limit(5).unwrap();
    let s = [mr.sge(0, 10)];
    ini.post_send(&SendWr::send(20, &s).signaled().to_srq(member.srq.srq_num()))
        .unwrap();
    common::wait_cq(&cq, 1);
    common::wait_cq(&member.cq, 1);
    let ev = member
        .ctx
        .get_async_event(Duration::from_secs(5))
        .expect("SRQ limit event");
    assert_eq!(ev, AsyncEvent::SrqLimitReached(member.srq.handle()));
    // A member leaving takes its SRQ with it: the target then refuses that SRQ number.
    let gone = member.srq.srq_num();
    drop(member);
    let s = [mr.sge(0, 10)];
    ini.post_send(&SendWr::send(21, &s).signaled().to_srq(gone))
        .unwrap();
    let wc = common::wait_cq(&cq, 1)[0];
    assert_eq!(wc.status, WcStatus::RemAccessErr, "{wc:?}");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn member_process_on_a_closed_host_gets_errors() {
    if !soft_only("member_process_on_a_closed_host_gets_errors") {
        return;
    }
    let path = domain_file("closed");
    let host = side(&path);
    let member = side(&path);
    drop(host);
    let ev = member
        .ctx
        .get_async_event(Duration::from_secs(5))
        .expect("an event when the host goes away");
    assert_eq!(ev, AsyncEvent::SrqError(member.srq.handle()));
    let s = [member.mr.sge(0, 8)];
    assert!(member.srq.post_recv(&RecvWr::new(1, &s)).is_err());
    assert!(matches!(
        member
            .ctx
            .alloc_pd()
            .unwrap()
            .create_xrc_target_qp(&member.xrcd),
        Err(VerbsError::Io { .. })
    ));
    // The next opener of the file starts a new domain.
    let again = side(&path);
    assert!(!again.xrcd.is_remote());
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_file_deleted_and_created_again_is_a_new_domain() {
    if !soft_only("a_file_deleted_and_created_again_is_a_new_domain") {
        return;
    }
    let path = domain_file("again");
    let first = side(&path);
    std::fs::remove_file(&path).unwrap();
    // The host keeps the old file's inode alive, so the new file cannot be mistaken for it.
    let second = side(&path);
    assert!(!first.xrcd.is_remote() && !second.xrcd.is_remote());
    assert_ne!(
        first.xrcd.target_addr(1).unwrap(),
        second.xrcd.target_addr(1).unwrap()
    );
    let third = side(&path);
    assert_eq!(
        third.xrcd.target_addr(1).unwrap(),
        second.xrcd.target_addr(1).unwrap(),
        "later openers join the new domain"
    );
    let _ = std::fs::remove_file(&path);
}

const CHILD_ENV: &str = "RDMX_XRCD_CHILD_ADDR";

#[test]
#[ignore = "run by xrc_domain_shared_with_another_process as the member process"]
fn xrcd_member_child() {
    let Ok(addr) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut n = [0u8; 2];
    tcp.read_exact(&mut n).unwrap();
    let mut p = vec![0u8; usize::from(u16::from_be_bytes(n))];
    tcp.read_exact(&mut p).unwrap();
    let path = PathBuf::from(String::from_utf8(p).unwrap());
    let me = side(&path);
    assert!(me.xrcd.is_remote(), "the parent hosts the domain");
    let tgt = me
        .ctx
        .alloc_pd()
        .unwrap()
        .create_xrc_target_qp(&me.xrcd)
        .unwrap();
    let mut info = Vec::new();
    info.extend_from_slice(&tgt.qp_num().0.to_be_bytes());
    info.extend_from_slice(&me.srq.srq_num().to_be_bytes());
    info.extend_from_slice(&me.mr.addr().to_be_bytes());
    info.extend_from_slice(&me.mr.rkey().0.to_be_bytes());
    tcp.write_all(&info).unwrap();
    let mut b = [0u8; 4 + 16 + 2];
    tcp.read_exact(&mut b).unwrap();
    let ini = u32::from_be_bytes(b[0..4].try_into().unwrap());
    let gid = Gid(b[4..20].try_into().unwrap());
    let port = u16::from_be_bytes(b[20..22].try_into().unwrap());
    connect_tgt(&tgt, ini, AhAttr::new(gid).with_udp_port(port));
    tcp.write_all(b"c").unwrap();
    let mut go = [0u8; 1];
    tcp.read_exact(&mut go).unwrap();
    check_side(&me, me.srq.srq_num(), tgt.qp_num().0);
    tcp.write_all(b"k").unwrap();
    tcp.read_exact(&mut go).unwrap();
}

#[test]
fn xrc_domain_shared_with_another_process() {
    if !soft_only("xrc_domain_shared_with_another_process") {
        return;
    }
    let path = domain_file("procs");
    let p = path.to_str().unwrap().as_bytes().to_vec();
    let path2 = path.clone();
    common::with_peer_process(
        "xrc_shared::xrcd_member_child",
        CHILD_ENV,
        move |mut tcp| {
            let host = side(&path2);
            assert!(!host.xrcd.is_remote());
            let ctx = rdmx_verbs::Device::open("soft:127.0.0.1").unwrap();
            let pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(64, None).unwrap();
            let ini = pd.create_qp(&QpInitAttr::xrc_send(&cq)).unwrap();
            let mr = pd.reg_mr(1 << 17, AccessFlags::LOCAL_WRITE).unwrap();
            tcp.write_all(&(p.len() as u16).to_be_bytes()).unwrap();
            tcp.write_all(&p).unwrap();
            let mut b = [0u8; 4 + 4 + 8 + 4];
            tcp.read_exact(&mut b).unwrap();
            let tgt = u32::from_be_bytes(b[0..4].try_into().unwrap());
            let srqn = u32::from_be_bytes(b[4..8].try_into().unwrap());
            let addr = u64::from_be_bytes(b[8..16].try_into().unwrap());
            let rkey = u32::from_be_bytes(b[16..20].try_into().unwrap());
            let mut me = Vec::new();
            me.extend_from_slice(&ini.qp_num().0.to_be_bytes());
            let a = ctx.port_addr(1).unwrap();
            me.extend_from_slice(&Gid::from_ip(a.ip()).0);
            me.extend_from_slice(&a.port().to_be_bytes());
            tcp.write_all(&me).unwrap();
            let mut c = [0u8; 1];
            tcp.read_exact(&mut c).unwrap();
            // The child's target lives in this process's host NIC.
            connect_ini(&ini, tgt, ah_to(host.xrcd.target_addr(1).unwrap()));
            drive(&ini, &cq, &mr, srqn, (addr, rkey));
            // Every operation on the child's side has completed: it may look now.
            tcp.write_all(b"g").unwrap();
            // The host's own SRQ through the child's target, on the same connection.
            drive(
                &ini,
                &cq,
                &mr,
                host.srq.srq_num(),
                (host.mr.addr(), host.mr.rkey().0),
            );
            check_side(&host, host.srq.srq_num(), tgt);
            tcp.read_exact(&mut c).unwrap();
            assert_eq!(&c, b"k", "the member process checked its side");
            tcp.write_all(b"x").unwrap();
        },
    );
    let _ = std::fs::remove_file(&path);
}
