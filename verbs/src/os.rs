//! What the providers and the public objects share of the operating system: the clock, one
//! source of randomness (keys, PSNs, QP numbers, seeds), eventfds and `poll`, and the
//! wake-up state of a completion channel. Neither provider's: the soft provider and the
//! libibverbs one both build on it.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The only place verbs reads clocks: the soft engine is sans-I/O and takes `now` as an
/// argument (clippy.toml bans the clock calls everywhere else).
pub(crate) mod clock {
    use std::time::{Instant, SystemTime};

    /// Monotonic time, for the engine and for bounded waits.
    #[expect(clippy::disallowed_methods, reason = "the driver owns the clock")]
    pub(crate) fn monotonic() -> Instant {
        Instant::now()
    }

    /// Wall-clock time, for capture timestamps.
    #[expect(clippy::disallowed_methods, reason = "the driver owns the clock")]
    pub(crate) fn wall() -> SystemTime {
        SystemTime::now()
    }
}

/// Where a device and everything above it read the time: the host's monotonic clock, or a
/// virtual one that only a simulation moves ([`SimNet`](crate::soft::SimNet)). Virtual
/// time starts at an arbitrary `Instant` and advances only when told to, so code that takes
/// its `now` from a `Clock` runs the same way on every replay of a simulation. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    virt: Option<Arc<VirtualTime>>,
}

#[derive(Debug)]
struct VirtualTime {
    base: Instant,
    nanos: AtomicU64,
}

impl Clock {
    /// The host's monotonic clock.
    pub fn real() -> Self {
        Self { virt: None }
    }

    /// A virtual clock at its start (0 ns); see [`advance_to`](Self::advance_to).
    pub(crate) fn new_virtual() -> Self {
        Self {
            virt: Some(Arc::new(VirtualTime {
                base: clock::monotonic(),
                nanos: AtomicU64::new(0),
            })),
        }
    }

    /// Now.
    pub fn now(&self) -> Instant {
        match &self.virt {
            None => clock::monotonic(),
            Some(v) => v.base + Duration::from_nanos(v.nanos.load(Ordering::Acquire)),
        }
    }

    /// Whether this clock is virtual (moves only when a simulation moves it).
    pub fn is_virtual(&self) -> bool {
        self.virt.is_some()
    }

    /// Virtual time since the clock's start (`None` for the real clock).
    pub fn elapsed_virtual(&self) -> Option<Duration> {
        self.virt
            .as_ref()
            .map(|v| Duration::from_nanos(v.nanos.load(Ordering::Acquire)))
    }

    /// Nanoseconds since the clock's start, for a virtual clock.
    pub(crate) fn virtual_nanos(&self) -> Option<u64> {
        self.virt.as_ref().map(|v| v.nanos.load(Ordering::Acquire))
    }

    /// Moves a virtual clock forward to `nanos` since its start (never backwards; a no-op
    /// on the real clock).
    pub(crate) fn advance_to(&self, nanos: u64) {
        if let Some(v) = &self.virt {
            v.nanos.fetch_max(nanos, Ordering::AcqRel);
        }
    }

    /// The virtual `Instant` at `nanos` since the clock's start (for the real clock, now).
    pub(crate) fn instant_at(&self, nanos: u64) -> Instant {
        match &self.virt {
            None => clock::monotonic(),
            Some(v) => v.base + Duration::from_nanos(nanos),
        }
    }

    /// Nanoseconds from the clock's start to `t` (virtual clocks; 0 before the start).
    pub(crate) fn nanos_of(&self, t: Instant) -> Option<u64> {
        self.virt.as_ref().map(|v| {
            t.saturating_duration_since(v.base)
                .as_nanos()
                .min(u128::from(u64::MAX)) as u64
        })
    }
}

thread_local! {
    /// A seeded generator that replaces the kernel's randomness on this thread (see
    /// [`seed_thread_random`]).
    static SEEDED: Cell<Option<u64>> = const { Cell::new(None) };
}

/// From now on, [`random_u64`] on the calling thread draws from a generator seeded with
/// `seed` instead of the kernel (`None`: the kernel again). A deterministic simulation sets
/// it, so that the keys, PSNs, QP numbers and identifiers of everything it creates on its
/// thread are the same on every replay of a seed.
pub fn seed_thread_random(seed: Option<u64>) {
    SEEDED.with(|s| s.set(seed));
}

/// Random bytes from the kernel: the one source of randomness of rdmx (memory keys, first
/// PSNs and QP numbers come from generators it seeds; the layers above use it for their
/// identifiers). On a thread given a seed ([`seed_thread_random`]), the next value of that
/// seed's sequence instead.
pub fn random_u64() -> u64 {
    if let Some(v) = SEEDED.with(|s| {
        s.get().map(|state| {
            // splitmix64
            let next = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            s.set(Some(next));
            let mut z = next;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        })
    }) {
        return v;
    }
    let mut v: u64 = 0;
    // SAFETY: getrandom writes at most 8 bytes into a live u64.
    let n = unsafe { libc::getrandom((&raw mut v).cast::<libc::c_void>(), 8, 0) };
    if n == 8 {
        v
    } else {
        // Fall back to the address-space layout and time; only used as a PRNG seed.
        let t = std::time::SystemTime::UNIX_EPOCH
            .elapsed()
            .map_or(0, |d| d.as_nanos() as u64);
        t ^ (&raw const v as usize as u64).rotate_left(32)
    }
}

/// A non-blocking eventfd used as a wake-up signal.
#[derive(Debug)]
pub(crate) struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: eventfd has no memory-safety preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor we own exclusively.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd })
    }

    /// Makes the fd readable (wakes a `poll` on it).
    pub(crate) fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own fd; errors (counter overflow,
        // EAGAIN) only mean it is already signalled.
        let _ = unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&raw const one).cast::<libc::c_void>(),
                8,
            )
        };
    }

    /// Clears the signal; returns true when it was set.
    pub(crate) fn drain(&self) -> bool {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live u64 from our own non-blocking fd.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut v).cast::<libc::c_void>(), 8) };
        n == 8
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Waits until one of `fds` is readable or `timeout` passes (`None` = forever). Returns the
/// readiness of each fd.
pub(crate) fn poll_readable(fds: &[RawFd], timeout: Option<Duration>) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(d.subsec_nanos() as i32),
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `pfds` is a live, correctly sized array of pollfd and `tsp` is null or points
    // at a live timespec for the duration of the call; no signal mask is passed.
    let n = unsafe {
        libc::ppoll(
            pfds.as_mut_ptr(),
            pfds.len() as libc::nfds_t,
            tsp,
            std::ptr::null(),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(e);
    }
    Ok(pfds
        .iter()
        .map(|p| p.revents & (libc::POLLIN | libc::POLLERR) != 0)
        .collect())
}

/// Wake-up state of one completion channel.
#[derive(Debug)]
pub(crate) struct ChannelInner {
    pub(crate) fd: EventFd,
    /// CQs whose notification fired and were not yet returned by `get_cq_event`.
    pub(crate) ready: Mutex<VecDeque<u32>>,
    /// `CompletionChannel::interrupt` was called and no wait has returned for it yet.
    pub(crate) interrupted: AtomicBool,
}

impl ChannelInner {
    pub(crate) fn new() -> io::Result<Self> {
        Ok(Self {
            fd: EventFd::new()?,
            ready: Mutex::new(VecDeque::new()),
            interrupted: AtomicBool::new(false),
        })
    }
}
