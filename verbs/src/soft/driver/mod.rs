//! The soft provider's I/O driver: UDP sockets, the clock, the engine thread, completion
//! channel and async-event signalling, fault injection and packet capture around the
//! sans-I/O `Nic` (`crate::soft::engine::Nic`).
//!
//! Progress model (DESIGN.md): posting threads build and transmit their packets themselves;
//! a thread polling a CQ drains the sockets and runs the engine inline; the engine thread
//! stays off the sockets while some thread has polled within [`HANDOFF_NS`] and otherwise
//! sleeps in `poll(2)` on the sockets, a wake-up eventfd and the next timer. It never spins.

mod doorbell;
pub(crate) mod pcap;
pub(crate) mod sys;

/// The only place the soft provider reads clocks: the engine is sans-I/O and takes `now`
/// as an argument (clippy.toml bans the clock calls everywhere else).
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

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};
use socket2::{Domain, Protocol, Socket, Type};

use super::engine::{AsyncEvent, Nic, NicConfig, NicCounters};
use super::fault::{FaultConfig, FaultInjector, FaultStats};
use crate::error::VerbsError;
use crate::types::Mtu;
use pcap::PcapWriter;
use sys::EventFd;

/// After a CQ poll, the engine thread keeps off the sockets for this long.
pub(crate) const HANDOFF_NS: u64 = 2_000_000;
/// Largest UDP payload we send or accept (4096 MTU + headers + pad + ICRC, rounded up).
const MAX_PACKET: usize = 4096 + 256;
/// An idle poll releases ACKs held at least this long (see `Nic::flush_acks`).
const ACK_IDLE_NS: u64 = 50_000;
/// Receive buffers per progress call (each holds one GRO batch of up to 64 KiB).
const RX_BATCH: usize = 32;
/// Size of one receive buffer.
const RX_BUF: usize = 65_536 + 1024;
/// Largest GSO batch: segments and bytes.
const GSO_MAX_SEGS: usize = 64;
const GSO_MAX_BYTES: usize = 65_000;
/// Socket buffer size requested (bytes).
const SOCKET_BUFFER: i32 = 16 << 20;

/// Wake-up state of one completion channel.
#[derive(Debug)]
pub(crate) struct ChannelInner {
    pub(crate) fd: EventFd,
    /// CQs whose notification fired and were not yet returned by `get_cq_event`.
    pub(crate) ready: Mutex<VecDeque<u32>>,
}

impl ChannelInner {
    pub(crate) fn new() -> io::Result<Self> {
        Ok(Self {
            fd: EventFd::new()?,
            ready: Mutex::new(VecDeque::new()),
        })
    }
}

/// A socket receiving one multicast group on one port.
#[derive(Debug)]
struct GroupSock {
    ip: IpAddr,
    port: usize,
    sock: UdpSocket,
    /// QPs of this device attached to the group through this port.
    refs: usize,
}

/// Packets collected under the NIC lock and sent after it is released (in order).
#[derive(Debug, Default)]
struct TxBatch {
    bufs: Vec<Vec<u8>>,
    meta: Vec<(usize, SocketAddr, usize)>,
}

/// Receive buffers, used by whichever thread is draining the sockets.
#[derive(Debug)]
struct RxState {
    bufs: Vec<Vec<u8>>,
    scratch: sys::RecvScratch,
    batch: Vec<sys::Received>,
    /// (port, source, destination, buffer, offset, length) of every datagram read.
    got: Vec<(usize, SocketAddr, IpAddr, usize, usize, usize)>,
    /// (port, destination address, fd) of every socket to read.
    sources: Vec<(usize, IpAddr, RawFd)>,
    /// The last read found more than one datagram: read in batches (`recvmmsg`) until a
    /// batch comes back with at most one, then go back to single, cheaper `recvmsg` calls.
    burst: bool,
}

/// A running soft device.
#[derive(Debug)]
pub(crate) struct Shared {
    /// This device, for the objects that refer back to it.
    me: Weak<Self>,
    nic: Mutex<Nic>,
    tx: Mutex<TxBatch>,
    rx: Mutex<RxState>,
    sockets: Vec<UdpSocket>,
    addrs: Vec<SocketAddr>,
    epoch: Instant,
    last_poll: AtomicU64,
    wake: EventFd,
    shutdown: AtomicBool,
    faults: Option<Mutex<FaultInjector<(usize, SocketAddr, IpAddr)>>>,
    /// Sockets bound to joined multicast groups.
    groups: Mutex<Vec<GroupSock>>,
    group_count: std::sync::atomic::AtomicUsize,
    channels: Mutex<HashMap<u32, Weak<ChannelInner>>>,
    events: Mutex<VecDeque<AsyncEvent>>,
    event_fd: EventFd,
    tx_errors: AtomicU64,
    /// Bit per port: its link is down (sends failed and the interface says so).
    port_down: AtomicU64,
    /// Ports whose link the periodic check has seen up at least once.
    links_seen_up: AtomicU64,
    /// The network interface of each port, when known.
    ifnames: Vec<Option<String>>,
    /// Sends that failed because the destination was unreachable (not a port failure).
    tx_unreachable: AtomicU64,
    gso: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Shared XRC domains this device hosts or is a member of.
    xrc: crate::soft::xrcd::Links,
    /// Sends held by an open post batch (see `doorbell.rs`).
    doorbell: doorbell::Doorbell,
}

/// The active MTU of a port bound to `ip`: the largest IB MTU that, with the 96 bytes of
/// IP/UDP/transport headers and ICRC a RoCEv2 packet can carry (spec §1.5, as the kernel's
/// `iboe_get_mtu`), fits the interface MTU. Loopback (64 KiB) gives 4096, a 1500-byte link
/// 1024. When the interface cannot be found, 1024 (safe on any Ethernet link).
fn port_active_mtu(ifname: Option<&str>) -> Mtu {
    ifname
        .and_then(sys::interface_mtu)
        .and_then(|m| Mtu::from_bytes_floor(m.saturating_sub(96)))
        .unwrap_or(Mtu::Mtu1024)
}

/// Send errors that mean the port's link or route is gone (not a transient buffer shortage).
fn is_link_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENETUNREACH | libc::ENETDOWN | libc::EHOSTUNREACH | libc::EADDRNOTAVAIL)
    )
}

/// The process-wide capture file from `RDMX_PCAP`, shared by every soft device.
fn pcap() -> Option<&'static Mutex<PcapWriter>> {
    static PCAP: OnceLock<Option<Mutex<PcapWriter>>> = OnceLock::new();
    PCAP.get_or_init(|| {
        let path = std::env::var_os("RDMX_PCAP")?;
        // `%p` in the name becomes the process id, so several processes can capture side by
        // side without writing into one file.
        let path = path
            .to_string_lossy()
            .replace("%p", &std::process::id().to_string());
        match PcapWriter::create(std::path::Path::new(&path)) {
            Ok(w) => Some(Mutex::new(w)),
            Err(e) => {
                tracing::warn!("RDMX_PCAP: cannot create {:?}: {e}", path);
                None
            }
        }
    })
    .as_ref()
}

/// Flushes the capture file (so a process that exits does not lose its tail).
pub(crate) fn flush_pcap() {
    if let Some(p) = pcap() {
        let _ = p.lock().flush();
    }
}

fn bind(addr: SocketAddr) -> Result<UdpSocket, VerbsError> {
    let io = |op| move |source| VerbsError::Io { op, source };
    let domain = if addr.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP)).map_err(io("socket"))?;
    sys::set_pmtudisc_do(s.as_raw_fd(), addr.is_ipv6()).map_err(io("setsockopt(MTU_DISCOVER)"))?;
    sys::set_buffers(s.as_raw_fd(), SOCKET_BUFFER);
    s.bind(&addr.into()).map_err(io("bind"))?;
    if let IpAddr::V4(v4) = addr.ip() {
        // Multicast sends leave through this port's address and loop back to local members.
        s.set_multicast_if_v4(&v4).map_err(io("IP_MULTICAST_IF"))?;
        s.set_multicast_loop_v4(true)
            .map_err(io("IP_MULTICAST_LOOP"))?;
        s.set_multicast_ttl_v4(8).map_err(io("IP_MULTICAST_TTL"))?;
    }
    s.set_nonblocking(true).map_err(io("set_nonblocking"))?;
    if !sys::enable_gro(s.as_raw_fd()) {
        tracing::debug!("UDP GRO not available on {addr}");
    }
    Ok(s.into())
}

impl Shared {
    /// Opens a soft device with one port per address (port 0 picks an ephemeral port).
    pub(crate) fn open(
        addrs: &[SocketAddr],
        faults: Option<FaultConfig>,
    ) -> Result<Arc<Self>, VerbsError> {
        let mut sockets = Vec::new();
        let mut bound = Vec::new();
        for a in addrs {
            let s = bind(*a)?;
            let local = s.local_addr().map_err(|source| VerbsError::Io {
                op: "getsockname",
                source,
            })?;
            sockets.push(s);
            bound.push(local);
        }
        let faults = match faults {
            Some(f) => Some(f),
            None => FaultConfig::from_env()
                .map_err(|e| VerbsError::InvalidArgument(format!("RDMX_FAULTS: {e}")))?,
        }
        .filter(|f| !f.is_noop())
        .map(|f| Mutex::new(FaultInjector::new(f)));
        let mut cfg = NicConfig::single_port(bound[0], sys::random_u64());
        cfg.ports = bound.clone();
        let ifnames: Vec<Option<String>> =
            bound.iter().map(|a| sys::interface_of(a.ip())).collect();
        tracing::debug!(?ifnames, "soft device interfaces");
        cfg.port_mtus = ifnames
            .iter()
            .map(|n| port_active_mtu(n.as_deref()))
            .collect();
        let io = |op| move |source| VerbsError::Io { op, source };
        let wake = EventFd::new().map_err(io("eventfd"))?;
        let event_fd = EventFd::new().map_err(io("eventfd"))?;
        let shared = Arc::new_cyclic(|me| Self {
            me: me.clone(),
            nic: Mutex::new(Nic::new(cfg)),
            tx: Mutex::new(TxBatch::default()),
            rx: Mutex::new(RxState {
                bufs: (0..RX_BATCH).map(|_| vec![0u8; RX_BUF]).collect(),
                scratch: sys::RecvScratch::default(),
                batch: Vec::new(),
                got: Vec::new(),
                sources: Vec::new(),
                burst: false,
            }),
            sockets,
            addrs: bound,
            epoch: clock::monotonic(),
            last_poll: AtomicU64::new(0),
            wake,
            shutdown: AtomicBool::new(false),
            faults,
            groups: Mutex::new(Vec::new()),
            group_count: std::sync::atomic::AtomicUsize::new(0),
            channels: Mutex::new(HashMap::new()),
            events: Mutex::new(VecDeque::new()),
            event_fd,
            tx_errors: AtomicU64::new(0),
            port_down: AtomicU64::new(0),
            links_seen_up: AtomicU64::new(0),
            ifnames,
            tx_unreachable: AtomicU64::new(0),
            gso: AtomicBool::new(std::env::var_os("RDMX_NO_GSO").is_none()),
            thread: Mutex::new(None),
            xrc: crate::soft::xrcd::Links::default(),
            doorbell: doorbell::Doorbell::default(),
        });
        let weak = Arc::downgrade(&shared);
        let handle = std::thread::Builder::new()
            .name(format!("rdmx-soft-{}", shared.addrs[0]))
            .spawn(move || engine_thread(weak))
            .map_err(io("spawn engine thread"))?;
        *shared.thread.lock() = Some(handle);
        Ok(shared)
    }

    /// This device as an `Arc` (`None` while it is being dropped).
    pub(crate) fn arc(&self) -> Option<Arc<Self>> {
        self.me.upgrade()
    }

    /// The shared XRC domains of this device.
    pub(crate) fn xrc_links(&self) -> &crate::soft::xrcd::Links {
        &self.xrc
    }

    /// Local addresses of the ports.
    pub(crate) fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Nanoseconds since the device was opened.
    pub(crate) fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Engine counters.
    pub(crate) fn counters(&self) -> NicCounters {
        self.nic.lock().counters()
    }

    /// Fault-injection counters, when a plan is active.
    pub(crate) fn fault_stats(&self) -> Option<FaultStats> {
        self.faults.as_ref().map(|f| f.lock().stats())
    }

    /// Active MTU of port index `port`.
    pub(crate) fn port_mtu(&self, port: usize) -> Mtu {
        self.nic
            .lock()
            .config()
            .port_mtus
            .get(port)
            .copied()
            .unwrap_or(Mtu::Mtu1024)
    }

    /// True when sends through port index `port` currently fail (link or route gone).
    pub(crate) fn port_is_down(&self, port: usize) -> bool {
        port < 64 && self.port_down.load(Ordering::Relaxed) & (1 << port) != 0
    }

    /// Sends refused because the destination was unreachable.
    pub(crate) fn tx_unreachable(&self) -> u64 {
        self.tx_unreachable.load(Ordering::Relaxed)
    }

    /// Transmit errors (packets the kernel refused; recovered by retransmission).
    pub(crate) fn tx_errors(&self) -> u64 {
        self.tx_errors.load(Ordering::Relaxed)
    }

    /// Pops completions of CQ `cq` (this never produces packets, so no flush).
    pub(crate) fn poll_cq(&self, cq: u32, wc: &mut [crate::types::WorkCompletion]) -> usize {
        self.nic.lock().poll_cq(cq, wc)
    }

    /// Runs `f` on the NIC, then sends whatever it produced.
    pub(crate) fn with_nic<R>(&self, f: impl FnOnce(&mut Nic, u64) -> R) -> R {
        self.run_nic(f, false)
    }

    /// [`with_nic`](Self::with_nic) for posting sends: inside the calling thread's post
    /// batch, the sends may be held and leave together (see `doorbell.rs`).
    pub(crate) fn post_with_nic<R>(&self, f: impl FnOnce(&mut Nic, u64) -> R) -> R {
        self.run_nic(f, true)
    }

    fn run_nic<R>(&self, f: impl FnOnce(&mut Nic, u64) -> R, posting: bool) -> R {
        let mut nic = self.nic.lock();
        let now = self.now();
        let r = f(&mut nic, now);
        // Posting receives and most control operations produce nothing to send: skip the
        // flush (the TX lock and the drain loops) on those paths.
        if !nic.has_output() {
            return r;
        }
        match posting
            .then(|| self.doorbell.hold(self.id(), now))
            .flatten()
        {
            None => self.flush(nic, now),
            Some(first) => {
                drop(nic);
                // A sleeping engine thread must learn the deadline of what is held.
                if first && self.poller_remaining().is_none() {
                    self.wake.signal();
                }
            }
        }
        r
    }

    /// The calling thread opens or closes a post batch; closing sends what it held.
    pub(crate) fn batch_posts(&self, on: bool) {
        doorbell::Doorbell::open(self.id(), on);
        if !on {
            self.flush_held();
        }
    }

    /// Sends the posts a batch held, if any.
    pub(crate) fn flush_held(&self) {
        if self.doorbell.any() {
            let nic = self.nic.lock();
            let now = self.now();
            self.flush(nic, now);
        }
    }

    /// This device's identity in the threads' batch records.
    fn id(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// Registers the channel that CQ `cq` signals.
    pub(crate) fn set_channel(&self, cq: u32, ch: &Arc<ChannelInner>) {
        self.channels.lock().insert(cq, Arc::downgrade(ch));
    }

    /// Forgets a CQ's channel.
    pub(crate) fn clear_channel(&self, cq: u32) {
        self.channels.lock().remove(&cq);
    }

    /// Makes port `port` receive multicast group `group` (one socket per group and port,
    /// bound to `group:4791` with address reuse, so several devices on a host each get a
    /// copy, spec §1.6). Reference counted per attached QP.
    pub(crate) fn join_group(&self, port: usize, group: IpAddr) -> Result<(), VerbsError> {
        let io = |op| move |source| VerbsError::Io { op, source };
        let mut groups = self.groups.lock();
        if let Some(g) = groups.iter_mut().find(|g| g.ip == group && g.port == port) {
            g.refs += 1;
            return Ok(());
        }
        let local = *self
            .addrs
            .get(port)
            .ok_or(VerbsError::NoSuchObject("port"))?;
        let (IpAddr::V4(g4), IpAddr::V4(l4)) = (group, local.ip()) else {
            return Err(VerbsError::Unsupported("IPv6 multicast groups"));
        };
        let s =
            Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).map_err(io("socket"))?;
        s.set_reuse_address(true).map_err(io("SO_REUSEADDR"))?;
        let bind_to = SocketAddr::new(group, crate::soft::wire::ROCE_UDP_PORT);
        s.bind(&bind_to.into())
            .map_err(io("bind multicast group"))?;
        s.join_multicast_v4(&g4, &l4)
            .map_err(io("IP_ADD_MEMBERSHIP"))?;
        s.set_nonblocking(true).map_err(io("set_nonblocking"))?;
        sys::set_buffers(s.as_raw_fd(), SOCKET_BUFFER);
        groups.push(GroupSock {
            ip: group,
            port,
            sock: s.into(),
            refs: 1,
        });
        self.group_count.store(groups.len(), Ordering::Relaxed);
        drop(groups);
        // The engine thread must add the new socket to its poll set.
        self.wake.signal();
        Ok(())
    }

    /// Drops one reference to a joined group; the socket closes (leaving the group) with the
    /// last one.
    pub(crate) fn leave_group(&self, port: usize, group: IpAddr) {
        let mut groups = self.groups.lock();
        if let Some(i) = groups.iter().position(|g| g.ip == group && g.port == port) {
            groups[i].refs -= 1;
            if groups[i].refs == 0 {
                groups.swap_remove(i);
            }
        }
        self.group_count.store(groups.len(), Ordering::Relaxed);
    }

    /// Pops an asynchronous event.
    pub(crate) fn pop_event(&self) -> Option<AsyncEvent> {
        let mut q = self.events.lock();
        let e = q.pop_front();
        if q.is_empty() {
            self.event_fd.drain();
        }
        e
    }

    /// The fd that is readable while async events are queued.
    pub(crate) fn event_fd(&self) -> &EventFd {
        &self.event_fd
    }

    /// Drains everything the NIC has produced and sends the packets, in order, after
    /// releasing the NIC lock (the TX lock keeps the order between threads).
    fn flush(&self, mut nic: MutexGuard<'_, Nic>, now: u64) {
        // Everything the NIC has, held posts included, leaves now.
        self.doorbell.clear();
        let mut tx = self.tx.lock();
        let mut n = 0;
        loop {
            if tx.bufs.len() <= n {
                tx.bufs.push(vec![0u8; MAX_PACKET]);
            }
            let Some(t) = nic.poll_transmit(now, &mut tx.bufs[n]) else {
                break;
            };
            tx.meta.push((t.port, t.dst, t.len));
            n += 1;
        }
        let mut notify = Vec::new();
        while let Some(cq) = nic.poll_cq_notify() {
            notify.push(cq);
        }
        let mut events = Vec::new();
        while let Some(e) = nic.poll_event() {
            events.push(e);
        }
        let hosting = self.xrc.hosting();
        let mut forwarded = Vec::new();
        if hosting {
            nic.take_forwarded(&mut forwarded);
        }
        drop(nic);
        let pcap = pcap();
        let TxBatch { bufs, meta } = &mut *tx;
        if let Some(p) = pcap {
            let ts = clock::wall();
            let mut p = p.lock();
            for (i, &(port, dst, len)) in meta.iter().enumerate() {
                let src = self.addrs[port];
                let dst4791 = SocketAddr::new(dst.ip(), crate::soft::wire::ROCE_UDP_PORT);
                let _ = p.write_frame(ts, src, dst4791, &bufs[i][..len]);
            }
        }
        // Ports whose sends worked / failed for lack of a route or link (bit per port).
        let (mut sent_ok, mut link_err) = (0u64, 0u64);
        let mut i = 0;
        while i < meta.len() {
            let (port, dst, len) = meta[i];
            // A run of packets to one destination, all of one size but the last: one GSO
            // send (every segment is a complete RoCE packet).
            let mut j = i + 1;
            let mut total = len;
            if self.gso.load(Ordering::Relaxed) {
                while j < meta.len()
                    && j - i < GSO_MAX_SEGS
                    && meta[j].0 == port
                    && meta[j].1 == dst
                    && meta[j].2 <= len
                    && total + meta[j].2 <= GSO_MAX_BYTES
                {
                    total += meta[j].2;
                    j += 1;
                    if meta[j - 1].2 < len {
                        break;
                    }
                }
            }
            let Some(sock) = self.sockets.get(port) else {
                i = j;
                continue;
            };
            if j - i >= 2 {
                let segs: Vec<&[u8]> = (i..j).map(|k| &bufs[k][..meta[k].2]).collect();
                let to = socket2::SockAddr::from(dst);
                match sys::send_gso(sock.as_raw_fd(), &to, &segs, len as u16) {
                    Ok(_) => {
                        sent_ok |= 1 << port.min(63);
                        i = j;
                        continue;
                    }
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) => {
                        tracing::debug!("UDP GSO unavailable ({e}); sending packets one by one");
                        self.gso.store(false, Ordering::Relaxed);
                    }
                    Err(_) => {}
                }
            }
            for k in i..j {
                match sock.send_to(&bufs[k][..meta[k].2], meta[k].1) {
                    Ok(_) => sent_ok |= 1 << port.min(63),
                    Err(e) => {
                        self.tx_errors.fetch_add(1, Ordering::Relaxed);
                        if is_link_error(&e) {
                            // A routing error is a port failure only when the port's own
                            // link is down; otherwise this destination is unreachable.
                            let down = self
                                .ifnames
                                .get(port)
                                .and_then(Option::as_deref)
                                .is_some_and(sys::interface_link_down);
                            if down {
                                link_err |= 1 << port.min(63);
                            } else {
                                self.tx_unreachable.fetch_add(1, Ordering::Relaxed);
                            }
                        } else if e.raw_os_error() == Some(libc::EMSGSIZE) {
                            tracing::warn!(
                                port = port + 1,
                                len = meta[k].2,
                                "packet larger than the link MTU (path MTU above the port's \
                                 active MTU?); dropped"
                            );
                        }
                    }
                }
            }
            i = j;
        }
        meta.clear();
        // Still under the TX lock, so forwarded completions keep the NIC's order.
        if hosting && (!forwarded.is_empty() || !events.is_empty()) {
            self.xrc.forward(&mut forwarded, &mut events);
        }
        drop(tx);
        self.track_ports(sent_ok & !link_err, link_err, now);
        if !notify.is_empty() {
            let chans = self.channels.lock();
            for cq in notify {
                if let Some(ch) = chans.get(&cq).and_then(Weak::upgrade) {
                    ch.ready.lock().push_back(cq);
                    ch.fd.signal();
                }
            }
        }
        if !events.is_empty() {
            for e in &events {
                tracing::debug!(?e, "async event");
            }
            self.events.lock().extend(events);
            self.event_fd.signal();
        }
    }

    /// Turns send results into port state changes: a port whose sends fail with a link or
    /// routing error goes down (`PortError`, and QPs with an armed alternate migrate at
    /// once); a down port whose sends work again comes back (`PortActive`).
    fn track_ports(&self, ok: u64, failed: u64, now: u64) {
        let mut changed = Vec::new();
        for port in 0..self.addrs.len().min(64) {
            let bit = 1u64 << port;
            let was_down = self.port_down.load(Ordering::Relaxed) & bit != 0;
            if failed & bit != 0 && !was_down {
                self.port_down.fetch_or(bit, Ordering::Relaxed);
                changed.push((port, false));
            } else if ok & bit != 0 && was_down {
                self.port_down.fetch_and(!bit, Ordering::Relaxed);
                changed.push((port, true));
            }
        }
        if changed.is_empty() {
            return;
        }
        let mut nic = self.nic.lock();
        for (port, up) in changed {
            tracing::info!(port = port + 1, up, "soft port state changed");
            if up {
                nic.handle_port_up(port);
            } else {
                nic.handle_port_down(now, port);
            }
        }
        self.flush(nic, now);
    }

    /// Reads up to a batch of datagrams from every socket (non-blocking) and runs them and
    /// any due timers through the engine. Returns the number of datagrams handled. Only one
    /// thread drains at a time; others return 0 at once.
    fn drain(&self) -> usize {
        self.drain_at(self.now())
    }

    /// [`drain`](Self::drain) with the time already read by the caller (one clock read per
    /// poll: on this VM a read costs about a tenth of an empty poll).
    fn drain_at(&self, now: u64) -> usize {
        let Some(mut rx) = self.rx.try_lock() else {
            return 0;
        };
        let RxState {
            bufs,
            scratch,
            batch,
            got,
            sources,
            burst,
        } = &mut *rx;
        got.clear();
        sources.clear();
        for (port, sock) in self.sockets.iter().enumerate() {
            sources.push((port, self.addrs[port].ip(), sock.as_raw_fd()));
        }
        if self.group_count.load(Ordering::Relaxed) > 0 {
            for g in self.groups.lock().iter() {
                sources.push((g.port, g.ip, g.sock.as_raw_fd()));
            }
        }
        let mut slot = 0;
        let mut emptied = true;
        for &(port, dst, fd) in sources.iter() {
            if slot == bufs.len() {
                emptied = false;
                break;
            }
            batch.clear();
            let room = bufs.len() - slot;
            let n = if *burst {
                let n = sys::recv_batch(fd, &mut bufs[slot..], scratch, batch).unwrap_or(0);
                *burst = n > 1;
                n
            } else {
                match sys::recv_one(fd, &mut bufs[slot]) {
                    Ok(Some(r)) => {
                        batch.push(r);
                        *burst = true;
                        1
                    }
                    _ => 0,
                }
            };
            if n == room {
                emptied = false;
            }
            for (k, &(len, src, seg)) in batch.iter().enumerate() {
                if len == 0 {
                    // An empty datagram: still handed to the engine, which counts it.
                    got.push((port, src, dst, slot + k, 0, 0));
                }
                let mut off = 0;
                while off < len {
                    let n = seg.min(len - off);
                    got.push((port, src, dst, slot + k, off, n));
                    off += n;
                }
            }
            slot += n;
        }
        let mut nic = self.nic.lock();
        if got.is_empty() {
            // An idle poll: nothing more to coalesce with, so acknowledge now (doing it here,
            // not right after the packets were handled, keeps the ACK off the latency path:
            // the application sees its completion, and may answer, first). Then timers.
            let acks = emptied && nic.has_held_acks();
            if acks {
                nic.flush_acks(now, ACK_IDLE_NS);
            }
            let due = nic.poll_timeout().is_some_and(|t| t <= now);
            if due {
                nic.handle_timeout(now);
            }
            drop(rx);
            if acks || due {
                self.flush(nic, now);
            }
            return 0;
        }
        let pcap = pcap();
        let ts = pcap.is_some().then(clock::wall);
        let mut handled = 0;
        for &(port, src, dst, b, off, len) in got.iter() {
            let data = &bufs[b][off..off + len];
            if let (Some(p), Some(ts)) = (pcap, ts) {
                let to = SocketAddr::new(dst, crate::soft::wire::ROCE_UDP_PORT);
                let _ = p.lock().write_frame(ts, src, to, data);
            }
            match &self.faults {
                Some(f) => f.lock().handle_frame(now, (port, src, dst), data),
                None => {
                    nic.handle_datagram(now, port, src, dst, data);
                    handled += 1;
                }
            }
        }
        if let Some(f) = &self.faults {
            let mut f = f.lock();
            while let Some(((port, src, dst), frame)) = f.poll_frame(now) {
                nic.handle_datagram(now, port, src, dst, &frame);
                handled += 1;
            }
        }
        if nic.poll_timeout().is_some_and(|t| t <= now) {
            nic.handle_timeout(now);
        }
        let read = got.len();
        drop(rx);
        self.flush(nic, now);
        handled.max(read)
    }

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

impl Drop for Shared {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::Relaxed);
        self.wake.signal();
        flush_pcap();
    }
}

/// Stops the engine thread of a device that is being closed.
pub(crate) fn shutdown(shared: &Shared) {
    shared.xrc.shutdown();
    shared.shutdown.store(true, Ordering::Relaxed);
    shared.wake.signal();
    let handle = shared.thread.lock().take();
    if let Some(h) = handle
        && h.thread().id() != std::thread::current().id()
    {
        let _ = h.join();
    }
    flush_pcap();
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
fn engine_thread(weak: Weak<Shared>) {
    let mut fds = Vec::new();
    let mut next_link_check = 0u64;
    loop {
        let Some(sh) = weak.upgrade() else {
            return;
        };
        if sh.shutdown.load(Ordering::Relaxed) {
            return;
        }
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
