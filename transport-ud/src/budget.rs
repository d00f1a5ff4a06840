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

use crate::state::{Shared, State};

/// The smallest window worth granting (or the whole window, when that is smaller).
const MIN_GRANT: u32 = 4;

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
    fn account(&mut self, share: &mut Share, reserved: u32, window: u32) {
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

    fn push_holder(&mut self, key: usize, id: u64, grant: u64, now: Instant) {
        self.holders.push_back((key, id, grant, now));
    }
}

impl Shared {
    /// After a change of session `k`: its reservation on the books, and its request for
    /// credit in line.
    pub(crate) fn settle(&self, st: &mut State, k: usize) {
        let State { peers, budget, .. } = st;
        let Some(Some(p)) = peers.get_mut(k) else {
            return;
        };
        let s = &mut p.session;
        // Only a session with no window waits in line. (A sender stalls with a window when
        // our application does not read, and more window would only hold more; and a
        // request may arrive late, after a grant.)
        let wants = s.take_want() && s.window() == 0;
        let reserved = s.promised().max(s.window());
        let window = s.window();
        budget.account(&mut p.share, reserved, window);
        if wants && !p.share.waiting {
            p.share.waiting = true;
            budget.waiting.push_back((k, p.id));
            budget.waits += 1;
        }
    }

    /// Grants windows to the sessions in line while the budget has room, and recalls
    /// credit from the longest-held windows for those that remain. Sessions changed are
    /// marked dirty (their credit or recall goes out).
    pub(crate) fn serve(&self, st: &mut State, now: Instant) {
        let window = self.session.recv_window;
        let least = MIN_GRANT.min(window);
        while let Some(&(k, id)) = st.budget.waiting.front() {
            let State {
                peers,
                budget,
                dirty,
                ..
            } = st;
            let Some(Some(p)) = peers
                .get_mut(k)
                .filter(|p| p.as_ref().is_some_and(|p| p.id == id))
            else {
                budget.waiting.pop_front();
                continue;
            };
            if !p.share.waiting {
                budget.waiting.pop_front();
                continue;
            }
            let others = budget.reserved.saturating_sub(u64::from(p.share.reserved));
            let room = budget.data.saturating_sub(others);
            let w = u32::try_from(room).unwrap_or(u32::MAX).min(window);
            if w < least || w <= p.session.promised() {
                break;
            }
            budget.waiting.pop_front();
            p.share.waiting = false;
            p.session.set_window(w);
            let reserved = p.session.promised().max(w);
            budget.account(&mut p.share, reserved, w);
            budget.grants += 1;
            p.share.grant = budget.grants;
            budget.push_holder(k, id, p.share.grant, now);
            if !dirty.contains(&k) {
                dirty.push(k);
            }
        }
        if !st.budget.waiting.is_empty() {
            self.recall_oldest(st, now);
        }
        // A session granted again leaves its older holder entry behind: drop stale entries
        // when they outnumber the sessions.
        if st.budget.holders.len() > 2 * st.peers.len() + 64 {
            let peers = &st.peers;
            st.budget.holders.retain(|&(k, id, g, _)| {
                peers
                    .get(k)
                    .and_then(Option::as_ref)
                    .is_some_and(|p| p.id == id && p.share.grant == g)
            });
        }
    }

    /// Takes windows away from the sessions granted the longest ago, and asks their peers
    /// for the unused credit, until what comes back covers the sessions in line.
    fn recall_oldest(&self, st: &mut State, now: Instant) {
        let window = u64::from(self.session.recv_window);
        let hold = self.session.rto;
        let State {
            peers,
            budget,
            dirty,
            ..
        } = st;
        let need = (budget.waiting.len() as u64 * window).min(budget.data);
        while budget.spare() + budget.returning < need {
            let Some(&(k, id, grant, at)) = budget.holders.front() else {
                break;
            };
            let live = peers.get(k).and_then(Option::as_ref).is_some_and(|p| {
                p.id == id && p.share.grant == grant && p.session.window() > 0 && !p.share.waiting
            });
            if !live {
                budget.holders.pop_front();
                continue;
            }
            if now.saturating_duration_since(at) < hold {
                break;
            }
            budget.holders.pop_front();
            let Some(Some(p)) = peers.get_mut(k) else {
                continue;
            };
            p.session.set_window(0);
            p.session.recall(now);
            budget.recalls += 1;
            let reserved = p.session.promised();
            budget.account(&mut p.share, reserved, 0);
            if !dirty.contains(&k) {
                dirty.push(k);
            }
        }
    }
}
