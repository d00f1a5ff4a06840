//! Tag-matching SRQs on the soft NIC (the behaviour is documented on the public module,
//! `verbs/src/tm.rs`): the tag list and its operations, the classification of an arriving
//! message by its tag-matching header, and the rendezvous read the responder starts.

use super::qp::{Qp, SendWqe, WqeKind};
use super::{InlineBytes, Nic, OneOrMany, Payload, Resources};
use crate::error::{PostError, VerbsError};
use crate::tm::{OpsFlags, OpsWr, Rvh, TMH_LEN, TagOp, TmCaps, Tmh, TmhOp};
use crate::types::{Psn, SendFlags, TmInfo, WcFlags, WcOpcode, WcStatus, WorkCompletion};
use crate::wr::Sge;

/// Most tags one tag-matching SRQ holds.
pub const MAX_NUM_TAGS: u32 = 1 << 16;
/// Most operations one `post_srq_ops` call carries.
const MAX_OPS: u32 = 1 << 12;

/// A tagged buffer.
#[derive(Debug, Clone)]
pub(crate) struct TagEntry {
    handle: u32,
    pub(crate) recv_wr_id: u64,
    pub(crate) sges: OneOrMany<Sge>,
    tag: u64,
    mask: u64,
}

/// The tag-matching part of an SRQ.
#[derive(Debug)]
pub(crate) struct TmState {
    max_num_tags: u32,
    max_ops: u32,
    /// Where list operations complete.
    cq: u32,
    /// In the order they were added (the first match wins).
    tags: Vec<TagEntry>,
    next_handle: u32,
    /// Unexpected messages delivered to ordinary receives.
    unexpected: u32,
    /// Unexpected messages the application reported handling.
    synced: u32,
}

impl TmState {
    fn in_sync(&self) -> bool {
        self.unexpected == self.synced
    }

    fn sync_flag(&self) -> WcFlags {
        if self.in_sync() {
            WcFlags::EMPTY
        } else {
            WcFlags::TM_SYNC_REQ
        }
    }
}

/// Where a message arriving on a tag-matching SRQ goes.
#[derive(Debug)]
pub(crate) enum TmDecision {
    /// To an ordinary receive WQE: not tagged (`TmNoTag`), or tagged with no match
    /// (unexpected: `Recv` with `TM_SYNC_REQ`, counted once delivered).
    Ordinary { unexpected: bool },
    /// To a tagged buffer: the data after the header.
    Eager { entry: TagEntry, info: TmInfo },
    /// A rendezvous request that matched: read the sender's buffer into the entry's.
    Rndv {
        entry: TagEntry,
        info: TmInfo,
        rvh: Rvh,
    },
}

/// How a receive completes (what `recv_send` reports at the last packet).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecvKind {
    pub(crate) opcode: WcOpcode,
    pub(crate) flags: WcFlags,
    pub(crate) tm: TmInfo,
}

impl RecvKind {
    pub(crate) const PLAIN: Self = Self {
        opcode: WcOpcode::Recv,
        flags: WcFlags::EMPTY,
        tm: TmInfo { tag: 0, app_ctx: 0 },
    };
}

/// The tag-matching job of an internal send-queue WQE.
#[derive(Debug, Clone, Copy)]
pub(crate) enum TmWqe {
    /// The rendezvous read: completes on `cq` as `TmRecv` with `TM_DATA_VALID`, then sends
    /// the FIN.
    Rndv { cq: u32, info: TmInfo },
    /// The FIN: completes silently.
    Fin,
}

impl Nic {
    /// Creates a tag-matching SRQ whose list operations complete on `cq`.
    ///
    /// # Errors
    /// As `create_srq`; `InvalidAttribute` for tag capacities beyond the device's.
    pub fn create_tm_srq(
        &mut self,
        pd: u32,
        max_wr: u32,
        max_sge: u32,
        caps: TmCaps,
        cq: u32,
    ) -> Result<u32, VerbsError> {
        if !self.res.cqs_contains(cq) {
            return Err(VerbsError::NoSuchObject("completion queue"));
        }
        if caps.max_num_tags == 0 || caps.max_num_tags > MAX_NUM_TAGS {
            return Err(VerbsError::InvalidAttribute {
                attr: "max_num_tags",
                reason: format!("{} is not between 1 and {MAX_NUM_TAGS}", caps.max_num_tags),
            });
        }
        if caps.max_ops == 0 || caps.max_ops > MAX_OPS {
            return Err(VerbsError::InvalidAttribute {
                attr: "max_ops",
                reason: format!("{} is not between 1 and {MAX_OPS}", caps.max_ops),
            });
        }
        let id = self.create_srq(pd, max_wr, max_sge)?;
        if let Some(s) = self.res.srqs.get_mut(&id) {
            s.tm = Some(TmState {
                max_num_tags: caps.max_num_tags,
                max_ops: caps.max_ops,
                cq,
                tags: Vec::new(),
                next_handle: 1,
                unexpected: 0,
                synced: 0,
            });
        }
        Ok(id)
    }

    /// `ibv_post_srq_ops`: runs the operations in order; one handle per operation.
    pub fn post_srq_ops(
        &mut self,
        srq: u32,
        ops: &[OpsWr<'_>],
    ) -> Result<Vec<u32>, (usize, PostError)> {
        self.timers_dirty = true;
        let res = &mut self.res;
        let s = res.srqs.get_mut(&srq).ok_or((0, PostError::Destroyed))?;
        let max_sge = s.max_sge;
        let tm = s.tm.as_mut().ok_or((
            0,
            PostError::InvalidWorkRequest(
                "not a tag-matching SRQ (ProtectionDomain::create_srq_tm)",
            ),
        ))?;
        if ops.len() > tm.max_ops as usize {
            return Err((
                tm.max_ops as usize,
                PostError::QueueFull {
                    what: "tag-matching operation",
                    depth: tm.max_ops,
                },
            ));
        }
        let mut handles = Vec::with_capacity(ops.len());
        let mut done = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let mut handle = 0;
            let (opcode, status) = match op.op {
                TagOp::Add {
                    recv_wr_id,
                    sg_list,
                    tag,
                    mask,
                } => {
                    if tm.tags.len() >= tm.max_num_tags as usize {
                        return Err((
                            i,
                            PostError::QueueFull {
                                what: "tag list",
                                depth: tm.max_num_tags,
                            },
                        ));
                    }
                    if sg_list.len() > max_sge as usize {
                        return Err((
                            i,
                            PostError::TooManySge {
                                count: sg_list.len(),
                                max: max_sge,
                            },
                        ));
                    }
                    handle = tm.next_handle;
                    tm.next_handle = tm.next_handle.wrapping_add(1).max(1);
                    tm.tags.push(TagEntry {
                        handle,
                        recv_wr_id,
                        sges: OneOrMany::from(sg_list),
                        tag,
                        mask,
                    });
                    (WcOpcode::TmAdd, WcStatus::Success)
                }
                TagOp::Del { handle: h } => match tm.tags.iter().position(|t| t.handle == h) {
                    Some(pos) => {
                        tm.tags.remove(pos);
                        (WcOpcode::TmDel, WcStatus::Success)
                    }
                    // Consumed by a message (or never added).
                    None => (WcOpcode::TmDel, WcStatus::TmErr),
                },
                TagOp::Sync => (WcOpcode::TmSync, WcStatus::Success),
            };
            if op.flags.contains(OpsFlags::TM_SYNC) || matches!(op.op, TagOp::Sync) {
                tm.synced = op.unexpected_cnt;
            }
            handles.push(handle);
            if status != WcStatus::Success || op.flags.contains(OpsFlags::SIGNALED) {
                done.push(WorkCompletion {
                    wr_id: op.wr_id,
                    status,
                    opcode,
                    wc_flags: tm.sync_flag(),
                    ..WorkCompletion::EMPTY
                });
            }
        }
        let cq = tm.cq;
        for wc in done {
            res.complete(cq, wc, false);
        }
        Ok(handles)
    }
}

impl Resources {
    /// Where a message whose first packet carries `first` goes, if SRQ `srq` matches tags
    /// (`None` for an SRQ without tag matching). A matched entry leaves the list.
    /// `one_packet`: the message is a single packet (a rendezvous request must be).
    pub(crate) fn tm_classify(
        &mut self,
        srq: u32,
        first: &[u8],
        one_packet: bool,
    ) -> Option<TmDecision> {
        let tm = self.srqs.get_mut(&srq)?.tm.as_mut()?;
        let Some(h) = Tmh::parse(first) else {
            return Some(TmDecision::Ordinary { unexpected: false });
        };
        let tagged = match h.op {
            TmhOp::NoTag | TmhOp::Fin => false,
            TmhOp::Eager => true,
            TmhOp::Rndv => {
                let rvh = first.get(TMH_LEN..).and_then(Rvh::parse);
                if rvh.is_none() || !one_packet {
                    // Not a rendezvous request this NIC can serve: software handles it.
                    return Some(TmDecision::Ordinary { unexpected: true });
                }
                true
            }
        };
        if !tagged {
            return Some(TmDecision::Ordinary { unexpected: false });
        }
        let pos = tm
            .in_sync()
            .then(|| {
                tm.tags
                    .iter()
                    .position(|t| h.tag & t.mask == t.tag & t.mask)
            })
            .flatten();
        let Some(pos) = pos else {
            return Some(TmDecision::Ordinary { unexpected: true });
        };
        let entry = tm.tags.remove(pos);
        let info = TmInfo {
            tag: h.tag,
            app_ctx: h.app_ctx,
        };
        Some(match h.op {
            TmhOp::Rndv => match first.get(TMH_LEN..).and_then(Rvh::parse) {
                Some(rvh) => TmDecision::Rndv { entry, info, rvh },
                None => TmDecision::Ordinary { unexpected: true },
            },
            _ => TmDecision::Eager { entry, info },
        })
    }

    /// An unexpected message was delivered to an ordinary receive of `srq`.
    pub(crate) fn tm_count_unexpected(&mut self, srq: u32) {
        if let Some(tm) = self.srqs.get_mut(&srq).and_then(|s| s.tm.as_mut()) {
            tm.unexpected = tm.unexpected.wrapping_add(1);
        }
    }
}

impl Qp {
    /// A matched rendezvous request (one packet, at PSN `psn`): reports the match and queues
    /// the read of the sender's buffer on this QP's send queue. False when the request
    /// cannot be served (the buffer is too small or unusable): the tag completes in error
    /// and the QP fails.
    pub(crate) fn tm_start_rndv(
        &mut self,
        res: &mut Resources,
        entry: TagEntry,
        info: TmInfo,
        rvh: Rvh,
    ) -> bool {
        let segs = res.resolve(self.recv_pd(res), &entry.sges, true);
        let cap: usize = segs.as_ref().map_or(0, |s| s.iter().map(|g| g.len).sum());
        let status = match segs {
            None => Some(WcStatus::LocProtErr),
            Some(_) if rvh.len as usize > cap => Some(WcStatus::LocLenErr),
            Some(_) => None,
        };
        let mut wc = self.recv_wc(
            entry.recv_wr_id,
            WcStatus::Success,
            WcOpcode::TmRecv,
            0,
            None,
        );
        wc.tm = info;
        wc.wc_flags = WcFlags::TM_MATCH;
        if let Some(st) = status {
            wc.status = st;
            res.complete(self.recv_cq, wc, false);
            self.fatal(res);
            return false;
        }
        res.complete(self.recv_cq, wc, false);
        let Some(segs) = segs else {
            return false;
        };
        self.req.sq.push_back(SendWqe {
            wr_id: entry.recv_wr_id,
            kind: WqeKind::Read,
            imm: None,
            remote_addr: rvh.va,
            rkey: rvh.rkey.0,
            compare: 0,
            swap_add: 0,
            flags: SendFlags::EMPTY,
            len: rvh.len as usize,
            payload: Payload::Segs(segs),
            local_err: None,
            ud: None,
            xrc_srqn: None,
            inv: None,
            bind: None,
            tm: Some(TmWqe::Rndv {
                cq: self.recv_cq,
                info,
            }),
            started: false,
            first_psn: Psn::new(0),
            npsn: 0,
        });
        true
    }

    /// Reports the end of an internal WQE: the rendezvous read's data-valid completion
    /// (and its FIN, on success), nothing for a FIN. False for an ordinary WQE.
    pub(crate) fn tm_wqe_done(
        &mut self,
        res: &mut Resources,
        w: &SendWqe,
        status: WcStatus,
    ) -> bool {
        match w.tm {
            None => false,
            Some(TmWqe::Fin) => true,
            Some(TmWqe::Rndv { cq, info }) => {
                let ok = status == WcStatus::Success;
                let st = if ok || status == WcStatus::WrFlushErr {
                    status
                } else {
                    WcStatus::TmRndvIncomplete
                };
                let mut wc = self.recv_wc(w.wr_id, st, WcOpcode::TmRecv, w.len as u32, None);
                wc.tm = info;
                wc.wc_flags = WcFlags::TM_DATA_VALID;
                res.complete(cq, wc, false);
                if ok {
                    let fin = Tmh {
                        op: TmhOp::Fin,
                        app_ctx: info.app_ctx,
                        tag: info.tag,
                    };
                    self.req.sq.push_back(SendWqe {
                        wr_id: 0,
                        kind: WqeKind::Send,
                        imm: None,
                        remote_addr: 0,
                        rkey: 0,
                        compare: 0,
                        swap_add: 0,
                        flags: SendFlags::EMPTY,
                        len: TMH_LEN,
                        payload: Payload::Inline(InlineBytes::new(&fin.to_bytes())),
                        local_err: None,
                        ud: None,
                        xrc_srqn: None,
                        inv: None,
                        bind: None,
                        tm: Some(TmWqe::Fin),
                        started: false,
                        first_psn: Psn::new(0),
                        npsn: 0,
                    });
                }
                true
            }
        }
    }
}
