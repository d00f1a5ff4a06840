//! Back-pressure with a slow receiver, and a thousand endpoints on one context.
#![allow(missing_docs)]

use std::time::{Duration, Instant};

/// The test that measures a delay does not run beside the one that keeps 200 threads busy
/// on this 2-CPU machine (it took 412 ms against its 80 ms bound twice in about 25 runs of
/// this whole file, where the two run at the same time; 0 in 5 runs since).
static TIMING: std::sync::Mutex<()> = std::sync::Mutex::new(());

use rdmx_core::Error;
use rdmx_core::bootstrap::Transport;
use rdmx_rc::{Context, Endpoint};

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
        if next.is_multiple_of(500) {
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

/// A server context with a small shared receive queue (`srq_depth`, `credits`) and `n`
/// endpoints to it from one client context; short peer timeouts (so recall ticks are fast).
/// Returns (server, client, client endpoints, server endpoints), pairs at equal indexes.
fn fan_in(
    srq_depth: u32,
    credits: u32,
    n: usize,
) -> (Context, Context, Vec<Endpoint>, Vec<Endpoint>) {
    fan_in_with(srq_depth, credits, n, false)
}

/// [`fan_in`], with the last client endpoint connected from a second client context when
/// `newcomer_apart` (the client endpoints returned are then those of both).
fn fan_in_with(
    srq_depth: u32,
    credits: u32,
    n: usize,
    newcomer_apart: bool,
) -> (Context, Context, Vec<Endpoint>, Vec<Endpoint>) {
    let server = Context::builder()
        .srq_depth(srq_depth)
        .credits(credits)
        .peer_timeout(Duration::from_millis(400))
        .build()
        .unwrap();
    let client_ctx = || {
        Context::builder()
            .peer_timeout(Duration::from_millis(400))
            .build()
            .unwrap()
    };
    let client = client_ctx();
    let listener = server.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    let acceptor = std::thread::spawn(move || {
        (0..n)
            .map(|_| listener.accept().unwrap())
            .collect::<Vec<_>>()
    });
    let mut ceps: Vec<_> = (0..n - 1).map(|_| client.connect(addr).unwrap()).collect();
    let last = if newcomer_apart {
        client_ctx().connect(addr).unwrap()
    } else {
        client.connect(addr).unwrap()
    };
    ceps.push(last);
    let seps = acceptor.join().unwrap();
    (server, client, ceps, seps)
}

/// The last of `eps` came after the others took every credit (and went idle): it sends 50
/// messages, which `receiver` checks only afterwards, so it runs out of credits again and
/// again. Returns how long the sends took.
fn newcomer_sends(eps: &[Endpoint], receiver: &Endpoint) -> Duration {
    let last = eps.last().unwrap();
    let start = Instant::now();
    for i in 0..50u32 {
        last.send_timeout(&i.to_le_bytes(), Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("message {i}: {e}"));
    }
    let took = start.elapsed();
    for i in 0..50u32 {
        let m = receiver.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(m[..], i.to_le_bytes());
    }
    took
}

/// More endpoints than the shared receive queue can back at the configured window: idle
/// endpoints hold every credit, and a newcomer that starts with none must still get to send,
/// without any RNR NAK. Either the server feeds it when it connects (recalling the idle
/// endpoints' credits) or its own context sees it starve first and lends it theirs (they
/// give them back to the server unasked, with a signal); which comes first is a matter of
/// microseconds, so either counts. (`more_busy_clients_than_buffers_keep_going` checks
/// that lending happens.)
#[test]
fn idle_endpoints_give_credits_back() {
    let (server, client, eps, server_eps) = fan_in(64, 32, 6);
    let took = newcomer_sends(&eps, server_eps.last().unwrap());
    assert!(server.stats().credits_recalled > 0);
    assert_eq!(server.device_counters().rnr_naks_sent, 0);
    eprintln!(
        "starved endpoint sent 50 messages in {took:?}; {} credits lent by its context",
        client.stats().credits_lent
    );
    drop(server_eps);
}

/// The same, with the newcomer in another client context: the holders' context cannot know
/// it starves, so the server recalls their credits. It asks with signals and the idle
/// endpoints answer with signals (each side holds credits for the other), so neither waits
/// for the other's tick.
#[test]
fn idle_endpoints_of_another_context_give_credits_back_when_asked() {
    let (server, client, eps, server_eps) = fan_in_with(64, 32, 6, true);
    let took = newcomer_sends(&eps, server_eps.last().unwrap());
    assert!(server.stats().credits_recalled > 0);
    assert_eq!(server.device_counters().rnr_naks_sent, 0);
    let (asked, answered) = (server.stats().recall_signals, client.stats().recall_signals);
    assert!(
        asked > 0 && answered > 0,
        "signals: {asked} asked, {answered} answered"
    );
    assert_eq!(client.stats().credits_lent, 0);
    eprintln!(
        "starved endpoint sent 50 messages in {took:?} after {} credits were recalled \
         ({asked} requests and {answered} answers signalled)",
        server.stats().credits_recalled
    );
    drop(server_eps);
}

/// A newcomer that every buffer was promised before, from another context: the server
/// feeds it when it connects, by recalling credits from idle holders, so that its first
/// message does not wait until the server notices it starving. That used to take up to a
/// background tick (100 ms) when the server's application was not calling rdmx meanwhile.
#[test]
fn a_newcomer_is_fed_before_it_asks() {
    let (server, _client, eps, server_eps) = fan_in_with(64, 32, 6, true);
    // Nobody calls rdmx meanwhile; the holders have been idle for long before it ends.
    std::thread::sleep(Duration::from_millis(200));
    let last = eps.last().unwrap();
    last.try_send(b"first")
        .expect("the newcomer still had no credit 200 ms after it connected");
    let m = server_eps
        .last()
        .unwrap()
        .recv_timeout(Duration::from_secs(5))
        .unwrap();
    assert_eq!(&m[..], b"first");
    assert!(server.stats().credits_recalled > 0, "{:?}", server.stats());
    assert_eq!(server.device_counters().rnr_naks_sent, 0);
}

/// The same newcomer, behind holders idle long enough for the server's background thread to
/// have backed off to its tick, while the server's application waits for messages as a
/// server does: the waiting thread looks at the starving flags itself (every 10 ms), so the
/// newcomer does not wait for the tick when it runs out again. Measured before the newcomer
/// was fed at connect: 98 ms without those looks, 2.5 ms with.
#[test]
fn a_newcomer_is_fed_quickly_while_the_server_waits_for_messages() {
    let _alone = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    // (From another context: the holders' own context would lend it their credits.)
    let (server, _client, eps, server_eps) = fan_in_with(64, 32, 6, true);
    let last = eps.last().unwrap();
    std::thread::sleep(Duration::from_millis(250));
    let srv = server.clone();
    let rx = std::thread::spawn(move || {
        for i in 0..50u32 {
            let m = srv.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(m[..], i.to_le_bytes());
        }
    });
    let start = Instant::now();
    for i in 0..50u32 {
        last.send_timeout(&i.to_le_bytes(), Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("message {i}: {e}"));
    }
    let took = start.elapsed();
    rx.join().unwrap();
    eprintln!("starved endpoint sent 50 messages in {took:?} while the server waited");
    assert!(server.stats().credits_recalled > 0);
    // A background tick is 100 ms; the scans of the waiting thread are 10 ms apart.
    assert!(
        took < Duration::from_millis(80),
        "{took:?}: the newcomer waited for the background tick"
    );
    drop(server_eps);
}

/// Rendezvous messages are read into the receiver's pool even before the application asks
/// for them, so they need their own bound: undelivered ones occupy the endpoint's credit
/// window. A zero-copy sender (which allocates nothing on its side) must stall after about
/// one window, and everything must arrive once the receiver reads.
#[test]
fn slow_receiver_stops_a_zero_copy_sender() {
    let credits = 8u32;
    let recv_ctx = Context::builder()
        .srq_depth(64)
        .credits(credits)
        .pool_max(64 << 20)
        .build()
        .unwrap();
    let listener = recv_ctx.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    let send_ctx = Context::builder().build().unwrap();
    let t = std::thread::spawn(move || listener.accept().unwrap());
    let tx = send_ctx.connect(addr).unwrap();
    let rx = t.join().unwrap();

    let blob = rdmx_rc::SharedBytes::from(vec![0x3cu8; 256 << 10]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut sent = 0u32;
    let mut last_progress = Instant::now();
    while last_progress.elapsed() < Duration::from_millis(300) {
        match tx.try_send_shared(&blob) {
            Ok(()) => {
                sent += 1;
                last_progress = Instant::now();
            }
            Err(Error::WouldBlock) => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("{e}"),
        }
        assert!(Instant::now() < deadline, "the sender never stalled");
    }
    assert!(
        sent <= 2 * credits,
        "{sent} rendezvous messages sent to a receiver that reads nothing"
    );
    let in_use = recv_ctx.pool_stats().in_use_bytes;
    assert!(
        in_use <= 64 * (32 << 10) + 2 * credits as usize * (256 << 10) + (1 << 20),
        "receiver pool holds {in_use} bytes"
    );
    // Now the receiver reads; the sender carries on to 200 messages.
    let total = 200u32;
    let sender = std::thread::spawn(move || {
        for _ in sent..total {
            tx.send_shared(blob.clone()).unwrap();
        }
        tx
    });
    for i in 0..total {
        let m = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("message {i}: {e}"));
        assert_eq!(m.len(), 256 << 10);
        assert!(m.iter().all(|&b| b == 0x3c));
    }
    let _tx = sender.join().unwrap();
    assert_eq!(send_ctx.stats().sent_zero_copy, u64::from(total));
    assert_eq!(recv_ctx.device_counters().rnr_naks_sent, 0);
}

/// More endpoints than posted receive buffers: every buffer backs the single credit of some
/// idle endpoint, and an endpoint whose credit moved on to another one must still get to
/// send. Keeping one credit per idle endpoint cannot free anything here, so idle holders
/// have to give back their last credit. (Before, this hung.)
#[test]
fn more_endpoints_than_buffers_never_starve() {
    const N: usize = 24;
    let (server, client, ceps, seps) = fan_in(16, 4, N);
    let start = Instant::now();
    // Ping-pong on one endpoint after the other, in an order that differs per round, so
    // credits keep moving to endpoints that will not use them for a while.
    for round in 0..2usize {
        for j in 0..N {
            let i = (j * (2 * round + 1) + round) % N;
            ceps[i]
                .send_timeout(&[i as u8, round as u8], Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("round {round}, endpoint {i}: {e}"));
            let m = seps[i].recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(m[..], [i as u8, round as u8]);
            seps[i]
                .send_timeout(&m, Duration::from_secs(10))
                .unwrap_or_else(|e| panic!("reply, round {round}, endpoint {i}: {e}"));
            drop(m);
            let back = ceps[i].recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(back[..], [i as u8, round as u8]);
        }
    }
    eprintln!(
        "{N} endpoints over 16 buffers: 2 rounds in {:?}, {} + {} credits recalled",
        start.elapsed(),
        server.stats().credits_recalled,
        client.stats().credits_recalled
    );
    assert_eq!(server.device_counters().rnr_naks_sent, 0);
    assert_eq!(client.device_counters().rnr_naks_sent, 0);
}

#[test]
fn endpoints_connecting_while_others_run_are_left_alone() {
    connecting_while_others_run(Transport::Rc);
}

#[test]
fn xrc_endpoints_connecting_at_once_through_one_context() {
    // XRC exchanges of a context run one at a time. The TCP connection used to be made
    // before taking that turn, so the listener could accept a thread still waiting for
    // it and wait for its Hello, while the thread whose turn it was waited for the
    // listener: 16 threads connecting at once timed out every time.
    connecting_while_others_run(Transport::Xrc);
}

fn connecting_while_others_run(transport: Transport) {
    // Threads of one client context connect while its other endpoints are busy, with
    // fewer buffers than the endpoints would like, so credits are handed out as buffers
    // come back, to endpoints that may still be connecting. Until an endpoint knows its
    // peer's mailbox (`Status::Connecting`), the context's other threads must not write to
    // it: such a write went to address 0, and the new endpoint died of a remote access
    // error. That window is a few microseconds (between the queue pair's RTS and
    // `conn::complete`), so this test exercises the path rather than catching the race
    // every time: the `many_clients` example with 100 clients failed about one run in 12
    // before the fix.
    //
    // Few buffers and credits at the client: its credit grants to its peers keep flowing
    // while the later endpoints connect.
    let client = Context::builder()
        .transport(transport)
        .srq_depth(64)
        .credits(8);
    let (server, client) = request_response(Context::builder(), client, transport, 48, 50);
    assert_eq!(client.stats().protocol_errors, 0);
    assert_eq!(server.stats().protocol_errors, 0);
}

/// More clients busy at once than either side has receive buffers, each doing round trips
/// with a server that answers everyone from one thread with blocking sends. Credits held
/// by endpoints that have nothing to send are the only ones the blocked server could use.
/// With 100 clients over 64 buffers on each side this used to crawl at about 60 round
/// trips a second (a recall per answer, each waiting for two scans), and went on for over
/// a minute; the clients' context now gives such credits back itself as soon as the
/// server starves (`credits_lent`). Measured in release: 30,000 round trips in 2.7-3.2 s.
#[test]
fn more_busy_clients_than_buffers_keep_going() {
    let _alone = TIMING.lock().unwrap_or_else(|e| e.into_inner());
    for transport in [Transport::Rc, Transport::Xrc] {
        let small = || Context::builder().transport(transport).srq_depth(64);
        let start = Instant::now();
        let (server, client) = request_response(small(), small(), transport, 100, 30);
        let took = start.elapsed();
        eprintln!(
            "{transport:?}: 100 clients x 30 round trips over 64 buffers a side in {took:?}; \
             credits lent: {} by the clients, {} by the server",
            client.stats().credits_lent,
            server.stats().credits_lent
        );
        for ctx in [&server, &client] {
            assert_eq!(ctx.device_counters().rnr_naks_sent, 0);
            assert_eq!(ctx.stats().protocol_errors, 0);
        }
        assert!(client.stats().credits_lent > 0, "{:?}", client.stats());
        // Far above what it takes now (under 2 s here in a debug build), far below the
        // crawl (3,000 round trips at 60 a second).
        assert!(took < Duration::from_secs(25), "{transport:?}: {took:?}");
    }
}

/// `clients` threads of one client context (built from `client`) each connect to a server
/// context (built from `server`) and do `rounds` round trips, which one server thread
/// answers with blocking sends. Returns the two contexts once every endpoint is done.
fn request_response(
    server: rdmx_rc::ContextBuilder,
    client: rdmx_rc::ContextBuilder,
    transport: Transport,
    clients: u32,
    rounds: u32,
) -> (Context, Context) {
    let server = server.transport(transport).build().unwrap();
    let listener = server.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    let srv_ctx = server.clone();
    let srv = std::thread::spawn(move || {
        let mut eps = std::collections::HashMap::new();
        for _ in 0..clients {
            let ep = listener.accept_timeout(Duration::from_secs(20)).unwrap();
            eps.insert(ep.id(), ep);
        }
        let mut answered = 0u32;
        while answered < clients * rounds {
            let m = srv_ctx
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|e| panic!("after {answered} answers: {e}"));
            eps[&m.endpoint()]
                .send_timeout(&m, Duration::from_secs(20))
                .unwrap_or_else(|e| panic!("answer {answered}: {e}"));
            answered += 1;
        }
        eps
    });
    let client = client.transport(transport).build().unwrap();
    let threads: Vec<_> = (0..clients)
        .map(|t| {
            let client = client.clone();
            std::thread::spawn(move || {
                let ep = client.connect(addr).unwrap();
                for i in 0..rounds {
                    let v = t * rounds + i;
                    ep.send_timeout(&v.to_le_bytes(), Duration::from_secs(20))
                        .unwrap_or_else(|e| panic!("client {t}, request {i}: {e}"));
                    let m = ep
                        .recv_timeout(Duration::from_secs(20))
                        .unwrap_or_else(|e| panic!("client {t}, round {i}: {e}"));
                    assert_eq!(m[..], v.to_le_bytes());
                }
                ep
            })
        })
        .collect();
    let eps: Vec<Endpoint> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let _server_eps = srv.join().unwrap();
    assert!(eps.iter().all(Endpoint::is_connected));
    (server, client)
}
