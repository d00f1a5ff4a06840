//! The soft provider's I/O driver: UDP sockets, the clock, the engine thread, completion
//! channel and async-event signalling, fault injection and packet capture around the
//! sans-I/O `Nic` (`crate::soft::engine::Nic`).
//!
//! Progress model (DESIGN.md): posting threads build and transmit their packets themselves;
//! a thread polling a CQ drains the sockets and runs the engine inline; the engine thread
//! stays off the sockets while some thread has polled within [`HANDOFF_NS`] and otherwise
//! sleeps in `poll(2)` on the sockets, a wake-up eventfd and the next timer. It never spins.

mod doorbell;
mod engine_thread;
pub(crate) mod pcap;
mod rx;
pub(crate) mod simnet;
pub(crate) mod sys;
mod tx;

pub(crate) use crate::os::clock;

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::Mutex;
use socket2::{Domain, Protocol, Socket, Type};

use super::engine::{AsyncEvent, Nic, NicConfig, NicCounters};
use super::fault::{FaultConfig, FaultInjector, FaultStats};
use crate::error::VerbsError;
use crate::types::Mtu;
use engine_thread::engine_thread;
use pcap::PcapWriter;
use rx::{GroupSock, RxState};
use sys::EventFd;
use tx::TxBatch;

/// After a CQ poll, the engine thread keeps off the sockets for this long.
pub(crate) const HANDOFF_NS: u64 = 2_000_000;
/// Receive buffers per progress call (each holds one GRO batch of up to 64 KiB).
const RX_BATCH: usize = 32;
/// Size of one receive buffer.
const RX_BUF: usize = 65_536 + 1024;
/// Socket buffer size requested (bytes).
const SOCKET_BUFFER: i32 = 16 << 20;

pub(crate) use crate::os::ChannelInner;

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
    /// While the engine thread sleeps (or is about to): until when, in device nanoseconds
    /// (`u64::MAX`: no timer). 0 while it is awake. A post that arms an earlier timer while
    /// nobody polls wakes it (`run_nic`).
    engine_sleeps_until: AtomicU64,
    wake: EventFd,
    /// A thread sleeps on a completion channel receiving this device's packets itself (see
    /// `park` in `engine_thread.rs`); the engine thread then stays off the sockets.
    parker: AtomicBool,
    /// When the current (or last) park began, in device nanoseconds.
    parked_since: AtomicU64,
    /// The parked thread left the sockets to a thread that polls, and wants to hear when
    /// that thread stops (`release` then signals `park_wake`).
    parker_waits_claim: AtomicBool,
    /// Wakes the parked thread to look again at who receives.
    park_wake: EventFd,
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
    /// The simulated net this device sends on instead of sockets, on its virtual clock
    /// (`simnet.rs`): no sockets and no engine thread then.
    sim: Option<simnet::SimNet>,
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

/// The process-wide capture file from `RDMX_PCAP` (`None` inside: not capturing).
static PCAP: OnceLock<Option<Mutex<PcapWriter>>> = OnceLock::new();
/// Why the capture file named by `RDMX_PCAP` could not be created.
static PCAP_ERROR: OnceLock<String> = OnceLock::new();

/// The process-wide capture file from `RDMX_PCAP`, shared by every soft device.
fn pcap() -> Option<&'static Mutex<PcapWriter>> {
    PCAP.get_or_init(|| {
        let path = std::env::var_os("RDMX_PCAP")?;
        // `%p` in the name becomes the process id, so several processes can capture side by
        // side without writing into one file.
        let path = path
            .to_string_lossy()
            .replace("%p", &std::process::id().to_string());
        match PcapWriter::create(std::path::Path::new(&path)) {
            Ok(w) => {
                // The writer lives in a static, which is never dropped: flush it when the
                // process exits normally, so the capture keeps its tail.
                if !sys::at_exit(flush_pcap_at_exit) {
                    tracing::debug!("RDMX_PCAP: atexit refused; the last frames may be lost");
                }
                Some(Mutex::new(w))
            }
            Err(e) => {
                let _ = PCAP_ERROR.set(format!("RDMX_PCAP: cannot create {path:?}: {e}"));
                None
            }
        }
    })
    .as_ref()
}

/// Flushes the capture at process exit. A thread that still holds the writer (exit while
/// it records a frame) is not waited for: the file then ends at the last whole record.
extern "C" fn flush_pcap_at_exit() {
    if let Some(Some(p)) = pcap_if_open()
        && let Some(mut w) = p.try_lock()
    {
        let _ = w.flush();
    }
}

/// The capture writer if [`pcap()`] has been called (never opens one).
fn pcap_if_open() -> Option<Option<&'static Mutex<PcapWriter>>> {
    PCAP.get().map(Option::as_ref)
}

/// The process's soft devices, for [`release_acks_at_exit`].
static DEVICES: Mutex<Vec<Weak<Shared>>> = parking_lot::const_mutex(Vec::new());

/// Adds a device to [`DEVICES`] (registering the exit hook with the first one).
fn register_device(dev: &Arc<Shared>) {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        if !sys::at_exit(release_acks_at_exit) {
            tracing::debug!("atexit refused; ACKs held at exit may be lost");
        }
    });
    let mut devs = DEVICES.lock();
    devs.retain(|d| d.strong_count() > 0);
    devs.push(Arc::downgrade(dev));
}

/// Sends, at process exit, the ACKs every device still holds back for coalescing. The
/// application may have seen the completion of a request (a peer's last message, its
/// Close) before the ACK left; a process that exits then would leave the peer retrying until
/// it gives up ("transport retries exhausted") on a peer that closed cleanly. A queue pair
/// that is destroyed sends its held ACK, but one that outlives the application's objects
/// (an XRC target belongs to the node, which a background thread may still hold) is never
/// destroyed before the process ends. A lock held by another thread is not waited for long.
extern "C" fn release_acks_at_exit() {
    let devs: Vec<Arc<Shared>> = match DEVICES.try_lock_for(std::time::Duration::from_millis(20)) {
        Some(d) => d.iter().filter_map(Weak::upgrade).collect(),
        None => return,
    };
    for dev in devs {
        if let Some(mut nic) = dev.nic.try_lock_for(std::time::Duration::from_millis(20))
            && nic.has_held_acks()
        {
            let now = dev.now();
            nic.flush_acks(now, 0);
            dev.flush(nic, now);
        }
    }
}

/// Flushes the capture file (so a process that exits does not lose its tail).
pub(crate) fn flush_pcap() {
    if let Some(p) = pcap() {
        let _ = p.lock().flush();
    }
}

fn bind(addr: SocketAddr) -> Result<UdpSocket, VerbsError> {
    let io = |op| move |error| VerbsError::Io { op, error };
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
    // UDP GRO starts off: the receive path switches it on when packets come in bursts
    // (`rx::PortRx`).
    Ok(s.into())
}

impl Shared {
    /// Opens a soft device with one port per address (port 0 picks an ephemeral port).
    pub(crate) fn open(
        addrs: &[SocketAddr],
        faults: Option<FaultConfig>,
        sim: Option<simnet::SimNet>,
    ) -> Result<Arc<Self>, VerbsError> {
        // A capture that was asked for and cannot be written is an error, not a silence.
        if pcap().is_none()
            && let Some(e) = PCAP_ERROR.get()
        {
            return Err(VerbsError::InvalidArgument(e.clone()));
        }
        let mut sockets = Vec::new();
        let mut bound = Vec::new();
        if sim.is_some() {
            // Simulated ports: no sockets; port 0 means the RoCEv2 port.
            for a in addrs {
                let port = if a.port() == 0 {
                    crate::soft::wire::ROCE_UDP_PORT
                } else {
                    a.port()
                };
                bound.push(SocketAddr::new(a.ip(), port));
            }
        }
        for a in addrs.iter().filter(|_| sim.is_none()) {
            let s = bind(*a)?;
            let local = s.local_addr().map_err(|error| VerbsError::Io {
                op: "getsockname",
                error,
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
        let ifnames: Vec<Option<String>> = if sim.is_some() {
            vec![None; bound.len()]
        } else {
            bound.iter().map(|a| sys::interface_of(a.ip())).collect()
        };
        tracing::debug!(?ifnames, "soft device interfaces");
        cfg.port_mtus = if sim.is_some() {
            vec![Mtu::Mtu4096; bound.len()]
        } else {
            ifnames
                .iter()
                .map(|n| port_active_mtu(n.as_deref()))
                .collect()
        };
        let port_mtus: Vec<usize> = cfg.port_mtus.iter().map(|m| m.bytes()).collect();
        let io = |op| move |error| VerbsError::Io { op, error };
        let wake = EventFd::new().map_err(io("eventfd"))?;
        let park_wake = EventFd::new().map_err(io("eventfd"))?;
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
                ports: vec![rx::PortRx::default(); sockets.len()],
                port_mtus: port_mtus.clone(),
            }),
            sockets,
            addrs: bound,
            epoch: clock::monotonic(),
            last_poll: AtomicU64::new(0),
            engine_sleeps_until: AtomicU64::new(0),
            wake,
            parker: AtomicBool::new(false),
            parked_since: AtomicU64::new(0),
            parker_waits_claim: AtomicBool::new(false),
            park_wake,
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
            sim,
        });
        if let Some(net) = &shared.sim {
            net.attach(&shared, &shared.addrs)?;
            return Ok(shared);
        }
        let weak = Arc::downgrade(&shared);
        let handle = std::thread::Builder::new()
            .name(format!("rdmx-soft-{}", shared.addrs[0]))
            .spawn(move || engine_thread(weak))
            .map_err(io("spawn engine thread"))?;
        *shared.thread.lock() = Some(handle);
        register_device(&shared);
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

    /// Nanoseconds since the device was opened (on a simulated net, its virtual clock).
    pub(crate) fn now(&self) -> u64 {
        match &self.sim {
            Some(net) => net.now_ns(),
            None => self.epoch.elapsed().as_nanos() as u64,
        }
    }

    /// The clock the device runs on.
    pub(crate) fn clock(&self) -> crate::os::Clock {
        self.sim
            .as_ref()
            .map_or_else(crate::os::Clock::real, |n| n.clock().clone())
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
            None => {
                self.flush(nic, now);
                // Sending armed a timer (the ACK timeout), perhaps earlier than the engine
                // thread's sleep: while nobody polls, nothing else would run it, and a lost
                // packet would never be retransmitted.
                let last = self.last_poll.load(Ordering::Relaxed);
                let polled = last != 0 && now.saturating_sub(last) < HANDOFF_NS;
                if posting && !polled {
                    let due = self.nic.lock().poll_timeout();
                    if due.is_some_and(|d| d < self.engine_sleeps_until.load(Ordering::Acquire)) {
                        self.wake.signal();
                    }
                }
            }
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
