//! A thousand endpoints on one context: receive memory does not grow with endpoints (the
//! shared receive queue), one `Context::recv` serves them all, and the resident set per
//! endpoint is reported. Its own test binary,
//! so that the RSS numbers are not disturbed by other tests.
#![allow(missing_docs)]

use std::time::Duration;

use rdmx_rc::{Context, Endpoint};

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn connect_many(server: &Context, client: &Context, n: usize) -> Vec<(Endpoint, Endpoint)> {
    let listener = server.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr();
    let acceptor = std::thread::spawn(move || {
        (0..n)
            .map(|_| listener.accept().unwrap())
            .collect::<Vec<_>>()
    });
    let clients: Vec<Endpoint> = (0..n).map(|_| client.connect(addr).unwrap()).collect();
    let servers = acceptor.join().unwrap();
    clients.into_iter().zip(servers).collect()
}

/// Every endpoint pair does a ping-pong per round. (Sending on all 1000 before receiving
/// anything would stall by design: the shared receive queue backs only so many credits.)
fn exchange(pairs: &[(Endpoint, Endpoint)], rounds: u32) {
    for r in 0..rounds {
        for (i, (c, s)) in pairs.iter().enumerate() {
            c.send(&[(i % 251) as u8, r as u8, 1, 2, 3]).unwrap();
            let m = s.recv_timeout(Duration::from_secs(20)).unwrap();
            assert_eq!(m[..2], [(i % 251) as u8, r as u8]);
            s.send(&m).unwrap();
            drop(m);
            let back = c.recv_timeout(Duration::from_secs(20)).unwrap();
            assert_eq!(back[..2], [(i % 251) as u8, r as u8]);
        }
    }
}

/// Every client sends at once; one server thread receives them all with `Context::recv`
/// (no per-endpoint polling) and answers each through the endpoint the message names.
fn fan_in_through_the_context(server: &Context, pairs: &[(Endpoint, Endpoint)]) {
    let by_id: std::collections::HashMap<u64, usize> = pairs
        .iter()
        .enumerate()
        .map(|(i, (_, s))| (s.id(), i))
        .collect();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut seen = vec![false; pairs.len()];
            for _ in 0..pairs.len() {
                let m = server.recv_timeout(Duration::from_secs(20)).unwrap();
                let i = by_id[&m.endpoint()];
                assert_eq!(m[..], (i as u32).to_le_bytes(), "wrong endpoint");
                assert!(!seen[i], "endpoint {i} delivered twice");
                seen[i] = true;
                pairs[i].1.send(&m).unwrap();
            }
        });
        for (i, (c, _)) in pairs.iter().enumerate() {
            c.send(&(i as u32).to_le_bytes()).unwrap();
        }
        for (i, (c, _)) in pairs.iter().enumerate() {
            let back = c.recv_timeout(Duration::from_secs(20)).unwrap();
            assert_eq!(back[..], (i as u32).to_le_bytes());
        }
    });
}

#[test]
fn thousand_endpoints_share_receive_buffers() {
    let build = || {
        Context::builder()
            .srq_depth(512)
            .credits(16)
            .build()
            .unwrap()
    };
    let (server, client) = (build(), build());
    let rss0 = rss_kib();
    let ten = connect_many(&server, &client, 10);
    exchange(&ten, 3);
    let posted_10 = server.posted_receives();
    let pool_10 = server.pool_stats().registered_bytes;
    let rss10 = rss_kib();

    let more = connect_many(&server, &client, 990);
    let all: Vec<(Endpoint, Endpoint)> = ten.into_iter().chain(more).collect();
    assert_eq!(server.endpoint_count(), 1000);
    exchange(&all, 3);
    let posted_1000 = server.posted_receives();
    let pool_1000 = server.pool_stats().registered_bytes;
    let rss1000 = rss_kib();
    let per_ep = (rss1000.saturating_sub(rss10)) as f64 / 990.0 / 2.0;
    eprintln!(
        "receive buffers posted: {posted_10} (10 endpoints) vs {posted_1000} (1000); \
         server pool {pool_10} vs {pool_1000} bytes; RSS {rss0} -> {rss10} -> {rss1000} KiB \
         (both contexts in this process: ~{per_ep:.1} KiB per endpoint per side)"
    );
    assert_eq!(
        posted_10, posted_1000,
        "receive buffers grew with endpoints"
    );
    assert_eq!(pool_10, pool_1000, "receive memory grew with endpoints");
    // All 1000 clients at once, received through the context: messages wait in inboxes,
    // which may hold up to one more queue depth of buffers (posted + held < 2 x depth).
    fan_in_through_the_context(&server, &all);
    let pool_fan_in = server.pool_stats().registered_bytes;
    eprintln!("server pool after the fan-in through Context::recv: {pool_fan_in} bytes");
    assert_eq!(server.posted_receives(), posted_10);
    assert!(
        pool_fan_in <= 2 * pool_10,
        "receive memory beyond two queue depths: {pool_fan_in} vs {pool_10}"
    );
    assert_eq!(server.device_counters().rnr_naks_sent, 0);
    assert_eq!(client.device_counters().rnr_naks_sent, 0);
}
