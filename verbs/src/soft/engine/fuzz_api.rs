//! Hooks for the fuzzing harness (`rdmx-fuzz`), which drives a [`Nic`] with hostile
//! datagrams. Not part of the supported API: hidden from the documentation, and free to
//! change with the harness.
//!
//! Everything else the harness needs (creating queue pairs, posting work requests, feeding
//! datagrams) is the engine's public API; only memory registration takes a type the crate
//! does not export, an [`Sge`] cannot be made from an address and a key, a memory window
//! bind ([`MwBindWr`]) is made from the public API's window and region objects only, and the
//! state of a window is not reported by the engine.

use std::sync::Arc;

use super::Nic;
use crate::error::PostError;
use crate::mem::RegisteredMemory;
use crate::types::{AccessFlags, Lkey, Qpn, Rkey, SendFlags};
use crate::wr::{MwBindWr, SendWr, Sge, WrOpcode};

/// A region [`reg_zeroed`] registered. Its bytes are reachable only through the NIC (the
/// harness never sees them), so handing out its SGEs keeps the promise of [`Sge`]: nobody
/// writes the memory while the NIC sends from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    key: u32,
    addr: u64,
    len: usize,
}

impl Region {
    /// The key (lkey = rkey).
    pub fn key(&self) -> u32 {
        self.key
    }

    /// The address of the first byte (what remote addresses name).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The SGE of bytes `off..off + len` of the region, or `None` outside it.
    pub fn sge(&self, off: usize, len: u32) -> Option<Sge> {
        let end = off.checked_add(usize::try_from(len).ok()?)?;
        if end > self.len {
            return None;
        }
        Some(Sge {
            addr: self.addr.checked_add(u64::try_from(off).ok()?)?,
            length: len,
            lkey: Lkey(self.key),
        })
    }
}

/// Registers `len` freshly allocated, zeroed bytes under protection domain `pd` with
/// `access` (as [`Nic::reg_mr`] does for a region the driver allocated), or `None` when the
/// allocation fails. The NIC owns the memory: it is freed when the region is deregistered
/// or the NIC dropped.
pub fn reg_zeroed(nic: &mut Nic, pd: u32, len: usize, access: AccessFlags) -> Option<Region> {
    let mem = Arc::new(RegisteredMemory::new(len)?);
    let addr = mem.addr();
    let key = nic.reg_mr(pd, mem, access);
    Some(Region { key, addr, len })
}

/// Writes `src` into bytes `off..off + src.len()` of `region`, as the application writes
/// its buffers: the harness does it while setting a NIC up, before any work request names
/// those bytes (so the promise of [`Region`] holds). False when the region is no longer
/// registered or the range is outside it.
pub fn write(nic: &Nic, region: &Region, off: usize, src: &[u8]) -> bool {
    nic.res
        .mrs
        .get(&region.key)
        .is_some_and(|mr| mr.mem.write(off, src))
}

/// Copies bytes `off..off + dst.len()` of `region` into `dst` (the harness checks what remote
/// writes did to it). False when the region is no longer registered or the range is outside
/// it.
pub fn read(nic: &Nic, region: &Region, off: usize, dst: &mut [u8]) -> bool {
    nic.res
        .mrs
        .get(&region.key)
        .is_some_and(|mr| mr.mem.read(off, dst))
}

/// A type 2 bind work request of window `mw` (the handle [`Nic::alloc_mw`] returned) under
/// key `rkey`, over bytes `off..off + len` of `region` with `access`; post it with
/// [`WrOpcode::BindMw`]. Not checked here: a bad one completes with `MwBindErr`.
pub fn type2_bind(
    mw: u32,
    rkey: u32,
    region: &Region,
    off: usize,
    len: u64,
    access: AccessFlags,
) -> MwBindWr {
    MwBindWr {
        mw,
        rkey: Rkey(rkey),
        lkey: Lkey(region.key),
        addr: region.addr.wrapping_add(off as u64),
        length: len,
        access,
        type1: false,
    }
}

/// Posts a type 1 bind of window `mw` over bytes `off..off + len` of `region` on QP `qpn`
/// (as `ibv_bind_mw` does); returns the key the window takes.
///
/// # Errors
/// As [`Nic::post_send`]; `InvalidWorkRequest` for a window that is not type 1.
#[allow(clippy::too_many_arguments)]
pub fn bind_type1(
    nic: &mut Nic,
    now: u64,
    qpn: Qpn,
    wr_id: u64,
    mw: u32,
    region: &Region,
    off: usize,
    len: u64,
    access: AccessFlags,
) -> Result<u32, PostError> {
    let key = nic
        .type1_bind_key(mw)
        .ok_or(PostError::InvalidWorkRequest("not a type 1 memory window"))?;
    let b = MwBindWr {
        type1: true,
        ..type2_bind(mw, key, region, off, len, access)
    };
    let wr = SendWr::new(wr_id, WrOpcode::BindMw(b), &[]).flags(SendFlags::SIGNALED);
    nic.post_send(now, qpn, &wr)?;
    Ok(key)
}

/// What window `mw` opens now: its key, address, length and access, or `None` while it is
/// not bound (never bound, invalidated, unbound or deallocated).
pub fn window(nic: &Nic, mw: u32) -> Option<(u32, u64, u64, AccessFlags)> {
    let w = nic.res.mws.get(&mw)?;
    let (addr, len, access) = w.opens()?;
    Some((w.rkey, addr, len, access))
}
