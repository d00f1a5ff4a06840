//! Registered memory: the bytes behind a memory region.
//!
//! A soft NIC writes into registered memory from its own threads on behalf of remote peers
//! (RDMA WRITE, atomics, incoming SENDs), at any time, exactly like a hardware NIC's DMA. To
//! keep that free of data races in the Rust sense, the bytes are never handed out as `&[u8]` /
//! `&mut [u8]`: every access, by the NIC or by the application, goes through this module's
//! copy functions, which use relaxed atomic loads and stores (plain moves on x86-64 and
//! aarch64). A reader racing a remote writer may see a mix of old and new bytes — the same
//! guarantee real RDMA gives — but never undefined behaviour. 8-byte aligned words are also
//! available as `AtomicU64` for RDMA atomics.
//!
//! A region may instead be backed by immutable application bytes ([`SharedBytes`]), which
//! are only read: every write path here refuses them, and they can only be registered with
//! remote read access.
//!
//! A third kind of region is *foreign*: another process's registered memory, which a soft
//! NIC hosting a shared XRC domain (`soft::xrcd`) reaches with `process_vm_readv` /
//! `process_vm_writev`, the way a NIC DMAs into any process's pages. Its bytes are never
//! touched through pointers in this process. To the owning process such a write is like a
//! hardware NIC's DMA: it happens outside its threads, and its own accesses stay atomic.
//!
//! This is the only module of the soft provider that contains `unsafe` apart from the
//! system-call wrappers in `soft::driver::sys`.
#![allow(unsafe_code)]

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use crate::bytes::SharedBytes;

/// Alignment of every registered buffer (a page, as a hardware NIC would like it).
const ALIGN: usize = 4096;

/// The bytes behind a region: either an owned, zero-initialised, page-aligned allocation
/// accessed only through atomics, or immutable application bytes ([`SharedBytes`]) that are
/// only ever read.
#[derive(Debug)]
pub struct RegisteredMemory {
    ptr: NonNull<u8>,
    len: usize,
    shared: Option<SharedBytes>,
    /// For foreign memory: the process whose address space `ptr` is in.
    foreign: Option<libc::pid_t>,
    /// Foreign memory whose registration was withdrawn: every access fails from then on.
    revoked: std::sync::atomic::AtomicBool,
    /// Application memory handed over (`adopt`): a `Box<[u8]>` of `len` bytes at `ptr`,
    /// given back by `into_box` or freed as one.
    adopted: bool,
}

/// Serialises read-modify-write atomics on foreign memory, so that the atomics one soft NIC
/// performs on another process's words are atomic with respect to each other.
static FOREIGN_ATOMICS: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

// SAFETY: an owned allocation is only ever accessed through atomic operations (see the
// module docs), and shared bytes are immutable and only read through `&[u8]`, so sharing
// either between threads cannot race.
unsafe impl Send for RegisteredMemory {}
// SAFETY: as above; `&RegisteredMemory` only permits atomic accesses.
unsafe impl Sync for RegisteredMemory {}

impl RegisteredMemory {
    /// Allocates `len` zeroed bytes (at least one byte is allocated so that the address is
    /// unique even for empty regions). Returns `None` when the size is impossible or the
    /// allocator fails.
    pub fn new(len: usize) -> Option<Self> {
        let layout = Layout::from_size_align(len.max(1), ALIGN).ok()?;
        // SAFETY: `layout` has a non-zero size (len.max(1)).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw)?;
        Some(Self {
            ptr,
            len,
            shared: None,
            foreign: None,
            revoked: std::sync::atomic::AtomicBool::new(false),
            adopted: false,
        })
    }

    /// Describes `len` bytes at `addr` in process `pid` (another process's registered
    /// memory, mirrored into a soft NIC that hosts a shared XRC domain). `None` for a null
    /// address. Nothing is mapped: every access is a `process_vm_readv` / `process_vm_writev`
    /// that fails cleanly (returns false) if the range is no longer mapped there.
    pub(crate) fn foreign(pid: libc::pid_t, addr: u64, len: usize) -> Option<Self> {
        let ptr = NonNull::new(usize::try_from(addr).ok()? as *mut u8)?;
        Some(Self {
            ptr,
            len,
            shared: None,
            foreign: Some(pid),
            revoked: std::sync::atomic::AtomicBool::new(false),
            adopted: false,
        })
    }

    /// Withdraws a foreign region: accesses already under way finish, later ones fail (the
    /// caller holds the NIC lock, which every access runs under, so none is under way).
    pub(crate) fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
    }

    /// The process owning a foreign region.
    pub(crate) fn foreign_pid(&self) -> Option<libc::pid_t> {
        self.foreign
    }

    /// Takes over application memory (`ibv_reg_mr` on a buffer the caller owns): from now
    /// on it is accessed only through this module's atomic copies, like an allocation of
    /// ours, and [`into_box`](Self::into_box) gives it back. `None` for an empty buffer (it
    /// has no address of its own).
    pub fn adopt(bytes: Box<[u8]>) -> Option<Self> {
        if bytes.is_empty() {
            return None;
        }
        let len = bytes.len();
        let ptr = NonNull::new(Box::into_raw(bytes).cast::<u8>())?;
        Some(Self {
            ptr,
            len,
            shared: None,
            foreign: None,
            revoked: std::sync::atomic::AtomicBool::new(false),
            adopted: true,
        })
    }

    /// Whether this is application memory [`adopt`](Self::adopt) took over.
    pub fn is_adopted(&self) -> bool {
        self.adopted
    }

    /// The memory [`adopt`](Self::adopt) took over, given back (the caller holds the only
    /// reference: nothing, the NIC included, can access it any more).
    ///
    /// # Errors
    /// `self` back, for memory that was not adopted.
    pub fn into_box(self) -> Result<Box<[u8]>, Self> {
        if !self.adopted {
            return Err(self);
        }
        // (Not dropped: the box below owns the bytes now; an adopted region has no shared
        // owner to release.)
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `ptr` and `len` are those of the `Box<[u8]>` `adopt` took apart; `me` is
        // never dropped, so the bytes are freed once, by the box; `self` was owned, so no
        // reference to them outlives this.
        Ok(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(me.ptr.as_ptr(), me.len)) })
    }

    /// Wraps immutable application bytes; `None` for an empty view (it has no address of
    /// its own). The result is read-only: [`write`](Self::write), [`fill`](Self::fill) and
    /// [`atomic_u64`](Self::atomic_u64) refuse it.
    pub fn from_shared(bytes: SharedBytes) -> Option<Self> {
        if bytes.is_empty() {
            return None;
        }
        let ptr = NonNull::new(bytes.as_ptr().cast_mut())?;
        Some(Self {
            ptr,
            len: bytes.len(),
            shared: Some(bytes),
            foreign: None,
            revoked: std::sync::atomic::AtomicBool::new(false),
            adopted: false,
        })
    }

    /// The application bytes behind a read-only region.
    pub fn shared(&self) -> Option<&SharedBytes> {
        self.shared.as_ref()
    }

    /// True for application bytes registered read-only.
    pub fn is_read_only(&self) -> bool {
        self.shared.is_some()
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The virtual address of the first byte (what verbs calls the MR's `addr`).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as usize as u64
    }

    /// A raw pointer to the first byte. Creating it is safe; dereferencing it is the caller's
    /// business (see [`MemoryRegion::as_mut_ptr`](crate::MemoryRegion::as_mut_ptr)).
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    fn byte(&self, i: usize) -> &AtomicU8 {
        debug_assert!(i < self.len);
        // SAFETY: callers check `i < self.len`; the pointer is inside our live allocation and
        // is only ever accessed atomically, so creating an `&AtomicU8` is sound.
        unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(i)) }
    }

    /// Whether the byte at `i` is 8-byte aligned in memory (the base of an allocation of
    /// ours is page aligned; adopted application memory may start anywhere).
    fn aligned(&self, i: usize) -> bool {
        (self.addr() as usize).wrapping_add(i).is_multiple_of(8)
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i + 8 <= self.len && self.aligned(i));
        // SAFETY: callers check that `i..i+8` is inside the allocation and that its address
        // is 8-byte aligned (`aligned`); all accesses are atomic.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(i).cast::<u64>()) }
    }

    /// The atomic word at `offset`, if it is 8-byte aligned and inside the region.
    pub fn atomic_u64(&self, offset: usize) -> Option<&AtomicU64> {
        let end = offset.checked_add(8)?;
        if self.shared.is_some()
            || self.foreign.is_some()
            || end > self.len
            || !self.aligned(offset)
        {
            return None;
        }
        Some(self.word(offset))
    }

    /// RDMA compare-and-swap on the 8-byte word at `offset`: returns the original value, or
    /// `None` when the word is misaligned, outside the region or read-only.
    pub fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> Option<u64> {
        if let Some(w) = self.atomic_u64(offset) {
            return Some(
                match w.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) | Err(v) => v,
                },
            );
        }
        self.foreign_rmw(offset, |v| if v == compare { swap } else { v })
    }

    /// RDMA fetch-and-add on the 8-byte word at `offset`: returns the original value, or
    /// `None` as for [`compare_swap`](Self::compare_swap).
    pub fn fetch_add(&self, offset: usize, add: u64) -> Option<u64> {
        if let Some(w) = self.atomic_u64(offset) {
            return Some(w.fetch_add(add, Ordering::SeqCst));
        }
        self.foreign_rmw(offset, |v| v.wrapping_add(add))
    }

    /// A read-modify-write of a foreign word, atomic with respect to every other atomic
    /// this process's soft NICs perform on foreign memory (not to the owner's own).
    fn foreign_rmw(&self, offset: usize, f: impl FnOnce(u64) -> u64) -> Option<u64> {
        let end = offset.checked_add(8)?;
        if self.foreign.is_none() || end > self.len || !offset.is_multiple_of(8) {
            return None;
        }
        let _g = FOREIGN_ATOMICS.lock();
        let mut b = [0u8; 8];
        if !self.read(offset, &mut b) {
            return None;
        }
        let old = u64::from_ne_bytes(b);
        self.write(offset, &f(old).to_ne_bytes()).then_some(old)
    }

    /// Copies between this process and foreign memory at `offset` (`write`: into it).
    fn foreign_copy(
        &self,
        pid: libc::pid_t,
        offset: usize,
        buf: *mut u8,
        len: usize,
        write: bool,
    ) -> bool {
        if self.revoked.load(Ordering::Acquire) {
            return false;
        }
        let mut done = 0usize;
        while done < len {
            let local = libc::iovec {
                iov_base: buf.wrapping_add(done).cast::<libc::c_void>(),
                iov_len: len - done,
            };
            let remote = libc::iovec {
                iov_base: self
                    .ptr
                    .as_ptr()
                    .wrapping_add(offset + done)
                    .cast::<libc::c_void>(),
                iov_len: len - done,
            };
            // SAFETY: `local` describes `len - done` bytes of a live buffer the caller owns
            // (a `&mut [u8]` for reads, a `&[u8]` that is only read for writes); `remote` is
            // an address in another process, which the kernel checks and never dereferences
            // here. Neither iovec outlives the call.
            let n = unsafe {
                if write {
                    libc::process_vm_writev(pid, &local, 1, &remote, 1, 0)
                } else {
                    libc::process_vm_readv(pid, &local, 1, &remote, 1, 0)
                }
            };
            if n <= 0 {
                return false;
            }
            done += n as usize;
        }
        true
    }

    /// Copies `dst.len()` bytes starting at `offset` into `dst`. Returns false (copying
    /// nothing) when the range is outside the region.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> bool {
        let Some(end) = offset.checked_add(dst.len()) else {
            return false;
        };
        if end > self.len {
            return false;
        }
        if let Some(b) = &self.shared {
            dst.copy_from_slice(&b[offset..end]);
            return true;
        }
        if let Some(pid) = self.foreign {
            return self.foreign_copy(pid, offset, dst.as_mut_ptr(), dst.len(), false);
        }
        let mut i = offset;
        let mut d = 0;
        // Leading bytes up to the next 8-byte boundary.
        while i < end && !self.aligned(i) {
            dst[d] = self.byte(i).load(Ordering::Relaxed);
            i += 1;
            d += 1;
        }
        // Whole words: one bounds check for the run, then word loads straight into `dst`
        // (this loop runs at several times the speed of one checked 8-byte copy per word).
        let words = (end - i) / 8;
        let out = &mut dst[d..d + words * 8];
        for (k, chunk) in out.chunks_exact_mut(8).enumerate() {
            let w = self.word(i + k * 8).load(Ordering::Relaxed);
            chunk.copy_from_slice(&w.to_ne_bytes());
        }
        i += words * 8;
        d += words * 8;
        while i < end {
            dst[d] = self.byte(i).load(Ordering::Relaxed);
            i += 1;
            d += 1;
        }
        true
    }

    /// Copies `src` into the region at `offset`. Returns false (writing nothing) when the
    /// range is outside the region.
    pub fn write(&self, offset: usize, src: &[u8]) -> bool {
        let Some(end) = offset.checked_add(src.len()) else {
            return false;
        };
        if self.shared.is_some() || end > self.len {
            return false;
        }
        if let Some(pid) = self.foreign {
            // The kernel only reads through the local iovec of a process_vm_writev.
            return self.foreign_copy(pid, offset, src.as_ptr().cast_mut(), src.len(), true);
        }
        let mut i = offset;
        let mut s = 0;
        while i < end && !self.aligned(i) {
            self.byte(i).store(src[s], Ordering::Relaxed);
            i += 1;
            s += 1;
        }
        let words = (end - i) / 8;
        for (k, chunk) in src[s..s + words * 8].chunks_exact(8).enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            self.word(i + k * 8)
                .store(u64::from_ne_bytes(b), Ordering::Relaxed);
        }
        i += words * 8;
        s += words * 8;
        while i < end {
            self.byte(i).store(src[s], Ordering::Relaxed);
            i += 1;
            s += 1;
        }
        true
    }

    /// Sets `len` bytes at `offset` to `value`. Returns false when out of range.
    pub fn fill(&self, offset: usize, len: usize, value: u8) -> bool {
        let Some(end) = offset.checked_add(len) else {
            return false;
        };
        if self.shared.is_some() || end > self.len {
            return false;
        }
        if self.foreign.is_some() {
            return self.write(offset, &vec![value; len]);
        }
        for i in offset..end {
            self.byte(i).store(value, Ordering::Relaxed);
        }
        true
    }
}

impl Drop for RegisteredMemory {
    fn drop(&mut self) {
        if self.adopted {
            // SAFETY: `ptr` and `len` are those of the `Box<[u8]>` `adopt` took apart, which
            // is rebuilt and freed once (`into_box` does not drop what it gives back).
            drop(unsafe {
                Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                    self.ptr.as_ptr(),
                    self.len,
                ))
            });
            return;
        }
        if self.shared.is_some() || self.foreign.is_some() {
            // Not ours to free: dropping `shared` releases the application's owner, and
            // foreign memory belongs to another process.
            return;
        }
        // The layout was valid at allocation time, so rebuilding it cannot fail; if it somehow
        // did we leak rather than free with a wrong layout.
        if let Ok(layout) = Layout::from_size_align(self.len.max(1), ALIGN) {
            // SAFETY: `ptr` came from `alloc_zeroed` with this exact layout and is freed once.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_length_and_offset_round_trips() {
        let m = RegisteredMemory::new(256).unwrap();
        for off in 0..17 {
            for len in 0..120 {
                let data: Vec<u8> = (0..len).map(|i| (i * 7 + off + len) as u8).collect();
                m.fill(0, 256, 0xEE);
                assert!(m.write(off, &data));
                let mut all = vec![0u8; 256];
                assert!(m.read(0, &mut all));
                assert!(all[..off].iter().all(|&b| b == 0xEE), "before {off}+{len}");
                assert_eq!(&all[off..off + len], &data[..], "{off}+{len}");
                assert!(
                    all[off + len..].iter().all(|&b| b == 0xEE),
                    "after {off}+{len}"
                );
                let mut back = vec![0u8; len];
                assert!(m.read(off, &mut back));
                assert_eq!(back, data);
            }
        }
    }

    #[test]
    fn read_write_any_alignment() {
        let m = RegisteredMemory::new(100).unwrap();
        assert_eq!(m.addr() % ALIGN as u64, 0);
        let data: Vec<u8> = (0..37).collect();
        for off in 0..20 {
            assert!(m.write(off, &data));
            let mut out = vec![0u8; 37];
            assert!(m.read(off, &mut out));
            assert_eq!(out, data);
        }
        assert!(!m.write(90, &data));
        assert!(!m.read(usize::MAX, &mut [0u8; 2]));
        assert!(m.atomic_u64(8).is_some());
        assert!(m.atomic_u64(4).is_none());
        assert!(m.atomic_u64(96).is_none());
    }

    #[test]
    fn foreign_memory_of_this_process() {
        let own = RegisteredMemory::new(64).unwrap();
        let pid = std::process::id() as libc::pid_t;
        let f = RegisteredMemory::foreign(pid, own.addr(), 64).unwrap();
        assert!(f.write(3, b"hello"));
        let mut b = [0u8; 5];
        assert!(own.read(3, &mut b));
        assert_eq!(&b, b"hello");
        assert!(f.read(3, &mut b) && &b == b"hello");
        assert!(!f.write(62, b"abc"), "past the end");
        assert_eq!(f.fetch_add(8, 5), Some(0));
        assert_eq!(f.compare_swap(8, 5, 9), Some(5));
        assert_eq!(f.compare_swap(8, 5, 11), Some(9));
        assert_eq!(own.atomic_u64(8).unwrap().load(Ordering::SeqCst), 9);
        assert!(f.atomic_u64(8).is_none() && f.fetch_add(4, 1).is_none());
        assert!(f.fill(40, 4, 0xAB));
        let mut w = [0u8; 4];
        assert!(own.read(40, &mut w) && w == [0xAB; 4]);
        // An unmapped address fails cleanly.
        let gone = RegisteredMemory::foreign(pid, 8, 16).unwrap();
        assert!(!gone.write(0, b"x") && !gone.read(0, &mut [0u8; 1]));
    }

    #[test]
    fn empty_region() {
        let m = RegisteredMemory::new(0).unwrap();
        assert!(m.is_empty());
        assert!(m.read(0, &mut []));
        assert!(!m.read(0, &mut [0u8; 1]));
    }
}
