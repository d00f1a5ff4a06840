//! What RPC runs over: a [`Link`] is one endpoint's messages (whole, in order,
//! flow-controlled), whatever the transport. RC and XRC endpoints (`rdmx_rc::Endpoint`)
//! and UD endpoints (`rdmx_ud::Endpoint`) are links; the `rdmx` facade's `Endpoint` is one
//! too, and an application may bring its own (the tests use an in-memory pair).

use std::ops::Deref;
use std::time::Duration;

use rdmx_core::Result;

/// One endpoint's messages, for RPC.
pub trait Link: Send + Sync + 'static {
    /// A received message (its bytes).
    type Frame: Deref<Target = [u8]> + Send + 'static;

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
}

/// Implements [`Link`] for an endpoint type with rdmx's endpoint calls (`send_timeout`,
/// `recv_timeout` giving a `Message`, `start_close`, `worker`): the transports' endpoints
/// here, the facade's `rdmx::Endpoint` there.
#[macro_export]
macro_rules! endpoint_link {
    ($t:ty) => {
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
        }
    };
}

endpoint_link!(rdmx_rc::Endpoint);
endpoint_link!(rdmx_ud::Endpoint);

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
    }
}
