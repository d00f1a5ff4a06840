//! Panic-free big-endian field access shared by the header views.
//!
//! Every reader returns 0 and every writer does nothing when the field lies outside the buffer,
//! so a view never panics, even before `check_len`. With the constant field ranges the header
//! modules use, these compile down to one bounds check and a byte swap.

use core::ops::Range;

/// A byte range inside a header.
pub(super) type Field = Range<usize>;

/// Reads the byte at `at`.
#[inline]
pub(super) fn get_u8(data: &[u8], at: usize) -> u8 {
    data.get(at).copied().unwrap_or(0)
}

/// Writes the byte at `at`.
#[inline]
pub(super) fn set_u8(data: &mut [u8], at: usize, value: u8) {
    if let Some(byte) = data.get_mut(at) {
        *byte = value;
    }
}

/// Reads bit(s) `mask` of the byte at `at`: true when any of them is set.
#[inline]
pub(super) fn get_flag(data: &[u8], at: usize, mask: u8) -> bool {
    get_u8(data, at) & mask != 0
}

/// Sets or clears the bit(s) `mask` of the byte at `at`.
#[inline]
pub(super) fn set_flag(data: &mut [u8], at: usize, mask: u8, value: bool) {
    let old = get_u8(data, at);
    set_u8(data, at, if value { old | mask } else { old & !mask });
}

#[inline]
fn get_array<const N: usize>(data: &[u8], field: Field) -> [u8; N] {
    data.get(field)
        .and_then(|bytes| <[u8; N]>::try_from(bytes).ok())
        .unwrap_or([0; N])
}

#[inline]
fn set_array<const N: usize>(data: &mut [u8], field: Field, value: [u8; N]) {
    if let Some(bytes) = data
        .get_mut(field)
        .and_then(|bytes| <&mut [u8; N]>::try_from(bytes).ok())
    {
        *bytes = value;
    }
}

/// Reads a big-endian `u16` (`field` must span 2 bytes).
#[inline]
pub(super) fn get_u16(data: &[u8], field: Field) -> u16 {
    u16::from_be_bytes(get_array(data, field))
}

/// Writes a big-endian `u16` (`field` must span 2 bytes).
#[inline]
pub(super) fn set_u16(data: &mut [u8], field: Field, value: u16) {
    set_array(data, field, value.to_be_bytes());
}

/// Reads a big-endian 24-bit value (`field` must span 3 bytes).
#[inline]
pub(super) fn get_u24(data: &[u8], field: Field) -> u32 {
    let [a, b, c] = get_array(data, field);
    u32::from_be_bytes([0, a, b, c])
}

/// Writes the low 24 bits of `value`, big-endian (`field` must span 3 bytes).
#[inline]
pub(super) fn set_u24(data: &mut [u8], field: Field, value: u32) {
    let [_, a, b, c] = value.to_be_bytes();
    set_array(data, field, [a, b, c]);
}

/// Reads a big-endian `u32` (`field` must span 4 bytes).
#[inline]
pub(super) fn get_u32(data: &[u8], field: Field) -> u32 {
    u32::from_be_bytes(get_array(data, field))
}

/// Writes a big-endian `u32` (`field` must span 4 bytes).
#[inline]
pub(super) fn set_u32(data: &mut [u8], field: Field, value: u32) {
    set_array(data, field, value.to_be_bytes());
}

/// Reads a big-endian `u64` (`field` must span 8 bytes).
#[inline]
pub(super) fn get_u64(data: &[u8], field: Field) -> u64 {
    u64::from_be_bytes(get_array(data, field))
}

/// Writes a big-endian `u64` (`field` must span 8 bytes).
#[inline]
pub(super) fn set_u64(data: &mut [u8], field: Field, value: u64) {
    set_array(data, field, value.to_be_bytes());
}

/// Defines the smoltcp-style `Packet<T>` view of a fixed-length header: the struct and its
/// `new_unchecked`, `new_checked`, `check_len` and `into_inner`. The invoking module must have
/// `HEADER_LEN`, `Result` and `WireError` in scope.
macro_rules! header_view {
    ($(#[$meta:meta])*) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct Packet<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> Packet<T> {
            /// Wraps a buffer without checking its length; call `check_len` before trusting
            /// the accessors (they never panic, but read 0 from a short buffer).
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps a buffer after checking that it holds the whole header.
            ///
            /// # Errors
            ///
            /// [`WireError::Truncated`] if the buffer is shorter than [`HEADER_LEN`].
            pub fn new_checked(buffer: T) -> Result<Self> {
                let packet = Self::new_unchecked(buffer);
                packet.check_len()?;
                Ok(packet)
            }

            /// Checks that the buffer holds the whole header.
            ///
            /// # Errors
            ///
            /// [`WireError::Truncated`] if the buffer is shorter than [`HEADER_LEN`].
            pub fn check_len(&self) -> Result<()> {
                if self.buffer.as_ref().len() < HEADER_LEN {
                    Err(WireError::Truncated)
                } else {
                    Ok(())
                }
            }

            /// Returns the underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}

pub(super) use header_view;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_out_of_range() {
        let mut buf = [0u8; 8];
        set_u24(&mut buf, 1..4, 0xABCD_EF12);
        assert_eq!(buf[..5], [0, 0xCD, 0xEF, 0x12, 0]);
        assert_eq!(get_u24(&buf, 1..4), 0xCD_EF12);
        set_u64(&mut buf, 0..8, 0x0102_0304_0506_0708);
        assert_eq!(buf, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(get_u16(&buf, 6..8), 0x0708);
        assert_eq!(get_u32(&buf, 0..4), 0x0102_0304);
        // Out of range: reads give 0, writes do nothing.
        assert_eq!(get_u32(&buf, 6..10), 0);
        assert_eq!(get_u8(&buf, 8), 0);
        set_u32(&mut buf, 6..10, 0xFFFF_FFFF);
        set_u8(&mut buf, 9, 0xFF);
        assert_eq!(buf, [1, 2, 3, 4, 5, 6, 7, 8]);
        set_flag(&mut buf, 0, 0x80, true);
        assert!(get_flag(&buf, 0, 0x80));
        set_flag(&mut buf, 0, 0x80, false);
        assert_eq!(buf[0], 1);
    }
}
