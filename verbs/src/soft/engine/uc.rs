//! The responder of a UC QP. Unreliable Connection keeps RC's connection, PSNs, segmentation
//! and opcode sequence, and drops everything that makes RC reliable: no ACK or NAK is ever
//! sent, nothing is retransmitted, and the requester completes a request when its last
//! packet leaves (`requester.rs`). The responder therefore never tells the requester
//! anything; what RC answers with a NAK, UC answers by dropping:
//!
//! - a PSN other than the expected one means packets were lost: the message in progress is
//!   lost with them (its receive WQE is kept for the next message), and packets are dropped
//!   until the next FIRST or ONLY packet starts a new message;
//! - a FIRST or ONLY packet is taken at any PSN (the responder resynchronises on it);
//! - an opcode out of sequence, a payload of the wrong length, a write the QP does not allow
//!   or whose R_Key, range or permission fails, and a send (or write with immediate) with no
//!   receive WQE posted drop the message, counted;
//! - a send longer than its receive WQE is the receiver's own error: the WQE completes with
//!   `LocLenErr` and the QP enters the error state.
//!
//! UC has no READ or atomics: those opcodes do not parse on the UC transport and are dropped
//! as malformed before they get here.

use super::Resources;
use super::qp::Qp;
use super::responder::Inbound;
use super::scatter;
use crate::soft::wire::PacketHeaders;
use crate::types::{AccessFlags, Psn, WcOpcode, WcStatus};

/// What a UC request packet is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UcOp {
    Send,
    Write,
}

/// (kind, first, last, immediate) of a UC request operation, `None` for anything else.
fn classify(op: u8) -> Option<(UcOp, bool, bool, bool)> {
    Some(match op {
        0x00 => (UcOp::Send, true, false, false),
        0x01 => (UcOp::Send, false, false, false),
        0x02 => (UcOp::Send, false, true, false),
        0x03 => (UcOp::Send, false, true, true),
        0x04 => (UcOp::Send, true, true, false),
        0x05 => (UcOp::Send, true, true, true),
        0x06 => (UcOp::Write, true, false, false),
        0x07 => (UcOp::Write, false, false, false),
        0x08 => (UcOp::Write, false, true, false),
        0x09 => (UcOp::Write, false, true, true),
        0x0A => (UcOp::Write, true, true, false),
        0x0B => (UcOp::Write, true, true, true),
        _ => return None,
    })
}

impl Qp {
    /// Handles a UC request packet (the QP is in RTR, RTS or SQD and the packet came from
    /// the connected peer).
    pub(crate) fn handle_uc_request(
        &mut self,
        res: &mut Resources,
        hdr: &PacketHeaders,
        payload: &[u8],
    ) {
        let Some((kind, first, last, _)) = classify(hdr.bth.opcode.operation()) else {
            res.counters.rx_malformed += 1;
            return;
        };
        let psn = Psn::new(hdr.bth.psn);
        if psn != self.resp.epsn {
            // Packets were lost: so is the message they belonged to.
            self.uc_drop_message(res);
            self.resp.uc_skip = true;
        }
        self.resp.epsn = psn.add(1);
        if first {
            if self.resp.cur.is_some() {
                // A new message before the last one ended: the old one lost its LAST.
                self.uc_drop_message(res);
            }
            self.resp.uc_skip = false;
        } else {
            let continues = matches!(
                (&self.resp.cur, kind),
                (Some(Inbound::Send { .. }), UcOp::Send)
                    | (Some(Inbound::Write { .. }), UcOp::Write)
            );
            if !continues && !self.resp.uc_skip {
                // A MIDDLE or LAST with no message (or another kind of message) open.
                self.uc_drop_message(res);
                self.resp.uc_skip = true;
            }
        }
        if self.resp.uc_skip {
            if last {
                self.resp.uc_skip = false;
            }
            res.counters.rx_dropped_seq += 1;
            return;
        }
        let mtu = self.mtu();
        let len_ok = match (first, last) {
            (true, true) => payload.len() <= mtu,
            (_, false) => payload.len() == mtu,
            (false, true) => !payload.is_empty() && payload.len() <= mtu,
        };
        if !len_ok {
            res.counters.rx_malformed += 1;
            self.uc_abandon(res, last);
            return;
        }
        match kind {
            UcOp::Send => self.uc_send(res, hdr, payload, first, last),
            UcOp::Write => self.uc_write(res, hdr, payload, first, last),
        }
    }

    fn uc_send(
        &mut self,
        res: &mut Resources,
        hdr: &PacketHeaders,
        payload: &[u8],
        first: bool,
        last: bool,
    ) {
        if first {
            let Some(wqe) = self.take_recv(res) else {
                res.counters.rx_no_recv += 1;
                self.uc_skip_rest(last);
                return;
            };
            let Some(segs) = res.resolve(self.recv_pd(res), &wqe.sges, true) else {
                let wc = self.recv_wc(wqe.wr_id, WcStatus::LocProtErr, WcOpcode::Recv, 0, None);
                res.complete(self.recv_cq, wc, false);
                self.fatal(res);
                return;
            };
            let cap = segs.iter().map(|s| s.len).sum();
            self.resp.cur = Some(Inbound::Send {
                wr_id: wqe.wr_id,
                segs,
                cap,
                got: 0,
                kind: super::tm::RecvKind::PLAIN,
            });
            self.resp.uc_wqe = Some(wqe);
        }
        let Some(Inbound::Send {
            wr_id,
            segs,
            cap,
            got,
            ..
        }) = &mut self.resp.cur
        else {
            return;
        };
        if *got + payload.len() > *cap {
            let wr_id = *wr_id;
            self.resp.cur = None;
            self.resp.uc_wqe = None;
            let wc = self.recv_wc(wr_id, WcStatus::LocLenErr, WcOpcode::Recv, 0, None);
            res.complete(self.recv_cq, wc, false);
            self.fatal(res);
            return;
        }
        scatter(segs, *got, payload);
        *got += payload.len();
        if last {
            let (wr_id, got) = (*wr_id, *got);
            self.resp.cur = None;
            self.resp.uc_wqe = None;
            let wc = self.recv_wc(
                wr_id,
                WcStatus::Success,
                WcOpcode::Recv,
                got as u32,
                hdr.immdt,
            );
            res.complete(self.recv_cq, wc, hdr.bth.solicited);
        }
    }

    fn uc_write(
        &mut self,
        res: &mut Resources,
        hdr: &PacketHeaders,
        payload: &[u8],
        first: bool,
        last: bool,
    ) {
        if first {
            let Some(reth) = hdr.reth else {
                res.counters.rx_malformed += 1;
                self.uc_abandon(res, last);
                return;
            };
            let target = if reth.dma_len == 0 {
                Some((None, 0))
            } else if self.allows(AccessFlags::REMOTE_WRITE) {
                res.remote(
                    self.qpn,
                    self.pd,
                    reth.rkey,
                    reth.va,
                    u64::from(reth.dma_len),
                    AccessFlags::REMOTE_WRITE,
                )
                .map(|(m, o)| (Some(m), o))
            } else {
                None
            };
            let Some((mem, off)) = target else {
                res.counters.rx_uc_dropped += 1;
                self.uc_skip_rest(last);
                return;
            };
            self.resp.cur = Some(Inbound::Write {
                mem,
                off,
                remaining: reth.dma_len as usize,
                total: reth.dma_len,
            });
        }
        let Some(Inbound::Write {
            mem,
            off,
            remaining,
            total,
        }) = &mut self.resp.cur
        else {
            return;
        };
        if payload.len() > *remaining || (last && payload.len() != *remaining) {
            res.counters.rx_malformed += 1;
            self.uc_abandon(res, last);
            return;
        }
        if let Some(m) = mem {
            m.write(*off, payload);
        }
        *off += payload.len();
        *remaining -= payload.len();
        if !last {
            return;
        }
        let total = *total;
        self.resp.cur = None;
        if hdr.immdt.is_some() {
            match self.take_recv(res) {
                Some(wqe) => {
                    let wc = self.recv_wc(
                        wqe.wr_id,
                        WcStatus::Success,
                        WcOpcode::RecvRdmaWithImm,
                        total,
                        hdr.immdt,
                    );
                    res.complete(self.recv_cq, wc, hdr.bth.solicited);
                }
                // The data landed; the notification has nowhere to go.
                None => res.counters.rx_no_recv += 1,
            }
        }
    }

    /// Drops the message in progress (counted) and, unless this packet was its last, the
    /// rest of it.
    fn uc_abandon(&mut self, res: &mut Resources, last: bool) {
        if self.resp.cur.is_none() {
            // The message was not open yet (its first packet failed): count it here.
            res.counters.rx_uc_dropped += 1;
        }
        self.uc_drop_message(res);
        self.uc_skip_rest(last);
    }

    fn uc_skip_rest(&mut self, last: bool) {
        self.resp.uc_skip = !last;
    }

    /// Forgets the message in progress, if any (counted), giving its receive WQE back to
    /// the front of the queue it came from.
    fn uc_drop_message(&mut self, res: &mut Resources) {
        if self.resp.cur.take().is_some() {
            res.counters.rx_uc_dropped += 1;
        }
        self.uc_return_wqe(res);
    }

    /// Puts the WQE of an unfinished UC send back at the front of its queue.
    pub(crate) fn uc_return_wqe(&mut self, res: &mut Resources) {
        let Some(w) = self.resp.uc_wqe.take() else {
            return;
        };
        match self.srq {
            Some(id) => {
                if let Some(s) = res.srqs.get_mut(&id) {
                    s.queue.push_front(w);
                }
            }
            None => self.resp.rq.push_front(w),
        }
    }
}
