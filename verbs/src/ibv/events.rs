//! The per-device event thread: completion-channel events (forwarded to the rdmx
//! `ChannelInner` of the CQ that fired) and asynchronous events (queued for `pop_event`).

use std::collections::{HashMap, VecDeque};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use super::{Ptr, ffi};
use crate::os::ChannelInner;
use crate::os::{EventFd, poll_readable};
use crate::types::Qpn;
use crate::vocab::AsyncEvent;

/// How long the thread sleeps in `poll(2)` before it looks at the stop flag again.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// State shared between a device and its event thread.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) stop: AtomicBool,
    /// CQ handle -> the channel to signal when it fires.
    pub(super) channels: Mutex<HashMap<u32, Weak<ChannelInner>>>,
    events: Mutex<VecDeque<AsyncEvent>>,
    /// Readable while `events` is not empty.
    pub(super) event_fd: EventFd,
}

impl Shared {
    pub(super) fn new() -> std::io::Result<Self> {
        Ok(Self {
            stop: AtomicBool::new(false),
            channels: Mutex::new(HashMap::new()),
            events: Mutex::new(VecDeque::new()),
            event_fd: EventFd::new()?,
        })
    }

    pub(super) fn pop_event(&self) -> Option<AsyncEvent> {
        let mut q = self.events.lock();
        let e = q.pop_front();
        if q.is_empty() {
            self.event_fd.drain();
        }
        e
    }

    fn push_event(&self, e: AsyncEvent) {
        tracing::debug!(?e, "async event");
        self.events.lock().push_back(e);
        self.event_fd.signal();
    }

    fn signal_cq(&self, cq: u32) {
        let ch = self.channels.lock().get(&cq).and_then(Weak::upgrade);
        if let Some(ch) = ch {
            ch.ready.lock().push_back(cq);
            ch.fd.signal();
        }
    }
}

/// Puts `fd` in non-blocking mode, so `ibv_get_cq_event` / `ibv_get_async_event` return an
/// error instead of blocking when nothing is pending.
pub(super) fn set_nonblocking(fd: RawFd) -> std::io::Result<()> {
    if fd < 0 {
        return Ok(());
    }
    // SAFETY: F_GETFL on a descriptor owned by libibverbs has no memory effects.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above; only the O_NONBLOCK status flag changes.
    let rc = unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The event thread. `ctx` and `chan` stay valid until it returns: the device joins it (in
/// `shutdown` or `Drop`) before destroying the channel and closing the context.
pub(super) fn run(
    shared: Arc<Shared>,
    ctx: Ptr<ffi::ibv_context>,
    chan: Ptr<ffi::ibv_comp_channel>,
) {
    // SAFETY: `ctx` is an open context (see above); reading its fd field is a plain load.
    let async_fd = unsafe { (*ctx.0).async_fd };
    let chan_fd = if chan.0.is_null() {
        -1
    } else {
        // SAFETY: a non-null `chan` is a live completion channel (see above).
        unsafe { (*chan.0).fd }
    };
    while !shared.stop.load(Ordering::Acquire) {
        // poll(2) ignores negative descriptors, so a missing channel is harmless.
        let ready = match poll_readable(&[chan_fd, async_fd], Some(POLL_INTERVAL)) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("ibverbs event thread: poll failed: {e}");
                std::thread::sleep(POLL_INTERVAL);
                continue;
            }
        };
        if ready.first().copied().unwrap_or(false) && !chan.0.is_null() {
            drain_cq_events(&shared, chan);
        }
        if ready.get(1).copied().unwrap_or(false) {
            drain_async_events(&shared, ctx);
        }
    }
}

fn drain_cq_events(shared: &Shared, chan: Ptr<ffi::ibv_comp_channel>) {
    loop {
        let mut cq: *mut ffi::ibv_cq = std::ptr::null_mut();
        let mut cq_ctx: *mut std::os::raw::c_void = std::ptr::null_mut();
        // SAFETY: `chan` is live (see `run`); the out-pointers are live locals. The fd is
        // non-blocking, so with nothing pending this returns an error instead of blocking.
        let rc = unsafe { ffi::ibv_get_cq_event(chan.0, &raw mut cq, &raw mut cq_ctx) };
        if rc != 0 || cq.is_null() {
            return;
        }
        // SAFETY: `cq` was just returned by ibv_get_cq_event, so it is alive (ibv_destroy_cq
        // waits for every reported event to be acknowledged, which is done here at once).
        unsafe { ffi::ibv_ack_cq_events(cq, 1) };
        // The CQ context is the rdmx handle stored at creation (not a pointer).
        let handle = u32::try_from(cq_ctx as usize).unwrap_or(u32::MAX);
        shared.signal_cq(handle);
    }
}

fn drain_async_events(shared: &Shared, ctx: Ptr<ffi::ibv_context>) {
    loop {
        // SAFETY: ibv_async_event is a plain C struct (a union of pointers/ints and an
        // enum); all-zero bytes are a valid value.
        let mut ev: ffi::ibv_async_event = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open (see `run`) and `ev` a live event struct; the async fd is
        // non-blocking, so this fails instead of blocking when nothing is pending.
        let rc = unsafe { ffi::ibv_get_async_event(ctx.0, &raw mut ev) };
        if rc != 0 {
            return;
        }
        let mapped = map_async(&ev);
        // SAFETY: `ev` was filled by ibv_get_async_event and is acknowledged exactly once,
        // after we are done reading the object it names.
        unsafe { ffi::ibv_ack_async_event(&raw mut ev) };
        if let Some(e) = mapped {
            shared.push_event(e);
        }
    }
}

/// Which member of `ibv_async_event::element` an event type fills (verbs.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Element {
    Qp,
    Cq,
    Srq,
    Port,
    /// Nothing rdmx reads: device events, WQ events (rdmx creates no WQs) and event types
    /// this code does not know, whose union member it must not guess.
    None,
}

fn element_of(t: ffi::ibv_event_type) -> Element {
    match t {
        ffi::IBV_EVENT_QP_FATAL
        | ffi::IBV_EVENT_QP_REQ_ERR
        | ffi::IBV_EVENT_QP_ACCESS_ERR
        | ffi::IBV_EVENT_COMM_EST
        | ffi::IBV_EVENT_SQ_DRAINED
        | ffi::IBV_EVENT_PATH_MIG
        | ffi::IBV_EVENT_PATH_MIG_ERR
        | ffi::IBV_EVENT_QP_LAST_WQE_REACHED => Element::Qp,
        ffi::IBV_EVENT_CQ_ERR => Element::Cq,
        ffi::IBV_EVENT_SRQ_ERR | ffi::IBV_EVENT_SRQ_LIMIT_REACHED => Element::Srq,
        ffi::IBV_EVENT_PORT_ACTIVE
        | ffi::IBV_EVENT_PORT_ERR
        | ffi::IBV_EVENT_LID_CHANGE
        | ffi::IBV_EVENT_PKEY_CHANGE
        | ffi::IBV_EVENT_SM_CHANGE
        | ffi::IBV_EVENT_CLIENT_REREGISTER
        | ffi::IBV_EVENT_GID_CHANGE => Element::Port,
        _ => Element::None,
    }
}

/// The rdmx event for event type `t`, given its element as read per [`element_of`]: a QP
/// number, a CQ or SRQ handle, or a port number (`None` when there is none, or it could
/// not be read). A known event whose element is missing gives `None` (there is nothing to
/// report it on); an unknown type gives `AsyncEvent::Other(t)`.
fn event_from(t: ffi::ibv_event_type, id: Option<u32>) -> Option<AsyncEvent> {
    let qp = || id.map(Qpn);
    let port = || id.and_then(|p| u8::try_from(p).ok());
    Some(match t {
        ffi::IBV_EVENT_CQ_ERR => AsyncEvent::CqError(id?),
        ffi::IBV_EVENT_QP_FATAL => AsyncEvent::QpFatal(qp()?),
        ffi::IBV_EVENT_QP_REQ_ERR => AsyncEvent::QpRequestError(qp()?),
        ffi::IBV_EVENT_QP_ACCESS_ERR => AsyncEvent::QpAccessError(qp()?),
        ffi::IBV_EVENT_COMM_EST => AsyncEvent::CommEstablished(qp()?),
        ffi::IBV_EVENT_SQ_DRAINED => AsyncEvent::SqDrained(qp()?),
        ffi::IBV_EVENT_PATH_MIG => AsyncEvent::PathMigrated(qp()?),
        ffi::IBV_EVENT_PATH_MIG_ERR => AsyncEvent::PathMigrationError(qp()?),
        ffi::IBV_EVENT_DEVICE_FATAL => AsyncEvent::DeviceFatal,
        ffi::IBV_EVENT_PORT_ACTIVE => AsyncEvent::PortActive(port()?),
        ffi::IBV_EVENT_PORT_ERR => AsyncEvent::PortError(port()?),
        ffi::IBV_EVENT_LID_CHANGE => AsyncEvent::LidChange(port()?),
        ffi::IBV_EVENT_PKEY_CHANGE => AsyncEvent::PkeyChange(port()?),
        ffi::IBV_EVENT_SM_CHANGE => AsyncEvent::SmChange(port()?),
        ffi::IBV_EVENT_SRQ_ERR => AsyncEvent::SrqError(id?),
        ffi::IBV_EVENT_SRQ_LIMIT_REACHED => AsyncEvent::SrqLimitReached(id?),
        ffi::IBV_EVENT_QP_LAST_WQE_REACHED => AsyncEvent::QpLastWqeReached(qp()?),
        ffi::IBV_EVENT_CLIENT_REREGISTER => AsyncEvent::ClientReregister(port()?),
        ffi::IBV_EVENT_GID_CHANGE => AsyncEvent::GidChange(port()?),
        other => AsyncEvent::Other(other),
    })
}

/// Reads the element of a not-yet-acknowledged event (the object stays alive until the
/// ack) and maps the event.
fn map_async(ev: &ffi::ibv_async_event) -> Option<AsyncEvent> {
    let t = ev.event_type;
    let id = match element_of(t) {
        Element::Qp => {
            // SAFETY: for QP events the union holds the QP pointer, alive until the event
            // is acknowledged.
            let qp = unsafe { ev.element.qp };
            // SAFETY: checked non-null; see above.
            (!qp.is_null()).then(|| unsafe { (*qp).qp_num })
        }
        Element::Cq => {
            // SAFETY: for CQ events the union holds the CQ pointer, alive until the ack.
            let cq = unsafe { ev.element.cq };
            // SAFETY: checked non-null; `cq_context` holds the rdmx handle we stored.
            let h = (!cq.is_null()).then(|| unsafe { (*cq).cq_context } as usize);
            h.and_then(|h| u32::try_from(h).ok())
        }
        Element::Srq => {
            // SAFETY: for SRQ events the union holds the SRQ pointer, alive until the ack.
            let srq = unsafe { ev.element.srq };
            // SAFETY: checked non-null; `srq_context` holds the rdmx handle we stored.
            let h = (!srq.is_null()).then(|| unsafe { (*srq).srq_context } as usize);
            h.and_then(|h| u32::try_from(h).ok())
        }
        Element::Port => {
            // SAFETY: for port events the union holds the port number.
            u32::try_from(unsafe { ev.element.port_num }).ok()
        }
        Element::None => None,
    };
    let e = event_from(t, id);
    if e.is_none() {
        tracing::debug!(
            event_type = t,
            "ibverbs async event without its object; skipped"
        );
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every event type of verbs.h, with what it becomes for element 7.
    const TABLE: [(ffi::ibv_event_type, Element, AsyncEvent); 20] = [
        (ffi::IBV_EVENT_CQ_ERR, Element::Cq, AsyncEvent::CqError(7)),
        (
            ffi::IBV_EVENT_QP_FATAL,
            Element::Qp,
            AsyncEvent::QpFatal(Qpn(7)),
        ),
        (
            ffi::IBV_EVENT_QP_REQ_ERR,
            Element::Qp,
            AsyncEvent::QpRequestError(Qpn(7)),
        ),
        (
            ffi::IBV_EVENT_QP_ACCESS_ERR,
            Element::Qp,
            AsyncEvent::QpAccessError(Qpn(7)),
        ),
        (
            ffi::IBV_EVENT_COMM_EST,
            Element::Qp,
            AsyncEvent::CommEstablished(Qpn(7)),
        ),
        (
            ffi::IBV_EVENT_SQ_DRAINED,
            Element::Qp,
            AsyncEvent::SqDrained(Qpn(7)),
        ),
        (
            ffi::IBV_EVENT_PATH_MIG,
            Element::Qp,
            AsyncEvent::PathMigrated(Qpn(7)),
        ),
        (
            ffi::IBV_EVENT_PATH_MIG_ERR,
            Element::Qp,
            AsyncEvent::PathMigrationError(Qpn(7)),
        ),
        (
            ffi::IBV_EVENT_DEVICE_FATAL,
            Element::None,
            AsyncEvent::DeviceFatal,
        ),
        (
            ffi::IBV_EVENT_PORT_ACTIVE,
            Element::Port,
            AsyncEvent::PortActive(7),
        ),
        (
            ffi::IBV_EVENT_PORT_ERR,
            Element::Port,
            AsyncEvent::PortError(7),
        ),
        (
            ffi::IBV_EVENT_LID_CHANGE,
            Element::Port,
            AsyncEvent::LidChange(7),
        ),
        (
            ffi::IBV_EVENT_PKEY_CHANGE,
            Element::Port,
            AsyncEvent::PkeyChange(7),
        ),
        (
            ffi::IBV_EVENT_SM_CHANGE,
            Element::Port,
            AsyncEvent::SmChange(7),
        ),
        (
            ffi::IBV_EVENT_SRQ_ERR,
            Element::Srq,
            AsyncEvent::SrqError(7),
        ),
        (
            ffi::IBV_EVENT_SRQ_LIMIT_REACHED,
            Element::Srq,
            AsyncEvent::SrqLimitReached(7),
        ),
        (
            ffi::IBV_EVENT_QP_LAST_WQE_REACHED,
            Element::Qp,
            AsyncEvent::QpLastWqeReached(Qpn(7)),
        ),
        (
            ffi::IBV_EVENT_CLIENT_REREGISTER,
            Element::Port,
            AsyncEvent::ClientReregister(7),
        ),
        (
            ffi::IBV_EVENT_GID_CHANGE,
            Element::Port,
            AsyncEvent::GidChange(7),
        ),
        (
            ffi::IBV_EVENT_WQ_FATAL,
            Element::None,
            AsyncEvent::Other(ffi::IBV_EVENT_WQ_FATAL),
        ),
    ];

    #[test]
    fn every_libibverbs_event_type_maps_to_a_value() {
        for (t, element, want) in TABLE {
            assert_eq!(element_of(t), element, "event type {t}");
            let id = (element != Element::None).then_some(7);
            assert_eq!(event_from(t, id), Some(want), "event type {t}");
        }
        // The table covers every type verbs.h defines (they are numbered from 0).
        let mut types: Vec<_> = TABLE.iter().map(|(t, ..)| *t).collect();
        types.sort_unstable();
        assert_eq!(types, (0..20).collect::<Vec<_>>());
    }

    #[test]
    fn unknown_event_types_are_other_and_read_no_element() {
        for t in [20, 21, 0x1000, u32::MAX] {
            assert_eq!(element_of(t), Element::None);
            assert_eq!(event_from(t, None), Some(AsyncEvent::Other(t)));
        }
    }

    #[test]
    fn a_known_event_without_its_object_is_skipped() {
        for (t, element, _) in TABLE {
            if element != Element::None {
                assert_eq!(event_from(t, None), None, "event type {t}");
            }
        }
        // A port number that does not fit a u8 is no port.
        assert_eq!(event_from(ffi::IBV_EVENT_PORT_ACTIVE, Some(300)), None);
    }
}
