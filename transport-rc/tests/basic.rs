//! Endpoint behaviour over loopback, within one process.
#![allow(missing_docs)]

mod common;

use std::time::{Duration, Instant};

use rdmx_core::{DisconnectCause, Error};
use rdmx_rc::{Context, Endpoint};

fn pair_with(b: impl Fn() -> rdmx_rc::ContextBuilder) -> (Context, Endpoint, Context, Endpoint) {
    let server = b().build().expect("server context");
    let listener = server.listen("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr();
    let t = std::thread::spawn(move || listener.accept().expect("accept"));
    let client = b().build().expect("client context");
    let cep = client.connect(addr).expect("connect");
    let sep = t.join().expect("accept thread");
    (client, cep, server, sep)
}

/// A pair with the default thresholds pinned (the builder beats `RDMX_*`): the tests count
/// on which protocol each size takes. The transport still follows `RDMX_TRANSPORT`.
fn pair() -> (Context, Endpoint, Context, Endpoint) {
    // The receive queue is pinned: several tests send more than a small queue holds before
    // they read (`RDMX_SRQ_DEPTH=16` made them block in `send`).
    pair_with(|| {
        Context::builder()
            .srq_depth(512)
            .pool_max(128 << 20)
            .inline_threshold(188)
            .rndv_threshold(32 << 10)
    })
}

#[test]
fn ping_pong_all_sizes() {
    let (_c, cep, _s, sep) = pair();
    let sizes = [
        0usize,
        1,
        8,
        100,
        188,
        189,
        1000,
        8191,
        8192,
        8193,
        100_000,
        1 << 20,
        3 << 20,
    ];
    let echo = std::thread::spawn(move || {
        for _ in 0..sizes.len() {
            let m = sep.recv().expect("server recv");
            sep.send(&m).expect("echo");
        }
        sep
    });
    for &n in &sizes {
        let data: Vec<u8> = (0..n).map(|i| (i * 7 + n) as u8).collect();
        cep.send(&data).expect("send");
        let m = cep.recv_timeout(Duration::from_secs(10)).expect("recv");
        assert_eq!(m.len(), n);
        assert!(m[..] == data[..], "payload of {n} bytes corrupted");
    }
    let _sep = echo.join().unwrap();
}

#[test]
fn one_way_stream_in_order() {
    let (c, cep, s, sep) = pair();
    let n = 5000u32;
    let rx = std::thread::spawn(move || {
        for i in 0..n {
            let m = sep.recv_timeout(Duration::from_secs(10)).expect("recv");
            let len = (i as usize * 37) % 50_000;
            assert_eq!(m.len(), len + 4, "message {i}");
            assert_eq!(u32::from_le_bytes(m[..4].try_into().unwrap()), i);
        }
        sep
    });
    for i in 0..n {
        let len = (i as usize * 37) % 50_000;
        let mut v = i.to_le_bytes().to_vec();
        v.resize(len + 4, i as u8);
        cep.send(&v).expect("send");
    }
    let _sep = rx.join().unwrap();
    let st = c.stats();
    assert!(
        st.sent_inline > 0 && st.sent_eager > 0 && st.sent_rndv > 0,
        "{st:?}"
    );
    assert_eq!(
        s.device_counters().rnr_naks_sent,
        0,
        "a receiver issued an RNR NAK"
    );
}

#[test]
fn close_is_orderly() {
    let (_c, cep, _s, sep) = pair();
    for i in 0..100u32 {
        cep.send(&i.to_le_bytes()).unwrap();
    }
    let closer = std::thread::spawn(move || cep.close());
    for i in 0..100u32 {
        let m = sep
            .recv_timeout(Duration::from_secs(5))
            .expect("message before close");
        assert_eq!(m[..], i.to_le_bytes());
    }
    match sep.recv_timeout(Duration::from_secs(5)) {
        Err(Error::Disconnected(DisconnectCause::PeerClosed)) => {}
        other => panic!("expected an orderly disconnect, got {other:?}"),
    }
    closer.join().unwrap().expect("close");
}

#[test]
fn try_recv_would_block_and_one_sided() {
    let (c, cep, s, sep) = pair();
    assert!(matches!(cep.try_recv(), Err(Error::WouldBlock)));
    let region = s.register(4096).unwrap();
    region.memory().write(100, b"remote bytes").unwrap();
    sep.send(&region.remote().to_bytes()).unwrap();
    let m = cep.recv_timeout(Duration::from_secs(5)).unwrap();
    let remote = rdmx_rc::RemoteRegion::from_bytes(&m).unwrap();
    let got = cep.read(&remote, 100, 12).unwrap();
    assert_eq!(&got[..], b"remote bytes");
    cep.write(&remote, 0, b"written").unwrap();
    assert_eq!(region.memory().to_vec(0, 7).unwrap(), b"written");
    region.memory().write_u64(512, 5).unwrap();
    assert_eq!(cep.fetch_add(&remote, 512, 3).unwrap(), 5);
    assert_eq!(cep.compare_swap(&remote, 512, 8, 1).unwrap(), 8);
    assert_eq!(region.memory().read_u64(512).unwrap(), 1);
    assert!(matches!(
        cep.write(&remote, 4090, b"too long"),
        Err(Error::InvalidArgument(_))
    ));
    drop(c);
}

#[test]
fn hostile_bootstrap_peers_get_clear_errors() {
    use std::io::Write;
    let ctx = Context::builder()
        .connect_timeout(Duration::from_millis(400))
        .build()
        .unwrap();
    let listener = ctx.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    // Garbage, a truncated frame, a wrong version, and a silent peer.
    let bad: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        b"RDMX\x00\x01\x00\x00".to_vec(),
        b"RDMX\x00\x63\x00\x00\x00\x04abcd".to_vec(),
        Vec::new(),
    ];
    for bytes in bad {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        if !bytes.is_empty() {
            s.write_all(&bytes).unwrap();
        }
        let start = Instant::now();
        let err = listener.accept().expect_err("a hostile peer was accepted");
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "took {:?}",
            start.elapsed()
        );
        assert!(matches!(err, Error::Bootstrap(_)), "{err}");
        eprintln!("{:?} -> {err}", String::from_utf8_lossy(&bytes));
    }
    // Nobody connecting: accept_timeout gives up in time.
    let start = Instant::now();
    let err = listener
        .accept_timeout(Duration::from_millis(100))
        .unwrap_err();
    assert!(matches!(err, Error::Timeout(_)), "{err}");
    assert!(start.elapsed() < Duration::from_secs(2));
    // The listener still works.
    let t =
        std::thread::spawn(move || listener.accept_timeout(Duration::from_secs(10)).map(|_| ()));
    let client = Context::builder().build().unwrap();
    let ep = client.connect(addr).unwrap();
    t.join().unwrap().unwrap();
    drop(ep);
    // A listener that never answers: connect gives up by its deadline.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let start = Instant::now();
    let err = ctx.connect(silent.local_addr().unwrap()).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(3));
    assert!(err.to_string().to_lowercase().contains("time"), "{err}");
}

/// A close right after the last credit was used: the Close itself needs the peer's next
/// grant, which arrives in the mailbox and must be read even though nothing is sent any
/// more (it was not, and such closes timed out).
#[test]
fn close_after_using_the_last_credit() {
    let (_c, cep, _s, sep) = pair_with(|| {
        Context::builder()
            .credits(1)
            .pool_max(128 << 20)
            .peer_timeout(Duration::from_secs(2))
    });
    for i in 0..3u8 {
        cep.send(&[i; 300]).unwrap();
        let m = sep.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(m[0], i);
    }
    let t = Instant::now();
    cep.close().expect("close");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "close took {:?}",
        t.elapsed()
    );
    assert!(matches!(
        sep.recv_timeout(Duration::from_secs(5)),
        Err(Error::Disconnected(DisconnectCause::PeerClosed))
    ));
}

#[test]
fn endpoints_know_their_peer_address() {
    let server = Context::builder().build().expect("server");
    let listener = server.listen("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr();
    let t = std::thread::spawn(move || listener.accept().expect("accept"));
    let client = Context::builder().build().expect("client");
    let cep = client.connect(addr).expect("connect");
    let sep = t.join().expect("accept thread");
    assert_eq!(cep.peer_addr(), addr);
    assert!(sep.peer_addr().ip().is_loopback());
    assert_ne!(sep.peer_addr().port(), 0);
    assert_ne!(
        sep.peer_addr(),
        addr,
        "the accepted side sees the client's address"
    );
    assert!(format!("{cep:?}").contains(&addr.to_string()));
}

#[test]
fn batched_sends_arrive_in_order_on_every_endpoint() {
    // Two endpoints from one client context, messages alternating between them, mixed sizes
    // (inline, eager, rendezvous). The first half is sent in batches of 16, the second in
    // one batch, which the device flushes every 16 posts and whenever the sender polls
    // (busy-polling: waits for credits poll the device).
    // The thresholds are pinned (the builder beats `RDMX_*`), since the test counts on
    // all three protocols and on small messages being packed.
    let b = || {
        Context::builder()
            .pool_max(128 << 20)
            .busy_poll(Duration::from_millis(200))
            .inline_threshold(188)
            .rndv_threshold(32 << 10)
    };
    let server = b().build().expect("server context");
    let listener = server.listen("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr();
    let listener = std::sync::Arc::new(listener);
    let client = b().build().expect("client context");
    let per_ep = 3000u32;
    let mut receivers = Vec::new();
    let mut eps = Vec::new();
    for _ in 0..2 {
        let l = listener.clone();
        let accept = std::thread::spawn(move || l.accept().expect("accept"));
        eps.push(client.connect(addr).expect("connect"));
        let sep = accept.join().expect("accept thread");
        receivers.push(std::thread::spawn(move || {
            for want in 0..per_ep {
                let m = sep.recv_timeout(Duration::from_secs(10)).expect("recv");
                assert_eq!(common::check(&m), want, "order on one endpoint");
            }
            sep
        }));
    }
    let total = 2 * per_ep;
    let mut batch = None;
    for i in 0..total {
        if i < per_ep && i % 16 == 0 || i == per_ep {
            drop(batch.take());
            batch = Some(client.batch());
        }
        let seq = i / 2;
        let mut v = vec![0u8; common::mixed_size(seq)];
        common::fill(seq, &mut v);
        eps[(i % 2) as usize].send(&v).expect("send");
    }
    drop(batch);
    for r in receivers {
        let _sep = r.join().unwrap();
    }
    let st = client.stats();
    eprintln!("{st:?}");
    assert!(
        st.sent_packed > 0 && st.sent_eager > 0 && st.sent_rndv > 0,
        "{st:?}"
    );
    assert!(st.packed_frames < st.sent_packed, "{st:?}");
    assert_eq!(
        server.device_counters().rnr_naks_sent,
        0,
        "a receiver issued an RNR NAK"
    );
}

#[test]
fn grants_to_a_sender_running_ahead_come_a_quarter_window_at_a_time() {
    // A one-way stream of small messages sent in batches (bursts) to a receiver that keeps
    // up: grants go back by mailbox write. Written for each freed buffer, they cost the
    // receiver a send per message; the rule is to wait for a quarter window (8 of the
    // default 32 credits) unless the sender has none left.
    let (c, cep, s, sep) = pair_with(|| {
        Context::builder()
            .pool_max(64 << 20)
            .busy_poll(Duration::from_millis(200))
    });
    let n = 20_000u32;
    let rx = std::thread::spawn(move || {
        for i in 0..n {
            let m = sep.recv_timeout(Duration::from_secs(10)).expect("recv");
            assert_eq!(m[..], i.to_le_bytes(), "message {i}");
        }
        sep
    });
    let mut batch = None;
    for i in 0..n {
        if i % 16 == 0 {
            drop(batch.take());
            batch = Some(c.batch());
        }
        cep.send(&i.to_le_bytes()).expect("send");
    }
    drop(batch);
    let _sep = rx.join().unwrap();
    let writes = s.stats().mailbox_writes;
    eprintln!("{writes} grant writes for {n} messages");
    assert!(
        u64::from(n) / writes.max(1) >= 4,
        "{writes} grant writes for {n} messages"
    );
}

#[test]
fn rendezvous_window_bounds_the_buffers_awaiting_a_read() {
    // A stream of rendezvous messages sent by copy: each takes a pooled source buffer,
    // held until the peer reports its read done. With a window of 2, no more than 2 are
    // held after any send returns (the credit window alone would allow 32). The sender
    // does not busy-poll, so it sleeps whenever the window is full: the read that frees
    // it must be signalled, or each wait would last until its sleep ends.
    let size = 256 << 10;
    let window = 2;
    let (c, cep, s, sep) = pair_with(|| {
        Context::builder()
            .pool_max(128 << 20)
            .rndv_window(window)
            .rndv_threshold(32 << 10)
            .busy_poll(Duration::ZERO)
    });
    assert_eq!(c.config().rndv_window, window);
    let n = 200u32;
    let rx = std::thread::spawn(move || {
        for i in 0..n {
            let m = sep.recv_timeout(Duration::from_secs(10)).expect("recv");
            assert_eq!(m.len(), size, "message {i}");
            assert_eq!(m[..4], i.to_le_bytes(), "message {i}");
            assert!(m[4..].iter().all(|&b| b == i as u8), "message {i}");
        }
        sep
    });
    let class = c.alloc(size).expect("alloc").capacity();
    let base = c.pool_stats().in_use_bytes;
    let mut most = 0;
    let mut msg = vec![0u8; size];
    for i in 0..n {
        msg.fill(i as u8);
        msg[..4].copy_from_slice(&i.to_le_bytes());
        cep.send(&msg).expect("send");
        most = most.max(c.pool_stats().in_use_bytes.saturating_sub(base));
    }
    let _sep = rx.join().unwrap();
    eprintln!(
        "at most {most} bytes held ({class}-byte buffers); {} read-done signals for {n} messages",
        s.stats().read_done_signals
    );
    assert!(
        most <= window as usize * class,
        "{most} bytes held, window {window} x {class}"
    );
    assert!(
        s.stats().read_done_signals > 0,
        "the full window was never signalled"
    );
    assert_eq!(c.device_counters().rnr_naks_sent, 0);
    assert_eq!(s.device_counters().rnr_naks_sent, 0);
}

#[test]
fn packed_messages_wait_for_no_more_than_the_batch() {
    // Small messages are packed only up to the inline threshold: pinned.
    let (c, cep, _s, sep) = pair_with(|| {
        Context::builder()
            .pool_max(128 << 20)
            .inline_threshold(188)
            .rndv_threshold(32 << 10)
    });
    // Ping-pong inside one batch, from one thread: the request is packed by the client's
    // context, and the thread then waits on the server's context, which does not make the
    // client's progress. The pack flusher posts the frame within 1 ms; without it, each
    // round waited for the client's background tick (3.2 s for the 50 rounds, against
    // 0.09 s). The median round is checked against 20 ms, far from both.
    {
        let _b = c.batch();
        let mut rounds = Vec::new();
        for i in 0..50u32 {
            let t = Instant::now();
            cep.send(&i.to_le_bytes()).unwrap();
            let m = sep.recv_timeout(Duration::from_secs(5)).unwrap();
            assert_eq!(m[..], i.to_le_bytes());
            assert!(!m.is_rendezvous());
            sep.send(&m).unwrap();
            drop(m);
            let back = cep.recv_timeout(Duration::from_secs(5)).unwrap();
            assert_eq!(back[..], i.to_le_bytes());
            rounds.push(t.elapsed());
        }
        rounds.sort();
        assert!(
            rounds[rounds.len() / 2] < Duration::from_millis(20),
            "median round {:?}: a packed frame waited for more than its hold",
            rounds[rounds.len() / 2]
        );
    }
    // A one-sided operation goes after the messages sent before it, packed or not.
    let region = _s.register(64).unwrap();
    sep.send(&region.remote().to_bytes()).unwrap();
    let remote =
        rdmx_rc::RemoteRegion::from_bytes(&cep.recv_timeout(Duration::from_secs(5)).unwrap())
            .unwrap();
    {
        let _b = c.batch();
        cep.send(b"before the write").unwrap();
        cep.write(&remote, 0, b"w").unwrap();
        assert_eq!(
            &sep.recv_timeout(Duration::from_secs(5)).unwrap()[..],
            b"before the write"
        );
    }
    // A batch that is never closed (leaked): its packed frame still goes, with the next
    // progress of any thread (here the background thread's).
    let leaked = c.batch();
    std::mem::forget(leaked);
    cep.send(b"leaked").unwrap();
    assert_eq!(
        &sep.recv_timeout(Duration::from_secs(5)).unwrap()[..],
        b"leaked"
    );
    // Close inside a batch: the packed messages go before the Close.
    let _b = c.batch();
    for i in 0..10u32 {
        cep.send(&i.to_le_bytes()).unwrap();
    }
    cep.close().unwrap();
    for i in 0..10u32 {
        let m = sep.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(m[..], i.to_le_bytes());
    }
    assert!(matches!(
        sep.recv_timeout(Duration::from_secs(5)),
        Err(Error::Disconnected(DisconnectCause::PeerClosed))
    ));
    let st = c.stats();
    assert!(st.sent_packed >= 60 && st.packed_frames > 0, "{st:?}");
}

#[test]
fn packed_messages_hold_their_frame_until_the_last_is_dropped() {
    // Packed messages are views of their frame's receive buffer (no copy). A receiver
    // whose application keeps every message holds every frame: its receive queue stops
    // refilling, the sender runs out of credits and waits (no error, nothing lost), and
    // everything flows again once the application lets messages go. A frame goes back
    // only with its last message, whichever message that is.
    let server = Context::builder()
        .srq_depth(32)
        .rndv_threshold(32 << 10)
        .build()
        .unwrap();
    let listener = server.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    let t = std::thread::spawn(move || listener.accept().unwrap());
    let client = Context::builder()
        .inline_threshold(188)
        .rndv_threshold(32 << 10)
        .build()
        .unwrap();
    let cep = client.connect(addr).unwrap();
    let _sep = t.join().unwrap();
    let n = 40_000u32;
    let tx = std::thread::spawn(move || {
        for round in 0..2 {
            for chunk in 0..n / 64 {
                let _b = client.batch();
                for i in chunk * 64..(chunk + 1) * 64 {
                    cep.send(&(round * n + i).to_le_bytes()).unwrap();
                }
            }
        }
        (client, cep)
    });
    // Round one: keep everything; on a stall, drop every other message we hold (so most
    // frames still have a message held, and go back only with a later drop).
    let mut held = Vec::new();
    let mut next = 0u32;
    let mut stalls = 0;
    while next < n {
        match server.recv_timeout(Duration::from_millis(20)) {
            Ok(m) => {
                assert_eq!(m[..], next.to_le_bytes());
                assert!(!m.is_rendezvous());
                next += 1;
                held.push(Some(m));
            }
            Err(Error::Timeout(_)) => {
                stalls += 1;
                assert!(
                    stalls < 200 && !held.is_empty(),
                    "stuck at message {next} with {} held",
                    held.len()
                );
                let live: Vec<usize> = (0..held.len()).filter(|&i| held[i].is_some()).collect();
                if live.len() < 2 {
                    held.clear();
                }
                for (j, &i) in live.iter().enumerate() {
                    if j % 2 == 0 {
                        held[i] = None;
                    }
                }
                held.retain(Option::is_some);
            }
            Err(e) => panic!("after {next}: {e}"),
        }
    }
    // The first messages of round two may already be in the same frame as the last ones
    // of round one; drop everything kept, then take round two without keeping anything.
    drop(held);
    while next < 2 * n {
        let m = server
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("round two, at {next}: {e}"));
        assert_eq!(m[..], next.to_le_bytes());
        next += 1;
    }
    let (client, _cep) = tx.join().unwrap();
    let frames = client.stats().packed_frames;
    eprintln!(
        "{} messages in {frames} frames, {stalls} stalls, {} credit waits at the sender",
        2 * n,
        client.stats().credit_waits
    );
    assert!(
        stalls > 0,
        "the application never held enough to stall the sender"
    );
    assert!(client.stats().credit_waits > 0, "the sender never waited");
    // A message whose frame cannot open at that moment (no send slot for a frame, say)
    // goes alone, after the open frame: that happened once in a few hundred runs
    // (79,999 packed and 1 inline), so a few are allowed.
    let st = client.stats();
    assert!(
        frames > 0
            && frames < u64::from(n)
            && st.sent_packed + st.sent_inline == u64::from(2 * n)
            && st.sent_packed >= u64::from(2 * n) * 99 / 100,
        "messages were not packed: {st:?}"
    );
    // Nothing leaked: every frame went back, so the receive queue is full again and the
    // held count is 0 (a frame given back twice, or never, would show here).
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.stats().recv_held != 0 {
        assert!(
            Instant::now() < deadline,
            "{} held",
            server.stats().recv_held
        );
        let _ = server.try_recv();
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Threads of this process named `name` (from /proc/self/task/*/comm).
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
                .filter(|c| c.trim() == name)
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn a_context_lives_while_its_endpoints_do_and_ends_after() {
    // Counting threads needs a process of its own (other tests run contexts meanwhile):
    // the test binary runs the check below as a child.
    common::ChildProc::spawn(
        "child_context_lifetime",
        &[("RDMX_TEST_CONTEXT_LIFETIME", "1".into())],
    )
    .wait_ok(Duration::from_secs(60));
}

/// The context handles go first; the endpoints keep working (a close is answered and
/// completes), and once they are gone too the contexts' threads end.
#[test]
#[ignore = "child process of a_context_lives_while_its_endpoints_do_and_ends_after"]
fn child_context_lifetime() {
    if std::env::var("RDMX_TEST_CONTEXT_LIFETIME").is_err() {
        return;
    }
    assert_eq!(threads_named("rdmx-progress"), 0);
    let (a, ea, b, eb) = pair();
    drop((a, b));
    ea.send(b"after the handles").unwrap();
    assert_eq!(
        &eb.recv_timeout(Duration::from_secs(5)).unwrap()[..],
        b"after the handles"
    );
    let t = Instant::now();
    ea.close().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "close took {:?}",
        t.elapsed()
    );
    assert_eq!(threads_named("rdmx-progress"), 2, "the threads ended early");
    drop((ea, eb));
    let deadline = Instant::now() + Duration::from_secs(10);
    while threads_named("rdmx-progress") + threads_named("rdmx-packs") > 0
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(threads_named("rdmx-progress"), 0, "progress threads left");
    assert_eq!(threads_named("rdmx-packs"), 0, "pack flushers left");
}

#[test]
fn answers_sent_while_draining_inside_a_batch_share_frames() {
    // A server's loop: take a message, open a batch, answer it, then take (without
    // waiting) and answer whatever else came. The zero-timeout receives make progress,
    // and that progress must not send the batch's packed frame early: 16 answers leave in
    // a frame or two, not in 16.
    let (c, cep, s, sep) = pair();
    let t = Duration::from_secs(10);
    for round in 0..20u32 {
        {
            let _b = c.batch();
            for i in 0..16u32 {
                cep.send(&(round * 16 + i).to_le_bytes()).expect("send");
            }
        }
        let before = s.stats();
        let first = sep.recv_timeout(t).expect("recv");
        let batch = s.batch();
        sep.send(&first).expect("answer");
        let mut answered = 1;
        while answered < 16 {
            match sep.recv_timeout(Duration::ZERO) {
                Ok(m) => {
                    sep.send(&m).expect("answer");
                    answered += 1;
                }
                // (The request frame may have come in two: wait for the rest.)
                Err(Error::Timeout(_)) => {
                    let m = sep.recv_timeout(t).expect("recv");
                    sep.send(&m).expect("answer");
                    answered += 1;
                }
                Err(e) => panic!("{e}"),
            }
        }
        drop(batch);
        let after = s.stats();
        assert_eq!(after.sent_packed - before.sent_packed, 16, "{after:?}");
        assert!(
            after.packed_frames - before.packed_frames <= 3,
            "16 answers in {} frames",
            after.packed_frames - before.packed_frames
        );
        // A thread that waits inside its batch sends what it holds first.
        for i in 0..16u32 {
            let m = cep.recv_timeout(t).expect("answer back");
            assert_eq!(m[..], (round * 16 + i).to_le_bytes());
        }
    }
    // Waiting inside a batch on the same context: what the batch holds goes before the
    // wait (the answer depends on it).
    let echo = std::thread::spawn(move || {
        for _ in 0..20 {
            let m = sep.recv_timeout(t).expect("recv");
            sep.send(&m).expect("answer");
        }
    });
    let _b = c.batch();
    for i in 0..20u32 {
        cep.send(&i.to_le_bytes()).expect("send");
        assert_eq!(cep.recv_timeout(t).expect("answer")[..], i.to_le_bytes());
    }
    echo.join().expect("echo thread");
}

#[test]
fn try_take_gives_what_has_come_without_polling() {
    // Three messages in one packed frame: the receive that takes the first has them all,
    // and `try_take` hands over the other two without a look at the device; then nothing
    // (it does not poll), while a receive still finds what comes later.
    let (c, cep, s, sep) = pair();
    let t = Duration::from_secs(10);
    {
        let _b = c.batch();
        for i in 0..3u32 {
            cep.send(&i.to_le_bytes()).expect("send");
        }
    }
    assert_eq!(sep.recv_timeout(t).expect("first")[..], 0u32.to_le_bytes());
    assert_eq!(sep.try_take().expect("second")[..], 1u32.to_le_bytes());
    assert_eq!(
        s.try_take().expect("third, from the context")[..],
        2u32.to_le_bytes()
    );
    assert!(sep.try_take().is_none());
    assert!(s.try_take().is_none());
    // A batch that sent one message: it leaves as that message, not as a packed frame.
    let before = c.stats();
    {
        let _b = c.batch();
        cep.send(b"later").expect("send");
    }
    let after = c.stats();
    assert_eq!(after.sent_packed - before.sent_packed, 1, "{after:?}");
    assert_eq!(after.packed_frames, before.packed_frames, "{after:?}");
    assert_eq!(&sep.recv_timeout(t).expect("later")[..], b"later");
}
