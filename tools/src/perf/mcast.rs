//! `rdmx perf --layer mcast --local`: one publisher and `--subs` subscribers of a reliable
//! multicast group (`Context::join`), each subscriber a process of its own (this program,
//! started with `--mcast-sub GROUP`), all on this host's soft device.
//!
//! * `--test rate`: the publisher publishes `--iters` messages as fast as the group takes
//!   them (in send batches of `--batch`, which pack small messages into shared datagrams); each subscriber reports the messages per second it took, from its first message
//!   to its last. One send reaches every subscriber: with the subscribers' share of the
//!   CPU, the per-subscriber rate with N subscribers against one is the fan-out.
//! * `--test lat`: the publisher publishes `--iters` messages at `--mcast-rate` per second;
//!   each subscriber reports publish-to-deliver latency (p50/p99/p99.9/max; the clocks of
//!   processes on one host agree).
//!
//! `--sub-faults SPEC` injects faults (the `RDMX_FAULTS` syntax, without a seed) into the
//! frames each subscriber's device receives, e.g. `drop=5%`: loss at the members.
//!
//! Each message carries its publish time (ns since the Unix epoch) in its first 8 bytes; a
//! message with the time `u64::MAX` ends the run. Each subscriber prints one JSON line
//! ([`SubResult`]) and exits.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdmx::{Context, Group, McastConfig, McastEvent};
use serde::{Deserialize, Serialize};

use super::report::{LatStats, Progress};
use super::{PerfArgs, TestArg};
use crate::error::{Error, Result, ResultExt};

/// Marks the last message.
const END: u64 = u64::MAX;
/// Longest wait for the subscribers to be heard, and for the group to drain.
const SETTLE: Duration = Duration::from_secs(20);
/// Most latency samples a subscriber keeps (beyond them it keeps every k-th).
const MAX_SAMPLES: usize = 1 << 21;

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// What a subscriber reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SubResult {
    member: u32,
    got: u64,
    /// Messages whose bytes were not the publisher's (never expected).
    corrupt: u64,
    /// Messages out of order (publish times going back: never expected).
    disorder: u64,
    first_ns: u64,
    last_ns: u64,
    /// Publish-to-deliver latencies sampled (ns).
    samples: Vec<u64>,
    naks_sent: u64,
    naks_suppressed: u64,
    duplicates: u64,
    lost: u64,
    removed: bool,
}

/// What `rdmx perf --layer mcast` prints (one JSON object with `--json`).
#[derive(Debug, Serialize)]
struct McastReport {
    test: &'static str,
    layer: &'static str,
    subs: usize,
    /// Messages per send batch (0: none).
    batch: u64,
    /// Faults injected at the subscribers (`--sub-faults`).
    sub_faults: Option<String>,
    size: usize,
    published: u64,
    reliable: bool,
    /// The rate asked for (lat).
    target_rate: Option<f64>,
    /// The publisher's rate: messages over the time until every subscriber had them.
    pub_msgs_per_s: f64,
    /// Each subscriber's messages per second (first to last message).
    sub_msgs_per_s: Vec<f64>,
    /// The slowest subscriber's rate.
    min_sub_msgs_per_s: f64,
    lat_p50_us: Option<f64>,
    lat_p99_us: Option<f64>,
    lat_p999_us: Option<f64>,
    lat_max_us: Option<f64>,
    /// Per subscriber: messages missing at the end (0 in reliable mode).
    missing: Vec<u64>,
    repairs_sent: u64,
    /// Repair requests the publisher ignored (within the holdoff, or no longer kept).
    naks_ignored: u64,
    naks_sent: u64,
    naks_suppressed: u64,
    duplicates: u64,
    members_removed: u64,
    corrupt: u64,
    disorder: u64,
}

fn config(args: &PerfArgs) -> McastConfig {
    let d = McastConfig::default();
    McastConfig {
        reliable: !args.unreliable,
        window: args.mcast_window.unwrap_or(d.window),
        nak_delay: args
            .mcast_nak_delay_us
            .map_or(d.nak_delay, Duration::from_micros),
        repair_holdoff: args
            .mcast_nak_delay_us
            .map_or(d.repair_holdoff, Duration::from_micros),
        ..d
    }
}

fn context(device: Option<&str>) -> Result<Context> {
    let mut b = Context::builder();
    if let Some(d) = device {
        b = b.device(d.to_string());
    }
    b.build().ctx("opening the context")
}

/// The subscriber's side (`--mcast-sub GROUP`).
pub(crate) fn subscriber(args: &PerfArgs, group: &str) -> Result<()> {
    let ctx = context(args.device.as_deref())?;
    let g = ctx
        .join_with(group, config(args))
        .ctx("joining the group")?;
    println!("READY {}", g.member_id());
    let mut r = SubResult {
        member: g.member_id(),
        got: 0,
        corrupt: 0,
        disorder: 0,
        first_ns: 0,
        last_ns: 0,
        samples: Vec::new(),
        naks_sent: 0,
        naks_suppressed: 0,
        duplicates: 0,
        lost: 0,
        removed: false,
    };
    let mut prev = 0u64;
    let mut every = 1u64;
    let deadline = Instant::now() + Duration::from_secs(args.mcast_secs_limit);
    // (Events and the deadline are looked at when nothing comes, and every 4,096
    // messages: each look takes the worker's lock or reads the clock.)
    let mut quiet = true;
    loop {
        if quiet || r.got.is_multiple_of(4096) {
            if Instant::now() > deadline {
                eprintln!("rdmx perf: subscriber {}: no end of the run", r.member);
                break;
            }
            while let Some(e) = g.poll_event() {
                if matches!(e, McastEvent::RemovedBy { .. }) {
                    r.removed = true;
                }
            }
            if r.removed {
                break;
            }
        }
        let m = match g.recv_timeout(Duration::from_millis(100)) {
            Ok((_, m)) => {
                quiet = false;
                m
            }
            Err(rdmx::Error::Timeout(_)) => {
                quiet = true;
                continue;
            }
            Err(e) => return Err(Error::msg(format!("receiving: {e}"))),
        };
        let now = unix_ns();
        let Some(stamp) = m.get(..8).and_then(|b| b.try_into().ok()) else {
            r.corrupt += 1;
            continue;
        };
        let stamp = u64::from_le_bytes(stamp);
        if stamp == END {
            break;
        }
        if m[8..].iter().any(|&b| b != 0xA5) {
            r.corrupt += 1;
        }
        if stamp < prev {
            r.disorder += 1;
        }
        prev = stamp;
        if r.got == 0 {
            r.first_ns = now;
        }
        r.last_ns = now;
        r.got += 1;
        if r.got.is_multiple_of(every) {
            r.samples.push(now.saturating_sub(stamp));
            if r.samples.len() >= MAX_SAMPLES {
                // Keep every other sample, and take half as many from now on.
                let kept: Vec<u64> = r.samples.iter().step_by(2).copied().collect();
                r.samples = kept;
                every *= 2;
            }
        }
    }
    let s = g.stats();
    r.naks_sent = s.naks_sent;
    r.naks_suppressed = s.naks_suppressed;
    r.duplicates = s.duplicates;
    r.lost = s.lost;
    println!(
        "RESULT {}",
        serde_json::to_string(&r).ctx("encoding the result")?
    );
    Ok(())
}

/// A message of `size` bytes stamped `t`.
fn stamped(buf: &mut [u8], t: u64) {
    buf[..8].copy_from_slice(&t.to_le_bytes());
}

/// Starts the subscribers and waits for their `READY`.
fn spawn_subs(
    args: &PerfArgs,
    group: &str,
    n: usize,
) -> Result<Vec<(Child, BufReader<std::process::ChildStdout>)>> {
    let exe = std::env::current_exe().ctx("finding this program")?;
    let mut subs = Vec::new();
    for _ in 0..n {
        let mut c = Command::new(&exe);
        c.args(["perf", "--layer", "mcast", "--local", "--mcast-sub", group])
            .args(["--mcast-secs-limit", &args.mcast_secs_limit.to_string()]);
        if let Some(d) = &args.device {
            c.args(["--device", d]);
        }
        if args.unreliable {
            c.arg("--unreliable");
        }
        if let Some(w) = args.mcast_window {
            c.args(["--mcast-window", &w.to_string()]);
        }
        if let Some(d) = args.mcast_nak_delay_us {
            c.args(["--mcast-nak-delay-us", &d.to_string()]);
        }
        if let Some(f) = &args.sub_faults {
            // (Each subscriber's own draw of the same odds.)
            c.env("RDMX_FAULTS", format!("{f},seed={}", subs.len() + 1));
        }
        let mut child = c
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .ctx("starting a subscriber")?;
        let out = child
            .stdout
            .take()
            .ok_or_else(|| Error::msg("a subscriber without stdout"))?;
        let mut out = BufReader::new(out);
        let mut line = String::new();
        out.read_line(&mut line).ctx("reading a subscriber")?;
        if !line.starts_with("READY") {
            let _ = child.kill();
            return Err(Error::msg(format!("a subscriber did not start: {line:?}")));
        }
        subs.push((child, out));
    }
    Ok(subs)
}

/// Publishes `count` messages (at `rate` per second when given), then the end mark.
fn publish(g: &Group, size: usize, count: u64, rate: Option<f64>, batch: u64) -> Result<Duration> {
    let mut buf = vec![0xA5u8; size];
    let mut progress = Progress::new("mcast".into(), count);
    let start = Instant::now();
    let mut open = None;
    for i in 0..count {
        if batch > 1 && i % batch == 0 {
            // The batch before leaves as this one opens.
            drop(open.take());
            open = Some(g.batch());
        }
        if let Some(r) = rate {
            let due = start + Duration::from_secs_f64(i as f64 / r);
            // Yield the last stretch (a sleep would bunch the messages; a spin would take
            // a core from the subscribers on a small machine).
            while Instant::now() < due {
                if due - Instant::now() > Duration::from_micros(200) {
                    std::thread::sleep(Duration::from_micros(100));
                } else {
                    std::thread::yield_now();
                }
            }
        }
        stamped(&mut buf, unix_ns());
        g.publish_timeout(&buf, SETTLE)
            .with_ctx(|| format!("publishing message {i}"))?;
        progress.update(i);
    }
    drop(open);
    g.flush_timeout(SETTLE)
        .ctx("waiting for the subscribers to take everything")?;
    let took = start.elapsed();
    progress.finish();
    stamped(&mut buf, END);
    g.publish_timeout(&buf, SETTLE).ctx("publishing the end")?;
    g.flush_timeout(SETTLE)
        .ctx("waiting for the end to arrive")?;
    Ok(took)
}

/// Runs the test.
pub(crate) fn run(args: &PerfArgs) -> Result<()> {
    if let Some(group) = &args.mcast_sub {
        return subscriber(args, group);
    }
    if !args.local {
        return Err(Error::msg(
            "--layer mcast runs its publisher and subscribers on this host: give --local",
        ));
    }
    let lat = match args.test {
        Some(TestArg::Rate) | None => false,
        Some(TestArg::Lat) => true,
        Some(t) => {
            return Err(Error::msg(format!(
                "--layer mcast has the tests rate and lat, not {}",
                t.name()
            )));
        }
    };
    let size = args.size.first().copied().unwrap_or(8) as usize;
    if !(8..=(1 << 20)).contains(&size) {
        return Err(Error::msg(format!(
            "--size {size}: --layer mcast messages are 8 B (their publish time) to 1 MiB"
        )));
    }
    let count = args.iters.unwrap_or(if lat { 20_000 } else { 1_000_000 });
    let rate = lat.then_some(args.mcast_rate);
    let n = args.subs.max(1);
    let group = format!("rdmx-perf-{}-{}", std::process::id(), unix_ns() % 1_000_000);
    let ctx = context(args.device.as_deref())?;
    let g = ctx
        .join_with(&group, config(args))
        .ctx("joining the group")?;
    let mut subs = spawn_subs(args, &group, n)?;
    let heard = Instant::now() + SETTLE;
    while g.receivers() < n {
        if Instant::now() > heard {
            for (c, _) in &mut subs {
                let _ = c.kill();
            }
            return Err(Error::msg(format!(
                "only {} of {n} subscribers were heard",
                g.receivers()
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let batch = if lat { 0 } else { u64::from(args.batch) };
    let took = publish(&g, size, count, rate, batch);
    let mut results = Vec::new();
    for (mut c, mut out) in subs {
        let mut line = String::new();
        let mut got = None;
        while out.read_line(&mut line).unwrap_or(0) > 0 {
            if let Some(j) = line.strip_prefix("RESULT ") {
                got = serde_json::from_str::<SubResult>(j.trim()).ok();
            }
            line.clear();
        }
        let _ = c.wait();
        results.push(got.ok_or_else(|| Error::msg("a subscriber gave no result"))?);
    }
    let took = took?;
    let mut removed = 0;
    while let Some(e) = g.poll_event() {
        if matches!(e, McastEvent::MemberRemoved { .. }) {
            removed += 1;
        }
    }
    let report = McastReport::new(
        &results,
        &g,
        size,
        count,
        rate,
        took,
        removed,
        !args.unreliable,
        lat,
    );
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report).ctx("encoding the report")?
        );
    } else {
        report.print();
    }
    Ok(())
}

impl McastReport {
    #[expect(
        clippy::too_many_arguments,
        reason = "one report from one run's figures"
    )]
    fn new(
        subs: &[SubResult],
        g: &Group,
        size: usize,
        published: u64,
        target_rate: Option<f64>,
        took: Duration,
        members_removed: u64,
        reliable: bool,
        lat: bool,
    ) -> Self {
        let rate = |s: &SubResult| {
            let ns = s.last_ns.saturating_sub(s.first_ns).max(1);
            s.got.saturating_sub(1) as f64 * 1e9 / ns as f64
        };
        let sub_msgs_per_s: Vec<f64> = subs.iter().map(rate).collect();
        let all: Vec<u64> = subs
            .iter()
            .flat_map(|s| s.samples.iter().copied())
            .collect();
        let l = LatStats::from_ns(&all, 1.0);
        let st = g.stats();
        Self {
            test: if lat { "lat" } else { "rate" },
            layer: "mcast",
            subs: subs.len(),
            batch: 0,
            sub_faults: None,
            size,
            published,
            reliable,
            target_rate,
            pub_msgs_per_s: published as f64 / took.as_secs_f64().max(1e-9),
            min_sub_msgs_per_s: sub_msgs_per_s.iter().copied().fold(f64::INFINITY, f64::min),
            sub_msgs_per_s,
            lat_p50_us: l.map(|l| l.p50),
            lat_p99_us: l.map(|l| l.p99),
            lat_p999_us: l.map(|l| l.p999),
            lat_max_us: l.map(|l| l.max),
            missing: subs
                .iter()
                .map(|s| published.saturating_sub(s.got))
                .collect(),
            repairs_sent: st.repairs_sent,
            naks_ignored: st.naks_ignored,
            naks_sent: subs.iter().map(|s| s.naks_sent).sum(),
            naks_suppressed: subs.iter().map(|s| s.naks_suppressed).sum(),
            duplicates: subs.iter().map(|s| s.duplicates).sum(),
            members_removed,
            corrupt: subs.iter().map(|s| s.corrupt).sum(),
            disorder: subs.iter().map(|s| s.disorder).sum(),
        }
    }

    fn print(&self) {
        println!(
            "mcast/{} {} B, {} subscriber(s), {} messages, {}",
            self.test,
            self.size,
            self.subs,
            self.published,
            if self.reliable {
                "reliable"
            } else {
                "unreliable"
            }
        );
        println!("  publisher        {:>12.0} msg/s", self.pub_msgs_per_s);
        for (i, r) in self.sub_msgs_per_s.iter().enumerate() {
            println!(
                "  subscriber {i:<3}   {r:>12.0} msg/s   missing {}",
                self.missing[i]
            );
        }
        if let (Some(p50), Some(p99), Some(p999), Some(max)) = (
            self.lat_p50_us,
            self.lat_p99_us,
            self.lat_p999_us,
            self.lat_max_us,
        ) {
            println!(
                "  publish->deliver p50 {p50:.1} us  p99 {p99:.1} us  p99.9 {p999:.1} us  max {max:.1} us"
            );
        }
        println!(
            "  repairs: {} asked ({} suppressed), {} sent; {} duplicates; {} removed; {} corrupt; {} out of order",
            self.naks_sent,
            self.naks_suppressed,
            self.repairs_sent,
            self.duplicates,
            self.members_removed,
            self.corrupt,
            self.disorder
        );
    }
}
