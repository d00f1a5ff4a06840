//! Memory windows (`struct ibv_mw`): remote access to part of a memory region under a key
//! of its own, granted and revoked without registering or deregistering the region.
//!
//! A window is allocated in a protection domain ([`ProtectionDomain::alloc_mw`]) and bound
//! to a range of a region registered with [`AccessFlags::MW_BIND`]:
//!
//! - **type 1**: [`QueuePair::bind_mw`] (`ibv_bind_mw`) posts the bind on a QP's send queue
//!   and returns the key the window takes (the tag of the old key plus one, so a peer
//!   holding the old key is refused); any QP of the domain reaches memory through it; a
//!   zero-length bind closes it;
//! - **type 2**: a bind work request ([`MemoryWindow::bind_wr`] in a [`SendWr`] with
//!   [`WrOpcode::BindMw`]) under a key the application picks (normally
//!   [`Rkey::inc`] of the previous one); only the binding QP reaches memory through it, and
//!   it is closed by [`WrOpcode::LocalInv`] or by the peer's [`WrOpcode::SendWithInv`]
//!   before it is bound again.
//!
//! Binds run on the send queue in order: a bind (or local invalidate) takes effect when the
//! NIC reaches it in the queue (requests posted before it may still be in flight: a peer
//! told the new key by a later send can use it) and completes in order. A bind that breaks a
//! rule completes with `MwBindErr`, an invalidation of a key that is not a bound type 2
//! window with `LocQpOpErr`, and either moves the QP to the error state. Access through a
//! closed, rebound or foreign window fails at the peer with a remote access error.
//!
//! [`SendWr`]: crate::SendWr
//! [`WrOpcode::BindMw`]: crate::WrOpcode::BindMw
//! [`WrOpcode::LocalInv`]: crate::WrOpcode::LocalInv
//! [`WrOpcode::SendWithInv`]: crate::WrOpcode::SendWithInv

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{PostError, VerbsError};
use crate::pd::{MemoryRegion, PdInner, ProtectionDomain};
use crate::qp::QueuePair;
use crate::types::{AccessFlags, MwType, Rkey, SendFlags};
use crate::wr::MwBindWr;

/// A memory window (`struct ibv_mw`). Dropping it deallocates it (`ibv_dealloc_mw`), which
/// closes its binding.
#[derive(Debug)]
pub struct MemoryWindow {
    pd: Arc<PdInner>,
    handle: u32,
    mw_type: MwType,
    rkey: AtomicU32,
}

/// A type 1 bind (`struct ibv_mw_bind`).
#[derive(Debug, Clone, Copy)]
pub struct MwBind<'a> {
    /// Returned in the bind's completion.
    pub wr_id: u64,
    /// `SIGNALED` for a completion on success (errors always complete); `FENCE`.
    pub send_flags: SendFlags,
    /// The region to open, or `None` to close the window.
    pub mr: Option<&'a MemoryRegion>,
    /// Offset of the window in the region.
    pub offset: usize,
    /// Length of the window in bytes.
    pub length: usize,
    /// Remote access granted through the window (`REMOTE_READ`, `REMOTE_WRITE`,
    /// `REMOTE_ATOMIC`).
    pub access: AccessFlags,
}

impl<'a> MwBind<'a> {
    /// Opens `length` bytes at `offset` of `mr` with `access`, signaled.
    pub fn new(
        wr_id: u64,
        mr: &'a MemoryRegion,
        offset: usize,
        length: usize,
        access: AccessFlags,
    ) -> Self {
        Self {
            wr_id,
            send_flags: SendFlags::SIGNALED,
            mr: Some(mr),
            offset,
            length,
            access,
        }
    }

    /// Closes the window (a zero-length bind), signaled.
    pub fn unbind(wr_id: u64) -> Self {
        Self {
            wr_id,
            send_flags: SendFlags::SIGNALED,
            mr: None,
            offset: 0,
            length: 0,
            access: AccessFlags::EMPTY,
        }
    }
}

impl ProtectionDomain {
    /// Allocates a memory window of `mw_type` (`ibv_alloc_mw`). It opens nothing until it
    /// is bound.
    ///
    /// # Errors
    /// `Unsupported` where the device has no memory windows; `ResourceExhausted`.
    pub fn alloc_mw(&self, mw_type: MwType) -> Result<MemoryWindow, VerbsError> {
        let (handle, rkey) = self.inner.ctx.dev().alloc_mw(self.inner.id, mw_type)?;
        Ok(MemoryWindow {
            pd: self.inner.clone(),
            handle,
            mw_type,
            rkey: AtomicU32::new(rkey),
        })
    }
}

/// The access a window may grant.
const WINDOW_ACCESS: AccessFlags = AccessFlags(
    AccessFlags::REMOTE_READ.0 | AccessFlags::REMOTE_WRITE.0 | AccessFlags::REMOTE_ATOMIC.0,
);

/// Checks what the application can get wrong before anything is posted.
fn check_bind(
    pd: u32,
    mr: &MemoryRegion,
    offset: usize,
    length: usize,
    access: AccessFlags,
) -> Result<(), &'static str> {
    if !WINDOW_ACCESS.contains(access) {
        return Err("a window grants remote read, write or atomic access only");
    }
    if mr.pd_id() != pd {
        return Err("the memory region belongs to another protection domain");
    }
    if !mr.access().contains(AccessFlags::MW_BIND) {
        return Err("the memory region was not registered with MW_BIND");
    }
    let writes = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    if access.intersects(writes) && !mr.access().contains(AccessFlags::LOCAL_WRITE) {
        return Err("remote write or atomic access needs a region with LOCAL_WRITE");
    }
    if offset.checked_add(length).is_none_or(|e| e > mr.len()) {
        return Err("the window is outside the memory region");
    }
    Ok(())
}

impl MemoryWindow {
    /// The window's key: the one it was allocated with, or the one the last type 1 bind
    /// returned. (A type 2 window's key is the one its last bind work request named: the
    /// application chose it.)
    pub fn rkey(&self) -> Rkey {
        Rkey(self.rkey.load(Ordering::Acquire))
    }

    /// The window's type.
    pub fn mw_type(&self) -> MwType {
        self.mw_type
    }

    /// A type 2 bind work request (`IBV_WR_BIND_MW`, or `ibv_wr_bind_mw`): open `length`
    /// bytes at `offset` of `mr` with `access` under key `rkey` (this window's index with
    /// a new tag: `self.rkey().inc()` the first time, then the key of the previous bind
    /// `.inc()`). Post it with `WrOpcode::BindMw` on the QP that will own the window.
    ///
    /// # Errors
    /// `InvalidArgument` for a type 1 window, a key of another window, a region of another
    /// domain or without `MW_BIND`, a range outside the region, or access other than
    /// remote read / write / atomic.
    pub fn bind_wr(
        &self,
        rkey: Rkey,
        mr: &MemoryRegion,
        offset: usize,
        length: usize,
        access: AccessFlags,
    ) -> Result<MwBindWr, VerbsError> {
        if self.mw_type != MwType::Type2 {
            return Err(VerbsError::InvalidArgument(
                "a type 1 window is bound with QueuePair::bind_mw".into(),
            ));
        }
        if rkey.0 >> 8 != self.rkey().0 >> 8 {
            return Err(VerbsError::InvalidArgument(format!(
                "key {:#x} is not a key of this window ({:#x} with another tag)",
                rkey.0,
                self.rkey().0
            )));
        }
        check_bind(self.pd.id, mr, offset, length, access)
            .map_err(|e| VerbsError::InvalidArgument(e.into()))?;
        Ok(MwBindWr {
            mw: self.handle,
            rkey,
            lkey: mr.lkey(),
            addr: mr.addr() + offset as u64,
            length: length as u64,
            access,
            type1: false,
        })
    }
}

impl MemoryWindow {
    /// A type 2 bind work request over exactly the memory an SGE names (its address,
    /// length and memory region): for code that holds buffers as SGEs, such as a pool
    /// of registered buffers. The device checks that the range lies in the region, that
    /// the region allows `MW_BIND` and is in the window's protection domain; a bind that
    /// breaks a rule completes with `MwBindErr`.
    ///
    /// # Errors
    /// `InvalidArgument` for a type 1 window, a key of another window, an empty SGE, or
    /// access other than remote read / write / atomic.
    pub fn bind_wr_sge(
        &self,
        rkey: Rkey,
        sge: &crate::wr::Sge,
        access: AccessFlags,
    ) -> Result<MwBindWr, VerbsError> {
        if self.mw_type != MwType::Type2 {
            return Err(VerbsError::InvalidArgument(
                "a type 1 window is bound with QueuePair::bind_mw".into(),
            ));
        }
        if rkey.0 >> 8 != self.rkey().0 >> 8 {
            return Err(VerbsError::InvalidArgument(format!(
                "key {:#x} is not a key of this window",
                rkey.0
            )));
        }
        self.sge_wr(rkey, sge, access, false)
            .map_err(|e| VerbsError::InvalidArgument(e.into()))
    }

    /// A bind of this window under `rkey` over exactly `sge`'s memory.
    fn sge_wr(
        &self,
        rkey: Rkey,
        sge: &crate::wr::Sge,
        access: AccessFlags,
        type1: bool,
    ) -> Result<MwBindWr, &'static str> {
        if !WINDOW_ACCESS.contains(access) || sge.length() == 0 {
            return Err("a window opens a non-empty range for remote access only");
        }
        Ok(MwBindWr {
            mw: self.handle,
            rkey,
            lkey: sge.lkey(),
            addr: sge.addr(),
            length: u64::from(sge.length()),
            access,
            type1,
        })
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        self.pd.ctx.dev().dealloc_mw(self.handle);
    }
}

impl QueuePair {
    /// Binds a type 1 memory window (`ibv_bind_mw`): posts the bind on this QP's send queue
    /// and returns the key the window takes, which [`MemoryWindow::rkey`] reports from now
    /// on. Remote access under the new key works once the bind has run (its completion,
    /// when signaled); the old key stops working then.
    ///
    /// # Errors
    /// `InvalidWorkRequest` for a type 2 window, a region of another protection domain or
    /// without `MW_BIND`, a range outside the region or non-remote access flags; otherwise
    /// as [`post_send`](Self::post_send).
    pub fn bind_mw(&self, mw: &MemoryWindow, bind: &MwBind<'_>) -> Result<Rkey, PostError> {
        if mw.mw_type != MwType::Type1 {
            return Err(PostError::InvalidWorkRequest(
                "ibv_bind_mw binds type 1 windows; bind a type 2 window with a BindMw request",
            ));
        }
        let wr = match bind.mr {
            Some(mr) => {
                check_bind(mw.pd.id, mr, bind.offset, bind.length, bind.access)
                    .map_err(PostError::InvalidWorkRequest)?;
                MwBindWr {
                    mw: mw.handle,
                    rkey: mw.rkey(),
                    lkey: mr.lkey(),
                    addr: mr.addr() + bind.offset as u64,
                    length: bind.length as u64,
                    access: bind.access,
                    type1: true,
                }
            }
            None => MwBindWr {
                mw: mw.handle,
                rkey: mw.rkey(),
                lkey: crate::types::Lkey(0),
                addr: 0,
                length: 0,
                access: AccessFlags::EMPTY,
                type1: true,
            },
        };
        let key = self.bind_mw_raw(bind.wr_id, bind.send_flags, &wr)?;
        mw.rkey.store(key, Ordering::Release);
        Ok(Rkey(key))
    }

    /// [`bind_mw`](Self::bind_mw) over exactly the memory an SGE names (for code that
    /// holds buffers as SGEs, such as a pool): a type 1 window opened to `access` on
    /// `sge`'s range of its region. The device checks the range, the region's `MW_BIND`
    /// and its protection domain (a bind that breaks a rule completes with `MwBindErr`).
    ///
    /// # Errors
    /// `InvalidWorkRequest` for a type 2 window, an empty SGE or non-remote access; else as
    /// [`post_send`](Self::post_send).
    pub fn bind_mw_sge(
        &self,
        mw: &MemoryWindow,
        wr_id: u64,
        send_flags: SendFlags,
        sge: &crate::wr::Sge,
        access: AccessFlags,
    ) -> Result<Rkey, PostError> {
        if mw.mw_type != MwType::Type1 {
            return Err(PostError::InvalidWorkRequest(
                "ibv_bind_mw binds type 1 windows; bind a type 2 window with a BindMw request",
            ));
        }
        let wr = mw
            .sge_wr(mw.rkey(), sge, access, true)
            .map_err(PostError::InvalidWorkRequest)?;
        let key = self.bind_mw_raw(wr_id, send_flags, &wr)?;
        mw.rkey.store(key, Ordering::Release);
        Ok(Rkey(key))
    }
}
