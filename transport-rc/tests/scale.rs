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
