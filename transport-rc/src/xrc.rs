//! XRC endpoints: contexts on one node share a connection per remote node.
//!
//! A [`Node`] is one device with one XRC domain. Every XRC context on it has its own XRC
//! shared receive queue in that domain. Towards each remote node a context keeps **one**
//! initiator queue pair (XRC_SEND), whatever the number of endpoints it has there; a message
//! names the remote context's receive queue by its SRQ number. The remote node keeps one
//! target queue pair (XRC_RECV) per remote initiator, shared by all of its contexts. So with
//! N contexts per node, a pair of nodes needs N initiators and N targets per direction,
//! where RC needs N x N queue pairs.
//!
//! Messages from every endpoint behind one initiator arrive through one target queue pair,
//! so the receiving context routes them by the header's tag (the endpoint number it gave
//! the peer), checked against the target queue pair they came through.
//!
//! The exchange, over the bootstrap TCP connection (`A` connects to `B`):
//!
//! 1. A -> B `Hello` (A's node, tag, SRQ number, mailbox, credits; no queue pair yet);
//! 2. B -> A `Accept` (B's node, and B's initiator towards A's node, new or already there);
//! 3. A -> B `Hello` again, now with A's initiator towards B's node and the target queue pair
//!    A's node has (or has just made) for B's initiator;
//! 4. B -> A `XrcTarget`: the target queue pair B's node has for A's initiator.
//!
//! Each side connects its initiator to the other's target when it is new. With two ports on
//! both nodes, initiators and targets are armed with an alternate path, as RC endpoints are:
//! an initiator migrates when its local port fails or its retries run out, a target follows
//! when the peer's initiator arrives on the alternate path with MigReq = 1, and the endpoints
//! sharing an initiator all report `PathMigrated`.
//!
//! A node is either the contexts of one process ([`Node::open`]) or of every process that
//! opens the node with the same domain file ([`Node::open_shared`], `ibv_open_xrcd` with a
//! file). Across processes, the node's targets are shared too: each side says in the
//! exchange which target of the other's node its initiator already sends to
//! (`xrc_in_use`), and the other side then uses that target, whichever process of its node
//! created it, instead of making one. On the soft provider the domain's targets receive at
//! the process hosting the domain, which every side announces (`xrc_target_path`, and
//! `xrc_target_alt` for the host's second port, the alternate path of initiators towards
//! the node).

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};
use rdmx_core::bootstrap::{self, EndpointInfo, Frame, PathInfo};
use rdmx_core::{Error, Result};
use rdmx_verbs::{
    Device, DeviceOptions, ProtectionDomain, QpAttr, QpAttrMask as M, QpCap, QpInitAttr, QpState,
    QueuePair, XrcDomain,
};

use crate::endpoint::Endpoint;
use crate::shared::{RcRef, Shared};

/// One device with one XRC domain, shared by the XRC contexts built on it
/// (`ContextBuilder::node`). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Node {
    pub(crate) inner: Arc<NodeInner>,
}

#[derive(Debug)]
pub(crate) struct NodeInner {
    pub(crate) vctx: rdmx_verbs::Context,
    pub(crate) pd: ProtectionDomain,
    pub(crate) xrcd: XrcDomain,
    pub(crate) id: u64,
    /// Target queue pairs this process created, by (remote node, remote initiator QP
    /// number).
    targets: Mutex<HashMap<(u64, u32), QueuePair>>,
    /// The node's contexts, which share its device and so its events.
    pub(crate) contexts: Mutex<Vec<std::sync::Weak<Shared>>>,
}

impl NodeInner {
    /// Destroys the target queue pairs this process made for initiators of `peer_node`
    /// (their initiators' next packets go unanswered); returns how many.
    pub(crate) fn drop_targets_from(&self, peer_node: u64) -> usize {
        let mut targets = self.targets.lock();
        let before = targets.len();
        targets.retain(|&(node, _), _| node != peer_node);
        before - targets.len()
    }

    /// Hands a device event to every live context of the node (each acts on its own
    /// objects; before, only the context that read the event heard of it).
    pub(crate) fn share_event(&self, ev: rdmx_verbs::AsyncEvent) {
        let mut ctxs = self.contexts.lock();
        ctxs.retain(|w| w.strong_count() > 0);
        for c in ctxs.iter().filter_map(std::sync::Weak::upgrade) {
            c.node_events.lock().push_back(ev);
        }
    }

    /// Where the node's targets receive on `port`, when another process hosts the domain.
    pub(crate) fn target_path(&self, port: u8) -> Option<PathInfo> {
        if !self.xrcd.is_remote() {
            return None;
        }
        let a = self.xrcd.target_addr(port).ok()?;
        Some(PathInfo {
            gid: rdmx_verbs::Gid::from_ip(a.ip()).0,
            udp_port: a.port(),
            port_num: port,
        })
    }
}

impl Node {
    /// Opens `device` and an XRC domain on it.
    ///
    /// # Errors
    /// `Verbs` when the device cannot be opened or has no XRC.
    pub fn open(device: &str) -> Result<Self> {
        Self::from_context(Device::open(device)?)
    }

    /// [`open`](Self::open) with device options (soft provider: fault injection).
    ///
    /// # Errors
    /// As `open`.
    pub fn open_with(device: &str, options: DeviceOptions) -> Result<Self> {
        Self::from_context(Device::open_with(device, options)?)
    }

    /// Opens `device` and joins the node shared by every process that opens it with the
    /// same `domain_file` (created if missing): their contexts share one connection per
    /// remote node, initiators and targets alike. On the soft provider the first process to
    /// open the file hosts the domain for the others, and the node ends with that process
    /// (the others' XRC endpoints then fail); see `Context::open_xrcd_file` in rdmx-verbs.
    ///
    /// # Errors
    /// `Verbs` when the device or the domain cannot be opened or the device has no XRC.
    pub fn open_shared(device: &str, domain_file: impl AsRef<std::path::Path>) -> Result<Self> {
        Self::with_domain(Device::open(device)?, Some(domain_file.as_ref()))
    }

    /// [`open_shared`](Self::open_shared) with device options.
    ///
    /// # Errors
    /// As `open_shared`.
    pub fn open_shared_with(
        device: &str,
        options: DeviceOptions,
        domain_file: impl AsRef<std::path::Path>,
    ) -> Result<Self> {
        Self::with_domain(
            Device::open_with(device, options)?,
            Some(domain_file.as_ref()),
        )
    }

    fn from_context(vctx: rdmx_verbs::Context) -> Result<Self> {
        Self::with_domain(vctx, None)
    }

    fn with_domain(vctx: rdmx_verbs::Context, file: Option<&std::path::Path>) -> Result<Self> {
        if !vctx.query_device().xrc {
            return Err(Error::Config(format!("device {} has no XRC", vctx.name())));
        }
        let pd = vctx.alloc_pd()?;
        let (xrcd, id) = match file {
            None => (vctx.open_xrcd()?, crate::context::random_u64()),
            Some(f) => {
                let xrcd = vctx.open_xrcd_file(f)?;
                // Every process of the node must announce the same node: name it after
                // where its targets receive (the host's address) and the domain.
                let at = xrcd.target_addr(1)?;
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                for b in format!("{at}/{}", f.display()).bytes() {
                    h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
                }
                (xrcd, h)
            }
        };
        Ok(Self {
            inner: Arc::new(NodeInner {
                vctx,
                pd,
                xrcd,
                id,
                targets: Mutex::new(HashMap::new()),
                contexts: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The node's random identifier (sent to peers).
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Target queue pairs this process created on the node (one per remote initiator;
    /// with a node shared by processes, each target is created by one of them).
    pub fn target_qps(&self) -> usize {
        self.inner.targets.lock().len()
    }
}

/// A context's initiator towards one remote node.
#[derive(Debug)]
pub(crate) struct Initiator {
    pub(crate) qp: Arc<QueuePair>,
    pub(crate) psn: u32,
    pub(crate) connected: bool,
    /// The remote node's target it sends to, once connected.
    pub(crate) target: u32,
}

/// Creates an initiator queue pair (moved to INIT).
pub(crate) fn create_initiator(sh: &Shared, sq_depth: u32) -> Result<QueuePair> {
    let mut attr = QpInitAttr::xrc_send(&sh.cq);
    attr.cap = QpCap {
        max_send_wr: sq_depth,
        max_recv_wr: 0,
        max_send_sge: 1,
        max_recv_sge: 0,
        max_inline_data: sh.max_inline_data,
    };
    let qp = sh.pd.create_qp(&attr)?;
    qp.modify(
        &QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            ..QpAttr::default()
        },
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )?;
    Ok(qp)
}

/// Moves an initiator to RTR and RTS towards the remote target queue pair `target`.
pub(crate) fn connect_initiator(
    sh: &Shared,
    ini: &Initiator,
    target: u32,
    path: &PathInfo,
    peer_mtu: u32,
) -> Result<()> {
    // The target's responses carry our own PSNs; rq_psn is unused on an initiator.
    crate::conn::to_rtr(sh, &ini.qp, path, peer_mtu, target, 0, false)?;
    crate::conn::to_rts(sh, &ini.qp, ini.psn, true)
}

/// The target queue pair this node has for the remote initiator `peer` describes (its node,
/// QP number and first PSN), created and connected if it is new (with the initiator node's second port as
/// its alternate path when both sides have two ports). Returns its number.
pub(crate) fn target_for(sh: &Shared, node: &NodeInner, peer: &EndpointInfo) -> Result<u32> {
    let (peer_node, ini_qpn, ini_psn) = (peer.node_id, peer.qpn, peer.psn);
    let (path, alt_path, peer_mtu) = (&peer.primary, peer.alternate.as_ref(), peer.mtu);
    // The peer's initiator already sends to a target of this node (made by this process
    // or another one of the node for an earlier endpoint): use it.
    if let Some(t) = peer.xrc_in_use {
        return match node.xrcd.has_target(rdmx_verbs::Qpn(t)) {
            Ok(true) | Err(rdmx_verbs::VerbsError::Unsupported(_)) => Ok(t),
            Ok(false) => Err(Error::Protocol(format!(
                "the peer's initiator claims to send to target {t:#x}, which this node does \
                 not have"
            ))),
            Err(e) => Err(e.into()),
        };
    }
    let mut targets = node.targets.lock();
    if let Some(t) = targets.get(&(peer_node, ini_qpn)) {
        return Ok(t.qp_num().0);
    }
    let tgt = node.pd.create_xrc_target_qp(&node.xrcd)?;
    crate::conn::to_init(&tgt)?;
    crate::conn::to_rtr(sh, &tgt, path, peer_mtu, ini_qpn, ini_psn, true)?;
    crate::conn::to_rts(sh, &tgt, 0, false)?;
    if sh.ports >= 2
        && let Some(alt) = alt_path
    {
        crate::conn::load_alternate(sh, &tgt, alt, 2)?;
    }
    let n = tgt.qp_num().0;
    targets.insert((peer_node, ini_qpn), tgt);
    Ok(n)
}

/// Send queue depth of an initiator (shared by the context's endpoints to one node).
fn initiator_depth(sh: &Shared) -> u32 {
    sh.vctx.query_device().max_qp_wr.clamp(256, 16_384)
}

/// The context's initiator towards `peer_node` (made, not yet connected, if there is none,
/// from `fresh` when given): its queue pair, first PSN and whether it is connected.
fn initiator_for(
    rc: &RcRef,
    peer_node: u64,
    fresh: Option<(Arc<QueuePair>, u32)>,
) -> Result<(Arc<QueuePair>, u32, bool)> {
    rc.with(|sh, st, _| {
        if let Some(i) = st.initiators.get(&peer_node) {
            return Ok((Arc::clone(&i.qp), i.psn, i.connected));
        }
        let (qp, psn) = match fresh {
            Some(f) => f,
            None => (
                Arc::new(create_initiator(sh, initiator_depth(sh))?),
                crate::conn::random_psn(),
            ),
        };
        st.initiators.insert(
            peer_node,
            Initiator {
                qp: Arc::clone(&qp),
                psn,
                connected: false,
                target: 0,
            },
        );
        Ok((qp, psn, false))
    })
}

/// Connects the context's initiator towards `peer_node` to `target`, unless it already is.
fn ensure_connected(rc: &RcRef, peer_node: u64, target: u32, peer: &EndpointInfo) -> Result<()> {
    rc.with(|sh, st, _| {
        let Some(ini) = st.initiators.get_mut(&peer_node) else {
            return Err(Error::Protocol(
                "the initiator went away while connecting".into(),
            ));
        };
        if !ini.connected {
            // The peer node's targets receive at its domain's host when that is another process.
            let path = peer.xrc_target_path.as_ref().unwrap_or(&peer.primary);
            connect_initiator(sh, ini, target, path, peer.mtu)?;
            let alt = match &peer.xrc_target_path {
                Some(_) => peer.xrc_target_alt.as_ref(),
                None => peer.alternate.as_ref(),
            };
            if sh.ports >= 2
                && let Some(alt) = alt
            {
                crate::conn::load_alternate(sh, &ini.qp, alt, 2)?;
            }
            ini.connected = true;
            ini.target = target;
        }
        Ok(())
    })
}

/// The target of `peer_node` this context's initiator already sends to, if connected.
fn target_in_use(rc: &RcRef, peer_node: u64) -> Option<u32> {
    rc.with(|_, st, _| {
        st.initiators
            .get(&peer_node)
            .filter(|i| i.connected)
            .map(|i| i.target)
    })
}

/// The last step of both sides: connect the shared initiator (if new) to the peer's
/// target, point the endpoint at it and at our target, and complete it.
fn finish(
    rc: &RcRef,
    key: usize,
    ini: Arc<QueuePair>,
    my_target: u32,
    their_target: u32,
    peer: &EndpointInfo,
) -> Result<()> {
    ensure_connected(rc, peer.node_id, their_target, peer)?;
    attach(rc, key, ini, my_target);
    crate::conn::complete(rc, key, peer);
    Ok(())
}

/// Points the endpoint at the shared initiator and this node's target for the peer.
fn attach(rc: &RcRef, key: usize, qp: Arc<QueuePair>, recv_qpn: u32) {
    rc.with(|_, st, _| {
        if let Some(ep) = st.eps.get_mut(key) {
            ep.qpn = qp.qp_num().0;
            ep.qp = qp;
            ep.recv_qpn = recv_qpn;
        }
    });
}

fn node(sh: &Shared) -> Result<Arc<NodeInner>> {
    sh.node
        .clone()
        .ok_or_else(|| Error::Config("not an XRC context".into()))
}

/// Takes the context's XRC exchange lock, waiting no later than `deadline`.
///
/// The exchanges of one context run one at a time, so that each tells the peer which of
/// its node's targets the context's initiator already uses (`xrc_in_use`) before another
/// exchange can change that.
pub(crate) fn exchange_lock(sh: &Shared, deadline: Instant) -> Result<MutexGuard<'_, ()>> {
    let start = Instant::now();
    sh.xrc_lock
        .try_lock_until(deadline)
        .ok_or_else(|| Error::Timeout(start.elapsed()))
}

/// The connecting side of an XRC endpoint (steps 1 to 4 of the module docs), under the
/// exchange lock (taken before the TCP connection was made).
pub(crate) fn connect(
    rc: &RcRef,
    _one_at_a_time: MutexGuard<'_, ()>,
    mut stream: TcpStream,
    addr: SocketAddr,
    deadline: Instant,
) -> Result<Endpoint> {
    let sh = &*rc.sh;
    let node = node(sh)?;
    // A new initiator, used only if this context has none towards the peer's node yet
    // (which is known from the Accept).
    let fresh = Arc::new(create_initiator(sh, initiator_depth(sh))?);
    let fresh_psn = crate::conn::random_psn();
    let (key, id, info) = crate::conn::register(rc, Arc::clone(&fresh), fresh_psn)?;
    let result = (|| -> Result<()> {
        bootstrap::send_frame(&mut stream, &Frame::Hello(info.clone()), deadline)?;
        let peer = bootstrap::expect_accept(&mut stream, deadline)?;
        crate::conn::check_peer(sh, &peer)?;
        let (ini, ini_psn, _) = initiator_for(rc, peer.node_id, Some((fresh, fresh_psn)))?;
        let my_target = target_for(sh, &node, &peer)?;
        let second = EndpointInfo {
            qpn: ini.qp_num().0,
            psn: ini_psn,
            xrc_target: Some(my_target),
            xrc_in_use: target_in_use(rc, peer.node_id),
            ..info
        };
        // The peer may send as soon as it has our target: route what arrives through it
        // to this endpoint before telling it.
        attach(rc, key, Arc::clone(&ini), my_target);
        bootstrap::send_frame(&mut stream, &Frame::Hello(second), deadline)?;
        let their_target = bootstrap::expect_xrc_target(&mut stream, deadline)?;
        finish(rc, key, ini, my_target, their_target, &peer)
    })();
    crate::conn::settle(rc, key, id, result, "connected (xrc)", addr)
}

/// How long a listener waits for its context's other XRC exchange before it declines
/// ([`bootstrap::REJECT_BUSY`]).
const BUSY_WAIT: Duration = Duration::from_millis(20);

/// The listening side of an XRC endpoint, after the first `Hello`. `None`: declined, as
/// another exchange of the context is under way (the connector tries again).
pub(crate) fn accept(
    rc: &RcRef,
    mut stream: TcpStream,
    from: SocketAddr,
    hello: &EndpointInfo,
    deadline: Instant,
) -> Result<Option<Endpoint>> {
    let sh = &*rc.sh;
    // Wait only briefly: the exchange under way may be our own connect to this very peer,
    // waiting for the peer's listener, which waits for its own connect to us. Declining
    // breaks that cycle; the connector retries after a random pause.
    let Some(_one_at_a_time) = sh.xrc_lock.try_lock_for(BUSY_WAIT) else {
        let _ = bootstrap::reject(&mut stream, bootstrap::REJECT_BUSY, deadline);
        tracing::debug!(%from, "XRC exchange declined: another one is under way");
        return Ok(None);
    };
    if let Err(e) = crate::conn::check_peer(sh, hello) {
        let _ = bootstrap::reject(&mut stream, &e.to_string(), deadline);
        return Err(e);
    }
    let node = node(sh)?;
    let (ini, ini_psn, _) = initiator_for(rc, hello.node_id, None)?;
    let (key, id, info) = crate::conn::register(rc, Arc::clone(&ini), ini_psn)?;
    let result = (|| -> Result<()> {
        let accept = EndpointInfo {
            qpn: ini.qp_num().0,
            psn: ini_psn,
            xrc_in_use: target_in_use(rc, hello.node_id),
            ..info
        };
        bootstrap::send_frame(&mut stream, &Frame::Accept(accept), deadline)?;
        let peer = bootstrap::expect_hello(&mut stream, deadline)?;
        if peer.node_id != hello.node_id || peer.tag != hello.tag {
            return Err(Error::Protocol(
                "the second XRC hello names another node or endpoint".into(),
            ));
        }
        let their_target = peer
            .xrc_target
            .ok_or_else(|| Error::Protocol("the second XRC hello has no target".into()))?;
        let my_target = target_for(sh, &node, &peer)?;
        // The peer sends as soon as it has our target: finish here first (as RC's accept
        // completes before its Accept), so that `accept` returns as soon as the peer can send.
        finish(rc, key, ini, my_target, their_target, &peer)?;
        bootstrap::send_frame(&mut stream, &Frame::XrcTarget(my_target), deadline)?;
        Ok(())
    })();
    crate::conn::settle(rc, key, id, result, "accepted (xrc)", from).map(Some)
}
