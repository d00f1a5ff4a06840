//! Devices and device contexts.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use crate::error::VerbsError;
use crate::provider::Provider;
use crate::soft::driver::{self, Shared};
use crate::soft::fault::{FaultConfig, FaultStats};
use crate::soft::{self};
use crate::types::{DeviceAttr, Gid, PortAttr};
use crate::vocab::{AsyncEvent, NicCounters};

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
    /// Open the (soft) device on this simulated net instead of UDP sockets: it runs on the
    /// net's virtual clock, with no thread of its own (see [`SimNet`](soft::SimNet)).
    pub sim: Option<soft::SimNet>,
}

impl DeviceOptions {
    /// Sets a fault-injection plan.
    pub fn with_faults(mut self, faults: FaultConfig) -> Self {
        self.faults = Some(faults);
        self
    }

    /// Opens the device on a simulated net.
    pub fn with_sim(mut self, net: &soft::SimNet) -> Self {
        self.sim = Some(net.clone());
        self
    }
}

impl Device {
    /// The devices on this host: the default soft device (loopback, ephemeral UDP port),
    /// the RDMA devices libibverbs knows (with the `ibverbs` feature; none is not an error),
    /// plus the one named by `RDMX_DEVICE` if that is a different soft device.
    pub fn list() -> Result<Vec<Self>, VerbsError> {
        let mut v = vec![Self {
            name: soft::DEFAULT_DEVICE.to_string(),
        }];
        #[cfg(feature = "ibverbs")]
        v.extend(
            crate::ibv::device_names()
                .into_iter()
                .map(|name| Self { name }),
        );
        if let Ok(name) = std::env::var("RDMX_DEVICE")
            && name != soft::DEFAULT_DEVICE
            && soft::parse_name(&name).is_ok()
        {
            v.push(Self { name });
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
            #[cfg(feature = "ibverbs")]
            {
                let dev: Arc<dyn Provider> = crate::ibv::IbvDevice::open(name)?;
                let _ = &opts;
                return Ok(Context {
                    inner: Arc::new(ContextInner {
                        dev,
                        name: name.to_string(),
                    }),
                });
            }
            #[cfg(not(feature = "ibverbs"))]
            return Err(VerbsError::DeviceNotFound(name.to_string()));
        }
        let addrs = soft::parse_name(name)?;
        let shared = Shared::open(&addrs, opts.faults, opts.sim)?;
        let bound = shared.addrs().to_vec();
        let dev: Arc<dyn Provider> = shared;
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
    pub(crate) dev: Arc<dyn Provider>,
    name: String,
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        self.dev.shutdown();
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

    pub(crate) fn dev(&self) -> &Arc<dyn Provider> {
        &self.inner.dev
    }

    /// Device attributes (`ibv_query_device`).
    pub fn query_device(&self) -> DeviceAttr {
        self.dev().query_device()
    }

    /// Port attributes (`ibv_query_port`); ports are numbered from 1.
    ///
    /// # Errors
    /// `InvalidArgument` for a port that does not exist.
    pub fn query_port(&self, port: u8) -> Result<PortAttr, VerbsError> {
        self.dev().query_port(port)
    }

    /// GID `index` of port `port` (`ibv_query_gid`): on RoCE, the port's IP address.
    ///
    /// # Errors
    /// `InvalidArgument` for a port or index that does not exist.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid, VerbsError> {
        self.dev().query_gid(port, index)
    }

    /// The type of GID table entry `index` of `port` (`ibv_query_gid_ex`).
    ///
    /// # Errors
    /// As the provider reports (an empty entry, a port that does not exist).
    pub fn query_gid_type(
        &self,
        port: u8,
        index: u32,
    ) -> Result<crate::types::GidType, VerbsError> {
        self.dev().query_gid_type(port, index)
    }

    /// The GID index rdmx uses on `port` by default: the first RoCE v2 entry holding an
    /// IPv4-mapped address (`::ffff:a.b.c.d`), else the first RoCE v2 entry, else 0 (a
    /// device that does not report types). On a RoCE NIC index 0 is usually RoCE v1 or
    /// the link-local IPv6 address, which a RoCE v2 peer cannot reach.
    ///
    /// # Errors
    /// As `query_port`.
    pub fn roce_v2_gid_index(&self, port: u8) -> Result<u32, VerbsError> {
        let len = self.query_port(port)?.gid_tbl_len.min(256);
        let mut first_v2 = None;
        for i in 0..len {
            let Ok(t) = self.query_gid_type(port, i) else {
                continue;
            };
            if t != crate::types::GidType::RoceV2 {
                continue;
            }
            let Ok(g) = self.query_gid(port, i) else {
                continue;
            };
            let mapped = g.0[..10].iter().all(|&b| b == 0) && g.0[10..12] == [0xFF, 0xFF];
            if mapped {
                return Ok(i);
            }
            first_v2.get_or_insert(i);
        }
        Ok(first_v2.unwrap_or(0))
    }

    /// The local UDP address of port `port` (soft provider): its IP is the port's GID and
    /// its UDP port goes into a peer's [`AhAttr::udp_port`](crate::types::AhAttr::udp_port).
    ///
    /// # Errors
    /// `InvalidArgument` for a port that does not exist (or a hardware device).
    pub fn port_addr(&self, port: u8) -> Result<SocketAddr, VerbsError> {
        self.dev().port_addr(port)
    }

    /// The clock the device runs on: the host's, or a simulated net's virtual clock. The
    /// layers above read their time from it, so that they run on the same clock as the
    /// device.
    pub fn clock(&self) -> crate::os::Clock {
        self.dev().clock()
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
            let _ = driver::sys::poll_readable(&[self.dev().event_fd()], Some(deadline - now));
        }
    }

    /// A file descriptor that is readable while asynchronous events are queued.
    pub fn async_fd(&self) -> RawFd {
        self.dev().event_fd()
    }

    /// Tells the provider that the calling thread stops polling completion queues for now
    /// (it is about to sleep). A soft device hands socket reception back to its engine thread
    /// at once instead of after the hand-off delay, so packets keep being processed while
    /// nobody polls. Hardware needs no such hint (no-op).
    pub fn yield_polling(&self) {
        self.dev().release();
    }

    /// Opens a post batch on this thread: until the returned guard is dropped, sends posted
    /// by this thread (separate `post_send` calls) may be held by the device and leave
    /// together, as one list would. Nothing else changes: completions, ordering and errors
    /// are those of the same posts made one by one.
    ///
    /// On the soft provider this turns a system call per small send into one per batch (up
    /// to 16 sends per batch; a poll of any CQ, closing the batch, or the thread going to
    /// sleep sends what is held). Hardware doorbells are cheap, and the `ibverbs` provider
    /// ignores batches. Do not keep a batch open while waiting for something other than
    /// this device: held sends wait too (at most 1 ms, when the soft device's engine thread
    /// sends them).
    pub fn batch_posts(&self) -> PostBatch<'_> {
        self.dev().batch_posts(true);
        PostBatch {
            ctx: self,
            _thread: std::marker::PhantomData,
        }
    }

    /// Transport counters of a soft NIC (packets, drops by cause, NAKs, retransmits); zero
    /// for other providers.
    pub fn counters(&self) -> NicCounters {
        self.dev()
            .soft_stats()
            .map(|s| s.counters)
            .unwrap_or_default()
    }

    /// Fault-injection counters, when a plan is active.
    pub fn fault_stats(&self) -> Option<FaultStats> {
        self.dev().soft_stats().and_then(|s| s.faults)
    }

    /// Packets that could not be sent because their destination was unreachable (no
    /// route); counted, not a port failure.
    pub fn tx_unreachable(&self) -> u64 {
        self.dev().soft_stats().map_or(0, |s| s.tx_unreachable)
    }

    /// Packets the kernel refused to send (each recovered by retransmission).
    pub fn tx_errors(&self) -> u64 {
        self.dev().soft_stats().map_or(0, |s| s.tx_errors)
    }
}

/// An open post batch ([`Context::batch_posts`]); dropping it sends what it held.
#[derive(Debug)]
#[must_use = "the batch ends when the guard is dropped"]
pub struct PostBatch<'a> {
    ctx: &'a Context,
    /// The batch belongs to the thread that opened it (not `Send`).
    _thread: std::marker::PhantomData<*const ()>,
}

impl Drop for PostBatch<'_> {
    fn drop(&mut self) {
        self.ctx.dev().batch_posts(false);
    }
}
