//! ACK Extended Transport Header (AETH, 4 bytes, spec `roce-wire.md` §3.1, §3.2).
//!
//! ```text
//! byte 0    syndrome: reserved(7) class(6..5) value(4..0)
//! byte 1-3  MSN (24 bits)
//! ```
//!
//! Syndrome classes: 00 ACK (value = credit code), 01 RNR NAK (value = RNR timer code),
//! 10 reserved, 11 NAK (value = NAK code).

use core::fmt;

use super::bytes::{get_u8, get_u24, header_view, set_u8, set_u24};
use super::{Result, WireError};

mod field {
    use super::super::bytes::Field;

    /// Syndrome byte.
    pub(super) const SYNDROME: usize = 0;
    /// Message sequence number (24 bits).
    pub(super) const MSN: Field = 1..4;
}

/// Length of the AETH in bytes.
pub const HEADER_LEN: usize = 4;

/// Mask of the 24-bit MSN.
pub const MSN_MASK: u32 = 0x00FF_FFFF;

/// Credit code meaning "invalid / unlimited credits" (spec §3.2); the recommended code for
/// every ACK (mandatory with an SRQ).
pub const CREDIT_INVALID: u8 = 0x1F;

/// Number of receive WQEs announced by ACK credit codes 0..=30 (spec §3.2). Code 31 is
/// [`CREDIT_INVALID`].
pub const CREDIT_COUNTS: [u16; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12_288, 16_384, 24_576, 32_768,
];

/// RNR NAK timer codes 0..=31 in nanoseconds (spec §3.2; code 0 is the longest, 655.36 ms).
const RNR_TIMER_NS: [u64; 32] = [
    655_360_000,
    10_000,
    20_000,
    30_000,
    40_000,
    60_000,
    80_000,
    120_000,
    160_000,
    240_000,
    320_000,
    480_000,
    640_000,
    960_000,
    1_280_000,
    1_920_000,
    2_560_000,
    3_840_000,
    5_120_000,
    7_680_000,
    10_240_000,
    15_360_000,
    20_480_000,
    30_720_000,
    40_960_000,
    61_440_000,
    81_920_000,
    122_880_000,
    163_840_000,
    245_760_000,
    327_680_000,
    491_520_000,
];

/// The RNR wait time in nanoseconds for an RNR timer code (only the low 5 bits of `code` are
/// used). Code 0 means 655.36 ms, the longest wait, not "no wait" (spec §3.2, §11.6).
pub fn rnr_timer_ns(code: u8) -> u64 {
    RNR_TIMER_NS
        .get(usize::from(code & 0x1F))
        .copied()
        .unwrap_or(0)
}

/// The number of receive WQEs an ACK credit code announces, or `None` for code 31
/// ([`CREDIT_INVALID`], "no credit information"). Only the low 5 bits of `code` are used.
pub fn ack_credits(code: u8) -> Option<u32> {
    CREDIT_COUNTS
        .get(usize::from(code & 0x1F))
        .map(|&count| u32::from(count))
}

/// The largest credit code whose count does not exceed `available` receive WQEs (for a
/// responder that does end-to-end flow control; most send [`CREDIT_INVALID`] instead).
pub fn credit_code(available: u32) -> u8 {
    let codes = CREDIT_COUNTS
        .iter()
        .take_while(|&&count| u32::from(count) <= available)
        .count();
    // At least code 0 (count 0) always qualifies, and there are 31 codes, so 1..=31 fits u8.
    u8::try_from(codes.saturating_sub(1)).unwrap_or(0)
}

/// NAK codes (syndrome class 11, spec §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: PSN sequence error; BTH.PSN is the PSN the responder expects.
    PsnSequence,
    /// 1: invalid request.
    InvalidRequest,
    /// 2: remote access error.
    RemoteAccess,
    /// 3: remote operational error.
    RemoteOperational,
    /// 4: invalid RD request (RD only).
    InvalidRd,
    /// A reserved NAK code (5..=31). [`AethRepr::kind`] also reports the reserved syndrome
    /// class 10 this way, with the whole 7-bit syndrome (0x40..=0x5F) as the value.
    Reserved(u8),
}

impl NakCode {
    /// The NAK code for a 5-bit value (bits above 4 are ignored).
    pub const fn from_code(code: u8) -> Self {
        match code & 0x1F {
            0 => Self::PsnSequence,
            1 => Self::InvalidRequest,
            2 => Self::RemoteAccess,
            3 => Self::RemoteOperational,
            4 => Self::InvalidRd,
            other => Self::Reserved(other),
        }
    }

    /// The numeric code.
    pub const fn code(self) -> u8 {
        match self {
            Self::PsnSequence => 0,
            Self::InvalidRequest => 1,
            Self::RemoteAccess => 2,
            Self::RemoteOperational => 3,
            Self::InvalidRd => 4,
            Self::Reserved(code) => code,
        }
    }
}

impl fmt::Display for NakCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::PsnSequence => f.write_str("psn-sequence-error"),
            Self::InvalidRequest => f.write_str("invalid-request"),
            Self::RemoteAccess => f.write_str("remote-access-error"),
            Self::RemoteOperational => f.write_str("remote-operational-error"),
            Self::InvalidRd => f.write_str("invalid-rd-request"),
            Self::Reserved(code) => write!(f, "reserved-0x{code:02x}"),
        }
    }
}

/// The meaning of an AETH syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AethKind {
    /// Positive acknowledgement with an end-to-end credit code ([`ack_credits`]).
    Ack {
        /// Credit code 0..=31 (31 = [`CREDIT_INVALID`]).
        credit: u8,
    },
    /// Receiver not ready: retry after [`rnr_timer_ns`]`(timer)`.
    RnrNak {
        /// RNR timer code 0..=31.
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
}

impl AethKind {
    /// The syndrome byte encoding this kind (inverse of [`AethRepr::kind`]).
    pub const fn syndrome(self) -> u8 {
        match self {
            Self::Ack { credit } => credit & 0x1F,
            Self::RnrNak { timer } => 0x20 | (timer & 0x1F),
            // The reserved syndrome class 10 as reported by `AethRepr::kind`.
            Self::Nak(NakCode::Reserved(code)) if code > 0x1F => code & 0x7F,
            Self::Nak(code) => 0x60 | (code.code() & 0x1F),
        }
    }
}

header_view! {
    /// A read/write view of an AETH at the start of a buffer.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The syndrome byte.
    #[inline]
    pub fn syndrome(&self) -> u8 {
        get_u8(self.buffer.as_ref(), field::SYNDROME)
    }

    /// The message sequence number (24 bits).
    #[inline]
    pub fn msn(&self) -> u32 {
        get_u24(self.buffer.as_ref(), field::MSN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the syndrome byte.
    #[inline]
    pub fn set_syndrome(&mut self, value: u8) {
        set_u8(self.buffer.as_mut(), field::SYNDROME, value);
    }

    /// Sets the message sequence number (low 24 bits of `value`).
    #[inline]
    pub fn set_msn(&mut self, value: u32) {
        set_u24(self.buffer.as_mut(), field::MSN, value);
    }
}

/// The decoded fields of an AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AethRepr {
    /// Syndrome byte; see [`AethRepr::kind`].
    pub syndrome: u8,
    /// Message sequence number (24 bits; emit masks it).
    pub msn: u32,
}

impl AethRepr {
    /// An ACK with credit code 31 ("invalid", syndrome 0x1F), as rxe sends (spec §3.2).
    pub const fn ack(msn: u32) -> Self {
        Self::from_kind(
            AethKind::Ack {
                credit: CREDIT_INVALID,
            },
            msn,
        )
    }

    /// An ACK with an explicit credit code (see [`credit_code`]).
    pub const fn ack_with_credit(credit: u8, msn: u32) -> Self {
        Self::from_kind(AethKind::Ack { credit }, msn)
    }

    /// An RNR NAK with an RNR timer code (syndrome 0x20 | timer).
    pub const fn rnr_nak(timer: u8, msn: u32) -> Self {
        Self::from_kind(AethKind::RnrNak { timer }, msn)
    }

    /// A NAK (syndrome 0x60 | code).
    pub const fn nak(code: NakCode, msn: u32) -> Self {
        Self::from_kind(AethKind::Nak(code), msn)
    }

    /// An AETH of the given kind; `msn` is masked to 24 bits.
    pub const fn from_kind(kind: AethKind, msn: u32) -> Self {
        Self {
            syndrome: kind.syndrome(),
            msn: msn & MSN_MASK,
        }
    }

    /// The meaning of the syndrome. The reserved bit 7 is ignored; the reserved class 10 is
    /// reported as `Nak(NakCode::Reserved(syndrome & 0x7F))`, which a requester treats like
    /// any unknown NAK.
    pub const fn kind(&self) -> AethKind {
        let value = self.syndrome & 0x1F;
        match (self.syndrome >> 5) & 0b11 {
            0b00 => AethKind::Ack { credit: value },
            0b01 => AethKind::RnrNak { timer: value },
            0b11 => AethKind::Nak(NakCode::from_code(value)),
            _ => AethKind::Nak(NakCode::Reserved(self.syndrome & 0x7F)),
        }
    }

    /// Decodes an AETH. Every syndrome is accepted; see [`AethRepr::kind`].
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if the buffer is shorter than [`HEADER_LEN`].
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self> {
        packet.check_len()?;
        Ok(Self {
            syndrome: packet.syndrome(),
            msn: packet.msn(),
        })
    }

    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the AETH (MSN masked to 24 bits).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        packet.set_syndrome(self.syndrome);
        packet.set_msn(self.msn);
    }
}

impl fmt::Display for AethRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind() {
            AethKind::Ack { credit } => match ack_credits(credit) {
                Some(count) => write!(f, "AETH ACK credits={count}")?,
                None => f.write_str("AETH ACK credits=invalid")?,
            },
            AethKind::RnrNak { timer } => {
                let ns = rnr_timer_ns(timer);
                write!(
                    f,
                    "AETH RNR-NAK timer={timer} ({}.{:02}ms)",
                    ns / 1_000_000,
                    ns % 1_000_000 / 10_000
                )?;
            }
            AethKind::Nak(code) => write!(f, "AETH NAK {code}")?,
        }
        write!(f, " msn={}", self.msn & MSN_MASK)
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

    /// AETHs of golden frames 6 (ACK credit code 8), 7 (RNR NAK timer 14), 8 (NAK PSN
    /// sequence error), all with MSN 3.
    const ACK_CREDIT_8: [u8; 4] = [0x08, 0x00, 0x00, 0x03];
    const RNR_14: [u8; 4] = [0x2e, 0x00, 0x00, 0x03];
    const NAK_SEQ: [u8; 4] = [0x60, 0x00, 0x00, 0x03];

    fn parse(bytes: &[u8]) -> AethRepr {
        AethRepr::parse(&Packet::new_checked(bytes).unwrap()).unwrap()
    }

    fn emit(repr: AethRepr) -> [u8; 4] {
        let mut buf = [0xFFu8; 4];
        assert_eq!(repr.buffer_len(), buf.len());
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        buf
    }

    #[test]
    fn golden_bytes_to_fields() {
        let ack = parse(&ACK_CREDIT_8);
        assert_eq!((ack.syndrome, ack.msn), (0x08, 3));
        assert_eq!(ack.kind(), AethKind::Ack { credit: 8 });
        assert_eq!(ack_credits(8), Some(16));
        let rnr = parse(&RNR_14);
        assert_eq!(rnr.kind(), AethKind::RnrNak { timer: 14 });
        assert_eq!(rnr_timer_ns(14), 1_280_000);
        let nak = parse(&NAK_SEQ);
        assert_eq!(nak.kind(), AethKind::Nak(NakCode::PsnSequence));
        let packet = Packet::new_unchecked(&NAK_SEQ);
        assert_eq!((packet.syndrome(), packet.msn()), (0x60, 3));
    }

    #[test]
    fn fields_to_golden_bytes() {
        assert_eq!(emit(AethRepr::ack_with_credit(8, 3)), ACK_CREDIT_8);
        assert_eq!(emit(AethRepr::rnr_nak(14, 3)), RNR_14);
        assert_eq!(emit(AethRepr::nak(NakCode::PsnSequence, 3)), NAK_SEQ);
        assert_eq!(emit(AethRepr::ack(0x0123_4567)), [0x1F, 0x23, 0x45, 0x67]);
        assert_eq!(
            emit(AethRepr {
                syndrome: 0x1F,
                msn: 0xFF00_0004
            }),
            [0x1F, 0, 0, 4]
        );
    }

    #[test]
    fn rejects_short_buffer() {
        assert_eq!(
            Packet::new_checked(&NAK_SEQ[..3]).err(),
            Some(WireError::Truncated)
        );
        assert_eq!(
            AethRepr::parse(&Packet::new_unchecked(&NAK_SEQ[..0])),
            Err(WireError::Truncated)
        );
    }

    #[test]
    fn syndromes() {
        assert_eq!(AethRepr::ack(0).syndrome, 0x1F);
        assert_eq!(AethRepr::nak(NakCode::InvalidRequest, 0).syndrome, 0x61);
        assert_eq!(AethRepr::nak(NakCode::RemoteAccess, 0).syndrome, 0x62);
        assert_eq!(AethRepr::nak(NakCode::RemoteOperational, 0).syndrome, 0x63);
        assert_eq!(AethRepr::nak(NakCode::InvalidRd, 0).syndrome, 0x64);
        assert_eq!(AethRepr::rnr_nak(0, 0).syndrome, 0x20);
        // Every 7-bit syndrome maps to a kind and back; bit 7 is ignored.
        for syndrome in 0..=0xFFu8 {
            let repr = AethRepr { syndrome, msn: 0 };
            assert_eq!(repr.kind().syndrome(), syndrome & 0x7F, "{syndrome:#x}");
        }
        assert_eq!(
            AethRepr {
                syndrome: 0x45,
                msn: 0
            }
            .kind(),
            AethKind::Nak(NakCode::Reserved(0x45))
        );
        assert_eq!(
            AethRepr {
                syndrome: 0x7F,
                msn: 0
            }
            .kind(),
            AethKind::Nak(NakCode::Reserved(0x1F))
        );
        for code in 0..32 {
            assert_eq!(NakCode::from_code(code).code(), code);
        }
    }

    #[test]
    fn credit_table() {
        assert_eq!(ack_credits(0), Some(0));
        assert_eq!(ack_credits(5), Some(6));
        assert_eq!(ack_credits(30), Some(32_768));
        assert_eq!(ack_credits(CREDIT_INVALID), None);
        assert_eq!(credit_code(0), 0);
        assert_eq!(credit_code(5), 4);
        assert_eq!(credit_code(6), 5);
        assert_eq!(credit_code(100), 13);
        assert_eq!(credit_code(u32::MAX), 30);
        for code in 0..31u8 {
            assert_eq!(credit_code(ack_credits(code).unwrap()), code);
        }
    }

    #[test]
    fn rnr_timer_table() {
        assert_eq!(rnr_timer_ns(0), 655_360_000);
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(rnr_timer_ns(12), 640_000);
        assert_eq!(rnr_timer_ns(25), 61_440_000);
        assert_eq!(rnr_timer_ns(31), 491_520_000);
        assert_eq!(rnr_timer_ns(0x20 | 14), 1_280_000);
        // Codes 1..=31 increase monotonically.
        for code in 1..31u8 {
            assert!(rnr_timer_ns(code) < rnr_timer_ns(code + 1));
        }
    }

    #[test]
    fn display() {
        assert_eq!(
            parse(&ACK_CREDIT_8).to_string(),
            "AETH ACK credits=16 msn=3"
        );
        assert_eq!(
            AethRepr::ack(7).to_string(),
            "AETH ACK credits=invalid msn=7"
        );
        assert_eq!(
            parse(&RNR_14).to_string(),
            "AETH RNR-NAK timer=14 (1.28ms) msn=3"
        );
        assert_eq!(
            AethRepr::rnr_nak(0, 1).to_string(),
            "AETH RNR-NAK timer=0 (655.36ms) msn=1"
        );
        assert_eq!(
            parse(&NAK_SEQ).to_string(),
            "AETH NAK psn-sequence-error msn=3"
        );
    }

    proptest! {
        #[test]
        fn round_trip(syndrome in any::<u8>(), msn in 0u32..=MSN_MASK) {
            let repr = AethRepr { syndrome, msn };
            let mut buf = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(AethRepr::parse(&Packet::new_unchecked(&buf[..])), Ok(repr));
        }
    }
}
