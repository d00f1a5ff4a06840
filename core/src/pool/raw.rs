//! The one audited `unsafe` module of rdmx-core: byte views of pooled registered memory.
//!
//! Registered memory is owned by a [`MemoryRegion`]; the NIC (hardware DMA, or the soft
//! provider's atomic copies) reads and writes it while a work request names it or, for
//! remotely accessible regions, when a peer accesses it. [`Buf`] hands the application plain
//! `&[u8]` / `&mut [u8]` views of one slot of such a region. That is sound because:
//!
//! 1. **Exclusive slots.** The pool gives each slot of a chunk to at most one `Buf` at a time
//!    (a slot goes back on the free list only when its `Buf` is dropped), and slots never
//!    overlap, so two `Buf`s never alias.
//! 2. **Lifetime.** A `Buf` holds an `Arc` of its chunk, which owns the `MemoryRegion`, whose
//!    memory stays allocated while the region lives (the verbs layer additionally keeps it
//!    alive while an in-flight operation names it).
//! 3. **No local NIC access while viewed.** A work request can name a `Buf`'s bytes only
//!    through its `sge` (a verbs `Sge` cannot be made from an address and a key), which
//!    takes a [`PostKey`](super::PostKey): only transports get one, and a transport
//!    implements the `unsafe` trait `worker::Transport`, whose contract is to post a `Buf`
//!    only once the application can no longer reach it and to hand it back only after the
//!    work request has completed or been flushed (or its queue pair was destroyed). The
//!    completion is observed under the worker's lock, which orders the NIC's writes before
//!    the application's reads. Misuses are compile-fail tests (`tests/compile-fail/`).
//! 4. **Remote access.** Pool chunks are registered with `LOCAL_WRITE` only, except the
//!    size classes at or above the rendezvous threshold, which add `REMOTE_READ` so a peer
//!    can read a rendezvous message. A peer only learns a remote key from a rendezvous
//!    request, and the protocol has it read the buffer only before it reports the read done.
//!    A misbehaving peer that reads a slot later can observe torn data; with the soft
//!    provider its reads are the engine's atomic loads running alongside the application's
//!    plain stores (the same race a DMA read has on hardware). Closing that hole completely
//!    needs memory windows (per-message remote keys), which the soft provider does not have
//!    yet.

#![allow(unsafe_code)]

use std::ops::{Deref, DerefMut};

use rdmx_verbs::{AccessFlags, MemoryRegion, ProtectionDomain, VerbsError};

use super::Buf;

/// A registered allocation carved into slots of one size class (or one dedicated buffer).
#[derive(Debug)]
pub(super) struct Chunk {
    pub(super) mr: MemoryRegion,
}

impl Chunk {
    pub(super) fn new(
        pd: &ProtectionDomain,
        len: usize,
        access: AccessFlags,
    ) -> Result<Self, VerbsError> {
        Ok(Self {
            mr: pd.reg_mr(len, access)?,
        })
    }
}

impl Deref for Buf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        debug_assert!(self.offset + self.len <= self.chunk.mr.len());
        // SAFETY: `offset + len <= cap` and the slot `offset..offset + cap` lies inside the
        // chunk's region (checked when the slot was carved, `Buf::set_len` keeps `len <= cap`);
        // the region's memory is alive while `self.chunk` is (point 2 of the module docs); no
        // other `Buf` covers these bytes and no local work request names them while this `Buf`
        // is reachable (points 1 and 3), so a shared view for the lifetime of `&self` is sound.
        unsafe { std::slice::from_raw_parts(self.chunk.mr.as_mut_ptr().add(self.offset), self.len) }
    }
}

impl DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        debug_assert!(self.offset + self.len <= self.chunk.mr.len());
        // SAFETY: as in `deref`; `&mut self` makes the view unique for its lifetime.
        unsafe {
            std::slice::from_raw_parts_mut(self.chunk.mr.as_mut_ptr().add(self.offset), self.len)
        }
    }
}
