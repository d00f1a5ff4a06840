//! # rdmx-core
//!
//! The transport-independent parts of the rdmx middleware:
//!
//! * [`config`]: every tunable, with builder methods and `RDMX_*` environment variables;
//! * [`pool`]: the registered buffer pool ([`Buf`]) carved into size classes;
//! * [`regcache`]: registrations of application memory sent zero-copy, keyed by address range;
//! * [`header`]: the message header that precedes every eager message on the wire;
//! * [`credit`]: receive-credit accounting shared by all endpoints of a context;
//! * [`bootstrap`]: the TCP side channel on which endpoints exchange their addresses;
//! * [`Event`] and [`Error`]: what the application is told;
//! * [`worker`]: the progress engine every transport plugs into ([`Worker`], the
//!   [`Transport`](worker::Transport) trait), with the waits, the background thread,
//!   events, received [`Message`]s and send batches.
//!
//! The RC/XRC endpoints that use these pieces live in `rdmx-rc`; the `rdmx` facade re-exports
//! both.
//!
//! # Cargo features
//!
//! * `tokio`: the async wait of the worker (`worker::wait_async`).
#![deny(unsafe_code)]

pub mod bootstrap;
pub mod config;
pub mod credit;
mod error;
mod event;
pub mod header;
pub mod pool;
pub mod regcache;
pub mod worker;

pub use config::{Config, ConfigBuilder};
pub use error::{Error, Result};
pub use event::{DisconnectCause, Event};
pub use pool::{Buf, BufferPool, PoolStats, SharedBuf};
pub use regcache::{RegCache, RegCacheStats, Registered};
pub use worker::{Arrival, Message, Worker};
