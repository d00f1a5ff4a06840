//! Datagram Extended Transport Header (DETH, 8 bytes, spec `roce-wire.md` §3.1), carried by
//! UD SEND_ONLY(_WITH_IMMEDIATE).
//!
//! ```text
//! byte 0-3  Q_Key
//! byte 4    reserved
//! byte 5-7  source QPN (24 bits)
//! ```

use core::fmt;

use super::bytes::{get_u24, get_u32, header_view, set_u8, set_u24, set_u32};
use super::{Result, WireError};

mod field {
    use super::super::bytes::Field;

    /// Queue key.
    pub(super) const QKEY: Field = 0..4;
    /// Reserved byte.
    pub(super) const RESERVED: usize = 4;
    /// Source QP number (24 bits).
    pub(super) const SRC_QP: Field = 5..8;
}

/// Length of the DETH in bytes.
pub const HEADER_LEN: usize = 8;

/// Mask of the 24-bit source QPN.
pub const QPN_MASK: u32 = 0x00FF_FFFF;

header_view! {
    /// A read/write view of a DETH at the start of a buffer.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The queue key.
    #[inline]
    pub fn qkey(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::QKEY)
    }

    /// The source QP number (24 bits).
    #[inline]
    pub fn src_qp(&self) -> u32 {
        get_u24(self.buffer.as_ref(), field::SRC_QP)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the queue key.
    #[inline]
    pub fn set_qkey(&mut self, value: u32) {
        set_u32(self.buffer.as_mut(), field::QKEY, value);
    }

    /// Sets the source QP number (low 24 bits of `value`) and clears the reserved byte.
    #[inline]
    pub fn set_src_qp(&mut self, value: u32) {
        set_u8(self.buffer.as_mut(), field::RESERVED, 0);
        set_u24(self.buffer.as_mut(), field::SRC_QP, value);
    }
}

/// The decoded fields of a DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: u32,
    /// Source QP number (24 bits; emit masks it).
    pub src_qp: u32,
}

impl DethRepr {
    /// Decodes a DETH (the reserved byte is ignored).
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if the buffer is shorter than [`HEADER_LEN`].
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self> {
        packet.check_len()?;
        Ok(Self {
            qkey: packet.qkey(),
            src_qp: packet.src_qp(),
        })
    }

    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the DETH (reserved byte 0, source QPN masked to 24 bits).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_qkey(self.qkey);
        packet.set_src_qp(self.src_qp);
    }
}

impl fmt::Display for DethRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DETH qkey=0x{:08x} sqpn=0x{:06x}",
            self.qkey,
            self.src_qp & QPN_MASK
        )
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

    /// DETH of golden frame 12 (UD multicast).
    const GOLDEN: [u8; 8] = [0x11, 0x11, 0x11, 0x11, 0x00, 0x00, 0x00, 0x33];
    const REPR: DethRepr = DethRepr {
        qkey: 0x1111_1111,
        src_qp: 0x33,
    };

    #[test]
    fn golden_bytes_to_fields() {
        let packet = Packet::new_checked(&GOLDEN[..]).unwrap();
        assert_eq!(packet.qkey(), 0x1111_1111);
        assert_eq!(packet.src_qp(), 0x33);
        assert_eq!(DethRepr::parse(&packet), Ok(REPR));
    }

    #[test]
    fn fields_to_golden_bytes() {
        let mut buf = [0xFFu8; HEADER_LEN];
        assert_eq!(REPR.buffer_len(), buf.len());
        REPR.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, GOLDEN);
        let masked = DethRepr {
            src_qp: 0xAB00_0033,
            ..REPR
        };
        masked.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, GOLDEN);
    }

    #[test]
    fn rejects_short_buffer() {
        assert_eq!(
            Packet::new_checked(&GOLDEN[..7]).err(),
            Some(WireError::Truncated)
        );
        assert_eq!(
            DethRepr::parse(&Packet::new_unchecked(&GOLDEN[..4])),
            Err(WireError::Truncated)
        );
    }

    #[test]
    fn display() {
        assert_eq!(REPR.to_string(), "DETH qkey=0x11111111 sqpn=0x000033");
    }

    proptest! {
        #[test]
        fn round_trip(qkey in any::<u32>(), src_qp in 0u32..=QPN_MASK) {
            let repr = DethRepr { qkey, src_qp };
            let mut buf = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(DethRepr::parse(&Packet::new_unchecked(&buf[..])), Ok(repr));
        }
    }
}
