//! Batch posting on libibverbs: a QP created with send ops is an `ibv_qp_ex`, and a batch
//! goes through its `wr_start`, builders, setters and `wr_complete` (`ibv_wr_*` are
//! `static inline` in verbs.h and call these pointers). Everything that can fail on the
//! rdmx side (inline limits, address handles, window and region pointers, a builder the
//! device lacks) is checked before `wr_start`, so a started batch is only ever completed.
//! A QP created without send ops posts the batch as one `ibv_post_send` chain.

use std::os::raw::c_void;

use super::post::{check_inline, post_err, raw_sge};
use super::{IbvDevice, ffi};
use crate::error::PostError;
use crate::types::{QpType, Qpn, SendFlags};
use crate::wr::{SendWr, WrOpcode};

/// What a request needs besides itself: its UD address handle and its window / region.
struct Extra {
    ah: *mut ffi::ibv_ah,
    bind: Option<(*mut ffi::ibv_mw, *mut ffi::ibv_mr)>,
}

fn missing(what: &'static str) -> PostError {
    PostError::InvalidWorkRequest(what)
}

impl IbvDevice {
    pub(super) fn post_send_all(
        &self,
        qpn: Qpn,
        wrs: &[SendWr<'_>],
    ) -> Result<(), (usize, PostError)> {
        let e = self.qp(qpn).ok_or((0, PostError::Destroyed))?;
        let Some(qpx) = e.qpx else {
            return self.post_send(qpn, wrs);
        };
        if wrs.is_empty() {
            return Ok(());
        }
        let q = qpx.0;
        // SAFETY: a live extended QP (its entry is in the table while the public QP
        // lives); its function pointers are set at creation and never change.
        let x = unsafe { &*q };
        let mut extra = Vec::with_capacity(wrs.len());
        for (i, w) in wrs.iter().enumerate() {
            check_inline(w, e.cap.max_inline_data).map_err(|err| (i, err))?;
            let ah = match (e.qp_type, w.ud) {
                (QpType::Ud, Some(ud)) => {
                    self.ah(e.pd, &ud.ah)
                        .map_err(|_| (i, missing("cannot create the address handle")))?
                        .0
                }
                (QpType::Ud, None) => return Err((i, missing("UD send without a destination"))),
                _ => std::ptr::null_mut(),
            };
            let bind = match &w.opcode {
                WrOpcode::BindMw(b) => Some(self.bind_ptrs(b).map_err(|err| (i, err))?),
                _ => None,
            };
            let builder = match w.opcode {
                WrOpcode::Send => x.wr_send.is_some(),
                WrOpcode::SendWithImm { .. } => x.wr_send_imm.is_some(),
                WrOpcode::SendWithInv { .. } => x.wr_send_inv.is_some(),
                WrOpcode::RdmaWrite { .. } => x.wr_rdma_write.is_some(),
                WrOpcode::RdmaWriteWithImm { .. } => x.wr_rdma_write_imm.is_some(),
                WrOpcode::RdmaRead { .. } => x.wr_rdma_read.is_some(),
                WrOpcode::AtomicCmpSwap { .. } => x.wr_atomic_cmp_swp.is_some(),
                WrOpcode::AtomicFetchAdd { .. } => x.wr_atomic_fetch_add.is_some(),
                WrOpcode::BindMw(_) => x.wr_bind_mw.is_some(),
                WrOpcode::LocalInv { .. } => x.wr_local_inv.is_some(),
            };
            if !builder {
                return Err((
                    i,
                    missing("the device has no ibv_wr_* builder for this operation"),
                ));
            }
            extra.push(Extra { ah, bind });
        }
        let (Some(start), Some(complete), Some(abort)) = (x.wr_start, x.wr_complete, x.wr_abort)
        else {
            return Err((
                0,
                missing("the device has no ibv_wr_start / ibv_wr_complete"),
            ));
        };
        let (Some(set_sges), Some(set_inline), Some(set_ud), Some(set_srqn)) = (
            x.wr_set_sge_list,
            x.wr_set_inline_data,
            x.wr_set_ud_addr,
            x.wr_set_xrc_srqn,
        ) else {
            return Err((0, missing("the device has no ibv_wr_set_* setters")));
        };
        // SAFETY: `q` is live (above); `wr_start` opens the QP's critical section, closed by
        // `wr_complete` (or `wr_abort`) below on every path.
        unsafe { start(q) };
        let mut raw: Vec<ffi::ibv_sge> = Vec::new();
        for (w, x2) in wrs.iter().zip(&extra) {
            let mut flags = w.send_flags.bits() & 0xF;
            if w.inline_data.is_some() {
                flags |= SendFlags::INLINE.bits();
            }
            // SAFETY: inside the critical section; the fields are the builders' inputs.
            unsafe {
                (*q).wr_id = w.wr_id;
                (*q).wr_flags = flags;
            }
            // SAFETY: every builder was checked present above; the arguments are plain
            // values and, for a bind, a live window and region (in their tables, kept by
            // the public objects) with a bind-info struct alive for the call.
            let built = unsafe { build(q, x, w, x2) };
            if !built {
                // SAFETY: inside the critical section, which this closes.
                unsafe { abort(q) };
                return Err((
                    0,
                    missing("the device has no ibv_wr_* builder for this operation"),
                ));
            }
            if !w.opcode.is_local() {
                match w.inline_data {
                    // SAFETY: the library copies the bytes during the call; `d` is alive.
                    Some(d) => unsafe {
                        set_inline(q, d.as_ptr().cast_mut().cast::<c_void>(), d.len())
                    },
                    None => {
                        raw.clear();
                        raw.extend(w.sg_list.iter().map(raw_sge));
                        // SAFETY: `raw` is alive for the call, which copies the entries.
                        unsafe { set_sges(q, raw.len(), raw.as_ptr()) };
                    }
                }
            }
            if let Some(ud) = w.ud.filter(|_| e.qp_type == QpType::Ud) {
                // SAFETY: the cached AH lives until the device closes.
                unsafe { set_ud(q, x2.ah, ud.remote_qpn.0, ud.remote_qkey) };
            }
            if let Some(srqn) = w.remote_srqn.filter(|_| e.qp_type == QpType::XrcSend) {
                // SAFETY: a plain value.
                unsafe { set_srqn(q, srqn) };
            }
        }
        // SAFETY: closes the critical section opened above.
        let rc = unsafe { complete(q) };
        if rc != 0 {
            return Err((0, post_err(rc, "send", e.cap.max_send_wr)));
        }
        Ok(())
    }
}

/// Calls the builder of `w` on `q`; false if the device lacks it.
///
/// # Safety
/// `q` is a live extended QP inside its `wr_start` critical section; a bind's window and
/// region in `extra` are live.
unsafe fn build(q: *mut ffi::ibv_qp_ex, x: &ffi::ibv_qp_ex, w: &SendWr<'_>, extra: &Extra) -> bool {
    // rdmx's immediate is the big-endian wire word read as a number; libibverbs takes
    // network order (see `set_opcode` in post.rs).
    // SAFETY: every call is a builder of the live QP `q` inside its critical section, with
    // plain values and (for a bind) live objects, as the function's contract states.
    unsafe {
        match w.opcode {
            WrOpcode::Send => x.wr_send.map(|f| f(q)),
            WrOpcode::SendWithImm { imm } => x.wr_send_imm.map(|f| f(q, imm.to_be())),
            WrOpcode::SendWithInv { rkey } => x.wr_send_inv.map(|f| f(q, rkey.0)),
            WrOpcode::RdmaWrite { remote_addr, rkey } => {
                x.wr_rdma_write.map(|f| f(q, rkey.0, remote_addr))
            }
            WrOpcode::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => x
                .wr_rdma_write_imm
                .map(|f| f(q, rkey.0, remote_addr, imm.to_be())),
            WrOpcode::RdmaRead { remote_addr, rkey } => {
                x.wr_rdma_read.map(|f| f(q, rkey.0, remote_addr))
            }
            WrOpcode::AtomicCmpSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => x
                .wr_atomic_cmp_swp
                .map(|f| f(q, rkey.0, remote_addr, compare, swap)),
            WrOpcode::AtomicFetchAdd {
                remote_addr,
                rkey,
                add,
            } => x
                .wr_atomic_fetch_add
                .map(|f| f(q, rkey.0, remote_addr, add)),
            WrOpcode::BindMw(b) => match extra.bind {
                Some((mw, mr)) => {
                    let info = ffi::ibv_mw_bind_info {
                        mr,
                        addr: b.addr,
                        length: b.length,
                        mw_access_flags: b.access.bits(),
                    };
                    x.wr_bind_mw.map(|f| f(q, mw, b.rkey.0, &raw const info))
                }
                None => None,
            },
            WrOpcode::LocalInv { rkey } => x.wr_local_inv.map(|f| f(q, rkey.0)),
        }
        .is_some()
    }
}
