//! The async forms of UD endpoint calls (feature `tokio`).
#![cfg(feature = "tokio")]
#![expect(clippy::unwrap_used, reason = "test")]

use std::time::Duration;

use rdmx_core::Config;
use rdmx_core::worker::Worker;
use rdmx_ud::UdTransport;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_over_tasks() {
    let cfg = Config {
        credits: 8,
        srq_depth: 64,
        pool_max: 32 << 20,
        ..Config::default()
    };
    let open = || {
        let w = Worker::open(&cfg, None, &[UdTransport::RECV_BUF_SIZE]).unwrap();
        let t = UdTransport::attach(&w, &cfg).unwrap();
        let h = w.start().unwrap();
        (h, t)
    };
    let (_ha, a) = open();
    let (_hb, b) = open();
    let (ea, eb) = a.connect_local(&b).unwrap();
    let server = tokio::spawn(async move {
        for _ in 0..100 {
            let m = eb.recv_async().await.unwrap();
            eb.send_async(&m).await.unwrap();
        }
        eb
    });
    for i in 0..100u32 {
        let m = vec![i as u8; (i as usize * 997) % 20_000];
        ea.send_async(&m).await.unwrap();
        let back = tokio::time::timeout(Duration::from_secs(10), ea.recv_async())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&back[..], &m[..]);
    }
    let _eb = server.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_over_tasks() {
    use rdmx_ud::group::Group;
    use rdmx_ud::mcast::McastConfig;
    let cfg = Config {
        srq_depth: 128,
        pool_max: 32 << 20,
        ..Config::default()
    };
    let name = format!("rdmx-async-group-{}", std::process::id());
    let join = || {
        let w = Worker::open(&cfg, None, &[UdTransport::RECV_BUF_SIZE]).unwrap();
        let h = w.start().unwrap();
        let g = Group::join(&w, &cfg, &name, McastConfig::default()).unwrap();
        (h, w, g)
    };
    let (_ha, _wa, a) = join();
    let (_hb, _wb, b) = join();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while a.receivers() < 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the group never formed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let reader = tokio::spawn(async move {
        for i in 0..300u32 {
            let (_, m) = b.recv_async().await.unwrap();
            assert_eq!(m, i.to_le_bytes());
        }
    });
    for i in 0..300u32 {
        a.publish_async(&i.to_le_bytes()).await.unwrap();
    }
    tokio::time::timeout(Duration::from_secs(10), reader)
        .await
        .expect("the reader finished")
        .unwrap();
}
