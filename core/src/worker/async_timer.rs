//! A delay future for the async waits that needs no runtime timer (feature `tokio`).
//!
//! Credits arrive by RDMA WRITE and raise no completion, so a waiting future looks again
//! after a short delay. `tokio::time` would make every runtime without `enable_time` panic
//! in `recv_async`; instead one process-wide thread keeps the deadlines and wakes the
//! futures. It blocks on a condition variable while nothing waits, so it costs nothing
//! when idle.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// A waker due at `at` (`seq` orders equal deadlines; wakers have no order).
struct Entry {
    at: Instant,
    seq: u64,
    waker: Waker,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

#[derive(Default)]
struct Timers {
    due: BinaryHeap<Reverse<Entry>>,
    seq: u64,
}

struct Wheel {
    timers: Mutex<Timers>,
    cond: Condvar,
}

/// The process-wide timer thread's state (started on first use).
fn wheel() -> &'static Wheel {
    static WHEEL: OnceLock<&'static Wheel> = OnceLock::new();
    WHEEL.get_or_init(|| {
        let w: &'static Wheel = Box::leak(Box::new(Wheel {
            timers: Mutex::new(Timers::default()),
            cond: Condvar::new(),
        }));
        let spawned = std::thread::Builder::new()
            .name("rdmx-async-timer".into())
            .spawn(move || run(w));
        if let Err(e) = spawned {
            // Delays then end at their first poll after the deadline (a wake-up from a
            // completion): slower, never stuck for long, as completions keep coming.
            tracing::warn!("cannot start the async timer thread: {e}");
        }
        w
    })
}

fn run(w: &'static Wheel) {
    let mut t = w.timers.lock();
    loop {
        let now = Instant::now();
        let mut fire = Vec::new();
        while t.due.peek().is_some_and(|Reverse(e)| e.at <= now) {
            if let Some(Reverse(e)) = t.due.pop() {
                fire.push(e.waker);
            }
        }
        if !fire.is_empty() {
            // Wake without the lock: a woken future may register again at once.
            drop(t);
            for waker in fire {
                waker.wake();
            }
            t = w.timers.lock();
            continue;
        }
        match t.due.peek().map(|Reverse(e)| e.at) {
            Some(at) => {
                w.cond.wait_until(&mut t, at);
            }
            None => w.cond.wait(&mut t),
        }
    }
}

/// Registers `waker` to be woken at `at`.
fn wake_at(at: Instant, waker: &Waker) {
    let w = wheel();
    let mut t = w.timers.lock();
    t.seq = t.seq.wrapping_add(1);
    let seq = t.seq;
    let earliest = t.due.peek().is_none_or(|Reverse(e)| at < e.at);
    t.due.push(Reverse(Entry {
        at,
        seq,
        waker: waker.clone(),
    }));
    if earliest {
        w.cond.notify_one();
    }
}

/// A future ready once `delay` has passed.
pub(crate) struct Delay {
    at: Instant,
    /// The waker registered last.
    registered: Option<Waker>,
}

impl Delay {
    pub(crate) fn new(delay: Duration) -> Self {
        Self {
            at: Instant::now() + delay,
            registered: None,
        }
    }
}

impl Future for Delay {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.at {
            return Poll::Ready(());
        }
        // Once per task: another poll from the same task keeps its registration (an
        // earlier one that fires later than needed is only a spurious wake-up).
        if !self
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            wake_at(self.at, cx.waker());
            self.registered = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_end_in_order_without_a_runtime_timer() {
        // A runtime without `enable_time`: tokio::time would panic here.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let start = Instant::now();
        rt.block_on(async {
            Delay::new(Duration::from_millis(20)).await;
            assert!(start.elapsed() >= Duration::from_millis(20));
            let (a, b) = (
                Delay::new(Duration::from_millis(30)),
                Delay::new(Duration::from_millis(10)),
            );
            b.await;
            let mid = start.elapsed();
            a.await;
            assert!(start.elapsed() >= mid);
        });
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}
