//! The responder of an RC QP (spec §5.3): PSN checks with one NAK per gap, opcode sequence
//! checks, receive WQE consumption and RNR NAKs, R_Key / bounds / permission checks, RDMA
//! WRITE placement, READ responses and atomics with a responder-resources cache for
//! duplicates, and coalesced ACKs.

use std::collections::VecDeque;
use std::sync::Arc;

use super::qp::{Qp, RecvWqe};
use super::tm::{RecvKind, TmDecision};
use super::{AsyncEvent, Resources, Seg, Transmit, scatter};
use crate::mem::RegisteredMemory;
use crate::soft::wire::{AethRepr, AtomicAckEthRepr, BthRepr, NakCode, Opcode};
use crate::soft::wire::{PacketHeaders, RethRepr};
use crate::tm::TMH_LEN;
use crate::types::{AccessFlags, Psn, WcFlags, WcOpcode, WcStatus};

/// A message being received.
#[derive(Debug)]
pub(super) enum Inbound {
    Send {
        wr_id: u64,
        segs: super::OneOrMany<Seg>,
        cap: usize,
        got: usize,
        /// How the receive completes (plain, or a tag-matching kind).
        kind: RecvKind,
    },
    Write {
        mem: Option<Arc<RegisteredMemory>>,
        off: usize,
        remaining: usize,
        total: u32,
    },
}

/// A responder resource: what a READ or atomic did, for duplicate handling.
#[derive(Debug, Clone, Copy)]
enum RdAtomic {
    Read {
        first: Psn,
        last: Psn,
        va: u64,
        rkey: u32,
        len: u64,
    },
    Atomic {
        psn: Psn,
        orig: u64,
    },
}

/// READ responses still to send.
#[derive(Debug)]
pub(crate) struct ReadJob {
    first: Psn,
    mem: Option<Arc<RegisteredMemory>>,
    off: usize,
    len: usize,
    pos: u32,
    total: u32,
}

/// A queued response packet.
#[derive(Debug)]
pub(crate) enum RespOut {
    Ack { psn: Psn, aeth: AethRepr },
    AtomicAck { psn: Psn, orig: u64 },
    Read(ReadJob),
}

/// Responder state of one QP.
#[derive(Debug, Default)]
pub(crate) struct Responder {
    pub(crate) rq: VecDeque<RecvWqe>,
    pub(super) epsn: Psn,
    msn: u32,
    nak_sent: bool,
    pub(crate) comm_est: bool,
    pub(super) cur: Option<Inbound>,
    /// UC: the receive WQE of the send in progress, given back if the message is lost.
    pub(super) uc_wqe: Option<RecvWqe>,
    /// UC: the rest of a lost message is being dropped (until a FIRST or ONLY packet).
    pub(super) uc_skip: bool,
    resources: VecDeque<RdAtomic>,
    pub(crate) out: VecDeque<RespOut>,
    /// A coalesced ACK not yet released to `out`, with when it was first held and how many
    /// AckReq packets it answers.
    held: Option<(Psn, AethRepr)>,
    held_since: u64,
    held_reqs: u32,
    last_released: Psn,
}

/// Longest time an ACK is held back for coalescing (well below any local ACK timeout).
pub(crate) const ACK_DELAY_NS: u64 = 50_000;
/// Release a held ACK once it answers this many AckReq packets…
const ACK_EVERY_REQS: u32 = 16;
/// …or covers this many PSNs since the last one released.
const ACK_EVERY_PSNS: i32 = 64;

impl Responder {
    pub(crate) fn reset(&mut self, epsn: Psn) {
        self.epsn = epsn;
        self.uc_wqe = None;
        self.uc_skip = false;
        self.msn = 0;
        self.nak_sent = false;
        self.cur = None;
        self.resources.clear();
        self.out.clear();
        self.held = None;
        self.held_reqs = 0;
        self.last_released = epsn.sub(1);
    }

    /// When the held ACK (if any) was first held.
    pub(crate) fn held_since(&self) -> Option<u64> {
        self.held.map(|_| self.held_since)
    }

    /// True while an ACK is held back for coalescing.
    pub(crate) fn has_held_ack(&self) -> bool {
        self.held.is_some()
    }

    /// When a held ACK must go out.
    pub(crate) fn ack_deadline(&self) -> Option<u64> {
        self.held
            .map(|_| self.held_since.saturating_add(ACK_DELAY_NS))
    }

    /// Moves the held ACK (if any) to the output queue.
    pub(crate) fn release_ack(&mut self) {
        if let Some((psn, aeth)) = self.held.take() {
            self.out.push_back(RespOut::Ack { psn, aeth });
            self.last_released = psn;
            self.held_reqs = 0;
        }
    }

    /// Queues a response other than a plain ACK, after any held ACK (order matters).
    fn push_out(&mut self, item: RespOut) {
        self.release_ack();
        self.out.push_back(item);
    }

    /// Key fields, for debugging.
    pub(crate) fn summary(&self) -> String {
        format!(
            "epsn={} msn={} nak_sent={} open={} res={:?}",
            self.epsn,
            self.msn,
            self.nak_sent,
            self.cur.is_some(),
            self.resources
        )
    }

    /// Acknowledges everything up to `psn`, coalescing with a held ACK (spec §5.3: an ACK
    /// covers all earlier PSNs; AckReq is answered within `ACK_DELAY_NS`).
    fn push_ack(&mut self, now: u64, psn: Psn) {
        let aeth = AethRepr::ack(self.msn);
        match &mut self.held {
            Some((p, a)) => {
                if !psn.before(*p) {
                    *p = psn;
                    *a = aeth;
                }
            }
            None => {
                self.held = Some((psn, aeth));
                self.held_since = now;
            }
        }
        self.held_reqs += 1;
        if self.held_reqs >= ACK_EVERY_REQS || psn.diff(self.last_released) >= ACK_EVERY_PSNS {
            self.release_ack();
        }
    }

    fn push_nak(&mut self, psn: Psn, code: NakCode) {
        let aeth = AethRepr::nak(code, self.msn);
        self.push_out(RespOut::Ack { psn, aeth });
    }

    fn remember(&mut self, r: RdAtomic, max: u8) {
        while self.resources.len() >= usize::from(max.max(1)) {
            self.resources.pop_front();
        }
        self.resources.push_back(r);
    }

    fn reads_in_flight(&self) -> usize {
        self.out
            .iter()
            .filter(|o| matches!(o, RespOut::Read(_)))
            .count()
    }
}

/// Kinds of protocol violation a responder answers with a NAK and an error state.
#[derive(Debug, Clone, Copy)]
enum Violation {
    InvalidRequest,
    RemoteAccess,
    RemoteOperational,
}

impl Qp {
    /// Class C / A errors: NAK the request, move to ERR, raise the async event.
    fn responder_error(&mut self, res: &mut Resources, psn: Psn, v: Violation) {
        let (code, ev) = match v {
            Violation::InvalidRequest => (
                NakCode::InvalidRequest,
                AsyncEvent::QpRequestError(self.qpn),
            ),
            Violation::RemoteAccess => (NakCode::RemoteAccess, AsyncEvent::QpAccessError(self.qpn)),
            Violation::RemoteOperational => {
                (NakCode::RemoteOperational, AsyncEvent::QpFatal(self.qpn))
            }
        };
        if let Some(Inbound::Send { wr_id, .. }) = self.resp.cur.take() {
            let wc = self.recv_wc(wr_id, WcStatus::RemInvReqErr, WcOpcode::Recv, 0, None);
            res.complete(self.recv_cq, wc, false);
        }
        res.events.push_back(ev);
        self.enter_error(res);
        self.resp.push_nak(psn, code);
    }

    /// An XRC request named an SRQ that does not exist or is not in this target's domain.
    pub(crate) fn xrc_bad_srq(&mut self, res: &mut Resources, psn: Psn) {
        self.responder_error(res, psn, Violation::RemoteAccess);
    }

    /// Handles a request packet (SEND, WRITE, READ request, atomic).
    pub(crate) fn handle_request(
        &mut self,
        now: u64,
        res: &mut Resources,
        hdr: &PacketHeaders,
        payload: &[u8],
    ) {
        let psn = Psn::new(hdr.bth.psn);
        let d = psn.diff(self.resp.epsn);
        if d > 0 {
            if !self.resp.nak_sent {
                self.resp.nak_sent = true;
                res.counters.seq_naks_sent += 1;
                let e = self.resp.epsn;
                self.resp.push_nak(e, NakCode::PsnSequence);
            } else {
                res.counters.rx_dropped_seq += 1;
            }
            return;
        }
        if d < 0 {
            self.handle_duplicate(now, res, psn, hdr);
            return;
        }
        self.resp.nak_sent = false;
        let op = hdr.bth.opcode.operation();
        let mtu = self.mtu();
        match op {
            0x00..=0x05 | 0x16 | 0x17 => self.recv_send(now, res, psn, hdr, payload, mtu),
            0x06..=0x0B => self.recv_write(now, res, psn, hdr, payload, mtu),
            0x0C => self.recv_read(res, psn, hdr, mtu),
            0x13 | 0x14 => self.recv_atomic(res, psn, hdr),
            _ => self.responder_error(res, psn, Violation::InvalidRequest),
        }
    }

    fn recv_send(
        &mut self,
        now: u64,
        res: &mut Resources,
        psn: Psn,
        hdr: &PacketHeaders,
        payload: &[u8],
        mtu: usize,
    ) {
        let op = hdr.bth.opcode.operation();
        let first = matches!(op, 0x00 | 0x04 | 0x05 | 0x17);
        let last = !matches!(op, 0x00 | 0x01);
        // Opcode sequence (class C).
        let open = matches!(self.resp.cur, Some(Inbound::Send { .. }));
        if first == open
            || (!first && !open)
            || matches!(self.resp.cur, Some(Inbound::Write { .. }))
        {
            self.responder_error(res, psn, Violation::InvalidRequest);
            return;
        }
        // Payload length rules (spec §3.3).
        let len_ok = match (first, last) {
            (true, true) => payload.len() <= mtu,
            (_, false) => payload.len() == mtu,
            (false, true) => !payload.is_empty() && payload.len() <= mtu,
        };
        if !len_ok {
            self.responder_error(res, psn, Violation::InvalidRequest);
            return;
        }
        let mut data = payload;
        if first {
            let tm = match self.srq {
                Some(id) => res.tm_classify(id, payload, last),
                None => None,
            };
            let mut kind = RecvKind::PLAIN;
            match tm {
                Some(TmDecision::Rndv { entry, info, rvh }) => {
                    // (One packet: the whole request.)
                    if self.tm_start_rndv(res, entry, info, rvh) {
                        self.resp.msn = (self.resp.msn + 1) & 0x00FF_FFFF;
                        self.resp.epsn = psn.add(1);
                        if hdr.bth.ack_req {
                            self.resp.push_ack(now, psn);
                        }
                    }
                    return;
                }
                Some(TmDecision::Eager { entry, info }) => {
                    kind = RecvKind {
                        opcode: WcOpcode::TmRecv,
                        flags: WcFlags::TM_MATCH | WcFlags::TM_DATA_VALID,
                        tm: info,
                    };
                    let Some(segs) = res.resolve(self.recv_pd(res), &entry.sges, true) else {
                        let mut wc = self.recv_wc(
                            entry.recv_wr_id,
                            WcStatus::LocProtErr,
                            kind.opcode,
                            0,
                            None,
                        );
                        wc.tm = info;
                        res.complete(self.recv_cq, wc, false);
                        self.responder_error(res, psn, Violation::RemoteOperational);
                        return;
                    };
                    data = payload.get(TMH_LEN..).unwrap_or_default();
                    let cap = segs.iter().map(|s| s.len).sum();
                    self.resp.cur = Some(Inbound::Send {
                        wr_id: entry.recv_wr_id,
                        segs,
                        cap,
                        got: 0,
                        kind,
                    });
                }
                Some(TmDecision::Ordinary { unexpected }) => {
                    kind.opcode = WcOpcode::TmNoTag;
                    if unexpected {
                        kind.opcode = WcOpcode::Recv;
                        kind.flags = WcFlags::TM_SYNC_REQ;
                    }
                }
                None => {}
            }
            if self.resp.cur.is_none() {
                let Some(wqe) = self.take_recv(res) else {
                    res.counters.rnr_naks_sent += 1;
                    // One NAK per gap: the requester resends from this PSN after its RNR
                    // wait, so the packets behind it are dropped without a sequence NAK.
                    self.resp.nak_sent = true;
                    let aeth = AethRepr::rnr_nak(self.attr.min_rnr_timer, self.resp.msn);
                    self.resp.push_out(RespOut::Ack { psn, aeth });
                    return;
                };
                if kind.flags.contains(WcFlags::TM_SYNC_REQ)
                    && let Some(id) = self.srq
                {
                    res.tm_count_unexpected(id);
                }
                let Some(segs) = res.resolve(self.recv_pd(res), &wqe.sges, true) else {
                    let wc = self.recv_wc(wqe.wr_id, WcStatus::LocProtErr, kind.opcode, 0, None);
                    res.complete(self.recv_cq, wc, false);
                    self.responder_error(res, psn, Violation::RemoteOperational);
                    return;
                };
                let cap = segs.iter().map(|s| s.len).sum();
                let wr_id = wqe.wr_id;
                self.resp.cur = Some(Inbound::Send {
                    wr_id,
                    segs,
                    cap,
                    got: 0,
                    kind,
                });
            }
        }
        let Some(Inbound::Send {
            wr_id,
            segs,
            cap,
            got,
            kind,
        }) = &mut self.resp.cur
        else {
            return;
        };
        let kind = *kind;
        let payload = data;
        if *got + payload.len() > *cap {
            let wr_id = *wr_id;
            self.resp.cur = None;
            let wc = self.recv_wc(wr_id, WcStatus::LocLenErr, kind.opcode, 0, None);
            res.complete(self.recv_cq, wc, false);
            self.responder_error(res, psn, Violation::InvalidRequest);
            return;
        }
        scatter(segs, *got, payload);
        *got += payload.len();
        if last {
            let (wr_id, got) = (*wr_id, *got);
            // A send with invalidate closes the window it names as it is delivered; a key
            // that names no type 2 window bound to this QP is an invalid request.
            if let Some(rkey) = hdr.ieth
                && !res.invalidate(self.qpn, self.pd, rkey, true)
            {
                self.responder_error(res, psn, Violation::InvalidRequest);
                return;
            }
            self.resp.cur = None;
            self.resp.msn = (self.resp.msn + 1) & 0x00FF_FFFF;
            let mut wc = self.recv_wc(wr_id, WcStatus::Success, kind.opcode, got as u32, hdr.immdt);
            wc.wc_flags |= kind.flags;
            wc.tm = kind.tm;
            if let Some(rkey) = hdr.ieth {
                wc.imm_data = rkey;
                wc.wc_flags |= WcFlags::WITH_INV;
            }
            res.complete(self.recv_cq, wc, hdr.bth.solicited);
        }
        self.resp.epsn = psn.add(1);
        if hdr.bth.ack_req {
            self.resp.push_ack(now, psn);
        }
    }

    fn recv_write(
        &mut self,
        now: u64,
        res: &mut Resources,
        psn: Psn,
        hdr: &PacketHeaders,
        payload: &[u8],
        mtu: usize,
    ) {
        let op = hdr.bth.opcode.operation();
        let first = matches!(op, 0x06 | 0x0A | 0x0B);
        let last = !matches!(op, 0x06 | 0x07);
        let with_imm = matches!(op, 0x09 | 0x0B);
        let open = matches!(self.resp.cur, Some(Inbound::Write { .. }));
        if first == open || matches!(self.resp.cur, Some(Inbound::Send { .. })) {
            self.responder_error(res, psn, Violation::InvalidRequest);
            return;
        }
        if !self.allows(AccessFlags::REMOTE_WRITE) {
            self.responder_error(res, psn, Violation::InvalidRequest);
            return;
        }
        let len_ok = match (first, last) {
            (true, true) => payload.len() <= mtu,
            (_, false) => payload.len() == mtu,
            (false, true) => !payload.is_empty() && payload.len() <= mtu,
        };
        if !len_ok {
            self.responder_error(res, psn, Violation::InvalidRequest);
            return;
        }
        // A write with immediate consumes a receive WQE: check before touching memory.
        if with_imm && !self.has_recv(res) {
            res.counters.rnr_naks_sent += 1;
            self.resp.nak_sent = true;
            let aeth = AethRepr::rnr_nak(self.attr.min_rnr_timer, self.resp.msn);
            self.resp.push_out(RespOut::Ack { psn, aeth });
            return;
        }
        if first {
            let Some(RethRepr { va, rkey, dma_len }) = hdr.reth else {
                self.responder_error(res, psn, Violation::InvalidRequest);
                return;
            };
            let (mem, off) = if dma_len == 0 {
                (None, 0)
            } else {
                match res.remote(
                    self.qpn,
                    self.pd,
                    rkey,
                    va,
                    u64::from(dma_len),
                    AccessFlags::REMOTE_WRITE,
                ) {
                    Some((m, o)) => (Some(m), o),
                    None => {
                        self.responder_error(res, psn, Violation::RemoteAccess);
                        return;
                    }
                }
            };
            self.resp.cur = Some(Inbound::Write {
                mem,
                off,
                remaining: dma_len as usize,
                total: dma_len,
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
            self.resp.cur = None;
            self.responder_error(res, psn, Violation::InvalidRequest);
            return;
        }
        if let Some(m) = mem {
            m.write(*off, payload);
        }
        *off += payload.len();
        *remaining -= payload.len();
        if last {
            let total = *total;
            self.resp.cur = None;
            self.resp.msn = (self.resp.msn + 1) & 0x00FF_FFFF;
            if with_imm && let Some(wqe) = self.take_recv(res) {
                let wc = self.recv_wc(
                    wqe.wr_id,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    total,
                    hdr.immdt,
                );
                res.complete(self.recv_cq, wc, hdr.bth.solicited);
            }
        }
        self.resp.epsn = psn.add(1);
        if hdr.bth.ack_req {
            self.resp.push_ack(now, psn);
        }
    }

    fn recv_read(&mut self, res: &mut Resources, psn: Psn, hdr: &PacketHeaders, mtu: usize) {
        if self.resp.cur.is_some()
            || !self.allows(AccessFlags::REMOTE_READ)
            || self.attr.max_dest_rd_atomic == 0
            || self.resp.reads_in_flight() >= usize::from(self.attr.max_dest_rd_atomic)
        {
            self.responder_error(res, psn, Violation::InvalidRequest);
            return;
        }
        let Some(RethRepr { va, rkey, dma_len }) = hdr.reth else {
            self.responder_error(res, psn, Violation::InvalidRequest);
            return;
        };
        let len = dma_len as usize;
        let (mem, off) = if len == 0 {
            (None, 0)
        } else {
            match res.remote(
                self.qpn,
                self.pd,
                rkey,
                va,
                len as u64,
                AccessFlags::REMOTE_READ,
            ) {
                Some((m, o)) => (Some(m), o),
                None => {
                    self.responder_error(res, psn, Violation::RemoteAccess);
                    return;
                }
            }
        };
        let total = len.div_ceil(mtu).max(1) as u32;
        let last = psn.add(total - 1);
        self.resp.remember(
            RdAtomic::Read {
                first: psn,
                last,
                va,
                rkey,
                len: len as u64,
            },
            self.attr.max_dest_rd_atomic,
        );
        self.resp.push_out(RespOut::Read(ReadJob {
            first: psn,
            mem,
            off,
            len,
            pos: 0,
            total,
        }));
        self.resp.epsn = psn.add(total);
        self.resp.msn = (self.resp.msn + 1) & 0x00FF_FFFF;
    }

    fn recv_atomic(&mut self, res: &mut Resources, psn: Psn, hdr: &PacketHeaders) {
        let Some(a) = hdr.atomic_eth else {
            self.responder_error(res, psn, Violation::InvalidRequest);
            return;
        };
        if self.resp.cur.is_some()
            || !self.allows(AccessFlags::REMOTE_ATOMIC)
            || self.attr.max_dest_rd_atomic == 0
            || a.va % 8 != 0
        {
            self.responder_error(res, psn, Violation::InvalidRequest);
            return;
        }
        let Some((mem, off)) = res.remote(
            self.qpn,
            self.pd,
            a.rkey,
            a.va,
            8,
            AccessFlags::REMOTE_ATOMIC,
        ) else {
            self.responder_error(res, psn, Violation::RemoteAccess);
            return;
        };
        if !off.is_multiple_of(8) || off + 8 > mem.len() || mem.is_read_only() {
            self.responder_error(res, psn, Violation::InvalidRequest);
            return;
        }
        let orig = if hdr.bth.opcode.operation() == Opcode::RC_COMPARE_SWAP.0 {
            mem.compare_swap(off, a.compare, a.swap_add)
        } else {
            mem.fetch_add(off, a.swap_add)
        };
        // Only foreign memory (another process's, through a shared XRC domain) can fail
        // here: its owner unmapped it.
        let Some(orig) = orig else {
            self.responder_error(res, psn, Violation::RemoteAccess);
            return;
        };
        self.resp
            .remember(RdAtomic::Atomic { psn, orig }, self.attr.max_dest_rd_atomic);
        self.resp.msn = (self.resp.msn + 1) & 0x00FF_FFFF;
        self.resp.push_out(RespOut::AtomicAck { psn, orig });
        self.resp.epsn = psn.add(1);
    }

    /// A request behind `epsn`: re-ACK, re-execute a READ, or replay an atomic result.
    fn handle_duplicate(&mut self, now: u64, res: &mut Resources, psn: Psn, hdr: &PacketHeaders) {
        res.counters.rx_duplicates += 1;
        let op = hdr.bth.opcode.operation();
        tracing::trace!(qpn = %self.qpn, op, %psn, epsn = %self.resp.epsn, "duplicate request");
        match op {
            0x0C => {
                let Some(reth) = hdr.reth else {
                    res.counters.rx_malformed += 1;
                    return;
                };
                let found = self.resp.resources.iter().rev().find_map(|r| match *r {
                    RdAtomic::Read {
                        first,
                        last,
                        va,
                        rkey,
                        len,
                    } if !psn.before(first) && !psn.after(last) => Some((first, va, rkey, len)),
                    _ => None,
                });
                let Some((first, va, rkey, len)) = found else {
                    res.counters.rx_dropped_seq += 1;
                    return;
                };
                let inside = reth.rkey == rkey
                    && reth.va >= va
                    && reth.va.saturating_add(u64::from(reth.dma_len)) <= va.saturating_add(len);
                if !inside {
                    res.counters.rx_dropped_seq += 1;
                    return;
                }
                let mtu = self.mtu();
                let (mem, off) = if len == 0 {
                    (None, 0)
                } else {
                    match res.remote(self.qpn, self.pd, rkey, va, len, AccessFlags::REMOTE_READ) {
                        Some((m, o)) => (Some(m), o),
                        None => {
                            res.counters.rx_dropped_seq += 1;
                            return;
                        }
                    }
                };
                let total = (len as usize).div_ceil(mtu).max(1) as u32;
                let pos = psn.diff(first).max(0) as u32;
                // Replace a stale job for the same READ rather than stream it twice.
                self.resp
                    .out
                    .retain(|o| !matches!(o, RespOut::Read(j) if j.first == first));
                self.resp.push_out(RespOut::Read(ReadJob {
                    first,
                    mem,
                    off,
                    len: len as usize,
                    pos,
                    total,
                }));
            }
            0x13 | 0x14 => {
                let found = self.resp.resources.iter().rev().find_map(|r| match *r {
                    RdAtomic::Atomic { psn: p, orig } if p == psn => Some(orig),
                    _ => None,
                });
                match found {
                    Some(orig) => self.resp.push_out(RespOut::AtomicAck { psn, orig }),
                    None => res.counters.rx_dropped_seq += 1,
                }
            }
            _ => {
                // A duplicate means the requester is retrying: answer at once.
                let e = self.resp.epsn.sub(1);
                self.resp.push_ack(now, e);
                self.resp.release_ack();
            }
        }
    }

    /// Builds the next response packet (ACK/NAK, atomic ACK, READ response).
    pub(crate) fn poll_response(
        &mut self,
        res: &mut Resources,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        let item = self.resp.out.pop_front()?;
        let bth = |opcode: Opcode, psn: Psn| BthRepr {
            opcode,
            solicited: false,
            mig_req: self.mig_req(),
            pad_count: 0,
            pkey: 0xFFFF,
            fecn: false,
            becn: false,
            dest_qp: self.attr.dest_qp_num,
            ack_req: false,
            psn: psn.value(),
        };
        let mut hdr = PacketHeaders {
            bth: bth(Opcode::RC_ACKNOWLEDGE, Psn::new(0)),
            deth: None,
            xrceth: None,
            reth: None,
            atomic_eth: None,
            aeth: None,
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
        };
        match item {
            RespOut::Ack { psn, aeth } => {
                res.counters.acks_sent += 1;
                hdr.bth = bth(Opcode::RC_ACKNOWLEDGE, psn);
                hdr.aeth = Some(aeth);
                self.build(&hdr, 0, buf, |_| {})
            }
            RespOut::AtomicAck { psn, orig } => {
                hdr.bth = bth(Opcode::RC_ATOMIC_ACKNOWLEDGE, psn);
                hdr.aeth = Some(AethRepr::ack(self.resp.msn));
                hdr.atomic_ack_eth = Some(AtomicAckEthRepr { orig });
                self.build(&hdr, 0, buf, |_| {})
            }
            RespOut::Read(mut job) => {
                let mtu = self.mtu();
                let psn = job.first.add(job.pos);
                let boff = job.pos as usize * mtu;
                let n = mtu.min(job.len.saturating_sub(boff));
                let last = job.pos + 1 >= job.total;
                let opcode = match (job.pos == 0, last) {
                    (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                    (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                    (false, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                    (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                };
                hdr.bth = bth(opcode, psn);
                if job.pos == 0 || last {
                    hdr.aeth = Some(AethRepr::ack(self.resp.msn));
                }
                let mem = job.mem.clone();
                let off = job.off + boff;
                let t = self.build(&hdr, n, buf, |b| {
                    if let Some(m) = &mem {
                        m.read(off, b);
                    }
                });
                if !last {
                    job.pos += 1;
                    self.resp.out.push_front(RespOut::Read(job));
                }
                t
            }
        }
    }
}
