//! One-sided operations started and waited for later, bounded by a timeout, and async; and
//! what they report when the peer is gone (the endpoint's cause).
#![allow(missing_docs)]

use std::time::{Duration, Instant};

use rdmx_core::{DisconnectCause, Error};
use rdmx_rc::{Context, Endpoint, LocalRegion, RemoteRegion};

const T: Duration = Duration::from_secs(10);

fn pair_with(server: rdmx_rc::ContextBuilder) -> (Context, Endpoint, Context, Endpoint) {
    let s = server.build().expect("server context");
    let listener = s.listen("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr();
    let t = std::thread::spawn(move || listener.accept().expect("accept"));
    let c = Context::builder()
        .peer_timeout(Duration::from_millis(600))
        .build()
        .expect("client context");
    let cep = c.connect(addr).expect("connect");
    let sep = t.join().expect("accept thread");
    (c, cep, s, sep)
}

fn region(s: &Context, len: usize) -> (LocalRegion, RemoteRegion) {
    let r = s.register(len).expect("register");
    let remote = r.remote();
    (r, remote)
}

#[test]
fn many_operations_in_flight_from_one_thread() {
    let (_c, cep, s, _sep) = pair_with(Context::builder());
    let (_c2, cep2, s2, _sep2) = pair_with(Context::builder());
    let (r1, rem1) = region(&s, 1 << 16);
    let (r2, rem2) = region(&s2, 1 << 16);
    for i in 0..64u64 {
        r1.memory().write_u64(i as usize * 8, i * 3).unwrap();
        r2.memory().write_u64(i as usize * 8, i * 5).unwrap();
    }
    // 64 reads on each of two endpoints, all posted before any is waited for, waited for
    // in reverse order.
    let mut ops = Vec::new();
    for i in 0..64u64 {
        ops.push((i, 3, cep.start_read(&rem1, i * 8, 8).unwrap()));
        ops.push((i, 5, cep2.start_read(&rem2, i * 8, 8).unwrap()));
    }
    while let Some((i, k, op)) = ops.pop() {
        let b = op.wait_timeout(T).unwrap();
        assert_eq!(u64::from_ne_bytes(b[..8].try_into().unwrap()), i * k);
    }
    // Writes and atomics started together; try_wait until each is there.
    let w = cep.start_write(&rem1, 4096, b"started").unwrap();
    let mut fa = cep.start_fetch_add(&rem1, 0, 10).unwrap();
    let cs = cep.start_compare_swap(&rem1, 8, 3, 33).unwrap();
    let end = Instant::now() + T;
    let got = loop {
        if let Some(r) = fa.try_wait() {
            break r.unwrap();
        }
        assert!(Instant::now() < end, "fetch_add never completed");
    };
    assert_eq!(got, 0);
    w.wait().unwrap();
    assert_eq!(cs.wait().unwrap(), 3);
    assert_eq!(r1.memory().to_vec(4096, 7).unwrap(), b"started");
    assert_eq!(r1.memory().read_u64(0).unwrap(), 10);
    assert_eq!(r1.memory().read_u64(8).unwrap(), 33);
    // Bounded forms on a live peer complete like the blocking ones.
    assert_eq!(
        &cep.read_timeout(&rem1, 4096, 7, T).unwrap()[..],
        b"started"
    );
    cep.write_timeout(&rem1, 0, &7u64.to_ne_bytes(), T).unwrap();
    assert_eq!(cep.fetch_add_timeout(&rem1, 0, 1, T).unwrap(), 7);
    assert_eq!(cep.compare_swap_timeout(&rem1, 0, 8, 0, T).unwrap(), 8);
    // A dropped operation completes on its own; the endpoint goes on.
    drop(cep.start_read(&rem1, 0, 4096).unwrap());
    assert_eq!(cep.fetch_add(&rem1, 0, 2).unwrap(), 0);
}

#[test]
fn a_silent_peer_times_out_then_fails_with_the_endpoints_cause() {
    // The server's device drops everything it receives: the client's operations get no
    // answer.
    let faults = rdmx_verbs::FaultConfig::parse("seed=1,drop=100%").unwrap();
    let (c, cep, s, _sep) = pair_with(
        Context::builder()
            .peer_timeout(Duration::from_millis(600))
            .device_options(rdmx_verbs::DeviceOptions::default().with_faults(faults)),
    );
    let (_r, rem) = region(&s, 4096);
    let in_use = c.pool_stats().in_use_bytes;
    let t0 = Instant::now();
    let e = cep
        .read_timeout(&rem, 0, 1024, Duration::from_millis(150))
        .unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e:?}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    // A deadline that flushes: the timed-out read may not happen later, so the endpoint
    // failed (its queue pair was flushed), and what follows fails with that cause.
    let cause = cep.disconnect_cause().expect("the endpoint is down");
    assert!(
        matches!(&cause, DisconnectCause::TransportError(why) if why.contains("flushed")),
        "{cause:?}"
    );
    let e = cep.start_fetch_add(&rem, 0, 1).map(|_| ()).unwrap_err();
    assert!(matches!(&e, Error::Disconnected(c) if *c == cause), "{e:?}");
    let e = cep.read(&rem, 0, 8).unwrap_err();
    assert!(matches!(&e, Error::Disconnected(c) if *c == cause), "{e:?}");
    // The timed-out read's buffer goes back once its work is flushed.
    let end = Instant::now() + T;
    while c.pool_stats().in_use_bytes > in_use {
        assert!(Instant::now() < end, "{:?}", c.pool_stats());
        c.progress();
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(feature = "tokio")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_one_sided_operations() {
    let (_c, cep, s, _sep) = pair_with(Context::builder());
    let (r, rem) = region(&s, 4096);
    r.memory().write(0, b"async bytes").unwrap();
    let read = cep.start_read(&rem, 0, 11).unwrap();
    let add = cep.start_fetch_add(&rem, 2048, 4).unwrap();
    let (b, v) = tokio::join!(read.wait_async(), add.wait_async());
    assert_eq!(&b.unwrap()[..], b"async bytes");
    assert_eq!(v.unwrap(), 0);
    // A dropped future leaves its operation to complete.
    let f = cep.start_read(&rem, 0, 4096).unwrap().wait_async();
    drop(f);
    assert_eq!(
        cep.start_fetch_add(&rem, 2048, 1)
            .unwrap()
            .wait_async()
            .await
            .unwrap(),
        4
    );
}

#[test]
fn a_silent_peer_fails_waiting_operations_with_the_endpoints_cause() {
    // Without a deadline, an operation to a peer that never answers waits for the peer
    // timeout, then fails with the endpoint's own cause (not a completion status).
    let faults = rdmx_verbs::FaultConfig::parse("seed=1,drop=100%").unwrap();
    let (c, cep, s, _sep) = pair_with(
        Context::builder()
            .peer_timeout(Duration::from_millis(600))
            .device_options(rdmx_verbs::DeviceOptions::default().with_faults(faults)),
    );
    let (_r, rem) = region(&s, 4096);
    let in_use = c.pool_stats().in_use_bytes;
    let pending = cep.start_fetch_add(&rem, 0, 1).unwrap();
    let e = pending.wait().unwrap_err();
    let cause = cep.disconnect_cause().expect("the endpoint is down");
    assert!(
        matches!(cause, DisconnectCause::PeerUnreachable(_)),
        "{cause:?}"
    );
    assert!(matches!(&e, Error::Disconnected(c) if *c == cause), "{e:?}");
    let end = Instant::now() + T;
    while c.pool_stats().in_use_bytes > in_use {
        assert!(Instant::now() < end, "{:?}", c.pool_stats());
        c.progress();
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A region registered for reading only: peers read it; a write or an atomic is a remote
/// access error that fails the writer's endpoint (and only it), and the region is untouched.
#[test]
fn a_read_only_region_refuses_writes_and_atomics() {
    let s = Context::builder().build().expect("server context");
    let r = s
        .register_with(4096, rdmx_rc::RemoteAccess::Read)
        .expect("register");
    r.memory().write(0, &[7u8; 64]).unwrap();
    let rem = r.remote();
    let listener = s.listen("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr();
    let accept = std::thread::spawn(move || {
        let eps: Vec<Endpoint> = (0..3).map(|_| listener.accept().expect("accept")).collect();
        eps
    });
    let c = Context::builder().build().expect("client context");
    let reader = c.connect(addr).expect("connect");
    let writer = c.connect(addr).expect("connect");
    let atomic = c.connect(addr).expect("connect");
    let _server_eps = accept.join().expect("accept thread");
    assert_eq!(&reader.read(&rem, 0, 64).unwrap()[..], &[7u8; 64]);
    assert!(
        writer.write(&rem, 0, &[0u8; 64]).is_err(),
        "a write went through"
    );
    assert!(
        atomic.fetch_add(&rem, 0, 1).is_err(),
        "an atomic went through"
    );
    assert_eq!(r.memory().to_vec(0, 64).unwrap(), vec![7u8; 64]);
    // The reader's endpoint is unaffected.
    assert_eq!(&reader.read(&rem, 8, 8).unwrap()[..], &[7u8; 8]);
    for ep in [&writer, &atomic] {
        assert!(matches!(ep.read(&rem, 0, 8), Err(Error::Disconnected(_))));
    }
}
