//! The YCSB-style bench: `clients` connections (on one context), driven by a thread each
//! or, with `threads`, by that many threads as `redis-benchmark` drives its connections
//! from one, run a [`Mix`] of reads and updates on keys drawn by a [`Dist`] for `secs`
//! seconds, with a live line once a second; then ops/s and p50/p99/p99.9 per operation
//! type.
//!
//! A thread with several connections runs them in waves: one round on each (its RPC
//! operations all leave in one send batch, its one-sided reads are all posted), then it
//! takes the answers, connection after connection.
//!
//! Reads are one-sided (RDMA READ of the key's slots) or through the server (RPC);
//! updates go through the server. With `depth` > 1 a client runs rounds of `depth`
//! operations as `redis-benchmark -P` does: the round's RPC operations leave in one send
//! batch and the round waits for all their answers (one-sided reads run one at a time
//! inside it). Every value read is checked (the key's, whole: never torn or mixed).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdmx::rpc::PendingCall;

use crate::workload::{Dist, KeyGen, Mix, Rng, check_value, key, value};
use crate::{KvClient, KvError, ReadStats, methods};

/// What the bench runs.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The read/update mix.
    pub mix: Mix,
    /// The key distribution.
    pub dist: Dist,
    /// Keys (loaded before the run).
    pub keys: u64,
    /// Value bytes (at least 16).
    pub value_size: usize,
    /// Connections (clients).
    pub clients: usize,
    /// Threads that drive them (0: one per connection).
    pub threads: usize,
    /// RPC operations in flight per client.
    pub depth: usize,
    /// Seconds measured.
    pub secs: f64,
    /// Reads one-sided (else through the server).
    pub one_sided: bool,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            mix: Mix::B,
            dist: Dist::Zipf(0.99),
            keys: 10_000,
            value_size: 64,
            clients: 1,
            threads: 0,
            depth: 1,
            secs: 5.0,
            one_sided: true,
        }
    }
}

/// Latency statistics of one operation type (microseconds).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct OpStats {
    /// Operations done.
    pub ops: u64,
    /// Per second.
    pub ops_per_s: f64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
}

/// What the bench measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchReport {
    /// The mix's letter.
    pub workload: &'static str,
    /// "uniform" or "zipf".
    pub dist: String,
    /// Value bytes.
    pub value_size: usize,
    /// Connections (clients).
    pub clients: usize,
    /// Threads that drove them.
    pub threads: usize,
    /// RPC operations in flight per client.
    pub depth: usize,
    /// "one-sided" or "rpc".
    pub get: &'static str,
    /// Seconds measured.
    pub secs: f64,
    /// All operations per second.
    pub ops_per_s: f64,
    /// Reads.
    pub get_stats: OpStats,
    /// Updates.
    pub put_stats: OpStats,
    /// One-sided reads that found a slot being written and read again.
    pub read_retries: u64,
    /// One-sided reads that gave up and asked the server.
    pub read_fallbacks: u64,
    /// Values read that were not whole (must be 0).
    pub bad_values: u64,
    /// Keys not found (must be 0: every key is loaded first).
    pub missing: u64,
    /// Failed operations.
    pub errors: u64,
}

/// Latencies of one operation type: every operation counted, a bounded sample of their
/// latencies kept (when full, every other one is dropped and later ones are taken at
/// twice the stride: a uniform sample over the whole run).
#[derive(Debug)]
struct Samples {
    ops: u64,
    stride: u64,
    v: Vec<u64>,
}

impl Default for Samples {
    fn default() -> Self {
        Self {
            ops: 0,
            stride: 1,
            v: Vec::new(),
        }
    }
}

impl Samples {
    fn push(&mut self, ns: u64) {
        self.ops += 1;
        if !self.ops.is_multiple_of(self.stride) {
            return;
        }
        self.v.push(ns);
        if self.v.len() >= MAX_SAMPLES {
            let mut i = 0;
            self.v.retain(|_| {
                i += 1;
                i % 2 == 0
            });
            self.stride *= 2;
        }
    }

    fn merge(&mut self, other: Self) {
        self.ops += other.ops;
        self.v.extend(other.v);
    }
}

#[derive(Debug, Default)]
struct ClientResult {
    gets: Samples,
    puts: Samples,
    reads: ReadStats,
    bad: u64,
    missing: u64,
    errors: u64,
}

enum Pending {
    Get(Instant, PendingCall<Arc<rdmx::Endpoint>, Option<Vec<u8>>>),
    Put(Instant, PendingCall<Arc<rdmx::Endpoint>, ()>),
}

/// Latency samples kept per client and operation type at most (see `Samples`).
const MAX_SAMPLES: usize = 1 << 18;

fn check_get(r: &mut ClientResult, v: Option<Vec<u8>>, k: u64) {
    match v {
        Some(v) => match check_value(&v) {
            Some((i, _)) if i == k => {}
            _ => r.bad += 1,
        },
        None => r.missing += 1,
    }
}

fn finish(r: &mut ClientResult, p: Pending) {
    match p {
        Pending::Get(t0, c) => {
            // (The key is inside the value: it is checked against itself.)
            match c.wait() {
                Ok(Some(v)) => {
                    if check_value(&v).is_none() {
                        r.bad += 1;
                    }
                }
                Ok(None) => r.missing += 1,
                Err(_) => r.errors += 1,
            }
            r.gets.push(t0.elapsed().as_nanos() as u64);
        }
        Pending::Put(t0, c) => {
            if c.wait().is_err() {
                r.errors += 1;
            }
            r.puts.push(t0.elapsed().as_nanos() as u64);
        }
    }
}

fn run_client(
    clients: &[&KvClient],
    o: &BenchOptions,
    seed: u64,
    stop: &AtomicBool,
    done: &AtomicU64,
) -> ClientResult {
    let mut r = ClientResult::default();
    let Some(first) = clients.first() else {
        return r;
    };
    let keys = KeyGen::new(o.keys, o.dist);
    let mut rng = Rng::new(seed);
    let mut version = seed << 32;
    let depth = o.depth.max(1);
    let mut wave = Vec::with_capacity(depth * clients.len());
    let mut keys_read = Vec::with_capacity(depth * clients.len());
    let timeout = Duration::from_secs(10);
    // Rounds of `depth` operations on each connection, as `redis-benchmark -P` pipelines:
    // the wave's RPC operations leave in one send batch (the connections share a context,
    // so one batch holds them all), then the wave waits for all their answers.
    while !stop.load(Ordering::Relaxed) {
        let batch = first.rpc().batch();
        // One-sided reads: the wave's are posted together (a read of each key's home slot),
        // then finished one after another.
        keys_read.clear();
        for c in clients {
            for _ in 0..depth {
                let k = keys.next(&mut rng);
                let read = rng.unit() < o.mix.read_fraction();
                if read && o.one_sided {
                    keys_read.push((*c, k, key(k)));
                    continue;
                }
                let t0 = Instant::now();
                let p = if read {
                    c.rpc()
                        .start(methods::GET, &key(k), timeout)
                        .map(|p| Pending::Get(t0, p))
                } else {
                    version += 1;
                    c.rpc()
                        .start(
                            methods::PUT,
                            &(key(k), value(k, version, o.value_size)),
                            timeout,
                        )
                        .map(|p| Pending::Put(t0, p))
                };
                match p {
                    Ok(p) => wave.push(p),
                    Err(_) => r.errors += 1,
                }
            }
        }
        drop(batch);
        let t0 = Instant::now();
        let started: Vec<_> = keys_read
            .iter()
            .map(|(c, k, kb)| (*k, c.start_get_one_sided(kb)))
            .collect();
        for (k, g) in started {
            match g.and_then(|g| g.finish(&mut r.reads)) {
                Ok(v) => check_get(&mut r, v, k),
                Err(_) => r.errors += 1,
            }
            r.gets.push(t0.elapsed().as_nanos() as u64);
        }
        for p in wave.drain(..) {
            finish(&mut r, p);
        }
        done.fetch_add((depth * clients.len()) as u64, Ordering::Relaxed);
    }
    r
}

fn stats(s: Samples, secs: f64) -> OpStats {
    let Samples { ops, mut v, .. } = s;
    if v.is_empty() {
        return OpStats::default();
    }
    v.sort_unstable();
    let pct = |p: f64| {
        let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
        v[rank.clamp(1, v.len()) - 1] as f64 / 1000.0
    };
    OpStats {
        ops,
        ops_per_s: ops as f64 / secs,
        p50_us: pct(50.0),
        p99_us: pct(99.0),
        p999_us: pct(99.9),
    }
}

/// Loads keys `0..n` (values of version 0) through `c`.
///
/// # Errors
/// The first failed PUT's.
pub fn load(c: &KvClient, n: u64, value_size: usize) -> Result<(), KvError> {
    let mut ring = std::collections::VecDeque::new();
    for k in 0..n {
        ring.push_back(c.rpc().start(
            methods::PUT,
            &(key(k), value(k, 0, value_size)),
            Duration::from_secs(10),
        )?);
        if ring.len() >= 64
            && let Some(p) = ring.pop_front()
        {
            p.wait()?;
        }
    }
    for p in ring {
        p.wait()?;
    }
    Ok(())
}

/// Runs the bench against the server at `addr` (keys loaded first), printing a live line
/// on stderr once a second when `progress`.
///
/// # Errors
/// Connecting or loading failed.
pub fn run(addr: SocketAddr, o: &BenchOptions, progress: bool) -> Result<BenchReport, KvError> {
    let loader = KvClient::connect(addr)?;
    load(&loader, o.keys, o.value_size)?;
    drop(loader);
    // The clients share one context (one device and progress thread for the process).
    let ctx = rdmx::Context::builder().build()?;
    let clients: Vec<KvClient> = (0..o.clients.max(1))
        .map(|_| KvClient::connect_on(&ctx, addr))
        .collect::<Result<_, _>>()?;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let threads = match o.threads {
        0 => clients.len(),
        t => t.min(clients.len()),
    };
    // Connections dealt to threads round-robin.
    let mut groups: Vec<Vec<&KvClient>> = vec![Vec::new(); threads];
    for (i, c) in clients.iter().enumerate() {
        groups[i % threads].push(c);
    }
    let results: Vec<ClientResult> = std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let (stop, done) = (&*stop, &*done);
                s.spawn(move || run_client(g, o, 0x9e37 + i as u64 * 7919, stop, done))
            })
            .collect();
        let end = start + Duration::from_secs_f64(o.secs);
        let mut last = 0;
        while Instant::now() < end {
            std::thread::sleep(Duration::from_millis(100).min(end - Instant::now().min(end)));
            let t = start.elapsed().as_secs_f64();
            if progress && (t as u64) > last {
                last = t as u64;
                let n = done.load(Ordering::Relaxed);
                eprint!("\r{t:.0} s: {n} ops ({:.0} ops/s)   ", n as f64 / t);
            }
        }
        stop.store(true, Ordering::Relaxed);
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let secs = start.elapsed().as_secs_f64();
    if progress {
        eprintln!();
    }
    let mut all = ClientResult::default();
    for r in results {
        all.gets.merge(r.gets);
        all.puts.merge(r.puts);
        all.reads.retries += r.reads.retries;
        all.reads.fallbacks += r.reads.fallbacks;
        all.bad += r.bad;
        all.missing += r.missing;
        all.errors += r.errors;
    }
    let get_stats = stats(all.gets, secs);
    let put_stats = stats(all.puts, secs);
    Ok(BenchReport {
        workload: o.mix.name(),
        dist: match o.dist {
            Dist::Uniform => "uniform".into(),
            Dist::Zipf(t) => format!("zipf {t}"),
        },
        value_size: o.value_size,
        clients: o.clients,
        threads,
        depth: o.depth,
        get: if o.one_sided { "one-sided" } else { "rpc" },
        secs,
        ops_per_s: get_stats.ops_per_s + put_stats.ops_per_s,
        get_stats,
        put_stats,
        read_retries: all.reads.retries,
        read_fallbacks: all.reads.fallbacks,
        bad_values: all.bad,
        missing: all.missing,
        errors: all.errors,
    })
}

impl BenchReport {
    /// The human table.
    pub fn table(&self) -> String {
        let row = |name: &str, s: &OpStats| {
            format!(
                "{name:<5} {:>10} {:>12.0} {:>9.1} {:>9.1} {:>9.1}\n",
                s.ops, s.ops_per_s, s.p50_us, s.p99_us, s.p999_us
            )
        };
        format!(
            "workload {} ({}), {} B values, {} client(s) on {} thread(s), depth {}, GET {}: {:.0} ops/s in {:.1} s\n\
             op          ops        ops/s   p50[us]   p99[us] p99.9[us]\n{}{}\
             one-sided re-reads {}, fallbacks {}; bad values {}, missing {}, errors {}\n",
            self.workload,
            self.dist,
            self.value_size,
            self.clients,
            self.threads,
            self.depth,
            self.get,
            self.ops_per_s,
            self.secs,
            row("GET", &self.get_stats),
            row("PUT", &self.put_stats),
            self.read_retries,
            self.read_fallbacks,
            self.bad_values,
            self.missing,
            self.errors
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_count_every_operation_and_stay_bounded() {
        let mut s = Samples::default();
        let n = (MAX_SAMPLES as u64) * 5 + 17;
        for i in 0..n {
            s.push(i);
        }
        assert_eq!(s.ops, n);
        assert!(
            s.v.len() < MAX_SAMPLES && s.v.len() > MAX_SAMPLES / 4,
            "{}",
            s.v.len()
        );
        // A uniform sample: its median is near the middle of the run.
        let st = stats(s, 1.0);
        assert_eq!(st.ops, n);
        let mid = n as f64 / 2.0 / 1000.0;
        assert!(
            (st.p50_us - mid).abs() < mid * 0.05,
            "{} vs {mid}",
            st.p50_us
        );
    }
}
