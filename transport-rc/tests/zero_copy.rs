//! Zero-copy sends of application memory (`send_shared`) and the registration cache.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use rdmx_rc::{Context, Endpoint, SharedBytes};

fn pair(regcache_max: usize) -> (Context, Endpoint, Context, Endpoint) {
    // The receive queue is pinned: a test sends more than a small queue holds before it
    // reads.
    let b = || {
        Context::builder()
            .srq_depth(512)
            .pool_max(128 << 20)
            .regcache_max(regcache_max)
    };
    let server = b().build().expect("server context");
    let listener = server.listen("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr();
    let t = std::thread::spawn(move || listener.accept().expect("accept"));
    let client = b().build().expect("client context");
    let cep = client.connect(addr).expect("connect");
    let sep = t.join().expect("accept thread");
    (client, cep, server, sep)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0] ^ seed)
        .collect()
}

#[test]
fn shared_buffers_are_read_in_place_and_the_registration_is_reused() {
    let (c, cep, _s, sep) = pair(64 << 20);
    let big: Arc<[u8]> = Arc::from(pattern(1 << 20, 1));
    let t = Duration::from_secs(10);
    // The same buffer ten times, then slices of it (rendezvous-sized and eager-sized).
    for _ in 0..10 {
        cep.send_shared(big.clone()).unwrap();
    }
    let whole = SharedBytes::from(big.clone());
    let pieces = [
        (0usize, 100_000usize),
        (500_000, 40_000),
        (1000, 100),
        (7, 5000),
    ];
    for &(off, len) in &pieces {
        cep.send_shared(whole.slice(off..off + len).unwrap())
            .unwrap();
    }
    for _ in 0..10 {
        let m = sep.recv_timeout(t).unwrap();
        assert!(m.is_rendezvous());
        assert_eq!(&m[..], &big[..]);
    }
    for &(off, len) in &pieces {
        let m = sep.recv_timeout(t).unwrap();
        assert_eq!(&m[..], &big[off..off + len]);
    }
    let rc = c.regcache_stats();
    assert_eq!(rc.misses, 1, "one registration for the buffer: {rc:?}");
    assert_eq!(rc.hits, 11, "9 repeats and two rendezvous slices: {rc:?}");
    assert_eq!((rc.entries, rc.bytes), (1, 1 << 20));
    let st = c.stats();
    assert_eq!(st.sent_zero_copy, 12);
    assert_eq!(st.sent_rndv, 12);
}

#[test]
fn bytes_dropped_by_the_application_stay_alive_until_read() {
    let (c, cep, _s, sep) = pair(64 << 20);
    let t = Duration::from_secs(10);
    // Each Vec is given away and never kept by the test: the endpoint must keep the bytes
    // until the peer has read them, then the cache lets them go.
    let n = 20;
    for i in 0..n {
        cep.send_shared(pattern(300_000, i as u8)).unwrap();
    }
    for i in 0..n {
        let m = sep.recv_timeout(t).unwrap();
        assert_eq!(&m[..], &pattern(300_000, i as u8)[..], "message {i}");
    }
    // All reads are done once the messages arrived; the next miss (or a flush) releases
    // registrations only the cache still holds.
    let deadline = std::time::Instant::now() + t;
    loop {
        c.progress();
        c.flush_regcache();
        if c.regcache_stats().entries == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            c.regcache_stats()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let rc = c.regcache_stats();
    assert_eq!((rc.misses, rc.bytes), (n as u64, 0));
}

#[test]
fn a_zero_cap_registers_every_send_and_keeps_nothing() {
    let (c, cep, _s, sep) = pair(0);
    let big: Arc<Vec<u8>> = Arc::new(pattern(200_000, 9));
    for _ in 0..3 {
        cep.send_shared(big.clone()).unwrap();
    }
    for _ in 0..3 {
        assert_eq!(
            &sep.recv_timeout(Duration::from_secs(10)).unwrap()[..],
            &big[..]
        );
    }
    let rc = c.regcache_stats();
    assert_eq!((rc.hits, rc.misses, rc.entries), (0, 3, 0));
}

#[test]
fn static_and_empty_and_oversized_shared_sends() {
    static DATA: [u8; 100_000] = [0x5a; 100_000];
    let (c, cep, _s, sep) = pair(64 << 20);
    let t = Duration::from_secs(10);
    cep.send_shared(&DATA[..]).unwrap();
    cep.send_shared(Vec::new()).unwrap();
    assert_eq!(&sep.recv_timeout(t).unwrap()[..], &DATA[..]);
    assert_eq!(sep.recv_timeout(t).unwrap().len(), 0);
    let too_big = vec![0u8; (64 << 20) + 1];
    assert!(matches!(
        cep.send_shared(too_big),
        Err(rdmx_core::Error::MessageTooLarge { .. })
    ));
    assert_eq!(c.stats().sent_zero_copy, 1);
}

#[test]
fn one_sided_writes_from_shared_bytes() {
    let (c, cep, s, sep) = pair(64 << 20);
    let region = s.register(1 << 20).unwrap();
    sep.send(&region.remote().to_bytes()).unwrap();
    let m = cep.recv_timeout(Duration::from_secs(5)).unwrap();
    let remote = rdmx_rc::RemoteRegion::from_bytes(&m).unwrap();
    let src = SharedBytes::from(pattern(600_000, 3));
    // The whole buffer, then two slices of it (cache hits), then nothing.
    cep.write_shared(&remote, 0, src.clone()).unwrap();
    assert_eq!(region.memory().to_vec(0, 600_000).unwrap(), &src[..]);
    cep.write_shared(&remote, 700_000, src.slice(1000..5000).unwrap())
        .unwrap();
    cep.write_shared(&remote, 800_000, src.slice(599_990..).unwrap())
        .unwrap();
    assert_eq!(
        region.memory().to_vec(700_000, 4000).unwrap(),
        &src[1000..5000]
    );
    assert_eq!(
        region.memory().to_vec(800_000, 10).unwrap(),
        &src[599_990..]
    );
    cep.write_shared(&remote, 0, Vec::new()).unwrap();
    let rc = c.regcache_stats();
    assert_eq!((rc.misses, rc.hits), (1, 2), "{rc:?}");
    // Out of range: refused before anything is posted.
    assert!(matches!(
        cep.write_shared(&remote, 500_000, src.clone()),
        Err(rdmx_core::Error::InvalidArgument(_))
    ));
    // Still usable afterwards.
    cep.send(b"after").unwrap();
    assert_eq!(
        &sep.recv_timeout(Duration::from_secs(5)).unwrap()[..],
        b"after"
    );
}

#[test]
fn a_refused_shared_write_fails_the_endpoint_and_lets_the_bytes_go() {
    let (c, cep, s, sep) = pair(64 << 20);
    let region = s.register(1 << 16).unwrap();
    let mut remote = region.remote();
    remote.rkey ^= 0x5A5A_5A5A; // a key the peer never gave out
    let src: Arc<[u8]> = Arc::from(pattern(40_000, 1));
    let e = cep.write_shared(&remote, 0, src.clone()).unwrap_err();
    assert!(matches!(e, rdmx_core::Error::Disconnected(_)), "{e}");
    assert!(
        region
            .memory()
            .to_vec(0, 64)
            .unwrap()
            .iter()
            .all(|&b| b == 0)
    );
    // The endpoint keeps the registration until its queue pair is gone; then only the
    // cache holds the bytes, and a flush lets them go.
    drop(cep);
    drop(sep);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while Arc::strong_count(&src) > 1 {
        c.progress();
        c.flush_regcache();
        assert!(
            std::time::Instant::now() < deadline,
            "the bytes are still referenced"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
