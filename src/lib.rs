//! # rdmx
//!
//! A messaging middleware for RDMA networks. This facade crate re-exports the public API of the
//! workspace crates. Today that is the verbs layer ([`verbs`]): devices, protection domains,
//! memory regions, completion queues and queue pairs, running on the built-in soft provider (a
//! userspace RoCEv2 NIC over UDP) or, later, on real hardware through libibverbs.
//!
//! ```no_run
//! use rdmx::verbs::Device;
//! let devices = Device::list().expect("list devices");
//! let ctx = devices[0].context().expect("open device");
//! println!("{:?}", ctx.query_device());
//! ```
#![forbid(unsafe_code)]

pub use rdmx_verbs as verbs;
