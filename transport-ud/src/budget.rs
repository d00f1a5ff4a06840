//! The receive budget every session shares: one UD queue pair has `P` posted receive
//! buffers, and whatever any peer may send takes one. Of them a control reserve
//! (`max(64, P / 8)`, at most half) is kept for acknowledgements, probes and requests; the
//! data promises of all sessions stay within the rest.
//!
//! A session's promise is the credit told minus the next sequence number expected; it can
//! grow up to its window, and shrinks only as the peer sends or gives credit back. So each
//! session reserves `max(promised, window)` buffers, and the sum of the reservations never
//! exceeds the data budget. Sessions start with a full window while the budget has room,
//! else with none; a sender without credit asks for some (`WANT`), and a session asking
//! waits in line until the budget has room for at least a small window. With sessions in
//! line, the sessions granted the longest ago (and held at least a retransmission timeout)
//! lose their window and are asked to give their credit back (`RECALL`), until what comes
//! back covers the line.

use std::collections::VecDeque;
use std::time::Instant;

/// The smallest window worth granting (or the whole window, when that is smaller).
pub(crate) const MIN_GRANT: u32 = 4;

/// The budget's books (in `State`).
#[derive(Debug, Default)]
pub(crate) struct Budget {
    /// Posted buffers data promises may use: the receive queue minus the control reserve.
    pub(crate) data: u64,
    /// The sum of every session's reservation, and of the windows of sessions being set up.
    pub(crate) reserved: u64,
    /// Of which: sessions with no window (their credit is being used up or given back).
    pub(crate) returning: u64,
    /// Sessions that asked for credit and wait for room: (key, id), first come first.
    pub(crate) waiting: VecDeque<(usize, u64)>,
    /// Sessions holding a window, oldest grant first: (key, id, grant number, when);
    /// entries of a later grant or a gone session are skipped.
    pub(crate) holders: VecDeque<(usize, u64, u64, Instant)>,
    /// Windows granted (sessions set up with one included); also numbers the grants.
    pub(crate) grants: u64,
    /// Recalls sent.
    pub(crate) recalls: u64,
    /// Requests for credit that had to wait in line.
    pub(crate) waits: u64,
}

/// What the budget holds of one session (in `Peer`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Share {
    /// Buffers reserved: `max(promised, window)` when last settled.
    pub(crate) reserved: u32,
    /// Counted in `Budget::returning` (its window is 0).
    pub(crate) returning: bool,
    /// In `Budget::waiting`.
    pub(crate) waiting: bool,
    /// Its latest grant's number (0: none).
    pub(crate) grant: u64,
}

/// The control reserve and data budget of a receive queue of `posted` buffers.
pub(crate) fn split(posted: u32) -> (u32, u32) {
    let control = (posted / 8).max(64).min(posted / 2);
    (control, posted - control)
}

impl Budget {
    /// The buffers no session reserves.
    pub(crate) fn spare(&self) -> u64 {
        self.data.saturating_sub(self.reserved)
    }

    /// The window a new session starts with: the whole `window` when the budget has room
    /// for it, else 0 (reserved until [`release`](Self::release) or the session opens).
    pub(crate) fn take_initial(&mut self, window: u32) -> u32 {
        if self.spare() >= u64::from(window) && self.waiting.is_empty() {
            self.reserved += u64::from(window);
            window
        } else {
            0
        }
    }

    /// Gives back what [`take_initial`](Self::take_initial) reserved for a session never
    /// opened.
    pub(crate) fn release(&mut self, window: u32) {
        self.reserved = self.reserved.saturating_sub(u64::from(window));
    }

    /// Registers an opened session's initial window (already reserved) as its share.
    pub(crate) fn open(&mut self, key: usize, id: u64, window: u32, now: Instant) -> Share {
        let mut share = Share {
            reserved: window,
            returning: window == 0,
            ..Share::default()
        };
        if window > 0 {
            self.grants += 1;
            share.grant = self.grants;
            self.push_holder(key, id, share.grant, now);
        }
        share
    }

    /// Updates the books to a session's reservation and window.
    pub(crate) fn account(&mut self, share: &mut Share, reserved: u32, window: u32) {
        self.reserved =
            self.reserved.saturating_sub(u64::from(share.reserved)) + u64::from(reserved);
        if share.returning {
            self.returning = self.returning.saturating_sub(u64::from(share.reserved));
        }
        share.reserved = reserved;
        share.returning = window == 0;
        if share.returning {
            self.returning += u64::from(reserved);
        }
    }

    /// Forgets a removed session's share.
    pub(crate) fn close(&mut self, share: &mut Share) {
        self.account(share, 0, 1);
        share.grant = 0;
    }

    pub(crate) fn push_holder(&mut self, key: usize, id: u64, grant: u64, now: Instant) {
        self.holders.push_back((key, id, grant, now));
    }
}
