//! Results: latency statistics, the human-readable table, JSON lines, and the progress
//! line on a terminal.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::TestKind;
use super::exchange::TestParams;
use super::lat::Measured;

/// Latency statistics in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LatStats {
    /// Median.
    pub(crate) p50: f64,
    /// 99th percentile.
    pub(crate) p99: f64,
    /// 99.9th percentile.
    pub(crate) p999: f64,
    /// Mean.
    pub(crate) avg: f64,
    /// Minimum.
    pub(crate) min: f64,
    /// Maximum.
    pub(crate) max: f64,
}

impl LatStats {
    /// Statistics of `samples` (nanoseconds), each divided by `div` (2 for one-way
    /// latencies from round trips). `None` for no samples.
    pub(crate) fn from_ns(samples: &[u64], div: f64) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_unstable();
        let us = |ns: u64| ns as f64 / 1000.0 / div;
        // Nearest-rank percentile.
        let pct = |p: f64| {
            let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
            us(s[rank.clamp(1, s.len()) - 1])
        };
        let sum: u128 = s.iter().map(|&v| u128::from(v)).sum();
        Some(Self {
            p50: pct(50.0),
            p99: pct(99.0),
            p999: pct(99.9),
            avg: sum as f64 / s.len() as f64 / 1000.0 / div,
            min: us(s[0]),
            max: us(s[s.len() - 1]),
        })
    }
}

/// One result line.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PerfResult {
    /// Test name.
    pub(crate) test: &'static str,
    /// Transport ("rc" or "ud").
    pub(crate) transport: &'static str,
    /// The client's device, as opened.
    pub(crate) device: String,
    /// Completion polling mode.
    pub(crate) busy_poll: bool,
    /// Message size in bytes.
    pub(crate) size: u64,
    /// Measured iterations.
    pub(crate) iters: u64,
    /// Warm-up iterations (not measured).
    pub(crate) warmup: u64,
    /// Outstanding work requests (bandwidth tests).
    pub(crate) tx_depth: Option<u32>,
    /// Path MTU in bytes.
    pub(crate) mtu: u32,
    /// Median latency (us); one-way for send_lat / write_lat, round trip otherwise.
    pub(crate) lat_p50_us: Option<f64>,
    /// 99th percentile latency (us).
    pub(crate) lat_p99_us: Option<f64>,
    /// 99.9th percentile latency (us).
    pub(crate) lat_p999_us: Option<f64>,
    /// Mean latency (us).
    pub(crate) lat_avg_us: Option<f64>,
    /// Minimum latency (us).
    pub(crate) lat_min_us: Option<f64>,
    /// Maximum latency (us).
    pub(crate) lat_max_us: Option<f64>,
    /// The latency fields are full round trips (read_lat, atomic_lat).
    pub(crate) lat_is_rtt: bool,
    /// Payload bandwidth in MB/s (10^6 bytes).
    #[serde(rename = "bw_MBps")]
    pub(crate) bw_mbps: f64,
    /// Messages (operations) per second.
    pub(crate) msg_rate: f64,
    /// Wall time of the measured iterations, in seconds.
    pub(crate) elapsed_s: f64,
    /// write_lat: how each side learns of the peer's write ("last_byte" polling or
    /// "write_imm" completions).
    pub(crate) write_lat_sync: Option<&'static str>,
    /// UD send_bw: messages sent (warm-up included) that the server never received.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ud_dropped: Option<u64>,
    /// The layer measured: "msg" for the message-layer tests (absent for the verbs tests).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) layer: Option<&'static str>,
    /// Message layer: how the client's data messages were sent ("inline", "eager",
    /// "rendezvous", "packed" (small messages of send batches), or "mixed").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) msg_protocol: Option<&'static str>,
    /// Message layer: receive credits per endpoint (the messages a sender may have in flight).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) credits: Option<u32>,
    /// Message layer: the context's `credit_waits` counter over the round (warm-up
    /// included): sends that found no credit or a full send queue (counted per attempt).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) credit_waits: Option<u64>,
    /// Message layer: how long blocking calls poll before they sleep, in microseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) busy_poll_us: Option<u64>,
    /// Message layer: messages sent per send batch (absent: no batches).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) batch: Option<u32>,
    /// Message layer over UD: what the client's sessions counted over the round (warm-up
    /// included): datagrams sent again, duplicates dropped, datagrams refused (beyond the
    /// credit granted, or forged).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ud_retransmits: Option<u64>,
    /// See `ud_retransmits`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ud_duplicates: Option<u64>,
    /// See `ud_retransmits`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ud_refused: Option<u64>,
}

impl PerfResult {
    /// Builds the result of a round.
    pub(crate) fn new(p: &TestParams, m: &Measured, device: &str, busy: bool, mtu: u32) -> Self {
        let one_way = matches!(p.test, TestKind::SendLat | TestKind::WriteLat);
        let lat_is_rtt = matches!(p.test, TestKind::ReadLat | TestKind::AtomicLat);
        let stats = if p.test.is_lat() {
            LatStats::from_ns(&m.rtt_ns, if one_way { 2.0 } else { 1.0 })
        } else {
            None
        };
        let secs = m.elapsed.as_secs_f64().max(1e-9);
        Self {
            test: p.test.name(),
            transport: p.transport.name(),
            device: device.to_string(),
            busy_poll: busy,
            size: p.size,
            iters: p.iters,
            warmup: p.warmup,
            tx_depth: (!p.test.is_lat()).then_some(p.tx_depth),
            mtu,
            lat_p50_us: stats.map(|s| s.p50),
            lat_p99_us: stats.map(|s| s.p99),
            lat_p999_us: stats.map(|s| s.p999),
            lat_avg_us: stats.map(|s| s.avg),
            lat_min_us: stats.map(|s| s.min),
            lat_max_us: stats.map(|s| s.max),
            lat_is_rtt,
            bw_mbps: (p.size as f64) * (p.iters as f64) / secs / 1e6,
            msg_rate: p.iters as f64 / secs,
            elapsed_s: m.elapsed.as_secs_f64(),
            write_lat_sync: (p.test == TestKind::WriteLat).then_some(if p.mem_poll {
                "last_byte"
            } else {
                "write_imm"
            }),
            ud_dropped: None,
            layer: None,
            msg_protocol: None,
            credits: None,
            credit_waits: None,
            busy_poll_us: None,
            batch: None,
            ud_retransmits: None,
            ud_duplicates: None,
            ud_refused: None,
        }
    }

    /// UD send_bw: the rates count only what the server received during the measured time
    /// (`measured` messages), and `dropped` datagrams are reported.
    pub(crate) fn set_ud_counts(&mut self, measured: u64, dropped: u64) {
        let secs = self.elapsed_s.max(1e-9);
        self.msg_rate = measured as f64 / secs;
        self.bw_mbps = (self.size as f64) * (measured as f64) / secs / 1e6;
        self.ud_dropped = Some(dropped);
    }
}

/// Prints results as a table or JSON lines on stdout.
#[derive(Debug)]
pub(crate) struct Printer {
    json: bool,
    header: bool,
    dropped: bool,
}

impl Printer {
    /// A printer; `json` selects JSON lines, `dropped` a column of UD drops in the table.
    pub(crate) fn new(json: bool, dropped: bool) -> Self {
        Self {
            json,
            header: false,
            dropped,
        }
    }

    /// Prints one result (the table header before the first).
    pub(crate) fn print(&mut self, r: &PerfResult) {
        let mut out = std::io::stdout().lock();
        if self.json {
            match serde_json::to_string(r) {
                Ok(s) => {
                    let _ = writeln!(out, "{s}");
                }
                Err(e) => tracing::error!("cannot encode a result as JSON: {e}"),
            }
        } else {
            if !self.header {
                self.header = true;
                let _ = write!(
                    out,
                    "{:<11} {:>10} {:>10} {:>5} {:>9} {:>9} {:>9} {:>9} {:>11} {:>12}",
                    "test",
                    "bytes",
                    "iters",
                    "lat",
                    "p50[us]",
                    "p99[us]",
                    "avg[us]",
                    "min[us]",
                    "BW[MB/s]",
                    "rate[msg/s]"
                );
                let _ = if self.dropped {
                    writeln!(out, " {:>8}", "dropped")
                } else {
                    writeln!(out)
                };
            }
            let f = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"));
            let kind = match (r.lat_p50_us.is_some(), r.lat_is_rtt) {
                (false, _) => "-",
                (true, true) => "rtt",
                (true, false) => "1-way",
            };
            let name = match r.layer {
                Some(layer) => format!("{layer}/{}", r.test),
                None => r.test.to_string(),
            };
            let _ = write!(
                out,
                "{:<11} {:>10} {:>10} {:>5} {:>9} {:>9} {:>9} {:>9} {:>11.2} {:>12.0}",
                name,
                r.size,
                r.iters,
                kind,
                f(r.lat_p50_us),
                f(r.lat_p99_us),
                f(r.lat_avg_us),
                f(r.lat_min_us),
                r.bw_mbps,
                r.msg_rate
            );
            let _ = match (self.dropped, r.ud_dropped) {
                (false, _) => writeln!(out),
                (true, None) => writeln!(out, " {:>8}", "-"),
                (true, Some(d)) => writeln!(out, " {d:>8}"),
            };
        }
        let _ = out.flush();
    }
}

/// A `\r` percentage line on stderr, only on a terminal and only for runs longer than a
/// second, redrawn at most ten times a second.
#[derive(Debug)]
pub(crate) struct Progress {
    enabled: bool,
    label: String,
    total: u64,
    start: Instant,
    last_draw: Option<Instant>,
    calls: u32,
}

impl Progress {
    /// A progress line for `total` steps of `label`.
    pub(crate) fn new(label: String, total: u64) -> Self {
        Self {
            enabled: std::io::stderr().is_terminal(),
            label,
            total: total.max(1),
            start: Instant::now(),
            last_draw: None,
            calls: 0,
        }
    }

    /// Records that `done` steps are done.
    pub(crate) fn update(&mut self, done: u64) {
        if !self.enabled {
            return;
        }
        self.calls = self.calls.wrapping_add(1);
        if !self.calls.is_multiple_of(16) {
            return;
        }
        let now = Instant::now();
        if now - self.start < Duration::from_secs(1)
            || self
                .last_draw
                .is_some_and(|t| now - t < Duration::from_millis(100))
        {
            return;
        }
        self.last_draw = Some(now);
        let pct = 100.0 * done.min(self.total) as f64 / self.total as f64;
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{}: {pct:5.1}%", self.label);
        let _ = err.flush();
    }

    /// Erases the line if anything was drawn.
    pub(crate) fn finish(&mut self) {
        if self.last_draw.take().is_some() {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r{:width$}\r", "", width = self.label.len() + 10);
            let _ = err.flush();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let s: Vec<u64> = (1..=100).map(|v| v * 1000).collect();
        let st = LatStats::from_ns(&s, 1.0).unwrap();
        assert_eq!(st.p50, 50.0);
        assert_eq!(st.p99, 99.0);
        assert_eq!(st.p999, 100.0);
        assert_eq!(st.min, 1.0);
        assert_eq!(st.max, 100.0);
        assert!((st.avg - 50.5).abs() < 1e-9);
        let half = LatStats::from_ns(&s, 2.0).unwrap();
        assert_eq!(half.p50, 25.0);
        assert!(LatStats::from_ns(&[], 1.0).is_none());
        assert_eq!(LatStats::from_ns(&[7000], 1.0).unwrap().p99, 7.0);
    }
}
