//! Immediate data (ImmDt) and Invalidate Extended Transport Header (IETH), both one 4-byte
//! word (spec `roce-wire.md` §3.1), so one view serves both:
//!
//! * ImmDt: opaque immediate data, delivered unchanged as `wc.imm_data` (network order);
//! * IETH: the R_Key to invalidate at the responder.
//!
//! Their decoded form is a plain `u32` (the big-endian word read as a number), see [`parse`]
//! and [`emit`].

use super::bytes::{get_u32, header_view, set_u32};
use super::{Result, WireError};

mod field {
    use super::super::bytes::Field;

    /// The 32-bit word.
    pub(super) const VALUE: Field = 0..4;
}

/// Length of the ImmDt and of the IETH in bytes.
pub const HEADER_LEN: usize = 4;

header_view! {
    /// A read/write view of an ImmDt or IETH at the start of a buffer.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The word: immediate data (ImmDt) or the R_Key to invalidate (IETH).
    #[inline]
    pub fn value(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::VALUE)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the word.
    #[inline]
    pub fn set_value(&mut self, value: u32) {
        set_u32(self.buffer.as_mut(), field::VALUE, value);
    }
}

/// Decodes an ImmDt or IETH.
///
/// # Errors
///
/// [`WireError::Truncated`] if the buffer is shorter than [`HEADER_LEN`].
pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<u32> {
    packet.check_len()?;
    Ok(packet.value())
}

/// Writes an ImmDt or IETH.
pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(value: u32, packet: &mut Packet<&mut T>) {
    packet.set_value(value);
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// ImmDt of golden frame 2 and IETH of golden frame 11.
    const IMMDT: [u8; 4] = [0xde, 0xad, 0xbe, 0xef];
    const IETH: [u8; 4] = [0x00, 0x00, 0x12, 0x34];

    #[test]
    fn golden_bytes_to_fields() {
        let packet = Packet::new_checked(&IMMDT[..]).unwrap();
        assert_eq!(packet.value(), 0xDEAD_BEEF);
        assert_eq!(parse(&packet), Ok(0xDEAD_BEEF));
        assert_eq!(parse(&Packet::new_checked(&IETH[..]).unwrap()), Ok(0x1234));
    }

    #[test]
    fn fields_to_golden_bytes() {
        let mut buf = [0u8; HEADER_LEN];
        emit(0xDEAD_BEEF, &mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, IMMDT);
        emit(0x1234, &mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, IETH);
    }

    #[test]
    fn rejects_short_buffer() {
        assert_eq!(
            Packet::new_checked(&IMMDT[..3]).err(),
            Some(WireError::Truncated)
        );
        assert_eq!(
            parse(&Packet::new_unchecked(&IMMDT[..1])),
            Err(WireError::Truncated)
        );
        assert_eq!(Packet::new_unchecked(&IMMDT[..2]).value(), 0);
    }

    proptest! {
        #[test]
        fn round_trip(value in any::<u32>()) {
            let mut buf = [0u8; HEADER_LEN];
            emit(value, &mut Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(parse(&Packet::new_unchecked(&buf[..])), Ok(value));
        }
    }
}
