//! A UD listener under floods of TCP connections from one source address: with a key, a
//! wrong or missing one fails on both sides; one address runs at most half of the
//! listener's exchanges (the rest of its connections wait), so silent connections from it
//! keep nobody else out; and an address whose exchanges keep failing is shut out for a
//! while, its connections closed at once.
#![expect(clippy::unwrap_used, reason = "test")]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use rdmx_core::bootstrap::{AuthKey, BootstrapError};
use rdmx_core::worker::{Worker, WorkerHandle};
use rdmx_core::{Config, Error};
use rdmx_ud::{Listener, UdTransport};

const KEY: &[u8] = b"correct horse battery staple";

fn cfg(key: Option<&[u8]>, connect_timeout: Duration) -> Config {
    Config {
        credits: 16,
        srq_depth: 64,
        pool_max: 64 << 20,
        connect_timeout,
        auth_key: key.map(|k| AuthKey::new(k).unwrap()),
        ..Config::default()
    }
}

fn started(cfg: &Config) -> (Worker, UdTransport, WorkerHandle) {
    let w = Worker::open(cfg, None, &[UdTransport::RECV_BUF_SIZE]).unwrap();
    let t = UdTransport::attach(&w, cfg).unwrap();
    let h = w.start().unwrap();
    (w, t, h)
}

/// A TCP connection to `to` from source address `from` (port chosen by the kernel).
fn tcp_from(from: &str, to: SocketAddr) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&format!("{from}:0").parse::<SocketAddr>().unwrap().into())
        .unwrap();
    s.connect(&to.into()).unwrap();
    s.into()
}

/// Accepts on a thread until `stop` is set; returns the endpoints accepted.
fn acceptor(
    l: Listener,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Vec<rdmx_ud::Endpoint>> {
    std::thread::spawn(move || {
        let mut got = Vec::new();
        let until = Instant::now() + Duration::from_secs(30);
        while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < until {
            if let Ok(ep) = l.accept_timeout(Duration::from_millis(20)) {
                got.push(ep);
            }
        }
        got
    })
}

#[test]
fn keys_are_checked_on_both_sides() {
    let (_ws, server, _hs) = started(&cfg(Some(KEY), Duration::from_secs(3)));
    let l = server.listen("127.0.0.1:0").unwrap();
    let addr = l.local_addr();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acc = acceptor(l, stop.clone());
    let (_wc, good, _hc) = started(&cfg(Some(KEY), Duration::from_secs(3)));
    let ep = good.connect(addr).expect("the same key connects");
    ep.send(b"hi").unwrap();
    let (_ww, wrong, _hw) = started(&cfg(
        Some(b"the wrong key, also long enough"),
        Duration::from_secs(3),
    ));
    match wrong.connect(addr) {
        Err(Error::Bootstrap(BootstrapError::AuthFailed(m))) => assert!(m.contains("wrong key")),
        other => panic!("a wrong key: {other:?}"),
    }
    let (_wn, none, _hn) = started(&cfg(None, Duration::from_secs(3)));
    match none.connect(addr) {
        Err(Error::Bootstrap(BootstrapError::Rejected(m))) => {
            assert!(m.contains("requires authentication"), "{m}");
        }
        other => panic!("no key: {other:?}"),
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let eps = acc.join().unwrap();
    assert_eq!(eps.len(), 1);
    assert_eq!(
        &eps[0].recv_timeout(Duration::from_secs(5)).unwrap()[..],
        b"hi"
    );
}

/// 80 connections from one address that say nothing (no key, so each exchange waits for
/// its `Hello` until the listener's 10 s connect timeout): more than the 64 exchanges a
/// listener runs at once. They take 32; a client from another address gets in within its
/// own 3 s timeout.
#[test]
fn a_silent_flood_from_one_address_keeps_nobody_else_out() {
    let (_ws, server, _hs) = started(&cfg(None, Duration::from_secs(10)));
    let l = server.listen("127.0.0.1:0").unwrap();
    let addr = l.local_addr();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acc = acceptor(l, stop.clone());
    let held: Vec<TcpStream> = (0..80).map(|_| tcp_from("127.0.0.2", addr)).collect();
    // Let the listener take them all in.
    std::thread::sleep(Duration::from_millis(300));
    let (_wc, client, _hc) = started(&cfg(None, Duration::from_secs(3)));
    let ep = client
        .connect(addr)
        .expect("a client from another address gets in");
    ep.send(b"through").unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let eps = acc.join().unwrap();
    assert_eq!(eps.len(), 1);
    assert_eq!(
        &eps[0].recv_timeout(Duration::from_secs(5)).unwrap()[..],
        b"through"
    );
    drop(held);
}

/// 32 exchanges from one address fail (garbage): its next connection is closed at once
/// (a connection let in would wait for its `Hello` for the 10 s connect timeout); other
/// addresses still get in.
#[test]
fn an_address_that_keeps_failing_is_shut_out() {
    let (_ws, server, _hs) = started(&cfg(None, Duration::from_secs(10)));
    let l = server.listen("127.0.0.1:0").unwrap();
    let addr = l.local_addr();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acc = acceptor(l, stop.clone());
    for _ in 0..32 {
        let mut s = tcp_from("127.0.0.2", addr);
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        // The listener closes it (after a reject or at once): wait for that.
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    }
    std::thread::sleep(Duration::from_millis(50));
    let mut s = tcp_from("127.0.0.2", addr);
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut b = [0u8; 16];
    match s.read(&mut b) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("expected the connection closed at once, got {other:?}"),
    }
    let (_wc, client, _hc) = started(&cfg(None, Duration::from_secs(3)));
    client.connect(addr).expect("others still get in");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(acc.join().unwrap().len(), 1);
}
