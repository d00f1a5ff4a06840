//! `rdmx-pubsub`: topics on reliable multicast groups.
//!
//! ```sh
//! cargo run --release --example pubsub -- sub prices            # prints what is published
//! cargo run --release --example pubsub -- pub prices one two    # publishes "one", "two"
//! cargo run --release --example pubsub -- bench --subs 3 --size 16 --secs 5 [--rate MSGS_PER_S] [--json] [--unreliable]
//! ```
//!
//! `bench` runs a publisher and `--subs` subscribers as threads of this process, each with a
//! context of its own (a soft device on loopback), and prints, with a live line while it
//! runs, the messages each subscriber got per second, the publish-to-deliver latency
//! (p50/p99/p99.9), the repairs asked for and sent, the members removed and the messages
//! lost (0 in reliable mode). Without `--rate` the publisher publishes as fast as the group
//! takes (a throughput test: latency then includes the publisher's queue); with it, at that
//! rate (a latency test).

use std::error::Error as StdError;
use std::io::BufRead;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdmx::{Context, Group, McastConfig, McastEvent};

fn main() -> Result<(), Box<dyn StdError>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("sub") => sub(args.get(1).ok_or("sub TOPIC")?),
        Some("pub") => publish(args.get(1).ok_or("pub TOPIC [MESSAGE...]")?, &args[2..]),
        Some("bench") => {
            let o = BenchOptions::parse(&args[1..])?;
            let r = bench(&o)?;
            if o.json {
                println!("{}", r.json());
            } else {
                print!("{}", r.table());
            }
            Ok(())
        }
        _ => Err(
            "usage: pubsub sub TOPIC | pub TOPIC [MESSAGE...] | bench [--subs N] \
                  [--size BYTES] [--secs S] [--json] [--unreliable]"
                .into(),
        ),
    }
}

/// Prints every message of `topic`, and the group's events.
fn sub(topic: &str) -> Result<(), Box<dyn StdError>> {
    let ctx = Context::new()?;
    let g = ctx.join(topic)?;
    eprintln!("member {} of {topic}", g.member_id());
    loop {
        while let Some(e) = g.poll_event() {
            eprintln!("event: {e:?}");
        }
        match g.recv_timeout(Duration::from_millis(200)) {
            Ok((from, m)) => println!("{from}: {}", String::from_utf8_lossy(&m)),
            Err(rdmx::Error::Timeout(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Publishes `messages` (or stdin's lines) to `topic`, once the group has a member.
fn publish(topic: &str, messages: &[String]) -> Result<(), Box<dyn StdError>> {
    let ctx = Context::new()?;
    let g = ctx.join(topic)?;
    let deadline = Instant::now() + Duration::from_secs(2);
    while g.receivers() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let lines: Vec<String> = if messages.is_empty() {
        std::io::stdin().lock().lines().collect::<Result<_, _>>()?
    } else {
        messages.to_vec()
    };
    for l in &lines {
        g.publish_timeout(l.as_bytes(), Duration::from_secs(10))?;
    }
    // Until every member has taken everything.
    g.flush_timeout(Duration::from_secs(10))?;
    Ok(())
}

/// What `bench` runs.
#[derive(Debug, Clone)]
struct BenchOptions {
    subs: usize,
    size: usize,
    secs: f64,
    /// Messages per second to publish at (`None`: as fast as the group takes them).
    rate: Option<f64>,
    json: bool,
    reliable: bool,
}

impl BenchOptions {
    fn parse(args: &[String]) -> Result<Self, Box<dyn StdError>> {
        let mut o = Self {
            subs: 1,
            size: 8,
            secs: 3.0,
            rate: None,
            json: false,
            reliable: true,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
            match a.as_str() {
                "--subs" => o.subs = value()?.parse()?,
                "--size" => o.size = value()?.parse()?,
                "--secs" => o.secs = value()?.parse()?,
                "--rate" => o.rate = Some(value()?.parse()?),
                "--json" => o.json = true,
                "--unreliable" => o.reliable = false,
                other => return Err(format!("unknown option {other}").into()),
            }
        }
        if o.subs == 0 || o.size < 16 {
            return Err("--subs at least 1, --size at least 16 (sequence and timestamp)".into());
        }
        Ok(o)
    }
}

/// What `bench` measured.
#[derive(Debug, Default)]
struct BenchReport {
    subs: usize,
    size: usize,
    reliable: bool,
    published: u64,
    secs: f64,
    /// Messages per second each subscriber got.
    rates: Vec<f64>,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    naks_sent: u64,
    repairs_sent: u64,
    removed: u64,
    lost: u64,
}

impl BenchReport {
    fn json(&self) -> String {
        let rates: Vec<String> = self.rates.iter().map(|r| format!("{r:.0}")).collect();
        format!(
            "{{\"subs\":{},\"size\":{},\"reliable\":{},\"published\":{},\"secs\":{:.3},\
             \"rate_per_sub\":[{}],\"lat_p50_us\":{:.1},\"lat_p99_us\":{:.1},\
             \"lat_p999_us\":{:.1},\"naks_sent\":{},\"repairs_sent\":{},\"removed\":{},\
             \"lost\":{}}}",
            self.subs,
            self.size,
            self.reliable,
            self.published,
            self.secs,
            rates.join(","),
            self.p50_us,
            self.p99_us,
            self.p999_us,
            self.naks_sent,
            self.repairs_sent,
            self.removed,
            self.lost
        )
    }

    fn table(&self) -> String {
        let rates: Vec<String> = self.rates.iter().map(|r| format!("{r:.0}")).collect();
        format!(
            "{} subscriber(s), {} B, {}: {} published in {:.2} s\n\
             delivered msg/s per subscriber: {}\n\
             publish->deliver latency: p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us\n\
             repairs asked {}, sent {}; members removed {}; messages lost {}\n",
            self.subs,
            self.size,
            if self.reliable {
                "reliable"
            } else {
                "unreliable"
            },
            self.published,
            self.secs,
            rates.join(", "),
            self.p50_us,
            self.p99_us,
            self.p999_us,
            self.naks_sent,
            self.repairs_sent,
            self.removed,
            self.lost
        )
    }
}

/// A publisher and `o.subs` subscribers, each with its own context, for `o.secs` seconds.
fn bench(o: &BenchOptions) -> Result<BenchReport, Box<dyn StdError>> {
    let topic = format!("rdmx-pubsub-bench-{}-{}", std::process::id(), o.subs);
    let options = McastConfig {
        reliable: o.reliable,
        ..McastConfig::default()
    };
    let pub_ctx = Context::new()?;
    let publisher = pub_ctx.join_with(&topic, options.clone())?;
    let mut subs: Vec<(Context, Group)> = Vec::new();
    for _ in 0..o.subs {
        let c = Context::new()?;
        let g = c.join_with(&topic, options.clone())?;
        subs.push((c, g));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while publisher.receivers() < o.subs {
        if Instant::now() > deadline {
            return Err("the subscribers never joined".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let base = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let got: Vec<Arc<AtomicU64>> = (0..o.subs).map(|_| Arc::new(AtomicU64::new(0))).collect();
    // Subscribers: count, check order, time each message.
    let mut readers = Vec::new();
    for ((_, g), n) in subs.iter().zip(&got) {
        let (g, n, stop) = (g.clone(), n.clone(), stop.clone());
        readers.push(std::thread::spawn(move || {
            let mut lat = Vec::with_capacity(1 << 20);
            let mut next = 0u64;
            let mut lost = 0u64;
            loop {
                match g.recv_timeout(Duration::from_millis(50)) {
                    Ok((_, m)) => {
                        let seq = u64::from_le_bytes(m[..8].try_into().unwrap_or_default());
                        let sent = u64::from_le_bytes(m[8..16].try_into().unwrap_or_default());
                        lost += seq.saturating_sub(next);
                        next = seq + 1;
                        let now = base.elapsed().as_nanos() as u64;
                        if lat.len() < 4 << 20 {
                            lat.push(now.saturating_sub(sent));
                        }
                        n.store(next, Ordering::Relaxed);
                    }
                    Err(_) if stop.load(Ordering::Acquire) => break,
                    Err(_) => {}
                }
            }
            (lat, lost, g.stats().naks_sent)
        }));
    }
    // The publisher, with a live line once a second.
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(o.secs);
    let mut msg = vec![0u8; o.size];
    let mut published = 0u64;
    let mut last_line = t0;
    while Instant::now() < end {
        if let Some(rate) = o.rate {
            // Paced: the next message is due at published / rate.
            let due = t0 + Duration::from_secs_f64(published as f64 / rate);
            while Instant::now() < due {
                std::hint::spin_loop();
            }
        }
        msg[..8].copy_from_slice(&published.to_le_bytes());
        msg[8..16].copy_from_slice(&(base.elapsed().as_nanos() as u64).to_le_bytes());
        match publisher.try_publish(&msg) {
            Ok(()) => published += 1,
            Err(rdmx::Error::WouldBlock) => std::thread::yield_now(),
            Err(e) => return Err(e.into()),
        }
        if last_line.elapsed() >= Duration::from_secs(1) {
            last_line = Instant::now();
            let min = got
                .iter()
                .map(|n| n.load(Ordering::Relaxed))
                .min()
                .unwrap_or(0);
            eprint!(
                "\r{:.0} s: published {published}, slowest subscriber {min} ({:.0} msg/s)   ",
                t0.elapsed().as_secs_f64(),
                min as f64 / t0.elapsed().as_secs_f64()
            );
        }
    }
    // Let the last messages arrive, then stop the readers.
    let drain = Instant::now() + Duration::from_secs(5);
    while got.iter().any(|n| n.load(Ordering::Relaxed) < published) && Instant::now() < drain {
        std::thread::sleep(Duration::from_millis(5));
    }
    let secs = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Release);
    eprintln!();
    let mut r = BenchReport {
        subs: o.subs,
        size: o.size,
        reliable: o.reliable,
        published,
        secs,
        ..BenchReport::default()
    };
    let mut all = Vec::new();
    for (h, n) in readers.into_iter().zip(&got) {
        let (lat, lost, naks) = h.join().map_err(|_| "a subscriber panicked")?;
        r.rates.push(n.load(Ordering::Relaxed) as f64 / secs);
        r.lost += lost;
        r.naks_sent += naks;
        all.extend(lat);
    }
    all.sort_unstable();
    let q = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .map_or(0.0, |&ns| ns as f64 / 1e3)
    };
    (r.p50_us, r.p99_us, r.p999_us) = (q(0.5), q(0.99), q(0.999));
    r.repairs_sent = publisher.stats().repairs_sent;
    r.removed = std::iter::from_fn(|| publisher.poll_event())
        .filter(|e| matches!(e, McastEvent::MemberRemoved { .. }))
        .count() as u64;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs() {
        let o = BenchOptions {
            subs: 2,
            size: 64,
            secs: 0.3,
            rate: None,
            json: true,
            reliable: true,
        };
        let r = bench(&o).unwrap();
        assert!(r.published > 0, "{r:?}");
        assert_eq!(r.lost, 0, "{r:?}");
        assert_eq!(r.removed, 0, "{r:?}");
        assert!(r.json().contains("\"rate_per_sub\""));
    }
}
