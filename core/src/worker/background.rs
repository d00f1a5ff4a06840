//! The background thread: progress when no application thread polls, the transports'
//! timers, the device's asynchronous events. It sleeps on the completion channel (or, while
//! a leader sleeps there, on `bg_cond`) and never spins.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::wait::background_sleep;
use super::{Worker, WorkerState};

/// The longest the background thread sleeps with no timer due: it looks at whether it
/// should end at least this often.
const MAX_SLEEP: Duration = Duration::from_millis(100);

/// How long after an application thread's last progress call the background thread still
/// counts it as polling (and leaves the completion queues unarmed: arming them would wake
/// it at every completion, stealing the polling thread's CPU).
const APP_POLL_NS: u64 = 2_000_000;

impl Worker {
    /// One round of the background thread's duties, without sleeping: a progress round,
    /// the device's asynchronous events, the transports' timers due now (on the worker's
    /// clock). Returns now.
    fn duties(&self, st: &mut WorkerState) -> Instant {
        if self.progress_locked(st) > 0 {
            self.wake_all();
        }
        while let Some(ev) = self.shared.vctx.get_async_event(Duration::ZERO) {
            st.each(self, |t, cx| t.handle_event(cx, ev));
        }
        let now = self.now();
        st.each(self, |t, cx| t.handle_timer(cx, now));
        now
    }

    /// Does the background thread's work once, for a worker that has none (never
    /// [`start`](Self::start)ed): a simulation drives its workers with this, between moves
    /// of the virtual clock. Returns the next time a transport has timer work
    /// ([`next_timer`](Self::next_timer)).
    pub fn drive(&self) -> Option<Instant> {
        let mut st = self.lock();
        self.duties(&mut st);
        Self::next_timer_locked(&st)
    }

    /// When a transport next has timer work, if ever.
    pub fn next_timer(&self) -> Option<Instant> {
        Self::next_timer_locked(&self.lock())
    }

    fn next_timer_locked(st: &WorkerState) -> Option<Instant> {
        st.transports.iter().filter_map(|t| t.next_timer()).min()
    }
}

/// The background thread's loop. It ends once the application let go of the worker (every
/// [`WorkerHandle`](super::WorkerHandle) dropped), no message is alive and every transport
/// is idle; until then endpoints keep their duties (keepalives, answering and finishing
/// closes). (The transports go with the worker, once nothing holds it.)
pub(super) fn run(w: &Worker) {
    let sh = &*w.shared;
    while !sh.stop.load(Ordering::Acquire) {
        let sleep = {
            let mut st = sh.state.lock();
            st.core.bg_on_channel = false;
            st.core.bg_until = None;
            if sh.handle_gone.load(Ordering::Acquire)
                && sh.messages.load(Ordering::Acquire) == 0
                && st.transports.iter().all(|t| t.is_idle())
            {
                sh.stop.store(true, Ordering::Release);
                break;
            }
            // Sleep on the channel armed when no application thread is polling, or when one
            // is waiting for us to wake it. (Decided under the lock, where sleepers count
            // themselves: a sleeper counted just after an unlocked look used to leave the
            // queues unarmed, its own arm used up by a completion it took itself, and it
            // slept until our next timer.)
            let last_poll = sh.last_app_poll.load(Ordering::Relaxed);
            let idle = last_poll == super::NEVER_POLLED
                || w.now_nanos().saturating_sub(last_poll) > APP_POLL_NS
                || sh.sleepers.load(Ordering::Acquire) > 0;
            if idle {
                w.arm(&st);
            }
            let now = w.duties(&mut st);
            // (A transport's watch is for sleeping application threads; what the background
            // thread must look at, it says with its timers.)
            let until = Worker::next_timer_locked(&st)
                .unwrap_or(now + MAX_SLEEP)
                .min(now + MAX_SLEEP);
            // While application threads sleep on the channel (see `wait::Leader`), ours is
            // only the timers.
            if let Some((t, long)) = background_sleep(&st, now, until) {
                // Our progress call claimed the device's reception as a poller would (the
                // soft NIC then leaves it to us for 2 ms): hand it back before sleeping, or
                // the leader, parked on the sockets, would leave them alone that long.
                sh.vctx.yield_polling();
                st.core.bg_sleeps_long = long;
                st.core.bg_until = Some(t);
                sh.bg_cond.wait_until(&mut st, t);
                st.core.bg_sleeps_long = false;
                continue;
            }
            st.core.bg_on_channel = true;
            st.core.bg_until = Some(until);
            until.saturating_duration_since(now)
        };
        // (Sleeping on the channel ends our claim on reception: the soft provider parks us on
        // its sockets, or hands them to its engine thread. Without that, a packet that
        // arrived while we slept waited up to 2 ms for anybody to read it.)
        let _ = sh.channel.wait_spin(sleep, Duration::ZERO);
    }
}
