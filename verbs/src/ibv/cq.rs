//! Completion queues on the device's completion channel, and the work-completion
//! conversion.

use std::sync::Arc;

use super::{IbvDevice, Ptr, ffi, last_err};
use crate::error::VerbsError;
use crate::os::ChannelInner;
use crate::types::{Qpn, WcFlags, WcOpcode, WcStatus, WorkCompletion};

impl IbvDevice {
    pub(super) fn create_cq(
        &self,
        cqe: usize,
        channel: &Arc<ChannelInner>,
    ) -> Result<u32, VerbsError> {
        if self.chan.is_null() {
            return Err(self.unsupported("CQs: this device has no completion channel"));
        }
        let n = std::os::raw::c_int::try_from(cqe)
            .map_err(|_| VerbsError::InvalidArgument(format!("CQ size {cqe}")))?;
        let h = self.t.lock().next_handle();
        self.shared
            .channels
            .lock()
            .insert(h, Arc::downgrade(channel));
        if let Some(cq) = self.create_cq_tm(n, h) {
            let mut t = self.t.lock();
            t.cqs.insert(h, Ptr(cq));
            t.cq_ex.insert(h);
            return Ok(h);
        }
        // SAFETY: `ctx` and `chan` are live until `Drop`, which destroys CQs first. The CQ
        // context is the handle as an integer, never dereferenced.
        let cq = unsafe {
            ffi::ibv_create_cq(
                self.ctx,
                n,
                h as usize as *mut std::os::raw::c_void,
                self.chan,
                0,
            )
        };
        if cq.is_null() {
            let e = last_err("ibv_create_cq");
            self.shared.channels.lock().remove(&h);
            return Err(e);
        }
        self.t.lock().cqs.insert(h, Ptr(cq));
        Ok(h)
    }

    /// On a device with tag matching: an extended CQ whose completions carry the tag and
    /// application context (`IBV_WC_EX_WITH_TM_INFO`), as the base `ibv_cq` it starts with.
    /// `None` elsewhere, or when the device refuses it (the caller makes a plain one).
    fn create_cq_tm(&self, cqe: std::os::raw::c_int, h: u32) -> Option<*mut ffi::ibv_cq> {
        if self.max_num_tags() == 0 {
            return None;
        }
        let ctx = self.ctx;
        let create = super::xrc::op!(ctx, create_cq_ex, super::xrc::CreateCqEx)?;
        // SAFETY: a plain C struct of integers and pointers; all-zero bytes are valid.
        let mut attr: ffi::ibv_cq_init_attr_ex = unsafe { std::mem::zeroed() };
        attr.cqe = u32::try_from(cqe).ok()?;
        attr.cq_context = h as usize as *mut std::os::raw::c_void;
        attr.channel = self.chan;
        attr.wc_flags = u64::from(
            ffi::IBV_WC_EX_WITH_BYTE_LEN
                | ffi::IBV_WC_EX_WITH_IMM
                | ffi::IBV_WC_EX_WITH_QP_NUM
                | ffi::IBV_WC_EX_WITH_SRC_QP
                | ffi::IBV_WC_EX_WITH_SLID
                | ffi::IBV_WC_EX_WITH_TM_INFO,
        );
        // SAFETY: `ctx` and `chan` are live; `attr` is live and initialised; the op was
        // checked present.
        let cq = unsafe { create(ctx, &raw mut attr) };
        if cq.is_null() {
            tracing::debug!(device = %self.name, "ibv_create_cq_ex with TM info refused");
            return None;
        }
        // `ibv_cq_ex_to_cq`: an extended CQ begins with the fields of `struct ibv_cq`.
        Some(cq.cast::<ffi::ibv_cq>())
    }

    /// Polls an extended CQ (`ibv_start_poll` / `ibv_next_poll` / `ibv_end_poll`).
    fn poll_cq_ex(&self, p: Ptr<ffi::ibv_cq>, wc: &mut [WorkCompletion]) -> usize {
        if wc.is_empty() {
            return 0;
        }
        let cq = p.0.cast::<ffi::ibv_cq_ex>();
        // SAFETY: a live CQ created by `create_cq_tm` (so an `ibv_cq_ex`); its function
        // pointers are set at creation and never change.
        let x = unsafe { &*cq };
        let (Some(start), Some(next), Some(end)) = (x.start_poll, x.next_poll, x.end_poll) else {
            return 0;
        };
        let mut attr = ffi::ibv_poll_cq_attr { comp_mask: 0 };
        // SAFETY: live CQ; `attr` is a live attribute struct.
        if unsafe { start(cq, &raw mut attr) } != 0 {
            // ENOENT: empty (any other error: nothing to read either).
            return 0;
        }
        let mut n = 0;
        loop {
            if let Some(slot) = wc.get_mut(n) {
                // SAFETY: a polling session is open on this live CQ and positioned on an
                // entry (after a successful start or next).
                *slot = unsafe { read_ex(cq) };
                n += 1;
            }
            // SAFETY: as above; a further entry only when the caller has room for it.
            if n >= wc.len() || unsafe { next(cq) } != 0 {
                break;
            }
        }
        // SAFETY: closes the polling session opened above.
        unsafe { end(cq) };
        n
    }

    pub(super) fn destroy_cq(&self, cq: u32) {
        let p = {
            let mut t = self.t.lock();
            t.cq_ex.remove(&cq);
            t.cqs.remove(&cq)
        };
        if let Some(p) = p {
            // SAFETY: live CQ removed from the table; its QPs/SRQs hold the public CQ, so none
            // is left. Events are acknowledged by the event thread as they arrive.
            let rc = unsafe { ffi::ibv_destroy_cq(p.0) };
            if rc != 0 {
                tracing::warn!(device = %self.name, cq, rc, "ibv_destroy_cq failed; leaked");
            }
        }
        self.shared.channels.lock().remove(&cq);
    }

    pub(super) fn poll_cq(&self, cq: u32, wc: &mut [WorkCompletion]) -> usize {
        // (One look at the tables per poll: this is the hot path.)
        let (p, ex) = {
            let t = self.t.lock();
            let Some(&p) = t.cqs.get(&cq) else {
                return 0;
            };
            (p, !t.cq_ex.is_empty() && t.cq_ex.contains(&cq))
        };
        if ex {
            return self.poll_cq_ex(p, wc);
        }
        // SAFETY: `p` is a live CQ (see `Ptr`); its context's ops table is filled by the
        // provider at open and never changes.
        let Some(poll) = (unsafe { (*(*p.0).context).ops.poll_cq }) else {
            return 0;
        };
        let mut buf = [RawWc::default(); 16];
        let mut done = 0;
        while done < wc.len() {
            let want = (wc.len() - done).min(buf.len());
            // SAFETY: `buf` holds at least `want` entries laid out as `struct ibv_wc` (checked
            // at compile time below); the CQ is live.
            let n = unsafe { poll(p.0, want as std::os::raw::c_int, buf.as_mut_ptr().cast()) };
            let Ok(n) = usize::try_from(n) else {
                tracing::warn!(device = %self.name, cq, rc = n, "ibv_poll_cq failed");
                break;
            };
            let n = n.min(want);
            for (dst, src) in wc[done..done + n].iter_mut().zip(&buf[..n]) {
                *dst = src.to_wc();
            }
            done += n;
            if n < want {
                break;
            }
        }
        done
    }

    pub(super) fn req_notify_cq(&self, cq: u32, solicited_only: bool) {
        let Some(p) = self.cq(cq) else {
            return;
        };
        // SAFETY: live CQ; see `poll_cq`.
        let Some(notify) = (unsafe { (*(*p.0).context).ops.req_notify_cq }) else {
            return;
        };
        // SAFETY: live CQ; the call only arms it.
        let rc = unsafe { notify(p.0, std::os::raw::c_int::from(solicited_only)) };
        if rc != 0 {
            tracing::warn!(device = %self.name, cq, rc, "ibv_req_notify_cq failed");
        }
    }
}

// `ibv_cq_ex_to_cq` is a cast: an extended CQ begins with the fields of `struct ibv_cq`.
const _: () = {
    use std::mem::offset_of;
    assert!(offset_of!(ffi::ibv_cq_ex, context) == offset_of!(ffi::ibv_cq, context));
    assert!(offset_of!(ffi::ibv_cq_ex, channel) == offset_of!(ffi::ibv_cq, channel));
    assert!(offset_of!(ffi::ibv_cq_ex, cq_context) == offset_of!(ffi::ibv_cq, cq_context));
    assert!(offset_of!(ffi::ibv_cq_ex, handle) == offset_of!(ffi::ibv_cq, handle));
    assert!(offset_of!(ffi::ibv_cq_ex, cqe) == offset_of!(ffi::ibv_cq, cqe));
    assert!(offset_of!(ffi::ibv_cq_ex, mutex) == offset_of!(ffi::ibv_cq, mutex));
    assert!(offset_of!(ffi::ibv_cq_ex, cond) == offset_of!(ffi::ibv_cq, cond));
    assert!(
        offset_of!(ffi::ibv_cq_ex, comp_events_completed)
            == offset_of!(ffi::ibv_cq, comp_events_completed)
    );
    assert!(
        offset_of!(ffi::ibv_cq_ex, async_events_completed)
            == offset_of!(ffi::ibv_cq, async_events_completed)
    );
};

/// The completion an extended CQ is positioned on.
///
/// # Safety
/// `cq` is a live extended CQ created with the flags of `create_cq_tm`, inside a polling
/// session positioned on an entry.
unsafe fn read_ex(cq: *mut ffi::ibv_cq_ex) -> WorkCompletion {
    // SAFETY: as the function's contract states; every reader was asked for at creation
    // (a missing one reads as zero).
    unsafe {
        let x = &*cq;
        let rd =
            |f: Option<unsafe extern "C" fn(*mut ffi::ibv_cq_ex) -> u32>| f.map_or(0, |f| f(cq));
        if x.status != ffi::ibv_wc_status::IBV_WC_SUCCESS {
            // Only these are defined for an error completion (as for `ibv_wc`).
            return WorkCompletion {
                wr_id: x.wr_id,
                status: WcStatus::from_code(x.status),
                qp_num: Qpn(rd(x.read_qp_num)),
                vendor_err: rd(x.read_vendor_err),
                ..WorkCompletion::EMPTY
            };
        }
        let opcode = x.read_opcode.map_or(u32::MAX, |f| f(cq));
        let flags = WcFlags(x.read_wc_flags.map_or(0, |f| f(cq)) & 0x7F);
        let imm = x.read_imm_data.map_or(0, |f| f(cq));
        let mut tm = crate::types::TmInfo::default();
        if opcode == ffi::ibv_wc_opcode::IBV_WC_TM_RECV
            && let Some(f) = x.read_tm_info
        {
            let mut info = ffi::ibv_wc_tm_info { tag: 0, priv_: 0 };
            f(cq, &raw mut info);
            tm = crate::types::TmInfo {
                tag: info.tag,
                app_ctx: info.priv_,
            };
        }
        WorkCompletion {
            wr_id: x.wr_id,
            status: WcStatus::from_code(x.status),
            opcode: WcOpcode::from_code(opcode),
            byte_len: rd(x.read_byte_len),
            // As `RawWc::to_wc`: the immediate in rdmx's convention, an invalidated key as is.
            imm_data: if flags.contains(WcFlags::WITH_IMM) {
                u32::from_be(imm)
            } else {
                imm
            },
            qp_num: Qpn(rd(x.read_qp_num)),
            src_qp: Qpn(rd(x.read_src_qp)),
            wc_flags: flags,
            vendor_err: rd(x.read_vendor_err),
            slid: u16::try_from(rd(x.read_slid)).unwrap_or(0),
            tm,
        }
    }
}

/// `struct ibv_wc` from verbs.h. ibverbs-sys declares its own copy with private fields, so
/// we poll into this mirror; the layout is checked against theirs below.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RawWc {
    wr_id: u64,
    status: u32,
    opcode: u32,
    vendor_err: u32,
    byte_len: u32,
    /// `imm_data` (big-endian) or `invalidated_rkey`.
    imm_data: u32,
    qp_num: u32,
    src_qp: u32,
    wc_flags: u32,
    pkey_index: u16,
    slid: u16,
    sl: u8,
    dlid_path_bits: u8,
}

const _: () = assert!(size_of::<RawWc>() == size_of::<ffi::ibv_wc>());
const _: () = assert!(align_of::<RawWc>() == align_of::<ffi::ibv_wc>());
const _: () = assert!(size_of::<RawWc>() == 48);

impl RawWc {
    fn to_wc(self) -> WorkCompletion {
        // GRH, WITH_IMM, IP_CSUM_OK, WITH_INV and the tag-matching flags (TM_SYNC_REQ,
        // TM_MATCH, TM_DATA_VALID).
        let flags = WcFlags(self.wc_flags & 0x7F);
        WorkCompletion {
            wr_id: self.wr_id,
            status: WcStatus::from_code(self.status),
            // Unknown codes (driver-specific ones) stay `Other(n)`, never a guess.
            opcode: WcOpcode::from_code(self.opcode),
            byte_len: self.byte_len,
            // libibverbs keeps imm_data in network byte order; rdmx's `imm_data` is the
            // big-endian wire word read as a number (as the soft provider delivers it).
            imm_data: if flags.contains(WcFlags::WITH_IMM) {
                u32::from_be(self.imm_data)
            } else {
                self.imm_data
            },
            qp_num: Qpn(self.qp_num),
            src_qp: Qpn(self.src_qp),
            wc_flags: flags,
            vendor_err: self.vendor_err,
            slid: self.slid,
            // (The tag and context of a tag-matching receive need an extended CQ.)
            tm: crate::types::TmInfo::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_libibverbs_opcode_maps_to_its_variant() {
        use ffi::ibv_wc_opcode as o;
        let table = [
            (o::IBV_WC_SEND, WcOpcode::Send),
            (o::IBV_WC_RDMA_WRITE, WcOpcode::RdmaWrite),
            (o::IBV_WC_RDMA_READ, WcOpcode::RdmaRead),
            (o::IBV_WC_COMP_SWAP, WcOpcode::CompSwap),
            (o::IBV_WC_FETCH_ADD, WcOpcode::FetchAdd),
            (o::IBV_WC_BIND_MW, WcOpcode::BindMw),
            (o::IBV_WC_LOCAL_INV, WcOpcode::LocalInv),
            (o::IBV_WC_TSO, WcOpcode::Tso),
            (o::IBV_WC_FLUSH, WcOpcode::Flush),
            (o::IBV_WC_ATOMIC_WRITE, WcOpcode::AtomicWrite),
            (o::IBV_WC_RECV, WcOpcode::Recv),
            (o::IBV_WC_RECV_RDMA_WITH_IMM, WcOpcode::RecvRdmaWithImm),
            (o::IBV_WC_TM_ADD, WcOpcode::TmAdd),
            (o::IBV_WC_TM_DEL, WcOpcode::TmDel),
            (o::IBV_WC_TM_SYNC, WcOpcode::TmSync),
            (o::IBV_WC_TM_RECV, WcOpcode::TmRecv),
            (o::IBV_WC_TM_NO_TAG, WcOpcode::TmNoTag),
            // Their meaning is the provider's: kept as numbers.
            (o::IBV_WC_DRIVER1, WcOpcode::Other(o::IBV_WC_DRIVER1)),
            (o::IBV_WC_DRIVER2, WcOpcode::Other(o::IBV_WC_DRIVER2)),
            (o::IBV_WC_DRIVER3, WcOpcode::Other(o::IBV_WC_DRIVER3)),
        ];
        for (code, want) in table {
            let wc = RawWc {
                opcode: code,
                ..RawWc::default()
            };
            assert_eq!(wc.to_wc().opcode, want, "opcode {code}");
            assert_eq!(want.code(), code);
        }
    }

    #[test]
    fn every_libibverbs_status_maps_to_a_named_variant() {
        use ffi::ibv_wc_status as st;
        let codes = [
            st::IBV_WC_SUCCESS,
            st::IBV_WC_LOC_LEN_ERR,
            st::IBV_WC_LOC_QP_OP_ERR,
            st::IBV_WC_LOC_EEC_OP_ERR,
            st::IBV_WC_LOC_PROT_ERR,
            st::IBV_WC_WR_FLUSH_ERR,
            st::IBV_WC_MW_BIND_ERR,
            st::IBV_WC_BAD_RESP_ERR,
            st::IBV_WC_LOC_ACCESS_ERR,
            st::IBV_WC_REM_INV_REQ_ERR,
            st::IBV_WC_REM_ACCESS_ERR,
            st::IBV_WC_REM_OP_ERR,
            st::IBV_WC_RETRY_EXC_ERR,
            st::IBV_WC_RNR_RETRY_EXC_ERR,
            st::IBV_WC_LOC_RDD_VIOL_ERR,
            st::IBV_WC_REM_INV_RD_REQ_ERR,
            st::IBV_WC_REM_ABORT_ERR,
            st::IBV_WC_INV_EECN_ERR,
            st::IBV_WC_INV_EEC_STATE_ERR,
            st::IBV_WC_FATAL_ERR,
            st::IBV_WC_RESP_TIMEOUT_ERR,
            st::IBV_WC_GENERAL_ERR,
            st::IBV_WC_TM_ERR,
            st::IBV_WC_TM_RNDV_INCOMPLETE,
        ];
        for code in codes {
            let wc = RawWc {
                status: code,
                ..RawWc::default()
            };
            let s = wc.to_wc().status;
            assert!(!matches!(s, WcStatus::Other(_)), "status {code} unnamed");
            assert_eq!(s.code(), code);
        }
        assert_eq!(
            RawWc {
                status: st::IBV_WC_RETRY_EXC_ERR,
                ..RawWc::default()
            }
            .to_wc()
            .status,
            WcStatus::RetryExcErr
        );
    }

    #[test]
    fn unknown_codes_are_kept_as_other() {
        let wc = RawWc {
            status: 4000,
            opcode: 77,
            ..RawWc::default()
        }
        .to_wc();
        assert_eq!(wc.status, WcStatus::Other(4000));
        assert_eq!(wc.opcode, WcOpcode::Other(77));
        assert!(!wc.opcode.is_recv());
        let wc = RawWc {
            opcode: 0xC0,
            ..RawWc::default()
        }
        .to_wc();
        assert_eq!(wc.opcode, WcOpcode::Other(0xC0));
        assert!(wc.opcode.is_recv());
    }

    #[test]
    fn immediate_data_is_read_in_network_order() {
        let wc = RawWc {
            opcode: ffi::ibv_wc_opcode::IBV_WC_RECV,
            wc_flags: WcFlags::WITH_IMM.bits(),
            imm_data: 0x1234_5678u32.to_be(),
            ..RawWc::default()
        }
        .to_wc();
        assert_eq!(wc.imm(), Some(0x1234_5678));
    }
}
