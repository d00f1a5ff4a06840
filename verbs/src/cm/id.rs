//! Communication identifiers (`struct rdma_cm_id`): creation, addresses and devices, the
//! QP the ID owns, and the accessors. Connecting is in `conn.rs`, multicast in `mcast.rs`,
//! the `rdma_verbs.h` helpers in `helpers.rs`.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::agent::{Agent, CmStats, source_ip_for};
use super::error::CmError;
use super::event::{ChannelCore, CmEvent, CmEventKind, status};
use super::proto::Conn;
use crate::cq::CompletionQueue;
use crate::device::{Context, ContextInner, Device};
use crate::pd::ProtectionDomain;
use crate::qp::{QpInitAttr, QueuePair};
use crate::types::{AccessFlags, Gid, QpAttr, QpAttrMask as M, QpState, QpType};

/// The Q_Key of rdma_cm's UDP port space (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// A port space (`enum rdma_port_space`): which kind of QP an ID connects and which service
/// IDs its port numbers map to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PortSpace {
    /// `RDMA_PS_TCP`: reliable connected QPs (RC).
    Tcp,
    /// `RDMA_PS_UDP`: unreliable datagram QPs (UD), multicast.
    Udp,
}

impl PortSpace {
    /// The port space's number (`RDMA_PS_TCP` = 0x0106, `RDMA_PS_UDP` = 0x0111).
    pub const fn number(self) -> u16 {
        match self {
            Self::Tcp => 0x0106,
            Self::Udp => 0x0111,
        }
    }

    /// The IB service ID of `port` in this space, as rdma_cm forms it:
    /// `0x0000_0000_0100_0000 | space << 16 | port` (e.g. `0x0106_xxxx` for TCP).
    pub const fn service_id(self, port: u16) -> u64 {
        ((self.number() as u64) << 16) | port as u64
    }
}

/// Connection parameters given to `connect` and `accept` (`struct rdma_conn_param`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data for the peer: at most 56 bytes on connect (the REQ's 92 less rdma_cm's
    /// 36-byte header), 196 on accept.
    pub private_data: Vec<u8>,
    /// RDMA reads and atomics this side accepts at once (as responder).
    pub responder_resources: u8,
    /// RDMA reads and atomics this side issues at once (as initiator).
    pub initiator_depth: u8,
    /// Transport retries (0-7; connect only).
    pub retry_count: u8,
    /// RNR retries the peer should make (0-7, 7 = forever).
    pub rnr_retry_count: u8,
}

impl Default for ConnParam {
    /// 4 reads each way, 7 retries, RNR retries forever, no private data.
    fn default() -> Self {
        Self {
            private_data: Vec::new(),
            responder_resources: 4,
            initiator_depth: 4,
            retry_count: 7,
            rnr_retry_count: 7,
        }
    }
}

impl ConnParam {
    /// Default parameters with `private_data`.
    pub fn with_private_data(data: &[u8]) -> Self {
        Self {
            private_data: data.to_vec(),
            ..Self::default()
        }
    }

    pub(crate) fn check(&self, op: &'static str, max: usize) -> Result<(), CmError> {
        if self.private_data.len() > max {
            return Err(CmError::PrivateDataTooLong {
                op,
                len: self.private_data.len(),
                max,
            });
        }
        if self.retry_count > 7 || self.rnr_retry_count > 7 {
            return Err(CmError::InvalidArgument(format!(
                "retry_count {} and rnr_retry_count {} must be 0-7",
                self.retry_count, self.rnr_retry_count
            )));
        }
        Ok(())
    }
}

/// What the passive side learnt from the REQ, or the active side chose for its REQ.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PeerPath {
    /// The peer's data-path GID.
    pub(crate) gid: Gid,
    /// The peer's data-path UDP port (soft device).
    pub(crate) udp_port: u16,
    /// The peer's QPN.
    pub(crate) qpn: u32,
    /// The peer's starting PSN.
    pub(crate) psn: u32,
    /// Path MTU code agreed.
    pub(crate) mtu: u8,
    /// Local ACK timeout code.
    pub(crate) ack_timeout: u8,
    /// Transport retries.
    pub(crate) retry_count: u8,
    /// RNR retries.
    pub(crate) rnr_retry: u8,
}

/// The mutable part of an ID.
#[derive(Debug, Default)]
pub(crate) struct IdState {
    pub(crate) local: Option<SocketAddr>,
    pub(crate) peer: Option<SocketAddr>,
    /// Where the peer's CM socket is, when it is not `peer` (a passive ID: the REQ's source).
    pub(crate) peer_cm: Option<SocketAddr>,
    pub(crate) agent: Option<Arc<Agent>>,
    pub(crate) route_resolved: bool,
    pub(crate) conn: Option<Conn>,
    /// Listening with this backlog.
    pub(crate) backlog: Option<usize>,
    /// Listener: requests delivered and not yet accepted or rejected.
    pub(crate) pending: usize,
    /// Passive ID: its listener, while it counts in the listener's `pending`.
    pub(crate) parent: Option<Weak<IdInner>>,
    /// Passive: the REQ's values; active: the REP's, once known.
    pub(crate) path: PeerPath,
    /// Our starting PSN.
    pub(crate) local_psn: u32,
    /// Multicast groups joined.
    pub(crate) groups: Vec<Gid>,
}

/// The shared part of a [`CmId`].
pub(crate) struct IdInner {
    pub(crate) channel: Arc<ChannelCore>,
    pub(crate) ps: PortSpace,
    /// The device given to `create_id_on`.
    pub(crate) pinned: Option<Context>,
    pub(crate) ctx: OnceLock<Context>,
    pub(crate) pd: OnceLock<ProtectionDomain>,
    pub(crate) cqs: OnceLock<(CompletionQueue, CompletionQueue)>,
    pub(crate) qp: OnceLock<QueuePair>,
    pub(crate) st: Mutex<IdState>,
    /// The provider split: an ID on a libibverbs device is a librdmacm `rdma_cm_id`
    /// (`rdmacm/`), and its calls go there; `None` for the soft CM.
    #[cfg(feature = "ibverbs")]
    pub(crate) hw: Option<super::rdmacm::HwId>,
}

impl fmt::Debug for IdInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.st.try_lock();
        f.debug_struct("CmId")
            .field("ps", &self.ps)
            .field("local", &st.as_ref().and_then(|s| s.local))
            .field("peer", &st.as_ref().and_then(|s| s.peer))
            .field("qp", &self.qp.get().map(QueuePair::qp_num))
            .finish_non_exhaustive()
    }
}

/// A communication identifier (`struct rdma_cm_id`): the RDMA counterpart of a socket. It is
/// bound to a device by [`bind_addr`](Self::bind_addr) or
/// [`resolve_addr`](Self::resolve_addr), owns at most one QP
/// ([`create_qp`](Self::create_qp)), and reports what happens to it on its channel.
/// Cheap to clone; dropping the last clone is `rdma_destroy_id` (a pending request is
/// rejected, a connection is told once with a DREQ, the QP is destroyed).
///
/// An ID made with [`EventChannel::create_id_on`](super::EventChannel::create_id_on) on a
/// libibverbs device (feature `ibverbs`) is a librdmacm `rdma_cm_id`: the same calls and
/// events, carried out by the kernel's CM (see the [module docs](super)).
#[derive(Debug, Clone)]
pub struct CmId {
    pub(crate) inner: Arc<IdInner>,
}

impl PartialEq for CmId {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for CmId {}

impl CmId {
    pub(crate) fn create(
        channel: &Arc<ChannelCore>,
        ps: PortSpace,
        pinned: Option<Context>,
    ) -> Self {
        let inner = Arc::new(IdInner {
            channel: Arc::clone(channel),
            ps,
            pinned,
            ctx: OnceLock::new(),
            pd: OnceLock::new(),
            cqs: OnceLock::new(),
            qp: OnceLock::new(),
            st: Mutex::new(IdState::default()),
            #[cfg(feature = "ibverbs")]
            hw: None,
        });
        channel.register_id(&inner);
        Self { inner }
    }

    /// An ID on the libibverbs device `ctx`, with its librdmacm side.
    #[cfg(feature = "ibverbs")]
    pub(crate) fn create_hw(
        channel: &Arc<ChannelCore>,
        ps: PortSpace,
        ctx: Context,
        hw: super::rdmacm::HwId,
    ) -> Self {
        Self {
            inner: Arc::new(IdInner {
                channel: Arc::clone(channel),
                ps,
                pinned: Some(ctx),
                ctx: OnceLock::new(),
                pd: OnceLock::new(),
                cqs: OnceLock::new(),
                qp: OnceLock::new(),
                st: Mutex::new(IdState::default()),
                hw: Some(hw),
            }),
        }
    }

    /// The librdmacm side of an ID on a libibverbs device.
    #[cfg(feature = "ibverbs")]
    pub(crate) fn hw(&self) -> Option<&super::rdmacm::HwId> {
        self.inner.hw.as_ref()
    }

    pub(crate) fn from_inner(inner: &Arc<IdInner>) -> Self {
        Self {
            inner: Arc::clone(inner),
        }
    }

    /// The port space.
    pub fn port_space(&self) -> PortSpace {
        self.inner.ps
    }

    /// The device the ID is bound to (`id->verbs`), once bound.
    pub fn context(&self) -> Option<&Context> {
        self.inner.ctx.get()
    }

    /// The protection domain of the ID's QP (`id->pd`), once created.
    pub fn pd(&self) -> Option<&ProtectionDomain> {
        self.inner.pd.get()
    }

    /// The ID's QP (`id->qp`), once created.
    pub fn qp(&self) -> Option<&QueuePair> {
        self.inner.qp.get()
    }

    /// The send and receive CQs of the ID's QP (`id->send_cq`, `id->recv_cq`).
    pub fn cqs(&self) -> Option<(&CompletionQueue, &CompletionQueue)> {
        self.inner.cqs.get().map(|(s, r)| (s, r))
    }

    /// The local CM address (`rdma_get_local_addr`): where the ID listens or sends from.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.inner.st.lock().local
    }

    /// The peer's CM address (`rdma_get_peer_addr`).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.inner.st.lock().peer
    }

    /// Counters of the ID's CM socket (a listener's is shared with the IDs it accepted);
    /// zero for a librdmacm ID (the kernel's CM keeps its own).
    pub fn stats(&self) -> CmStats {
        self.inner
            .st
            .lock()
            .agent
            .as_ref()
            .map(|a| a.stats())
            .unwrap_or_default()
    }

    /// Binds the ID to a local address and its device (`rdma_bind_addr`): a listener's
    /// address (port 0 picks a free port; see [`local_addr`](Self::local_addr)), or the
    /// device of a UD ID. A TCP ID's CM socket is bound at `addr`.
    ///
    /// # Errors
    /// `InvalidState` when already bound; `Io` when the address is in use; `Verbs` when the
    /// device cannot be opened.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<(), CmError> {
        #[cfg(feature = "ibverbs")]
        if let Some(hw) = self.hw() {
            return hw.bind_addr(self, addr);
        }
        let mut st = self.inner.st.lock();
        if st.local.is_some() {
            return Err(CmError::InvalidState {
                op: "bind",
                why: "the ID is already bound",
            });
        }
        self.inner.attach_device(addr.ip())?;
        let local = if self.inner.ps == PortSpace::Tcp {
            let agent = Agent::bind(addr)?;
            let local = agent.local_addr();
            self.inner.channel.register_agent(&agent);
            st.agent = Some(agent);
            local
        } else {
            addr
        };
        st.local = Some(local);
        Ok(())
    }

    /// Resolves `dst` and binds the ID to the device that reaches it (`rdma_resolve_addr`):
    /// the local address is `src` when given, else the kernel's route to `dst` (loopback for
    /// a multicast `dst`). ADDR_RESOLVED (or ADDR_ERROR) follows on the channel. `timeout` is
    /// accepted for the API's sake: resolution on the soft provider is immediate.
    ///
    /// # Errors
    /// `InvalidState` when the ID is already connected or listening; `Io` when the CM socket
    /// cannot be bound.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<(), CmError> {
        #[cfg(feature = "ibverbs")]
        if let Some(hw) = self.hw() {
            return hw.resolve_addr(self, src, dst, timeout);
        }
        let _ = timeout;
        let mut st = self.inner.st.lock();
        if st.conn.is_some() || st.backlog.is_some() {
            return Err(CmError::InvalidState {
                op: "resolve an address",
                why: "the ID is connected or listening",
            });
        }
        let local_ip = match src {
            Some(s) if !s.ip().is_unspecified() => s.ip(),
            _ if dst.ip().is_multicast() || dst.ip().is_loopback() => {
                if dst.is_ipv4() || dst.ip().is_multicast() {
                    IpAddr::V4(Ipv4Addr::LOCALHOST)
                } else {
                    dst.ip()
                }
            }
            _ => match source_ip_for(dst.ip()) {
                Ok(ip) => ip,
                Err(_) => {
                    drop(st);
                    self.push(CmEventKind::AddrError, status::NO_DEVICE);
                    return Ok(());
                }
            },
        };
        if let Err(e) = self.inner.attach_device(local_ip) {
            tracing::debug!(error = %e, "rdma_resolve_addr: no device");
            drop(st);
            self.push(CmEventKind::AddrError, status::NO_DEVICE);
            return Ok(());
        }
        if st.local.is_none() {
            let port = src.map_or(0, |s| s.port());
            let local = SocketAddr::new(local_ip, port);
            if self.inner.ps == PortSpace::Tcp {
                let agent = Agent::bind(local)?;
                st.local = Some(agent.local_addr());
                self.inner.channel.register_agent(&agent);
                st.agent = Some(agent);
            } else {
                st.local = Some(local);
            }
        }
        st.peer = Some(dst);
        drop(st);
        self.push(CmEventKind::AddrResolved, 0);
        Ok(())
    }

    /// Resolves the route to the peer (`rdma_resolve_route`). RoCE needs no path record:
    /// ROUTE_RESOLVED follows at once.
    ///
    /// # Errors
    /// `InvalidState` before `resolve_addr`.
    pub fn resolve_route(&self, timeout: Duration) -> Result<(), CmError> {
        #[cfg(feature = "ibverbs")]
        if let Some(hw) = self.hw() {
            return hw.resolve_route(self, timeout);
        }
        let _ = timeout;
        let mut st = self.inner.st.lock();
        if st.peer.is_none() {
            return Err(CmError::InvalidState {
                op: "resolve a route",
                why: "the address is not resolved",
            });
        }
        st.route_resolved = true;
        drop(st);
        self.push(CmEventKind::RouteResolved, 0);
        Ok(())
    }

    /// Listens for connection requests (`rdma_listen`): at most `backlog` (at least 1) wait
    /// for `accept` / `reject` at once; further REQs are dropped, and their senders retry.
    ///
    /// # Errors
    /// `InvalidState` before `bind_addr`; `Unsupported` in the UDP port space (SIDR).
    pub fn listen(&self, backlog: usize) -> Result<(), CmError> {
        if self.inner.ps != PortSpace::Tcp {
            return Err(CmError::Unsupported(
                "listening in the UDP port space (SIDR)",
            ));
        }
        #[cfg(feature = "ibverbs")]
        if let Some(hw) = self.hw() {
            return hw.listen(self, backlog);
        }
        let mut st = self.inner.st.lock();
        let Some(agent) = st.agent.clone() else {
            return Err(CmError::InvalidState {
                op: "listen",
                why: "the ID is not bound (bind_addr)",
            });
        };
        if st.peer.is_some() {
            return Err(CmError::InvalidState {
                op: "listen",
                why: "the ID is resolved to a peer",
            });
        }
        st.backlog = Some(backlog.max(1));
        agent.set_listener(Some(&self.inner));
        Ok(())
    }

    /// Creates the ID's QP on its device (`rdma_create_qp`), with `pd` or, when `None`, a
    /// protection domain of its own. An RC or UC QP (TCP port space) is moved to INIT, so
    /// that receives can be posted before the connection is up; a UD QP (UDP port space) to
    /// RTS with Q_Key [`RDMA_UDP_QKEY`].
    ///
    /// # Errors
    /// `InvalidState` before the ID is bound or when it has a QP; `InvalidArgument` for a
    /// QP type that does not fit the port space or a PD of another device; `Verbs` when the
    /// QP cannot be created or moved.
    pub fn create_qp(
        &self,
        pd: Option<&ProtectionDomain>,
        attr: &QpInitAttr<'_>,
    ) -> Result<&QueuePair, CmError> {
        let Some(ctx) = self.inner.ctx.get() else {
            return Err(CmError::InvalidState {
                op: "create a QP",
                why: "the ID is not bound to a device (bind_addr / resolve_addr)",
            });
        };
        if self.inner.qp.get().is_some() {
            return Err(CmError::InvalidState {
                op: "create a QP",
                why: "the ID already has one",
            });
        }
        let fits = match self.inner.ps {
            PortSpace::Tcp => matches!(attr.qp_type, QpType::Rc | QpType::Uc),
            PortSpace::Udp => attr.qp_type == QpType::Ud,
        };
        if !fits {
            return Err(CmError::InvalidArgument(format!(
                "a {:?} QP does not fit the {:?} port space",
                attr.qp_type, self.inner.ps
            )));
        }
        let pd = match pd {
            Some(pd) if !Arc::ptr_eq(&pd.context().inner, &ctx.inner) => {
                return Err(CmError::InvalidArgument(
                    "the protection domain belongs to another device".into(),
                ));
            }
            Some(pd) => pd.clone(),
            None => ctx.alloc_pd()?,
        };
        let qp = pd.create_qp(attr)?;
        #[cfg(feature = "ibverbs")]
        if let Some(hw) = self.hw() {
            hw.init_qp(ctx, &qp, attr.srq.is_some())?;
            return self.keep_qp(pd, attr, qp);
        }
        match attr.qp_type {
            QpType::Ud => {
                let init = QpAttr {
                    qp_state: QpState::Init,
                    port_num: 1,
                    qkey: RDMA_UDP_QKEY,
                    ..QpAttr::default()
                };
                qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)?;
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
                // Groups joined before the QP existed.
                for g in &self.inner.st.lock().groups {
                    qp.attach_mcast(*g, 0)?;
                }
            }
            t => {
                let mut access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
                if t == QpType::Rc {
                    access |= AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
                }
                let init = QpAttr {
                    qp_state: QpState::Init,
                    port_num: 1,
                    qp_access_flags: access,
                    ..QpAttr::default()
                };
                qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)?;
            }
        }
        self.keep_qp(pd, attr, qp)
    }

    /// Keeps the new QP, its PD and its CQs in the ID.
    fn keep_qp(
        &self,
        pd: ProtectionDomain,
        attr: &QpInitAttr<'_>,
        qp: QueuePair,
    ) -> Result<&QueuePair, CmError> {
        let _ = self.inner.pd.set(pd);
        let _ = self
            .inner
            .cqs
            .set((attr.send_cq.clone(), attr.recv_cq.clone()));
        let _ = self.inner.qp.set(qp);
        self.inner.qp.get().ok_or(CmError::InvalidState {
            op: "create a QP",
            why: "the ID got another QP at the same time",
        })
    }

    /// Queues an event of `kind` about this ID.
    pub(crate) fn push(&self, kind: CmEventKind, status: i32) {
        let mut ev = CmEvent::new(kind, self.clone());
        ev.status = status;
        self.inner.channel.push(ev);
    }
}

impl IdInner {
    /// Binds the ID to its pinned device, or to the default soft device of `ip`.
    fn attach_device(&self, ip: IpAddr) -> Result<(), CmError> {
        if self.ctx.get().is_some() {
            return Ok(());
        }
        let ctx = match &self.pinned {
            Some(c) => c.clone(),
            None => default_device(ip)?,
        };
        let _ = self.ctx.set(ctx);
        Ok(())
    }

    /// When the ID's timer is due.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.st.lock().conn.as_ref().and_then(Conn::poll_timeout)
    }
}

/// A random 24-bit PSN.
pub(crate) fn random_psn() -> u32 {
    (crate::os::random_u64() as u32) & 0x00FF_FFFF
}

/// The process's soft device for `ip`: opened at first use, shared while any ID (or anything
/// else) holds it. A wildcard address means loopback.
fn default_device(ip: IpAddr) -> Result<Context, CmError> {
    static DEVICES: OnceLock<Mutex<HashMap<IpAddr, Weak<ContextInner>>>> = OnceLock::new();
    let ip = if ip.is_unspecified() {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        ip
    };
    let mut map = DEVICES.get_or_init(|| Mutex::new(HashMap::new())).lock();
    if let Some(inner) = map.get(&ip).and_then(Weak::upgrade) {
        return Ok(Context { inner });
    }
    let host = match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    };
    let ctx = Device::open(&format!("soft:{host}"))?;
    map.retain(|_, w| w.strong_count() > 0);
    map.insert(ip, Arc::downgrade(&ctx.inner));
    Ok(ctx)
}
