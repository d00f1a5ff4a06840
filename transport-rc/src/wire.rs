//! The RC transport's own wire items, beside the frame header every transport shares
//! (`rdmx_core::header`): the mailbox slot a peer writes with RDMA WRITE (credit grants and
//! rendezvous reads done, then credit recall), and the signals (RDMA WRITE with immediate)
//! that make it look at once.
//!
//! ```text
//!  mailbox slot (MAILBOX_LEN = 16 bytes, two words, each written and read whole)
//!  0                                8                                16
//!  +--------------------------------+--------------------------------+
//!  | Mailbox: grant | rndv_done     | Recall: returned | counter+flags|
//!  +--------------------------------+--------------------------------+
//! ```

/// Length of a mailbox slot: two aligned 64-bit words. The first is a [`Mailbox`] (credit
/// grant low, rendezvous done high), the second a [`Recall`] (credits returned low, recall
/// requests high). Each word is written and read as a whole.
pub const MAILBOX_LEN: usize = 16;
/// Offset of the [`Recall`] word in a slot.
pub const RECALL_OFF: usize = 8;

/// The contents of a mailbox slot: the two cumulative counters a peer writes with an RDMA
/// WRITE when it has no message to piggyback them on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Mailbox {
    /// Cumulative credits granted.
    pub grant: u32,
    /// Cumulative rendezvous reads finished.
    pub rndv_done: u32,
}

impl Mailbox {
    /// The slot as one 64-bit word (written and read atomically).
    pub fn to_word(self) -> u64 {
        u64::from(self.grant) | (u64::from(self.rndv_done) << 32)
    }

    /// The slot from its word.
    pub fn from_word(w: u64) -> Self {
        Self {
            grant: w as u32,
            rndv_done: (w >> 32) as u32,
        }
    }
}

/// The second word of a mailbox slot: credit recall. A receiver short of buffers asks an idle
/// sender to give back credits it is not using (`recall`, a request counter); the sender
/// answers by counting them as used (`returned`, cumulative). Both are written by the slot's
/// peer into the slot of the other side.
///
/// Layout: `returned` in bits 0..32, the request counter in bits 32..61 (29 bits, compared
/// only for a change), `closing` in bit 61, `starving` in bit 62 and `all` in bit 63. A
/// request normally leaves
/// the sender one credit, so that its next message goes out at once; with `all`, it gives
/// back every credit. That is needed when endpoints outnumber the receive buffers: each idle
/// endpoint then holds a single credit, and keeping one would free nothing. `starving` is
/// the writer's own state: it has a message to send and no credit; the reader then takes
/// credits from idle endpoints for it (and only then: with more endpoints than buffers, some
/// always lack credits without wanting any). `closing` is the writer's state too: it closes,
/// everything it sent before has been read, and it has no credit left for its Close; the
/// reader grants it one more, once, even if undelivered messages fill its window (the only
/// message that credit can carry is the Close). A peer that predates the flags reads them
/// as part of the counter (bootstrap protocol version 6 has `closing`).
///
/// One value of the counter never occurs ([`next_request`](Self::next_request) skips it):
/// a word with it ([`Recall::GONE`]) says that the writer's endpoint went down without an
/// orderly close, which the reader cannot learn otherwise when the two share their queue
/// pairs with other endpoints (XRC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Recall {
    /// Cumulative credits the writer gave back to the reader.
    pub returned: u32,
    /// Cumulative recall requests the writer made to the reader (29 bits: see
    /// [`Recall::COUNTER_MASK`]).
    pub recall: u32,
    /// The writer waits to send and has no credit.
    pub starving: bool,
    /// The writer closes and has no credit for its Close.
    pub closing: bool,
    /// The latest request asks for every credit, not all but one.
    pub all: bool,
}

impl Recall {
    /// The request counter's bits.
    pub const COUNTER_MASK: u32 = 0x1FFF_FFFF;

    /// The word that says "my endpoint is gone": every bit set (a request counter of
    /// [`COUNTER_MASK`](Self::COUNTER_MASK), which no request uses).
    pub const GONE: u64 = u64::MAX;

    /// The word says the writer's endpoint is gone.
    pub fn is_gone(self) -> bool {
        self.recall == Self::COUNTER_MASK
    }

    /// The word.
    pub fn to_word(self) -> u64 {
        u64::from(self.returned)
            | (u64::from(self.recall & Self::COUNTER_MASK) << 32)
            | (u64::from(self.closing) << 61)
            | (u64::from(self.starving) << 62)
            | (u64::from(self.all) << 63)
    }

    /// From the word.
    pub fn from_word(w: u64) -> Self {
        Self {
            returned: w as u32,
            recall: (w >> 32) as u32 & Self::COUNTER_MASK,
            closing: (w >> 61) & 1 == 1,
            starving: (w >> 62) & 1 == 1,
            all: w >> 63 == 1,
        }
    }

    /// The request counter after `n`, wrapping within its 29 bits (and past
    /// [`COUNTER_MASK`](Self::COUNTER_MASK), which [`GONE`](Self::GONE) uses).
    pub fn next_request(n: u32) -> u32 {
        let next = n.wrapping_add(1) & Self::COUNTER_MASK;
        if next == Self::COUNTER_MASK { 0 } else { next }
    }
}

/// What a signal says: the immediate of an RDMA WRITE with immediate that carries a word
/// into the peer's mailbox slot (the word lands before the completion). It wakes the peer to
/// act on the word at once: a plain write raises no completion, so the peer would see it
/// only at its next poll of the slot (its background tick, or the end of a bounded sleep).
/// A signal spends one of the writer's credits for the peer; the receive buffer it consumed
/// goes back to the queue untouched.
///
/// Layout of the 32-bit immediate: [`Signal::MAGIC`] in bits 24..32, the kind in bits
/// 16..24, the receiving endpoint's tag in bits 0..16 (for routing, as in a header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// A [`Recall`] word with a new request, "I asked you for credits": answer now if idle.
    RecallRequest,
    /// A [`Recall`] word with credits given back: apply them now.
    RecallReturned,
    /// A [`Mailbox`] word whose `rndv_done` moved, after a rendezvous request flagged
    /// [`Header::WAKE_ON_READ`](rdmx_core::header::Header::WAKE_ON_READ): the sender may send its next rendezvous message.
    ReadDone,
}

impl Signal {
    /// The immediate's top byte.
    pub const MAGIC: u8 = 0xC5;

    /// The immediate for endpoint `tag` at the receiver.
    pub fn to_imm(self, tag: u16) -> u32 {
        let kind: u32 = match self {
            Self::RecallRequest => 1,
            Self::RecallReturned => 2,
            Self::ReadDone => 3,
        };
        (u32::from(Self::MAGIC) << 24) | (kind << 16) | u32::from(tag)
    }

    /// Parses an immediate: the signal and the tag, or `None` for anything else.
    pub fn from_imm(imm: u32) -> Option<(Self, u16)> {
        if (imm >> 24) as u8 != Self::MAGIC {
            return None;
        }
        let kind = match (imm >> 16) & 0xFF {
            1 => Self::RecallRequest,
            2 => Self::RecallReturned,
            3 => Self::ReadDone,
            _ => return None,
        };
        Some((kind, imm as u16))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn recall_signal_round_trips_and_rejects_others() {
        for sig in [
            Signal::RecallRequest,
            Signal::RecallReturned,
            Signal::ReadDone,
        ] {
            for tag in [0u16, 1, 0x1234, u16::MAX] {
                assert_eq!(Signal::from_imm(sig.to_imm(tag)), Some((sig, tag)));
            }
        }
        assert_eq!(Signal::from_imm(0), None);
        assert_eq!(Signal::from_imm(0xC504_0001), None, "unknown kind");
        assert_eq!(Signal::from_imm(0xC401_0001), None, "wrong magic");
    }

    #[test]
    fn mailbox_word() {
        let m = Mailbox {
            grant: 0x1234_5678,
            rndv_done: 0x9abc_def0,
        };
        assert_eq!(Mailbox::from_word(m.to_word()), m);
    }

    #[test]
    fn recall_counter_wraps_within_its_bits() {
        let top = Recall::COUNTER_MASK;
        assert_eq!(Recall::next_request(top), 0);
        // The value before the mask wraps to 0 too: the mask itself means "gone".
        assert_eq!(Recall::next_request(top - 1), 0);
        assert!(Recall::from_word(Recall::GONE).is_gone());
        assert!(!Recall::from_word(Recall::default().to_word()).is_gone());
        let w = Recall {
            returned: u32::MAX,
            recall: top,
            closing: false,
            starving: false,
            all: false,
        };
        let back = Recall::from_word(w.to_word());
        assert_eq!(back, w);
        assert!(
            !back.all && !back.starving && !back.closing,
            "the counter must not spill into the flags"
        );
    }

    proptest! {
        #[test]
        fn recall_word_round_trips(
            returned in any::<u32>(),
            recall in 0..=Recall::COUNTER_MASK,
            closing in any::<bool>(),
            starving in any::<bool>(),
            all in any::<bool>(),
        ) {
            let r = Recall { returned, recall, closing, starving, all };
            prop_assert_eq!(Recall::from_word(r.to_word()), r);
        }
    }
}
