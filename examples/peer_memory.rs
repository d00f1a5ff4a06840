//! What a peer costs: queue pairs per context and bytes per endpoint, for RC and UD
//! endpoints, at any number of peers.
//!
//! Two workers in one process, each with the transport, connected `PEERS` times
//! (`connect_local`: an endpoint on each side). Bytes are counted by this program's
//! allocator (everything the endpoints, their sessions or queue pairs and the soft NIC's
//! state hold, beyond the registered buffer pools, which grow with traffic, not with
//! peers) and divided by the number of endpoints: once set up, and again after one
//! round trip on every endpoint and a quiet spell. Queue pairs are the soft NIC's count.
//! Prints one JSON line.
//!
//! ```sh
//! cargo run --release --example peer_memory -- ud 10000
//! cargo run --release --example peer_memory -- rc 1000
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::error::Error as StdError;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use rdmx::core::worker::Worker;
use rdmx::{Config, Endpoint, RcTransport, UdTransport};

/// The system allocator, counting the bytes live.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call goes to the system allocator with the caller's arguments; the counter
// is arithmetic on the sizes only.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract for `realloc`, passed on.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// What one run measured.
#[derive(Debug)]
struct Report {
    transport: String,
    peers: usize,
    qps_per_context: u64,
    bytes_per_endpoint_fresh: f64,
    bytes_per_endpoint_quiet: f64,
    setup_s: f64,
    round_trips_s: f64,
}

fn main() -> Result<(), Box<dyn StdError>> {
    let mut args = std::env::args().skip(1);
    let transport = args.next().unwrap_or_else(|| "ud".into());
    let peers = match args.next() {
        Some(a) => a.parse().map_err(|e| format!("peers {a:?}: {e}"))?,
        None => 1000,
    };
    let r = run(&transport, peers)?;
    println!(
        "{{\"transport\":\"{}\",\"peers\":{},\"qps_per_context\":{},\
         \"bytes_per_endpoint_fresh\":{:.0},\"bytes_per_endpoint_quiet\":{:.0},\
         \"setup_s\":{:.3},\"round_trips_s\":{:.3}}}",
        r.transport,
        r.peers,
        r.qps_per_context,
        r.bytes_per_endpoint_fresh,
        r.bytes_per_endpoint_quiet,
        r.setup_s,
        r.round_trips_s
    );
    Ok(())
}

/// Waits (up to a second) until no thread allocates or frees any more: the workers of an
/// earlier run end within a tick of their last handle, and what they free must not count
/// against this one.
fn settle() {
    for _ in 0..20 {
        let a = LIVE.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(50));
        if LIVE.load(Ordering::Relaxed) == a {
            return;
        }
    }
}

/// Connects `peers` endpoint pairs over `transport` (`rc` or `ud`) and measures.
fn run(transport: &str, peers: usize) -> Result<Report, Box<dyn StdError>> {
    settle();
    let cfg = Config {
        pool_max: 1 << 30,
        peer_timeout: Duration::from_secs(3),
        ..Config::default()
    };
    let ud = match transport {
        "ud" => true,
        "rc" => false,
        other => return Err(format!("transport {other:?}: rc or ud").into()),
    };
    let class = if ud {
        UdTransport::RECV_BUF_SIZE
    } else {
        cfg.recv_buf_size()
    };
    let (wa, wb) = (
        Worker::open(&cfg, None, &[class])?,
        Worker::open(&cfg, None, &[class])?,
    );
    let qps = |w: &Worker| {
        let c = w.verbs_context().counters();
        c.qps_created - c.qps_destroyed
    };
    let qps0 = qps(&wa);
    enum T {
        Rc(RcTransport, RcTransport),
        Ud(UdTransport, UdTransport),
    }
    let t = if ud {
        T::Ud(
            UdTransport::attach(&wa, &cfg)?,
            UdTransport::attach(&wb, &cfg)?,
        )
    } else {
        T::Rc(
            RcTransport::attach(&wa, &cfg, None)?,
            RcTransport::attach(&wb, &cfg, None)?,
        )
    };
    let (_ha, _hb) = (wa.start()?, wb.start()?);

    // (Pool chunks come from the allocator too: what the pools grow by is left out.)
    let pools =
        || (wa.pool().stats().registered_bytes + wb.pool().stats().registered_bytes) as isize;
    let before = LIVE.load(Ordering::Relaxed) - pools();
    let t0 = Instant::now();
    let mut pairs: Vec<(Endpoint, Endpoint)> = Vec::with_capacity(peers);
    for _ in 0..peers {
        pairs.push(match &t {
            T::Rc(a, b) => {
                let (x, y) = a.connect_local(b)?;
                (x.into(), y.into())
            }
            T::Ud(a, b) => {
                let (x, y) = a.connect_local(b)?;
                (x.into(), y.into())
            }
        });
    }
    let setup = t0.elapsed();
    let ours = (pairs.capacity() * size_of::<(Endpoint, Endpoint)>()) as isize;
    let per = |live: isize| (live - before - ours) as f64 / (2 * peers) as f64;
    let fresh = per(LIVE.load(Ordering::Relaxed) - pools());
    eprintln!(
        "{transport}: {peers} endpoint pairs set up in {setup:?}, {fresh:.0} bytes per endpoint"
    );
    let qps_per_context = qps(&wa) - qps0;

    // A round trip on every endpoint, all under way at once: one thread sends every
    // request, another answers them as they come (a single thread sending everything
    // first would stall: RC bounds what a context holds unread, and blocks senders).
    let t1 = Instant::now();
    let wait = Duration::from_secs(60);
    std::thread::scope(|sc| -> Result<(), String> {
        let server = sc.spawn(|| -> Result<(), String> {
            for (i, (_, b)) in pairs.iter().enumerate() {
                let m = b
                    .recv_timeout(wait)
                    .map_err(|e| format!("request {i}: {e}"))?;
                if m[..] != (i as u64).to_le_bytes() {
                    return Err(format!("endpoint {i}: a wrong message"));
                }
                b.send(&m).map_err(|e| format!("answer {i}: {e}"))?;
            }
            Ok(())
        });
        for (i, (a, _)) in pairs.iter().enumerate() {
            a.send(&(i as u64).to_le_bytes())
                .map_err(|e| format!("send {i}: {e}"))?;
        }
        for (i, (a, _)) in pairs.iter().enumerate() {
            let m = a
                .recv_timeout(wait)
                .map_err(|e| format!("answer {i}: {e}"))?;
            if m[..] != (i as u64).to_le_bytes() {
                return Err(format!("endpoint {i}: a wrong answer"));
            }
        }
        server
            .join()
            .map_err(|_| "the answering thread panicked".to_string())?
    })?;
    let round_trips = t1.elapsed();
    eprintln!("{transport}: a round trip on each in {round_trips:?}");
    // Quiet endpoints give back what the busy spell grew (UD: at the keepalive).
    std::thread::sleep(cfg.peer_timeout / 3 + Duration::from_millis(300));
    let quiet = per(LIVE.load(Ordering::Relaxed) - pools());
    drop(pairs);
    Ok(Report {
        transport: transport.into(),
        peers,
        qps_per_context,
        bytes_per_endpoint_fresh: fresh,
        bytes_per_endpoint_quiet: quiet,
        setup_s: setup.as_secs_f64(),
        round_trips_s: round_trips.as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    /// The allocator counts every thread's bytes: one measurement at a time.
    static ALONE: Mutex<()> = Mutex::new(());

    #[test]
    fn runs() {
        let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
        for t in ["rc", "ud"] {
            let r = super::run(t, 20).unwrap();
            assert_eq!(r.qps_per_context, if t == "rc" { 20 } else { 2 }, "{r:?}");
            assert!(r.bytes_per_endpoint_fresh > 0.0, "{r:?}");
        }
    }

    /// Issue 18's target: 10,000 UD peers on one context, the queue pairs fixed, under
    /// 2 KiB per peer beyond the shared pool.
    #[test]
    fn ten_thousand_ud_peers_cost_under_2_kib_each() {
        let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
        let r = super::run("ud", 10_000).unwrap();
        assert_eq!(r.qps_per_context, 2, "{r:?}");
        assert!(
            r.bytes_per_endpoint_fresh < 2048.0 && r.bytes_per_endpoint_quiet < 2048.0,
            "{r:?}"
        );
    }
}
