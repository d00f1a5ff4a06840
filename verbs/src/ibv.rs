//! The libibverbs provider (cargo feature `ibverbs`): RDMA NICs and kernel Soft-RoCE through
//! rdma-core.
//!
//! **In progress.** This release discovers devices, opens them and answers the device, port
//! and GID queries (so `Device::list` and `rdmx devices` show hardware). Creating protection
//! domains, queues and memory regions on a hardware device returns
//! `VerbsError::Unsupported` until the rest of the provider lands; the conformance suite
//! (`RDMX_TEST_DEVICE=<name> cargo test -p rdmx-verbs --features ibverbs --test conformance`)
//! is what it will be checked with.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;

// The raw rdma-core bindings the `ibverbs` crate is built on (its `ffi` module is not
// public in 0.9), generated from the same headers.
use ibverbs_sys as ffi;

use crate::error::{PostError, VerbsError};
use crate::mem::RegisteredMemory;
use crate::provider::Provider;
use crate::soft::driver::ChannelInner;
use crate::soft::engine::{AsyncEvent, QpConfig, SrqState};
use crate::types::{
    AccessFlags, DeviceAttr, Gid, Mtu, PortAttr, PortState, QpAttr, QpAttrMask, QpCap, Qpn,
    WorkCompletion,
};
use crate::wr::{RecvWr, SendWr};

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
}

// SAFETY: an ibv_context may be used from any thread (libibverbs objects are thread-safe);
// we only pass the pointer to libibverbs calls.
unsafe impl Send for IbvDevice {}
// SAFETY: as above.
unsafe impl Sync for IbvDevice {}

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
        Ok(Arc::new(Self {
            ctx,
            name: name.to_string(),
        }))
    }

    fn raw_device_attr(&self) -> Result<ffi::ibv_device_attr, VerbsError> {
        let mut a = ffi::ibv_device_attr::default();
        // SAFETY: `ctx` is an open context and `a` a live, correctly sized attribute struct.
        let rc = unsafe { ffi::ibv_query_device(self.ctx, &raw mut a) };
        if rc != 0 {
            let source = std::io::Error::from_raw_os_error(rc);
            return Err(VerbsError::Io {
                op: "ibv_query_device",
                source,
            });
        }
        Ok(a)
    }

    fn unsupported(&self, what: &'static str) -> VerbsError {
        tracing::debug!(device = %self.name, what, "not implemented by the ibverbs provider yet");
        VerbsError::Unsupported(what)
    }
}

impl Drop for IbvDevice {
    fn drop(&mut self) {
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
            max_inline_data: 0,
            phys_port_cnt: a.phys_port_cnt,
            atomic_glob: a.atomic_cap == ffi::IBV_ATOMIC_GLOB,
            max_srq: nonneg(a.max_srq),
            xrc: a.device_cap_flags & ffi::IBV_DEVICE_XRC != 0,
            auto_path_mig: a.device_cap_flags & ffi::IBV_DEVICE_AUTO_PATH_MIG != 0,
            max_mcast_grp: nonneg(a.max_mcast_grp),
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

    fn port_addr(&self, port: u8) -> Result<SocketAddr, VerbsError> {
        let _ = port;
        Err(VerbsError::InvalidArgument(
            "UDP port addresses exist only on soft devices".into(),
        ))
    }

    fn pop_event(&self) -> Option<AsyncEvent> {
        None
    }

    fn event_fd(&self) -> RawFd {
        // SAFETY: `ctx` is an open context; reading its async fd field is a plain load.
        unsafe { (*self.ctx).async_fd }
    }

    fn shutdown(&self) {}

    fn alloc_pd(&self) -> Result<u32, VerbsError> {
        Err(self.unsupported("protection domains on the ibverbs provider (in progress)"))
    }

    fn reg_mr(&self, _: u32, _: &Arc<RegisteredMemory>, _: AccessFlags) -> Result<u32, VerbsError> {
        Err(self.unsupported("memory regions on the ibverbs provider (in progress)"))
    }

    fn dereg_mr(&self, _: u32) {}

    fn create_cq(&self, _: usize, _: &Arc<ChannelInner>) -> Result<u32, VerbsError> {
        Err(self.unsupported("completion queues on the ibverbs provider (in progress)"))
    }

    fn destroy_cq(&self, _: u32) {}

    fn poll_cq(&self, _: u32, _: &mut [WorkCompletion]) -> usize {
        0
    }

    fn req_notify_cq(&self, _: u32, _: bool) {}

    fn progress(&self) -> usize {
        0
    }

    fn release(&self) {}

    fn create_qp(&self, _: &QpConfig) -> Result<Qpn, VerbsError> {
        Err(self.unsupported("queue pairs on the ibverbs provider (in progress)"))
    }

    fn destroy_qp(&self, _: Qpn) {}

    fn modify_qp(&self, _: Qpn, _: &QpAttr, _: QpAttrMask) -> Result<(), VerbsError> {
        Err(self.unsupported("queue pairs on the ibverbs provider (in progress)"))
    }

    fn query_qp(&self, _: Qpn) -> Option<(QpAttr, QpCap)> {
        None
    }

    fn post_send(&self, _: Qpn, _: &[SendWr<'_>]) -> Result<(), (usize, PostError)> {
        Err((0, PostError::Destroyed))
    }

    fn post_recv(&self, _: Qpn, _: &RecvWr<'_>) -> Result<(), PostError> {
        Err(PostError::Destroyed)
    }

    fn attach_mcast(&self, _: Qpn, _: Gid, _: u8) -> Result<(), VerbsError> {
        Err(self.unsupported("multicast on the ibverbs provider (in progress)"))
    }

    fn detach_mcast(&self, _: Qpn, _: Gid, _: u8) -> Result<(), VerbsError> {
        Err(self.unsupported("multicast on the ibverbs provider (in progress)"))
    }

    fn create_srq(
        &self,
        _: u32,
        _: Option<(u32, u32)>,
        _: u32,
        _: u32,
        _: u32,
    ) -> Result<u32, VerbsError> {
        Err(self.unsupported("shared receive queues on the ibverbs provider (in progress)"))
    }

    fn destroy_srq(&self, _: u32) -> Result<(), VerbsError> {
        Ok(())
    }

    fn post_srq_recv(&self, _: u32, _: &RecvWr<'_>) -> Result<(), PostError> {
        Err(PostError::Destroyed)
    }

    fn modify_srq(&self, _: u32, _: Option<u32>, _: Option<u32>) -> Result<(), VerbsError> {
        Err(self.unsupported("shared receive queues on the ibverbs provider (in progress)"))
    }

    fn query_srq(&self, _: u32) -> Option<SrqState> {
        None
    }

    fn alloc_xrcd(&self) -> Result<u32, VerbsError> {
        Err(self.unsupported("XRC domains on the ibverbs provider (in progress)"))
    }
}
