//! Posting work requests (through the context's ops table: `ibv_post_send`,
//! `ibv_post_recv` and `ibv_post_srq_recv` are `static inline` in verbs.h) and shared
//! receive queues.

use super::{IbvDevice, Ptr, QpEntry, ffi, io_err, last_err};
use crate::error::{PostError, VerbsError};
use crate::types::{QpType, Qpn, SendFlags};
use crate::vocab::SrqState;
use crate::wr::{RecvWr, SendWr, Sge, WrOpcode};

/// Handles of basic SRQs have this bit set (XRC SRQs use their 24-bit SRQ number).
pub(super) const BASIC_SRQ_BASE: u32 = 1 << 24;

pub(super) fn raw_sge(s: &Sge) -> ffi::ibv_sge {
    ffi::ibv_sge {
        addr: s.addr,
        length: s.length,
        lkey: s.lkey.0,
    }
}

/// The `PostError` for a libibverbs post failure (`rc` is an errno).
pub(super) fn post_err(rc: i32, what: &'static str, depth: u32) -> PostError {
    match rc {
        libc::ENOMEM => PostError::QueueFull { what, depth },
        libc::EINVAL => PostError::InvalidWorkRequest("rejected by the device (EINVAL)"),
        _ => PostError::InvalidWorkRequest("rejected by the device"),
    }
}

/// Rejects an inline send (inline data, or the `INLINE` flag on SGEs) longer than `max`,
/// the QP's limit as `ibv_create_qp` granted it. Checked here because providers report it
/// as ENOMEM (mlx5, for one), which would read as a full queue.
pub(super) fn check_inline(w: &SendWr<'_>, max: u32) -> Result<(), PostError> {
    if w.inline_data.is_none() && !w.send_flags.contains(SendFlags::INLINE) {
        return Ok(());
    }
    let len = w.total_len();
    if len > u64::from(max) {
        return Err(PostError::InlineTooLong {
            len: usize::try_from(len).unwrap_or(usize::MAX),
            max,
        });
    }
    Ok(())
}

/// The opcode and its operands in `wr`.
fn set_opcode(wr: &mut ffi::ibv_send_wr, op: &WrOpcode) -> Result<(), PostError> {
    use ffi::ibv_wr_opcode as o;
    let rdma = |remote_addr, rkey: u32| ffi::ibv_send_wr__bindgen_ty_2 {
        rdma: ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey },
    };
    // libibverbs keeps imm_data in network byte order; rdmx's immediate is the big-endian
    // wire word read as a number (the soft provider's convention), hence `to_be`.
    match *op {
        WrOpcode::Send => wr.opcode = o::IBV_WR_SEND,
        WrOpcode::SendWithImm { imm } => {
            wr.opcode = o::IBV_WR_SEND_WITH_IMM;
            wr.__bindgen_anon_1.imm_data = imm.to_be();
        }
        WrOpcode::RdmaWrite { remote_addr, rkey } => {
            wr.opcode = o::IBV_WR_RDMA_WRITE;
            wr.wr = rdma(remote_addr, rkey.0);
        }
        WrOpcode::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm,
        } => {
            wr.opcode = o::IBV_WR_RDMA_WRITE_WITH_IMM;
            wr.wr = rdma(remote_addr, rkey.0);
            wr.__bindgen_anon_1.imm_data = imm.to_be();
        }
        WrOpcode::RdmaRead { remote_addr, rkey } => {
            wr.opcode = o::IBV_WR_RDMA_READ;
            wr.wr = rdma(remote_addr, rkey.0);
        }
        // `compare_add` is the compare value of a CAS and the addend of a fetch-and-add;
        // `swap` is only read by CAS.
        WrOpcode::AtomicCmpSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            wr.opcode = o::IBV_WR_ATOMIC_CMP_AND_SWP;
            wr.wr = ffi::ibv_send_wr__bindgen_ty_2 {
                atomic: ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr,
                    compare_add: compare,
                    swap,
                    rkey: rkey.0,
                },
            };
        }
        WrOpcode::AtomicFetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            wr.opcode = o::IBV_WR_ATOMIC_FETCH_AND_ADD;
            wr.wr = ffi::ibv_send_wr__bindgen_ty_2 {
                atomic: ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                    remote_addr,
                    compare_add: add,
                    swap: 0,
                    rkey: rkey.0,
                },
            };
        }
        WrOpcode::SendWithInv { rkey } => {
            wr.opcode = o::IBV_WR_SEND_WITH_INV;
            wr.__bindgen_anon_1.invalidate_rkey = rkey.0;
        }
        WrOpcode::LocalInv { rkey } => {
            wr.opcode = o::IBV_WR_LOCAL_INV;
            wr.__bindgen_anon_1.invalidate_rkey = rkey.0;
        }
        // The window and region pointers are filled in by `build_send_wr`.
        WrOpcode::BindMw(_) => wr.opcode = o::IBV_WR_BIND_MW,
    }
    Ok(())
}

impl IbvDevice {
    /// The libibverbs form of `w` (without its SGE pointer and link), SGEs appended to
    /// `sges`; returns the WR and its SGE count.
    fn build_send_wr(
        &self,
        e: &QpEntry,
        w: &SendWr<'_>,
        sges: &mut Vec<ffi::ibv_sge>,
    ) -> Result<(ffi::ibv_send_wr, usize), PostError> {
        let start = sges.len();
        check_inline(w, e.cap.max_inline_data)?;
        match w.inline_data {
            Some(d) => {
                let length = u32::try_from(d.len()).map_err(|_| PostError::InlineTooLong {
                    len: d.len(),
                    max: e.cap.max_inline_data,
                })?;
                // The device copies inline data at post time; the slice outlives the call.
                sges.push(ffi::ibv_sge {
                    addr: d.as_ptr() as u64,
                    length,
                    lkey: 0,
                });
            }
            None => sges.extend(w.sg_list.iter().map(raw_sge)),
        }
        let n = sges.len() - start;
        // SAFETY: ibv_send_wr is a plain C struct (integers, pointers, unions of them);
        // all-zero bytes are a valid value.
        let mut r: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        r.wr_id = w.wr_id;
        r.num_sge = std::os::raw::c_int::try_from(n).map_err(|_| PostError::TooManySge {
            count: n,
            max: e.cap.max_send_sge,
        })?;
        let mut flags = w.send_flags.bits() & 0xF;
        if w.inline_data.is_some() {
            flags |= SendFlags::INLINE.bits();
        }
        r.send_flags = flags;
        set_opcode(&mut r, &w.opcode)?;
        if let WrOpcode::BindMw(b) = &w.opcode {
            let (mw, mr) = self.bind_ptrs(b)?;
            r.__bindgen_anon_2 = ffi::ibv_send_wr__bindgen_ty_4 {
                bind_mw: ffi::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
                    mw,
                    rkey: b.rkey.0,
                    bind_info: ffi::ibv_mw_bind_info {
                        mr,
                        addr: b.addr,
                        length: b.length,
                        mw_access_flags: b.access.bits(),
                    },
                },
            };
        }
        match e.qp_type {
            QpType::Ud => {
                let ud = w.ud.ok_or(PostError::InvalidWorkRequest(
                    "UD send without a destination",
                ))?;
                let ah = self.ah(e.pd, &ud.ah).map_err(|err| {
                    tracing::debug!("UD address handle: {err}");
                    PostError::InvalidWorkRequest("cannot create the address handle")
                })?;
                r.wr = ffi::ibv_send_wr__bindgen_ty_2 {
                    ud: ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
                        ah: ah.0,
                        remote_qpn: ud.remote_qpn.0,
                        remote_qkey: ud.remote_qkey,
                    },
                };
            }
            QpType::XrcSend => {
                let srqn = w.remote_srqn.ok_or(PostError::InvalidWorkRequest(
                    "XRC send without a remote SRQ",
                ))?;
                r.qp_type = ffi::ibv_send_wr__bindgen_ty_3 {
                    xrc: ffi::ibv_send_wr__bindgen_ty_3__bindgen_ty_1 { remote_srqn: srqn },
                };
            }
            _ => {}
        }
        Ok((r, n))
    }

    /// Posts `wrs` as one chain. A WR we cannot translate stops the chain there: the WRs
    /// before it are posted (as verbs does up to `bad_wr`) and its index is returned.
    pub(super) fn post_send(&self, qpn: Qpn, wrs: &[SendWr<'_>]) -> Result<(), (usize, PostError)> {
        if wrs.is_empty() {
            return Ok(());
        }
        let e = self.qp(qpn).ok_or((0, PostError::Destroyed))?;
        let mut sges = Vec::with_capacity(wrs.iter().map(|w| w.sg_list.len().max(1)).sum());
        let mut raw: Vec<ffi::ibv_send_wr> = Vec::with_capacity(wrs.len());
        let mut spans = Vec::with_capacity(wrs.len());
        let mut pending = None;
        for (i, w) in wrs.iter().enumerate() {
            let start = sges.len();
            match self.build_send_wr(&e, w, &mut sges) {
                Ok((r, n)) => {
                    raw.push(r);
                    spans.push((start, n));
                }
                Err(err) => {
                    pending = Some((i, err));
                    break;
                }
            }
        }
        if !raw.is_empty() {
            self.post_send_chain(&e, &mut raw, &mut sges, &spans)?;
        }
        match pending {
            Some(p) => Err(p),
            None => Ok(()),
        }
    }

    /// Links `raw` (SGEs in `sges` at `spans`) into a chain and posts it.
    fn post_send_chain(
        &self,
        e: &QpEntry,
        raw: &mut [ffi::ibv_send_wr],
        sges: &mut [ffi::ibv_sge],
        spans: &[(usize, usize)],
    ) -> Result<(), (usize, PostError)> {
        // Link the chain through raw pointers only (no references into the buffers are made
        // after these pointers are taken, so they stay valid).
        let base = sges.as_mut_ptr();
        let count = raw.len();
        let first = raw.as_mut_ptr();
        for (k, &(start, n)) in spans.iter().enumerate().take(count) {
            // SAFETY: `k < count == raw.len()`, so the element is in bounds, and no other
            // reference to it exists.
            let r = unsafe { &mut *first.add(k) };
            // `start + n <= sges.len()`, so the pointer is in bounds whenever `n > 0`.
            r.sg_list = if n == 0 {
                std::ptr::null_mut()
            } else {
                base.wrapping_add(start)
            };
            r.next = if k + 1 < count {
                first.wrapping_add(k + 1)
            } else {
                std::ptr::null_mut()
            };
        }
        // SAFETY: live QP (see `Ptr`); the ops table is filled at open and never changes.
        let Some(post) = (unsafe { (*(*e.qp.0).context).ops.post_send }) else {
            return Err((0, PostError::Destroyed));
        };
        let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: `raw` is a chain of `count` live WRs linked in order whose SGE pointers
        // point into `sges`; both buffers are borrowed (so alive and unmoved) for the whole
        // call, and inline data slices outlive it. `bad` is a live out-pointer.
        let rc = unsafe { post(e.qp.0, first, &raw mut bad) };
        if rc == 0 {
            return Ok(());
        }
        let idx = if bad.is_null() {
            0
        } else {
            (bad as usize)
                .checked_sub(first as usize)
                .map_or(0, |off| off / size_of::<ffi::ibv_send_wr>())
                .min(count - 1)
        };
        Err((idx, post_err(rc, "send", e.cap.max_send_wr)))
    }

    pub(super) fn post_recv(&self, qpn: Qpn, wr: &RecvWr<'_>) -> Result<(), PostError> {
        let e = self.qp(qpn).ok_or(PostError::Destroyed)?;
        let mut sges: Vec<ffi::ibv_sge> = wr.sg_list.iter().map(raw_sge).collect();
        let mut r = recv_wr(wr.wr_id, &mut sges, e.cap.max_recv_sge)?;
        // SAFETY: live QP; see `post_send`.
        let Some(post) = (unsafe { (*(*e.qp.0).context).ops.post_recv }) else {
            return Err(PostError::Destroyed);
        };
        let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: `r` is one live WR whose SGE pointer points into `sges`, alive until after
        // the call; `bad` is a live out-pointer.
        let rc = unsafe { post(e.qp.0, &raw mut r, &raw mut bad) };
        if rc != 0 {
            return Err(post_err(rc, "receive", e.cap.max_recv_wr));
        }
        Ok(())
    }

    pub(super) fn post_srq_recv(&self, srq: u32, wr: &RecvWr<'_>) -> Result<(), PostError> {
        let p = self.srq(srq).ok_or(PostError::Destroyed)?;
        let mut sges: Vec<ffi::ibv_sge> = wr.sg_list.iter().map(raw_sge).collect();
        let mut r = recv_wr(wr.wr_id, &mut sges, 0)?;
        // SAFETY: live SRQ; its context's ops table never changes.
        let Some(post) = (unsafe { (*(*p.0).context).ops.post_srq_recv }) else {
            return Err(PostError::Destroyed);
        };
        let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: as in `post_recv`.
        let rc = unsafe { post(p.0, &raw mut r, &raw mut bad) };
        if rc != 0 {
            return Err(post_err(rc, "receive", 0));
        }
        Ok(())
    }

    /// Creates a basic SRQ (the limit is armed by the caller).
    pub(super) fn create_srq(&self, pd: u32, max_wr: u32, max_sge: u32) -> Result<u32, VerbsError> {
        let (pdp, h) = {
            let mut t = self.t.lock();
            let pdp = *t
                .pds
                .get(&pd)
                .ok_or(VerbsError::NoSuchObject("protection domain"))?;
            // Above every 24-bit SRQ number, so never equal to an XRC SRQ's handle.
            let mut h = t.next_handle() | BASIC_SRQ_BASE;
            while t.srqs.contains_key(&h) {
                h = t.next_handle() | BASIC_SRQ_BASE;
            }
            (pdp, h)
        };
        let mut init = ffi::ibv_srq_init_attr {
            // The handle as an integer, reported back in SRQ async events.
            srq_context: h as usize as *mut std::os::raw::c_void,
            attr: ffi::ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit: 0,
            },
        };
        // SAFETY: live PD; `init` is live and fully initialised.
        let srq = unsafe { ffi::ibv_create_srq(pdp.0, &raw mut init) };
        if srq.is_null() {
            return Err(last_err("ibv_create_srq"));
        }
        self.t.lock().srqs.insert(h, Ptr(srq));
        Ok(h)
    }

    pub(super) fn destroy_srq(&self, srq: u32) -> Result<(), VerbsError> {
        let Some(p) = self.t.lock().srqs.remove(&srq) else {
            return Ok(());
        };
        // SAFETY: live SRQ removed from the table; QPs using it hold its public object, so
        // none is left. Destroyed once.
        let rc = unsafe { ffi::ibv_destroy_srq(p.0) };
        if rc != 0 {
            tracing::warn!(srq, rc, "ibv_destroy_srq failed; leaked");
            return Err(io_err("ibv_destroy_srq", rc));
        }
        Ok(())
    }

    pub(super) fn modify_srq(
        &self,
        srq: u32,
        max_wr: Option<u32>,
        limit: Option<u32>,
    ) -> Result<(), VerbsError> {
        let p = self.srq(srq).ok_or(VerbsError::NoSuchObject("SRQ"))?;
        let mut attr = ffi::ibv_srq_attr {
            max_wr: max_wr.unwrap_or(0),
            max_sge: 0,
            srq_limit: limit.unwrap_or(0),
        };
        let mut mask = 0;
        if max_wr.is_some() {
            mask |= ffi::IBV_SRQ_MAX_WR;
        }
        if limit.is_some() {
            mask |= ffi::IBV_SRQ_LIMIT;
        }
        if mask == 0 {
            return Ok(());
        }
        // SAFETY: live SRQ; `attr` is live and initialised.
        let rc = unsafe { ffi::ibv_modify_srq(p.0, &raw mut attr, mask as std::os::raw::c_int) };
        if rc != 0 {
            return Err(io_err("ibv_modify_srq", rc));
        }
        Ok(())
    }

    pub(super) fn query_srq(&self, srq: u32) -> Option<SrqState> {
        let p = self.srq(srq)?;
        let mut attr = ffi::ibv_srq_attr::default();
        // SAFETY: live SRQ; `attr` is a live out-struct.
        let rc = unsafe { ffi::ibv_query_srq(p.0, &raw mut attr) };
        if rc != 0 {
            return None;
        }
        Some(SrqState {
            max_wr: attr.max_wr,
            max_sge: attr.max_sge,
            srq_limit: attr.srq_limit,
            // libibverbs cannot report how many WQEs are posted (see `SrqState::posted`).
            posted: None,
        })
    }
}

/// One receive WR over `sges` (which must outlive its use).
fn recv_wr(wr_id: u64, sges: &mut [ffi::ibv_sge], max: u32) -> Result<ffi::ibv_recv_wr, PostError> {
    let num_sge = std::os::raw::c_int::try_from(sges.len()).map_err(|_| PostError::TooManySge {
        count: sges.len(),
        max,
    })?;
    Ok(ffi::ibv_recv_wr {
        wr_id,
        next: std::ptr::null_mut(),
        sg_list: if sges.is_empty() {
            std::ptr::null_mut()
        } else {
            sges.as_mut_ptr()
        },
        num_sge,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Lkey;

    #[test]
    fn inline_sends_longer_than_the_granted_limit_are_named() {
        let data = [7u8; 65];
        assert!(check_inline(&SendWr::send_inline(1, &data[..64]), 64).is_ok());
        assert!(matches!(
            check_inline(&SendWr::send_inline(1, &data), 64),
            Err(PostError::InlineTooLong { len: 65, max: 64 })
        ));
        // A QP granted no inline space (0) takes no inline send at all.
        assert!(matches!(
            check_inline(&SendWr::send_inline(1, &data[..1]), 0),
            Err(PostError::InlineTooLong { len: 1, max: 0 })
        ));
        // The INLINE flag on SGEs counts their total length; without it SGEs are not inline.
        let sges = [
            Sge {
                addr: 0x1000,
                length: 40,
                lkey: Lkey(1),
            },
            Sge {
                addr: 0x2000,
                length: 40,
                lkey: Lkey(1),
            },
        ];
        assert!(check_inline(&SendWr::send(2, &sges), 64).is_ok());
        assert!(matches!(
            check_inline(&SendWr::send(2, &sges).flags(SendFlags::INLINE), 64),
            Err(PostError::InlineTooLong { len: 80, max: 64 })
        ));
    }
}
