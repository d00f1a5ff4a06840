//! Tag-matching SRQs on libibverbs: `ibv_create_srq_ex` with `IBV_SRQT_TM`,
//! `ibv_post_srq_ops` and the device's `tm_caps` (`ibv_query_device_ex`), all reached
//! through `struct verbs_context` as in `xrc.rs`. Never run on hardware here; the
//! conformance suite's tag-matching cases are what checks it on a device that has them.

use std::os::raw::c_void;

use super::post::{BASIC_SRQ_BASE, raw_sge};
use super::xrc::{PostSrqOps, QueryDeviceEx, not_supported, op};
use super::{IbvDevice, Ptr, ffi, last_err};
use crate::error::{PostError, VerbsError};
use crate::tm::{OpsWr, TagOp, TmCaps};

impl IbvDevice {
    /// The device's tag-matching limit (`tm_caps.max_num_tags`; 0 without the op).
    pub(super) fn max_num_tags(&self) -> u32 {
        let ctx = self.ctx;
        let Some(query) = op!(ctx, query_device_ex, QueryDeviceEx) else {
            return 0;
        };
        // SAFETY: a plain C struct of integers and nested plain structs; zeroes are valid.
        let mut attr: ffi::ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open; `attr` is live and as large as the size passed; no input.
        let rc = unsafe { query(ctx, std::ptr::null(), &raw mut attr, size_of_val(&attr)) };
        if rc != 0 {
            return 0;
        }
        attr.tm_caps.max_num_tags
    }

    /// `ibv_create_srq_ex` of a tag-matching SRQ whose list operations complete on `cq`.
    pub(super) fn create_srq_tm(
        &self,
        pd: u32,
        max_wr: u32,
        max_sge: u32,
        tm: TmCaps,
        cq: u32,
    ) -> Result<u32, VerbsError> {
        let ctx = self.ctx;
        let create = op!(ctx, create_srq_ex, super::xrc::CreateSrqEx).ok_or_else(not_supported)?;
        let (pdp, cqp, h) = {
            let mut t = self.t.lock();
            let pdp = *t
                .pds
                .get(&pd)
                .ok_or(VerbsError::NoSuchObject("protection domain"))?;
            let cqp = *t
                .cqs
                .get(&cq)
                .ok_or(VerbsError::NoSuchObject("completion queue"))?;
            let mut h = t.next_handle() | BASIC_SRQ_BASE;
            while t.srqs.contains_key(&h) {
                h = t.next_handle() | BASIC_SRQ_BASE;
            }
            (pdp, cqp, h)
        };
        // SAFETY: a plain C struct of integers and pointers; all-zero bytes are valid.
        let mut init: ffi::ibv_srq_init_attr_ex = unsafe { std::mem::zeroed() };
        init.srq_context = h as usize as *mut c_void;
        init.attr = ffi::ibv_srq_attr {
            max_wr,
            max_sge,
            srq_limit: 0,
        };
        init.comp_mask = ffi::IBV_SRQ_INIT_ATTR_TYPE
            | ffi::IBV_SRQ_INIT_ATTR_PD
            | ffi::IBV_SRQ_INIT_ATTR_CQ
            | ffi::IBV_SRQ_INIT_ATTR_TM;
        init.srq_type = ffi::IBV_SRQT_TM;
        init.pd = pdp.0;
        init.cq = cqp.0;
        init.tm_cap = ffi::ibv_tm_cap {
            max_num_tags: tm.max_num_tags,
            max_ops: tm.max_ops,
        };
        // SAFETY: `ctx`, PD and CQ are live; `init` is live and initialised; the op was
        // checked present.
        let srq = unsafe { create(ctx, &raw mut init) };
        if srq.is_null() {
            return Err(last_err("ibv_create_srq_ex"));
        }
        self.t.lock().srqs.insert(h, Ptr(srq));
        Ok(h)
    }

    /// `ibv_post_srq_ops`: one chain; the handles the device wrote into the ADDs.
    pub(super) fn post_srq_ops(
        &self,
        srq: u32,
        ops: &[OpsWr<'_>],
    ) -> Result<Vec<u32>, (usize, PostError)> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let p = self.srq(srq).ok_or((0, PostError::Destroyed))?;
        let post = op!(self.ctx, post_srq_ops, PostSrqOps).ok_or((
            0,
            PostError::InvalidWorkRequest("the device has no ibv_post_srq_ops"),
        ))?;
        // Every SGE list first (so no pointer into `sges` moves afterwards).
        let mut sges: Vec<ffi::ibv_sge> = Vec::new();
        let mut spans = Vec::with_capacity(ops.len());
        for o in ops {
            let start = sges.len();
            if let TagOp::Add { sg_list, .. } = o.op {
                sges.extend(sg_list.iter().map(raw_sge));
            }
            spans.push((start, sges.len() - start));
        }
        // SAFETY: a plain C struct; all-zero bytes are valid.
        let mut raw: Vec<ffi::ibv_ops_wr> = vec![unsafe { std::mem::zeroed() }; ops.len()];
        for (k, (o, r)) in ops.iter().zip(raw.iter_mut()).enumerate() {
            r.wr_id = o.wr_id;
            r.flags = o.flags.bits() as std::os::raw::c_int;
            r.tm.unexpected_cnt = o.unexpected_cnt;
            match o.op {
                TagOp::Add {
                    recv_wr_id,
                    tag,
                    mask,
                    ..
                } => {
                    let (start, n) = spans.get(k).copied().unwrap_or((0, 0));
                    r.opcode = ffi::IBV_WR_TAG_ADD;
                    r.tm.add.recv_wr_id = recv_wr_id;
                    r.tm.add.num_sge = n as std::os::raw::c_int;
                    r.tm.add.sg_list = if n == 0 {
                        std::ptr::null_mut()
                    } else {
                        sges.as_mut_ptr().wrapping_add(start)
                    };
                    r.tm.add.tag = tag;
                    r.tm.add.mask = mask;
                }
                TagOp::Del { handle } => {
                    r.opcode = ffi::IBV_WR_TAG_DEL;
                    r.tm.handle = handle;
                }
                TagOp::Sync => r.opcode = ffi::IBV_WR_TAG_SYNC,
            }
        }
        let first = raw.as_mut_ptr();
        let count = raw.len();
        for k in 0..count {
            // SAFETY: `k < count`; no reference to the element exists.
            let r = unsafe { &mut *first.add(k) };
            r.next = if k + 1 < count {
                first.wrapping_add(k + 1)
            } else {
                std::ptr::null_mut()
            };
        }
        let mut bad: *mut ffi::ibv_ops_wr = std::ptr::null_mut();
        // SAFETY: live SRQ; `raw` is a chain of live WRs whose SGE pointers point into
        // `sges`, both alive and unmoved for the call; `bad` is a live out-pointer.
        let rc = unsafe { post(p.0, first, &raw mut bad) };
        // SAFETY: the chain is ours again; each ADD's handle was written by the device.
        let handles: Vec<u32> = (0..count)
            .map(|k| unsafe { (*first.add(k)).tm.handle })
            .zip(ops)
            .map(|(h, o)| {
                if matches!(o.op, TagOp::Add { .. }) {
                    h
                } else {
                    0
                }
            })
            .collect();
        if rc != 0 {
            let idx = if bad.is_null() {
                0
            } else {
                (bad as usize)
                    .checked_sub(first as usize)
                    .map_or(0, |off| off / size_of::<ffi::ibv_ops_wr>())
                    .min(count - 1)
            };
            return Err((idx, super::post::post_err(rc, "tag-matching operation", 0)));
        }
        Ok(handles)
    }
}
