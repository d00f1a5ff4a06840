//! The registered buffer pool.
//!
//! Large registered chunks are carved into power-of-two size classes (256 B to 4 MiB, plus
//! the receive-buffer size), so sending never registers memory on the fast path. A [`Buf`]
//! is an owned handle to one slot: it dereferences to its bytes, knows its keys, and returns
//! to its class's free list when dropped. The pool grows chunk by chunk up to its cap
//! (`Config::pool_max`); past that, [`BufferPool::try_alloc`] says `WouldBlock` and callers
//! wait for a buffer to come back — back-pressure instead of unbounded memory. Buffers
//! larger than the biggest class get a dedicated registration (counted against the cap).
//!
//! The byte views live in the audited module `raw`.

mod raw;

mod shared;
pub use shared::SharedBuf;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use rdmx_verbs::{AccessFlags, ProtectionDomain, Rkey, Sge};

use crate::error::{Error, Result};
use raw::Chunk;

/// Smallest size class.
pub const MIN_CLASS: usize = 256;
/// Largest size class; bigger buffers are registered one by one.
pub const MAX_CLASS: usize = 4 << 20;
/// Target size of a chunk of small slots.
const CHUNK_TARGET: usize = 2 << 20;
/// At most this many slots per chunk.
const MAX_SLOTS: usize = 64;

/// The right to name a pool buffer's bytes in a work request, or to offer them to a peer
/// (its [`Buf::sge`], [`Buf::rkey`]).
///
/// A [`Buf`] hands out plain `&[u8]` / `&mut [u8]` views of registered memory, which the NIC
/// reads and writes on its own while a work request names it: posting a buffer the
/// application can still reach would be a data race. So only a transport gets this key (a
/// [`Worker`](crate::Worker) hands it to each transport it adds), and a transport promises,
/// by implementing the `unsafe` trait [`Transport`](crate::worker::Transport), to name a
/// buffer only once the application can no longer reach it, and to hand it back only after
/// the work request has completed or been flushed. The application never holds one:
///
/// ```compile_fail
/// # fn f(pool: &rdmx_core::BufferPool, qp: &rdmx_verbs::QueuePair) -> rdmx_core::Result<()> {
/// let mut buf = pool.try_alloc(4096)?;
/// qp.post_recv(&rdmx_verbs::RecvWr::new(1, &[buf.sge()]))?; // needs a PostKey
/// buf[0] = 1; // the NIC may write these bytes at the same time
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct PostKey(());

impl PostKey {
    /// Made by the worker only.
    pub(crate) fn new() -> Self {
        Self(())
    }
}

/// How a pool is sized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// Most registered bytes the pool may hold.
    pub max_bytes: usize,
    /// Classes (and dedicated buffers) at least this large are registered with
    /// `REMOTE_READ` (rendezvous sources).
    pub remote_read_min: usize,
    /// Extra size classes besides the powers of two: the transports' receive-buffer
    /// sizes (RC's header plus eager threshold; UD's MTU plus GRH).
    pub extra_classes: Vec<usize>,
}

/// Counters of a pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Registered bytes (all chunks).
    pub registered_bytes: usize,
    /// Bytes in slots currently handed out.
    pub in_use_bytes: usize,
    /// Registered chunks.
    pub chunks: usize,
    /// Successful allocations.
    pub allocs: u64,
    /// Allocations refused because the pool was at its cap.
    pub exhausted: u64,
}

#[derive(Debug)]
struct Class {
    size: usize,
    free: Vec<(Arc<Chunk>, usize)>,
}

#[derive(Debug)]
struct State {
    classes: Vec<Class>,
    stats: PoolStats,
}

struct Shared {
    pd: ProtectionDomain,
    cfg: PoolConfig,
    state: Mutex<State>,
    released: AtomicU64,
    /// Registered bytes the owner keeps for good (see [`BufferPool::reserve`]).
    reserved: AtomicUsize,
    /// The class sizes, ascending (as in `State::classes`).
    sizes: Vec<usize>,
    /// The device has memory windows: remotely readable classes also allow `MW_BIND`, so
    /// a transport can open one buffer to one peer for one transfer.
    mw_bind: bool,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferPool")
            .field("cfg", &self.cfg)
            .field("stats", &self.state.lock().stats)
            .finish()
    }
}

/// A pool of registered buffers (cheap to clone; clones share the pool).
#[derive(Debug, Clone)]
pub struct BufferPool {
    shared: Arc<Shared>,
}

/// An owned buffer from a [`BufferPool`]: dereferences to its first [`len`](Self::len)
/// bytes, knows its memory keys, and goes back to the pool when dropped.
pub struct Buf {
    chunk: Arc<Chunk>,
    offset: usize,
    cap: usize,
    len: usize,
    /// Index of the size class, or `None` for a dedicated registration.
    class: Option<usize>,
    pool: Arc<Shared>,
}

impl fmt::Debug for Buf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buf")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("cap", &self.cap)
            .finish()
    }
}

impl BufferPool {
    /// A pool registering its chunks in `pd`.
    pub fn new(pd: &ProtectionDomain, cfg: PoolConfig) -> Self {
        let mut sizes: Vec<usize> =
            std::iter::successors(Some(MIN_CLASS), |s| (*s < MAX_CLASS).then_some(s * 2)).collect();
        for &x in &cfg.extra_classes {
            if x > 0 && x <= MAX_CLASS && !sizes.contains(&x) {
                sizes.push(x);
            }
        }
        sizes.sort_unstable();
        let classes = sizes
            .iter()
            .map(|&size| Class {
                size,
                free: Vec::new(),
            })
            .collect();
        Self {
            shared: Arc::new(Shared {
                pd: pd.clone(),
                cfg,
                state: Mutex::new(State {
                    classes,
                    stats: PoolStats::default(),
                }),
                released: AtomicU64::new(0),
                reserved: AtomicUsize::new(0),
                sizes,
                mw_bind: pd.context().query_device().memory_windows,
            }),
        }
    }

    /// The class a buffer of `len` bytes comes from (`None`: a dedicated registration).
    fn class_size(&self, len: usize) -> Option<usize> {
        self.shared.sizes.iter().copied().find(|&s| s >= len)
    }

    /// Registered bytes a buffer of `len` bytes takes: its size class, or for a dedicated
    /// registration `len` rounded up to a page.
    pub fn footprint(&self, len: usize) -> usize {
        self.class_size(len)
            .unwrap_or_else(|| len.next_multiple_of(4096))
    }

    /// Slots per chunk of the class of `size` bytes on an empty pool.
    fn chunk_slots(&self, size: usize) -> usize {
        slots_for(size).min((self.shared.cfg.max_bytes / 4 / size).max(1))
    }

    /// Registered bytes `count` buffers of `len` bytes take when they are the first of their
    /// class: whole chunks.
    pub fn footprint_of(&self, count: usize, len: usize) -> usize {
        match self.class_size(len) {
            Some(size) => {
                let slots = self.chunk_slots(size);
                count.div_ceil(slots) * slots * size
            }
            None => count * len.next_multiple_of(4096),
        }
    }

    /// Declares `bytes` of the cap as kept for good by the pool's owner (the receive buffers
    /// a context posts for its whole life): from then on a buffer that could not fit beside
    /// them is refused with `PoolCapacity` instead of waiting for ever.
    pub fn reserve(&self, bytes: usize) {
        self.shared.reserved.store(bytes, Ordering::Relaxed);
    }

    /// Registered bytes a single buffer may take: the cap less the reserved bytes.
    pub fn capacity(&self) -> usize {
        self.shared
            .cfg
            .max_bytes
            .saturating_sub(self.shared.reserved.load(Ordering::Relaxed))
    }

    /// The largest buffer the pool can ever serve (with nothing else handed out).
    pub fn largest(&self) -> usize {
        let cap = self.capacity();
        if cap > MAX_CLASS {
            return cap - cap % 4096;
        }
        self.shared
            .sizes
            .iter()
            .copied()
            .filter(|&s| s <= cap)
            .max()
            .unwrap_or(0)
    }

    /// The pool's configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.shared.cfg
    }

    /// Current counters.
    pub fn stats(&self) -> PoolStats {
        self.shared.state.lock().stats
    }

    /// How many buffers have been returned so far (callers waiting for space watch it).
    pub fn released(&self) -> u64 {
        self.shared.released.load(Ordering::Acquire)
    }

    /// A buffer of `len` bytes (its contents are whatever the slot held before), without
    /// waiting.
    ///
    /// # Errors
    /// `WouldBlock` when the pool is at its cap and no slot of the class is free;
    /// `PoolCapacity` when the buffer could never fit (beside the [reserved](Self::reserve)
    /// bytes); `Verbs` when registration fails.
    pub fn try_alloc(&self, len: usize) -> Result<Buf> {
        let sh = &self.shared;
        // The class, found once (`sizes` is in the order of `State::classes`).
        let class = sh.sizes.iter().position(|&s| s >= len);
        let footprint = class.map_or_else(|| len.next_multiple_of(4096), |ci| sh.sizes[ci]);
        if len > sh.cfg.max_bytes || footprint > self.capacity() {
            return Err(Error::PoolCapacity(len));
        }
        let mut st = sh.state.lock();
        let Some(ci) = class else {
            return self.alloc_dedicated(st, len);
        };
        let size = st.classes[ci].size;
        if st.classes[ci].free.is_empty() {
            // No chunk takes more than a quarter of the cap, so that one class cannot
            // strand the room another needs in a half-used chunk.
            let mut slots = self.chunk_slots(size);
            if st.stats.registered_bytes + size * slots > sh.cfg.max_bytes {
                reclaim(&mut st);
            }
            // Near the cap, a smaller chunk (down to one slot) rather than none: a class
            // whose full chunk never fits must still be able to serve a buffer.
            let room = sh.cfg.max_bytes.saturating_sub(st.stats.registered_bytes);
            slots = slots.min(room / size);
            if slots == 0 {
                st.stats.exhausted += 1;
                return Err(Error::WouldBlock);
            }
            let bytes = size * slots;
            let chunk = Arc::new(Chunk::new(&sh.pd, bytes, self.access_for(size))?);
            st.stats.registered_bytes += bytes;
            st.stats.chunks += 1;
            let free = &mut st.classes[ci].free;
            free.extend((0..slots).rev().map(|i| (chunk.clone(), i * size)));
        }
        let Some((chunk, offset)) = st.classes[ci].free.pop() else {
            return Err(Error::WouldBlock);
        };
        st.stats.allocs += 1;
        st.stats.in_use_bytes += size;
        drop(st);
        Ok(Buf {
            chunk,
            offset,
            cap: size,
            len,
            class: Some(ci),
            pool: sh.clone(),
        })
    }

    /// True when `buf` came from this pool (so its memory keys are this pool's).
    pub fn owns(&self, buf: &Buf) -> bool {
        Arc::ptr_eq(&self.shared, &buf.pool)
    }

    /// A buffer holding a copy of `data`.
    ///
    /// # Errors
    /// As [`try_alloc`](Self::try_alloc).
    pub fn try_alloc_from(&self, data: &[u8]) -> Result<Buf> {
        let mut b = self.try_alloc(data.len())?;
        b.copy_from_slice(data);
        Ok(b)
    }

    fn access_for(&self, size: usize) -> AccessFlags {
        if size >= self.shared.cfg.remote_read_min {
            let a = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
            if self.shared.mw_bind {
                a | AccessFlags::MW_BIND
            } else {
                a
            }
        } else {
            AccessFlags::LOCAL_WRITE
        }
    }

    fn alloc_dedicated(
        &self,
        mut st: parking_lot::MutexGuard<'_, State>,
        len: usize,
    ) -> Result<Buf> {
        let sh = &self.shared;
        let bytes = len.next_multiple_of(4096);
        if st.stats.registered_bytes + bytes > sh.cfg.max_bytes {
            reclaim(&mut st);
        }
        if st.stats.registered_bytes + bytes > sh.cfg.max_bytes {
            st.stats.exhausted += 1;
            return Err(Error::WouldBlock);
        }
        // Count it before registering so concurrent callers cannot overshoot the cap.
        st.stats.registered_bytes += bytes;
        st.stats.in_use_bytes += bytes;
        st.stats.chunks += 1;
        drop(st);
        match Chunk::new(&sh.pd, bytes, self.access_for(bytes)) {
            Ok(c) => {
                sh.state.lock().stats.allocs += 1;
                Ok(Buf {
                    chunk: Arc::new(c),
                    offset: 0,
                    cap: bytes,
                    len,
                    class: None,
                    pool: sh.clone(),
                })
            }
            Err(e) => {
                let mut st = sh.state.lock();
                st.stats.registered_bytes -= bytes;
                st.stats.in_use_bytes -= bytes;
                st.stats.chunks -= 1;
                Err(e.into())
            }
        }
    }
}

/// Slots per chunk of a class of `size` bytes.
fn slots_for(size: usize) -> usize {
    (CHUNK_TARGET / size).clamp(1, MAX_SLOTS)
}

/// Deregisters chunks whose slots are all free, so that memory one size class no longer
/// uses can serve another (called when the pool is at its cap).
fn reclaim(st: &mut State) {
    let mut freed = 0usize;
    let mut chunks = 0usize;
    for class in &mut st.classes {
        // Chunks near the cap may have fewer slots than `slots_for`: count each one's own.
        let mut counts: std::collections::HashMap<*const Chunk, (usize, usize)> =
            std::collections::HashMap::new();
        for (c, _) in &class.free {
            counts.entry(Arc::as_ptr(c)).or_insert((0, c.mr.len())).0 += 1;
        }
        let size = class.size;
        let idle: Vec<(*const Chunk, usize)> = counts
            .into_iter()
            .filter(|&(_, (n, len))| n * size == len)
            .map(|(p, (_, len))| (p, len))
            .collect();
        if idle.is_empty() {
            continue;
        }
        class
            .free
            .retain(|(c, _)| !idle.iter().any(|&(p, _)| p == Arc::as_ptr(c)));
        freed += idle.iter().map(|&(_, len)| len).sum::<usize>();
        chunks += idle.len();
    }
    st.stats.registered_bytes = st.stats.registered_bytes.saturating_sub(freed);
    st.stats.chunks = st.stats.chunks.saturating_sub(chunks);
}

impl Buf {
    /// Bytes in use (what `Deref` shows).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when `len() == 0`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The slot's size: the most `len` can grow to.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Sets the length (the bytes between the old and new length keep whatever the slot
    /// held).
    ///
    /// # Errors
    /// `InvalidArgument` when `len` exceeds the capacity.
    pub fn set_len(&mut self, len: usize) -> Result<()> {
        if len > self.cap {
            return Err(Error::InvalidArgument(format!(
                "length {len} exceeds the buffer's capacity {}",
                self.cap
            )));
        }
        self.len = len;
        Ok(())
    }

    /// Address of the first byte.
    pub fn addr(&self) -> u64 {
        self.chunk.mr.addr() + self.offset as u64
    }

    /// Remote key of the memory region (meaningful for buffers registered with remote
    /// read), for a transport that offers the buffer to a peer (see [`PostKey`]).
    pub fn rkey(&self, _: PostKey) -> Rkey {
        self.chunk.mr.rkey()
    }

    /// An SGE for `len` bytes starting `off` bytes into the buffer (clamped to the
    /// capacity), for a transport that posts the buffer (see [`PostKey`]).
    pub fn sge_at(&self, _: PostKey, off: usize, len: usize) -> Sge {
        let off = off.min(self.cap);
        let len = len.min(self.cap - off);
        self.chunk.mr.sge(self.offset + off, len)
    }

    /// An SGE for the first `len()` bytes, for a transport that posts the buffer (see
    /// [`PostKey`]).
    pub fn sge(&self, key: PostKey) -> Sge {
        self.sge_at(key, 0, self.len)
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        let sh = &self.pool;
        let mut st = sh.state.lock();
        st.stats.in_use_bytes = st.stats.in_use_bytes.saturating_sub(self.cap);
        match self.class {
            Some(ci) => {
                if let Some(c) = st.classes.get_mut(ci) {
                    c.free.push((self.chunk.clone(), self.offset));
                }
            }
            None => {
                st.stats.registered_bytes = st.stats.registered_bytes.saturating_sub(self.cap);
                st.stats.chunks = st.stats.chunks.saturating_sub(1);
            }
        }
        drop(st);
        sh.released.fetch_add(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdmx_verbs::Device;

    fn pool(max: usize) -> BufferPool {
        let ctx = Device::open("soft:127.0.0.1").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        BufferPool::new(
            &pd,
            PoolConfig {
                max_bytes: max,
                remote_read_min: 8192,
                extra_classes: vec![8192 + 16],
            },
        )
    }

    #[test]
    fn classes_and_reuse() {
        let p = pool(64 << 20);
        let mut a = p.try_alloc(100).unwrap();
        assert_eq!(a.capacity(), 256);
        assert_eq!(a.len(), 100);
        a.fill(7);
        let addr = a.addr();
        drop(a);
        let b = p.try_alloc(200).unwrap();
        assert_eq!(b.addr(), addr, "a freed slot is reused first");
        assert!(
            b[..100].iter().all(|&x| x == 7),
            "the slot's old bytes are visible"
        );
        let r = p.try_alloc(8200).unwrap();
        assert_eq!(r.capacity(), 8208, "the receive class");
        let big = p.try_alloc_from(&vec![3u8; 5 << 20]).unwrap();
        assert_eq!(big.capacity(), 5 << 20);
        assert_eq!(big[5 << 19], 3);
        let s = p.stats();
        assert_eq!(s.allocs, 4);
        drop((b, r, big));
        assert_eq!(p.stats().in_use_bytes, 0);
    }

    #[test]
    fn slots_do_not_overlap() {
        let p = pool(64 << 20);
        let mut bufs: Vec<Buf> = (0..200).map(|_| p.try_alloc(1000).unwrap()).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            b.fill(i as u8);
        }
        for (i, b) in bufs.iter().enumerate() {
            assert!(b.iter().all(|&x| x == i as u8), "slot {i} was overwritten");
        }
    }

    #[test]
    fn cap_gives_back_pressure() {
        let p = pool(4 << 20);
        let mut held = Vec::new();
        let err = loop {
            match p.try_alloc(64 << 10) {
                Ok(b) => held.push(b),
                Err(e) => break e,
            }
            assert!(held.len() < 1000, "the cap was not enforced");
        };
        assert!(matches!(err, Error::WouldBlock), "{err}");
        assert!(p.stats().registered_bytes <= 4 << 20);
        assert!(p.stats().exhausted >= 1);
        let before = p.released();
        held.pop();
        assert_eq!(p.released(), before + 1);
        assert!(
            p.try_alloc(64 << 10).is_ok(),
            "a returned slot is usable again"
        );
        assert!(matches!(p.try_alloc(8 << 20), Err(Error::PoolCapacity(_))));
        // Another class needs a chunk of its own, which only fits once memory is returned.
        assert!(matches!(p.try_alloc(10), Err(Error::WouldBlock)));
        held.clear();
        let mut b = p.try_alloc(10).unwrap();
        assert!(b.set_len(300).is_err());
        assert!(b.set_len(256).is_ok());
    }

    #[test]
    fn reserved_bytes_make_what_can_never_fit_a_capacity_error() {
        let p = pool(8 << 20);
        assert_eq!(p.largest(), 8 << 20);
        // 100 buffers of 33 KiB: two whole chunks of the 64 KiB class (32 slots of 64 KiB).
        assert_eq!(p.footprint_of(100, 33 << 10), 4 * 32 * (64 << 10));
        assert_eq!(p.footprint(33 << 10), 64 << 10);
        assert_eq!(p.footprint((4 << 20) + 1), (4 << 20) + 4096);
        p.reserve(3 << 20);
        assert_eq!(p.capacity(), 5 << 20);
        assert_eq!(p.largest(), 5 << 20);
        assert!(matches!(
            p.try_alloc((5 << 20) + 1),
            Err(Error::PoolCapacity(_))
        ));
        drop(p.try_alloc(5 << 20).unwrap());
        p.reserve(5 << 20);
        // 3 MiB left: a 2 MiB class buffer is the largest (a 4 MiB one never fits).
        assert_eq!(p.largest(), 2 << 20);
        assert!(matches!(p.try_alloc(3 << 20), Err(Error::PoolCapacity(_))));
        assert!(p.try_alloc(2 << 20).is_ok());
    }

    #[test]
    fn a_class_whose_full_chunk_does_not_fit_still_serves() {
        // 1.5 MiB cap: a 128 KiB chunk of 16 slots (2 MiB) can never fit, but smaller chunks
        // can, down to one slot, and they are reclaimed like full ones.
        let p = pool(3 << 19);
        let small = p.try_alloc(100).unwrap(); // a 64-slot chunk of 256 B
        let mut held = Vec::new();
        while let Ok(b) = p.try_alloc(100 << 10) {
            held.push(b);
            assert!(held.len() < 100);
        }
        assert_eq!(held.len(), 11, "{:?}", p.stats());
        assert!(p.stats().registered_bytes <= 3 << 19);
        drop(held);
        drop(small);
        // Both classes' chunks are idle: another class reclaims them.
        let r = p.try_alloc(1 << 20).unwrap();
        assert_eq!(r.capacity(), 1 << 20);
        assert!(p.stats().registered_bytes <= 3 << 19);
    }
}
