//! Hooks for the fuzzing harness (`rdmx-fuzz`): the body codec, which is crate-private,
//! and the client's reading of a response frame. Not part of the supported API: hidden from
//! the documentation, and free to change with the harness.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::status::Status;
use crate::wire::{self, Header};

/// A body decoded as a server decodes a request's (all of `body`, allocating at most
/// `limit` bytes).
///
/// # Errors
/// The decoder's, in words.
pub fn decode_body<T: DeserializeOwned>(body: &[u8], limit: usize) -> Result<T, String> {
    crate::codec::decode(body, limit)
}

/// A whole frame: `header` (its length set) and `value` encoded as a body, as a client or
/// a server builds it.
///
/// # Errors
/// The encoder's, or the limit's (in words).
pub fn encode_frame<T: Serialize + ?Sized>(
    header: Header,
    value: &T,
    limit: usize,
) -> Result<Vec<u8>, String> {
    let mut framed = crate::codec::encode_framed(value, limit)?;
    wire::seal(header, &mut framed);
    Ok(framed)
}

/// What a client makes of a response frame: the decoded body, or the call's failure.
///
/// # Errors
/// The [`Status`] the client would return.
pub fn decode_response<T: DeserializeOwned>(frame: &[u8], limit: usize) -> Result<T, Status> {
    crate::client::decode_response(frame, limit)
}
