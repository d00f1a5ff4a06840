//! XRC peers that come and go: a server's initiator towards a peer's node goes with the
//! last endpoint on it, and a peer process that exits right after a clean close is reported
//! as closed (not unreachable).
#![allow(missing_docs)]

mod common;

use std::time::{Duration, Instant};

use rdmx_core::DisconnectCause;
use rdmx_core::bootstrap::Transport;
use rdmx_rc::{Context, Endpoint};

fn xrc(peer_timeout: Duration) -> Context {
    Context::builder()
        .transport(Transport::Xrc)
        .peer_timeout(peer_timeout)
        .build()
        .unwrap()
}

/// Three request/reply exchanges of 100 bytes, the client asking.
fn exchange(client: &Endpoint, server: &Endpoint) {
    for i in 0..3u8 {
        client
            .send_timeout(&[i; 100], Duration::from_secs(5))
            .unwrap();
        let m = server.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(m[..], [i; 100]);
        server
            .send_timeout(&m[..8], Duration::from_secs(5))
            .unwrap();
        drop(m);
        client.recv_timeout(Duration::from_secs(5)).unwrap();
    }
}

fn wait_cause(ep: &Endpoint, timeout: Duration) -> Option<DisconnectCause> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(c) = ep.disconnect_cause() {
            return Some(c);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Clients (each its own XRC node) connect one after another, exchange, close and go: the
/// server's initiators towards their nodes go with their endpoints (they stayed, one per
/// client node ever seen, until their retries ran out, if ever).
#[test]
fn initiators_go_with_their_last_endpoint() {
    let server = xrc(Duration::from_secs(2));
    let mut listener = server.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    for i in 0..6 {
        let client = xrc(Duration::from_secs(2));
        let t = std::thread::spawn(move || {
            let ep = listener.accept_timeout(Duration::from_secs(10)).unwrap();
            (listener, ep)
        });
        let c_ep = client.connect(addr).unwrap();
        let (l, s_ep) = t.join().unwrap();
        listener = l;
        exchange(&c_ep, &s_ep);
        assert_eq!(
            server.queue_pairs(),
            1,
            "client {i}: one initiator towards its node"
        );
        c_ep.close().unwrap();
        assert_eq!(
            wait_cause(&s_ep, Duration::from_secs(5)),
            Some(DisconnectCause::PeerClosed),
            "client {i}"
        );
        drop(s_ep);
        drop(c_ep);
        drop(client);
        let deadline = Instant::now() + Duration::from_secs(5);
        while server.queue_pairs() > 0 && Instant::now() < deadline {
            server.progress();
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(server.queue_pairs(), 0, "client {i}: its initiator is gone");
    }
}

/// A client of `clients_exiting_right_after_close_are_not_unreachable`: connects to
/// `RDMX_TEST_CHURN_ADDR`, exchanges, closes and exits at once.
#[test]
#[ignore = "child process of clients_exiting_right_after_close_are_not_unreachable"]
fn child_churn_client() {
    let Ok(addr) = std::env::var("RDMX_TEST_CHURN_ADDR") else {
        return;
    };
    let ctx = xrc(Duration::from_secs(2));
    let ep = ctx.connect(addr.as_str()).unwrap();
    for i in 0..3u8 {
        ep.send_timeout(&[i; 100], Duration::from_secs(5)).unwrap();
        ep.recv_timeout(Duration::from_secs(5)).unwrap();
    }
    ep.close().unwrap();
    // As a short-lived client does: gone as soon as the close returns.
    std::process::exit(0);
}

/// Client processes connect one after another, exchange, close and exit at once. The
/// server's Close was delivered to each of them (their close returned), but the ACK the
/// client's NIC held back for coalescing left with the process; the server's initiator then
/// retried until "transport retries exhausted" and reported a peer that had closed cleanly
/// as unreachable.
#[test]
fn clients_exiting_right_after_close_are_not_unreachable() {
    let server = xrc(Duration::from_secs(1));
    let listener = server.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().to_string();
    for i in 0..5 {
        let child = common::ChildProc::spawn(
            "child_churn_client",
            &[("RDMX_TEST_CHURN_ADDR", addr.clone())],
        );
        let ep = listener.accept_timeout(Duration::from_secs(20)).unwrap();
        for _ in 0..3 {
            let m = ep.recv_timeout(Duration::from_secs(10)).unwrap();
            ep.send_timeout(&m[..8], Duration::from_secs(5)).unwrap();
        }
        child.wait_ok(Duration::from_secs(20));
        // Retries run out within the peer timeout: wait a little longer.
        assert_eq!(
            wait_cause(&ep, Duration::from_secs(3)),
            Some(DisconnectCause::PeerClosed),
            "client {i}"
        );
    }
    std::thread::sleep(Duration::from_millis(1500));
    while let Some(ev) = server.poll_event() {
        if let rdmx_core::Event::Disconnected { cause, .. } = &ev {
            assert_eq!(cause, &DisconnectCause::PeerClosed, "{ev:?}");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.queue_pairs() > 0 && Instant::now() < deadline {
        server.progress();
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        server.queue_pairs(),
        0,
        "the initiators went with the endpoints"
    );
}
