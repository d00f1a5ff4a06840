//! Back-pressure with a slow receiver, and a thousand endpoints on one context.
#![allow(missing_docs)]

use std::time::{Duration, Instant};

use rdmx_core::Error;
use rdmx_rc::Context;

#[test]
fn slow_receiver_bounds_memory() {
    let recv_ctx = Context::builder()
        .srq_depth(64)
        .credits(8)
        .pool_max(16 << 20)
        .build()
        .unwrap();
    let listener = recv_ctx.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    let send_ctx = Context::builder().build().unwrap();
    let t = std::thread::spawn(move || listener.accept().unwrap());
    let tx = send_ctx.connect(addr).unwrap();
    let rx = t.join().unwrap();

    // Nobody receives: the sender must run out of credits and get WouldBlock, not pile up
    // data anywhere.
    let msg = vec![0xabu8; 1000];
    let mut sent = 0u32;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut m = msg.clone();
        m[..4].copy_from_slice(&sent.to_le_bytes());
        match tx.try_send(&m) {
            Ok(()) => sent += 1,
            Err(Error::WouldBlock) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(
            Instant::now() < deadline,
            "the sender never ran out of credits"
        );
    }
    // Credits keep coming while the receiver's progress engine refills its queue from the
    // pool — until it holds a queue's worth of unreceived messages (64 here): then the
    // sender stalls for good.
    let mut last_progress = Instant::now();
    while last_progress.elapsed() < Duration::from_millis(300) {
        match tx.try_send(&sent.to_le_bytes()) {
            Ok(()) => {
                sent += 1;
                last_progress = Instant::now();
            }
            Err(Error::WouldBlock) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("{e}"),
        }
        assert!(Instant::now() < deadline, "the sender never stalled");
    }
    let stalled_at = sent;
    assert!(
        stalled_at <= 2 * 64 + 8,
        "{stalled_at} messages sent without credits"
    );
    let pool = recv_ctx.pool_stats();
    assert!(pool.registered_bytes <= 16 << 20);

    // A blocking sender now blocks; a slow consumer lets it through, message by message.
    let total = 3000u32;
    let sender = std::thread::spawn(move || {
        for i in sent..total {
            let mut m = vec![0xabu8; 1000];
            m[..4].copy_from_slice(&i.to_le_bytes());
            tx.send(&m).unwrap();
        }
        tx
    });
    let mut next = 0u32;
    let mut max_registered = 0;
    while next < total {
        let m = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        if m.len() >= 4 {
            assert_eq!(u32::from_le_bytes(m[..4].try_into().unwrap()), next);
        }
        next += 1;
        if next % 500 == 0 {
            std::thread::sleep(Duration::from_millis(20));
            max_registered = max_registered.max(recv_ctx.pool_stats().registered_bytes);
        }
    }
    let _tx = sender.join().unwrap();
    assert_eq!(
        recv_ctx.device_counters().rnr_naks_sent,
        0,
        "RNR NAKs were sent"
    );
    assert_eq!(send_ctx.device_counters().rnr_naks_received, 0);
    assert!(send_ctx.stats().credit_waits > 0);
    eprintln!(
        "stalled after {stalled_at} messages; receiver pool peaked at {max_registered} bytes"
    );
}

/// More endpoints than the shared receive queue can back at the configured window: idle
/// endpoints hold every credit, and a newcomer that starts with none must still get to send
/// (credit recall), without any RNR NAK.
#[test]
fn idle_endpoints_give_credits_back() {
    let server = Context::builder()
        .srq_depth(64)
        .credits(32)
        .peer_timeout(Duration::from_millis(400))
        .build()
        .unwrap();
    let client = Context::builder()
        .peer_timeout(Duration::from_millis(400))
        .build()
        .unwrap();
    let listener = server.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    let acceptor = std::thread::spawn(move || {
        (0..6)
            .map(|_| listener.accept().unwrap())
            .collect::<Vec<_>>()
    });
    let eps: Vec<_> = (0..6).map(|_| client.connect(addr).unwrap()).collect();
    let server_eps = acceptor.join().unwrap();
    // The first endpoints took every credit; the last one has none and is idle-blocked
    // until the idle ones give theirs back.
    let last = eps.last().unwrap();
    assert!(matches!(last.try_send(b"x"), Err(Error::WouldBlock)));
    let start = Instant::now();
    for i in 0..50u32 {
        last.send_timeout(&i.to_le_bytes(), Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("message {i}: {e}"));
    }
    let took = start.elapsed();
    let receiver = server_eps.last().unwrap();
    for i in 0..50u32 {
        let m = receiver.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(m[..], i.to_le_bytes());
    }
    assert!(server.stats().credits_recalled > 0);
    assert_eq!(server.device_counters().rnr_naks_sent, 0);
    eprintln!(
        "starved endpoint sent 50 messages in {took:?} after {} credits were recalled",
        server.stats().credits_recalled
    );
    drop(server_eps);
}
