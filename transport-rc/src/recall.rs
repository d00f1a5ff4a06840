//! Credit recall: getting receive credits back from idle endpoints.
//!
//! Every credit a context grants is backed by a posted receive buffer, and the buffers are
//! shared by all endpoints. Credits held by an endpoint that sends nothing are buffers nobody
//! else can use: with many endpoints, a newcomer (or a busy endpoint) could wait forever.
//!
//! A sender that has a message and no credit says so: it sets `starving` in its recall word
//! in our slot (and clears it once it has a credit again). On the background tick, a
//! context that sees a starving peer puts that endpoint at the front of the queue for
//! grants and, when no buffer is spare, asks idle peers (those that sent nothing during the
//! last tick) to give credits back: all but one from peers holding more than one, so their
//! next message still goes out at once. A peer that has not sent anything since its previous
//! tick answers by treating those credits as used and telling us so; we count them as
//! received without a buffer, which frees them for the endpoint that waits.
//!
//! With more endpoints than posted buffers, every buffer can back the single credit of some
//! idle endpoint, and keeping one each frees nothing (1,000 endpoints over 512 buffers did
//! hang so). Then the request says `all`, sent to as many idle peers as endpoints starve,
//! the longest idle first; such a peer gives back its last credit too and waits for grants
//! like the others. Grants not yet told to an idle peer are taken back without asking.
//! Recall acts only for starving peers: with more endpoints than buffers, some endpoints
//! always lack credits without wanting any, and taking credits for them would only move
//! the shortage around.
//!
//! Requests, answers and the starving flag travel in the second word of the mailbox slots
//! (an 8-byte RDMA WRITE; no receive buffer involved).
//!
//! **Signals.** A plain write raises no completion, so the peer would act on a request or an
//! answer only at its next background tick (100 ms), and a starving sender waited for two
//! ticks. When the writer holds a credit for the peer, a request or an answer is sent as an
//! RDMA WRITE *with immediate* instead ([`Signal`]): the word lands, then a completion
//! wakes the peer, which acts at once. The signal uses one receive buffer, paid with one of
//! the writer's credits like any message: an answer gives back all its credits but the one
//! the signal spends, which the receiver frees as it reposts the buffer. Without a credit the
//! plain write remains, and the tick picks it up. The starving flag itself cannot be
//! signalled (its writer has no credit by definition): a context whose buffers are all
//! promised while some endpoint has none looks at the flags every [`WATCH_SCAN`], backing
//! off to the tick while it receives nothing and nobody starves.

use std::time::{Duration, Instant};

use rdmx_core::header::{RECALL_OFF, Recall, Signal};
use rdmx_verbs::{Rkey, WrOpcode};

use crate::ep::{Hold, Status};
use crate::send::{PostData, post_on};
use crate::shared::{Shared, State};

/// Writes our recall word (`returned`, `requested`, flags) into the peer's slot of endpoint
/// `k`.
pub(crate) fn write_recall(st: &mut State, k: usize) -> bool {
    write_recall_as(st, k, None)
}

/// [`write_recall`], as a signal to the peer when `signal` is set and we hold a credit for
/// it (see the module's documentation).
fn write_recall_as(st: &mut State, k: usize, signal: Option<Signal>) -> bool {
    let Some(ep) = st.eps.get_mut(k) else {
        return false;
    };
    let w = Recall {
        returned: ep.recall.returned_out,
        recall: ep.recall.requested_out,
        starving: ep.recall.starving,
        all: ep.recall.ask_all,
    };
    let bytes = w.to_word().to_be_bytes();
    let remote_addr = ep.peer_mailbox.0 + RECALL_OFF as u64;
    let rkey = Rkey(ep.peer_mailbox.1);
    if ep.sq_used() + 2 >= ep.sq_depth {
        return false;
    }
    let op = match signal {
        Some(sig) if ep.is_open() && ep.send.take() => {
            st.stats.recall_signals += 1;
            WrOpcode::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm: sig.to_imm(ep.peer_tag),
            }
        }
        _ => WrOpcode::RdmaWrite { remote_addr, rkey },
    };
    let Some(ep) = st.eps.get_mut(k) else {
        return false;
    };
    post_on(ep, op, PostData::Inline(&bytes), Hold::None, false).is_ok()
}

/// How often a context first looks at the starving flags once every posted buffer backs a
/// credit and some endpoint holds none (a sender there can only wait to be noticed). While
/// the context receives nothing, the interval doubles after each look that finds nobody
/// starving, up to the tick; it starts again here when someone starves or messages arrive.
pub(crate) const WATCH_SCAN: Duration = Duration::from_millis(10);

/// The peer's recall word of endpoint `k`, from our mailbox.
fn their_word(sh: &Shared, st: &State, k: usize) -> Option<Recall> {
    let ep = st.eps.get(k)?;
    let mut b = [0u8; 8];
    sh.mailbox.read(ep.mailbox_off + RECALL_OFF, &mut b).ok()?;
    Some(Recall::from_word(u64::from_be_bytes(b)))
}

/// Applies the credits the peer of endpoint `k` gave back (its `returned` counter): counted
/// as received without a buffer, which frees them. Never more than it holds (a peer cannot
/// free buffers it was not granted). Returns how many.
fn apply_returned(sh: &Shared, st: &mut State, k: usize, theirs: Recall) -> u64 {
    let Some(ep) = st.eps.get_mut(k) else {
        return 0;
    };
    let back = theirs
        .returned
        .wrapping_sub(ep.recall.returned_seen)
        .min(ep.recall_outstanding());
    if back == 0 {
        return 0;
    }
    ep.recall.returned_seen = ep.recall.returned_seen.wrapping_add(back);
    ep.recv.received = ep.recv.received.wrapping_add(back);
    // Below its window now (perhaps at zero): it waits for grants like the others.
    sh.mark_needy(st, k);
    let back = u64::from(back);
    st.budget.outstanding = st.budget.outstanding.saturating_sub(back);
    st.stats.credits_recalled += back;
    back
}

/// Answers a new recall request from the peer of endpoint `k`: if we sent nothing on it
/// since the previous tick (`idle_sender`), give back what it asks for, signalling when we
/// can.
fn answer(sh: &Shared, st: &mut State, k: usize, theirs: Recall, idle_sender: bool) {
    let Some(ep) = st.eps.get_mut(k) else {
        return;
    };
    if theirs.recall == ep.recall.requested_seen {
        return;
    }
    ep.recall.requested_seen = theirs.recall;
    // The credits we hold include grants written into our mailbox and not read yet (it is
    // read when we run out): read it, or those could never be given back.
    sh.read_mailbox(st, k);
    let Some(ep) = st.eps.get_mut(k) else {
        return;
    };
    let avail = ep.send.available();
    let keep = u32::from(!theirs.all);
    if avail <= keep || !idle_sender {
        return;
    }
    // One of the credits given back pays for the signal (the peer frees its buffer).
    let give = avail - keep - 1;
    ep.send.sent = ep.send.sent.wrapping_add(give);
    ep.recall.returned_out = ep.recall.returned_out.wrapping_add(give);
    write_recall_as(st, k, Some(Signal::RecallReturned));
}

/// A recall signal arrived on endpoint `k`: act on the peer's word now. `returned`: the
/// peer gave credits back ([`Signal::RecallReturned`]); otherwise it asked for some
/// ([`Signal::RecallRequest`]).
pub(crate) fn on_signal(sh: &Shared, st: &mut State, k: usize, returned: bool) {
    let Some(theirs) = their_word(sh, st, k) else {
        return;
    };
    if returned {
        if apply_returned(sh, st, k, theirs) > 0 {
            sh.wake_all();
        }
    } else {
        let idle_sender = st
            .eps
            .get(k)
            .is_some_and(|ep| ep.send.sent == ep.recall.sent_at_tick);
        answer(sh, st, k, theirs, idle_sender);
    }
}

/// How often the receiving side looks again while a peer starves (instead of once per
/// background tick): answers that came as plain writes (the idle peer had no credit to
/// signal with) are then seen within this long.
pub(crate) const PRESSURE_SCAN: Duration = Duration::from_millis(5);

/// The background tick: answer the peers' recall requests, apply the credits they gave back,
/// and take credits from idle peers for starving ones. With `answer_requests` false (the
/// quicker scans, see [`PRESSURE_SCAN`] and [`WATCH_SCAN`]), requests from peers are left
/// for the next full tick or their signal: whether we are idle is judged against the
/// previous full tick.
pub(crate) fn tick(
    sh: &Shared,
    st: &mut State,
    now: Instant,
    idle_for: Duration,
    answer_requests: bool,
) {
    let keys: Vec<usize> = st.eps.iter().map(|(k, _)| k).collect();
    let mut freed = 0u64;
    let mut starving = Vec::new();
    for &k in &keys {
        if !st
            .eps
            .get(k)
            .is_some_and(|ep| matches!(ep.status, Status::Open))
        {
            continue;
        }
        let Some(theirs) = their_word(sh, st, k) else {
            continue;
        };
        freed += apply_returned(sh, st, k, theirs);
        let Some(ep) = st.eps.get_mut(k) else {
            continue;
        };
        if theirs.starving && ep.recv.outstanding() == 0 {
            starving.push(k);
        }
        if !answer_requests {
            continue;
        }
        // Idle means: nothing sent on this endpoint since the previous tick.
        let idle_sender = ep.send.sent == ep.recall.sent_at_tick;
        ep.recall.sent_at_tick = ep.send.sent;
        answer(sh, st, k, theirs, idle_sender);
    }
    // Scan again soon while a peer starves, and now and then while every buffer is promised
    // and some endpoint holds no credit (one may start starving unnoticed).
    st.recall_pressure = !starving.is_empty();
    let watch = st.budget.spare() == 0
        && st
            .eps
            .iter()
            .any(|(_, ep)| ep.is_open() && ep.recv.outstanding() == 0);
    // While messages arrive, the watch stays at WATCH_SCAN; a context that received
    // nothing since the last look backs off towards the tick, so that an idle one with
    // every buffer promised (1,000 idle endpoints on 512 buffers) does not keep waking up
    // every 10 ms.
    let active = st.recv_seen != st.recv_at_watch;
    st.recv_at_watch = st.recv_seen;
    st.recall_watch_every = if !watch || !st.recall_watch || st.recall_pressure || active {
        WATCH_SCAN
    } else {
        (st.recall_watch_every * 2).min(idle_for)
    };
    st.recall_watch = watch;
    if !starving.is_empty() {
        feed_starving(sh, st, &keys, &starving, now, idle_for, &mut freed);
    }
    if freed > 0 {
        sh.after(st);
        sh.wake_all();
    }
}

/// Puts starving endpoints first in line for grants and, when no buffer is spare, frees
/// credits held by idle ones.
fn feed_starving(
    sh: &Shared,
    st: &mut State,
    keys: &[usize],
    starving: &[usize],
    now: Instant,
    idle_for: Duration,
    freed: &mut u64,
) {
    for &k in starving.iter().rev() {
        st.needy.retain(|&x| x != k);
        st.needy.push_front(k);
        if let Some(ep) = st.eps.get_mut(k) {
            ep.in_needy = true;
        }
    }
    sh.after(st);
    let waiting = starving
        .iter()
        .filter(|&&k| st.eps.get(k).is_some_and(|e| e.recv.outstanding() == 0))
        .count();
    if waiting == 0 || st.budget.spare() > 0 {
        return;
    }
    let is_idle = |ep: &crate::ep::Ep| ep.is_open() && now.duration_since(ep.last_rx) >= idle_for;
    // Grants not told to the peer yet are ours to take back without asking.
    let mut untold = 0u64;
    for &k in keys {
        let Some(ep) = st.eps.get_mut(k) else {
            continue;
        };
        let n = ep.recv.unadvertised();
        if n > 0 && is_idle(ep) && !starving.contains(&k) {
            ep.recv.granted = ep.recv.granted.wrapping_sub(n);
            untold += u64::from(n);
            sh.mark_needy(st, k);
        }
    }
    if untold > 0 {
        st.budget.outstanding = st.budget.outstanding.saturating_sub(untold);
        *freed += untold;
        if st.budget.spare() >= waiting as u64 {
            return;
        }
    }
    let mut holders: Vec<(usize, u32, Instant)> = keys
        .iter()
        .filter_map(|&k| {
            let ep = st.eps.get(k)?;
            let asked_recently = ep.recall.asked_at.is_some_and(|t| now - t < idle_for);
            (is_idle(ep) && !asked_recently && ep.recv.outstanding() > 0)
                .then(|| (k, ep.recv.outstanding(), ep.last_rx))
        })
        .collect();
    let all = holders.iter().all(|&(_, n, _)| n <= 1);
    if all {
        // Taking an endpoint's last credit makes its next message wait for a grant: take
        // only as many as endpoints starve, from those idle the longest.
        holders.sort_by_key(|&(_, _, last)| last);
        holders.truncate(waiting);
    } else {
        holders.retain(|&(_, n, _)| n > 1);
    }
    for (k, _, _) in holders {
        let Some(ep) = st.eps.get_mut(k) else {
            continue;
        };
        ep.recall.requested_out = Recall::next_request(ep.recall.requested_out);
        ep.recall.ask_all = all;
        ep.recall.asked_at = Some(now);
        write_recall_as(st, k, Some(Signal::RecallRequest));
    }
}
