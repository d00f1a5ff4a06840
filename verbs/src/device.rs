//! Devices and device contexts.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use crate::cq::{CompletionChannel, CompletionQueue};
use crate::error::VerbsError;
use crate::pd::ProtectionDomain;
use crate::soft::driver::{self, Shared};
use crate::soft::engine::{AsyncEvent, NicCounters};
use crate::soft::fault::{FaultConfig, FaultStats};
use crate::soft::{self};
use crate::types::{DeviceAttr, Gid, Mtu, PortAttr, PortState};

/// An RDMA device that can be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    name: String,
}

/// Options for opening a device.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct DeviceOptions {
    /// Fault-injection plan for frames this (soft) device receives. `None` reads
    /// `RDMX_FAULTS` from the environment.
    pub faults: Option<FaultConfig>,
}

impl DeviceOptions {
    /// Sets a fault-injection plan.
    pub fn with_faults(mut self, faults: FaultConfig) -> Self {
        self.faults = Some(faults);
        self
    }
}

impl Device {
    /// The devices on this host: the default soft device (loopback, ephemeral UDP port),
    /// plus the one named by `RDMX_DEVICE` if that is a different soft device.
    pub fn list() -> Result<Vec<Self>, VerbsError> {
        let mut v = vec![Self {
            name: soft::DEFAULT_DEVICE.to_string(),
        }];
        if let Ok(name) = std::env::var("RDMX_DEVICE") {
            if name != soft::DEFAULT_DEVICE && soft::parse_name(&name).is_ok() {
                v.push(Self { name });
            }
        }
        Ok(v)
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Opens the device named `name` (`ibv_open_device`).
    ///
    /// # Errors
    /// `InvalidDeviceName` / `DeviceNotFound` for an unknown name, `Io` when its sockets
    /// cannot be bound.
    pub fn open(name: &str) -> Result<Context, VerbsError> {
        Self::open_with(name, DeviceOptions::default())
    }

    /// Opens the device named `name` with options.
    ///
    /// # Errors
    /// As [`Device::open`]; also `InvalidArgument` for a bad `RDMX_FAULTS`.
    pub fn open_with(name: &str, opts: DeviceOptions) -> Result<Context, VerbsError> {
        if !name.starts_with(soft::PREFIX) {
            return Err(VerbsError::DeviceNotFound(name.to_string()));
        }
        let addrs = soft::parse_name(name)?;
        let dev = Shared::open(&addrs, opts.faults)?;
        let bound = dev.addrs().to_vec();
        let canonical = format!(
            "soft:{}",
            bound
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        );
        Ok(Context {
            inner: Arc::new(ContextInner {
                dev,
                name: canonical,
            }),
        })
    }

    /// Opens this device.
    ///
    /// # Errors
    /// As [`Device::open`].
    pub fn context(&self) -> Result<Context, VerbsError> {
        Self::open(&self.name)
    }
}

#[derive(Debug)]
pub(crate) struct ContextInner {
    pub(crate) dev: Arc<Shared>,
    name: String,
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        driver::shutdown(&self.dev);
    }
}

/// An open device (`struct ibv_context`). Cheap to clone; the device closes when the last
/// clone and every object created from it are dropped.
#[derive(Debug, Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

impl Context {
    /// The opened device's name, with the UDP ports actually bound (e.g.
    /// `soft:127.0.0.1:40123`).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    pub(crate) fn dev(&self) -> &Arc<Shared> {
        &self.inner.dev
    }

    /// Device attributes (`ibv_query_device`).
    pub fn query_device(&self) -> DeviceAttr {
        let cfg_inline = self.dev().with_nic(|n, _| n.config().max_inline_data);
        DeviceAttr {
            fw_ver: format!("rdmx-soft {}", env!("CARGO_PKG_VERSION")),
            node_guid: self.node_guid(),
            vendor_id: 0,
            max_mr_size: 1 << 40,
            max_qp: 1 << 20,
            max_qp_wr: 1 << 16,
            max_sge: 32,
            max_cq: 1 << 16,
            max_cqe: 1 << 22,
            max_mr: 1 << 24,
            max_pd: 1 << 16,
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 16,
            max_inline_data: cfg_inline,
            phys_port_cnt: self.dev().addrs().len() as u8,
            atomic_glob: true,
            max_srq: 1 << 16,
            xrc: true,
            auto_path_mig: true,
            max_mcast_grp: 1 << 10,
        }
    }

    fn node_guid(&self) -> u64 {
        let a = self.dev().addrs()[0];
        let ip = match a.ip() {
            std::net::IpAddr::V4(v4) => u64::from(u32::from(v4)),
            std::net::IpAddr::V6(v6) => (u128::from(v6) as u64) ^ ((u128::from(v6) >> 64) as u64),
        };
        (0x02_00_00u64 << 40) | ((ip & 0xFFFF_FFFF) << 16) | u64::from(a.port())
    }

    /// Port attributes (`ibv_query_port`); ports are numbered from 1.
    ///
    /// # Errors
    /// `InvalidArgument` for a port that does not exist.
    pub fn query_port(&self, port: u8) -> Result<PortAttr, VerbsError> {
        let addr = self.port_addr(port)?;
        let _ = addr;
        let active = self.dev().port_mtu(usize::from(port) - 1);
        let down = self.dev().port_is_down(usize::from(port) - 1);
        Ok(PortAttr {
            state: if down {
                PortState::Down
            } else {
                PortState::Active
            },
            max_mtu: Mtu::Mtu4096,
            active_mtu: active,
            gid_tbl_len: 1,
            link_layer: "Ethernet",
            max_msg_sz: 1 << 31,
        })
    }

    /// GID `index` of port `port` (`ibv_query_gid`): the port's IP address.
    ///
    /// # Errors
    /// `InvalidArgument` for a port or index that does not exist.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid, VerbsError> {
        if index != 0 {
            return Err(VerbsError::InvalidArgument(format!(
                "GID index {index} does not exist"
            )));
        }
        Ok(Gid::from_ip(self.port_addr(port)?.ip()))
    }

    /// The local UDP address of port `port` (soft provider): its IP is the port's GID and
    /// its UDP port goes into a peer's [`AhAttr::udp_port`](crate::types::AhAttr::udp_port).
    ///
    /// # Errors
    /// `InvalidArgument` for a port that does not exist.
    pub fn port_addr(&self, port: u8) -> Result<SocketAddr, VerbsError> {
        usize::from(port)
            .checked_sub(1)
            .and_then(|i| self.dev().addrs().get(i).copied())
            .ok_or_else(|| VerbsError::InvalidArgument(format!("port {port} does not exist")))
    }

    /// Allocates a protection domain (`ibv_alloc_pd`).
    ///
    /// # Errors
    /// None today; reserved for resource limits.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain, VerbsError> {
        Ok(ProtectionDomain::new(self.clone()))
    }

    /// Creates a completion channel (`ibv_create_comp_channel`).
    ///
    /// # Errors
    /// `Io` when the eventfd cannot be created.
    pub fn create_comp_channel(&self) -> Result<CompletionChannel, VerbsError> {
        CompletionChannel::new(self.clone())
    }

    /// Creates a completion queue of at least `cqe` entries (`ibv_create_cq`), signalling
    /// `channel` when armed (a private channel is used when `None`).
    ///
    /// # Errors
    /// `InvalidArgument` for a size of 0 or above the device limit.
    pub fn create_cq(
        &self,
        cqe: usize,
        channel: Option<&CompletionChannel>,
    ) -> Result<CompletionQueue, VerbsError> {
        CompletionQueue::new(self.clone(), cqe, channel)
    }

    /// Returns the next asynchronous event, waiting up to `timeout` (`ibv_get_async_event`).
    pub fn get_async_event(&self, timeout: Duration) -> Option<AsyncEvent> {
        let deadline = driver::clock::monotonic() + timeout;
        loop {
            if let Some(e) = self.dev().pop_event() {
                return Some(e);
            }
            let now = driver::clock::monotonic();
            if now >= deadline {
                return None;
            }
            let fd = self.dev().event_fd().raw();
            let _ = driver::sys::poll_readable(&[fd], Some(deadline - now));
        }
    }

    /// A file descriptor that is readable while asynchronous events are queued.
    pub fn async_fd(&self) -> RawFd {
        self.dev().event_fd().raw()
    }

    /// Transport counters of the soft NIC (packets, drops by cause, NAKs, retransmits).
    pub fn counters(&self) -> NicCounters {
        self.dev().counters()
    }

    /// Fault-injection counters, when a plan is active.
    pub fn fault_stats(&self) -> Option<FaultStats> {
        self.dev().fault_stats()
    }

    /// Packets that could not be sent because their destination was unreachable (no
    /// route); counted, not a port failure.
    pub fn tx_unreachable(&self) -> u64 {
        self.dev().tx_unreachable()
    }

    /// Packets the kernel refused to send (each recovered by retransmission).
    pub fn tx_errors(&self) -> u64 {
        self.dev().tx_errors()
    }
}
