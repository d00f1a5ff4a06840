//! Unreliable datagram QPs (spec §6): one packet per message, DETH with Q_Key and source
//! QPN, the controlled-Q_Key rule, the 40-byte GRH in front of every receive, no ACKs and
//! silent, counted drops; and multicast groups (QPN 0xFFFFFF, one copy per attached QP).

use std::net::{IpAddr, SocketAddr};

use super::qp::{Qp, WqeKind};
use super::{Nic, Resources, Transmit, scatter};
use crate::error::{PostError, VerbsError};
use crate::grh::{GRH_LEN, build_grh};
use crate::soft::wire::{BthRepr, DethRepr, IcrcPath, Opcode, PacketHeaders, ROCE_UDP_PORT};
use crate::types::{
    Gid, QpState, QpType, Qpn, SendFlags, WcFlags, WcOpcode, WcStatus, WorkCompletion,
};
use crate::wr::UdDest;

impl Qp {
    /// Checks a UD send work request; returns its destination.
    pub(crate) fn check_ud_send(
        &self,
        res: &Resources,
        kind: WqeKind,
        len: u64,
        dest: Option<UdDest>,
    ) -> Result<UdDest, PostError> {
        if kind != WqeKind::Send {
            return Err(PostError::InvalidWorkRequest(
                "UD QPs only send (SEND or SEND with immediate)",
            ));
        }
        let Some(d) = dest else {
            return Err(PostError::InvalidWorkRequest(
                "a UD send needs an address handle, remote QPN and Q_Key (SendWr::to)",
            ));
        };
        let port = usize::from(d.ah.port_num).checked_sub(1);
        let Some(mtu) = port.and_then(|p| res.cfg.port_mtus.get(p)) else {
            return Err(PostError::InvalidWorkRequest(
                "the address handle names no local port",
            ));
        };
        let mtu = mtu.bytes() as u64;
        if len > mtu {
            return Err(PostError::MessageTooLong { len, max: mtu });
        }
        Ok(d)
    }

    /// Builds the next UD packet; the WQE completes as soon as it is on the wire.
    pub(crate) fn poll_ud(&mut self, res: &mut Resources, buf: &mut [u8]) -> Option<Transmit> {
        if !matches!(self.state(), QpState::Rts | QpState::Sqd) {
            return None;
        }
        let w = self.req.sq.pop_front()?;
        if let Some(status) = w.local_err {
            let wc = self.send_wc(&w, status);
            res.complete(self.send_cq, wc, false);
            self.send_queue_error(res);
            return None;
        }
        let d = w.ud?;
        let port = usize::from(d.ah.port_num).saturating_sub(1);
        let local = *res.cfg.ports.get(port)?;
        let dst_ip = d.ah.dgid.to_ip();
        let qkey = if d.remote_qkey & 0x8000_0000 != 0 {
            self.attr.qkey
        } else {
            d.remote_qkey
        };
        let psn = self.ud_next_psn;
        self.ud_next_psn = psn.add(1);
        let hdr = PacketHeaders {
            bth: BthRepr {
                opcode: if w.imm.is_some() {
                    Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
                } else {
                    Opcode::UD_SEND_ONLY
                },
                solicited: w.flags.contains(SendFlags::SOLICITED),
                mig_req: true,
                pad_count: 0,
                pkey: 0xFFFF,
                fecn: false,
                becn: false,
                dest_qp: d.remote_qpn.0,
                ack_req: false,
                psn: psn.value(),
            },
            deth: Some(DethRepr {
                qkey,
                src_qp: self.qpn.0,
            }),
            xrceth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            immdt: w.imm,
            ieth: None,
        };
        let hl = hdr.emit(buf).ok()?;
        let body = buf.get_mut(hl..hl + w.len)?;
        w.payload.gather(0, body);
        let icrc = IcrcPath {
            src: local,
            dst: SocketAddr::new(dst_ip, ROCE_UDP_PORT),
        };
        let len = crate::soft::wire::finish_packet(buf, hl + w.len, &icrc).ok()?;
        if self.sq_sig_all || w.flags.contains(SendFlags::SIGNALED) {
            let wc = self.send_wc(&w, WcStatus::Success);
            res.complete(self.send_cq, wc, false);
        }
        Some(Transmit {
            port,
            dst: SocketAddr::new(dst_ip, d.ah.udp_port),
            len,
        })
    }

    /// A UD send-side error: the QP goes to SQE and the rest of the send queue flushes
    /// (spec §9.3: UD send errors move to SQE, not ERR).
    fn send_queue_error(&mut self, res: &mut Resources) {
        self.attr.qp_state = QpState::Sqe;
        self.attr.cur_qp_state = QpState::Sqe;
        while let Some(w) = self.req.sq.pop_front() {
            let wc = self.send_wc(&w, WcStatus::WrFlushErr);
            res.complete(self.send_cq, wc, false);
        }
    }

    /// Delivers a UD packet to this QP.
    pub(crate) fn handle_ud(
        &mut self,
        res: &mut Resources,
        src: SocketAddr,
        dst: IpAddr,
        hdr: &PacketHeaders,
        payload: &[u8],
        udp_len: usize,
    ) {
        if self.qp_type != QpType::Ud
            || !matches!(
                self.state(),
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            )
        {
            res.counters.rx_no_qp += 1;
            return;
        }
        let Some(deth) = hdr.deth else {
            res.counters.rx_malformed += 1;
            return;
        };
        if deth.qkey != self.attr.qkey {
            res.counters.rx_qkey_violations += 1;
            return;
        }
        let Some(wqe) = self.take_recv(res) else {
            // UD has no RNR: a datagram without a receive WQE is dropped (and counted).
            res.counters.rx_no_recv += 1;
            return;
        };
        let imm = hdr.immdt;
        let mut wc = WorkCompletion {
            wr_id: wqe.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: (GRH_LEN + payload.len()) as u32,
            imm_data: imm.unwrap_or(0),
            qp_num: self.qpn,
            src_qp: Qpn(deth.src_qp),
            wc_flags: if imm.is_some() {
                WcFlags::GRH | WcFlags::WITH_IMM
            } else {
                WcFlags::GRH
            },
            vendor_err: 0,
            slid: src.port(),
            ..WorkCompletion::EMPTY
        };
        match res.resolve(self.recv_pd(res), &wqe.sges, true) {
            None => wc.status = WcStatus::LocProtErr,
            Some(segs) => {
                let cap: usize = segs.iter().map(|s| s.len).sum();
                if cap < GRH_LEN + payload.len() {
                    wc.status = WcStatus::LocLenErr;
                } else {
                    let mut grh = [0u8; GRH_LEN];
                    build_grh(src.ip(), dst, udp_len, &mut grh);
                    scatter(&segs, 0, &grh);
                    scatter(&segs, GRH_LEN, payload);
                }
            }
        }
        res.complete(self.recv_cq, wc, hdr.bth.solicited);
    }
}

impl Nic {
    /// Attaches a UD QP to a multicast group (`ibv_attach_mcast`); the LID is ignored on
    /// RoCE.
    pub fn attach_mcast(&mut self, qpn: Qpn, gid: Gid) -> Result<(), VerbsError> {
        let qp = self
            .qps
            .get(&qpn.0)
            .ok_or(VerbsError::NoSuchObject("queue pair"))?;
        if qp.qp_type != QpType::Ud {
            return Err(VerbsError::Unsupported("multicast needs a UD queue pair"));
        }
        if !gid.is_multicast() {
            return Err(VerbsError::InvalidArgument(format!(
                "{gid} is not a multicast GID"
            )));
        }
        let members = self.res.mcast.entry(gid).or_default();
        if !members.contains(&qpn.0) {
            members.push(qpn.0);
        }
        Ok(())
    }

    /// Detaches a QP from a group (`ibv_detach_mcast`).
    pub fn detach_mcast(&mut self, qpn: Qpn, gid: Gid) -> Result<(), VerbsError> {
        let members =
            self.res.mcast.get_mut(&gid).ok_or_else(|| {
                VerbsError::InvalidArgument(format!("no QP is attached to {gid}"))
            })?;
        let before = members.len();
        members.retain(|q| *q != qpn.0);
        if members.len() == before {
            return Err(VerbsError::InvalidArgument(format!(
                "{qpn} is not attached to {gid}"
            )));
        }
        if members.is_empty() {
            self.res.mcast.remove(&gid);
        }
        Ok(())
    }

    /// Routes a UD packet: to one QP, or to every QP attached to the destination group.
    pub(crate) fn deliver_ud(
        &mut self,
        src: SocketAddr,
        dst: IpAddr,
        hdr: &PacketHeaders,
        payload: &[u8],
        udp_len: usize,
    ) {
        if hdr.bth.dest_qp == Qpn::MULTICAST.0 {
            let Some(members) = self.res.mcast.get(&Gid::from_ip(dst)).cloned() else {
                self.res.counters.rx_no_group += 1;
                return;
            };
            for q in members {
                if let Some(qp) = self.qps.get_mut(&q) {
                    qp.handle_ud(&mut self.res, src, dst, hdr, payload, udp_len);
                }
            }
            return;
        }
        if dst.is_multicast() {
            self.res.counters.rx_no_group += 1;
            return;
        }
        match self.qps.get_mut(&hdr.bth.dest_qp) {
            Some(qp) => qp.handle_ud(&mut self.res, src, dst, hdr, payload, udp_len),
            None => self.res.counters.rx_no_qp += 1,
        }
    }
}
