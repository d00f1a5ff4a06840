//! Small helpers every layer may use: addresses, deadlines, random identifiers.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use rdmx_core::{Error, Result};

/// The first address `addr` resolves to.
pub(crate) fn resolve(addr: impl ToSocketAddrs) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .map_err(|e| Error::InvalidArgument(format!("bad address: {e}")))?
        .next()
        .ok_or_else(|| Error::InvalidArgument("the address resolved to nothing".into()))
}

/// `from + t`, or a decade from `from` when that overflows (`Duration::MAX` means wait).
pub(crate) fn far(from: Instant, t: Duration) -> Instant {
    from.checked_add(t)
        .unwrap_or_else(|| from + Duration::from_secs(10 * 365 * 86_400))
}

/// The host's clock, for the side channel only: deadlines of the TCP exchanges that set
/// endpoints up, and of threads waiting for them, are real time whatever the device's clock.
/// The protocol itself reads the worker's clock (`Cx::now`, `Worker::now`), which a
/// simulation moves; the architecture test allows `Instant::now` nowhere else in rdmx-rc.
pub(crate) fn host_now() -> Instant {
    Instant::now()
}

/// A random identifier (contexts, XRC nodes, pauses), from rdmx's one source of
/// randomness (`rdmx_verbs::random_u64`).
pub(crate) fn random_u64() -> u64 {
    rdmx_verbs::random_u64()
}

/// The address vector of a peer's path.
pub(crate) fn av(path: &rdmx_core::bootstrap::PathInfo) -> rdmx_verbs::AhAttr {
    rdmx_verbs::AhAttr::new(rdmx_verbs::Gid(path.gid)).with_udp_port(path.udp_port)
}
