//! Base Transport Header (BTH, 12 bytes, spec `roce-wire.md` §2.1).
//!
//! ```text
//! byte 0     OpCode
//! byte 1     SE(7) M(6) PadCnt(5..4) TVer(3..0)
//! byte 2-3   P_Key
//! byte 4     FECN(7) BECN(6) reserved(5..0)     (masked in the ICRC)
//! byte 5-7   DestQP (24 bits)
//! byte 8     AckReq(7) reserved(6..0)
//! byte 9-11  PSN (24 bits)
//! ```

use core::fmt;

use super::bytes::{
    get_flag, get_u8, get_u16, get_u24, header_view, set_flag, set_u8, set_u16, set_u24,
};
use super::opcode::Opcode;
use super::{Result, WireError};

mod field {
    use super::super::bytes::Field;

    /// Opcode byte.
    pub(super) const OPCODE: usize = 0;
    /// SE, M, PadCnt, TVer.
    pub(super) const FLAGS: usize = 1;
    /// Partition key.
    pub(super) const PKEY: Field = 2..4;
    /// FECN, BECN and 6 reserved bits.
    pub(super) const ECN: usize = 4;
    /// Destination QP number (24 bits).
    pub(super) const DEST_QP: Field = 5..8;
    /// AckReq and 7 reserved bits.
    pub(super) const ACK_REQ: usize = 8;
    /// Packet sequence number (24 bits).
    pub(super) const PSN: Field = 9..12;

    /// Solicited event bit of `FLAGS`.
    pub(super) const SE_MASK: u8 = 0x80;
    /// MigReq bit of `FLAGS`.
    pub(super) const MIG_REQ_MASK: u8 = 0x40;
    /// PadCnt bits of `FLAGS`.
    pub(super) const PAD_MASK: u8 = 0x30;
    /// PadCnt shift within `FLAGS`.
    pub(super) const PAD_SHIFT: u8 = 4;
    /// TVer bits of `FLAGS`.
    pub(super) const TVER_MASK: u8 = 0x0F;
    /// FECN bit of `ECN`.
    pub(super) const FECN_MASK: u8 = 0x80;
    /// BECN bit of `ECN`.
    pub(super) const BECN_MASK: u8 = 0x40;
    /// AckReq bit of `ACK_REQ`.
    pub(super) const ACK_REQ_MASK: u8 = 0x80;
}

/// Length of the BTH in bytes.
pub const HEADER_LEN: usize = 12;

/// Mask of the 24-bit fields (DestQP, PSN).
pub const MASK_24: u32 = 0x00FF_FFFF;

/// Destination QP number that addresses a UD multicast group (spec §2.1).
pub const MULTICAST_QPN: u32 = 0x00FF_FFFF;

header_view! {
    /// A read/write view of a BTH at the start of a buffer.
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// The opcode.
    #[inline]
    pub fn opcode(&self) -> Opcode {
        Opcode(get_u8(self.buffer.as_ref(), field::OPCODE))
    }

    /// The solicited event bit (SE).
    #[inline]
    pub fn solicited(&self) -> bool {
        get_flag(self.buffer.as_ref(), field::FLAGS, field::SE_MASK)
    }

    /// The migration request bit (M).
    #[inline]
    pub fn mig_req(&self) -> bool {
        get_flag(self.buffer.as_ref(), field::FLAGS, field::MIG_REQ_MASK)
    }

    /// The pad count (0..=3).
    #[inline]
    pub fn pad_count(&self) -> u8 {
        (get_u8(self.buffer.as_ref(), field::FLAGS) & field::PAD_MASK) >> field::PAD_SHIFT
    }

    /// The transport header version (TVer, must be 0).
    #[inline]
    pub fn tver(&self) -> u8 {
        get_u8(self.buffer.as_ref(), field::FLAGS) & field::TVER_MASK
    }

    /// The partition key.
    #[inline]
    pub fn pkey(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::PKEY)
    }

    /// The forward explicit congestion notification bit.
    #[inline]
    pub fn fecn(&self) -> bool {
        get_flag(self.buffer.as_ref(), field::ECN, field::FECN_MASK)
    }

    /// The backward explicit congestion notification bit (set in CNPs).
    #[inline]
    pub fn becn(&self) -> bool {
        get_flag(self.buffer.as_ref(), field::ECN, field::BECN_MASK)
    }

    /// The destination QP number (24 bits).
    #[inline]
    pub fn dest_qp(&self) -> u32 {
        get_u24(self.buffer.as_ref(), field::DEST_QP)
    }

    /// The acknowledge request bit (A).
    #[inline]
    pub fn ack_req(&self) -> bool {
        get_flag(self.buffer.as_ref(), field::ACK_REQ, field::ACK_REQ_MASK)
    }

    /// The packet sequence number (24 bits).
    #[inline]
    pub fn psn(&self) -> u32 {
        get_u24(self.buffer.as_ref(), field::PSN)
    }

    /// The bytes after the BTH (empty if the buffer is too short).
    #[inline]
    pub fn payload(&self) -> &[u8] {
        self.buffer.as_ref().get(HEADER_LEN..).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the opcode.
    #[inline]
    pub fn set_opcode(&mut self, value: Opcode) {
        set_u8(self.buffer.as_mut(), field::OPCODE, value.0);
    }

    /// Sets the solicited event bit.
    #[inline]
    pub fn set_solicited(&mut self, value: bool) {
        set_flag(self.buffer.as_mut(), field::FLAGS, field::SE_MASK, value);
    }

    /// Sets the migration request bit.
    #[inline]
    pub fn set_mig_req(&mut self, value: bool) {
        set_flag(
            self.buffer.as_mut(),
            field::FLAGS,
            field::MIG_REQ_MASK,
            value,
        );
    }

    /// Sets the pad count (only the low 2 bits of `value` are used).
    #[inline]
    pub fn set_pad_count(&mut self, value: u8) {
        let data = self.buffer.as_mut();
        let flags = get_u8(data, field::FLAGS) & !field::PAD_MASK;
        set_u8(
            data,
            field::FLAGS,
            flags | ((value << field::PAD_SHIFT) & field::PAD_MASK),
        );
    }

    /// Sets the transport header version (only the low 4 bits of `value` are used).
    #[inline]
    pub fn set_tver(&mut self, value: u8) {
        let data = self.buffer.as_mut();
        let flags = get_u8(data, field::FLAGS) & !field::TVER_MASK;
        set_u8(data, field::FLAGS, flags | (value & field::TVER_MASK));
    }

    /// Sets the partition key.
    #[inline]
    pub fn set_pkey(&mut self, value: u16) {
        set_u16(self.buffer.as_mut(), field::PKEY, value);
    }

    /// Sets the FECN bit.
    #[inline]
    pub fn set_fecn(&mut self, value: bool) {
        set_flag(self.buffer.as_mut(), field::ECN, field::FECN_MASK, value);
    }

    /// Sets the BECN bit.
    #[inline]
    pub fn set_becn(&mut self, value: bool) {
        set_flag(self.buffer.as_mut(), field::ECN, field::BECN_MASK, value);
    }

    /// Sets the destination QP number (low 24 bits of `value`).
    #[inline]
    pub fn set_dest_qp(&mut self, value: u32) {
        set_u24(self.buffer.as_mut(), field::DEST_QP, value);
    }

    /// Sets the acknowledge request bit.
    #[inline]
    pub fn set_ack_req(&mut self, value: bool) {
        set_flag(
            self.buffer.as_mut(),
            field::ACK_REQ,
            field::ACK_REQ_MASK,
            value,
        );
    }

    /// Sets the packet sequence number (low 24 bits of `value`).
    #[inline]
    pub fn set_psn(&mut self, value: u32) {
        set_u24(self.buffer.as_mut(), field::PSN, value);
    }

    /// The bytes after the BTH, mutable (empty if the buffer is too short).
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        self.buffer
            .as_mut()
            .get_mut(HEADER_LEN..)
            .unwrap_or(&mut [])
    }
}

/// The decoded fields of a BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BthRepr {
    /// Opcode: transport and operation.
    pub opcode: Opcode,
    /// Solicited event (SE).
    pub solicited: bool,
    /// Migration request / APM state (M).
    pub mig_req: bool,
    /// Pad bytes after the payload (0..=3).
    pub pad_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Forward explicit congestion notification.
    pub fecn: bool,
    /// Backward explicit congestion notification.
    pub becn: bool,
    /// Destination QP number (24 bits; emit masks it).
    pub dest_qp: u32,
    /// Acknowledge request (A).
    pub ack_req: bool,
    /// Packet sequence number (24 bits; emit masks it).
    pub psn: u32,
}

impl BthRepr {
    /// Decodes a BTH. Reserved bits are ignored; the opcode is not checked here (see
    /// [`Opcode::headers`]).
    ///
    /// # Errors
    ///
    /// [`WireError::Truncated`] if the buffer is too short, [`WireError::BadVersion`] if TVer
    /// is not 0.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self> {
        packet.check_len()?;
        if packet.tver() != 0 {
            return Err(WireError::BadVersion);
        }
        Ok(Self {
            opcode: packet.opcode(),
            solicited: packet.solicited(),
            mig_req: packet.mig_req(),
            pad_count: packet.pad_count(),
            pkey: packet.pkey(),
            fecn: packet.fecn(),
            becn: packet.becn(),
            dest_qp: packet.dest_qp(),
            ack_req: packet.ack_req(),
            psn: packet.psn(),
        })
    }

    /// Length of the emitted header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the BTH (TVer 0, reserved bits 0, 24-bit fields and pad count masked).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, packet: &mut Packet<&mut T>) {
        let data = packet.buffer.as_mut();
        set_u8(data, field::OPCODE, self.opcode.0);
        set_u8(
            data,
            field::FLAGS,
            (u8::from(self.solicited) << 7)
                | (u8::from(self.mig_req) << 6)
                | ((self.pad_count << field::PAD_SHIFT) & field::PAD_MASK),
        );
        set_u16(data, field::PKEY, self.pkey);
        set_u8(
            data,
            field::ECN,
            (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6),
        );
        set_u24(data, field::DEST_QP, self.dest_qp);
        set_u8(data, field::ACK_REQ, u8::from(self.ack_req) << 7);
        set_u24(data, field::PSN, self.psn);
    }
}

impl fmt::Display for BthRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BTH {} dqpn=0x{:06x} psn={} pkey=0x{:04x}",
            self.opcode,
            self.dest_qp & MASK_24,
            self.psn & MASK_24,
            self.pkey
        )?;
        for (set, name) in [
            (self.solicited, " se"),
            (self.mig_req, " m"),
            (self.ack_req, " a"),
            (self.fecn, " fecn"),
            (self.becn, " becn"),
        ] {
            if set {
                f.write_str(name)?;
            }
        }
        if self.pad_count != 0 {
            write!(f, " pad={}", self.pad_count)?;
        }
        Ok(())
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

    /// BTH of golden frame 1: RC SEND_ONLY, M, pad 2, QP 0x11, AckReq, PSN 0x100.
    const SEND_ONLY: [u8; 12] = [
        0x04, 0x60, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x00, 0x01, 0x00,
    ];
    /// BTH of the ConnectX-4 Lx CNP (golden frame 17): BECN, QP 0x118.
    const CNP: [u8; 12] = [
        0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00,
    ];

    fn send_only_repr() -> BthRepr {
        BthRepr {
            opcode: Opcode::RC_SEND_ONLY,
            solicited: false,
            mig_req: true,
            pad_count: 2,
            pkey: 0xFFFF,
            fecn: false,
            becn: false,
            dest_qp: 0x11,
            ack_req: true,
            psn: 0x100,
        }
    }

    #[test]
    fn golden_bytes_to_fields() {
        let packet = Packet::new_checked(&SEND_ONLY[..]).unwrap();
        assert_eq!(packet.opcode(), Opcode::RC_SEND_ONLY);
        assert!(!packet.solicited());
        assert!(packet.mig_req());
        assert_eq!(packet.pad_count(), 2);
        assert_eq!(packet.tver(), 0);
        assert_eq!(packet.pkey(), 0xFFFF);
        assert!(!packet.fecn());
        assert!(!packet.becn());
        assert_eq!(packet.dest_qp(), 0x11);
        assert!(packet.ack_req());
        assert_eq!(packet.psn(), 0x100);
        assert!(packet.payload().is_empty());
        assert_eq!(BthRepr::parse(&packet).unwrap(), send_only_repr());

        let cnp = BthRepr::parse(&Packet::new_unchecked(&CNP[..])).unwrap();
        assert_eq!(cnp.opcode, Opcode::CNP);
        assert!(cnp.becn && !cnp.fecn && !cnp.mig_req && !cnp.ack_req);
        assert_eq!((cnp.dest_qp, cnp.psn, cnp.pkey), (0x118, 0, 0xFFFF));
    }

    #[test]
    fn fields_to_golden_bytes() {
        let mut buf = [0xAAu8; 12];
        send_only_repr().emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, SEND_ONLY);

        let mut buf = [0u8; 12];
        let mut packet = Packet::new_unchecked(&mut buf);
        packet.set_opcode(Opcode::CNP);
        packet.set_pkey(0xFFFF);
        packet.set_becn(true);
        packet.set_dest_qp(0xAB00_0118);
        assert_eq!(buf, CNP);
    }

    #[test]
    fn setters_touch_only_their_bits() {
        let mut buf = SEND_ONLY;
        let mut packet = Packet::new_unchecked(&mut buf);
        packet.set_pad_count(3);
        packet.set_solicited(true);
        packet.set_tver(5);
        packet.set_fecn(true);
        packet.set_ack_req(false);
        packet.set_psn(0x0123_4567);
        assert_eq!(packet.pad_count(), 3);
        assert!(packet.solicited() && packet.mig_req());
        assert_eq!(packet.tver(), 5);
        assert_eq!(packet.psn(), 0x23_4567);
        assert_eq!(
            buf,
            [
                0x04, 0xF5, 0xff, 0xff, 0x80, 0x00, 0x00, 0x11, 0x00, 0x23, 0x45, 0x67
            ]
        );
    }

    #[test]
    fn rejects_short_buffer_and_bad_version() {
        assert_eq!(
            Packet::new_checked(&SEND_ONLY[..11]).err(),
            Some(WireError::Truncated)
        );
        assert_eq!(
            BthRepr::parse(&Packet::new_unchecked(&SEND_ONLY[..0])),
            Err(WireError::Truncated)
        );
        let mut buf = SEND_ONLY;
        Packet::new_unchecked(&mut buf).set_tver(1);
        assert_eq!(
            BthRepr::parse(&Packet::new_unchecked(&buf)),
            Err(WireError::BadVersion)
        );
        // Accessors on a short buffer do not panic.
        let short = Packet::new_unchecked(&SEND_ONLY[..3]);
        assert_eq!((short.psn(), short.dest_qp(), short.pkey()), (0, 0, 0));
    }

    #[test]
    fn emit_masks_24_bit_fields() {
        let repr = BthRepr {
            dest_qp: 0xFFFF_FFFF,
            psn: 0x0100_0002,
            pad_count: 7,
            ..send_only_repr()
        };
        let mut buf = [0u8; 12];
        repr.emit(&mut Packet::new_unchecked(&mut buf));
        let parsed = BthRepr::parse(&Packet::new_unchecked(&buf)).unwrap();
        assert_eq!(parsed.dest_qp, 0xFF_FFFF);
        assert_eq!(parsed.psn, 2);
        assert_eq!(parsed.pad_count, 3);
        assert_eq!(parsed.pkey, 0xFFFF);
    }

    #[test]
    fn display() {
        assert_eq!(
            send_only_repr().to_string(),
            "BTH RC SEND_ONLY dqpn=0x000011 psn=256 pkey=0xffff m a pad=2"
        );
    }

    proptest! {
        #[test]
        fn round_trip(
            opcode in any::<u8>(),
            flags in any::<[bool; 6]>(),
            pad_count in 0u8..4,
            pkey in any::<u16>(),
            dest_qp in 0u32..=MASK_24,
            psn in 0u32..=MASK_24,
        ) {
            let [solicited, mig_req, fecn, becn, ack_req, _] = flags;
            let repr = BthRepr {
                opcode: Opcode(opcode), solicited, mig_req, pad_count, pkey, fecn, becn,
                dest_qp, ack_req, psn,
            };
            let mut buf = [0u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(BthRepr::parse(&Packet::new_unchecked(&buf[..])), Ok(repr));
        }
    }
}
