//! The event channel (`rdma_create_event_channel`) and its events (`struct rdma_cm_event`).
//!
//! Each channel runs one background thread: it sleeps in `poll(2)` on the CM sockets of
//! the channel's IDs and on a wake-up eventfd, with the earliest retransmission deadline (at
//! most one second) as its timeout, and feeds what arrives and what times out into the IDs'
//! state machines. It exits when the [`EventChannel`] is dropped.

use std::collections::VecDeque;
use std::fmt;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::agent::Agent;
use super::error::CmError;
use super::id::{CmId, IdInner, PortSpace};
use crate::device::Context;
use crate::os::{EventFd, clock, poll_readable};
use crate::types::{AhAttr, Qpn};

/// The kind of a CM event (`enum rdma_cm_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CmEventKind {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED`: `resolve_addr` bound the ID to a device.
    AddrResolved,
    /// `RDMA_CM_EVENT_ADDR_ERROR`: `resolve_addr` failed.
    AddrError,
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED`: `resolve_route` completed.
    RouteResolved,
    /// `RDMA_CM_EVENT_ROUTE_ERROR`: `resolve_route` failed.
    RouteError,
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`: a listener got a connection request; the event's ID
    /// is a new ID for it, to `accept` or `reject`.
    ConnectRequest,
    /// `RDMA_CM_EVENT_CONNECT_ERROR`: the connection could not be set up locally.
    ConnectError,
    /// `RDMA_CM_EVENT_UNREACHABLE`: the peer did not answer (after the retries).
    Unreachable,
    /// `RDMA_CM_EVENT_REJECTED`: the peer refused; `status` is the IB CM reject reason.
    Rejected,
    /// `RDMA_CM_EVENT_ESTABLISHED`: the connection is up (both sides).
    Established,
    /// `RDMA_CM_EVENT_DISCONNECTED`: the connection is down (both sides); the QP is in ERR.
    Disconnected,
    /// `RDMA_CM_EVENT_MULTICAST_JOIN`: a join completed; the event carries the group's UD
    /// parameters.
    MulticastJoin,
    /// `RDMA_CM_EVENT_MULTICAST_ERROR`: a join failed.
    MulticastError,
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL` (librdmacm only): the ID's device is going away;
    /// drop the ID and everything made on the device.
    #[cfg(feature = "ibverbs")]
    DeviceRemoval,
    /// `RDMA_CM_EVENT_ADDR_CHANGE` (librdmacm only): the ID's address moved to another
    /// device or port.
    #[cfg(feature = "ibverbs")]
    AddrChange,
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT` (librdmacm only): the QP of a closed connection left
    /// its time-wait and may be reused.
    #[cfg(feature = "ibverbs")]
    TimewaitExit,
}

impl CmEventKind {
    /// The librdmacm name (`rdma_event_str`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            Self::AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            Self::RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            Self::RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            Self::ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            Self::ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            Self::Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            Self::Rejected => "RDMA_CM_EVENT_REJECTED",
            Self::Established => "RDMA_CM_EVENT_ESTABLISHED",
            Self::Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            Self::MulticastJoin => "RDMA_CM_EVENT_MULTICAST_JOIN",
            Self::MulticastError => "RDMA_CM_EVENT_MULTICAST_ERROR",
            #[cfg(feature = "ibverbs")]
            Self::DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            #[cfg(feature = "ibverbs")]
            Self::AddrChange => "RDMA_CM_EVENT_ADDR_CHANGE",
            #[cfg(feature = "ibverbs")]
            Self::TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        }
    }
}

impl fmt::Display for CmEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The peer's connection parameters, as a CONNECT_REQUEST or ESTABLISHED event reports them
/// (`struct rdma_conn_param` of the event).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PeerConnParam {
    /// The peer's responder resources (RDMA reads it accepts at once).
    pub responder_resources: u8,
    /// The peer's initiator depth (RDMA reads it issues at once).
    pub initiator_depth: u8,
    /// Transport retry count asked for.
    pub retry_count: u8,
    /// RNR retry count asked for.
    pub rnr_retry_count: u8,
    /// The peer's QP number.
    pub qp_num: Qpn,
    /// The peer uses a shared receive queue.
    pub srq: bool,
}

/// The UD parameters of a MULTICAST_JOIN event (`struct rdma_ud_param`): the group's
/// address vector, QPN and Q_Key, to build the sender's address handle with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct UdParam {
    /// The group's address vector (the multicast GID).
    pub ah_attr: AhAttr,
    /// The destination QPN: [`Qpn::MULTICAST`].
    pub qp_num: Qpn,
    /// The group's Q_Key (rdma_cm's UDP port space: 0x01234567).
    pub qkey: u32,
}

/// Statuses of events that are not a reject reason (negative errno values, as rdma_cm).
pub mod status {
    /// No answer in time (`-ETIMEDOUT`): UNREACHABLE.
    pub const TIMED_OUT: i32 = -110;
    /// No device for the address (`-ENODEV`): ADDR_ERROR.
    pub const NO_DEVICE: i32 = -19;
    /// An invalid argument (`-EINVAL`): MULTICAST_ERROR, CONNECT_ERROR.
    pub const INVALID: i32 = -22;
}

/// A CM event (`struct rdma_cm_event`). Dropping it is `rdma_ack_cm_event`.
#[derive(Debug)]
#[non_exhaustive]
pub struct CmEvent {
    /// What happened.
    pub kind: CmEventKind,
    /// The ID it happened to; for CONNECT_REQUEST, the new ID of the incoming connection.
    pub id: CmId,
    /// For CONNECT_REQUEST, the listening ID.
    pub listen_id: Option<CmId>,
    /// 0, the reject reason (REJECTED), or a negative errno (see [`status`]).
    pub status: i32,
    /// The peer's private data (CONNECT_REQUEST, ESTABLISHED at the active side, REJECTED).
    /// As in rdma_cm it is the whole private-data field of the message: the peer's bytes
    /// followed by zeros (56 bytes for a request, 196 for an accept, 148 for a reject).
    pub private_data: Vec<u8>,
    /// The peer's connection parameters (CONNECT_REQUEST; ESTABLISHED at the active side).
    pub conn: Option<PeerConnParam>,
    /// The group's UD parameters (MULTICAST_JOIN).
    pub ud: Option<UdParam>,
}

impl CmEvent {
    pub(crate) fn new(kind: CmEventKind, id: CmId) -> Self {
        Self {
            kind,
            id,
            listen_id: None,
            status: 0,
            private_data: Vec::new(),
            conn: None,
            ud: None,
        }
    }
}

/// What a channel shares with its IDs and its thread.
#[derive(Debug)]
pub(crate) struct ChannelCore {
    events: Mutex<VecDeque<CmEvent>>,
    ready: Condvar,
    /// Readable while events are queued.
    event_fd: EventFd,
    /// Wakes the thread (new socket, new deadline, shutdown).
    wake: EventFd,
    stop: AtomicBool,
    /// The IDs whose timers and sockets the thread serves.
    ids: Mutex<Vec<Weak<IdInner>>>,
    agents: Mutex<Vec<Weak<Agent>>>,
    /// librdmacm's channel, created with the first ID on a libibverbs device.
    #[cfg(feature = "ibverbs")]
    rdmacm: Mutex<Option<Arc<super::rdmacm::HwChannel>>>,
}

impl ChannelCore {
    /// librdmacm's channel of this channel, created on first use (and the thread told to
    /// poll it).
    ///
    /// # Errors
    /// `Io` when librdmacm cannot create it (no kernel CM).
    #[cfg(feature = "ibverbs")]
    pub(crate) fn rdmacm(&self) -> Result<Arc<super::rdmacm::HwChannel>, CmError> {
        let mut hw = self.rdmacm.lock();
        if let Some(h) = hw.as_ref() {
            return Ok(Arc::clone(h));
        }
        let h = Arc::new(super::rdmacm::HwChannel::new()?);
        *hw = Some(Arc::clone(&h));
        drop(hw);
        self.wake();
        Ok(h)
    }

    /// Queues an event (dropped when the channel is gone).
    pub(crate) fn push(&self, ev: CmEvent) {
        if self.stop.load(Ordering::Acquire) {
            return;
        }
        tracing::debug!(kind = %ev.kind, status = ev.status, "rdma_cm event");
        self.events.lock().push_back(ev);
        self.event_fd.signal();
        self.ready.notify_all();
    }

    /// Makes the thread look at its deadlines and sockets again.
    pub(crate) fn wake(&self) {
        self.wake.signal();
    }

    pub(crate) fn register_id(&self, id: &Arc<IdInner>) {
        self.ids.lock().push(Arc::downgrade(id));
    }

    pub(crate) fn register_agent(&self, a: &Arc<Agent>) {
        self.agents.lock().push(Arc::downgrade(a));
        self.wake();
    }

    /// The thread's loop: bounded waits, exits on `stop`.
    fn run(self: Arc<Self>) {
        let mut buf = vec![0u8; 2048];
        while !self.stop.load(Ordering::Acquire) {
            let agents: Vec<Arc<Agent>> = {
                let mut a = self.agents.lock();
                a.retain(|w| w.strong_count() > 0);
                a.iter().filter_map(Weak::upgrade).collect()
            };
            let ids: Vec<Arc<IdInner>> = {
                let mut v = self.ids.lock();
                v.retain(|w| w.strong_count() > 0);
                v.iter().filter_map(Weak::upgrade).collect()
            };
            let now = clock::monotonic();
            let next = ids.iter().filter_map(|i| i.poll_timeout()).min();
            let wait = next
                .map_or(Duration::from_secs(1), |d| d.saturating_duration_since(now))
                .min(Duration::from_secs(1));
            // Drop our references before sleeping, so that IDs and sockets the application
            // lets go of close now rather than after the wait.
            drop(ids);
            let mut fds = vec![self.wake.raw()];
            fds.extend(agents.iter().map(|a| a.raw_fd()));
            #[cfg(feature = "ibverbs")]
            let hw = self.rdmacm.lock().clone();
            #[cfg(feature = "ibverbs")]
            if let Some(h) = &hw {
                fds.push(h.fd());
            }
            let ready = match poll_readable(&fds, Some(wait)) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "rdma_cm channel poll failed");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            if ready.first().copied().unwrap_or(false) {
                self.wake.drain();
            }
            for (a, r) in agents.iter().zip(ready.iter().skip(1)) {
                if *r {
                    a.receive(&mut buf);
                }
            }
            #[cfg(feature = "ibverbs")]
            if let Some(h) = hw
                && ready.get(1 + agents.len()).copied().unwrap_or(false)
            {
                h.drain(&self);
            }
            drop(agents);
            let now = clock::monotonic();
            let due: Vec<Arc<IdInner>> = self.ids.lock().iter().filter_map(Weak::upgrade).collect();
            for id in due {
                if id.poll_timeout().is_some_and(|d| d <= now) {
                    id.handle_timeout(now);
                }
            }
        }
    }
}

/// An event channel (`struct rdma_event_channel`): the queue the events of its IDs go to,
/// with a file descriptor that is readable while events are queued.
///
/// Dropping the channel (`rdma_destroy_event_channel`) stops its thread and discards queued
/// events; its IDs then get no more events and their connections no longer progress.
#[derive(Debug)]
pub struct EventChannel {
    core: Arc<ChannelCore>,
    thread: Option<JoinHandle<()>>,
}

impl EventChannel {
    /// Creates an event channel and its thread (`rdma_create_event_channel`).
    ///
    /// # Errors
    /// `Io` when the eventfds or the thread cannot be created.
    pub fn new() -> Result<Self, CmError> {
        let fd = || {
            EventFd::new().map_err(|error| CmError::Io {
                op: "eventfd",
                error,
            })
        };
        let core = Arc::new(ChannelCore {
            events: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            event_fd: fd()?,
            wake: fd()?,
            stop: AtomicBool::new(false),
            ids: Mutex::new(Vec::new()),
            agents: Mutex::new(Vec::new()),
            #[cfg(feature = "ibverbs")]
            rdmacm: Mutex::new(None),
        });
        let c = Arc::clone(&core);
        let thread = std::thread::Builder::new()
            .name("rdmx-cm".into())
            .spawn(move || c.run())
            .map_err(|error| CmError::Io {
                op: "spawn the CM thread",
                error,
            })?;
        Ok(Self {
            core,
            thread: Some(thread),
        })
    }

    /// Creates an ID in `ps` whose events go to this channel (`rdma_create_id`). The ID is
    /// bound to a device by `bind_addr` or `resolve_addr`: the soft device of the address
    /// (one per IP address in the process, opened when first needed, shared while in use).
    ///
    /// # Errors
    /// None today.
    pub fn create_id(&self, ps: PortSpace) -> Result<CmId, CmError> {
        Ok(CmId::create(&self.core, ps, None))
    }

    /// Creates an ID bound to the device `ctx` rather than the default device of its address
    /// (the device `resolve_addr` and `bind_addr` use).
    ///
    /// With the `ibverbs` feature, an ID on a libibverbs device is a librdmacm
    /// `rdma_cm_id` (`rdma_create_id`; the channel's `rdma_event_channel` is created with
    /// the first): the addresses it is bound or resolved to must belong to `ctx`'s device.
    ///
    /// # Errors
    /// `Unsupported` when `ctx` is neither a soft device nor (with the `ibverbs` feature) a
    /// libibverbs one; `Io` when librdmacm cannot create the channel or the ID (e.g.
    /// `ENODEV`: no kernel CM).
    pub fn create_id_on(&self, ctx: &Context, ps: PortSpace) -> Result<CmId, CmError> {
        #[cfg(feature = "ibverbs")]
        if super::rdmacm::is_ibverbs(ctx) {
            return super::rdmacm::create_id(&self.core, ctx, ps);
        }
        if ctx.port_addr(1).is_err() {
            return Err(CmError::Unsupported(
                "the CM runs on soft devices only (librdmacm is not wrapped)",
            ));
        }
        Ok(CmId::create(&self.core, ps, Some(ctx.clone())))
    }

    /// The next event, waiting up to `timeout` for one (`rdma_get_cm_event`); `None` when
    /// none came.
    pub fn get_event(&self, timeout: Duration) -> Option<CmEvent> {
        let deadline = clock::monotonic() + timeout;
        let mut q = self.core.events.lock();
        loop {
            if let Some(ev) = q.pop_front() {
                if q.is_empty() {
                    self.core.event_fd.drain();
                }
                return Some(ev);
            }
            if self.core.ready.wait_until(&mut q, deadline).timed_out() && q.is_empty() {
                return None;
            }
        }
    }

    /// The next event if one is queued.
    pub fn try_get_event(&self) -> Option<CmEvent> {
        self.get_event(Duration::ZERO)
    }

    /// Waits up to `timeout` for an event of kind `kind`; events of other kinds that arrive
    /// first are returned as the error.
    ///
    /// # Errors
    /// `UnexpectedEvent` with the event that came instead, `Timeout` when none came.
    pub fn expect_event(&self, kind: CmEventKind, timeout: Duration) -> Result<CmEvent, CmError> {
        match self.get_event(timeout) {
            Some(ev) if ev.kind == kind => Ok(ev),
            Some(ev) => Err(CmError::UnexpectedEvent {
                expected: kind,
                got: ev.kind,
                status: ev.status,
            }),
            None => Err(CmError::Timeout("a CM event")),
        }
    }
}

impl AsRawFd for EventChannel {
    /// Readable while events are queued; valid as long as the channel lives.
    fn as_raw_fd(&self) -> RawFd {
        self.core.event_fd.raw()
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        self.core.stop.store(true, Ordering::Release);
        self.core.wake();
        // The events hold IDs, which hold the channel: let them go.
        let events = std::mem::take(&mut *self.core.events.lock());
        drop(events);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.core.ids.lock().clear();
        self.core.agents.lock().clear();
    }
}
