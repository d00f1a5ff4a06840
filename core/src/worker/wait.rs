//! How a blocking call waits: [`wait_until`] polls, spinning for the busy-poll time after
//! every change on what it waits for, then sleeps; the first thread to sleep leads
//! ([`Leader`]); spinning needs a slot ([`SpinSlot`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::MutexGuard;

use super::{Shared, TransportId, Worker, WorkerState};
use crate::{Error, Result};

/// Polls between two looks at the clock while spinning.
const CLOCK_EVERY: u32 = 16;

/// The longest sleep of a wait that polls for something no completion announces (credits
/// written into a mailbox, pool buffers, send-queue slots).
const POLLED_SLEEP: Duration = Duration::from_millis(5);

/// The longest sleep of a wait whose thread is woken when what it waits for happens (a
/// message, an endpoint going down): only a safety net, so that a thousand threads blocked
/// in `recv` do not wake up 200,000 times a second between them.
const NOTIFIED_SLEEP: Duration = Duration::from_secs(1);

/// How long the background thread leaves the channel to application threads after the last
/// one slept there (see [`Leader`]). As the soft provider's hand-off of its sockets.
pub(super) const HANDOFF: Duration = Duration::from_millis(2);

/// What a blocking call waits for: which condition variable it sleeps on (its endpoint's,
/// or the worker's), and whether a notification is sure to wake it.
#[derive(Debug, Clone, Copy)]
pub struct Wait {
    on: Option<(TransportId, usize)>,
    notified: bool,
}

impl Wait {
    /// A message (or the end) on endpoint `key` of transport `tid`: every arrival,
    /// completed read and state change of the endpoint notifies.
    pub fn message(tid: TransportId, key: usize) -> Self {
        Self {
            on: Some((tid, key)),
            notified: true,
        }
    }

    /// Something else of endpoint `key` (a credit, a send slot, an operation's completion),
    /// looked for again after each bounded sleep.
    pub fn endpoint(tid: TransportId, key: usize) -> Self {
        Self {
            on: Some((tid, key)),
            notified: false,
        }
    }

    /// A message of any endpoint of the worker (made ready by a completion, which wakes
    /// the worker's sleepers).
    pub const ANY_MESSAGE: Self = Self {
        on: None,
        notified: true,
    };

    /// Anything else of the worker (events, pool buffers).
    pub const WORKER: Self = Self {
        on: None,
        notified: false,
    };
}

/// Waits in a row that may be served by what was already there, without a progress round
/// (see [`wait_until`]).
const TAKES_BEFORE_POLL: u32 = 32;

/// Waits until `f` returns `Some`, driving progress: polls for the busy-poll time, then
/// sleeps (the background thread, or any thread that makes progress, wakes it).
/// `timeout = None` waits forever; the timeout counts from the first look that fails.
///
/// The busy-poll time counts from the first look that fails too, and again from every
/// change seen on what the wait is about (its endpoint's activity, or the worker's): a
/// request whose reply is being read, a message of ours that the peer just read, are signs
/// that what we wait for is on its way, and a thread that sleeps now pays a wake-up (tens
/// of microseconds here) in the middle of the exchange. Idle, nothing changes, and the
/// thread sleeps after one busy-poll time.
///
/// A wait for something of one endpoint ([`Wait::message`], [`Wait::endpoint`]) sleeps on
/// that endpoint's condition variable, which only what happens on that endpoint notifies
/// ([`Cx::touch`](super::Cx::touch)); other waits sleep on the worker's. A thousand threads
/// blocked on their own endpoints are then not all woken by every completion.
///
/// # Errors
/// `Timeout` when `timeout` passes first; otherwise what `f` returns.
pub fn wait_until<T>(
    w: &Worker,
    wait: Wait,
    timeout: Option<Duration>,
    mut f: impl FnMut(&mut WorkerState) -> Option<Result<T>>,
) -> Result<T> {
    let sh = &*w.shared;
    // The clock is read only once a look has failed (a call that finds what it wants at
    // once reads it only for the poll stamp): at a million messages a second, each read
    // (~22 ns here) is a percent of the time. The timeout counts from `start`, the spin
    // from `spin_from` (reset to `None` by activity).
    let mut start: Option<Instant> = None;
    let mut spin_from: Option<Instant> = None;
    let mut seen: Option<u32> = None;
    // A notified wait sleeps until it is woken; a polled one looks again after 100 µs, then
    // less and less often.
    let mut sleep = if wait.notified {
        NOTIFIED_SLEEP
    } else {
        Duration::from_micros(100)
    };
    // Reading the clock costs about as much as an empty poll here, so the spin looks at it
    // only every few polls.
    let mut polls = 0u32;
    // The busy-poll time applies while the thread holds one of the worker's spin slots
    // (see `SpinSlot`); without one it sleeps at once.
    let mut slot = SpinSlot::none(sh);
    let mut lead = Leader::default();
    {
        // What is already there (the rest of a packed frame, the answers of a burst) is
        // taken without a progress round first: a round is a look at the device (a system
        // call on the soft provider) that finds nothing while a burst is being taken. At
        // most `TAKES_BEFORE_POLL` waits in a row are served so.
        let mut st = sh.state.lock();
        if st.core.unpolled_takes < TAKES_BEFORE_POLL
            && let Some(r) = f(&mut st)
        {
            st.core.unpolled_takes += 1;
            return r;
        }
    }
    loop {
        {
            let mut st = sh.state.lock();
            if polls.is_multiple_of(CLOCK_EVERY) {
                w.stamp_app_poll();
            }
            if w.progress_locked(&mut st) > 0 {
                w.wake_all();
            }
            if let Some(r) = f(&mut st) {
                return lead.end(sh, &mut st, r);
            }
            // A thread that waits inside a send batch of its own first sends what the batch
            // holds (what it waits for may be the answer to it). A look that may not wait
            // (a zero timeout: draining what came in) keeps it.
            if polls == 0 && timeout != Some(Duration::ZERO) && w.batch_open() {
                w.flush_batches(&mut st);
            }
            let act = st.activity(wait.on);
            if seen.is_some_and(|s| s != act) {
                spin_from = None;
            }
            seen = Some(act);
            polls = polls.wrapping_add(1);
            if !polls.is_multiple_of(CLOCK_EVERY) && spin_from.is_some() {
                drop(st);
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            let begun = *start.get_or_insert(now);
            let spinning = *spin_from.get_or_insert_with(|| {
                // (Re)starting to spin: only with a slot.
                if !slot.held {
                    slot = SpinSlot::take(sh);
                }
                now
            });
            // (Durations compared, not instants added: a timeout of `Duration::MAX` waits.)
            let waited = now - begun;
            if let Some(t) = timeout
                && waited >= t
            {
                return lead.end(sh, &mut st, Err(Error::Timeout(waited)));
            }
            let busy = if slot.held {
                sh.cfg.busy_poll
            } else {
                Duration::ZERO
            };
            if now - spinning >= busy {
                slot.release();
                // Sleep: arm the completion queues, look once more to close the race, then
                // wait. What arrives by RDMA WRITE raises no completion, so the sleep is
                // also bounded.
                w.arm(&st);
                if w.progress_locked(&mut st) > 0 {
                    w.wake_all();
                }
                if let Some(r) = f(&mut st) {
                    return lead.end(sh, &mut st, r);
                }
                let mut t = sleep;
                if let Some(timeout) = timeout {
                    t = t.min(timeout.saturating_sub(waited));
                }
                // While a transport watches for what no completion announces, one sleeping
                // thread at a time wakes at its interval to make progress. The others sleep
                // until notified.
                let watch = Worker::watch(&st);
                let watcher = watch.is_some() && !st.core.watcher_asleep;
                if let Some(every) = watch.filter(|_| watcher) {
                    st.core.watcher_asleep = true;
                    t = t.min(every);
                }
                sh.sleepers.fetch_add(1, Ordering::AcqRel);
                if lead.take(sh, &mut st) {
                    // (Sleeping on the channel, the soft provider's parked poller receives
                    // the device's packets on this thread: see `CompletionChannel::wait`.)
                    lead.sleep(sh, &mut st, wait.on, t);
                } else {
                    // Stop claiming the device's reception, so that whoever receives while
                    // nobody polls (the leader, or the soft provider's engine thread) does.
                    sh.vctx.yield_polling();
                    sleep_on_condvar(sh, &mut st, wait.on, t);
                }
                if watcher {
                    st.core.watcher_asleep = false;
                }
                sh.sleepers.fetch_sub(1, Ordering::AcqRel);
                let cap = if wait.notified {
                    NOTIFIED_SLEEP
                } else {
                    POLLED_SLEEP
                };
                sleep = (sleep * 2).min(cap);
                continue;
            }
        }
        std::hint::spin_loop();
    }
}

/// Sleeps up to `t` on the condition variable of endpoint `on` (or the worker's).
fn sleep_on_condvar(
    sh: &Shared,
    st: &mut MutexGuard<'_, WorkerState>,
    on: Option<(TransportId, usize)>,
    t: Duration,
) {
    let own = on.and_then(|(tid, key)| st.wait_slot(tid, key)).map(|s| {
        s.sleepers += 1;
        Arc::clone(&s.cond)
    });
    match &own {
        Some(cond) => {
            cond.wait_for(st, t);
        }
        None => {
            sh.cond.wait_for(st, t);
        }
    }
    // (The condition variable tells whether the slot still belongs to the same endpoint:
    // a new endpoint in the same slot has a new one.)
    if let Some(cond) = own
        && let Some(s) = on.and_then(|(tid, key)| st.wait_slot(tid, key))
        && Arc::ptr_eq(&s.cond, &cond)
    {
        s.sleepers -= 1;
    }
}

/// The leader: of the threads blocked in [`wait_until`], the first that sleeps does so on
/// the completion channel, in the background thread's place, and keeps that place until its
/// wait ends; the others sleep on condition variables.
///
/// Without it, a message for a sleeping thread took three wake-ups in a row: the soft NIC's
/// engine thread (the packet), the background thread (the channel), then the application
/// thread (its condition variable), at ~15-25 us each here. The leader is woken by the
/// channel itself, and on the soft provider by the packet (it receives the device's packets
/// while it sleeps on the channel: `CompletionChannel::wait`).
///
/// Completions wake the leader through the channel (it arms the queues before it sleeps, as
/// every sleeper does). What wakes sleepers without a completion (an endpoint failing at a
/// keepalive tick, a close, a mailbox credit seen by another thread) interrupts the
/// leader's sleep when it concerns what the leader waits for
/// ([`Cx::nudge_leader`](super::Cx::nudge_leader), [`Worker::wake_all`]).
///
/// The background thread stays off the channel while there is a leader, and for
/// [`HANDOFF`] after the last one left: a thread whose message just came usually waits
/// again soon, and moving the background thread on and off the channel at every message
/// cost two of its wake-ups per message, which took the CPU from the threads exchanging
/// them (one-way latency of 100 KB messages, 25 % of them at 120-250 us instead of 40).
/// So it looks again [`HANDOFF`] into each sleep of the leader (and after one left), and
/// sleeps until its next timer when the leader is still asleep then; a leader whose wait
/// ends wakes it only then, or when other threads wait (they need someone on the channel
/// now). A leader that finds the background thread on the channel interrupts it once, so
/// that it moves off.
#[derive(Debug, Default)]
struct Leader {
    held: bool,
}

impl Leader {
    /// Takes the leadership if nobody holds it; true when this thread leads.
    fn take(&mut self, sh: &Shared, st: &mut WorkerState) -> bool {
        if !self.held && !st.core.leader {
            st.core.leader = true;
            self.held = true;
            if st.core.bg_on_channel {
                sh.channel.interrupt();
            }
        }
        self.held
    }

    /// Sleeps on the completion channel for up to `t`, waiting for endpoint `on` (or the
    /// worker).
    fn sleep(
        &self,
        sh: &Shared,
        st: &mut MutexGuard<'_, WorkerState>,
        on: Option<(TransportId, usize)>,
        t: Duration,
    ) {
        st.core.leader_asleep = Some(on);
        st.core.leader_slept_at = Some(Instant::now());
        if on.is_none() {
            sh.leader_waits_any.store(true, Ordering::Release);
        }
        MutexGuard::unlocked(st, || {
            let _ = sh.channel.wait_spin(t, Duration::ZERO);
        });
        st.core.leader_asleep = None;
        sh.leader_waits_any.store(false, Ordering::Release);
    }

    /// The wait ends with `r`: gives the leadership back.
    fn end<T>(&mut self, sh: &Shared, st: &mut WorkerState, r: T) -> T {
        if self.held {
            self.held = false;
            st.core.leader = false;
            st.core.leader_slept_at = Some(Instant::now());
            if st.core.bg_sleeps_long || sh.sleepers.load(Ordering::Acquire) > 0 {
                sh.bg_cond.notify_one();
            }
        }
        r
    }
}

/// Where the background thread sleeps next (see [`Leader`]): on the channel (`None`), or on
/// `bg_cond` until the returned instant (and whether that is a long sleep, which a leader
/// whose wait ends must interrupt). `until` is when its own timers want it.
pub(super) fn background_sleep(
    st: &WorkerState,
    now: Instant,
    until: Instant,
) -> Option<(Instant, bool)> {
    let look = st
        .core
        .leader_slept_at
        .map(|t| t + HANDOFF)
        .filter(|&l| l > now);
    match (st.core.leader, look) {
        (_, Some(l)) => Some((l.min(until), false)),
        (true, None) => Some((until, true)),
        (false, None) => None,
    }
}

/// A thread's right to busy-poll a worker. Spinning helps only while there are CPUs to spin
/// on: with a thousand threads blocked in one context on two CPUs, each spinning 50 us
/// before it sleeps took the CPU from the threads with work to do (the server thread of
/// `examples/many_clients.rs`). A worker has eight slots per CPU; a waiting thread that
/// finds none free sleeps at once. (One per CPU helped the thousand threads as much but
/// made 64 client threads 20-40 % slower; eight per CPU left those as they were.)
struct SpinSlot<'a> {
    sh: &'a Shared,
    held: bool,
}

impl<'a> SpinSlot<'a> {
    fn none(sh: &'a Shared) -> Self {
        Self { sh, held: false }
    }

    fn take(sh: &'a Shared) -> Self {
        let held = sh
            .spinners
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < sh.spin_slots).then_some(n + 1)
            })
            .is_ok();
        Self { sh, held }
    }

    fn release(&mut self) {
        if self.held {
            self.held = false;
            self.sh.spinners.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for SpinSlot<'_> {
    fn drop(&mut self) {
        self.release();
    }
}
