//! The registration cache: application memory sent zero-copy stays registered between sends.
//!
//! Registering memory with a NIC is expensive (on hardware a system call that pins pages), so
//! a buffer the application sends again and again should be registered once. The usual way to
//! keep such a cache correct is to intercept `free`/`munmap` and drop registrations whose
//! memory went away; rdmx installs no allocator hooks. Instead every entry *owns* its bytes:
//! zero-copy sends take [`SharedBytes`] (an `Arc<[u8]>`, an `Arc<Vec<u8>>` or `'static`
//! bytes), and the registration holds a reference to that owner. So:
//!
//! * a cached range always belongs to live, immutable memory, so any view that falls inside it
//!   is the same bytes, and a hit is always correct;
//! * memory is never freed while registered, whatever the application does;
//! * an entry that only the cache still holds (the application dropped every reference, or
//!   the owner is not used any more) is released at the next miss or by
//!   [`flush`](RegCache::flush), and idle entries are evicted least recently used first once
//!   the cache holds more than its cap ([`Config::regcache_max`](crate::Config)).
//!
//! Entries are keyed by address range: a miss registers the owner's whole extent
//! ([`SharedBytes::whole`]), so later sends of other slices of the same buffer hit.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use rdmx_verbs::{AccessFlags, Lkey, MemoryRegion, ProtectionDomain, Rkey, SharedBytes};

use crate::error::{Error, Result};

/// How many ranges that start at or below an address are examined for one that covers it.
/// Ranges of live owners never overlap unless two `'static` views overlap, so one is almost
/// always enough.
const SCAN: usize = 8;

/// Counters of a [`RegCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegCacheStats {
    /// Lookups served by an existing registration.
    pub hits: u64,
    /// Lookups that registered memory.
    pub misses: u64,
    /// Registrations dropped (evicted over the cap, released because only the cache held the
    /// bytes, or flushed).
    pub evictions: u64,
    /// Registrations cached now.
    pub entries: usize,
    /// Bytes those registrations cover.
    pub bytes: usize,
}

struct Entry {
    mr: Arc<MemoryRegion>,
    used: u64,
}

#[derive(Default)]
struct Inner {
    map: BTreeMap<(u64, u64), Entry>,
    bytes: usize,
    clock: u64,
    stats: RegCacheStats,
}

/// A cache of read-only registrations of application memory, keyed by address range.
pub struct RegCache {
    pd: ProtectionDomain,
    max: usize,
    inner: Mutex<Inner>,
    /// The access registrations get: `REMOTE_READ`, and `MW_BIND` where the device has
    /// memory windows (a transport opens one range to one peer through a window).
    access: AccessFlags,
}

impl std::fmt::Debug for RegCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegCache")
            .field("max", &self.max)
            .field("stats", &self.stats())
            .finish()
    }
}

/// A registration covering some application bytes. Holding it keeps the registration, and
/// so the bytes, alive; a cached entry in use is never evicted.
#[derive(Debug, Clone)]
pub struct Registered {
    mr: Arc<MemoryRegion>,
    addr: u64,
    len: usize,
}

impl Registered {
    /// Address of the registered view's first byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length of the view in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty view (never produced by the cache).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The local key of the covering registration.
    pub fn lkey(&self) -> Lkey {
        self.mr.lkey()
    }

    /// An SGE for the whole view: the registration is read-only (the NIC may only read the
    /// bytes, which are immutable while shared), so naming it races with nothing.
    pub fn sge(&self) -> rdmx_verbs::Sge {
        let off = usize::try_from(self.addr() - self.mr.addr()).unwrap_or(usize::MAX);
        self.mr.sge(off, self.len())
    }

    /// The remote key of the covering registration (peers may only read with it).
    pub fn rkey(&self) -> Rkey {
        self.mr.rkey()
    }

    /// The covering memory region (it may extend beyond the view).
    pub fn region(&self) -> &MemoryRegion {
        &self.mr
    }
}

impl RegCache {
    /// A cache registering under `pd` that keeps at most `max` bytes registered while idle
    /// (0: nothing is kept; every lookup registers).
    pub fn new(pd: ProtectionDomain, max: usize) -> Self {
        let access = if pd.context().query_device().memory_windows {
            AccessFlags::REMOTE_READ | AccessFlags::MW_BIND
        } else {
            AccessFlags::REMOTE_READ
        };
        Self {
            pd,
            max,
            inner: Mutex::new(Inner::default()),
            access,
        }
    }

    /// A registration covering `bytes`: a cached one when an entry's range covers them,
    /// else a new read-only registration of the owner's whole extent (cached when it fits
    /// under the cap; if it does not, only `bytes` are registered, uncached).
    ///
    /// # Errors
    /// `InvalidArgument` for empty bytes; `Verbs` when registration fails.
    pub fn register(&self, bytes: &SharedBytes) -> Result<Registered> {
        if bytes.is_empty() {
            return Err(Error::InvalidArgument(
                "cannot register an empty buffer".into(),
            ));
        }
        let addr = bytes.addr();
        let len = bytes.len();
        let end = addr.saturating_add(len as u64);
        let mut g = self.inner.lock();
        let inner = &mut *g;
        inner.clock += 1;
        let now = inner.clock;
        if let Some(e) = inner
            .map
            .range_mut(..=(addr, u64::MAX))
            .rev()
            .take(SCAN)
            .find(|((_, e_end), _)| *e_end >= end)
            .map(|(_, e)| e)
        {
            e.used = now;
            inner.stats.hits += 1;
            return Ok(Registered {
                mr: e.mr.clone(),
                addr,
                len,
            });
        }
        inner.stats.misses += 1;
        release_unowned(inner);
        let whole = bytes.whole();
        if whole.len() > self.max {
            let mr = self.pd.reg_shared(bytes.clone(), self.access)?;
            return Ok(Registered {
                mr: Arc::new(mr),
                addr,
                len,
            });
        }
        let wlen = whole.len();
        let mr = Arc::new(self.pd.reg_shared(whole, self.access)?);
        let key = (mr.addr(), mr.addr().saturating_add(wlen as u64));
        let out = Registered {
            mr: mr.clone(),
            addr,
            len,
        };
        // Replacing an entry for the same range (possible only when more than `SCAN`
        // overlapping `'static` views hid it from the lookup) must not count it twice.
        if inner.map.insert(key, Entry { mr, used: now }).is_none() {
            inner.bytes += wlen;
        }
        if inner.bytes > self.max {
            evict_lru(inner, self.max);
        }
        inner.stats.entries = inner.map.len();
        inner.stats.bytes = inner.bytes;
        Ok(out)
    }

    /// Drops every registration not in use by a send; returns how many.
    pub fn flush(&self) -> usize {
        let mut g = self.inner.lock();
        let inner = &mut *g;
        let before = inner.map.len();
        let idle: Vec<(u64, u64)> = inner
            .map
            .iter()
            .filter(|(_, e)| Arc::strong_count(&e.mr) == 1)
            .map(|(k, _)| *k)
            .collect();
        for k in idle {
            remove(inner, k);
        }
        before - inner.map.len()
    }

    /// The counters.
    pub fn stats(&self) -> RegCacheStats {
        self.inner.lock().stats
    }
}

fn remove(inner: &mut Inner, k: (u64, u64)) {
    if inner.map.remove(&k).is_some() {
        inner.bytes -= (k.1 - k.0) as usize;
        inner.stats.evictions += 1;
        inner.stats.entries = inner.map.len();
        inner.stats.bytes = inner.bytes;
    }
}

/// Releases entries whose bytes only the cache still references and that no send uses.
fn release_unowned(inner: &mut Inner) {
    let dead: Vec<(u64, u64)> = inner
        .map
        .iter()
        .filter(|(_, e)| {
            Arc::strong_count(&e.mr) == 1
                && e.mr.shared_bytes().is_some_and(|b| b.owner_refs() == 1)
        })
        .map(|(k, _)| *k)
        .collect();
    for k in dead {
        remove(inner, k);
    }
}

/// Evicts idle entries, least recently used first, until at most `max` bytes are cached (or
/// only entries in use remain).
fn evict_lru(inner: &mut Inner, max: usize) {
    let mut idle: Vec<(u64, (u64, u64))> = inner
        .map
        .iter()
        .filter(|(_, e)| Arc::strong_count(&e.mr) == 1)
        .map(|(k, e)| (e.used, *k))
        .collect();
    idle.sort_unstable();
    for (_, k) in idle {
        if inner.bytes <= max {
            break;
        }
        remove(inner, k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdmx_verbs::Device;

    fn pd() -> ProtectionDomain {
        Device::open("soft:127.0.0.1").unwrap().alloc_pd().unwrap()
    }

    #[test]
    fn slices_of_a_cached_buffer_hit() {
        let c = RegCache::new(pd(), 1 << 20);
        let a = SharedBytes::from(vec![1u8; 10_000]);
        let r1 = c.register(&a).unwrap();
        assert_eq!((r1.addr(), r1.len()), (a.addr(), 10_000));
        let s = a.slice(5000..6000).unwrap();
        let r2 = c.register(&s).unwrap();
        assert_eq!(r2.addr(), a.addr() + 5000);
        assert_eq!(r2.rkey(), r1.rkey(), "same registration");
        // A slice registered first still registers the whole owner.
        let b = SharedBytes::from(vec![2u8; 4096]);
        let rb = c.register(&b.slice(100..200).unwrap()).unwrap();
        assert_eq!(rb.region().len(), 4096);
        assert_eq!(c.register(&b).unwrap().rkey(), rb.rkey());
        let st = c.stats();
        assert_eq!((st.hits, st.misses, st.entries), (2, 2, 2));
        assert_eq!(st.bytes, 14_096);
        assert!(c.register(&a.slice(0..0).unwrap()).is_err());
    }

    #[test]
    fn buffers_the_application_dropped_are_released() {
        let c = RegCache::new(pd(), 1 << 20);
        let a = SharedBytes::from(vec![1u8; 1000]);
        drop(c.register(&a).unwrap());
        drop(a);
        assert_eq!(c.stats().entries, 1);
        // The next miss notices that only the cache holds the first buffer.
        let b = SharedBytes::from(vec![2u8; 1000]);
        let _rb = c.register(&b).unwrap();
        let st = c.stats();
        assert_eq!((st.entries, st.evictions, st.bytes), (1, 1, 1000));
    }

    #[test]
    fn the_cap_evicts_idle_entries_lru_and_never_ones_in_use() {
        let c = RegCache::new(pd(), 3000);
        let bufs: Vec<SharedBytes> = (0..4u8).map(|i| SharedBytes::from(vec![i; 1000])).collect();
        let held = c.register(&bufs[0]).unwrap();
        c.register(&bufs[1]).unwrap();
        c.register(&bufs[2]).unwrap();
        c.register(&bufs[1]).unwrap(); // 1 is now more recent than 2
        c.register(&bufs[3]).unwrap(); // over the cap: evict the LRU idle entry (2)
        let st = c.stats();
        assert_eq!((st.entries, st.bytes, st.evictions), (3, 3000, 1));
        let before = c.stats().misses;
        c.register(&bufs[1]).unwrap();
        c.register(&bufs[0]).unwrap();
        assert_eq!(c.stats().misses, before, "1 and the held 0 stayed cached");
        c.register(&bufs[2]).unwrap();
        assert_eq!(c.stats().misses, before + 1, "2 was evicted");
        // Flush drops everything but the registration in use.
        assert_eq!(c.flush(), 2);
        assert_eq!(c.stats().entries, 1);
        drop(held);
        assert_eq!(c.flush(), 1);
        assert_eq!(c.stats().bytes, 0);
    }

    #[test]
    fn a_zero_cap_caches_nothing() {
        let c = RegCache::new(pd(), 0);
        let a = SharedBytes::from(vec![1u8; 100]);
        let r = c.register(&a).unwrap();
        assert_eq!(r.region().len(), 100);
        c.register(&a).unwrap();
        let st = c.stats();
        assert_eq!((st.hits, st.misses, st.entries), (0, 2, 0));
    }

    #[test]
    fn static_bytes_are_never_released_as_unowned() {
        static DATA: [u8; 64] = [9; 64];
        let c = RegCache::new(pd(), 1 << 20);
        c.register(&SharedBytes::from(&DATA[..])).unwrap();
        c.register(&SharedBytes::from(vec![0u8; 10])).unwrap();
        c.register(&SharedBytes::from(vec![0u8; 10])).unwrap();
        c.register(&SharedBytes::from(&DATA[8..16])).unwrap();
        assert_eq!(c.stats().hits, 1, "the static range stayed cached");
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            /// Register a slice of buffer `b` (from `start` for `len`, clamped).
            Register {
                b: usize,
                start: usize,
                len: usize,
            },
            /// Drop the oldest registration handle still held.
            DropHandle,
            /// Replace buffer `b` by a new one (the old owner is dropped by the test).
            Replace {
                b: usize,
                size: usize,
            },
            Flush,
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                4 => (0..4usize, 0..3000usize, 1..3000usize)
                    .prop_map(|(b, start, len)| Op::Register { b, start, len }),
                2 => Just(Op::DropHandle),
                1 => (0..4usize, 1..3000usize).prop_map(|(b, size)| Op::Replace { b, size }),
                1 => Just(Op::Flush),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(48))]
            /// Whatever the sequence, a registration covers its bytes and holds exactly them,
            /// the byte count matches the entries, and idle entries stay under the cap.
            #[test]
            fn registrations_always_hold_the_bytes(ops in proptest::collection::vec(op(), 1..60)) {
                let cap = 6000;
                let c = RegCache::new(pd(), cap);
                let mut bufs: Vec<SharedBytes> = (0..4u8)
                    .map(|i| SharedBytes::from(vec![i; 1000 + 500 * i as usize]))
                    .collect();
                let mut seed = 1u8;
                let mut misses = 0;
                let mut held: std::collections::VecDeque<(Registered, Vec<u8>)> = Default::default();
                for op in ops {
                    match op {
                        Op::Register { b, start, len } => {
                            let buf = &bufs[b];
                            let start = start % buf.len();
                            let len = len.min(buf.len() - start).max(1);
                            let view = buf.slice(start..start + len).unwrap();
                            let r = c.register(&view).unwrap();
                            let base = r.region().addr();
                            prop_assert!(r.addr() >= base);
                            let off = (r.addr() - base) as usize;
                            prop_assert!(off + r.len() <= r.region().len());
                            let got = r.region().to_vec(off, r.len()).unwrap();
                            prop_assert_eq!(&got[..], &view[..]);
                            held.push_back((r, view.to_vec()));
                        }
                        Op::DropHandle => {
                            held.pop_front();
                        }
                        Op::Replace { b, size } => {
                            seed = seed.wrapping_add(17);
                            bufs[b] = SharedBytes::from(vec![seed; size]);
                        }
                        Op::Flush => {
                            c.flush();
                        }
                    }
                    // Held registrations still hold their bytes, whatever happened since.
                    for (r, want) in &held {
                        let off = (r.addr() - r.region().addr()) as usize;
                        prop_assert_eq!(&r.region().to_vec(off, r.len()).unwrap()[..], &want[..]);
                    }
                    let st = c.stats();
                    let g = c.inner.lock();
                    let sum: usize = g.map.keys().map(|(s, e)| (e - s) as usize).sum();
                    prop_assert_eq!(st.bytes, sum);
                    prop_assert_eq!(st.entries, g.map.len());
                    let idle: usize = g
                        .map
                        .iter()
                        .filter(|(_, e)| Arc::strong_count(&e.mr) == 1)
                        .map(|((s, e), _)| (e - s) as usize)
                        .sum();
                    // Eviction runs when a miss adds an entry: then the cache is under its
                    // cap, or every entry left is in use.
                    if st.misses > misses {
                        prop_assert!(st.bytes <= cap || idle == 0, "{} idle of {}", idle, st.bytes);
                    }
                    misses = st.misses;
                }
            }
        }
    }
}
