//! The facade's endpoint as a cheap handle (clones share it; the last one closes it), and
//! a connect that waits for its server to start.

use std::time::{Duration, Instant};

use rdmx::{Context, DisconnectCause, Error, Transport};

const T: Duration = Duration::from_secs(10);

#[test]
fn clones_share_an_endpoint_and_the_last_one_closes_it() {
    for t in [Transport::Rc, Transport::Ud] {
        let s = Context::builder().transport(t).build().expect("server");
        let c = Context::builder().transport(t).build().expect("client");
        let listener = s.listen("127.0.0.1:0").expect("listen");
        let addr = listener.local_addr();
        let accept = std::thread::spawn(move || listener.accept().expect("accept"));
        let ep = c.connect(addr).expect("connect");
        let sep = accept.join().expect("accept thread");
        // Two threads send through clones of one endpoint.
        let senders: Vec<_> = (0..2u32)
            .map(|k| {
                let e = ep.clone();
                std::thread::spawn(move || {
                    for i in 0..50u32 {
                        e.send(&(k * 1000 + i).to_le_bytes()).expect("send");
                    }
                })
            })
            .collect();
        for h in senders {
            h.join().expect("sender");
        }
        let mut got: Vec<u32> = (0..100)
            .map(|_| {
                let m = sep.recv_timeout(T).expect("recv");
                u32::from_le_bytes(m[..4].try_into().expect("4 bytes"))
            })
            .collect();
        got.sort_unstable();
        let want: Vec<u32> = (0..50).chain(1000..1050).collect();
        assert_eq!(got, want, "{t:?}");
        // Dropping one clone leaves the endpoint open; dropping the last closes it.
        let other = ep.clone();
        drop(ep);
        other.send(b"still open").expect("send after a clone went");
        assert_eq!(&sep.recv_timeout(T).expect("recv")[..], b"still open");
        drop(other);
        match sep.recv_timeout(T) {
            Err(Error::Disconnected(DisconnectCause::PeerClosed)) => {}
            r => panic!("{t:?}: {r:?}"),
        }
    }
}

#[test]
fn connect_retry_waits_for_a_server_that_starts_later() {
    // A free port, then a server that listens on it only after 300 ms.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let server = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let s = Context::builder().build().expect("server");
        let listener = s.listen(("127.0.0.1", port)).expect("listen");
        let ep = listener.accept().expect("accept");
        let m = ep.recv_timeout(T).expect("recv");
        ep.send(&m).expect("echo");
        // (Kept until the client has its echo.)
        let _ = ep.recv_timeout(T);
    });
    let c = Context::builder().build().expect("client");
    let t0 = Instant::now();
    let ep = c
        .connect_retry(("127.0.0.1", port), T)
        .expect("connect once the server is up");
    assert!(
        t0.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t0.elapsed()
    );
    ep.send(b"hello").expect("send");
    assert_eq!(&ep.recv_timeout(T).expect("echo")[..], b"hello");
    drop(ep);
    server.join().expect("server thread");

    // Nobody ever listens: the last failure after the timeout, not before.
    let t0 = Instant::now();
    assert!(
        c.connect_retry(("127.0.0.1", port), Duration::from_millis(300))
            .is_err()
    );
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(290) && waited < Duration::from_secs(5),
        "{waited:?}"
    );

    // A peer that answers and refuses is not asked again: a UD client at an RC listener.
    let s = Context::builder().build().expect("rc server");
    let listener = s.listen("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr();
    let refusing = std::thread::spawn(move || {
        let _ = listener.accept_timeout(Duration::from_secs(3));
    });
    let u = Context::builder()
        .transport(Transport::Ud)
        .build()
        .expect("ud client");
    let t0 = Instant::now();
    assert!(u.connect_retry(addr, T).is_err());
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    refusing.join().expect("listener thread");
}

#[test]
fn connection_data_travels_both_ways_on_every_transport() {
    for t in [Transport::Rc, Transport::Xrc, Transport::Ud] {
        let s = Context::builder().transport(t).build().expect("server");
        let c = Context::builder().transport(t).build().expect("client");
        let listener = s.listen("127.0.0.1:0").expect("listen");
        listener
            .set_accept_data(b"server 7, leader")
            .expect("accept data");
        assert!(matches!(
            listener.set_accept_data(&[0u8; 4097]),
            Err(Error::InvalidArgument(_))
        ));
        let addr = listener.local_addr();
        let accept = std::thread::spawn(move || {
            let a = listener.accept().expect("accept");
            let b = listener.accept().expect("accept");
            (a, b)
        });
        let ep = c
            .connect_with(addr, b"role=follower id=3")
            .expect("connect with data");
        let plain = c.connect(addr).expect("connect without");
        assert!(matches!(
            c.connect_with(addr, &[1u8; 4097]),
            Err(Error::InvalidArgument(_))
        ));
        let (a, b) = accept.join().expect("accept thread");
        // (Accepted in the order the connects completed.)
        let (with, without) = if a.peer_data().is_empty() {
            (b, a)
        } else {
            (a, b)
        };
        assert_eq!(&with.peer_data()[..], b"role=follower id=3", "{t:?}");
        assert!(without.peer_data().is_empty(), "{t:?}");
        assert_eq!(&ep.peer_data()[..], b"server 7, leader", "{t:?}");
        assert_eq!(&plain.peer_data()[..], b"server 7, leader", "{t:?}");
        // The endpoints work as any other.
        ep.send(b"after").expect("send");
        assert_eq!(&with.recv_timeout(T).expect("recv")[..], b"after");
    }
}
