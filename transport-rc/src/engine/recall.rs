//! Credit recall: getting receive credits back from idle endpoints.
//!
//! Every credit a context grants is backed by a posted receive buffer, and the buffers are
//! shared by all endpoints. Credits held by an endpoint that sends nothing are buffers nobody
//! else can use: with many endpoints, a newcomer (or a busy endpoint) could wait forever.
//!
//! A sender that has a message and no credit says so: it sets `starving` in its recall word
//! in our slot (and clears it once it has a credit again). A context that sees a starving
//! peer (at a scan, below) puts that endpoint at the front of the queue for grants and, when
//! no buffer is spare, asks idle peers (none of their messages arrived for
//! [`PRESSURE_IDLE`]) to give credits back: all but one from peers holding more than one,
//! so their next message still goes out at once. A peer with nothing waiting to be sent
//! answers by treating those credits as used and telling us so; we count them as received
//! without a buffer, which frees them for the endpoint that waits.
//!
//! **Lending.** The starving endpoint's own context knows first. When its other endpoints
//! to the same peer context hold credits and have nothing to send, one of them gives its
//! credits back unasked, as a signal (below), which makes the peer look at the flags at
//! once and grant the freed buffer to the starving endpoint ([`lend_idle`]). This is what
//! keeps a server that answers many clients from one thread going when the clients have
//! fewer buffers than requests in flight: without it, every answer whose endpoint had no
//! credit waited for the clients' context to notice the flag and recall, two scans apart.
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
//! answer only at its next scan, and a starving sender waited for two of them. When the
//! writer holds a credit for the peer, a request or an answer is sent as an RDMA WRITE
//! *with immediate* instead ([`Signal`]): the word lands, then a completion
//! wakes the peer, which acts at once. The signal uses one receive buffer, paid with one of
//! the writer's credits like any message: an answer gives back all its credits but the one
//! the signal spends, which the receiver frees as it reposts the buffer. Without a credit the
//! plain write remains, and the next scan picks it up.
//!
//! **Scans.** The starving flag itself cannot be signalled (its writer has no credit by
//! definition), so the flags are looked at: on the background tick, every [`PRESSURE_SCAN`]
//! while a peer starves, and every [`WATCH_SCAN`] while every posted buffer is promised and
//! some endpoint is below its window (backing off to the tick while the context receives
//! nothing and nobody starves). A scan answers the peers' requests too. Whichever thread
//! makes progress does the scans that are due (`Shared::after`).

use std::time::{Duration, Instant};

use crate::wire::{RECALL_OFF, Recall, Signal};
use rdmx_core::worker::Cx;
use rdmx_verbs::{Rkey, WrOpcode};

use super::send::{PostData, post_on};
use crate::ep::{Hold, Status};
use crate::state::{Shared, State};
use crate::timers::Timer;

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
    // Until the endpoint is open, the peer's mailbox is unknown; until the peer is ready,
    // its slot is closed.
    if ep.status == Status::Connecting || !ep.peer_ready {
        return false;
    }
    let w = Recall {
        returned: ep.recall.returned_out,
        recall: ep.recall.requested_out,
        closing: ep.recall.closing,
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

pub(crate) use crate::state::WATCH_SCAN;

/// The peer's recall word of endpoint `k`, from our mailbox.
fn their_word(sh: &Shared, st: &State, k: usize) -> Option<Recall> {
    let ep = st.eps.get(k)?;
    let mut b = [0u8; 8];
    let (mem, off) = sh.slot_mem(&ep.slot);
    mem.read(off + RECALL_OFF, &mut b).ok()?;
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

/// Answers a new recall request from the peer of endpoint `k`: unless a message of ours
/// waits to be sent on it (`idle_sender` false), give back what it asks for, signalling
/// when we can. (The peer asked because none of our messages arrived for
/// [`PRESSURE_IDLE`].)
fn answer(
    sh: &Shared,
    st: &mut State,
    cx: &mut Cx<'_>,
    k: usize,
    theirs: Recall,
    idle_sender: bool,
) {
    let Some(ep) = st.eps.get_mut(k) else {
        return;
    };
    if theirs.recall == ep.recall.requested_seen {
        return;
    }
    ep.recall.requested_seen = theirs.recall;
    // The credits we hold include grants written into our mailbox and not read yet (it is
    // read when we run out): read it, or those could never be given back.
    sh.read_mailbox(st, cx, k);
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

/// Endpoint `k` starves: give credits for the same peer context back from another endpoint
/// that has nothing to send, so that the peer can grant them to `k` at once.
///
/// The credits of all our endpoints to one peer context are buffers of that context. With
/// more endpoints than it has buffers, they can all be held by endpoints of ours that have
/// nothing to send (a client waiting for an answer to a request it could not send yet),
/// while a thread blocks in `send` on `k`. Its recall would get them back only once it
/// noticed `k`'s starving flag (a plain write, found at its next scan), and then by asking
/// us: a round trip and two scans. We know first, and the returned credits arrive as a
/// signal, which makes the peer look at the flags at once ([`on_signal`]). The starving
/// flag was written before, on `k`'s queue pair.
///
/// The donor keeps one credit if it has more (its next message still goes at once), and
/// gives its last one otherwise. Only one donor per starving episode: `k` needs one credit.
pub(crate) fn lend_idle(sh: &Shared, st: &mut State, cx: &mut Cx<'_>, k: usize) {
    let Some(peer) = st.eps.get(k).map(|ep| ep.peer_context) else {
        return;
    };
    let candidates: Vec<usize> = st
        .eps
        .iter()
        .filter(|&(j, ep)| j != k && ep.peer_context == peer && ep.is_open() && !ep.waits_to_send())
        .map(|(j, _)| j)
        .collect();
    // Grants written into our mailbox are read only when an endpoint runs out: read them
    // for the candidates. The donor is one whose application has nothing left to answer
    // if there is one (an endpoint with unread messages is likely to reply soon), and
    // then the one holding the most.
    for &j in &candidates {
        sh.read_mailbox(st, cx, j);
    }
    let donor = candidates
        .into_iter()
        .filter_map(|j| st.eps.get(j).map(|ep| (j, ep)))
        .filter(|(_, ep)| ep.send.available() > 0)
        .max_by_key(|(_, ep)| (ep.inbox.is_empty(), ep.send.available()))
        .map(|(j, _)| j);
    let Some(j) = donor else {
        return;
    };
    let Some(ep) = st.eps.get_mut(j) else {
        return;
    };
    let avail = ep.send.available();
    let keep = u32::from(avail > 1);
    // One of the credits given back pays for the signal (the peer frees its buffer).
    let give = avail - keep - 1;
    ep.send.sent = ep.send.sent.wrapping_add(give);
    ep.recall.returned_out = ep.recall.returned_out.wrapping_add(give);
    st.stats.credits_lent += u64::from(give) + 1;
    write_recall_as(st, j, Some(Signal::RecallReturned));
}

/// A recall signal arrived on endpoint `k`: act on the peer's word now. `returned`: the
/// peer gave credits back ([`Signal::RecallReturned`]); otherwise it asked for some
/// ([`Signal::RecallRequest`]).
pub(crate) fn on_signal(sh: &Shared, st: &mut State, cx: &mut Cx<'_>, k: usize, returned: bool) {
    // The peer's side of a connection opens first: it may ask before ours knows where its
    // mailbox is (an answer then went to address 0 and took the endpoint down with a remote
    // access error). Its word stays in our mailbox; the scans answer it once we are open.
    if st
        .eps
        .get(k)
        .is_none_or(|ep| ep.status == Status::Connecting)
    {
        return;
    }
    let Some(theirs) = their_word(sh, st, k) else {
        return;
    };
    if theirs.is_gone() {
        sh.peer_gone(st, cx, k);
        return;
    }
    if returned {
        apply_returned(sh, st, k, theirs);
        // The peer may have given these back (at least the credit the signal used) for
        // another of its endpoints that starves (see [`lend_idle`]): look at the flags now,
        // so that it is first in line.
        let now = cx.now();
        tick(sh, st, cx, now);
        cx.wake_all();
    } else {
        let idle_sender = st.eps.get(k).is_some_and(|ep| !ep.waits_to_send());
        answer(sh, st, cx, k, theirs, idle_sender);
    }
}

/// How often the receiving side looks again while a peer starves (instead of once per
/// background tick): answers that came as plain writes (the idle peer had no credit to
/// signal with) are then seen within this long.
pub(crate) const PRESSURE_SCAN: Duration = Duration::from_millis(5);

/// How long no message may have arrived from a peer for its credits to be recalled for a
/// starving one (and between two requests to the same peer). A peer that has a message
/// waiting keeps its credits anyway; one that sends now and then loses them only while
/// another starves, and gets new ones by starving in turn.
pub(crate) const PRESSURE_IDLE: Duration = Duration::from_millis(5);

/// A look at the peers' recall words (on the background tick, the quicker scans of
/// [`PRESSURE_SCAN`] and [`WATCH_SCAN`], and when a peer gives credits back): answer their
/// requests, apply the credits they gave back, and take credits from idle peers for
/// starving ones.
pub(crate) fn tick(sh: &Shared, st: &mut State, cx: &mut Cx<'_>, now: Instant) {
    let keys: Vec<usize> = st.eps.iter().map(|(k, _)| k).collect();
    let mut freed = 0u64;
    let mut starving = Vec::new();
    let mut closing = Vec::new();
    let mut gone = Vec::new();
    for &k in &keys {
        let Some(ep) = st.eps.get(k) else { continue };
        let open = ep.status == Status::Open;
        // A closing endpoint, and one waiting for its peer's answer to our `GONE`, look
        // only for the peer's `GONE`.
        if !open && ep.status != Status::Closing && !ep.awaiting_gone {
            continue;
        }
        let Some(theirs) = their_word(sh, st, k) else {
            continue;
        };
        if theirs.is_gone() {
            gone.push(k);
            continue;
        }
        if !open {
            continue;
        }
        freed += apply_returned(sh, st, k, theirs);
        let Some(ep) = st.eps.get_mut(k) else {
            continue;
        };
        // A newcomer never granted a credit starves as soon as its peer has something to
        // send: it is fed before it asks, so that its first message does not wait for the
        // look that would find its flag (up to a tick while nothing else arrives here).
        let unfed = ep.recv.granted == 0;
        if (theirs.starving || unfed) && ep.recv.outstanding() == 0 {
            starving.push(k);
        }
        let idle_sender = !ep.waits_to_send();
        if theirs.closing && !ep.recall.close_granted && ep.recv.outstanding() == 0 {
            // Its Close needs a credit that its window, full of messages our application
            // has not taken yet, would not give it: one more, once (`distribute`). With no
            // buffer spare, it starves like any sender.
            if !ep.recall.close_wanted {
                ep.recall.close_wanted = true;
                st.close_wanted += 1;
            }
            closing.push(k);
            if st.budget.spare() == 0 && starving.last() != Some(&k) {
                starving.push(k);
            }
        }
        answer(sh, st, cx, k, theirs, idle_sender);
    }
    for k in gone {
        sh.peer_gone(st, cx, k);
    }
    for k in closing {
        sh.mark_needy(st, k);
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
        (st.recall_watch_every * 2).min(sh.keepalive_tick())
    };
    st.recall_watch = watch;
    if !starving.is_empty() {
        feed_starving(sh, st, cx, &keys, &starving, now, &mut freed);
    }
    if freed > 0 {
        sh.after(st, cx);
        cx.wake_all();
    }
}

/// Puts starving endpoints first in line for grants and, when no buffer is spare, frees
/// credits held by idle ones.
fn feed_starving(
    sh: &Shared,
    st: &mut State,
    cx: &mut Cx<'_>,
    keys: &[usize],
    starving: &[usize],
    now: Instant,
    freed: &mut u64,
) {
    // One pass over the queue (this runs on every recall signal; a removal per starving
    // endpoint made it quadratic with hundreds of both).
    let first: std::collections::HashSet<usize> = starving.iter().copied().collect();
    let was = std::mem::take(&mut st.needy);
    st.needy.extend(starving.iter().copied());
    st.needy
        .extend(was.into_iter().filter(|k| !first.contains(k)));
    for &k in starving {
        if let Some(ep) = st.eps.get_mut(k) {
            ep.in_needy = true;
        }
    }
    sh.after(st, cx);
    let waiting = starving
        .iter()
        .filter(|&&k| st.eps.get(k).is_some_and(|e| e.recv.outstanding() == 0))
        .count();
    if waiting == 0 || st.budget.spare() > 0 {
        return;
    }
    let is_idle =
        |ep: &crate::ep::Ep| ep.is_open() && now.duration_since(ep.last_rx) >= PRESSURE_IDLE;
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
            let asked_recently = ep.timers.get(Timer::Recall).is_some_and(|t| now < t);
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
        // (A gate, not an action: it wakes nobody.)
        let _ = ep.timers.set(Timer::Recall, now + PRESSURE_IDLE);
        write_recall_as(st, k, Some(Signal::RecallRequest));
    }
}
