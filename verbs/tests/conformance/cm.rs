//! The connection manager (`rdma_*`) on the soft provider over loopback: connect / accept
//! with private data, traffic over the connection, reject, unreachable, disconnect from
//! either side, receives posted before accept, a backlog of concurrent clients, UD
//! multicast, and garbage sent to a listener. Every wait is bounded.
//!
//! On a libibverbs device (`RDMX_TEST_DEVICE`, feature `ibverbs`) the cases that do not
//! look at the soft CM's sockets run through librdmacm, on the first IPv4 address among
//! port 1's GIDs.

use crate::common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Duration;

use rdmx_verbs::cm::mad::{CmMsg, Mad};
use rdmx_verbs::cm::msg::Ids;
use rdmx_verbs::cm::{CONNECT_PRIVATE_MAX, status};
use rdmx_verbs::soft::wire::IcrcPath;
use rdmx_verbs::{
    CmError, CmEvent, CmEventKind as K, CmId, CompletionQueue, ConnParam, Context, EventChannel,
    MemoryRegion, PortSpace, QpCap, QpInitAttr, QpState, Qpn, Rkey, SendFlags, WcOpcode, WcStatus,
};

const WAIT: Duration = Duration::from_secs(10);

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
}

/// Skips on a device that is not a soft one (the case looks at the soft CM's sockets).
fn soft_only(test: &str) -> bool {
    if common::on_soft() {
        return true;
    }
    common::skip(test, "the case looks at the soft CM's own sockets");
    false
}

/// The IP address the CM binds to on the test device: loopback on a soft device, else the
/// first IPv4 address among port 1's GIDs (`None`: the case is skipped).
fn cm_ip(ctx: &Context) -> Option<IpAddr> {
    if ctx.port_addr(1).is_ok() {
        return Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    let n = ctx.query_port(1).map_or(0, |p| p.gid_tbl_len).min(64);
    (0..n)
        .filter_map(|i| ctx.query_gid(1, i).ok())
        .map(|g| g.to_ip())
        .find(|ip| ip.is_ipv4() && !ip.is_unspecified())
}

/// Whether the CM cases can run on the test device (soft, or hardware with an IPv4 GID).
fn cm_device(test: &str) -> bool {
    if common::on_soft() || cm_ip(&common::open_test_device()).is_some() {
        return true;
    }
    common::skip(test, "no IPv4 address among port 1's GIDs");
    false
}

/// The next event but TIMEWAIT_EXIT (librdmacm reports it some time after a connection
/// closed; the soft CM does not).
fn next_event(ch: &EventChannel, timeout: Duration) -> Option<CmEvent> {
    loop {
        let ev = ch.get_event(timeout)?;
        if ev.kind.as_str() != "RDMA_CM_EVENT_TIMEWAIT_EXIT" {
            return Some(ev);
        }
    }
}

fn expect(ch: &EventChannel, kind: K) -> CmEvent {
    match next_event(ch, WAIT) {
        Some(ev) if ev.kind == kind => ev,
        Some(ev) => panic!("waiting for {kind}: got {} (status {})", ev.kind, ev.status),
        None => panic!("waiting for {kind}: nothing within {WAIT:?}"),
    }
}

/// An ID's QP with its receive CQ and a registered buffer.
struct Qp {
    cq: CompletionQueue,
    mr: MemoryRegion,
}

/// A QP with a send and a receive CQ (so that `get_send_comp` and `get_recv_comp` each see
/// their own).
fn make_qp(id: &CmId) -> Qp {
    let ctx = id.context().expect("the ID is bound").clone();
    let send_cq = ctx.create_cq(64, None).unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let mut attr = QpInitAttr::rc(&send_cq, &cq);
    attr.cap = QpCap {
        max_send_wr: 32,
        max_recv_wr: 32,
        ..QpCap::default()
    };
    attr.sq_sig_all = true;
    id.create_qp(None, &attr).unwrap();
    assert_eq!(id.qp().unwrap().state(), QpState::Init);
    let mr = id.reg_write(4096).unwrap();
    Qp { cq, mr }
}

/// A listener on its own device and channel, on an ephemeral loopback port.
struct Server {
    ch: EventChannel,
    id: CmId,
    _ctx: Context,
}

fn server(backlog: usize) -> Server {
    let ch = EventChannel::new().unwrap();
    let ctx = common::open_test_device();
    let ip = cm_ip(&ctx).expect("an address for the CM (cm_device)");
    let id = ch.create_id_on(&ctx, PortSpace::Tcp).unwrap();
    id.bind_addr(SocketAddr::new(ip, 0)).unwrap();
    id.listen(backlog).unwrap();
    assert_ne!(id.local_addr().unwrap().port(), 0);
    Server { ch, id, _ctx: ctx }
}

/// A client ID on its own device and channel, resolved to `dst`, with a QP.
fn client(dst: SocketAddr) -> (EventChannel, CmId, Qp) {
    let ch = EventChannel::new().unwrap();
    let ctx = common::open_test_device();
    let id = ch.create_id_on(&ctx, PortSpace::Tcp).unwrap();
    // On hardware, from the device's own address (the kernel would pick by route).
    let src = (!common::on_soft()).then(|| SocketAddr::new(dst.ip(), 0));
    id.resolve_addr(src, dst, Duration::from_secs(2)).unwrap();
    expect(&ch, K::AddrResolved);
    id.resolve_route(Duration::from_secs(2)).unwrap();
    expect(&ch, K::RouteResolved);
    let qp = make_qp(&id);
    (ch, id, qp)
}

fn wait_wc(cq: &CompletionQueue) -> rdmx_verbs::WorkCompletion {
    let mut wc = [rdmx_verbs::WorkCompletion::EMPTY];
    let n = cq.poll_blocking(&mut wc, WAIT).unwrap();
    assert_eq!(n, 1, "a completion within {WAIT:?}");
    wc[0]
}

/// Connects a client to `srv` with the given private data; returns both sides.
fn connect_pair(
    srv: &Server,
    hello: &[u8],
    welcome: &[u8],
) -> ((EventChannel, CmId, Qp), (CmId, Qp)) {
    let (cch, cid, cqp) = client(srv.id.local_addr().unwrap());
    cid.connect(&ConnParam::with_private_data(hello)).unwrap();
    let req = expect(&srv.ch, K::ConnectRequest);
    assert_eq!(req.listen_id.as_ref(), Some(&srv.id));
    assert_eq!(req.private_data.len(), CONNECT_PRIVATE_MAX);
    assert_eq!(&req.private_data[..hello.len()], hello);
    let peer = req.conn.expect("the requester's parameters");
    assert_eq!(peer.qp_num, cid.qp().unwrap().qp_num());
    let sid = req.id.clone();
    let sqp = make_qp(&sid);
    sid.accept(&ConnParam::with_private_data(welcome)).unwrap();
    assert_eq!(sid.qp().unwrap().state(), QpState::Rts);
    let est = expect(&cch, K::Established);
    assert_eq!(&est.private_data[..welcome.len()], welcome);
    assert_eq!(est.conn.unwrap().qp_num, sid.qp().unwrap().qp_num());
    expect(&srv.ch, K::Established);
    assert_eq!(cid.qp().unwrap().state(), QpState::Rts);
    ((cch, cid, cqp), (sid, sqp))
}

#[test]
fn connect_accept_with_private_data_then_send_and_rdma_write() {
    if !cm_device("connect_accept_with_private_data_then_send_and_rdma_write") {
        return;
    }
    let srv = server(4);
    let (cch, cid, cqp) = client(srv.id.local_addr().unwrap());
    // The client tells the server where to write, in its private data.
    let mut hello = b"hi".to_vec();
    hello.extend_from_slice(&cqp.mr.addr().to_be_bytes());
    hello.extend_from_slice(&cqp.mr.rkey().0.to_be_bytes());
    cid.connect(&ConnParam::with_private_data(&hello)).unwrap();
    let req = expect(&srv.ch, K::ConnectRequest);
    assert_eq!(&req.private_data[..hello.len()], &hello[..]);
    assert!(req.private_data[hello.len()..].iter().all(|b| *b == 0));
    let addr = u64::from_be_bytes(req.private_data[2..10].try_into().unwrap());
    let rkey = Rkey(u32::from_be_bytes(
        req.private_data[10..14].try_into().unwrap(),
    ));
    let sid = req.id.clone();
    assert_eq!(sid.peer_addr(), cid.local_addr());
    let sqp = make_qp(&sid);
    // A receive posted before accept is used by the client's first send.
    sid.post_recv(7, &sqp.mr, 0, 256).unwrap();
    sid.accept(&ConnParam::with_private_data(b"welcome"))
        .unwrap();
    let est = expect(&cch, K::Established);
    assert_eq!(&est.private_data[..7], b"welcome");
    assert_eq!(est.private_data.len(), 196);
    expect(&srv.ch, K::Established);

    cqp.mr.write(0, b"a message over rdma_cm").unwrap();
    cid.post_send(1, &cqp.mr, 0, 22, SendFlags::SIGNALED)
        .unwrap();
    assert_eq!(cid.get_send_comp(WAIT).unwrap().status, WcStatus::Success);
    let wc = sid.get_recv_comp(WAIT).unwrap();
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (7, WcStatus::Success, 22)
    );
    assert_eq!(sqp.mr.to_vec(0, 22).unwrap(), b"a message over rdma_cm");

    sqp.mr.write(1024, b"written by the server").unwrap();
    sid.post_write(2, &sqp.mr, 1024, 21, addr + 512, rkey, SendFlags::SIGNALED)
        .unwrap();
    let wc = sid.get_send_comp(WAIT).unwrap();
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(cqp.mr.to_vec(512, 21).unwrap(), b"written by the server");
    let _ = (&cqp.cq, &sqp.cq);
}

#[test]
fn private_data_longer_than_the_message_carries_is_refused() {
    if !cm_device("private_data_longer_than_the_message_carries_is_refused") {
        return;
    }
    let srv = server(1);
    let (_cch, cid, _cqp) = client(srv.id.local_addr().unwrap());
    let e = cid.connect(&ConnParam::with_private_data(&[1; 57]));
    assert!(
        matches!(e, Err(CmError::PrivateDataTooLong { max: 56, .. })),
        "{e:?}"
    );
    cid.connect(&ConnParam::with_private_data(&[1; 56]))
        .unwrap();
    let req = expect(&srv.ch, K::ConnectRequest);
    let e = req.id.reject(&[0; 149]);
    assert!(
        matches!(e, Err(CmError::PrivateDataTooLong { max: 148, .. })),
        "{e:?}"
    );
    let _q = make_qp(&req.id);
    let e = req.id.accept(&ConnParam::with_private_data(&[0; 197]));
    assert!(
        matches!(e, Err(CmError::PrivateDataTooLong { max: 196, .. })),
        "{e:?}"
    );
}

#[test]
fn reject_reaches_the_client_with_its_private_data() {
    if !cm_device("reject_reaches_the_client_with_its_private_data") {
        return;
    }
    let srv = server(1);
    let (cch, cid, _cqp) = client(srv.id.local_addr().unwrap());
    cid.connect(&ConnParam::default()).unwrap();
    let req = expect(&srv.ch, K::ConnectRequest);
    req.id.reject(b"go away").unwrap();
    let rej = expect(&cch, K::Rejected);
    assert_eq!(rej.status, 28, "consumer-defined reject reason");
    assert_eq!(rej.private_data.len(), 148);
    assert_eq!(&rej.private_data[..7], b"go away");
    assert_eq!(rej.id, cid);
    // Accepting after the reject is refused.
    assert!(req.id.accept(&ConnParam::default()).is_err());
}

#[test]
fn a_bound_socket_without_listener_rejects_with_invalid_service_id() {
    if !soft_only("a_bound_socket_without_listener_rejects_with_invalid_service_id") {
        return;
    }
    let ch = EventChannel::new().unwrap();
    let id = ch.create_id(PortSpace::Tcp).unwrap();
    id.bind_addr(loopback(0)).unwrap();
    let (cch, cid, _cqp) = client(id.local_addr().unwrap());
    cid.connect(&ConnParam::default()).unwrap();
    let rej = expect(&cch, K::Rejected);
    assert_eq!(rej.status, 8);
    assert_eq!(id.stats().rx_no_listener, 1);
}

#[test]
fn connect_to_nobody_is_unreachable_in_bounded_time() {
    if !soft_only("connect_to_nobody_is_unreachable_in_bounded_time") {
        return;
    }
    // A port nobody listens on: bound, then closed.
    let port = UdpSocket::bind(loopback(0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (cch, cid, _cqp) = client(loopback(port));
    cid.connect(&ConnParam::default()).unwrap();
    let ev = expect(&cch, K::Unreachable);
    assert_eq!(ev.status, status::TIMED_OUT);
    assert!(cid.stats().tx_mads >= 5, "the REQ was sent again");
}

fn check_disconnect(from_client: bool) {
    let srv = server(2);
    let ((cch, cid, cqp), (sid, sqp)) = connect_pair(&srv, b"c", b"s");
    // Outstanding receives on both sides flush when the QPs go to ERR.
    cid.post_recv(11, &cqp.mr, 0, 64).unwrap();
    sid.post_recv(12, &sqp.mr, 0, 64).unwrap();
    if from_client {
        cid.disconnect().unwrap();
    } else {
        sid.disconnect().unwrap();
    }
    expect(&cch, K::Disconnected);
    expect(&srv.ch, K::Disconnected);
    assert_eq!(cid.qp().unwrap().state(), QpState::Err);
    assert_eq!(sid.qp().unwrap().state(), QpState::Err);
    let wc = wait_wc(&cqp.cq);
    assert_eq!((wc.wr_id, wc.status), (11, WcStatus::WrFlushErr));
    let wc = wait_wc(&sqp.cq);
    assert_eq!((wc.wr_id, wc.status), (12, WcStatus::WrFlushErr));
    // Disconnecting again is refused; nothing more arrives.
    assert!(cid.disconnect().is_err());
    assert!(next_event(&cch, Duration::from_millis(200)).is_none());
}

#[test]
fn disconnect_from_the_client_reaches_both_sides() {
    if cm_device("disconnect_from_the_client_reaches_both_sides") {
        check_disconnect(true);
    }
}

#[test]
fn disconnect_from_the_server_reaches_both_sides() {
    if cm_device("disconnect_from_the_server_reaches_both_sides") {
        check_disconnect(false);
    }
}

#[test]
fn a_backlog_of_concurrent_clients_is_served() {
    if !cm_device("a_backlog_of_concurrent_clients_is_served") {
        return;
    }
    const CLIENTS: usize = 4;
    let srv = server(CLIENTS);
    let dst = srv.id.local_addr().unwrap();
    // The clients' sends have completed before the server disconnects them.
    let sent = std::sync::Arc::new(std::sync::Barrier::new(CLIENTS + 1));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let sent = std::sync::Arc::clone(&sent);
            std::thread::spawn(move || {
                let (cch, cid, cqp) = client(dst);
                cid.connect(&ConnParam::with_private_data(&[i as u8]))
                    .unwrap();
                let est = expect(&cch, K::Established);
                assert_eq!(est.private_data[0], 100 + i as u8);
                cqp.mr.write(0, &[i as u8; 8]).unwrap();
                cid.post_send(1, &cqp.mr, 0, 8, SendFlags::SIGNALED)
                    .unwrap();
                assert_eq!(cid.get_send_comp(WAIT).unwrap().status, WcStatus::Success);
                sent.wait();
                let ev = expect(&cch, K::Disconnected);
                assert_eq!(ev.id, cid);
            })
        })
        .collect();
    // Requests and establishments of different clients interleave on the channel.
    let mut accepted = Vec::new();
    let mut established = 0;
    while accepted.len() < CLIENTS || established < CLIENTS {
        let ev = next_event(&srv.ch, WAIT).expect("a server event");
        match ev.kind {
            K::ConnectRequest => {
                let i = ev.private_data[0];
                let sqp = make_qp(&ev.id);
                ev.id.post_recv(1, &sqp.mr, 0, 64).unwrap();
                ev.id
                    .accept(&ConnParam::with_private_data(&[100 + i]))
                    .unwrap();
                accepted.push((i, ev.id.clone(), sqp));
            }
            K::Established => established += 1,
            other => panic!("unexpected {other} (status {})", ev.status),
        }
    }
    for (i, id, qp) in &accepted {
        let wc = id.get_recv_comp(WAIT).unwrap();
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(qp.mr.to_vec(0, 8).unwrap(), vec![*i; 8]);
    }
    sent.wait();
    for (_, id, _) in &accepted {
        id.disconnect().unwrap();
    }
    for c in clients {
        c.join().unwrap();
    }
    for _ in 0..CLIENTS {
        expect(&srv.ch, K::Disconnected);
    }
}

/// A multicast group unique to this process.
fn group() -> IpAddr {
    let pid = std::process::id();
    IpAddr::V4(Ipv4Addr::new(239, 78, (pid % 250) as u8, 1))
}

#[test]
fn ud_multicast_join_send_receive_leave() {
    if !cm_device("ud_multicast_join_send_receive_leave") {
        return;
    }
    let g = group();
    let mut sides = Vec::new();
    for _ in 0..2 {
        let ch = EventChannel::new().unwrap();
        let ctx = common::open_test_device();
        let ip = cm_ip(&ctx).expect("an address for the CM (cm_device)");
        let id = ch.create_id_on(&ctx, PortSpace::Udp).unwrap();
        id.resolve_addr(Some(SocketAddr::new(ip, 0)), SocketAddr::new(g, 7174), WAIT)
            .unwrap();
        expect(&ch, K::AddrResolved);
        let cq = ctx.create_cq(64, None).unwrap();
        let mut attr = QpInitAttr::ud(&cq, &cq);
        attr.sq_sig_all = true;
        id.create_qp(None, &attr).unwrap();
        assert_eq!(id.qp().unwrap().state(), QpState::Rts);
        let mr = id.reg_msgs(4096).unwrap();
        sides.push((ch, id, cq, mr, ctx));
    }
    let (rch, rid, _rcq, rmr, _) = &sides[0];
    for i in 0..4 {
        rid.post_recv(i, rmr, i as usize * 1024, 1024).unwrap();
    }
    rid.join_multicast(g).unwrap();
    let ev = expect(rch, K::MulticastJoin);
    let ud = ev.ud.expect("UD parameters");
    assert_eq!(ud.qp_num, Qpn::MULTICAST);
    assert_eq!(ud.qkey, rdmx_verbs::cm::RDMA_UDP_QKEY);
    assert!(rid.join_multicast(g).is_err(), "joined twice");

    let (sch, sid, _scq, smr, _) = &sides[1];
    sid.join_multicast(g).unwrap();
    let ud = expect(sch, K::MulticastJoin).ud.unwrap();
    let ah = sid.pd().unwrap().create_ah(&ud.ah_attr).unwrap();
    smr.write(0, b"to the group").unwrap();
    sid.post_ud_send(1, smr, 0, 12, &ah, ud.qp_num, ud.qkey, SendFlags::SIGNALED)
        .unwrap();
    assert_eq!(sid.get_send_comp(WAIT).unwrap().status, WcStatus::Success);
    let wc = rid.get_recv_comp(WAIT).unwrap();
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(wc.src_qp, sid.qp().unwrap().qp_num());
    let grh = rdmx_verbs::ah::GRH_LEN;
    assert_eq!(
        rmr.to_vec(wc.wr_id as usize * 1024 + grh, 12).unwrap(),
        b"to the group"
    );

    // After leaving, the receiver gets nothing more.
    rid.leave_multicast(g).unwrap();
    assert!(rid.leave_multicast(g).is_err(), "left twice");
    sid.post_ud_send(2, smr, 0, 12, &ah, ud.qp_num, ud.qkey, SendFlags::SIGNALED)
        .unwrap();
    assert_eq!(sid.get_send_comp(WAIT).unwrap().status, WcStatus::Success);
    assert!(matches!(
        rid.get_recv_comp(Duration::from_millis(300)),
        Err(CmError::Timeout(_))
    ));
    sid.leave_multicast(g).unwrap();
}

#[test]
fn garbage_sent_to_a_listener_is_dropped_and_counted() {
    if !soft_only("garbage_sent_to_a_listener_is_dropped_and_counted") {
        return;
    }
    let srv = server(2);
    let dst = srv.id.local_addr().unwrap();
    let sock = UdpSocket::bind(loopback(0)).unwrap();
    let src = sock.local_addr().unwrap();
    let path = IcrcPath::new(src, dst);
    let rtu = Mad {
        tid: 1,
        msg: CmMsg::Rtu(Ids {
            local_comm_id: 5,
            remote_comm_id: 6,
            remote_qpn: 0,
        }),
    };
    let good = rtu.to_frame(0, &path);
    let mut bad_icrc = good;
    *bad_icrc.last_mut().unwrap() ^= 0xFF;
    let mut bad_class = good;
    bad_class[12 + 8 + 1] = 0x04; // management class
    let mut bad_attr = good;
    bad_attr[12 + 8 + 17] = 0x19; // attribute ID 0x0019 (LAP)
    let mut bad_qp = good;
    bad_qp[7] = 2; // destination QP 2
    let malformed: Vec<Vec<u8>> = vec![
        Vec::new(),
        vec![0xFF; 3],
        vec![0x64; 40],
        good[..100].to_vec(),
        good[..good.len() - 1].to_vec(),
        bad_icrc.to_vec(),
        bad_class.to_vec(),
        bad_attr.to_vec(),
        bad_qp.to_vec(),
        [good.as_slice(), &[0u8; 4]].concat(),
        (0..1500u32).map(|i| (i * 7) as u8).collect(),
    ];
    for m in &malformed {
        sock.send_to(m, dst).unwrap();
    }
    // A well-formed RTU for a communication nobody has: counted, not answered.
    sock.send_to(&good, dst).unwrap();
    // A legitimate connection still works.
    let ((_cch, cid, cqp), (sid, sqp)) = connect_pair(&srv, b"ok", b"ok");
    sid.post_recv(1, &sqp.mr, 0, 64).unwrap();
    cid.post_send(1, &cqp.mr, 0, 8, SendFlags::SIGNALED)
        .unwrap();
    assert_eq!(sid.get_recv_comp(WAIT).unwrap().status, WcStatus::Success);
    let s = srv.id.stats();
    assert_eq!(s.rx_malformed, malformed.len() as u64, "{s:?}");
    assert_eq!(s.rx_unknown_comm_id, 1, "{s:?}");
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut buf = [0u8; 512];
    assert!(sock.recv_from(&mut buf).is_err(), "nothing answers garbage");
}

#[test]
fn a_slow_accept_is_covered_by_an_mra() {
    if !cm_device("a_slow_accept_is_covered_by_an_mra") {
        return;
    }
    let srv = server(1);
    let (cch, cid, _cqp) = client(srv.id.local_addr().unwrap());
    cid.connect(&ConnParam::default()).unwrap();
    let req = expect(&srv.ch, K::ConnectRequest);
    // Longer than the REQ's response time-out (~537 ms): the client sends the REQ again,
    // the server answers the duplicate with an MRA, and the client waits.
    std::thread::sleep(Duration::from_millis(1500));
    let _q = make_qp(&req.id);
    req.id.accept(&ConnParam::default()).unwrap();
    expect(&cch, K::Established);
    expect(&srv.ch, K::Established);
    if common::on_soft() {
        let s = srv.id.stats();
        assert!(s.rx_mads >= 3, "REQ, its duplicate(s) and the RTU: {s:?}");
    }
    assert!(
        srv.ch.try_get_event().is_none(),
        "one request, not one per duplicate"
    );
}

#[test]
fn dropping_a_connected_id_disconnects_the_peer() {
    if !cm_device("dropping_a_connected_id_disconnects_the_peer") {
        return;
    }
    let srv = server(1);
    let ((cch, cid, _cqp), (sid, _sqp)) = connect_pair(&srv, b"c", b"s");
    drop(sid);
    let ev = expect(&cch, K::Disconnected);
    assert_eq!(ev.id, cid);
    assert_eq!(cid.qp().unwrap().state(), QpState::Err);
}
