//! What a session is configured with, how it ends, what sending it refuses, its counters.

use std::time::Duration;

use thiserror::Error;

/// How a session behaves.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Largest datagram (header included): the path MTU's payload.
    pub max_datagram: usize,
    /// Largest message either way.
    pub max_message: usize,
    /// Datagrams in flight at most.
    pub send_window: u32,
    /// Datagrams the peer may send beyond what the application has not taken yet.
    pub recv_window: u32,
    /// Bytes of messages queued for sending before `send` says `WouldBlock`.
    pub max_queued: usize,
    /// Messages up to this size may share a datagram.
    pub pack_max: usize,
    /// First retransmission timeout.
    pub rto: Duration,
    /// Longest retransmission timeout.
    pub max_rto: Duration,
    /// An acknowledgement waits at most this long for a datagram to ride on.
    pub ack_delay: Duration,
    /// A peer silent (or acknowledging nothing) this long is unreachable.
    pub peer_timeout: Duration,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            max_datagram: 4096,
            max_message: 64 << 20,
            send_window: 64,
            recv_window: 64,
            max_queued: 1 << 20,
            pack_max: 256,
            rto: Duration::from_millis(5),
            max_rto: Duration::from_millis(200),
            ack_delay: Duration::from_micros(50),
            peer_timeout: Duration::from_secs(2),
        }
    }
}

/// Why a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// This side closed, and the peer confirmed.
    LocalClose,
    /// The peer closed in order: everything it sent was delivered.
    PeerClosed,
    /// The peer stopped answering.
    PeerUnreachable,
    /// The peer broke the protocol (what it did).
    Protocol(String),
}

/// Why `send` refused a message.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SendError {
    /// The send queue is full: try again once datagrams are acknowledged.
    #[error("the send queue is full")]
    WouldBlock,
    /// Longer than `max_message`.
    #[error("message of {len} bytes; the limit is {max}")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The session is closing or closed.
    #[error("the session is closed")]
    Closed,
}

/// What a session counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// Datagrams sent (first transmissions and retransmissions, acknowledgements).
    pub sent: u64,
    /// Of those, retransmissions.
    pub retransmits: u64,
    /// Of those, acknowledgements and probes sent alone.
    pub acks: u64,
    /// Datagrams received and accepted.
    pub received: u64,
    /// Duplicates dropped.
    pub duplicates: u64,
    /// Datagrams that arrived ahead of a missing one (held, inside the credit).
    pub out_of_order: u64,
    /// Datagrams dropped: beyond the credit granted, or acknowledging what was never sent.
    pub refused: u64,
    /// Messages delivered whole.
    pub delivered: u64,
    /// Messages that shared a datagram.
    pub packed: u64,
    /// Credit the peer gave back unused (sequence numbers it skipped after a recall).
    pub skipped: u64,
}
