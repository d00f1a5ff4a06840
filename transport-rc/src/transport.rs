//! The RC transport as the worker sees it ([`Rc`], which implements
//! `rdmx_core::worker::Transport`): its progress round, its timers (keepalives, the recall
//! scans, packed frames held by send batches), device events, and received buffers coming
//! back. How threads wait, and the background thread, are the worker's.

use std::time::{Duration, Instant};

use rdmx_core::worker::{Cx, Message, Transport, WaitSlot};
use rdmx_core::{Buf, Event};
use rdmx_verbs::AsyncEvent;

use crate::state::{Rc, Shared, State};
use crate::timers::Timer;

#[expect(
    unsafe_code,
    reason = "implementing `Transport` vouches for the posting rules below"
)]
// SAFETY: rdmx-rc names a pool buffer in a work request, or offers it to a peer, only once it
// has moved into the transport's tables, out of the application's reach: receive buffers
// live in `State::recv_slots` while posted; a send's buffer in its endpoint's `inflight`
// (`Hold::Buf`, `Hold::Op`) until the work request's own completion (every work request
// that holds a buffer is signaled) or its flush; a rendezvous destination in the inbox
// (`Inbound::Rndv`) until its read completes; a rendezvous source in `rndv_out` until the
// peer reports it read (a peer reading it later is issue 22's: memory windows). Buffers
// still named when an endpoint goes down stay until their flush completion or the queue
// pair's destruction (`Shared::fail`, `Shared::remove`); an endpoint on a shared XRC
// initiator, which outlives it, is removed only once no work names its buffers
// (`Ep::lends_buffers_to_the_nic`). The key never leaves `Shared`.
unsafe impl Transport for Rc {
    fn arm(&self) {
        self.sh.cq.req_notify(false);
    }

    fn progress(&mut self, cx: &mut Cx<'_>) -> usize {
        self.sh.progress(&mut self.st, cx)
    }

    fn handle_event(&mut self, cx: &mut Cx<'_>, ev: AsyncEvent) {
        match &self.sh.node {
            // The contexts of a node share its device: every one of them hears every event
            // and acts on what concerns it (`handle_timer` takes its share).
            Some(n) => n.share_event(ev),
            None => on_async_event(&self.sh, &mut self.st, cx, ev),
        }
    }

    fn next_timer(&self) -> Option<Instant> {
        let st = &self.st;
        let mut next = st.next_scan;
        if let Some(t) = st.timer_queue.peek() {
            next = next.min(t);
        }
        // (The quicker looks at the starving flags between ticks happen in progress,
        // `Shared::after`, once they are due.)
        let scan = if st.recall_pressure {
            Some(crate::engine::recall::PRESSURE_SCAN)
        } else if st.recall_watch {
            Some(st.recall_watch_every)
        } else {
            None
        };
        if let (Some(every), Some(at)) = (scan, st.recall_scanned_at) {
            next = next.min(at + every);
        }
        Some(next)
    }

    fn handle_timer(&mut self, cx: &mut Cx<'_>, now: Instant) {
        let (sh, st) = (&*self.sh, &mut self.st);
        if sh.node.is_some() {
            let mine: Vec<AsyncEvent> = sh.node_events.lock().drain(..).collect();
            for ev in mine {
                on_async_event(sh, st, cx, ev);
            }
        }
        // The endpoints' timers (keepalives, close deadlines, lingers, re-arms, starving
        // flags, packed frames), then the tick's look at the peers' recall words.
        if st.timer_queue.peek().is_some_and(|t| t <= now) {
            crate::engine::run_timers(sh, st, cx, now);
        }
        if now >= st.next_scan {
            crate::engine::recall::tick(sh, st, cx, now);
            sh.after(st, cx);
            st.next_scan = now + sh.keepalive_tick();
            st.recall_scanned_at = Some(now);
        }
    }

    fn watch(&self) -> Option<Duration> {
        // While every buffer is promised, one sleeping thread at a time wakes every scan
        // interval to look at the starving flags (see `recall.rs`): a starving sender's flag
        // notifies nobody, and the background thread may have backed off to its tick.
        let st = &self.st;
        if st.recall_pressure {
            Some(crate::engine::recall::PRESSURE_SCAN)
        } else if st.budget.spare() == 0 && !st.needy.is_empty() {
            Some(crate::engine::recall::WATCH_SCAN)
        } else {
            None
        }
    }

    fn take_back(&mut self, cx: &mut Cx<'_>, buf: Buf) {
        self.sh.recycle(&mut self.st, buf);
        self.sh.after(&mut self.st, cx);
    }

    fn hand_over(&mut self, cx: &mut Cx<'_>) {
        self.st.held = self.st.held.saturating_sub(1);
        self.sh.after(&mut self.st, cx);
    }

    fn take_message(&mut self, cx: &mut Cx<'_>, key: usize) -> Option<Message> {
        let ep = self.st.eps.get(key)?;
        if ep.detached {
            return None;
        }
        let msg = self.sh.pop_message(&mut self.st, cx, key)?;
        if let Some(ep) = self.st.eps.get_mut(key)
            && ep.has_message()
        {
            cx.mark_ready(&mut ep.wait);
        }
        Some(msg)
    }

    fn wait_slot(&mut self, key: usize) -> Option<&mut WaitSlot> {
        self.st.eps.get_mut(key).map(|ep| &mut ep.wait)
    }

    fn flush_batch(&mut self, _: &mut Cx<'_>) {
        if !self.st.packs.is_empty() {
            self.sh.flush_packs(&mut self.st);
        }
    }

    fn is_idle(&self) -> bool {
        self.st.eps.is_empty()
    }
}

fn on_async_event(sh: &Shared, st: &mut State, cx: &mut Cx<'_>, ev: AsyncEvent) {
    match ev {
        AsyncEvent::SrqLimitReached(_) => {
            sh.after(st, cx);
            let _ = sh.srq.arm_limit((sh.cfg.srq_depth / 4).max(1));
        }
        AsyncEvent::PathMigrated(qpn) => {
            // The queue pair an endpoint sends on (its RC QP, or a shared XRC initiator):
            // every endpoint on it moved. (A node's XRC target QPs migrate on their own;
            // the endpoints hear of it through their initiators.)
            let mut any = false;
            let mut rearm_due = Vec::new();
            for (k, ep) in st.eps.iter_mut().filter(|(_, e)| e.qpn == qpn.0) {
                ep.on_alt = !ep.on_alt;
                // The path left behind leaves from port 1 when we are now on the alternate.
                ep.rearm_port = Some(if ep.on_alt { 1 } else { 2 });
                rearm_due.push(k);
                tracing::info!(endpoint = ep.id, "path migrated");
                cx.push_event(Event::PathMigrated { endpoint: ep.id });
                any = true;
            }
            let at = cx.now() + sh.keepalive_tick();
            for k in rearm_due {
                st.arm(cx, k, Timer::Rearm, at);
            }
            if any {
                cx.wake_all();
            }
        }
        AsyncEvent::PortActive(port) => crate::engine::rearm(sh, st, cx, Some(port), None),
        AsyncEvent::SrqError(srq) if srq == sh.srq.handle() => {
            // Nothing can arrive any more: the receive queue every endpoint shares is gone
            // (for a node shared by processes, the process hosting its domain went away).
            tracing::warn!("the context's shared receive queue failed; every endpoint is down");
            let keys: Vec<usize> = st.eps.iter().map(|(k, _)| k).collect();
            for k in keys {
                sh.fail(
                    st,
                    cx,
                    k,
                    rdmx_core::DisconnectCause::TransportError(
                        "the context's shared receive queue failed (SrqError; on a node \
                         shared by processes, its domain's host went away)"
                            .into(),
                    ),
                );
            }
            cx.wake_all();
        }
        AsyncEvent::QpFatal(qpn)
        | AsyncEvent::QpAccessError(qpn)
        | AsyncEvent::QpRequestError(qpn) => {
            // The completion that says why (retries exhausted: the peer is unreachable)
            // came before the event: take it first, so that the endpoint goes down with
            // that cause rather than this generic one.
            if sh.progress(st, cx) > 0 {
                cx.wake_all();
            }
            if let Some(&k) = st.by_qpn.get(&qpn.0) {
                sh.fail(
                    st,
                    cx,
                    k,
                    rdmx_core::DisconnectCause::TransportError(format!("{ev:?}")),
                );
            }
        }
        other => tracing::debug!(event = ?other, "device event"),
    }
}
