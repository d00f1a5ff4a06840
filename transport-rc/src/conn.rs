//! Setting endpoints up (queue pair, bootstrap exchange) and keeping them alive.

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdmx_core::bootstrap::{self, BootstrapError, EndpointInfo, Frame, PathInfo, TransportKind};
use rdmx_core::credit::{RecvWindow, SendWindow};

use rdmx_core::worker::{Cx, WaitSlot};
use rdmx_core::{DisconnectCause, Error, Result};
use rdmx_verbs::{
    AccessFlags, AhAttr, Gid, MigState, Mtu, QpAttr, QpAttrMask as M, QpCap, QpInitAttr, QpState,
    QueuePair, Rkey, WrOpcode,
};

use crate::context::{Context, MAX_ENDPOINTS};
use crate::endpoint::Endpoint;
use crate::ep::{Ep, Hold, Status};
use crate::send::{PostData, post_on};
use crate::shared::{RcRef, Shared, State};
use crate::wire::{MAILBOX_LEN, Mailbox};

/// Send queue depth of an endpoint's queue pair.
pub(crate) fn sq_depth(sh: &Shared) -> u32 {
    sh.cfg.credits.saturating_mul(2).saturating_add(64)
}

/// The local ACK timeout exponent (4.096 us * 2^t per try) so that 8 tries take about half
/// the peer timeout.
pub(crate) fn timeout_exponent(peer_timeout: Duration) -> u8 {
    let per_try_ns = (peer_timeout.as_nanos() / 16).max(4096);
    let mut t = 1u8;
    while t < 31 && 4096u128 << t < per_try_ns {
        t += 1;
    }
    t
}

/// How long an endpoint may be silent before it is probed with a keepalive: the peer
/// timeout less what the probe's tries take (8 of the ACK timeout, rounded up to a power of
/// two) and one background tick, so that a dead peer is reported within the peer timeout.
/// (Probing after half the timeout overshot it: 3.5-3.7 s with a 3 s timeout.)
pub(crate) fn probe_after(peer_timeout: Duration, tick: Duration) -> Duration {
    let tries = Duration::from_nanos((4096u64 << timeout_exponent(peer_timeout)) * 8);
    peer_timeout.saturating_sub(tries + tick)
}

pub(crate) fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x5eed);
    (h.finish() as u32) & 0x00ff_ffff
}

fn create_qp(sh: &Shared) -> Result<QueuePair> {
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

/// The address vector of a peer's path.
pub(crate) fn av(path: &PathInfo) -> AhAttr {
    AhAttr::new(Gid(path.gid)).with_udp_port(path.udp_port)
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
        ah_attr: av(path),
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
    let gid = sh.vctx.query_gid(port, 0)?;
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
fn bring_up_endpoint(rc: &RcRef, key: usize, psn: u32, peer: &EndpointInfo) -> Result<()> {
    rc.with(|sh, st, _| {
        let ep = st
            .eps
            .get(key)
            .ok_or(Error::Disconnected(DisconnectCause::LocalClose))?;
        bring_up(sh, &ep.qp, psn, peer)
    })
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
) -> Result<Endpoint> {
    if let Err(e) = result {
        unregister(rc, key);
        return Err(e);
    }
    tracing::debug!(endpoint = id, %peer, "{what}");
    Ok(Endpoint::new(rc.clone(), key, id, peer))
}

/// Loads `path` (the peer's side, reached from local port `local_port`) as the queue pair's
/// alternate path and asks for it to be armed (automatic path migration).
pub(crate) fn load_alternate(
    sh: &Shared,
    qp: &QueuePair,
    path: &PathInfo,
    local_port: u8,
) -> Result<()> {
    let mut alt = av(path);
    alt.port_num = local_port;
    qp.modify(
        &QpAttr {
            qp_state: QpState::Rts,
            path_mig_state: MigState::Rearm,
            alt_ah_attr: alt,
            alt_port_num: local_port,
            alt_timeout: timeout_exponent(sh.cfg.peer_timeout),
            ..QpAttr::default()
        },
        M::STATE | M::ALT_PATH | M::PATH_MIG_STATE,
    )?;
    Ok(())
}

/// Registers a new endpoint (not yet connected) and describes it for the peer. `qp` is its
/// RC queue pair, or (XRC) an initiator that may still be replaced by the context's
/// existing one once the peer's node is known.
pub(crate) fn register(
    rc: &RcRef,
    qp: Arc<QueuePair>,
    psn: u32,
) -> Result<(usize, u64, EndpointInfo)> {
    rc.with(|sh, st, _| {
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
        let mailbox_off = key * MAILBOX_LEN;
        let _ = sh.mailbox.write(mailbox_off, &[0; MAILBOX_LEN]);
        let qpn = qp.qp_num().0;
        let xrc = sh.node.as_ref();
        let info = EndpointInfo {
            transport: if xrc.is_some() {
                TransportKind::Xrc
            } else {
                TransportKind::Rc
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
            mailbox_addr: sh.mailbox.addr() + mailbox_off as u64,
            mailbox_rkey: sh.mailbox.rkey().0,
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
            peer_context: 0,
            mailbox_off,
            mailbox_seen: Mailbox::default(),
            peer_eager_limit: 0,
            peer_max_message: 0,
            next_seq: 0,
            sq_depth: sq_depth(sh),
            unsignaled: 0,
            inflight: VecDeque::new(),
            signaled_out: 0,
            ops_done: Vec::new(),
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
            rearm_after: None,
            last_rx: Instant::now(),
            keepalive_at: None,
            close_deadline: None,
            linger_until: None,
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
pub(crate) fn complete(rc: &RcRef, key: usize, peer: &EndpointInfo) {
    rc.with(|sh, st, cx| {
        let target = st.budget.target();
        if let Some(ep) = st.eps.get_mut(key) {
            if ep.status == Status::Connecting {
                ep.status = Status::Open;
            }
            ep.peer_tag = peer.tag as u16;
            ep.peer_context = peer.context_id;
            if sh.node.is_some() {
                ep.remote_srqn = peer.srq_nums.first().copied();
            }
            ep.send = SendWindow::new(peer.credits);
            ep.peer_mailbox = (peer.mailbox_addr, peer.mailbox_rkey);
            ep.peer_eager_limit = peer.eager_limit as usize;
            ep.peer_max_message = usize::try_from(peer.max_message).unwrap_or(usize::MAX);
            ep.last_rx = Instant::now();
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
        }
        sh.after(st, cx);
    });
}

pub(crate) fn unregister(rc: &RcRef, key: usize) {
    rc.with(|sh, st, cx| sh.remove(st, cx, key));
}

pub(crate) fn check_peer(sh: &Shared, peer: &EndpointInfo) -> Result<()> {
    let ours = if sh.node.is_some() {
        TransportKind::Xrc
    } else {
        TransportKind::Rc
    };
    if peer.transport != ours {
        return Err(Error::Protocol(format!(
            "the peer uses transport {:?}, this context {ours:?}",
            peer.transport
        )));
    }
    if ours == TransportKind::Xrc && peer.srq_nums.len() != 1 {
        return Err(Error::Protocol(
            "an XRC peer must name exactly one receive queue".into(),
        ));
    }
    Ok(())
}

/// The connecting side.
pub(crate) fn connect(ctx: &Context, addr: SocketAddr) -> Result<Endpoint> {
    let sh = ctx.shared();
    let deadline = Instant::now() + sh.cfg.connect_timeout;
    if sh.node.is_some() {
        return connect_xrc(ctx.rc(), addr, deadline);
    }
    let mut stream = bootstrap::connect(addr, deadline)?;
    let psn = random_psn();
    let qp = Arc::new(create_qp(sh)?);
    let (key, id, info) = register(ctx.rc(), qp, psn)?;
    let result = (|| -> Result<()> {
        bootstrap::send_frame(&mut stream, &Frame::Hello(info), deadline)?;
        let peer = bootstrap::expect_accept(&mut stream, deadline)?;
        check_peer(sh, &peer)?;
        bring_up_endpoint(ctx.rc(), key, psn, &peer)?;
        complete(ctx.rc(), key, &peer);
        Ok(())
    })();
    settle(ctx.rc(), key, id, result, "connected", addr)
}

/// The connecting side of an XRC endpoint: the exchange, tried again after a short random
/// pause while the listener declines because its context is busy with another exchange
/// ([`bootstrap::REJECT_BUSY`]).
fn connect_xrc(rc: &RcRef, addr: SocketAddr, deadline: Instant) -> Result<Endpoint> {
    let sh = &*rc.sh;
    loop {
        // XRC exchanges of a context run one at a time, and the TCP connection is made
        // under that lock: otherwise a listener could accept the connection of a thread
        // still waiting here, and wait for its Hello while the thread it should be
        // answering waits for it (16 threads connecting at once through one context timed
        // out every time).
        let one_at_a_time = crate::xrc::exchange_lock(sh, deadline)?;
        let stream = bootstrap::connect(addr, deadline)?;
        match crate::xrc::connect(rc, one_at_a_time, stream, addr, deadline) {
            Err(Error::Bootstrap(BootstrapError::Rejected(r))) if r == bootstrap::REJECT_BUSY => {
                // Our lock is released: the peer's own exchange with us can go ahead.
                let pause = Duration::from_millis(5 + crate::context::random_u64() % 40);
                if Instant::now() + pause >= deadline {
                    return Err(Error::Bootstrap(BootstrapError::Rejected(r)));
                }
                tracing::debug!(%addr, ?pause, "the listener is busy; trying again");
                std::thread::sleep(pause);
            }
            other => return other,
        }
    }
}

/// The listening side, after the TCP accept. `None`: the exchange was declined for now
/// (XRC, context busy with another exchange); the caller accepts the next connection.
pub(crate) fn accept(
    ctx: &Context,
    mut stream: TcpStream,
    from: SocketAddr,
) -> Result<Option<Endpoint>> {
    let sh = ctx.shared();
    let deadline = Instant::now() + sh.cfg.connect_timeout;
    let peer = bootstrap::expect_hello(&mut stream, deadline)?;
    if sh.node.is_some() && peer.transport == TransportKind::Xrc {
        return crate::xrc::accept(ctx.rc(), stream, from, &peer, deadline);
    }
    if let Err(e) = check_peer(sh, &peer) {
        let _ = bootstrap::reject(&mut stream, &e.to_string(), deadline);
        return Err(e);
    }
    let psn = random_psn();
    let qp = match create_qp(sh) {
        Ok(q) => q,
        Err(e) => {
            let _ = bootstrap::reject(&mut stream, "cannot create a queue pair", deadline);
            return Err(e);
        }
    };
    let (key, id, info) = register(ctx.rc(), Arc::new(qp), psn)?;
    let result = (|| -> Result<()> {
        bring_up_endpoint(ctx.rc(), key, psn, &peer)?;
        complete(ctx.rc(), key, &peer);
        bootstrap::send_frame(&mut stream, &Frame::Accept(info), deadline)?;
        Ok(())
    })();
    settle(ctx.rc(), key, id, result, "accepted", from).map(Some)
}

/// Background duties, every tick: probe peers that have been silent for half the peer
/// timeout (a signaled mailbox write: a dead peer makes it exhaust its retries), and give up
/// on closes that take longer than the peer timeout.
pub(crate) fn keepalive(sh: &Shared, st: &mut State, cx: &mut Cx<'_>, now: Instant) {
    let probe = probe_after(sh.cfg.peer_timeout, sh.keepalive_tick());
    let mut expired = Vec::new();
    for (k, ep) in st.eps.iter_mut() {
        if ep.linger_until.is_some_and(|t| now >= t) {
            ep.linger_until = None;
            st.reap_pending = true;
        }
        if let Some(d) = ep.close_deadline
            && now >= d
            && !matches!(ep.status, Status::Down(_))
        {
            expired.push(k);
            continue;
        }
        if !matches!(ep.status, Status::Open | Status::Closing) {
            continue;
        }
        if now.duration_since(ep.last_rx) < probe || ep.signaled_out > 0 {
            continue;
        }
        // Probes are spaced the same way: a peer that dies right after answering one is
        // found by the next within the peer timeout (spacing them half the timeout apart
        // overshot it: 0.45 s with a 0.4 s timeout).
        if ep
            .keepalive_at
            .is_some_and(|t| now.duration_since(t) < probe)
        {
            continue;
        }
        let m = Mailbox {
            grant: ep.recv.advertised,
            rndv_done: ep.rndv_in_adv,
        };
        let bytes = m.to_word().to_be_bytes();
        let op = WrOpcode::RdmaWrite {
            remote_addr: ep.peer_mailbox.0,
            rkey: Rkey(ep.peer_mailbox.1),
        };
        if post_on(ep, op, PostData::Inline(&bytes), Hold::None, true).is_ok() {
            ep.keepalive_at = Some(now);
        }
    }
    crate::recall::tick(sh, st, cx, now);
    for k in expired {
        sh.fail(
            st,
            cx,
            k,
            DisconnectCause::PeerUnreachable("the peer did not finish closing in time".into()),
        );
    }
    sh.after(st, cx);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_leave_room_for_their_retries() {
        for ms in [10u64, 200, 1000, 2000, 3000, 10_000] {
            let t = Duration::from_millis(ms);
            let tick = (t / 4).min(Duration::from_millis(100));
            let tries = Duration::from_nanos((4096u64 << timeout_exponent(t)) * 8);
            let probe = probe_after(t, tick);
            assert!(probe + tries + tick <= t.max(tries + tick), "{ms} ms");
        }
        // 3 s: 8 tries of 268 ms, so probe after 0.75 s of silence (not 1.5 s).
        let t = Duration::from_secs(3);
        assert_eq!(timeout_exponent(t), 16);
        assert!(probe_after(t, Duration::from_millis(100)) < Duration::from_millis(800));
    }

    #[test]
    fn timeout_exponent_scales() {
        // 2 s peer timeout: 8 tries of ~134 ms.
        assert_eq!(timeout_exponent(Duration::from_secs(2)), 15);
        assert_eq!(timeout_exponent(Duration::from_millis(10)), 8);
        assert_eq!(timeout_exponent(Duration::from_secs(100_000)), 31);
    }
}
