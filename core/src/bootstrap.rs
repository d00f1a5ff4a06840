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

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::time::{Duration, Instant};

use bincode::Options;
use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use socket2::{Domain, Protocol, Socket, Type};

/// Version of the bootstrap protocol; both sides must agree. Version 3: credit recall may
/// be signalled with an RDMA WRITE with immediate (`rdmx_core::header::Signal`), which a
/// version 2 peer would take for a protocol violation. Version 4: a rendezvous request may
/// ask to be woken when a read finishes (`Header::WAKE_ON_READ`), answered with a
/// `Signal::ReadDone` a version 3 peer would reject.
pub const PROTOCOL_VERSION: u16 = 4;

/// The four bytes every bootstrap frame starts with.
pub const MAGIC: [u8; 4] = *b"RDMX";

/// Length of the fixed frame header (magic, version, payload length), in bytes.
pub const HEADER_LEN: usize = 10;

/// The largest payload a frame may carry, in bytes (64 KiB).
///
/// A header announcing more is refused with [`BootstrapError::TooLarge`] before any of the
/// payload is read.
pub const MAX_FRAME: u32 = 64 * 1024;

/// The longest reason [`reject`] sends, in bytes; longer reasons are cut at a character
/// boundary.
pub const MAX_REJECT_REASON: usize = 1024;

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

/// How a path is reached: what a peer needs to build an address vector towards us.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathInfo {
    /// The GID of the local port (an IPv4-mapped address on RoCEv2).
    pub gid: [u8; 16],
    /// Soft provider: the UDP port of that device port (4791 on hardware).
    pub udp_port: u16,
    /// The local port number (1-based) this path leaves from.
    pub port_num: u8,
}

/// The transport an endpoint uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TransportKind {
    /// Reliable connected queue pairs, one per endpoint.
    Rc,
    /// XRC: one initiator QP per remote node, reaching every SRQ of the remote processes.
    Xrc,
}

/// Everything one side tells the other to connect an endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointInfo {
    /// Transport of the endpoint.
    pub transport: TransportKind,
    /// The queue pair number the peer must send to (RC QP or XRC target QP).
    pub qpn: u32,
    /// The first PSN this side will send with.
    pub psn: u32,
    /// The path MTU this side can use, in bytes.
    pub mtu: u32,
    /// The primary path.
    pub primary: PathInfo,
    /// An alternate path for automatic path migration, when this side has two ports.
    pub alternate: Option<PathInfo>,
    /// XRC: the SRQ numbers of this side's receive queues (empty for RC).
    #[serde(deserialize_with = "deserialize_u32s_cautiously")]
    pub srq_nums: Vec<u32>,
    /// Receive credits granted to the peer up front.
    pub credits: u32,
    /// Address of the peer's mailbox slot in this side's mailbox region.
    pub mailbox_addr: u64,
    /// Remote key of the mailbox region.
    pub mailbox_rkey: u32,
    /// Largest message this side accepts, in bytes.
    pub max_message: u64,
    /// The largest message this side sends eagerly (bigger ones use rendezvous).
    pub eager_limit: u32,
    /// A random identifier of the sending context (for logs and duplicate detection).
    pub context_id: u64,
    /// A random identifier of the sending node (the device the context's XRC domain lives
    /// on; XRC target queue pairs are shared per remote node).
    pub node_id: u64,
    /// The endpoint's number on the sending side: the peer puts it in the header of every
    /// message so the sender's context can route it (at most 65535).
    pub tag: u32,
    /// XRC: the target queue pair the sender created (or already had) for the peer's
    /// initiator; `None` in a `Hello` and for RC.
    pub xrc_target: Option<u32>,
    /// XRC: where this side's node's target queue pairs receive, when that is not
    /// `primary` (soft provider: an XRC domain hosted by another process of the node).
    pub xrc_target_path: Option<PathInfo>,
    /// XRC: with `xrc_target_path`, the alternate path to the node's targets (the hosting
    /// process's second port), when it has two.
    pub xrc_target_alt: Option<PathInfo>,
    /// XRC: the target queue pair of the peer's node that this side's initiator already
    /// sends to (connected for another endpoint, possibly to another process of that
    /// node); the peer uses it instead of making a new one.
    pub xrc_in_use: Option<u32>,
}

/// One message of the bootstrap exchange.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Frame {
    /// Connector -> listener: "here is my side, please accept".
    Hello(EndpointInfo),
    /// Listener -> connector: accepted; here is the listener's side.
    Accept(EndpointInfo),
    /// Either side: refused, with a human-readable reason.
    Reject(String),
    /// XRC, connector -> listener after the `Accept`: the target queue pair the connector's
    /// node has for the listener's initiator.
    XrcTarget(u32),
}

/// Deserializes a `Vec<u32>` without trusting the announced length: serde would reserve up to
/// 1 MiB for a sequence that claims 2^60 elements, which is more than a whole frame; here at
/// most [`MAX_SRQ_NUMS`] elements are reserved up front, and the vector grows only with the
/// elements actually decoded.
fn deserialize_u32s_cautiously<'de, D>(deserializer: D) -> Result<Vec<u32>, D::Error>
where
    D: Deserializer<'de>,
{
    /// Visits a sequence of `u32`.
    struct CautiousU32s;

    impl<'de> Visitor<'de> for CautiousU32s {
        type Value = Vec<u32>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a sequence of u32")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u32>, A::Error> {
            let reserve = seq.size_hint().unwrap_or(0).min(MAX_SRQ_NUMS);
            let mut out = Vec::with_capacity(reserve);
            while let Some(value) = seq.next_element()? {
                out.push(value);
            }
            Ok(out)
        }
    }

    deserializer.deserialize_seq(CautiousU32s)
}

/// Errors of the bootstrap exchange.
///
/// `BadMagic`, `Decode`, `Invalid`, `TooLarge`, `Truncated`, `Unexpected` and
/// `VersionMismatch` mean the peer broke (or does not speak) the protocol; `Rejected` means it
/// refused us; `Closed`, `Io` and `Timeout` come from the connection itself.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    /// The frame does not start with [`MAGIC`]: the peer does not speak this protocol.
    #[error(
        "bootstrap frame starts with {0:02x?} instead of \"RDMX\": the peer does not speak the \
         rdmx bootstrap protocol"
    )]
    BadMagic([u8; 4]),
    /// The peer closed the connection before sending any byte of a frame.
    #[error("the peer closed the bootstrap connection before sending a frame")]
    Closed,
    /// The payload is not a valid encoding of a [`Frame`].
    #[error("bootstrap frame payload does not decode: {0}")]
    Decode(String),
    /// The peer's [`EndpointInfo`] failed [`validate`].
    #[error("invalid endpoint information: {0}")]
    Invalid(String),
    /// A socket operation failed.
    #[error("bootstrap {op} failed")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The peer refused the exchange, with this reason.
    #[error("the peer rejected the bootstrap: {0:?}")]
    Rejected(String),
    /// The deadline passed.
    #[error("bootstrap timed out {what}")]
    Timeout {
        /// What was being waited for.
        what: &'static str,
    },
    /// The frame header announces a payload longer than [`MAX_FRAME`].
    #[error("bootstrap frame announces a {0}-byte payload; the limit is {MAX_FRAME} bytes")]
    TooLarge(u32),
    /// The peer closed the connection in the middle of a frame.
    #[error("the peer closed the bootstrap connection mid-frame, after {got} of {expected} bytes")]
    Truncated {
        /// Bytes of the frame received.
        got: usize,
        /// Bytes of the frame expected (only the header, until the header is complete).
        expected: usize,
    },
    /// A well-formed frame of a kind that is not allowed at this point of the exchange.
    #[error("unexpected bootstrap frame: {0}")]
    Unexpected(&'static str),
    /// The frame header carries another protocol version.
    #[error("bootstrap protocol version mismatch: we speak v{ours}, the peer speaks v{theirs}")]
    VersionMismatch {
        /// Our version ([`PROTOCOL_VERSION`]).
        ours: u16,
        /// The version in the peer's frame header.
        theirs: u16,
    },
}

/// The fixed header of a frame, as read from the wire.
///
/// Its layout is the same in every protocol version (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The protocol version of the sender.
    pub version: u16,
    /// Length of the payload that follows the header, in bytes.
    pub payload_len: u32,
}

impl Header {
    /// Length of the whole frame (header and payload), in bytes.
    pub fn frame_len(&self) -> usize {
        let payload = usize::try_from(self.payload_len).unwrap_or(usize::MAX);
        HEADER_LEN.saturating_add(payload)
    }
}

/// The bincode configuration of the payload: fixed-width little-endian integers, bounded by
/// [`MAX_FRAME`] when decoding, and no trailing bytes allowed.
fn wire_options() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian()
        .with_limit(u64::from(MAX_FRAME))
        .reject_trailing_bytes()
}

/// Encodes `frame` with its header.
///
/// A frame whose payload exceeds [`MAX_FRAME`] is still encoded, and [`decode`] refuses it
/// with [`BootstrapError::TooLarge`]; use [`try_encode`] to catch that before sending. Every
/// valid [`EndpointInfo`] (see [`validate`]) fits.
pub fn encode(frame: &Frame) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + 128);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    out.extend_from_slice(&0_u32.to_be_bytes());
    // The size limit of `wire_options` is for decoding hostile input; here we encode our own
    // frame, and too large a frame is reported by the length check in `try_encode`.
    let options = bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian();
    // Cannot fail: the writer is a Vec (which never fails), there is no size limit, and the
    // derived `Serialize` impls of `Frame` only emit sequences of known length.
    options
        .serialize_into(&mut out, frame)
        .expect("bincode serialization into a Vec cannot fail");
    let payload_len = u32::try_from(out.len() - HEADER_LEN).unwrap_or(u32::MAX);
    if let Some(length) = out.get_mut(field::LENGTH) {
        length.copy_from_slice(&payload_len.to_be_bytes());
    }
    out
}

/// Encodes `frame` with its header, refusing a payload longer than [`MAX_FRAME`].
///
/// # Errors
///
/// [`BootstrapError::TooLarge`] when the payload would exceed [`MAX_FRAME`] bytes.
pub fn try_encode(frame: &Frame) -> Result<Vec<u8>, BootstrapError> {
    let bytes = encode(frame);
    let payload_len = u32::try_from(bytes.len() - HEADER_LEN).unwrap_or(u32::MAX);
    if payload_len > MAX_FRAME {
        return Err(BootstrapError::TooLarge(payload_len));
    }
    Ok(bytes)
}

/// Reads the frame header at the start of `buf`, whatever its version.
///
/// Returns `Ok(None)` while fewer than [`HEADER_LEN`] bytes are available. The magic is
/// checked as soon as its four bytes are there; the version and length are returned as they
/// are, unchecked, so a peer can always learn the other side's version (see the
/// [module docs](self)).
///
/// # Errors
///
/// [`BootstrapError::BadMagic`] when `buf` does not start with [`MAGIC`].
pub fn decode_header(buf: &[u8]) -> Result<Option<Header>, BootstrapError> {
    check_magic(buf)?;
    let (Some(version), Some(payload_len)) =
        (be_u16(buf, field::VERSION), be_u32(buf, field::LENGTH))
    else {
        return Ok(None);
    };
    Ok(Some(Header {
        version,
        payload_len,
    }))
}

/// Decodes one frame from the start of `buf`.
///
/// Returns `Ok(None)` when `buf` is a valid but incomplete frame (more bytes are needed),
/// and `Ok(Some((frame, consumed)))` when a whole frame was decoded from the first `consumed`
/// bytes; bytes after it are left alone. Checks happen as early as the bytes allow: the magic
/// with 4 bytes, the version with 6, the length with 10, so garbage is refused before the
/// rest of it arrives. Never panics and never allocates more than the payload needs, which is
/// at most [`MAX_FRAME`] bytes.
///
/// # Errors
///
/// [`BootstrapError::BadMagic`], [`BootstrapError::VersionMismatch`],
/// [`BootstrapError::TooLarge`] or [`BootstrapError::Decode`] when the bytes are not a valid
/// frame of our version.
pub fn decode(buf: &[u8]) -> Result<Option<(Frame, usize)>, BootstrapError> {
    check_magic(buf)?;
    check_version(buf)?;
    let Some(header) = decode_header(buf)? else {
        return Ok(None);
    };
    check_length(header.payload_len)?;
    let frame_len = header.frame_len();
    let Some(payload) = buf.get(HEADER_LEN..frame_len) else {
        return Ok(None);
    };
    Ok(Some((decode_payload(payload)?, frame_len)))
}

/// Decodes a payload of exactly `payload.len()` bytes.
fn decode_payload(payload: &[u8]) -> Result<Frame, BootstrapError> {
    wire_options()
        .deserialize(payload)
        .map_err(|err| BootstrapError::Decode(err.to_string()))
}

/// Fails unless `buf` starts with [`MAGIC`]; passes while fewer than 4 bytes are there.
fn check_magic(buf: &[u8]) -> Result<(), BootstrapError> {
    match buf.get(field::MAGIC) {
        Some(magic) if magic != MAGIC => {
            let mut found = [0_u8; 4];
            found.copy_from_slice(magic);
            Err(BootstrapError::BadMagic(found))
        }
        _ => Ok(()),
    }
}

/// Fails if `buf` carries another version than ours; passes while the version is not there.
fn check_version(buf: &[u8]) -> Result<(), BootstrapError> {
    match be_u16(buf, field::VERSION) {
        Some(theirs) if theirs != PROTOCOL_VERSION => Err(BootstrapError::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs,
        }),
        _ => Ok(()),
    }
}

/// Fails if an announced payload length exceeds [`MAX_FRAME`].
fn check_length(payload_len: u32) -> Result<(), BootstrapError> {
    if payload_len > MAX_FRAME {
        return Err(BootstrapError::TooLarge(payload_len));
    }
    Ok(())
}

/// The big-endian `u16` at `range` of `buf`, if `buf` is long enough.
fn be_u16(buf: &[u8], range: Range<usize>) -> Option<u16> {
    let bytes: [u8; 2] = buf.get(range)?.try_into().ok()?;
    Some(u16::from_be_bytes(bytes))
}

/// The big-endian `u32` at `range` of `buf`, if `buf` is long enough.
fn be_u32(buf: &[u8], range: Range<usize>) -> Option<u32> {
    let bytes: [u8; 4] = buf.get(range)?.try_into().ok()?;
    Some(u32::from_be_bytes(bytes))
}

/// Checks that the endpoint information a peer sent makes sense.
///
/// The rules: `qpn`, `psn` and every SRQ number fit in 24 bits; `mtu` is 256, 512, 1024,
/// 2048 or 4096; `credits` is at most 65536 (0 is allowed: a context whose receive queue is
/// fully committed grants credits later, through the mailbox); there are at most 4096 SRQ numbers; and
/// every path (primary and alternate) has a nonzero UDP port and a port number of at least 1.
///
/// # Errors
///
/// [`BootstrapError::Invalid`] naming the first rule that fails.
pub fn validate(info: &EndpointInfo) -> Result<(), BootstrapError> {
    let invalid = |msg: String| Err(BootstrapError::Invalid(msg));
    if info.qpn > MAX_24BIT {
        return invalid(format!("qpn {:#x} does not fit in 24 bits", info.qpn));
    }
    if info.psn > MAX_24BIT {
        return invalid(format!("psn {:#x} does not fit in 24 bits", info.psn));
    }
    if !VALID_MTUS.contains(&info.mtu) {
        return invalid(format!(
            "mtu {} is not one of 256, 512, 1024, 2048, 4096",
            info.mtu
        ));
    }
    if info.tag > 0xFFFF {
        return invalid(format!("tag {} does not fit in 16 bits", info.tag));
    }
    if info.xrc_target.is_some_and(|q| q > MAX_24BIT) {
        return invalid("the XRC target qpn does not fit in 24 bits".into());
    }
    if info.xrc_in_use.is_some_and(|q| q > MAX_24BIT) {
        return invalid("the XRC target in use does not fit in 24 bits".into());
    }
    if info.credits > MAX_CREDITS {
        return invalid(format!(
            "credits {} outside 0..={MAX_CREDITS}",
            info.credits
        ));
    }
    if info.srq_nums.len() > MAX_SRQ_NUMS {
        return invalid(format!(
            "{} SRQ numbers, more than {MAX_SRQ_NUMS}",
            info.srq_nums.len()
        ));
    }
    if let Some(srq) = info.srq_nums.iter().find(|&&srq| srq > MAX_24BIT) {
        return invalid(format!("SRQ number {srq:#x} does not fit in 24 bits"));
    }
    validate_path("primary", &info.primary)?;
    if let Some(alternate) = &info.alternate {
        validate_path("alternate", alternate)?;
    }
    if let Some(targets) = &info.xrc_target_path {
        validate_path("XRC target", targets)?;
    }
    if let Some(targets) = &info.xrc_target_alt {
        validate_path("XRC target alternate", targets)?;
    }
    Ok(())
}

/// Checks one path of an [`EndpointInfo`].
fn validate_path(which: &str, path: &PathInfo) -> Result<(), BootstrapError> {
    if path.udp_port == 0 {
        return Err(BootstrapError::Invalid(format!(
            "{which} path has UDP port 0"
        )));
    }
    if path.port_num == 0 {
        return Err(BootstrapError::Invalid(format!(
            "{which} path has port number 0 (ports are numbered from 1)"
        )));
    }
    Ok(())
}

/// Binds a listening socket for bootstrap connections on `addr`.
///
/// The socket has `SO_REUSEADDR` (so a restarted server can bind again while old connections
/// linger in `TIME_WAIT`), `TCP_NODELAY` (which Linux passes on to accepted connections;
/// [`accept`] sets it anyway) and a backlog of 1024. Use port 0 to let the OS choose.
///
/// # Errors
///
/// [`BootstrapError::Io`] when the socket cannot be created, configured, bound or put in the
/// listening state.
pub fn listen(addr: SocketAddr) -> Result<TcpListener, BootstrapError> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
        .map_err(io_error("socket"))?;
    socket
        .set_reuse_address(true)
        .map_err(io_error("set SO_REUSEADDR"))?;
    socket
        .set_tcp_nodelay(true)
        .map_err(io_error("set TCP_NODELAY"))?;
    socket.bind(&addr.into()).map_err(io_error("bind"))?;
    socket.listen(LISTEN_BACKLOG).map_err(io_error("listen"))?;
    Ok(socket.into())
}

/// Accepts one bootstrap connection and sets `TCP_NODELAY` on it.
///
/// This blocks until a connector arrives (or fails at once with `WouldBlock` inside
/// [`BootstrapError::Io`] if `listener` is non-blocking); the exchange that follows is bounded
/// by the deadlines of [`expect_hello`] and [`send_frame`].
///
/// # Errors
///
/// [`BootstrapError::Io`] when `accept` or setting the option fails.
pub fn accept(listener: &TcpListener) -> Result<(TcpStream, SocketAddr), BootstrapError> {
    let (stream, peer) = loop {
        match listener.accept() {
            Ok(accepted) => break accepted,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(io_error("accept")(err)),
        }
    };
    stream
        .set_nodelay(true)
        .map_err(io_error("set TCP_NODELAY"))?;
    Ok((stream, peer))
}

/// [`accept`] giving up at `deadline`: `Ok(None)` when no peer connected in time. The
/// listener is put in non-blocking mode while it waits (and back afterwards), so do not
/// call [`accept`] on it from another thread at the same time.
///
/// # Errors
///
/// [`BootstrapError::Io`] when `accept` or setting an option fails.
pub fn accept_until(
    listener: &TcpListener,
    deadline: Instant,
) -> Result<Option<(TcpStream, SocketAddr)>, BootstrapError> {
    listener
        .set_nonblocking(true)
        .map_err(io_error("set O_NONBLOCK"))?;
    let got = loop {
        match listener.accept() {
            Ok(accepted) => break Ok(Some(accepted)),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break Ok(None);
                }
                // A rare call: a short sleep is cheaper than keeping an epoll set for it.
                std::thread::sleep(left.min(Duration::from_millis(2)));
            }
            Err(err) => break Err(io_error("accept")(err)),
        }
    };
    listener
        .set_nonblocking(false)
        .map_err(io_error("clear O_NONBLOCK"))?;
    let Some((stream, peer)) = got? else {
        return Ok(None);
    };
    stream
        .set_nonblocking(false)
        .map_err(io_error("clear O_NONBLOCK"))?;
    stream
        .set_nodelay(true)
        .map_err(io_error("set TCP_NODELAY"))?;
    Ok(Some((stream, peer)))
}

/// Connects to a bootstrap listener at `addr`, giving up at `deadline`, and sets
/// `TCP_NODELAY`.
///
/// Makes one attempt: a refused connection is an error at once, not retried.
///
/// # Errors
///
/// [`BootstrapError::Timeout`] when the deadline passes first, [`BootstrapError::Io`] when
/// the connection fails (for instance, refused).
pub fn connect(addr: SocketAddr, deadline: Instant) -> Result<TcpStream, BootstrapError> {
    const WHAT: &str = "connecting";
    let timeout = time_left(deadline, WHAT)?;
    let stream = TcpStream::connect_timeout(&addr, timeout).map_err(|err| {
        if is_timeout(&err) {
            BootstrapError::Timeout { what: WHAT }
        } else {
            io_error("connect")(err)
        }
    })?;
    stream
        .set_nodelay(true)
        .map_err(io_error("set TCP_NODELAY"))?;
    Ok(stream)
}

/// Sends one frame, blocking no later than `deadline`.
///
/// Puts the stream in blocking mode and leaves its write timeout as it found it.
///
/// # Errors
///
/// [`BootstrapError::TooLarge`] when the frame does not fit in [`MAX_FRAME`] (nothing is
/// sent), [`BootstrapError::Timeout`] when the deadline passes before the whole frame is
/// handed to the kernel, [`BootstrapError::Io`] when the connection fails.
pub fn send_frame(
    stream: &mut TcpStream,
    frame: &Frame,
    deadline: Instant,
) -> Result<(), BootstrapError> {
    let bytes = try_encode(frame)?;
    let previous = stream
        .write_timeout()
        .map_err(io_error("get write timeout"))?;
    let result = write_all_by(stream, &bytes, deadline);
    // Best effort: the frame's outcome matters more than restoring the old timeout.
    stream.set_write_timeout(previous).ok();
    result
}

/// Receives one frame, blocking no later than `deadline`.
///
/// Reads exactly one frame and nothing after it. The header is checked as it arrives (magic
/// after 4 bytes, version after 6, length after 10), and the payload buffer is allocated only
/// once its length is known to be at most [`MAX_FRAME`]. Puts the stream in blocking mode and
/// leaves its read timeout as it found it.
///
/// # Errors
///
/// - [`BootstrapError::Timeout`] when the deadline passes before the frame is complete;
/// - [`BootstrapError::Closed`] when the peer closes before sending any byte;
/// - [`BootstrapError::Truncated`] when it closes in the middle of the frame;
/// - [`BootstrapError::BadMagic`], [`BootstrapError::VersionMismatch`],
///   [`BootstrapError::TooLarge`], [`BootstrapError::Decode`] when the bytes are not a frame
///   of our version;
/// - [`BootstrapError::Io`] when the connection fails.
pub fn recv_frame(stream: &mut TcpStream, deadline: Instant) -> Result<Frame, BootstrapError> {
    let previous = stream
        .read_timeout()
        .map_err(io_error("get read timeout"))?;
    let result = recv_frame_inner(stream, deadline);
    // Best effort, as in `send_frame`.
    stream.set_read_timeout(previous).ok();
    result
}

/// [`recv_frame`] without the timeout bookkeeping.
fn recv_frame_inner(stream: &mut TcpStream, deadline: Instant) -> Result<Frame, BootstrapError> {
    stream
        .set_nonblocking(false)
        .map_err(io_error("set blocking mode"))?;
    let mut header = [0_u8; HEADER_LEN];
    // Read the header in steps so that each field is checked as soon as it is complete.
    let mut got = 0;
    for end in [field::MAGIC.end, field::VERSION.end, field::LENGTH.end] {
        let part = header.get_mut(got..end).unwrap_or_default();
        read_exact_by(
            stream,
            part,
            deadline,
            "waiting for a frame header",
            got,
            HEADER_LEN,
        )?;
        got = end;
        check_magic(&header[..end])?;
        check_version(&header[..end])?;
    }
    let Some(parsed) = decode_header(&header)? else {
        // Unreachable: all HEADER_LEN bytes were read above.
        return Err(BootstrapError::Truncated {
            got,
            expected: HEADER_LEN,
        });
    };
    check_length(parsed.payload_len)?;
    // At most MAX_FRAME bytes: checked just above.
    let mut payload = vec![0_u8; parsed.frame_len() - HEADER_LEN];
    read_exact_by(
        stream,
        &mut payload,
        deadline,
        "waiting for a frame payload",
        HEADER_LEN,
        parsed.frame_len(),
    )?;
    decode_payload(&payload)
}

/// Reads exactly `buf.len()` bytes, no later than `deadline`.
///
/// `before` is how many bytes of the frame were read before this call and `expected` the
/// frame length known so far; both only shape the [`BootstrapError::Truncated`] report.
fn read_exact_by(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
    what: &'static str,
    before: usize,
    expected: usize,
) -> Result<(), BootstrapError> {
    let mut filled = 0;
    while let Some(rest) = buf.get_mut(filled..).filter(|rest| !rest.is_empty()) {
        let timeout = time_left(deadline, what)?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(io_error("set read timeout"))?;
        match stream.read(rest) {
            Ok(0) if before + filled == 0 => return Err(BootstrapError::Closed),
            Ok(0) => {
                return Err(BootstrapError::Truncated {
                    got: before + filled,
                    expected,
                });
            }
            Ok(n) => filled += n,
            // A timeout here is checked against the deadline at the top of the loop.
            Err(err) if is_timeout(&err) || err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(io_error("read")(err)),
        }
    }
    Ok(())
}

/// Writes all of `bytes`, no later than `deadline`.
fn write_all_by(
    stream: &mut TcpStream,
    bytes: &[u8],
    deadline: Instant,
) -> Result<(), BootstrapError> {
    const WHAT: &str = "sending a frame";
    stream
        .set_nonblocking(false)
        .map_err(io_error("set blocking mode"))?;
    let mut sent = 0;
    while let Some(rest) = bytes.get(sent..).filter(|rest| !rest.is_empty()) {
        let timeout = time_left(deadline, WHAT)?;
        stream
            .set_write_timeout(Some(timeout))
            .map_err(io_error("set write timeout"))?;
        match stream.write(rest) {
            Ok(0) => return Err(io_error("write")(io::ErrorKind::WriteZero.into())),
            Ok(n) => sent += n,
            Err(err) if is_timeout(&err) || err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(io_error("write")(err)),
        }
    }
    Ok(())
}

/// Tells the peer why it is refused: sends `Frame::Reject(reason)`, then closes our side
/// gracefully, no later than `deadline`.
///
/// The reject is encoded with our [`PROTOCOL_VERSION`], whatever version the peer speaks: a
/// peer of another version cannot decode the payload, but it can read our version from the
/// header (see [`decode_header`]) and reports [`BootstrapError::VersionMismatch`]. A reason
/// longer than [`MAX_REJECT_REASON`] bytes is cut.
///
/// After sending, the write side is shut down and whatever the peer still sends is read and
/// dropped until it closes or `deadline` passes. This keeps our close from turning into a
/// reset that could destroy the reject before the peer reads it, at the price of waiting
/// (up to `deadline`) for the peer to close.
///
/// # Errors
///
/// Those of [`send_frame`]; the shutdown and draining that follow are best effort.
pub fn reject(
    stream: &mut TcpStream,
    reason: &str,
    deadline: Instant,
) -> Result<(), BootstrapError> {
    let mut end = reason.len().min(MAX_REJECT_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let reason = reason.get(..end).unwrap_or_default();
    send_frame(stream, &Frame::Reject(reason.to_owned()), deadline)?;
    if stream.shutdown(Shutdown::Write).is_ok() {
        drain(stream, deadline);
    }
    Ok(())
}

/// Reads and drops bytes until the peer closes, an error, or `deadline`.
fn drain(stream: &mut TcpStream, deadline: Instant) {
    let previous = stream.read_timeout().ok().flatten();
    let mut sink = [0_u8; 1024];
    while let Ok(timeout) = time_left(deadline, "draining") {
        if stream.set_read_timeout(Some(timeout)).is_err() {
            break;
        }
        match stream.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => {}
            Err(err) if is_timeout(&err) || err.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    stream.set_read_timeout(previous).ok();
}

/// Listener side: receives the connector's `Hello` and checks it with [`validate`].
///
/// When the peer spoke our framing but something is wrong (another version, a frame too
/// large or undecodable, invalid endpoint information, or a frame other than `Hello`), this
/// tells the peer with [`reject`] before returning the error, so that the connector gets a
/// clear error instead of waiting for its deadline. Nothing is sent back to a peer whose bytes
/// do not start with [`MAGIC`].
///
/// # Errors
///
/// Those of [`recv_frame`]; [`BootstrapError::Invalid`] when the information fails
/// [`validate`]; [`BootstrapError::Rejected`] when the peer sent a `Reject`;
/// [`BootstrapError::Unexpected`] for an `Accept`.
pub fn expect_hello(
    stream: &mut TcpStream,
    deadline: Instant,
) -> Result<EndpointInfo, BootstrapError> {
    let result = match recv_frame(stream, deadline) {
        Ok(Frame::Hello(info)) => validate(&info).map(|()| info),
        Ok(Frame::Accept(_)) => Err(BootstrapError::Unexpected("Accept while waiting for Hello")),
        Ok(Frame::XrcTarget(_)) => Err(BootstrapError::Unexpected(
            "XrcTarget while waiting for Hello",
        )),
        Ok(Frame::Reject(reason)) => return Err(BootstrapError::Rejected(reason)),
        Err(err) => Err(err),
    };
    if let Err(err) = &result
        && let Some(reason) = reject_reason(err)
    {
        // Best effort: the error we return is the one that matters.
        reject(stream, &reason, deadline).ok();
    }
    result
}

/// What the listener tells a connector whose `Hello` failed with `err`, if anything.
fn reject_reason(err: &BootstrapError) -> Option<String> {
    match err {
        BootstrapError::VersionMismatch { ours, theirs } => Some(format!(
            "bootstrap protocol version mismatch: the listener speaks v{ours}, the connector \
             sent v{theirs}"
        )),
        BootstrapError::TooLarge(_)
        | BootstrapError::Decode(_)
        | BootstrapError::Invalid(_)
        | BootstrapError::Unexpected(_) => Some(format!("listener refused the hello: {err}")),
        _ => None,
    }
}

/// Connector side: receives the listener's answer to our `Hello`.
///
/// # Errors
///
/// Those of [`recv_frame`]; [`BootstrapError::Rejected`] with the listener's reason when it
/// refused us; [`BootstrapError::Invalid`] when its information fails [`validate`];
/// [`BootstrapError::Unexpected`] for a `Hello`.
pub fn expect_accept(
    stream: &mut TcpStream,
    deadline: Instant,
) -> Result<EndpointInfo, BootstrapError> {
    match recv_frame(stream, deadline)? {
        Frame::Accept(info) => {
            validate(&info)?;
            Ok(info)
        }
        Frame::Reject(reason) => Err(BootstrapError::Rejected(reason)),
        Frame::Hello(_) => Err(BootstrapError::Unexpected("Hello while waiting for Accept")),
        Frame::XrcTarget(_) => Err(BootstrapError::Unexpected(
            "XrcTarget while waiting for Accept",
        )),
    }
}

/// Listener side of an XRC exchange: receives the connector's target QP number.
///
/// # Errors
///
/// Those of [`recv_frame`]; [`BootstrapError::Rejected`] when the connector refused;
/// [`BootstrapError::Invalid`] for a number above 24 bits; [`BootstrapError::Unexpected`]
/// for any other frame.
pub fn expect_xrc_target(stream: &mut TcpStream, deadline: Instant) -> Result<u32, BootstrapError> {
    match recv_frame(stream, deadline)? {
        Frame::XrcTarget(qpn) if qpn <= MAX_24BIT => Ok(qpn),
        Frame::XrcTarget(qpn) => Err(BootstrapError::Invalid(format!(
            "XRC target qpn {qpn:#x} does not fit in 24 bits"
        ))),
        Frame::Reject(reason) => Err(BootstrapError::Rejected(reason)),
        _ => Err(BootstrapError::Unexpected(
            "wrong frame while waiting for XrcTarget",
        )),
    }
}

/// The time left until `deadline`, or a timeout error naming `what` if none is.
fn time_left(deadline: Instant, what: &'static str) -> Result<Duration, BootstrapError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(BootstrapError::Timeout { what });
    }
    Ok(left)
}

/// Whether a socket error is a read/write/connect timeout (`EAGAIN` for socket timeouts on
/// Unix, `TimedOut` elsewhere).
fn is_timeout(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Wraps an OS error of operation `op`.
fn io_error(op: &'static str) -> impl Fn(io::Error) -> BootstrapError {
    move |source| BootstrapError::Io { op, source }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn path(port_num: u8) -> PathInfo {
        PathInfo {
            gid: [
                0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, port_num,
            ],
            udp_port: 4791,
            port_num,
        }
    }

    fn rc_info() -> EndpointInfo {
        EndpointInfo {
            transport: TransportKind::Rc,
            qpn: 0x12,
            psn: 0x00ab_cdef,
            mtu: 4096,
            primary: path(1),
            alternate: Some(path(2)),
            srq_nums: Vec::new(),
            credits: 64,
            mailbox_addr: 0x7f00_1234_5000,
            mailbox_rkey: 0x1234,
            max_message: 1 << 20,
            eager_limit: 8192,
            context_id: 0xdead_beef_cafe_f00d,
            node_id: 0x0123_4567_89ab_cdef,
            tag: 0xFFFF,
            xrc_target: Some(0x00AB_CDEF),
            xrc_target_path: None,
            xrc_target_alt: None,
            xrc_in_use: Some(7),
        }
    }

    fn xrc_info() -> EndpointInfo {
        EndpointInfo {
            transport: TransportKind::Xrc,
            alternate: None,
            srq_nums: vec![1, 2, MAX_24BIT],
            ..rc_info()
        }
    }

    fn all_frames() -> Vec<Frame> {
        vec![
            Frame::Hello(rc_info()),
            Frame::Accept(xrc_info()),
            Frame::Hello(EndpointInfo {
                srq_nums: (0..4096).collect(),
                ..xrc_info()
            }),
            Frame::Reject("version mismatch: ünïcödé reasons are fine".to_owned()),
            Frame::Reject(String::new()),
        ]
    }

    fn header(version: u16, payload_len: u32) -> Vec<u8> {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&version.to_be_bytes());
        bytes.extend_from_slice(&payload_len.to_be_bytes());
        bytes
    }

    /// A frame of our version around an arbitrary payload.
    fn frame_with_payload(payload: &[u8]) -> Vec<u8> {
        let mut bytes = header(PROTOCOL_VERSION, u32::try_from(payload.len()).unwrap());
        bytes.extend_from_slice(payload);
        bytes
    }

    #[test]
    fn every_variant_round_trips() {
        for frame in all_frames() {
            let bytes = encode(&frame);
            assert_eq!(try_encode(&frame).unwrap(), bytes);
            let (decoded, consumed) = decode(&bytes).unwrap().expect("a whole frame");
            assert_eq!(decoded, frame);
            assert_eq!(consumed, bytes.len());
        }
    }

    #[test]
    fn every_prefix_needs_more_bytes() {
        for frame in all_frames() {
            let bytes = encode(&frame);
            for end in 0..bytes.len() {
                assert!(
                    matches!(decode(&bytes[..end]), Ok(None)),
                    "prefix of {end}/{} bytes of {frame:?}: {:?}",
                    bytes.len(),
                    decode(&bytes[..end])
                );
            }
        }
    }

    #[test]
    fn golden_bytes_of_a_reject() {
        let mut expected = b"RDMX\x00\x04\x00\x00\x00\x0e".to_vec();
        expected.extend_from_slice(&[2, 0, 0, 0]); // variant index 2: Reject
        expected.extend_from_slice(&[2, 0, 0, 0, 0, 0, 0, 0]); // string length, u64 LE
        expected.extend_from_slice(b"no");
        assert_eq!(encode(&Frame::Reject("no".to_owned())), expected);
    }

    #[test]
    fn decode_consumes_one_frame_and_leaves_the_rest() {
        let first = encode(&Frame::Hello(rc_info()));
        let mut bytes = first.clone();
        bytes.extend_from_slice(&encode(&Frame::Reject("next".to_owned())));
        let (frame, consumed) = decode(&bytes).unwrap().unwrap();
        assert_eq!(frame, Frame::Hello(rc_info()));
        assert_eq!(consumed, first.len());
        let (next, _) = decode(&bytes[consumed..]).unwrap().unwrap();
        assert_eq!(next, Frame::Reject("next".to_owned()));
    }

    #[test]
    fn bad_magic_is_refused_after_four_bytes() {
        assert!(matches!(decode(b"GE"), Ok(None)));
        assert!(matches!(decode(b"GET "), Err(BootstrapError::BadMagic(m)) if m == *b"GET "));
        assert!(matches!(
            decode(b"GET / HTTP/1.1\r\n"),
            Err(BootstrapError::BadMagic(m)) if m == *b"GET "
        ));
        assert!(matches!(
            decode_header(b"rdmx\0\x01"),
            Err(BootstrapError::BadMagic(_))
        ));
    }

    #[test]
    fn another_version_is_refused_after_six_bytes() {
        let v5 = header(5, 5);
        assert!(matches!(
            decode(&v5[..6]),
            Err(BootstrapError::VersionMismatch { ours: 4, theirs: 5 })
        ));
        // The header of any version stays readable.
        assert_eq!(decode_header(&v5[..9]).unwrap(), None);
        assert_eq!(
            decode_header(&v5).unwrap(),
            Some(Header {
                version: 5,
                payload_len: 5
            })
        );
    }

    #[test]
    fn an_oversized_length_is_refused_before_the_payload() {
        let at_limit = header(PROTOCOL_VERSION, MAX_FRAME);
        assert!(matches!(decode(&at_limit), Ok(None)));
        let over = header(PROTOCOL_VERSION, MAX_FRAME + 1);
        assert!(matches!(decode(&over), Err(BootstrapError::TooLarge(n)) if n == MAX_FRAME + 1));
        let huge = header(PROTOCOL_VERSION, u32::MAX);
        assert!(matches!(
            decode(&huge),
            Err(BootstrapError::TooLarge(u32::MAX))
        ));
    }

    #[test]
    fn garbage_payloads_are_decode_errors() {
        // Unknown variant index.
        let bytes = frame_with_payload(&[9, 0, 0, 0]);
        assert!(matches!(decode(&bytes), Err(BootstrapError::Decode(_))));
        // Payload shorter than the frame it starts.
        let bytes = frame_with_payload(&[0, 0, 0, 0, 1]);
        assert!(matches!(decode(&bytes), Err(BootstrapError::Decode(_))));
        // Invalid UTF-8 in a reject reason.
        let bytes = frame_with_payload(&[2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0xff]);
        assert!(matches!(decode(&bytes), Err(BootstrapError::Decode(_))));
    }

    #[test]
    fn trailing_bytes_inside_the_payload_are_refused() {
        let bytes = encode(&Frame::Reject("x".to_owned()));
        let mut payload = bytes[HEADER_LEN..].to_vec();
        payload.push(0);
        let err = decode(&frame_with_payload(&payload)).unwrap_err();
        assert!(matches!(err, BootstrapError::Decode(_)), "{err:?}");
    }

    #[test]
    fn hostile_sequence_lengths_fail_without_allocating() {
        // A reject whose string claims 2^60 bytes.
        let mut payload = vec![2, 0, 0, 0];
        payload.extend_from_slice(&(1_u64 << 60).to_le_bytes());
        payload.extend_from_slice(b"abc");
        let err = decode(&frame_with_payload(&payload)).unwrap_err();
        assert!(matches!(err, BootstrapError::Decode(_)), "{err:?}");

        // A hello whose SRQ list claims 2^60 entries. With no alternate path the list length
        // sits at payload offset 4 (frame) + 4 (transport) + 12 (qpn, psn, mtu) + 19 (primary)
        // + 1 (None) = 40.
        let info = EndpointInfo {
            alternate: None,
            ..rc_info()
        };
        let mut payload = encode(&Frame::Hello(info))[HEADER_LEN..].to_vec();
        assert_eq!(payload[40..48], [0; 8], "layout changed: fix the offset");
        payload[40..48].copy_from_slice(&(1_u64 << 60).to_le_bytes());
        let err = decode(&frame_with_payload(&payload)).unwrap_err();
        assert!(matches!(err, BootstrapError::Decode(_)), "{err:?}");
    }

    #[test]
    fn oversized_frames_are_not_sent() {
        let frame = Frame::Reject("x".repeat(MAX_FRAME as usize));
        assert!(matches!(try_encode(&frame), Err(BootstrapError::TooLarge(n)) if n > MAX_FRAME));
        // `encode` still produces bytes, which the decoder refuses.
        assert!(matches!(
            decode(&encode(&frame)),
            Err(BootstrapError::TooLarge(_))
        ));
    }

    #[test]
    fn valid_information_passes() {
        validate(&rc_info()).unwrap();
        validate(&xrc_info()).unwrap();
        let edges = EndpointInfo {
            qpn: MAX_24BIT,
            psn: 0,
            mtu: 256,
            credits: MAX_CREDITS,
            srq_nums: vec![MAX_24BIT; MAX_SRQ_NUMS],
            ..xrc_info()
        };
        validate(&edges).unwrap();
        validate(&EndpointInfo {
            credits: 1,
            ..rc_info()
        })
        .unwrap();
    }

    #[test]
    fn each_rule_is_enforced() {
        let broken: [(&str, EndpointInfo); 10] = [
            (
                "qpn",
                EndpointInfo {
                    qpn: 1 << 24,
                    ..rc_info()
                },
            ),
            (
                "psn",
                EndpointInfo {
                    psn: u32::MAX,
                    ..rc_info()
                },
            ),
            (
                "mtu",
                EndpointInfo {
                    mtu: 1500,
                    ..rc_info()
                },
            ),
            (
                "mtu",
                EndpointInfo {
                    mtu: 0,
                    ..rc_info()
                },
            ),
            (
                "credits",
                EndpointInfo {
                    credits: MAX_CREDITS + 1,
                    ..rc_info()
                },
            ),
            (
                "SRQ numbers",
                EndpointInfo {
                    srq_nums: vec![1; MAX_SRQ_NUMS + 1],
                    ..xrc_info()
                },
            ),
            (
                "SRQ number",
                EndpointInfo {
                    srq_nums: vec![1, 1 << 24],
                    ..xrc_info()
                },
            ),
            (
                "primary path has UDP port 0",
                EndpointInfo {
                    primary: PathInfo {
                        udp_port: 0,
                        ..path(1)
                    },
                    ..rc_info()
                },
            ),
            (
                "primary path has port number 0",
                EndpointInfo {
                    primary: PathInfo {
                        port_num: 0,
                        ..path(1)
                    },
                    ..rc_info()
                },
            ),
            (
                "alternate path has UDP port 0",
                EndpointInfo {
                    alternate: Some(PathInfo {
                        udp_port: 0,
                        ..path(2)
                    }),
                    ..rc_info()
                },
            ),
        ];
        for (needle, info) in broken {
            match validate(&info) {
                Err(BootstrapError::Invalid(msg)) => {
                    assert!(msg.contains(needle), "{msg:?} should mention {needle:?}");
                }
                other => panic!("{info:?} should be invalid ({needle}), got {other:?}"),
            }
        }
    }

    #[test]
    fn error_messages_say_what_happened() {
        let msg = BootstrapError::VersionMismatch { ours: 1, theirs: 2 }.to_string();
        assert!(msg.contains("v1") && msg.contains("v2"), "{msg}");
        let msg = BootstrapError::BadMagic(*b"GET ").to_string();
        assert!(msg.contains("RDMX"), "{msg}");
        let msg = BootstrapError::TooLarge(u32::MAX).to_string();
        assert!(
            msg.contains(&u32::MAX.to_string()) && msg.contains("65536"),
            "{msg}"
        );
        // Reasons from the peer are quoted, so control characters cannot mess up a log line.
        let msg = BootstrapError::Rejected("a\nb\x1b[31m".to_owned()).to_string();
        assert!(!msg.contains('\n') && !msg.contains('\x1b'), "{msg}");
    }

    fn arb_path() -> impl Strategy<Value = PathInfo> {
        (any::<[u8; 16]>(), 1..=u16::MAX, 1..=u8::MAX).prop_map(|(gid, udp_port, port_num)| {
            PathInfo {
                gid,
                udp_port,
                port_num,
            }
        })
    }

    /// Endpoint information that passes [`validate`].
    fn arb_info() -> impl Strategy<Value = EndpointInfo> {
        (
            (
                prop_oneof![Just(TransportKind::Rc), Just(TransportKind::Xrc)],
                0..=MAX_24BIT,
                0..=MAX_24BIT,
                proptest::sample::select(VALID_MTUS.to_vec()),
                arb_path(),
                proptest::option::of(arb_path()),
                proptest::collection::vec(0..=MAX_24BIT, 0..64),
            ),
            (
                0..=MAX_CREDITS,
                any::<u64>(),
                any::<u32>(),
                any::<u64>(),
                any::<u32>(),
                any::<u64>(),
            ),
            (
                any::<u64>(),
                0..=0xFFFFu32,
                proptest::option::of(0..=MAX_24BIT),
                proptest::option::of(arb_path()),
                proptest::option::of(arb_path()),
                proptest::option::of(0..=MAX_24BIT),
            ),
        )
            .prop_map(
                |(
                    (transport, qpn, psn, mtu, primary, alternate, srq_nums),
                    (credits, mailbox_addr, mailbox_rkey, max_message, eager_limit, context_id),
                    (node_id, tag, xrc_target, xrc_target_path, xrc_target_alt, xrc_in_use),
                )| EndpointInfo {
                    transport,
                    qpn,
                    psn,
                    mtu,
                    primary,
                    alternate,
                    srq_nums,
                    credits,
                    mailbox_addr,
                    mailbox_rkey,
                    max_message,
                    eager_limit,
                    context_id,
                    node_id,
                    tag,
                    xrc_target,
                    xrc_target_path,
                    xrc_target_alt,
                    xrc_in_use,
                },
            )
    }

    fn arb_frame() -> impl Strategy<Value = Frame> {
        prop_oneof![
            arb_info().prop_map(Frame::Hello),
            arb_info().prop_map(Frame::Accept),
            ".{0,200}".prop_map(Frame::Reject),
            (0..=MAX_24BIT).prop_map(Frame::XrcTarget),
        ]
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&bytes);
            let _ = decode_header(&bytes);
        }

        #[test]
        fn arbitrary_payloads_never_panic(
            payload in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            // Behind a valid header, so that bincode sees every input.
            let bytes = frame_with_payload(&payload);
            if let Ok(Some((_, consumed))) = decode(&bytes) {
                prop_assert_eq!(consumed, bytes.len());
            }
        }

        #[test]
        fn mutated_frames_never_panic(
            frame in arb_frame(),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        ) {
            let mut bytes = encode(&frame);
            for (at, value) in flips {
                let at = at.index(bytes.len());
                bytes[at] = value;
            }
            let _ = decode(&bytes);
        }

        #[test]
        fn valid_frames_round_trip(frame in arb_frame()) {
            let bytes = try_encode(&frame).unwrap();
            let (decoded, consumed) = decode(&bytes).unwrap().unwrap();
            prop_assert_eq!(consumed, bytes.len());
            if let Frame::Hello(info) | Frame::Accept(info) = &decoded {
                prop_assert!(validate(info).is_ok());
            }
            prop_assert_eq!(decoded, frame);
        }
    }
}
