//! BTH opcodes (spec `roce-wire.md` §2.2): the transport (bits 7..5), the operation
//! (bits 4..0), and the extension headers that each supported opcode carries.

use core::fmt;

use super::{aeth, atomic, deth, imm, reth, xrceth};

/// Operation codes: bits 4..0 of an opcode, the same for every transport (spec §2.2).
pub mod op {
    /// First packet of a multi-packet SEND.
    pub const SEND_FIRST: u8 = 0x00;
    /// Middle packet of a multi-packet SEND.
    pub const SEND_MIDDLE: u8 = 0x01;
    /// Last packet of a multi-packet SEND.
    pub const SEND_LAST: u8 = 0x02;
    /// Last packet of a multi-packet SEND with immediate (ImmDt).
    pub const SEND_LAST_WITH_IMMEDIATE: u8 = 0x03;
    /// Single-packet SEND.
    pub const SEND_ONLY: u8 = 0x04;
    /// Single-packet SEND with immediate (ImmDt).
    pub const SEND_ONLY_WITH_IMMEDIATE: u8 = 0x05;
    /// First packet of a multi-packet RDMA WRITE (RETH).
    pub const RDMA_WRITE_FIRST: u8 = 0x06;
    /// Middle packet of a multi-packet RDMA WRITE.
    pub const RDMA_WRITE_MIDDLE: u8 = 0x07;
    /// Last packet of a multi-packet RDMA WRITE.
    pub const RDMA_WRITE_LAST: u8 = 0x08;
    /// Last packet of a multi-packet RDMA WRITE with immediate (ImmDt).
    pub const RDMA_WRITE_LAST_WITH_IMMEDIATE: u8 = 0x09;
    /// Single-packet RDMA WRITE (RETH).
    pub const RDMA_WRITE_ONLY: u8 = 0x0A;
    /// Single-packet RDMA WRITE with immediate (RETH, ImmDt).
    pub const RDMA_WRITE_ONLY_WITH_IMMEDIATE: u8 = 0x0B;
    /// RDMA READ request (RETH, no payload).
    pub const RDMA_READ_REQUEST: u8 = 0x0C;
    /// First packet of a multi-packet RDMA READ response (AETH).
    pub const RDMA_READ_RESPONSE_FIRST: u8 = 0x0D;
    /// Middle packet of a multi-packet RDMA READ response.
    pub const RDMA_READ_RESPONSE_MIDDLE: u8 = 0x0E;
    /// Last packet of a multi-packet RDMA READ response (AETH).
    pub const RDMA_READ_RESPONSE_LAST: u8 = 0x0F;
    /// Single-packet RDMA READ response (AETH).
    pub const RDMA_READ_RESPONSE_ONLY: u8 = 0x10;
    /// ACK, RNR NAK or NAK (AETH).
    pub const ACKNOWLEDGE: u8 = 0x11;
    /// Response to an atomic (AETH, AtomicAckETH).
    pub const ATOMIC_ACKNOWLEDGE: u8 = 0x12;
    /// Atomic compare and swap (AtomicETH).
    pub const COMPARE_SWAP: u8 = 0x13;
    /// Atomic fetch and add (AtomicETH).
    pub const FETCH_ADD: u8 = 0x14;
    /// Last packet of a multi-packet SEND with invalidate (IETH).
    pub const SEND_LAST_WITH_INVALIDATE: u8 = 0x16;
    /// Single-packet SEND with invalidate (IETH).
    pub const SEND_ONLY_WITH_INVALIDATE: u8 = 0x17;
    /// FLUSH (IBTA 1.5, optional; not supported here).
    pub const FLUSH: u8 = 0x1C;
    /// ATOMIC WRITE (IBTA 1.5, optional; not supported here).
    pub const ATOMIC_WRITE: u8 = 0x1D;
}

/// Transport service encoded in bits 7..5 of an opcode (spec §2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Reliable Connection (0x00).
    Rc,
    /// Unreliable Connection (0x20).
    Uc,
    /// Reliable Datagram (0x40; not supported).
    Rd,
    /// Unreliable Datagram (0x60).
    Ud,
    /// Congestion notification (0x80; 0x81 is the RoCEv2 CNP).
    Cnp,
    /// Extended Reliable Connection (0xA0).
    Xrc,
    /// Manufacturer specific (0xE0), and the reserved range 0xC0..=0xDF.
    Vendor,
}

impl Transport {
    /// The transport bits (7..5) of an opcode of this transport.
    pub const fn bits(self) -> u8 {
        match self {
            Self::Rc => 0x00,
            Self::Uc => 0x20,
            Self::Rd => 0x40,
            Self::Ud => 0x60,
            Self::Cnp => 0x80,
            Self::Xrc => 0xA0,
            Self::Vendor => 0xE0,
        }
    }

    /// Short name as used in opcode names ("RC", "UC", ...).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Rc => "RC",
            Self::Uc => "UC",
            Self::Rd => "RD",
            Self::Ud => "UD",
            Self::Cnp => "CNP",
            Self::Xrc => "XRC",
            Self::Vendor => "VENDOR",
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A BTH opcode (byte 0 of the BTH).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Opcode(pub u8);

impl Opcode {
    /// RC SEND_FIRST (0x00).
    pub const RC_SEND_FIRST: Self = Self(op::SEND_FIRST);
    /// RC SEND_MIDDLE (0x01).
    pub const RC_SEND_MIDDLE: Self = Self(op::SEND_MIDDLE);
    /// RC SEND_LAST (0x02).
    pub const RC_SEND_LAST: Self = Self(op::SEND_LAST);
    /// RC SEND_LAST_WITH_IMMEDIATE (0x03).
    pub const RC_SEND_LAST_WITH_IMMEDIATE: Self = Self(op::SEND_LAST_WITH_IMMEDIATE);
    /// RC SEND_ONLY (0x04).
    pub const RC_SEND_ONLY: Self = Self(op::SEND_ONLY);
    /// RC SEND_ONLY_WITH_IMMEDIATE (0x05).
    pub const RC_SEND_ONLY_WITH_IMMEDIATE: Self = Self(op::SEND_ONLY_WITH_IMMEDIATE);
    /// RC RDMA_WRITE_FIRST (0x06).
    pub const RC_RDMA_WRITE_FIRST: Self = Self(op::RDMA_WRITE_FIRST);
    /// RC RDMA_WRITE_MIDDLE (0x07).
    pub const RC_RDMA_WRITE_MIDDLE: Self = Self(op::RDMA_WRITE_MIDDLE);
    /// RC RDMA_WRITE_LAST (0x08).
    pub const RC_RDMA_WRITE_LAST: Self = Self(op::RDMA_WRITE_LAST);
    /// RC RDMA_WRITE_LAST_WITH_IMMEDIATE (0x09).
    pub const RC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Self = Self(op::RDMA_WRITE_LAST_WITH_IMMEDIATE);
    /// RC RDMA_WRITE_ONLY (0x0A).
    pub const RC_RDMA_WRITE_ONLY: Self = Self(op::RDMA_WRITE_ONLY);
    /// RC RDMA_WRITE_ONLY_WITH_IMMEDIATE (0x0B).
    pub const RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Self = Self(op::RDMA_WRITE_ONLY_WITH_IMMEDIATE);
    /// RC RDMA_READ_REQUEST (0x0C).
    pub const RC_RDMA_READ_REQUEST: Self = Self(op::RDMA_READ_REQUEST);
    /// RC RDMA_READ_RESPONSE_FIRST (0x0D).
    pub const RC_RDMA_READ_RESPONSE_FIRST: Self = Self(op::RDMA_READ_RESPONSE_FIRST);
    /// RC RDMA_READ_RESPONSE_MIDDLE (0x0E).
    pub const RC_RDMA_READ_RESPONSE_MIDDLE: Self = Self(op::RDMA_READ_RESPONSE_MIDDLE);
    /// RC RDMA_READ_RESPONSE_LAST (0x0F).
    pub const RC_RDMA_READ_RESPONSE_LAST: Self = Self(op::RDMA_READ_RESPONSE_LAST);
    /// RC RDMA_READ_RESPONSE_ONLY (0x10).
    pub const RC_RDMA_READ_RESPONSE_ONLY: Self = Self(op::RDMA_READ_RESPONSE_ONLY);
    /// RC ACKNOWLEDGE (0x11).
    pub const RC_ACKNOWLEDGE: Self = Self(op::ACKNOWLEDGE);
    /// RC ATOMIC_ACKNOWLEDGE (0x12).
    pub const RC_ATOMIC_ACKNOWLEDGE: Self = Self(op::ATOMIC_ACKNOWLEDGE);
    /// RC COMPARE_SWAP (0x13).
    pub const RC_COMPARE_SWAP: Self = Self(op::COMPARE_SWAP);
    /// RC FETCH_ADD (0x14).
    pub const RC_FETCH_ADD: Self = Self(op::FETCH_ADD);
    /// RC SEND_LAST_WITH_INVALIDATE (0x16).
    pub const RC_SEND_LAST_WITH_INVALIDATE: Self = Self(op::SEND_LAST_WITH_INVALIDATE);
    /// RC SEND_ONLY_WITH_INVALIDATE (0x17).
    pub const RC_SEND_ONLY_WITH_INVALIDATE: Self = Self(op::SEND_ONLY_WITH_INVALIDATE);
    /// UD SEND_ONLY (0x64).
    pub const UD_SEND_ONLY: Self = Self(0x60 | op::SEND_ONLY);
    /// UD SEND_ONLY_WITH_IMMEDIATE (0x65).
    pub const UD_SEND_ONLY_WITH_IMMEDIATE: Self = Self(0x60 | op::SEND_ONLY_WITH_IMMEDIATE);
    /// RoCEv2 congestion notification packet (0x81, spec §1.3).
    pub const CNP: Self = Self(0x81);

    /// The transport service (bits 7..5). The reserved range 0xC0..=0xDF is reported as
    /// [`Transport::Vendor`]; [`Opcode::headers`] rejects it like the vendor range.
    pub const fn transport(self) -> Transport {
        match self.0 >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            3 => Transport::Ud,
            4 => Transport::Cnp,
            5 => Transport::Xrc,
            _ => Transport::Vendor,
        }
    }

    /// The operation (bits 4..0); compare with the constants in [`op`].
    pub const fn operation(self) -> u8 {
        self.0 & 0x1F
    }

    /// The same operation on another transport, e.g. `RC_SEND_ONLY.with_transport(Xrc)` is
    /// 0xA4.
    pub const fn with_transport(self, transport: Transport) -> Self {
        Self(transport.bits() | self.operation())
    }

    /// The extension headers that follow the BTH for this opcode, in wire order, or `None`
    /// for an opcode this provider does not support: RD, vendor and reserved opcodes, RDMA
    /// READ/atomic/invalidate on UC, anything but SEND_ONLY(_WITH_IMMEDIATE) on UD, CNP codes
    /// other than 0x81, FLUSH and ATOMIC_WRITE.
    pub const fn headers(self) -> Option<HeaderSet> {
        let operation = self.operation();
        match self.transport() {
            Transport::Rc => rc_headers(operation),
            Transport::Uc => {
                if operation <= op::RDMA_WRITE_ONLY_WITH_IMMEDIATE {
                    rc_headers(operation)
                } else {
                    None
                }
            }
            Transport::Ud => match operation {
                op::SEND_ONLY => Some(HeaderSet {
                    deth: true,
                    ..HeaderSet::NONE
                }),
                op::SEND_ONLY_WITH_IMMEDIATE => Some(HeaderSet {
                    deth: true,
                    immdt: true,
                    ..HeaderSet::NONE
                }),
                _ => None,
            },
            // Spec §2.2: XRC requests carry an XRCETH first, responses (0xAD..=0xB2) do not.
            Transport::Xrc => match rc_headers(operation) {
                Some(mut set) => {
                    set.xrceth = !self.is_response();
                    Some(set)
                }
                None => None,
            },
            Transport::Cnp => {
                if self.0 == Self::CNP.0 {
                    Some(HeaderSet {
                        cnp: true,
                        ..HeaderSet::NONE
                    })
                } else {
                    None
                }
            }
            Transport::Rd | Transport::Vendor => None,
        }
    }

    /// Whether this is a response opcode (RDMA READ response, ACKNOWLEDGE, ATOMIC_ACKNOWLEDGE)
    /// on a connected transport, i.e. a packet that the responder sends to the requester.
    pub const fn is_response(self) -> bool {
        matches!(self.transport(), Transport::Rc | Transport::Xrc)
            && matches!(
                self.operation(),
                op::RDMA_READ_RESPONSE_FIRST..=op::ATOMIC_ACKNOWLEDGE
            )
    }

    /// Whether packets with this (supported) opcode may carry payload, and therefore pad:
    /// SEND, RDMA WRITE and RDMA READ response packets. READ requests, ACKs, atomics and CNPs
    /// carry none (spec §3.3).
    pub const fn carries_payload(self) -> bool {
        match self.transport() {
            Transport::Rc | Transport::Uc | Transport::Ud | Transport::Xrc => matches!(
                self.operation(),
                op::SEND_FIRST..=op::RDMA_WRITE_ONLY_WITH_IMMEDIATE
                    | op::RDMA_READ_RESPONSE_FIRST..=op::RDMA_READ_RESPONSE_ONLY
                    | op::SEND_LAST_WITH_INVALIDATE
                    | op::SEND_ONLY_WITH_INVALIDATE
            ),
            Transport::Rd | Transport::Cnp | Transport::Vendor => false,
        }
    }

    /// Human-readable name, e.g. `"RC SEND_ONLY"`, `"XRC RDMA_WRITE_ONLY"`, `"CNP"`. Reserved
    /// codes are named `"<transport> RESERVED"`.
    pub fn name(self) -> &'static str {
        let names = match self.0 >> 5 {
            0 => &RC_NAMES,
            1 => &UC_NAMES,
            2 => &RD_NAMES,
            3 => &UD_NAMES,
            4 => {
                return if self.0 == Self::CNP.0 {
                    "CNP"
                } else {
                    "CNP RESERVED"
                };
            }
            5 => &XRC_NAMES,
            6 => return "RESERVED",
            _ => return "VENDOR",
        };
        names
            .get(usize::from(self.operation()))
            .copied()
            .unwrap_or("RESERVED")
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.headers().is_some() {
            f.write_str(self.name())
        } else {
            write!(f, "{} (0x{:02x})", self.name(), self.0)
        }
    }
}

/// RC (and, for the operations they share, UC and XRC) extension headers, spec §2.2.
const fn rc_headers(operation: u8) -> Option<HeaderSet> {
    const NONE: HeaderSet = HeaderSet::NONE;
    let set = match operation {
        op::SEND_FIRST | op::SEND_MIDDLE | op::SEND_LAST | op::SEND_ONLY => NONE,
        op::SEND_LAST_WITH_IMMEDIATE | op::SEND_ONLY_WITH_IMMEDIATE => HeaderSet {
            immdt: true,
            ..NONE
        },
        op::RDMA_WRITE_FIRST | op::RDMA_WRITE_ONLY | op::RDMA_READ_REQUEST => {
            HeaderSet { reth: true, ..NONE }
        }
        op::RDMA_WRITE_MIDDLE | op::RDMA_WRITE_LAST => NONE,
        op::RDMA_WRITE_LAST_WITH_IMMEDIATE => HeaderSet {
            immdt: true,
            ..NONE
        },
        op::RDMA_WRITE_ONLY_WITH_IMMEDIATE => HeaderSet {
            reth: true,
            immdt: true,
            ..NONE
        },
        op::RDMA_READ_RESPONSE_FIRST
        | op::RDMA_READ_RESPONSE_LAST
        | op::RDMA_READ_RESPONSE_ONLY
        | op::ACKNOWLEDGE => HeaderSet { aeth: true, ..NONE },
        op::RDMA_READ_RESPONSE_MIDDLE => NONE,
        op::ATOMIC_ACKNOWLEDGE => HeaderSet {
            aeth: true,
            atomic_ack_eth: true,
            ..NONE
        },
        op::COMPARE_SWAP | op::FETCH_ADD => HeaderSet {
            atomic_eth: true,
            ..NONE
        },
        op::SEND_LAST_WITH_INVALIDATE | op::SEND_ONLY_WITH_INVALIDATE => {
            HeaderSet { ieth: true, ..NONE }
        }
        _ => return None,
    };
    Some(set)
}

/// Which extension headers follow the BTH (spec §2.2). Wire order is the field order:
/// DETH, XRCETH, RETH | AtomicETH, AETH, AtomicAckETH, ImmDt | IETH, then the CNP's reserved
/// bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeaderSet {
    /// Datagram extended transport header (8 bytes, UD).
    pub deth: bool,
    /// XRC extended transport header (4 bytes, XRC requests).
    pub xrceth: bool,
    /// RDMA extended transport header (16 bytes).
    pub reth: bool,
    /// Atomic extended transport header (28 bytes).
    pub atomic_eth: bool,
    /// ACK extended transport header (4 bytes).
    pub aeth: bool,
    /// Atomic ACK extended transport header (8 bytes).
    pub atomic_ack_eth: bool,
    /// Immediate data (4 bytes).
    pub immdt: bool,
    /// Invalidate extended transport header (4 bytes).
    pub ieth: bool,
    /// The 16 reserved bytes of a RoCEv2 CNP (spec §1.3).
    pub cnp: bool,
}

/// Length of the reserved area that follows the BTH of a CNP.
pub const CNP_RESERVED_LEN: usize = 16;

impl HeaderSet {
    /// No extension header.
    pub const NONE: Self = Self {
        deth: false,
        xrceth: false,
        reth: false,
        atomic_eth: false,
        aeth: false,
        atomic_ack_eth: false,
        immdt: false,
        ieth: false,
        cnp: false,
    };

    /// Total length in bytes of the extension headers, excluding the BTH.
    pub const fn len(&self) -> usize {
        const fn size(present: bool, len: usize) -> usize {
            if present { len } else { 0 }
        }
        size(self.deth, deth::HEADER_LEN)
            + size(self.xrceth, xrceth::HEADER_LEN)
            + size(self.reth, reth::HEADER_LEN)
            + size(self.atomic_eth, atomic::eth::HEADER_LEN)
            + size(self.aeth, aeth::HEADER_LEN)
            + size(self.atomic_ack_eth, atomic::ack::HEADER_LEN)
            + size(self.immdt, imm::HEADER_LEN)
            + size(self.ieth, imm::HEADER_LEN)
            + size(self.cnp, CNP_RESERVED_LEN)
    }

    /// Whether no extension header follows the BTH.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

macro_rules! operation_names {
    ($prefix:literal) => {
        [
            concat!($prefix, " SEND_FIRST"),
            concat!($prefix, " SEND_MIDDLE"),
            concat!($prefix, " SEND_LAST"),
            concat!($prefix, " SEND_LAST_WITH_IMMEDIATE"),
            concat!($prefix, " SEND_ONLY"),
            concat!($prefix, " SEND_ONLY_WITH_IMMEDIATE"),
            concat!($prefix, " RDMA_WRITE_FIRST"),
            concat!($prefix, " RDMA_WRITE_MIDDLE"),
            concat!($prefix, " RDMA_WRITE_LAST"),
            concat!($prefix, " RDMA_WRITE_LAST_WITH_IMMEDIATE"),
            concat!($prefix, " RDMA_WRITE_ONLY"),
            concat!($prefix, " RDMA_WRITE_ONLY_WITH_IMMEDIATE"),
            concat!($prefix, " RDMA_READ_REQUEST"),
            concat!($prefix, " RDMA_READ_RESPONSE_FIRST"),
            concat!($prefix, " RDMA_READ_RESPONSE_MIDDLE"),
            concat!($prefix, " RDMA_READ_RESPONSE_LAST"),
            concat!($prefix, " RDMA_READ_RESPONSE_ONLY"),
            concat!($prefix, " ACKNOWLEDGE"),
            concat!($prefix, " ATOMIC_ACKNOWLEDGE"),
            concat!($prefix, " COMPARE_SWAP"),
            concat!($prefix, " FETCH_ADD"),
            concat!($prefix, " RESERVED"),
            concat!($prefix, " SEND_LAST_WITH_INVALIDATE"),
            concat!($prefix, " SEND_ONLY_WITH_INVALIDATE"),
            concat!($prefix, " RESERVED"),
            concat!($prefix, " RESERVED"),
            concat!($prefix, " RESERVED"),
            concat!($prefix, " RESERVED"),
            concat!($prefix, " FLUSH"),
            concat!($prefix, " ATOMIC_WRITE"),
            concat!($prefix, " RESERVED"),
            concat!($prefix, " RESERVED"),
        ]
    };
}

const RC_NAMES: [&str; 32] = operation_names!("RC");
const UC_NAMES: [&str; 32] = operation_names!("UC");
const RD_NAMES: [&str; 32] = operation_names!("RD");
const UD_NAMES: [&str; 32] = operation_names!("UD");
const XRC_NAMES: [&str; 32] = operation_names!("XRC");

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
mod tests {
    use super::*;

    fn set(f: impl FnOnce(&mut HeaderSet)) -> Option<HeaderSet> {
        let mut set = HeaderSet::NONE;
        f(&mut set);
        Some(set)
    }

    #[test]
    fn transport_and_operation() {
        assert_eq!(Opcode(0x04).transport(), Transport::Rc);
        assert_eq!(Opcode(0x24).transport(), Transport::Uc);
        assert_eq!(Opcode(0x44).transport(), Transport::Rd);
        assert_eq!(Opcode(0x64).transport(), Transport::Ud);
        assert_eq!(Opcode(0x81).transport(), Transport::Cnp);
        assert_eq!(Opcode(0xA4).transport(), Transport::Xrc);
        assert_eq!(Opcode(0xC4).transport(), Transport::Vendor);
        assert_eq!(Opcode(0xE4).transport(), Transport::Vendor);
        assert_eq!(Opcode(0xB7).operation(), op::SEND_ONLY_WITH_INVALIDATE);
        assert_eq!(
            Opcode::RC_SEND_ONLY.with_transport(Transport::Xrc),
            Opcode(0xA4)
        );
        assert_eq!(
            Opcode::RC_SEND_ONLY.with_transport(Transport::Ud),
            Opcode::UD_SEND_ONLY
        );
        assert_eq!(
            Opcode(0xB2).with_transport(Transport::Rc),
            Opcode::RC_ATOMIC_ACKNOWLEDGE
        );
    }

    #[test]
    fn header_sets_follow_spec_table() {
        // Spot checks of spec §2.2, one per row kind.
        assert_eq!(Opcode::RC_SEND_FIRST.headers(), set(|_| {}));
        assert_eq!(
            Opcode::RC_SEND_ONLY_WITH_IMMEDIATE.headers(),
            set(|s| s.immdt = true)
        );
        assert_eq!(
            Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.headers(),
            set(|s| {
                s.reth = true;
                s.immdt = true;
            })
        );
        assert_eq!(
            Opcode::RC_RDMA_READ_REQUEST.headers(),
            set(|s| s.reth = true)
        );
        assert_eq!(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE.headers(), set(|_| {}));
        assert_eq!(
            Opcode::RC_RDMA_READ_RESPONSE_LAST.headers(),
            set(|s| s.aeth = true)
        );
        assert_eq!(
            Opcode::RC_ATOMIC_ACKNOWLEDGE.headers(),
            set(|s| {
                s.aeth = true;
                s.atomic_ack_eth = true;
            })
        );
        assert_eq!(Opcode::RC_FETCH_ADD.headers(), set(|s| s.atomic_eth = true));
        assert_eq!(
            Opcode::RC_SEND_LAST_WITH_INVALIDATE.headers(),
            set(|s| s.ieth = true)
        );
        assert_eq!(Opcode(0x15).headers(), None);
        assert_eq!(Opcode(0x1C).headers(), None);
        assert_eq!(Opcode(0x1D).headers(), None);
        // UC: SEND and RDMA WRITE only.
        assert_eq!(Opcode(0x2B).headers(), Opcode(0x0B).headers());
        assert_eq!(Opcode(0x2C).headers(), None);
        assert_eq!(Opcode(0x31).headers(), None);
        assert_eq!(Opcode(0x37).headers(), None);
        // UD.
        assert_eq!(Opcode::UD_SEND_ONLY.headers(), set(|s| s.deth = true));
        assert_eq!(
            Opcode::UD_SEND_ONLY_WITH_IMMEDIATE.headers(),
            set(|s| {
                s.deth = true;
                s.immdt = true;
            })
        );
        assert_eq!(Opcode(0x60).headers(), None);
        // XRC: requests with XRCETH, responses without.
        assert_eq!(
            Opcode(0xAB).headers(),
            set(|s| {
                s.xrceth = true;
                s.reth = true;
                s.immdt = true;
            })
        );
        assert_eq!(
            Opcode(0xB3).headers(),
            set(|s| {
                s.xrceth = true;
                s.atomic_eth = true;
            })
        );
        assert_eq!(Opcode(0xAD).headers(), set(|s| s.aeth = true));
        assert_eq!(Opcode(0xAE).headers(), set(|_| {}));
        assert_eq!(Opcode(0xB1).headers(), set(|s| s.aeth = true));
        assert_eq!(
            Opcode(0xB7).headers(),
            set(|s| {
                s.xrceth = true;
                s.ieth = true;
            })
        );
        // CNP, RD, vendor.
        assert_eq!(Opcode::CNP.headers(), set(|s| s.cnp = true));
        assert_eq!(Opcode(0x80).headers(), None);
        assert_eq!(Opcode(0x44).headers(), None);
        assert_eq!(Opcode(0xC0).headers(), None);
        assert_eq!(Opcode(0xE0).headers(), None);
    }

    #[test]
    fn header_lengths() {
        assert_eq!(HeaderSet::NONE.len(), 0);
        assert!(HeaderSet::NONE.is_empty());
        let all_requests = HeaderSet {
            xrceth: true,
            reth: true,
            immdt: true,
            ..HeaderSet::NONE
        };
        assert_eq!(all_requests.len(), 24);
        assert_eq!(Opcode(0xB4).headers().unwrap().len(), 32);
        assert_eq!(Opcode::RC_ATOMIC_ACKNOWLEDGE.headers().unwrap().len(), 12);
        assert_eq!(
            Opcode::UD_SEND_ONLY_WITH_IMMEDIATE.headers().unwrap().len(),
            12
        );
        assert_eq!(Opcode::CNP.headers().unwrap().len(), 16);
        // Largest header set is 32 bytes (spec §3: ext hdrs 0..32).
        let max = (0..=255u8)
            .filter_map(|code| Opcode(code).headers())
            .map(|set| set.len())
            .max();
        assert_eq!(max, Some(32));
    }

    #[test]
    fn payload_and_response_classes() {
        let supported = (0..=255u8).map(Opcode).filter(|op| op.headers().is_some());
        assert_eq!(supported.clone().count(), 23 + 12 + 2 + 23 + 1);
        for opcode in supported {
            let set = opcode.headers().unwrap();
            if opcode.is_response() {
                assert!(set.aeth || opcode.operation() == op::RDMA_READ_RESPONSE_MIDDLE);
                assert!(!set.xrceth);
            }
            if set.reth || set.atomic_eth || set.aeth || set.cnp {
                let payload = opcode.carries_payload();
                let write = matches!(
                    opcode.operation(),
                    op::RDMA_WRITE_FIRST | op::RDMA_WRITE_ONLY | op::RDMA_WRITE_ONLY_WITH_IMMEDIATE
                );
                let read_response = matches!(
                    opcode.operation(),
                    op::RDMA_READ_RESPONSE_FIRST
                        | op::RDMA_READ_RESPONSE_LAST
                        | op::RDMA_READ_RESPONSE_ONLY
                );
                assert_eq!(payload, write || read_response, "{opcode}");
            }
        }
        assert!(!Opcode::RC_RDMA_READ_REQUEST.carries_payload());
        assert!(!Opcode::CNP.carries_payload());
        assert!(Opcode::UD_SEND_ONLY.carries_payload());
        assert!(Opcode(0xAE).is_response());
        assert!(!Opcode(0x31).is_response());
    }

    #[test]
    fn names() {
        assert_eq!(Opcode::RC_SEND_ONLY.name(), "RC SEND_ONLY");
        assert_eq!(Opcode(0xAA).name(), "XRC RDMA_WRITE_ONLY");
        assert_eq!(
            Opcode::UD_SEND_ONLY_WITH_IMMEDIATE.name(),
            "UD SEND_ONLY_WITH_IMMEDIATE"
        );
        assert_eq!(Opcode(0x37).name(), "UC SEND_ONLY_WITH_INVALIDATE");
        assert_eq!(Opcode::CNP.name(), "CNP");
        assert_eq!(Opcode(0x80).name(), "CNP RESERVED");
        assert_eq!(Opcode(0x15).name(), "RC RESERVED");
        assert_eq!(Opcode(0xC3).name(), "RESERVED");
        assert_eq!(Opcode(0xFF).name(), "VENDOR");
        assert_eq!(Opcode::RC_FETCH_ADD.to_string(), "RC FETCH_ADD");
        assert_eq!(Opcode(0x15).to_string(), "RC RESERVED (0x15)");
        assert_eq!(Transport::Xrc.to_string(), "XRC");
    }
}
