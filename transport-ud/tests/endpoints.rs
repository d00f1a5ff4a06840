//! UD endpoints over soft devices: on loopback with the workers' background threads, and on
//! a simulated lossy net driven on its virtual clock.
#![expect(clippy::unwrap_used, reason = "test")]

#[allow(dead_code, reason = "the simulations' generator is not used here")]
mod common;

use std::time::Duration;

use rdmx_core::worker::{Worker, WorkerHandle};
use rdmx_core::{Config, DisconnectCause, Error};
use rdmx_ud::UdTransport;
use rdmx_verbs::DeviceOptions;
use rdmx_verbs::soft::{SimLink, SimNet};

fn cfg() -> Config {
    Config {
        credits: 16,
        srq_depth: 64,
        pool_max: 64 << 20,
        ..Config::default()
    }
}

fn node(cfg: &Config, opts: Option<DeviceOptions>) -> (Worker, UdTransport) {
    let w = Worker::open(cfg, opts, &[UdTransport::RECV_BUF_SIZE]).unwrap();
    let t = UdTransport::attach(&w, cfg).unwrap();
    (w, t)
}

/// A node on loopback with its background thread.
fn started(cfg: &Config) -> (Worker, UdTransport, WorkerHandle) {
    let (w, t) = node(cfg, None);
    let h = w.start().unwrap();
    (w, t, h)
}

fn msg(n: u32, len: usize) -> Vec<u8> {
    let mut m: Vec<u8> = (0..len).map(|i| (i as u32 * 7 + n) as u8).collect();
    if len >= 4 {
        m[..4].copy_from_slice(&n.to_le_bytes());
    }
    m
}

#[test]
fn messages_of_every_size_arrive_once_and_in_order_on_loopback() {
    let cfg = cfg();
    let (_wa, a, _ha) = started(&cfg);
    let (_wb, b, _hb) = started(&cfg);
    let (ea, eb) = a.connect_local(&b).unwrap();
    let sizes = [0usize, 1, 100, 4000, 4096, 9000, 70_000, 300_000];
    let n = 400u32;
    let sender = std::thread::spawn(move || {
        for i in 0..n {
            let len = sizes[i as usize % sizes.len()];
            ea.send(&msg(i, len)).unwrap();
        }
        ea
    });
    for i in 0..n {
        let m = eb.recv_timeout(Duration::from_secs(10)).unwrap();
        let len = sizes[i as usize % sizes.len()];
        assert_eq!(&m[..], &msg(i, len)[..], "message {i}");
    }
    let ea = sender.join().unwrap();
    // An echo back.
    eb.send(b"back").unwrap();
    assert_eq!(
        &ea.recv_timeout(Duration::from_secs(5)).unwrap()[..],
        b"back"
    );
    ea.close().unwrap();
    match eb.recv_timeout(Duration::from_secs(5)) {
        Err(Error::Disconnected(DisconnectCause::PeerClosed)) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(a.stats().malformed, 0);
}

#[test]
fn exactly_once_over_a_lossy_reordering_simulated_net() {
    let net = SimNet::new(
        5,
        SimLink {
            loss: 0.05,
            duplicate: 0.02,
            jitter: Duration::from_micros(50),
            ..SimLink::default()
        },
    );
    let mut cfg = cfg();
    cfg.device = "soft:10.0.0.1".into();
    let (wa, a) = node(&cfg, Some(DeviceOptions::default().with_sim(&net)));
    cfg.device = "soft:10.0.0.2".into();
    let (wb, b) = node(&cfg, Some(DeviceOptions::default().with_sim(&net)));
    let (ea, eb) = a.connect_local(&b).unwrap();
    let total = 2_000u32;
    let (mut sent, mut got) = (0u32, 0u32);
    let mut steps = 0;
    while got < total {
        steps += 1;
        assert!(steps < 2_000_000, "stuck: sent {sent}, got {got}");
        while sent < total {
            let len = [5usize, 300, 5000, 20_000][sent as usize % 4];
            match ea.try_send(&msg(sent, len)) {
                Ok(()) => sent += 1,
                Err(Error::WouldBlock) => break,
                Err(e) => panic!("{e}"),
            }
        }
        while let Ok(m) = eb.try_recv() {
            let len = [5usize, 300, 5000, 20_000][got as usize % 4];
            assert_eq!(&m[..], &msg(got, len)[..], "message {got}");
            got += 1;
        }
        let mut next = net.next_event();
        for w in [&wa, &wb] {
            if let Some(t) = w.drive() {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        let now = net.clock().now();
        let t = next.map_or(now + Duration::from_millis(1), |t| t.max(now));
        net.advance_to(
            t.min(now + Duration::from_millis(1))
                .max(now + Duration::from_nanos(1)),
        );
    }
    let st = net.stats();
    assert!(st.lost > 0 && st.duplicated > 0, "{st:?}");
    // The transports count what the net did to their sessions.
    let (sa, sb) = (a.stats(), b.stats());
    assert!(sa.retransmits > 0, "{sa:?}");
    assert!(sb.duplicates > 0 && sb.out_of_order > 0, "{sb:?}");
    eprintln!(
        "{total} messages, {steps} steps, virtual {:?}, {st:?}",
        net.elapsed()
    );
}

#[test]
fn endpoints_connect_over_the_side_channel() {
    let cfg = cfg();
    let (_wa, a, _ha) = started(&cfg);
    let (_wb, b, _hb) = started(&cfg);
    let listener = b.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    let server = std::thread::spawn(move || {
        let ep = listener.accept_timeout(Duration::from_secs(10)).unwrap();
        while let Ok(m) = ep.recv() {
            ep.send(&m).unwrap();
        }
        (listener, ep.disconnect_cause())
    });
    let ep = a.connect(addr).unwrap();
    for i in 0..200u32 {
        let m = msg(i, [3usize, 5000, 40_000][i as usize % 3]);
        ep.send(&m).unwrap();
        assert_eq!(
            &ep.recv_timeout(Duration::from_secs(10)).unwrap()[..],
            &m[..]
        );
    }
    ep.close().unwrap();
    let (_listener, cause) = server.join().unwrap();
    assert_eq!(cause, Some(DisconnectCause::PeerClosed));
}

#[test]
fn a_listener_refuses_other_transports_and_garbage_and_goes_on() {
    use rdmx_core::bootstrap::{self, Frame, PathInfo, Transport};
    let cfg = cfg();
    let (_wb, b, _hb) = started(&cfg);
    let listener = b.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    let server = std::thread::spawn(move || {
        let ep = listener.accept_timeout(Duration::from_secs(20)).unwrap();
        assert_eq!(
            &ep.recv_timeout(Duration::from_secs(10)).unwrap()[..],
            b"real"
        );
        ep
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    // An RC endpoint's Hello: refused, saying why.
    let mut s = bootstrap::connect(addr, deadline).unwrap();
    let rc = bootstrap::EndpointInfo {
        transport: Transport::Rc,
        qpn: 5,
        psn: 7,
        mtu: 4096,
        primary: PathInfo {
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1],
            udp_port: 4791,
            port_num: 1,
        },
        alternate: None,
        srq_nums: Vec::new(),
        credits: 8,
        mailbox_addr: 0,
        mailbox_rkey: 0,
        max_message: 1 << 20,
        eager_limit: 0,
        context_id: 1,
        node_id: 1,
        tag: 0,
        xrc_target: None,
        xrc_target_path: None,
        xrc_target_alt: None,
        xrc_in_use: None,
        token: 0,
        app_data: Vec::new(),
    };
    bootstrap::send_frame(&mut s, &Frame::Hello(rc), deadline).unwrap();
    match bootstrap::recv_frame(&mut s, deadline) {
        Ok(Frame::Reject(why)) => assert!(why.contains("transport"), "{why}"),
        other => panic!("{other:?}"),
    }
    // (Kept open: the listener's exchange with us waits for us to hang up after its reject,
    // and must not hold up the next one. A silent connection must not either.)
    let silent = std::net::TcpStream::connect(addr).unwrap();
    // Garbage.
    {
        use std::io::Write;
        let mut g = std::net::TcpStream::connect(addr).unwrap();
        g.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    }
    // A UD endpoint still gets in.
    let (_wa, a, _ha) = started(&cfg);
    let ep = a.connect(addr).unwrap();
    ep.send(b"real").unwrap();
    let accepted = server.join().unwrap();
    // (The failed exchanges left no session behind.)
    assert_eq!(b.endpoint_count(), 1);
    drop((s, silent, accepted));
}

#[test]
fn connecting_to_a_listener_that_refuses_is_a_clear_error() {
    use rdmx_core::bootstrap;
    let tcp = bootstrap::listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = tcp.local_addr().unwrap();
    let refuser = std::thread::spawn(move || {
        let (mut s, _) = bootstrap::accept(&tcp).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let _ = bootstrap::expect_hello(&mut s, deadline).unwrap();
        bootstrap::reject(&mut s, "not today", deadline).unwrap();
    });
    let cfg = cfg();
    let (_w, a) = node(&cfg, None);
    match a.connect(addr) {
        Err(Error::Bootstrap(e)) => assert!(e.to_string().contains("not today"), "{e}"),
        other => panic!("{other:?}"),
    }
    refuser.join().unwrap();
    assert_eq!(a.endpoint_count(), 0);
}

/// Datagrams from a raw UD queue pair: garbage, unknown sessions, forged tokens, a real
/// session's id with a forged sequence number. Each is dropped and counted; the endpoint
/// goes on.
#[test]
fn forged_and_garbage_datagrams_are_counted_and_harm_nothing() {
    let cfg = cfg();
    let (_wa, a, _ha) = started(&cfg);
    let (_wb, b, _hb) = started(&cfg);
    let (ea, eb) = a.connect_local(&b).unwrap();
    ea.send(b"before").unwrap();
    assert_eq!(
        &eb.recv_timeout(Duration::from_secs(5)).unwrap()[..],
        b"before"
    );

    // The attacker: a plain UD queue pair on a device of its own.
    let stranger = common::Stranger::aimed_at(&b);
    let mut datagrams: Vec<Vec<u8>> =
        vec![Vec::new(), b"GET / HTTP/1.1\r\n".to_vec(), vec![0xff; 4000]];
    for s in [0u32, 1, 7, 60_000, u32::MAX] {
        datagrams.push(common::forged_data(s, 0x1234_5678, 0));
        datagrams.push(common::forged_data(s, 0, 12345));
    }
    stranger.send_all(&datagrams);
    // Everything lands and is judged; the endpoint still works, and nothing was delivered.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        // 3 malformed; 8 for sessions that do not exist (1, 7, 60,000, u32::MAX); the 2
        // for session 0 fail its token inside the session.
        let s = b.stats();
        if s.malformed + s.unknown_session >= 11 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{s:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    ea.send(b"after").unwrap();
    assert_eq!(
        &eb.recv_timeout(Duration::from_secs(5)).unwrap()[..],
        b"after"
    );
    assert!(eb.try_recv().is_err());
    let s = b.stats();
    assert_eq!((s.malformed, s.unknown_session), (3, 8), "{s:?}");
}

#[test]
fn forty_senders_share_a_receive_budget_of_four_windows() {
    // The receiver's queue of 128 buffers keeps 64 for control datagrams; the other 64 back
    // four windows of 16 at a time, for 40 sessions that all send at once: most start
    // with no window, ask, wait in line, and get windows recalled from the others.
    let server_cfg = Config {
        srq_depth: 128,
        ..cfg()
    };
    let (ws, s) = node(&server_cfg, None);
    let _hs = ws.start().unwrap();
    let per_client = 10;
    let n = 60u32;
    let sizes = [8usize, 100, 3000, 9000];
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for _ in 0..4 {
        let (wc, c) = node(&cfg(), None);
        let hc = wc.start().unwrap();
        let mut eps = Vec::new();
        for _ in 0..per_client {
            let (ec, es) = c.connect_local(&s).unwrap();
            eps.push(ec);
            receivers.push(es);
        }
        senders.push(std::thread::spawn(move || {
            for i in 0..n {
                for ep in &eps {
                    ep.send(&msg(i, sizes[i as usize % sizes.len()])).unwrap();
                }
            }
            (eps, hc, wc, c)
        }));
    }
    assert_eq!(s.endpoint_count(), 40);
    let mut got = vec![0u32; receivers.len()];
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while got.iter().any(|&g| g < n) {
        assert!(
            std::time::Instant::now() < deadline,
            "stuck: {got:?} {:?}",
            s.stats()
        );
        let mut any = false;
        for (r, g) in receivers.iter().zip(got.iter_mut()) {
            while let Ok(m) = r.try_recv() {
                assert_eq!(&m[..], &msg(*g, sizes[*g as usize % sizes.len()])[..]);
                *g += 1;
                any = true;
            }
        }
        if !any {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let st = s.stats();
    let nic = ws.verbs_context().counters();
    eprintln!(
        "server: {st:?}; datagrams dropped for lack of a buffer: {}",
        nic.rx_no_recv
    );
    assert!(st.credit_waits > 0 && st.recalls > 0, "{st:?}");
    assert_eq!(st.malformed + st.unknown_session, 0, "{st:?}");
    for t in senders {
        let (eps, _hc, wc, c) = t.join().unwrap();
        assert_eq!(
            wc.verbs_context().counters().rx_no_recv,
            0,
            "{:?}",
            c.stats()
        );
        drop(eps);
    }
    assert_eq!(nic.rx_no_recv, 0, "a datagram found no posted buffer");
}

#[test]
fn a_worker_started_and_sent_to_at_once_takes_the_first_datagram_promptly() {
    // Its background thread used to take the application for a poller during the first
    // 2 ms (the last poll's time started at 0), leave the completion queue unarmed and
    // sleep until its 100 ms tick. Nothing here polls: only the background thread can
    // take the datagram.
    let cfg = cfg();
    for _ in 0..3 {
        let (ws, s) = node(&cfg, None);
        let _hs = ws.start().unwrap();
        let (wc, c) = node(&cfg, None);
        let _hc = wc.start().unwrap();
        let (ec, _es) = c.connect_local(&s).unwrap();
        let t0 = std::time::Instant::now();
        ec.send(b"first").unwrap();
        while s.stats().datagrams_received == 0 {
            assert!(
                t0.elapsed() < Duration::from_millis(60),
                "the first datagram waited for the background thread's tick"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

#[test]
fn a_slow_receiver_bounds_what_it_holds_and_nothing_is_dropped() {
    // 16 credits: the receiver holds at most 16 datagrams' worth of unread messages (and one
    // message that completed beyond them); the sender's blocking sends wait meanwhile.
    let cfg = cfg();
    let (wa, a, _ha) = started(&cfg);
    let (wb, b, _hb) = started(&cfg);
    let (ea, eb) = a.connect_local(&b).unwrap();
    let sizes = [8usize, 1000, 5000, 9000];
    let n = 3000u32;
    let sender = std::thread::spawn(move || {
        for i in 0..n {
            ea.send(&msg(i, sizes[i as usize % sizes.len()])).unwrap();
        }
        ea
    });
    // Slow: one message every half millisecond for a while, looking at what b holds.
    let biggest = 9000usize.div_ceil(4096 - 40 - 32 - 4) as u64 + 1;
    let mut worst = 0;
    for i in 0..300u32 {
        std::thread::sleep(Duration::from_micros(500));
        let held = b.stats().held_datagrams;
        worst = worst.max(held);
        assert!(
            held <= 16 + biggest,
            "b holds {held} datagrams of unread messages"
        );
        let m = eb.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(&m[..], &msg(i, sizes[i as usize % sizes.len()])[..]);
    }
    assert!(worst >= 8, "the receiver never filled its window ({worst})");
    for i in 300..n {
        let m = eb.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(
            &m[..],
            &msg(i, sizes[i as usize % sizes.len()])[..],
            "message {i}"
        );
    }
    let _ea = sender.join().unwrap();
    for w in [&wa, &wb] {
        assert_eq!(w.verbs_context().counters().rx_no_recv, 0);
    }
    assert_eq!(b.stats().refused, 0, "{:?}", b.stats());
}

fn keyed(key: &[u8]) -> Config {
    Config {
        auth_key: Some(rdmx_core::bootstrap::AuthKey::new(key).unwrap()),
        ..cfg()
    }
}

const KEY: &[u8] = b"the UD sessions' shared key";

/// With a key, every session datagram carries its connection's tag (a key derived from the
/// bootstrap's nonces): messages of every size, around the datagram size too, go both ways
/// whole and in order, over the bootstrap and in-process.
#[test]
fn keyed_sessions_carry_messages_of_every_size() {
    let kcfg = keyed(KEY);
    let (_wa, a, _ha) = started(&kcfg);
    let (_wb, b, _hb) = started(&kcfg);
    let l = b.listen("127.0.0.1:0").unwrap();
    let addr = l.local_addr();
    let acc = std::thread::spawn(move || l.accept_timeout(Duration::from_secs(5)).unwrap());
    let over_tcp = (a.connect(addr).unwrap(), acc.join().unwrap());
    let in_process = a.connect_local(&b).unwrap();
    let sizes = [
        0usize, 1, 100, 4000, 4040, 4056, 4096, 9000, 70_000, 300_000,
    ];
    for (ea, eb) in [&over_tcp, &in_process] {
        for (i, len) in sizes.iter().enumerate() {
            ea.send(&msg(i as u32, *len)).unwrap();
            eb.send(&msg(i as u32 + 100, *len)).unwrap();
        }
        for (i, len) in sizes.iter().enumerate() {
            let m = eb.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(&m[..], &msg(i as u32, *len)[..], "message {i}");
            let m = ea.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(&m[..], &msg(i as u32 + 100, *len)[..], "message {i} back");
        }
    }
    for t in [&a, &b] {
        let s = t.stats();
        assert_eq!(
            (s.unauthenticated, s.malformed, s.refused),
            (0, 0, 0),
            "{s:?}"
        );
    }
    // In-process pairs need the same key on both sides, or none.
    let (_wn, none, _hn) = started(&cfg());
    assert!(matches!(
        a.connect_local(&none),
        Err(Error::InvalidArgument(_))
    ));
    let (_wo, other, _ho) = started(&keyed(b"another key, just as long"));
    assert!(matches!(
        a.connect_local(&other),
        Err(Error::InvalidArgument(_))
    ));
}

/// With a key, a datagram from a stranger never reaches a session: the ones that name a
/// real session (which would otherwise fail its token inside the session), and garbage,
/// are dropped first as unauthenticated.
#[test]
fn with_a_key_strangers_datagrams_never_reach_a_session() {
    let cfg = keyed(KEY);
    let (_wa, a, _ha) = started(&cfg);
    let (_wb, b, _hb) = started(&cfg);
    let (ea, eb) = a.connect_local(&b).unwrap();
    ea.send(b"before").unwrap();
    assert_eq!(
        &eb.recv_timeout(Duration::from_secs(5)).unwrap()[..],
        b"before"
    );
    let stranger = common::Stranger::aimed_at(&b);
    let mut tagged = common::forged_data(0, 0, 0);
    // A tag of the right length, of no key.
    tagged.extend_from_slice(&[0x5a; 16]);
    stranger.send_all(&[
        Vec::new(),
        vec![0xff; 4000],
        common::forged_data(0, 0x1234_5678, 0),
        tagged,
    ]);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while b.stats().unauthenticated < 4 {
        assert!(std::time::Instant::now() < deadline, "{:?}", b.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
    ea.send(b"after").unwrap();
    assert_eq!(
        &eb.recv_timeout(Duration::from_secs(5)).unwrap()[..],
        b"after"
    );
    assert!(eb.try_recv().is_err());
    let s = b.stats();
    assert_eq!(
        (s.unauthenticated, s.malformed, s.unknown_session, s.refused),
        (4, 0, 0, 0),
        "{s:?}"
    );
}
