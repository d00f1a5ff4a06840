//! # rdmx-rc
//!
//! Reliable-connected endpoints over the verbs API: a [`Context`] owns the device, one
//! shared receive queue for every endpoint, the registered buffer pool and the progress
//! engine; an [`Endpoint`] is one RC queue pair to a peer, with credit flow control and three
//! send protocols chosen by size (inline, eager, rendezvous).
//!
//! DESIGN.md places the context in `rdmx-core`. It lives here instead: the context's progress
//! engine routes every completion to an endpoint, so it has to know the endpoint protocol,
//! and putting it in core would either pull the RC transport into core or need a transport
//! trait object on the hottest path. Core keeps what is transport-independent (configuration,
//! buffer pool, header, credits, bootstrap); a UD transport will get its own context type or
//! a trait once it exists, decided with two real implementations in hand.
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

// The modules in their layers, bottom up: each uses only those below it.
//
// 1. `wire` (the RC-only wire items), `util`, `ep` (per-endpoint state), `node` (XRC nodes);
// 2. `state`: the transport's resources and state, and how handles reach them;
// 3. `engine`: the progress engine (completions, credits, rendezvous, recall, sends,
//    teardown, keepalives), one type's methods;
// 4. `setup`: queue pairs, registering and completing endpoints;
// 5. `conn` and `xrc`: the RC and XRC exchanges (`conn` hands XRC contexts to `xrc`);
// 6. `transport`: the `Transport` the worker drives;
// 7. the handles: `endpoint`, `accept` (listener exchanges), `attach` (the transport as a
//    worker's, and its listener), `context`, `asyncio`.
mod accept;
#[cfg(feature = "tokio")]
mod asyncio;
mod attach;
mod conn;
mod context;
mod endpoint;
mod engine;
mod ep;
mod node;
mod setup;
mod state;
mod transport;
mod util;
pub mod wire;
mod xrc;

pub use attach::{Listener, RcTransport};
pub use context::{Context, ContextBuilder, ContextParts, FromParts, MAX_ENDPOINTS, open_worker};
pub use endpoint::{Endpoint, LocalRegion, RemoteRegion};
pub use node::Node;
pub use rdmx_core::worker::{Batch, IntoBufError, MAX_EVENTS, Message};
pub use rdmx_verbs::SharedBytes;
pub use state::Stats;

/// The handles applications pass between threads stay `Send + Sync` (a compile-time check:
/// a field that is not, such as an `Rc`, fails the build here rather than in a user's code).
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Context>();
    send_sync::<Endpoint>();
    send_sync::<Listener>();
    send_sync::<Message>();
    send_sync::<LocalRegion>();
    send_sync::<RemoteRegion>();
    send_sync::<Node>();
};
