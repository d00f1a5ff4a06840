//! The engine thread, and the handoff of reception between it and the threads that poll:
//! a polling thread claims the sockets for [`HANDOFF_NS`]; otherwise the engine thread
//! sleeps in `poll(2)` on the sockets, the wake-up eventfd and the next timer.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{HANDOFF_NS, Shared, sys};

impl Shared {
    /// Called by a thread polling a CQ: claims reception for a while and makes progress.
    pub(crate) fn progress(&self) -> usize {
        self.flush_held();
        let now = self.now();
        self.last_poll.store(now.max(1), Ordering::Relaxed);
        self.drain_at(now) + self.xrc.poll_members()
    }

    /// Called before a poller goes to sleep: hands reception back now, to the parked thread
    /// if there is one (see [`park`](Self::park)), else to the engine thread.
    pub(crate) fn release(&self) {
        self.flush_held();
        self.last_poll.store(0, Ordering::Relaxed);
        // (Against the parked thread's store of `parker_waits_claim` and load of our claim:
        // one of us sees the other.)
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.parker.load(Ordering::Acquire) {
            if self.parker_waits_claim.load(Ordering::Acquire) {
                self.park_wake.signal();
            }
        } else {
            self.wake.signal();
        }
        self.xrc.wake_members();
    }

    /// Sleeps until `fd` (a completion channel's) is readable or `timeout` passes, and
    /// meanwhile receives this device's packets on the calling thread: the parked poller.
    ///
    /// A thread that sleeps on a channel because it waits for a completion is woken by the
    /// packet that causes it, with no hand-off: otherwise the engine thread wakes for the
    /// packet and then wakes the sleeper through the channel, two wake-ups in a row (~15-25
    /// us each here) where hardware raises one interrupt. The engine thread keeps the
    /// timers and stays off the sockets while a thread is parked; one thread parks at a
    /// time (another sleeps on its fd alone), and none does on a member of a shared XRC
    /// domain (its member links have reader threads of their own).
    ///
    /// A parked thread leaves the sockets to a thread that polls (a claim younger than
    /// [`HANDOFF_NS`]) and takes them back when that thread stops (`release`) or its claim
    /// lapses. Its own claim ends as it parks. When it leaves, it claims reception like a
    /// poller (it usually polls again soon), and the engine thread takes over if it does not.
    pub(crate) fn park(&self, fd: RawFd, timeout: Duration) -> std::io::Result<()> {
        if self.xrc.is_member() || self.parker.swap(true, Ordering::AcqRel) {
            self.release();
            sys::poll_readable(&[fd], Some(timeout))?;
            return Ok(());
        }
        let _parked = Parked(self);
        self.flush_held();
        let start = self.now();
        self.last_poll.store(0, Ordering::Relaxed);
        self.parked_since.store(start.max(1), Ordering::Release);
        let mut fds = Vec::with_capacity(2 + self.sockets.len());
        loop {
            let now = self.now();
            let left = timeout.saturating_sub(Duration::from_nanos(now - start));
            if left.is_zero() {
                return Ok(());
            }
            // Say we would wait for a claim before looking at it (see `release`).
            self.parker_waits_claim.store(true, Ordering::Release);
            std::sync::atomic::fence(Ordering::SeqCst);
            let claim = self.poller_remaining();
            if claim.is_none() {
                self.parker_waits_claim.store(false, Ordering::Release);
            }
            fds.clear();
            fds.extend([fd, self.park_wake.raw()]);
            if claim.is_none() {
                fds.extend(self.sockets.iter().map(AsRawFd::as_raw_fd));
                fds.extend(self.groups.lock().iter().map(|g| g.sock.as_raw_fd()));
            }
            let t = claim.map_or(left, |c| c.min(left));
            let ready = sys::poll_readable(&fds, Some(t))?;
            if ready.first().copied().unwrap_or(false) {
                return Ok(());
            }
            if ready.get(1).copied().unwrap_or(false) {
                self.park_wake.drain();
            }
            if ready.iter().skip(2).any(|&r| r) {
                // What the packets complete signals `fd` if its CQ is armed: the next poll
                // returns at once.
                for _ in 0..64 {
                    if self.drain() == 0 {
                        break;
                    }
                }
            }
        }
    }

    /// While an application thread is polling (it claimed reception less than
    /// [`HANDOFF_NS`] ago), how much longer its claim lasts.
    pub(crate) fn poller_remaining(&self) -> Option<Duration> {
        let last = self.last_poll.load(Ordering::Relaxed);
        let left = (last + HANDOFF_NS).checked_sub(self.now())?;
        (last != 0 && left > 0).then(|| Duration::from_nanos(left))
    }

    /// Next engine deadline (timers and delayed fault-injected frames).
    pub(super) fn next_deadline(&self) -> Option<u64> {
        let t = self.nic.lock().poll_timeout();
        let f = self.faults.as_ref().and_then(|f| f.lock().poll_timeout());
        match (t, f) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Ends a park (see [`Shared::park`]).
struct Parked<'a>(&'a Shared);

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        let sh = self.0;
        let now = sh.now();
        sh.last_poll.store(now.max(1), Ordering::Relaxed);
        sh.parker_waits_claim.store(false, Ordering::Release);
        sh.parker.store(false, Ordering::Release);
        // The engine thread takes reception over once this claim lapses: it must be awake
        // then (it sleeps until its timers alone during a long park). (Against its store of
        // `engine_sleeps_until` and load of `parker`: one of us sees the other.)
        std::sync::atomic::fence(Ordering::SeqCst);
        if sh.engine_sleeps_until.load(Ordering::Acquire) > now + HANDOFF_NS {
            sh.wake.signal();
        }
    }
}

/// How often the engine thread reads the operational state of a multi-port device's links.
const LINK_CHECK_NS: u64 = 10_000_000;

impl Shared {
    /// True when the device has more than one port (then links are checked periodically:
    /// a port whose link goes down fails over even when nothing is being sent on it).
    fn checks_links(&self) -> bool {
        self.ifnames.len() > 1 && self.ifnames.iter().any(Option::is_some)
    }

    /// Reads each port's link state and reports changes like send results do: a link that
    /// went down takes its port down (`PortError`, armed queue pairs migrate), a link that
    /// came back up brings it back (`PortActive`).
    ///
    /// A link never seen up since the device opened is not declared down here (a fresh
    /// veth or NIC reports its link a little after it is configured, and a port that never
    /// worked has nothing to fail over from); failed sends still take such a port down.
    fn check_links(&self, now: u64) {
        let (mut up, mut down) = (0u64, 0u64);
        let seen = self.links_seen_up.load(Ordering::Relaxed);
        for (port, name) in self.ifnames.iter().enumerate().take(64) {
            let Some(name) = name else { continue };
            if !sys::interface_link_down(name) {
                up |= 1 << port;
            } else if seen & (1 << port) != 0 {
                down |= 1 << port;
            }
            tracing::trace!(port, name, up = up & (1 << port) != 0, "link check");
        }
        self.links_seen_up.fetch_or(up, Ordering::Relaxed);
        self.track_ports(up, down, now);
    }
}

/// The engine thread: owns timers, and reception whenever no thread is polling.
pub(super) fn engine_thread(weak: Weak<Shared>) {
    let mut fds = Vec::new();
    let mut next_link_check = 0u64;
    loop {
        let Some(sh) = weak.upgrade() else {
            return;
        };
        if sh.shutdown.load(Ordering::Relaxed) {
            return;
        }
        // About to sleep: from here, a post that arms a timer wakes us unless our deadline
        // (computed below, under the NIC lock the post also takes) is earlier.
        sh.engine_sleeps_until.store(u64::MAX, Ordering::Release);
        std::sync::atomic::fence(Ordering::SeqCst);
        let now = sh.now();
        let last = sh.last_poll.load(Ordering::Relaxed);
        let parked = sh.parker.load(Ordering::Acquire);
        let poller_active = parked || (last != 0 && now.saturating_sub(last) < HANDOFF_NS);
        let mut deadline = sh.next_deadline();
        if let Some(d) = sh.doorbell.deadline() {
            deadline = Some(deadline.map_or(d, |x| x.min(d)));
        }
        // Look again when a poller's claim lapses. A parked thread claims for as long as it
        // is parked: look once `HANDOFF_NS` into the park, then sleep on the timers (the
        // thread wakes us as it leaves if we sleep past its claim then: `Parked`).
        let handoff_end = if parked {
            let since = sh.parked_since.load(Ordering::Acquire);
            (now < since + HANDOFF_NS).then_some(since + HANDOFF_NS)
        } else if poller_active {
            Some(last + HANDOFF_NS)
        } else {
            None
        };
        if let Some(h) = handoff_end {
            deadline = Some(deadline.map_or(h, |d| d.min(h)));
        }
        let links = sh.checks_links();
        if links {
            if now >= next_link_check {
                sh.check_links(now);
                next_link_check = now + LINK_CHECK_NS;
            }
            deadline = Some(deadline.map_or(next_link_check, |d| d.min(next_link_check)));
        }
        sh.engine_sleeps_until
            .store(deadline.unwrap_or(u64::MAX), Ordering::Release);
        let timeout = deadline.map(|d| Duration::from_nanos(d.saturating_sub(now)));
        fds.clear();
        fds.push(sh.wake.raw());
        if !poller_active {
            fds.extend(sh.sockets.iter().map(AsRawFd::as_raw_fd));
            fds.extend(sh.groups.lock().iter().map(|g| g.sock.as_raw_fd()));
        }
        // Do not keep the device alive while sleeping.
        let wake_fd = sh.wake.raw();
        drop(sh);
        let ready = sys::poll_readable(&fds, timeout).unwrap_or_default();
        let Some(sh) = weak.upgrade() else {
            return;
        };
        sh.engine_sleeps_until.store(0, Ordering::Release);
        if ready.first().copied().unwrap_or(false) {
            let _ = wake_fd;
            sh.wake.drain();
        }
        if sh.shutdown.load(Ordering::Relaxed) {
            return;
        }
        let now = sh.now();
        let last = sh.last_poll.load(Ordering::Relaxed);
        let poller_active = sh.parker.load(Ordering::Acquire)
            || (last != 0 && now.saturating_sub(last) < HANDOFF_NS);
        if !poller_active {
            // Drain until the sockets are empty (bounded so timers still run).
            for _ in 0..64 {
                if sh.drain() == 0 {
                    break;
                }
            }
        }
        if sh.doorbell.deadline().is_some_and(|t| t <= sh.now()) {
            sh.flush_held();
        }
        let due = sh.next_deadline().is_some_and(|t| t <= sh.now());
        if due {
            sh.drain();
            let mut nic = sh.nic.lock();
            let now = sh.now();
            nic.handle_timeout(now);
            sh.flush(nic, now);
        }
    }
}
