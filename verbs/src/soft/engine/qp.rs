//! One queue pair: attributes, state machine, queues, and the dispatch between its requester
//! (`requester.rs`), responder (`responder.rs`) and completer halves.

use std::net::SocketAddr;

use super::{AsyncEvent, OneOrMany, Payload, Resources, Transmit};
use crate::error::{PostError, VerbsError};
use crate::qp_state as state;
use crate::soft::wire::{IcrcPath, PacketHeaders, ROCE_UDP_PORT, Transport, finish_packet};
use crate::types::{
    AccessFlags, MigState, Psn, QpAttr, QpAttrMask as M, QpCap, QpState, QpType, Qpn, SendFlags,
    WcFlags, WcOpcode, WcStatus, WorkCompletion,
};
use crate::wr::{RecvWr, Sge};

/// Largest message (2 GiB), as `max_msg_sz` reports.
pub(crate) const MAX_MSG_SIZE: u64 = 1 << 31;

/// What a send WQE does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WqeKind {
    Send,
    Write,
    Read,
    CmpSwap,
    FetchAdd,
    /// Bind a memory window (runs on this NIC only).
    Bind,
    /// Invalidate a memory window (runs on this NIC only).
    LocalInv,
}

impl WqeKind {
    pub(crate) fn is_rd_atomic(self) -> bool {
        matches!(self, Self::Read | Self::CmpSwap | Self::FetchAdd)
    }

    /// Operations that send nothing: they run when they reach the front of the queue.
    pub(crate) fn is_local(self) -> bool {
        matches!(self, Self::Bind | Self::LocalInv)
    }

    fn wc_opcode(self) -> WcOpcode {
        match self {
            Self::Send => WcOpcode::Send,
            Self::Write => WcOpcode::RdmaWrite,
            Self::Read => WcOpcode::RdmaRead,
            Self::CmpSwap => WcOpcode::CompSwap,
            Self::FetchAdd => WcOpcode::FetchAdd,
            Self::Bind => WcOpcode::BindMw,
            Self::LocalInv => WcOpcode::LocalInv,
        }
    }
}

/// A posted send work request.
#[derive(Debug)]
pub(crate) struct SendWqe {
    pub(crate) wr_id: u64,
    pub(crate) kind: WqeKind,
    pub(crate) imm: Option<u32>,
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    pub(crate) compare: u64,
    pub(crate) swap_add: u64,
    pub(crate) flags: SendFlags,
    pub(crate) len: usize,
    /// Local data source (send/write) or destination (read/atomic result).
    pub(crate) payload: Payload,
    /// Set when local validation failed at post time; reported when the WQE starts.
    pub(crate) local_err: Option<WcStatus>,
    /// Destination of a UD send.
    pub(crate) ud: Option<crate::wr::UdDest>,
    /// Remote XRC SRQ of an XRC send.
    pub(crate) xrc_srqn: Option<u32>,
    /// The key a send with invalidate or a local invalidate names.
    pub(crate) inv: Option<u32>,
    /// What a bind does.
    pub(crate) bind: Option<crate::wr::MwBindWr>,
    /// An internal WQE of tag matching (a rendezvous read, a FIN).
    pub(crate) tm: Option<super::tm::TmWqe>,
    pub(crate) started: bool,
    pub(crate) first_psn: Psn,
    /// PSNs this WQE consumes.
    pub(crate) npsn: u32,
}

impl SendWqe {
    pub(crate) fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npsn.saturating_sub(1))
    }
}

/// A posted receive work request.
#[derive(Debug, Clone)]
pub(crate) struct RecvWqe {
    pub(crate) wr_id: u64,
    pub(crate) sges: OneOrMany<Sge>,
}

/// The network path of a connected QP.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Path {
    /// Local port index (0-based).
    pub(crate) port: usize,
    pub(crate) local: SocketAddr,
    pub(crate) remote: SocketAddr,
}

/// Queue pair state.
#[derive(Debug)]
pub(crate) struct Qp {
    pub(crate) qpn: Qpn,
    pub(crate) qp_type: QpType,
    pub(crate) pd: u32,
    pub(crate) send_cq: u32,
    pub(crate) recv_cq: u32,
    /// Shared receive queue the QP takes receive WQEs from, if any. For an XRC target QP:
    /// the SRQ named by the packet being handled.
    pub(crate) srq: Option<u32>,
    /// XRC domain of an XRC target QP.
    pub(crate) xrcd: Option<u32>,
    pub(crate) cap: QpCap,
    pub(crate) sq_sig_all: bool,
    pub(crate) attr: QpAttr,
    pub(crate) path: Option<Path>,
    /// The alternate path (APM).
    pub(crate) alt_path: Option<Path>,
    /// How many times this QP migrated.
    pub(crate) migrations: u32,
    pub(crate) in_tx_ready: bool,
    /// Listed in the NIC's set of QPs with timers.
    pub(crate) in_timed: bool,
    /// Next PSN of a UD QP's sends.
    pub(crate) ud_next_psn: Psn,
    pub(crate) req: super::requester::Requester,
    pub(crate) resp: super::responder::Responder,
}

impl Qp {
    pub(crate) fn new(
        qpn: Qpn,
        qp_type: QpType,
        pd: u32,
        send_cq: u32,
        recv_cq: u32,
        cap: QpCap,
        sq_sig_all: bool,
    ) -> Self {
        let attr = QpAttr {
            cap,
            ..QpAttr::default()
        };
        Self {
            qpn,
            qp_type,
            pd,
            send_cq,
            recv_cq,
            srq: None,
            xrcd: None,
            cap,
            sq_sig_all,
            attr,
            path: None,
            alt_path: None,
            migrations: 0,
            in_tx_ready: false,
            in_timed: false,
            ud_next_psn: Psn::new(0),
            req: Default::default(),
            resp: Default::default(),
        }
    }

    pub(crate) fn state(&self) -> QpState {
        self.attr.qp_state
    }

    pub(crate) fn mtu(&self) -> usize {
        self.attr.path_mtu.bytes()
    }

    /// `ibv_modify_qp`.
    pub(crate) fn modify(
        &mut self,
        now: u64,
        res: &mut Resources,
        a: &QpAttr,
        mask: M,
    ) -> Result<(), VerbsError> {
        let from = self.state();
        // The common layer (`QueuePair::modify`) has run the same check on the state it
        // queried; this one sees the state under the NIC lock.
        let to = state::check_modify(self.qp_type, from, a, mask)?;
        self.validate_values(res, a, mask)?;
        self.check_apm(res, a, mask, to)?;

        // Apply the attributes named in the mask.
        let mut n = self.attr;
        macro_rules! take {
            ($bit:expr, $($f:ident),+) => {
                if mask.contains($bit) {
                    $(n.$f = a.$f;)+
                }
            };
        }
        take!(M::ACCESS_FLAGS, qp_access_flags);
        take!(M::PKEY_INDEX, pkey_index);
        take!(M::PORT, port_num);
        take!(M::QKEY, qkey);
        take!(M::AV, ah_attr);
        take!(M::PATH_MTU, path_mtu);
        take!(M::TIMEOUT, timeout);
        take!(M::RETRY_CNT, retry_cnt);
        take!(M::RNR_RETRY, rnr_retry);
        take!(M::RQ_PSN, rq_psn);
        take!(M::MAX_QP_RD_ATOMIC, max_rd_atomic);
        take!(
            M::ALT_PATH,
            alt_ah_attr,
            alt_pkey_index,
            alt_port_num,
            alt_timeout
        );
        take!(M::MIN_RNR_TIMER, min_rnr_timer);
        take!(M::SQ_PSN, sq_psn);
        take!(M::MAX_DEST_RD_ATOMIC, max_dest_rd_atomic);
        // PATH_MIG_STATE is a request, applied by `apply_apm` below.
        take!(M::DEST_QPN, dest_qp_num);
        take!(M::EN_SQD_ASYNC_NOTIFY, en_sqd_async_notify);
        n.qp_state = to;
        n.cur_qp_state = to;
        self.attr = n;

        match (from, to) {
            (_, QpState::Reset) => self.reset(),
            (_, QpState::Err) if from != QpState::Err => self.enter_error(res),
            (QpState::Init, QpState::Rtr) if self.qp_type == QpType::Ud => {}
            (QpState::Rtr, QpState::Rts) if self.qp_type == QpType::Ud => {
                self.ud_next_psn = Psn::new(self.attr.sq_psn);
            }
            (QpState::Init, QpState::Rtr) => {
                let port = usize::from(self.attr.port_num).saturating_sub(1);
                let local =
                    res.cfg
                        .ports
                        .get(port)
                        .copied()
                        .ok_or(VerbsError::InvalidAttribute {
                            attr: "PORT",
                            reason: "no such port".into(),
                        })?;
                let av = self.attr.ah_attr;
                self.path = Some(Path {
                    port,
                    local,
                    remote: SocketAddr::new(av.dgid.to_ip(), av.udp_port),
                });
                self.resp.reset(Psn::new(self.attr.rq_psn));
            }
            (QpState::Rtr, QpState::Rts) => {
                self.req.set_window(res.cfg.max_unacked_psns);
                self.req.reset(Psn::new(self.attr.sq_psn), &self.attr);
            }
            (QpState::Rts, QpState::Sqd) => {
                self.attr.sq_draining = true;
                self.req.check_drained(self.qpn, &self.attr, res);
            }
            (QpState::Sqd, QpState::Rts) => {
                self.attr.sq_draining = false;
                self.req.reload_limits(&self.attr);
            }
            _ => {}
        }
        if matches!(to, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            let requested = mask.contains(M::PATH_MIG_STATE).then_some(a.path_mig_state);
            self.apply_apm(now, res, mask, requested)?;
        }
        Ok(())
    }

    fn validate_values(&self, res: &Resources, a: &QpAttr, mask: M) -> Result<(), VerbsError> {
        let bad =
            |attr: &'static str, reason: String| Err(VerbsError::InvalidAttribute { attr, reason });
        if mask.contains(M::PORT)
            && (a.port_num == 0 || usize::from(a.port_num) > res.cfg.ports.len())
        {
            return bad("PORT", format!("port {} does not exist", a.port_num));
        }
        if mask.contains(M::PKEY_INDEX) && a.pkey_index != 0 {
            return bad(
                "PKEY_INDEX",
                "the P_Key table has one entry (index 0)".into(),
            );
        }
        // Field widths (shared with the libibverbs provider).
        state::check_ranges(a, mask)?;
        if mask.contains(M::MAX_QP_RD_ATOMIC) && a.max_rd_atomic > 16 {
            return bad("MAX_QP_RD_ATOMIC", format!("{} > 16", a.max_rd_atomic));
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) && a.max_dest_rd_atomic > 16 {
            return bad(
                "MAX_DEST_RD_ATOMIC",
                format!("{} > 16", a.max_dest_rd_atomic),
            );
        }
        if mask.contains(M::PATH_MTU) {
            let port = if mask.contains(M::PORT) {
                a.port_num
            } else {
                self.attr.port_num
            };
            let active = res
                .cfg
                .port_mtus
                .get(usize::from(port).saturating_sub(1))
                .copied();
            if active.is_some_and(|m| a.path_mtu > m) {
                return bad(
                    "PATH_MTU",
                    format!(
                        "{} bytes is larger than port {port}'s active MTU",
                        a.path_mtu.bytes()
                    ),
                );
            }
        }
        if mask.contains(M::AV) && a.ah_attr.dgid.is_multicast() {
            return bad(
                "AV",
                "a connected QP cannot have a multicast destination".into(),
            );
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.req = Default::default();
        self.resp = Default::default();
        self.path = None;
        self.alt_path = None;
        self.migrations = 0;
        let cap = self.cap;
        self.attr = QpAttr {
            cap,
            ..QpAttr::default()
        };
    }

    /// Moves the QP to ERR and flushes every outstanding work request.
    pub(crate) fn enter_error(&mut self, res: &mut Resources) {
        self.attr.qp_state = QpState::Err;
        self.attr.cur_qp_state = QpState::Err;
        self.req.timers_off();
        while let Some(w) = self.req.sq.pop_front() {
            if !self.tm_wqe_done(res, &w, WcStatus::WrFlushErr) {
                let wc = self.send_wc(&w, WcStatus::WrFlushErr);
                res.complete(self.send_cq, wc, false);
            }
        }
        self.req.cursor = 0;
        self.uc_return_wqe(res);
        self.flush_receives(res);
        self.resp.out.clear();
    }

    /// An error moved the QP to ERR (a completion with `status` was already delivered).
    pub(crate) fn fatal(&mut self, res: &mut Resources) {
        if self.state() != QpState::Err {
            res.events.push_back(AsyncEvent::QpFatal(self.qpn));
            self.enter_error(res);
        }
    }

    pub(crate) fn send_wc(&self, w: &SendWqe, status: WcStatus) -> WorkCompletion {
        WorkCompletion {
            wr_id: w.wr_id,
            status,
            opcode: w.kind.wc_opcode(),
            byte_len: if w.kind == WqeKind::Read {
                w.len as u32
            } else {
                0
            },
            qp_num: self.qpn,
            ..WorkCompletion::EMPTY
        }
    }

    pub(crate) fn recv_wc(
        &self,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
        imm: Option<u32>,
    ) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len,
            imm_data: imm.unwrap_or(0),
            qp_num: self.qpn,
            wc_flags: if imm.is_some() {
                WcFlags::WITH_IMM
            } else {
                WcFlags::EMPTY
            },
            ..WorkCompletion::EMPTY
        }
    }

    /// `ibv_post_recv`.
    pub(crate) fn post_recv(
        &mut self,
        res: &mut Resources,
        wr: &RecvWr<'_>,
    ) -> Result<(), PostError> {
        let st = self.state();
        if self.srq.is_some() || matches!(self.qp_type, QpType::XrcSend | QpType::XrcRecv) {
            return Err(PostError::InvalidWorkRequest(
                "this QP has no receive queue of its own (SRQ or XRC); post to the SRQ",
            ));
        }
        if st == QpState::Reset {
            return Err(PostError::InvalidState {
                what: "receive",
                state: st,
            });
        }
        if self.resp.rq.len() >= self.cap.max_recv_wr as usize {
            return Err(PostError::QueueFull {
                what: "receive",
                depth: self.cap.max_recv_wr,
            });
        }
        if wr.sg_list.len() > self.cap.max_recv_sge as usize {
            return Err(PostError::TooManySge {
                count: wr.sg_list.len(),
                max: self.cap.max_recv_sge,
            });
        }
        if st == QpState::Err {
            let wc = self.recv_wc(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0, None);
            res.complete(self.recv_cq, wc, false);
            return Ok(());
        }
        self.resp.rq.push_back(RecvWqe {
            wr_id: wr.wr_id,
            sges: OneOrMany::from(wr.sg_list),
        });
        Ok(())
    }

    /// True when `poll_transmit` may have something.
    pub(crate) fn wants_transmit(&self) -> bool {
        !self.resp.out.is_empty() || self.req.has_work()
    }

    /// Routes a received packet to the requester (responses) or the responder (requests).
    pub(crate) fn handle_packet(
        &mut self,
        now: u64,
        res: &mut Resources,
        port: usize,
        src: SocketAddr,
        hdr: &PacketHeaders,
        payload: &[u8],
    ) {
        if !matches!(self.state(), QpState::Rtr | QpState::Rts | QpState::Sqd) {
            res.counters.rx_no_qp += 1;
            return;
        }
        let Some(path) = self.path else {
            res.counters.rx_no_qp += 1;
            return;
        };
        let _ = path;
        if !self.on_a_path(port, src)
            || !pkey_match(hdr.bth.pkey)
            || !self.takes_transport(hdr.bth.opcode.transport())
        {
            res.counters.rx_bad_addr += 1;
            return;
        }
        self.on_peer_mig_req(now, res, hdr.bth.mig_req);
        if self.qp_type == QpType::XrcRecv
            && !is_response(hdr.bth.opcode.operation())
            && !self.bind_xrc_srq(res, hdr)
        {
            return;
        }
        if is_response(hdr.bth.opcode.operation()) {
            if matches!(self.state(), QpState::Rts | QpState::Sqd) {
                self.handle_response(now, res, hdr, payload);
            } else {
                res.counters.rx_dropped_seq += 1;
            }
        } else {
            if self.state() == QpState::Rtr && !self.resp.comm_est {
                self.resp.comm_est = true;
                res.events.push_back(AsyncEvent::CommEstablished(self.qpn));
            }
            if self.qp_type == QpType::Uc {
                self.handle_uc_request(res, hdr, payload);
            } else {
                self.handle_request(now, res, hdr, payload);
            }
        }
    }

    /// Whether packets of `t` are meant for a QP of this type (an RC packet reaching a UC
    /// QP, or the other way round, is a misdirected packet).
    fn takes_transport(&self, t: Transport) -> bool {
        matches!(
            (t, self.qp_type),
            (Transport::Rc, QpType::Rc)
                | (Transport::Uc, QpType::Uc)
                | (Transport::Xrc, QpType::XrcSend | QpType::XrcRecv)
        )
    }

    /// Earliest timer deadline (requester timers and the responder's held ACK).
    pub(crate) fn next_timeout(&self) -> Option<u64> {
        match (self.req.next_timeout(), self.resp.ack_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs expired timers.
    pub(crate) fn handle_timeout(&mut self, now: u64, res: &mut Resources) {
        if self.resp.ack_deadline().is_some_and(|t| t <= now) {
            self.resp.release_ack();
        }
        self.handle_req_timeout(now, res);
    }

    /// Writes the next packet of this QP: responses first (they unblock the peer), then
    /// requests.
    pub(crate) fn poll_transmit(
        &mut self,
        now: u64,
        res: &mut Resources,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        if self.qp_type == QpType::Ud {
            return self.poll_ud(res, buf);
        }
        if let Some(t) = self.poll_response(res, buf) {
            return Some(t);
        }
        self.poll_request(now, res, buf)
    }

    /// Builds a packet: headers, then `payload_len` bytes produced by `fill`, then pad and
    /// ICRC. Returns the transmit descriptor.
    pub(crate) fn build(
        &self,
        hdr: &PacketHeaders,
        payload_len: usize,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8]),
    ) -> Option<Transmit> {
        let path = self.path?;
        let mut xrc_hdr;
        let transport = match self.qp_type {
            // Same transport, XRC opcodes (spec §7); requests carry XRCETH.
            QpType::XrcSend | QpType::XrcRecv => Some(Transport::Xrc),
            QpType::Uc => Some(Transport::Uc),
            _ => None,
        };
        let hdr = match transport {
            Some(t) => {
                xrc_hdr = *hdr;
                xrc_hdr.bth.opcode = hdr.bth.opcode.with_transport(t);
                &xrc_hdr
            }
            None => hdr,
        };
        let hl = hdr.emit(buf).ok()?;
        let body = buf.get_mut(hl..hl + payload_len)?;
        fill(body);
        let icrc = IcrcPath {
            src: path.local,
            dst: SocketAddr::new(path.remote.ip(), ROCE_UDP_PORT),
        };
        let len = finish_packet(buf, hl + payload_len, &icrc).ok()?;
        Some(Transmit {
            port: path.port,
            dst: path.remote,
            len,
        })
    }

    /// MigReq bit for outgoing packets (1 while MIGRATED, spec §8).
    pub(crate) fn mig_req(&self) -> bool {
        self.attr.path_mig_state == MigState::Migrated
    }

    /// Remote access permission the responder grants.
    pub(crate) fn allows(&self, f: AccessFlags) -> bool {
        self.attr.qp_access_flags.contains(f)
    }
}

impl Qp {
    /// An XRC target takes the receive WQE, the protection domain for R_Key checks and the
    /// completion queue from the XRC SRQ named in the packet's XRCETH (spec §7). A missing
    /// SRQ, or one of another XRC domain, is answered with a NAK remote access error.
    fn bind_xrc_srq(&mut self, res: &mut Resources, hdr: &PacketHeaders) -> bool {
        let Some(x) = hdr.xrceth else {
            res.counters.rx_malformed += 1;
            return false;
        };
        match res.srqs.get(&x.srqn) {
            Some(s) if s.xrc.is_some_and(|(d, _)| Some(d) == self.xrcd) => {
                self.srq = Some(x.srqn);
                self.pd = s.pd;
                self.recv_cq = s.xrc.map_or(0, |(_, cq)| cq);
                true
            }
            _ => {
                self.xrc_bad_srq(res, Psn::new(hdr.bth.psn));
                false
            }
        }
    }
}

/// P_Key match rule (spec §2.1) against our only P_Key, 0xFFFF.
fn pkey_match(pkey: u16) -> bool {
    const OURS: u16 = 0xFFFF;
    (pkey & 0x7FFF) == (OURS & 0x7FFF) && (pkey & 0x7FFF) != 0 && (pkey | OURS) & 0x8000 != 0
}

/// Response opcodes (READ responses, ACK, atomic ACK).
fn is_response(op: u8) -> bool {
    (0x0D..=0x12).contains(&op)
}
