//! The few Linux calls the driver needs that std and socket2 do not offer: eventfd, poll and
//! `IP_MTU_DISCOVER`.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

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
        Ok(Self {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
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
    let ms: libc::c_int = match timeout {
        None => -1,
        Some(d) => {
            // Round up so that a sub-millisecond timer does not become a busy loop.
            let ms = d.as_micros().div_ceil(1000);
            ms.min(i32::MAX as u128) as libc::c_int
        }
    };
    // SAFETY: `pfds` is a live, correctly sized array of pollfd for the duration of the call.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
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

/// Sets an integer socket option.
fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its exact size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&raw const v).cast::<libc::c_void>(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `IP_MTU_DISCOVER = IP_PMTUDISC_DO` (IPv4) / `IPV6_MTU_DISCOVER` (IPv6): DF set, IPv4 ID 0
/// on unconnected sockets, which the ICRC needs (spec §1.7).
pub(crate) fn set_pmtudisc_do(fd: RawFd, v6: bool) -> io::Result<()> {
    if v6 {
        setsockopt_int(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
    } else {
        setsockopt_int(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
    }
}

/// Tries `SO_RCVBUFFORCE` / `SO_SNDBUFFORCE` (root) and falls back to the plain options.
pub(crate) fn set_buffers(fd: RawFd, bytes: i32) {
    if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, bytes).is_err() {
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, bytes);
    }
    if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, bytes).is_err() {
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, bytes);
    }
}

/// Random bytes from the kernel, for seeds.
pub(crate) fn random_u64() -> u64 {
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
