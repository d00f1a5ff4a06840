//! What RPC runs over: a [`Link`] is one endpoint's messages (whole, in order,
//! flow-controlled), whatever the transport. RC and XRC endpoints (`rdmx_rc::Endpoint`)
//! and UD endpoints (`rdmx_ud::Endpoint`) are links; the `rdmx` facade's `Endpoint` is one
//! too, and an application may bring its own (the tests use an in-memory pair).

use std::ops::Deref;
use std::time::Duration;

use parking_lot::RwLock;
use rdmx_core::{BufferPool, DisconnectCause, Error, Result};

use crate::payload::{Attach, Payload};
use crate::wire::{FrameError, Header};

/// One endpoint's messages, for RPC.
pub trait Link: Send + Sync + 'static {
    /// A received message (its bytes).
    type Frame: Deref<Target = [u8]> + Into<Payload> + Send + 'static;

    /// Sends `data` as one message, waiting up to `timeout` for room.
    ///
    /// # Errors
    /// The transport's: `Timeout`, `Disconnected`, `MessageTooLarge`.
    fn send_timeout(&self, data: &[u8], timeout: Duration) -> Result<()>;

    /// The next message, waiting up to `timeout`.
    ///
    /// # Errors
    /// `Timeout`; `Disconnected` once the peer is gone (or left) and nothing is left.
    fn recv_timeout(&self, timeout: Duration) -> Result<Self::Frame>;

    /// Starts an orderly close (what was sent still arrives).
    fn start_close(&self);

    /// Opens a send batch on this thread, if the link has them: until the guard drops,
    /// small messages sent may leave together, packed (see `Worker::batch`).
    fn batch(&self) -> Option<rdmx_core::worker::Batch<'_>> {
        None
    }

    /// Sends a payload as one message, without copying it where the transport can (the
    /// default copies).
    ///
    /// # Errors
    /// As [`send_timeout`](Self::send_timeout).
    fn send_attach_timeout(&self, payload: Attach, timeout: Duration) -> Result<()> {
        self.send_timeout(&payload, timeout)
    }

    /// The registered buffer pool that zero-copy payloads come from, if the link has one.
    fn pool(&self) -> Option<BufferPool> {
        None
    }

    /// The next message already received, without polling for more (`None`: none queued;
    /// the default has no such queue). A server answers what it took this way before it
    /// polls again, so that an answer does not wait for a poll that finds nothing.
    fn try_take(&self) -> Option<Self::Frame> {
        None
    }
}

/// A shared link (for a client that also uses the endpoint for something else, such as
/// one-sided reads).
impl<L: Link> Link for std::sync::Arc<L> {
    type Frame = L::Frame;

    fn send_timeout(&self, data: &[u8], timeout: Duration) -> Result<()> {
        (**self).send_timeout(data, timeout)
    }

    fn recv_timeout(&self, timeout: Duration) -> Result<Self::Frame> {
        (**self).recv_timeout(timeout)
    }

    fn start_close(&self) {
        (**self).start_close();
    }

    fn batch(&self) -> Option<rdmx_core::worker::Batch<'_>> {
        (**self).batch()
    }

    fn send_attach_timeout(&self, payload: Attach, timeout: Duration) -> Result<()> {
        (**self).send_attach_timeout(payload, timeout)
    }

    fn pool(&self) -> Option<BufferPool> {
        (**self).pool()
    }

    fn try_take(&self) -> Option<Self::Frame> {
        (**self).try_take()
    }
}

/// Implements [`Link`] for an endpoint type with rdmx's endpoint calls (`send_timeout`,
/// `recv_timeout` giving a `Message`, `start_close`, `worker`): the transports' endpoints
/// here, the facade's `rdmx::Endpoint` there. With `zero_copy`, the type also has
/// `send_buf_timeout` and `send_shared_timeout`, which payloads then go through.
#[macro_export]
macro_rules! endpoint_link {
    ($t:ty) => {
        $crate::endpoint_link!(@impl $t, copy);
    };
    ($t:ty, zero_copy) => {
        $crate::endpoint_link!(@impl $t, zero_copy);
    };
    (@send copy, $s:ident, $p:ident, $to:ident) => {
        Self::send_timeout($s, &$p, $to)
    };
    (@send zero_copy, $s:ident, $p:ident, $to:ident) => {
        match $p {
            $crate::Attach::Buf(b) => Self::send_buf_timeout($s, b, $to),
            $crate::Attach::Shared(s) => Self::send_shared_timeout($s, s, $to),
        }
    };
    (@impl $t:ty, $mode:ident) => {
        impl $crate::Link for $t {
            type Frame = $crate::__core::Message;

            fn send_timeout(
                &self,
                data: &[u8],
                timeout: ::std::time::Duration,
            ) -> $crate::__core::Result<()> {
                Self::send_timeout(self, data, timeout)
            }

            fn recv_timeout(
                &self,
                timeout: ::std::time::Duration,
            ) -> $crate::__core::Result<$crate::__core::Message> {
                Self::recv_timeout(self, timeout)
            }

            fn start_close(&self) {
                Self::start_close(self);
            }

            fn batch(&self) -> Option<$crate::__core::worker::Batch<'_>> {
                Some(self.worker().batch())
            }

            fn send_attach_timeout(
                &self,
                payload: $crate::Attach,
                timeout: ::std::time::Duration,
            ) -> $crate::__core::Result<()> {
                $crate::endpoint_link!(@send $mode, self, payload, timeout)
            }

            fn pool(&self) -> Option<$crate::__core::BufferPool> {
                Some(self.worker().pool().clone())
            }

            fn try_take(&self) -> Option<$crate::__core::Message> {
                Self::try_take(self)
            }
        }
    };
}

endpoint_link!(rdmx_rc::Endpoint, zero_copy);
endpoint_link!(rdmx_ud::Endpoint);

/// How long a reader waits for the payload its frame announced (it follows at once; a
/// large one takes its transfer's time).
const PAYLOAD_WAIT: Duration = Duration::from_secs(10);

/// A received frame, its header (or why it is not one) and the payload it announced.
pub(crate) struct Incoming<F> {
    pub(crate) frame: F,
    pub(crate) header: std::result::Result<Header, FrameError>,
    pub(crate) payload: Option<Payload>,
}

/// A link whose frames keep their payloads: a frame and its payload leave back to back
/// (nothing another thread sends through the `Conn` comes between), and the frame that
/// announces a payload is read with it.
pub(crate) struct Conn<L> {
    pub(crate) link: L,
    order: RwLock<()>,
}

impl<L: Link> Conn<L> {
    pub(crate) fn new(link: L) -> Self {
        Self {
            link,
            order: RwLock::new(()),
        }
    }

    /// Sends `frame`, then `payload` (if any) right behind it. A payload that cannot follow
    /// its frame (its send failed or timed out after the frame left) ends the link: the
    /// peer would take the next frame for it.
    pub(crate) fn send(
        &self,
        frame: &[u8],
        payload: Option<Attach>,
        timeout: Duration,
    ) -> Result<()> {
        let Some(p) = payload else {
            let _shared = self.order.read();
            return self.link.send_timeout(frame, timeout);
        };
        let _alone = self.order.write();
        self.link.send_timeout(frame, timeout)?;
        if let Err(e) = self.link.send_attach_timeout(p, timeout) {
            tracing::debug!("a payload could not follow its frame ({e}): the link ends");
            self.link.start_close();
            return Err(e);
        }
        Ok(())
    }

    /// The next frame (waiting up to `timeout`) with its payload. One reader at a time.
    ///
    /// # Errors
    /// The link's; a payload that does not come ends the link (`Disconnected`).
    pub(crate) fn recv(&self, timeout: Duration) -> Result<Incoming<L::Frame>> {
        let frame = self.link.recv_timeout(timeout)?;
        self.with_payload(frame)
    }

    /// The next frame already received (`Link::try_take`), with its payload (which it
    /// waits for, if announced).
    pub(crate) fn try_take(&self) -> Option<Result<Incoming<L::Frame>>> {
        self.link.try_take().map(|f| self.with_payload(f))
    }

    fn with_payload(&self, frame: L::Frame) -> Result<Incoming<L::Frame>> {
        let header = Header::parse(&frame).map(|(h, _)| h);
        let payload = match &header {
            Ok(h) if h.attached => match self.link.recv_timeout(PAYLOAD_WAIT) {
                Ok(p) => Some(p.into()),
                Err(Error::Timeout(_) | Error::WouldBlock) => {
                    self.link.start_close();
                    return Err(Error::Disconnected(DisconnectCause::Protocol(
                        "an RPC frame announced a payload that did not come".into(),
                    )));
                }
                Err(e) => return Err(e),
            },
            _ => None,
        };
        Ok(Incoming {
            frame,
            header,
            payload,
        })
    }
}

/// A pair of links in memory, for tests and for services inside one process: what one
/// side sends the other receives (unbounded; dropping a side disconnects the other).
pub mod mem {
    use std::time::Duration;

    use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, unbounded};
    use parking_lot::Mutex;
    use rdmx_core::{DisconnectCause, Error, Result};

    /// One side of an in-memory pair.
    #[derive(Debug)]
    pub struct MemLink {
        tx: Mutex<Option<Sender<Vec<u8>>>>,
        rx: Receiver<Vec<u8>>,
    }

    /// Two connected in-memory links.
    pub fn pair() -> (MemLink, MemLink) {
        let (a_tx, b_rx) = unbounded();
        let (b_tx, a_rx) = unbounded();
        (
            MemLink {
                tx: Mutex::new(Some(a_tx)),
                rx: a_rx,
            },
            MemLink {
                tx: Mutex::new(Some(b_tx)),
                rx: b_rx,
            },
        )
    }

    impl super::Link for MemLink {
        type Frame = Vec<u8>;

        fn send_timeout(&self, data: &[u8], _timeout: Duration) -> Result<()> {
            let tx = self.tx.lock();
            let Some(tx) = tx.as_ref() else {
                return Err(Error::Disconnected(DisconnectCause::LocalClose));
            };
            tx.send(data.to_vec())
                .map_err(|_| Error::Disconnected(DisconnectCause::PeerClosed))
        }

        fn recv_timeout(&self, timeout: Duration) -> Result<Vec<u8>> {
            match self.rx.recv_timeout(timeout) {
                Ok(m) => Ok(m),
                Err(RecvTimeoutError::Timeout) => Err(Error::Timeout(timeout)),
                Err(RecvTimeoutError::Disconnected) => {
                    Err(Error::Disconnected(DisconnectCause::PeerClosed))
                }
            }
        }

        fn start_close(&self) {
            self.tx.lock().take();
        }

        fn try_take(&self) -> Option<Vec<u8>> {
            self.rx.try_recv().ok()
        }
    }
}
