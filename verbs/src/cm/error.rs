//! Errors of the connection manager's calls.

use std::io;

use super::event::CmEventKind;
use crate::error::{PostError, VerbsError};
use crate::types::WcStatus;

/// Errors of the connection manager (`rdma_*` calls).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// A verbs call the CM made failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// Posting a work request failed.
    #[error(transparent)]
    Post(#[from] PostError),
    /// An operating-system call failed (binding the CM socket, sending, creating the thread).
    #[error("{op} failed: {error}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        error: io::Error,
    },
    /// The call does not fit the ID's state (e.g. `accept` on an ID that got no request,
    /// `connect` before `resolve_addr`).
    #[error("cannot {op}: {why}")]
    InvalidState {
        /// The call.
        op: &'static str,
        /// What is missing or wrong.
        why: &'static str,
    },
    /// Private data longer than the message carries (56 bytes on connect, 196 on accept,
    /// 148 on reject).
    #[error("{len} bytes of private data exceed the {max} bytes {op} carries")]
    PrivateDataTooLong {
        /// The call.
        op: &'static str,
        /// Bytes given.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// An argument is invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Not supported (a device other than the soft provider, SIDR, ...).
    #[error("not supported: {0}")]
    Unsupported(&'static str),
    /// Nothing came in time.
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
    /// Another event came than the one waited for.
    #[error("expected {expected}, got {got} (status {status})")]
    UnexpectedEvent {
        /// The kind waited for.
        expected: CmEventKind,
        /// The kind that came.
        got: CmEventKind,
        /// Its status.
        status: i32,
    },
    /// A work request completed with an error status (`rdma_get_send_comp` /
    /// `rdma_get_recv_comp` return the completion; this is for callers that want `?`).
    #[error("work request {wr_id} completed with {status:?}")]
    Completion {
        /// The work request.
        wr_id: u64,
        /// Its status.
        status: WcStatus,
    },
}

impl From<CmError> for io::Error {
    fn from(e: CmError) -> Self {
        let kind = match &e {
            CmError::Io { error, .. } => error.kind(),
            CmError::Timeout(_) => io::ErrorKind::TimedOut,
            CmError::Unsupported(_) => io::ErrorKind::Unsupported,
            _ => io::ErrorKind::InvalidInput,
        };
        Self::new(kind, e)
    }
}
