//! Async forms of the UD endpoint calls (feature `tokio`), waiting with the worker's async
//! wait (`rdmx_core::worker::wait_async`). Cancellation is safe: a future holds no memory the
//! NIC may use (a send copies the message into its session when it is accepted), and a
//! cancelled `recv_async` leaves the message queued.

use rdmx_core::worker::{Message, wait_async};
use rdmx_core::{Error, Result};

use crate::endpoint::Endpoint;

impl Endpoint {
    /// Waits for the next message without blocking the thread.
    ///
    /// # Errors
    /// As [`recv`](Self::recv).
    pub async fn recv_async(&self) -> Result<Message> {
        wait_async(&self.u.w, |ws| {
            self.u
                .on(ws, |sh, st, cx| sh.take_message(st, cx, self.key))
        })
        .await
    }

    /// Sends a message, waiting for room without blocking the thread.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub async fn send_async(&self, data: &[u8]) -> Result<()> {
        wait_async(&self.u.w, |ws| match self.try_on(ws, data) {
            Ok(true) => Some(Ok(())),
            Ok(false) => None,
            Err(e) => Some(Err::<(), Error>(e)),
        })
        .await
    }
}
