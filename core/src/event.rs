//! Events reported to the application.

use std::fmt;

/// Why an endpoint stopped working.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DisconnectCause {
    /// The peer closed the endpoint in an orderly way (everything it sent was delivered).
    PeerClosed,
    /// This side closed the endpoint (`close()`, or dropping it while open): what its own
    /// calls and its `Event::Disconnected` report once the orderly close it started is done.
    LocalClose,
    /// The peer stopped answering: the transport exhausted its retries (peer dead, or every
    /// path down). Carries the completion status that reported it.
    PeerUnreachable(String),
    /// The queue pair went to the error state for another reason (a work completion error or
    /// a fatal asynchronous event).
    TransportError(String),
    /// The peer violated the protocol.
    Protocol(String),
    /// The context was dropped.
    ContextClosed,
    /// The peer's endpoint went down without an orderly close (its close timed out, its
    /// context was dropped, or it failed), and its side said so. Over XRC this is how a
    /// peer learns it: the queue pairs its endpoint used stay up for the other endpoints.
    PeerAborted,
}

impl fmt::Display for DisconnectCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::PeerClosed => f.write_str("the peer closed the endpoint"),
            Self::LocalClose => f.write_str("closed locally"),
            Self::PeerUnreachable(s) => write!(f, "the peer is unreachable ({s})"),
            Self::TransportError(s) => write!(f, "transport error ({s})"),
            Self::Protocol(s) => write!(f, "protocol violation ({s})"),
            Self::ContextClosed => f.write_str("the context was dropped"),
            Self::PeerAborted => f.write_str("the peer's endpoint went down without closing"),
        }
    }
}

/// Something that happened to an endpoint, reported by `Context::poll_event`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// The endpoint's queue pair migrated to its alternate path (automatic path migration).
    PathMigrated {
        /// The endpoint's identifier.
        endpoint: u64,
    },
    /// An alternate path was loaded and armed again after a migration.
    PathRearmed {
        /// The endpoint's identifier.
        endpoint: u64,
    },
    /// The endpoint is no longer usable.
    Disconnected {
        /// The endpoint's identifier.
        endpoint: u64,
        /// Why.
        cause: DisconnectCause,
    },
}
