//! Limits an application runs into: messages and buffers larger than a pool can ever hold,
//! what `Context::config` says about them, and a close with every credit spent.
#![allow(missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::connect_pair;
use rdmx_core::Error;
use rdmx_rc::{Context, ContextBuilder};

/// A builder with the default receive queue pinned: what fits beside it, and how many
/// credits a sender gets, depend on it (`RDMX_SRQ_DEPTH` must not change the tests).
fn depth() -> ContextBuilder {
    Context::builder().srq_depth(512)
}

/// A receiver whose pool cannot hold the default largest message beside its receive
/// buffers (64 MiB of pool, about 16 MiB of them posted for good) advertises what it can
/// hold, and a bigger message is refused at the sender at once. It used to be accepted,
/// and its rendezvous read waited for a buffer for ever, silently, with every message
/// behind it.
#[test]
fn a_message_the_receivers_pool_cannot_hold_is_refused_at_once() {
    let small = || depth().pool_max(64 << 20);
    let (client, cep, server, sep) = connect_pair(small(), depth());
    let largest = server.config().max_message;
    assert!(
        largest < 64 << 20 && largest > 32 << 20,
        "the receiver's largest message: {largest}"
    );
    assert_eq!(client.config().max_message, 64 << 20);
    let blob = rdmx_rc::SharedBytes::from(vec![7u8; largest + 4096]);
    let start = Instant::now();
    match cep.send_shared_timeout(blob, Duration::from_secs(5)) {
        Err(Error::MessageTooLarge { len, max }) => {
            assert_eq!((len, max), (largest + 4096, largest));
        }
        other => panic!("a message beyond the receiver's pool: {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(1));
    // The endpoint is still fine, and a message of the largest size arrives.
    let blob = rdmx_rc::SharedBytes::from(vec![9u8; largest]);
    cep.send_shared(blob).expect("the largest message");
    let m = sep
        .recv_timeout(Duration::from_secs(30))
        .expect("receive it");
    assert_eq!(m.len(), largest);
    assert!(m.iter().all(|&b| b == 9));
    drop(m);
    cep.send(b"after").unwrap();
    assert_eq!(
        &sep.recv_timeout(Duration::from_secs(5)).unwrap()[..],
        b"after"
    );
}

/// A buffer the local pool can never hold is refused with `PoolCapacity` at once: `alloc`
/// used to wait for the connect timeout, and a `send` that copies into the pool blocked
/// for ever.
#[test]
fn a_buffer_the_local_pool_cannot_hold_is_refused_at_once() {
    let ctx = depth().pool_max(40 << 20).build().unwrap();
    let start = Instant::now();
    assert!(matches!(ctx.alloc(40 << 20), Err(Error::PoolCapacity(_))));
    assert!(matches!(ctx.alloc(30 << 20), Err(Error::PoolCapacity(_))));
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    // The largest it reports does fit.
    let largest = ctx.config().max_message;
    let b = ctx.alloc(largest).expect("a buffer of max_message bytes");
    assert_eq!(b.len(), largest);
    drop(b);

    let (_client, cep, _server, _sep) = connect_pair(depth(), depth().pool_max(40 << 20));
    let start = Instant::now();
    match cep.send_timeout(&vec![1u8; 30 << 20], Duration::from_secs(5)) {
        Err(Error::MessageTooLarge { .. } | Error::PoolCapacity(_)) => {}
        other => panic!("a send the local pool cannot copy: {other:?}"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
}

/// `config()` reports the values that apply, not the requested ones.
#[test]
fn the_config_reports_effective_values() {
    let ctx = depth()
        .inline_threshold(4096)
        .pool_max(64 << 20)
        .build()
        .unwrap();
    let cfg = ctx.config();
    assert!(cfg.inline_threshold < 4096, "{}", cfg.inline_threshold);
    assert!(cfg.max_message < 64 << 20, "{}", cfg.max_message);
}

/// A sender that spent exactly its last credit on rendezvous messages, and closes while the
/// receiving application has not taken them yet: its window is full of undelivered
/// messages, so the receiver grants nothing, and the Close had no credit. `close` timed out
/// after the peer timeout (2 s) and the receiver, once it read everything, got
/// `PeerUnreachable` instead of `PeerClosed`. The closing side now asks for the one credit
/// its Close needs (`Recall::closing`).
#[test]
fn a_close_after_the_last_credit_went_on_unread_messages_is_orderly() {
    let (client, cep, _server, sep) = connect_pair(depth(), depth());
    let n = client.config().credits;
    let msg = |i: u32| {
        let mut v = vec![(i % 251) as u8; 1 << 20];
        v[..4].copy_from_slice(&i.to_le_bytes());
        v
    };
    for i in 0..n {
        cep.send_timeout(&msg(i), Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("message {i}: {e}"));
    }
    let closer = std::thread::spawn(move || {
        let start = Instant::now();
        (cep.close(), start.elapsed())
    });
    // The receiving application is busy for a while, longer than the peer timeout.
    std::thread::sleep(Duration::from_millis(2500));
    for i in 0..n {
        let m = sep
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("message {i}: {e}"));
        assert_eq!(m[..], msg(i)[..], "message {i}");
    }
    match sep.recv_timeout(Duration::from_secs(5)) {
        Err(Error::Disconnected(rdmx_core::DisconnectCause::PeerClosed)) => {}
        other => panic!("after the last message: {other:?}"),
    }
    let (r, took) = closer.join().unwrap();
    r.unwrap_or_else(|e| panic!("close after {took:?}: {e}"));
    eprintln!("close returned after {took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
}

/// The side that closes reports `LocalClose`, the other `PeerClosed` (both used to say
/// `PeerClosed`).
#[test]
fn each_side_reports_who_closed() {
    let (client, cep, server, sep) = connect_pair(depth(), depth());
    cep.send(b"bye").unwrap();
    cep.close().expect("close");
    let cause = |r: rdmx_core::Result<rdmx_rc::Message>| match r {
        Err(Error::Disconnected(c)) => c,
        other => panic!("{other:?}"),
    };
    use rdmx_core::DisconnectCause::{LocalClose, PeerClosed};
    assert_eq!(cep.disconnect_cause(), Some(LocalClose));
    assert_eq!(cause(cep.recv_timeout(Duration::from_secs(1))), LocalClose);
    assert_eq!(
        &sep.recv_timeout(Duration::from_secs(5)).unwrap()[..],
        b"bye"
    );
    assert_eq!(cause(sep.recv_timeout(Duration::from_secs(5))), PeerClosed);
    assert_eq!(sep.disconnect_cause(), Some(PeerClosed));
    // The events come once each side is down (ours once our answering Close is out).
    let closed = |ctx: &Context| {
        let deadline = Instant::now() + Duration::from_secs(5);
        std::iter::from_fn(|| ctx.wait_event(deadline.saturating_duration_since(Instant::now())))
            .find_map(|e| match e {
                rdmx_core::Event::Disconnected { cause, .. } => Some(cause),
                _ => None,
            })
    };
    assert_eq!(closed(&client), Some(LocalClose));
    assert_eq!(closed(&server), Some(PeerClosed));
}

/// The same close when the receiver has no buffer spare at all: its application holds a
/// queue's worth of unread messages (so no buffer is posted again) and idle endpoints hold
/// the credits of the rest. The Close's credit is recalled from them, as a starving
/// sender's would be.
#[test]
fn a_close_with_no_credit_and_no_spare_buffer_is_orderly() {
    let server = depth().srq_depth(32).credits(8).build().unwrap();
    let listener = server.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    let acceptor = std::thread::spawn(move || {
        (0..4)
            .map(|_| listener.accept_timeout(Duration::from_secs(10)).unwrap())
            .collect::<Vec<_>>()
    });
    let client = depth().build().unwrap();
    let eps: Vec<_> = (0..4).map(|_| client.connect(addr).unwrap()).collect();
    let seps = acceptor.join().unwrap();
    let msg = |i: u32| vec![i as u8; 1000];
    // The first endpoint sends until no credit comes any more (100 ms of WouldBlock).
    let mut sent = 0u32;
    let mut blocked_since: Option<Instant> = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while blocked_since.is_none_or(|t| t.elapsed() < Duration::from_millis(100)) {
        assert!(Instant::now() < deadline, "the sender never ran out");
        match eps[0].try_send(&msg(sent)) {
            Ok(()) => {
                sent += 1;
                blocked_since = None;
            }
            Err(Error::WouldBlock) => {
                blocked_since.get_or_insert_with(Instant::now);
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        sent >= 32,
        "{sent} messages: the receiver's queue was not filled"
    );
    let start = Instant::now();
    if let Err(e) = eps[0].close() {
        panic!(
            "close after {sent} messages: {e}\nserver {:?}\nclient {:?}",
            server.stats(),
            client.stats()
        );
    }
    let took = start.elapsed();
    for i in 0..sent {
        let m = seps[0].recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(m[..], msg(i)[..], "message {i}");
    }
    assert!(matches!(
        seps[0].recv_timeout(Duration::from_secs(5)),
        Err(Error::Disconnected(rdmx_core::DisconnectCause::PeerClosed))
    ));
    eprintln!(
        "{sent} messages, close returned after {took:?}; {} credits recalled",
        server.stats().credits_recalled
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
}

/// A peer that connects to a listener and then says nothing holds no other peer back: the
/// exchanges run at once. Before, the listener waited for the silent one's frame for the
/// whole connect timeout, and the real client's connect timed out meanwhile.
#[test]
fn a_silent_peer_holds_no_other_back() {
    use std::io::Write;
    let server = depth()
        .connect_timeout(Duration::from_millis(1500))
        .build()
        .unwrap();
    let listener = server.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    let acceptor = std::thread::spawn(move || {
        (0..2)
            .map(|_| listener.accept_timeout(Duration::from_secs(10)))
            .collect::<Vec<_>>()
    });
    let mut silent = std::net::TcpStream::connect(addr).unwrap();
    silent.write_all(b"RDMX\0").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let client = depth().build().unwrap();
    let start = Instant::now();
    let cep = client.connect(addr).expect("connect behind a silent peer");
    let took = start.elapsed();
    cep.send(b"through").unwrap();
    let results = acceptor.join().unwrap();
    let mut results = results.into_iter();
    let sep = results.next().unwrap().expect("the real client first");
    assert_eq!(
        &sep.recv_timeout(Duration::from_secs(5)).unwrap()[..],
        b"through"
    );
    match results.next().unwrap() {
        Err(Error::Bootstrap(e)) => eprintln!("the silent peer: {e}"),
        other => panic!("the silent peer: {other:?}"),
    }
    drop(silent);
    eprintln!("connect behind a silent peer took {took:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
}
