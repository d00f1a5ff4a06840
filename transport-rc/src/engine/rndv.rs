//! Rendezvous bookkeeping of the progress engine: reads of peers' buffers (posted in order
//! as destinations are free), the "read done" counts and credit grants a peer writes into
//! our mailbox slots, and the window of our own buffers awaiting a peer's read.

use crate::wire::Mailbox;
use rdmx_core::DisconnectCause;
use rdmx_core::header::seq_after;
use rdmx_core::worker::Cx;
use rdmx_verbs::{SendWr, WcStatus, WorkCompletion, WrOpcode};

use crate::ep::{Hold, Inbound, Status, wrid};
use crate::state::{Shared, State};

/// The most credits a peer may hold out to us at once: above the deepest shared receive
/// queue a verbs device creates (the soft provider's 65,536; hardware's are smaller), so
/// a grant beyond it cannot be backed by posted buffers and is a lie.
pub(crate) const MAX_PEER_WINDOW: u32 = 1 << 17;

impl Shared {
    pub(crate) fn on_read(&self, st: &mut State, cx: &mut Cx<'_>, c: &WorkCompletion) {
        let k = wrid::key(c.wr_id);
        Self::touch(st, cx, k);
        let Some(ep) = st.eps.get_mut(k) else { return };
        if ep.qpn != c.qp_num.0 {
            return;
        }
        ep.signaled_out = ep.signaled_out.saturating_sub(1);
        // Reads complete in the order they were posted: the first posted, unfinished one.
        let at = ep.inbox.iter().position(|i| {
            matches!(
                i,
                Inbound::Rndv {
                    posted: true,
                    done: false,
                    ..
                }
            )
        });
        let mut gap = Vec::new();
        if let Some(at) = at {
            if c.status == WcStatus::Success {
                if let Some(Inbound::Rndv { done, .. }) = ep.inbox.get_mut(at) {
                    *done = true;
                }
            } else {
                // The message never arrived: it must not be delivered with whatever its
                // buffer held (the read is over, so the NIC no longer writes the buffer),
                // and neither may anything sent after it: what the application gets stays
                // a prefix of the stream, and the endpoint's error comes where the gap is.
                ep.inbox.remove(at);
                ep.rndv_queued = ep.rndv_queued.saturating_sub(1);
                gap = ep.inbox.drain(at..).collect();
            }
        }
        ep.inflight.retain(|(s, _)| *s != wrid::seq(c.wr_id));
        if c.status == WcStatus::Success {
            ep.rndv_in_done = ep.rndv_in_done.wrapping_add(1);
            if !st.dirty.contains(&k) {
                st.dirty.push(k);
            }
            if at.is_some()
                && let Some(ep) = st.eps.get_mut(k)
            {
                cx.mark_ready(&mut ep.wait);
            }
        } else {
            if !gap.is_empty() {
                self.discard_after_gap(st, k, gap);
            }
            if c.status != WcStatus::WrFlushErr {
                // A peer that stopped answering is unreachable, as for any other work
                // request (it was reported as a transport error).
                let cause = match c.status {
                    WcStatus::RetryExcErr => DisconnectCause::PeerUnreachable(
                        "transport retries exhausted (rendezvous read)".into(),
                    ),
                    s => DisconnectCause::TransportError(format!("rendezvous read: {s:?}")),
                };
                self.fail_qp(st, cx, c.qp_num.0, cause);
            }
        }
    }

    /// Drops the inbox entries of endpoint `k` that came after a lost message, giving
    /// their receive buffers back. A rendezvous read still in flight keeps its entry (and
    /// destination buffer) until it ends, with a flush error since the queue pair failed;
    /// its entry goes then.
    fn discard_after_gap(&self, st: &mut State, k: usize, later: Vec<Inbound>) {
        let mut keep = Vec::new();
        for i in later {
            match i {
                Inbound::Msg { buf, .. } => self.recycle(st, buf),
                Inbound::Packed { frame, .. } => self.release_frame(st, frame),
                Inbound::Rndv {
                    posted: true,
                    done: false,
                    ..
                } => keep.push(i),
                Inbound::Rndv { .. } => {
                    if let Some(ep) = st.eps.get_mut(k) {
                        ep.rndv_queued = ep.rndv_queued.saturating_sub(1);
                    }
                }
                Inbound::Closed => {}
            }
        }
        if let Some(ep) = st.eps.get_mut(k) {
            ep.inbox.extend(keep);
        }
    }

    /// Applies cumulative counters from the peer (piggybacked or from the mailbox). Returns
    /// whether they gave the endpoint room to send (credits, or rendezvous buffers the peer
    /// finished reading).
    ///
    /// # Errors
    /// A peer that lies: a read-done count beyond the rendezvous buffers offered to it, or
    /// a grant of more credits than any receiver can back ([`MAX_PEER_WINDOW`]). Nothing is
    /// applied (no buffer is released); the caller disconnects the endpoint.
    pub(crate) fn apply_peer_counters(
        &self,
        st: &mut State,
        k: usize,
        m: Mailbox,
    ) -> Result<bool, String> {
        let ep = &mut st.eps[k];
        let offered = ep.rndv_out.len() as u32;
        let done = m.rndv_done.wrapping_sub(ep.rndv_out_done);
        if seq_after(m.rndv_done, ep.rndv_out_done) && done > offered {
            return Err(format!(
                "the peer reports {done} rendezvous reads done; {offered} buffers were offered"
            ));
        }
        let window = m.grant.wrapping_sub(ep.send.sent);
        if seq_after(m.grant, ep.send.sent) && window > MAX_PEER_WINDOW {
            return Err(format!(
                "the peer grants {window} credits; no receive queue holds more than \
                 {MAX_PEER_WINDOW}"
            ));
        }
        let mut freed = ep.send.update(m.grant);
        while seq_after(m.rndv_done, ep.rndv_out_done) {
            if ep.rndv_out.pop_front().is_none() {
                break;
            }
            ep.rndv_out_done = ep.rndv_out_done.wrapping_add(1);
            freed = true;
        }
        // (Runs for every message received: skip the scan when nobody is watched.)
        if ep.rndv_out.is_empty() && !st.rndv_watch.is_empty() {
            st.rndv_watch.retain(|&x| x != k);
        }
        Ok(freed)
    }

    /// Reads the mailbox slot of one endpoint and applies it.
    pub(crate) fn read_mailbox(&self, st: &mut State, cx: &mut Cx<'_>, k: usize) {
        let Some(ep) = st.eps.get(k) else { return };
        let mut b = [0u8; 8];
        let (mem, off) = self.slot_mem(&ep.slot);
        if mem.read(off, &mut b).is_err() {
            return;
        }
        let m = Mailbox::from_word(u64::from_be_bytes(b));
        if m != ep.mailbox_seen {
            Self::touch(st, cx, k);
            st.eps[k].mailbox_seen = m;
            if let Err(why) = self.apply_peer_counters(st, k, m) {
                st.stats.protocol_errors += 1;
                self.fail(st, cx, k, DisconnectCause::Protocol(why));
            }
        }
    }

    pub(crate) fn check_mailboxes(&self, st: &mut State, cx: &mut Cx<'_>) {
        let watch = std::mem::take(&mut st.rndv_watch);
        for &k in &watch {
            self.read_mailbox(st, cx, k);
        }
        for k in watch {
            if st.eps.get(k).is_some_and(|e| !e.rndv_out.is_empty()) && !st.rndv_watch.contains(&k)
            {
                st.rndv_watch.push(k);
            }
        }
    }

    /// Allocates destinations for waiting rendezvous requests and posts their reads, in order.
    pub(crate) fn post_deferred_reads(&self, st: &mut State, cx: &mut Cx<'_>) {
        if st.rndv_wait.is_empty() {
            return;
        }
        let waiting = std::mem::take(&mut st.rndv_wait);
        let mut too_big = Vec::new();
        for k in waiting {
            let Some(ep) = st.eps.get_mut(k) else {
                continue;
            };
            // A read for an endpoint that is down is not posted: over XRC the shared
            // initiator would still carry it, to a buffer the peer may have released (its
            // endpoint is gone); the message is lost, like the ones behind it.
            if !matches!(ep.status, Status::Open | Status::Closing) {
                continue;
            }
            let mut blocked = false;
            for entry in ep.inbox.iter_mut() {
                let Inbound::Rndv {
                    len,
                    rts,
                    dest,
                    posted,
                    ..
                } = entry
                else {
                    continue;
                };
                if *posted {
                    continue;
                }
                if ep.inflight.len() as u32 + 1 >= ep.sq_depth {
                    blocked = true;
                    break;
                }
                if dest.is_none() {
                    match self.pool.try_alloc(*len as usize) {
                        Ok(b) => *dest = Some(b),
                        // Beyond what the pool can ever hold (the peer ignored the limit we
                        // advertised): it would wait for ever, and everything behind it.
                        Err(rdmx_core::Error::PoolCapacity(n)) => {
                            too_big.push((k, n));
                            break;
                        }
                        Err(_) => {
                            blocked = true;
                            break;
                        }
                    }
                }
                let Some(d) = dest.as_ref() else { break };
                let sge = d.sge(self.post_key);
                let seq = ep.next_seq;
                ep.next_seq = ep.next_seq.wrapping_add(1);
                let mut wr = SendWr::new(
                    wrid::make(wrid::READ, k, seq),
                    WrOpcode::RdmaRead {
                        remote_addr: rts.addr,
                        rkey: rdmx_verbs::Rkey(rts.rkey),
                    },
                    std::slice::from_ref(&sge),
                )
                .signaled();
                wr.remote_srqn = ep.remote_srqn;
                match ep.qp.post_send(&wr) {
                    Ok(()) => {
                        ep.inflight.push_back((seq, Hold::None));
                        ep.signaled_out += 1;
                        *posted = true;
                    }
                    Err(e) => {
                        tracing::debug!("posting a rendezvous read failed: {e}");
                        blocked = true;
                        break;
                    }
                }
            }
            if blocked {
                st.rndv_wait.push(k);
            }
        }
        for (k, n) in too_big {
            let cause = DisconnectCause::Protocol(format!(
                "a {n}-byte rendezvous message exceeds the {} bytes advertised",
                self.cfg.max_message
            ));
            self.fail(st, cx, k, cause);
        }
    }
}
