//! `rdmx::Context` with the UD transport: the same endpoint API as RC, one-sided operations
//! refused clearly, messages through the context-wide receive.

use std::time::Duration;

use rdmx::{Context, DisconnectCause, Error, Transport};

const T: Duration = Duration::from_secs(10);

fn ud() -> Context {
    Context::builder()
        .transport(Transport::Ud)
        .credits(16)
        .srq_depth(256)
        .build()
        .expect("a UD context")
}

#[test]
fn ud_endpoints_through_the_facade() {
    let server = ud();
    assert!(server.ud().is_some());
    let listener = server.listen("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr();
    let echo = std::thread::spawn(move || {
        let ep = listener.accept_timeout(T).expect("accept");
        // Five messages through the context-wide receive, echoed; then the peer's close.
        for _ in 0..5 {
            let m = listener.context().recv_timeout(T).expect("context recv");
            assert_eq!(m.endpoint(), ep.id());
            ep.send(&m).expect("echo");
        }
        match ep.recv_timeout(T) {
            Err(Error::Disconnected(DisconnectCause::PeerClosed)) => {}
            other => panic!("{other:?}"),
        }
    });
    let client = ud();
    let ep = client.connect(addr).expect("connect");
    for size in [0usize, 10, 5000, 100_000] {
        let m = vec![size as u8; size];
        ep.send(&m).expect("send");
        assert_eq!(&ep.recv_timeout(T).expect("echoed")[..], &m[..]);
    }
    let buf = {
        let mut b = client.alloc(1000).expect("alloc");
        b.fill(3);
        b
    };
    ep.send_buf(buf).expect("send_buf");
    assert_eq!(&ep.recv_timeout(T).expect("echoed")[..], &[3u8; 1000][..]);
    // One-sided operations need RC or XRC.
    let region = server.register(4096).expect("register").remote();
    match ep.write(&region, 0, b"x") {
        Err(Error::Unsupported(m)) => assert!(m.contains("UD"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        ep.fetch_add(&region, 0, 1),
        Err(Error::Unsupported(_))
    ));
    ep.close().expect("close");
    echo.join().expect("the echo side");
    assert_eq!(ep.disconnect_cause(), Some(DisconnectCause::LocalClose));
}

#[test]
fn a_ud_context_and_an_rc_listener_refuse_each_other_clearly() {
    let rc = Context::builder().build().expect("an RC context");
    let listener = rc.listen("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr();
    let t = std::thread::spawn(move || {
        let _ = listener.accept_timeout(Duration::from_secs(3));
    });
    match ud().connect(addr) {
        Err(Error::Bootstrap(e)) => assert!(e.to_string().contains("transport"), "{e}"),
        other => panic!("{other:?}"),
    }
    t.join().expect("listener thread");
}
