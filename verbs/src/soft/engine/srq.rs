//! Shared receive queues (spec §9.1): receive WQEs posted once and consumed, in posting
//! order, by whichever QP needs one; the limit event; and the receive-WQE source of a QP
//! (its own receive queue or its SRQ).

use std::collections::VecDeque;

use super::qp::{Qp, RecvWqe};
use super::{AsyncEvent, Nic, Resources};
use crate::error::{PostError, VerbsError};
use crate::types::{QpState, QpType, WcOpcode, WcStatus};
use crate::vocab::SrqState;
use crate::wr::RecvWr;

/// Largest SRQ depth.
pub(crate) const MAX_SRQ_WR: u32 = 1 << 16;
/// Largest SGE count per SRQ receive.
pub(crate) const MAX_SRQ_SGE: u32 = 32;

/// One shared receive queue.
#[derive(Debug)]
pub(crate) struct Srq {
    pub(crate) pd: u32,
    pub(crate) queue: VecDeque<RecvWqe>,
    pub(crate) max_wr: u32,
    pub(crate) max_sge: u32,
    /// Armed limit (0 = disarmed).
    pub(crate) limit: u32,
    /// XRC SRQ: its XRC domain and the CQ its receive completions go to.
    pub(crate) xrc: Option<(u32, u32)>,
    /// Tag matching (`tm.rs`).
    pub(crate) tm: Option<super::tm::TmState>,
}

impl Nic {
    /// Creates an SRQ under `pd` (`ibv_create_srq`); returns its handle.
    pub fn create_srq(&mut self, pd: u32, max_wr: u32, max_sge: u32) -> Result<u32, VerbsError> {
        if max_wr == 0 || max_wr > MAX_SRQ_WR {
            return Err(VerbsError::InvalidAttribute {
                attr: "max_wr",
                reason: format!("{max_wr} is not between 1 and {MAX_SRQ_WR}"),
            });
        }
        if max_sge == 0 || max_sge > MAX_SRQ_SGE {
            return Err(VerbsError::InvalidAttribute {
                attr: "max_sge",
                reason: format!("{max_sge} is not between 1 and {MAX_SRQ_SGE}"),
            });
        }
        let id = loop {
            let n = self.res.rng.next_u32() & 0x00FF_FFFF;
            if n != 0 && !self.res.srqs.contains_key(&n) {
                break n;
            }
        };
        let srq = Srq {
            pd,
            queue: VecDeque::new(),
            max_wr,
            max_sge,
            limit: 0,
            xrc: None,
            tm: None,
        };
        self.res.srqs.insert(id, srq);
        Ok(id)
    }

    /// Allocates an XRC domain (`ibv_open_xrcd`).
    pub fn alloc_xrcd(&mut self) -> u32 {
        self.next_xrcd = self.next_xrcd.wrapping_add(1).max(1);
        self.next_xrcd
    }

    /// Creates an XRC SRQ in `xrcd` whose receive completions go to `cq`
    /// (`ibv_create_srq_ex` with `IBV_SRQT_XRC`). Its handle is its 24-bit SRQ number.
    pub fn create_xrc_srq(
        &mut self,
        pd: u32,
        xrcd: u32,
        cq: u32,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<u32, VerbsError> {
        if !self.res.cqs_contains(cq) {
            return Err(VerbsError::NoSuchObject("completion queue"));
        }
        let id = self.create_srq(pd, max_wr, max_sge)?;
        if let Some(s) = self.res.srqs.get_mut(&id) {
            s.xrc = Some((xrcd, cq));
        }
        Ok(id)
    }

    /// Destroys an SRQ; fails while a QP created on it still exists. XRC target QPs are not
    /// tied to an SRQ (each message names one), so they do not hold it: one that last
    /// delivered into it forgets it, and a later message naming it gets a NAK.
    pub fn destroy_srq(&mut self, srq: u32) -> Result<(), VerbsError> {
        self.timers_dirty = true;
        if self
            .qps
            .values()
            .any(|q| q.srq == Some(srq) && q.qp_type != QpType::XrcRecv)
        {
            return Err(VerbsError::InvalidArgument(
                "the shared receive queue is still used by a queue pair".into(),
            ));
        }
        for q in self.qps.values_mut() {
            if q.srq == Some(srq) {
                q.srq = None;
            }
        }
        self.res
            .srqs
            .remove(&srq)
            .map(|_| ())
            .ok_or(VerbsError::NoSuchObject("SRQ"))
    }

    /// Posts receive WQEs in order; stops at the first that fails and returns its index
    /// (`ibv_post_srq_recv` with a list and `bad_wr`).
    pub fn post_srq_recv_list(
        &mut self,
        srq: u32,
        wrs: &[RecvWr<'_>],
    ) -> Result<(), (usize, PostError)> {
        for (i, wr) in wrs.iter().enumerate() {
            self.post_srq_recv(srq, wr).map_err(|e| (i, e))?;
        }
        Ok(())
    }

    /// Posts a receive WQE to an SRQ (`ibv_post_srq_recv`).
    pub fn post_srq_recv(&mut self, srq: u32, wr: &RecvWr<'_>) -> Result<(), PostError> {
        self.timers_dirty = true;
        let s = self.res.srqs.get_mut(&srq).ok_or(PostError::Destroyed)?;
        if s.queue.len() >= s.max_wr as usize {
            return Err(PostError::QueueFull {
                what: "shared receive",
                depth: s.max_wr,
            });
        }
        if wr.sg_list.len() > s.max_sge as usize {
            return Err(PostError::TooManySge {
                count: wr.sg_list.len(),
                max: s.max_sge,
            });
        }
        s.queue.push_back(RecvWqe {
            wr_id: wr.wr_id,
            sges: super::OneOrMany::from(wr.sg_list),
        });
        Ok(())
    }

    /// Changes `max_wr` (grow only) and/or arms the limit (`ibv_modify_srq`).
    pub fn modify_srq(
        &mut self,
        srq: u32,
        max_wr: Option<u32>,
        limit: Option<u32>,
    ) -> Result<(), VerbsError> {
        let s = self
            .res
            .srqs
            .get_mut(&srq)
            .ok_or(VerbsError::NoSuchObject("SRQ"))?;
        let new_max = max_wr.unwrap_or(s.max_wr);
        if new_max < s.queue.len() as u32 || new_max == 0 || new_max > MAX_SRQ_WR {
            return Err(VerbsError::InvalidAttribute {
                attr: "max_wr",
                reason: format!(
                    "{new_max} must be between the {} posted WQEs and {MAX_SRQ_WR}",
                    s.queue.len()
                ),
            });
        }
        if let Some(l) = limit
            && l > new_max
        {
            return Err(VerbsError::InvalidAttribute {
                attr: "srq_limit",
                reason: format!("{l} exceeds max_wr {new_max}"),
            });
        }
        s.max_wr = new_max;
        if let Some(l) = limit {
            s.limit = l;
        }
        Ok(())
    }

    /// Current SRQ attributes (`ibv_query_srq`).
    pub fn query_srq(&self, srq: u32) -> Option<SrqState> {
        self.res.srqs.get(&srq).map(|s| SrqState {
            max_wr: s.max_wr,
            max_sge: s.max_sge,
            srq_limit: s.limit,
            posted: Some(s.queue.len() as u32),
        })
    }
}

impl Qp {
    /// True when a receive WQE is available (own receive queue or SRQ).
    pub(crate) fn has_recv(&self, res: &Resources) -> bool {
        match self.srq {
            Some(id) => res.srqs.get(&id).is_some_and(|s| !s.queue.is_empty()),
            None => !self.resp.rq.is_empty(),
        }
    }

    /// The protection domain receive WQEs are resolved in (the SRQ's, for a QP on an SRQ).
    pub(crate) fn recv_pd(&self, res: &Resources) -> u32 {
        self.srq
            .and_then(|id| res.srqs.get(&id))
            .map_or(self.pd, |s| s.pd)
    }

    /// Takes the next receive WQE. On an SRQ, raises the limit event (once, then disarms)
    /// when the number posted drops below the armed limit.
    pub(crate) fn take_recv(&mut self, res: &mut Resources) -> Option<RecvWqe> {
        let Some(id) = self.srq else {
            return self.resp.rq.pop_front();
        };
        let s = res.srqs.get_mut(&id)?;
        let w = s.queue.pop_front()?;
        if s.limit > 0 && (s.queue.len() as u32) < s.limit {
            s.limit = 0;
            res.events.push_back(AsyncEvent::SrqLimitReached(id));
        }
        Some(w)
    }

    /// Flushes the QP's own receive queue (an SRQ's WQEs stay with the SRQ) and, for a QP on
    /// an SRQ, tells the application that it will take no more WQEs.
    pub(crate) fn flush_receives(&mut self, res: &mut Resources) {
        while let Some(r) = self.resp.rq.pop_front() {
            let wc = self.recv_wc(r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0, None);
            res.complete(self.recv_cq, wc, false);
        }
        if self.srq.is_some() && self.state() == QpState::Err {
            res.events.push_back(AsyncEvent::QpLastWqeReached(self.qpn));
        }
    }
}
