//! # rdmx-rc
//!
//! Reliable-connected endpoints over the verbs API: a [`Context`] owns the device, one
//! shared receive queue for every endpoint, the registered buffer pool and the progress
//! engine; an [`Endpoint`] is one RC queue pair to a peer, with credit flow control and three
//! send protocols chosen by size (inline, eager, rendezvous).
//!
//! ```no_run
//! use rdmx_rc::Context;
//! let server = Context::builder().build()?;
//! let listener = server.listen("127.0.0.1:0")?;
//! let addr = listener.local_addr();
//! std::thread::spawn(move || {
//!     let ep = listener.accept().unwrap();
//!     let msg = ep.recv().unwrap();
//!     ep.send(&msg).unwrap();
//! });
//! let client = Context::builder().build()?;
//! let ep = client.connect(addr)?;
//! ep.send(b"ping")?;
//! assert_eq!(&ep.recv()?[..], b"ping");
//! # Ok::<(), rdmx_core::Error>(())
//! ```
#![forbid(unsafe_code)]

mod conn;
mod context;
mod endpoint;
mod ep;
mod shared;

pub use context::{Context, ContextBuilder, Listener, MAX_ENDPOINTS};
pub use endpoint::{Endpoint, LocalRegion, Message, RemoteRegion};
pub use shared::Stats;
