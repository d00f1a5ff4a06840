//! Waiting and the context's own threads: `wait_until` (how a blocking call polls, then
//! sleeps), the background thread (progress when no application thread polls, keepalives,
//! device events, path re-arming) and the pack flusher (packed frames of send batches go
//! within `PACK_HOLD`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::MutexGuard;
use rdmx_core::{Error, Event, Result};
use rdmx_verbs::AsyncEvent;

use crate::shared::{Shared, State};

/// Polls between two looks at the clock while spinning.
const CLOCK_EVERY: u32 = 16;

/// The longest sleep of a wait that polls for something no completion announces (credits
/// written into the mailbox, pool buffers, send-queue slots).
const POLLED_SLEEP: Duration = Duration::from_millis(5);

/// The longest sleep of a wait whose thread is woken when what it waits for happens (a
/// message, an endpoint going down): only a safety net, so that a thousand threads blocked
/// in `recv` do not wake up 200,000 times a second between them.
const NOTIFIED_SLEEP: Duration = Duration::from_secs(1);

/// What a blocking call waits for: which condition variable it sleeps on (its endpoint's,
/// or the context's), and whether a notification is sure to wake it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wait {
    on: Option<usize>,
    notified: bool,
}

impl Wait {
    /// A message (or the end) on endpoint `k`: every arrival, completed read and state
    /// change of the endpoint notifies.
    pub(crate) fn message(k: usize) -> Self {
        Self {
            on: Some(k),
            notified: true,
        }
    }

    /// Something else of endpoint `k` (a credit, a send slot, an operation's completion),
    /// looked for again after each bounded sleep.
    pub(crate) fn endpoint(k: usize) -> Self {
        Self {
            on: Some(k),
            notified: false,
        }
    }

    /// A message of any endpoint of the context (made ready by a completion, which wakes
    /// the context's sleepers).
    pub(crate) const ANY_MESSAGE: Self = Self {
        on: None,
        notified: true,
    };

    /// Anything else of the context (events, pool buffers).
    pub(crate) const CONTEXT: Self = Self {
        on: None,
        notified: false,
    };
}

impl Wait {
    /// The activity counter of what this wait is about (see `Shared::stir`).
    fn activity(self, st: &State) -> u32 {
        match self.on {
            Some(k) => st.eps.get(k).map_or(0, |ep| ep.activity),
            None => st.activity,
        }
    }
}

/// Waits until `f` returns `Some`, driving progress: polls for the busy-poll time, then
/// sleeps (the background thread, or any thread that makes progress, wakes it).
/// `timeout = None` waits forever; the timeout counts from the first look that fails.
///
/// The busy-poll time counts from the first look that fails too, and again from every
/// change seen on what the wait is about (its endpoint's activity, or the context's): a
/// request whose reply is being read, a message of ours that the peer just read, are signs
/// that what we wait for is on its way, and a thread that sleeps now pays a wake-up (tens
/// of microseconds here) in the middle of the exchange. Idle, nothing changes, and the
/// thread sleeps after one busy-poll time as before.
///
/// A wait for something of one endpoint ([`Wait::message`], [`Wait::endpoint`]) sleeps on
/// that endpoint's condition variable, which only what happens on that endpoint notifies
/// (`Shared::touch`); other waits sleep on the context's. A thousand threads blocked on
/// their own endpoints are then not all woken by every completion of the context.
pub(crate) fn wait_until<T>(
    sh: &Shared,
    wait: Wait,
    timeout: Option<Duration>,
    mut f: impl FnMut(&mut State) -> Option<Result<T>>,
) -> Result<T> {
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
    // The busy-poll time applies while the thread holds one of the context's spin slots
    // (see `SpinSlot`); without one it sleeps at once.
    let mut slot = SpinSlot::none(sh);
    let mut lead = Leader::default();
    loop {
        {
            let mut st = sh.state.lock();
            if polls.is_multiple_of(CLOCK_EVERY) {
                sh.last_app_poll.store(sh.now_nanos(), Ordering::Relaxed);
            }
            if sh.progress(&mut st) > 0 {
                sh.wake_all();
            }
            if let Some(r) = f(&mut st) {
                return lead.end(sh, &mut st, r);
            }
            let act = wait.activity(&st);
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
                // Sleep: arm the completion queue (the background thread sleeps on its
                // channel), look once more to close the race, then wait. Credits that arrive
                // by RDMA WRITE raise no completion, so the sleep is also bounded.
                sh.cq.req_notify(false);
                if sh.progress(&mut st) > 0 {
                    sh.wake_all();
                }
                if let Some(r) = f(&mut st) {
                    return lead.end(sh, &mut st, r);
                }
                let mut t = sleep;
                if let Some(timeout) = timeout {
                    t = t.min(timeout.saturating_sub(waited));
                }
                // While every buffer is promised, one sleeping thread wakes every scan
                // interval to look at the starving flags (see `recall.rs`): a starving
                // sender's flag notifies nobody, and the background thread may have backed
                // off to its tick. The others sleep until notified.
                let scarce = st.budget.spare() == 0 && !st.needy.is_empty();
                let watcher = (scarce || st.recall_pressure) && !st.watcher_asleep;
                if watcher {
                    st.watcher_asleep = true;
                    let every = if st.recall_pressure {
                        crate::recall::PRESSURE_SCAN
                    } else {
                        crate::recall::WATCH_SCAN
                    };
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
                    // (The endpoint's id tells whether its slot still holds it afterwards.)
                    let on = wait.on;
                    let own = on.and_then(|k| st.eps.get_mut(k)).map(|ep| {
                        ep.sleepers += 1;
                        (ep.id, Arc::clone(&ep.cond))
                    });
                    match &own {
                        Some((_, cond)) => {
                            cond.wait_for(&mut st, t);
                        }
                        None => {
                            sh.cond.wait_for(&mut st, t);
                        }
                    }
                    if let Some((id, _)) = own
                        && let Some(ep) = on.and_then(|k| st.eps.get_mut(k))
                        && ep.id == id
                    {
                        ep.sleepers -= 1;
                    }
                }
                if watcher {
                    st.watcher_asleep = false;
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

/// The leader: of the threads blocked in [`wait_until`], the first that sleeps does so on
/// the completion channel, in the background thread's place, and keeps that place until its
/// wait ends; the others sleep on condition variables as before.
///
/// Without it, a message for a sleeping thread took three wake-ups in a row: the soft NIC's
/// engine thread (the packet), the background thread (the channel), then the application
/// thread (its condition variable), at ~15-25 us each here. The leader is woken by the
/// channel itself, and on the soft provider by the packet (it receives the device's packets
/// while it sleeps on the channel: `CompletionChannel::wait`).
///
/// Completions wake the leader through the channel (it arms the queue before it sleeps, as
/// every sleeper does). What wakes sleepers without a completion (an endpoint failing at a
/// keepalive tick, a close, a mailbox credit seen by another thread) interrupts the
/// leader's sleep when it concerns what the leader waits for (`Shared::nudge_leader`,
/// `Shared::wake_all`).
///
/// The background thread stays off the channel while there is a leader, and for
/// [`HANDOFF`] after the last one left: a thread whose message just came usually waits
/// again soon, and moving the background thread on and off the channel at every message
/// cost two of its wake-ups per message, which took the CPU from the threads exchanging
/// them (one-way latency of 100 KB messages, 25 % of them at 120-250 us instead of 40).
/// So it looks again [`HANDOFF`] into each sleep of the leader (and after one left), and
/// sleeps until its tick when the leader is still asleep then; a leader whose wait ends
/// wakes it only then, or when other threads wait (they need someone on the channel now).
/// A leader that finds the background thread on the channel interrupts it once, so that it
/// moves off.
#[derive(Debug, Default)]
struct Leader {
    held: bool,
}

/// How long the background thread leaves the channel to application threads after the last
/// one slept there (see [`Leader`]). As the soft provider's hand-off of its sockets.
const HANDOFF: Duration = Duration::from_millis(2);

impl Leader {
    /// Takes the leadership if nobody holds it; true when this thread leads.
    fn take(&mut self, sh: &Shared, st: &mut State) -> bool {
        if !self.held && !st.leader {
            st.leader = true;
            self.held = true;
            if st.bg_on_channel {
                sh.cq.channel().interrupt();
            }
        }
        self.held
    }

    /// Sleeps on the completion channel for up to `t`, waiting for endpoint `on` (or the
    /// context).
    fn sleep(&self, sh: &Shared, st: &mut MutexGuard<'_, State>, on: Option<usize>, t: Duration) {
        st.leader_asleep = Some(on);
        st.leader_slept_at = Some(Instant::now());
        if on.is_none() {
            sh.leader_waits_any.store(true, Ordering::Release);
        }
        MutexGuard::unlocked(st, || {
            let _ = sh.cq.channel().wait_spin(t, Duration::ZERO);
        });
        st.leader_asleep = None;
        sh.leader_waits_any.store(false, Ordering::Release);
    }

    /// The wait ends with `r`: gives the leadership back.
    fn end<T>(&mut self, sh: &Shared, st: &mut State, r: T) -> T {
        if self.held {
            self.held = false;
            st.leader = false;
            st.leader_slept_at = Some(Instant::now());
            if st.bg_sleeps_long || sh.sleepers.load(Ordering::Acquire) > 0 {
                sh.bg_cond.notify_one();
            }
        }
        r
    }
}

/// Where the background thread sleeps next (see [`Leader`]): on the channel, or on
/// `bg_cond` until the returned instant (and whether that is a long sleep, which a leader
/// whose wait ends must interrupt).
fn background_sleep(st: &State, now: Instant, tick: Duration) -> Option<(Instant, bool)> {
    let look = st.leader_slept_at.map(|t| t + HANDOFF).filter(|&l| l > now);
    match (st.leader, look) {
        (true, Some(l)) => Some((l.min(now + tick), false)),
        (true, None) => Some((now + tick, true)),
        (false, Some(l)) => Some((l.min(now + tick), false)),
        (false, None) => None,
    }
}

/// A thread's right to busy-poll a context. Spinning helps only while there are CPUs to
/// spin on: with a thousand threads blocked in one context on two CPUs, each spinning
/// 50 us before it sleeps took the CPU from the threads with work to do (the server thread
/// of `examples/many_clients.rs`). A context has eight slots per CPU; a waiting thread
/// that finds none free sleeps at once. (One per CPU helped the thousand threads as much
/// but made 64 client threads 20-40 % slower; eight per CPU left those as they were:
/// docs/MESSAGING.md, "Progress and waiting".)
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

/// The pack flusher: posts packed frames that stayed open `PACK_HOLD` (a thread holding a
/// send batch while it blocks on something other than rdmx). It sleeps on its condition
/// variable without a timeout while no frame is open, so an idle context or one that never
/// batches pays nothing; while frames keep opening it wakes once per `PACK_HOLD`.
pub(crate) fn pack_flusher(sh: &Shared) {
    let mut st = sh.state.lock();
    while !sh.stop.load(Ordering::Acquire) {
        match st.pack_due {
            None => sh.pack_cond.wait(&mut st),
            Some(due) => {
                if Instant::now() < due {
                    sh.pack_cond.wait_until(&mut st, due);
                    continue;
                }
                st.pack_due = None;
                if !st.packs.is_empty() {
                    sh.flush_packs(&mut st);
                    if !st.packs.is_empty() {
                        // No send slot now: look again soon.
                        st.pack_due = Some(Instant::now() + crate::send::PACK_HOLD);
                    }
                }
            }
        };
    }
}

/// The context's own threads, which hold it too: the background thread and the pack
/// flusher.
const CONTEXT_THREADS: usize = 2;

/// The background thread: progress when no application thread polls, keepalives, device
/// events. It sleeps on the completion channel and never spins.
pub(crate) fn background(sh: &Arc<Shared>) {
    let tick = sh.keepalive_tick();
    let mut next_keepalive = Instant::now() + tick;
    let mut sleep;
    while !sh.stop.load(Ordering::Acquire) {
        // Done once the application let go of everything: no context handle, no endpoint
        // or message (only this thread and the pack flusher hold the context), and every
        // endpoint closed and reaped. Until then endpoints keep their duties.
        if sh.handle_gone.load(Ordering::Acquire)
            && Arc::strong_count(sh) <= CONTEXT_THREADS
            && sh.state.lock().eps.is_empty()
        {
            sh.stop.store(true, Ordering::Release);
            let _st = sh.state.lock();
            sh.pack_cond.notify_all();
            break;
        }
        {
            let mut st = sh.state.lock();
            st.bg_on_channel = false;
            // Sleep on the completion channel armed when no application thread is polling, or
            // when one is waiting for us to wake it.
            let idle = sh
                .now_nanos()
                .saturating_sub(sh.last_app_poll.load(Ordering::Relaxed))
                > 2_000_000
                || sh.sleepers.load(Ordering::Acquire) > 0;
            if idle {
                sh.cq.req_notify(false);
            }
            if sh.progress(&mut st) > 0 {
                sh.wake_all();
            }
            while let Some(ev) = sh.vctx.get_async_event(Duration::ZERO) {
                match &sh.node {
                    // The contexts of a node share its device: every one of them hears
                    // every event and acts on what concerns it.
                    Some(n) => n.share_event(ev),
                    None => on_async_event(sh, &mut st, ev),
                }
            }
            let mine: Vec<AsyncEvent> = sh.node_events.lock().drain(..).collect();
            for ev in mine {
                on_async_event(sh, &mut st, ev);
            }
            let now = Instant::now();
            // (The quicker looks at the starving flags between ticks happen in the progress
            // call above, `Shared::after`, once they are due.)
            if now >= next_keepalive {
                rearm(sh, &mut st, None);
                crate::conn::keepalive(sh, &mut st, now);
                next_keepalive = now + tick;
                st.recall_scanned_at = Some(now);
            }
            sleep = if st.recall_pressure {
                crate::recall::PRESSURE_SCAN.min(tick)
            } else if st.recall_watch {
                st.recall_watch_every.min(tick)
            } else {
                tick
            };
        }
        // While application threads sleep on the channel (see `Leader`), ours is only the
        // timers.
        {
            let mut st = sh.state.lock();
            if let Some((until, long)) = background_sleep(&st, Instant::now(), sleep) {
                // Our progress call claimed the device's reception as a poller would (the
                // soft NIC then leaves it to us for 2 ms): hand it back before sleeping, or
                // the leader, parked on the sockets, would leave them alone that long.
                sh.vctx.yield_polling();
                st.bg_sleeps_long = long;
                sh.bg_cond.wait_until(&mut st, until);
                st.bg_sleeps_long = false;
                continue;
            }
            st.bg_on_channel = true;
        }
        // (Sleeping on the channel ends our claim on reception: the soft provider parks us on
        // its sockets, or hands them to its engine thread. Without that, a packet that
        // arrived while we slept waited up to 2 ms for anybody to read it: message latency
        // without busy polling had a p99 of 1.1 ms.)
        // While an application thread polls, stay asleep for a whole tick: a thread that
        // stops polling to sleep arms the completion queue first, which wakes us at once,
        // and waking up more often only steals the polling thread's CPU. While a peer
        // starves for credits, look again sooner.
        let _ = sh.cq.channel().wait_spin(sleep, Duration::ZERO);
    }
    // The context is going away: endpoints that still exist keep working through their own
    // progress calls.
}

/// Loads the path an endpoint migrated away from as its new alternate, once that path's
/// local port is active and a tick has passed since the migration (`port`: a port that just
/// became active; `None`: check them all). Called on every tick and on `PortActive`.
fn rearm(sh: &Shared, st: &mut State, port: Option<u8>) {
    let mut rearmed = Vec::new();
    for (_, ep) in st.eps.iter_mut() {
        let (Some(p), Some(paths)) = (ep.rearm_port, &ep.paths) else {
            continue;
        };
        if port.is_some_and(|q| q != p) || !matches!(ep.status, crate::ep::Status::Open) {
            continue;
        }
        if ep.rearm_after.is_some_and(|t| Instant::now() < t) {
            continue;
        }
        let up = sh
            .vctx
            .query_port(p)
            .is_ok_and(|a| a.state == rdmx_verbs::PortState::Active);
        if !up {
            continue;
        }
        // Port 1 reaches the peer's primary address, port 2 its alternate.
        let target = &paths[usize::from(p) - 1];
        match crate::conn::load_alternate(sh, &ep.qp, target, p) {
            Ok(()) => {
                ep.rearm_port = None;
                rearmed.push(ep.id);
            }
            Err(e) => tracing::debug!(endpoint = ep.id, "re-arming failed: {e}"),
        }
    }
    for endpoint in rearmed {
        st.events.push(Event::PathRearmed { endpoint });
    }
}

fn on_async_event(sh: &Shared, st: &mut State, ev: AsyncEvent) {
    match ev {
        AsyncEvent::SrqLimitReached(_) => {
            sh.after(st);
            let _ = sh.srq.arm_limit((sh.cfg.srq_depth / 4).max(1));
        }
        AsyncEvent::PathMigrated(qpn) => {
            // The queue pair an endpoint sends on (its RC QP, or a shared XRC initiator):
            // every endpoint on it moved. (A node's XRC target QPs migrate on their own;
            // the endpoints hear of it through their initiators.)
            let mut any = false;
            for (_, ep) in st.eps.iter_mut().filter(|(_, e)| e.qpn == qpn.0) {
                ep.on_alt = !ep.on_alt;
                // The path left behind leaves from port 1 when we are now on the alternate.
                ep.rearm_port = Some(if ep.on_alt { 1 } else { 2 });
                ep.rearm_after = Some(Instant::now() + sh.keepalive_tick());
                tracing::info!(endpoint = ep.id, "path migrated");
                st.events.push(Event::PathMigrated { endpoint: ep.id });
                any = true;
            }
            if any {
                sh.wake_all();
            }
        }
        AsyncEvent::PortActive(port) => rearm(sh, st, Some(port)),
        AsyncEvent::SrqError(srq) if srq == sh.srq.handle() => {
            // Nothing can arrive any more: the receive queue every endpoint shares is gone
            // (for a node shared by processes, the process hosting its domain went away).
            tracing::warn!("the context's shared receive queue failed; every endpoint is down");
            let keys: Vec<usize> = st.eps.iter().map(|(k, _)| k).collect();
            for k in keys {
                sh.fail(
                    st,
                    k,
                    rdmx_core::DisconnectCause::TransportError(
                        "the context's shared receive queue failed (SrqError; on a node \
                         shared by processes, its domain's host went away)"
                            .into(),
                    ),
                );
            }
            sh.wake_all();
        }
        AsyncEvent::QpFatal(qpn)
        | AsyncEvent::QpAccessError(qpn)
        | AsyncEvent::QpRequestError(qpn) => {
            // The completion that says why (retries exhausted: the peer is unreachable)
            // came before the event: take it first, so that the endpoint goes down with
            // that cause rather than this generic one.
            if sh.progress(st) > 0 {
                sh.wake_all();
            }
            if let Some(&k) = st.by_qpn.get(&qpn.0) {
                sh.fail(
                    st,
                    k,
                    rdmx_core::DisconnectCause::TransportError(format!("{ev:?}")),
                );
            }
        }
        other => tracing::debug!(event = ?other, "device event"),
    }
}
