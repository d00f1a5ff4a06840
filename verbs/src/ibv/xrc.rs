//! XRC: domains, XRC SRQs and XRC target QPs.
//!
//! `ibv_open_xrcd`, `ibv_create_srq_ex`, `ibv_get_srq_num` and `ibv_create_qp_ex` are
//! `static inline` in verbs.h: they call through `struct verbs_context`, which wraps the
//! `ibv_context` and which ibverbs-sys does not bind. We mirror only the tail of that struct
//! (the fields right before the embedded `ibv_context`, whose layout rdma-core keeps fixed
//! because the struct grows at its start) and perform the same checks as the
//! `verbs_get_ctx_op` macro: the context is extended (`abi_compat == UINTPTR_MAX`), the
//! provider's `sz` covers the op, and the op is set.

use std::os::raw::{c_int, c_void};

use super::qp::cap_from;
use super::{IbvDevice, Ptr, QpEntry, ffi, last_err};
use crate::error::VerbsError;
use crate::types::{QpType, Qpn};
use crate::vocab::QpConfig;

type CreateQpEx =
    unsafe extern "C" fn(*mut ffi::ibv_context, *mut ffi::ibv_qp_init_attr_ex) -> *mut ffi::ibv_qp;
type GetSrqNum = unsafe extern "C" fn(*mut ffi::ibv_srq, *mut u32) -> c_int;
pub(super) type CreateSrqEx = unsafe extern "C" fn(
    *mut ffi::ibv_context,
    *mut ffi::ibv_srq_init_attr_ex,
) -> *mut ffi::ibv_srq;
type OpenXrcd =
    unsafe extern "C" fn(*mut ffi::ibv_context, *mut ffi::ibv_xrcd_init_attr) -> *mut ffi::ibv_xrcd;
type CloseXrcd = unsafe extern "C" fn(*mut ffi::ibv_xrcd) -> c_int;

pub(super) type PostSrqOps = unsafe extern "C" fn(
    *mut ffi::ibv_srq,
    *mut ffi::ibv_ops_wr,
    *mut *mut ffi::ibv_ops_wr,
) -> c_int;
pub(super) type CreateCqEx = unsafe extern "C" fn(
    *mut ffi::ibv_context,
    *mut ffi::ibv_cq_init_attr_ex,
) -> *mut ffi::ibv_cq_ex;
pub(super) type QueryDeviceEx = unsafe extern "C" fn(
    *mut ffi::ibv_context,
    *const c_void,
    *mut ffi::ibv_device_attr_ex,
    usize,
) -> c_int;

/// The last fields of `struct verbs_context` (verbs.h), from `post_srq_ops` on, which end
/// right where the embedded `struct ibv_context` begins. Only used for its layout (offsets
/// and size); fields rdmx does not call are plain pointer-sized words.
#[repr(C)]
#[allow(dead_code)]
pub(super) struct VerbsCtxTail {
    pub(super) post_srq_ops: Option<PostSrqOps>,
    destroy_rwq_ind_table: usize,
    create_rwq_ind_table: usize,
    destroy_wq: usize,
    modify_wq: usize,
    create_wq: usize,
    query_rt_values: usize,
    pub(super) create_cq_ex: Option<CreateCqEx>,
    priv_: usize,
    pub(super) query_device_ex: Option<QueryDeviceEx>,
    ibv_destroy_flow: usize,
    abi_placeholder2: usize,
    ibv_create_flow: usize,
    abi_placeholder1: usize,
    open_qp: usize,
    create_qp_ex: Option<CreateQpEx>,
    get_srq_num: Option<GetSrqNum>,
    pub(super) create_srq_ex: Option<CreateSrqEx>,
    open_xrcd: Option<OpenXrcd>,
    close_xrcd: Option<CloseXrcd>,
    abi_placeholder3: u64,
    /// Size of the provider's `verbs_context` (checked against the op's distance to the end).
    sz: usize,
}

/// Reads the extended op at offset `off` of the tail, as `verbs_get_ctx_op` does: only for
/// an extended context whose `sz` covers the op. `F` must be the op's `Option<fn>` type.
pub(super) fn ctx_op<F: Copy>(ctx: *mut ffi::ibv_context, off: usize) -> Option<F> {
    // The mirror is only known to match the C layout (no padding between the fields, or
    // between `sz` and the context) where pointers are 8 bytes.
    if size_of::<usize>() != 8 || off >= size_of::<VerbsCtxTail>() {
        return None;
    }
    // SAFETY: `ctx` is an open context; `abi_compat` is a plain pointer field.
    if unsafe { (*ctx).abi_compat } as usize != usize::MAX {
        return None;
    }
    // An extended context is the last field of a `verbs_context`: the tail (all
    // pointer-sized fields, so no padding) ends right before it.
    let base = ctx.cast::<u8>().wrapping_sub(size_of::<VerbsCtxTail>());
    let sz_off = std::mem::offset_of!(VerbsCtxTail, sz);
    // SAFETY: `sz` sits immediately before the context in every extended context (verbs.h:
    // "Must be immediately before struct ibv_context"), inside the same live allocation.
    let sz = unsafe { base.add(sz_off).cast::<usize>().read() };
    if sz < size_of::<VerbsCtxTail>() - off + size_of::<ffi::ibv_context>() {
        return None;
    }
    // SAFETY: `sz` says the provider's verbs_context extends back to this op, so the field
    // is inside the live allocation; the caller names the field's type as `F`.
    Some(unsafe { base.add(off).cast::<F>().read() })
}

const _: () = assert!(
    size_of::<usize>() != 8 || size_of::<VerbsCtxTail>() == 22 * 8,
    "verbs_context tail mirror has padding"
);

/// Reads op `$field` of the context's `verbs_context` (see `ctx_op`).
macro_rules! op {
    ($ctx:expr, $field:ident, $ty:ty) => {
        $crate::ibv::xrc::ctx_op::<Option<$ty>>(
            $ctx,
            std::mem::offset_of!($crate::ibv::xrc::VerbsCtxTail, $field),
        )
        .flatten()
    };
}
pub(super) use op;

pub(super) fn not_supported() -> VerbsError {
    VerbsError::Unsupported("XRC: the device's provider lacks the extended verbs op")
}

impl IbvDevice {
    pub(super) fn open_xrcd(&self) -> Result<u32, VerbsError> {
        // No file: fd -1 and O_CREAT make a new, process-private domain (ibv_open_xrcd(3)).
        self.open_xrcd_fd(-1)
    }

    /// Opens the domain tied to the file open on `fd` (created with the file's inode if
    /// none is yet; `-1`: a private domain). The kernel keeps the association, so `fd` may
    /// be closed afterwards.
    pub(super) fn open_xrcd_fd(&self, fd: c_int) -> Result<u32, VerbsError> {
        let ctx = self.ctx;
        let open = op!(ctx, open_xrcd, OpenXrcd).ok_or_else(not_supported)?;
        let mut init = ffi::ibv_xrcd_init_attr {
            comp_mask: ffi::IBV_XRCD_INIT_ATTR_FD | ffi::IBV_XRCD_INIT_ATTR_OFLAGS,
            fd,
            oflags: libc::O_CREAT,
        };
        // SAFETY: `ctx` is open and `init` a live, initialised attribute struct; the op was
        // checked present for this context.
        let x = unsafe { open(ctx, &raw mut init) };
        if x.is_null() {
            return Err(last_err("ibv_open_xrcd"));
        }
        let mut t = self.t.lock();
        let h = t.next_handle();
        t.xrcds.insert(h, Ptr(x));
        Ok(h)
    }

    /// Closes an XRC domain (only from `Drop`, after its SRQs and QPs).
    pub(super) fn close_xrcd(&self, x: Ptr<ffi::ibv_xrcd>) -> c_int {
        let Some(close) = op!(self.ctx, close_xrcd, CloseXrcd) else {
            return -1;
        };
        // SAFETY: `x` is a live domain opened on this context whose SRQs and QPs are gone;
        // closed once.
        unsafe { close(x.0) }
    }

    /// Creates an XRC SRQ; its handle is its real SRQ number (what senders name).
    pub(super) fn create_xrc_srq(
        &self,
        pd: u32,
        (xrcd, cq): (u32, u32),
        max_wr: u32,
        max_sge: u32,
    ) -> Result<u32, VerbsError> {
        let ctx = self.ctx;
        let create = op!(ctx, create_srq_ex, CreateSrqEx).ok_or_else(not_supported)?;
        let get_num = op!(ctx, get_srq_num, GetSrqNum).ok_or_else(not_supported)?;
        let (pdp, xp, cqp) = {
            let t = self.t.lock();
            let pdp = *t
                .pds
                .get(&pd)
                .ok_or(VerbsError::NoSuchObject("protection domain"))?;
            let xp = *t
                .xrcds
                .get(&xrcd)
                .ok_or(VerbsError::NoSuchObject("XRC domain"))?;
            let cqp = *t
                .cqs
                .get(&cq)
                .ok_or(VerbsError::NoSuchObject("completion queue"))?;
            (pdp, xp, cqp)
        };
        // SAFETY: a plain C struct of integers and pointers; all-zero bytes are valid.
        let mut init: ffi::ibv_srq_init_attr_ex = unsafe { std::mem::zeroed() };
        init.attr = ffi::ibv_srq_attr {
            max_wr,
            max_sge,
            srq_limit: 0,
        };
        init.comp_mask = ffi::IBV_SRQ_INIT_ATTR_TYPE
            | ffi::IBV_SRQ_INIT_ATTR_PD
            | ffi::IBV_SRQ_INIT_ATTR_XRCD
            | ffi::IBV_SRQ_INIT_ATTR_CQ;
        init.srq_type = ffi::IBV_SRQT_XRC;
        init.pd = pdp.0;
        init.xrcd = xp.0;
        init.cq = cqp.0;
        // SAFETY: `ctx`, PD, XRCD and CQ are live; `init` is live and initialised; the op
        // was checked present.
        let srq = unsafe { create(ctx, &raw mut init) };
        if srq.is_null() {
            return Err(last_err("ibv_create_srq_ex"));
        }
        let mut num = 0u32;
        // SAFETY: `srq` was just created; `num` is a live out-value.
        let rc = unsafe { get_num(srq, &raw mut num) };
        if rc != 0 || num >= super::post::BASIC_SRQ_BASE {
            // SAFETY: the SRQ was just created and nothing else refers to it.
            let drc = unsafe { ffi::ibv_destroy_srq(srq) };
            if drc != 0 {
                tracing::warn!(rc = drc, "ibv_destroy_srq failed; leaked");
            }
            return Err(VerbsError::Io {
                op: "ibv_get_srq_num",
                error: std::io::Error::from_raw_os_error(if rc > 0 { rc } else { libc::EIO }),
            });
        }
        // SAFETY: live SRQ not yet visible to any other thread of ours: set its context to
        // the handle reported in async events (the library only hands it back). Its limit
        // is not armed yet, so no SRQ event can be read concurrently.
        unsafe { (*srq).srq_context = num as usize as *mut c_void };
        self.t.lock().srqs.insert(num, Ptr(srq));
        Ok(num)
    }

    /// Creates an XRC target QP in the domain of `cfg.xrcd`.
    pub(super) fn create_xrc_target(&self, cfg: &QpConfig) -> Result<Qpn, VerbsError> {
        let ctx = self.ctx;
        let create = op!(ctx, create_qp_ex, CreateQpEx).ok_or_else(not_supported)?;
        let xrcd = cfg.xrcd.ok_or(VerbsError::InvalidArgument(
            "XRC target QP without domain".into(),
        ))?;
        let xp = *self
            .t
            .lock()
            .xrcds
            .get(&xrcd)
            .ok_or(VerbsError::NoSuchObject("XRC domain"))?;
        // SAFETY: a plain C struct of integers, pointers and nested plain structs; all-zero
        // bytes are valid.
        let mut init: ffi::ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        init.qp_type = ffi::ibv_qp_type::IBV_QPT_XRC_RECV;
        init.comp_mask = ffi::IBV_QP_INIT_ATTR_XRCD;
        init.xrcd = xp.0;
        // SAFETY: `ctx` and the XRCD are live; `init` is live and initialised; the op was
        // checked present.
        let qp = unsafe { create(ctx, &raw mut init) };
        if qp.is_null() {
            return Err(last_err("ibv_create_qp_ex"));
        }
        // SAFETY: non-null QP just created.
        let qpn = unsafe { (*qp).qp_num };
        let entry = QpEntry {
            qp: Ptr(qp),
            pd: cfg.pd,
            qp_type: QpType::XrcRecv,
            // What the library wrote back into `init` (a target QP has no queues of its
            // own, so all zeros on the providers we know of).
            cap: cap_from(&init.cap),
            qpx: None,
        };
        self.t.lock().qps.insert(qpn, entry);
        Ok(Qpn(qpn))
    }

    /// `ibv_create_qp_ex` with `init` (which the call updates).
    pub(super) fn create_qp_ex(
        &self,
        init: &mut ffi::ibv_qp_init_attr_ex,
    ) -> Result<*mut ffi::ibv_qp, VerbsError> {
        let ctx = self.ctx;
        let create = op!(ctx, create_qp_ex, CreateQpEx).ok_or_else(not_supported)?;
        // SAFETY: `ctx` is live, `init` is a live, initialised attribute struct whose
        // pointers (PD, CQs, SRQ) name live objects; the op was checked present.
        let qp = unsafe { create(ctx, init) };
        if qp.is_null() {
            return Err(last_err("ibv_create_qp_ex"));
        }
        Ok(qp)
    }
}
