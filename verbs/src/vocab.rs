//! The vocabulary the public objects and the providers share, beside `types.rs`: device
//! events and counters, and what queue pairs and shared receive queues are created with and
//! report. Neither provider's own: the soft engine and the libibverbs provider both speak it.

use crate::types::{QpCap, QpType, Qpn};

/// Counters a NIC keeps (drops are counted, never silent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NicCounters {
    /// Packets transmitted.
    pub tx_packets: u64,
    /// Payload bytes transmitted.
    pub tx_bytes: u64,
    /// Packets received (before any check).
    pub rx_packets: u64,
    /// Dropped: could not be parsed (truncated, bad lengths, bad version, unknown opcode).
    pub rx_malformed: u64,
    /// Dropped: ICRC mismatch.
    pub rx_bad_icrc: u64,
    /// Dropped: destination QP does not exist or is in a state that takes no packets.
    pub rx_no_qp: u64,
    /// Dropped: wrong source address, P_Key or transport for the QP.
    pub rx_bad_addr: u64,
    /// Dropped: out-of-sequence packets after the first NAK, stale responses, duplicates.
    pub rx_dropped_seq: u64,
    /// Duplicate requests answered (re-ACK, READ re-execution, atomic replay).
    pub rx_duplicates: u64,
    /// RNR NAKs sent (a receive was needed and none was posted).
    pub rnr_naks_sent: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// PSN-sequence NAKs sent.
    pub seq_naks_sent: u64,
    /// Retransmissions started (timeouts, sequence NAKs, implied NAKs).
    pub retransmits: u64,
    /// Local ACK timeouts.
    pub ack_timeouts: u64,
    /// ACK packets sent.
    pub acks_sent: u64,
    /// Completions lost because a CQ overflowed.
    pub cq_overflows: u64,
    /// UD datagrams dropped for a wrong Q_Key (`qkey_viol_cntr`).
    pub rx_qkey_violations: u64,
    /// UD datagrams and UC messages dropped because no receive WQE was posted (UC has no
    /// RNR NAK).
    pub rx_no_recv: u64,
    /// UC messages dropped: a packet of theirs was lost (a PSN gap), or they broke a rule
    /// RC would answer with a NAK (opcode sequence, length, R_Key or permission).
    pub rx_uc_dropped: u64,
    /// Multicast datagrams for a group no QP joined.
    pub rx_no_group: u64,
    /// Queue pairs created (those alive now: this less `qps_destroyed`).
    pub qps_created: u64,
    /// Queue pairs destroyed.
    pub qps_destroyed: u64,
}

/// An asynchronous event (`ibv_async_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// First packet received while in RTR.
    CommEstablished(Qpn),
    /// A QP entered the error state because of a local or transport error.
    QpFatal(Qpn),
    /// Responder detected an invalid request (transport/opcode violation).
    QpRequestError(Qpn),
    /// Responder detected an access violation.
    QpAccessError(Qpn),
    /// RTS->SQD drain finished.
    SqDrained(Qpn),
    /// A completion queue overflowed.
    CqError(u32),
    /// The number of WQEs in an SRQ dropped below its armed limit (the limit is now 0).
    SrqLimitReached(u32),
    /// A QP on an SRQ entered the error state and will take no more WQEs from it.
    QpLastWqeReached(Qpn),
    /// A QP migrated to its alternate path.
    PathMigrated(Qpn),
    /// A QP could not migrate (no armed alternate, or the alternate failed too).
    PathMigrationError(Qpn),
    /// A port (1-based) became usable.
    PortActive(u8),
    /// A port (1-based) failed.
    PortError(u8),
    /// The device failed; every object on it is unusable (hardware only).
    DeviceFatal,
    /// An SRQ failed (hardware only).
    SrqError(u32),
    /// A port's LID changed (InfiniBand only).
    LidChange(u8),
    /// A port's P_Key table changed (hardware only).
    PkeyChange(u8),
    /// A port's subnet manager changed (InfiniBand only).
    SmChange(u8),
    /// The subnet manager asks a port's clients to register again (InfiniBand only).
    ClientReregister(u8),
    /// A port's GID table changed, e.g. an IP address came or went on RoCE (hardware
    /// only).
    GidChange(u8),
    /// An event rdmx does not name, by its `ibv_event_type` number (for example
    /// `IBV_EVENT_WQ_FATAL`: rdmx creates no work queues).
    Other(u32),
}

/// What a queue pair is created with (`ibv_qp_init_attr`, by handle).
#[derive(Debug, Clone, Copy)]
pub struct QpConfig {
    /// Protection domain.
    pub pd: u32,
    /// Transport.
    pub qp_type: QpType,
    /// CQ for send completions.
    pub send_cq: u32,
    /// CQ for receive completions.
    pub recv_cq: u32,
    /// Queue capacities.
    pub cap: QpCap,
    /// Every send WR completes, signaled or not.
    pub sq_sig_all: bool,
    /// Shared receive queue to take receives from.
    pub srq: Option<u32>,
    /// XRC domain (XRC target QPs).
    pub xrcd: Option<u32>,
    /// Operations of the batch posting API (`send_ops_flags`; empty: created plainly).
    pub send_ops: crate::types::SendOps,
}

impl QpConfig {
    /// An RC QP on one CQ with default capacities.
    pub fn rc(pd: u32, cq: u32) -> Self {
        Self {
            pd,
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            cap: QpCap::default(),
            sq_sig_all: false,
            srq: None,
            xrcd: None,
            send_ops: crate::types::SendOps::EMPTY,
        }
    }
}

/// SRQ attributes as reported by `query_srq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqState {
    /// Queue depth.
    pub max_wr: u32,
    /// SGEs per receive.
    pub max_sge: u32,
    /// Armed limit (0 once the limit event fired, until re-armed).
    pub srq_limit: u32,
    /// Receive WQEs currently posted and not yet taken by a message; `None` when the
    /// provider cannot tell. libibverbs has no way to ask (`ibv_query_srq` reports only
    /// `max_wr`, `max_sge` and the limit), and counting posts against polled completions
    /// would be wrong: a WQE leaves the SRQ when the NIC takes it, not when its completion
    /// is polled, and an XRC completion does not say which SRQ it came from. So the soft
    /// provider reports `Some`, the libibverbs provider `None`.
    pub posted: Option<u32>,
}

/// Counters of what a fault injector did (the soft provider's `FaultInjector`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FaultStats {
    /// Frames offered to the injector.
    pub seen: u64,
    /// Frames discarded.
    pub dropped: u64,
    /// Frames delivered twice (each counts once here).
    pub duplicated: u64,
    /// Frames held back for reordering.
    pub reordered: u64,
    /// Frames with one bit flipped, counted as delivered: a corrupted frame that is also
    /// duplicated counts twice (both copies fail the ICRC).
    pub corrupted: u64,
    /// Frames delayed by `delay_ns`.
    pub delayed: u64,
}
