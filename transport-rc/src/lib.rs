//! # rdmx-rc
//!
//! Reliable-connected (and XRC) endpoints over the verbs API, as a transport of an
//! `rdmx_core::worker::Worker`: [`RcTransport`] attaches to a worker one completion queue
//! and shared receive queue for every endpoint, and the mailbox region peers write credits
//! into; an [`Endpoint`] is one RC queue pair (or a share of an XRC initiator) to a peer,
//! with credit flow control and three send protocols chosen by size (inline, eager,
//! rendezvous). The worker runs its progress (`Transport` in `transport.rs`), waits and
//! background thread.
//!
//! [`Context`] is the RC-only context (a worker with this transport), which this crate's own
//! tests use; applications use the `rdmx` facade's, which composes the worker with every
//! transport.
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
// `unsafe` appears once, to vouch for the posting rules in `transport.rs` (no unsafe
// operation anywhere in the crate).
#![deny(unsafe_code)]

// The modules in their layers, bottom up: each uses only those below it.
//
// 1. `wire` (the RC-only wire items), `util`, `timers` (each endpoint's deadlines and the
//    queue of wakes), `ep` (per-endpoint state), `node` (XRC nodes);
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
mod ops;
mod setup;
mod state;
mod timers;
mod transport;
mod util;
pub mod wire;
mod xrc;

pub use attach::{Listener, RcTransport};
pub use context::{Context, ContextBuilder, ContextParts, FromParts, MAX_ENDPOINTS, open_worker};
pub use endpoint::{Endpoint, LocalRegion, RemoteAccess, RemoteRegion};
pub use node::Node;
pub use ops::{OpOutput, PendingOp};
pub use rdmx_core::SharedBuf;
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
