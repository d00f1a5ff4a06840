//! A counting global allocator: it forwards to [`System`] and, while armed (during one
//! input), records the largest single allocation and the bytes allocated in total (a
//! reallocation counts its new size). An allocation above [`HARD_CAP`] while armed is not
//! attempted: the input that asked for it is reported and the process aborts, before the
//! machine runs out of memory.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};

/// Larger single allocations than this abort the run at once (1 GiB).
pub(crate) const HARD_CAP: usize = 1 << 30;

/// The allocator (installed in `main.rs`).
#[derive(Debug)]
pub(crate) struct Counting;

static ARMED: AtomicBool = AtomicBool::new(false);
static LARGEST: AtomicUsize = AtomicUsize::new(0);
static TOTAL: AtomicUsize = AtomicUsize::new(0);

/// What the driver is running, for the report of a hard-cap allocation.
static CURRENT_TARGET: AtomicUsize = AtomicUsize::new(usize::MAX);
static CURRENT_SEED: AtomicU64 = AtomicU64::new(0);
static CURRENT_INDEX: AtomicU64 = AtomicU64::new(0);

/// The allocations of one input.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Usage {
    /// The largest single allocation, in bytes.
    pub(crate) largest: usize,
    /// Bytes allocated in total.
    pub(crate) total: usize,
}

/// Starts counting for input `index` of target number `target` in a run seeded `seed`.
pub(crate) fn arm(target: usize, seed: u64, index: u64) {
    CURRENT_TARGET.store(target, Relaxed);
    CURRENT_SEED.store(seed, Relaxed);
    CURRENT_INDEX.store(index, Relaxed);
    LARGEST.store(0, Relaxed);
    TOTAL.store(0, Relaxed);
    ARMED.store(true, Relaxed);
}

/// Stops counting; what the input allocated.
pub(crate) fn disarm() -> Usage {
    ARMED.store(false, Relaxed);
    Usage {
        largest: LARGEST.load(Relaxed),
        total: TOTAL.load(Relaxed),
    }
}

/// Counts an allocation of `size` bytes; aborts the process when it exceeds [`HARD_CAP`]
/// while armed.
fn note(size: usize) {
    if !ARMED.load(Relaxed) {
        return;
    }
    LARGEST.fetch_max(size, Relaxed);
    TOTAL.fetch_add(size, Relaxed);
    if size > HARD_CAP {
        // Counting stops so that the report may allocate.
        ARMED.store(false, Relaxed);
        let name = crate::targets::name_of(CURRENT_TARGET.load(Relaxed));
        let seed = CURRENT_SEED.load(Relaxed);
        let index = CURRENT_INDEX.load(Relaxed);
        eprintln!(
            "rdmx-fuzz: target {name}: an allocation of {size} bytes (over {HARD_CAP}) on input \
             #{index} of seed {seed:#x}; replay with: rdmx-fuzz {name} --seed {seed:#x} \
             --start {index} --iters 1"
        );
        std::process::abort();
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
// `System`'s guarantees are ours; the bookkeeping only touches atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which we pass on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` (every allocation goes there) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: as in `dealloc`, and the caller upholds `realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
