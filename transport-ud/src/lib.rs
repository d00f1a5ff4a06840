//! # rdmx-ud
//!
//! UD endpoints for rdmx: reliable, ordered, flow-controlled messages between any number of
//! peers over a small fixed number of datagram queue pairs per context (eRPC's design, UCX's
//! `ud` transport): queue pairs and per-peer memory stop growing with the cluster.
//!
//! This first part is the protocol, sans I/O: the datagram format ([`wire`]) and one peer's
//! session ([`session`]): per-peer sequence numbers, cumulative and selective
//! acknowledgements, retransmission on timeout, duplicate suppression, a send window,
//! receive credits that bound memory, segmentation and reassembly above the datagram size,
//! small messages packed together, an orderly close, keepalives and peer death. Time comes
//! in as arguments, so a seeded simulation drives it (`tests/session_sim.rs`). The
//! transport over the worker (queue pairs, address handles, the shared receive budget, the
//! set-up over the side channel, endpoints) builds on it.
#![deny(unsafe_code)]

// The modules in their layers, bottom up: `seq` < `wire` < `session` (the protocol, sans
// I/O) < `state` (resources and state) < `engine` (progress) < `endpoint` < `setup`
// (reserving and opening sessions) < `transport` (the worker's view), `exchange` (set-up
// over the side channel) < `attach` (the transport as applications see it).
#[cfg(feature = "tokio")]
mod asyncio;
mod attach;
mod budget;
mod endpoint;
mod engine;
mod exchange;
mod grants;
pub mod group;
pub mod mcast;
mod outbox;
pub mod seq;
pub mod session;
mod setup;
mod state;
mod transport;
pub mod wire;

pub use attach::{Listener, QKEY, UdTransport};
pub use endpoint::Endpoint;
pub use seq::Seq;
pub use session::{Cause, SendError, Session, SessionConfig, SessionStats};
pub use state::UdStats;
