//! # rdmx-verbs
//!
//! A safe Rust rendering of the RDMA verbs (`ibv_*`): devices, protection domains, memory
//! regions, completion queues and channels, queue pairs with the real state machine, and
//! work requests — plus the **soft provider**, a userspace RDMA NIC that speaks
//! RoCEv2-framed InfiniBand transport packets over UDP, so everything runs on machines
//! without RDMA hardware.
//!
//! ```text
//! Device::open(name) -> Context -> ProtectionDomain -> MemoryRegion, QueuePair
//!                               -> CompletionQueue (+ CompletionChannel)
//! soft provider:  wire (headers, ICRC)  <-  engine (sans-I/O RC transport)  <-  driver (UDP)
//! cm (rdma_cm):    EventChannel -> CmId (resolve, listen, connect / accept, multicast),
//!                  CM MADs over UDP, on soft devices
//! ```
//!
//! ## Quick start
//! ```no_run
//! use rdmx_verbs::{AccessFlags, Device};
//! let ctx = Device::open("soft:127.0.0.1")?;
//! let pd = ctx.alloc_pd()?;
//! let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)?;
//! mr.write(0, b"hello")?;
//! let cq = ctx.create_cq(256, None)?;
//! # Ok::<(), rdmx_verbs::VerbsError>(())
//! ```
//!
//! ## Safety model
//! Posting is safe: an SGE names memory by key, and the provider resolves the key when it
//! executes the request (a stale key completes with `LocProtErr`). Registered bytes are only
//! accessed through copies with atomic word accesses, so the NIC writing on behalf of a
//! remote peer never races with the application in the Rust sense.
//!
//! ## Cargo features
//! * `ibverbs` (off by default): the libibverbs provider for RDMA NICs and kernel Soft-RoCE
//!   and the connection manager on it through librdmacm (needs `libibverbs-dev`,
//!   `librdmacm-dev`, `cmake`, `libclang-dev`, `pkg-config`). It is built and linted
//!   in CI but has not yet run against hardware (no NIC or rxe on our machines); run the
//!   conformance suite on a device before relying on it.
#![deny(unsafe_code)]

pub mod ah;
mod bytes;
pub mod cm;
pub mod cq;
pub mod device;
pub mod error;
pub mod grh;
#[cfg(feature = "ibverbs")]
mod ibv;
pub mod mw;
pub mod pd;
pub mod qp;
pub mod soft;
pub mod srq;
pub mod tm;
pub mod types;
pub mod wr;
pub mod wr_batch;
pub mod xrc;

mod mem;
pub mod os;
mod provider;
mod qp_state;
pub mod vocab;

pub use ah::AddressHandle;
pub use bytes::SharedBytes;
pub use cm::{CmError, CmEvent, CmEventKind, CmId, ConnParam, EventChannel, PortSpace};
pub use cq::{CompletionChannel, CompletionQueue};
pub use device::{Context, Device, DeviceOptions, PostBatch};
pub use error::{PostError, VerbsError};
pub use mw::{MemoryWindow, MwBind};
pub use os::{Clock, random_u64, seed_thread_random};
pub use pd::{MemoryRegion, ProtectionDomain};
pub use qp::{QpInitAttr, QueuePair};
pub use soft::fault::FaultConfig;
pub use srq::{SharedReceiveQueue, SrqAttr, SrqInitAttr};
pub use tm::{OpsFlags, OpsWr, Rvh, TagOp, TmCaps, Tmh, TmhOp};
pub use types::*;
pub use vocab::{AsyncEvent, FaultStats, NicCounters};
pub use wr::{MwBindWr, RecvWr, SendWr, Sge, UdDest, WrOpcode};
pub use wr_batch::{WrBatch, WrError};
pub use xrc::XrcDomain;
