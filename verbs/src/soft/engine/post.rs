//! Posting to the send queue: the checks `ibv_post_send` makes, one request at a time or a
//! whole batch at once (`ibv_wr_complete`: checked in full, then queued).

use super::qp::{MAX_MSG_SIZE, Qp, SendWqe, WqeKind};
use super::{InlineBytes, Payload, Resources};
use crate::error::PostError;
use crate::types::{Psn, QpState, QpType, SendFlags, WcStatus};
use crate::wr::{SendWr, WrOpcode};

impl Qp {
    /// `ibv_post_send` of one work request.
    pub(crate) fn post_send(
        &mut self,
        res: &mut Resources,
        wr: &SendWr<'_>,
    ) -> Result<(), PostError> {
        let w = self.prepare_send(res, wr, 0)?;
        self.push_send(res, w);
        Ok(())
    }

    /// A batch posted whole or not at all (`ibv_wr_complete`): every request is checked
    /// (with room for all of them in the queue) before the first is queued.
    pub(crate) fn post_send_all(
        &mut self,
        res: &mut Resources,
        wrs: &[SendWr<'_>],
    ) -> Result<(), (usize, PostError)> {
        let mut ready = Vec::with_capacity(wrs.len());
        for (i, wr) in wrs.iter().enumerate() {
            ready.push(self.prepare_send(res, wr, i).map_err(|e| (i, e))?);
        }
        for w in ready {
            self.push_send(res, w);
        }
        Ok(())
    }

    /// Queues a checked request (or completes it flushed in the error states).
    fn push_send(&mut self, res: &mut Resources, w: SendWqe) {
        if matches!(self.state(), QpState::Err | QpState::Sqe) {
            let wc = self.send_wc(&w, WcStatus::WrFlushErr);
            res.complete(self.send_cq, wc, false);
            return;
        }
        self.req.sq.push_back(w);
    }

    /// Checks `wr` and builds its WQE, as the `queued`-th of a batch (for the room left in
    /// the queue). Nothing changes on the QP.
    fn prepare_send(
        &self,
        res: &Resources,
        wr: &SendWr<'_>,
        queued: usize,
    ) -> Result<SendWqe, PostError> {
        let st = self.state();
        if !matches!(
            st,
            QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err
        ) {
            return Err(PostError::InvalidState {
                what: "send",
                state: st,
            });
        }
        if self.req.sq.len() + queued >= self.cap.max_send_wr as usize {
            return Err(PostError::QueueFull {
                what: "send",
                depth: self.cap.max_send_wr,
            });
        }
        if wr.sg_list.len() > self.cap.max_send_sge as usize {
            return Err(PostError::TooManySge {
                count: wr.sg_list.len(),
                max: self.cap.max_send_sge,
            });
        }
        let local = wr.opcode.is_local();
        let len = if local { 0 } else { wr.total_len() };
        if len > MAX_MSG_SIZE {
            return Err(PostError::MessageTooLong {
                len,
                max: MAX_MSG_SIZE,
            });
        }
        let (mut inv, mut bind) = (None, None);
        let (kind, imm, remote_addr, rkey, compare, swap_add) = match wr.opcode {
            WrOpcode::Send => (WqeKind::Send, None, 0, 0, 0, 0),
            WrOpcode::SendWithInv { rkey } => {
                inv = Some(rkey.0);
                (WqeKind::Send, None, 0, 0, 0, 0)
            }
            WrOpcode::LocalInv { rkey } => {
                inv = Some(rkey.0);
                (WqeKind::LocalInv, None, 0, 0, 0, 0)
            }
            WrOpcode::BindMw(b) => {
                bind = Some(b);
                (WqeKind::Bind, None, 0, 0, 0, 0)
            }
            WrOpcode::SendWithImm { imm } => (WqeKind::Send, Some(imm), 0, 0, 0, 0),
            WrOpcode::RdmaWrite { remote_addr, rkey } => {
                (WqeKind::Write, None, remote_addr, rkey.0, 0, 0)
            }
            WrOpcode::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => (WqeKind::Write, Some(imm), remote_addr, rkey.0, 0, 0),
            WrOpcode::RdmaRead { remote_addr, rkey } => {
                (WqeKind::Read, None, remote_addr, rkey.0, 0, 0)
            }
            WrOpcode::AtomicCmpSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => (WqeKind::CmpSwap, None, remote_addr, rkey.0, compare, swap),
            WrOpcode::AtomicFetchAdd {
                remote_addr,
                rkey,
                add,
            } => (WqeKind::FetchAdd, None, remote_addr, rkey.0, 0, add),
        };
        match self.qp_type {
            QpType::XrcRecv => {
                return Err(PostError::InvalidWorkRequest(
                    "an XRC target QP has no send queue",
                ));
            }
            QpType::Uc if kind.is_rd_atomic() => {
                return Err(PostError::InvalidWorkRequest(
                    "a UC QP has no RDMA read or atomics (sends and RDMA writes only)",
                ));
            }
            QpType::Uc | QpType::Ud if inv.is_some() && kind == WqeKind::Send => {
                return Err(PostError::InvalidWorkRequest(
                    "send with invalidate is an RC and XRC operation",
                ));
            }
            QpType::Ud if local => {
                return Err(PostError::InvalidWorkRequest(
                    "memory window binds and invalidations need a connected QP",
                ));
            }
            QpType::XrcSend if wr.remote_srqn.is_none() && !local => {
                return Err(PostError::InvalidWorkRequest(
                    "an XRC send needs the remote SRQ number (SendWr::to_srq)",
                ));
            }
            _ => {}
        }
        let ud = if self.qp_type == QpType::Ud {
            Some(self.check_ud_send(res, kind, len, wr.ud)?)
        } else {
            None
        };
        let inline = wr.send_flags.contains(SendFlags::INLINE) || wr.inline_data.is_some();
        if inline {
            if !matches!(kind, WqeKind::Send | WqeKind::Write) {
                return Err(PostError::InvalidWorkRequest(
                    "inline is only valid for sends and RDMA writes",
                ));
            }
            if len > u64::from(self.cap.max_inline_data) {
                return Err(PostError::InlineTooLong {
                    len: len as usize,
                    max: self.cap.max_inline_data,
                });
            }
        }
        if matches!(kind, WqeKind::CmpSwap | WqeKind::FetchAdd) && len != 8 {
            return Err(PostError::InvalidWorkRequest(
                "an atomic needs one 8-byte local buffer for the original value",
            ));
        }
        let mut local_err = None;
        let payload = if local {
            Payload::Inline(InlineBytes::new(&[]))
        } else if let Some(d) = wr.inline_data {
            Payload::Inline(InlineBytes::new(d))
        } else {
            let write = kind.is_rd_atomic();
            match res.resolve(self.pd, wr.sg_list, write) {
                Some(segs) if inline => {
                    let mut v = vec![0u8; len as usize];
                    Payload::Segs(segs).gather(0, &mut v);
                    Payload::Inline(InlineBytes::new(&v))
                }
                Some(segs) => Payload::Segs(segs),
                None => {
                    local_err = Some(WcStatus::LocProtErr);
                    Payload::Inline(InlineBytes::new(&[]))
                }
            }
        };
        let w = SendWqe {
            wr_id: wr.wr_id,
            kind,
            imm,
            remote_addr,
            rkey,
            compare,
            swap_add,
            flags: wr.send_flags,
            len: len as usize,
            payload,
            local_err,
            ud,
            xrc_srqn: wr.remote_srqn,
            inv,
            bind,
            tm: None,
            started: false,
            first_psn: Psn::new(0),
            npsn: 0,
        };
        Ok(w)
    }
}
