//! Setting endpoints up, whatever the exchange: queue pairs and their state transitions,
//! registering an endpoint in the context, completing it with what the peer told, and undoing
//! it. The RC exchange (`conn.rs`) and the XRC one (`xrc.rs`) are built on it.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;

use rdmx_core::bootstrap::{EndpointInfo, PathInfo, Transport};
use rdmx_core::credit::{RecvWindow, SendWindow};

use rdmx_core::worker::WaitSlot;
use rdmx_core::{DisconnectCause, Error, Result};
use rdmx_verbs::{
    AccessFlags, Mtu, MwType, QpAttr, QpAttrMask as M, QpCap, QpInitAttr, QpState, QueuePair,
    WrOpcode,
};

use crate::engine::{load_alternate, timeout_exponent};
use crate::ep::{Ep, Hold, Slot, Status};
use crate::state::{MAX_ENDPOINTS, RcRef, Shared};
use crate::wire::{MAILBOX_LEN, Mailbox};

/// Send queue depth of an endpoint's queue pair.
pub(crate) fn sq_depth(sh: &Shared) -> u32 {
    sh.cfg.credits.saturating_mul(2).saturating_add(64)
}

/// A random first packet sequence number.
pub(crate) fn random_psn() -> u32 {
    (rdmx_verbs::random_u64() as u32) & 0x00ff_ffff
}

pub(crate) fn create_qp(sh: &Shared) -> Result<QueuePair> {
    let mut attr = QpInitAttr::rc(&sh.cq, &sh.cq);
    attr.srq = Some(&sh.srq);
    attr.cap = QpCap {
        max_send_wr: sq_depth(sh),
        max_recv_wr: 0,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: sh.max_inline_data,
    };
    let qp = sh.pd.create_qp(&attr)?;
    to_init(&qp)?;
    Ok(qp)
}

/// RESET -> INIT on port 1 with every remote access (RC queue pairs and XRC targets).
pub(crate) fn to_init(qp: &QueuePair) -> Result<()> {
    qp.modify(
        &QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            ..QpAttr::default()
        },
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )?;
    Ok(())
}

/// The path MTU both sides can use (the peer's, capped by our port's).
pub(crate) fn path_mtu(sh: &Shared, peer_mtu: u32) -> Mtu {
    Mtu::from_bytes_floor(peer_mtu.min(sh.mtu_bytes) as usize).unwrap_or(Mtu::Mtu1024)
}

/// INIT -> RTR towards `dest_qpn` over `path`, expecting `rq_psn` first. A responder (an RC
/// queue pair or an XRC target) also gets READ/atomic resources and an RNR timer; an XRC
/// initiator receives nothing.
pub(crate) fn to_rtr(
    sh: &Shared,
    qp: &QueuePair,
    path: &PathInfo,
    peer_mtu: u32,
    dest_qpn: u32,
    rq_psn: u32,
    responder: bool,
) -> Result<()> {
    let mut attr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: rdmx_verbs::AhAttr {
            sgid_index: u8::try_from(sh.gid_index(1)).unwrap_or(0),
            ..crate::util::av(path)
        },
        path_mtu: path_mtu(sh, peer_mtu),
        dest_qp_num: dest_qpn,
        rq_psn,
        ..QpAttr::default()
    };
    let mut mask = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    if responder {
        attr.max_dest_rd_atomic = 16;
        attr.min_rnr_timer = 12;
        mask |= M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
    }
    qp.modify(&attr, mask)?;
    Ok(())
}

/// RTR -> RTS sending from `sq_psn`. A requester (an RC queue pair or an XRC initiator)
/// gets the retry counts and READ/atomic depth; an XRC target sends only responses.
pub(crate) fn to_rts(sh: &Shared, qp: &QueuePair, sq_psn: u32, requester: bool) -> Result<()> {
    let mut attr = QpAttr {
        qp_state: QpState::Rts,
        timeout: timeout_exponent(sh.cfg.peer_timeout),
        sq_psn,
        ..QpAttr::default()
    };
    let mut mask = M::STATE | M::TIMEOUT | M::SQ_PSN;
    if requester {
        attr.retry_cnt = 7;
        attr.rnr_retry = 7;
        attr.max_rd_atomic = 16;
        mask |= M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
    }
    qp.modify(&attr, mask)?;
    Ok(())
}

pub(crate) fn path_info(sh: &Shared, port: u8) -> Result<PathInfo> {
    let gid = sh.vctx.query_gid(port, sh.gid_index(port))?;
    let udp_port = sh.vctx.port_addr(port).map_or(4791, |a| a.port());
    Ok(PathInfo {
        gid: gid.0,
        udp_port,
        port_num: port,
    })
}

/// Moves the queue pair to RTR and RTS towards the peer (and loads the peer's alternate
/// path when both sides have two ports).
fn bring_up(sh: &Shared, qp: &QueuePair, my_psn: u32, peer: &EndpointInfo) -> Result<()> {
    to_rtr(sh, qp, &peer.primary, peer.mtu, peer.qpn, peer.psn, true)?;
    to_rts(sh, qp, my_psn, true)?;
    if sh.ports >= 2
        && let Some(alt) = &peer.alternate
    {
        load_alternate(sh, qp, alt, 2)?;
    }
    Ok(())
}

/// Brings the queue pair of the registered endpoint `key` up towards `peer`.
pub(crate) fn bring_up_endpoint(
    rc: &RcRef,
    key: usize,
    psn: u32,
    peer: &EndpointInfo,
) -> Result<()> {
    rc.with(|sh, st, _| {
        let ep = st
            .eps
            .get_mut(key)
            .ok_or(Error::Disconnected(DisconnectCause::LocalClose))?;
        bring_up(sh, &ep.qp, psn, peer)?;
        // Our slot opens to the peer's queue pair now, before the peer can learn that it
        // may write it (the listener's Accept goes after this; the connector's
        // `Signal::Ready` follows the bind on this queue pair).
        if let Some((mw, k)) = &ep.mailbox_mw {
            let (mem, off) = sh.slot_mem(&ep.slot);
            let sge = mem.sge(off, MAILBOX_LEN);
            let bind = mw.bind_wr_sge(*k, &sge, AccessFlags::REMOTE_WRITE)?;
            crate::engine::send::post_on(
                ep,
                WrOpcode::BindMw(bind),
                crate::engine::send::PostData::Buf(sh.post_key),
                Hold::None,
                false,
            )?;
        }
        Ok(())
    })
}

/// An endpoint an exchange set up: its key in the context and its identifier.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Established {
    pub(crate) key: usize,
    pub(crate) id: u64,
}

/// Ends an exchange: the endpoint when `result` is `Ok`, else its registration undone and
/// the error.
pub(crate) fn settle(
    rc: &RcRef,
    key: usize,
    id: u64,
    result: Result<()>,
    what: &str,
    peer: SocketAddr,
) -> Result<Established> {
    if let Err(e) = result {
        unregister(rc, key);
        return Err(e);
    }
    tracing::debug!(endpoint = id, %peer, "{what}");
    Ok(Established { key, id })
}

/// Registers a new endpoint (not yet connected) and describes it for the peer. `qp` is its
/// RC queue pair, or (XRC) an initiator that may still be replaced by the context's
/// existing one once the peer's node is known.
pub(crate) fn register(
    rc: &RcRef,
    qp: Arc<QueuePair>,
    psn: u32,
    app_data: Vec<u8>,
) -> Result<(usize, u64, EndpointInfo)> {
    rc.with(|sh, st, cx| {
        let now = cx.now();
        if st.eps.len() >= MAX_ENDPOINTS {
            return Err(Error::InvalidArgument(format!(
                "a context holds at most {MAX_ENDPOINTS} endpoints"
            )));
        }
        let key = st.eps.vacant_key();
        let mut recv = RecvWindow::default();
        let credits = st.budget.add_endpoint(&mut recv);
        recv.advertise();
        let id = st.next_id;
        st.next_id += 1;
        // Confinement: the peer gets the key of a window over its own slot only, bound to
        // this endpoint's queue pair once it is ready to send (`bring_up_endpoint`); without
        // windows (and on XRC), the key of a registration of that slot alone.
        let (slot, mailbox_mw) = if sh.confine {
            let off = key * MAILBOX_LEN;
            let _ = sh.mailbox.write(off, &[0; MAILBOX_LEN]);
            let mw = sh.pd.alloc_mw(MwType::Type2)?;
            let k = mw.rkey().inc();
            (Slot::InRegion(off), Some((mw, k)))
        } else {
            let mr = sh.pd.reg_mr(
                MAILBOX_LEN,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )?;
            (Slot::Own(mr), None)
        };
        let (mem, off) = sh.slot_mem(&slot);
        let mailbox_addr = mem.addr() + off as u64;
        let mailbox_rkey = mailbox_mw.as_ref().map_or(mem.rkey().0, |(_, k)| k.0);
        let qpn = qp.qp_num().0;
        let xrc = sh.node.as_ref();
        let info = EndpointInfo {
            transport: if xrc.is_some() {
                Transport::Xrc
            } else {
                Transport::Rc
            },
            // XRC: the initiator is announced in the second Hello (see xrc.rs).
            qpn: if xrc.is_some() { 0 } else { qpn },
            psn,
            mtu: sh.mtu_bytes,
            primary: path_info(sh, 1)?,
            alternate: if sh.ports >= 2 {
                Some(path_info(sh, 2)?)
            } else {
                None
            },
            srq_nums: if xrc.is_some() {
                vec![sh.srq.srq_num()]
            } else {
                Vec::new()
            },
            credits,
            mailbox_addr,
            mailbox_rkey,
            max_message: sh.cfg.max_message as u64,
            eager_limit: sh.cfg.rndv_threshold as u32,
            context_id: sh.context_id,
            node_id: xrc.map_or(0, |n| n.id),
            tag: key as u32,
            xrc_target: None,
            xrc_target_path: xrc.and_then(|n| n.target_path(1)),
            xrc_target_alt: if sh.ports >= 2 {
                xrc.and_then(|n| n.target_path(2))
            } else {
                None
            },
            xrc_in_use: None,
            token: 0,
            app_data,
        };
        st.eps.insert(Ep {
            id,
            key,
            qp,
            qpn,
            // XRC: set once this node's target for the peer's initiator is known.
            recv_qpn: if xrc.is_some() { u32::MAX } else { qpn },
            remote_srqn: None,
            peer_tag: 0,
            status: Status::Connecting,
            detached: false,
            close_sent: false,
            peer_closed: false,
            closed_here: false,
            send: SendWindow::new(0),
            recv,
            in_needy: false,
            wait: WaitSlot::new(key),
            close_event_due: false,
            peer_mailbox: (0, 0),
            peer_ready: false,
            mailbox_mw,
            peer_context: 0,
            slot,
            awaiting_gone: false,
            mailbox_seen: Mailbox::default(),
            peer_eager_limit: 0,
            peer_max_message: 0,
            next_seq: 0,
            sq_depth: sq_depth(sh),
            unsignaled: 0,
            inflight: VecDeque::new(),
            signaled_out: 0,
            ops_done: Vec::new(),
            ops_abandoned: Vec::new(),
            peer_data: Arc::from(&[][..]),
            rndv_out: VecDeque::new(),
            rndv_out_done: 0,
            rndv_in_done: 0,
            rndv_in_adv: 0,
            rndv_in_seen: 0,
            pack: None,
            rndv_wake_at: None,
            rndv_queued: 0,
            inbox: VecDeque::new(),
            delivered: 0,
            paths: None,
            on_alt: false,
            rearm_port: None,
            last_rx: now,
            keepalive_at: None,
            timers: crate::timers::Timers::default(),
            recall: crate::ep::RecallState::default(),
        });
        if xrc.is_none() {
            st.by_qpn.insert(qpn, key);
        }
        Ok((key, id, info))
    })
}

/// Fills in what the peer told us, and opens the endpoint.
///
/// Until now it was `Connecting`: other threads of the context (granting credits, recalling
/// them, keepalives) left it alone, as its peer's mailbox was unknown. A write to it then
/// went to address 0 and took the endpoint down with a remote access error, which 100
/// client threads connecting at once through one context hit about once in 12 runs.
///
/// `peer_ready`: the peer's mailbox slot may be written at once (its window was bound
/// before it told us its side, or there is no window). The listening side passes false:
/// the connector binds its window only after our Accept, and tells us with the bootstrap
/// `Ready` (or its first message); until then nothing is written into its slot.
pub(crate) fn complete(rc: &RcRef, key: usize, peer: &EndpointInfo, peer_ready: bool) {
    rc.with(|sh, st, cx| {
        let target = st.budget.target();
        if let Some(ep) = st.eps.get_mut(key) {
            if ep.status == Status::Connecting {
                ep.status = Status::Open;
            }
            ep.peer_ready = peer_ready || !sh.confine;
            ep.peer_tag = peer.tag as u16;
            ep.peer_context = peer.context_id;
            ep.peer_data = peer.app_data.as_slice().into();
            if sh.node.is_some() {
                ep.remote_srqn = peer.srq_nums.first().copied();
            }
            ep.send = SendWindow::new(peer.credits);
            ep.peer_mailbox = (peer.mailbox_addr, peer.mailbox_rkey);
            ep.peer_eager_limit = peer.eager_limit as usize;
            ep.peer_max_message = usize::try_from(peer.max_message).unwrap_or(usize::MAX);
            ep.last_rx = cx.now();
            // The paths the endpoint's queue pair sends on (re-armed after a migration): the
            // peer's ports, or with XRC towards a node hosted by another process, that host's.
            let paths = match &peer.xrc_target_path {
                Some(p) => peer.xrc_target_alt.as_ref().map(|a| (p, a)),
                None => peer.alternate.as_ref().map(|a| (&peer.primary, a)),
            };
            if sh.ports >= 2
                && let Some((p, alt)) = paths
            {
                ep.paths = Some([p.clone(), alt.clone()]);
            }
            // Grants made while connecting are told now; below its window, it waits for more
            // like the others.
            let below = ep.recv.outstanding() < target;
            let unfed = ep.recv.granted == 0;
            if ep.recv.unadvertised() > 0 {
                st.dirty.push(key);
            }
            if below {
                sh.mark_needy(st, key);
            }
            // With every buffer promised, it has none: look for idle holders now rather than at
            // the next scan (the recall finds it among the starving).
            if unfed && st.budget.spare() == 0 {
                st.recall_scanned_at = None;
            }
            crate::engine::start_keepalive(sh, st, cx, key);
        }
        sh.after(st, cx);
    });
}

/// The listening side: the connector said (bootstrap `Ready`) that its slot's window is
/// bound.
pub(crate) fn peer_ready(rc: &RcRef, key: usize) {
    rc.with(|sh, st, cx| sh.peer_is_ready(st, cx, key));
}

pub(crate) fn unregister(rc: &RcRef, key: usize) {
    rc.with(|sh, st, cx| sh.remove(st, cx, key));
}

pub(crate) fn check_peer(sh: &Shared, peer: &EndpointInfo) -> Result<()> {
    let ours = if sh.node.is_some() {
        Transport::Xrc
    } else {
        Transport::Rc
    };
    if peer.transport != ours {
        return Err(Error::Protocol(format!(
            "the peer uses transport {:?}, this context {ours:?}",
            peer.transport
        )));
    }
    if ours == Transport::Xrc && peer.srq_nums.len() != 1 {
        return Err(Error::Protocol(
            "an XRC peer must name exactly one receive queue".into(),
        ));
    }
    Ok(())
}
