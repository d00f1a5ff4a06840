//! The per-device event thread: completion-channel events (forwarded to the rdmx
//! `ChannelInner` of the CQ that fired) and asynchronous events (queued for `pop_event`), plus
//! the work-completion conversion.

use std::collections::{HashMap, VecDeque};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use super::{Ptr, ffi};
use crate::soft::driver::ChannelInner;
use crate::soft::driver::sys::{EventFd, poll_readable};
use crate::soft::engine::AsyncEvent;
use crate::types::{Qpn, WcFlags, WcOpcode, WcStatus, WorkCompletion};

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

/// Reads the element of a not-yet-acknowledged event (the object stays alive until the ack).
fn map_async(ev: &ffi::ibv_async_event) -> Option<AsyncEvent> {
    let t = ev.event_type;
    let qpn = || {
        // SAFETY: for QP events the union holds the QP pointer, alive until the event is
        // acknowledged.
        let qp = unsafe { ev.element.qp };
        // SAFETY: checked non-null; see above.
        (!qp.is_null()).then(|| Qpn(unsafe { (*qp).qp_num }))
    };
    let port = || {
        // SAFETY: for port events the union holds the port number.
        u8::try_from(unsafe { ev.element.port_num }).ok()
    };
    Some(match t {
        ffi::IBV_EVENT_QP_FATAL => AsyncEvent::QpFatal(qpn()?),
        ffi::IBV_EVENT_QP_REQ_ERR => AsyncEvent::QpRequestError(qpn()?),
        ffi::IBV_EVENT_QP_ACCESS_ERR => AsyncEvent::QpAccessError(qpn()?),
        ffi::IBV_EVENT_COMM_EST => AsyncEvent::CommEstablished(qpn()?),
        ffi::IBV_EVENT_SQ_DRAINED => AsyncEvent::SqDrained(qpn()?),
        ffi::IBV_EVENT_PATH_MIG => AsyncEvent::PathMigrated(qpn()?),
        ffi::IBV_EVENT_PATH_MIG_ERR => AsyncEvent::PathMigrationError(qpn()?),
        ffi::IBV_EVENT_QP_LAST_WQE_REACHED => AsyncEvent::QpLastWqeReached(qpn()?),
        ffi::IBV_EVENT_PORT_ACTIVE => AsyncEvent::PortActive(port()?),
        ffi::IBV_EVENT_PORT_ERR => AsyncEvent::PortError(port()?),
        ffi::IBV_EVENT_CQ_ERR => {
            // SAFETY: for CQ events the union holds the CQ pointer, alive until the ack.
            let cq = unsafe { ev.element.cq };
            if cq.is_null() {
                return None;
            }
            // SAFETY: checked non-null; `cq_context` holds the rdmx handle we stored.
            let h = unsafe { (*cq).cq_context } as usize;
            AsyncEvent::CqError(u32::try_from(h).ok()?)
        }
        ffi::IBV_EVENT_SRQ_LIMIT_REACHED => {
            // SAFETY: for SRQ events the union holds the SRQ pointer, alive until the ack.
            let srq = unsafe { ev.element.srq };
            if srq.is_null() {
                return None;
            }
            // SAFETY: checked non-null; `srq_context` holds the rdmx handle we stored.
            let h = unsafe { (*srq).srq_context } as usize;
            AsyncEvent::SrqLimitReached(u32::try_from(h).ok()?)
        }
        other => {
            tracing::debug!(
                event_type = other,
                "ibverbs async event not mapped; skipped"
            );
            return None;
        }
    })
}

/// `struct ibv_wc` from verbs.h. ibverbs-sys declares its own copy with private fields, so
/// we poll into this mirror; the layout is checked against theirs below.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RawWc {
    wr_id: u64,
    status: u32,
    opcode: u32,
    vendor_err: u32,
    byte_len: u32,
    /// `imm_data` (big-endian) or `invalidated_rkey`.
    imm_data: u32,
    qp_num: u32,
    src_qp: u32,
    wc_flags: u32,
    pkey_index: u16,
    slid: u16,
    sl: u8,
    dlid_path_bits: u8,
}

const _: () = assert!(size_of::<RawWc>() == size_of::<ffi::ibv_wc>());
const _: () = assert!(align_of::<RawWc>() == align_of::<ffi::ibv_wc>());
const _: () = assert!(size_of::<RawWc>() == 48);

fn wc_opcode(op: u32) -> WcOpcode {
    match op {
        ffi::ibv_wc_opcode::IBV_WC_SEND => WcOpcode::Send,
        ffi::ibv_wc_opcode::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        ffi::ibv_wc_opcode::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        ffi::ibv_wc_opcode::IBV_WC_COMP_SWAP => WcOpcode::CompSwap,
        ffi::ibv_wc_opcode::IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
        ffi::ibv_wc_opcode::IBV_WC_RECV => WcOpcode::Recv,
        ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        // WcOpcode has no catch-all variant: opcodes rdmx never posts (bind MW, local
        // invalidate, TSO, flush, atomic write, tag matching, driver) fall back to the
        // direction (receive-side codes have bit 7 set).
        other => {
            tracing::debug!(opcode = other, "unmapped ibv_wc opcode");
            if other & 0x80 != 0 {
                WcOpcode::Recv
            } else {
                WcOpcode::Send
            }
        }
    }
}

impl RawWc {
    pub(super) fn to_wc(self) -> WorkCompletion {
        let flags = WcFlags(self.wc_flags & 0xF);
        WorkCompletion {
            wr_id: self.wr_id,
            status: WcStatus::from_code(self.status),
            opcode: wc_opcode(self.opcode),
            byte_len: self.byte_len,
            // libibverbs keeps imm_data in network byte order; rdmx's `imm_data` is the
            // big-endian wire word read as a number (as the soft provider delivers it).
            imm_data: if flags.contains(WcFlags::WITH_IMM) {
                u32::from_be(self.imm_data)
            } else {
                self.imm_data
            },
            qp_num: Qpn(self.qp_num),
            src_qp: Qpn(self.src_qp),
            wc_flags: flags,
            vendor_err: self.vendor_err,
            slid: self.slid,
        }
    }
}
