//! Async forms of the endpoint, context and listener calls (feature `tokio`).
//!
//! They wait with the worker's async wait (`rdmx_core::worker::wait_async`).
//!
//! Cancellation is safe: a future never owns memory the NIC may use. Until a send is posted
//! its bytes are only in the future; once posted, the buffer belongs to the endpoint's
//! tables and is released when the work completes, whatever happened to the future. A
//! cancelled `recv_async` leaves the message queued for the next receive.

use std::net::ToSocketAddrs;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdmx_core::worker::wait_async;
use rdmx_core::{Buf, Error, Message, Result, bootstrap};

use crate::endpoint::Endpoint;
use crate::engine::send::Payload;

impl Endpoint {
    /// Waits for the next message without blocking the thread.
    ///
    /// # Errors
    /// As [`recv`](Self::recv).
    pub async fn recv_async(&self) -> Result<Message> {
        wait_async(&self.rc.w, |ws| {
            self.rc.on(ws, |sh, st, cx| self.take_message(sh, st, cx))
        })
        .await
    }

    /// Sends a copy of `data`, waiting for a credit without blocking the thread.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub async fn send_async(&self, data: &[u8]) -> Result<()> {
        let mut slot = Some(Payload::Bytes(data));
        self.send_async_inner(&mut slot).await
    }

    /// Sends a pooled buffer (zero copy when large), waiting for a credit without blocking
    /// the thread. If the future is dropped before the buffer was posted, the buffer simply
    /// returns to the pool.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub async fn send_buf_async(&self, buf: Buf) -> Result<()> {
        let mut slot = Some(Payload::Buf(buf));
        self.send_async_inner(&mut slot).await
    }

    /// Sends application bytes (zero copy when large, see
    /// [`send_shared`](Self::send_shared)), waiting for a credit without blocking the
    /// thread. Dropping the future before the send was posted just drops its reference to
    /// the bytes; once posted, the endpoint keeps the bytes until the peer has read them.
    ///
    /// # Errors
    /// As [`send_shared`](Self::send_shared).
    pub async fn send_shared_async(&self, data: impl Into<rdmx_verbs::SharedBytes>) -> Result<()> {
        let mut slot = Some(Payload::Shared(data.into()));
        self.send_async_inner(&mut slot).await
    }

    async fn send_async_inner(&self, slot: &mut Option<Payload<'_>>) -> Result<()> {
        let key = self.key;
        // A send that does not go at once counts as one credit wait, as in `send`.
        let mut counted = false;
        wait_async(&self.rc.w, |ws| {
            self.rc.on(ws, |sh, st, cx| {
                let p = slot.take()?;
                match sh.try_send(st, cx, key, p) {
                    Ok(None) => Some(Ok(())),
                    Ok(Some(back)) => {
                        if !counted {
                            counted = true;
                            st.stats.credit_waits += 1;
                        }
                        *slot = Some(back);
                        None
                    }
                    Err(e) => Some(Err(e)),
                }
            })
        })
        .await
    }
}

impl crate::Context {
    /// Waits for the next message from any endpoint without blocking the thread (see
    /// [`Context::recv`](crate::Context::recv)). A cancelled future leaves the message
    /// queued for the next receive.
    ///
    /// # Errors
    /// As [`Context::recv`](crate::Context::recv).
    pub async fn recv_async(&self) -> Result<Message> {
        self.worker().recv_async().await
    }
}

/// How long one accept attempt of [`Listener::accept_async`](crate::Listener::accept_async)
/// waits before looking whether its future is still wanted.
const ACCEPT_SLICE: Duration = Duration::from_millis(50);

/// Sets the flag when dropped: the blocking half of a cancelled call stops.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

fn joined<T>(r: std::result::Result<Result<T>, tokio::task::JoinError>) -> Result<T> {
    r.unwrap_or_else(|e| {
        Err(Error::Protocol(format!(
            "connection set-up task failed: {e}"
        )))
    })
}

impl crate::Context {
    /// [`connect`](crate::Context::connect) without blocking the runtime: the exchange runs
    /// on tokio's blocking pool (it needs a multi-threaded runtime or one with blocking
    /// threads). Dropping the future does not stop an exchange already under way; the
    /// endpoint it makes is then closed at once.
    ///
    /// # Errors
    /// As `connect`.
    pub async fn connect_async(&self, addr: impl ToSocketAddrs) -> Result<Endpoint> {
        let addr = crate::util::resolve(addr)?;
        let ctx = self.clone();
        joined(tokio::task::spawn_blocking(move || ctx.connect(addr)).await)
    }
}

impl crate::Listener {
    /// [`accept`](crate::Listener::accept) without blocking the runtime. Until a peer
    /// connects, dropping the future stops the wait within 50 ms and accepts nothing; once
    /// a peer's connection was taken, the exchange finishes and the endpoint is closed at
    /// once. As with `accept_timeout`, do not accept on the same listener from another
    /// thread meanwhile.
    ///
    /// # Errors
    /// As `accept`.
    pub async fn accept_async(&self) -> Result<Endpoint> {
        let tcp = self.tcp.try_clone().map_err(|error| {
            Error::Bootstrap(bootstrap::BootstrapError::Io {
                op: "dup the listening socket",
                error,
            })
        })?;
        let rc = self.rc.rc.clone();
        let exchanges = Arc::clone(&self.exchanges);
        let cancelled = Arc::new(AtomicBool::new(false));
        let _cancel = CancelOnDrop(Arc::clone(&cancelled));
        let task = tokio::task::spawn_blocking(move || {
            loop {
                if cancelled.load(Ordering::Acquire) {
                    return Err(Error::Timeout(Duration::ZERO));
                }
                let until = Some(crate::util::host_now() + ACCEPT_SLICE);
                if let Some(ep) = crate::accept::accept_until(&rc, &tcp, &exchanges, until)? {
                    return Ok(ep);
                }
            }
        });
        joined(task.await)
    }
}
