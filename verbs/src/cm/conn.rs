//! Connecting: `rdma_connect`, `rdma_accept`, `rdma_reject`, `rdma_disconnect`, rdma_cm's
//! REQ header, and the QP transitions of a connection (the answers from the network are
//! in `dispatch.rs`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::error::CmError;
use super::id::{CmId, ConnParam, IdInner, PeerPath, PortSpace, random_psn};
use super::mad::{CmMsg, Mad};
use super::msg::{REP_PRIVATE_LEN, REQ_PRIVATE_LEN, Rep, Req};
use super::proto::{
    Conn, MAX_CM_RETRIES, Output, RESPONSE_TIMEOUT_CODE, State, Timing, WrongState,
};
use crate::os::clock;
use crate::types::{AhAttr, Gid, Mtu, QpAttr, QpAttrMask as M, QpState, QpType};

/// Bytes of rdma_cm's header at the start of a REQ's private data.
pub const CMA_HDR_LEN: usize = 36;
/// Private data an application may give `connect` (92 - 36).
pub const CONNECT_PRIVATE_MAX: usize = REQ_PRIVATE_LEN - CMA_HDR_LEN;
/// Private data an application may give `accept`.
pub const ACCEPT_PRIVATE_MAX: usize = REP_PRIVATE_LEN;
/// Private data an application may give `reject`.
pub const REJECT_PRIVATE_MAX: usize = super::msg::REJ_PRIVATE_LEN;
/// The local ACK timeout code of our connections (4.096 us × 2^14 ≈ 67 ms).
const ACK_TIMEOUT: u8 = 14;
/// The RNR NAK timer code our responders use.
const MIN_RNR_TIMER: u8 = 12;

/// rdma_cm's header (`cma_hdr`): version 0, IP version in the high nibble, the source port,
/// the source and destination addresses (IPv4 as 12 zero bytes and the address).
fn cma_header(src: SocketAddr, dst: SocketAddr) -> [u8; CMA_HDR_LEN] {
    let mut h = [0u8; CMA_HDR_LEN];
    let v4 = src.is_ipv4() && dst.is_ipv4();
    h[1] = if v4 { 0x40 } else { 0x60 };
    h[2..4].copy_from_slice(&src.port().to_be_bytes());
    h[4..20].copy_from_slice(&cma_addr(src.ip(), v4));
    h[20..36].copy_from_slice(&cma_addr(dst.ip(), v4));
    h
}

fn cma_addr(ip: IpAddr, v4: bool) -> [u8; 16] {
    match ip {
        IpAddr::V4(a) if v4 => {
            let mut b = [0u8; 16];
            b[12..].copy_from_slice(&a.octets());
            b
        }
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// The source address in a REQ's rdma_cm header, if the header is one.
pub(super) fn cma_source(private: &[u8; REQ_PRIVATE_LEN]) -> Option<SocketAddr> {
    let (hdr, _) = private.split_first_chunk::<CMA_HDR_LEN>()?;
    if hdr[0] != 0 {
        return None;
    }
    let port = u16::from_be_bytes([hdr[2], hdr[3]]);
    let mut a = [0u8; 16];
    a.copy_from_slice(&hdr[4..20]);
    let ip = match hdr[1] >> 4 {
        4 => IpAddr::V4(Ipv4Addr::new(a[12], a[13], a[14], a[15])),
        6 => IpAddr::V6(Ipv6Addr::from(a)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

fn wrong(op: &'static str, s: WrongState) -> CmError {
    CmError::InvalidState {
        op,
        why: s.0.name(),
    }
}

impl CmId {
    /// Connects to the resolved peer (`rdma_connect`): sends a REQ (again after each
    /// response time-out, a bounded number of times). ESTABLISHED follows when the peer
    /// accepts (the QP is then in RTS), REJECTED when it refuses, UNREACHABLE when nobody
    /// answers (about 2.7 s).
    ///
    /// # Errors
    /// `InvalidState` before `resolve_route`, without a QP, or when already connecting;
    /// `PrivateDataTooLong` beyond 56 bytes; `Unsupported` in the UDP port space (SIDR).
    pub fn connect(&self, param: &ConnParam) -> Result<(), CmError> {
        const OP: &str = "connect";
        param.check(OP, CONNECT_PRIVATE_MAX)?;
        if self.inner.ps != PortSpace::Tcp {
            return Err(CmError::Unsupported("connect in the UDP port space (SIDR)"));
        }
        #[cfg(feature = "ibverbs")]
        if let Some(hw) = self.hw() {
            return hw.connect(self, param);
        }
        let (Some(ctx), Some(qp)) = (self.inner.ctx.get(), self.inner.qp.get()) else {
            return Err(CmError::InvalidState {
                op: OP,
                why: "the ID has no QP (create_qp; CONNECT_RESPONSE is not supported)",
            });
        };
        let mut st = self.inner.st.lock();
        let (Some(local), Some(peer), Some(agent)) = (st.local, st.peer, st.agent.clone()) else {
            return Err(CmError::InvalidState {
                op: OP,
                why: "the address is not resolved",
            });
        };
        if !st.route_resolved {
            return Err(CmError::InvalidState {
                op: OP,
                why: "the route is not resolved",
            });
        }
        if st.conn.is_some() {
            return Err(CmError::InvalidState {
                op: OP,
                why: "the ID already connects",
            });
        }
        let data = ctx.port_addr(1)?;
        let mtu = ctx.query_port(1)?.active_mtu;
        let psn = random_psn();
        let comm_id = agent.alloc_comm_id(&self.inner);
        let mut private_data = [0u8; REQ_PRIVATE_LEN];
        private_data[..CMA_HDR_LEN].copy_from_slice(&cma_header(local, peer));
        private_data[CMA_HDR_LEN..CMA_HDR_LEN + param.private_data.len()]
            .copy_from_slice(&param.private_data);
        let req = Req {
            local_comm_id: comm_id,
            service_id: self.inner.ps.service_id(peer.port()),
            local_ca_guid: ctx.query_device().node_guid,
            local_qkey: 0,
            local_qpn: qp.qp_num().0,
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            remote_cm_response_timeout: RESPONSE_TIMEOUT_CODE,
            transport_type: u8::from(qp.qp_type() == QpType::Uc),
            flow_control: true,
            starting_psn: psn,
            local_cm_response_timeout: RESPONSE_TIMEOUT_CODE,
            retry_count: param.retry_count,
            pkey: 0xFFFF,
            path_mtu: mtu as u8,
            rnr_retry_count: param.rnr_retry_count,
            max_cm_retries: MAX_CM_RETRIES,
            srq: false,
            primary_local_lid: data.port(),
            primary_remote_lid: 0,
            primary_local_gid: ctx.query_gid(1, 0)?,
            primary_remote_gid: Gid::from_ip(peer.ip()),
            primary_flow_label: 0,
            primary_packet_rate: 0,
            primary_traffic_class: 0,
            primary_hop_limit: 64,
            primary_sl: 0,
            primary_subnet_local: false,
            primary_local_ack_timeout: ACK_TIMEOUT,
            private_data,
        };
        st.local_psn = psn;
        st.path = PeerPath {
            gid: Gid::from_ip(peer.ip()),
            mtu: mtu as u8,
            ack_timeout: ACK_TIMEOUT,
            retry_count: param.retry_count,
            ..PeerPath::default()
        };
        let mad = Mad {
            tid: crate::os::random_u64(),
            msg: CmMsg::Req(Box::new(req)),
        };
        let now = clock::monotonic();
        let mut out = Vec::new();
        st.conn = Some(Conn::active(now, mad, Timing::default(), &mut out));
        self.inner.execute(&mut st, now, out);
        drop(st);
        self.inner.channel.wake();
        Ok(())
    }

    /// Accepts the connection request this ID was created for (`rdma_accept`): moves the QP
    /// to RTR and RTS with the requester's values and sends a REP (again until the RTU
    /// comes). ESTABLISHED follows the RTU.
    ///
    /// # Errors
    /// `InvalidState` for an ID without a pending request or without a QP;
    /// `PrivateDataTooLong` beyond 196 bytes; `Verbs` when the QP cannot be moved.
    pub fn accept(&self, param: &ConnParam) -> Result<(), CmError> {
        const OP: &str = "accept";
        param.check(OP, ACCEPT_PRIVATE_MAX)?;
        #[cfg(feature = "ibverbs")]
        if let Some(hw) = self.hw() {
            return hw.accept(self, param);
        }
        let (Some(ctx), Some(qp)) = (self.inner.ctx.get(), self.inner.qp.get()) else {
            return Err(CmError::InvalidState {
                op: OP,
                why: "the ID has no QP (create_qp)",
            });
        };
        let mut st = self.inner.st.lock();
        let state = st.conn.as_ref().map(Conn::state);
        if state != Some(State::ReqRcvd) {
            return Err(CmError::InvalidState {
                op: OP,
                why: state.map_or("no connection request", State::name),
            });
        }
        let path = st.path;
        let psn = random_psn();
        let local_mtu = ctx.query_port(1)?.active_mtu as u8;
        let mtu = mtu_of(path.mtu.min(local_mtu));
        connect_qp(
            qp,
            &path,
            mtu,
            psn,
            (param.responder_resources, param.initiator_depth),
            path.rnr_retry,
        )?;
        let mut private_data = [0u8; REP_PRIVATE_LEN];
        private_data[..param.private_data.len()].copy_from_slice(&param.private_data);
        let Some(conn) = st.conn.as_mut() else {
            return Err(CmError::InvalidState {
                op: OP,
                why: "no connection request",
            });
        };
        let rep = Rep {
            local_comm_id: conn.local_comm_id,
            remote_comm_id: conn.remote_comm_id,
            local_qkey: u32::from(ctx.port_addr(1)?.port()),
            local_qpn: qp.qp_num().0,
            starting_psn: psn,
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            target_ack_delay: 0,
            failover_accepted: 0,
            flow_control: true,
            rnr_retry_count: param.rnr_retry_count,
            srq: false,
            local_ca_guid: ctx.query_device().node_guid,
            private_data,
        };
        let mad = Mad {
            tid: conn.tid(),
            msg: CmMsg::Rep(Box::new(rep)),
        };
        let now = clock::monotonic();
        let mut out = Vec::new();
        conn.accept(now, mad, &mut out).map_err(|s| wrong(OP, s))?;
        st.local_psn = psn;
        self.inner.release_parent(&mut st);
        self.inner.execute(&mut st, now, out);
        drop(st);
        self.inner.channel.wake();
        Ok(())
    }

    /// Refuses the connection request this ID was created for (`rdma_reject`): the
    /// requester gets REJECTED with `private_data` (at most 148 bytes).
    ///
    /// # Errors
    /// `InvalidState` for an ID without a pending request; `PrivateDataTooLong`.
    pub fn reject(&self, private_data: &[u8]) -> Result<(), CmError> {
        const OP: &str = "reject";
        if private_data.len() > REJECT_PRIVATE_MAX {
            return Err(CmError::PrivateDataTooLong {
                op: OP,
                len: private_data.len(),
                max: REJECT_PRIVATE_MAX,
            });
        }
        #[cfg(feature = "ibverbs")]
        if let Some(hw) = self.hw() {
            return hw.reject(private_data);
        }
        let mut st = self.inner.st.lock();
        let now = clock::monotonic();
        let mut out = Vec::new();
        let Some(conn) = st.conn.as_mut() else {
            return Err(CmError::InvalidState {
                op: OP,
                why: "no connection request",
            });
        };
        conn.reject(now, private_data, &mut out)
            .map_err(|s| wrong(OP, s))?;
        self.inner.release_parent(&mut st);
        self.inner.execute(&mut st, now, out);
        drop(st);
        self.inner.channel.wake();
        Ok(())
    }

    /// Disconnects (`rdma_disconnect`): the QP goes to ERR at once (outstanding work
    /// flushes), a DREQ goes to the peer, and DISCONNECTED follows on both sides.
    ///
    /// # Errors
    /// `InvalidState` when the ID is not connected.
    pub fn disconnect(&self) -> Result<(), CmError> {
        const OP: &str = "disconnect";
        #[cfg(feature = "ibverbs")]
        if let Some(hw) = self.hw() {
            return hw.disconnect(self);
        }
        let mut st = self.inner.st.lock();
        let now = clock::monotonic();
        let mut out = Vec::new();
        let Some(conn) = st.conn.as_mut() else {
            return Err(CmError::InvalidState {
                op: OP,
                why: "the ID is not connected",
            });
        };
        conn.disconnect(now, crate::os::random_u64(), &mut out)
            .map_err(|s| wrong(OP, s))?;
        self.inner.execute(&mut st, now, out);
        drop(st);
        self.inner.channel.wake();
        Ok(())
    }
}

/// The MTU of code `code`, 1024 bytes if the code is not one.
pub(super) fn mtu_of(code: u8) -> Mtu {
    [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ]
    .into_iter()
    .find(|m| *m as u8 == code)
    .unwrap_or(Mtu::Mtu1024)
}

/// Moves an INIT QP to RTR and RTS towards `path`; `rd` is (max_dest_rd_atomic,
/// max_rd_atomic).
pub(super) fn connect_qp(
    qp: &crate::qp::QueuePair,
    path: &PeerPath,
    mtu: Mtu,
    sq_psn: u32,
    rd: (u8, u8),
    rnr_retry: u8,
) -> Result<(), CmError> {
    let rc = qp.qp_type() == QpType::Rc;
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: AhAttr::new(path.gid).with_udp_port(path.udp_port),
        path_mtu: mtu,
        dest_qp_num: path.qpn,
        rq_psn: path.psn,
        max_dest_rd_atomic: rd.0,
        min_rnr_timer: MIN_RNR_TIMER,
        ..QpAttr::default()
    };
    let mut mask = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    if rc {
        mask |= M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
    }
    qp.modify(&rtr, mask)?;
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout: path.ack_timeout,
        retry_cnt: path.retry_count,
        rnr_retry,
        sq_psn,
        max_rd_atomic: rd.1,
        ..QpAttr::default()
    };
    let mut mask = M::STATE | M::SQ_PSN;
    if rc {
        mask |= M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
    }
    qp.modify(&rts, mask)?;
    Ok(())
}

impl Drop for IdInner {
    fn drop(&mut self) {
        // librdmacm's ID goes first (`rdma_destroy_id`), before the QP it names.
        #[cfg(feature = "ibverbs")]
        drop(self.hw.take());
        let st = self.st.get_mut();
        if let Some(mut conn) = st.conn.take() {
            let mut out = Vec::new();
            conn.destroy(crate::os::random_u64(), &mut out);
            if let (Some(a), Some(to)) = (&st.agent, st.peer_cm.or(st.peer)) {
                for o in out {
                    if let Output::Send(m) = o {
                        a.send(&m, to);
                    }
                }
            }
            if let Some(a) = &st.agent {
                a.unregister(conn.local_comm_id);
            }
        }
        if st.backlog.is_some()
            && let Some(a) = &st.agent
        {
            a.set_listener(None);
        }
        if let Some(parent) = st.parent.take().and_then(|w| w.upgrade()) {
            let mut p = parent.st.lock();
            p.pending = p.pending.saturating_sub(1);
        }
    }
}
