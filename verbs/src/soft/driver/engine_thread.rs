//! The engine thread, and the handoff of reception between it and the threads that poll:
//! a polling thread claims the sockets for [`HANDOFF_NS`]; otherwise the engine thread
//! sleeps in `poll(2)` on the sockets, the wake-up eventfd and the next timer.

use std::os::fd::AsRawFd;
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

    /// Called before a poller goes to sleep: hands reception back to the engine thread now.
    pub(crate) fn release(&self) {
        self.flush_held();
        self.last_poll.store(0, Ordering::Relaxed);
        self.wake.signal();
        self.xrc.wake_members();
    }

    /// While an application thread is polling (it claimed reception less than
    /// [`HANDOFF_NS`] ago), how much longer its claim lasts.
    pub(crate) fn poller_remaining(&self) -> Option<Duration> {
        let last = self.last_poll.load(Ordering::Relaxed);
        let left = (last + HANDOFF_NS).checked_sub(self.now())?;
        (last != 0 && left > 0).then(|| Duration::from_nanos(left))
    }

    /// Next engine deadline (timers and delayed fault-injected frames).
    fn next_deadline(&self) -> Option<u64> {
        let t = self.nic.lock().poll_timeout();
        let f = self.faults.as_ref().and_then(|f| f.lock().poll_timeout());
        match (t, f) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
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
        let now = sh.now();
        let last = sh.last_poll.load(Ordering::Relaxed);
        let poller_active = last != 0 && now.saturating_sub(last) < HANDOFF_NS;
        let mut deadline = sh.next_deadline();
        if let Some(d) = sh.doorbell.deadline() {
            deadline = Some(deadline.map_or(d, |x| x.min(d)));
        }
        if poller_active {
            let handoff_end = last + HANDOFF_NS;
            deadline = Some(deadline.map_or(handoff_end, |d| d.min(handoff_end)));
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
        let poller_active = last != 0 && now.saturating_sub(last) < HANDOFF_NS;
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
