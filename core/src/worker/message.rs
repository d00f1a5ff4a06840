//! Received messages: a pooled buffer that goes back to its transport when dropped.

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{TransportId, Worker};
use crate::{Buf, Error};

/// Where a received message's bytes are.
#[derive(Debug)]
pub enum Body {
    /// A message in its receive buffer, from the offset on (the buffer goes back to the
    /// transport on drop).
    Recv(Buf, usize),
    /// A message read into a pool buffer of its own (rendezvous): dropped with the message.
    Owned(Buf),
    /// One message of a frame that holds several (a view of the frame's receive buffer,
    /// which goes back to the transport when its last message is dropped).
    Shared(Arc<Buf>, Range<usize>),
}

/// A received message: a pooled buffer (the payload is what it dereferences to). Messages
/// that arrived in a receive buffer occupy it, and the small messages of a packed frame
/// share the frame's: it goes back to the receive queue when the message (for a frame, its
/// last message) is dropped — keep messages briefly, or copy them out
/// ([`into_buf`](Self::into_buf)). Rendezvous messages own a pool buffer.
pub struct Message {
    /// `None` once given away (`into_buf`) or released (drop).
    payload: Option<Body>,
    endpoint: u64,
    worker: Worker,
    tid: TransportId,
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("endpoint", &self.endpoint)
            .field("len", &self.len())
            .finish()
    }
}

impl Deref for Message {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.payload {
            Some(Body::Recv(b, off)) => b.get(*off..).unwrap_or_default(),
            Some(Body::Owned(b)) => b,
            Some(Body::Shared(frame, range)) => frame.get(range.clone()).unwrap_or_default(),
            None => &[],
        }
    }
}

impl Message {
    pub(super) fn new(payload: Body, endpoint: u64, worker: Worker, tid: TransportId) -> Self {
        worker.shared.messages.fetch_add(1, Ordering::AcqRel);
        Self {
            payload: Some(payload),
            endpoint,
            worker,
            tid,
        }
    }

    /// The endpoint it came from (its `Endpoint::id`).
    pub fn endpoint(&self) -> u64 {
        self.endpoint
    }

    /// True for a message that arrived by rendezvous (it owns a pool buffer of its own).
    pub fn is_rendezvous(&self) -> bool {
        matches!(self.payload, Some(Body::Owned(_)))
    }

    /// The payload as a buffer several sends may share ([`SharedBuf`](crate::SharedBuf)): forwarded to
    /// several endpoints, a rendezvous message is read by each peer from where it arrived,
    /// with no copy (see [`into_buf`](Self::into_buf) for which messages are copied once).
    ///
    /// # Errors
    /// As `into_buf`, with the message handed back.
    pub fn into_shared(self) -> Result<crate::SharedBuf, Box<IntoBufError>> {
        self.into_buf().map(crate::SharedBuf::from)
    }

    /// The payload as an owned buffer. For a rendezvous message this is the buffer itself
    /// (no copy); an eager or packed message is copied, so that its receive buffer can go
    /// back at once.
    ///
    /// Holding a message holds its receive buffer (for a packed message, the whole frame
    /// it came in), and the receive queue refills only while the application holds less
    /// than a queue's worth: an application that keeps messages for long should keep them
    /// as `into_buf` copies.
    ///
    /// When the pool has no room for the copy, the receive buffer itself is handed over,
    /// the payload moved to its front (for a packed message, once no other message of its
    /// frame is alive): it then no longer counts as held, and the receive queue gets a new
    /// buffer once the pool has room.
    ///
    /// # Errors
    /// With the message handed back (nothing is lost): the pool has no room for the copy
    /// of a packed message whose frame other live messages share (`WouldBlock`), or
    /// allocating failed otherwise.
    pub fn into_buf(mut self) -> Result<Buf, Box<IntoBufError>> {
        if let Some(Body::Owned(b)) = self.payload.take_if(|p| matches!(p, Body::Owned(_))) {
            return Ok(b);
        }
        match self.worker.pool().try_alloc_from(&self[..]) {
            Ok(b) => return Ok(b),
            Err(Error::WouldBlock) => {}
            Err(error) => {
                return Err(Box::new(IntoBufError {
                    error,
                    message: self,
                }));
            }
        }
        let len = self.len();
        let (mut buf, off) = match self.payload.take() {
            Some(Body::Recv(buf, off)) => (buf, off),
            Some(Body::Shared(frame, range)) => match Arc::try_unwrap(frame) {
                Ok(buf) => (buf, range.start),
                Err(frame) => {
                    self.payload = Some(Body::Shared(frame, range));
                    return Err(Box::new(IntoBufError {
                        error: Error::WouldBlock,
                        message: self,
                    }));
                }
            },
            other => {
                self.payload = other;
                return Err(Box::new(IntoBufError {
                    error: Error::WouldBlock,
                    message: self,
                }));
            }
        };
        buf.copy_within(off..off + len, 0);
        // (Cannot fail: `len` is within the buffer.)
        let _ = buf.set_len(len);
        let w = &self.worker;
        w.lock().on(w, self.tid, |t, cx| t.hand_over(cx));
        Ok(buf)
    }
}

impl Drop for Message {
    fn drop(&mut self) {
        let buf = match self.payload.take() {
            None | Some(Body::Owned(_)) => None,
            Some(Body::Recv(buf, _)) => Some(buf),
            // Not the frame's last reference: nothing to give back, no lock to take.
            Some(Body::Shared(frame, _)) => Arc::into_inner(frame),
        };
        if let Some(buf) = buf {
            let w = &self.worker;
            w.lock().on(w, self.tid, |t, cx| t.take_back(cx, buf));
            w.wake_all();
        }
        self.worker.shared.messages.fetch_sub(1, Ordering::AcqRel);
    }
}

/// [`Message::into_buf`] failed: why, and the message, handed back untouched. The box
/// converts into [`Error`] (dropping the message) for use with `?`.
#[derive(Debug)]
pub struct IntoBufError {
    /// Why.
    pub error: Error,
    /// The message, still valid.
    pub message: Message,
}

impl fmt::Display for IntoBufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no buffer for the message: {}", self.error)
    }
}

impl std::error::Error for IntoBufError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<Box<IntoBufError>> for Error {
    fn from(e: Box<IntoBufError>) -> Self {
        e.error
    }
}
