//! The UD transport as the worker sees it ([`Ud`], which implements
//! `rdmx_core::worker::Transport`): its progress round, its session timers, and messages
//! for receives on the whole worker.

use std::time::Instant;

use rdmx_core::Buf;
use rdmx_core::worker::{Cx, Message, Transport, WaitSlot};
use rdmx_verbs::AsyncEvent;

use crate::state::Ud;

#[expect(
    unsafe_code,
    reason = "implementing `Transport` vouches for the posting rules below"
)]
// SAFETY: rdmx-ud names a pool buffer in a work request only once it has moved into the
// transport's tables, out of the application's reach: a receive buffer lives in
// `State::recv_slots` while posted (until its completion, success or flush), a send buffer
// in `State::send_slots` until its send's completion (every send is signaled). No buffer
// is offered to a peer for RDMA (UD has no one-sided operations), and no buffer the
// application holds is ever posted: messages reach it copied into buffers of their own. The
// key never leaves `Shared`.
unsafe impl Transport for Ud {
    fn arm(&self) {
        self.sh.cq.req_notify(false);
    }

    fn progress(&mut self, cx: &mut Cx<'_>) -> usize {
        self.sh.progress(&mut self.st, cx)
    }

    fn handle_event(&mut self, _cx: &mut Cx<'_>, ev: AsyncEvent) {
        tracing::debug!(event = ?ev, "device event (UD transport)");
    }

    fn next_timer(&self) -> Option<Instant> {
        self.st.timers.peek().map(|std::cmp::Reverse((t, _, _))| *t)
    }

    fn handle_timer(&mut self, cx: &mut Cx<'_>, now: Instant) {
        self.sh.handle_timers(&mut self.st, cx, now);
    }

    fn take_back(&mut self, _cx: &mut Cx<'_>, buf: Buf) {
        // (Messages own their buffers: nothing comes back. A buffer that did goes to the
        // pool.)
        drop(buf);
    }

    fn hand_over(&mut self, _cx: &mut Cx<'_>) {}

    fn take_message(&mut self, cx: &mut Cx<'_>, key: usize) -> Option<Message> {
        if self.st.peer(key).is_none_or(|p| p.detached) {
            return None;
        }
        let m = self.sh.take_message(&mut self.st, cx, key)?.ok()?;
        if let Some(p) = self.st.peer_mut(key)
            && p.session.has_message()
        {
            cx.mark_ready(&mut p.wait);
        }
        Some(m)
    }

    fn wait_slot(&mut self, key: usize) -> Option<&mut WaitSlot> {
        self.st.peer_mut(key).map(|p| &mut p.wait)
    }

    fn flush_batch(&mut self, _cx: &mut Cx<'_>) {}

    fn is_idle(&self) -> bool {
        self.st.peers.is_empty()
    }
}
