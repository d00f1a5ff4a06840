//! Windows from the budget (see `budget`): each session's share settled after it changed,
//! windows granted to the sessions in line, and the longest-held ones recalled for them.

use std::time::Instant;

use crate::budget::MIN_GRANT;
use crate::state::{Shared, State};

impl Shared {
    /// After a change of session `k`: its reservation on the books, and its request for
    /// credit in line.
    pub(crate) fn settle(&self, st: &mut State, k: usize) {
        let State { peers, budget, .. } = st;
        let Some(Some(p)) = peers.get_mut(k) else {
            return;
        };
        let s = &mut p.session;
        // A peer that sent its Fin (or a dead session) will use no credit: its share goes
        // back at once, not when its endpoint is dropped (a closed endpoint the application
        // keeps would hold it for ever, and recalling it is no use: it sends nothing).
        let done = s.peer_done();
        if done && s.window() > 0 {
            s.set_window(0);
        }
        // Only a session with no window waits in line. (A sender stalls with a window when
        // our application does not read, and more window would only hold more; and a
        // request may arrive late, after a grant.)
        let wants = s.take_want() && s.window() == 0 && !done;
        let reserved = if done {
            0
        } else {
            s.promised().max(s.window())
        };
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
            // With a long line, smaller windows for more sessions at once.
            let fair = budget.data / (budget.waiting.len() as u64).max(1);
            let w = u32::try_from(room.min(fair.max(u64::from(least))))
                .unwrap_or(u32::MAX)
                .min(window);
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
            dirty.insert(k);
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
            dirty.insert(k);
        }
    }
}
