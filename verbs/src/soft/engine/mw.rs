//! Memory windows (IBA 10.6.7 and the verbs manuals): a window opens
//! part of a memory region to remote access under its own key, and is closed again without
//! deregistering the region.
//!
//! Keys: a window's key is its index (the upper 24 bits, fixed at allocation) and a tag (the
//! low 8 bits, new at every bind). A type 1 window's tag is advanced by the NIC at each bind
//! (`ibv_bind_mw` returns the new key); a type 2 window is bound under a key the application
//! chooses (the same index, normally the next tag). Window keys have their top bit set and
//! memory-region keys have it clear ([`WINDOW_BIT`]), so a key names one object and neither
//! kind of key is drawn by scanning the other's table.
//!
//! Rules enforced:
//! - a bind names a region of the window's protection domain registered with `MW_BIND`, and
//!   a range inside it; remote write or atomic access needs the region's `LOCAL_WRITE`;
//! - a type 1 window is bound by `QueuePair::bind_mw` only, and rebinding replaces its
//!   binding; a zero-length bind unbinds it;
//! - a type 2 window is bound by a bind work request only, must be free (never bound, or
//!   invalidated) to be bound, and is then reachable through the binding QP only;
//! - local invalidate and send with invalidate close a bound type 2 window (the send's only
//!   on the QP it is bound to); a type 1 window cannot be invalidated;
//! - a region with windows bound is not deregistered from under them: an explicit
//!   deregistration fails (busy); dropping the region hides it from local use and frees it
//!   when its last window closes;
//! - destroying a QP closes the type 2 windows bound to it.

use std::sync::Arc;

use super::{Nic, Resources};
use crate::error::VerbsError;
use crate::mem::RegisteredMemory;
use crate::types::{AccessFlags, MwType, Qpn, WcStatus};
use crate::wr::MwBindWr;

/// A memory window.
#[derive(Debug)]
pub(crate) struct MwEntry {
    pub(crate) pd: u32,
    pub(crate) mw_type: MwType,
    /// The current key (index and tag).
    pub(crate) rkey: u32,
    /// The key the next type 1 bind posted takes (advanced at post time, so that binds
    /// queued back to back get distinct keys).
    pub(crate) next_rkey: u32,
    pub(crate) bound: Option<Binding>,
}

/// What a bound window opens.
#[derive(Debug)]
pub(crate) struct Binding {
    /// The region's key (its window count is kept).
    mr: u32,
    mem: Arc<RegisteredMemory>,
    /// Offset of the window's first byte in `mem`.
    off: usize,
    addr: u64,
    len: u64,
    access: AccessFlags,
    /// The QP a type 2 window is bound to.
    qpn: Option<Qpn>,
}

impl MwEntry {
    /// What the window opens while bound: address, length, access.
    pub(crate) fn opens(&self) -> Option<(u64, u64, AccessFlags)> {
        self.bound.as_ref().map(|b| (b.addr, b.len, b.access))
    }
}

/// The access flags a window may grant.
const WINDOW_ACCESS: AccessFlags = AccessFlags(
    AccessFlags::REMOTE_READ.0 | AccessFlags::REMOTE_WRITE.0 | AccessFlags::REMOTE_ATOMIC.0,
);

/// Set in every window key, clear in every memory-region key.
pub(crate) const WINDOW_BIT: u32 = 1 << 31;

fn next_tag(key: u32) -> u32 {
    (key & !0xFF) | (key.wrapping_add(1) & 0xFF)
}

impl Resources {
    /// True when `key` may become a memory-region key: no window has its index.
    pub(crate) fn mr_key_free(&self, key: u32) -> bool {
        key != 0 && key & WINDOW_BIT == 0 && !self.mrs.contains_key(&key)
    }

    /// Remote access through window key `rkey` by QP `qpn` of protection domain `pd`.
    pub(crate) fn window(
        &self,
        qpn: Qpn,
        pd: u32,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Option<(Arc<RegisteredMemory>, usize)> {
        let w = self.mws.get(&(rkey >> 8))?;
        let b = w.bound.as_ref()?;
        if w.rkey != rkey || w.pd != pd || !b.access.contains(need) {
            return None;
        }
        if b.qpn.is_some_and(|q| q != qpn) {
            return None;
        }
        let rel = va.checked_sub(b.addr)?;
        if rel.checked_add(len)? > b.len {
            return None;
        }
        Some((b.mem.clone(), b.off + rel as usize))
    }

    /// Closes a window's binding: the region loses a window (and is freed if its owner let
    /// it go and this was its last).
    fn unbind(&mut self, idx: u32) {
        let Some(b) = self.mws.get_mut(&idx).and_then(|w| w.bound.take()) else {
            return;
        };
        if let Some(mr) = self.mrs.get_mut(&b.mr) {
            mr.windows = mr.windows.saturating_sub(1);
            if mr.windows == 0 && mr.orphaned {
                self.mrs.remove(&b.mr);
            }
        }
    }

    /// Runs a bind work request posted on QP `qpn` (protection domain `pd`).
    pub(crate) fn exec_bind(&mut self, qpn: Qpn, pd: u32, b: &MwBindWr) -> Result<(), WcStatus> {
        let idx = b.rkey.0 >> 8;
        let Some(w) = self.mws.get(&b.mw) else {
            return Err(WcStatus::MwBindErr);
        };
        let type1 = w.mw_type == MwType::Type1;
        if b.mw != idx || w.pd != pd || type1 != b.type1 {
            return Err(WcStatus::MwBindErr);
        }
        if !type1 && w.bound.is_some() {
            // A type 2 window is invalidated before it is bound again.
            return Err(WcStatus::MwBindErr);
        }
        if type1 && b.length == 0 {
            self.unbind(idx);
            if let Some(w) = self.mws.get_mut(&idx) {
                w.rkey = b.rkey.0;
            }
            return Ok(());
        }
        if !WINDOW_ACCESS.contains(b.access) {
            return Err(WcStatus::MwBindErr);
        }
        let Some(mr) = self.mrs.get(&b.lkey.0) else {
            return Err(WcStatus::MwBindErr);
        };
        let writes = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
        if mr.orphaned
            || mr.pd != pd
            || !mr.access.contains(AccessFlags::MW_BIND)
            || (b.access.intersects(writes) && !mr.access.contains(AccessFlags::LOCAL_WRITE))
        {
            return Err(WcStatus::MwBindErr);
        }
        let off = b
            .addr
            .checked_sub(mr.mem.addr())
            .ok_or(WcStatus::MwBindErr)?;
        let end = off.checked_add(b.length).ok_or(WcStatus::MwBindErr)?;
        if end > mr.mem.len() as u64 {
            return Err(WcStatus::MwBindErr);
        }
        let binding = Binding {
            mr: b.lkey.0,
            mem: mr.mem.clone(),
            off: off as usize,
            addr: b.addr,
            len: b.length,
            access: b.access,
            qpn: (!type1).then_some(qpn),
        };
        self.unbind(idx);
        if let Some(mr) = self.mrs.get_mut(&b.lkey.0) {
            mr.windows += 1;
        }
        if let Some(w) = self.mws.get_mut(&idx) {
            w.rkey = b.rkey.0;
            w.bound = Some(binding);
        }
        Ok(())
    }

    /// Invalidates the type 2 window `rkey` names: locally (any QP of its protection
    /// domain) or, with `remote`, by a peer's send with invalidate arriving on `qpn` (the
    /// QP it is bound to).
    pub(crate) fn invalidate(&mut self, qpn: Qpn, pd: u32, rkey: u32, remote: bool) -> bool {
        let idx = rkey >> 8;
        let ok = self.mws.get(&idx).is_some_and(|w| {
            w.mw_type == MwType::Type2
                && w.rkey == rkey
                && w.pd == pd
                && w.bound
                    .as_ref()
                    .is_some_and(|b| !remote || b.qpn == Some(qpn))
        });
        if ok {
            self.unbind(idx);
        }
        ok
    }

    /// Closes the type 2 windows bound to `qpn` (the QP is going away).
    pub(crate) fn unbind_qp(&mut self, qpn: Qpn) {
        let idx: Vec<u32> = self
            .mws
            .iter()
            .filter(|(_, w)| w.bound.as_ref().is_some_and(|b| b.qpn == Some(qpn)))
            .map(|(&i, _)| i)
            .collect();
        for i in idx {
            self.unbind(i);
        }
    }
}

impl Nic {
    /// Allocates a memory window in `pd` (`ibv_alloc_mw`); returns its handle and key.
    ///
    /// # Errors
    /// `ResourceExhausted` past 2^20 windows.
    pub fn alloc_mw(&mut self, pd: u32, mw_type: MwType) -> Result<(u32, u32), VerbsError> {
        if self.res.mws.len() >= 1 << 20 {
            return Err(VerbsError::ResourceExhausted("memory windows"));
        }
        loop {
            let key = self.res.rng.next_u32() | WINDOW_BIT;
            let idx = key >> 8;
            if let std::collections::hash_map::Entry::Vacant(v) = self.res.mws.entry(idx) {
                v.insert(MwEntry {
                    pd,
                    mw_type,
                    rkey: key,
                    next_rkey: key,
                    bound: None,
                });
                return Ok((idx, key));
            }
        }
    }

    /// Deallocates a window (`ibv_dealloc_mw`), closing its binding.
    pub fn dealloc_mw(&mut self, mw: u32) -> bool {
        self.res.unbind(mw);
        self.res.mws.remove(&mw).is_some()
    }

    /// The key the next type 1 bind of `mw` takes (and reserves it).
    pub(crate) fn type1_bind_key(&mut self, mw: u32) -> Option<u32> {
        let w = self.res.mws.get_mut(&mw)?;
        if w.mw_type != MwType::Type1 {
            return None;
        }
        w.next_rkey = next_tag(w.next_rkey);
        Some(w.next_rkey)
    }

    /// The window's current key.
    pub fn mw_rkey(&self, mw: u32) -> Option<u32> {
        self.res.mws.get(&mw).map(|w| w.rkey)
    }

    /// Deregisters a region unless windows are bound to it (`ibv_dereg_mr`'s EBUSY).
    ///
    /// # Errors
    /// `Busy` with windows bound; `NoSuchObject` for an unknown key.
    pub fn dereg_mr_checked(&mut self, key: u32) -> Result<(), VerbsError> {
        match self.res.mrs.get(&key) {
            None => Err(VerbsError::NoSuchObject("memory region")),
            Some(e) if e.windows > 0 => Err(VerbsError::Busy(
                "memory windows are bound to the region; invalidate or deallocate them first",
            )),
            Some(_) => {
                self.res.mrs.remove(&key);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soft::engine::NicConfig;
    use crate::types::{Lkey, Rkey};

    fn nic() -> Nic {
        Nic::new(NicConfig::single_port("10.0.0.1:4791".parse().unwrap(), 1))
    }

    fn bind_wr(mw: u32, rkey: u32, lkey: u32, addr: u64, length: u64, type1: bool) -> MwBindWr {
        MwBindWr {
            mw,
            rkey: Rkey(rkey),
            lkey: Lkey(lkey),
            addr,
            length,
            access: AccessFlags::REMOTE_WRITE,
            type1,
        }
    }

    #[test]
    fn a_dropped_region_lives_until_its_last_window_closes() {
        let mut n = nic();
        let pd = n.alloc_pd();
        let mem = Arc::new(RegisteredMemory::new(4096).unwrap());
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
        let key = n.reg_mr(pd, mem.clone(), access);
        let (mw, rkey) = n.alloc_mw(pd, MwType::Type1).unwrap();
        let next = n.type1_bind_key(mw).unwrap();
        assert_eq!(next, Rkey(rkey).inc().0);
        let b = bind_wr(mw, next, key, mem.addr() + 16, 64, true);
        n.res.exec_bind(Qpn(5), pd, &b).unwrap();
        assert_eq!(n.res.mrs[&key].windows, 1);
        assert!(matches!(n.dereg_mr_checked(key), Err(VerbsError::Busy(_))));
        assert!(n.dereg_mr(key));
        // Orphaned: no local use, but the window still reaches the memory.
        assert!(n.res.mrs[&key].orphaned);
        let w = AccessFlags::REMOTE_WRITE;
        assert!(n.res.remote(Qpn(9), pd, key, mem.addr(), 8, w).is_none());
        let (_, off) = n
            .res
            .remote(Qpn(9), pd, next, mem.addr() + 20, 8, w)
            .unwrap();
        assert_eq!(off, 20);
        assert!(
            n.res
                .remote(Qpn(9), pd, next, mem.addr() + 76, 8, w)
                .is_none()
        );
        assert!(
            n.res
                .remote(Qpn(9), pd, rkey, mem.addr() + 20, 8, w)
                .is_none()
        );
        assert!(n.dealloc_mw(mw));
        assert!(!n.res.mrs.contains_key(&key), "freed with its last window");
    }

    #[test]
    fn type2_rules() {
        let mut n = nic();
        let pd = n.alloc_pd();
        let mem = Arc::new(RegisteredMemory::new(4096).unwrap());
        let key = n.reg_mr(
            pd,
            mem.clone(),
            AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
        );
        let (mw, rkey) = n.alloc_mw(pd, MwType::Type2).unwrap();
        let k = Rkey(rkey).inc().0;
        // Bound through a type 1 call, with another window's index, or in another PD: no.
        let b = bind_wr(mw, k, key, mem.addr(), 64, true);
        assert_eq!(n.res.exec_bind(Qpn(5), pd, &b), Err(WcStatus::MwBindErr));
        let b = bind_wr(mw, k ^ 0x100, key, mem.addr(), 64, false);
        assert_eq!(n.res.exec_bind(Qpn(5), pd, &b), Err(WcStatus::MwBindErr));
        let b = bind_wr(mw, k, key, mem.addr(), 64, false);
        assert_eq!(
            n.res.exec_bind(Qpn(5), pd + 1, &b),
            Err(WcStatus::MwBindErr)
        );
        // Past the region's end.
        let b = bind_wr(mw, k, key, mem.addr() + 4090, 64, false);
        assert_eq!(n.res.exec_bind(Qpn(5), pd, &b), Err(WcStatus::MwBindErr));
        let b = bind_wr(mw, k, key, mem.addr(), 64, false);
        n.res.exec_bind(Qpn(5), pd, &b).unwrap();
        let w = AccessFlags::REMOTE_WRITE;
        assert!(n.res.remote(Qpn(5), pd, k, mem.addr(), 8, w).is_some());
        assert!(
            n.res.remote(Qpn(6), pd, k, mem.addr(), 8, w).is_none(),
            "another QP"
        );
        // Bound: not again until invalidated; the remote invalidation only on its QP.
        assert_eq!(n.res.exec_bind(Qpn(5), pd, &b), Err(WcStatus::MwBindErr));
        assert!(!n.res.invalidate(Qpn(6), pd, k, true));
        assert!(!n.res.invalidate(Qpn(5), pd, rkey, false), "the old key");
        assert!(n.res.invalidate(Qpn(5), pd, k, true));
        assert!(n.res.remote(Qpn(5), pd, k, mem.addr(), 8, w).is_none());
        assert_eq!(n.res.mrs[&key].windows, 0);
        // Destroying the QP closes its windows.
        n.res.exec_bind(Qpn(5), pd, &b).unwrap();
        n.res.unbind_qp(Qpn(5));
        assert!(n.res.remote(Qpn(5), pd, k, mem.addr(), 8, w).is_none());
        // No region key shares a window's index.
        for _ in 0..1000 {
            let m = Arc::new(RegisteredMemory::new(8).unwrap());
            let key = n.reg_mr(pd, m, AccessFlags::LOCAL_WRITE);
            assert_ne!(key >> 8, mw);
        }
    }
}
