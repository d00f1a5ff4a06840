//! [`Endpoint`]: one peer of a context, over whichever transport the context's configuration
//! picked. Every transport gives the same message contract (exactly once, in order,
//! flow-controlled); one-sided operations need RC or XRC, and a UD endpoint answers them with
//! `Error::Unsupported`.

use std::net::SocketAddr;
use std::time::Duration;

use rdmx_core::{Buf, DisconnectCause, Error, Message, Result, SharedBuf};
use rdmx_rc::{PendingOp, RemoteRegion};
use rdmx_verbs::SharedBytes;

/// An endpoint: messages to and from one peer (see the module docs).
///
/// A cheap handle: clones share the endpoint (threads may each hold one, no `Arc`
/// needed); it closes in the background when the last clone is dropped, or for all of
/// them when one calls [`close`](Self::close) or [`start_close`](Self::start_close).
#[derive(Debug, Clone)]
pub struct Endpoint(std::sync::Arc<Inner>);

#[derive(Debug)]
enum Inner {
    Rc(rdmx_rc::Endpoint),
    Ud(rdmx_ud::Endpoint),
}

impl From<rdmx_rc::Endpoint> for Endpoint {
    fn from(e: rdmx_rc::Endpoint) -> Self {
        Self(std::sync::Arc::new(Inner::Rc(e)))
    }
}

impl From<rdmx_ud::Endpoint> for Endpoint {
    fn from(e: rdmx_ud::Endpoint) -> Self {
        Self(std::sync::Arc::new(Inner::Ud(e)))
    }
}

/// Calls the same method on either transport's endpoint.
macro_rules! both {
    ($self:ident, $e:ident => $call:expr) => {
        match &*$self.0 {
            Inner::Rc($e) => $call,
            Inner::Ud($e) => $call,
        }
    };
}

/// What a UD endpoint answers to a one-sided operation.
fn one_sided_on_ud() -> Error {
    Error::Unsupported(
        "one-sided operations (RDMA write, read, atomics) need an RC or XRC endpoint; this \
         one is UD"
            .into(),
    )
}

impl Endpoint {
    /// The worker the endpoint runs on (its context's).
    pub fn worker(&self) -> &rdmx_core::worker::Worker {
        both!(self, e => e.worker())
    }

    /// The RC/XRC endpoint underneath, if it is one.
    pub fn as_rc(&self) -> Option<&rdmx_rc::Endpoint> {
        match &*self.0 {
            Inner::Rc(e) => Some(e),
            Inner::Ud(_) => None,
        }
    }

    /// The UD endpoint underneath, if it is one.
    pub fn as_ud(&self) -> Option<&rdmx_ud::Endpoint> {
        match &*self.0 {
            Inner::Ud(e) => Some(e),
            Inner::Rc(_) => None,
        }
    }

    /// The peer's address (its side channel's for RC, its device's for UD).
    pub fn peer_addr(&self) -> SocketAddr {
        both!(self, e => e.peer_addr())
    }

    /// The endpoint's id (in events and messages).
    pub fn id(&self) -> u64 {
        both!(self, e => e.id())
    }

    /// True while messages can be sent and received.
    pub fn is_connected(&self) -> bool {
        both!(self, e => e.is_connected())
    }

    /// Why the endpoint is down, if it is.
    pub fn disconnect_cause(&self) -> Option<DisconnectCause> {
        both!(self, e => e.disconnect_cause())
    }

    /// Sends a copy of `data`, waiting for room (credits, send slots).
    ///
    /// # Errors
    /// `MessageTooLarge`; `Disconnected` once the endpoint is closing or down.
    pub fn send(&self, data: &[u8]) -> Result<()> {
        both!(self, e => e.send(data))
    }

    /// [`send`](Self::send), waiting at most `timeout`.
    ///
    /// # Errors
    /// As `send`; `Timeout`.
    pub fn send_timeout(&self, data: &[u8], timeout: Duration) -> Result<()> {
        both!(self, e => e.send_timeout(data, timeout))
    }

    /// Sends a copy of `data` if there is room now.
    ///
    /// # Errors
    /// `WouldBlock` when there is none; else as `send`.
    pub fn try_send(&self, data: &[u8]) -> Result<()> {
        both!(self, e => e.try_send(data))
    }

    /// Sends a pooled buffer (RC: without a copy; UD: copied into its session).
    ///
    /// # Errors
    /// As `send`.
    pub fn send_buf(&self, buf: Buf) -> Result<()> {
        match &*self.0 {
            Inner::Rc(e) => e.send_buf(buf),
            Inner::Ud(e) => e.send(&buf),
        }
    }

    /// [`send_buf`](Self::send_buf), waiting at most `timeout`.
    ///
    /// # Errors
    /// As `send_buf`; `Timeout`.
    pub fn send_buf_timeout(&self, buf: Buf, timeout: Duration) -> Result<()> {
        match &*self.0 {
            Inner::Rc(e) => e.send_buf_timeout(buf, timeout),
            Inner::Ud(e) => e.send_timeout(&buf, timeout),
        }
    }

    /// Sends a buffer several sends share (RC: read in place by each peer when large, no
    /// copy; UD: copied into its session). See [`rdmx_rc::Endpoint::send_shared_buf`].
    ///
    /// # Errors
    /// As `send`.
    pub fn send_shared_buf(&self, buf: &SharedBuf) -> Result<()> {
        match &*self.0 {
            Inner::Rc(e) => e.send_shared_buf(buf),
            Inner::Ud(e) => e.send(buf),
        }
    }

    /// [`send_shared_buf`](Self::send_shared_buf), waiting at most `timeout`.
    ///
    /// # Errors
    /// As `send_shared_buf`; `Timeout`.
    pub fn send_shared_buf_timeout(&self, buf: &SharedBuf, timeout: Duration) -> Result<()> {
        match &*self.0 {
            Inner::Rc(e) => e.send_shared_buf_timeout(buf, timeout),
            Inner::Ud(e) => e.send_timeout(buf, timeout),
        }
    }

    /// Sends the slices of `parts` as one message without joining them first (RC: copied
    /// once into what carries it; UD: joined, then sent).
    ///
    /// # Errors
    /// As `send`.
    pub fn send_parts(&self, parts: &[&[u8]]) -> Result<()> {
        match &*self.0 {
            Inner::Rc(e) => e.send_parts(parts),
            Inner::Ud(e) => e.send(&parts.concat()),
        }
    }

    /// [`send_parts`](Self::send_parts), waiting at most `timeout`.
    ///
    /// # Errors
    /// As `send_parts`; `Timeout`.
    pub fn send_parts_timeout(&self, parts: &[&[u8]], timeout: Duration) -> Result<()> {
        match &*self.0 {
            Inner::Rc(e) => e.send_parts_timeout(parts, timeout),
            Inner::Ud(e) => e.send_timeout(&parts.concat(), timeout),
        }
    }

    /// Sends a pooled buffer if there is room now: `Ok(None)` sent, `Ok(Some(buf))` no room
    /// (the buffer handed back).
    ///
    /// # Errors
    /// As `send`.
    pub fn try_send_buf(&self, buf: Buf) -> Result<Option<Buf>> {
        match &*self.0 {
            Inner::Rc(e) => e.try_send_buf(buf),
            Inner::Ud(e) => match e.try_send(&buf) {
                Ok(()) => Ok(None),
                Err(Error::WouldBlock) => Ok(Some(buf)),
                Err(err) => Err(err),
            },
        }
    }

    /// Sends application memory (RC: zero-copy through the registration cache; UD: copied).
    ///
    /// # Errors
    /// As `send`.
    pub fn send_shared(&self, data: impl Into<SharedBytes>) -> Result<()> {
        match &*self.0 {
            Inner::Rc(e) => e.send_shared(data),
            Inner::Ud(e) => e.send(&data.into()),
        }
    }

    /// [`send_shared`](Self::send_shared), waiting at most `timeout`.
    ///
    /// # Errors
    /// As `send_shared`; `Timeout`.
    pub fn send_shared_timeout(
        &self,
        data: impl Into<SharedBytes>,
        timeout: Duration,
    ) -> Result<()> {
        match &*self.0 {
            Inner::Rc(e) => e.send_shared_timeout(data, timeout),
            Inner::Ud(e) => e.send_timeout(&data.into(), timeout),
        }
    }

    /// [`send_shared`](Self::send_shared) if there is room now.
    ///
    /// # Errors
    /// `WouldBlock`; else as `send_shared`.
    pub fn try_send_shared(&self, data: &SharedBytes) -> Result<()> {
        match &*self.0 {
            Inner::Rc(e) => e.try_send_shared(data),
            Inner::Ud(e) => e.try_send(data),
        }
    }

    /// The next message, waiting for it.
    ///
    /// # Errors
    /// `Disconnected` once the endpoint is down and every message before was taken.
    pub fn recv(&self) -> Result<Message> {
        both!(self, e => e.recv())
    }

    /// [`recv`](Self::recv), waiting at most `timeout`.
    ///
    /// # Errors
    /// As `recv`; `Timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Message> {
        both!(self, e => e.recv_timeout(timeout))
    }

    /// The next message already received, without making progress (no look at the device):
    /// for a loop that answers what came in and sends its answers before it looks again
    /// (a receive, even one that may not wait, polls the device first). `None` when no
    /// message is queued; messages that came before the endpoint went down are still
    /// given (a receive says why it is down once they are taken).
    pub fn try_take(&self) -> Option<Message> {
        both!(self, e => e.try_take())
    }

    /// The next message if one is there now.
    ///
    /// # Errors
    /// `WouldBlock` when none is; else as `recv`.
    pub fn try_recv(&self) -> Result<Message> {
        both!(self, e => e.try_recv())
    }

    /// Closes in order and waits (up to the peer timeout) for the peer to confirm.
    ///
    /// # Errors
    /// `Timeout` when the peer did not answer in time; `Disconnected` when the endpoint
    /// had gone down otherwise.
    pub fn close(&self) -> Result<()> {
        both!(self, e => e.close())
    }

    /// The connection data the peer sent with its connect or accept (empty if none: see
    /// [`Context::connect_with`](crate::Context::connect_with) and
    /// [`Listener::set_accept_data`](crate::Listener::set_accept_data)).
    pub fn peer_data(&self) -> std::sync::Arc<[u8]> {
        both!(self, e => e.peer_data())
    }

    /// Begins an orderly close and returns at once.
    pub fn start_close(&self) {
        both!(self, e => e.start_close());
    }

    /// Writes `data` into the peer's region (RC/XRC only).
    ///
    /// # Errors
    /// `Unsupported` on UD; else as [`rdmx_rc::Endpoint::write`].
    pub fn write(&self, remote: &RemoteRegion, offset: u64, data: &[u8]) -> Result<()> {
        self.rc_only()?.write(remote, offset, data)
    }

    /// Writes application memory into the peer's region, zero-copy (RC/XRC only).
    ///
    /// # Errors
    /// `Unsupported` on UD; else as [`rdmx_rc::Endpoint::write_shared`].
    pub fn write_shared(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        data: impl Into<SharedBytes>,
    ) -> Result<()> {
        self.rc_only()?.write_shared(remote, offset, data)
    }

    /// Reads `len` bytes of the peer's region (RC/XRC only).
    ///
    /// # Errors
    /// `Unsupported` on UD; else as [`rdmx_rc::Endpoint::read`].
    pub fn read(&self, remote: &RemoteRegion, offset: u64, len: usize) -> Result<Buf> {
        self.rc_only()?.read(remote, offset, len)
    }

    /// Compare-and-swap on a word of the peer's region (RC/XRC only).
    ///
    /// # Errors
    /// `Unsupported` on UD; else as [`rdmx_rc::Endpoint::compare_swap`].
    pub fn compare_swap(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64> {
        self.rc_only()?.compare_swap(remote, offset, compare, swap)
    }

    /// Fetch-and-add on a word of the peer's region (RC/XRC only).
    ///
    /// # Errors
    /// `Unsupported` on UD; else as [`rdmx_rc::Endpoint::fetch_add`].
    pub fn fetch_add(&self, remote: &RemoteRegion, offset: u64, add: u64) -> Result<u64> {
        self.rc_only()?.fetch_add(remote, offset, add)
    }

    /// The RC endpoint underneath, or `Unsupported` on UD.
    fn rc_only(&self) -> Result<&rdmx_rc::Endpoint> {
        match &*self.0 {
            Inner::Rc(e) => Ok(e),
            Inner::Ud(_) => Err(one_sided_on_ud()),
        }
    }

    /// [`write`](Self::write), waiting at most `timeout` (RC/XRC only).
    ///
    /// # Errors
    /// `Unsupported` on UD; else as [`rdmx_rc::Endpoint::write_timeout`].
    pub fn write_timeout(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        data: &[u8],
        timeout: Duration,
    ) -> Result<()> {
        self.rc_only()?.write_timeout(remote, offset, data, timeout)
    }

    /// [`read`](Self::read), waiting at most `timeout` (RC/XRC only).
    ///
    /// # Errors
    /// `Unsupported` on UD; else as [`rdmx_rc::Endpoint::read_timeout`].
    pub fn read_timeout(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        len: usize,
        timeout: Duration,
    ) -> Result<Buf> {
        self.rc_only()?.read_timeout(remote, offset, len, timeout)
    }

    /// [`compare_swap`](Self::compare_swap), waiting at most `timeout` (RC/XRC only).
    ///
    /// # Errors
    /// `Unsupported` on UD; else as [`rdmx_rc::Endpoint::compare_swap_timeout`].
    pub fn compare_swap_timeout(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        compare: u64,
        swap: u64,
        timeout: Duration,
    ) -> Result<u64> {
        self.rc_only()?
            .compare_swap_timeout(remote, offset, compare, swap, timeout)
    }

    /// [`fetch_add`](Self::fetch_add), waiting at most `timeout` (RC/XRC only).
    ///
    /// # Errors
    /// `Unsupported` on UD; else as [`rdmx_rc::Endpoint::fetch_add_timeout`].
    pub fn fetch_add_timeout(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        add: u64,
        timeout: Duration,
    ) -> Result<u64> {
        self.rc_only()?
            .fetch_add_timeout(remote, offset, add, timeout)
    }

    /// Starts a write and returns at once (RC/XRC only): a [`PendingOp`] to wait for,
    /// blocking, bounded or async.
    ///
    /// # Errors
    /// `Unsupported` on UD; else as [`rdmx_rc::Endpoint::start_write`].
    pub fn start_write(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        data: &[u8],
    ) -> Result<PendingOp<'_, ()>> {
        self.rc_only()?.start_write(remote, offset, data)
    }

    /// Starts a read and returns at once (RC/XRC only): many reads in flight from one
    /// thread.
    ///
    /// # Errors
    /// `Unsupported` on UD; else as [`rdmx_rc::Endpoint::start_read`].
    pub fn start_read(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        len: usize,
    ) -> Result<PendingOp<'_, Buf>> {
        self.rc_only()?.start_read(remote, offset, len)
    }

    /// Starts a compare-and-swap and returns at once (RC/XRC only).
    ///
    /// # Errors
    /// `Unsupported` on UD; else as [`rdmx_rc::Endpoint::start_compare_swap`].
    pub fn start_compare_swap(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        compare: u64,
        swap: u64,
    ) -> Result<PendingOp<'_, u64>> {
        self.rc_only()?
            .start_compare_swap(remote, offset, compare, swap)
    }

    /// Starts a fetch-and-add and returns at once (RC/XRC only).
    ///
    /// # Errors
    /// `Unsupported` on UD; else as [`rdmx_rc::Endpoint::start_fetch_add`].
    pub fn start_fetch_add(
        &self,
        remote: &RemoteRegion,
        offset: u64,
        add: u64,
    ) -> Result<PendingOp<'_, u64>> {
        self.rc_only()?.start_fetch_add(remote, offset, add)
    }

    /// Waits for the next message without blocking the thread.
    ///
    /// # Errors
    /// As [`recv`](Self::recv).
    #[cfg(feature = "tokio")]
    pub async fn recv_async(&self) -> Result<Message> {
        match &*self.0 {
            Inner::Rc(e) => e.recv_async().await,
            Inner::Ud(e) => e.recv_async().await,
        }
    }

    /// Sends a copy of `data` without blocking the thread.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    #[cfg(feature = "tokio")]
    pub async fn send_async(&self, data: &[u8]) -> Result<()> {
        match &*self.0 {
            Inner::Rc(e) => e.send_async(data).await,
            Inner::Ud(e) => e.send_async(data).await,
        }
    }

    /// Sends a pooled buffer without blocking the thread.
    ///
    /// # Errors
    /// As [`send_buf`](Self::send_buf).
    #[cfg(feature = "tokio")]
    pub async fn send_buf_async(&self, buf: Buf) -> Result<()> {
        match &*self.0 {
            Inner::Rc(e) => e.send_buf_async(buf).await,
            Inner::Ud(e) => e.send_async(&buf).await,
        }
    }

    /// Sends application memory without blocking the thread.
    ///
    /// # Errors
    /// As [`send_shared`](Self::send_shared).
    #[cfg(feature = "tokio")]
    pub async fn send_shared_async(&self, data: impl Into<SharedBytes>) -> Result<()> {
        match &*self.0 {
            Inner::Rc(e) => e.send_shared_async(data).await,
            Inner::Ud(e) => e.send_async(&data.into()).await,
        }
    }
}

rdmx_rpc::endpoint_link!(Endpoint, zero_copy);

/// A context is where the messages of its endpoints come from, for a server of many links
/// (`rdmx_rpc::Server::serve_set`): each message with its endpoint's id.
impl rdmx_rpc::SetRecv<Message> for crate::Context {
    fn recv_timeout(&self, timeout: Duration) -> Result<(u64, Message)> {
        Self::recv_timeout(self, timeout).map(|m| (m.endpoint(), m))
    }

    fn try_take(&self) -> Option<(u64, Message)> {
        Self::try_take(self).map(|m| (m.endpoint(), m))
    }
}
