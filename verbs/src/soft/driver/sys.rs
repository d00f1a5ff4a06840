//! The few Linux calls the driver needs that std and socket2 do not offer (socket options,
//! batched and GSO sends and receives); eventfd, poll and randomness are in `crate::os`.
#![allow(unsafe_code)]

pub(crate) use crate::os::{EventFd, poll_readable, random_u64};

use std::io;
use std::os::fd::RawFd;

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

/// Registers `f` to run when the process exits normally (`exit(3)`, or returning from
/// `main`). False if the C library refused.
pub(crate) fn at_exit(f: extern "C" fn()) -> bool {
    // SAFETY: `f` is a plain function that stays valid for the life of the process; a Rust
    // `extern "C"` function aborts rather than unwinds if it panics.
    unsafe { libc::atexit(f) == 0 }
}

/// `SOL_UDP` / `UDP_SEGMENT` / `UDP_GRO` (linux/udp.h).
const SOL_UDP: libc::c_int = 17;
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

/// Switches UDP GRO on or off on a receive socket. While it is on, the kernel may hand
/// several datagrams of one flow over in one buffer, with the segment size in a control
/// message; while it is off, it splits such batches before queueing them. False when the
/// kernel refused (no UDP GRO).
pub(crate) fn set_gro(fd: RawFd, on: bool) -> bool {
    setsockopt_int(fd, SOL_UDP, UDP_GRO, i32::from(on)).is_ok()
}

/// Sends the concatenation of `segs` to `dst` as one UDP GSO batch: the kernel cuts it into
/// datagrams of `seg_size` bytes (the last may be shorter). Every slice but the last must be
/// exactly `seg_size` long.
pub(crate) fn send_gso(
    fd: RawFd,
    dst: &socket2::SockAddr,
    segs: &[&[u8]],
    seg_size: u16,
) -> io::Result<usize> {
    let mut iov: Vec<libc::iovec> = segs
        .iter()
        .map(|s| libc::iovec {
            iov_base: s.as_ptr() as *mut libc::c_void,
            iov_len: s.len(),
        })
        .collect();
    // Room for one cmsg carrying a u16, 8-byte aligned.
    let mut cbuf = [0u64; 4];
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
    // SAFETY: an all-zero msghdr is a valid empty header; we fill the fields below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = dst.as_ptr() as *mut libc::c_void;
    msg.msg_namelen = dst.len();
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len();
    msg.msg_control = cbuf.as_mut_ptr().cast::<libc::c_void>();
    msg.msg_controllen = space;
    // SAFETY: msg_control points at `cbuf`, which is at least `space` bytes and aligned for
    // cmsghdr, so the first header and its data are inside it.
    unsafe {
        let cm = libc::CMSG_FIRSTHDR(&raw const msg);
        if cm.is_null() {
            return Err(io::Error::other("no room for the GSO control message"));
        }
        (*cm).cmsg_level = SOL_UDP;
        (*cm).cmsg_type = UDP_SEGMENT;
        (*cm).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<u16>(), seg_size);
    }
    // SAFETY: `msg` points at live iovecs, address and control buffer for the whole call.
    let n = unsafe { libc::sendmsg(fd, &raw const msg, 0) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Converts a kernel-filled `sockaddr_storage` to a std address.
fn sockaddr_to_std(ss: &libc::sockaddr_storage) -> Option<std::net::SocketAddr> {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
    match libc::c_int::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, which is smaller than
            // and layout-compatible with the start of sockaddr_storage.
            let sin =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddrV4::new(ip, u16::from_be(sin.sin_port)).into())
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(
                SocketAddrV6::new(
                    ip,
                    u16::from_be(sin6.sin6_port),
                    sin6.sin6_flowinfo,
                    sin6.sin6_scope_id,
                )
                .into(),
            )
        }
        _ => None,
    }
}

/// Reusable `recvmmsg` headers (rebuilt on every call, so the raw pointers they hold never
/// outlive one call).
#[derive(Default)]
pub(crate) struct RecvScratch {
    iovs: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_storage>,
    cbufs: Vec<[u64; 8]>,
    msgs: Vec<libc::mmsghdr>,
}

impl std::fmt::Debug for RecvScratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecvScratch")
    }
}

// SAFETY: the raw pointers inside are only meaningful during one `recv_batch` call, which
// rewrites all of them before use; between calls they are never dereferenced.
unsafe impl Send for RecvScratch {}

/// One datagram (or GRO batch) read by [`recv_batch`]: its length, source and segment size.
pub(crate) type Received = (usize, std::net::SocketAddr, usize);

/// Reads up to `bufs.len()` datagrams in one `recvmmsg` call without blocking, appending one
/// entry per buffer filled (in order) to `out`. Returns the number of buffers filled (0 when
/// the socket is empty).
pub(crate) fn recv_batch(
    fd: RawFd,
    bufs: &mut [Vec<u8>],
    scratch: &mut RecvScratch,
    out: &mut Vec<Received>,
) -> io::Result<usize> {
    let n = bufs.len().min(64);
    if n == 0 {
        return Ok(0);
    }
    let RecvScratch {
        iovs,
        names,
        cbufs,
        msgs,
    } = scratch;
    iovs.clear();
    iovs.extend(bufs[..n].iter_mut().map(|b| libc::iovec {
        iov_base: b.as_mut_ptr().cast::<libc::c_void>(),
        iov_len: b.len(),
    }));
    // SAFETY: sockaddr_storage and mmsghdr are plain data for which all-zero is valid; the
    // headers' fields are all set below.
    let (zero_name, zero_msg) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    names.resize(n, zero_name);
    cbufs.resize(n, [0u64; 8]);
    msgs.resize(n, zero_msg);
    for i in 0..n {
        let h = &mut msgs[i].msg_hdr;
        h.msg_name = (&raw mut names[i]).cast::<libc::c_void>();
        h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        h.msg_iov = &raw mut iovs[i];
        h.msg_iovlen = 1;
        h.msg_control = cbufs[i].as_mut_ptr().cast::<libc::c_void>();
        h.msg_controllen = size_of::<[u64; 8]>();
    }
    // SAFETY: `msgs` holds `n` headers whose pointers refer to live buffers (`iovs`, `names`,
    // `cbufs`, and the caller's `bufs`) that outlive the call.
    let got = unsafe {
        libc::recvmmsg(
            fd,
            msgs.as_mut_ptr(),
            n as libc::c_uint,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    let Some(got) = nonblocking(got as isize)? else {
        return Ok(0);
    };
    for m in &msgs[..got] {
        let len = m.msg_len as usize;
        let seg = gro_segment(&m.msg_hdr).unwrap_or(len);
        // SAFETY: msg_name points into `names`; the index is in range.
        let name = unsafe { &*m.msg_hdr.msg_name.cast::<libc::sockaddr_storage>() };
        let Some(src) = sockaddr_to_std(name) else {
            out.push((0, std::net::SocketAddr::from(([0, 0, 0, 0], 0)), 1));
            continue;
        };
        out.push((len, src, seg.min(len).max(1)));
    }
    Ok(got)
}

/// Reads one datagram (or GRO batch) with `recvmsg` without blocking: cheaper than
/// [`recv_batch`] for a busy poll that usually finds nothing or one packet. Returns
/// `Ok(None)` when the socket is empty.
pub(crate) fn recv_one(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<Received>> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast::<libc::c_void>(),
        iov_len: buf.len(),
    };
    // SAFETY: sockaddr_storage and msghdr are plain data for which all-zero is valid.
    let (mut name, mut msg): (libc::sockaddr_storage, libc::msghdr) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    let mut cbuf = [0u64; 8];
    msg.msg_name = (&raw mut name).cast::<libc::c_void>();
    msg.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast::<libc::c_void>();
    msg.msg_controllen = size_of_val(&cbuf);
    // SAFETY: every pointer in `msg` refers to a live buffer of the stated size.
    let n = unsafe { libc::recvmsg(fd, &raw mut msg, libc::MSG_DONTWAIT) };
    let Some(len) = nonblocking(n)? else {
        return Ok(None);
    };
    let seg = gro_segment(&msg).unwrap_or(len);
    Ok(Some((len, source(&name), seg.min(len).max(1))))
}

/// Reads one datagram with `recvfrom` without blocking: about 0.1 µs cheaper than
/// [`recv_one`] here (no message header or iovec to import), but blind to GRO. Only for a
/// socket that cannot hold a coalesced batch: UDP GRO off, and off long enough that no batch
/// coalesced before can still be queued (see `rx::PortRx`). Returns `Ok(None)` when the
/// socket is empty.
pub(crate) fn recv_plain(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<Received>> {
    // SAFETY: sockaddr_storage is plain data for which all-zero is valid.
    let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut name_len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `buf` and `name` are live buffers of the stated sizes for the whole call.
    let n = unsafe {
        libc::recvfrom(
            fd,
            buf.as_mut_ptr().cast::<libc::c_void>(),
            buf.len(),
            libc::MSG_DONTWAIT,
            (&raw mut name).cast::<libc::sockaddr>(),
            &raw mut name_len,
        )
    };
    let Some(len) = nonblocking(n)? else {
        return Ok(None);
    };
    Ok(Some((len, source(&name), len.max(1))))
}

/// The result of a non-blocking receive call: `Ok(None)` when it would have blocked, the
/// error when it failed, otherwise the count it returned.
fn nonblocking(n: isize) -> io::Result<Option<usize>> {
    if n >= 0 {
        return Ok(Some(n as usize));
    }
    let e = io::Error::last_os_error();
    if e.kind() == io::ErrorKind::WouldBlock {
        Ok(None)
    } else {
        Err(e)
    }
}

/// A received datagram's source address (0.0.0.0:0 when the family is unknown).
fn source(name: &libc::sockaddr_storage) -> std::net::SocketAddr {
    sockaddr_to_std(name).unwrap_or_else(|| std::net::SocketAddr::from(([0, 0, 0, 0], 0)))
}

/// The UDP GRO segment size from a received message's control data, if present.
fn gro_segment(msg: &libc::msghdr) -> Option<usize> {
    // SAFETY: the kernel filled `msg_controllen` bytes of the control buffer with well-formed
    // cmsgs; the CMSG_* macros stay inside that range.
    unsafe {
        let mut cm = libc::CMSG_FIRSTHDR(msg);
        while !cm.is_null() {
            if (*cm).cmsg_level == SOL_UDP && (*cm).cmsg_type == UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(cm).cast::<libc::c_int>());
                if v > 0 {
                    return Some(v as usize);
                }
            }
            cm = libc::CMSG_NXTHDR(msg, cm);
        }
    }
    None
}

/// The MTU of a network interface (`/sys/class/net/<ifname>/mtu`).
pub(crate) fn interface_mtu(name: &str) -> Option<usize> {
    std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// True when the interface's operational state says its link is down (`down`,
/// `lowerlayerdown`, `notpresent`); `up` and `unknown` (loopback) count as up.
pub(crate) fn interface_link_down(name: &str) -> bool {
    std::fs::read_to_string(format!("/sys/class/net/{name}/operstate"))
        .map(|s| matches!(s.trim(), "down" | "lowerlayerdown" | "notpresent"))
        .unwrap_or(false)
}

/// A sockaddr of the list getifaddrs returned, copied out (`None`: null, or a family other
/// than IPv4 and IPv6).
fn ifaddr_ip(sa: *const libc::sockaddr) -> Option<std::net::IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: `sa` points at a sockaddr of the getifaddrs list (alive until freeifaddrs),
    // whose family says how to read it.
    let family = libc::c_int::from(unsafe { (*sa).sa_family });
    let len = match family {
        libc::AF_INET => size_of::<libc::sockaddr_in>(),
        libc::AF_INET6 => size_of::<libc::sockaddr_in6>(),
        _ => return None,
    };
    // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for `len` bytes (the family's size, at most the
    // storage's) and do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(sa.cast::<u8>(), (&raw mut ss).cast::<u8>(), len);
    }
    sockaddr_to_std(&ss).map(|a| a.ip())
}

/// Whether `ip` is in the subnet of `addr` with `mask` (both of its family).
fn in_subnet(ip: std::net::IpAddr, addr: std::net::IpAddr, mask: std::net::IpAddr) -> bool {
    use std::net::IpAddr::{V4, V6};
    match (ip, addr, mask) {
        (V4(i), V4(a), V4(m)) => {
            let m = u32::from(m);
            m != 0 && u32::from(i) & m == u32::from(a) & m
        }
        (V6(i), V6(a), V6(m)) => {
            let m = u128::from(m);
            m != 0 && u128::from(i) & m == u128::from(a) & m
        }
        _ => false,
    }
}

/// The name of the network interface that owns `ip` (from getifaddrs), if any: the one
/// with that very address, else the one whose subnet holds it (127.0.0.2 is on `lo`, whose
/// address is 127.0.0.1/8).
pub(crate) fn interface_of(ip: std::net::IpAddr) -> Option<String> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&raw mut head) } != 0 {
        return None;
    }
    let mut exact = None;
    let mut subnet = None;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_name.is_null() {
            continue;
        }
        let Some(addr) = ifaddr_ip(ifa.ifa_addr) else {
            continue;
        };
        let name = || {
            // SAFETY: ifa_name is a non-null (checked above), NUL-terminated string owned
            // by the list, alive until freeifaddrs.
            let n = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
            n.to_string_lossy().into_owned()
        };
        if addr == ip {
            exact = Some(name());
            break;
        }
        if subnet.is_none() && ifaddr_ip(ifa.ifa_netmask).is_some_and(|m| in_subnet(ip, addr, m)) {
            subnet = Some(name());
        }
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(head) };
    exact
        .or(subnet)
        .filter(|n| !n.contains('/') && !n.contains(".."))
}

/// The process id of the peer of a connected Unix socket (`SO_PEERCRED`), as the kernel
/// recorded it at `connect`.
pub(crate) fn peer_pid(fd: RawFd) -> io::Result<libc::pid_t> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are live locals of the size passed; the kernel writes at
    // most `len` bytes into `cred`.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast::<libc::c_void>(),
            &raw mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.pid)
}

/// Who may attach to this process where Yama restricts ptrace to descendants
/// (`PR_SET_PTRACER`): nobody extra, one process, or any process of this user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ptracer {
    /// Yama's default: descendants only.
    Default,
    /// This process (the host of a shared XRC domain).
    Pid(libc::pid_t),
    /// Any process of this user (`PR_SET_PTRACER_ANY`).
    Any,
}

impl Ptracer {
    /// What to allow so that `host` (when known) can also attach: Yama keeps a single
    /// tracer per process, so a second, different host widens the permission to any
    /// process, and an unknown host too.
    pub(crate) fn with_host(self, host: Option<libc::pid_t>) -> Self {
        match (self, host) {
            (Self::Any, _) | (_, None) => Self::Any,
            (Self::Default, Some(h)) => Self::Pid(h),
            (Self::Pid(p), Some(h)) if p == h => self,
            (Self::Pid(_), Some(_)) => Self::Any,
        }
    }
}

/// The permission this process has given so far (see [`allow_ptrace_by`]).
static PTRACER: parking_lot::Mutex<Ptracer> = parking_lot::Mutex::new(Ptracer::Default);

/// Lets the host of a shared XRC domain (`host`, from the socket's `SO_PEERCRED`) attach to
/// this process, and so read and write its memory, where Yama restricts ptrace to
/// descendants: the host reaches a member's registered memory that way. Only that process
/// is allowed, unless this process is a member of domains with different hosts (or the
/// host is unknown), when any process of this user is.
pub(crate) fn allow_ptrace_by(host: Option<libc::pid_t>) {
    let mut cur = PTRACER.lock();
    let next = cur.with_host(host);
    if next == *cur {
        return;
    }
    let arg = match next {
        Ptracer::Pid(p) => libc::c_ulong::try_from(p).unwrap_or(libc::PR_SET_PTRACER_ANY),
        _ => libc::PR_SET_PTRACER_ANY,
    };
    // SAFETY: PR_SET_PTRACER takes plain integer arguments and touches no memory of ours.
    let _ = unsafe { libc::prctl(libc::PR_SET_PTRACER, arg, 0, 0, 0) };
    *cur = next;
}

/// Reads one message from a connected socket without blocking (`recv` with
/// `MSG_DONTWAIT`): `Ok(None)` when none is queued, `Ok(Some(0))` at end of stream.
pub(crate) fn recv_dontwait(fd: RawFd, buf: &mut [u8]) -> io::Result<Option<usize>> {
    // SAFETY: `buf` is a live, writable buffer of `buf.len()` bytes for the whole call.
    let n = unsafe {
        libc::recv(
            fd,
            buf.as_mut_ptr().cast::<libc::c_void>(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    nonblocking(n)
}

#[cfg(test)]
mod tests {
    use super::{Ptracer, in_subnet, interface_of};

    #[test]
    fn an_address_without_an_interface_of_its_own_is_on_its_subnets() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        assert!(in_subnet(ip("127.0.0.2"), ip("127.0.0.1"), ip("255.0.0.0")));
        assert!(!in_subnet(ip("10.0.0.2"), ip("127.0.0.1"), ip("255.0.0.0")));
        assert!(!in_subnet(ip("127.0.0.2"), ip("127.0.0.1"), ip("0.0.0.0")));
        assert!(in_subnet(ip("fd00::5"), ip("fd00::1"), ip("ffff:ffff::")));
        assert!(!in_subnet(ip("fd00::5"), ip("127.0.0.1"), ip("255.0.0.0")));
        // Loopback: 127.0.0.2 is served by the interface of 127.0.0.1 (its MTU was taken for
        // 1024, the fallback, when only an exact address counted).
        if let Some(lo) = interface_of(ip("127.0.0.1")) {
            assert_eq!(interface_of(ip("127.0.0.2")), Some(lo.clone()));
            assert_eq!(interface_of(ip("127.9.8.7")), Some(lo));
        }
    }

    #[test]
    fn ptracer_allows_the_one_host_and_widens_only_when_needed() {
        let first = Ptracer::Default.with_host(Some(100));
        assert_eq!(first, Ptracer::Pid(100));
        assert_eq!(
            first.with_host(Some(100)),
            Ptracer::Pid(100),
            "same host again"
        );
        assert_eq!(first.with_host(Some(200)), Ptracer::Any, "a second host");
        assert_eq!(
            Ptracer::Default.with_host(None),
            Ptracer::Any,
            "unknown host"
        );
        assert_eq!(
            Ptracer::Any.with_host(Some(100)),
            Ptracer::Any,
            "never narrows"
        );
    }
}
