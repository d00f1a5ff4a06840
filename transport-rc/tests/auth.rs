//! The authenticated bootstrap: both sides prove a shared key before anything is set up;
//! a wrong or missing key is a clear error on both sides; garbage and floods of
//! connections neither break the listener nor keep legitimate peers out.
#![allow(missing_docs)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use rdmx_core::Error;
use rdmx_core::bootstrap::{BootstrapError, Transport};
use rdmx_rc::{Context, Endpoint, Listener};

const KEY: &[u8] = b"correct horse battery staple";

fn ctx(key: Option<&[u8]>) -> Context {
    let mut b = Context::builder()
        .transport(Transport::Rc)
        .connect_timeout(Duration::from_secs(3));
    if let Some(k) = key {
        b = b.auth_key(k);
    }
    b.build().unwrap()
}

/// Accepts until an endpoint comes (errors of failed exchanges are skipped and counted),
/// on a thread; returns the endpoint and the errors seen.
fn accept_one(l: &Listener) -> (Option<Endpoint>, Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut errors = Vec::new();
    while Instant::now() < deadline {
        match l.accept_timeout(Duration::from_millis(200)) {
            Ok(ep) => return (Some(ep), errors),
            Err(Error::Timeout(_)) => {}
            Err(e) => errors.push(e.to_string()),
        }
    }
    (None, errors)
}

fn exchange(
    server_key: Option<&[u8]>,
    client_key: Option<&[u8]>,
) -> (Result<Endpoint, Error>, Vec<String>) {
    let server = ctx(server_key);
    let l = server.listen("127.0.0.1:0").unwrap();
    let addr = l.local_addr();
    let client = ctx(client_key);
    let t = std::thread::spawn(move || {
        let r = client.connect(addr);
        (client, r)
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut errors = Vec::new();
    let mut got = None;
    while Instant::now() < deadline && !t.is_finished() {
        match l.accept_timeout(Duration::from_millis(100)) {
            Ok(ep) => got = Some(ep),
            Err(Error::Timeout(_)) => {}
            Err(e) => errors.push(e.to_string()),
        }
    }
    // Outcomes of exchanges that ended as the client finished.
    while let Ok(r) = l.accept_timeout(Duration::from_millis(100)).map(Some) {
        got = got.or(r);
    }
    let (_client, r) = t.join().unwrap();
    if let (Ok(cep), Some(sep)) = (&r, &got) {
        cep.send(b"authenticated").unwrap();
        assert_eq!(
            &sep.recv_timeout(Duration::from_secs(5)).unwrap()[..],
            b"authenticated"
        );
    }
    (r, errors)
}

fn is_auth_error(e: &Error, needle: &str) -> bool {
    let s = e.to_string();
    matches!(
        e,
        Error::Bootstrap(BootstrapError::AuthFailed(_) | BootstrapError::Rejected(_))
    ) && s.contains(needle)
}

#[test]
fn the_same_key_connects() {
    let (r, errors) = exchange(Some(KEY), Some(KEY));
    assert!(r.is_ok(), "{r:?}");
    assert!(errors.is_empty(), "{errors:?}");
}

#[test]
fn a_wrong_key_fails_on_both_sides() {
    let (r, errors) = exchange(Some(KEY), Some(b"the wrong key, also long enough"));
    let e = r.unwrap_err();
    assert!(is_auth_error(&e, "wrong key"), "client: {e}");
    assert!(
        errors.iter().any(|s| s.contains("wrong key")),
        "server: {errors:?}"
    );
}

#[test]
fn a_missing_key_fails_on_both_sides() {
    // The client has none, the listener requires one.
    let (r, errors) = exchange(Some(KEY), None);
    let e = r.unwrap_err();
    assert!(is_auth_error(&e, "requires authentication"), "client: {e}");
    assert!(
        errors.iter().any(|s| s.contains("requires authentication")),
        "server: {errors:?}"
    );
    // The client has one, the listener none.
    let (r, errors) = exchange(None, Some(KEY));
    let e = r.unwrap_err();
    assert!(is_auth_error(&e, "no key"), "client: {e}");
    assert!(
        errors.iter().any(|s| s.contains("no key")),
        "server: {errors:?}"
    );
}

#[test]
fn short_keys_are_refused_at_build() {
    let e = Context::builder()
        .transport(Transport::Rc)
        .auth_key(b"short")
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("16 bytes"), "{e}");
}

/// A TCP connection to `to` from source address `from` (port chosen by the kernel).
fn tcp_from(from: &str, to: SocketAddr) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&format!("{from}:0").parse::<SocketAddr>().unwrap().into())
        .unwrap();
    s.connect(&to.into()).unwrap();
    s.into()
}

#[test]
fn garbage_and_floods_keep_nobody_out() {
    let server = ctx(Some(KEY));
    let l = server.listen("127.0.0.1:0").unwrap();
    let addr = l.local_addr();
    // From another address: garbage and silent connections, more than a listener runs
    // exchanges at once (64).
    let mut held = Vec::new();
    for i in 0..80 {
        let mut s = tcp_from("127.0.0.2", addr);
        if i % 2 == 0 {
            let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        }
        held.push(s);
    }
    // A legitimate peer gets in meanwhile.
    let client = ctx(Some(KEY));
    let t = std::thread::spawn(move || {
        let r = client.connect(addr);
        (client, r)
    });
    let started = Instant::now();
    let (ep, errors) = accept_one(&l);
    let (_client, r) = t.join().unwrap();
    let cep = r.expect("the legitimate client connects");
    let sep = ep.expect("the listener accepts it");
    assert!(started.elapsed() < Duration::from_secs(8));
    cep.send(b"through the flood").unwrap();
    assert_eq!(
        &sep.recv_timeout(Duration::from_secs(5)).unwrap()[..],
        b"through the flood"
    );
    // The flood's exchanges failed (garbage at once, silence after the auth timeout):
    // drain them, then the flooding address is shut out for a while.
    let deadline = Instant::now() + Duration::from_secs(6);
    let mut failed = errors.len();
    while failed < 32 && Instant::now() < deadline {
        if let Err(Error::Bootstrap(_) | Error::Protocol(_)) =
            l.accept_timeout(Duration::from_millis(200))
        {
            failed += 1;
        }
    }
    assert!(failed >= 32, "{failed} failed exchanges");
    drop(held);
    std::thread::sleep(Duration::from_millis(50));
    let _ = l.accept_timeout(Duration::from_millis(50));
    let mut s = tcp_from("127.0.0.2", addr);
    let _ = l.accept_timeout(Duration::from_millis(300));
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut b = [0u8; 16];
    // Closed at once: end of stream (or a reset), no challenge.
    assert!(matches!(s.read(&mut b), Ok(0) | Err(_)));
    // Others still get in.
    let client = ctx(Some(KEY));
    let t = std::thread::spawn(move || client.connect(addr).map(|ep| (client, ep)));
    let (ep, _) = accept_one(&l);
    assert!(ep.is_some());
    assert!(t.join().unwrap().is_ok());
}

/// 80 connections from one address that say nothing (no key, so each exchange waits for
/// its `Hello` until the listener's 10 s connect timeout): more than the 64 exchanges a
/// listener runs at once. They take at most 32 (the rest wait); a client from another
/// address gets in within its own 3 s timeout.
#[test]
fn a_silent_flood_from_one_address_keeps_nobody_else_out() {
    let server = Context::builder()
        .transport(Transport::Rc)
        .connect_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let l = server.listen("127.0.0.1:0").unwrap();
    let addr = l.local_addr();
    let held: Vec<TcpStream> = (0..80).map(|_| tcp_from("127.0.0.2", addr)).collect();
    // The listener takes them in while it waits for an endpoint.
    let _ = l.accept_timeout(Duration::from_millis(300));
    let client = ctx(None);
    let t = std::thread::spawn(move || {
        let r = client.connect(addr);
        (client, r)
    });
    let (ep, errors) = accept_one(&l);
    let (_client, r) = t.join().unwrap();
    let cep = r.expect("a client from another address gets in");
    let sep = ep.expect("the listener accepts it");
    assert!(errors.is_empty(), "{errors:?}");
    cep.send(b"through").unwrap();
    assert_eq!(
        &sep.recv_timeout(Duration::from_secs(5)).unwrap()[..],
        b"through"
    );
    drop(held);
}
