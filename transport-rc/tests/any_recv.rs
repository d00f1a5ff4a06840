//! `Context::recv`: one receive call for every endpoint of a context.
#![allow(missing_docs)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdmx_core::Error;
use rdmx_rc::{Context, Endpoint};

const T: Duration = Duration::from_secs(20);

/// A client context with `n` endpoints to a server context, and the server's endpoints by
/// id (with the index of their client).
struct FanIn {
    client: Context,
    ceps: Vec<Endpoint>,
    server: Context,
    seps: HashMap<u64, (usize, Endpoint)>,
}

fn fan_in(n: usize) -> FanIn {
    // The tests send up to 40 messages on an endpoint before the server reads: the
    // receive queue and the credit window are pinned to room for that (the builder beats
    // `RDMX_SRQ_DEPTH` and `RDMX_CREDITS`, with which a send would otherwise block).
    let server = Context::builder()
        .pool_max(256 << 20)
        .srq_depth(512)
        .credits(64)
        .build()
        .expect("server");
    let listener = server.listen("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr();
    let client = Context::builder()
        .pool_max(256 << 20)
        .build()
        .expect("client");
    let mut ceps = Vec::new();
    let mut seps = HashMap::new();
    for i in 0..n {
        let accepted = std::thread::scope(|s| {
            let h = s.spawn(|| listener.accept_timeout(T).expect("accept"));
            ceps.push(client.connect(addr).expect("connect"));
            h.join().expect("accept thread")
        });
        seps.insert(accepted.id(), (i, accepted));
    }
    FanIn {
        client,
        ceps,
        server,
        seps,
    }
}

/// Payload: endpoint index, sequence number, then a pattern, `len` bytes in all.
fn payload(ep: usize, seq: u32, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len.max(8)];
    v[..4].copy_from_slice(&(ep as u32).to_le_bytes());
    v[4..8].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in v.iter_mut().enumerate().skip(8) {
        *b = (i as u32 ^ seq ^ ep as u32) as u8;
    }
    v
}

fn parse(m: &[u8]) -> (usize, u32) {
    let ep = u32::from_le_bytes(m[..4].try_into().unwrap()) as usize;
    let seq = u32::from_le_bytes(m[4..8].try_into().unwrap());
    (ep, seq)
}

fn size_of_msg(seq: u32) -> usize {
    match seq % 10 {
        0 => 100_000,  // rendezvous
        3 | 6 => 3000, // eager
        _ => 8,        // inline
    }
}

#[test]
fn every_message_of_every_endpoint_once_and_in_order() {
    const N: usize = 12;
    const M: u32 = 300;
    let FanIn {
        client,
        ceps,
        server,
        seps,
    } = fan_in(N);
    let senders = std::thread::spawn(move || {
        // Interleave the endpoints so that several have messages waiting at once.
        for seq in 0..M {
            for (i, ep) in ceps.iter().enumerate() {
                ep.send_timeout(&payload(i, seq, size_of_msg(seq)), T)
                    .expect("send");
            }
        }
        (client, ceps)
    });
    let mut next = [0u32; N];
    let mut rendezvous = 0;
    for _ in 0..(N as u32 * M) {
        let m = server.recv_timeout(T).expect("context recv");
        let (i, seq) = parse(&m);
        let (idx, _) = &seps[&m.endpoint()];
        assert_eq!(*idx, i, "message attributed to the wrong endpoint");
        assert_eq!(seq, next[i], "endpoint {i}: out of order or duplicated");
        assert_eq!(m.len(), size_of_msg(seq).max(8));
        assert!(
            m[..] == payload(i, seq, size_of_msg(seq))[..],
            "payload corrupted"
        );
        if m.is_rendezvous() {
            rendezvous += 1;
        }
        next[i] += 1;
    }
    assert!(next.iter().all(|&n| n == M));
    assert_eq!(rendezvous, N as u32 * M / 10);
    assert!(matches!(server.try_recv(), Err(Error::WouldBlock)));
    let _ = senders.join().expect("senders");
}

#[test]
fn busy_endpoints_take_turns() {
    const N: usize = 3;
    const M: u32 = 20; // within the credit window: all sent before the server reads
    let FanIn {
        client: _client,
        ceps,
        server,
        seps,
    } = fan_in(N);
    let base = server.device_counters().rx_packets;
    for seq in 0..M {
        for (i, ep) in ceps.iter().enumerate() {
            ep.send(&payload(i, seq, 8)).expect("send");
        }
    }
    // Wait until the server's device has received every message (one packet each), then
    // let progress queue them all.
    let deadline = Instant::now() + T;
    while server.device_counters().rx_packets < base + u64::from(M) * N as u64 {
        assert!(Instant::now() < deadline, "messages never arrived");
        server.progress();
        std::thread::sleep(Duration::from_millis(1));
    }
    while server.progress() > 0 {}
    let order: Vec<usize> = (0..M as usize * N)
        .map(|_| {
            let m = server.try_recv().expect("queued message");
            seps[&m.endpoint()].0
        })
        .collect();
    // Every endpoint had messages waiting the whole time: each window of N consecutive
    // messages holds one of each.
    for w in order.chunks(N) {
        let mut seen = w.to_vec();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), N, "not in turn: {order:?}");
    }
}

#[test]
fn mixes_with_endpoint_recv_and_skips_dropped_handles() {
    let FanIn {
        client: _client,
        ceps,
        server,
        mut seps,
    } = fan_in(2);
    let (a_id, b_id) = {
        let mut ids: Vec<(u64, usize)> = seps.iter().map(|(&id, (i, _))| (id, *i)).collect();
        ids.sort_by_key(|&(_, i)| i);
        (ids[0].0, ids[1].0)
    };
    for seq in 0..40 {
        ceps[0]
            .send(&payload(0, seq, size_of_msg(seq)))
            .expect("send a");
    }
    // Alternate the two ways of receiving on endpoint a: one sequence, no gaps.
    let a = &seps[&a_id].1;
    for seq in 0..40 {
        let m = if seq % 2 == 0 {
            a.recv_timeout(T).expect("endpoint recv")
        } else {
            server.recv_timeout(T).expect("context recv")
        };
        assert_eq!(m.endpoint(), a_id);
        assert_eq!(parse(&m), (0, seq));
    }
    // Messages for b arrive, then the application drops b's handle: they are not handed
    // out, and the context reports a timeout rather than waiting forever.
    for seq in 0..5 {
        ceps[1].send(&payload(1, seq, 8)).expect("send b");
    }
    let deadline = Instant::now() + T;
    let b = seps.remove(&b_id).expect("b").1;
    // Make sure they are queued at b before the handle goes.
    let first = loop {
        match b.try_recv() {
            Ok(m) => break m,
            Err(Error::WouldBlock) => {
                assert!(Instant::now() < deadline, "b's messages never arrived");
                std::thread::yield_now();
            }
            Err(e) => panic!("b: {e}"),
        }
    };
    assert_eq!(parse(&first), (1, 0));
    drop(first);
    drop(b);
    match server.recv_timeout(Duration::from_millis(300)) {
        Err(Error::Timeout(_)) => {}
        Ok(m) => panic!("message from a dropped endpoint delivered: {:?}", parse(&m)),
        Err(e) => panic!("unexpected error: {e}"),
    }
    assert!(matches!(server.try_recv(), Err(Error::WouldBlock)));
    // Endpoint a still works through the context.
    ceps[0].send(&payload(0, 40, 8)).expect("send a again");
    let m = server.recv_timeout(T).expect("context recv after the drop");
    assert_eq!((m.endpoint(), parse(&m)), (a_id, (0, 40)));
}

#[test]
fn a_server_on_context_recv_sees_orderly_closes_after_the_last_message() {
    let FanIn {
        client: _client,
        ceps,
        server,
        seps,
    } = fan_in(3);
    // Each client sends a few messages and closes; all of that completes (the server's
    // background thread answers the closes) before the server takes anything.
    for (i, ep) in ceps.iter().enumerate() {
        for seq in 0..5 {
            ep.send(&payload(i, seq, size_of_msg(seq))).expect("send");
        }
    }
    for ep in &ceps {
        ep.close().expect("orderly close");
    }
    // The closes are done, but their messages wait: no event yet.
    assert_eq!(
        server.poll_event(),
        None,
        "close reported before its messages"
    );
    let mut next = [0u32; 3];
    let mut closed = std::collections::HashSet::new();
    for _ in 0..15 {
        let m = server.recv_timeout(T).expect("context recv");
        let (i, seq) = parse(&m);
        assert_eq!(seps[&m.endpoint()].0, i);
        assert_eq!(seq, next[i]);
        assert!(
            !closed.contains(&m.endpoint()),
            "a message after the close event"
        );
        next[i] += 1;
        drop(m);
        while let Some(ev) = server.poll_event() {
            match ev {
                rdmx_core::Event::Disconnected { endpoint, cause } => {
                    assert_eq!(cause, rdmx_core::DisconnectCause::PeerClosed);
                    let k = seps[&endpoint].0;
                    assert_eq!(
                        next[k], 5,
                        "endpoint {k} reported closed before its last message"
                    );
                    closed.insert(endpoint);
                }
                other => panic!("unexpected event {other:?}"),
            }
        }
    }
    // A close whose last step (our own Close being acknowledged) finished after its last
    // message was taken is reported when it finishes.
    while closed.len() < 3 {
        match server.wait_event(T) {
            Some(rdmx_core::Event::Disconnected { endpoint, cause }) => {
                assert_eq!(cause, rdmx_core::DisconnectCause::PeerClosed);
                closed.insert(endpoint);
            }
            other => panic!("expected a close event, got {other:?}"),
        }
    }
    assert!(matches!(server.try_recv(), Err(Error::WouldBlock)));
}
