//! The progress engine: completions in (datagrams to their sessions, send buffers back),
//! datagrams out (what sessions want to send, posted from pool buffers), session timers,
//! messages to the application, and removing finished sessions.

use std::cmp::Reverse;
use std::sync::Arc;
use std::time::Instant;

use rdmx_core::worker::{Body, Cx, Message};
use rdmx_core::{Buf, Error, Event, Result};
use rdmx_verbs::{RecvWr, SendWr, WcStatus};

use crate::state::{CTRL_TAG, SEND_TAG, Shared, State, disconnect_cause};
use crate::wire::Header;
use rdmx_core::bootstrap::DatagramKey;

impl Shared {
    /// Posts receive buffer `buf` (whole capacity) on the data queue pair, or on the
    /// control one.
    pub(crate) fn post_recv(&self, st: &mut State, mut buf: Buf, ctrl: bool) -> Result<()> {
        let cap = buf.capacity();
        buf.set_len(cap)?;
        let slot = st.recv_slots.vacant_key();
        let sge = [buf.sge(self.post_key)];
        let (qp, tag) = if ctrl {
            (&self.ctrl_qp, CTRL_TAG)
        } else {
            (&self.qp, 0)
        };
        qp.post_recv(&RecvWr::new(slot as u64 | tag, &sge))?;
        st.recv_slots.insert(buf);
        Ok(())
    }

    /// Polls the completion queue (a bounded number), routes datagrams to their sessions,
    /// then sends what the sessions want to send. Returns the completions handled.
    pub(crate) fn progress(&self, st: &mut State, cx: &mut Cx<'_>) -> usize {
        let mut wc = std::mem::take(&mut st.wc);
        let n = self.cq.poll(&mut wc);
        let now = cx.now();
        for c in wc.iter().take(n) {
            if c.wr_id & SEND_TAG != 0 {
                let slot = (c.wr_id & !SEND_TAG) as usize;
                st.send_slots.try_remove(slot);
                if !st.blocked.is_empty() {
                    for k in st.blocked.take() {
                        st.mark_dirty(k);
                    }
                }
                if c.status != WcStatus::Success {
                    st.stats.send_errors += 1;
                }
                continue;
            }
            let ctrl = c.wr_id & CTRL_TAG != 0;
            let Some(buf) = st.recv_slots.try_remove((c.wr_id & !CTRL_TAG) as usize) else {
                continue;
            };
            if c.status != WcStatus::Success {
                st.stats.recv_errors += 1;
                // Flushed at teardown: the buffer goes back to the pool. Anything else (a
                // datagram too long for a control buffer) costs the datagram, not the
                // buffer.
                if c.status != WcStatus::WrFlushErr
                    && let Err(e) = self.post_recv(st, buf, ctrl)
                {
                    tracing::warn!("reposting a UD receive buffer failed: {e}");
                }
                continue;
            }
            st.stats.datagrams_received += 1;
            let len = (c.byte_len as usize).min(buf.len());
            let data = buf.get(rdmx_verbs::ah::GRH_LEN..len).unwrap_or_default();
            // With a key, every datagram ends with its session's tag: the header (which names
            // the session) is read from what precedes it, and nothing reaches the session
            // before the tag checks.
            let (body, tag) = if self.keyed {
                match data.len().checked_sub(DatagramKey::TAG_LEN) {
                    Some(at) => (&data[..at], Some(&data[at..])),
                    None => (&[][..], None),
                }
            } else {
                (data, None)
            };
            match Header::parse(body) {
                Err(_) if self.keyed => st.stats.unauthenticated += 1,
                Err(_) => st.stats.malformed += 1,
                Ok((h, payload)) => {
                    let k = h.dst_session as usize;
                    match st.peer_mut(k) {
                        Some(p) => {
                            let authentic = match (&p.mac, tag) {
                                (None, None) => true,
                                (Some(key), Some(tag)) => key.verify(&[body], tag),
                                _ => false,
                            };
                            if authentic {
                                p.session.handle_datagram(now, &h, payload);
                                st.mark_dirty(k);
                            } else {
                                st.stats.unauthenticated += 1;
                            }
                        }
                        None => st.stats.unknown_session += 1,
                    }
                }
            }
            if let Err(e) = self.post_recv(st, buf, ctrl) {
                tracing::warn!("reposting a UD receive buffer failed: {e}");
            }
        }
        st.wc = wc;
        self.after(st, cx, now);
        n
    }

    /// What follows any change: the budget's books, datagrams out, waiters told, timers
    /// queued, finished sessions removed; then windows granted or recalled, and the
    /// sessions they change sent to at once (nothing else may happen for a while to send
    /// them: every sender in line may be waiting out its probe's back-off). Each round
    /// after the first only has sessions the budget changed, each grant or recall taking
    /// one out of its line, so the rounds end.
    pub(crate) fn after(&self, st: &mut State, cx: &mut Cx<'_>, now: Instant) {
        while !st.dirty.is_empty() {
            self.after_round(st, cx, now);
            if !st.budget.waiting.is_empty() {
                self.serve(st, now);
            }
        }
    }

    fn after_round(&self, st: &mut State, cx: &mut Cx<'_>, now: Instant) {
        let dirty = st.dirty.take();
        for &k in &dirty {
            self.settle(st, k);
            self.transmit(st, k, now);
            let Some(p) = st.peer_mut(k) else {
                continue;
            };
            if p.detached && p.session.has_message() {
                // Nobody will read them: their credit goes back, and the close can end.
                p.session.drop_messages();
                self.transmit_peer(st, k, now);
            }
            let Some(p) = st.peer_mut(k) else {
                continue;
            };
            let ready = p.session.has_message() || p.session.cause().is_some();
            if ready {
                cx.touch(&mut p.wait);
                if !p.detached {
                    cx.mark_ready(&mut p.wait);
                }
            }
            if let Some(cause) = p.session.cause()
                && !p.told_down
                && !p.session.has_message()
            {
                p.told_down = true;
                cx.push_event(Event::Disconnected {
                    endpoint: p.id,
                    cause: disconnect_cause(cause),
                });
                cx.wake_all();
            }
            if let Some(t) = p.session.poll_timeout()
                && p.timer_at.is_none_or(|q| t < q)
            {
                p.timer_at = Some(t);
                let id = p.id;
                st.timers.push(Reverse((t, k, id)));
                cx.schedule(t);
            }
        }
        // Sessions whose handle is gone and that are over leave.
        for &k in &dirty {
            let over = st
                .peer(k)
                .is_some_and(|p| p.detached && p.session.is_finished());
            if over {
                self.remove(st, k);
            }
        }
    }

    fn transmit_peer(&self, st: &mut State, k: usize, now: Instant) {
        self.transmit(st, k, now);
    }

    /// Sends what peer `k`'s session wants to send, while a pool buffer and a send slot
    /// are free.
    pub(crate) fn transmit(&self, st: &mut State, k: usize, now: Instant) {
        let State {
            peers,
            send_slots,
            scratch,
            stats,
            blocked,
            ..
        } = st;
        let Some(Some(p)) = peers.get_mut(k) else {
            return;
        };
        loop {
            if send_slots.len() >= self.sq_depth as usize {
                // Its turn comes with the next send completion (its timers may not be set
                // yet: they are when it transmits).
                blocked.insert(k);
                return;
            }
            let Some(n) = p.session.poll_transmit(now, scratch) else {
                return;
            };
            let tag_len = p.mac.as_ref().map_or(0, |_| DatagramKey::TAG_LEN);
            let Ok(mut buf) = self.pool.try_alloc(n + tag_len) else {
                // Lost here as on the wire: the session sends it again.
                stats.send_dropped += 1;
                return;
            };
            let datagram = scratch.get(..n).unwrap_or_default();
            buf[..n].copy_from_slice(datagram);
            if let Some(key) = &p.mac {
                buf[n..].copy_from_slice(&key.tag(&[datagram]));
            }
            let slot = send_slots.vacant_key();
            let sge = [buf.sge(self.post_key)];
            // Acknowledgements (a header and nothing else) go to the peer's control queue
            // pair, everything else to its data one.
            let to = if crate::wire::is_ack(scratch.get(..n).unwrap_or_default()) {
                p.remote_ctrl_qpn
            } else {
                p.remote_qpn
            };
            let wr = SendWr::send(slot as u64 | SEND_TAG, &sge)
                .signaled()
                .to(&p.ah, to, self.qkey);
            match self.qp.post_send(&wr) {
                Ok(()) => {
                    send_slots.insert(buf);
                    stats.datagrams_sent += 1;
                }
                Err(e) => {
                    tracing::debug!("posting a UD datagram failed: {e}");
                    stats.send_dropped += 1;
                    return;
                }
            }
        }
    }

    /// Runs the session timers due at `now`.
    pub(crate) fn handle_timers(&self, st: &mut State, cx: &mut Cx<'_>, now: Instant) {
        while let Some(Reverse((t, k, id))) = st.timers.peek().copied() {
            if t > now {
                break;
            }
            st.timers.pop();
            let Some(p) = st.peer_mut(k) else {
                continue;
            };
            if p.id != id {
                continue;
            }
            if p.timer_at == Some(t) {
                p.timer_at = None;
            }
            if p.session.poll_timeout().is_some_and(|d| d <= now) {
                p.session.handle_timeout(now);
            }
            st.mark_dirty(k);
        }
        self.after(st, cx, now);
    }

    /// The next message of peer `k`, for the application.
    pub(crate) fn take_message(
        &self,
        st: &mut State,
        cx: &mut Cx<'_>,
        k: usize,
    ) -> Option<Result<Message>> {
        let p = st.peer_mut(k)?;
        if let Some(m) = p.session.recv() {
            let id = p.id;
            st.mark_dirty(k);
            let now = cx.now();
            self.after(st, cx, now);
            // The session's bytes into a pool buffer of the message's own.
            let body = match self.pool.try_alloc_from(&m) {
                Ok(b) => b,
                Err(e) => return Some(Err(e)),
            };
            return Some(Ok(cx.message(Body::Owned(body), id)));
        }
        p.session
            .cause()
            .map(|c| Err(Error::Disconnected(disconnect_cause(c))))
    }

    /// Removes peer `k` (or the key an exchange reserved) and gives its share of the
    /// receive budget back.
    pub(crate) fn remove(&self, st: &mut State, k: usize) {
        if let Some(Some(mut p)) = st.peers.try_remove(k) {
            st.budget.close(&mut p.share);
            let s = p.session.stats();
            let e = &mut st.ended;
            e.retransmits += s.retransmits;
            e.duplicates += s.duplicates;
            e.out_of_order += s.out_of_order;
            e.refused += s.refused;
            let to = (p.ah.attr().dgid, p.ah.attr().udp_port);
            // (The cache's and this session's: the last session to that remote goes.)
            if Arc::strong_count(&p.ah) <= 2 {
                st.ahs.remove(&to);
            }
            tracing::debug!(endpoint = p.id, "UD session removed");
        }
    }
}
