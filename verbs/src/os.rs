//! What the providers and the public objects share of the operating system: the clock, one
//! source of randomness (keys, PSNs, QP numbers, seeds), eventfds and `poll`, and the
//! wake-up state of a completion channel. Neither provider's: the soft provider and the
//! libibverbs one both build on it.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

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

/// Random bytes from the kernel: the one source of randomness of rdmx (memory keys, first
/// PSNs and QP numbers come from generators it seeds; the layers above use it for their
/// identifiers).
pub fn random_u64() -> u64 {
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
