//! rdmx-rpc: typed request/response services over the message endpoints of any rdmx
//! transport (RC, XRC, UD: anything that is a [`Link`]).
//!
//! A service's methods are declared once, as [`Method`] constants that fix each method's
//! name and its request and response types (serde types, encoded with bincode); the server
//! registers a handler per method ([`Service::builder`]) and runs them on a pool of threads
//! ([`Server`]); clients call them ([`Client::call`], [`Client::start`] for many calls in
//! flight, `Client::call_async` with the `tokio` feature). Each call carries its method,
//! an id and its deadline (as the time left: clocks need not agree); responses come back in
//! any order. Failures are [`Status`]es with gRPC's codes.
//!
//! ```no_run
//! use rdmx_rpc::{Client, ClientConfig, Method, Server, ServerConfig, Service, Status};
//!
//! const ECHO: Method<String, String> = Method::new("echo");
//!
//! # fn demo(server_link: rdmx_rpc::link::mem::MemLink, client_link: rdmx_rpc::link::mem::MemLink) -> Result<(), Box<dyn std::error::Error>> {
//! let service = Service::builder()
//!     .method(ECHO, |_cx, s: String| Ok::<_, Status>(s))
//!     .build()?;
//! let server = Server::new(service, ServerConfig::default())?;
//! server.serve(server_link)?;
//! let client = Client::new(client_link, ClientConfig::default())?;
//! assert_eq!(client.call(ECHO, &"hi".to_string())?, "hi");
//! # Ok(())
//! # }
//! ```
//!
//! Modules, in layers: [`status`] and [`wire`] (frames) at the bottom, `codec` (bodies),
//! [`payload`] (raw bytes beside a body, zero-copy when large), [`link`] (what RPC runs over), [`method`], then [`server`] and [`client`].

pub mod client;
mod codec;
mod depth;
#[doc(hidden)]
pub mod fuzz_api;
pub mod link;
pub mod method;
pub mod payload;
pub mod server;
pub mod status;
pub mod wire;

/// (For [`endpoint_link!`].)
#[doc(hidden)]
pub use rdmx_core as __core;

pub use client::{Client, ClientConfig, ClientStats, PendingCall};
pub use link::Link;
pub use method::Method;
pub use payload::{Attach, Payload};
pub use server::{
    CallContext, Limits, LinkSet, Server, ServerConfig, ServerStats, Service, ServiceBuilder,
    ServiceError, SetRecv,
};
pub use status::{Code, Status};
