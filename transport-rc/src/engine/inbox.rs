//! Handing received messages to the application: from one endpoint
//! ([`Endpoint::recv`](crate::Endpoint::recv)) or
//! from whichever endpoint of a context has one (`Context::recv`, through the worker's
//! ready queue).
//!
//! A server with many endpoints should not need a thread, or a polling loop, per endpoint.
//! So the context keeps a ready queue: the endpoints whose inbox starts with a deliverable
//! message (an eager message, or a rendezvous message whose read has finished), each at
//! most once. `Context::recv` takes one message from the endpoint at the front and, when
//! that endpoint has another one ready, puts it back at the end: busy endpoints take turns,
//! and the messages of one endpoint still come out in the order they were sent.
//!
//! An orderly close is reported (`Event::Disconnected` with `PeerClosed`) only after the
//! last message the peer sent before closing has been taken, so a server that drops an
//! endpoint on that event loses none of its messages.
//!
//! Both ways of receiving can be mixed: a message goes to whichever call takes it first.
//! The queue is not cleaned when `Endpoint::recv` empties an inbox; a key is checked when it
//! is taken from the queue, and dropped there if its endpoint has nothing ready (or is
//! gone, or its handle was dropped). Every key was pushed for a message, so the queue never
//! holds more entries than messages arrived.

use std::sync::Arc;

use rdmx_core::worker::Cx;
use rdmx_core::{DisconnectCause, Event};

use rdmx_core::Message;
use rdmx_core::worker::Body;

use crate::ep::Inbound;
use crate::state::{Shared, State};
use rdmx_core::header::PackedEntries;

impl Shared {
    /// Takes the message at the front of endpoint `k`'s inbox if it is deliverable (not a
    /// rendezvous message still being read, not the end-of-stream marker).
    pub(crate) fn pop_message(&self, st: &mut State, cx: &mut Cx<'_>, k: usize) -> Option<Message> {
        let ep = st.eps.get_mut(k)?;
        if let Some(Inbound::Packed { frame, off, end }) = ep.inbox.front_mut() {
            // The next message of a packed frame: a view of the frame, no copy. The frame's
            // receive buffer goes back to the queue when its last message is dropped.
            let entry = PackedEntries::entry_at(frame.get(..*end)?, *off)?;
            let view = Arc::clone(frame);
            *off = entry.end;
            if entry.end >= *end
                && let Some(Inbound::Packed { frame, .. }) = ep.inbox.pop_front()
            {
                self.release_frame(st, frame);
            }
            return Some(self.delivered(st, cx, k, Body::Shared(view, entry)));
        }
        let payload = match ep.inbox.pop_front()? {
            Inbound::Msg { buf, off } => Body::Recv(buf, off),
            Inbound::Rndv {
                dest: Some(buf),
                done: true,
                ..
            } => Body::Owned(buf),
            other => {
                ep.inbox.push_front(other);
                return None;
            }
        };
        Some(self.delivered(st, cx, k, payload))
    }

    /// Counts a message taken from endpoint `k`'s inbox and wraps it for the application.
    fn delivered(&self, st: &mut State, cx: &mut Cx<'_>, k: usize, payload: Body) -> Message {
        let ep = &mut st.eps[k];
        ep.delivered += 1;
        let id = ep.id;
        if ep.close_event_due && !ep.has_pending_messages() {
            ep.close_event_due = false;
            let cause = ep.down_cause().unwrap_or(DisconnectCause::PeerClosed);
            cx.push_event(Event::Disconnected {
                endpoint: id,
                cause,
            });
        }
        st.stats.delivered += 1;
        if matches!(payload, Body::Owned(_)) {
            // A rendezvous message: its slot in the credit window opens again.
            ep.rndv_queued = ep.rndv_queued.saturating_sub(1);
            self.mark_needy(st, k);
        }
        cx.message(payload, id)
    }
}
