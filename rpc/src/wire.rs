//! The frames of rdmx-rpc: a fixed 24-byte header, then the body. Every frame is one
//! message of the endpoint underneath (which keeps them whole, in order, flow-controlled).
//!
//! ```text
//!  0  version (0x52)    1  kind (1 request, 2 response, 3 cancel)
//!  2  status            (responses: 0 ok, else a gRPC code; the body is then its message)
//!  3  flags           (bit 0: a payload follows as the next message; requests and
//!                       responses only)
//!  4  method            (u32: the FNV-1a hash of the method's name)
//!  8  call id           (u64: the caller's number for the call)
//! 16  budget           (u32: requests: microseconds the caller still waits, 0 none)
//! 20  body length      (u32)
//! ```
//!
//! Deadlines travel as the time left, not as a point in time: the hosts' clocks need not
//! agree. All integers are little-endian.

use thiserror::Error;

use crate::status::Code;

/// Header length.
pub const HEADER_LEN: usize = 24;
/// Wire version.
pub const VERSION: u8 = 0x52;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A call.
    Request,
    /// A call's outcome.
    Response,
    /// The caller no longer waits for call `id`.
    Cancel,
}

/// A frame's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What it is.
    pub kind: Kind,
    /// Responses: `None` for success, else the failure's code.
    pub status: Option<Code>,
    /// The method's id.
    pub method: u32,
    /// The call's id (the caller's).
    pub id: u64,
    /// Requests: microseconds the caller still waits (0: no deadline).
    pub budget_us: u32,
    /// Body bytes.
    pub len: u32,
    /// A payload follows as the link's next message (see [`crate::payload`]).
    pub attached: bool,
}

/// Flag bit: a payload follows.
const ATTACHED: u8 = 1;

/// Why a frame was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Shorter than a header, or than its length says.
    #[error("a truncated RPC frame ({0} bytes)")]
    Truncated(usize),
    /// Another version.
    #[error("an RPC frame of version {0:#x}")]
    Version(u8),
    /// An unknown kind.
    #[error("an RPC frame of unknown kind {0}")]
    Kind(u8),
    /// A status number we do not know.
    #[error("an RPC response with unknown status {0}")]
    Status(u8),
    /// Flags this version does not know, or a payload on a cancel.
    #[error("an RPC frame with flags {0:#04x}")]
    Flags(u8),
    /// Longer than its length says.
    #[error("an RPC frame with {extra} bytes after its body")]
    Trailing {
        /// The bytes beyond.
        extra: usize,
    },
}

impl Header {
    /// Writes the header into `out` (at least [`HEADER_LEN`] bytes).
    pub fn write(&self, out: &mut [u8]) {
        out[0] = VERSION;
        out[1] = match self.kind {
            Kind::Request => 1,
            Kind::Response => 2,
            Kind::Cancel => 3,
        };
        out[2] = self.status.map_or(0, Code::to_u8);
        out[3] = if self.attached { ATTACHED } else { 0 };
        out[4..8].copy_from_slice(&self.method.to_le_bytes());
        out[8..16].copy_from_slice(&self.id.to_le_bytes());
        out[16..20].copy_from_slice(&self.budget_us.to_le_bytes());
        out[20..24].copy_from_slice(&self.len.to_le_bytes());
    }

    /// The header and the body of frame `data`.
    ///
    /// # Errors
    /// A [`FrameError`] for anything that is not a whole frame of this version.
    pub fn parse(data: &[u8]) -> Result<(Self, &[u8]), FrameError> {
        let h: &[u8; HEADER_LEN] = data
            .first_chunk()
            .ok_or(FrameError::Truncated(data.len()))?;
        if h[0] != VERSION {
            return Err(FrameError::Version(h[0]));
        }
        let kind = match h[1] {
            1 => Kind::Request,
            2 => Kind::Response,
            3 => Kind::Cancel,
            k => return Err(FrameError::Kind(k)),
        };
        let status = match h[2] {
            0 => None,
            s => Some(Code::from_u8(s).ok_or(FrameError::Status(s))?),
        };
        let attached = match h[3] {
            0 => false,
            ATTACHED if kind != Kind::Cancel => true,
            f => return Err(FrameError::Flags(f)),
        };
        let word = |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
        let mut id = [0u8; 8];
        id.copy_from_slice(&h[8..16]);
        let header = Self {
            kind,
            status,
            method: word(4),
            id: u64::from_le_bytes(id),
            budget_us: word(16),
            len: word(20),
            attached,
        };
        let body = &data[HEADER_LEN..];
        let len = header.len as usize;
        if body.len() < len {
            return Err(FrameError::Truncated(data.len()));
        }
        if body.len() > len {
            return Err(FrameError::Trailing {
                extra: body.len() - len,
            });
        }
        Ok((header, body))
    }
}

/// A frame: `header` (its `len` set from `body`) and `body`, in one buffer.
pub fn frame(mut header: Header, body: &[u8]) -> Vec<u8> {
    header.len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    let mut v = vec![0u8; HEADER_LEN + body.len()];
    header.write(&mut v);
    v[HEADER_LEN..].copy_from_slice(body);
    v
}

/// Writes `header` (its `len` set from what follows) over the first [`HEADER_LEN`] bytes of
/// `framed`, a frame built with room for it (at least that long).
pub fn seal(mut header: Header, framed: &mut [u8]) {
    let body = framed.len().saturating_sub(HEADER_LEN);
    header.len = u32::try_from(body).unwrap_or(u32::MAX);
    if let Some(h) = framed.get_mut(..HEADER_LEN) {
        header.write(h);
    }
}

/// The id of a method named `name` (FNV-1a, 32 bits).
pub const fn method_id(name: &str) -> u32 {
    let b = name.as_bytes();
    let mut h: u32 = 0x811c_9dc5;
    let mut i = 0;
    while i < b.len() {
        h ^= b[i] as u32;
        h = h.wrapping_mul(0x0100_0193);
        i += 1;
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let h = Header {
            kind: Kind::Response,
            status: Some(Code::NotFound),
            method: method_id("kv.get"),
            id: u64::MAX - 3,
            budget_us: 1234,
            len: 0,
            attached: true,
        };
        let f = frame(h, b"no such key");
        let (g, body) = Header::parse(&f).unwrap();
        assert_eq!(g, Header { len: 11, ..h });
        assert_eq!(body, b"no such key");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let good = frame(
            Header {
                kind: Kind::Request,
                status: None,
                method: 7,
                id: 1,
                budget_us: 0,
                len: 0,
                attached: false,
            },
            b"abc",
        );
        for n in 0..good.len() {
            assert!(Header::parse(&good[..n]).is_err(), "{n} bytes taken");
        }
        let mut long = good.clone();
        long.push(0);
        assert!(matches!(
            Header::parse(&long),
            Err(FrameError::Trailing { extra: 1 })
        ));
        for (at, v) in [(0, 0x51u8), (1, 9), (2, 99), (3, 2)] {
            let mut bad = good.clone();
            bad[at] = v;
            assert!(Header::parse(&bad).is_err(), "byte {at} = {v} taken");
        }
        let mut rng = 0x1234_5678_9abc_def0u64;
        for _ in 0..10_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let n = (rng % 64) as usize;
            let bytes: Vec<u8> = (0..n).map(|i| (rng >> (i % 8 * 8)) as u8).collect();
            let _ = Header::parse(&bytes);
        }
    }

    #[test]
    fn method_ids_are_fnv1a() {
        assert_eq!(method_id(""), 0x811c_9dc5);
        assert_ne!(method_id("kv.get"), method_id("kv.put"));
    }
}
