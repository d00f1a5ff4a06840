//! Maps keyed by the NIC's own 32-bit object numbers (QPNs, CQ and SRQ numbers, memory
//! keys), with a multiplicative hash instead of the standard library's SipHash.
//!
//! Every packet looks up its QP, its memory region and its CQ; SipHash was about an eighth of
//! the engine's time per message. Hash flooding is not a concern here: a packet can only
//! look keys up, and only the local application creates objects (inserts).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` keyed by a NIC object number.
pub(crate) type IdMap<V> = HashMap<u32, V, BuildHasherDefault<IdHasher>>;

/// Fibonacci hashing of a `u32` key: the product's high bits (which the map uses for its
/// control bytes) depend on every key bit.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

const K: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by `u32` keys; any byte string still hashes deterministically.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(K);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(K);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_and_sparse_keys_spread() {
        let mut m: IdMap<u32> = IdMap::default();
        for k in (0..10_000u32).chain((0..1000).map(|i| i << 20)) {
            m.insert(k, k);
        }
        for k in (0..10_000u32).chain((0..1000).map(|i| i << 20)) {
            assert_eq!(m.get(&k), Some(&k));
        }
        // The high 7 bits (hashbrown's control byte) differ across consecutive keys.
        let tops: std::collections::HashSet<u64> = (0..128u32)
            .map(|k| {
                let mut h = IdHasher::default();
                h.write_u32(k);
                h.finish() >> 57
            })
            .collect();
        assert!(tops.len() > 64, "{}", tops.len());
    }
}
