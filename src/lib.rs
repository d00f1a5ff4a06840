//! # rdmx
//!
//! A messaging middleware for RDMA networks. This facade crate re-exports the public API of the
//! workspace crates:
//!
//! * the message layer at the top level: [`Context`] (a worker — device, buffer pool,
//!   progress — with its transports, and [`Context::recv`] from any of their endpoints),
//!   [`Endpoint`] (ordered, exactly-once, flow-controlled messages and one-sided
//!   operations), [`Message`], [`Buf`], [`SharedBytes`] (application memory sent
//!   zero-copy through the registration cache), [`Node`] (XRC), [`Event`], [`Error`];
//! * [`rpc`]: typed request/response services over endpoints (`rdmx::Endpoint` is an
//!   [`rpc::Link`]);
//! * [`core`]: the worker and its `Transport` trait, configuration, buffer pool, frame
//!   header, credits, bootstrap;
//! * [`verbs`]: devices, protection domains, memory regions, completion queues and queue
//!   pairs, on the built-in soft provider (a userspace RoCEv2 NIC over UDP) or, with the
//!   `ibverbs` feature, real hardware through libibverbs.
//!
//! ```no_run
//! let ctx = rdmx::Context::builder().build()?;
//! let listener = ctx.listen("127.0.0.1:7000")?;
//! let ep = listener.accept()?;
//! let msg = ep.recv()?;
//! ep.send(&msg)?;
//! // Large application buffers go zero-copy; the registration is cached for the next send.
//! let blob: std::sync::Arc<[u8]> = vec![7u8; 1 << 20].into();
//! ep.send_shared(blob.clone())?;
//! # Ok::<(), rdmx::Error>(())
//! ```
#![forbid(unsafe_code)]

pub use rdmx_core as core;
pub use rdmx_core::bootstrap::Transport;
pub use rdmx_core::{
    Arrival, Buf, Config, DisconnectCause, Error, Event, PoolStats, RegCacheStats, Result,
    SharedBuf,
};
pub use rdmx_rpc as rpc;
mod context;
mod endpoint;

pub use context::{Context, ContextBuilder, Listener};
pub use endpoint::Endpoint;
pub use rdmx_rc::{
    Batch, IntoBufError, LocalRegion, Message, Node, OpOutput, PendingOp, RcTransport,
    RemoteAccess, RemoteRegion, Stats,
};
pub use rdmx_ud::UdTransport;
pub use rdmx_ud::group::Group;
pub use rdmx_ud::mcast::{McastConfig, McastEvent, McastStats, RemovedWhy};
pub use rdmx_verbs as verbs;
pub use rdmx_verbs::{MemoryRegion, NicCounters, SharedBytes};
