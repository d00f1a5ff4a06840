//! Credit: the receive window the transport gives a session from its budget, the peer's
//! requests for more (`WANT`), and taking credit back from an idle peer (`RECALL`, answered
//! by `RETURN`).

use std::time::Instant;

use super::Session;
use crate::seq::Seq;
use crate::wire::{Header, flags};

impl Session {
    /// The receive window (datagrams granted beyond the whole messages held).
    pub fn window(&self) -> u32 {
        self.window
    }

    /// Sets the receive window: what the credit grows to from now on (credit told stays).
    /// A larger one is told with the next datagram, at once when the peer waits for it.
    pub fn set_window(&mut self, w: u32) {
        let grows = w > self.window;
        self.window = w;
        if grows && self.credit().since(self.credit_told) > 0 {
            self.ack_now = true;
        }
    }

    /// Datagrams the peer may still send on credit told (each one a receive buffer this
    /// side must have posted).
    pub fn promised(&self) -> u32 {
        u32::try_from(self.granted.since(self.rcv_next).max(0)).unwrap_or(0)
    }

    /// Takes the peer's request for credit (`WANT`), if it made one since the last look.
    pub fn take_want(&mut self) -> bool {
        std::mem::take(&mut self.wanted)
    }

    /// Asks the peer to give its unused credit back (set the window to what it may keep
    /// first). It answers when it has nothing to send; until then the request rides on
    /// every datagram.
    pub fn recall(&mut self, now: Instant) {
        if self.promised() > 0 && !self.is_recalling() {
            self.recall_out = true;
            self.ack_now = true;
            self.recall_at = Some(now + self.rto());
        }
    }

    /// Whether a recall is under way (the peer still holds credit we asked back).
    pub fn is_recalling(&self) -> bool {
        self.recall_out && self.promised() > 0
    }

    /// The credit we grant now: `recv_window` packets beyond the whole messages the
    /// application has not taken. (The message being reassembled holds none: its bytes are
    /// copied out as they come, and a message longer than the window must be able to
    /// complete.) Never below what was told already: a peer may use a credit once told.
    pub(super) fn credit(&self) -> Seq {
        let now = self.rcv_next.plus(self.window.saturating_sub(self.held));
        if now.before(self.granted) {
            self.granted
        } else {
            now
        }
    }

    /// The credit requests and returns a datagram carries.
    pub(super) fn take_credit_flags(&mut self, h: &Header) {
        if h.has(flags::WANT) {
            self.wanted = true;
            self.ack_now = true;
        }
        if h.has(flags::RECALL) {
            // Give back what we will not use: only with nothing queued and nothing in
            // flight (then every packet we sent has arrived, and the peer may count the
            // unused numbers as received too).
            let idle = !self.has_unsent() && self.inflight.is_empty() && !self.outbox.mid_message();
            if idle {
                if self.peer_credit.since(self.next_seq) > 0 {
                    self.next_seq = self.peer_credit;
                    self.snd_una = self.next_seq;
                }
                self.ack_now = true;
            }
        }
        if h.has(flags::RETURN) {
            // Nothing below `h.seq` will come: numbers the peer skipped count as received
            // (never past what we granted, never over a packet we hold or a message in the
            // middle).
            let skip = h.seq.since(self.rcv_next);
            let fits = skip > 0 && h.seq.since(self.granted) <= 0;
            if fits
                && self.partial.is_none()
                && self.ahead.iter().take(skip as usize).all(Option::is_none)
            {
                self.rcv_next = h.seq;
                self.ahead.drain(..(skip as usize).min(self.ahead.len()));
                self.stats.skipped += skip as u64;
            }
            if self.promised() == 0 {
                self.recall_out = false;
                self.recall_at = None;
            }
        }
    }
}
