//! Verbs vocabulary types shared by every provider: identifiers, enums with the libibverbs
//! numeric codes, attribute structs and work completions.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A 24-bit queue pair number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Qpn(pub u32);

impl Qpn {
    /// The multicast destination QPN (UD only).
    pub const MULTICAST: Self = Self(0x00FF_FFFF);
}

impl fmt::Display for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

/// A 24-bit packet sequence number with wrapping arithmetic (spec §5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// The PSN space mask.
    pub const MASK: u32 = 0x00FF_FFFF;

    /// Builds a PSN from the low 24 bits of `v`.
    pub const fn new(v: u32) -> Self {
        Self(v & Self::MASK)
    }

    /// The raw 24-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    pub const fn add(self, n: u32) -> Self {
        Self(self.0.wrapping_add(n) & Self::MASK)
    }

    /// `self - n` modulo 2^24.
    pub const fn sub(self, n: u32) -> Self {
        Self(self.0.wrapping_sub(n) & Self::MASK)
    }

    /// Signed distance `self - other` in the 24-bit circle: positive when `self` is after
    /// `other`.
    pub const fn diff(self, other: Self) -> i32 {
        ((self.0.wrapping_sub(other.0)) << 8) as i32 >> 8
    }

    /// True when `self` is strictly after `other`.
    pub const fn after(self, other: Self) -> bool {
        self.diff(other) > 0
    }

    /// True when `self` is strictly before `other`.
    pub const fn before(self, other: Self) -> bool {
        self.diff(other) < 0
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A memory region key (the soft provider uses the same value for the local and remote key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lkey(pub u32);

/// A remote key, sent to peers so they can access a memory region or a memory window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Rkey(pub u32);

impl Rkey {
    /// The same key with the next tag (`ibv_inc_rkey`): the low 8 bits count up, wrapping,
    /// and the rest (the index of the window) stays. A type 2 memory window is bound under a
    /// key the application chooses this way, so that the key of an earlier binding no
    /// longer matches.
    pub const fn inc(self) -> Self {
        Self((self.0 & !0xFF) | (self.0.wrapping_add(1) & 0xFF))
    }

    /// The tag: the low 8 bits.
    pub const fn tag(self) -> u8 {
        (self.0 & 0xFF) as u8
    }
}

/// What a GID table entry is for (`ibv_gid_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GidType {
    /// InfiniBand (0).
    Ib,
    /// RoCE v1: Ethernet, no IP (1).
    RoceV1,
    /// RoCE v2: UDP/IP (2); what rdmx speaks.
    RoceV2,
}

/// The type of a memory window (`ibv_mw_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MwType {
    /// Type 1 (1): bound with `QueuePair::bind_mw`; the key's tag advances at every bind;
    /// any QP of the protection domain may access through it.
    Type1 = 1,
    /// Type 2 (2): bound with a bind work request (`WrOpcode::BindMw`) under a key the
    /// application chooses; only the QP that bound it may be accessed through it; must be
    /// invalidated (locally or by a peer's send with invalidate) before it is bound again.
    Type2 = 2,
}

/// A 128-bit global identifier. On RoCEv2 it is an IPv6 address or an IPv4-mapped one.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID naming `ip` (IPv4 addresses become `::ffff:a.b.c.d`).
    pub fn from_ip(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Self(v6.octets()),
        }
    }

    /// The IP address this GID stands for on the wire (spec §1.4).
    pub fn to_ip(&self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// True for multicast GIDs (IPv4-mapped 224.0.0.0/4 or `ff..`).
    pub fn is_multicast(&self) -> bool {
        self.to_ip().is_multicast()
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({})", Ipv6Addr::from(self.0))
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", Ipv6Addr::from(self.0))
    }
}

impl From<Ipv4Addr> for Gid {
    fn from(ip: Ipv4Addr) -> Self {
        Self::from_ip(IpAddr::V4(ip))
    }
}

/// Path MTU (`ibv_mtu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    /// 256 bytes (code 1).
    Mtu256 = 1,
    /// 512 bytes (code 2).
    Mtu512 = 2,
    /// 1024 bytes (code 3).
    Mtu1024 = 3,
    /// 2048 bytes (code 4).
    Mtu2048 = 4,
    /// 4096 bytes (code 5).
    Mtu4096 = 5,
}

impl Mtu {
    /// The MTU in bytes.
    pub const fn bytes(self) -> usize {
        128 << (self as u32)
    }

    /// The largest MTU not above `bytes`, if any.
    pub fn from_bytes_floor(bytes: usize) -> Option<Self> {
        [
            Self::Mtu4096,
            Self::Mtu2048,
            Self::Mtu1024,
            Self::Mtu512,
            Self::Mtu256,
        ]
        .into_iter()
        .find(|m| m.bytes() <= bytes)
    }

    /// The MTU whose size is exactly `bytes`.
    pub fn from_bytes(bytes: usize) -> Option<Self> {
        Self::from_bytes_floor(bytes).filter(|m| m.bytes() == bytes)
    }
}

/// Queue pair transport type (`ibv_qp_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QpType {
    /// Reliable connected (2).
    Rc = 2,
    /// Unreliable connected (3).
    Uc = 3,
    /// Unreliable datagram (4).
    Ud = 4,
    /// XRC initiator (9).
    XrcSend = 9,
    /// XRC target (10).
    XrcRecv = 10,
}

/// Queue pair state (`ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Reset (0).
    Reset = 0,
    /// Initialized (1).
    Init = 1,
    /// Ready to receive (2).
    Rtr = 2,
    /// Ready to send (3).
    Rts = 3,
    /// Send queue drained (4).
    Sqd = 4,
    /// Send queue error (5).
    Sqe = 5,
    /// Error (6).
    Err = 6,
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Self::Reset => "RESET",
            Self::Init => "INIT",
            Self::Rtr => "RTR",
            Self::Rts => "RTS",
            Self::Sqd => "SQD",
            Self::Sqe => "SQE",
            Self::Err => "ERR",
        };
        f.write_str(s)
    }
}

/// Path migration state (`ibv_mig_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MigState {
    /// No armed alternate path (0).
    #[default]
    Migrated = 0,
    /// Alternate loaded, arming requested (1).
    Rearm = 1,
    /// Both ends armed (2).
    Armed = 2,
}

macro_rules! bitflags_u32 {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $flag:ident = $val:expr;)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub u32);

        impl $name {
            $($(#[$fm])* pub const $flag: Self = Self($val);)*
            /// No flag set.
            pub const EMPTY: Self = Self(0);

            /// True when every flag of `other` is set in `self`.
            pub const fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }

            /// True when any flag of `other` is set in `self`.
            pub const fn intersects(self, other: Self) -> bool {
                self.0 & other.0 != 0
            }

            /// The raw bits.
            pub const fn bits(self) -> u32 {
                self.0
            }

            /// The names of the flags set, for messages.
            pub fn names(self) -> Vec<&'static str> {
                let mut v = Vec::new();
                $(if self.0 & $val != 0 { v.push(stringify!($flag)); })*
                v
            }
        }

        impl std::ops::BitOr for $name {
            type Output = Self;
            fn bitor(self, rhs: Self) -> Self {
                Self(self.0 | rhs.0)
            }
        }

        impl std::ops::BitOrAssign for $name {
            fn bitor_assign(&mut self, rhs: Self) {
                self.0 |= rhs.0;
            }
        }

        impl std::ops::BitAnd for $name {
            type Output = Self;
            fn bitand(self, rhs: Self) -> Self {
                Self(self.0 & rhs.0)
            }
        }

        impl std::ops::Not for $name {
            type Output = Self;
            fn not(self) -> Self {
                Self(!self.0)
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}({})", stringify!($name), self.names().join(" | "))
            }
        }
    };
}

pub(crate) use bitflags_u32;

bitflags_u32! {
    /// Memory region and QP access flags (`ibv_access_flags`).
    AccessFlags {
        /// The NIC may write locally (receives, READ responses, atomic results).
        LOCAL_WRITE = 1;
        /// Remote peers may RDMA WRITE.
        REMOTE_WRITE = 2;
        /// Remote peers may RDMA READ.
        REMOTE_READ = 4;
        /// Remote peers may perform atomics.
        REMOTE_ATOMIC = 8;
        /// Memory windows may be bound to the region (`IBV_ACCESS_MW_BIND`).
        MW_BIND = 16;
    }
}

bitflags_u32! {
    /// Which attributes a `modify` call sets (`ibv_qp_attr_mask`).
    QpAttrMask {
        /// `qp_state`.
        STATE = 1 << 0;
        /// `cur_qp_state`.
        CUR_STATE = 1 << 1;
        /// `en_sqd_async_notify`.
        EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `qp_access_flags`.
        ACCESS_FLAGS = 1 << 3;
        /// `pkey_index`.
        PKEY_INDEX = 1 << 4;
        /// `port_num`.
        PORT = 1 << 5;
        /// `qkey`.
        QKEY = 1 << 6;
        /// `ah_attr` (primary address vector).
        AV = 1 << 7;
        /// `path_mtu`.
        PATH_MTU = 1 << 8;
        /// `timeout` (local ACK timeout).
        TIMEOUT = 1 << 9;
        /// `retry_cnt`.
        RETRY_CNT = 1 << 10;
        /// `rnr_retry`.
        RNR_RETRY = 1 << 11;
        /// `rq_psn`.
        RQ_PSN = 1 << 12;
        /// `max_rd_atomic`.
        MAX_QP_RD_ATOMIC = 1 << 13;
        /// Alternate path attributes.
        ALT_PATH = 1 << 14;
        /// `min_rnr_timer`.
        MIN_RNR_TIMER = 1 << 15;
        /// `sq_psn`.
        SQ_PSN = 1 << 16;
        /// `max_dest_rd_atomic`.
        MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `path_mig_state`.
        PATH_MIG_STATE = 1 << 18;
        /// `cap`.
        CAP = 1 << 19;
        /// `dest_qp_num`.
        DEST_QPN = 1 << 20;
    }
}

bitflags_u32! {
    /// Send work request flags (`ibv_send_flags`).
    SendFlags {
        /// Wait for earlier READ/atomic WRs to complete before starting.
        FENCE = 1;
        /// Generate a completion on success.
        SIGNALED = 2;
        /// Set the solicited-event bit.
        SOLICITED = 4;
        /// Copy the data into the WR at post time (no memory key needed).
        INLINE = 8;
    }
}

bitflags_u32! {
    /// The operations a QP is created for (`ibv_qp_create_send_ops_flags`, the
    /// `send_ops_flags` of `ibv_qp_init_attr_ex`), for the batch posting API
    /// (`QueuePair::wr_start`).
    SendOps {
        /// RDMA write.
        RDMA_WRITE = 1;
        /// RDMA write with immediate.
        RDMA_WRITE_WITH_IMM = 2;
        /// Send.
        SEND = 4;
        /// Send with immediate.
        SEND_WITH_IMM = 8;
        /// RDMA read.
        RDMA_READ = 16;
        /// Atomic compare-and-swap.
        ATOMIC_CMP_AND_SWP = 32;
        /// Atomic fetch-and-add.
        ATOMIC_FETCH_AND_ADD = 64;
        /// Local invalidate.
        LOCAL_INV = 128;
        /// Memory window bind.
        BIND_MW = 256;
        /// Send with invalidate.
        SEND_WITH_INV = 512;
    }
}

bitflags_u32! {
    /// Work completion flags (`ibv_wc_flags`).
    WcFlags {
        /// A GRH is present in the first 40 bytes of the receive buffer (UD).
        GRH = 1;
        /// Immediate data is valid.
        WITH_IMM = 2;
        /// IP checksum verified.
        IP_CSUM_OK = 4;
        /// `invalidated_rkey` is valid.
        WITH_INV = 8;
        /// Tag matching: the SRQ's unexpected-message count is ahead of the count the
        /// application last reported (`IBV_WC_TM_SYNC_REQ`): send a sync.
        TM_SYNC_REQ = 16;
        /// Tag matching: the message matched a posted tag (`IBV_WC_TM_MATCH`).
        TM_MATCH = 32;
        /// Tag matching: the matched message's data is in the tag's buffer
        /// (`IBV_WC_TM_DATA_VALID`).
        TM_DATA_VALID = 64;
    }
}

/// Work completion status (`ibv_wc_status`), with the libibverbs numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WcStatus {
    /// 0: the operation completed.
    Success,
    /// 1: local length error (receive buffer too small, message too long).
    LocLenErr,
    /// 2: local QP operation error.
    LocQpOpErr,
    /// 3: local EE context operation error (RD).
    LocEecOpErr,
    /// 4: local protection error (bad lkey, SGE outside the MR, missing access).
    LocProtErr,
    /// 5: flushed because the QP is in the error state.
    WrFlushErr,
    /// 6: memory window bind error.
    MwBindErr,
    /// 7: bad response from the responder.
    BadRespErr,
    /// 8: local access error while placing incoming data.
    LocAccessErr,
    /// 9: remote invalid request.
    RemInvReqErr,
    /// 10: remote access error (bad rkey, bounds, permission).
    RemAccessErr,
    /// 11: remote operational error.
    RemOpErr,
    /// 12: transport retries exhausted.
    RetryExcErr,
    /// 13: RNR retries exhausted.
    RnrRetryExcErr,
    /// 14: local RDD violation (RD).
    LocRddViolErr,
    /// 15: remote invalid RD request.
    RemInvRdReqErr,
    /// 16: remote aborted.
    RemAbortErr,
    /// 17: invalid EE context number.
    InvEecnErr,
    /// 18: invalid EE context state.
    InvEecStateErr,
    /// 19: fatal error.
    FatalErr,
    /// 20: response timeout.
    RespTimeoutErr,
    /// 21: general error.
    GeneralErr,
    /// 22: tag-matching error (tag-matching SRQs).
    TmErr,
    /// 23: tag-matching rendezvous not completed.
    TmRndvIncomplete,
    /// A status value this enum does not name (`from_code` never returns it for a named
    /// one).
    Other(u32),
}

impl WcStatus {
    /// The libibverbs numeric code.
    pub const fn code(self) -> u32 {
        match self {
            Self::Success => 0,
            Self::LocLenErr => 1,
            Self::LocQpOpErr => 2,
            Self::LocEecOpErr => 3,
            Self::LocProtErr => 4,
            Self::WrFlushErr => 5,
            Self::MwBindErr => 6,
            Self::BadRespErr => 7,
            Self::LocAccessErr => 8,
            Self::RemInvReqErr => 9,
            Self::RemAccessErr => 10,
            Self::RemOpErr => 11,
            Self::RetryExcErr => 12,
            Self::RnrRetryExcErr => 13,
            Self::LocRddViolErr => 14,
            Self::RemInvRdReqErr => 15,
            Self::RemAbortErr => 16,
            Self::InvEecnErr => 17,
            Self::InvEecStateErr => 18,
            Self::FatalErr => 19,
            Self::RespTimeoutErr => 20,
            Self::GeneralErr => 21,
            Self::TmErr => 22,
            Self::TmRndvIncomplete => 23,
            Self::Other(n) => n,
        }
    }

    /// The status for a libibverbs numeric code.
    pub const fn from_code(code: u32) -> Self {
        match code {
            0 => Self::Success,
            1 => Self::LocLenErr,
            2 => Self::LocQpOpErr,
            3 => Self::LocEecOpErr,
            4 => Self::LocProtErr,
            5 => Self::WrFlushErr,
            6 => Self::MwBindErr,
            7 => Self::BadRespErr,
            8 => Self::LocAccessErr,
            9 => Self::RemInvReqErr,
            10 => Self::RemAccessErr,
            11 => Self::RemOpErr,
            12 => Self::RetryExcErr,
            13 => Self::RnrRetryExcErr,
            14 => Self::LocRddViolErr,
            15 => Self::RemInvRdReqErr,
            16 => Self::RemAbortErr,
            17 => Self::InvEecnErr,
            18 => Self::InvEecStateErr,
            19 => Self::FatalErr,
            20 => Self::RespTimeoutErr,
            21 => Self::GeneralErr,
            22 => Self::TmErr,
            23 => Self::TmRndvIncomplete,
            n => Self::Other(n),
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Self::Success => "success",
            Self::LocLenErr => "local length error",
            Self::LocQpOpErr => "local QP operation error",
            Self::LocEecOpErr => "local EE context operation error",
            Self::LocProtErr => "local protection error",
            Self::WrFlushErr => "work request flushed",
            Self::MwBindErr => "memory window bind error",
            Self::BadRespErr => "bad response",
            Self::LocAccessErr => "local access error",
            Self::RemInvReqErr => "remote invalid request",
            Self::RemAccessErr => "remote access error",
            Self::RemOpErr => "remote operational error",
            Self::RetryExcErr => "transport retry counter exceeded",
            Self::RnrRetryExcErr => "RNR retry counter exceeded",
            Self::LocRddViolErr => "local RDD violation",
            Self::RemInvRdReqErr => "remote invalid RD request",
            Self::RemAbortErr => "remote aborted",
            Self::InvEecnErr => "invalid EE context number",
            Self::InvEecStateErr => "invalid EE context state",
            Self::FatalErr => "fatal error",
            Self::RespTimeoutErr => "response timeout",
            Self::GeneralErr => "general error",
            Self::TmErr => "tag matching error",
            Self::TmRndvIncomplete => "tag matching rendezvous incomplete",
            Self::Other(n) => return write!(f, "status {n}"),
        };
        f.write_str(s)
    }
}

/// Work completion opcode (`ibv_wc_opcode`), with the libibverbs numbers. Receive-side
/// opcodes have bit 7 (128) set ([`WcOpcode::is_recv`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WcOpcode {
    /// 0: send.
    Send,
    /// 1: RDMA write.
    RdmaWrite,
    /// 2: RDMA read.
    RdmaRead,
    /// 3: atomic compare-and-swap.
    CompSwap,
    /// 4: atomic fetch-and-add.
    FetchAdd,
    /// 5: memory window bind.
    BindMw,
    /// 6: local invalidate.
    LocalInv,
    /// 7: TCP segmentation offload send (raw packet QPs).
    Tso,
    /// 8: flush.
    Flush,
    /// 9: atomic write.
    AtomicWrite,
    /// 128: receive.
    Recv,
    /// 129: receive from an RDMA write with immediate.
    RecvRdmaWithImm,
    /// 130: tag-matching SRQ: tag added.
    TmAdd,
    /// 131: tag-matching SRQ: tag deleted.
    TmDel,
    /// 132: tag-matching SRQ: tag list synchronised.
    TmSync,
    /// 133: tag-matching SRQ: receive matched a tag.
    TmRecv,
    /// 134: tag-matching SRQ: receive matched no tag.
    TmNoTag,
    /// An opcode this enum does not name, such as a provider's driver-specific codes
    /// (135 to 137); `from_code` never returns it for a named one.
    Other(u32),
}

impl WcOpcode {
    /// The libibverbs numeric code.
    pub const fn code(self) -> u32 {
        match self {
            Self::Send => 0,
            Self::RdmaWrite => 1,
            Self::RdmaRead => 2,
            Self::CompSwap => 3,
            Self::FetchAdd => 4,
            Self::BindMw => 5,
            Self::LocalInv => 6,
            Self::Tso => 7,
            Self::Flush => 8,
            Self::AtomicWrite => 9,
            Self::Recv => 128,
            Self::RecvRdmaWithImm => 129,
            Self::TmAdd => 130,
            Self::TmDel => 131,
            Self::TmSync => 132,
            Self::TmRecv => 133,
            Self::TmNoTag => 134,
            Self::Other(n) => n,
        }
    }

    /// The opcode for a libibverbs numeric code.
    pub const fn from_code(code: u32) -> Self {
        match code {
            0 => Self::Send,
            1 => Self::RdmaWrite,
            2 => Self::RdmaRead,
            3 => Self::CompSwap,
            4 => Self::FetchAdd,
            5 => Self::BindMw,
            6 => Self::LocalInv,
            7 => Self::Tso,
            8 => Self::Flush,
            9 => Self::AtomicWrite,
            128 => Self::Recv,
            129 => Self::RecvRdmaWithImm,
            130 => Self::TmAdd,
            131 => Self::TmDel,
            132 => Self::TmSync,
            133 => Self::TmRecv,
            134 => Self::TmNoTag,
            n => Self::Other(n),
        }
    }

    /// True for the completion of a receive-side operation (verbs.h: `opcode &
    /// IBV_WC_RECV`), including opcodes this enum does not name.
    pub const fn is_recv(self) -> bool {
        self.code() & 0x80 != 0
    }
}

/// A work completion (`struct ibv_wc`). For error completions only `wr_id`, `status` and
/// `qp_num` are meaningful, as in verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The caller's identifier of the work request.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
    /// What it was.
    pub opcode: WcOpcode,
    /// Receive: bytes placed (UD: including the 40-byte GRH); RDMA read: bytes read.
    pub byte_len: u32,
    /// Immediate data (network order, as sent) when `wc_flags` has `WITH_IMM`; the
    /// invalidated remote key when it has `WITH_INV`.
    pub imm_data: u32,
    /// The local QP the work request belonged to.
    pub qp_num: Qpn,
    /// Source QP (UD receives).
    pub src_qp: Qpn,
    /// Completion flags.
    pub wc_flags: WcFlags,
    /// Provider-specific error detail (0 when none).
    pub vendor_err: u32,
    /// Source LID: 0 on RoCE. The soft provider reports the sender's UDP port here for UD
    /// receives, so `AddressHandle::from_work_completion` can build a reply path.
    pub slid: u16,
    /// Tag-matching receives (`WcOpcode::TmRecv`): the message's tag and application
    /// context (`ibv_wc_read_tm_info`); zero otherwise.
    pub tm: TmInfo,
}

/// The tag-matching fields of a completion (`struct ibv_wc_tm_info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TmInfo {
    /// The message's tag.
    pub tag: u64,
    /// The message's application context (the TMH's `app_ctx`, `priv` in verbs).
    pub app_ctx: u32,
}

impl WorkCompletion {
    /// An empty completion, useful to size a poll buffer.
    pub const EMPTY: Self = Self {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm_data: 0,
        qp_num: Qpn(0),
        src_qp: Qpn(0),
        wc_flags: WcFlags::EMPTY,
        vendor_err: 0,
        slid: 0,
        tm: TmInfo { tag: 0, app_ctx: 0 },
    };

    /// True when the status is `Success`.
    pub fn is_ok(&self) -> bool {
        self.status == WcStatus::Success
    }

    /// The immediate data if present.
    pub fn imm(&self) -> Option<u32> {
        self.wc_flags
            .contains(WcFlags::WITH_IMM)
            .then_some(self.imm_data)
    }

    /// The remote key a peer's send with invalidate closed (`invalidated_rkey`, which
    /// shares its field with `imm_data` in verbs), if this receive carried one.
    pub fn invalidated_rkey(&self) -> Option<Rkey> {
        self.wc_flags
            .contains(WcFlags::WITH_INV)
            .then_some(Rkey(self.imm_data))
    }
}

impl Default for WorkCompletion {
    fn default() -> Self {
        Self::EMPTY
    }
}

/// An address vector (`ibv_ah_attr` with its GRH) naming the remote end of a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AhAttr {
    /// Destination GID (an IP address on RoCEv2).
    pub dgid: Gid,
    /// Index of the local GID (and so local address / port) to send from.
    pub sgid_index: u8,
    /// Local port number (1-based).
    pub port_num: u8,
    /// IP hop limit / TTL.
    pub hop_limit: u8,
    /// IP traffic class (DSCP + ECN).
    pub traffic_class: u8,
    /// IPv6 flow label (20 bits).
    pub flow_label: u32,
    /// Soft provider extension: the UDP port the remote soft device listens on (4791 for
    /// standard RoCEv2 peers). Ignored by hardware providers.
    pub udp_port: u16,
}

impl AhAttr {
    /// An address vector for `dgid` with RoCEv2 defaults (port 1, GID index 0, hop limit 64,
    /// UDP port 4791).
    pub fn new(dgid: Gid) -> Self {
        Self {
            dgid,
            sgid_index: 0,
            port_num: 1,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            udp_port: 4791,
        }
    }

    /// Sets the soft provider's destination UDP port.
    pub fn with_udp_port(mut self, port: u16) -> Self {
        self.udp_port = port;
        self
    }
}

/// Queue capacities (`ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCap {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Largest inline send in bytes.
    pub max_inline_data: u32,
}

impl Default for QpCap {
    fn default() -> Self {
        Self {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        }
    }
}

/// Attributes for `QueuePair::modify` / returned by `QueuePair::query` (`ibv_qp_attr`).
/// Only the fields named in the accompanying [`QpAttrMask`] are read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QpAttr {
    /// Target state.
    pub qp_state: QpState,
    /// Asserted current state (with `CUR_STATE`).
    pub cur_qp_state: QpState,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Path migration state.
    pub path_mig_state: MigState,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Receive queue initial PSN (the peer's `sq_psn`).
    pub rq_psn: u32,
    /// Send queue initial PSN.
    pub sq_psn: u32,
    /// Remote QP number.
    pub dest_qp_num: u32,
    /// Allowed remote operations.
    pub qp_access_flags: AccessFlags,
    /// Capacities.
    pub cap: QpCap,
    /// Primary path.
    pub ah_attr: AhAttr,
    /// Alternate path.
    pub alt_ah_attr: AhAttr,
    /// P_Key index (primary).
    pub pkey_index: u16,
    /// P_Key index (alternate).
    pub alt_pkey_index: u16,
    /// Request SQ drained event on RTS->SQD.
    pub en_sqd_async_notify: bool,
    /// True while draining in SQD.
    pub sq_draining: bool,
    /// Outstanding READ/atomic requests this QP may issue.
    pub max_rd_atomic: u8,
    /// Outstanding READ/atomic requests this QP accepts as responder.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code this QP sends as responder.
    pub min_rnr_timer: u8,
    /// Primary port.
    pub port_num: u8,
    /// Local ACK timeout exponent (4.096 us × 2^timeout; 0 = infinite).
    pub timeout: u8,
    /// Transport retry count (0-7).
    pub retry_cnt: u8,
    /// RNR retry count (0-7; 7 = infinite).
    pub rnr_retry: u8,
    /// Alternate port.
    pub alt_port_num: u8,
    /// Alternate path local ACK timeout.
    pub alt_timeout: u8,
}

impl Default for QpAttr {
    fn default() -> Self {
        Self {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu1024,
            path_mig_state: MigState::Migrated,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: AccessFlags::EMPTY,
            cap: QpCap::default(),
            ah_attr: AhAttr::new(Gid::default()),
            alt_ah_attr: AhAttr::new(Gid::default()),
            pkey_index: 0,
            alt_pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 1,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            alt_port_num: 0,
            alt_timeout: 0,
        }
    }
}

/// Device attributes (`ibv_device_attr`), the subset rdmx uses.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceAttr {
    /// Firmware / provider version string.
    pub fw_ver: String,
    /// Node GUID.
    pub node_guid: u64,
    /// Vendor identifier.
    pub vendor_id: u32,
    /// Largest memory region in bytes.
    pub max_mr_size: u64,
    /// Maximum queue pairs.
    pub max_qp: u32,
    /// Maximum work requests per queue.
    pub max_qp_wr: u32,
    /// Maximum SGEs per work request.
    pub max_sge: u32,
    /// Maximum completion queues.
    pub max_cq: u32,
    /// Maximum entries per completion queue.
    pub max_cqe: u32,
    /// Maximum memory regions.
    pub max_mr: u32,
    /// Maximum protection domains.
    pub max_pd: u32,
    /// Outstanding READ/atomic per QP as responder.
    pub max_qp_rd_atom: u32,
    /// Outstanding READ/atomic per QP as initiator.
    pub max_qp_init_rd_atom: u32,
    /// Largest inline data a QP can be created with. 0 on libibverbs devices: verbs has no
    /// device-wide value (`ibv_device_attr` and `ibv_device_attr_ex` lack the field, and
    /// the limit depends on the QP type and its SGE counts), so ask for what you need in
    /// `QpCap::max_inline_data` and read what the device granted from `QueuePair::query`.
    pub max_inline_data: u32,
    /// Physical ports.
    pub phys_port_cnt: u8,
    /// Atomic operations are atomic with respect to the whole device (GLOB).
    pub atomic_glob: bool,
    /// Maximum SRQs (0 = not supported).
    pub max_srq: u32,
    /// XRC supported.
    pub xrc: bool,
    /// Automatic path migration supported.
    pub auto_path_mig: bool,
    /// Maximum multicast groups (0 = not supported).
    pub max_mcast_grp: u32,
    /// Tag matching: most tags a tag-matching SRQ can hold (`ibv_tm_caps.max_num_tags`;
    /// 0 = no tag-matching SRQs).
    pub max_num_tags: u32,
    /// Memory windows supported (`max_mw` > 0).
    pub memory_windows: bool,
}

/// Port state (`ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// Link down.
    Down = 1,
    /// Link up and usable.
    Active = 4,
}

/// Port attributes (`ibv_port_attr`), the subset rdmx uses.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortAttr {
    /// Logical state.
    pub state: PortState,
    /// Largest MTU of the port.
    pub max_mtu: Mtu,
    /// MTU currently usable on the port.
    pub active_mtu: Mtu,
    /// Entries in the GID table.
    pub gid_tbl_len: u32,
    /// Link layer ("Ethernet" for RoCE).
    pub link_layer: &'static str,
    /// Largest message size.
    pub max_msg_sz: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_wraps_and_compares() {
        let a = Psn::new(0x00FF_FFFF);
        assert_eq!(a.add(1).value(), 0);
        assert!(a.add(1).after(a));
        assert!(a.before(a.add(5)));
        assert_eq!(Psn::new(3).diff(Psn::new(0x00FF_FFFE)), 5);
        assert_eq!(Psn::new(0).sub(1).value(), 0x00FF_FFFF);
    }

    #[test]
    fn gid_maps_ipv4() {
        let g = Gid::from(Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(g.to_ip(), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
        assert!(Gid::from(Ipv4Addr::new(239, 1, 2, 3)).is_multicast());
    }

    #[test]
    fn mtu_codes() {
        assert_eq!(Mtu::Mtu256.bytes(), 256);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(Mtu::from_bytes_floor(1400), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::from_bytes(1000), None);
    }

    #[test]
    fn status_codes_round_trip() {
        for c in (0..300).chain([u32::MAX]) {
            let s = WcStatus::from_code(c);
            assert_eq!(s.code(), c);
            assert_eq!(matches!(s, WcStatus::Other(_)), c > 23, "{c}");
        }
        assert_eq!(WcStatus::from_code(22), WcStatus::TmErr);
        assert_eq!(WcStatus::from_code(24), WcStatus::Other(24));
        assert_eq!(WcStatus::Other(24).to_string(), "status 24");
    }

    #[test]
    fn opcode_codes_round_trip_and_unknown_ones_are_other() {
        for c in (0..300).chain([u32::MAX]) {
            let op = WcOpcode::from_code(c);
            assert_eq!(op.code(), c);
            let named = matches!(c, 0..=9 | 128..=134);
            assert_eq!(!matches!(op, WcOpcode::Other(_)), named, "{c}");
            assert_eq!(op.is_recv(), c & 0x80 != 0, "{c}");
        }
        assert_eq!(WcOpcode::from_code(129), WcOpcode::RecvRdmaWithImm);
        // Driver-specific codes keep their number and their direction.
        assert_eq!(WcOpcode::from_code(135), WcOpcode::Other(135));
        assert!(WcOpcode::Other(135).is_recv());
        assert!(!WcOpcode::Other(10).is_recv());
    }
}
