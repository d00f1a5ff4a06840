//! RDMA Extended Transport Header (RETH, 16 bytes, spec `roce-wire.md` §3.1).
//!
//! Carried by RDMA_WRITE_FIRST, RDMA_WRITE_ONLY(_WITH_IMMEDIATE) and RDMA_READ_REQUEST.
//!
//! ```text
//! byte 0-7    virtual address
//! byte 8-11   R_Key
//! byte 12-15  DMA length (of the whole message)
//! ```

use core::fmt;

use super::bytes::{get_u32, get_u64, header_view, set_u32, set_u64};
use super::{Result, WireError};

mod field {
    use super::super::bytes::Field;

    /// Remote virtual address.
    pub(super) const VA: Field = 0..8;
    /// Remote key.
    pub(super) const RKEY: Field = 8..12;
    /// DMA length.
    pub(super) const DMA_LEN: Field = 12..16;
}

/// Length of the RETH in bytes.
pub const HEADER_LEN: usize = 16;

header_view! {
    /// A read/write view of a RETH at the start of a buffer.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The remote virtual address.
    #[inline]
    pub fn va(&self) -> u64 {
        get_u64(self.buffer.as_ref(), field::VA)
    }

    /// The remote key.
    #[inline]
    pub fn rkey(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::RKEY)
    }

    /// The DMA length: the length of the whole message, not of this packet.
    #[inline]
    pub fn dma_len(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::DMA_LEN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the remote virtual address.
    #[inline]
    pub fn set_va(&mut self, value: u64) {
        set_u64(self.buffer.as_mut(), field::VA, value);
    }

    /// Sets the remote key.
    #[inline]
    pub fn set_rkey(&mut self, value: u32) {
        set_u32(self.buffer.as_mut(), field::RKEY, value);
    }

    /// Sets the DMA length.
    #[inline]
    pub fn set_dma_len(&mut self, value: u32) {
        set_u32(self.buffer.as_mut(), field::DMA_LEN, value);
    }
}

/// The decoded fields of a RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RethRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length of the whole message in bytes.
    pub dma_len: u32,
}

impl RethRepr {
    /// Decodes a RETH.
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if the buffer is shorter than [`HEADER_LEN`].
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self> {
        packet.check_len()?;
        Ok(Self {
            va: packet.va(),
            rkey: packet.rkey(),
            dma_len: packet.dma_len(),
        })
    }

    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the RETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_va(self.va);
        packet.set_rkey(self.rkey);
        packet.set_dma_len(self.dma_len);
    }
}

impl fmt::Display for RethRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RETH va=0x{:x} rkey=0x{:08x} len={}",
            self.va, self.rkey, self.dma_len
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

    /// RETH of golden frame 4 (RDMA READ request for 8192 bytes).
    const GOLDEN: [u8; 16] = [
        0x00, 0x00, 0x7f, 0x00, 0x12, 0x34, 0x00, 0x00, 0x00, 0x00, 0x12, 0x34, 0x00, 0x00, 0x20,
        0x00,
    ];
    const REPR: RethRepr = RethRepr {
        va: 0x7F00_1234_0000,
        rkey: 0x1234,
        dma_len: 8192,
    };

    #[test]
    fn golden_bytes_to_fields() {
        let packet = Packet::new_checked(&GOLDEN[..]).unwrap();
        assert_eq!(packet.va(), 0x7F00_1234_0000);
        assert_eq!(packet.rkey(), 0x1234);
        assert_eq!(packet.dma_len(), 8192);
        assert_eq!(RethRepr::parse(&packet), Ok(REPR));
    }

    #[test]
    fn fields_to_golden_bytes() {
        let mut buf = [0xFFu8; HEADER_LEN];
        assert_eq!(REPR.buffer_len(), buf.len());
        REPR.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, GOLDEN);
    }

    #[test]
    fn rejects_short_buffer() {
        assert_eq!(
            Packet::new_checked(&GOLDEN[..15]).err(),
            Some(WireError::Truncated)
        );
        assert_eq!(
            RethRepr::parse(&Packet::new_unchecked(&GOLDEN[..4])),
            Err(WireError::Truncated)
        );
    }

    #[test]
    fn display() {
        assert_eq!(
            REPR.to_string(),
            "RETH va=0x7f0012340000 rkey=0x00001234 len=8192"
        );
    }

    proptest! {
        #[test]
        fn round_trip(va in any::<u64>(), rkey in any::<u32>(), dma_len in any::<u32>()) {
            let repr = RethRepr { va, rkey, dma_len };
            let mut buf = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(RethRepr::parse(&Packet::new_unchecked(&buf[..])), Ok(repr));
        }
    }
}
