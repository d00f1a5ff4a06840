//! The TCP exchange: listening, accepting and connecting, sending and receiving frames
//! under deadlines, and the `Hello` / `Accept` / `Reject` / `XrcTarget` steps of the
//! handshake built on them.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use super::codec::{
    check_length, check_magic, check_version, decode_header, decode_payload, try_encode,
};
use super::wire::{BootstrapError, EndpointInfo, Frame, validate};
use super::{HEADER_LEN, LISTEN_BACKLOG, MAX_24BIT, MAX_REJECT_REASON, field};

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
///
/// [`MAX_FRAME`]: super::MAX_FRAME
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
///
/// [`MAX_FRAME`]: super::MAX_FRAME
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
///
/// [`PROTOCOL_VERSION`]: super::PROTOCOL_VERSION
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
///
/// [`MAGIC`]: super::MAGIC
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
        Ok(Frame::Ready) => Err(BootstrapError::Unexpected("Ready while waiting for Hello")),
        Ok(Frame::AuthHello(_) | Frame::AuthProof(_)) => Err(BootstrapError::AuthFailed(
            "the peer offers authentication; this listener has no key (RDMX_AUTH_KEY)".into(),
        )),
        Ok(Frame::AuthChallenge { .. }) => Err(BootstrapError::Unexpected(
            "AuthChallenge while waiting for Hello",
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
        BootstrapError::AuthFailed(why) => Some(why.clone()),
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
        Frame::Ready => Err(BootstrapError::Unexpected("Ready while waiting for Accept")),
        Frame::AuthHello(_) | Frame::AuthChallenge { .. } | Frame::AuthProof(_) => Err(
            BootstrapError::Unexpected("an authentication frame while waiting for Accept"),
        ),
    }
}

/// Listener side of an RC exchange, after its `Accept`: waits for the connector's `Ready`
/// (its mailbox slot may be written from now on).
///
/// # Errors
///
/// Those of [`recv_frame`]; [`BootstrapError::Rejected`] when the connector gave up;
/// [`BootstrapError::Unexpected`] for any other frame.
pub fn expect_ready(stream: &mut TcpStream, deadline: Instant) -> Result<(), BootstrapError> {
    match recv_frame(stream, deadline)? {
        Frame::Ready => Ok(()),
        Frame::Reject(reason) => Err(BootstrapError::Rejected(reason)),
        _ => Err(BootstrapError::Unexpected(
            "wrong frame while waiting for Ready",
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
    move |error| BootstrapError::Io { op, error }
}
