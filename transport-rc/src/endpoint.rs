//! The application's handles: [`Endpoint`], [`Message`], and the one-sided regions
//! [`LocalRegion`] / [`RemoteRegion`].

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use rdmx_core::worker::Cx;
use rdmx_core::{Buf, DisconnectCause, Error, Result, SharedBuf};
use rdmx_verbs::{MemoryRegion, SharedBytes};

use rdmx_core::Message;
use rdmx_core::worker::wait_until;

use crate::engine::send::Payload;
use crate::ep::{Inbound, Status};
use crate::state::{RcRef, Shared, State};
use crate::timers::Timer;

/// A connection to one peer: ordered, exactly-once, flow-controlled messages, plus one-sided
/// access to regions the peer registered. `Send + Sync`; several threads may use it.
///
/// Dropping it closes the endpoint in the background (messages already sent are still
/// delivered); [`close`](Self::close) does the same and waits for the peer.
pub struct Endpoint {
    pub(crate) rc: RcRef,
    pub(crate) key: usize,
    id: u64,
    peer: SocketAddr,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("id", &self.id)
            .field("peer", &self.peer)
            .finish()
    }
}

impl Endpoint {
    pub(crate) fn new(rc: RcRef, key: usize, id: u64, peer: SocketAddr) -> Self {
        Self { rc, key, id, peer }
    }

    /// The peer's address on the bootstrap side channel: the address we connected to, or,
    /// for an accepted endpoint, where the peer's connection came from.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The worker the endpoint runs on (for its send batches:
    /// [`Worker::batch`](rdmx_core::worker::Worker::batch)).
    pub fn worker(&self) -> &rdmx_core::worker::Worker {
        &self.rc.w
    }

    /// The connection data the peer sent with its connect or accept (empty if none: see
    /// [`RcTransport::connect_with`](crate::RcTransport::connect_with) and
    /// [`Listener::set_accept_data`](crate::Listener::set_accept_data)).
    pub fn peer_data(&self) -> std::sync::Arc<[u8]> {
        self.rc
            .with(|_, st, _| st.eps.get(self.key).map(|ep| ep.peer_data.clone()))
            .unwrap_or_else(|| std::sync::Arc::from(&[][..]))
    }

    /// The endpoint's identifier (unique within its context; also in [`Message::endpoint`]
    /// and in events).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// True while messages can be sent and received.
    pub fn is_connected(&self) -> bool {
        self.rc.with(|_, st, _| {
            st.eps
                .get(self.key)
                .is_some_and(|e| e.status == Status::Open)
        })
    }

    /// Why the endpoint is down, if it is. Once `recv` has reported the peer's orderly
    /// close (every message before it taken), this says `PeerClosed` too, even while our
    /// answering Close is still on its way.
    pub fn disconnect_cause(&self) -> Option<DisconnectCause> {
        self.rc.with(|_, st, _| {
            let ep = st.eps.get(self.key)?;
            ep.down_cause().or_else(|| {
                matches!(ep.inbox.front(), Some(Inbound::Closed))
                    .then_some(DisconnectCause::PeerClosed)
            })
        })
    }

    // ------------------------------------------------------------------ sending

    fn send_payload(&self, p: Payload<'_>, timeout: Option<Duration>, block: bool) -> Result<()> {
        let first = self.rc.with(|sh, st, cx| -> Result<Option<Payload<'_>>> {
            let Some(back) = sh.try_send(st, cx, self.key, p)? else {
                return Ok(None);
            };
            st.stats.credit_waits += 1;
            if block {
                return Ok(Some(back));
            }
            sh.progress(st, cx);
            // Progress may have brought a credit.
            match sh.try_send(st, cx, self.key, back)? {
                None => Ok(None),
                Some(_) => Err(Error::WouldBlock),
            }
        })?;
        let Some(p) = first else {
            return Ok(());
        };
        let mut slot = Some(p);
        wait_until(&self.rc.w, self.rc.wait_endpoint(self.key), timeout, |ws| {
            self.rc.on(ws, |sh, st, cx| {
                let p = slot.take()?;
                match sh.try_send(st, cx, self.key, p) {
                    Ok(None) => Some(Ok(())),
                    Ok(Some(back)) => {
                        slot = Some(back);
                        None
                    }
                    Err(e) => Some(Err(e)),
                }
            })
        })
    }

    /// Sends a copy of `data`, waiting for a credit (and a pool buffer) if needed. The
    /// protocol follows the size: inline, eager, or rendezvous. A rendezvous message also
    /// waits while [`Config::rndv_window`](rdmx_core::Config::rndv_window) earlier ones
    /// await the peer's read.
    ///
    /// # Errors
    /// `Disconnected` when the endpoint is down, `MessageTooLarge` above the maximum.
    pub fn send(&self, data: &[u8]) -> Result<()> {
        self.send_payload(Payload::Bytes(data), None, true)
    }

    /// [`send`](Self::send) giving up after `timeout` with `Timeout`.
    ///
    /// # Errors
    /// As `send`, plus `Timeout`.
    pub fn send_timeout(&self, data: &[u8], timeout: Duration) -> Result<()> {
        self.send_payload(Payload::Bytes(data), Some(timeout), true)
    }

    /// Sends `data` only if a credit is available now.
    ///
    /// # Errors
    /// `WouldBlock` when out of credits (or pool buffers, or room in the rendezvous
    /// window), else as `send`.
    pub fn try_send(&self, data: &[u8]) -> Result<()> {
        self.send_payload(Payload::Bytes(data), None, false)
    }

    /// Sends a pooled buffer without copying it when it is large (rendezvous: the peer reads
    /// it straight from this buffer, which returns to the pool once the peer reports the
    /// read done). Small buffers are sent inline or eagerly like `send`.
    ///
    /// # Errors
    /// As `send`.
    pub fn send_buf(&self, buf: Buf) -> Result<()> {
        self.send_payload(Payload::Buf(buf), None, true)
    }

    /// [`send_buf`](Self::send_buf) giving up after `timeout` (the buffer is dropped).
    ///
    /// # Errors
    /// As `send`, plus `Timeout`.
    pub fn send_buf_timeout(&self, buf: Buf, timeout: Duration) -> Result<()> {
        self.send_payload(Payload::Buf(buf), Some(timeout), true)
    }

    /// Sends a pooled buffer only if a credit is available now. `Ok(None)`: sent;
    /// `Ok(Some(buf))`: it would block, and the buffer is handed back untouched.
    ///
    /// # Errors
    /// As `send` (the buffer is dropped then).
    pub fn try_send_buf(&self, buf: Buf) -> Result<Option<Buf>> {
        self.rc.with(|sh, st, cx| {
            let back = match sh.try_send(st, cx, self.key, Payload::Buf(buf))? {
                None => return Ok(None),
                Some(p) => {
                    st.stats.credit_waits += 1;
                    sh.progress(st, cx);
                    sh.try_send(st, cx, self.key, p)?
                }
            };
            Ok(match back {
                Some(Payload::Buf(b)) => Some(b),
                _ => None,
            })
        })
    }

    /// Sends application bytes without copying them when the message is large enough for
    /// rendezvous (at least `Config::rndv_threshold`): the peer RDMA-reads them where they
    /// are, through a registration from the context's registration cache, and the endpoint
    /// keeps a reference to the bytes until the peer reports the read done. Sending the same
    /// buffer (or parts of it) again reuses the registration. Smaller messages are copied
    /// (inline or eager), which is faster than registering at those sizes.
    ///
    /// `data` is an `Arc<[u8]>`, an `Arc<Vec<u8>>`, a `Vec<u8>` (taken over without copying)
    /// or `&'static [u8]`, or a [`SharedBytes`] view of one; the bytes are immutable while
    /// shared, so the message is exactly what was passed.
    ///
    /// # Errors
    /// As `send`; `Verbs` when the bytes cannot be registered.
    pub fn send_shared(&self, data: impl Into<SharedBytes>) -> Result<()> {
        self.send_payload(Payload::Shared(data.into()), None, true)
    }

    /// [`send_shared`](Self::send_shared) giving up after `timeout` with `Timeout`.
    ///
    /// # Errors
    /// As `send_shared`, plus `Timeout`.
    pub fn send_shared_timeout(
        &self,
        data: impl Into<SharedBytes>,
        timeout: Duration,
    ) -> Result<()> {
        self.send_payload(Payload::Shared(data.into()), Some(timeout), true)
    }

    /// [`send_shared`](Self::send_shared) only if a credit is available now (cloning a
    /// `SharedBytes` to retry is cheap).
    ///
    /// # Errors
    /// `WouldBlock` when out of credits (or room in the rendezvous window), else as
    /// `send_shared`.
    pub fn try_send_shared(&self, data: &SharedBytes) -> Result<()> {
        self.send_payload(Payload::Shared(data.clone()), None, false)
    }

    /// Sends a buffer several sends share ([`SharedBuf`]: a pooled buffer or a received
    /// message made shareable) without copying it when it is large: each peer reads it
    /// where it is, and the buffer goes back to the pool once the last send is done and
    /// the last clone dropped. Send the same `SharedBuf` on several endpoints to fan a
    /// message out with no copy. Small buffers are copied as `send` copies.
    ///
    /// # Errors
    /// As `send`.
    pub fn send_shared_buf(&self, buf: &SharedBuf) -> Result<()> {
        self.send_payload(Payload::SharedBuf(buf.clone()), None, true)
    }

    /// [`send_shared_buf`](Self::send_shared_buf) giving up after `timeout`.
    ///
    /// # Errors
    /// As `send`, plus `Timeout`.
    pub fn send_shared_buf_timeout(&self, buf: &SharedBuf, timeout: Duration) -> Result<()> {
        self.send_payload(Payload::SharedBuf(buf.clone()), Some(timeout), true)
    }

    /// Sends the slices of `parts` as one message (a header and a payload, say) without
    /// joining them first: they are copied once, straight into what carries the message.
    ///
    /// # Errors
    /// As `send`.
    pub fn send_parts(&self, parts: &[&[u8]]) -> Result<()> {
        self.send_payload(Payload::Parts(parts), None, true)
    }

    /// [`send_parts`](Self::send_parts) giving up after `timeout`.
    ///
    /// # Errors
    /// As `send`, plus `Timeout`.
    pub fn send_parts_timeout(&self, parts: &[&[u8]], timeout: Duration) -> Result<()> {
        self.send_payload(Payload::Parts(parts), Some(timeout), true)
    }

    // ------------------------------------------------------------------ receiving

    pub(crate) fn take_message(
        &self,
        sh: &Shared,
        st: &mut State,
        cx: &mut Cx<'_>,
    ) -> Option<Result<Message>> {
        if let Some(m) = sh.pop_message(st, cx, self.key) {
            return Some(Ok(m));
        }
        let Some(ep) = st.eps.get(self.key) else {
            return Some(Err(Error::Disconnected(DisconnectCause::LocalClose)));
        };
        if matches!(ep.inbox.front(), Some(Inbound::Closed)) {
            return Some(Err(Error::Disconnected(
                ep.down_cause().unwrap_or(DisconnectCause::PeerClosed),
            )));
        }
        if let Some(c) = ep.down_cause() {
            return Some(Err(Error::Disconnected(c)));
        }
        None
    }

    /// Waits for the next message from the peer.
    ///
    /// # Errors
    /// `Disconnected` once the peer closed (after every message it sent was received) or
    /// the endpoint failed.
    pub fn recv(&self) -> Result<Message> {
        wait_until(&self.rc.w, self.rc.wait_message(self.key), None, |ws| {
            self.rc.on(ws, |sh, st, cx| self.take_message(sh, st, cx))
        })
    }

    /// [`recv`](Self::recv) giving up after `timeout`.
    ///
    /// # Errors
    /// As `recv`, plus `Timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Message> {
        wait_until(
            &self.rc.w,
            self.rc.wait_message(self.key),
            Some(timeout),
            |ws| self.rc.on(ws, |sh, st, cx| self.take_message(sh, st, cx)),
        )
    }

    /// The next message already received, without making progress (no look at the device):
    /// for a loop that answers what came in and sends its answers before it looks again
    /// (a receive, even one that may not wait, polls the device first). `None` when no
    /// message is queued; messages that came before the endpoint went down are still
    /// given (a receive says why it is down once they are taken).
    pub fn try_take(&self) -> Option<Message> {
        self.rc
            .with(|sh, st, cx| self.take_message(sh, st, cx))
            .and_then(Result::ok)
    }

    /// The next message if one is there now.
    ///
    /// # Errors
    /// `WouldBlock` when nothing has arrived, else as `recv`.
    pub fn try_recv(&self) -> Result<Message> {
        self.rc.with(|sh, st, cx| {
            if let Some(r) = self.take_message(sh, st, cx) {
                return r;
            }
            sh.progress(st, cx);
            self.take_message(sh, st, cx)
                .unwrap_or(Err(Error::WouldBlock))
        })
    }

    // ------------------------------------------------------------------ closing

    /// Closes the endpoint gracefully: stops sending, lets what is in flight arrive, tells
    /// the peer, and waits (up to the peer timeout) for the peer to acknowledge. Messages
    /// still queued for this side can be received until then.
    ///
    /// # Errors
    /// `Timeout` when the peer did not answer in time (the endpoint is down anyway);
    /// `Disconnected` with the cause when the endpoint had already gone down otherwise than
    /// by an orderly close (a dead peer, say: nothing could be drained). Closing an endpoint
    /// that is already closed in order succeeds.
    pub fn close(&self) -> Result<()> {
        let timeout = self.rc.sh.cfg.peer_timeout;
        self.begin_close(Closer::Waits);
        let r = wait_until(
            &self.rc.w,
            self.rc.wait_message(self.key),
            Some(timeout),
            |ws| {
                self.rc.on(ws, |_, st, _| match st.eps.get(self.key) {
                    None => Some(Ok(())),
                    Some(ep) => ep.down_cause().map(|c| match c {
                        DisconnectCause::PeerClosed | DisconnectCause::LocalClose => Ok(()),
                        other => Err(Error::Disconnected(other)),
                    }),
                })
            },
        );
        if matches!(r, Err(Error::Timeout(_))) {
            self.rc
                .with(|sh, st, cx| sh.fail(st, cx, self.key, DisconnectCause::LocalClose));
        }
        r
    }

    /// Begins closing the endpoint as [`close`](Self::close) does, and returns at once: the
    /// endpoint stops sending, drains, tells the peer and goes down (with `LocalClose`, or
    /// `PeerClosed` if the peer closed first) as the worker makes progress; a peer that does
    /// not answer within the peer timeout takes it down all the same.
    /// [`is_connected`](Self::is_connected) and [`disconnect_cause`](Self::disconnect_cause)
    /// say where it is. For code that never blocks (an event loop, a simulation).
    pub fn start_close(&self) {
        self.begin_close(Closer::Returns);
    }

    /// Marks the endpoint closing from this side (and, for a dropped handle, detached), with
    /// a deadline of one peer timeout. A caller that waits for the close ([`close`](Self::close)) ends
    /// its wait at that deadline itself (and reports `Timeout`): the endpoint's own deadline
    /// then comes a tick later, for the case where the waiting thread went away.
    fn begin_close(&self, closer: Closer) {
        let detach = closer == Closer::Drops;
        let mut timeout = self.rc.sh.cfg.peer_timeout;
        if closer == Closer::Waits {
            timeout += self.rc.sh.keepalive_tick();
        }
        self.rc.with(|sh, st, cx| {
            if let Some(ep) = st.eps.get_mut(self.key) {
                ep.detached |= detach;
                if ep.status == Status::Open {
                    ep.status = Status::Closing;
                    ep.closed_here = true;
                }
                let at = cx.now() + timeout;
                st.arm_once(cx, self.key, Timer::CloseDeadline, at);
            }
            st.reap_pending = true;
            sh.after(st, cx);
        });
    }
}

/// Who closes an endpoint, for [`Endpoint::begin_close`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closer {
    /// `close`, which waits for the close to finish.
    Waits,
    /// `start_close`, which returns at once.
    Returns,
    /// The handle's drop.
    Drops,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.begin_close(Closer::Drops);
    }
}

// ---------------------------------------------------------------------- regions

/// What peers may do to a [`LocalRegion`] with one-sided operations. Anything else is a
/// remote access error at the peer (its endpoint fails), and the region is untouched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteAccess {
    /// RDMA READ only: what a table that peers look up one-sidedly needs (the KV demo's).
    Read,
    /// READ and WRITE.
    ReadWrite,
    /// READ, WRITE and the atomics (`compare_swap`, `fetch_add`).
    All,
}

impl RemoteAccess {
    /// The verbs access flags of a registration that allows this (and local writes).
    pub(crate) fn flags(self) -> rdmx_verbs::AccessFlags {
        use rdmx_verbs::AccessFlags as A;
        match self {
            Self::Read => A::LOCAL_WRITE | A::REMOTE_READ,
            Self::ReadWrite => A::LOCAL_WRITE | A::REMOTE_READ | A::REMOTE_WRITE,
            Self::All => A::LOCAL_WRITE | A::REMOTE_READ | A::REMOTE_WRITE | A::REMOTE_ATOMIC,
        }
    }
}

/// Memory this side registers for peers to access with one-sided operations: every peer
/// given its [`remote`](Self::remote) description may do what its [`RemoteAccess`] allows,
/// anywhere in it, until it is dropped.
#[derive(Debug)]
pub struct LocalRegion {
    pub(crate) mr: MemoryRegion,
}

/// What a peer needs to access a [`LocalRegion`]: send it as a message
/// ([`to_bytes`](Self::to_bytes)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteRegion {
    /// Address of the first byte.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key.
    pub rkey: u32,
}

impl RemoteRegion {
    /// Encoded length.
    pub const LEN: usize = 20;

    /// The 20-byte encoding (big-endian address, length, key).
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..16].copy_from_slice(&self.len.to_be_bytes());
        b[16..].copy_from_slice(&self.rkey.to_be_bytes());
        b
    }

    /// Decodes [`to_bytes`](Self::to_bytes); `None` for anything else.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() != Self::LEN {
            return None;
        }
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[..8]);
        let mut l = [0u8; 8];
        l.copy_from_slice(&b[8..16]);
        Some(Self {
            addr: u64::from_be_bytes(a),
            len: u64::from_be_bytes(l),
            rkey: u32::from_be_bytes([b[16], b[17], b[18], b[19]]),
        })
    }
}

impl LocalRegion {
    /// What to give a peer.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.mr.addr(),
            len: self.mr.len() as u64,
            rkey: self.mr.rkey().0,
        }
    }

    /// The region's memory, read and written here with copies (peers may access it any
    /// time): [`MemoryRegion::read`] / [`write`](MemoryRegion::write) for bytes,
    /// [`read_u64`](MemoryRegion::read_u64) / [`write_u64`](MemoryRegion::write_u64) for
    /// the 8-byte words peers' atomics (`compare_swap`, `fetch_add`) work on, `to_vec` for
    /// a copy.
    pub fn memory(&self) -> &MemoryRegion {
        &self.mr
    }
}
