//! Payloads: raw bytes that travel beside a call's (or a response's) typed body, as a
//! message of their own right after its frame, so that large ones go zero-copy.
//!
//! On RC and XRC endpoints a payload at or above the rendezvous threshold is read by the
//! peer straight from where it is: an [`Attach::Buf`] from its pool buffer, an
//! [`Attach::Shared`] from the application's memory (through the registration cache); the
//! receiver gets it in a pool buffer of its own ([`Payload::into_buf`] hands that buffer
//! over without a copy). Smaller payloads, and every payload on UD endpoints, are copied
//! as any message is.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use rdmx_core::{Buf, Message};
use rdmx_rc::SharedBytes;

/// A payload to send: a pooled buffer, or shared bytes (an `Arc<[u8]>`, a `Vec<u8>` taken
/// over, `&'static [u8]`). Neither is copied at rendezvous sizes on RC and XRC.
pub enum Attach {
    /// A buffer of the endpoint's pool (it returns there once the peer has read it).
    Buf(Buf),
    /// Application bytes (kept alive until the peer has read them).
    Shared(SharedBytes),
}

impl Attach {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Self::Buf(b) => b.len(),
            Self::Shared(s) => s.len(),
        }
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Deref for Attach {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Self::Buf(b) => b,
            Self::Shared(s) => s,
        }
    }
}

impl fmt::Debug for Attach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self {
            Self::Buf(_) => "Buf",
            Self::Shared(_) => "Shared",
        };
        write!(f, "Attach::{kind}({} bytes)", self.len())
    }
}

impl From<Buf> for Attach {
    fn from(b: Buf) -> Self {
        Self::Buf(b)
    }
}

impl From<SharedBytes> for Attach {
    fn from(s: SharedBytes) -> Self {
        Self::Shared(s)
    }
}

impl From<Vec<u8>> for Attach {
    fn from(v: Vec<u8>) -> Self {
        Self::Shared(v.into())
    }
}

impl From<Arc<[u8]>> for Attach {
    fn from(a: Arc<[u8]>) -> Self {
        Self::Shared(a.into())
    }
}

impl From<&'static [u8]> for Attach {
    fn from(s: &'static [u8]) -> Self {
        Self::Shared(s.into())
    }
}

/// A received payload: a message of the endpoint (its receive buffer, or for a large one
/// a pool buffer of its own), or, over links that are not rdmx endpoints, a vector.
pub struct Payload(Inner);

enum Inner {
    Message(Message),
    Vec(Vec<u8>),
}

impl Payload {
    /// Whether it arrived in a pool buffer of its own (the one [`into_buf`](Self::into_buf)
    /// gives without a copy): by rendezvous on RC and XRC, reassembled on UD.
    pub fn is_rendezvous(&self) -> bool {
        matches!(&self.0, Inner::Message(m) if m.is_rendezvous())
    }

    /// The payload as a pool buffer: a rendezvous payload's own buffer (no copy), else a
    /// copy into the endpoint's pool (see `Message::into_buf`).
    ///
    /// # Errors
    /// The payload back, when it did not come through an rdmx endpoint (no pool: use
    /// [`into_vec`](Self::into_vec)) or the pool has no room for the copy now.
    pub fn into_buf(self) -> Result<Buf, Self> {
        match self.0 {
            Inner::Message(m) => m.into_buf().map_err(|e| Self(Inner::Message(e.message))),
            Inner::Vec(v) => Err(Self(Inner::Vec(v))),
        }
    }

    /// The payload as a vector (a copy, unless it came as one).
    pub fn into_vec(self) -> Vec<u8> {
        match self.0 {
            Inner::Message(m) => m.to_vec(),
            Inner::Vec(v) => v,
        }
    }
}

impl Deref for Payload {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.0 {
            Inner::Message(m) => m,
            Inner::Vec(v) => v,
        }
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Payload")
            .field("len", &self.len())
            .field("rendezvous", &self.is_rendezvous())
            .finish()
    }
}

impl From<Message> for Payload {
    fn from(m: Message) -> Self {
        Self(Inner::Message(m))
    }
}

impl From<Vec<u8>> for Payload {
    fn from(v: Vec<u8>) -> Self {
        Self(Inner::Vec(v))
    }
}
