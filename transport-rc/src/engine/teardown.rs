//! Endpoint life's end: taking an endpoint down (its queue pair to the error state, the
//! application told), reaping endpoints whose work has drained, and removing them with
//! their buffers returned only after the queue pair is flushed.

use std::sync::Arc;

use rdmx_core::header::{Header, Kind};
use rdmx_core::worker::Cx;
use rdmx_core::{DisconnectCause, Event};
use rdmx_verbs::{QpAttr, QpAttrMask, QpState, WcStatus, WrOpcode};

use super::send::{PostData, post_on};
use crate::ep::{Hold, Inbound, OpResult, OpSource, Status};
use crate::state::{Shared, State};
use crate::timers::Timer;
use crate::wire::{MAILBOX_LEN, RECALL_OFF, Recall};

/// The least an XRC endpoint that went down on this side waits for its peer's answer
/// (with its key, its slot and its rendezvous buffers) before they go without it: two of the
/// longest background ticks (100 ms), in which an rdmx peer answers, and some slack. The
/// wait is the peer timeout when that is longer.
const LINGER: std::time::Duration = std::time::Duration::from_millis(250);

impl Shared {
    /// Takes an endpoint down: its queue pair goes to the error state (flushing what is
    /// posted), the application is told.
    pub(crate) fn fail(&self, st: &mut State, cx: &mut Cx<'_>, k: usize, cause: DisconnectCause) {
        cx.nudge_leader(k);
        let Some(ep) = st.eps.get_mut(k) else { return };
        if matches!(ep.status, Status::Down(_)) {
            return;
        }
        tracing::debug!(endpoint = ep.id, %cause, "endpoint down");
        cx.wake_sleepers(&ep.wait);
        // Over a shared XRC initiator the peer cannot notice (its keepalives keep getting
        // through, to the node's shared target): tell it, unless it is the one that went.
        // (An unreachable peer may only have been slow to close; if the initiator itself is
        // broken, the write fails and nothing is lost.)
        let shared_qp = Arc::strong_count(&ep.qp) > 1;
        let mut linger = false;
        let peer_knows = matches!(
            cause,
            DisconnectCause::PeerClosed | DisconnectCause::PeerAborted
        );
        if shared_qp && !peer_knows && matches!(ep.status, Status::Open | Status::Closing) {
            let op = WrOpcode::RdmaWrite {
                remote_addr: ep.peer_mailbox.0 + RECALL_OFF as u64,
                rkey: rdmx_verbs::Rkey(ep.peer_mailbox.1),
            };
            let gone = Recall::GONE.to_be_bytes();
            if let Err(e) = post_on(ep, op, PostData::Inline(&gone), Hold::None, false) {
                tracing::debug!(endpoint = ep.id, "could not tell the peer: {e}");
            }
            // Until the peer has read that (at its next look, within its tick), it may still
            // send, read our rendezvous buffers and write our slot: its messages come through
            // the node's shared target and are routed by our key, so the key must not go to a
            // new endpoint meanwhile, nor the buffers back to the pool. It answers with a
            // `GONE` of its own once it has stopped: written on its initiator after all its
            // work on this endpoint, so our target has executed that work when the answer
            // lands (`peer_gone`). Without an answer, the wait ends after `gone_wait`.
            linger = true;
            ep.awaiting_gone = true;
        }
        ep.status = Status::Down(cause.clone());
        // A shared XRC initiator stays up for the other endpoints (it is failed as a whole
        // by `fail_qp` when it breaks).
        if Arc::strong_count(&ep.qp) == 1 {
            let _ = ep.qp.modify(
                &QpAttr {
                    qp_state: QpState::Err,
                    ..QpAttr::default()
                },
                QpAttrMask::STATE,
            );
        }
        ep.signaled_out = 0;
        // Operations still waiting get an error now. Their buffers, like every buffer a
        // posted work request names, stay in the endpoint until the flush completion of that
        // request arrives or the queue pair is destroyed: a NIC may still be using them.
        let mut failed = Vec::new();
        for (s, hold) in ep.inflight.iter_mut() {
            if let Hold::Op(src) = hold {
                failed.push(OpResult {
                    seq: *s,
                    status: WcStatus::WrFlushErr,
                    buf: None,
                });
                *hold = match std::mem::replace(src, OpSource::None) {
                    OpSource::None => Hold::None,
                    OpSource::Buf(b) => Hold::Buf(b),
                    OpSource::Shared(r) => Hold::Shared(r),
                };
            }
        }
        for r in failed {
            ep.op_done(r);
        }
        // Rendezvous buffers stay too (released with the queue pair); nobody needs to
        // watch for their release any more.
        let id = ep.id;
        st.rndv_watch.retain(|&x| x != k);
        if linger {
            let at = cx.now() + self.gone_wait();
            st.arm(cx, k, Timer::Linger, at);
        }
        cx.push_event(Event::Disconnected {
            endpoint: id,
            cause,
        });
        st.reap_pending = true;
        cx.wake_all();
    }

    /// How long an XRC endpoint that told its peer it went down waits for the answer.
    pub(crate) fn gone_wait(&self) -> std::time::Duration {
        self.cfg.peer_timeout.max(LINGER)
    }

    /// The peer of endpoint `k` wrote `Recall::GONE` in its recall word. On an endpoint
    /// still up, the peer's side went down: ours goes down too, and answers with a `GONE` of
    /// its own, posted after everything this endpoint posted (it posts nothing more), so that
    /// the peer's key, slot and buffers may go once it lands. On an endpoint that told its
    /// peer first and waits, it is that answer (or the peer's own news, if both went down at
    /// once: it too posts nothing more after it): the wait ends.
    pub(crate) fn peer_gone(&self, st: &mut State, cx: &mut Cx<'_>, k: usize) {
        let Some(ep) = st.eps.get_mut(k) else { return };
        match ep.status {
            Status::Open | Status::Closing => {
                self.fail(st, cx, k, DisconnectCause::PeerAborted);
                let Some(ep) = st.eps.get_mut(k) else { return };
                let op = WrOpcode::RdmaWrite {
                    remote_addr: ep.peer_mailbox.0 + RECALL_OFF as u64,
                    rkey: rdmx_verbs::Rkey(ep.peer_mailbox.1),
                };
                let gone = Recall::GONE.to_be_bytes();
                if let Err(e) = post_on(ep, op, PostData::Inline(&gone), Hold::None, false) {
                    tracing::debug!(endpoint = ep.id, "could not answer the peer: {e}");
                }
            }
            Status::Down(_) if ep.awaiting_gone => {
                ep.awaiting_gone = false;
                ep.timers.clear(Timer::Linger);
                st.stats.gone_answered += 1;
                st.reap_pending = true;
                cx.wake_all();
            }
            _ => {}
        }
    }

    /// Sends the Close of endpoints that are closing and drained; removes endpoints that are
    /// down and whose handle is gone.
    pub(crate) fn reap(&self, st: &mut State, cx: &mut Cx<'_>) {
        let now = cx.now();
        // A closing endpoint whose last send used its last credit needs the peer's next
        // grant for its Close, and grants written into the mailbox are only noticed when
        // read: nothing else reads it once the application stopped sending.
        let starved: Vec<usize> = st
            .eps
            .iter()
            .filter(|(_, ep)| {
                ep.status == Status::Closing && !ep.close_sent && ep.send.available() == 0
            })
            .map(|(k, _)| k)
            .collect();
        for k in starved {
            self.read_mailbox(st, cx, k);
            // Still none, and everything sent was read: the peer may be holding its grants
            // back because its application has not taken our messages yet. Ask for the one
            // credit the Close needs (`Recall::closing`).
            let Some(ep) = st.eps.get_mut(k) else {
                continue;
            };
            if ep.send.available() == 0 && ep.drained() && !ep.recall.closing {
                ep.recall.closing = true;
                super::recall::write_recall(st, k);
            }
        }
        let mut remove = Vec::new();
        for (k, ep) in st.eps.iter_mut() {
            if ep.status == Status::Closing
                && !ep.close_sent
                && ep.drained()
                && ep.send.available() > 0
            {
                let h = Header {
                    kind: Kind::Close,
                    tag: ep.peer_tag,
                    grant: ep.recv.advertise(),
                    rndv_done: ep.rndv_in_done,
                    len: 0,
                    flags: 0,
                };
                ep.rndv_in_adv = ep.rndv_in_done;
                ep.send.take();
                if post_on(
                    ep,
                    WrOpcode::Send,
                    PostData::Inline(&h.to_bytes()),
                    Hold::None,
                    true,
                )
                .is_ok()
                {
                    ep.close_sent = true;
                }
            }
            if ep.status == Status::Closing
                && ep.close_sent
                && ep.peer_closed
                && ep.signaled_out == 0
            {
                let cause = if ep.closed_here {
                    DisconnectCause::LocalClose
                } else {
                    DisconnectCause::PeerClosed
                };
                ep.status = Status::Down(cause.clone());
                cx.wake_sleepers(&ep.wait);
                // The event comes after the last message the peer sent before closing has
                // been taken (see `inbox.rs`): an application that drops the endpoint on the
                // event loses nothing.
                if ep.has_pending_messages() {
                    ep.close_event_due = true;
                } else {
                    cx.push_event(Event::Disconnected {
                        endpoint: ep.id,
                        cause,
                    });
                }
            }
            // (An endpoint whose queue pair goes with it may go at once: destroying the queue
            // pair ends its work. One on a shared XRC initiator waits until the work that
            // names its buffers has completed: the initiator goes on.)
            if ep.detached
                && matches!(ep.status, Status::Down(_))
                && ep.timers.get(Timer::Linger).is_none_or(|t| now >= t)
                && (Arc::strong_count(&ep.qp) == 1 || !ep.lends_buffers_to_the_nic())
            {
                remove.push(k);
            }
        }
        for k in remove {
            self.remove(st, cx, k);
        }
        // (A lingering endpoint is looked at again when its linger timer expires, not by
        // every progress call.)
        st.reap_pending = st.eps.iter().any(|(_, e)| {
            e.status == Status::Closing
                || (e.detached
                    && matches!(e.status, Status::Down(_))
                    && e.timers.get(Timer::Linger).is_none())
        });
    }

    /// Destroys an endpoint's queue pair and frees its credits and buffers.
    pub(crate) fn remove(&self, st: &mut State, cx: &mut Cx<'_>, k: usize) {
        let Some(ep) = st.eps.try_remove(k) else {
            return;
        };
        cx.wake_sleepers(&ep.wait);
        if st.by_qpn.get(&ep.qpn) == Some(&k) {
            st.by_qpn.remove(&ep.qpn);
        }
        // XRC: the context's initiator towards a node goes with the last endpoint on it (held
        // then by the table and this endpoint only; an exchange under way holds it too). The
        // next endpoint to that node makes a new one.
        if self.node.is_some() {
            st.initiators
                .retain(|_, i| !(Arc::ptr_eq(&i.qp, &ep.qp) && Arc::strong_count(&ep.qp) <= 2));
        }
        st.budget.remove_endpoint(&ep.recv);
        if ep.recall.close_wanted {
            st.close_wanted = st.close_wanted.saturating_sub(1);
        }
        st.needy.retain(|&x| x != k);
        st.dirty.retain(|&x| x != k);
        st.rndv_watch.retain(|&x| x != k);
        st.rndv_wait.retain(|&x| x != k);
        st.packs.retain(|&x| x != k);
        if let crate::ep::Slot::InRegion(off) = ep.slot {
            let _ = self.mailbox.write(off, &[0; MAILBOX_LEN]);
        }
        // Eager buffers still queued go back to the receive queue.
        let mut ep = ep;
        // A packed frame's buffer goes back once the messages taken from it are dropped too.
        for i in ep.inbox.drain(..) {
            match i {
                Inbound::Msg { buf, .. } => self.recycle(st, buf),
                Inbound::Packed { frame, .. } => self.release_frame(st, frame),
                _ => {}
            }
        }
        // Dropping the queue pair destroys it; the verbs layer guarantees the NIC no longer
        // touches the buffers held by its work requests once that returns.
        drop(ep);
    }
}
