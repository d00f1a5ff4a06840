//! The handle tables: every libibverbs object of a device by rdmx handle, and their
//! teardown.

use std::collections::HashMap;
use std::fmt;

use super::{IbvDevice, ffi};
use crate::types::{AhAttr, QpCap, QpType};

/// A raw libibverbs object pointer kept in a handle table.
pub(super) struct Ptr<T>(pub(super) *mut T);

impl<T> Clone for Ptr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Ptr<T> {}

impl<T> fmt::Debug for Ptr<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:p}", self.0)
    }
}

// SAFETY: libibverbs objects may be used from any thread (the library and providers lock
// internally); a `Ptr` is only dereferenced or passed to libibverbs while the object is in
// its handle table, and the public objects guarantee a handle is not destroyed while a call
// using it runs (every call goes through `&self` of the owning object, destruction through
// its `Drop`).
unsafe impl<T> Send for Ptr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Ptr<T> {}

/// A queue pair and what posting needs to know about it.
#[derive(Debug, Clone, Copy)]
pub(super) struct QpEntry {
    pub(super) qp: Ptr<ffi::ibv_qp>,
    pub(super) pd: u32,
    pub(super) qp_type: QpType,
    pub(super) cap: QpCap,
    /// The extended QP of one created with send ops (`ibv_wr_*` posting), else `None`.
    pub(super) qpx: Option<Ptr<ffi::ibv_qp_ex>>,
}

/// Every object created on the device, by rdmx handle. Destroyed children are removed by
/// their `destroy_*` call; whatever is left is destroyed in `Drop` children first.
#[derive(Debug, Default)]
pub(super) struct Tables {
    pub(super) pds: HashMap<u32, Ptr<ffi::ibv_pd>>,
    /// lkey -> MR.
    pub(super) mrs: HashMap<u32, Ptr<ffi::ibv_mr>>,
    pub(super) cqs: HashMap<u32, Ptr<ffi::ibv_cq>>,
    /// CQs created with `ibv_create_cq_ex` (tag-matching devices: their completions carry
    /// the tag), polled through `ibv_start_poll` (see `cq.rs`).
    pub(super) cq_ex: std::collections::HashSet<u32>,
    /// QPN -> QP.
    pub(super) qps: HashMap<u32, QpEntry>,
    /// Basic SRQs: `BASIC_SRQ_BASE | n`; XRC SRQs: their real SRQ number.
    pub(super) srqs: HashMap<u32, Ptr<ffi::ibv_srq>>,
    pub(super) xrcds: HashMap<u32, Ptr<ffi::ibv_xrcd>>,
    /// Memory windows by handle.
    pub(super) mws: HashMap<u32, Ptr<ffi::ibv_mw>>,
    /// Regions dropped while windows were bound to them (see `mw.rs`).
    pub(super) zombies: Vec<super::mw::Zombie>,
    /// Address handles of UD sends, cached by (PD, path) until the device closes.
    pub(super) ahs: HashMap<(u32, AhAttr), Ptr<ffi::ibv_ah>>,
    next: u32,
}

impl Tables {
    /// A fresh handle for PDs, CQs and SRQs (never 0, never reused).
    pub(super) fn next_handle(&mut self) -> u32 {
        self.next = self.next.wrapping_add(1).max(1);
        self.next
    }
}

impl IbvDevice {
    /// Destroys whatever the public objects left, children first (QPs, AHs, SRQs, XRC domains,
    /// CQs, MRs, PDs). A failed destroy is logged and the object leaked.
    pub(super) fn destroy_all(&self) {
        let mut t = self.t.lock();
        for (qpn, e) in t.qps.drain() {
            // SAFETY: the QP is live and no longer reachable through the table.
            let rc = unsafe { ffi::ibv_destroy_qp(e.qp.0) };
            if rc != 0 {
                tracing::warn!(device = %self.name, qpn, rc, "ibv_destroy_qp failed; leaked");
            }
        }
        for (_, ah) in t.ahs.drain() {
            // SAFETY: the AH is live; every QP that could send with it is destroyed.
            let rc = unsafe { ffi::ibv_destroy_ah(ah.0) };
            if rc != 0 {
                tracing::warn!(device = %self.name, rc, "ibv_destroy_ah failed; leaked");
            }
        }
        for (h, srq) in t.srqs.drain() {
            // SAFETY: the SRQ is live and its QPs are destroyed.
            let rc = unsafe { ffi::ibv_destroy_srq(srq.0) };
            if rc != 0 {
                tracing::warn!(device = %self.name, h, rc, "ibv_destroy_srq failed; leaked");
            }
        }
        for (h, x) in std::mem::take(&mut t.xrcds) {
            let rc = self.close_xrcd(x);
            if rc != 0 {
                tracing::warn!(device = %self.name, h, rc, "ibv_close_xrcd failed; leaked");
            }
        }
        for (h, cq) in t.cqs.drain() {
            // SAFETY: the CQ is live and the QPs/SRQs using it are destroyed.
            let rc = unsafe { ffi::ibv_destroy_cq(cq.0) };
            if rc != 0 {
                tracing::warn!(device = %self.name, h, rc, "ibv_destroy_cq failed; leaked");
            }
        }
        for (h, mw) in t.mws.drain() {
            let rc = super::mw::dealloc(mw);
            if rc != 0 {
                tracing::warn!(device = %self.name, h, rc, "ibv_dealloc_mw failed; leaked");
            }
        }
        for z in std::mem::take(&mut t.zombies) {
            // SAFETY: the MR is live (its deregistration was refused) and only in that list.
            let rc = unsafe { ffi::ibv_dereg_mr(z.mr.0) };
            if rc != 0 {
                tracing::warn!(device = %self.name, rc, "ibv_dereg_mr failed; leaked");
                std::mem::forget(z);
            }
        }
        for (k, mr) in t.mrs.drain() {
            // SAFETY: the MR is live and unreachable through the table.
            let rc = unsafe { ffi::ibv_dereg_mr(mr.0) };
            if rc != 0 {
                tracing::warn!(device = %self.name, k, rc, "ibv_dereg_mr failed; leaked");
            }
        }
        for (h, pd) in t.pds.drain() {
            // SAFETY: the PD is live and every object created in it is gone.
            let rc = unsafe { ffi::ibv_dealloc_pd(pd.0) };
            if rc != 0 {
                tracing::warn!(device = %self.name, h, rc, "ibv_dealloc_pd failed; leaked");
            }
        }
    }
}
