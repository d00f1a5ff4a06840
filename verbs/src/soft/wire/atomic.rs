//! Atomic extended transport headers (spec `roce-wire.md` §3.1): the AtomicETH of
//! COMPARE_SWAP / FETCH_ADD requests ([`eth`]) and the AtomicAckETH of ATOMIC_ACKNOWLEDGE
//! responses ([`ack`]).
//!
//! Naming trap (spec §3.1): for CmpSwap the WR's `compare_add` goes into `compare` and `swap`
//! into `swap_add`; for FetchAdd `compare_add` (the add value) goes into `swap_add`.

pub use self::ack::AtomicAckEthRepr;
pub use self::eth::AtomicEthRepr;

pub mod eth {
    //! Atomic Extended Transport Header (AtomicETH, 28 bytes).
    //!
    //! ```text
    //! byte 0-7    virtual address (8-byte aligned)
    //! byte 8-11   R_Key
    //! byte 12-19  swap (CmpSwap) or add (FetchAdd) value
    //! byte 20-27  compare value (CmpSwap; ignored for FetchAdd)
    //! ```

    use core::fmt;

    use super::super::bytes::{get_u32, get_u64, header_view, set_u32, set_u64};
    use super::super::{Result, WireError};

    mod field {
        use super::super::super::bytes::Field;

        /// Remote virtual address.
        pub(super) const VA: Field = 0..8;
        /// Remote key.
        pub(super) const RKEY: Field = 8..12;
        /// Swap or add value.
        pub(super) const SWAP_ADD: Field = 12..20;
        /// Compare value.
        pub(super) const COMPARE: Field = 20..28;
    }

    /// Length of the AtomicETH in bytes.
    pub const HEADER_LEN: usize = 28;

    header_view! {
        /// A read/write view of an AtomicETH at the start of a buffer.
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

        /// The swap (CmpSwap) or add (FetchAdd) value.
        #[inline]
        pub fn swap_add(&self) -> u64 {
            get_u64(self.buffer.as_ref(), field::SWAP_ADD)
        }

        /// The compare value (CmpSwap).
        #[inline]
        pub fn compare(&self) -> u64 {
            get_u64(self.buffer.as_ref(), field::COMPARE)
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

        /// Sets the swap or add value.
        #[inline]
        pub fn set_swap_add(&mut self, value: u64) {
            set_u64(self.buffer.as_mut(), field::SWAP_ADD, value);
        }

        /// Sets the compare value.
        #[inline]
        pub fn set_compare(&mut self, value: u64) {
            set_u64(self.buffer.as_mut(), field::COMPARE, value);
        }
    }

    /// The decoded fields of an AtomicETH.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct AtomicEthRepr {
        /// Remote virtual address (must be 8-byte aligned; checked by the responder).
        pub va: u64,
        /// Remote key.
        pub rkey: u32,
        /// Swap value (CmpSwap) or add value (FetchAdd).
        pub swap_add: u64,
        /// Compare value (CmpSwap; ignored for FetchAdd).
        pub compare: u64,
    }

    impl AtomicEthRepr {
        /// Decodes an AtomicETH.
        ///
        /// # Errors
        ///
        /// [`WireError::Truncated`] if the buffer is shorter than [`HEADER_LEN`].
        pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self> {
            packet.check_len()?;
            Ok(Self {
                va: packet.va(),
                rkey: packet.rkey(),
                swap_add: packet.swap_add(),
                compare: packet.compare(),
            })
        }

        /// Length of the emitted header.
        pub const fn buffer_len(&self) -> usize {
            HEADER_LEN
        }

        /// Writes the AtomicETH.
        pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
            packet.set_va(self.va);
            packet.set_rkey(self.rkey);
            packet.set_swap_add(self.swap_add);
            packet.set_compare(self.compare);
        }
    }

    impl fmt::Display for AtomicEthRepr {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(
                f,
                "AtomicETH va=0x{:x} rkey=0x{:08x} swap_add=0x{:x} compare=0x{:x}",
                self.va, self.rkey, self.swap_add, self.compare
            )
        }
    }
}

pub mod ack {
    //! Atomic Acknowledge Extended Transport Header (AtomicAckETH, 8 bytes).
    //!
    //! ```text
    //! byte 0-7    original remote value (before the operation)
    //! ```

    use core::fmt;

    use super::super::bytes::{get_u64, header_view, set_u64};
    use super::super::{Result, WireError};

    mod field {
        use super::super::super::bytes::Field;

        /// Original remote value.
        pub(super) const ORIG: Field = 0..8;
    }

    /// Length of the AtomicAckETH in bytes.
    pub const HEADER_LEN: usize = 8;

    header_view! {
        /// A read/write view of an AtomicAckETH at the start of a buffer.
    }

    impl<T: AsRef<[u8]>> Packet<T> {
        /// The original remote value.
        #[inline]
        pub fn orig(&self) -> u64 {
            get_u64(self.buffer.as_ref(), field::ORIG)
        }
    }

    impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
        /// Sets the original remote value.
        #[inline]
        pub fn set_orig(&mut self, value: u64) {
            set_u64(self.buffer.as_mut(), field::ORIG, value);
        }
    }

    /// The decoded fields of an AtomicAckETH.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct AtomicAckEthRepr {
        /// The remote value before the atomic operation.
        pub orig: u64,
    }

    impl AtomicAckEthRepr {
        /// Decodes an AtomicAckETH.
        ///
        /// # Errors
        ///
        /// [`WireError::Truncated`] if the buffer is shorter than [`HEADER_LEN`].
        pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self> {
            packet.check_len()?;
            Ok(Self {
                orig: packet.orig(),
            })
        }

        /// Length of the emitted header.
        pub const fn buffer_len(&self) -> usize {
            HEADER_LEN
        }

        /// Writes the AtomicAckETH.
        pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
            packet.set_orig(self.orig);
        }
    }

    impl fmt::Display for AtomicAckEthRepr {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "AtomicAckETH orig=0x{:x}", self.orig)
        }
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

    use super::super::WireError;
    use super::*;

    /// AtomicETH of golden frame 9 (COMPARE_SWAP).
    const ATOMIC_ETH: [u8; 28] = [
        0x00, 0x00, 0x7f, 0x00, 0x12, 0x34, 0x01, 0x00, 0x00, 0x00, 0x12, 0x34, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x11, 0x11, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x22, 0x22,
    ];
    const ATOMIC_ETH_REPR: AtomicEthRepr = AtomicEthRepr {
        va: 0x7F00_1234_0100,
        rkey: 0x1234,
        swap_add: 0x1111,
        compare: 0x2222,
    };
    /// AtomicAckETH of golden frame 10 (ATOMIC_ACKNOWLEDGE).
    const ATOMIC_ACK_ETH: [u8; 8] = [0, 0, 0, 0, 0, 0, 0x22, 0x22];

    #[test]
    fn golden_bytes_to_fields() {
        let packet = eth::Packet::new_checked(&ATOMIC_ETH[..]).unwrap();
        assert_eq!(packet.va(), 0x7F00_1234_0100);
        assert_eq!(packet.rkey(), 0x1234);
        assert_eq!(packet.swap_add(), 0x1111);
        assert_eq!(packet.compare(), 0x2222);
        assert_eq!(AtomicEthRepr::parse(&packet), Ok(ATOMIC_ETH_REPR));

        let packet = ack::Packet::new_checked(&ATOMIC_ACK_ETH[..]).unwrap();
        assert_eq!(packet.orig(), 0x2222);
        assert_eq!(
            AtomicAckEthRepr::parse(&packet),
            Ok(AtomicAckEthRepr { orig: 0x2222 })
        );
    }

    #[test]
    fn fields_to_golden_bytes() {
        let mut buf = [0xFFu8; eth::HEADER_LEN];
        assert_eq!(ATOMIC_ETH_REPR.buffer_len(), buf.len());
        ATOMIC_ETH_REPR.emit(&mut eth::Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, ATOMIC_ETH);

        let mut buf = [0xFFu8; ack::HEADER_LEN];
        let repr = AtomicAckEthRepr { orig: 0x2222 };
        assert_eq!(repr.buffer_len(), buf.len());
        repr.emit(&mut ack::Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, ATOMIC_ACK_ETH);
    }

    #[test]
    fn rejects_short_buffer() {
        assert_eq!(
            eth::Packet::new_checked(&ATOMIC_ETH[..27]).err(),
            Some(WireError::Truncated)
        );
        assert_eq!(
            AtomicEthRepr::parse(&eth::Packet::new_unchecked(&ATOMIC_ETH[..8])),
            Err(WireError::Truncated)
        );
        assert_eq!(
            ack::Packet::new_checked(&ATOMIC_ACK_ETH[..7]).err(),
            Some(WireError::Truncated)
        );
        assert_eq!(
            AtomicAckEthRepr::parse(&ack::Packet::new_unchecked(&ATOMIC_ACK_ETH[..0])),
            Err(WireError::Truncated)
        );
    }

    #[test]
    fn display() {
        assert_eq!(
            ATOMIC_ETH_REPR.to_string(),
            "AtomicETH va=0x7f0012340100 rkey=0x00001234 swap_add=0x1111 compare=0x2222"
        );
        assert_eq!(
            AtomicAckEthRepr { orig: 0x2222 }.to_string(),
            "AtomicAckETH orig=0x2222"
        );
    }

    proptest! {
        #[test]
        fn round_trip(
            va in any::<u64>(),
            rkey in any::<u32>(),
            swap_add in any::<u64>(),
            compare in any::<u64>(),
        ) {
            let repr = AtomicEthRepr { va, rkey, swap_add, compare };
            let mut buf = [0u8; eth::HEADER_LEN];
            repr.emit(&mut eth::Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(AtomicEthRepr::parse(&eth::Packet::new_unchecked(&buf[..])), Ok(repr));

            let repr = AtomicAckEthRepr { orig: swap_add };
            let mut buf = [0u8; ack::HEADER_LEN];
            repr.emit(&mut ack::Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(
                AtomicAckEthRepr::parse(&ack::Packet::new_unchecked(&buf[..])),
                Ok(repr)
            );
        }
    }
}
