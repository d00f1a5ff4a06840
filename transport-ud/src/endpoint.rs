//! [`Endpoint`]: one peer of a UD transport, with the contract of an RC endpoint — exactly
//! once, in order, flow-controlled.

use std::net::SocketAddr;
use std::time::Duration;

use rdmx_core::worker::{Message, WorkerState, wait_until};
use rdmx_core::{DisconnectCause, Error, Result};

use crate::session::SendError;
use crate::state::{UdRef, disconnect_cause};

/// A UD endpoint: messages to and from one peer over the transport's datagram queue pair.
/// Dropping it closes it in order (what was sent still arrives) and lets its session go
/// once the peer has answered.
#[derive(Debug)]
pub struct Endpoint {
    pub(crate) u: UdRef,
    pub(crate) key: usize,
    pub(crate) id: u64,
    pub(crate) peer: SocketAddr,
    pub(crate) peer_data: std::sync::Arc<[u8]>,
}

impl Endpoint {
    /// The connection data the peer sent with its connect or accept (empty if none).
    pub fn peer_data(&self) -> std::sync::Arc<[u8]> {
        std::sync::Arc::clone(&self.peer_data)
    }

    /// The worker the endpoint runs on (for its send batches:
    /// [`Worker::batch`](rdmx_core::worker::Worker::batch)).
    pub fn worker(&self) -> &rdmx_core::worker::Worker {
        &self.u.w
    }

    /// The endpoint's id (in events and messages).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The peer's device address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Why the endpoint is down, once it is and its messages are all taken.
    pub fn disconnect_cause(&self) -> Option<DisconnectCause> {
        self.u.with(|_, st, _| {
            st.peer(self.key)
                .and_then(|p| p.session.cause())
                .map(disconnect_cause)
        })
    }

    /// True while messages can be sent.
    pub fn is_connected(&self) -> bool {
        self.u.with(|_, st, _| {
            st.peer(self.key)
                .is_some_and(|p| p.session.cause().is_none() && !p.session.is_closing())
        })
    }

    /// One attempt to send: `Ok(true)` sent (queued in the session), `Ok(false)` no room
    /// now.
    fn try_once(&self, data: &[u8]) -> Result<bool> {
        let mut ws = self.u.w.lock();
        self.try_on(&mut ws, data)
    }

    /// [`try_once`](Self::try_once), the worker's lock held.
    pub(crate) fn try_on(&self, ws: &mut WorkerState, data: &[u8]) -> Result<bool> {
        self.u.on(ws, |sh, st, cx| {
            let Some(p) = st.peer_mut(self.key) else {
                return Err(Error::Disconnected(DisconnectCause::LocalClose));
            };
            match p.session.send(data) {
                Ok(()) => {
                    st.mark_dirty(self.key);
                    let now = cx.now();
                    sh.after(st, cx, now);
                    Ok(true)
                }
                Err(SendError::WouldBlock) => Ok(false),
                Err(SendError::TooLarge { len, max }) => Err(Error::MessageTooLarge { len, max }),
                Err(SendError::Closed) => Err(Error::Disconnected(
                    p.session
                        .cause()
                        .map_or(DisconnectCause::LocalClose, disconnect_cause),
                )),
            }
        })
    }

    /// Sends a message, waiting while the send queue is full.
    ///
    /// # Errors
    /// `MessageTooLarge`; `Disconnected` once the endpoint is closing or down.
    pub fn send(&self, data: &[u8]) -> Result<()> {
        self.send_within(data, None)
    }

    /// [`send`](Self::send), waiting at most `timeout`.
    ///
    /// # Errors
    /// As `send`; `Timeout`.
    pub fn send_timeout(&self, data: &[u8], timeout: Duration) -> Result<()> {
        self.send_within(data, Some(timeout))
    }

    fn send_within(&self, data: &[u8], timeout: Option<Duration>) -> Result<()> {
        if self.try_once(data)? {
            return Ok(());
        }
        wait_until(
            &self.u.w,
            self.u.wait_endpoint(self.key),
            timeout,
            |ws| match self.try_on(ws, data) {
                Ok(true) => Some(Ok(())),
                Ok(false) => None,
                Err(e) => Some(Err(e)),
            },
        )
    }

    /// Sends a message if the send queue has room now.
    ///
    /// # Errors
    /// `WouldBlock` when it has none; else as `send`.
    pub fn try_send(&self, data: &[u8]) -> Result<()> {
        if self.try_once(data)? {
            Ok(())
        } else {
            Err(Error::WouldBlock)
        }
    }

    /// The next message, waiting for it.
    ///
    /// # Errors
    /// `Disconnected` once the endpoint is down and every message before was taken.
    pub fn recv(&self) -> Result<Message> {
        self.recv_within(None)
    }

    /// [`recv`](Self::recv), waiting at most `timeout`.
    ///
    /// # Errors
    /// As `recv`; `Timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Message> {
        self.recv_within(Some(timeout))
    }

    fn recv_within(&self, timeout: Option<Duration>) -> Result<Message> {
        wait_until(&self.u.w, self.u.wait_message(self.key), timeout, |ws| {
            self.u
                .on(ws, |sh, st, cx| sh.take_message(st, cx, self.key))
        })
    }

    /// The next message already received, without making progress (no look at the device):
    /// for a loop that answers what came in and sends its answers before it looks again
    /// (a receive, even one that may not wait, polls the device first). `None` when no
    /// message is queued; messages that came before the endpoint went down are still
    /// given (a receive says why it is down once they are taken).
    pub fn try_take(&self) -> Option<Message> {
        self.u
            .with(|sh, st, cx| sh.take_message(st, cx, self.key))
            .and_then(Result::ok)
    }

    /// The next message if one is there now.
    ///
    /// # Errors
    /// `WouldBlock` when none is; else as `recv`.
    pub fn try_recv(&self) -> Result<Message> {
        self.u.with(|sh, st, cx| {
            if let Some(r) = sh.take_message(st, cx, self.key) {
                return r;
            }
            // A thread that polls moves things along itself (as on RC endpoints).
            sh.progress(st, cx);
            sh.take_message(st, cx, self.key)
                .unwrap_or(Err(Error::WouldBlock))
        })
    }

    /// Begins an orderly close and returns at once: what was sent still arrives, then the
    /// peer is told; [`disconnect_cause`](Self::disconnect_cause) says when it is over.
    pub fn start_close(&self) {
        self.u.with(|sh, st, cx| {
            if let Some(p) = st.peer_mut(self.key) {
                p.session.close();
                st.mark_dirty(self.key);
                let now = cx.now();
                sh.after(st, cx, now);
            }
        });
    }

    /// Closes in order and waits (up to the peer timeout) for the peer to confirm.
    /// Messages still queued for this side can be received until then.
    ///
    /// # Errors
    /// `Timeout` when the peer did not answer in time; `Disconnected` with the cause when
    /// the endpoint had gone down otherwise.
    pub fn close(&self) -> Result<()> {
        self.start_close();
        let timeout = self.u.sh.cfg.peer_timeout + self.u.sh.session.max_rto;
        wait_until(
            &self.u.w,
            self.u.wait_endpoint(self.key),
            Some(timeout),
            |ws| {
                self.u.on(ws, |_, st, _| {
                    let p = st.peer(self.key)?;
                    if p.session.fin_acked() {
                        return Some(Ok(()));
                    }
                    p.session
                        .dead_cause()
                        .map(|c| Err(Error::Disconnected(disconnect_cause(c))))
                })
            },
        )
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.u.with(|sh, st, cx| {
            if let Some(p) = st.peer_mut(self.key) {
                p.detached = true;
                p.session.close();
                st.mark_dirty(self.key);
                let now = cx.now();
                sh.after(st, cx, now);
            }
        });
    }
}
