//! A latency histogram.

use super::*;

/// Sub-buckets per power of two: a latency is kept within 1/64 (1.6 %), exactly below 128 ns.
pub(crate) const SUB_BITS: u32 = 6;
/// Buckets up to `u64::MAX` ns.
pub(crate) const BUCKETS: usize = 3776;

/// Publish-to-deliver latencies, in log-linear buckets (what a child sends its parent instead
/// of every sample).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Histogram {
    pub(crate) counts: Vec<u64>,
}

impl Histogram {
    pub(crate) fn bucket(ns: u64) -> usize {
        let sub = 1u64 << SUB_BITS;
        if ns < 2 * sub {
            return ns as usize;
        }
        let shift = 63 - ns.leading_zeros() - SUB_BITS;
        ((u64::from(shift) + 1) * sub + (ns >> shift) - sub) as usize
    }

    /// The middle of bucket `i`, in ns.
    pub(crate) fn value(i: usize) -> f64 {
        let sub = 1usize << SUB_BITS;
        if i < 2 * sub {
            return i as f64;
        }
        let shift = (i / sub - 1) as u32;
        let low = ((i % sub + sub) as u64) << shift;
        low as f64 + ((1u64 << shift) - 1) as f64 / 2.0
    }

    pub(crate) fn record(&mut self, ns: u64) {
        let i = Self::bucket(ns);
        if i >= self.counts.len() {
            self.counts.resize(i + 1, 0);
        }
        self.counts[i] += 1;
    }

    pub(crate) fn merge(&mut self, other: &Self) {
        if other.counts.len() > self.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
    }

    /// The `q` quantile in microseconds (0 without samples).
    pub(crate) fn quantile_us(&self, q: f64) -> f64 {
        let total: u64 = self.counts.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let rank = ((total as f64 * q).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::value(i) / 1e3;
            }
        }
        0.0
    }

    /// `bucket:count,...` (buckets that have samples).
    pub(crate) fn encode(&self) -> String {
        let parts: Vec<String> = self
            .counts
            .iter()
            .enumerate()
            .filter(|&(_, &c)| c > 0)
            .map(|(i, c)| format!("{i}:{c}"))
            .collect();
        parts.join(",")
    }

    pub(crate) fn decode(s: &str) -> Result<Self, String> {
        let mut h = Self::default();
        for part in s.split(',').filter(|p| !p.is_empty()) {
            let (i, c) = part
                .split_once(':')
                .ok_or_else(|| format!("latency bucket {part:?}"))?;
            let i: usize = number("latency bucket", i)?;
            if i >= BUCKETS {
                return Err(format!("latency bucket {i}"));
            }
            if i >= h.counts.len() {
                h.counts.resize(i + 1, 0);
            }
            h.counts[i] += number::<u64>("latency count", c)?;
        }
        Ok(h)
    }
}
