//! [`SharedBuf`]: a pooled buffer several sends share (fan-out without copies).

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use super::Buf;

/// A pooled buffer shared by several sends: cloning is a reference count, every clone sees
/// the same bytes, and the buffer goes back to the pool when the last clone is dropped and
/// the last send of it is done (a rendezvous send keeps a clone until the peer has read
/// it). Made from a [`Buf`] (`SharedBuf::from(buf)`) or a received message
/// (`Message::into_shared`). Its bytes can no longer change: a peer may be reading them.
#[derive(Clone)]
pub struct SharedBuf(Arc<Buf>);

impl SharedBuf {
    /// The buffer underneath (its keys, for a transport posting it).
    pub fn buf(&self) -> &Buf {
        &self.0
    }

    /// The buffer back, if this is the last clone.
    ///
    /// # Errors
    /// The shared buffer back, while other clones (or sends) hold it.
    pub fn try_unwrap(self) -> Result<Buf, Self> {
        Arc::try_unwrap(self.0).map_err(Self)
    }

    /// How many clones (including sends under way) share it.
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.0)
    }
}

impl From<Buf> for SharedBuf {
    fn from(b: Buf) -> Self {
        Self(Arc::new(b))
    }
}

impl Deref for SharedBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl AsRef<[u8]> for SharedBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl fmt::Debug for SharedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBuf")
            .field("buf", &*self.0)
            .field("holders", &self.holders())
            .finish()
    }
}
