//! Batched doorbells: sends posted inside a [`PostBatch`](crate::PostBatch) leave together.
//!
//! A hardware NIC takes a posted send with a doorbell write of a few nanoseconds and sends
//! it on its own. The soft NIC sends from the posting thread, and a UDP `sendto` (with
//! loopback delivery) costs 1.5-4 µs on the machines rdmx is developed on, so a thread that
//! posts one small send after another pays a system call per message. Posts in one list
//! (`post_send` with several work requests) already leave in one GSO send; a batch extends
//! that to separate `post_send` calls, such as the message layer's one post per message.
//!
//! While the calling thread has a batch open on a device, its posts are held, up to
//! [`MAX_HELD`] at a time. Held sends go out when:
//! - a post finds [`MAX_HELD`] held already;
//! - the batch ends (the guard is dropped), or the device is polled (a CQ poll or a progress
//!   call, by any thread), or another call into the device produces output;
//! - the thread stops polling ([`release`](super::Shared::release));
//! - [`HOLD_MAX_NS`] after the first held post, by the engine thread (a batch leaked with
//!   `mem::forget`, or a thread that blocks elsewhere with a batch open, still gets its
//!   sends out). While no thread busy-polls the device, the engine thread sleeps, and the
//!   first post held in a batch wakes it to set that timer: one system call per batch.
//!
//! Holding is never implicit: a thread without an open batch is flushed at once, as a NIC
//! would send at once.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// At most this many posts are held; the next one flushes them all (one GSO send).
pub(crate) const MAX_HELD: u32 = 16;
/// Held posts leave at the latest this long after the first of them.
pub(crate) const HOLD_MAX_NS: u64 = 1_000_000;

thread_local! {
    /// The device this thread has a batch open on (its address, 0 for none) and how many
    /// nested batches.
    static OPEN: Cell<(usize, u32)> = const { Cell::new((0, 0)) };
}

/// Held-post accounting of one device (changed under the NIC lock).
#[derive(Debug, Default)]
pub(crate) struct Doorbell {
    held: AtomicU32,
    /// When the first held post was held (device nanoseconds).
    since: AtomicU64,
}

impl Doorbell {
    /// The calling thread opens (`true`) or closes a batch on device `dev`.
    pub(crate) fn open(dev: usize, on: bool) {
        OPEN.with(|o| {
            let (d, depth) = o.get();
            o.set(match (on, d == dev) {
                (true, true) => (dev, depth + 1),
                (true, false) => (dev, 1),
                (false, true) if depth > 1 => (dev, depth - 1),
                (false, _) => (0, 0),
            });
        });
    }

    /// Whether the calling thread's post on device `dev` at `now` may be held; if so it is
    /// counted. `Some(true)`: held, and the first one held.
    pub(crate) fn hold(&self, dev: usize, now: u64) -> Option<bool> {
        if OPEN.with(Cell::get).0 != dev {
            return None;
        }
        let held = self.held.load(Ordering::Relaxed);
        if held >= MAX_HELD {
            return None;
        }
        if held == 0 {
            self.since.store(now, Ordering::Relaxed);
        }
        self.held.store(held + 1, Ordering::Relaxed);
        Some(held == 0)
    }

    /// When the held posts must leave, if any are held.
    pub(crate) fn deadline(&self) -> Option<u64> {
        self.any()
            .then(|| self.since.load(Ordering::Relaxed) + HOLD_MAX_NS)
    }

    /// True while some post is held.
    pub(crate) fn any(&self) -> bool {
        self.held.load(Ordering::Relaxed) > 0
    }

    /// Everything held is about to be sent.
    pub(crate) fn clear(&self) {
        self.held.store(0, Ordering::Relaxed);
    }
}
