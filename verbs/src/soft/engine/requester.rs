//! The requester and completer of an RC QP (spec §5.2): segmentation to the path MTU, PSN
//! assignment, the window, AckReq, READ / atomic limits and fences, ACK / NAK / response
//! processing, go-back-N retransmission, the local ACK timer and RNR waits.

use std::collections::VecDeque;

use super::qp::{Qp, SendWqe, WqeKind};
use super::{AsyncEvent, Payload, Resources, Transmit, scatter};
use crate::soft::wire::aeth::rnr_timer_ns;
use crate::soft::wire::{
    AethKind, AtomicEthRepr, BthRepr, NakCode, Opcode, PacketHeaders, RethRepr, XrcEthRepr,
};
use crate::types::{Psn, QpAttr, QpState, QpType, Qpn, SendFlags, WcStatus};

/// Request an ACK at least every this many packets inside long messages.
const ACK_REQ_EVERY: u32 = 64;

/// Requester state of one QP.
#[derive(Debug, Default)]
pub(crate) struct Requester {
    /// Posted, not yet completed WQEs, in order.
    pub(crate) sq: VecDeque<SendWqe>,
    /// Index in `sq` of the WQE whose packets are sent next.
    pub(crate) cursor: usize,
    /// Packets of `sq[cursor]` already sent (or, for a READ, PSNs already answered).
    pkt_off: u32,
    /// PSN the next new WQE starts at.
    next_psn: Psn,
    /// Oldest PSN not yet acknowledged or answered.
    una: Psn,
    retry_left: u8,
    rnr_left: u8,
    /// Local ACK timer deadline.
    rto: Option<u64>,
    /// End of an RNR wait.
    rnr_until: Option<u64>,
    rd_atomic_out: u32,
    max_rd_atomic: u32,
    /// Go-back-N in progress from `restart_psn` (further gap signals are ignored until
    /// progress is made).
    recovering: bool,
    restart_psn: Psn,
    timeout_ns: u64,
    retry_cnt: u8,
    rnr_retry: u8,
    window: u32,
    drained_sent: bool,
    /// READ response PSNs of the front READ received ahead of `una`.
    read_ooo: Vec<Psn>,
    /// PSN of the last sequence NAK: a new one further on means the responder progressed.
    last_nak: Option<Psn>,
}

/// A READ response this far ahead of the expected one is taken as a loss, not reordering.
const REORDER_TOLERANCE: i32 = 8;

/// Local ACK timeout for the 5-bit exponent: 4.096 us × 2^t; 0 means never.
pub(crate) fn ack_timeout_ns(t: u8) -> u64 {
    if t == 0 {
        0
    } else {
        4096u64 << u32::from(t.min(31))
    }
}

impl Requester {
    pub(crate) fn reset(&mut self, psn: Psn, attr: &QpAttr) {
        self.next_psn = psn;
        self.una = psn;
        self.cursor = 0;
        self.pkt_off = 0;
        self.rd_atomic_out = 0;
        self.recovering = false;
        self.last_nak = None;
        self.read_ooo.clear();
        self.timers_off();
        self.reload_limits(attr);
        self.retry_left = self.retry_cnt;
        self.rnr_left = self.rnr_retry;
    }

    pub(crate) fn reload_limits(&mut self, attr: &QpAttr) {
        self.timeout_ns = ack_timeout_ns(attr.timeout);
        self.retry_cnt = attr.retry_cnt;
        self.rnr_retry = attr.rnr_retry;
        self.max_rd_atomic = u32::from(attr.max_rd_atomic.max(1));
        if self.window == 0 {
            self.window = 256;
        }
    }

    /// After a path migration: fresh retry counters, and everything unacknowledged goes out
    /// again (on the new path) right away.
    pub(crate) fn restart_on_new_path(&mut self, now: u64) {
        self.retry_left = self.retry_cnt;
        self.rnr_left = self.rnr_retry;
        self.recovering = false;
        self.last_nak = None;
        // Rewind to the oldest unacknowledged PSN.
        let una = self.una;
        if let Some(idx) = self
            .sq
            .iter()
            .position(|w| w.started && !w.kind.is_local() && !w.last_psn().before(una))
            && idx <= self.cursor
        {
            let off = self
                .sq
                .get(idx)
                .map_or(0, |w| una.diff(w.first_psn).max(0) as u32);
            self.cursor = idx;
            self.pkt_off = off;
        }
        self.rto = None;
        self.arm_rto(now);
    }

    /// Sets the maximum number of unacknowledged PSNs.
    pub(crate) fn set_window(&mut self, w: u32) {
        self.window = w.clamp(1, 1 << 22);
    }

    /// Key fields, for debugging.
    pub(crate) fn summary(&self) -> String {
        format!(
            "next={} una={} off={} rto={:?} rnr={:?} rd_out={} recovering={} retry_left={}",
            self.next_psn,
            self.una,
            self.pkt_off,
            self.rto,
            self.rnr_until,
            self.rd_atomic_out,
            self.recovering,
            self.retry_left
        )
    }

    pub(crate) fn timers_off(&mut self) {
        self.rto = None;
        self.rnr_until = None;
    }

    pub(crate) fn has_work(&self) -> bool {
        self.rnr_until.is_none() && self.cursor < self.sq.len()
    }

    pub(crate) fn next_timeout(&self) -> Option<u64> {
        match (self.rto, self.rnr_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn arm_rto(&mut self, now: u64) {
        self.rto = (self.timeout_ns > 0 && self.una != self.next_psn)
            .then(|| now.saturating_add(self.timeout_ns));
    }

    /// Raises SQ_DRAINED once an SQD QP has nothing outstanding.
    pub(crate) fn check_drained(&mut self, qpn: Qpn, attr: &QpAttr, res: &mut Resources) {
        let idle = self.una == self.next_psn;
        if attr.sq_draining && idle && !self.drained_sent {
            self.drained_sent = true;
            if attr.en_sqd_async_notify {
                res.events.push_back(AsyncEvent::SqDrained(qpn));
            }
        }
        if !attr.sq_draining {
            self.drained_sent = false;
        }
    }
}

impl Qp {
    /// Builds the next request packet, if the window, limits and state allow.
    pub(crate) fn poll_request(
        &mut self,
        now: u64,
        res: &mut Resources,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        if !matches!(self.state(), QpState::Rts | QpState::Sqd) || self.req.rnr_until.is_some() {
            return None;
        }
        let mtu = self.mtu();
        let draining = self.attr.sq_draining;
        if !draining {
            self.run_local_ops(res);
        }
        self.complete_local_fronts(res);
        let cursor = self.req.cursor;
        let w = self.req.sq.get(cursor)?;
        if !w.started {
            if draining || (w.kind.is_local() && w.local_err.is_none()) {
                return None;
            }
            if let Some(status) = w.local_err {
                // A local error completes in order: wait until everything before it is done.
                if cursor == 0 {
                    let wc = self.send_wc(w, status);
                    self.req.sq.pop_front();
                    res.complete(self.send_cq, wc, false);
                    self.fatal(res);
                }
                return None;
            }
            if w.flags.contains(SendFlags::FENCE) && self.req.rd_atomic_out > 0 {
                return None;
            }
            if w.kind.is_rd_atomic() && self.req.rd_atomic_out >= self.req.max_rd_atomic {
                return None;
            }
            if self.req.next_psn.diff(self.req.una) >= self.req.window as i32 {
                return None;
            }
            let npsn = match w.kind {
                WqeKind::CmpSwap | WqeKind::FetchAdd => 1,
                _ => w.len.div_ceil(mtu).max(1) as u32,
            };
            let first = self.req.next_psn;
            let w = self.req.sq.get_mut(cursor)?;
            w.started = true;
            w.first_psn = first;
            w.npsn = npsn;
            self.req.next_psn = first.add(npsn);
            self.req.pkt_off = 0;
            if w.kind.is_rd_atomic() {
                self.req.rd_atomic_out += 1;
            }
        }
        let w = self.req.sq.get(cursor)?;
        let off = self.req.pkt_off;
        let psn = w.first_psn.add(off);
        if psn.diff(self.req.una) >= self.req.window as i32 {
            return None;
        }
        let bth = |opcode: Opcode, ack_req: bool, solicited: bool| BthRepr {
            opcode,
            solicited,
            mig_req: self.mig_req(),
            pad_count: 0,
            pkey: 0xFFFF,
            fecn: false,
            becn: false,
            dest_qp: self.attr.dest_qp_num,
            ack_req,
            psn: psn.value(),
        };
        let mut hdr = PacketHeaders {
            bth: bth(Opcode::RC_ACKNOWLEDGE, false, false),
            deth: None,
            xrceth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
        };
        hdr.xrceth = w.xrc_srqn.map(|srqn| XrcEthRepr { srqn });
        let t = match w.kind {
            WqeKind::Send | WqeKind::Write => {
                let boff = off as usize * mtu;
                let n = mtu.min(w.len.saturating_sub(boff));
                let first = off == 0;
                let last = off + 1 >= w.npsn;
                let send = w.kind == WqeKind::Send;
                let imm = w.imm.filter(|_| last);
                let inv = w.inv.filter(|_| last && send);
                let opcode = match (send, first, last, imm.is_some()) {
                    (true, true, true, _) if inv.is_some() => Opcode::RC_SEND_ONLY_WITH_INVALIDATE,
                    (true, false, true, _) if inv.is_some() => Opcode::RC_SEND_LAST_WITH_INVALIDATE,
                    (true, true, true, false) => Opcode::RC_SEND_ONLY,
                    (true, true, true, true) => Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
                    (true, true, false, _) => Opcode::RC_SEND_FIRST,
                    (true, false, false, _) => Opcode::RC_SEND_MIDDLE,
                    (true, false, true, false) => Opcode::RC_SEND_LAST,
                    (true, false, true, true) => Opcode::RC_SEND_LAST_WITH_IMMEDIATE,
                    (false, true, true, false) => Opcode::RC_RDMA_WRITE_ONLY,
                    (false, true, true, true) => Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
                    (false, true, false, _) => Opcode::RC_RDMA_WRITE_FIRST,
                    (false, false, false, _) => Opcode::RC_RDMA_WRITE_MIDDLE,
                    (false, false, true, false) => Opcode::RC_RDMA_WRITE_LAST,
                    (false, false, true, true) => Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
                };
                let solicited =
                    last && w.flags.contains(SendFlags::SOLICITED) && (send || imm.is_some());
                // UC has no acknowledgements: its AckReq bit stays clear.
                let ack_req =
                    self.qp_type != QpType::Uc && (last || (off + 1).is_multiple_of(ACK_REQ_EVERY));
                hdr.bth = bth(opcode, ack_req, solicited);
                hdr.immdt = imm;
                hdr.ieth = inv;
                if !send && first {
                    hdr.reth = Some(RethRepr {
                        va: w.remote_addr,
                        rkey: w.rkey,
                        dma_len: w.len as u32,
                    });
                }
                let payload = &w.payload;
                self.build(&hdr, n, buf, |b| payload.gather(boff, b))?
            }
            WqeKind::Read => {
                let boff = off as usize * mtu;
                hdr.bth = bth(Opcode::RC_RDMA_READ_REQUEST, true, false);
                hdr.reth = Some(RethRepr {
                    va: w.remote_addr.wrapping_add(boff as u64),
                    rkey: w.rkey,
                    dma_len: w.len.saturating_sub(boff) as u32,
                });
                self.build(&hdr, 0, buf, |_| {})?
            }
            WqeKind::Bind | WqeKind::LocalInv => return None,
            WqeKind::CmpSwap | WqeKind::FetchAdd => {
                let opcode = if w.kind == WqeKind::CmpSwap {
                    Opcode::RC_COMPARE_SWAP
                } else {
                    Opcode::RC_FETCH_ADD
                };
                hdr.bth = bth(opcode, true, false);
                hdr.atomic_eth = Some(AtomicEthRepr {
                    va: w.remote_addr,
                    rkey: w.rkey,
                    swap_add: w.swap_add,
                    compare: w.compare,
                });
                self.build(&hdr, 0, buf, |_| {})?
            }
        };
        let npsn = w.npsn;
        if self.qp_type == QpType::Uc {
            // UC completes a request when its last packet leaves: nothing will answer it.
            if off + 1 < npsn {
                self.req.pkt_off += 1;
            } else {
                self.complete_front(res);
                self.req.check_drained(self.qpn, &self.attr, res);
            }
            return Some(t);
        }
        let multi_packet = matches!(w.kind, WqeKind::Send | WqeKind::Write);
        if multi_packet && off + 1 < npsn {
            self.req.pkt_off += 1;
        } else {
            self.req.cursor += 1;
            self.req.pkt_off = 0;
        }
        if self.req.rto.is_none() {
            self.req.arm_rto(now);
        }
        Some(t)
    }

    /// Runs at once the local operations just posted at the head of what the requester has
    /// to do (a bind posted on an idle queue takes effect before `post_send` returns).
    pub(crate) fn run_posted_local_ops(&mut self, res: &mut Resources) {
        if self.state() == QpState::Rts && !self.attr.sq_draining && self.req.rnr_until.is_none() {
            self.run_local_ops(res);
            self.complete_local_fronts(res);
        }
    }

    /// Runs the local operations (bind, local invalidate) the requester has reached, in
    /// send-queue order: their effect is immediate (requests before them may still be in
    /// flight, as on hardware), their completion comes in order. One that fails is left
    /// with its error status for the in-order error path (`local_err`). Started local
    /// operations a go-back-N rewound over are stepped past.
    fn run_local_ops(&mut self, res: &mut Resources) {
        loop {
            let cursor = self.req.cursor;
            let Some(w) = self.req.sq.get(cursor) else {
                return;
            };
            if !w.kind.is_local() || w.local_err.is_some() {
                return;
            }
            if w.started {
                self.req.cursor += 1;
                continue;
            }
            let result = match (w.kind, w.bind, w.inv) {
                (WqeKind::Bind, Some(b), _) => res.exec_bind(self.qpn, self.pd, &b),
                (WqeKind::LocalInv, _, Some(rkey)) => {
                    if res.invalidate(self.qpn, self.pd, rkey, false) {
                        Ok(())
                    } else {
                        Err(WcStatus::LocQpOpErr)
                    }
                }
                _ => Err(WcStatus::LocQpOpErr),
            };
            let next = self.req.next_psn;
            let Some(w) = self.req.sq.get_mut(cursor) else {
                return;
            };
            match result {
                Ok(()) => {
                    w.started = true;
                    w.first_psn = next;
                    w.npsn = 0;
                    self.req.cursor += 1;
                }
                Err(status) => {
                    w.local_err = Some(status);
                    return;
                }
            }
        }
    }

    /// Completes the local operations at the front of the send queue that have run.
    fn complete_local_fronts(&mut self, res: &mut Resources) {
        while let Some(w) = self.req.sq.front() {
            if !(w.kind.is_local() && w.started) {
                return;
            }
            let Some(w) = self.req.sq.pop_front() else {
                return;
            };
            self.req.cursor = self.req.cursor.saturating_sub(1);
            if self.sq_sig_all || w.flags.contains(SendFlags::SIGNALED) {
                let wc = self.send_wc(&w, WcStatus::Success);
                res.complete(self.send_cq, wc, false);
            }
        }
    }

    /// Completes `sq[0]` successfully.
    fn complete_front(&mut self, res: &mut Resources) {
        let Some(w) = self.req.sq.pop_front() else {
            return;
        };
        if self.req.cursor > 0 {
            self.req.cursor -= 1;
        } else {
            self.req.pkt_off = 0;
        }
        if w.kind.is_rd_atomic() {
            self.req.rd_atomic_out = self.req.rd_atomic_out.saturating_sub(1);
        }
        self.req.una = w.last_psn().add(1);
        if !self.tm_wqe_done(res, &w, WcStatus::Success)
            && (self.sq_sig_all || w.flags.contains(SendFlags::SIGNALED))
        {
            let wc = self.send_wc(&w, WcStatus::Success);
            res.complete(self.send_cq, wc, false);
        }
        self.complete_local_fronts(res);
    }

    /// Completes `sq[0]` with an error status and moves the QP to ERR.
    fn fail_front(&mut self, res: &mut Resources, status: WcStatus) {
        if let Some(w) = self.req.sq.pop_front()
            && !self.tm_wqe_done(res, &w, status)
        {
            let wc = self.send_wc(&w, status);
            res.complete(self.send_cq, wc, false);
        }
        self.fatal(res);
    }

    /// Cumulative acknowledgement of every PSN up to and including `p`. Returns
    /// `(progress, implied_nak)`.
    fn ack_upto(&mut self, res: &mut Resources, p: Psn) -> (bool, bool) {
        let mut progress = false;
        while let Some(w) = self.req.sq.front() {
            if !w.started {
                break;
            }
            match w.kind {
                WqeKind::Send | WqeKind::Write => {
                    if !p.before(w.last_psn()) {
                        self.complete_front(res);
                        progress = true;
                    } else {
                        if !p.before(self.req.una) {
                            self.req.una = p.add(1);
                            progress = true;
                        }
                        break;
                    }
                }
                k if k.is_local() => {
                    self.complete_local_fronts(res);
                    progress = true;
                }
                _ => {
                    // An ACK at or beyond a READ/atomic whose response we have not seen
                    // means the response was lost: implied NAK.
                    return (progress, !p.before(self.req.una));
                }
            }
        }
        (progress, false)
    }

    fn on_progress(&mut self, now: u64, res: &mut Resources) {
        self.req.retry_left = self.req.retry_cnt;
        self.req.rnr_left = self.req.rnr_retry;
        self.req.recovering = false;
        self.req.rto = None;
        self.req.arm_rto(now);
        self.req.check_drained(self.qpn, &self.attr, res);
    }

    /// Go-back-N: resend everything from the oldest unacknowledged PSN.
    fn rewind(&mut self, now: u64, res: &mut Resources) {
        res.counters.retransmits += 1;
        let una = self.req.una;
        let idx = self
            .req
            .sq
            .iter()
            .position(|w| w.started && !w.kind.is_local() && !w.last_psn().before(una))
            .unwrap_or(self.req.sq.len());
        self.req.cursor = idx.min(self.req.cursor);
        self.req.pkt_off = match self.req.sq.get(self.req.cursor) {
            Some(w) if w.started && self.req.cursor == idx => una.diff(w.first_psn).max(0) as u32,
            _ => 0,
        };
        self.req.recovering = true;
        self.req.restart_psn = una;
        self.req.rto = None;
        if self.req.timeout_ns > 0 {
            self.req.rto = Some(now.saturating_add(self.req.timeout_ns));
        }
    }

    /// A transport retry (timeout, sequence NAK, implied NAK): rewind, or fail with
    /// RETRY_EXC_ERR when the retry count is used up.
    fn retry(&mut self, now: u64, res: &mut Resources) {
        tracing::trace!(qpn = %self.qpn, state = %self.req.summary(), "transport retry");
        let infinite = res.cfg.infinite_retry_at_7 && self.req.retry_cnt == 7;
        if self.req.retry_left == 0 && !infinite {
            if self.migrate_on_retry_exhaustion(now, res) {
                return;
            }
            self.fail_front(res, WcStatus::RetryExcErr);
            return;
        }
        self.req.retry_left = self.req.retry_left.saturating_sub(1);
        self.rewind(now, res);
    }

    /// Handles an ACK, NAK, READ response or atomic ACK.
    pub(crate) fn handle_response(
        &mut self,
        now: u64,
        res: &mut Resources,
        hdr: &PacketHeaders,
        payload: &[u8],
    ) {
        let psn = Psn::new(hdr.bth.psn);
        // Anything at or beyond the next unassigned PSN was never requested.
        if !psn.before(self.req.next_psn) || psn.diff(self.req.una) < -(1 << 22) {
            res.counters.rx_dropped_seq += 1;
            return;
        }
        // XRC responses use XRC opcodes with the same operation: compare operations.
        let op = Opcode(hdr.bth.opcode.operation());
        if op == Opcode::RC_ACKNOWLEDGE {
            let Some(aeth) = hdr.aeth else {
                res.counters.rx_malformed += 1;
                return;
            };
            match aeth.kind() {
                AethKind::Ack { .. } => {
                    let (progress, implied) = self.ack_upto(res, psn);
                    if progress {
                        self.on_progress(now, res);
                    }
                    if implied && !self.req.recovering {
                        self.retry(now, res);
                    }
                }
                AethKind::RnrNak { .. } | AethKind::Nak(_) if psn.before(self.req.una) => {
                    // A stale or duplicated NAK for something already acknowledged.
                    res.counters.rx_dropped_seq += 1;
                }
                AethKind::RnrNak { timer } => {
                    res.counters.rnr_naks_received += 1;
                    let (progress, _) = self.ack_upto(res, psn.sub(1));
                    if progress {
                        self.on_progress(now, res);
                    }
                    if self.req.rnr_retry != 7 {
                        if self.req.rnr_left == 0 {
                            self.fail_front(res, WcStatus::RnrRetryExcErr);
                            return;
                        }
                        self.req.rnr_left -= 1;
                    }
                    self.rewind(now, res);
                    res.counters.retransmits -= 1;
                    self.req.recovering = false;
                    self.req.rto = None;
                    self.req.rnr_until = Some(now.saturating_add(rnr_timer_ns(timer)));
                }
                AethKind::Nak(code) => {
                    let (progress, _) = self.ack_upto(res, psn.sub(1));
                    if progress {
                        self.on_progress(now, res);
                    }
                    match code {
                        NakCode::PsnSequence => {
                            // A NAK further on than the previous one means the responder
                            // moved forward: resend, but do not use up a retry.
                            let progressed = self.req.last_nak.is_none_or(|l| psn.after(l));
                            self.req.last_nak = Some(psn);
                            if progressed {
                                self.rewind(now, res);
                            } else if self.req.recovering && self.req.restart_psn == psn {
                                res.counters.rx_dropped_seq += 1;
                            } else {
                                self.retry(now, res);
                            }
                        }
                        NakCode::InvalidRequest => self.fail_front(res, WcStatus::RemInvReqErr),
                        NakCode::RemoteAccess => self.fail_front(res, WcStatus::RemAccessErr),
                        NakCode::RemoteOperational => self.fail_front(res, WcStatus::RemOpErr),
                        _ => self.fail_front(res, WcStatus::BadRespErr),
                    }
                }
            }
            return;
        }
        // READ responses and atomic ACKs implicitly acknowledge every earlier send/write.
        let mut progress = false;
        while let Some(w) = self.req.sq.front() {
            if w.started
                && matches!(w.kind, WqeKind::Send | WqeKind::Write)
                && w.last_psn().before(psn)
            {
                self.complete_front(res);
                progress = true;
            } else {
                break;
            }
        }
        let is_atomic_ack = op == Opcode::RC_ATOMIC_ACKNOWLEDGE;
        let front_ok = match self.req.sq.front() {
            Some(w) if w.started => {
                if is_atomic_ack {
                    matches!(w.kind, WqeKind::CmpSwap | WqeKind::FetchAdd)
                } else {
                    w.kind == WqeKind::Read
                }
            }
            _ => false,
        };
        if !front_ok {
            if progress {
                self.on_progress(now, res);
            }
            res.counters.rx_dropped_seq += 1;
            return;
        }
        let una = self.req.una;
        if psn.before(una) {
            res.counters.rx_dropped_seq += 1;
            if progress {
                self.on_progress(now, res);
            }
            return;
        }
        if is_atomic_ack {
            if psn != una {
                // The atomic's ACK carries the atomic's PSN; anything else is for a later
                // request, so this one's answer was lost.
                self.gap(now, res, progress);
                return;
            }
            let Some(ack) = hdr.atomic_ack_eth else {
                res.counters.rx_malformed += 1;
                return;
            };
            if let Some(w) = self.req.sq.front()
                && let Payload::Segs(segs) = &w.payload
            {
                scatter(segs, 0, &ack.orig.to_ne_bytes());
            }
            self.complete_front(res);
            self.on_progress(now, res);
            return;
        }
        // READ response. Responses are placed by PSN, in any order (a reordering network
        // must not stall the read); `una` advances over the contiguous part.
        let mtu = self.mtu();
        let Some(w) = self.req.sq.front() else {
            return;
        };
        let Ok(idx) = u32::try_from(psn.diff(w.first_psn)) else {
            res.counters.rx_dropped_seq += 1;
            return;
        };
        if idx >= w.npsn {
            // For a later READ: this one's responses are missing or still in flight.
            self.gap(now, res, progress);
            return;
        }
        let boff = idx as usize * mtu;
        let last = idx + 1 >= w.npsn;
        let want = if last {
            w.len.saturating_sub(boff)
        } else {
            mtu
        };
        let o = op.operation();
        let op_ok = match (idx == 0, last) {
            (true, true) => o == 0x10,
            (true, false) => o == 0x0D,
            (false, false) => o == 0x0E,
            (false, true) => o == 0x0F,
        };
        // A re-requested READ restarts with FIRST/ONLY at a later PSN: accept that too.
        let op_ok = op_ok || (o == 0x0D && !last) || (o == 0x10 && last);
        if !op_ok || payload.len() != want {
            res.counters.rx_malformed += 1;
            self.fail_front(res, WcStatus::BadRespErr);
            return;
        }
        if let Payload::Segs(segs) = &w.payload {
            scatter(segs, boff, payload);
        }
        let last_psn = w.last_psn();
        if psn == una {
            let mut next = una.add(1);
            while let Some(pos) = self.req.read_ooo.iter().position(|p| *p == next) {
                self.req.read_ooo.swap_remove(pos);
                next = next.add(1);
            }
            self.req.una = next;
            if next.after(last_psn) {
                self.req.read_ooo.clear();
                self.complete_front(res);
            }
            self.on_progress(now, res);
        } else {
            if !self.req.read_ooo.contains(&psn) && self.req.read_ooo.len() < 4096 {
                self.req.read_ooo.push(psn);
            }
            if progress {
                self.on_progress(now, res);
            }
            if psn.diff(una) > REORDER_TOLERANCE {
                self.gap(now, res, false);
            }
        }
    }

    /// A response showed that something before it is missing: go back once (ignored while a
    /// go-back-N from the same point is in progress).
    fn gap(&mut self, now: u64, res: &mut Resources, progress: bool) {
        if progress {
            self.on_progress(now, res);
        }
        if self.req.recovering {
            res.counters.rx_dropped_seq += 1;
        } else {
            self.retry(now, res);
        }
    }

    /// Local ACK timer or RNR wait expired.
    pub(crate) fn handle_req_timeout(&mut self, now: u64, res: &mut Resources) {
        if self.req.rnr_until.is_some_and(|t| t <= now) {
            self.req.rnr_until = None;
            self.req.arm_rto(now);
        }
        if self.req.rto.is_some_and(|t| t <= now) {
            self.req.rto = None;
            if self.req.una != self.req.next_psn {
                res.counters.ack_timeouts += 1;
                self.retry(now, res);
            }
        }
    }
}
