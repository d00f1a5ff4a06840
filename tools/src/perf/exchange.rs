//! The TCP side channel of `rdmx perf`: how client and server exchange queue pair
//! information and synchronise.
//!
//! A frame is a big-endian `u32` length followed by that many bytes: the magic `RDMX`, a
//! big-endian `u16` protocol version, then one bincode-encoded [`Msg`]. Frames larger than
//! [`MAX_FRAME`] are refused before anything is allocated, and decoding never panics on
//! malformed input.
//!
//! One connection carries one or more test rounds:
//!
//! ```text
//! client                              server
//!   Setup{params, client endpoint} ->
//!                                   <- SetupReply{server endpoint}   (server QP in RTS)
//!   (client QP to RTS) Go          ->
//!   ... the test ...
//!   Finished{ops}                  ->
//!                                   <- Report{received, value, check}
//!   (next size: Setup ... | Bye)
//! ```
//!
//! (UD send_bw's flow control, the server's credits, goes over the UD queue pairs, not
//! here; the server's `Report` says how many datagrams really arrived.)
//!
//! Either side may send `Error` instead of the expected message and close.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bincode::Options;
use serde::{Deserialize, Serialize};

use super::{TestKind, Transport};
use crate::error::{Error, Result, ResultExt};

/// Frame magic.
pub(crate) const MAGIC: [u8; 4] = *b"RDMX";
/// Protocol version; bump on any change of [`Msg`].
pub(crate) const VERSION: u16 = 2;
/// Largest frame body accepted.
pub(crate) const MAX_FRAME: usize = 64 * 1024;
/// How long a read or write on the side channel may block.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// One side's queue pair and memory region, as the peer needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EndpointInfo {
    /// Queue pair number.
    pub(crate) qpn: u32,
    /// Initial send PSN.
    pub(crate) psn: u32,
    /// GID of port 1.
    pub(crate) gid: [u8; 16],
    /// UDP port of the soft device's port 1.
    pub(crate) udp_port: u16,
    /// Active MTU of port 1, in bytes.
    pub(crate) mtu: u32,
    /// Address of the memory region.
    pub(crate) mr_addr: u64,
    /// Its remote key.
    pub(crate) mr_rkey: u32,
    /// Its length.
    pub(crate) mr_len: u64,
}

/// What the client asks the server to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TestParams {
    /// The test.
    pub(crate) test: TestKind,
    /// RC or UD queue pairs.
    pub(crate) transport: Transport,
    /// Message size in bytes.
    pub(crate) size: u64,
    /// Measured iterations.
    pub(crate) iters: u64,
    /// Warm-up iterations (run before the measured ones).
    pub(crate) warmup: u64,
    /// Outstanding work requests (bandwidth tests).
    pub(crate) tx_depth: u32,
    /// Largest inline send / write.
    pub(crate) inline_size: u32,
    /// send_bw: receives the server keeps posted.
    pub(crate) rx_depth: u32,
    /// write_lat: each side spins on the last byte of its buffer (true) or waits for the
    /// receive completion of an RDMA WRITE with immediate (false).
    pub(crate) mem_poll: bool,
}

impl TestParams {
    /// Iterations in total, warm-up included.
    pub(crate) fn total(&self) -> u64 {
        self.iters + self.warmup
    }

    /// Checks values received from a peer (never trusted).
    pub(crate) fn validate(&self) -> Result<()> {
        if self.size == 0 || self.size > super::MAX_SIZE {
            return Err(Error::msg(format!(
                "message size {} is outside 1..={}",
                self.size,
                super::MAX_SIZE
            )));
        }
        if self.iters == 0 || self.iters > super::MAX_ITERS || self.warmup > super::MAX_ITERS {
            return Err(Error::msg(format!(
                "iteration count {} (+{} warm-up) is outside 1..={}",
                self.iters,
                self.warmup,
                super::MAX_ITERS
            )));
        }
        if self.tx_depth == 0 || self.tx_depth > super::MAX_TX_DEPTH {
            return Err(Error::msg(format!(
                "tx depth {} is outside 1..={}",
                self.tx_depth,
                super::MAX_TX_DEPTH
            )));
        }
        if self.rx_depth == 0 || self.rx_depth > super::MAX_RX_DEPTH {
            return Err(Error::msg(format!(
                "rx depth {} is outside 1..={}",
                self.rx_depth,
                super::MAX_RX_DEPTH
            )));
        }
        if self.test == TestKind::AtomicLat && self.size != 8 {
            return Err(Error::msg("atomic_lat works on 8-byte words"));
        }
        self.transport.check_test(self.test)
    }
}

/// What the server found at the end of a round.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ServerReport {
    /// Messages received (send tests) or the iterations it took part in (write_lat).
    pub(crate) received: u64,
    /// The final value of the atomic word (atomic_lat).
    pub(crate) value: u64,
    /// Why the server's data check failed, if it did.
    pub(crate) check_error: Option<String>,
}

/// A side-channel message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Msg {
    /// Client -> server: run this test against this endpoint.
    Setup {
        /// The test parameters.
        params: TestParams,
        /// The client's endpoint.
        ep: EndpointInfo,
    },
    /// Server -> client: the server's endpoint; its QP is ready to receive.
    SetupReply {
        /// The server's endpoint.
        ep: EndpointInfo,
    },
    /// Client -> server: the client's QP is ready, the test starts.
    Go,
    /// Client -> server: the client completed `ops` operations (warm-up included).
    Finished {
        /// Operations completed.
        ops: u64,
    },
    /// Server -> client: end-of-round results.
    Report(ServerReport),
    /// Either way: the sender failed and is closing.
    Error(String),
    /// Client -> server: no more rounds.
    Bye,
}

impl Msg {
    /// A short name for messages.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Setup { .. } => "Setup",
            Self::SetupReply { .. } => "SetupReply",
            Self::Go => "Go",
            Self::Finished { .. } => "Finished",
            Self::Report(_) => "Report",
            Self::Error(_) => "Error",
            Self::Bye => "Bye",
        }
    }
}

fn codec() -> impl Options {
    bincode::DefaultOptions::new()
        .with_limit(MAX_FRAME as u64)
        .reject_trailing_bytes()
}

/// Encodes `msg` as a complete frame (length prefix included).
pub(crate) fn encode(msg: &Msg) -> Result<Vec<u8>> {
    let body = codec()
        .serialize(msg)
        .ctx("encoding a side-channel message")?;
    let len = MAGIC.len() + 2 + body.len();
    if len > MAX_FRAME {
        return Err(Error::msg(format!(
            "message of {len} bytes exceeds the {MAX_FRAME}-byte frame limit"
        )));
    }
    let mut out = Vec::with_capacity(4 + len);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Decodes a frame body (everything after the length prefix).
pub(crate) fn decode_body(body: &[u8]) -> Result<Msg> {
    let Some((magic, rest)) = body.split_first_chunk::<4>() else {
        return Err(Error::msg(format!(
            "side-channel frame of {} bytes is too short",
            body.len()
        )));
    };
    if *magic != MAGIC {
        return Err(Error::msg(format!(
            "peer is not an rdmx perf endpoint (bad magic {magic:02x?}, expected {MAGIC:02x?})"
        )));
    }
    let Some((ver, rest)) = rest.split_first_chunk::<2>() else {
        return Err(Error::msg("side-channel frame is truncated (no version)"));
    };
    let ver = u16::from_be_bytes(*ver);
    if ver != VERSION {
        return Err(Error::msg(format!(
            "peer speaks side-channel protocol version {ver}, this rdmx speaks {VERSION}; \
             run the same rdmx version on both sides"
        )));
    }
    codec()
        .deserialize(rest)
        .ctx("malformed side-channel message")
}

/// Reads one frame. `what` names the awaited message in errors.
pub(crate) fn read_msg(r: &mut impl Read, what: &str) -> Result<Msg> {
    let mut len = [0u8; 4];
    read_exact(r, &mut len, what, true)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(Error::msg(format!(
            "side-channel frame of {len} bytes exceeds the {MAX_FRAME}-byte limit \
             (peer is not rdmx perf, or a different version)"
        )));
    }
    if len < MAGIC.len() + 2 {
        return Err(Error::msg(format!(
            "side-channel frame of {len} bytes is too short"
        )));
    }
    let mut body = vec![0u8; len];
    read_exact(r, &mut body, what, false)?;
    decode_body(&body)
}

fn read_exact(r: &mut impl Read, buf: &mut [u8], what: &str, at_start: bool) -> Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) if at_start && done == 0 => {
                return Err(Error::msg(format!(
                    "peer closed the connection while we waited for {what}"
                )));
            }
            Ok(0) => {
                return Err(Error::msg(format!(
                    "truncated side-channel frame: connection closed while reading {what}"
                )));
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Error::msg(format!(
                    "timed out after {} s waiting for {what} from the peer",
                    IO_TIMEOUT.as_secs()
                )));
            }
            Err(e) => return Err(Error::with_source(format!("reading {what}"), e)),
        }
    }
    Ok(())
}

/// Writes one frame.
pub(crate) fn write_msg(w: &mut impl Write, msg: &Msg) -> Result<()> {
    let frame = encode(msg)?;
    w.write_all(&frame)
        .and_then(|()| w.flush())
        .with_ctx(|| format!("sending {}", msg.kind()))
}

/// Reads a message and turns a peer's `Error` into ours.
pub(crate) fn expect_msg(r: &mut impl Read, what: &str) -> Result<Msg> {
    match read_msg(r, what)? {
        Msg::Error(e) => Err(Error::msg(format!("peer reported an error: {e}"))),
        m => Ok(m),
    }
}

/// An error for an unexpected message.
pub(crate) fn unexpected(got: &Msg, what: &str) -> Error {
    Error::msg(format!(
        "protocol error: expected {what}, got {}",
        got.kind()
    ))
}

/// Sets the timeouts and options of a side-channel stream.
pub(crate) fn configure(s: &TcpStream) -> Result<()> {
    s.set_nodelay(true).ctx("setting TCP_NODELAY")?;
    s.set_read_timeout(Some(IO_TIMEOUT))
        .ctx("setting the TCP read timeout")?;
    s.set_write_timeout(Some(IO_TIMEOUT))
        .ctx("setting the TCP write timeout")
}

/// True when the peer has sent something (or closed) that nobody is reading yet: a sign it
/// gave up. Never blocks.
pub(crate) fn peer_spoke(s: &TcpStream) -> bool {
    if s.set_nonblocking(true).is_err() {
        return false;
    }
    let mut b = [0u8; 1];
    let r = s.peek(&mut b);
    let _ = s.set_nonblocking(false);
    match r {
        Ok(_) => true,
        Err(e) => !matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn sample() -> Msg {
        Msg::Setup {
            params: TestParams {
                test: TestKind::WriteBw,
                transport: Transport::Rc,
                size: 65536,
                iters: 1000,
                warmup: 100,
                tx_depth: 128,
                inline_size: 64,
                rx_depth: 4096,
                mem_poll: false,
            },
            ep: EndpointInfo {
                qpn: 0x12_3456,
                psn: 0xAB_CDEF,
                gid: [7; 16],
                udp_port: 40000,
                mtu: 4096,
                mr_addr: 0x7f00_0000_1000,
                mr_rkey: 0xdead_beef,
                mr_len: 131_072,
            },
        }
    }

    #[test]
    fn round_trip() {
        for m in [
            sample(),
            Msg::Go,
            Msg::Bye,
            Msg::Finished { ops: 5 },
            Msg::Error("boom".into()),
            Msg::Report(ServerReport {
                received: 9,
                value: 3,
                check_error: Some("x".into()),
            }),
        ] {
            let frame = encode(&m).unwrap();
            let got = read_msg(&mut Cursor::new(frame), "a message").unwrap();
            assert_eq!(got, m);
        }
    }

    #[test]
    fn every_truncation_is_an_error() {
        let frame = encode(&sample()).unwrap();
        for cut in 0..frame.len() {
            let r = read_msg(&mut Cursor::new(&frame[..cut]), "Setup");
            assert!(r.is_err(), "truncated at {cut} decoded");
        }
        // A body cut short but with its length prefix adjusted is malformed bincode.
        for cut in 6..frame.len() - 4 {
            assert!(
                decode_body(&frame[4..4 + cut]).is_err(),
                "body cut at {cut} decoded"
            );
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        // Deterministic pseudo-random garbage, with and without a valid header.
        let mut x: u64 = 0x1234_5678_9abc_def0;
        for round in 0..2000 {
            let len = (round % 97) as usize;
            let mut body: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            if round % 2 == 0 && body.len() >= 6 {
                body[..4].copy_from_slice(&MAGIC);
                body[4..6].copy_from_slice(&VERSION.to_be_bytes());
            }
            let _ = decode_body(&body);
            let mut framed = (body.len() as u32).to_be_bytes().to_vec();
            framed.extend_from_slice(&body);
            let _ = read_msg(&mut Cursor::new(framed), "garbage");
        }
        // A header claiming a huge string must not allocate it.
        let mut body = MAGIC.to_vec();
        body.extend_from_slice(&VERSION.to_be_bytes());
        body.extend_from_slice(&[5, 253, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]);
        assert!(decode_body(&body).is_err());
    }

    #[test]
    fn bad_headers_are_clear_errors() {
        let e = read_msg(
            &mut Cursor::new(b"GET / HTTP/1.1\r\n\r\n".to_vec()),
            "Setup",
        );
        assert!(e.unwrap_err().to_string().contains("exceeds"));
        let mut frame = encode(&Msg::Go).unwrap();
        frame[4] = b'X';
        let e = read_msg(&mut Cursor::new(frame), "Go")
            .unwrap_err()
            .to_string();
        assert!(e.contains("magic"), "{e}");
        let mut frame = encode(&Msg::Go).unwrap();
        frame[9] = 99;
        let e = read_msg(&mut Cursor::new(frame), "Go")
            .unwrap_err()
            .to_string();
        assert!(e.contains("version"), "{e}");
        let e = read_msg(&mut Cursor::new(Vec::new()), "Go")
            .unwrap_err()
            .to_string();
        assert!(e.contains("closed"), "{e}");
        let mut frame = encode(&Msg::Go).unwrap();
        frame.push(0);
        frame[3] += 1;
        assert!(
            read_msg(&mut Cursor::new(frame), "Go").is_err(),
            "trailing bytes accepted"
        );
    }

    #[test]
    fn params_from_a_peer_are_checked() {
        let Msg::Setup { mut params, .. } = sample() else {
            unreachable!()
        };
        assert!(params.validate().is_ok());
        params.size = 0;
        assert!(params.validate().is_err());
        params.size = 8;
        params.tx_depth = 0;
        assert!(params.validate().is_err());
        params.tx_depth = 128;
        params.transport = Transport::Ud;
        assert!(params.validate().is_err(), "UD write_bw accepted");
        params.test = TestKind::SendBw;
        assert!(params.validate().is_ok());
    }
}
