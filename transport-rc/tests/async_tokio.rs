//! The async forms (feature `tokio`): an echo over tokio tasks, and cancellation of pending
//! receive and send futures.
#![cfg(feature = "tokio")]
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use rdmx_rc::{Context, Endpoint};

fn pair(b: impl Fn() -> rdmx_rc::ContextBuilder) -> (Context, Endpoint, Context, Endpoint) {
    let server = b().build().unwrap();
    let listener = server.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    let t = std::thread::spawn(move || listener.accept().unwrap());
    let client = b().build().unwrap();
    let cep = client.connect(addr).unwrap();
    (client, cep, server, t.join().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_over_tasks() {
    let (_c, cep, _s, sep) = pair(Context::builder);
    let sep = Arc::new(sep);
    let server = tokio::spawn({
        let sep = Arc::clone(&sep);
        async move {
            for _ in 0..600 {
                let m = sep.recv_async().await.unwrap();
                sep.send_async(&m).await.unwrap();
            }
        }
    });
    for i in 0..600usize {
        let len = [5, 150, 3000, 20_000][i % 4];
        let data: Vec<u8> = (0..len).map(|j| (i + j) as u8).collect();
        cep.send_async(&data).await.unwrap();
        let back = tokio::time::timeout(Duration::from_secs(10), cep.recv_async())
            .await
            .expect("echo timed out")
            .unwrap();
        assert!(back[..] == data[..], "message {i}");
    }
    server.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_futures_lose_nothing() {
    let (c, cep, s, sep) = pair(|| Context::builder().credits(4).srq_depth(16));
    let baseline = s.pool_stats().in_use_bytes;
    let client_baseline = c.pool_stats().in_use_bytes;

    // A receive that is cancelled while pending: the message sent afterwards is not lost.
    let r = tokio::time::timeout(Duration::from_millis(20), sep.recv_async()).await;
    assert!(r.is_err(), "nothing was sent, the receive must pend");
    cep.send_async(b"after the cancel").await.unwrap();
    let m = sep.recv_async().await.unwrap();
    assert_eq!(&m[..], b"after the cancel");
    drop(m);

    // Sends that pend for lack of credits (the server does not read), cancelled: each one
    // either went out whole or not at all.
    let mut sent = 0u32;
    let mut cancelled = 0u32;
    while cancelled < 3 {
        let big = vec![sent as u8; 40_000]; // rendezvous
        let small = sent.to_le_bytes();
        let data: &[u8] = if sent.is_multiple_of(2) { &small } else { &big };
        let f = match tokio::time::timeout(Duration::from_millis(30), cep.send_async(data)).await {
            Ok(r) => r.map(|()| true),
            Err(_) => Ok(false),
        };
        match f {
            Ok(true) => sent += 1,
            Ok(false) => cancelled += 1,
            Err(e) => panic!("{e}"),
        }
        if sent > 200 {
            panic!("the sender never ran out of credits");
        }
    }
    // Each send that pended counted as a credit wait, as a blocking send's does.
    assert!(
        c.stats().credit_waits >= u64::from(cancelled),
        "{} credit waits for {cancelled} pending sends",
        c.stats().credit_waits
    );
    // Now the server reads: exactly `sent` messages, in order.
    for i in 0..sent {
        let m = tokio::time::timeout(Duration::from_secs(10), sep.recv_async())
            .await
            .expect("a sent message is missing")
            .unwrap();
        if i % 2 == 0 {
            assert_eq!(m[..], i.to_le_bytes(), "message {i}");
        } else {
            assert_eq!(m.len(), 40_000);
            assert!(m.iter().all(|&b| b == i as u8), "message {i}");
        }
    }
    let extra = tokio::time::timeout(Duration::from_millis(100), sep.recv_async()).await;
    assert!(extra.is_err(), "a cancelled send was delivered");
    // Every buffer went back: the server's and the client's pools hold nothing in use
    // beyond the receive queue's buffers.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        s.pool_stats().in_use_bytes,
        baseline,
        "server buffers leaked"
    );
    let _ = c.progress();
    assert_eq!(
        c.pool_stats().in_use_bytes,
        client_baseline,
        "client buffers (rendezvous sources) leaked"
    );
    eprintln!(
        "sent {sent}, cancelled {cancelled}; client pool {:?}",
        c.pool_stats()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_shared_sends_release_their_bytes() {
    // Rendezvous messages are read into the receiver's pool whether or not it calls recv;
    // a small pool makes the unread ones stop the sender.
    let (c, cep, s, sep) = pair(|| {
        Context::builder()
            .credits(4)
            .srq_depth(16)
            .pool_max(2 << 20)
    });
    let blob: Arc<[u8]> = (0..100_000u32)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    let mut sent = 0u32;
    let mut cancelled = 0u32;
    while cancelled < 3 {
        let f = cep.send_shared_async(blob.clone());
        match tokio::time::timeout(Duration::from_millis(30), f).await {
            Ok(r) => {
                r.unwrap();
                sent += 1;
            }
            Err(_) => cancelled += 1,
        }
        assert!(sent <= 200, "the sender never ran out of credits");
    }
    for i in 0..sent {
        let m = tokio::time::timeout(Duration::from_secs(10), sep.recv_async())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "message {i} of {sent} is missing; server {:?} {:?}, client {:?}",
                    s.stats(),
                    s.pool_stats(),
                    c.stats()
                )
            })
            .unwrap();
        assert!(m[..] == blob[..], "message {i}");
    }
    let extra = tokio::time::timeout(Duration::from_millis(100), sep.recv_async()).await;
    assert!(extra.is_err(), "a cancelled send was delivered");
    // Once the peer has reported its reads done and the cache is flushed, nothing but this
    // test references the bytes: cancelled futures kept no reference either.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while Arc::strong_count(&blob) > 1 {
        let _ = c.progress();
        c.flush_regcache();
        assert!(
            std::time::Instant::now() < deadline,
            "{} references left",
            Arc::strong_count(&blob) - 1
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(c.stats().sent_zero_copy, u64::from(sent));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_recv_async_serves_several_endpoints() {
    let server = Arc::new(Context::builder().build().unwrap());
    let listener = server.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    let client = Context::builder().build().unwrap();
    let mut ceps = Vec::new();
    let mut seps = Vec::new();
    for _ in 0..4 {
        let accepted = std::thread::scope(|s| {
            let h = s.spawn(|| listener.accept().unwrap());
            ceps.push(client.connect(addr).unwrap());
            h.join().unwrap()
        });
        seps.push(accepted);
    }
    // A context-wide receive cancelled while pending loses nothing.
    let r = tokio::time::timeout(Duration::from_millis(20), server.recv_async()).await;
    assert!(r.is_err(), "nothing was sent, the receive must pend");

    // One task answers whichever endpoint spoke, found by the message's endpoint id.
    let by_id: std::collections::HashMap<u64, Endpoint> =
        seps.into_iter().map(|e| (e.id(), e)).collect();
    let echo = tokio::spawn({
        let server = Arc::clone(&server);
        async move {
            for _ in 0..400 {
                let m = server.recv_async().await.unwrap();
                by_id[&m.endpoint()].send_async(&m).await.unwrap();
            }
            by_id
        }
    });
    for round in 0..100usize {
        for (i, ep) in ceps.iter().enumerate() {
            let data = vec![(round * 4 + i) as u8; [3, 500, 40_000, 9][i]];
            ep.send_async(&data).await.unwrap();
        }
        for (i, ep) in ceps.iter().enumerate() {
            let back = tokio::time::timeout(Duration::from_secs(10), ep.recv_async())
                .await
                .expect("echo timed out")
                .unwrap();
            assert!(
                back.iter().all(|&b| b == (round * 4 + i) as u8),
                "round {round}"
            );
            assert_eq!(back.len(), [3, 500, 40_000, 9][i]);
        }
    }
    let _by_id = echo.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_and_accept_without_blocking_the_runtime() {
    let server = Context::builder().build().unwrap();
    let listener = server.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    let client = Context::builder().build().unwrap();

    // An accept cancelled while nobody connects takes nothing with it.
    let r = tokio::time::timeout(Duration::from_millis(30), listener.accept_async()).await;
    assert!(r.is_err(), "nobody connected, the accept must pend");
    tokio::time::sleep(Duration::from_millis(120)).await;

    for round in 0..3u8 {
        let (sep, cep) = tokio::join!(listener.accept_async(), client.connect_async(addr));
        let (sep, cep) = (sep.unwrap(), cep.unwrap());
        assert_eq!(cep.peer_addr(), addr);
        cep.send_async(&[round; 100]).await.unwrap();
        let m = sep.recv_async().await.unwrap();
        assert_eq!(&m[..], &[round; 100]);
        sep.send_async(&m).await.unwrap();
        assert_eq!(&cep.recv_async().await.unwrap()[..], &[round; 100]);
    }
    // Errors come back as errors: nobody listens here.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    assert!(client.connect_async(dead_addr).await.is_err());
}

/// The async calls need no runtime timer: on a runtime built without `enable_time`,
/// `recv_async` used to panic ("timers are disabled"). A one-way stream over 4 credits makes
/// the sender wait for grants, which arrive by RDMA WRITE and are found by the delays.
#[test]
fn a_runtime_without_timers_is_enough() {
    let (_c, cep, _s, sep) = pair(|| Context::builder().credits(4).srq_depth(16));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let start = std::time::Instant::now();
    rt.block_on(async {
        let receiver = async {
            for i in 0..200u32 {
                let m = sep.recv_async().await.unwrap();
                assert_eq!(m[..], i.to_le_bytes(), "message {i}");
            }
        };
        let sender = async {
            for i in 0..200u32 {
                cep.send_async(&i.to_le_bytes()).await.unwrap();
            }
        };
        tokio::join!(receiver, sender);
    });
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
}
