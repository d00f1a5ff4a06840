//! The datagrams of multicast groups: a fixed 32-byte header, then the payload.
//!
//! ```text
//!  0  version (0x81: not a session datagram)   1  kind   2  flags   3  0
//!  4  group        the group's id (from its name)
//!  8  source       the member that sent the datagram
//! 12  stream       the publisher the datagram is about (its member id)
//! 16  seq          Data: this datagram's number; Heartbeat: the next one to come;
//!                  Status: the next one the member expects; Nak: the first one missing;
//!                  Removed: the member removed
//! 20  aux          Data, Heartbeat: the oldest number the publisher can still send again;
//!                  Status: whole messages waiting for the member's application;
//!                  Nak: how many are missing
//! 24  epoch        the publisher's stream epoch (a restarted publisher is a new stream)
//! 28  len (u16)    payload bytes            30  0 (u16)
//! ```
//!
//! `Data` with `FIRST` starts with the message's length (u32), then its first bytes; `LAST`
//! ends the message. `Data` with `PACKED` carries several whole small messages, each as a
//! u16 length and its bytes. Data and heartbeats go to the group; a `Nak` goes to the group too (the
//! other members hear it and do not ask again); a `Status` goes to the publisher alone;
//! `Removed`, `Join` and `Leave` go to the group. All integers are big-endian.

use thiserror::Error;

use crate::seq::Seq;

/// Header length.
pub const HEADER_LEN: usize = 32;
/// Wire version (the high bit tells multicast datagrams from session ones).
pub const VERSION: u8 = 0x81;

/// What a multicast datagram is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A segment of one published message.
    Data,
    /// The publisher is alive; `seq` is the next number it will send.
    Heartbeat,
    /// A member's position and window, for its publisher's flow control.
    Status,
    /// A member misses `aux` datagrams from `seq` of a publisher.
    Nak,
    /// The publisher removed member `seq` (too slow, or silent).
    Removed,
    /// The sender leaves the group.
    Leave,
    /// The sender is a member (sent when it joins, then every heartbeat interval): the
    /// publishers wait for it from then on.
    Join,
}

impl Kind {
    fn to_u8(self) -> u8 {
        match self {
            Self::Data => 1,
            Self::Heartbeat => 2,
            Self::Status => 3,
            Self::Nak => 4,
            Self::Removed => 5,
            Self::Leave => 6,
            Self::Join => 7,
        }
    }

    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Data,
            2 => Self::Heartbeat,
            3 => Self::Status,
            4 => Self::Nak,
            5 => Self::Removed,
            6 => Self::Leave,
            7 => Self::Join,
            _ => return None,
        })
    }
}

/// Header flags.
pub mod flags {
    /// The segment opens a message (its payload starts with the message length).
    pub const FIRST: u8 = 1;
    /// The segment ends a message.
    pub const LAST: u8 = 2;
    /// A datagram sent again (a repair).
    pub const REPAIR: u8 = 4;
    /// Several whole small messages, each as a u16 length and its bytes.
    pub const PACKED: u8 = 8;
    /// Every flag this version knows.
    pub const ALL: u8 = FIRST | LAST | REPAIR | PACKED;
}

/// A multicast datagram's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What it is.
    pub kind: Kind,
    /// `flags::*`.
    pub flags: u8,
    /// The group's id.
    pub group: u32,
    /// The sending member.
    pub source: u32,
    /// The publisher it is about.
    pub stream: u32,
    /// See the module's table.
    pub seq: Seq,
    /// See the module's table.
    pub aux: u32,
    /// The publisher's stream epoch.
    pub epoch: u32,
    /// Payload bytes.
    pub len: u16,
}

/// Why a datagram was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ParseError {
    /// Shorter than a header, or than its length says.
    #[error("truncated multicast datagram")]
    Truncated,
    /// Another version (or a session datagram).
    #[error("multicast datagram of version {0:#x}")]
    Version(u8),
    /// An unknown kind.
    #[error("unknown multicast datagram kind {0}")]
    Kind(u8),
    /// Flags this version does not know, or that do not go with the kind.
    #[error("bad flags {0:#x}")]
    Flags(u8),
    /// Reserved bytes not zero, or a payload on a kind that has none.
    #[error("malformed multicast datagram")]
    Malformed,
}

impl Header {
    /// Writes the header into `out[..HEADER_LEN]`.
    ///
    /// # Panics
    /// When `out` is shorter than [`HEADER_LEN`] (a caller's mistake, never input).
    pub fn write(&self, out: &mut [u8]) {
        let h = &mut out[..HEADER_LEN];
        h[0] = VERSION;
        h[1] = self.kind.to_u8();
        h[2] = self.flags;
        h[3] = 0;
        h[4..8].copy_from_slice(&self.group.to_be_bytes());
        h[8..12].copy_from_slice(&self.source.to_be_bytes());
        h[12..16].copy_from_slice(&self.stream.to_be_bytes());
        h[16..20].copy_from_slice(&self.seq.0.to_be_bytes());
        h[20..24].copy_from_slice(&self.aux.to_be_bytes());
        h[24..28].copy_from_slice(&self.epoch.to_be_bytes());
        h[28..30].copy_from_slice(&self.len.to_be_bytes());
        h[30..32].copy_from_slice(&[0, 0]);
    }

    /// Parses a datagram into its header and payload.
    ///
    /// # Errors
    /// [`ParseError`] for anything that is not a well-formed multicast datagram.
    pub fn parse(d: &[u8]) -> Result<(Self, &[u8]), ParseError> {
        let h = d.get(..HEADER_LEN).ok_or(ParseError::Truncated)?;
        let u32_at = |i: usize| u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        if h[0] != VERSION {
            return Err(ParseError::Version(h[0]));
        }
        let kind = Kind::from_u8(h[1]).ok_or(ParseError::Kind(h[1]))?;
        let fl = h[2];
        if fl & !flags::ALL != 0 || (kind != Kind::Data && fl != 0) {
            return Err(ParseError::Flags(fl));
        }
        if h[3] != 0 || h[30] != 0 || h[31] != 0 {
            return Err(ParseError::Malformed);
        }
        let len = u16::from_be_bytes([h[28], h[29]]);
        let payload = d
            .get(HEADER_LEN..HEADER_LEN + usize::from(len))
            .ok_or(ParseError::Truncated)?;
        if kind != Kind::Data && len != 0 {
            return Err(ParseError::Malformed);
        }
        Ok((
            Self {
                kind,
                flags: fl,
                group: u32_at(4),
                source: u32_at(8),
                stream: u32_at(12),
                seq: Seq(u32_at(16)),
                aux: u32_at(20),
                epoch: u32_at(24),
                len,
            },
            payload,
        ))
    }

    /// Whether a flag is set.
    pub fn has(&self, f: u8) -> bool {
        self.flags & f != 0
    }
}

/// Whether `d` looks like a multicast datagram (by its version byte), for routing.
pub fn is_mcast(d: &[u8]) -> bool {
    d.first() == Some(&VERSION)
}

/// The group id of a group name (FNV-1a, 32 bits): what datagrams carry, and what the
/// multicast address is made from.
pub fn group_id(name: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> Header {
        Header {
            kind: Kind::Data,
            flags: flags::FIRST | flags::LAST,
            group: 7,
            source: 11,
            stream: 11,
            seq: Seq(0xffff_fffe),
            aux: 3,
            epoch: 99,
            len: 5,
        }
    }

    #[test]
    fn a_header_round_trips() {
        let mut b = vec![0u8; HEADER_LEN + 5];
        data().write(&mut b);
        b[HEADER_LEN..].copy_from_slice(b"hello");
        let (h, p) = Header::parse(&b).unwrap();
        assert_eq!(h, data());
        assert_eq!(p, b"hello");
        assert!(is_mcast(&b));
    }

    #[test]
    fn malformed_datagrams_are_errors_not_panics() {
        let mut b = vec![0u8; HEADER_LEN + 5];
        data().write(&mut b);
        for n in 0..b.len() {
            assert!(Header::parse(&b[..n]).is_err(), "{n} bytes");
        }
        let bad = |i: usize, v: u8| {
            let mut c = b.clone();
            c[i] = v;
            Header::parse(&c).err()
        };
        assert_eq!(bad(0, 2), Some(ParseError::Version(2)));
        assert_eq!(bad(1, 9), Some(ParseError::Kind(9)));
        assert_eq!(bad(2, 0x80), Some(ParseError::Flags(0x80)));
        assert_eq!(bad(3, 1), Some(ParseError::Malformed));
        assert_eq!(bad(31, 1), Some(ParseError::Malformed));
        // A status with a payload, a heartbeat with flags.
        let mut s = b.clone();
        s[1] = 3;
        s[2] = 0;
        assert_eq!(Header::parse(&s).err(), Some(ParseError::Malformed));
        let mut hb = b;
        hb[1] = 2;
        assert_eq!(Header::parse(&hb).err(), Some(ParseError::Flags(3)));
    }

    #[test]
    fn group_ids_differ_by_name() {
        assert_ne!(group_id("prices"), group_id("orders"));
        assert_eq!(group_id("prices"), group_id("prices"));
    }
}
