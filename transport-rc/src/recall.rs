//! Credit recall: getting receive credits back from idle endpoints.
//!
//! Every credit a context grants is backed by a posted receive buffer, and the buffers are
//! shared by all endpoints. Credits held by an endpoint that sends nothing are buffers nobody
//! else can use: with many endpoints, a newcomer (or a busy endpoint) could wait forever.
//! So, on the background tick, a context that has endpoints waiting for credits and no spare
//! buffer asks its idle peers (those that sent nothing during the last tick and hold more
//! than one credit) to give credits back. A peer that has not sent anything during the last
//! tick answers by treating all its credits but one as used and telling us so; we count them
//! as received without a buffer, which frees them for the endpoints that wait.
//!
//! Keeping one credit per idle peer is not always possible: with more endpoints than posted
//! buffers, every buffer can end up backing the single credit of some idle endpoint while
//! another waits with none (1,000 endpoints over 512 buffers did hang so). When no idle
//! holder has more than one credit, the request says `all`, and idle peers give back their
//! last credit too. Such an endpoint goes back in the queue of endpoints waiting for credits,
//! behind those already waiting, and gets one again as buffers free up.
//!
//! Both the request and the answer are cumulative counters in the second word of the mailbox
//! slots (an 8-byte RDMA WRITE; no receive buffer involved).

use std::time::{Duration, Instant};

use rdmx_core::header::{RECALL_OFF, Recall};
use rdmx_verbs::{Rkey, WrOpcode};

use crate::ep::{Hold, Status};
use crate::shared::{PostData, Shared, State, post_on};

/// Writes our recall word (`returned`, `requested`) into the peer's slot of endpoint `k`.
fn write_recall(st: &mut State, k: usize) -> bool {
    let Some(ep) = st.eps.get_mut(k) else {
        return false;
    };
    let w = Recall {
        returned: ep.recall.returned_out,
        recall: ep.recall.requested_out,
        all: ep.recall.ask_all,
    };
    let bytes = w.to_word().to_be_bytes();
    let op = WrOpcode::RdmaWrite {
        remote_addr: ep.peer_mailbox.0 + RECALL_OFF as u64,
        rkey: Rkey(ep.peer_mailbox.1),
    };
    ep.sq_used() + 2 < ep.sq_depth
        && post_on(ep, op, PostData::Inline(&bytes), Hold::None, false).is_ok()
}

/// The background tick: answer the peers' recall requests, apply the credits they gave back,
/// and ask idle peers for credits when endpoints here are waiting for some.
pub(crate) fn tick(sh: &Shared, st: &mut State, now: Instant, idle_for: Duration) {
    let keys: Vec<usize> = st.eps.iter().map(|(k, _)| k).collect();
    let mut freed = 0u64;
    for &k in &keys {
        let Some(ep) = st.eps.get_mut(k) else {
            continue;
        };
        if !matches!(ep.status, Status::Open) {
            continue;
        }
        let mut b = [0u8; 8];
        if sh
            .mailbox
            .read(ep.mailbox_off + RECALL_OFF, &mut b)
            .is_err()
        {
            continue;
        }
        let theirs = Recall::from_word(u64::from_be_bytes(b));
        // Credits the peer gave back: received without using a buffer. Never more than it
        // holds (a peer cannot free buffers it was not granted).
        let back = theirs
            .returned
            .wrapping_sub(ep.recall.returned_seen)
            .min(ep.recall_outstanding());
        if back > 0 {
            ep.recall.returned_seen = ep.recall.returned_seen.wrapping_add(back);
            ep.recv.received = ep.recv.received.wrapping_add(back);
            freed += u64::from(back);
            // Below its window now (perhaps at zero): it waits for grants like the others.
            sh.mark_needy(st, k);
        }
        let Some(ep) = st.eps.get_mut(k) else {
            continue;
        };
        // A request from the peer: if we sent nothing since the previous tick, keep one
        // credit and give back the rest.
        let idle_sender = ep.send.sent == ep.recall.sent_at_tick;
        ep.recall.sent_at_tick = ep.send.sent;
        let mut answer = false;
        if theirs.recall != ep.recall.requested_seen {
            ep.recall.requested_seen = theirs.recall;
            // The credits we hold include grants written into our mailbox and not read yet
            // (it is read when we run out): read it, or those could never be given back.
            sh.read_mailbox(st, k);
            let Some(ep) = st.eps.get_mut(k) else {
                continue;
            };
            let avail = ep.send.available();
            let keep = u32::from(!theirs.all);
            if avail > keep && idle_sender {
                let give = avail - keep;
                ep.send.sent = ep.send.sent.wrapping_add(give);
                ep.recall.returned_out = ep.recall.returned_out.wrapping_add(give);
                answer = true;
            }
        }
        if answer {
            write_recall(st, k);
        }
    }
    st.budget.outstanding = st.budget.outstanding.saturating_sub(freed);
    if freed > 0 {
        st.stats.credits_recalled += freed;
    }
    // Short of buffers while endpoints wait for credits: ask the idle holders, for all their
    // credits but one; when none holds more than one, for all of them.
    if st.budget.spare() == 0 && !st.needy.is_empty() {
        // Grants not told to the peer yet are ours to take back without asking.
        let mut untold = 0u64;
        for &k in &keys {
            let Some(ep) = st.eps.get_mut(k) else {
                continue;
            };
            let n = ep.recv.unadvertised();
            if n > 0 && now.duration_since(ep.last_rx) >= idle_for {
                ep.recv.granted = ep.recv.granted.wrapping_sub(n);
                untold += u64::from(n);
                sh.mark_needy(st, k);
            }
        }
        if untold > 0 {
            st.budget.outstanding = st.budget.outstanding.saturating_sub(untold);
            freed += untold;
        }
    }
    if st.budget.spare() == 0 && !st.needy.is_empty() {
        let idle_holders: Vec<(usize, u32)> = keys
            .iter()
            .filter_map(|&k| {
                let ep = st.eps.get(k)?;
                let idle = now.duration_since(ep.last_rx) >= idle_for;
                let asked_recently = ep.recall.asked_at.is_some_and(|t| now - t < idle_for);
                (ep.is_open() && idle && !asked_recently && ep.recv.outstanding() > 0)
                    .then(|| (k, ep.recv.outstanding()))
            })
            .collect();
        let all = idle_holders.iter().all(|&(_, n)| n <= 1);
        for (k, n) in idle_holders {
            if !all && n <= 1 {
                continue;
            }
            let Some(ep) = st.eps.get_mut(k) else {
                continue;
            };
            ep.recall.requested_out = Recall::next_request(ep.recall.requested_out);
            ep.recall.ask_all = all;
            ep.recall.asked_at = Some(now);
            write_recall(st, k);
        }
    }
    if freed > 0 {
        sh.after(st);
        sh.wake_all();
    }
}
