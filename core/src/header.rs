//! The message header: 16 bytes in front of every message an endpoint sends with a SEND.
//!
//! ```text
//!  0      1      2             4                8                12               16
//!  +------+------+-------------+----------------+----------------+----------------+
//!  | kind | flags| tag         | credit grant   | rendezvous done| length         |
//!  +------+------+-------------+----------------+----------------+----------------+
//! ```
//!
//! All fields are big-endian. `tag` is the receiving endpoint's number in its context (told
//! at connect time): the receiver routes the message by it, which XRC needs (messages from
//! every endpoint of a remote node arrive through one target queue pair). `credit grant` and `rendezvous done` are cumulative counters
//! (mod 2^32) piggybacked on every message, the same values a transport may otherwise have the peer
//! write into the sender's memory (rdmx-rc's mailbox slots). A rendezvous request (`Rts`) carries
//! 16 more bytes: the address (u64) and remote key (u32) of the sender's registered buffer,
//! then 4 reserved bytes. `flags` is 0 but for [`Header::WAKE_ON_READ`] on a rendezvous
//! request; bits a receiver does not know are ignored.
//!
//! A packed frame (`Packed`, sent inside a send batch) carries several small messages of
//! one endpoint in one SEND: `length` payload bytes made of entries, each a 2-byte
//! big-endian length and that many bytes, at least one entry, nothing after the last
//! ([`PackedEntries`]). The receiver delivers them as separate messages, in order.
//!
//! Parsing never panics: every length and value is checked, and anything unexpected is a
//! [`HeaderError`].

/// Length of the fixed header.
pub const HEADER_LEN: usize = 16;
/// Length of a rendezvous request (header plus buffer descriptor).
pub const RTS_LEN: usize = HEADER_LEN + 16;
/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An eager message: the payload follows the header.
    Data = 1,
    /// A rendezvous request: read `len` bytes from the buffer described after the header.
    Rts = 2,
    /// The sender closes the endpoint; nothing follows it.
    Close = 3,
    /// Several small messages in one frame (see the module docs).
    Packed = 4,
}

/// Length of the length prefix of each entry of a packed frame.
pub const PACKED_ENTRY_LEN: usize = 2;

/// The entries of a packed frame's payload: the messages' byte ranges within the payload,
/// in order. Built by [`PackedEntries::parse`], which checks the whole payload first.
#[derive(Debug, Clone)]
pub struct PackedEntries<'a> {
    payload: &'a [u8],
    at: usize,
}

impl<'a> PackedEntries<'a> {
    /// Checks that `payload` is a sequence of at least one entry with nothing left over;
    /// returns the entries and their count, or `None` for a malformed payload.
    pub fn parse(payload: &'a [u8]) -> Option<(Self, usize)> {
        let mut at = 0;
        let mut count = 0;
        while at < payload.len() {
            at = Self::entry_at(payload, at)?.end;
            count += 1;
        }
        (count > 0).then_some((Self { payload, at: 0 }, count))
    }

    /// The bytes of the entry that starts at `at` in `payload` (the next one starts at the
    /// range's end), or `None` when no whole entry starts there.
    pub fn entry_at(payload: &[u8], at: usize) -> Option<std::ops::Range<usize>> {
        let l = payload.get(at..at.checked_add(PACKED_ENTRY_LEN)?)?;
        let start = at + PACKED_ENTRY_LEN;
        let end = start + usize::from(u16::from_be_bytes([l[0], l[1]]));
        (end <= payload.len()).then_some(start..end)
    }

    /// Appends an entry of `data` to a packed payload under construction in `out` at
    /// `at`; returns the new end, or `None` when it does not fit (or `data` is longer
    /// than an entry can be).
    pub fn append(out: &mut [u8], at: usize, data: &[u8]) -> Option<usize> {
        let len = u16::try_from(data.len()).ok()?;
        let end = at.checked_add(PACKED_ENTRY_LEN + data.len())?;
        let dst = out.get_mut(at..end)?;
        dst[..PACKED_ENTRY_LEN].copy_from_slice(&len.to_be_bytes());
        dst[PACKED_ENTRY_LEN..].copy_from_slice(data);
        Some(end)
    }
}

impl Iterator for PackedEntries<'_> {
    type Item = std::ops::Range<usize>;

    fn next(&mut self) -> Option<Self::Item> {
        let r = Self::entry_at(self.payload, self.at)?;
        self.at = r.end;
        Some(r)
    }
}

/// Why a header was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Fewer bytes than a header.
    #[error("message of {0} bytes is shorter than its header")]
    Short(usize),
    /// An unknown kind byte.
    #[error("unknown message kind {0}")]
    Kind(u8),
    /// The announced length does not match the bytes received.
    #[error("header announces {announced} payload bytes, {actual} arrived")]
    Length {
        /// Announced payload length.
        announced: u32,
        /// Bytes after the header.
        actual: usize,
    },
}

/// A parsed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The message kind.
    pub kind: Kind,
    /// The receiving endpoint's number in its context.
    pub tag: u16,
    /// Cumulative receive credits the sender grants the receiver.
    pub grant: u32,
    /// Cumulative count of the receiver's rendezvous buffers the sender has finished reading.
    pub rndv_done: u32,
    /// Payload length (`Data`) or rendezvous length (`Rts`).
    pub len: u32,
    /// Flag bits ([`Header::WAKE_ON_READ`]).
    pub flags: u8,
}

/// The buffer a rendezvous request points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtsInfo {
    /// Address of the sender's buffer.
    pub addr: u64,
    /// Its remote key.
    pub rkey: u32,
}

impl Header {
    /// On a rendezvous request: this request fills the sender's rendezvous window (it waits
    /// for a read to finish before its next one), so the receiver should report its reads
    /// done with a signal (rdmx-rc's `Signal::ReadDone`), which wakes the sender, rather than with a plain
    /// mailbox write, which does not. rdmx signals once half of the requests then
    /// outstanding are read, so that a sleeping sender wakes once per half window.
    pub const WAKE_ON_READ: u8 = 1;

    /// Writes the header into the first [`HEADER_LEN`] bytes of `out` (which must be at
    /// least that long; shorter buffers are left untouched and `false` is returned).
    pub fn write(&self, out: &mut [u8]) -> bool {
        let Some(h) = out.get_mut(..HEADER_LEN) else {
            return false;
        };
        h[0] = self.kind as u8;
        h[1] = self.flags;
        h[2..4].copy_from_slice(&self.tag.to_be_bytes());
        h[4..8].copy_from_slice(&self.grant.to_be_bytes());
        h[8..12].copy_from_slice(&self.rndv_done.to_be_bytes());
        h[12..16].copy_from_slice(&self.len.to_be_bytes());
        true
    }

    /// The header as bytes.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        self.write(&mut b);
        b
    }

    /// Parses the header of a received message of `msg.len()` bytes and checks the length
    /// against what arrived.
    ///
    /// # Errors
    /// A [`HeaderError`] for short messages, unknown kinds and length mismatches.
    pub fn parse(msg: &[u8]) -> Result<Self, HeaderError> {
        let h = msg.get(..HEADER_LEN).ok_or(HeaderError::Short(msg.len()))?;
        let u32_at = |o: usize| u32::from_be_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
        let kind = match h[0] {
            1 => Kind::Data,
            2 => Kind::Rts,
            3 => Kind::Close,
            4 => Kind::Packed,
            k => return Err(HeaderError::Kind(k)),
        };
        let hdr = Self {
            kind,
            tag: u16::from_be_bytes([h[2], h[3]]),
            grant: u32_at(4),
            rndv_done: u32_at(8),
            len: u32_at(12),
            flags: h[1],
        };
        let actual = msg.len() - HEADER_LEN;
        let ok = match kind {
            Kind::Data | Kind::Packed => actual as u64 == u64::from(hdr.len),
            Kind::Rts => actual == RTS_LEN - HEADER_LEN,
            Kind::Close => actual == 0,
        };
        if !ok {
            return Err(HeaderError::Length {
                announced: hdr.len,
                actual,
            });
        }
        Ok(hdr)
    }
}

impl RtsInfo {
    /// Writes the descriptor after the header (`out` must be at least [`RTS_LEN`] long).
    pub fn write(&self, out: &mut [u8]) -> bool {
        let Some(d) = out.get_mut(HEADER_LEN..RTS_LEN) else {
            return false;
        };
        d[..8].copy_from_slice(&self.addr.to_be_bytes());
        d[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        d[12..16].copy_from_slice(&[0; 4]);
        true
    }

    /// Reads the descriptor of a rendezvous request already accepted by [`Header::parse`].
    pub fn parse(msg: &[u8]) -> Option<Self> {
        let d = msg.get(HEADER_LEN..RTS_LEN)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(&d[..8]);
        Some(Self {
            addr: u64::from_be_bytes(a),
            rkey: u32::from_be_bytes([d[8], d[9], d[10], d[11]]),
        })
    }
}

/// True when cumulative counter `a` is ahead of `b` (mod 2^32, within half the space).
pub fn seq_after(a: u32, b: u32) -> bool {
    a != b && a.wrapping_sub(b) < 1 << 31
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip() {
        let h = Header {
            kind: Kind::Data,
            tag: 0xBEEF,
            grant: 7,
            rndv_done: u32::MAX,
            len: 3,
            flags: 0,
        };
        let mut msg = h.to_bytes().to_vec();
        msg.extend_from_slice(b"abc");
        assert_eq!(Header::parse(&msg), Ok(h));
        assert_eq!(
            Header::parse(&msg[..18]),
            Err(HeaderError::Length {
                announced: 3,
                actual: 2
            })
        );
        let mut rts = [0u8; RTS_LEN];
        let r = Header {
            kind: Kind::Rts,
            len: 1 << 20,
            flags: Header::WAKE_ON_READ,
            ..h
        };
        r.write(&mut rts);
        let info = RtsInfo {
            addr: 0xdead_beef_0000,
            rkey: 42,
        };
        info.write(&mut rts);
        assert_eq!(Header::parse(&rts), Ok(r));
        assert_eq!(RtsInfo::parse(&rts), Some(info));
        assert_eq!(Header::parse(&[1, 2]), Err(HeaderError::Short(2)));
        let mut bad = h.to_bytes();
        bad[0] = 9;
        assert_eq!(Header::parse(&bad), Err(HeaderError::Kind(9)));
    }

    #[test]
    fn malformed_packed_payloads_are_refused() {
        assert!(PackedEntries::parse(&[]).is_none(), "no entry");
        assert!(PackedEntries::parse(&[0]).is_none(), "half a length");
        assert!(
            PackedEntries::parse(&[0, 3, 1, 2]).is_none(),
            "an entry cut short"
        );
        assert!(
            PackedEntries::parse(&[0, 1, 7, 0]).is_none(),
            "bytes after the last entry"
        );
        let (mut e, n) = PackedEntries::parse(&[0, 0, 0, 1, 9]).unwrap();
        assert_eq!(n, 2, "an empty message is an entry");
        assert_eq!(
            (e.next(), e.next(), e.next()),
            (Some(2..2), Some(4..5), None)
        );
        let mut small = [0u8; 4];
        assert_eq!(PackedEntries::append(&mut small, 0, &[1, 2]), Some(4));
        assert_eq!(
            PackedEntries::append(&mut small, 2, &[1]),
            None,
            "does not fit"
        );
    }

    #[test]
    fn sequence_comparison_wraps() {
        assert!(seq_after(1, 0));
        assert!(seq_after(0, u32::MAX));
        assert!(!seq_after(5, 5));
        assert!(!seq_after(0, 1));
    }

    proptest! {
        #[test]
        fn header_round_trips(
            kind in prop_oneof![
                Just(Kind::Data),
                Just(Kind::Rts),
                Just(Kind::Close),
                Just(Kind::Packed)
            ],
            tag in any::<u16>(),
            grant in any::<u32>(),
            rndv_done in any::<u32>(),
            flags in any::<u8>(),
            data_len in 0u32..64,
        ) {
            let len = if kind == Kind::Close { 0 } else { data_len };
            let h = Header { kind, tag, grant, rndv_done, len, flags };
            let extra = match kind {
                Kind::Data | Kind::Packed => len as usize,
                Kind::Rts => RTS_LEN - HEADER_LEN,
                Kind::Close => 0,
            };
            let mut msg = vec![0u8; HEADER_LEN + extra];
            prop_assert!(h.write(&mut msg));
            prop_assert_eq!(Header::parse(&msg), Ok(h));
        }

        #[test]
        fn packed_entries_round_trip(
            msgs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..20),
        ) {
            let mut out = vec![0u8; 1024];
            let mut at = 0;
            for m in &msgs {
                at = PackedEntries::append(&mut out, at, m).unwrap();
            }
            let (entries, count) = PackedEntries::parse(&out[..at]).unwrap();
            prop_assert_eq!(count, msgs.len());
            let got: Vec<Vec<u8>> = entries.map(|r| out[r].to_vec()).collect();
            prop_assert_eq!(got, msgs);
        }

        #[test]
        fn packed_parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Some((entries, count)) = PackedEntries::parse(&bytes) {
                let ranges: Vec<_> = entries.collect();
                prop_assert_eq!(ranges.len(), count);
                prop_assert_eq!(ranges.last().map(|r| r.end), Some(bytes.len()));
            }
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(h) = Header::parse(&bytes) {
                prop_assert!(bytes.len() >= HEADER_LEN);
                if h.kind == Kind::Rts {
                    prop_assert!(RtsInfo::parse(&bytes).is_some());
                }
            }
        }
    }
}
