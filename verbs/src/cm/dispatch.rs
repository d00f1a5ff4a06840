//! What arrives for an ID, from the network or its timer: a listener's REQ (a new ID and
//! CONNECT_REQUEST), a MAD for a communication, a time-out; and the execution of the state
//! machine's outputs (MADs out, QP transitions, events).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use super::agent::Agent;
use super::conn::{CMA_HDR_LEN, cma_source, connect_qp, mtu_of};
use super::event::{CmEvent, CmEventKind, PeerConnParam, status};
use super::id::{CmId, IdInner, IdState, PeerPath};
use super::mad::Mad;
use super::msg::{Rep, Req, reason};
use super::proto::{Conn, Notice, Output, State};
use crate::types::{QpAttr, QpAttrMask as M, QpState, Qpn};

impl IdInner {
    /// A passive ID leaves its listener's backlog (accepted, rejected, or gone).
    pub(crate) fn release_parent(&self, st: &mut IdState) {
        if let Some(parent) = st.parent.take().and_then(|w| w.upgrade()) {
            let mut p = parent.st.lock();
            p.pending = p.pending.saturating_sub(1);
        }
    }

    /// A REQ for this listener.
    pub(crate) fn handle_req(
        self: &Arc<Self>,
        now: Instant,
        agent: &Arc<Agent>,
        from: SocketAddr,
        mad: &Mad,
        req: &Req,
    ) {
        let mut st = self.st.lock();
        let (Some(backlog), Some(local), Some(ctx)) = (st.backlog, st.local, self.ctx.get()) else {
            drop(st);
            agent.reject_req(mad, from, reason::INVALID_SERVICE_ID);
            return;
        };
        if req.service_id != self.ps.service_id(local.port()) {
            drop(st);
            agent.reject_req(mad, from, reason::INVALID_SERVICE_ID);
            return;
        }
        if req.transport_type > 1 {
            drop(st);
            agent.reject_req(mad, from, reason::INVALID_TRANSPORT_TYPE);
            return;
        }
        if req.primary_local_lid == 0 {
            // No data-path UDP port: the REQ comes from a CM that is not ours.
            drop(st);
            agent.reject_req(mad, from, reason::INVALID_LID);
            return;
        }
        if st.pending >= backlog {
            agent.count_backlog_full();
            return;
        }
        st.pending += 1;
        let child = CmId::create(&self.channel, self.ps, Some(ctx.clone()));
        let _ = child.inner.ctx.set(ctx.clone());
        let comm_id = agent.alloc_comm_id(&child.inner);
        agent.note_req(from, req.local_comm_id, comm_id);
        {
            let mut c = child.inner.st.lock();
            c.local = Some(local);
            c.peer = Some(cma_source(&req.private_data).unwrap_or(from));
            c.agent = Some(Arc::clone(agent));
            c.route_resolved = true;
            c.parent = Some(Arc::downgrade(self));
            c.path = PeerPath {
                gid: req.primary_local_gid,
                udp_port: req.primary_local_lid,
                qpn: req.local_qpn,
                psn: req.starting_psn,
                mtu: req.path_mtu,
                ack_timeout: req.primary_local_ack_timeout,
                retry_count: req.retry_count,
                rnr_retry: req.rnr_retry_count,
            };
            c.conn = Some(Conn::passive(
                comm_id,
                mad.tid,
                (req.local_comm_id, req.local_qpn),
            ));
            // The REQ's peer CM address is where answers go: the UDP source.
            c.peer_cm = Some(from);
        }
        drop(st);
        let _ = now;
        let mut ev = CmEvent::new(CmEventKind::ConnectRequest, child);
        ev.listen_id = Some(CmId::from_inner(self));
        ev.private_data = req
            .private_data
            .get(CMA_HDR_LEN..)
            .unwrap_or_default()
            .to_vec();
        ev.conn = Some(PeerConnParam {
            responder_resources: req.responder_resources,
            initiator_depth: req.initiator_depth,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            qp_num: Qpn(req.local_qpn),
            srq: req.srq,
        });
        self.channel.push(ev);
    }

    /// A MAD for this ID's communication.
    pub(crate) fn handle_mad(self: &Arc<Self>, now: Instant, mad: &Mad, from: SocketAddr) {
        let mut st = self.st.lock();
        let mut out = Vec::new();
        let Some(conn) = st.conn.as_mut() else {
            return;
        };
        let _ = from;
        conn.handle(now, mad, &mut out);
        self.execute(&mut st, now, out);
    }

    /// The ID's timer.
    pub(crate) fn handle_timeout(self: &Arc<Self>, now: Instant) {
        let mut st = self.st.lock();
        let mut out = Vec::new();
        let Some(conn) = st.conn.as_mut() else {
            return;
        };
        conn.handle_timeout(now, &mut out);
        self.execute(&mut st, now, out);
    }

    /// Carries out the state machine's outputs, in order.
    pub(crate) fn execute(self: &Arc<Self>, st: &mut IdState, now: Instant, out: Vec<Output>) {
        let mut queue: std::collections::VecDeque<Output> = out.into();
        // Bounded: each output yields at most a few more, once (qp_connected).
        let mut budget = 64;
        while let Some(o) = queue.pop_front() {
            budget -= 1;
            if budget == 0 {
                break;
            }
            match o {
                Output::Send(m) => {
                    if let (Some(a), Some(to)) = (&st.agent, st.peer_cm.or(st.peer)) {
                        a.send(&m, to);
                    }
                }
                Output::QpError => {
                    if let Some(qp) = self.qp.get() {
                        let err = QpAttr {
                            qp_state: QpState::Err,
                            ..QpAttr::default()
                        };
                        if let Err(e) = qp.modify(&err, M::STATE) {
                            tracing::debug!(error = %e, "rdma_cm: moving the QP to ERR");
                        }
                    }
                }
                Output::ConnectQp(rep) => {
                    let ok = self.connect_active(st, &rep);
                    let mut more = Vec::new();
                    if let Some(c) = st.conn.as_mut() {
                        c.qp_connected(now, ok, &mut more);
                    }
                    queue.extend(more);
                    if ok {
                        let mut ev = CmEvent::new(CmEventKind::Established, CmId::from_inner(self));
                        ev.private_data = rep.private_data.to_vec();
                        ev.conn = Some(PeerConnParam {
                            responder_resources: rep.responder_resources,
                            initiator_depth: rep.initiator_depth,
                            retry_count: st.path.retry_count,
                            rnr_retry_count: rep.rnr_retry_count,
                            qp_num: Qpn(rep.local_qpn),
                            srq: rep.srq,
                        });
                        self.channel.push(ev);
                    }
                }
                Output::Notify(n) => {
                    let (kind, status, private) = match n {
                        Notice::Established(p) => (CmEventKind::Established, 0, p),
                        Notice::Rejected(r, p) => (CmEventKind::Rejected, i32::from(r), p),
                        Notice::Unreachable => {
                            (CmEventKind::Unreachable, status::TIMED_OUT, vec![])
                        }
                        Notice::ConnectError => {
                            (CmEventKind::ConnectError, status::INVALID, vec![])
                        }
                        Notice::Disconnected => (CmEventKind::Disconnected, 0, vec![]),
                    };
                    if kind == CmEventKind::Rejected {
                        self.release_parent(st);
                    }
                    let mut ev = CmEvent::new(kind, CmId::from_inner(self));
                    ev.status = status;
                    ev.private_data = private;
                    self.channel.push(ev);
                }
            }
        }
        if let Some(c) = &st.conn
            && c.state() == State::Closed
            && let Some(a) = &st.agent
        {
            a.unregister(c.local_comm_id);
        }
    }

    /// Active side: connects the QP with the REP's values; false on failure.
    fn connect_active(&self, st: &mut IdState, rep: &Rep) -> bool {
        let (Some(qp), Ok(port)) = (self.qp.get(), u16::try_from(rep.local_qkey)) else {
            return false;
        };
        st.path.udp_port = port;
        st.path.qpn = rep.local_qpn;
        st.path.psn = rep.starting_psn;
        st.path.rnr_retry = rep.rnr_retry_count;
        let path = st.path;
        // The active side takes the REP's values mirrored (the peer's initiator depth is
        // what it may ask of us, its responder resources what we may ask of it).
        let rd = (rep.initiator_depth, rep.responder_resources);
        match connect_qp(
            qp,
            &path,
            mtu_of(path.mtu),
            st.local_psn,
            rd,
            rep.rnr_retry_count,
        ) {
            Ok(()) => port != 0,
            Err(e) => {
                tracing::debug!(error = %e, "rdma_cm: connecting the QP");
                false
            }
        }
    }
}
