//! Smoke test of the simulated net under the message layer.
use std::time::Duration;

use rdmx_core::Config;
use rdmx_core::worker::Worker;
use rdmx_rc::RcTransport;
use rdmx_verbs::DeviceOptions;
use rdmx_verbs::soft::{SimLink, SimNet};

#[test]
fn two_workers_exchange_messages_on_a_lossy_simulated_net() {
    let net = SimNet::new(
        7,
        SimLink {
            loss: 0.02,
            jitter: Duration::from_micros(20),
            duplicate: 0.01,
            ..SimLink::default()
        },
    );
    let mut cfg = Config {
        srq_depth: 64,
        pool_max: 16 << 20,
        rndv_threshold: 4096,
        ..Config::default()
    };
    let mut nodes = Vec::new();
    for i in 0..2 {
        cfg.device = format!("soft:10.0.0.{}", i + 1);
        let w = Worker::open(
            &cfg,
            Some(DeviceOptions::default().with_sim(&net)),
            &[cfg.recv_buf_size()],
        )
        .unwrap();
        let t = RcTransport::attach(&w, &cfg, None).unwrap();
        nodes.push((w, t));
    }
    let (a, b) = nodes[0].1.connect_local(&nodes[1].1).unwrap();
    let start = std::time::Instant::now();
    let mut sent = 0u32;
    let mut got = 0u32;
    let total = 200u32;
    let mut steps = 0;
    while got < total && steps < 200_000 {
        steps += 1;
        while sent < total {
            let len = [8usize, 100, 1000, 5000, 20000][sent as usize % 5];
            let mut m = vec![(sent % 251) as u8; len];
            m[..4].copy_from_slice(&sent.to_le_bytes());
            match a.try_send(&m) {
                Ok(()) => sent += 1,
                Err(rdmx_core::Error::WouldBlock) => break,
                Err(e) => panic!("send {sent}: {e}"),
            }
        }
        while let Ok(m) = b.try_recv() {
            let n = u32::from_le_bytes(m[..4].try_into().unwrap());
            assert_eq!(n, got, "in order");
            got += 1;
        }
        let mut next = net.next_event();
        for (w, _) in &nodes {
            if let Some(t) = w.drive() {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        }
        // Application work that a drive made possible comes first.
        if let Some(t) = next {
            net.advance_to(t);
        }
    }
    eprintln!(
        "got {got}/{total} in {steps} steps, virtual {:?}, real {:?}, {:?}",
        net.elapsed(),
        start.elapsed(),
        net.stats()
    );
    assert_eq!(got, total);
}
