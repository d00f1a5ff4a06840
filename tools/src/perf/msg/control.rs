//! The control messages of a message-layer round, sent on the measured endpoint itself
//! (outside the timed loops).
//!
//! A control message is one `rdmx` message: the magic `RDXM`, a big-endian `u16` version,
//! then one bincode-encoded [`Ctl`]. Messages longer than [`MAX_CTL`] are refused before
//! anything is decoded, and decoding never panics on malformed input.

use std::time::Duration;

use bincode::Options;
use rdmx::Endpoint;
use serde::{Deserialize, Serialize};

use super::{RdmxResultExt, RoundParams};
use crate::error::{Error, Result, ResultExt};
use crate::perf::exchange::IO_TIMEOUT;

/// Magic of a control message.
pub(crate) const MAGIC: [u8; 4] = *b"RDXM";
/// Version of the control messages; bump on any change of [`Ctl`].
pub(crate) const VERSION: u16 = 1;
/// Largest control message accepted.
pub(crate) const MAX_CTL: usize = 8 * 1024;
/// Longest error text sent to the peer.
const MAX_ERROR_TEXT: usize = 2048;

/// A control message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Ctl {
    /// Client -> server: run this round.
    Setup(RoundParams),
    /// Server -> client: the round may start.
    Ready,
    /// Server -> client (bw, rate): this many data messages arrived (at the end of the
    /// warm-up and of the round).
    Ack {
        /// Data messages received so far in the round.
        received: u64,
    },
    /// Server -> client: end-of-round results.
    Report {
        /// Data messages received in the round.
        received: u64,
        /// Why the server's data check failed, if it did.
        check_error: Option<String>,
    },
    /// Either way: the sender failed and is closing.
    Error(String),
    /// Client -> server: no more rounds.
    Bye,
}

impl Ctl {
    /// A short name for messages.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Setup(_) => "Setup",
            Self::Ready => "Ready",
            Self::Ack { .. } => "Ack",
            Self::Report { .. } => "Report",
            Self::Error(_) => "Error",
            Self::Bye => "Bye",
        }
    }
}

fn codec() -> impl Options {
    bincode::DefaultOptions::new()
        .with_limit(MAX_CTL as u64)
        .reject_trailing_bytes()
}

/// Encodes a control message.
pub(crate) fn encode(ctl: &Ctl) -> Result<Vec<u8>> {
    let body = codec().serialize(ctl).ctx("encoding a control message")?;
    let mut out = Vec::with_capacity(MAGIC.len() + 2 + body.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_be_bytes());
    out.extend_from_slice(&body);
    if out.len() > MAX_CTL {
        return Err(Error::msg(format!(
            "control message of {} bytes exceeds the {MAX_CTL}-byte limit",
            out.len()
        )));
    }
    Ok(out)
}

/// Decodes a control message; `what` names the awaited message in errors.
pub(crate) fn decode(data: &[u8], what: &str) -> Result<Ctl> {
    if data.len() > MAX_CTL {
        return Err(Error::msg(format!(
            "expected {what}, got a {}-byte message (a data message?)",
            data.len()
        )));
    }
    let Some((magic, rest)) = data.split_first_chunk::<4>() else {
        return Err(Error::msg(format!(
            "expected {what}, got a {}-byte message that is not a control message",
            data.len()
        )));
    };
    if *magic != MAGIC {
        return Err(Error::msg(format!(
            "expected {what}, got a message that is not an rdmx perf control message (bad \
             magic {magic:02x?}, expected {MAGIC:02x?})"
        )));
    }
    let Some((ver, rest)) = rest.split_first_chunk::<2>() else {
        return Err(Error::msg("control message is truncated (no version)"));
    };
    let ver = u16::from_be_bytes(*ver);
    if ver != VERSION {
        return Err(Error::msg(format!(
            "peer speaks perf control version {ver}, this rdmx speaks {VERSION}; run the same \
             rdmx version on both sides"
        )));
    }
    codec()
        .deserialize(rest)
        .with_ctx(|| format!("malformed control message (expected {what})"))
}

/// The error text of `data` if it is an `Error` control message.
pub(crate) fn peer_error(data: &[u8]) -> Option<String> {
    match decode(data, "an error report") {
        Ok(Ctl::Error(e)) => Some(e),
        _ => None,
    }
}

/// Sends a control message (waiting up to the side channel's I/O timeout for a credit).
pub(crate) fn send(ep: &Endpoint, ctl: &Ctl) -> Result<()> {
    let frame = encode(ctl)?;
    ep.send_timeout(&frame, IO_TIMEOUT)
        .with_rctx(|| format!("sending {}", ctl.kind()))
}

/// Tells the peer why this side gives up, if a credit is available now (best effort).
pub(crate) fn send_error(ep: &Endpoint, e: &Error) {
    let mut text = e.to_string();
    if text.len() > MAX_ERROR_TEXT {
        let mut cut = MAX_ERROR_TEXT;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    if let Ok(frame) = encode(&Ctl::Error(text)) {
        let _ = ep.try_send(&frame);
    }
}

/// Waits up to `timeout` for a control message; a peer's `Error` becomes ours.
pub(crate) fn recv(ep: &Endpoint, what: &str, timeout: Duration) -> Result<Ctl> {
    let m = ep
        .recv_timeout(timeout)
        .with_rctx(|| format!("waiting for {what}"))?;
    match decode(&m, what)? {
        Ctl::Error(e) => Err(Error::msg(format!("the peer reported an error: {e}"))),
        c => Ok(c),
    }
}

/// Looks, for up to `wait`, for an error report among the messages the peer sent before it
/// went away: the reason behind a local failure such as a disconnect.
pub(crate) fn pending_peer_error(ep: &Endpoint, wait: Duration) -> Option<String> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return None;
        }
        let m = ep.recv_timeout(left).ok()?;
        if let Some(e) = peer_error(&m) {
            return Some(e);
        }
    }
}

/// An error for an unexpected control message.
pub(crate) fn unexpected(got: &Ctl, what: &str) -> Error {
    Error::msg(format!(
        "protocol error: expected {what}, got {}",
        got.kind()
    ))
}

#[cfg(test)]
mod tests {
    use super::super::MsgTest;
    use super::*;

    fn all() -> Vec<Ctl> {
        vec![
            Ctl::Setup(RoundParams {
                test: MsgTest::Rate,
                size: 8,
                iters: 100_000,
                warmup: 100,
            }),
            Ctl::Ready,
            Ctl::Ack { received: 5 },
            Ctl::Report {
                received: 9,
                check_error: Some("x".into()),
            },
            Ctl::Error("boom".into()),
            Ctl::Bye,
        ]
    }

    #[test]
    fn round_trip() {
        for c in all() {
            let frame = encode(&c).unwrap();
            assert_eq!(decode(&frame, "a message").unwrap(), c);
        }
    }

    #[test]
    fn truncations_and_garbage_are_errors_not_panics() {
        for c in all() {
            let frame = encode(&c).unwrap();
            for cut in 0..frame.len() {
                assert!(decode(&frame[..cut], "x").is_err(), "{c:?} cut at {cut}");
            }
            let mut longer = frame.clone();
            longer.push(0);
            assert!(decode(&longer, "x").is_err(), "trailing bytes accepted");
        }
        let mut x: u64 = 0x9abc_def0_1234_5678;
        for round in 0..2000 {
            let len = (round % 61) as usize;
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
            let _ = decode(&body, "garbage");
        }
        // An error text (variant 4) claiming a huge length (varint: 253, then a u64) must
        // not allocate it.
        let mut body = MAGIC.to_vec();
        body.extend_from_slice(&VERSION.to_be_bytes());
        body.extend_from_slice(&[4, 253, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]);
        assert!(decode(&body, "x").is_err());
    }

    #[test]
    fn bad_headers_are_clear_errors() {
        let e = decode(&[0u8; 65536], "Ready").unwrap_err().to_string();
        assert!(e.contains("data message"), "{e}");
        let e = decode(b"GET / HTTP/1.1", "Ready").unwrap_err().to_string();
        assert!(e.contains("magic"), "{e}");
        let mut frame = encode(&Ctl::Ready).unwrap();
        frame[5] = 99;
        let e = decode(&frame, "Ready").unwrap_err().to_string();
        assert!(e.contains("version"), "{e}");
        assert_eq!(
            peer_error(&encode(&Ctl::Error("why".into())).unwrap()),
            Some("why".into())
        );
        assert_eq!(peer_error(&encode(&Ctl::Ready).unwrap()), None);
    }
}
