//! Many UD peers on one transport: two queue pairs (data and control) whatever their
//! number, and every peer's message delivered through a receive budget a small fraction of
//! what their windows would need. (What each peer costs in memory is measured by
//! `examples/peer_memory.rs`, whose test runs 10,000 UD peers too.)
//!
//! `RDMX_UD_PEERS=<n>` (default 10,000) sets the number of peers.
#![expect(clippy::unwrap_used, reason = "test")]

use std::time::{Duration, Instant};

use rdmx_core::Config;
use rdmx_core::worker::Worker;
use rdmx_ud::UdTransport;

fn node(cfg: &Config) -> (Worker, UdTransport) {
    let w = Worker::open(cfg, None, &[UdTransport::RECV_BUF_SIZE]).unwrap();
    let t = UdTransport::attach(&w, cfg).unwrap();
    (w, t)
}

#[test]
fn ten_thousand_peers_share_two_queue_pairs_and_a_small_budget() {
    let n: usize = std::env::var("RDMX_UD_PEERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let cfg = Config {
        credits: 32,
        srq_depth: 1024,
        pool_max: 256 << 20,
        peer_timeout: Duration::from_secs(3),
        ..Config::default()
    };
    let (ws, s) = node(&cfg);
    let _hs = ws.start().unwrap();
    let (wc, c) = node(&cfg);
    let _hc = wc.start().unwrap();
    let qps = (s.qp_num(), c.qp_num());

    // Set-up: each `connect_local` makes a session on both transports, and two endpoint
    // handles (what an application keeps per peer, counted too).
    let t0 = Instant::now();
    let mut pairs = Vec::with_capacity(n);
    for _ in 0..n {
        pairs.push(c.connect_local(&s).unwrap());
    }
    let setup = t0.elapsed();
    assert_eq!(s.endpoint_count(), n);
    assert_eq!(
        (s.qp_num(), c.qp_num()),
        qps,
        "one queue pair each, whatever the peers"
    );

    // Every client sends a message, every server endpoint answers it: 28 whole windows of
    // budget (1,024 buffers less the control reserve, at 32 credits) for 10,000 senders.
    let t1 = Instant::now();
    for (i, (ec, _)) in pairs.iter().enumerate() {
        ec.send(&(i as u64).to_le_bytes()).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut left: Vec<usize> = (0..n).collect();
    while !left.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{} requests not in: {:?}",
            left.len(),
            s.stats()
        );
        left.retain(|&i| match pairs[i].1.try_recv() {
            Ok(m) => {
                assert_eq!(&m[..], &(i as u64).to_le_bytes());
                pairs[i].1.send(&m).unwrap();
                false
            }
            Err(_) => true,
        });
    }
    let mut left: Vec<usize> = (0..n).collect();
    while !left.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{} answers not in: {:?}",
            left.len(),
            c.stats()
        );
        left.retain(|&i| match pairs[i].0.try_recv() {
            Ok(m) => {
                assert_eq!(&m[..], &(i as u64).to_le_bytes());
                false
            }
            Err(_) => true,
        });
    }
    let exchange = t1.elapsed();

    let (st, ct) = (s.stats(), c.stats());
    let (sn, cn) = (ws.verbs_context().counters(), wc.verbs_context().counters());
    eprintln!(
        "{n} peers: set-up {setup:?}, request and answer each {exchange:?}; server {st:?}; \
         dropped for lack of a buffer: server {}, client {}",
        sn.rx_no_recv, cn.rx_no_recv
    );
    assert!(st.recalls > 0 && st.credit_waits > 0, "{st:?}");
    // Credits bound the data, the control queue pair takes the acknowledgements, requests
    // and keepalives of every peer: nothing finds the receive queue empty.
    assert_eq!((sn.rx_no_recv, cn.rx_no_recv), (0, 0));
    assert_eq!(st.malformed + st.unknown_session, 0);
    assert_eq!(ct.malformed + ct.unknown_session, 0);
    drop(pairs);
}
