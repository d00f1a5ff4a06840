//! Bootstrap: the TCP side channel on which two contexts exchange endpoint information.
//!
//! Before two contexts can talk over RDMA they must learn each other's queue pair numbers,
//! PSNs, GIDs and credits. They do so over an ordinary TCP connection: the connector sends a
//! [`Frame::Hello`] with its [`EndpointInfo`], and the listener answers with a
//! [`Frame::Accept`] carrying its own, or a [`Frame::Reject`] saying why not.
//!
//! ```text
//! connector                               listener
//!   connect(addr, deadline)                 listen(addr) ; accept(&listener)
//!   send_frame(Hello(ours)) ───────────────▶ expect_hello(deadline) -> theirs
//!   expect_accept(deadline) -> theirs ◀───── send_frame(Accept(ours))   or  reject(reason)
//!   send_frame(Ready) ─────────────────────▶ expect_ready(deadline)      (RC, confined)
//! ```
//!
//! # Wire format
//!
//! Every message is one frame: a fixed 10-byte header followed by the payload.
//!
//! ```text
//! offset  size  field
//!      0     4  magic: b"RDMX"
//!      4     2  protocol version, big-endian (PROTOCOL_VERSION)
//!      6     4  payload length in bytes, big-endian, at most MAX_FRAME
//!     10     n  payload: the bincode 1.3 encoding of a Frame
//!               (fixed-width integers, little-endian; lengths as u64)
//! ```
//!
//! The header layout is frozen: every version of the protocol, past and future, starts its
//! frames with these 10 bytes. A peer that speaks another version can therefore always read
//! the header with [`decode_header`] and learn which version the other side speaks, even when
//! it cannot decode the payload. Only the payload encoding may change between versions.
//!
//! # Version mismatch
//!
//! [`recv_frame`] refuses a frame whose header carries another version with
//! [`BootstrapError::VersionMismatch`]. When the listener sees this, [`expect_hello`] answers
//! with a `Reject` frame encoded with *our* version before it returns the error, so the
//! connector does not hang: a connector of the same version reads the reason as
//! [`BootstrapError::Rejected`], and one of another version gets its own
//! `VersionMismatch` naming our version.
//!
//! # Deadlines
//!
//! Every function that waits for the peer ([`connect`], [`send_frame`], [`recv_frame`] and the
//! helpers built on them) takes an absolute deadline and never blocks past it: before each
//! blocking call it sets the socket's read or write timeout to the time left. Only [`accept`]
//! waits without one, as a listener's accept loop does.
//! A peer that sends nothing, or stops in the middle of a frame, yields
//! [`BootstrapError::Timeout`] at the deadline.
//!
//! # Hostile peers
//!
//! Nothing received from the network can make these functions panic, and they never allocate
//! more than [`MAX_FRAME`] bytes for a frame: the announced length is checked before the
//! payload is read, bincode runs with a size limit, and the SRQ list reserves at most 4096
//! entries up front whatever length it claims, so a payload that claims a string or a vector
//! of 2^60 elements fails to decode instead of allocating. [`decode`] is a pure function over
//! a byte slice, usable from fuzzers and property tests.

pub mod auth;
mod codec;
mod exchange;
#[cfg(test)]
mod fixtures;
mod gate;
mod wire;

pub use auth::{AuthKey, DatagramKey};
pub use codec::{decode, decode_header, encode, try_encode};
pub use exchange::{
    accept, accept_until, connect, expect_accept, expect_hello, expect_ready, expect_xrc_target,
    listen, recv_frame, reject, send_frame,
};
pub use gate::{Admission, Admitted, Gate, Refusal, Ticket};
pub use wire::{BootstrapError, EndpointInfo, Frame, Header, PathInfo, Transport, validate};

/// Version of the bootstrap protocol; both sides must agree. Version 3: credit recall may
/// be signalled with an RDMA WRITE with immediate (`rdmx_rc::wire::Signal`), which a
/// version 2 peer would take for a protocol violation. Version 4: a rendezvous request may
/// ask to be woken when a read finishes (`Header::WAKE_ON_READ`), answered with a
/// `Signal::ReadDone` a version 3 peer would reject. Version 5: a recall word may say that
/// the writer's endpoint is gone (`rdmx_rc::wire::Recall::GONE`), which a
/// version 4 peer would take for a request. Version 6: a recall word may say that the
/// writer closes and needs one credit for its Close (`Recall::closing`, a bit the request
/// counter used before). Version 7: UD endpoints (`Transport::Ud`) and the session
/// token (`EndpointInfo::token`), a field a version 6 peer would not decode. Version 8: the
/// application's connection data (`EndpointInfo::app_data`). Version 9: confined RC
/// endpoints (`mailbox_rkey` is a memory window's key, bound once the queue pair is up; the
/// connector's `Signal::Ready` says its own is bound), which a version 8 peer would write
/// before the window exists and reject as an unknown signal.
pub const PROTOCOL_VERSION: u16 = 9;

/// The four bytes every bootstrap frame starts with.
pub const MAGIC: [u8; 4] = *b"RDMX";

/// Length of the fixed frame header (magic, version, payload length), in bytes.
pub const HEADER_LEN: usize = 10;

/// The largest payload a frame may carry, in bytes (64 KiB).
///
/// A header announcing more is refused with [`BootstrapError::TooLarge`] before any of the
/// payload is read.
pub const MAX_FRAME: u32 = 64 * 1024;

/// The most connection data ([`EndpointInfo::app_data`]) an endpoint carries.
pub const MAX_APP_DATA: usize = 4096;

/// Checks connection data an application hands to a connect or a listener.
///
/// # Errors
/// `InvalidArgument` for more than [`MAX_APP_DATA`] bytes.
pub fn check_app_data(data: &[u8]) -> crate::Result<()> {
    if data.len() > MAX_APP_DATA {
        return Err(crate::Error::InvalidArgument(format!(
            "{} bytes of connection data; at most {MAX_APP_DATA} go with a connection",
            data.len()
        )));
    }
    Ok(())
}

/// The longest reason [`reject`] sends, in bytes; longer reasons are cut at a character
/// boundary.
pub const MAX_REJECT_REASON: usize = 1024;

/// The reason of a `Reject` that means "not now, connect again": a listener whose context
/// is in the middle of another XRC exchange declines after a short wait, so that two
/// contexts connecting to each other at once do not each wait for the other. A connector
/// that gets it backs off for a few milliseconds and tries again, until its connect
/// timeout.
pub const REJECT_BUSY: &str = "busy: another XRC exchange of this context is under way; retry";

/// The largest queue pair number, PSN or SRQ number: they are 24-bit fields on the wire.
const MAX_24BIT: u32 = 0x00FF_FFFF;

/// Path MTUs an endpoint may announce (IBTA vol. 1, 9.7.4.1: 256 to 4096 bytes).
const VALID_MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];

/// The most receive credits an endpoint may grant up front.
const MAX_CREDITS: u32 = 65_536;

/// The most SRQ numbers an endpoint may announce.
const MAX_SRQ_NUMS: usize = 4096;

/// Backlog of the listening socket.
const LISTEN_BACKLOG: i32 = 1024;

/// Byte ranges of the header fields.
mod field {
    use std::ops::Range;

    /// The magic bytes.
    pub(super) const MAGIC: Range<usize> = 0..4;
    /// The protocol version, big-endian.
    pub(super) const VERSION: Range<usize> = 4..6;
    /// The payload length, big-endian.
    pub(super) const LENGTH: Range<usize> = 6..10;
}
