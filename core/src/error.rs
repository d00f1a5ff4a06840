//! The middleware's error type.

use std::time::Duration;

use rdmx_verbs::VerbsError;

use crate::bootstrap::BootstrapError;
use crate::event::DisconnectCause;

/// Result alias for the middleware.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong in the middleware.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A verbs call failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// Posting a work request failed.
    #[error(transparent)]
    Post(#[from] rdmx_verbs::PostError),
    /// The endpoint exchange over TCP failed.
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    /// A configuration value (builder or `RDMX_*` variable) is invalid.
    #[error("configuration: {0}")]
    Config(String),
    /// The operation cannot proceed now without blocking (no credit, no buffer, nothing
    /// received yet); try again later.
    #[error("operation would block")]
    WouldBlock,
    /// A blocking operation did not finish in time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The message is larger than the configured maximum.
    #[error("message of {len} bytes exceeds the maximum of {max} bytes")]
    MessageTooLarge {
        /// The message length.
        len: usize,
        /// The limit (`Config::max_message`).
        max: usize,
    },
    /// The buffer pool cannot supply a buffer of this size (it is larger than the pool may
    /// ever hold).
    #[error("a {0}-byte buffer exceeds the pool's capacity")]
    PoolCapacity(usize),
    /// The endpoint is closed or broken.
    #[error("endpoint disconnected: {0}")]
    Disconnected(DisconnectCause),
    /// The peer violated the protocol (bad header, impossible credit value, ...).
    #[error("protocol violation by the peer: {0}")]
    Protocol(String),
    /// The API was used in a way it does not support.
    #[error("invalid use: {0}")]
    InvalidArgument(String),
    /// The endpoint's transport cannot do this (one-sided operations on a UD endpoint).
    #[error("unsupported: {0}")]
    Unsupported(String),
}
