//! XRC endpoints: contexts on one node share a connection per remote node.
//!
//! A `Node` (`node.rs`) is one device with one XRC domain. Every XRC context on it has its own XRC
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
//! A node is either the contexts of one process (`Node::open`) or of every process that
//! opens the node with the same domain file (`Node::open_shared`, `ibv_open_xrcd` with a
//! file). Across processes, the node's targets are shared too: each side says in the
//! exchange which target of the other's node its initiator already sends to
//! (`xrc_in_use`), and the other side then uses that target, whichever process of its node
//! created it, instead of making one. On the soft provider the domain's targets receive at
//! the process hosting the domain, which every side announces (`xrc_target_path`, and
//! `xrc_target_alt` for the host's second port, the alternate path of initiators towards
//! the node).

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::MutexGuard;
use rdmx_core::bootstrap::{self, EndpointInfo, Frame, PathInfo};
use rdmx_core::{Error, Result};
use rdmx_verbs::{QpAttr, QpAttrMask as M, QpCap, QpInitAttr, QpState, QueuePair};

use crate::node::{Initiator, NodeInner};
use crate::setup::Established;
use crate::state::{RcRef, Shared};

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
    crate::setup::to_rtr(sh, &ini.qp, path, peer_mtu, target, 0, false)?;
    crate::setup::to_rts(sh, &ini.qp, ini.psn, true)
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
    crate::setup::to_init(&tgt)?;
    crate::setup::to_rtr(sh, &tgt, path, peer_mtu, ini_qpn, ini_psn, true)?;
    crate::setup::to_rts(sh, &tgt, 0, false)?;
    if sh.ports >= 2
        && let Some(alt) = alt_path
    {
        crate::engine::load_alternate(sh, &tgt, alt, 2)?;
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
                crate::setup::random_psn(),
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
                crate::engine::load_alternate(sh, &ini.qp, alt, 2)?;
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
    // (XRC has no slot windows: see `Shared::confine`.)
    crate::setup::complete(rc, key, peer, true);
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
    let start = crate::util::host_now();
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
    data: &[u8],
) -> Result<Established> {
    let sh = &*rc.sh;
    let node = node(sh)?;
    // A new initiator, used only if this context has none towards the peer's node yet
    // (which is known from the Accept).
    let fresh = Arc::new(create_initiator(sh, initiator_depth(sh))?);
    let fresh_psn = crate::setup::random_psn();
    let (key, id, info) = crate::setup::register(rc, Arc::clone(&fresh), fresh_psn, data.to_vec())?;
    let result = (|| -> Result<()> {
        bootstrap::send_frame(&mut stream, &Frame::Hello(info.clone()), deadline)?;
        let peer = bootstrap::expect_accept(&mut stream, deadline)?;
        crate::setup::check_peer(sh, &peer)?;
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
    crate::setup::settle(rc, key, id, result, "connected (xrc)", addr)
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
) -> Result<Option<Established>> {
    let sh = &*rc.sh;
    // Wait only briefly: the exchange under way may be our own connect to this very peer,
    // waiting for the peer's listener, which waits for its own connect to us. Declining
    // breaks that cycle; the connector retries after a random pause.
    let Some(_one_at_a_time) = sh.xrc_lock.try_lock_for(BUSY_WAIT) else {
        let _ = bootstrap::reject(&mut stream, bootstrap::REJECT_BUSY, deadline);
        tracing::debug!(%from, "XRC exchange declined: another one is under way");
        return Ok(None);
    };
    if let Err(e) = crate::setup::check_peer(sh, hello) {
        let _ = bootstrap::reject(&mut stream, &e.to_string(), deadline);
        return Err(e);
    }
    let node = node(sh)?;
    let (ini, ini_psn, _) = initiator_for(rc, hello.node_id, None)?;
    let data = sh.accept_data.lock().clone();
    let (key, id, info) = crate::setup::register(rc, Arc::clone(&ini), ini_psn, data)?;
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
    crate::setup::settle(rc, key, id, result, "accepted (xrc)", from).map(Some)
}
