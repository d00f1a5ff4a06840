//! Shared, immutable bytes that a memory region can be registered on without copying.
//!
//! Registering application memory is only sound when the memory cannot be freed, moved or
//! changed while the NIC may still read it. [`SharedBytes`] gives that guarantee through
//! ownership instead of through allocator hooks: it holds a reference-counted (or `'static`)
//! owner of the bytes, so a region registered on it keeps the bytes alive for as long as the
//! region, and any operation still in flight on it, exists. The bytes are never written through
//! such a region: only `REMOTE_READ` access is allowed on it (see
//! [`ProtectionDomain::reg_shared`](crate::ProtectionDomain::reg_shared)).

use std::fmt;
use std::ops::{Bound, Deref, RangeBounds};
use std::sync::Arc;

#[derive(Clone)]
enum Owner {
    Slice(Arc<[u8]>),
    Vec(Arc<Vec<u8>>),
    Static(&'static [u8]),
}

impl Owner {
    fn bytes(&self) -> &[u8] {
        match self {
            Self::Slice(a) => a,
            Self::Vec(v) => v.as_slice(),
            Self::Static(s) => s,
        }
    }
}

/// An immutable view of bytes whose owner it keeps alive: an `Arc<[u8]>`, an `Arc<Vec<u8>>`
/// (a `Vec<u8>` converts without copying) or a `&'static [u8]`.
///
/// Cloning and slicing are cheap (a reference count). While any clone exists the bytes stay
/// where they are, so their address can be registered with the NIC.
#[derive(Clone)]
pub struct SharedBytes {
    owner: Owner,
    off: usize,
    len: usize,
}

impl SharedBytes {
    fn new(owner: Owner) -> Self {
        let len = owner.bytes().len();
        Self { owner, off: 0, len }
    }

    /// Number of bytes in this view.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty view.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The virtual address of the view's first byte.
    pub fn addr(&self) -> u64 {
        self.as_ptr() as usize as u64
    }

    /// A narrower view sharing the same owner; `None` when `range` is outside this view.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Option<Self> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.checked_add(1)?,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.checked_add(1)?,
            Bound::Excluded(&e) => e,
            Bound::Unbounded => self.len,
        };
        if start > end || end > self.len {
            return None;
        }
        Some(Self {
            owner: self.owner.clone(),
            off: self.off + start,
            len: end - start,
        })
    }

    /// How many references share the owner (every `SharedBytes` clone holds one, as does
    /// every other `Arc` the application keeps); `usize::MAX` for `'static` bytes. A value of
    /// 1 seen through a registered region means that only the region still holds the bytes.
    pub fn owner_refs(&self) -> usize {
        match &self.owner {
            Owner::Slice(a) => Arc::strong_count(a),
            Owner::Vec(v) => Arc::strong_count(v),
            Owner::Static(_) => usize::MAX,
        }
    }

    /// The view of everything the owner holds (what a registration cache registers, so
    /// that later views of other parts of the same owner find the same registration).
    pub fn whole(&self) -> Self {
        Self::new(self.owner.clone())
    }
}

impl Deref for SharedBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // In range by construction: `off + len` never exceeds the owner's length.
        self.owner
            .bytes()
            .get(self.off..self.off + self.len)
            .unwrap_or(&[])
    }
}

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBytes")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .finish()
    }
}

impl From<Arc<[u8]>> for SharedBytes {
    fn from(a: Arc<[u8]>) -> Self {
        Self::new(Owner::Slice(a))
    }
}

impl From<Arc<Vec<u8>>> for SharedBytes {
    fn from(v: Arc<Vec<u8>>) -> Self {
        Self::new(Owner::Vec(v))
    }
}

impl From<Vec<u8>> for SharedBytes {
    /// Takes the vector over without copying its bytes.
    fn from(v: Vec<u8>) -> Self {
        Self::new(Owner::Vec(Arc::new(v)))
    }
}

impl From<&'static [u8]> for SharedBytes {
    fn from(s: &'static [u8]) -> Self {
        Self::new(Owner::Static(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_share_the_owner_and_check_bounds() {
        let v: Vec<u8> = (0..100).collect();
        let ptr = v.as_ptr() as u64;
        let b = SharedBytes::from(v);
        assert_eq!(b.addr(), ptr, "a Vec converts without copying");
        let s = b.slice(10..20).unwrap();
        assert_eq!(&s[..], &(10..20).collect::<Vec<u8>>()[..]);
        assert_eq!(s.addr(), ptr + 10);
        let t = s.slice(5..).unwrap();
        assert_eq!(t[0], 15);
        assert_eq!(t.whole().len(), 100);
        assert!(s.slice(5..11).is_none());
        assert!(s.slice(..=10).is_none());
        assert!(s.slice(usize::MAX..).is_none());
        assert_eq!(s.slice(10..).unwrap().len(), 0);
        let st: SharedBytes = (&b"static"[..]).into();
        assert_eq!(&st[..], b"static");
        let a: Arc<[u8]> = Arc::from(&[1u8, 2, 3][..]);
        assert_eq!(SharedBytes::from(a).len(), 3);
    }
}
