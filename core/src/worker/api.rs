//! What a context offers whatever its transports: receiving from every endpoint, events,
//! pool buffers, counters. The contexts built on a worker (`rdmx_rc::Context`, the `rdmx`
//! facade's) hand these calls down.

use std::time::Duration;

use rdmx_verbs::NicCounters;

use super::wait::{Wait, wait_until};
use super::{Message, Worker};
use crate::pool::PoolStats;
use crate::{Buf, Error, Event, Result};

/// What [`Worker::recv_or_event`] gives: a message of any endpoint, or an event.
#[derive(Debug)]
pub enum Arrival {
    /// A message ([`Message::endpoint`] says whose).
    Message(Message),
    /// An event (a disconnect, a path migration, ...).
    Event(Event),
}

impl Worker {
    /// Waits for the next message of any endpoint or the next event, whichever comes
    /// first (events first when both are there: they are rare, and a server that is busy
    /// with messages still learns of a peer's end at once). One loop serves both, without
    /// polling for events between receives.
    ///
    /// # Errors
    /// None: it waits until there is one (the `Result` matches the other receive calls).
    pub fn recv_or_event(&self) -> Result<Arrival> {
        wait_until(self, Wait::ANY_MESSAGE, None, |ws| self.take_arrival(ws))
    }

    /// [`recv_or_event`](Self::recv_or_event) giving up after `timeout`.
    ///
    /// # Errors
    /// `Timeout` when neither came in time.
    pub fn recv_or_event_timeout(&self, timeout: Duration) -> Result<Arrival> {
        wait_until(self, Wait::ANY_MESSAGE, Some(timeout), |ws| {
            self.take_arrival(ws)
        })
    }

    /// [`recv_or_event`](Self::recv_or_event) without blocking the thread (feature
    /// `tokio`). A cancelled future leaves what it would have taken queued.
    ///
    /// # Errors
    /// As `recv_or_event`.
    #[cfg(feature = "tokio")]
    pub async fn recv_or_event_async(&self) -> Result<Arrival> {
        super::wait_async(self, |ws| self.take_arrival(ws)).await
    }

    /// The next event, without blocking the thread (feature `tokio`): woken when one is
    /// queued, so a program can `select!` on a peer's end. A cancelled future leaves the
    /// event queued.
    ///
    /// # Errors
    /// None: it waits until there is one.
    #[cfg(feature = "tokio")]
    pub async fn next_event_async(&self) -> Result<Event> {
        super::wait_async(self, |ws| ws.pop_event().map(Ok)).await
    }

    fn take_arrival(&self, ws: &mut super::WorkerState) -> Option<Result<Arrival>> {
        if let Some(ev) = ws.pop_event() {
            return Some(Ok(Arrival::Event(ev)));
        }
        self.take_any(ws).map(|m| Ok(Arrival::Message(m)))
    }

    /// Waits for the next message from any endpoint of any transport of the worker.
    /// Endpoints with messages waiting take turns (one message each, round robin); the
    /// messages of one endpoint arrive in order. [`Message::endpoint`] says which endpoint
    /// sent it.
    ///
    /// This never reports a disconnect: endpoints that go down show up as
    /// [`Event::Disconnected`] in [`poll_event`](Self::poll_event). A peer's orderly close
    /// is reported once the last message it sent before closing has been taken, so an
    /// application may drop the endpoint when the event comes. Messages of an endpoint whose
    /// handle was dropped are not delivered. It can be mixed with an endpoint's own receive:
    /// a message goes to whichever call takes it first.
    ///
    /// # Errors
    /// None: it waits until some endpoint has a message. (The `Result` matches the other
    /// receive calls; [`recv_timeout`](Self::recv_timeout) and
    /// [`try_recv`](Self::try_recv) do return errors.)
    pub fn recv(&self) -> Result<Message> {
        wait_until(self, Wait::ANY_MESSAGE, None, |ws| {
            self.take_any(ws).map(Ok)
        })
    }

    /// [`recv`](Self::recv) giving up after `timeout`.
    ///
    /// # Errors
    /// `Timeout` when no endpoint had a message in time.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Message> {
        wait_until(self, Wait::ANY_MESSAGE, Some(timeout), |ws| {
            self.take_any(ws).map(Ok)
        })
    }

    /// The next message of any endpoint already received, without making progress (no look
    /// at the device): for a loop that answers what came in and sends its answers before it
    /// looks again. `None` when none is queued.
    pub fn try_take(&self) -> Option<Message> {
        let mut ws = self.lock();
        self.take_any(&mut ws)
    }

    /// The next message of any endpoint if one is there now (after one round of
    /// progress).
    ///
    /// # Errors
    /// `WouldBlock` when no endpoint has a message.
    pub fn try_recv(&self) -> Result<Message> {
        let mut ws = self.lock();
        if let Some(m) = self.take_any(&mut ws) {
            return Ok(m);
        }
        if self.progress_locked(&mut ws) > 0 {
            self.wake_all();
        }
        self.take_any(&mut ws).ok_or(Error::WouldBlock)
    }

    /// Waits for the next message from any endpoint without blocking the thread (see
    /// [`recv`](Self::recv)). A cancelled future leaves the message queued for the next
    /// receive.
    ///
    /// # Errors
    /// As [`recv`](Self::recv).
    #[cfg(feature = "tokio")]
    pub async fn recv_async(&self) -> Result<Message> {
        super::wait_async(self, |ws| self.take_any(ws).map(Ok)).await
    }

    /// The next event (path migrations, disconnects), if any, after one round of progress.
    /// The worker keeps the latest [`MAX_EVENTS`](super::MAX_EVENTS) for an application
    /// that does not ask; older ones are dropped and counted
    /// ([`events_dropped`](Self::events_dropped)).
    pub fn poll_event(&self) -> Option<Event> {
        let mut ws = self.lock();
        self.progress_locked(&mut ws);
        ws.pop_event()
    }

    /// Waits up to `timeout` for the next event.
    pub fn wait_event(&self, timeout: Duration) -> Option<Event> {
        wait_until(self, Wait::WORKER, Some(timeout), |ws| {
            ws.pop_event().map(Ok)
        })
        .ok()
    }

    /// Events dropped because the application let [`MAX_EVENTS`](super::MAX_EVENTS) pile
    /// up without taking them.
    pub fn events_dropped(&self) -> u64 {
        self.lock().events_dropped()
    }

    /// A buffer from the registered pool, waiting (up to the connect timeout) while the pool
    /// is at its cap.
    ///
    /// # Errors
    /// `PoolCapacity` when `len` can never fit; `Timeout` when no buffer came back in time.
    pub fn alloc(&self, len: usize) -> Result<Buf> {
        let pool = self.pool();
        wait_until(
            self,
            Wait::WORKER,
            Some(self.config().connect_timeout),
            |_| match pool.try_alloc(len) {
                Err(Error::WouldBlock) => None,
                r => Some(r),
            },
        )
    }

    /// A buffer from the registered pool, or `WouldBlock` when the pool is at its cap.
    ///
    /// # Errors
    /// As [`BufferPool::try_alloc`](crate::BufferPool::try_alloc).
    pub fn try_alloc(&self, len: usize) -> Result<Buf> {
        self.pool().try_alloc(len)
    }

    /// Counters of the buffer pool.
    pub fn pool_stats(&self) -> PoolStats {
        self.pool().stats()
    }

    /// Counters of the device (RNR NAKs, retransmissions, ...).
    pub fn device_counters(&self) -> NicCounters {
        self.verbs_context().counters()
    }
}
