//! Call outcomes, as gRPC names them: a [`Code`] and a message.

use thiserror::Error;

/// Why a call did not give its response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Code {
    /// The call was cancelled (by its caller, or the client went away).
    Cancelled,
    /// The deadline passed before the response came (at the client), or before the server
    /// could run the handler (the server dropped the work).
    DeadlineExceeded,
    /// The handler did not find what the request named.
    NotFound,
    /// The request did not decode as the method's request type, or the handler refused it.
    InvalidArgument,
    /// A size limit (request or response), or the server's queue, was exceeded.
    ResourceExhausted,
    /// The peer is gone or cannot be reached; the call may or may not have run.
    Unavailable,
    /// The handler panicked, the response did not encode, or the peer broke the protocol.
    Internal,
    /// The server has no such method.
    Unimplemented,
}

impl Code {
    /// Its number on the wire (gRPC's numbers; 0 is success).
    pub fn to_u8(self) -> u8 {
        match self {
            Self::Cancelled => 1,
            Self::InvalidArgument => 3,
            Self::DeadlineExceeded => 4,
            Self::NotFound => 5,
            Self::ResourceExhausted => 8,
            Self::Unimplemented => 12,
            Self::Internal => 13,
            Self::Unavailable => 14,
        }
    }

    /// The code of wire number `v` (`None` for 0, success, and numbers we do not know).
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Cancelled,
            3 => Self::InvalidArgument,
            4 => Self::DeadlineExceeded,
            5 => Self::NotFound,
            8 => Self::ResourceExhausted,
            12 => Self::Unimplemented,
            13 => Self::Internal,
            14 => Self::Unavailable,
            _ => return None,
        })
    }
}

/// A call's failure: a [`Code`] and a message for people.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{code:?}: {message}")]
pub struct Status {
    /// What kind of failure.
    pub code: Code,
    /// What happened, in words.
    pub message: String,
}

impl Status {
    /// A status of `code` with `message`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// `Cancelled`.
    pub fn cancelled(message: impl Into<String>) -> Self {
        Self::new(Code::Cancelled, message)
    }

    /// `DeadlineExceeded`.
    pub fn deadline_exceeded(message: impl Into<String>) -> Self {
        Self::new(Code::DeadlineExceeded, message)
    }

    /// `NotFound`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }

    /// `InvalidArgument`.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    /// `ResourceExhausted`.
    pub fn resource_exhausted(message: impl Into<String>) -> Self {
        Self::new(Code::ResourceExhausted, message)
    }

    /// `Unavailable`.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(Code::Unavailable, message)
    }

    /// `Internal`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Code::Internal, message)
    }

    /// `Unimplemented`.
    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new(Code::Unimplemented, message)
    }

    /// The status a transport error means for a call: the peer gone or unreachable is
    /// `Unavailable`, a message over a limit `ResourceExhausted`, anything else `Internal`.
    pub fn from_transport(e: &rdmx_core::Error) -> Self {
        use rdmx_core::Error as E;
        match e {
            E::Disconnected(cause) => Self::unavailable(format!("the peer is gone: {cause:?}")),
            E::MessageTooLarge { len, max } => Self::resource_exhausted(format!(
                "a message of {len} bytes; the endpoint takes at most {max}"
            )),
            E::Timeout(t) => Self::deadline_exceeded(format!("no room to send within {t:?}")),
            other => Self::internal(format!("transport: {other}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_numbers_are_none() {
        for c in [
            Code::Cancelled,
            Code::DeadlineExceeded,
            Code::NotFound,
            Code::InvalidArgument,
            Code::ResourceExhausted,
            Code::Unavailable,
            Code::Internal,
            Code::Unimplemented,
        ] {
            assert_eq!(Code::from_u8(c.to_u8()), Some(c));
        }
        assert_eq!(Code::from_u8(0), None);
        assert_eq!(Code::from_u8(200), None);
    }
}
