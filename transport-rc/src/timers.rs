//! Timers: each endpoint's table of deadlines, and the transport's queue of when endpoints
//! next need a look.
//!
//! An endpoint keeps one [`Timers`] table: an optional deadline per [`Timer`]. Setting one
//! earlier than the endpoint's earliest queued wake queues a wake in the [`TimerQueue`]
//! (a min-heap of (time, endpoint key, endpoint id)); when a wake comes due, the transport
//! runs whichever of the endpoint's timers are due and queues its next wake. Entries are
//! never removed from the heap: one that finds its endpoint gone (another id in the slot) or
//! nothing due is dropped when it comes up. Times come from the worker's clock, never from
//! the host's: a simulation moves them.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

/// The deadlines an endpoint may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// Look at whether the peer has been silent long enough to be probed.
    Keepalive,
    /// An orderly close must be over by then (else the endpoint fails).
    CloseDeadline,
    /// A failed endpoint stays in the table until then, for the peer's sake.
    Linger,
    /// Re-arm the path left behind by a migration (not before then).
    Rearm,
    /// Out of credits since then: a send that still finds none tells the peer that we
    /// starve (a gate).
    Starving,
    /// A recall request of ours may be repeated from then on.
    Recall,
    /// The endpoint's packed frame goes by then.
    PackFlush,
}

impl Timer {
    /// Every timer, in the order the table stores them.
    pub(crate) const ALL: [Self; 7] = [
        Self::Keepalive,
        Self::CloseDeadline,
        Self::Linger,
        Self::Rearm,
        Self::Starving,
        Self::Recall,
        Self::PackFlush,
    ];

    fn index(self) -> usize {
        self as usize
    }

    /// Whether the transport acts when this timer expires (`Recall` and `Starving` are
    /// gates, looked at by what they gate: nothing happens at them, so nothing wakes for
    /// them).
    pub(crate) fn wakes(self) -> bool {
        !matches!(self, Self::Recall | Self::Starving)
    }
}

/// One endpoint's deadlines.
#[derive(Debug, Default, Clone)]
pub(crate) struct Timers {
    at: [Option<Instant>; Timer::ALL.len()],
    /// The earliest wake queued for the endpoint, if any (see [`TimerQueue`]).
    queued: Option<Instant>,
}

impl Timers {
    /// The deadline of `t`, if set.
    pub(crate) fn get(&self, t: Timer) -> Option<Instant> {
        self.at[t.index()]
    }

    /// Whether `t` is set and due at `now`.
    pub(crate) fn is_due(&self, t: Timer, now: Instant) -> bool {
        self.get(t).is_some_and(|at| at <= now)
    }

    /// Sets `t` to `at`. Returns the time to queue a wake for, when it is earlier than the
    /// endpoint's queued wake.
    #[must_use = "queue the wake it returns"]
    pub(crate) fn set(&mut self, t: Timer, at: Instant) -> Option<Instant> {
        self.at[t.index()] = Some(at);
        self.wake_for(t, at)
    }

    /// Clears `t`.
    pub(crate) fn clear(&mut self, t: Timer) {
        self.at[t.index()] = None;
    }

    /// Clears `t` and says whether it was due at `now`.
    pub(crate) fn take_due(&mut self, t: Timer, now: Instant) -> bool {
        let due = self.is_due(t, now);
        if due {
            self.clear(t);
        }
        due
    }

    /// The earliest deadline the transport acts on.
    pub(crate) fn next(&self) -> Option<Instant> {
        Timer::ALL
            .iter()
            .filter(|t| t.wakes())
            .filter_map(|&t| self.get(t))
            .min()
    }

    fn wake_for(&mut self, t: Timer, at: Instant) -> Option<Instant> {
        if !t.wakes() || self.queued.is_some_and(|q| q <= at) {
            return None;
        }
        self.queued = Some(at);
        Some(at)
    }

    /// The queued wake came up: the next one to queue, if any deadline is left.
    #[must_use = "queue the wake it returns"]
    pub(crate) fn requeue(&mut self) -> Option<Instant> {
        self.queued = self.next();
        self.queued
    }
}

/// When endpoints next need a look: (time, endpoint key, endpoint id).
#[derive(Debug, Default)]
pub(crate) struct TimerQueue {
    heap: BinaryHeap<Reverse<(Instant, usize, u64)>>,
}

impl TimerQueue {
    /// Queues a look at endpoint `key` (identified by `id`) at `at`.
    pub(crate) fn push(&mut self, at: Instant, key: usize, id: u64) {
        self.heap.push(Reverse((at, key, id)));
    }

    /// The earliest queued look.
    pub(crate) fn peek(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _, _))| *at)
    }

    /// The next look due at `now`: (key, id).
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<(usize, u64)> {
        match self.heap.peek() {
            Some(Reverse((at, _, _))) if *at <= now => {
                self.heap.pop().map(|Reverse((_, k, id))| (k, id))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_table_queues_only_earlier_wakes() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut t = Timers::default();
        assert_eq!(t.set(Timer::Keepalive, ms(100)), Some(ms(100)));
        assert_eq!(
            t.set(Timer::CloseDeadline, ms(200)),
            None,
            "later than the queued wake"
        );
        assert_eq!(t.set(Timer::PackFlush, ms(1)), Some(ms(1)));
        assert_eq!(t.set(Timer::Recall, ms(0)), None, "a gate wakes nobody");
        assert_eq!(t.next(), Some(ms(1)));
        assert!(t.take_due(Timer::PackFlush, ms(1)));
        assert!(!t.take_due(Timer::Keepalive, ms(1)));
        assert_eq!(t.requeue(), Some(ms(100)));
        assert_eq!(t.get(Timer::CloseDeadline), Some(ms(200)));
    }

    #[test]
    fn the_queue_pops_in_time_order_and_only_when_due() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut q = TimerQueue::default();
        q.push(ms(30), 3, 30);
        q.push(ms(10), 1, 10);
        q.push(ms(20), 2, 20);
        assert_eq!(q.peek(), Some(ms(10)));
        assert_eq!(q.pop_due(ms(5)), None);
        assert_eq!(q.pop_due(ms(25)), Some((1, 10)));
        assert_eq!(q.pop_due(ms(25)), Some((2, 20)));
        assert_eq!(q.pop_due(ms(25)), None);
        assert_eq!(q.peek(), Some(ms(30)));
    }
}
