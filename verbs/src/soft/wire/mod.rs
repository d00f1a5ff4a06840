#![warn(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
//! Zero-copy views of RoCEv2 packets: the InfiniBand transport headers carried in the UDP
//! payload (port [`ROCE_UDP_PORT`]) and the invariant CRC that ends it.
//!
//! Layout of one UDP payload (spec `roce-wire.md` §1.1, §2.2):
//!
//! ```text
//! | BTH 12 | [DETH] [XRCETH] [RETH | AtomicETH] [AETH] [AtomicAckETH] [ImmDt | IETH] | payload | pad 0..3 | ICRC 4 |
//! ```
//!
//! Each header has its own module in the smoltcp style:
//!
//! * a private `field` module with the byte ranges, and a `HEADER_LEN` constant;
//! * `Packet<T: AsRef<[u8]>>`, a typed view over a byte buffer, with `new_unchecked`,
//!   `new_checked` and `check_len`, getters, and setters where `T: AsMut<[u8]>`;
//! * a `*Repr` struct holding the decoded fields, with `parse`, `emit` and `buffer_len`, and a
//!   tcpdump-style [`Display`](core::fmt::Display) for tracing.
//!
//! [`PacketHeaders`] parses or emits a whole packet's headers at once, [`finish_packet`] adds
//! pad and ICRC to an outgoing packet, and [`icrc`] computes and checks the invariant CRC.
//!
//! # No-panic contract
//!
//! This module handles bytes straight from the network, so:
//!
//! * once `check_len` (or `new_checked`) has succeeded on a `Packet`, none of its accessors
//!   panics (in fact the accessors never panic at all: on a buffer that is too short a getter
//!   returns 0 and a setter does nothing, but the values are then meaningless);
//! * `parse` never panics, whatever the input;
//! * `emit` never panics on a buffer of at least `buffer_len` bytes (and [`PacketHeaders::emit`]
//!   and [`finish_packet`] return [`WireError::Truncated`] instead of panicking on short buffers);
//! * untrusted input must go through `new_checked` or a `parse` function.
//!
//! The module contains no `unsafe`, no allocation on the packet path, and no indexing that can
//! panic (enforced with `clippy::indexing_slicing`).
//!
//! # Example
//!
//! ```
//! use std::net::SocketAddr;
//!
//! use rdmx_verbs::soft::wire::{
//!     BthRepr, IcrcPath, Opcode, PacketHeaders, finish_packet, icrc,
//! };
//!
//! let headers = PacketHeaders::new(BthRepr {
//!     opcode: Opcode::RC_SEND_ONLY,
//!     solicited: false,
//!     mig_req: true,
//!     pad_count: 0,
//!     pkey: 0xFFFF,
//!     fecn: false,
//!     becn: false,
//!     dest_qp: 0x11,
//!     ack_req: true,
//!     psn: 0x100,
//! });
//! let path = IcrcPath {
//!     src: "10.0.0.1:49443".parse::<SocketAddr>().unwrap(),
//!     dst: "10.0.0.2:4791".parse::<SocketAddr>().unwrap(),
//! };
//! let mut buf = [0u8; 64];
//! let hdr_len = headers.emit(&mut buf).unwrap();
//! buf[hdr_len..hdr_len + 10].copy_from_slice(b"hello roce");
//! let len = finish_packet(&mut buf, hdr_len + 10, &path).unwrap();
//! assert!(icrc::verify(&path, &buf[..len]));
//!
//! let (parsed, payload) = PacketHeaders::parse(&buf[..len]).unwrap();
//! assert_eq!(parsed.bth.pad_count, 2);
//! assert_eq!(payload, b"hello roce");
//! ```

pub mod aeth;
pub mod atomic;
pub mod bth;
mod bytes;
pub mod deth;
pub mod icrc;
pub mod imm;
pub mod opcode;
pub mod packet;
pub mod reth;
#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
mod testdata;
#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
mod tests;
pub mod xrceth;

pub use aeth::{AethKind, AethRepr, NakCode};
pub use atomic::{AtomicAckEthRepr, AtomicEthRepr};
pub use bth::BthRepr;
pub use deth::DethRepr;
pub use icrc::IcrcPath;
pub use opcode::{HeaderSet, Opcode, Transport};
pub use packet::{PacketHeaders, finish_packet};
pub use reth::RethRepr;
pub use xrceth::XrcEthRepr;

/// UDP destination port of RoCEv2 (IANA "RoCEv2"); receivers listen on it (spec §1.2).
pub const ROCE_UDP_PORT: u16 = 4791;

/// Why a packet could not be parsed or emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer is shorter than the headers (or, when emitting, than the output) need.
    #[error("packet truncated")]
    Truncated,
    /// The BTH transport header version (TVer) is not 0 (spec §2.1).
    #[error("unsupported BTH transport header version")]
    BadVersion,
    /// The BTH opcode is reserved or not supported by this provider (RD, vendor, ...).
    #[error("unknown or unsupported opcode 0x{0:02x}")]
    UnknownOpcode(u8),
    /// A malformed packet: an impossible length or pad count (pad on a packet that carries no
    /// payload, pad longer than the payload), or, when emitting, a required extension header
    /// that is missing.
    #[error("impossible length, pad count or header combination")]
    BadLength,
    /// The invariant CRC does not match the packet.
    #[error("bad ICRC")]
    BadIcrc,
}

/// Result type of the wire module.
pub type Result<T> = core::result::Result<T, WireError>;
