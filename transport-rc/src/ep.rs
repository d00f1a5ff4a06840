//! The per-endpoint state kept inside a context (the `Endpoint` handle only names it).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use crate::timers::Timers;

use rdmx_core::credit::{RecvWindow, SendWindow};
use rdmx_core::header::RtsInfo;
use rdmx_core::worker::WaitSlot;
use rdmx_core::{Buf, DisconnectCause};
use rdmx_verbs::{QueuePair, WcStatus};

use crate::wire::Mailbox;

/// Credit-recall bookkeeping of an endpoint (see `recall.rs`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RecallState {
    /// Credits we gave back to the peer (cumulative; written into the peer's slot).
    pub(crate) returned_out: u32,
    /// Recall requests we made to the peer (cumulative, 29 bits; written into the peer's
    /// slot).
    pub(crate) requested_out: u32,
    /// Our latest request asks for every credit (see `recall.rs`).
    pub(crate) ask_all: bool,
    /// We told the peer we wait to send with no credit.
    pub(crate) starving: bool,
    /// We told the peer we close with no credit for the Close.
    pub(crate) closing: bool,
    /// The peer closes with no credit for its Close: its window may exceed the target by
    /// one until it is granted (`distribute`).
    pub(crate) close_wanted: bool,
    /// ... and that credit was granted (once: it can carry nothing but the Close).
    pub(crate) close_granted: bool,
    /// Since when we have been out of credits with something to send.
    pub(crate) starved_since: Option<Instant>,
    /// When a message took our last credit (the peer may not grant more unless asked).
    pub(crate) emptied_at: Option<Instant>,
    /// The peer's `returned` counter already applied to our receive window.
    pub(crate) returned_seen: u32,
    /// The peer's `recall` counter already answered.
    pub(crate) requested_seen: u32,
}

/// Where an endpoint is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Status {
    /// Set up, and being connected: the peer's details (its mailbox above all) are not
    /// known yet, so nothing may be written to it. Grants made meanwhile are written once
    /// it opens (`conn::complete`).
    Connecting,
    /// Sending and receiving.
    Open,
    /// `close()` was called: no new sends; in-flight ones drain, then a Close goes out.
    Closing,
    /// Finished (orderly or not); the cause is what calls report.
    Down(DisconnectCause),
}

/// Something received, in arrival order.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// An eager message ready for the application: its receive buffer (which goes back to
    /// the shared receive queue), and the payload's offset.
    Msg { buf: Buf, off: usize },
    /// A rendezvous message being read (or waiting for a destination buffer).
    Rndv {
        len: u32,
        rts: RtsInfo,
        dest: Option<Buf>,
        posted: bool,
        done: bool,
    },
    /// A packed frame (a receive buffer holding several small messages): the next entry
    /// starts at `off`, the payload ends at `end`. Its messages are handed out as views of
    /// the frame (no copy), each holding a reference; the buffer goes back to the shared
    /// receive queue with the last reference (`Shared::release_frame`).
    Packed {
        frame: Arc<Buf>,
        off: usize,
        end: usize,
    },
    /// The peer closed: every message it sent is before this marker.
    Closed,
}

/// What a posted send work request holds until it completes.
#[derive(Debug)]
pub(crate) enum Hold {
    /// Nothing (inline data, mailbox writes).
    None,
    /// A buffer the NIC reads from (eager send) — released at completion.
    Buf(Buf),
    /// Application bytes the NIC reads from (kept after a failure until the queue pair is
    /// flushed).
    // Held only to keep the registration and its bytes alive.
    #[allow(dead_code)]
    Shared(rdmx_core::Registered),
    /// A one-sided operation the application waits for (a local pooled buffer is returned
    /// with the result).
    Op(OpSource),
}

/// The local side of a one-sided operation.
#[derive(Debug)]
pub(crate) enum OpSource {
    /// None (the data is inline or there is none).
    None,
    /// A pooled buffer: written by READs and atomics, read by WRITEs; given back.
    Buf(Buf),
    /// Application bytes an RDMA WRITE reads in place (`write_shared`).
    Shared(rdmx_core::Registered),
}

/// The result of a one-sided operation.
#[derive(Debug)]
pub(crate) struct OpResult {
    pub(crate) seq: u32,
    pub(crate) status: WcStatus,
    pub(crate) buf: Option<Buf>,
}

/// One endpoint.
#[derive(Debug)]
pub(crate) struct Ep {
    /// Public identifier (unique within the context).
    pub(crate) id: u64,
    /// Index in the context's endpoint table (also in work-request ids).
    pub(crate) key: usize,
    /// The queue pair it sends on: its own RC queue pair, or the context's XRC initiator
    /// towards the peer's node (shared with the other endpoints to that node).
    pub(crate) qp: Arc<QueuePair>,
    /// Number of `qp` (send completions carry it).
    pub(crate) qpn: u32,
    /// Number of the queue pair its messages arrive through (the RC queue pair, or this
    /// node's XRC target for the peer's initiator).
    pub(crate) recv_qpn: u32,
    /// XRC: the peer context's receive queue.
    pub(crate) remote_srqn: Option<u32>,
    /// The peer's context (its random identifier): our endpoints with the same one use
    /// credits of the same receive buffers.
    pub(crate) peer_context: u64,
    /// The peer's number for this endpoint (the header tag of everything we send).
    pub(crate) peer_tag: u16,
    pub(crate) status: Status,
    /// The application's handle was dropped: remove once down.
    pub(crate) detached: bool,
    /// We sent our Close.
    pub(crate) close_sent: bool,
    /// The peer's Close arrived.
    pub(crate) peer_closed: bool,
    /// This side closed first (`close()` or a drop while open): the orderly end is then
    /// reported as `LocalClose`, else as `PeerClosed`.
    pub(crate) closed_here: bool,

    // Flow control.
    pub(crate) send: SendWindow,
    pub(crate) recv: RecvWindow,
    pub(crate) in_needy: bool,
    /// What threads blocked on this endpoint sleep on, and what has happened on it (see
    /// `rdmx_core::worker::wait_until`): completions and state changes of this endpoint
    /// wake only them, not every thread waiting on the context.
    pub(crate) wait: WaitSlot,
    /// Closed in order with messages still queued: the `Disconnected` event waits for the
    /// last of them to be taken.
    pub(crate) close_event_due: bool,
    /// Where our grants go in the peer's memory.
    pub(crate) peer_mailbox: (u64, u32),
    /// The peer's slot may be written: its window is bound (the listening side learns it
    /// from the peer's `Signal::Ready` or first message; see `setup.rs`).
    pub(crate) peer_ready: bool,
    /// The memory window through which the peer (and only its queue pair) writes our
    /// slot, with the key the peer was given (`None` without confinement).
    pub(crate) mailbox_mw: Option<(rdmx_verbs::MemoryWindow, rdmx_verbs::Rkey)>,
    /// Our slot, which the peer writes.
    pub(crate) slot: Slot,
    /// XRC: we told the peer that this endpoint went down (`Recall::GONE`) and wait for its
    /// answer before its key and buffers may go (see `engine/teardown.rs`).
    pub(crate) awaiting_gone: bool,
    pub(crate) mailbox_seen: Mailbox,
    /// The peer's limits.
    pub(crate) peer_eager_limit: usize,
    pub(crate) peer_max_message: usize,

    // Send queue.
    pub(crate) next_seq: u32,
    pub(crate) sq_depth: u32,
    pub(crate) unsignaled: u32,
    pub(crate) inflight: VecDeque<(u32, Hold)>,
    /// Signaled work requests not yet completed (each gives exactly one completion).
    pub(crate) signaled_out: u32,
    pub(crate) ops_done: Vec<OpResult>,
    /// One-sided operations still posted whose results nobody waits for (dropped when
    /// they come: see `Ep::op_done`).
    pub(crate) ops_abandoned: Vec<u32>,
    /// The connection data the peer sent (`Endpoint::peer_data`).
    pub(crate) peer_data: Arc<[u8]>,

    // Rendezvous, sender side: buffers the peer reads, released when it reports them done.
    pub(crate) rndv_out: VecDeque<RndvOut>,
    pub(crate) rndv_out_done: u32,
    // Rendezvous, receiver side: reads finished (cumulative) and the value told to the peer.
    pub(crate) rndv_in_done: u32,
    pub(crate) rndv_in_adv: u32,
    /// Small messages sent inside a send batch and not yet posted: a pooled buffer with
    /// the frame's header space, then entries up to its length (see `send.rs`). It holds
    /// one of the peer's credits, taken when it was opened.
    pub(crate) pack: Option<Buf>,
    /// Rendezvous requests received (cumulative).
    pub(crate) rndv_in_seen: u32,
    /// The peer's rendezvous window is full (a request carried `Header::WAKE_ON_READ`):
    /// report reads done with a signal once `rndv_in_done` reaches this, half of what was
    /// then outstanding (the peer sleeps once per half window, not once per message).
    pub(crate) rndv_wake_at: Option<u32>,
    /// Rendezvous messages announced by the peer and not yet taken by the application.
    /// They count against the endpoint's credit window (the RTS buffer itself is reposted
    /// at once), so a receiver that does not read stops a rendezvous sender just as it stops
    /// an eager one.
    pub(crate) rndv_queued: u32,

    pub(crate) inbox: VecDeque<Inbound>,
    /// Messages delivered to the application so far (for stats and tests).
    pub(crate) delivered: u64,
    /// The peer's two paths (primary, alternate) when both sides have two ports: the
    /// endpoint is connected with an alternate path and fails over to it.
    pub(crate) paths: Option<[rdmx_core::bootstrap::PathInfo; 2]>,
    /// The queue pair currently runs on the alternate path (flips at every migration).
    pub(crate) on_alt: bool,
    /// After a migration, the local port of the path left behind, to re-arm once it is up.
    pub(crate) rearm_port: Option<u8>,
    pub(crate) last_rx: Instant,
    pub(crate) recall: RecallState,
    /// When we last probed the silent peer (see `keepalive.rs`).
    pub(crate) keepalive_at: Option<Instant>,
    /// The endpoint's deadlines (`timers.rs`): the keepalive look, the close deadline (set
    /// when the handle is dropped or `close` is called), the linger of a failed endpoint
    /// (not removed before then, although down and dropped: the peer may not know yet),
    /// the re-arm of a path left behind (not before then: re-arming makes the queue pair
    /// send MigReq = 0 again, and the peer follows a migration only when it sees MigReq = 1),
    /// the starving flag, the recall gate, the packed frame's flush.
    pub(crate) timers: Timers,
}

/// A buffer offered to the peer's read, and the window it is offered through (declared
/// first, so that it is deallocated, which closes it, before the buffer goes back).
#[derive(Debug)]
pub(crate) struct RndvOut {
    /// The window (`None` where windows are not used): closed when this is dropped.
    pub(crate) _window: Option<rdmx_verbs::MemoryWindow>,
    /// What the peer reads.
    pub(crate) _src: RndvSrc,
}

/// What a peer reads in a rendezvous; held until it reports the read done (or the queue
/// pair is flushed).
#[derive(Debug)]
pub(crate) enum RndvSrc {
    /// A pooled buffer (`send`, `send_buf`).
    // Held only to keep it out of the pool until the peer's read is done.
    #[allow(dead_code)]
    Buf(Buf),
    /// Application bytes through the registration cache (`send_shared`).
    #[allow(dead_code)]
    Shared(rdmx_core::Registered),
    /// A clone of a pooled buffer several sends share (`send_shared_buf`).
    #[allow(dead_code)]
    SharedBuf(rdmx_core::SharedBuf),
}

impl Ep {
    /// Send work requests posted and not yet completed.
    pub(crate) fn sq_used(&self) -> u32 {
        self.inflight.len() as u32
    }

    /// True when the peer has finished reading every rendezvous buffer we offered and no
    /// packed frame waits to be posted (so a Close may follow).
    pub(crate) fn drained(&self) -> bool {
        self.rndv_out.is_empty() && self.pack.is_none()
    }

    /// Messages (eager or rendezvous) are still queued.
    pub(crate) fn has_pending_messages(&self) -> bool {
        self.inbox.iter().any(|i| {
            matches!(
                i,
                Inbound::Msg { .. } | Inbound::Rndv { .. } | Inbound::Packed { .. }
            )
        })
    }

    /// The front of the inbox is a message that can be delivered now (not the
    /// end-of-stream marker).
    pub(crate) fn has_message(&self) -> bool {
        matches!(
            self.inbox.front(),
            Some(Inbound::Msg { .. })
                | Some(Inbound::Rndv { done: true, .. })
                | Some(Inbound::Packed { .. })
        )
    }

    /// Credits the peer may still use (what a recall can at most give back).
    pub(crate) fn recall_outstanding(&self) -> u32 {
        self.recv.outstanding()
    }

    /// Work requests still name buffers this endpoint holds (sends and one-sided
    /// operations that hold a buffer, rendezvous reads under way).
    pub(crate) fn lends_buffers_to_the_nic(&self) -> bool {
        self.inflight.iter().any(|(_, h)| !matches!(h, Hold::None))
            || self.inbox.iter().any(|i| {
                matches!(
                    i,
                    Inbound::Rndv {
                        posted: true,
                        done: false,
                        ..
                    }
                )
            })
    }

    pub(crate) fn is_open(&self) -> bool {
        self.status == Status::Open
    }

    /// A send on this endpoint waits for a credit, or a packed frame waits to go: the
    /// credits it holds are about to be used.
    pub(crate) fn waits_to_send(&self) -> bool {
        self.recall.starved_since.is_some() || self.pack.is_some()
    }

    pub(crate) fn down_cause(&self) -> Option<DisconnectCause> {
        match &self.status {
            Status::Down(c) => Some(c.clone()),
            _ => None,
        }
    }
}

/// Work-request ids: 2 bits of kind, 30 bits of endpoint key (or receive slot), 32 bits of
/// sequence number.
pub(crate) mod wrid {
    pub(crate) const RECV: u64 = 0;
    pub(crate) const SEND: u64 = 1;
    pub(crate) const READ: u64 = 2;

    pub(crate) fn make(kind: u64, key: usize, seq: u32) -> u64 {
        (kind << 62) | (((key as u64) & 0x3fff_ffff) << 32) | u64::from(seq)
    }

    pub(crate) fn kind(id: u64) -> u64 {
        id >> 62
    }

    pub(crate) fn key(id: u64) -> usize {
        ((id >> 32) & 0x3fff_ffff) as usize
    }

    pub(crate) fn seq(id: u64) -> u32 {
        id as u32
    }
}

/// Where an endpoint's mailbox slot lives.
#[derive(Debug)]
pub(crate) enum Slot {
    /// At this offset in the context's mailbox region, which no peer may write: the peer
    /// writes through a type 2 window bound to the endpoint's queue pair (`Ep::mailbox_mw`).
    InRegion(usize),
    /// A registration of its own, whose key only this endpoint's peer is given (XRC, whose
    /// targets cannot be bound to, and devices without windows): a peer can write its own
    /// slot and nothing beside it. Deregistered when the endpoint is removed.
    Own(rdmx_verbs::MemoryRegion),
}
