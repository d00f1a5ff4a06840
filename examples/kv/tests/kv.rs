//! The KV demo: its operations, a consistency checker (writers through the server while
//! readers read one-sidedly: never a torn or mixed value, never older than a PUT already
//! acknowledged), and the bench with small parameters.
#![expect(clippy::unwrap_used, reason = "test")]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdmx_kv::bench::{BenchOptions, run};
use rdmx_kv::workload::{Dist, KeyGen, Mix, Rng, check_value, key, value};
use rdmx_kv::{KvClient, KvServer, ServerOptions};

fn server(slots: u64, max_value: u32) -> KvServer {
    server_with(slots, max_value, ServerOptions::default().readers)
}

fn server_with(slots: u64, max_value: u32, readers: usize) -> KvServer {
    KvServer::start(
        "127.0.0.1:0",
        ServerOptions {
            slots,
            max_value,
            readers,
        },
    )
    .unwrap()
}

#[test]
fn put_get_del_over_both_paths_and_clear_errors() {
    let s = server(1024, 256);
    let c = KvClient::connect(s.local_addr()).unwrap();
    assert_eq!(c.get_one_sided(b"nope").unwrap(), None);
    c.put(b"k1", b"v1").unwrap();
    c.put(b"k2", &[7u8; 256]).unwrap();
    assert_eq!(c.get_one_sided(b"k1").unwrap(), Some(b"v1".to_vec()));
    assert_eq!(c.get_rpc(b"k2").unwrap(), Some(vec![7u8; 256]));
    c.put(b"k1", b"second").unwrap();
    assert_eq!(c.get_one_sided(b"k1").unwrap(), Some(b"second".to_vec()));
    assert!(c.del(b"k1").unwrap());
    assert!(!c.del(b"k1").unwrap());
    assert_eq!(c.get_one_sided(b"k1").unwrap(), None);
    assert_eq!(c.get_rpc(b"k1").unwrap(), None);
    // A key deleted in the middle of a probe does not hide the keys after it.
    for i in 0..200u64 {
        c.put(&key(i), &value(i, 1, 32)).unwrap();
    }
    for i in (0..200u64).step_by(3) {
        assert!(c.del(&key(i)).unwrap());
    }
    for i in 0..200u64 {
        let v = c.get_one_sided(&key(i)).unwrap();
        if i % 3 == 0 {
            assert_eq!(v, None, "{i}");
        } else {
            assert_eq!(check_value(&v.unwrap()), Some((i, 1)), "{i}");
        }
    }
    // Bad input: clear statuses.
    let e = c.put(&[b'x'; 100], b"v").unwrap_err();
    assert_eq!(e.code, rdmx::rpc::Code::InvalidArgument, "{e}");
    let e = c.put(b"big", &[0u8; 300]).unwrap_err();
    assert_eq!(e.code, rdmx::rpc::Code::InvalidArgument, "{e}");
    let e = c.put(b"", b"v").unwrap_err();
    assert_eq!(e.code, rdmx::rpc::Code::InvalidArgument, "{e}");
}

/// Writers update hot keys through the server (each key has one writer, whose versions
/// grow); readers read them one-sidedly. Every value read is whole (one write's bytes, of
/// its key) and no older than the newest PUT of that key acknowledged before the read
/// began, and a reader never sees a key's version go back.
#[test]
fn one_sided_reads_never_see_torn_or_stale_values() {
    const KEYS: u64 = 64;
    let ops_goal: u64 = std::env::var("RDMX_KV_CHECK_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let s = server(1024, 512);
    let loader = KvClient::connect(s.local_addr()).unwrap();
    for k in 0..KEYS {
        loader.put(&key(k), &value(k, 0, 400)).unwrap();
    }
    // acked[k]: the newest version of key k whose PUT was acknowledged.
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let (addr, acked, stop) = (s.local_addr(), Arc::clone(&acked), Arc::clone(&stop));
            std::thread::spawn(move || {
                let c = KvClient::connect(addr).unwrap();
                let keys = KeyGen::new(KEYS, Dist::Zipf(0.99));
                let mut rng = Rng::new(w + 1);
                let mut v = 0u64;
                let mut writes = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // The writer's own keys (k % 2 == w), hot ones often.
                    let k = keys.next(&mut rng) / 2 * 2 + w;
                    if k >= KEYS {
                        continue;
                    }
                    v += 1;
                    c.put(&key(k), &value(k, v, 400)).unwrap();
                    acked[k as usize].store(v, Ordering::Release);
                    writes += 1;
                }
                writes
            })
        })
        .collect();
    let readers: Vec<_> = (0..2u64)
        .map(|r| {
            let (addr, acked, stop, ops) = (
                s.local_addr(),
                Arc::clone(&acked),
                Arc::clone(&stop),
                Arc::clone(&ops),
            );
            std::thread::spawn(move || {
                let c = KvClient::connect(addr).unwrap();
                let keys = KeyGen::new(KEYS, Dist::Zipf(0.99));
                let mut rng = Rng::new(100 + r);
                let mut stats = rdmx_kv::ReadStats::default();
                let mut seen = vec![0u64; KEYS as usize];
                while !stop.load(Ordering::Relaxed) {
                    let k = keys.next(&mut rng);
                    let floor = acked[k as usize].load(Ordering::Acquire);
                    let v = c
                        .get_one_sided_counted(&key(k), &mut stats)
                        .unwrap()
                        .expect("every key is loaded");
                    let (i, ver) = check_value(&v).expect("a torn or mixed value");
                    assert_eq!(i, k, "another key's value");
                    assert!(
                        ver >= floor,
                        "key {k}: read version {ver} after version {floor} was acknowledged"
                    );
                    assert!(
                        ver >= seen[k as usize],
                        "key {k}: version {ver} after {}",
                        seen[k as usize]
                    );
                    seen[k as usize] = ver;
                    ops.fetch_add(1, Ordering::Relaxed);
                }
                stats
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    while ops.load(Ordering::Relaxed) < ops_goal && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let writes: u64 = writers.into_iter().map(|w| w.join().unwrap()).sum();
    let mut retries = 0;
    for r in readers {
        retries += r.join().unwrap().retries;
    }
    let n = ops.load(Ordering::Relaxed);
    eprintln!("{n} one-sided reads checked against {writes} writes; {retries} slots read again");
    assert!(n >= ops_goal, "only {n} reads in 120 s");
    assert!(
        writes > 100,
        "only {writes} writes: the readers were not raced"
    );
}

#[test]
fn the_bench_runs_with_small_parameters() {
    // Both server shapes (one set reader for every client, a reader per client), and
    // clients with a thread each or sharing threads.
    for (readers, mix, one_sided, depth, clients, threads) in [
        (1, Mix::A, true, 1, 2, 0),
        (1, Mix::B, false, 8, 2, 0),
        (0, Mix::C, true, 1, 2, 0),
        (0, Mix::A, false, 2, 5, 2),
        (2, Mix::B, false, 1, 7, 3),
        (1, Mix::B, true, 2, 6, 2),
    ] {
        let s = server_with(1 << 12, 64, readers);
        let o = BenchOptions {
            mix,
            dist: Dist::Zipf(0.99),
            keys: 500,
            value_size: 64,
            clients,
            threads,
            depth,
            secs: 0.3,
            one_sided,
        };
        let r = run(s.local_addr(), &o, false).unwrap();
        assert!(r.get_stats.ops > 0, "{r:?}");
        assert_eq!((r.bad_values, r.missing, r.errors), (0, 0, 0), "{r:?}");
        assert!(r.table().contains("GET"));
    }
}

/// Every client has the table's key (one-sided GETs read it), and the table is registered
/// for reading only: a client that writes it by hand fails, and the table is intact.
#[test]
fn a_client_cannot_write_the_table() {
    let s = server(1024, 64);
    let c = KvClient::connect(s.local_addr()).unwrap();
    c.put(b"k", b"v").unwrap();
    let ctx = rdmx::Context::builder().build().unwrap();
    let ep = Arc::new(ctx.connect(s.local_addr()).unwrap());
    let rpc = rdmx::rpc::Client::new(Arc::clone(&ep), rdmx::rpc::ClientConfig::default()).unwrap();
    let info = rpc.call(rdmx_kv::methods::INFO, &()).unwrap();
    let table = rdmx::RemoteRegion {
        addr: info.addr,
        len: info.len,
        rkey: info.rkey,
    };
    let wipe = vec![0xffu8; info.len.min(4096) as usize];
    assert!(ep.write(&table, 0, &wipe).is_err(), "the table was written");
    assert_eq!(c.get_one_sided(b"k").unwrap(), Some(b"v".to_vec()));
    assert_eq!(c.get_rpc(b"k").unwrap(), Some(b"v".to_vec()));
}
