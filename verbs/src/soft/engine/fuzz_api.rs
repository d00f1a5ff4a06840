//! Hooks for the fuzzing harness (`rdmx-fuzz`), which drives a [`Nic`] with hostile
//! datagrams. Not part of the supported API: hidden from the documentation, and free to
//! change with the harness.
//!
//! Everything else the harness needs (creating queue pairs, posting work requests, feeding
//! datagrams) is the engine's public API; only memory registration takes a type the crate
//! does not export, and an [`Sge`] cannot be made from an address and a key.

use std::sync::Arc;

use super::Nic;
use crate::mem::RegisteredMemory;
use crate::types::{AccessFlags, Lkey};
use crate::wr::Sge;

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
