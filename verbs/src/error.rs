//! Error types of the verbs API, one per surface: object management ([`VerbsError`]) and
//! work-request posting ([`PostError`]). A failed *work completion* is not an error of these
//! kinds: it is data returned by a successful poll (see `WorkCompletion::status`).

use std::io;

use crate::types::{QpState, QpType};

/// Errors of device, object and queue-pair management calls.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// No device has this name.
    #[error("no RDMA device named {0:?}")]
    DeviceNotFound(String),
    /// The device name could not be parsed.
    #[error("invalid device name {name:?}: {reason}")]
    InvalidDeviceName {
        /// The name given.
        name: String,
        /// Why it is invalid.
        reason: String,
    },
    /// An operating-system call failed. The OS error is part of the message (and so is
    /// not also returned as the `source`, which would print it twice in a chain).
    #[error("{op} failed: {error}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        error: io::Error,
    },
    /// The transition is not legal for this QP type (verbs: EINVAL).
    #[error("illegal QP transition {from} -> {to} for {qp_type:?}")]
    IllegalTransition {
        /// QP type.
        qp_type: QpType,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// A required attribute was missing from the mask (verbs: EINVAL).
    #[error("QP transition {from} -> {to} requires attribute {attr}")]
    MissingAttribute {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// The `IBV_QP_*` mask bit that is required.
        attr: &'static str,
    },
    /// An attribute not allowed in this transition was in the mask (verbs: EINVAL).
    #[error("attribute {attr} is not allowed in QP transition {from} -> {to}")]
    UnexpectedAttribute {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// The offending `IBV_QP_*` mask bit.
        attr: &'static str,
    },
    /// An attribute value is out of range or inconsistent.
    #[error("invalid value for {attr}: {reason}")]
    InvalidAttribute {
        /// The attribute.
        attr: &'static str,
        /// Why.
        reason: String,
    },
    /// An argument is invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The object is in use (verbs: EBUSY), e.g. a memory region with memory windows
    /// bound to it.
    #[error("busy: {0}")]
    Busy(&'static str),
    /// A device limit was reached.
    #[error("resource exhausted: {0}")]
    ResourceExhausted(&'static str),
    /// The operation is not supported by this device or QP type.
    #[error("not supported: {0}")]
    Unsupported(&'static str),
    /// The object no longer exists on the device.
    #[error("{0} does not exist")]
    NoSuchObject(&'static str),
}

impl From<VerbsError> for io::Error {
    fn from(e: VerbsError) -> Self {
        let kind = match &e {
            VerbsError::DeviceNotFound(_) | VerbsError::NoSuchObject(_) => io::ErrorKind::NotFound,
            VerbsError::Io { error, .. } => error.kind(),
            VerbsError::ResourceExhausted(_) => io::ErrorKind::OutOfMemory,
            VerbsError::Unsupported(_) => io::ErrorKind::Unsupported,
            _ => io::ErrorKind::InvalidInput,
        };
        Self::new(kind, e)
    }
}

/// Errors of `post_send` / `post_recv`: the work request was not queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PostError {
    /// The QP's state does not accept this kind of work request.
    #[error("cannot post a {what} work request to a QP in state {state}")]
    InvalidState {
        /// "send" or "receive".
        what: &'static str,
        /// The QP's current state.
        state: QpState,
    },
    /// The queue is full (`max_send_wr` / `max_recv_wr` outstanding).
    #[error("{what} queue full ({depth} work requests outstanding)")]
    QueueFull {
        /// "send" or "receive".
        what: &'static str,
        /// The queue depth.
        depth: u32,
    },
    /// More SGEs than the QP allows.
    #[error("{count} SGEs exceed the QP's limit of {max}")]
    TooManySge {
        /// SGEs given.
        count: usize,
        /// Limit.
        max: u32,
    },
    /// Inline data longer than `max_inline_data`.
    #[error("inline data of {len} bytes exceeds max_inline_data {max}")]
    InlineTooLong {
        /// Bytes given.
        len: usize,
        /// Limit.
        max: u32,
    },
    /// The work request is malformed for this QP type or opcode.
    #[error("invalid work request: {0}")]
    InvalidWorkRequest(&'static str),
    /// The message is longer than the device's maximum message size.
    #[error("message of {len} bytes exceeds the maximum message size {max}")]
    MessageTooLong {
        /// Bytes given.
        len: u64,
        /// Limit.
        max: u64,
    },
    /// The QP no longer exists.
    #[error("queue pair destroyed")]
    Destroyed,
}
