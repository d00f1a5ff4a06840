//! The libibverbs provider (cargo feature `ibverbs`): RDMA NICs and kernel Soft-RoCE through
//! rdma-core.
//!
//! Objects are kept in handle tables ([`Tables`]): PDs, CQs, XRC domains and basic SRQs get
//! counters as handles (basic SRQs above 2^24), XRC SRQs their real SRQ number (what
//! `srq_num()` must report), MRs their lkey and QPs their real QP number. The public objects keep parents
//! alive while children exist, so a handle is never destroyed while a call on it runs; what
//! is left when the device closes is destroyed children first.
//!
//! One completion channel per device: a background thread ([`events::run`]) waits on it
//! and on the async-event fd, forwards CQ events to the rdmx `ChannelInner` of the CQ and
//! queues async events for `pop_event`.
//!
//! XRC (`ibv_open_xrcd`, `ibv_create_srq_ex`, `ibv_get_srq_num`, `ibv_create_qp_ex`) is
//! `static inline` in verbs.h and goes through `struct verbs_context`, which ibverbs-sys
//! does not bind: see [`xrc`] for how those ops are reached.
//!
//! The conformance suite (`RDMX_TEST_DEVICE=<name> cargo test -p rdmx-verbs --features
//! ibverbs --test conformance`) is what this is checked with on real hardware.
#![allow(unsafe_code)]

mod cq;
mod events;
mod mw;
mod post;
mod qp;
mod tables;
mod tm;
mod wr;
mod xrc;

use std::ffi::CStr;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

// The raw rdma-core bindings the `ibverbs` crate is built on (its `ffi` module is not
// public in 0.9), generated from the same headers.
use ibverbs_sys as ffi;
use parking_lot::Mutex;

use crate::error::{PostError, VerbsError};
use crate::mem::RegisteredMemory;
use crate::os::ChannelInner;
use crate::provider::Provider;
use crate::types::{
    AccessFlags, DeviceAttr, Gid, Mtu, MwType, PortAttr, PortState, QpAttr, QpAttrMask, QpCap,
    QpState, Qpn, SendFlags, SendOps, WorkCompletion,
};
use crate::vocab::{AsyncEvent, QpConfig, SrqState};
use crate::wr::{MwBindWr, RecvWr, SendWr};
use tables::{Ptr, QpEntry, Tables};

/// The names of the RDMA devices libibverbs knows. No RDMA subsystem (libibverbs reports
/// `ENOSYS`) or no device is an empty list, not an error.
pub(crate) fn device_names() -> Vec<String> {
    let mut n: std::os::raw::c_int = 0;
    // SAFETY: `n` is a live int the call writes the count into; a null result means no list.
    let list = unsafe { ffi::ibv_get_device_list(&raw mut n) };
    if list.is_null() {
        return Vec::new();
    }
    let mut names = Vec::new();
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: the list holds `n` valid device pointers until it is freed below.
        let dev = unsafe { *list.add(i) };
        if dev.is_null() {
            continue;
        }
        // SAFETY: `dev` is a device of the live list; the name is a NUL-terminated string
        // owned by the library that we copy before freeing the list.
        let name = unsafe { ffi::ibv_get_device_name(dev) };
        if !name.is_null() {
            // SAFETY: checked non-null above; valid while the list lives.
            names.push(
                unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { ffi::ibv_free_device_list(list) };
    names
}

/// An open hardware device.
#[derive(Debug)]
pub(crate) struct IbvDevice {
    ctx: *mut ffi::ibv_context,
    name: String,
    /// The device's one completion channel (null when it could not be created: creating a
    /// CQ then fails).
    chan: *mut ffi::ibv_comp_channel,
    shared: Arc<events::Shared>,
    t: Mutex<Tables>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

// SAFETY: an ibv_context and its completion channel may be used from any thread (libibverbs
// objects are thread-safe); we only pass the pointers to libibverbs calls, and they are
// freed only in `Drop`, after the event thread has been joined.
unsafe impl Send for IbvDevice {}
// SAFETY: as above.
unsafe impl Sync for IbvDevice {}

fn io_err(op: &'static str, rc: i32) -> VerbsError {
    VerbsError::Io {
        op,
        error: std::io::Error::from_raw_os_error(rc),
    }
}

/// The error of a libibverbs call that returns NULL and sets errno.
fn last_err(op: &'static str) -> VerbsError {
    VerbsError::Io {
        op,
        error: std::io::Error::last_os_error(),
    }
}

impl IbvDevice {
    /// Opens the device called `name`.
    pub(crate) fn open(name: &str) -> Result<Arc<Self>, VerbsError> {
        let mut n: std::os::raw::c_int = 0;
        // SAFETY: as in `device_names`.
        let list = unsafe { ffi::ibv_get_device_list(&raw mut n) };
        if list.is_null() {
            return Err(VerbsError::DeviceNotFound(name.to_string()));
        }
        let mut ctx = std::ptr::null_mut();
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: the list holds `n` device pointers until freed below.
            let dev = unsafe { *list.add(i) };
            if dev.is_null() {
                continue;
            }
            // SAFETY: `dev` is valid; the returned name lives as long as the list.
            let dn = unsafe { ffi::ibv_get_device_name(dev) };
            // SAFETY: non-null names are NUL-terminated strings owned by the library.
            if !dn.is_null() && unsafe { CStr::from_ptr(dn) }.to_bytes() == name.as_bytes() {
                // SAFETY: `dev` is a valid device of the live list; opening it is independent
                // of the list's lifetime once it returns.
                ctx = unsafe { ffi::ibv_open_device(dev) };
                break;
            }
        }
        // SAFETY: freed once; an opened context stays valid after the list is freed.
        unsafe { ffi::ibv_free_device_list(list) };
        if ctx.is_null() {
            return Err(VerbsError::DeviceNotFound(name.to_string()));
        }
        let shared = match events::Shared::new() {
            Ok(s) => Arc::new(s),
            Err(error) => {
                // SAFETY: `ctx` was just opened and nothing else refers to it.
                unsafe { ffi::ibv_close_device(ctx) };
                return Err(VerbsError::Io {
                    op: "eventfd",
                    error,
                });
            }
        };
        // SAFETY: `ctx` is open; the channel is destroyed in `Drop` before the context.
        let chan = unsafe { ffi::ibv_create_comp_channel(ctx) };
        if chan.is_null() {
            tracing::warn!(
                device = name,
                "ibv_create_comp_channel failed; CQs unavailable"
            );
        } else {
            // SAFETY: non-null channel just created; reading its fd is a plain load.
            let fd = unsafe { (*chan).fd };
            if let Err(e) = events::set_nonblocking(fd) {
                tracing::warn!(device = name, "completion channel fd: {e}");
            }
        }
        // SAFETY: `ctx` is open; reading its async fd field is a plain load.
        if let Err(e) = events::set_nonblocking(unsafe { (*ctx).async_fd }) {
            tracing::warn!(device = name, "async event fd: {e}");
        }
        let dev = Arc::new(Self {
            ctx,
            name: name.to_string(),
            chan,
            shared: shared.clone(),
            t: Mutex::new(Tables::default()),
            thread: Mutex::new(None),
        });
        let (c, ch) = (Ptr(ctx), Ptr(chan));
        match std::thread::Builder::new()
            .name(format!("rdmx-ibv-{name}"))
            .spawn(move || events::run(shared, c, ch))
        {
            Ok(h) => *dev.thread.lock() = Some(h),
            Err(e) => tracing::warn!(device = name, "cannot start the event thread: {e}"),
        }
        Ok(dev)
    }

    fn raw_device_attr(&self) -> Result<ffi::ibv_device_attr, VerbsError> {
        let mut a = ffi::ibv_device_attr::default();
        // SAFETY: `ctx` is an open context and `a` a live, correctly sized attribute struct.
        let rc = unsafe { ffi::ibv_query_device(self.ctx, &raw mut a) };
        if rc != 0 {
            return Err(io_err("ibv_query_device", rc));
        }
        Ok(a)
    }

    fn unsupported(&self, what: &'static str) -> VerbsError {
        tracing::debug!(device = %self.name, what, "not implemented by the ibverbs provider");
        VerbsError::Unsupported(what)
    }

    fn stop_thread(&self) {
        self.shared.stop.store(true, Ordering::Release);
        let h = self.thread.lock().take();
        if let Some(h) = h
            && h.join().is_err()
        {
            tracing::warn!(device = %self.name, "the ibverbs event thread panicked");
        }
    }

    fn pd(&self, pd: u32) -> Result<Ptr<ffi::ibv_pd>, VerbsError> {
        self.t
            .lock()
            .pds
            .get(&pd)
            .copied()
            .ok_or(VerbsError::NoSuchObject("protection domain"))
    }

    fn cq(&self, cq: u32) -> Option<Ptr<ffi::ibv_cq>> {
        self.t.lock().cqs.get(&cq).copied()
    }

    fn qp(&self, qpn: Qpn) -> Option<QpEntry> {
        self.t.lock().qps.get(&qpn.0).copied()
    }

    fn srq(&self, srq: u32) -> Option<Ptr<ffi::ibv_srq>> {
        self.t.lock().srqs.get(&srq).copied()
    }
}

impl Drop for IbvDevice {
    fn drop(&mut self) {
        self.stop_thread();
        self.destroy_all();
        if !self.chan.is_null() {
            // SAFETY: the channel was created in `open`, its CQs are destroyed and the event
            // thread that read it has been joined; destroyed once.
            let rc = unsafe { ffi::ibv_destroy_comp_channel(self.chan) };
            if rc != 0 {
                tracing::warn!(device = %self.name, rc, "ibv_destroy_comp_channel failed");
            }
        }
        // SAFETY: `ctx` was opened by ibv_open_device and is closed exactly once; every object
        // created from it holds the Context (and so this value) alive.
        let rc = unsafe { ffi::ibv_close_device(self.ctx) };
        if rc != 0 {
            tracing::warn!(device = %self.name, rc, "ibv_close_device failed; leaking it");
        }
    }
}

fn mtu_from(v: ffi::ibv_mtu) -> Mtu {
    match v {
        ffi::IBV_MTU_256 => Mtu::Mtu256,
        ffi::IBV_MTU_512 => Mtu::Mtu512,
        ffi::IBV_MTU_2048 => Mtu::Mtu2048,
        ffi::IBV_MTU_4096 => Mtu::Mtu4096,
        _ => Mtu::Mtu1024,
    }
}

impl Provider for IbvDevice {
    fn query_device(&self) -> DeviceAttr {
        let a = self.raw_device_attr().unwrap_or_default();
        let fw = a
            .fw_ver
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect::<Vec<_>>();
        let nonneg = |v: std::os::raw::c_int| u32::try_from(v).unwrap_or(0);
        DeviceAttr {
            fw_ver: String::from_utf8_lossy(&fw).into_owned(),
            node_guid: u64::from_be(a.node_guid),
            vendor_id: a.vendor_id,
            max_mr_size: a.max_mr_size,
            max_qp: nonneg(a.max_qp),
            max_qp_wr: nonneg(a.max_qp_wr),
            max_sge: nonneg(a.max_sge),
            max_cq: nonneg(a.max_cq),
            max_cqe: nonneg(a.max_cqe),
            max_mr: nonneg(a.max_mr),
            max_pd: nonneg(a.max_pd),
            max_qp_rd_atom: nonneg(a.max_qp_rd_atom),
            max_qp_init_rd_atom: nonneg(a.max_qp_init_rd_atom),
            // libibverbs reports no device-wide inline limit (see `DeviceAttr`); a QP's own
            // limit is what `ibv_create_qp` grants, reported by `query_qp`.
            max_inline_data: 0,
            phys_port_cnt: a.phys_port_cnt,
            atomic_glob: a.atomic_cap == ffi::IBV_ATOMIC_GLOB,
            max_srq: nonneg(a.max_srq),
            xrc: a.device_cap_flags & ffi::IBV_DEVICE_XRC != 0,
            auto_path_mig: a.device_cap_flags & ffi::IBV_DEVICE_AUTO_PATH_MIG != 0,
            max_mcast_grp: nonneg(a.max_mcast_grp),
            max_num_tags: self.max_num_tags(),
            memory_windows: a.max_mw > 0,
        }
    }

    fn query_port(&self, port: u8) -> Result<PortAttr, VerbsError> {
        let mut a = ffi::ibv_port_attr::default();
        // SAFETY: `ctx` is open; `a` is a full ibv_port_attr, at least as large as the layout
        // the library writes through the compat pointer type.
        let rc = unsafe { ffi::ibv_query_port(self.ctx, port, (&raw mut a).cast()) };
        if rc != 0 {
            return Err(VerbsError::InvalidArgument(format!(
                "ibv_query_port({port}) failed: {}",
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        Ok(PortAttr {
            state: if a.state == ffi::ibv_port_state::IBV_PORT_ACTIVE {
                PortState::Active
            } else {
                PortState::Down
            },
            max_mtu: mtu_from(a.max_mtu),
            active_mtu: mtu_from(a.active_mtu),
            gid_tbl_len: u32::try_from(a.gid_tbl_len).unwrap_or(0),
            link_layer: if u32::from(a.link_layer) == ffi::IBV_LINK_LAYER_ETHERNET {
                "Ethernet"
            } else {
                "InfiniBand"
            },
            max_msg_sz: a.max_msg_sz,
        })
    }

    fn query_gid(&self, port: u8, index: u32) -> Result<Gid, VerbsError> {
        let mut g = ffi::ibv_gid::default();
        let idx = std::os::raw::c_int::try_from(index)
            .map_err(|_| VerbsError::InvalidArgument(format!("GID index {index}")))?;
        // SAFETY: `ctx` is open and `g` a live 16-byte GID the call fills.
        let rc = unsafe { ffi::ibv_query_gid(self.ctx, port, idx, &raw mut g) };
        if rc != 0 {
            return Err(VerbsError::InvalidArgument(format!(
                "ibv_query_gid({port}, {index}) failed: {}",
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        // SAFETY: every bit pattern of the union is a valid byte array.
        Ok(Gid(unsafe { g.raw }))
    }

    fn query_gid_type(&self, port: u8, index: u32) -> Result<crate::types::GidType, VerbsError> {
        // SAFETY: a plain C struct of integers and a byte union; zeroes are valid.
        let mut e: ffi::ibv_gid_entry = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is open; `e` is a live entry of the size passed.
        let rc = unsafe {
            ffi::_ibv_query_gid_ex(
                self.ctx,
                u32::from(port),
                index,
                &raw mut e,
                0,
                size_of::<ffi::ibv_gid_entry>(),
            )
        };
        if rc != 0 {
            return Err(io_err("ibv_query_gid_ex", rc));
        }
        Ok(match e.gid_type {
            ffi::IBV_GID_TYPE_ROCE_V2 => crate::types::GidType::RoceV2,
            1 => crate::types::GidType::RoceV1,
            _ => crate::types::GidType::Ib,
        })
    }

    fn port_addr(&self, port: u8) -> Result<SocketAddr, VerbsError> {
        let _ = port;
        Err(VerbsError::InvalidArgument(
            "UDP port addresses exist only on soft devices".into(),
        ))
    }

    fn pop_event(&self) -> Option<AsyncEvent> {
        self.shared.pop_event()
    }

    fn event_fd(&self) -> RawFd {
        self.shared.event_fd.raw()
    }

    fn shutdown(&self) {
        self.stop_thread();
    }

    fn alloc_pd(&self) -> Result<u32, VerbsError> {
        // SAFETY: `ctx` is open; the PD is deallocated in `Drop` after its children.
        let pd = unsafe { ffi::ibv_alloc_pd(self.ctx) };
        if pd.is_null() {
            return Err(last_err("ibv_alloc_pd"));
        }
        let mut t = self.t.lock();
        let h = t.next_handle();
        t.pds.insert(h, Ptr(pd));
        Ok(h)
    }

    fn reg_mr(
        &self,
        pd: u32,
        mem: &Arc<RegisteredMemory>,
        access: AccessFlags,
    ) -> Result<(u32, u32), VerbsError> {
        let pd = self.pd(pd)?;
        // ibv_reg_mr rejects an empty range on most devices; `RegisteredMemory` always
        // allocates at least one byte, so a zero-length region registers that byte.
        let len = mem.len().max(1);
        let flags = access.bits() & 0x1F;
        // SAFETY: `pd` is live; `mem` is a live allocation of at least `len` bytes that the
        // MemoryRegion keeps alive until after `dereg_mr` (it owns the Arc). The NIC writes
        // to it only as the access flags allow, and rdmx reads it only through atomics.
        let mr = unsafe {
            ffi::ibv_reg_mr(
                pd.0,
                mem.addr() as usize as *mut std::os::raw::c_void,
                len,
                flags as std::os::raw::c_int,
            )
        };
        if mr.is_null() {
            return Err(last_err("ibv_reg_mr"));
        }
        // SAFETY: non-null MR just registered; its keys are plain fields.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        let old = self.t.lock().mrs.insert(lkey, Ptr(mr));
        if let Some(old) = old {
            // Cannot happen (the device never hands out a live lkey twice); keep the old MR
            // registered rather than freeing memory a peer might still target.
            tracing::warn!(lkey, ?old, "duplicate lkey from ibv_reg_mr; old MR leaked");
        }
        Ok((lkey, rkey))
    }

    fn dereg_mr(&self, key: u32, mem: &Arc<RegisteredMemory>) {
        self.dereg_or_keep(key, mem);
    }

    fn dereg_mr_checked(&self, key: u32) -> Result<(), VerbsError> {
        self.dereg_checked(key)
    }

    fn alloc_mw(&self, pd: u32, mw_type: MwType) -> Result<(u32, u32), VerbsError> {
        Self::alloc_mw(self, pd, mw_type)
    }

    fn dealloc_mw(&self, mw: u32) {
        Self::dealloc_mw(self, mw);
    }

    fn bind_mw(
        &self,
        qpn: Qpn,
        wr_id: u64,
        flags: SendFlags,
        bind: &MwBindWr,
    ) -> Result<u32, PostError> {
        Self::bind_mw(self, qpn, wr_id, flags, bind)
    }

    fn create_cq(&self, cqe: usize, channel: &Arc<ChannelInner>) -> Result<u32, VerbsError> {
        Self::create_cq(self, cqe, channel)
    }

    fn destroy_cq(&self, cq: u32) {
        Self::destroy_cq(self, cq);
    }

    fn poll_cq(&self, cq: u32, wc: &mut [WorkCompletion]) -> usize {
        Self::poll_cq(self, cq, wc)
    }

    fn req_notify_cq(&self, cq: u32, solicited_only: bool) {
        Self::req_notify_cq(self, cq, solicited_only);
    }

    fn progress(&self) -> usize {
        0
    }

    fn release(&self) {}

    fn create_qp(&self, cfg: &QpConfig) -> Result<Qpn, VerbsError> {
        Self::create_qp(self, cfg)
    }

    fn destroy_qp(&self, qpn: Qpn) {
        Self::destroy_qp(self, qpn);
    }

    fn modify_qp(&self, qpn: Qpn, attr: &QpAttr, mask: QpAttrMask) -> Result<(), VerbsError> {
        Self::modify_qp(self, qpn, attr, mask)
    }

    fn query_qp(&self, qpn: Qpn) -> Option<(QpAttr, QpCap)> {
        Self::query_qp(self, qpn)
    }

    fn qp_state(&self, qpn: Qpn) -> Option<QpState> {
        Self::qp_state(self, qpn)
    }

    fn post_send(&self, qpn: Qpn, wrs: &[SendWr<'_>]) -> Result<(), (usize, PostError)> {
        Self::post_send(self, qpn, wrs)
    }

    fn post_send_all(
        &self,
        qpn: Qpn,
        wrs: &[SendWr<'_>],
        _send_ops: SendOps,
    ) -> Result<(), (usize, PostError)> {
        Self::post_send_all(self, qpn, wrs)
    }

    fn post_recv(&self, qpn: Qpn, wr: &RecvWr<'_>) -> Result<(), PostError> {
        Self::post_recv(self, qpn, wr)
    }

    fn attach_mcast(&self, qpn: Qpn, gid: Gid, _port: u8) -> Result<(), VerbsError> {
        let e = self.qp(qpn).ok_or(VerbsError::NoSuchObject("queue pair"))?;
        let g = ffi::ibv_gid { raw: gid.0 };
        // SAFETY: live QP; `g` is a live GID the call reads. The LID is unused on RoCE.
        let rc = unsafe { ffi::ibv_attach_mcast(e.qp.0, &raw const g, 0) };
        if rc != 0 {
            return Err(io_err("ibv_attach_mcast", rc));
        }
        Ok(())
    }

    fn detach_mcast(&self, qpn: Qpn, gid: Gid, _port: u8) -> Result<(), VerbsError> {
        let e = self.qp(qpn).ok_or(VerbsError::NoSuchObject("queue pair"))?;
        let g = ffi::ibv_gid { raw: gid.0 };
        // SAFETY: as in `attach_mcast`.
        let rc = unsafe { ffi::ibv_detach_mcast(e.qp.0, &raw const g, 0) };
        if rc != 0 {
            return Err(io_err("ibv_detach_mcast", rc));
        }
        Ok(())
    }

    fn create_srq(
        &self,
        pd: u32,
        xrc: Option<(u32, u32)>,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<u32, VerbsError> {
        match xrc {
            Some(x) => self.create_xrc_srq(pd, x, max_wr, max_sge),
            None => Self::create_srq(self, pd, max_wr, max_sge),
        }
    }

    fn create_srq_tm(
        &self,
        pd: u32,
        max_wr: u32,
        max_sge: u32,
        tm: crate::tm::TmCaps,
        cq: u32,
    ) -> Result<u32, VerbsError> {
        Self::create_srq_tm(self, pd, max_wr, max_sge, tm, cq)
    }

    fn post_srq_ops(
        &self,
        srq: u32,
        ops: &[crate::tm::OpsWr<'_>],
    ) -> Result<Vec<u32>, (usize, PostError)> {
        Self::post_srq_ops(self, srq, ops)
    }

    fn destroy_srq(&self, srq: u32) -> Result<(), VerbsError> {
        Self::destroy_srq(self, srq)
    }

    fn post_srq_recv(&self, srq: u32, wr: &RecvWr<'_>) -> Result<(), PostError> {
        Self::post_srq_recv(self, srq, wr)
    }

    fn modify_srq(
        &self,
        srq: u32,
        max_wr: Option<u32>,
        limit: Option<u32>,
    ) -> Result<(), VerbsError> {
        Self::modify_srq(self, srq, max_wr, limit)
    }

    fn query_srq(&self, srq: u32) -> Option<SrqState> {
        Self::query_srq(self, srq)
    }

    fn alloc_xrcd(&self) -> Result<u32, VerbsError> {
        self.open_xrcd()
    }

    fn open_xrcd_file(
        &self,
        path: &std::path::Path,
    ) -> Result<crate::provider::SharedXrcd, VerbsError> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|error| VerbsError::Io {
                op: "open XRC domain file",
                error,
            })?;
        let h = self.open_xrcd_fd(std::os::fd::AsRawFd::as_raw_fd(&f))?;
        Ok(crate::provider::SharedXrcd::Local(h))
    }
}
