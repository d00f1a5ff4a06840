//! The datagram format of UD sessions: a fixed 32-byte header, then the payload.
//!
//! ```text
//!  0  version (1)     1  kind            2  flags           3  0
//!  4  destination session id (the receiver's)
//!  8  destination token (the receiver's, from the set-up: stale or forged datagrams fail it)
//! 12  seq       packet sequence number of this datagram (data kinds); next to send (Ack)
//! 16  ack       every packet of the other direction before it has arrived
//! 20  sack      bit i: packet ack + 1 + i has arrived too
//! 24  credit    the receiver of this header may send packets before it
//! 28  len (u16) payload bytes      30  0 (u16)
//! ```
//!
//! Payloads: `Data` with `FIRST` starts with the message's length (u32), then its first
//! bytes; later segments carry bytes only; `LAST` ends the message. `Packed` carries whole
//! small messages, each as a u16 length and its bytes. `Fin` (no payload) is the sender's
//! orderly close, in sequence after its last message. `Ack` carries only the header.
//! All integers are big-endian.

use thiserror::Error;

use crate::seq::Seq;

/// Header length.
pub const HEADER_LEN: usize = 32;
/// Wire version.
pub const VERSION: u8 = 2;
/// Bytes of the message length that opens a `FIRST` segment.
pub const MSG_LEN_PREFIX: usize = 4;
/// Bytes of the length before each message in a `Packed` payload.
pub const PACKED_ENTRY_LEN: usize = 2;

/// What a datagram is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A segment of one message.
    Data,
    /// Several whole small messages.
    Packed,
    /// The sender closes (in sequence: after everything it sent).
    Fin,
    /// Acknowledgement and credit only (no sequence number of its own).
    Ack,
}

impl Kind {
    fn to_u8(self) -> u8 {
        match self {
            Self::Data => 1,
            Self::Packed => 2,
            Self::Fin => 3,
            Self::Ack => 4,
        }
    }

    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Data,
            2 => Self::Packed,
            3 => Self::Fin,
            4 => Self::Ack,
            _ => return None,
        })
    }

    /// Whether the datagram takes a sequence number (and a credit).
    pub fn is_sequenced(self) -> bool {
        !matches!(self, Self::Ack)
    }
}

/// Whether `datagram` (as written by a session) is an acknowledgement alone: a header of
/// kind `Ack` and no payload (what goes to a peer's control queue pair).
pub fn is_ack(datagram: &[u8]) -> bool {
    datagram.len() == HEADER_LEN && datagram.get(1) == Some(&Kind::Ack.to_u8())
}

/// Header flags.
pub mod flags {
    /// The segment opens a message (its payload starts with the message length).
    pub const FIRST: u8 = 1;
    /// The segment ends a message.
    pub const LAST: u8 = 2;
    /// Answer with an acknowledgement at once (a retransmission, a probe).
    pub const ACK_NOW: u8 = 4;
    /// The sender has messages waiting and no credit: please grant some.
    pub const WANT: u8 = 8;
    /// The receiver asks an idle sender to give its unused credit back.
    pub const RECALL: u8 = 16;
    /// On an acknowledgement sent with nothing in flight: the sender will send nothing
    /// below this header's `seq` any more, so the receiver may count every number before it
    /// as received (the numbers an idle sender skipped to give recalled credit back).
    pub const RETURN: u8 = 32;
    /// Every flag this version knows.
    pub const ALL: u8 = FIRST | LAST | ACK_NOW | WANT | RECALL | RETURN;
}

/// A datagram header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the datagram is.
    pub kind: Kind,
    /// [`flags`].
    pub flags: u8,
    /// The receiver's session id.
    pub dst_session: u32,
    /// The receiver's session token.
    pub dst_token: u32,
    /// This datagram's sequence number (sequenced kinds).
    pub seq: Seq,
    /// Cumulative acknowledgement of the other direction.
    pub ack: Seq,
    /// Selective acknowledgement of the 32 packets after `ack`.
    pub sack: u32,
    /// The peer may send packets before this.
    pub credit: Seq,
    /// Payload bytes.
    pub len: u16,
}

/// Why a datagram was not accepted as one of ours (each is counted, never fatal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// Shorter than a header.
    #[error("datagram shorter than a header")]
    Truncated,
    /// Another wire version.
    #[error("unknown wire version {0}")]
    Version(u8),
    /// An unknown kind.
    #[error("unknown datagram kind {0}")]
    Kind(u8),
    /// Flags this version does not know, or reserved bytes that are not zero.
    #[error("unknown flags or non-zero reserved bytes")]
    Reserved,
    /// The header's length does not match the datagram's.
    #[error("payload length {said} in the header, {got} in the datagram")]
    Length {
        /// What the header says.
        said: usize,
        /// What came.
        got: usize,
    },
}

impl Header {
    /// Writes the header into `out[..HEADER_LEN]`; `false` (nothing written) when `out` is
    /// shorter than a header.
    pub fn write(&self, out: &mut [u8]) -> bool {
        let Some(h) = out.get_mut(..HEADER_LEN) else {
            return false;
        };
        h[0] = VERSION;
        h[1] = self.kind.to_u8();
        h[2] = self.flags;
        h[3] = 0;
        h[4..8].copy_from_slice(&self.dst_session.to_be_bytes());
        h[8..12].copy_from_slice(&self.dst_token.to_be_bytes());
        h[12..16].copy_from_slice(&self.seq.0.to_be_bytes());
        h[16..20].copy_from_slice(&self.ack.0.to_be_bytes());
        h[20..24].copy_from_slice(&self.sack.to_be_bytes());
        h[24..28].copy_from_slice(&self.credit.0.to_be_bytes());
        h[28..30].copy_from_slice(&self.len.to_be_bytes());
        h[30..32].copy_from_slice(&[0, 0]);
        true
    }

    /// Reads a datagram: its header and payload.
    ///
    /// # Errors
    /// [`DecodeError`] for anything that is not a well-formed datagram of this version.
    pub fn parse(d: &[u8]) -> Result<(Self, &[u8]), DecodeError> {
        let (h, payload) = d
            .split_at_checked(HEADER_LEN)
            .ok_or(DecodeError::Truncated)?;
        let word = |i: usize| u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        if h[0] != VERSION {
            return Err(DecodeError::Version(h[0]));
        }
        let kind = Kind::from_u8(h[1]).ok_or(DecodeError::Kind(h[1]))?;
        if h[2] & !flags::ALL != 0 || h[3] != 0 || h[30] != 0 || h[31] != 0 {
            return Err(DecodeError::Reserved);
        }
        let len = u16::from_be_bytes([h[28], h[29]]);
        if usize::from(len) != payload.len() {
            return Err(DecodeError::Length {
                said: usize::from(len),
                got: payload.len(),
            });
        }
        Ok((
            Self {
                kind,
                flags: h[2],
                dst_session: word(4),
                dst_token: word(8),
                seq: Seq(word(12)),
                ack: Seq(word(16)),
                sack: word(20),
                credit: Seq(word(24)),
                len,
            },
            payload,
        ))
    }

    /// Whether flag `f` is set.
    pub fn has(&self, f: u8) -> bool {
        self.flags & f != 0
    }
}

/// The messages of a `Packed` payload, or `None` when it is malformed (an entry that runs
/// past the end, or an empty payload).
pub fn packed_entries(payload: &[u8]) -> Option<Vec<&[u8]>> {
    let mut out = Vec::new();
    let mut rest = payload;
    while !rest.is_empty() {
        let (len, tail) = rest.split_at_checked(PACKED_ENTRY_LEN)?;
        let n = usize::from(u16::from_be_bytes([len[0], len[1]]));
        let (msg, tail) = tail.split_at_checked(n)?;
        out.push(msg);
        rest = tail;
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            kind: Kind::Data,
            flags: flags::FIRST | flags::LAST,
            dst_session: 7,
            dst_token: 0xdead_beef,
            seq: Seq(u32::MAX),
            ack: Seq(3),
            sack: 0b101,
            credit: Seq(40),
            len: 5,
        }
    }

    #[test]
    fn a_header_round_trips() {
        let mut d = vec![0u8; HEADER_LEN + 5];
        assert!(header().write(&mut d));
        d[HEADER_LEN..].copy_from_slice(b"hello");
        let (h, p) = Header::parse(&d).unwrap();
        assert_eq!(h, header());
        assert_eq!(p, b"hello");
    }

    #[test]
    fn malformed_datagrams_are_errors_not_panics() {
        let mut d = vec![0u8; HEADER_LEN + 5];
        header().write(&mut d);
        assert_eq!(Header::parse(&d[..10]), Err(DecodeError::Truncated));
        assert_eq!(
            Header::parse(&d[..HEADER_LEN + 4]),
            Err(DecodeError::Length { said: 5, got: 4 })
        );
        let mut bad = d.clone();
        bad[0] = 9;
        assert_eq!(Header::parse(&bad), Err(DecodeError::Version(9)));
        let mut bad = d.clone();
        bad[1] = 0;
        assert_eq!(Header::parse(&bad), Err(DecodeError::Kind(0)));
        let mut bad = d.clone();
        bad[2] = 0x80;
        assert_eq!(Header::parse(&bad), Err(DecodeError::Reserved));
        let mut bad = d;
        bad[31] = 1;
        assert_eq!(Header::parse(&bad), Err(DecodeError::Reserved));
        // Every prefix and every single-byte corruption parses or fails cleanly.
        let mut d = vec![0u8; HEADER_LEN + 5];
        header().write(&mut d);
        for n in 0..d.len() {
            let _ = Header::parse(&d[..n]);
        }
        for i in 0..d.len() {
            for v in [0u8, 1, 0x7f, 0xff] {
                let mut c = d.clone();
                c[i] = v;
                let _ = Header::parse(&c);
            }
        }
    }

    #[test]
    fn packed_payloads_parse_or_are_refused() {
        let p = [0, 2, b'h', b'i', 0, 0, 0, 1, b'!'];
        let e = packed_entries(&p).unwrap();
        assert_eq!(e, vec![&b"hi"[..], &b""[..], &b"!"[..]]);
        assert_eq!(packed_entries(&[]), None);
        assert_eq!(packed_entries(&[0]), None);
        assert_eq!(packed_entries(&[0, 3, 1, 2]), None);
    }
}
