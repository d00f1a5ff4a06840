//! XRC Extended Transport Header (XRCETH, 4 bytes, spec `roce-wire.md` §3.1), carried first
//! after the BTH by every XRC request (0xA0..=0xAC, 0xB3..=0xB7).
//!
//! ```text
//! byte 0    reserved
//! byte 1-3  XRC SRQ number at the target (24 bits)
//! ```

use core::fmt;

use super::bytes::{get_u24, header_view, set_u8, set_u24};
use super::{Result, WireError};

mod field {
    use super::super::bytes::Field;

    /// Reserved byte.
    pub(super) const RESERVED: usize = 0;
    /// XRC SRQ number (24 bits).
    pub(super) const SRQN: Field = 1..4;
}

/// Length of the XRCETH in bytes.
pub const HEADER_LEN: usize = 4;

/// Mask of the 24-bit SRQ number.
pub const SRQN_MASK: u32 = 0x00FF_FFFF;

header_view! {
    /// A read/write view of an XRCETH at the start of a buffer.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The XRC SRQ number (24 bits).
    #[inline]
    pub fn srqn(&self) -> u32 {
        get_u24(self.buffer.as_ref(), field::SRQN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the XRC SRQ number (low 24 bits of `value`) and clears the reserved byte.
    #[inline]
    pub fn set_srqn(&mut self, value: u32) {
        set_u8(self.buffer.as_mut(), field::RESERVED, 0);
        set_u24(self.buffer.as_mut(), field::SRQN, value);
    }
}

/// The decoded fields of an XRCETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct XrcEthRepr {
    /// XRC SRQ number at the target (24 bits; emit masks it).
    pub srqn: u32,
}

impl XrcEthRepr {
    /// Decodes an XRCETH (the reserved byte is ignored).
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if the buffer is shorter than [`HEADER_LEN`].
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self> {
        packet.check_len()?;
        Ok(Self {
            srqn: packet.srqn(),
        })
    }

    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the XRCETH (reserved byte 0, SRQ number masked to 24 bits).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_srqn(self.srqn);
    }
}

impl fmt::Display for XrcEthRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "XRCETH srqn=0x{:06x}", self.srqn & SRQN_MASK)
    }
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

    /// XRCETH of golden frame 13 (XRC SEND_ONLY to SRQ 0x77).
    const GOLDEN: [u8; 4] = [0x00, 0x00, 0x00, 0x77];

    #[test]
    fn golden_bytes_to_fields() {
        let packet = Packet::new_checked(&GOLDEN[..]).unwrap();
        assert_eq!(packet.srqn(), 0x77);
        assert_eq!(XrcEthRepr::parse(&packet), Ok(XrcEthRepr { srqn: 0x77 }));
        // The reserved byte is ignored.
        let reserved_set = [0xFF, 0x00, 0x00, 0x77];
        assert_eq!(
            XrcEthRepr::parse(&Packet::new_unchecked(&reserved_set[..])),
            Ok(XrcEthRepr { srqn: 0x77 })
        );
    }

    #[test]
    fn fields_to_golden_bytes() {
        let mut buf = [0xFFu8; HEADER_LEN];
        let repr = XrcEthRepr { srqn: 0xFF00_0077 };
        assert_eq!(repr.buffer_len(), buf.len());
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, GOLDEN);
    }

    #[test]
    fn rejects_short_buffer() {
        assert_eq!(
            Packet::new_checked(&GOLDEN[..3]).err(),
            Some(WireError::Truncated)
        );
        assert_eq!(
            XrcEthRepr::parse(&Packet::new_unchecked(&GOLDEN[..0])),
            Err(WireError::Truncated)
        );
    }

    #[test]
    fn display() {
        assert_eq!(
            XrcEthRepr { srqn: 0x77 }.to_string(),
            "XRCETH srqn=0x000077"
        );
    }

    proptest! {
        #[test]
        fn round_trip(srqn in 0u32..=SRQN_MASK) {
            let repr = XrcEthRepr { srqn };
            let mut buf = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(XrcEthRepr::parse(&Packet::new_unchecked(&buf[..])), Ok(repr));
        }
    }
}
