//! Receive buffers and credits: reposting buffers on the shared receive queue (in
//! batches), refilling it from the pool, handing the posted buffers out as credits to the
//! endpoints that need them, and telling peers their grants (piggybacked, or by mailbox
//! write).

use std::sync::Arc;

use crate::wire::{Mailbox, Signal};
use rdmx_core::Buf;
use rdmx_verbs::{RecvWr, WrOpcode};

use super::send::{PostData, post_on};
use crate::ep::{Hold, Status, wrid};
use crate::state::{Shared, State};

impl Shared {
    /// Puts a receive buffer back on the shared receive queue (or back in the pool when the
    /// queue is full). With `batch_posts` it joins the pending batch, posted by
    /// [`flush_posts`](Self::flush_posts) once a sixteenth of the queue is waiting or at the
    /// end of the next progress.
    pub(crate) fn repost(&self, st: &mut State, buf: Buf) {
        if st.budget.posted + st.pending_posts.len() as u64 >= u64::from(self.cfg.srq_depth) {
            return;
        }
        let slot = st.recv_slots.insert(buf);
        if self.batch_posts {
            st.pending_posts.push(slot);
            if st.pending_posts.len() as u64 >= (u64::from(self.cfg.srq_depth) / 16).max(1) {
                self.flush_posts(st);
            }
            return;
        }
        let Some(buf) = st.recv_slots.get(slot) else {
            return;
        };
        let sge = buf.sge_at(self.post_key, 0, buf.capacity());
        let wr = RecvWr::new(wrid::make(wrid::RECV, slot, 0), std::slice::from_ref(&sge));
        match self.srq.post_recv(&wr) {
            Ok(()) => {
                st.budget.on_post(1);
                st.stats.recv_posted += 1;
            }
            Err(e) => {
                tracing::warn!("posting a receive buffer failed: {e}");
                st.recv_slots.remove(slot);
            }
        }
    }

    /// Posts the pending batch of receive buffers with one call.
    pub(crate) fn flush_posts(&self, st: &mut State) {
        if st.pending_posts.is_empty() {
            return;
        }
        let slots = std::mem::take(&mut st.pending_posts);
        let sges: Vec<_> = slots
            .iter()
            .filter_map(|&s| {
                st.recv_slots
                    .get(s)
                    .map(|b| b.sge_at(self.post_key, 0, b.capacity()))
            })
            .collect();
        let wrs: Vec<RecvWr<'_>> = slots
            .iter()
            .zip(&sges)
            .map(|(&slot, sge)| {
                RecvWr::new(wrid::make(wrid::RECV, slot, 0), std::slice::from_ref(sge))
            })
            .collect();
        let posted = match self.srq.post_recv_list(&wrs) {
            Ok(()) => wrs.len(),
            Err((i, e)) => {
                tracing::warn!(
                    "posting receive buffers failed at {i} of {}: {e}",
                    wrs.len()
                );
                i
            }
        };
        drop(wrs);
        for &slot in &slots[posted..] {
            st.recv_slots.try_remove(slot);
        }
        st.budget.on_post(posted as u64);
        st.stats.recv_posted += posted as u64;
    }

    /// An eager message buffer came back from the application.
    pub(crate) fn recycle(&self, st: &mut State, buf: Buf) {
        st.held = st.held.saturating_sub(1);
        self.repost(st, buf);
    }

    /// Drops one reference to a packed frame (held by its inbox entry or by a message taken
    /// from it): the last one, whichever it is, sends the receive buffer back. Every holder
    /// lets go with `Arc::into_inner` (here, or in `Message::drop`), which gives the buffer
    /// to exactly one of them.
    pub(crate) fn release_frame(&self, st: &mut State, frame: Arc<Buf>) {
        if let Some(buf) = Arc::into_inner(frame) {
            self.recycle(st, buf);
        }
    }

    /// Keeps the shared receive queue full from the pool, as long as the application does not
    /// hold more than a queue's worth of buffers (beyond that, senders wait for credits).
    ///
    /// It waits until a sixteenth of the queue is missing and then posts them together, so
    /// the receive path does not post a buffer per message (a lone endpoint's credits come
    /// from the spare buffers meanwhile). Below the queue's SRQ limit the SRQ-limit event
    /// triggers it too.
    pub(crate) fn refill(&self, st: &mut State) {
        // Batched posting: buffers wait until a sixteenth of the queue is missing (below),
        // or at once when every posted buffer is promised to a sender.
        if !st.pending_posts.is_empty() && st.budget.spare() == 0 {
            self.flush_posts(st);
        }
        let depth = u64::from(self.cfg.srq_depth);
        let batch = (depth / 16).max(1);
        if st.budget.posted + batch > depth && st.budget.spare() > 0 {
            return;
        }
        loop {
            let queued = st.budget.posted + st.pending_posts.len() as u64;
            if queued >= depth || queued + st.held >= 2 * depth + st.close_wanted {
                break;
            }
            match self.pool.try_alloc(self.cfg.recv_buf_size()) {
                Ok(b) => {
                    let before = st.budget.posted + st.pending_posts.len() as u64;
                    self.repost(st, b);
                    if st.budget.posted + st.pending_posts.len() as u64 == before {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        self.flush_posts(st);
    }

    pub(crate) fn mark_needy(&self, st: &mut State, k: usize) {
        if let Some(ep) = st.eps.get_mut(k)
            && !ep.in_needy
        {
            ep.in_needy = true;
            st.needy.push_back(k);
        }
    }

    /// Hands spare posted buffers to endpoints below their target window.
    pub(crate) fn distribute(&self, st: &mut State) {
        if st.close_wanted > 0 && st.budget.spare() > 0 {
            // A Close waiting for its credit goes first: it is the last message, and its
            // buffer may be the one posted beyond the bound for it.
            let (first, rest): (
                std::collections::VecDeque<usize>,
                std::collections::VecDeque<usize>,
            ) = std::mem::take(&mut st.needy)
                .into_iter()
                .partition(|&k| st.eps.get(k).is_some_and(|ep| ep.recall.close_wanted));
            st.needy = first;
            st.needy.extend(rest);
        }
        let mut rounds = st.needy.len();
        while st.budget.spare() > 0 && rounds > 0 {
            rounds -= 1;
            let Some(k) = st.needy.pop_front() else { break };
            let Some(ep) = st.eps.get_mut(k) else {
                continue;
            };
            if !ep.is_open() && ep.status != Status::Closing {
                ep.in_needy = false;
                continue;
            }
            let target = st.budget.target();
            // Undelivered rendezvous messages occupy the window like unread eager ones.
            let mut window = target.saturating_sub(ep.rndv_queued);
            if ep.recall.close_wanted {
                // The peer closes with no credit left (see `recall::tick`).
                window = window.max(1);
            }
            while ep.recv.outstanding() < window && st.budget.spare() > 0 {
                if !st.budget.grant(&mut ep.recv) {
                    break;
                }
            }
            if ep.recall.close_wanted && ep.recv.outstanding() > 0 {
                ep.recall.close_wanted = false;
                ep.recall.close_granted = true;
                st.close_wanted = st.close_wanted.saturating_sub(1);
            }
            let told = ep.recv.advertised.wrapping_sub(ep.recv.received);
            // Tell the peer once it is down to half its window, and then only with a
            // quarter window's worth, unless it has nothing left: a write per freed buffer
            // (the silly-window pattern) costs the receiver a send per message once the
            // sender runs ahead of it.
            let unadvertised = ep.recv.unadvertised();
            let worth = told == 0 || unadvertised >= (target / 4).max(1);
            if unadvertised > 0 && told <= target / 2 && worth && !st.dirty.contains(&k) {
                st.dirty.push(k);
            }
            if ep.recv.outstanding() < window {
                st.needy.push_back(k);
            } else {
                ep.in_needy = false;
            }
        }
    }

    /// Writes pending grants and rendezvous-done counts into peers' mailboxes.
    pub(crate) fn flush_mailboxes(&self, st: &mut State) {
        let dirty = std::mem::take(&mut st.dirty);
        for k in dirty {
            let Some(ep) = st.eps.get_mut(k) else {
                continue;
            };
            if !matches!(ep.status, Status::Open | Status::Closing) {
                continue;
            }
            if !ep.peer_ready {
                // Told when the peer's slot opens (`Signal::Ready` or its first message).
                continue;
            }
            if ep.recv.unadvertised() == 0 && ep.rndv_in_done == ep.rndv_in_adv {
                continue;
            }
            if ep.sq_used() + 1 >= ep.sq_depth {
                st.dirty.push(k);
                continue;
            }
            let m = Mailbox {
                grant: ep.recv.advertise(),
                rndv_done: ep.rndv_in_done,
            };
            // A sender whose rendezvous window is full asked to be woken once half of it is
            // read; that takes a credit (without one, it finds out by polling).
            let wake = ep
                .rndv_wake_at
                .is_some_and(|at| !rdmx_core::header::seq_after(at, ep.rndv_in_done));
            if wake {
                ep.rndv_wake_at = None;
            }
            ep.rndv_in_adv = ep.rndv_in_done;
            let bytes = m.to_word().to_be_bytes();
            let (addr, rkey) = ep.peer_mailbox;
            let remote_addr = addr;
            let rkey = rdmx_verbs::Rkey(rkey);
            let op = if wake && ep.is_open() && ep.send.take() {
                st.stats.read_done_signals += 1;
                WrOpcode::RdmaWriteWithImm {
                    remote_addr,
                    rkey,
                    imm: Signal::ReadDone.to_imm(ep.peer_tag),
                }
            } else {
                WrOpcode::RdmaWrite { remote_addr, rkey }
            };
            if let Err(e) = post_on(ep, op, PostData::Inline(&bytes), Hold::None, false) {
                tracing::debug!("mailbox write failed: {e}");
                continue;
            }
            st.stats.mailbox_writes += 1;
        }
    }
}
