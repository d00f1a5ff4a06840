//! The connection manager on libibverbs devices (feature `ibverbs`): the `cm` API mapped
//! onto librdmacm.
//!
//! An [`EventChannel`](super::EventChannel) creates its `rdma_event_channel` when the first
//! ID on a libibverbs device is made ([`create_id_on`](super::EventChannel::create_id_on)
//! with a hardware [`Context`]); its thread then also polls that channel's descriptor (made
//! non-blocking) and reads what is there with `rdma_get_cm_event`. Each event is copied out
//! (kind, status, private data, connection or UD parameters), acknowledged at once with
//! `rdma_ack_cm_event`, and then turned into a [`CmEvent`] for the [`CmId`] whose key is in
//! the `rdma_cm_id`'s `context`. A CONNECT_REQUEST's new `rdma_cm_id` becomes a new `CmId`
//! (with a key of its own). Because nothing is held unacknowledged, `rdma_destroy_id` and
//! `rdma_leave_multicast`, which wait for the acknowledgements of their events, never wait
//! on rdmx.
//!
//! # Queue pairs: rdmx's, not librdmacm's
//!
//! `rdma_create_qp` is not used. [`CmId::create_qp`] creates the QP through rdmx's
//! libibverbs provider, on the PD the caller gives or one of the ID's [`Context`], so that it
//! is an ordinary [`QueuePair`] (posting, modify, query, destruction by rdmx) and librdmacm
//! never holds a pointer to an object rdmx frees. librdmacm supports such IDs: without
//! `id->qp` the QP number travels in `rdma_conn_param`, the application moves the QP
//! through its states with the attributes `rdma_init_qp_attr` computes, and the active side
//! gets CONNECT_RESPONSE and completes with `rdma_establish`. rdmx does that work where
//! librdmacm would do it with its own QP:
//!
//! * create: INIT from `rdma_init_qp_attr` (UD: then RTR and RTS);
//! * active side, on CONNECT_RESPONSE: INIT again (the attributes may have changed since),
//!   RTR, RTS (the kernel's values), `rdma_establish`, then ESTABLISHED is reported; a
//!   failure moves the QP to ERR and reports CONNECT_ERROR (a REJECTED or DISCONNECTED of
//!   that attempt is then dropped, as librdmacm does);
//! * passive side, in `accept`: INIT again, RTR with `max_dest_rd_atomic` = the responder
//!   resources, RTS with `max_rd_atomic` = the initiator depth, then `rdma_accept`;
//! * `disconnect`, DISCONNECTED, REJECTED, UNREACHABLE and CONNECT_ERROR move the QP to ERR;
//! * multicast: the QP is attached to the group when MULTICAST_JOIN comes (or when it is
//!   created, for groups joined before) and detached on leave.
//!
//! The attributes from `rdma_init_qp_attr` go to `ibv_modify_qp` as they are (not through
//! [`QpAttr`], whose address vector has no LID, SL or rate). On an
//! InfiniBand port bits 21-23 of the returned mask are cleared first, as librdmacm does.
//! Responder resources and initiator depth are limited to the device's maxima (librdmacm
//! refuses larger values), and a passive side's initiator depth to the requester's
//! responder resources.
//!
//! # Devices: the ID's `Context` is the caller's, not librdmacm's
//!
//! librdmacm opens its own `ibv_context` per device (`id->verbs`) and owns it: it opens it
//! lazily, allocates a PD of its own in it while IDs use the device (freed with the last),
//! and closes it when the device is unplugged and no ID uses it any more. rdmx's
//! libibverbs provider owns and closes the contexts it wraps, runs a thread on each that
//! consumes its asynchronous events, and makes their descriptors non-blocking. Adopting
//! librdmacm's context would give it two owners, so it is not done: an ID on hardware is
//! created with `create_id_on(ctx)`, and whenever librdmacm binds it to a device (after
//! `bind_addr`, at ADDR_RESOLVED, for a CONNECT_REQUEST) the device's name must be the one
//! `ctx` was opened with. [`CmId::context`] is then `ctx`, a second context on the very
//! device librdmacm chose: QP numbers, keys and addresses are the device's, whichever
//! context made them. An address on another device is refused (`bind_addr`:
//! `InvalidArgument`; `resolve_addr`: ADDR_ERROR with status `-ENODEV`; a request arriving
//! on another device: rejected and not reported).
//! [`EventChannel::create_id`](super::EventChannel::create_id), without a device, stays on
//! the soft provider.
//!
//! # Not covered
//!
//! Listening, connecting and accepting in the UDP port space (SIDR) are `Unsupported`, as
//! on the soft provider. [`CmStats`](super::CmStats) are zero (the kernel keeps the CM's
//! counters). Multicast attaches with the group's MLID, but rdmx's libibverbs provider
//! builds RoCE address vectors only (see `ibv/qp.rs`), so UD sends to an InfiniBand group
//! are not expected to work. Nothing here has run against a device yet (see the crate docs).
#![allow(unsafe_code)]

mod ffi;

use std::any::Any;
use std::collections::HashMap;
use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::RawFd;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use ibverbs_sys as ibv;
use parking_lot::Mutex;

use super::conn::REJECT_PRIVATE_MAX;
use super::error::CmError;
use super::event::{ChannelCore, CmEvent, CmEventKind, PeerConnParam, UdParam, status};
use super::id::{CmId, ConnParam, IdInner, PortSpace, random_psn};
use crate::device::Context;
use crate::ibv::IbvDevice;
use crate::qp::QueuePair;
use crate::types::{AhAttr, Gid, QpAttr, QpAttrMask as M, QpState, QpType, Qpn};

/// Events read per wake-up of the channel thread, at most.
const EVENT_BATCH: usize = 64;

/// The `ibv_qp_attr_mask` bits librdmacm clears on InfiniBand ports (bits 21-23).
const IB_ROCE_ONLY_MASK: c_int = 0x00E0_0000;

/// A librdmacm object pointer.
struct Raw<T>(*mut T);

// SAFETY: librdmacm's channels and IDs may be used from any thread (the library locks its
// own state; the kernel serialises the commands). A `Raw` is freed only by the `Drop` of its
// owner (`HwChannel`, `HwId`), after which nothing can reach it.
unsafe impl<T> Send for Raw<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Raw<T> {}

/// `errno` of the librdmacm call `op` that just failed, as a [`CmError`].
fn last_err(op: &'static str) -> CmError {
    CmError::Io {
        op,
        error: std::io::Error::last_os_error(),
    }
}

/// `rc` of librdmacm call `op` (0, or -1 with errno).
fn check(op: &'static str, rc: c_int) -> Result<(), CmError> {
    if rc == 0 { Ok(()) } else { Err(last_err(op)) }
}

/// The libibverbs device behind `ctx`, if it is one.
fn ibv_device(ctx: &Context) -> Option<&IbvDevice> {
    let any: &dyn Any = &**ctx.dev();
    any.downcast_ref::<IbvDevice>()
}

/// Whether `ctx` is a libibverbs device (whose IDs go through librdmacm).
pub(crate) fn is_ibverbs(ctx: &Context) -> bool {
    ibv_device(ctx).is_some()
}

/// `addr` as a C socket address.
fn to_sockaddr(addr: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: a plain C struct of integers; all-zero bytes are valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: a sockaddr_storage is large and aligned enough for any socket address.
            unsafe {
                std::ptr::from_mut(&mut ss)
                    .cast::<libc::sockaddr_in>()
                    .write(sin)
            };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo().to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above.
            unsafe {
                std::ptr::from_mut(&mut ss)
                    .cast::<libc::sockaddr_in6>()
                    .write(sin6)
            };
        }
    }
    ss
}

/// The socket address in `ss`, if it is an IPv4 or IPv6 one.
fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match c_int::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in; it is aligned for it.
            let sin = unsafe { std::ptr::from_ref(ss).cast::<libc::sockaddr_in>().read() };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for a sockaddr_in6.
            let sin6 = unsafe { std::ptr::from_ref(ss).cast::<libc::sockaddr_in6>().read() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::new(
                IpAddr::V6(ip),
                u16::from_be(sin6.sin6_port),
            ))
        }
        _ => None,
    }
}

/// A millisecond time-out for librdmacm (at least 1 ms, at most `i32::MAX`).
fn millis(t: Duration) -> c_int {
    c_int::try_from(t.as_millis()).unwrap_or(c_int::MAX).max(1)
}

/// A device limit as a `u8` count.
fn limit(v: u32) -> u8 {
    u8::try_from(v).unwrap_or(u8::MAX)
}

/// The address vector of a UD event, in rdmx's terms.
fn ah_from(a: &ibv::ibv_ah_attr) -> AhAttr {
    // SAFETY: every bit pattern of the GID union is a valid byte array.
    let dgid = Gid(unsafe { a.grh.dgid.raw });
    AhAttr {
        dgid,
        sgid_index: a.grh.sgid_index,
        port_num: a.port_num,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        flow_label: a.grh.flow_label,
        udp_port: 4791,
    }
}

/// An event copied out of librdmacm's `struct rdma_cm_event` before it is acknowledged.
struct RawEvent {
    /// `enum rdma_cm_event_type`.
    event: u32,
    status: i32,
    /// The ID (for CONNECT_REQUEST, the new one, which rdmx now owns).
    id: *mut ffi::rdma_cm_id,
    /// The key in the ID's `context` (for CONNECT_REQUEST, the listener's).
    key: u64,
    private_data: Vec<u8>,
    conn: ffi::rdma_conn_param,
    ud: Option<(AhAttr, Gid, u16, u32, u32)>,
    /// A multicast event's join context (rdmx's group token).
    mc_token: u64,
}

impl RawEvent {
    /// Copies `ev`.
    ///
    /// # Safety
    /// `ev` is an event `rdma_get_cm_event` returned and that is not yet acknowledged.
    unsafe fn copy(ev: *const ffi::rdma_cm_event) -> Self {
        use ffi::event_type as e;
        // SAFETY: the caller's event is live; its fields are plain values.
        let (event, status, id, listen_id, param) = unsafe {
            (
                (*ev).event,
                (*ev).status,
                (*ev).id,
                (*ev).listen_id,
                (*ev).param,
            )
        };
        // SAFETY: both union members are plain C data (integers, pointers, byte unions), so
        // reading either is defined whatever librdmacm filled in; each is used only for the
        // events it belongs to.
        let (conn, ud) = unsafe { (param.conn, param.ud) };
        let owner = if event == e::CONNECT_REQUEST {
            listen_id
        } else {
            id
        };
        let key = if owner.is_null() {
            0
        } else {
            // SAFETY: the event's IDs are live while it is unacknowledged.
            unsafe { (*owner).context as usize as u64 }
        };
        let multicast = matches!(event, e::MULTICAST_JOIN | e::MULTICAST_ERROR);
        // The private data pointer and length sit at the same places in both members. A
        // multicast event's pointer is the join's context, not data.
        let private_data = if multicast || conn.private_data.is_null() {
            Vec::new()
        } else {
            let len = usize::from(conn.private_data_len);
            // SAFETY: librdmacm points `private_data` at `private_data_len` bytes inside
            // the event, valid until it is acknowledged.
            unsafe { std::slice::from_raw_parts(conn.private_data.cast::<u8>(), len) }.to_vec()
        };
        let ud = (event == e::MULTICAST_JOIN).then(|| {
            let ah = ah_from(&ud.ah_attr);
            (ah, ah.dgid, ud.ah_attr.dlid, ud.qp_num, ud.qkey)
        });
        Self {
            event,
            status,
            id,
            key,
            private_data,
            conn: ffi::rdma_conn_param {
                private_data: std::ptr::null(),
                private_data_len: 0,
                ..conn
            },
            ud,
            mc_token: if multicast {
                conn.private_data as usize as u64
            } else {
                0
            },
        }
    }

    /// The peer's connection parameters.
    fn peer(&self) -> PeerConnParam {
        PeerConnParam {
            responder_resources: self.conn.responder_resources,
            initiator_depth: self.conn.initiator_depth,
            retry_count: self.conn.retry_count,
            rnr_retry_count: self.conn.rnr_retry_count,
            qp_num: Qpn(self.conn.qp_num),
            srq: self.conn.srq != 0,
        }
    }
}

/// A channel's `rdma_event_channel` and the IDs whose events it carries, by key.
pub(crate) struct HwChannel {
    ch: Raw<ffi::rdma_event_channel>,
    fd: RawFd,
    ids: Mutex<HashMap<u64, Weak<IdInner>>>,
    next_key: AtomicU64,
}

impl std::fmt::Debug for HwChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HwChannel")
            .field("fd", &self.fd)
            .finish_non_exhaustive()
    }
}

impl HwChannel {
    /// `rdma_create_event_channel`, with its descriptor made non-blocking.
    ///
    /// # Errors
    /// `Io` when librdmacm has no kernel CM (`/dev/infiniband/rdma_cm` missing: `ENODEV`)
    /// or the descriptor cannot be set up.
    pub(crate) fn new() -> Result<Self, CmError> {
        // SAFETY: no arguments; NULL with errno set on failure.
        let ch = unsafe { ffi::rdma_create_event_channel() };
        if ch.is_null() {
            return Err(last_err("rdma_create_event_channel"));
        }
        // SAFETY: a live channel; its descriptor is a plain field.
        let fd = unsafe { (*ch).fd };
        // SAFETY: F_GETFL / F_SETFL on the channel's own descriptor only change its status
        // flags; `rdma_get_cm_event` then returns EAGAIN instead of blocking.
        let ok = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) >= 0
        };
        if !ok {
            let error = std::io::Error::last_os_error();
            // SAFETY: created above, no ID on it yet; destroyed once.
            unsafe { ffi::rdma_destroy_event_channel(ch) };
            return Err(CmError::Io {
                op: "make the rdma_cm channel non-blocking",
                error,
            });
        }
        Ok(Self {
            ch: Raw(ch),
            fd,
            ids: Mutex::new(HashMap::new()),
            next_key: AtomicU64::new(1),
        })
    }

    /// The descriptor the channel thread polls.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd
    }

    fn key(&self) -> u64 {
        self.next_key.fetch_add(1, Ordering::Relaxed)
    }

    fn register(&self, key: u64, inner: &Arc<IdInner>) {
        let mut ids = self.ids.lock();
        ids.retain(|_, w| w.strong_count() > 0);
        ids.insert(key, Arc::downgrade(inner));
    }

    fn lookup(&self, key: u64) -> Option<Arc<IdInner>> {
        self.ids.lock().get(&key).and_then(Weak::upgrade)
    }

    /// `rdma_create_id` on this channel: an ID whose events this channel reads.
    fn create_raw(&self, key: u64, ps: PortSpace) -> Result<*mut ffi::rdma_cm_id, CmError> {
        let mut id = std::ptr::null_mut();
        // SAFETY: a live channel; `id` is a live out-pointer; the context is an opaque
        // value librdmacm only stores.
        let rc = unsafe {
            ffi::rdma_create_id(
                self.ch.0,
                &raw mut id,
                key as usize as *mut c_void,
                u32::from(ps.number()),
            )
        };
        check("rdma_create_id", rc)?;
        if id.is_null() {
            return Err(CmError::InvalidState {
                op: "rdma_create_id",
                why: "librdmacm returned no ID",
            });
        }
        Ok(id)
    }

    /// Reads what the channel holds (at most [`EVENT_BATCH`] events) and queues the
    /// translated events on `core`.
    pub(crate) fn drain(self: &Arc<Self>, core: &Arc<ChannelCore>) {
        for _ in 0..EVENT_BATCH {
            let mut ev = std::ptr::null_mut();
            // SAFETY: a live, non-blocking channel; `ev` is a live out-pointer.
            let rc = unsafe { ffi::rdma_get_cm_event(self.ch.0, &raw mut ev) };
            if rc != 0 || ev.is_null() {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::WouldBlock {
                    // The descriptor may stay readable: pause rather than spin on it.
                    tracing::warn!(error = %e, "rdma_get_cm_event failed");
                    std::thread::sleep(Duration::from_millis(10));
                }
                return;
            }
            // SAFETY: `ev` was just returned and is not acknowledged yet.
            let raw = unsafe { RawEvent::copy(ev) };
            // SAFETY: acknowledged once; nothing reads `ev` afterwards.
            unsafe { ffi::rdma_ack_cm_event(ev) };
            self.dispatch(core, raw);
        }
    }

    fn dispatch(self: &Arc<Self>, core: &Arc<ChannelCore>, raw: RawEvent) {
        if raw.event == ffi::event_type::CONNECT_REQUEST {
            self.connect_request(core, raw);
            return;
        }
        let Some(inner) = self.lookup(raw.key) else {
            tracing::debug!(event = raw.event, "rdma_cm event for an ID that is gone");
            return;
        };
        let id = CmId::from_inner(&inner);
        if let Some(hw) = inner.hw.as_ref()
            && let Some(ev) = hw.on_event(&id, raw)
        {
            core.push(ev);
        }
    }

    /// A CONNECT_REQUEST: the new `rdma_cm_id` becomes a new [`CmId`].
    fn connect_request(self: &Arc<Self>, core: &Arc<ChannelCore>, raw: RawEvent) {
        if raw.id.is_null() {
            return;
        }
        let key = self.key();
        // SAFETY: librdmacm created this ID for the request and handed it to us; `context`
        // is the application's field (it holds the listener's key until we set ours).
        unsafe { (*raw.id).context = key as usize as *mut c_void };
        let hw = HwId::new(raw.id, key, self);
        let listener = self.lookup(raw.key);
        let Some((listener, pinned)) = listener.and_then(|l| l.pinned.clone().map(|p| (l, p)))
        else {
            tracing::debug!("rdma_cm: a request for a listener that is gone; rejected");
            if let Err(e) = hw.reject_raw(&[]) {
                tracing::debug!(error = %e, "rdma_reject");
            }
            return;
        };
        let child = CmId::create_hw(core, listener.ps, pinned, hw);
        self.register(key, &child.inner);
        let Some(hw) = child.inner.hw.as_ref() else {
            return;
        };
        if let Err(other) = hw.attach(&child.inner) {
            tracing::debug!(
                device = other,
                "rdma_cm: a request on another device; rejected"
            );
            if let Err(e) = hw.reject_raw(&[]) {
                tracing::debug!(error = %e, "rdma_reject");
            }
            return;
        }
        {
            let (local, peer) = hw.addrs();
            let mut st = child.inner.st.lock();
            st.local = local;
            st.peer = peer;
            st.route_resolved = true;
        }
        {
            let mut hs = hw.st.lock();
            hs.conn = Conn::ReqRcvd;
            hs.peer_resources = raw.conn.responder_resources;
        }
        let mut ev = CmEvent::new(CmEventKind::ConnectRequest, child.clone());
        ev.listen_id = Some(CmId::from_inner(&listener));
        ev.status = raw.status;
        ev.conn = Some(raw.peer());
        ev.private_data = raw.private_data;
        core.push(ev);
    }
}

impl Drop for HwChannel {
    fn drop(&mut self) {
        // Every HwId holds this channel, so its IDs are destroyed; their events were all
        // acknowledged as they were read.
        // SAFETY: created in `new`, destroyed once, with no ID left on it.
        unsafe { ffi::rdma_destroy_event_channel(self.ch.0) };
    }
}

/// Where a connection stands, as far as the calls allowed on it go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Conn {
    #[default]
    Idle,
    /// `rdma_connect` made; waiting for the answer.
    Connecting,
    /// A passive ID whose request waits for `accept` or `reject`.
    ReqRcvd,
    /// `rdma_accept` made; waiting for the RTU.
    Accepted,
    Established,
    Disconnecting,
    Closed,
}

impl Conn {
    fn name(self) -> &'static str {
        match self {
            Self::Idle => "the ID is not connecting",
            Self::Connecting => "the ID is connecting",
            Self::ReqRcvd => "the request is not answered yet",
            Self::Accepted => "the request is already accepted",
            Self::Established => "the connection is established",
            Self::Disconnecting => "the connection is being torn down",
            Self::Closed => "the connection is closed (rejected, failed or disconnected)",
        }
    }
}

/// A multicast group an ID joined (or is joining).
#[derive(Debug, Clone, Copy)]
struct Group {
    ip: IpAddr,
    /// The join's context, which its events carry back.
    token: u64,
    /// The MGID and MLID, once MULTICAST_JOIN came.
    joined: Option<(Gid, u16)>,
}

#[derive(Debug, Default)]
struct HwState {
    conn: Conn,
    /// A passive ID: the requester's responder resources (our initiator depth's bound).
    peer_resources: u8,
    /// The ID's QP takes its receives from an SRQ.
    qp_srq: bool,
    /// The connection failed locally after CONNECT_RESPONSE: its later REJECTED or
    /// DISCONNECTED is not reported.
    connect_error: bool,
    groups: Vec<Group>,
    next_token: u64,
}

/// The librdmacm side of a [`CmId`] on a libibverbs device: its `rdma_cm_id`.
pub(crate) struct HwId {
    id: Raw<ffi::rdma_cm_id>,
    chan: Arc<HwChannel>,
    key: u64,
    st: Mutex<HwState>,
}

impl std::fmt::Debug for HwId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HwId")
            .field("key", &self.key)
            .field("st", &self.st.try_lock().map(|s| s.conn))
            .finish_non_exhaustive()
    }
}

impl Drop for HwId {
    fn drop(&mut self) {
        // SAFETY: the ID is ours and destroyed once. Its events were acknowledged as they
        // were read, so the call does not wait; the kernel rejects a pending request and
        // sends a DREQ for an established connection. The QP (rdmx's) outlives it.
        let rc = unsafe { ffi::rdma_destroy_id(self.id.0) };
        if rc != 0 {
            tracing::warn!(
                error = %std::io::Error::last_os_error(),
                "rdma_destroy_id failed; the ID is leaked"
            );
        }
        self.chan.ids.lock().remove(&self.key);
    }
}

/// Creates an ID on the libibverbs device `ctx` (see the module docs).
pub(crate) fn create_id(
    core: &Arc<ChannelCore>,
    ctx: &Context,
    ps: PortSpace,
) -> Result<CmId, CmError> {
    let chan = core.rdmacm()?;
    let key = chan.key();
    let raw = chan.create_raw(key, ps)?;
    let id = CmId::create_hw(core, ps, ctx.clone(), HwId::new(raw, key, &chan));
    chan.register(key, &id.inner);
    Ok(id)
}

impl HwId {
    fn new(id: *mut ffi::rdma_cm_id, key: u64, chan: &Arc<HwChannel>) -> Self {
        Self {
            id: Raw(id),
            chan: Arc::clone(chan),
            key,
            st: Mutex::new(HwState {
                next_token: 1,
                ..HwState::default()
            }),
        }
    }

    /// The name of the device librdmacm bound the ID to, if it is bound to one.
    fn device_name(&self) -> Option<String> {
        // SAFETY: a live ID; `verbs` is librdmacm's context of the bound device (NULL
        // before), valid while the ID lives.
        let verbs = unsafe { (*self.id.0).verbs };
        if verbs.is_null() {
            return None;
        }
        // SAFETY: a live context's device pointer.
        let dev = unsafe { (*verbs).device };
        if dev.is_null() {
            return None;
        }
        // SAFETY: a live device; the name is a NUL-terminated string of the library.
        let name = unsafe { ibv::ibv_get_device_name(dev) };
        if name.is_null() {
            return None;
        }
        // SAFETY: checked non-null; copied at once.
        Some(
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    /// Binds `inner` to its pinned device if librdmacm's device (if any yet) is that one;
    /// else the name of librdmacm's device.
    fn attach(&self, inner: &IdInner) -> Result<(), String> {
        let Some(pinned) = inner.pinned.as_ref() else {
            return Err("(no device)".into());
        };
        match self.device_name() {
            Some(n) if n != pinned.name() => Err(n),
            _ => {
                let _ = inner.ctx.set(pinned.clone());
                Ok(())
            }
        }
    }

    /// The local and peer addresses librdmacm holds for the ID.
    fn addrs(&self) -> (Option<SocketAddr>, Option<SocketAddr>) {
        // SAFETY: a live ID; librdmacm wrote the addresses in the call or event this follows,
        // on this thread. Copies are taken, no reference is kept.
        let (src, dst) = unsafe {
            let a = &raw const (*self.id.0).route.addr;
            ((&raw const (*a).src).read(), (&raw const (*a).dst).read())
        };
        let nonzero = |a: SocketAddr| (!a.ip().is_unspecified() || a.port() != 0).then_some(a);
        (from_sockaddr(&src), from_sockaddr(&dst).and_then(nonzero))
    }

    /// The port librdmacm bound the ID to.
    fn port_num(&self) -> u8 {
        // SAFETY: a live ID; a plain field librdmacm sets when it binds the ID.
        unsafe { (*self.id.0).port_num }.max(1)
    }

    /// `rdma_bind_addr`.
    pub(crate) fn bind_addr(&self, id: &CmId, addr: SocketAddr) -> Result<(), CmError> {
        let mut st = id.inner.st.lock();
        if st.local.is_some() {
            return Err(CmError::InvalidState {
                op: "bind",
                why: "the ID is already bound",
            });
        }
        let mut sa = to_sockaddr(addr);
        // SAFETY: a live ID; `sa` is a live socket address of its family's size.
        let rc = unsafe { ffi::rdma_bind_addr(self.id.0, (&raw mut sa).cast()) };
        check("rdma_bind_addr", rc)?;
        if let Err(other) = self.attach(&id.inner) {
            return Err(CmError::InvalidArgument(format!(
                "{addr} belongs to device {other}, not to the ID's device; drop the ID"
            )));
        }
        st.local = self.addrs().0.or(Some(addr));
        Ok(())
    }

    /// `rdma_resolve_addr`. ADDR_RESOLVED or ADDR_ERROR follows; a failure the kernel
    /// reports at once for lack of a device or route is reported as ADDR_ERROR too.
    pub(crate) fn resolve_addr(
        &self,
        id: &CmId,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<(), CmError> {
        {
            let st = id.inner.st.lock();
            if st.backlog.is_some() || !matches!(self.st.lock().conn, Conn::Idle) {
                return Err(CmError::InvalidState {
                    op: "resolve an address",
                    why: "the ID is connected or listening",
                });
            }
        }
        let mut s = src.map(to_sockaddr);
        let mut d = to_sockaddr(dst);
        let sp = s
            .as_mut()
            .map_or(std::ptr::null_mut(), |s| (&raw mut *s).cast());
        // SAFETY: a live ID; the addresses are live socket addresses (or NULL for none).
        let rc =
            unsafe { ffi::rdma_resolve_addr(self.id.0, sp, (&raw mut d).cast(), millis(timeout)) };
        if rc != 0 {
            let error = std::io::Error::last_os_error();
            let code = error.raw_os_error().unwrap_or(0);
            let no_route = [
                libc::ENODEV,
                libc::EADDRNOTAVAIL,
                libc::ENETUNREACH,
                libc::EHOSTUNREACH,
            ];
            if no_route.contains(&code) {
                tracing::debug!(%error, %dst, "rdma_resolve_addr: no device");
                id.push(CmEventKind::AddrError, -code);
                return Ok(());
            }
            return Err(CmError::Io {
                op: "rdma_resolve_addr",
                error,
            });
        }
        Ok(())
    }

    /// `rdma_resolve_route`.
    pub(crate) fn resolve_route(&self, id: &CmId, timeout: Duration) -> Result<(), CmError> {
        if id.inner.st.lock().peer.is_none() {
            return Err(CmError::InvalidState {
                op: "resolve a route",
                why: "the address is not resolved",
            });
        }
        // SAFETY: a live ID.
        let rc = unsafe { ffi::rdma_resolve_route(self.id.0, millis(timeout)) };
        check("rdma_resolve_route", rc)
    }

    /// `rdma_listen`.
    pub(crate) fn listen(&self, id: &CmId, backlog: usize) -> Result<(), CmError> {
        let mut st = id.inner.st.lock();
        if st.local.is_none() {
            return Err(CmError::InvalidState {
                op: "listen",
                why: "the ID is not bound (bind_addr)",
            });
        }
        if st.peer.is_some() {
            return Err(CmError::InvalidState {
                op: "listen",
                why: "the ID is resolved to a peer",
            });
        }
        let n = c_int::try_from(backlog.max(1)).unwrap_or(c_int::MAX);
        // SAFETY: a live, bound ID.
        let rc = unsafe { ffi::rdma_listen(self.id.0, n) };
        check("rdma_listen", rc)?;
        st.backlog = Some(backlog.max(1));
        Ok(())
    }

    /// `rdma_init_qp_attr` for `state`.
    fn init_attr(&self, state: u32) -> Result<(ibv::ibv_qp_attr, c_int), CmError> {
        let mut attr = ibv::ibv_qp_attr {
            qp_state: state,
            ..Default::default()
        };
        let mut mask: c_int = 0;
        // SAFETY: a live ID; both out-values are live and correctly typed.
        let rc = unsafe { ffi::rdma_init_qp_attr(self.id.0, &raw mut attr, &raw mut mask) };
        check("rdma_init_qp_attr", rc)?;
        Ok((attr, mask))
    }

    /// Moves `qp` (of `ctx`) to `state` with librdmacm's attributes, `adjust`ed.
    fn move_qp(
        &self,
        ctx: &Context,
        qp: &QueuePair,
        state: u32,
        adjust: impl FnOnce(&mut ibv::ibv_qp_attr),
    ) -> Result<(), CmError> {
        let dev = ibv_device(ctx).ok_or(CmError::Unsupported(
            "librdmacm IDs on a device that is not a libibverbs one",
        ))?;
        let (mut attr, mut mask) = self.init_attr(state)?;
        if state == ibv::ibv_qp_state::IBV_QPS_RTR
            && ctx
                .query_port(self.port_num())
                .is_ok_and(|p| p.link_layer == "InfiniBand")
        {
            mask &= !IB_ROCE_ONLY_MASK;
        }
        adjust(&mut attr);
        dev.modify_qp_raw(qp.qp_num(), &mut attr, mask)?;
        Ok(())
    }

    /// Brings a new QP of the ID to its first state (see the module docs).
    pub(crate) fn init_qp(&self, ctx: &Context, qp: &QueuePair, srq: bool) -> Result<(), CmError> {
        use ibv::ibv_qp_state as s;
        self.move_qp(ctx, qp, s::IBV_QPS_INIT, |_| {})?;
        if qp.qp_type() == QpType::Ud {
            let rtr = QpAttr {
                qp_state: QpState::Rtr,
                ..QpAttr::default()
            };
            qp.modify(&rtr, M::STATE)?;
            let rts = QpAttr {
                qp_state: QpState::Rts,
                sq_psn: random_psn(),
                ..QpAttr::default()
            };
            qp.modify(&rts, M::STATE | M::SQ_PSN)?;
        }
        let mut hs = self.st.lock();
        hs.qp_srq = srq;
        for g in &hs.groups {
            if let Some((mgid, mlid)) = g.joined {
                qp.attach_mcast(mgid, mlid)?;
            }
        }
        Ok(())
    }

    /// The connection parameters for librdmacm.
    fn conn_param(
        param: &ConnParam,
        resources: u8,
        depth: u8,
        srq: bool,
        qp: &QueuePair,
    ) -> ffi::rdma_conn_param {
        ffi::rdma_conn_param {
            private_data: if param.private_data.is_empty() {
                std::ptr::null()
            } else {
                param.private_data.as_ptr().cast()
            },
            private_data_len: u8::try_from(param.private_data.len()).unwrap_or(u8::MAX),
            responder_resources: resources,
            initiator_depth: depth,
            flow_control: 1,
            retry_count: param.retry_count,
            rnr_retry_count: param.rnr_retry_count,
            srq: u8::from(srq),
            qp_num: qp.qp_num().0,
        }
    }

    /// `rdma_connect` (the caller checked the parameters and the port space).
    pub(crate) fn connect(&self, id: &CmId, param: &ConnParam) -> Result<(), CmError> {
        const OP: &str = "connect";
        let inner = &id.inner;
        let (Some(ctx), Some(qp)) = (inner.ctx.get(), inner.qp.get()) else {
            return Err(CmError::InvalidState {
                op: OP,
                why: "the ID has no QP (create_qp)",
            });
        };
        {
            let st = inner.st.lock();
            if st.peer.is_none() {
                return Err(CmError::InvalidState {
                    op: OP,
                    why: "the address is not resolved",
                });
            }
            if !st.route_resolved {
                return Err(CmError::InvalidState {
                    op: OP,
                    why: "the route is not resolved",
                });
            }
        }
        let mut hs = self.st.lock();
        if hs.conn != Conn::Idle {
            return Err(CmError::InvalidState {
                op: OP,
                why: "the ID already connects",
            });
        }
        let dev = ctx.query_device();
        let resources = param.responder_resources.min(limit(dev.max_qp_rd_atom));
        let depth = param.initiator_depth.min(limit(dev.max_qp_init_rd_atom));
        let mut p = Self::conn_param(param, resources, depth, hs.qp_srq, qp);
        // SAFETY: a live ID; `p` and the private data it points to live across the call,
        // which copies them.
        let rc = unsafe { ffi::rdma_connect(self.id.0, &raw mut p) };
        check("rdma_connect", rc)?;
        hs.conn = Conn::Connecting;
        hs.connect_error = false;
        Ok(())
    }

    /// `rdma_accept` (the caller checked the parameters).
    pub(crate) fn accept(&self, id: &CmId, param: &ConnParam) -> Result<(), CmError> {
        const OP: &str = "accept";
        use ibv::ibv_qp_state as s;
        let inner = &id.inner;
        let (Some(ctx), Some(qp)) = (inner.ctx.get(), inner.qp.get()) else {
            return Err(CmError::InvalidState {
                op: OP,
                why: "the ID has no QP (create_qp)",
            });
        };
        let mut hs = self.st.lock();
        if hs.conn != Conn::ReqRcvd {
            return Err(CmError::InvalidState {
                op: OP,
                why: if hs.conn == Conn::Idle {
                    "no connection request"
                } else {
                    hs.conn.name()
                },
            });
        }
        let dev = ctx.query_device();
        let resources = param.responder_resources.min(limit(dev.max_qp_rd_atom));
        let depth = param
            .initiator_depth
            .min(limit(dev.max_qp_init_rd_atom))
            .min(hs.peer_resources);
        let moved = if matches!(qp.qp_type(), QpType::Rc | QpType::Uc) {
            self.move_qp(ctx, qp, s::IBV_QPS_INIT, |_| {})
                .and_then(|()| {
                    self.move_qp(ctx, qp, s::IBV_QPS_RTR, |a| {
                        a.max_dest_rd_atomic = resources;
                    })
                })
                .and_then(|()| self.move_qp(ctx, qp, s::IBV_QPS_RTS, |a| a.max_rd_atomic = depth))
        } else {
            Ok(())
        };
        let accepted = moved.and_then(|()| {
            let mut p = Self::conn_param(param, resources, depth, hs.qp_srq, qp);
            // SAFETY: a live ID with a pending request; `p` and its private data live
            // across the call, which copies them.
            let rc = unsafe { ffi::rdma_accept(self.id.0, &raw mut p) };
            check("rdma_accept", rc)
        });
        if let Err(e) = accepted {
            qp_error(qp);
            return Err(e);
        }
        hs.conn = Conn::Accepted;
        Ok(())
    }

    /// `rdma_reject` (the caller checked the length).
    pub(crate) fn reject(&self, private_data: &[u8]) -> Result<(), CmError> {
        let mut hs = self.st.lock();
        if hs.conn != Conn::ReqRcvd {
            return Err(CmError::InvalidState {
                op: "reject",
                why: "no connection request",
            });
        }
        self.reject_raw(private_data)?;
        hs.conn = Conn::Closed;
        Ok(())
    }

    /// `rdma_reject` with at most [`REJECT_PRIVATE_MAX`] bytes.
    fn reject_raw(&self, private_data: &[u8]) -> Result<(), CmError> {
        let data = private_data
            .get(..REJECT_PRIVATE_MAX)
            .unwrap_or(private_data);
        let len = u8::try_from(data.len()).unwrap_or(u8::MAX);
        let ptr = if data.is_empty() {
            std::ptr::null()
        } else {
            data.as_ptr().cast()
        };
        // SAFETY: a live ID; `data` lives across the call, which copies it.
        let rc = unsafe { ffi::rdma_reject(self.id.0, ptr, len) };
        check("rdma_reject", rc)
    }

    /// `rdma_disconnect`: the QP goes to ERR first.
    pub(crate) fn disconnect(&self, id: &CmId) -> Result<(), CmError> {
        let mut hs = self.st.lock();
        if !matches!(hs.conn, Conn::Established | Conn::Accepted) {
            return Err(CmError::InvalidState {
                op: "disconnect",
                why: "the ID is not connected",
            });
        }
        if let Some(qp) = id.inner.qp.get() {
            qp_error(qp);
        }
        // SAFETY: a live, connected ID.
        let rc = unsafe { ffi::rdma_disconnect(self.id.0) };
        check("rdma_disconnect", rc)?;
        hs.conn = Conn::Disconnecting;
        Ok(())
    }

    /// `rdma_join_multicast` (the caller checked the port space and the address).
    pub(crate) fn join_multicast(&self, id: &CmId, group: IpAddr) -> Result<(), CmError> {
        if id.inner.ctx.get().is_none() {
            return Err(CmError::InvalidState {
                op: "join a multicast group",
                why: "the ID is not bound (bind_addr / resolve_addr)",
            });
        }
        let token = {
            let mut hs = self.st.lock();
            if hs.groups.iter().any(|g| g.ip == group) {
                return Err(CmError::InvalidArgument(format!(
                    "{group} is already joined"
                )));
            }
            let token = hs.next_token;
            hs.next_token += 1;
            hs.groups.push(Group {
                ip: group,
                token,
                joined: None,
            });
            token
        };
        let mut sa = to_sockaddr(SocketAddr::new(group, 0));
        // SAFETY: a live, bound ID; `sa` is a live socket address; the context is an opaque
        // value librdmacm hands back in the join's events.
        let rc = unsafe {
            ffi::rdma_join_multicast(
                self.id.0,
                (&raw mut sa).cast(),
                token as usize as *mut c_void,
            )
        };
        if let Err(e) = check("rdma_join_multicast", rc) {
            self.st.lock().groups.retain(|g| g.token != token);
            return Err(e);
        }
        Ok(())
    }

    /// Detaches the QP and `rdma_leave_multicast`.
    pub(crate) fn leave_multicast(&self, id: &CmId, group: IpAddr) -> Result<(), CmError> {
        let Some(g) = self
            .st
            .lock()
            .groups
            .iter()
            .find(|g| g.ip == group)
            .copied()
        else {
            return Err(CmError::InvalidArgument(format!("{group} is not joined")));
        };
        if let (Some(qp), Some((mgid, mlid))) = (id.inner.qp.get(), g.joined) {
            qp.detach_mcast(mgid, mlid)?;
        }
        let mut sa = to_sockaddr(SocketAddr::new(group, 0));
        // SAFETY: a live ID that joined `group`. The call waits until the group's events
        // are acknowledged, which the channel thread does as it reads them; no lock of ours
        // is held.
        let rc = unsafe { ffi::rdma_leave_multicast(self.id.0, (&raw mut sa).cast()) };
        check("rdma_leave_multicast", rc)?;
        self.st.lock().groups.retain(|x| x.token != g.token);
        Ok(())
    }

    /// Turns one event of this ID into the `CmEvent` to report, if any.
    fn on_event(&self, id: &CmId, raw: RawEvent) -> Option<CmEvent> {
        use ffi::event_type as e;
        let inner = &id.inner;
        let mut ev = CmEvent::new(CmEventKind::AddrError, id.clone());
        ev.status = raw.status;
        ev.kind = match raw.event {
            e::ADDR_RESOLVED => match self.attach(inner) {
                Ok(()) => {
                    let (local, peer) = self.addrs();
                    let mut st = inner.st.lock();
                    st.local = local.or(st.local);
                    st.peer = peer;
                    CmEventKind::AddrResolved
                }
                Err(other) => {
                    tracing::debug!(device = other, "rdma_cm: address on another device");
                    ev.status = status::NO_DEVICE;
                    CmEventKind::AddrError
                }
            },
            e::ADDR_ERROR => CmEventKind::AddrError,
            e::ROUTE_RESOLVED => {
                inner.st.lock().route_resolved = true;
                CmEventKind::RouteResolved
            }
            e::ROUTE_ERROR => CmEventKind::RouteError,
            e::CONNECT_RESPONSE => return Some(self.complete_connect(id, raw)),
            e::CONNECT_ERROR | e::UNREACHABLE | e::REJECTED | e::DISCONNECTED => {
                let mut hs = self.st.lock();
                let quiet = hs.connect_error && matches!(raw.event, e::REJECTED | e::DISCONNECTED);
                hs.conn = Conn::Closed;
                drop(hs);
                if let Some(qp) = inner.qp.get() {
                    qp_error(qp);
                }
                if quiet {
                    return None;
                }
                ev.private_data = raw.private_data;
                match raw.event {
                    e::CONNECT_ERROR => CmEventKind::ConnectError,
                    e::UNREACHABLE => CmEventKind::Unreachable,
                    e::REJECTED => CmEventKind::Rejected,
                    _ => CmEventKind::Disconnected,
                }
            }
            e::ESTABLISHED => {
                self.st.lock().conn = Conn::Established;
                ev.private_data = raw.private_data;
                CmEventKind::Established
            }
            e::DEVICE_REMOVAL => CmEventKind::DeviceRemoval,
            e::ADDR_CHANGE => CmEventKind::AddrChange,
            e::TIMEWAIT_EXIT => CmEventKind::TimewaitExit,
            e::MULTICAST_JOIN => return self.joined(id, &raw),
            e::MULTICAST_ERROR => {
                self.forget_group(raw.mc_token);
                CmEventKind::MulticastError
            }
            other => {
                tracing::debug!(
                    event = other,
                    "rdma_cm: an event rdmx does not know; dropped"
                );
                return None;
            }
        };
        Some(ev)
    }

    /// CONNECT_RESPONSE: RTR, RTS, `rdma_establish`; ESTABLISHED or CONNECT_ERROR.
    fn complete_connect(&self, id: &CmId, raw: RawEvent) -> CmEvent {
        use ibv::ibv_qp_state as s;
        let inner = &id.inner;
        let done = match (inner.ctx.get(), inner.qp.get()) {
            (Some(ctx), Some(qp)) => self
                .move_qp(ctx, qp, s::IBV_QPS_INIT, |_| {})
                .and_then(|()| self.move_qp(ctx, qp, s::IBV_QPS_RTR, |_| {}))
                .and_then(|()| self.move_qp(ctx, qp, s::IBV_QPS_RTS, |_| {}))
                .and_then(|()| {
                    // SAFETY: a live ID that got CONNECT_RESPONSE and has no librdmacm QP.
                    let rc = unsafe { ffi::rdma_establish(self.id.0) };
                    check("rdma_establish", rc)
                }),
            _ => Err(CmError::InvalidState {
                op: "complete a connection",
                why: "the ID has no QP",
            }),
        };
        let mut hs = self.st.lock();
        match done {
            Ok(()) => {
                hs.conn = Conn::Established;
                let mut ev = CmEvent::new(CmEventKind::Established, id.clone());
                ev.conn = Some(raw.peer());
                ev.private_data = raw.private_data;
                ev
            }
            Err(e) => {
                tracing::debug!(error = %e, "rdma_cm: completing the connection failed");
                hs.conn = Conn::Closed;
                hs.connect_error = true;
                if let Some(qp) = inner.qp.get() {
                    qp_error(qp);
                }
                let mut ev = CmEvent::new(CmEventKind::ConnectError, id.clone());
                ev.status = match &e {
                    CmError::Io { error, .. } => {
                        error.raw_os_error().map_or(status::INVALID, |c| -c)
                    }
                    CmError::Verbs(crate::error::VerbsError::Io { error, .. }) => {
                        error.raw_os_error().map_or(status::INVALID, |c| -c)
                    }
                    _ => status::INVALID,
                };
                ev
            }
        }
    }

    /// MULTICAST_JOIN: attach the QP, report the group's UD parameters.
    fn joined(&self, id: &CmId, raw: &RawEvent) -> Option<CmEvent> {
        let (ah_attr, mgid, mlid, qp_num, qkey) = raw.ud?;
        let mut hs = self.st.lock();
        let Some(g) = hs.groups.iter_mut().find(|g| g.token == raw.mc_token) else {
            // Left before the join completed.
            return None;
        };
        g.joined = Some((mgid, mlid));
        let attached = match id.inner.qp.get() {
            Some(qp) => qp.attach_mcast(mgid, mlid),
            None => Ok(()),
        };
        let mut ev = CmEvent::new(CmEventKind::MulticastJoin, id.clone());
        match attached {
            Ok(()) => {
                ev.ud = Some(UdParam {
                    ah_attr,
                    qp_num: Qpn(qp_num),
                    qkey,
                });
            }
            Err(e) => {
                tracing::debug!(error = %e, "rdma_join_multicast: attach failed");
                drop(hs);
                self.forget_group(raw.mc_token);
                ev.kind = CmEventKind::MulticastError;
                ev.status = status::INVALID;
            }
        }
        Some(ev)
    }

    /// A join that failed: librdmacm leaves the group (its events are acknowledged, so the
    /// call does not wait) and the ID no longer counts it as joined, as on the soft provider.
    fn forget_group(&self, token: u64) {
        let g = {
            let mut hs = self.st.lock();
            let g = hs.groups.iter().find(|g| g.token == token).copied();
            hs.groups.retain(|g| g.token != token);
            g
        };
        if let Some(g) = g {
            let mut sa = to_sockaddr(SocketAddr::new(g.ip, 0));
            // SAFETY: a live ID with a join of `g.ip` in librdmacm; no lock of ours is held.
            let rc = unsafe { ffi::rdma_leave_multicast(self.id.0, (&raw mut sa).cast()) };
            if rc != 0 {
                tracing::debug!(
                    error = %std::io::Error::last_os_error(),
                    "rdma_leave_multicast after a failed join"
                );
            }
        }
    }
}

/// Moves `qp` to ERR (outstanding work flushes); failures are logged.
fn qp_error(qp: &QueuePair) {
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    if let Err(e) = qp.modify(&err, M::STATE) {
        tracing::debug!(error = %e, "rdma_cm: moving the QP to ERR");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_round_trip_through_c() {
        for a in [
            "192.0.2.7:4791",
            "0.0.0.0:0",
            "[2001:db8::1]:7471",
            "[::ffff:10.1.2.3]:1",
        ] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(from_sockaddr(&to_sockaddr(a)), Some(a), "{a}");
        }
        // SAFETY: a plain C struct; all-zero bytes are valid (family AF_UNSPEC).
        let none: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        assert_eq!(from_sockaddr(&none), None);
    }

    #[test]
    fn time_outs_and_limits_fit_librdmacm() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_millis(2500)), 2500);
        assert_eq!(millis(Duration::from_secs(u64::MAX)), c_int::MAX);
        assert_eq!((limit(16), limit(1000)), (16, 255));
    }

    /// A zeroed `rdma_cm_id` whose `context` is `key`.
    fn fake_id(key: u64) -> Box<ffi::rdma_cm_id> {
        // SAFETY: pointers, integers, socket addresses and GID unions: all-zero is valid.
        let mut id: Box<ffi::rdma_cm_id> = Box::new(unsafe { std::mem::zeroed() });
        id.context = key as usize as *mut c_void;
        id
    }

    fn fake_event(
        event: u32,
        id: &mut ffi::rdma_cm_id,
        listen: Option<&mut ffi::rdma_cm_id>,
    ) -> ffi::rdma_cm_event {
        ffi::rdma_cm_event {
            id,
            listen_id: listen.map_or(std::ptr::null_mut(), |l| l),
            event,
            status: 0,
            // SAFETY: plain C data; all-zero is valid for either member.
            param: unsafe { std::mem::zeroed() },
        }
    }

    #[test]
    fn a_connect_request_is_copied_with_the_listener_key_and_its_private_data() {
        use ffi::event_type as e;
        let mut new = fake_id(0);
        let mut listener = fake_id(42);
        let data: Vec<u8> = (0..56).collect();
        let mut ev = fake_event(e::CONNECT_REQUEST, &mut new, Some(&mut listener));
        ev.param.conn = ffi::rdma_conn_param {
            private_data: data.as_ptr().cast(),
            private_data_len: 56,
            responder_resources: 3,
            initiator_depth: 2,
            flow_control: 1,
            retry_count: 6,
            rnr_retry_count: 7,
            srq: 1,
            qp_num: 0x12_3456,
        };
        // SAFETY: a live event of our own making.
        let raw = unsafe { RawEvent::copy(&ev) };
        assert_eq!(raw.key, 42, "a request is found by its listener");
        assert_eq!(raw.id, &raw mut *new);
        assert_eq!(raw.private_data, data);
        assert!(
            raw.conn.private_data.is_null(),
            "no pointer outlives the ack"
        );
        let p = raw.peer();
        assert_eq!(
            (p.responder_resources, p.initiator_depth, p.retry_count),
            (3, 2, 6)
        );
        assert_eq!(
            (p.rnr_retry_count, p.qp_num, p.srq),
            (7, Qpn(0x12_3456), true)
        );
        assert!(raw.ud.is_none());
    }

    #[test]
    fn an_event_without_private_data_copies_none() {
        use ffi::event_type as e;
        let mut id = fake_id(7);
        let mut ev = fake_event(e::DISCONNECTED, &mut id, None);
        ev.status = -5;
        // A length with no pointer (librdmacm sets both or neither) reads nothing.
        ev.param.conn.private_data_len = 9;
        // SAFETY: a live event of our own making.
        let raw = unsafe { RawEvent::copy(&ev) };
        assert_eq!((raw.key, raw.status), (7, -5));
        assert!(raw.private_data.is_empty());
    }

    #[test]
    fn a_multicast_join_yields_the_group_and_not_the_context_as_data() {
        use ffi::event_type as e;
        let mut id = fake_id(9);
        let mut ev = fake_event(e::MULTICAST_JOIN, &mut id, None);
        let mgid = Gid::from_ip(IpAddr::V4(Ipv4Addr::new(239, 1, 2, 3)));
        let mut ah = ibv::ibv_ah_attr {
            dlid: 0xC001,
            port_num: 1,
            is_global: 1,
            ..Default::default()
        };
        ah.grh.dgid = ibv::ibv_gid { raw: mgid.0 };
        ah.grh.sgid_index = 3;
        ah.grh.hop_limit = 1;
        ev.param.ud = ffi::rdma_ud_param {
            // librdmacm puts the join's context here.
            private_data: 5usize as *const c_void,
            private_data_len: 0,
            ah_attr: ah,
            qp_num: 0xFF_FFFF,
            qkey: super::super::id::RDMA_UDP_QKEY,
        };
        // SAFETY: a live event of our own making.
        let raw = unsafe { RawEvent::copy(&ev) };
        assert_eq!(raw.mc_token, 5);
        assert!(raw.private_data.is_empty());
        let (ah, g, mlid, qpn, qkey) = raw.ud.unwrap();
        assert_eq!((g, mlid, qpn, qkey), (mgid, 0xC001, 0xFF_FFFF, 0x0123_4567));
        assert_eq!((ah.dgid, ah.sgid_index, ah.hop_limit), (mgid, 3, 1));
        assert_eq!(Qpn(qpn), Qpn::MULTICAST);
    }

    /// What this machine's librdmacm does without devices: either the kernel CM is there
    /// and an address no RDMA device serves resolves to ADDR_ERROR (or fails at once)
    /// within the time-out, or creating the channel fails cleanly. Never a panic, never
    /// an unbounded wait.
    #[test]
    fn the_kernel_cm_answers_or_refuses_cleanly() {
        use ffi::event_type as e;
        let chan = match HwChannel::new() {
            Ok(c) => Arc::new(c),
            Err(e) => {
                // No /dev/infiniband/rdma_cm (no rdma_ucm module): ENODEV or the like.
                assert!(
                    matches!(&e, CmError::Io { op: "rdma_create_event_channel", error }
                        if error.raw_os_error().is_some()),
                    "{e:?}"
                );
                eprintln!("no kernel CM here: {e}");
                return;
            }
        };
        let raw = chan.create_raw(1, PortSpace::Tcp).expect("rdma_create_id");
        let id = HwId::new(raw, 1, &chan);
        // Binding to loopback works or fails with an errno.
        let mut lo = to_sockaddr("127.0.0.1:0".parse().unwrap());
        // SAFETY: a live ID; `lo` is a live IPv4 socket address.
        let rc = unsafe { ffi::rdma_bind_addr(id.id.0, (&raw mut lo).cast()) };
        if rc != 0 {
            eprintln!(
                "rdma_bind_addr(127.0.0.1): {}",
                std::io::Error::last_os_error()
            );
        }
        drop(id);
        // A documentation address (TEST-NET-1) from a fresh ID.
        let raw = chan.create_raw(2, PortSpace::Tcp).expect("rdma_create_id");
        let id = HwId::new(raw, 2, &chan);
        let mut dst = to_sockaddr("192.0.2.1:7471".parse().unwrap());
        // SAFETY: a live ID; `dst` is a live socket address.
        let rc = unsafe {
            ffi::rdma_resolve_addr(id.id.0, std::ptr::null_mut(), (&raw mut dst).cast(), 500)
        };
        if rc != 0 {
            eprintln!("rdma_resolve_addr: {}", std::io::Error::last_os_error());
            return;
        }
        let ready = crate::os::poll_readable(&[chan.fd()], Some(Duration::from_secs(5)))
            .expect("poll the channel");
        assert_eq!(ready, vec![true], "an answer within the time-out");
        let mut ev = std::ptr::null_mut();
        // SAFETY: a live channel; `ev` is a live out-pointer.
        let rc = unsafe { ffi::rdma_get_cm_event(chan.ch.0, &raw mut ev) };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        // SAFETY: just returned, not yet acknowledged.
        let got = unsafe { RawEvent::copy(ev) };
        // SAFETY: acknowledged once.
        unsafe { ffi::rdma_ack_cm_event(ev) };
        assert_eq!(got.key, 2);
        // A host with an RDMA device and a default route may resolve it (to the gateway).
        assert!(
            matches!(got.event, e::ADDR_ERROR | e::ADDR_RESOLVED),
            "event {}",
            got.event
        );
        if got.event == e::ADDR_ERROR {
            assert!(got.status < 0, "a negative errno: {}", got.status);
        }
    }
}
