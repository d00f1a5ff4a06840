//! Endpoints between processes: exactly-once delivery under packet loss (half of it sent in
//! send batches, with packed frames), and a peer that is killed mid-stream.
#![allow(missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::{ChildProc, check, fill, mixed_size};
use rdmx_core::{DisconnectCause, Error, Event};
use rdmx_rc::Context;
use rdmx_verbs::{DeviceOptions, FaultConfig};

const FAULTS: &str = "seed=11,drop=5%,reorder=2%";
const MESSAGES: u32 = 100_000;

/// The sender: connects to the parent and streams the mixed-size messages, then closes.
#[test]
#[ignore = "child process of exactly_once_under_loss"]
fn child_mixed_sender() {
    let Ok(addr) = std::env::var("RDMX_TEST_ADDR") else {
        return;
    };
    let ctx = Context::builder()
        .peer_timeout(Duration::from_millis(150))
        .build()
        .expect("child context (RDMX_FAULTS set by the parent)");
    let ep = ctx.connect(addr.as_str()).expect("connect");
    let n: u32 = std::env::var("RDMX_TEST_COUNT").unwrap().parse().unwrap();
    let mut buf = vec![0u8; 64 << 10]; // the largest mixed_size is 49151
    // The second half goes in send batches of 16, so that small messages travel packed.
    let mut batch = None;
    for i in 0..n {
        if i >= n / 2 && i % 16 == 0 {
            drop(batch.take());
            batch = Some(ctx.batch());
        }
        let len = mixed_size(i);
        fill(i, &mut buf[..len]);
        ep.send(&buf[..len]).expect("send");
    }
    drop(batch);
    ep.close().expect("close");
    let st = ctx.stats();
    println!(
        "SENT inline={} packed={} frames={} eager={} rndv={} faults={:?}",
        st.sent_inline,
        st.sent_packed,
        st.packed_frames,
        st.sent_eager,
        st.sent_rndv,
        ctx.verbs_context().fault_stats()
    );
}

#[test]
fn exactly_once_under_loss() {
    let faults = FaultConfig::parse(FAULTS).unwrap();
    let ctx = Context::builder()
        .peer_timeout(Duration::from_millis(150))
        .device_options(DeviceOptions::default().with_faults(faults))
        .build()
        .unwrap();
    let listener = ctx.listen("127.0.0.1:0").unwrap();
    let child = ChildProc::spawn(
        "child_mixed_sender",
        &[
            ("RDMX_TEST_ADDR", listener.local_addr().to_string()),
            ("RDMX_TEST_COUNT", MESSAGES.to_string()),
            ("RDMX_FAULTS", FAULTS.to_string()),
        ],
    );
    let ep = listener.accept().expect("accept");
    let start = Instant::now();
    let mut next = 0u32;
    loop {
        match ep.recv_timeout(Duration::from_secs(30)) {
            Ok(m) => {
                let i = check(&m);
                assert_eq!(i, next, "out of order or duplicated");
                next += 1;
            }
            Err(Error::Disconnected(DisconnectCause::PeerClosed)) => break,
            Err(e) => panic!("after {next} messages: {e}"),
        }
    }
    assert_eq!(next, MESSAGES, "messages lost");
    let sent = child.expect_line("SENT", Duration::from_secs(10));
    child.wait_ok(Duration::from_secs(10));
    assert!(
        !sent.contains("packed=0 "),
        "no message travelled packed: {sent}"
    );
    let faults = ctx
        .verbs_context()
        .fault_stats()
        .expect("fault plan active");
    let counters = ctx.device_counters();
    eprintln!(
        "{MESSAGES} messages in {:?}; child: {sent}; here: {faults:?}; rnr_naks_sent={}",
        start.elapsed(),
        counters.rnr_naks_sent
    );
    assert!(
        faults.dropped > 0 && faults.reordered > 0,
        "no faults were injected"
    );
    assert_eq!(counters.rnr_naks_sent, 0, "the receiver issued RNR NAKs");
}

/// The victim: accepts, streams messages to the parent until it is killed.
#[test]
#[ignore = "child process of peer_killed_mid_stream"]
fn child_streamer() {
    let Ok(_) = std::env::var("RDMX_TEST_STREAM") else {
        return;
    };
    let ctx = Context::builder().build().unwrap();
    let listener = ctx.listen("127.0.0.1:0").unwrap();
    println!("ADDR {}", listener.local_addr());
    let ep = listener.accept().unwrap();
    let mut i = 0u32;
    loop {
        ep.send(&i.to_le_bytes()).unwrap();
        i = i.wrapping_add(1);
        if i.is_multiple_of(1000) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[test]
fn peer_killed_mid_stream() {
    let timeout = Duration::from_millis(600);
    let ctx = Context::builder().peer_timeout(timeout).build().unwrap();
    // A second, healthy endpoint on the same context.
    let other = Context::builder().build().unwrap();
    let ol = other.listen("127.0.0.1:0").unwrap();
    let oaddr = ol.local_addr();
    let echo = std::thread::spawn(move || {
        let ep = ol.accept().unwrap();
        while let Ok(m) = ep.recv() {
            if ep.send(&m).is_err() {
                break;
            }
        }
    });
    let healthy = ctx.connect(oaddr).unwrap();

    // Pool memory in use before the victim's endpoint exists (the receive queue's buffers).
    let base = ctx.pool_stats().in_use_bytes;
    let mut child = ChildProc::spawn("child_streamer", &[("RDMX_TEST_STREAM", "1".into())]);
    let addr = child.expect_line("ADDR", Duration::from_secs(10));
    let ep = ctx.connect(addr.as_str()).unwrap();
    for _ in 0..2000 {
        ep.recv_timeout(Duration::from_secs(5)).expect("stream");
    }
    child.child.kill().unwrap();
    let killed = Instant::now();
    let _ = child.child.wait();
    // Drain what is left, then the error must come.
    let err = loop {
        match ep.recv_timeout(Duration::from_secs(10)) {
            Ok(_) => {}
            Err(e) => break e,
        }
    };
    let took = killed.elapsed();
    assert!(
        matches!(
            err,
            Error::Disconnected(DisconnectCause::PeerUnreachable(_))
        ),
        "{err}"
    );
    assert!(
        took < timeout * 2 + Duration::from_millis(500),
        "peer death took {took:?} to surface (timeout {timeout:?})"
    );
    let ev = loop {
        match ctx.wait_event(Duration::from_secs(1)) {
            Some(e @ Event::Disconnected { .. }) => break e,
            Some(_) => {}
            None => panic!("no Disconnected event"),
        }
    };
    assert_eq!(
        ev,
        Event::Disconnected {
            endpoint: ep.id(),
            cause: ep.disconnect_cause().unwrap()
        }
    );
    eprintln!("peer death surfaced after {took:?}");
    // Once the dead endpoint is dropped (its queue pair destroyed), every buffer it held
    // is back in the pool.
    drop(ep);
    let _ = ctx.progress();
    let in_use = ctx.pool_stats().in_use_bytes;
    assert!(
        in_use <= base,
        "{in_use} bytes in use after the dead endpoint was dropped, {base} before it existed"
    );
    // The other endpoint keeps working.
    for i in 0..100u32 {
        healthy.send(&i.to_le_bytes()).unwrap();
        let m = healthy.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(m[..], i.to_le_bytes());
    }
    drop(healthy);
    echo.join().unwrap();
}

/// The same death seen by a server that receives only through `Context::recv`: the dead
/// endpoint is reported as an event within the timeout, and messages of a healthy endpoint
/// keep coming, in order, before and after.
#[test]
fn peer_killed_while_receiving_through_the_context() {
    let timeout = Duration::from_millis(600);
    let ctx = Context::builder().peer_timeout(timeout).build().unwrap();
    let other = Context::builder().build().unwrap();
    let ol = other.listen("127.0.0.1:0").unwrap();
    let oaddr = ol.local_addr();
    let streamer = std::thread::spawn(move || {
        let ep = ol.accept().unwrap();
        let mut i = 0u32;
        while ep.send(&i.to_le_bytes()).is_ok() {
            i = i.wrapping_add(1);
        }
    });
    let healthy = ctx.connect(oaddr).unwrap();
    let mut child = ChildProc::spawn("child_streamer", &[("RDMX_TEST_STREAM", "1".into())]);
    let addr = child.expect_line("ADDR", Duration::from_secs(10));
    let victim = ctx.connect(addr.as_str()).unwrap();

    let mut next_healthy = 0u32;
    let mut next_victim = 0u32;
    let mut killed: Option<Instant> = None;
    let mut reported: Option<Duration> = None;
    let mut healthy_after = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while reported.is_none() || healthy_after < 500 {
        assert!(
            Instant::now() < deadline,
            "stuck: victim reported {reported:?}"
        );
        let m = ctx
            .recv_timeout(Duration::from_secs(5))
            .expect("context recv");
        let v = u32::from_le_bytes(m[..4].try_into().unwrap());
        if m.endpoint() == healthy.id() {
            assert_eq!(v, next_healthy, "healthy endpoint out of order");
            next_healthy += 1;
            if reported.is_some() {
                healthy_after += 1;
            }
        } else {
            assert_eq!(m.endpoint(), victim.id());
            assert!(
                reported.is_none(),
                "a message from the dead peer after its report"
            );
            assert_eq!(v, next_victim, "victim's stream out of order");
            next_victim += 1;
        }
        if killed.is_none() && next_victim >= 2000 {
            child.child.kill().unwrap();
            let _ = child.child.wait();
            killed = Some(Instant::now());
        }
        while let Some(ev) = ctx.poll_event() {
            if let Event::Disconnected { endpoint, cause } = ev {
                assert_eq!(
                    endpoint,
                    victim.id(),
                    "the healthy endpoint went down: {cause}"
                );
                assert!(
                    matches!(cause, DisconnectCause::PeerUnreachable(_)),
                    "{cause}"
                );
                let k = killed.expect("disconnected before the kill");
                reported = Some(k.elapsed());
            }
        }
    }
    let took = reported.unwrap();
    eprintln!("peer death surfaced after {took:?} while receiving through the context");
    assert!(
        took < timeout * 2 + Duration::from_millis(500),
        "peer death took {took:?} to surface (timeout {timeout:?})"
    );
    drop(victim);
    drop(healthy);
    drop(ctx);
    streamer.join().unwrap();
}
