//! Protection domains and memory regions.

use std::sync::Arc;

use crate::bytes::SharedBytes;
use crate::device::Context;
use crate::error::VerbsError;
use crate::mem::RegisteredMemory;
use crate::types::{AccessFlags, Lkey, Rkey};
use crate::wr::Sge;

#[derive(Debug)]
pub(crate) struct PdInner {
    pub(crate) ctx: Context,
    pub(crate) id: u32,
}

/// A protection domain (`struct ibv_pd`): memory regions and queue pairs created from the
/// same domain may be used together.
#[derive(Debug, Clone)]
pub struct ProtectionDomain {
    pub(crate) inner: Arc<PdInner>,
}

impl ProtectionDomain {
    pub(crate) fn new(ctx: Context) -> Result<Self, VerbsError> {
        let id = ctx.dev().alloc_pd()?;
        Ok(Self {
            inner: Arc::new(PdInner { ctx, id }),
        })
    }

    /// The context this domain belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// Allocates `len` zeroed bytes and registers them (`ibv_reg_mr` on memory the region
    /// owns). Remote access flags other than none require `LOCAL_WRITE`, as in verbs.
    ///
    /// # Errors
    /// `InvalidArgument` for an impossible size or flag combination, `ResourceExhausted`
    /// when the memory cannot be allocated.
    pub fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<MemoryRegion, VerbsError> {
        Self::check_access(access)?;
        if len as u64 > 1 << 40 {
            return Err(VerbsError::InvalidArgument(format!(
                "{len} bytes exceeds max_mr_size"
            )));
        }
        let mem = RegisteredMemory::new(len).ok_or(VerbsError::ResourceExhausted("memory"))?;
        self.register(mem, access)
    }

    /// Registers memory the caller owns (`ibv_reg_mr` on the application's own buffer):
    /// `bytes` (a `Vec<u8>`, a `Box<[u8]>`) is handed over without a copy, accessed from
    /// then on like a region's own bytes (through [`MemoryRegion::read`] /
    /// [`write`](MemoryRegion::write): the NIC may write it at any time), and given back by
    /// [`MemoryRegion::into_bytes`].
    ///
    /// # Errors
    /// As [`reg_mr`](Self::reg_mr); `InvalidArgument` for an empty buffer.
    pub fn reg_mr_owned(
        &self,
        bytes: impl Into<Box<[u8]>>,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        Self::check_access(access)?;
        let mem = RegisteredMemory::adopt(bytes.into())
            .ok_or_else(|| VerbsError::InvalidArgument("cannot register an empty buffer".into()))?;
        self.register(mem, access)
    }

    fn check_access(access: AccessFlags) -> Result<(), VerbsError> {
        if access.bits() & !0x1F != 0 {
            return Err(VerbsError::InvalidArgument(format!(
                "unknown access flag bits {:#x}",
                access.bits()
            )));
        }
        let remote_w = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
        if access.intersects(remote_w) && !access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(VerbsError::InvalidArgument(
                "REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE".into(),
            ));
        }
        Ok(())
    }

    /// Registers `mem` with the device under this domain.
    fn register(
        &self,
        mem: RegisteredMemory,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        let mem = Arc::new(mem);
        let (key, rkey) = self.inner.ctx.dev().reg_mr(self.inner.id, &mem, access)?;
        Ok(MemoryRegion {
            pd: self.inner.clone(),
            mem,
            key,
            rkey,
            access,
            live: true,
        })
    }

    /// Registers immutable application bytes without copying them (`ibv_reg_mr` on memory
    /// the application owns). The region keeps `bytes` (and so their owner) alive until it
    /// is dropped and no operation still uses it, so the NIC never reads freed memory.
    /// The region is read-only: it can be the source of sends and RDMA WRITEs and the
    /// target of peers' RDMA READs, never a destination.
    ///
    /// # Errors
    /// `InvalidArgument` for empty bytes or for access flags other than `REMOTE_READ` and
    /// `MW_BIND` (`LOCAL_WRITE`, `REMOTE_WRITE` and `REMOTE_ATOMIC` would let the NIC
    /// write them).
    pub fn reg_shared(
        &self,
        bytes: SharedBytes,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        if !(AccessFlags::REMOTE_READ | AccessFlags::MW_BIND).contains(access) {
            return Err(VerbsError::InvalidArgument(format!(
                "shared bytes are immutable: only REMOTE_READ (and MW_BIND) access is allowed, \
                 not {:#x}",
                access.bits()
            )));
        }
        let len = bytes.len();
        let mem = RegisteredMemory::from_shared(bytes).ok_or_else(|| {
            VerbsError::InvalidArgument(format!("cannot register {len} shared bytes"))
        })?;
        self.register(mem, access)
    }
}

/// A registered memory region that owns its bytes (`struct ibv_mr`).
///
/// The bytes are read and written with [`read`](Self::read) / [`write`](Self::write) (copies
/// with atomic word accesses) rather than through `&[u8]`, because the NIC may write them at
/// any time on behalf of a remote peer. Dropping the region deregisters it first; the
/// memory itself is freed only when no in-flight operation still uses it.
#[derive(Debug)]
pub struct MemoryRegion {
    pd: Arc<PdInner>,
    mem: Arc<RegisteredMemory>,
    key: u32,
    rkey: u32,
    access: AccessFlags,
    /// Still registered (false once [`deregister`](Self::deregister) succeeded).
    live: bool,
}

impl MemoryRegion {
    /// Deregisters a region made by [`ProtectionDomain::reg_mr_owned`] and gives its
    /// memory back, with what the NIC and the application wrote into it.
    ///
    /// # Errors
    /// The region back (still registered) when it was not made from the caller's memory;
    /// `Err(None)` when work still in flight uses it (verbs forbids deregistering then): it
    /// is deregistered, and its memory is freed when that work completes.
    pub fn into_bytes(self) -> Result<Box<[u8]>, Option<Self>> {
        if !self.mem.is_adopted() {
            return Err(Some(self));
        }
        let mem = Arc::clone(&self.mem);
        // (Dropping the region deregisters it: the NIC lets its reference go.)
        drop(self);
        match Arc::try_unwrap(mem) {
            Ok(m) => m.into_box().map_err(|_| None),
            Err(_) => Err(None),
        }
    }

    /// Virtual address of the first byte.
    pub fn addr(&self) -> u64 {
        self.mem.addr()
    }

    /// A raw pointer to the first byte, for code that builds `&[u8]` views of parts of the
    /// region under its own synchronisation (a buffer pool). The NIC reads and writes the bytes
    /// with atomic operations whenever the region is named by a posted work request or, with
    /// remote access flags, by a peer; a plain access through this pointer must not overlap
    /// in time with any such access to the same bytes. The pointer is valid while this region
    /// lives.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.mem.as_mut_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    /// The application bytes of a region made by [`ProtectionDomain::reg_shared`].
    pub fn shared_bytes(&self) -> Option<&SharedBytes> {
        self.mem.shared()
    }

    /// True for a region on application bytes ([`ProtectionDomain::reg_shared`]): it is
    /// never written, and `write`, `fill` and `write_u64` fail on it.
    pub fn is_read_only(&self) -> bool {
        self.mem.is_read_only()
    }

    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.mem.is_empty()
    }

    /// The local key.
    pub fn lkey(&self) -> Lkey {
        Lkey(self.key)
    }

    /// The remote key (to give to peers).
    pub fn rkey(&self) -> Rkey {
        Rkey(self.rkey)
    }

    /// The access flags it was registered with.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// An SGE for `len` bytes at `offset`. A range outside the region is not rejected here;
    /// a work request using it completes with `LocProtErr`, as on hardware.
    pub fn sge(&self, offset: usize, len: usize) -> Sge {
        Sge {
            addr: self.addr().wrapping_add(offset as u64),
            length: len.min(u32::MAX as usize) as u32,
            lkey: self.lkey(),
        }
    }

    /// An SGE covering the whole region.
    pub fn sge_all(&self) -> Sge {
        self.sge(0, self.len())
    }

    /// Copies bytes at `offset` into `dst`.
    ///
    /// # Errors
    /// `InvalidArgument` when the range is outside the region.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), VerbsError> {
        if self.mem.read(offset, dst) {
            Ok(())
        } else {
            Err(self.range_err(offset, dst.len()))
        }
    }

    /// Copies `src` into the region at `offset`.
    ///
    /// # Errors
    /// `InvalidArgument` when the range is outside the region.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), VerbsError> {
        if self.mem.write(offset, src) {
            Ok(())
        } else {
            Err(self.range_err(offset, src.len()))
        }
    }

    /// Sets `len` bytes at `offset` to `value`.
    ///
    /// # Errors
    /// `InvalidArgument` when the range is outside the region.
    pub fn fill(&self, offset: usize, len: usize, value: u8) -> Result<(), VerbsError> {
        if self.mem.fill(offset, len, value) {
            Ok(())
        } else {
            Err(self.range_err(offset, len))
        }
    }

    /// A copy of `len` bytes at `offset`.
    ///
    /// # Errors
    /// `InvalidArgument` when the range is outside the region.
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>, VerbsError> {
        let mut v = vec![0u8; len];
        self.read(offset, &mut v)?;
        Ok(v)
    }

    /// Reads the 8-byte aligned word at `offset` atomically (host byte order).
    ///
    /// # Errors
    /// `InvalidArgument` when unaligned or out of range.
    pub fn read_u64(&self, offset: usize) -> Result<u64, VerbsError> {
        if self.is_read_only() && offset.is_multiple_of(8) {
            // Immutable bytes: a plain read is atomic enough.
            let mut w = [0u8; 8];
            self.read(offset, &mut w)?;
            return Ok(u64::from_ne_bytes(w));
        }
        self.mem
            .atomic_u64(offset)
            .map(|w| w.load(std::sync::atomic::Ordering::SeqCst))
            .ok_or_else(|| self.range_err(offset, 8))
    }

    /// Writes the 8-byte aligned word at `offset` atomically (host byte order).
    ///
    /// # Errors
    /// `InvalidArgument` when unaligned or out of range.
    pub fn write_u64(&self, offset: usize, v: u64) -> Result<(), VerbsError> {
        self.mem
            .atomic_u64(offset)
            .map(|w| w.store(v, std::sync::atomic::Ordering::SeqCst))
            .ok_or_else(|| self.range_err(offset, 8))
    }

    fn range_err(&self, offset: usize, len: usize) -> VerbsError {
        let in_range = offset.checked_add(len).is_some_and(|e| e <= self.len());
        if self.is_read_only() && in_range {
            return VerbsError::InvalidArgument(
                "the region is registered on shared (immutable) bytes".into(),
            );
        }
        VerbsError::InvalidArgument(format!(
            "range {offset}+{len} is outside the {}-byte memory region",
            self.len()
        ))
    }
}

impl MemoryRegion {
    /// Deregisters the region (`ibv_dereg_mr` with its result): unlike dropping it, this
    /// fails while memory windows are bound to it.
    ///
    /// # Errors
    /// The region back (still registered) with `Busy` while windows are bound, or with the
    /// device's error.
    pub fn deregister(mut self) -> Result<(), (Self, VerbsError)> {
        match self.pd.ctx.dev().dereg_mr_checked(self.key) {
            Ok(()) => {
                self.live = false;
                Ok(())
            }
            Err(e) => Err((self, e)),
        }
    }

    /// The protection domain's handle, for checks that two objects share it.
    pub(crate) fn pd_id(&self) -> u32 {
        self.pd.id
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // Deregister before the memory can be freed; in-flight operations keep their own
        // reference to the bytes, so nothing writes into freed memory. Memory windows
        // still bound keep the registration (and the memory) until they close.
        if self.live {
            self.pd.ctx.dev().dereg_mr(self.key, &self.mem);
        }
    }
}

impl Context {
    /// Allocates a protection domain (`ibv_alloc_pd`).
    ///
    /// # Errors
    /// None today; reserved for resource limits.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain, VerbsError> {
        ProtectionDomain::new(self.clone())
    }
}
