//! Memory windows on libibverbs: `ibv_alloc_mw`, `ibv_dealloc_mw` and `ibv_bind_mw` are
//! `static inline` in verbs.h and call the context's ops table, as here. A memory region
//! whose deregistration fails (EBUSY: windows bound to it) keeps its memory alive in the
//! device's table and is deregistered again when a window is deallocated or the device
//! closes: the NIC may still write it through a window, so it must not be freed.

use std::sync::Arc;

use super::{IbvDevice, Ptr, ffi, last_err};
use crate::error::{PostError, VerbsError};
use crate::mem::RegisteredMemory;
use crate::types::{MwType, Qpn, SendFlags};
use crate::wr::MwBindWr;

/// A region deregistered by its owner that the device refused to let go (windows bound).
#[derive(Debug)]
pub(super) struct Zombie {
    pub(super) mr: Ptr<ffi::ibv_mr>,
    pub(super) _mem: Arc<RegisteredMemory>,
}

impl IbvDevice {
    pub(super) fn alloc_mw(&self, pd: u32, mw_type: MwType) -> Result<(u32, u32), VerbsError> {
        let pd = self.pd(pd)?;
        // SAFETY: live PD; its context's ops table is filled at open and never changes.
        let Some(alloc) = (unsafe { (*(*pd.0).context).ops.alloc_mw }) else {
            return Err(VerbsError::Unsupported("memory windows on this device"));
        };
        // SAFETY: live PD; the type is one of the two the call knows.
        let mw = unsafe { alloc(pd.0, mw_type as ffi::ibv_mw_type) };
        if mw.is_null() {
            return Err(last_err("ibv_alloc_mw"));
        }
        // SAFETY: non-null window just allocated; its key is a plain field.
        let rkey = unsafe { (*mw).rkey };
        let mut t = self.t.lock();
        let h = t.next_handle();
        t.mws.insert(h, Ptr(mw));
        Ok((h, rkey))
    }

    pub(super) fn dealloc_mw(&self, h: u32) {
        let Some(mw) = self.t.lock().mws.remove(&h) else {
            return;
        };
        let rc = dealloc(mw);
        if rc != 0 {
            tracing::warn!(device = %self.name, h, rc, "ibv_dealloc_mw failed; leaked");
        }
        self.retry_zombies();
    }

    /// Deregisters what could not be deregistered before (a window has gone since).
    pub(super) fn retry_zombies(&self) {
        let mut t = self.t.lock();
        t.zombies.retain(|z| {
            // SAFETY: the MR is live (its deregistration failed) and only in this list.
            unsafe { ffi::ibv_dereg_mr(z.mr.0) != 0 }
        });
    }

    /// `ibv_dereg_mr` for a region its owner dropped: on failure the memory stays alive.
    pub(super) fn dereg_or_keep(&self, key: u32, mem: &Arc<RegisteredMemory>) {
        let Some(mr) = self.t.lock().mrs.remove(&key) else {
            return;
        };
        // SAFETY: the MR was live in the table and is deregistered once.
        let rc = unsafe { ffi::ibv_dereg_mr(mr.0) };
        if rc != 0 {
            tracing::debug!(device = %self.name, key, rc, "ibv_dereg_mr refused; kept");
            self.t.lock().zombies.push(Zombie {
                mr,
                _mem: Arc::clone(mem),
            });
        }
    }

    /// `ibv_dereg_mr` that leaves the region registered when the device refuses.
    pub(super) fn dereg_checked(&self, key: u32) -> Result<(), VerbsError> {
        let mut t = self.t.lock();
        let mr = *t
            .mrs
            .get(&key)
            .ok_or(VerbsError::NoSuchObject("memory region"))?;
        // SAFETY: the MR is live in the table; on success it is removed from it below.
        let rc = unsafe { ffi::ibv_dereg_mr(mr.0) };
        match rc {
            0 => {
                t.mrs.remove(&key);
                Ok(())
            }
            libc::EBUSY => Err(VerbsError::Busy(
                "memory windows are bound to the region; invalidate or deallocate them first",
            )),
            _ => Err(super::io_err("ibv_dereg_mr", rc)),
        }
    }

    /// `ibv_bind_mw` (type 1); returns the window's new key.
    pub(super) fn bind_mw(
        &self,
        qpn: Qpn,
        wr_id: u64,
        flags: SendFlags,
        b: &MwBindWr,
    ) -> Result<u32, PostError> {
        let e = self.qp(qpn).ok_or(PostError::Destroyed)?;
        let (mw, mr) = {
            let t = self.t.lock();
            let mw = *t.mws.get(&b.mw).ok_or(PostError::InvalidWorkRequest(
                "the memory window no longer exists",
            ))?;
            // An unbind (length 0) may name no region.
            let mr = t.mrs.get(&b.lkey.0).copied();
            (mw, mr)
        };
        if b.length > 0 && mr.is_none() {
            return Err(PostError::InvalidWorkRequest(
                "the memory region no longer exists",
            ));
        }
        let mut bind = ffi::ibv_mw_bind {
            wr_id,
            send_flags: flags.bits() & 0xF,
            bind_info: ffi::ibv_mw_bind_info {
                mr: mr.map_or(std::ptr::null_mut(), |m| m.0),
                addr: b.addr,
                length: b.length,
                mw_access_flags: b.access.bits(),
            },
        };
        // SAFETY: live QP; its context's ops table never changes.
        let Some(op) = (unsafe { (*(*e.qp.0).context).ops.bind_mw }) else {
            return Err(PostError::InvalidWorkRequest(
                "memory windows are not supported on this device",
            ));
        };
        // SAFETY: live QP, window and region (in their tables, kept by the public objects
        // for the duration of the call); `bind` is a live struct the call reads.
        let rc = unsafe { op(e.qp.0, mw.0, &raw mut bind) };
        if rc != 0 {
            return Err(PostError::InvalidWorkRequest(
                "ibv_bind_mw rejected the bind",
            ));
        }
        // SAFETY: live window; the provider updated its key.
        Ok(unsafe { (*mw.0).rkey })
    }

    /// The raw window and region of a bind work request.
    pub(super) fn bind_ptrs(
        &self,
        b: &MwBindWr,
    ) -> Result<(*mut ffi::ibv_mw, *mut ffi::ibv_mr), PostError> {
        let t = self.t.lock();
        let mw = t.mws.get(&b.mw).ok_or(PostError::InvalidWorkRequest(
            "the memory window no longer exists",
        ))?;
        let mr = t.mrs.get(&b.lkey.0).ok_or(PostError::InvalidWorkRequest(
            "the memory region no longer exists",
        ))?;
        Ok((mw.0, mr.0))
    }
}

/// `ibv_dealloc_mw`.
pub(super) fn dealloc(mw: Ptr<ffi::ibv_mw>) -> i32 {
    // SAFETY: live window, removed from its table; its context's ops never change.
    match unsafe { (*(*mw.0).context).ops.dealloc_mw } {
        // SAFETY: as above; deallocated once.
        Some(f) => unsafe { f(mw.0) },
        None => libc::EOPNOTSUPP,
    }
}
