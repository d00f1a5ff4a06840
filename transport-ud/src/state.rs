//! The UD transport's resources ([`Shared`]) and mutable state ([`State`], inside the
//! worker's lock as [`Ud`]), and how handles reach both ([`UdRef`]).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use rdmx_core::bootstrap::DatagramKey;
use rdmx_core::pool::{BufferPool, PostKey};
use rdmx_core::worker::{Cx, TransportId, Wait, WaitSlot, Worker, WorkerState};
use rdmx_core::{Buf, Config, DisconnectCause};
use rdmx_verbs::{
    AddressHandle, CompletionQueue, Gid, ProtectionDomain, Qpn, QueuePair, WorkCompletion,
};
use slab::Slab;

use crate::budget::{Budget, Share};
use crate::session::{Cause, Session, SessionConfig, SessionStats};

/// Completions polled per round.
pub(crate) const POLL_BATCH: usize = 64;
/// Work-request ids: the top bit says a send (else a receive), the rest is the slot.
pub(crate) const SEND_TAG: u64 = 1 << 63;
/// Work-request ids of receives on the control queue pair carry this bit too.
pub(crate) const CTRL_TAG: u64 = 1 << 62;

/// What the transport owns and never changes.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) tid: TransportId,
    pub(crate) post_key: PostKey,
    pub(crate) vctx: rdmx_verbs::Context,
    pub(crate) pd: ProtectionDomain,
    pub(crate) cq: CompletionQueue,
    pub(crate) qp: QueuePair,
    /// The queue pair peers send their acknowledgements to (small buffers, many of them).
    pub(crate) ctrl_qp: QueuePair,
    pub(crate) pool: BufferPool,
    /// The Q_Key of every datagram of rdmx UD endpoints.
    pub(crate) qkey: u32,
    /// The GID index of port 1 (`Config::gid_index`, else its RoCE v2 IPv4-mapped entry).
    pub(crate) gid_index: u32,
    /// How each session behaves (its receive window is the configured credits).
    pub(crate) session: SessionConfig,
    /// The transport has an authentication key: every session's datagrams carry tags.
    pub(crate) keyed: bool,
    /// Send work requests at most in flight.
    pub(crate) sq_depth: u32,
    /// This transport's address (its device port), for peers.
    pub(crate) addr: SocketAddr,
    pub(crate) cfg: Config,
    /// The connection data this transport's listeners answer with.
    pub(crate) accept_data: parking_lot::Mutex<Vec<u8>>,
}

/// One peer: its session, where it is, and who waits on it.
#[derive(Debug)]
pub(crate) struct Peer {
    /// The endpoint's public id.
    pub(crate) id: u64,
    pub(crate) session: Session,
    /// Where its datagrams go (shared by the sessions to one remote transport: see
    /// `State::ahs`).
    pub(crate) ah: Arc<AddressHandle>,
    pub(crate) remote_qpn: Qpn,
    /// Where its acknowledgements go: the peer's control queue pair (or `remote_qpn`).
    pub(crate) remote_ctrl_qpn: Qpn,
    /// With an authentication key: the connection's datagram key (from the bootstrap's
    /// exchange). Every datagram of the session, both ways, ends with its tag.
    pub(crate) mac: Option<DatagramKey>,
    pub(crate) wait: WaitSlot,
    /// The application dropped its handle.
    pub(crate) detached: bool,
    /// The earliest timer queued for the session.
    pub(crate) timer_at: Option<Instant>,
    /// Whether its `Disconnected` event went out.
    pub(crate) told_down: bool,
    /// What it holds of the receive budget.
    pub(crate) share: Share,
}

/// Counters of the transport (beside each session's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdStats {
    /// Datagrams that parsed but named no session of ours (unknown or gone).
    pub unknown_session: u64,
    /// Datagrams that did not parse (truncated, another version, garbage).
    pub malformed: u64,
    /// With a key: datagrams without a valid tag of their session's key (a stranger's,
    /// another session's, or altered), dropped before the session sees them.
    pub unauthenticated: u64,
    /// Receive completions in error (flushes at teardown, mostly).
    pub recv_errors: u64,
    /// Send completions in error.
    pub send_errors: u64,
    /// Datagrams a session produced that could not be posted (no pool buffer or send
    /// slot): lost here like on the wire, recovered by retransmission.
    pub send_dropped: u64,
    /// Datagrams sent (posted).
    pub datagrams_sent: u64,
    /// Datagrams received (completions).
    pub datagrams_received: u64,
    /// Receive windows granted from the shared budget (sessions set up with one included).
    pub grants: u64,
    /// Windows taken back from sessions holding them, for sessions waiting for one.
    pub recalls: u64,
    /// Requests for credit that waited for room in the budget.
    pub credit_waits: u64,
    /// Of the sessions (open or ended): datagrams sent again.
    pub retransmits: u64,
    /// Of the sessions: duplicate datagrams dropped.
    pub duplicates: u64,
    /// Of the sessions: datagrams that arrived ahead of a missing one (held until it came).
    pub out_of_order: u64,
    /// Of the sessions: datagrams dropped beyond the credit granted (nothing to reassemble
    /// them into), with a stale or forged token, or acknowledging what was never sent.
    pub refused: u64,
    /// Now (not a counter): the datagrams' worth of whole messages the sessions hold for
    /// applications that have not taken them (each session holds at most its window, and
    /// one message that completed beyond it).
    pub held_datagrams: u64,
}

/// Everything that changes, under the worker's lock.
#[derive(Debug)]
pub(crate) struct State {
    /// Sessions by key (their id); `None` while an exchange reserves the key.
    pub(crate) peers: Slab<Option<Peer>>,
    /// Posted receive buffers (work-request id = slot).
    pub(crate) recv_slots: Slab<Buf>,
    /// Send buffers until their completion (work-request id = slot | `SEND_TAG`).
    pub(crate) send_slots: Slab<Buf>,
    /// Session timers: (when, peer key, peer id); stale entries are skipped.
    pub(crate) timers: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    /// Sessions that may have a datagram to send.
    pub(crate) dirty: KeySet,
    /// Sessions that found the send queue full: dirty again once a send completes.
    pub(crate) blocked: KeySet,
    /// The receive buffers the sessions share.
    pub(crate) budget: Budget,
    /// The counters of the sessions removed.
    pub(crate) ended: SessionStats,
    /// Address handles by remote (GID, UDP port), one for every session to it; an entry
    /// leaves with the last session that uses it, so the cache holds one handle per remote
    /// transport with live sessions.
    pub(crate) ahs: HashMap<(Gid, u16), Arc<AddressHandle>>,
    pub(crate) next_id: u64,
    pub(crate) stats: UdStats,
    pub(crate) wc: Vec<WorkCompletion>,
    /// Scratch for one datagram.
    pub(crate) scratch: Vec<u8>,
}

impl State {
    /// State for datagrams of up to `max_datagram` bytes and a data budget of `data`
    /// receive buffers.
    pub(crate) fn new(max_datagram: usize, data: u32) -> Self {
        Self {
            peers: Slab::new(),
            recv_slots: Slab::new(),
            send_slots: Slab::new(),
            timers: BinaryHeap::new(),
            dirty: KeySet::default(),
            blocked: KeySet::default(),
            budget: Budget {
                data: u64::from(data),
                ..Budget::default()
            },
            ahs: HashMap::new(),
            ended: SessionStats::default(),
            next_id: 1,
            stats: UdStats::default(),
            wc: vec![WorkCompletion::EMPTY; POLL_BATCH],
            scratch: vec![0; max_datagram],
        }
    }

    /// The open session `k`.
    pub(crate) fn peer(&self, k: usize) -> Option<&Peer> {
        self.peers.get(k).and_then(Option::as_ref)
    }

    /// The open session `k`, to change.
    pub(crate) fn peer_mut(&mut self, k: usize) -> Option<&mut Peer> {
        self.peers.get_mut(k).and_then(Option::as_mut)
    }

    /// Marks peer `k` as possibly having something to send.
    pub(crate) fn mark_dirty(&mut self, k: usize) {
        self.dirty.insert(k);
    }
}

/// Session keys, each at most once, in the order they came (what changed since a round,
/// with ten thousand sessions: a list with a membership flag by key, not a search).
#[derive(Debug, Default)]
pub(crate) struct KeySet {
    list: Vec<usize>,
    member: Vec<bool>,
}

impl KeySet {
    /// Adds `k` unless it is in.
    pub(crate) fn insert(&mut self, k: usize) {
        if self.member.len() <= k {
            self.member.resize(k + 1, false);
        }
        if !self.member[k] {
            self.member[k] = true;
            self.list.push(k);
        }
    }

    /// Whether the set is empty.
    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Takes every key out, in order.
    pub(crate) fn take(&mut self) -> Vec<usize> {
        for &k in &self.list {
            self.member[k] = false;
        }
        std::mem::take(&mut self.list)
    }
}

/// The transport as the worker holds it.
#[derive(Debug)]
pub(crate) struct Ud {
    pub(crate) sh: Arc<Shared>,
    pub(crate) st: State,
}

/// A handle's way to the transport: its worker, and the resources.
#[derive(Debug, Clone)]
pub(crate) struct UdRef {
    pub(crate) w: Worker,
    pub(crate) sh: Arc<Shared>,
}

impl UdRef {
    /// Runs `f` on the transport under the worker's lock.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&Shared, &mut State, &mut Cx<'_>) -> R) -> R {
        let mut ws = self.w.lock();
        self.on(&mut ws, f)
    }

    /// Runs `f` on the transport, the worker's lock held (`ws`).
    pub(crate) fn on<R>(
        &self,
        ws: &mut WorkerState,
        f: impl FnOnce(&Shared, &mut State, &mut Cx<'_>) -> R,
    ) -> R {
        // Added at `tid` when attached; transports are never removed (they go with the
        // worker, which this handle keeps alive).
        let (t, core) = ws
            .transport::<Ud>(self.sh.tid)
            .expect("the UD transport is in its worker");
        let mut cx = core.cx(&self.w, self.sh.tid);
        f(&self.sh, &mut t.st, &mut cx)
    }

    /// A wait for a message (or the end) of peer `k`.
    pub(crate) fn wait_message(&self, k: usize) -> Wait {
        Wait::message(self.sh.tid, k)
    }

    /// A wait for room to send to peer `k`.
    pub(crate) fn wait_endpoint(&self, k: usize) -> Wait {
        Wait::endpoint(self.sh.tid, k)
    }
}

/// The application's view of why a session ended.
pub(crate) fn disconnect_cause(c: Cause) -> DisconnectCause {
    match c {
        Cause::LocalClose => DisconnectCause::LocalClose,
        Cause::PeerClosed => DisconnectCause::PeerClosed,
        Cause::PeerUnreachable => {
            DisconnectCause::PeerUnreachable("no answer within the peer timeout".into())
        }
        Cause::Protocol(m) => DisconnectCause::Protocol(m),
    }
}
