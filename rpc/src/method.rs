//! Methods, declared once and used by both sides: a [`Method`] names a call and fixes its
//! request and response types.
//!
//! ```
//! use rdmx_rpc::Method;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! pub struct Get { pub key: String }
//!
//! /// The service's methods, shared by the server (which registers a handler for each)
//! /// and its clients (which call them).
//! pub const GET: Method<Get, Option<Vec<u8>>> = Method::new("kv.get");
//! ```

use std::fmt;
use std::marker::PhantomData;

use crate::wire::method_id;

/// A method: its name (and the id derived from it) and its request and response types.
pub struct Method<Req, Resp> {
    name: &'static str,
    id: u32,
    _types: PhantomData<fn(Req) -> Resp>,
}

impl<Req, Resp> Method<Req, Resp> {
    /// The method named `name` (the id on the wire is the FNV-1a hash of the name: two
    /// methods of one server must not share it, which registering checks).
    pub const fn new(name: &'static str) -> Self {
        Self {
            name,
            id: method_id(name),
            _types: PhantomData,
        }
    }

    /// Its name.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// Its id on the wire.
    pub const fn id(&self) -> u32 {
        self.id
    }
}

impl<Req, Resp> Clone for Method<Req, Resp> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<Req, Resp> Copy for Method<Req, Resp> {}

impl<Req, Resp> fmt::Debug for Method<Req, Resp> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Method({:?}, {:#010x})", self.name, self.id)
    }
}
