//! Tag-matching shared receive queues (`IBV_SRQT_TM`, `ibv_post_srq_ops`).
//!
//! A tag-matching SRQ holds, besides ordinary receive WQEs, a list of tagged buffers
//! (`tag`, `mask`, SGEs) added and removed with [`SharedReceiveQueue::post_srq_ops`](crate::SharedReceiveQueue::post_srq_ops). A
//! message whose payload starts with a tag-matching header ([`Tmh`], 16 bytes) is matched
//! by the NIC against the list in the order the tags were added: the first entry with
//! `msg.tag & entry.mask == entry.tag & entry.mask` takes it.
//!
//! - **Eager** (`TmhOp::Eager`): the data after the header lands in the tag's buffer; one
//!   completion, opcode `TmRecv`, flags `TM_MATCH | TM_DATA_VALID`, `wr_id` the tag's
//!   `recv_wr_id`, `tm` the message's tag and application context.
//! - **Rendezvous** (`TmhOp::Rndv`): the header is followed by an [`Rvh`] naming the
//!   sender's buffer (address, key, length). On a match the NIC reports `TmRecv` with
//!   `TM_MATCH`, reads the sender's buffer into the tag's buffer with an RDMA READ on the
//!   receiving QP, reports `TmRecv` with `TM_DATA_VALID` (and the length), and sends the
//!   sender a message with a `TmhOp::Fin` header (same tag and context) so it can release
//!   its buffer. The sender gets the FIN as an ordinary message. A rendezvous request is
//!   one packet (the headers and at most an MTU of the application's own header).
//! - **No tag** (`TmhOp::NoTag`, or a message shorter than a header): an ordinary receive
//!   WQE takes the whole message; opcode `TmNoTag`.
//! - **Unexpected** (tagged, no entry matches): an ordinary receive WQE takes the whole
//!   message, header included, so the application can match it in software; opcode `Recv`
//!   with `TM_SYNC_REQ`. The SRQ counts unexpected messages.
//!
//! Phase synchronisation: while the SRQ has delivered more unexpected messages than the
//! application has reported handling (the `unexpected_cnt` of an operation with
//! `OpsFlags::TM_SYNC`, or a `TagOp::Sync`), the NIC matches nothing, so that a tag added
//! before the application saw an unexpected message with that tag cannot take a later
//! message out of order; every tagged message is unexpected until the counts agree.
//! List-operation completions carry `TM_SYNC_REQ` while they disagree.
//!
//! List operations complete on the SRQ's CQ (when `SIGNALED`; always on error): `TmAdd`,
//! `TmDel` (status `TmErr` when the tag was consumed by a message before the delete ran),
//! `TmSync`. Message completions go to the receiving QP's receive CQ, as on any SRQ.
//!
//! Tag matching runs on RC QPs. On the soft provider it is the NIC's own software doing the
//! matching. On libibverbs the SRQ and its list operations go to the device
//! (`ibv_create_srq_ex` with `IBV_SRQT_TM`, `ibv_post_srq_ops`; `max_num_tags` from
//! `ibv_query_device_ex`), and on such a device every CQ is an extended one
//! (`ibv_create_cq_ex` with `IBV_WC_EX_WITH_TM_INFO`, polled with `ibv_start_poll`), so
//! that `WorkCompletion::tm` carries the tag and context (`ibv_wc_read_tm_info`).

use crate::types::Rkey;
use crate::wr::Sge;

/// Length of a tag-matching header.
pub const TMH_LEN: usize = 16;
/// Length of a rendezvous header.
pub const RVH_LEN: usize = 16;

/// What a tagged message is (`enum ibv_tmh_op`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TmhOp {
    /// 0: not tagged: goes to an ordinary receive.
    NoTag = 0,
    /// 1: a rendezvous request: an [`Rvh`] follows.
    Rndv = 1,
    /// 2: the end of a rendezvous (sent by the receiving NIC).
    Fin = 2,
    /// 3: an eager message: the data follows.
    Eager = 3,
}

/// A tag-matching header (`struct ibv_tmh`): opcode, 3 reserved bytes, the application
/// context (big-endian 32 bits) and the tag (big-endian 64 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tmh {
    /// The kind of message.
    pub op: TmhOp,
    /// Application context, reported with the match (`priv`).
    pub app_ctx: u32,
    /// The tag.
    pub tag: u64,
}

impl Tmh {
    /// The header's 16 bytes.
    pub fn to_bytes(&self) -> [u8; TMH_LEN] {
        let mut b = [0u8; TMH_LEN];
        b[0] = self.op as u8;
        b[4..8].copy_from_slice(&self.app_ctx.to_be_bytes());
        b[8..16].copy_from_slice(&self.tag.to_be_bytes());
        b
    }

    /// The header at the start of `b`: `None` when `b` is shorter than a header or its
    /// opcode is not one of the four.
    pub fn parse(b: &[u8]) -> Option<Self> {
        let h = b.get(..TMH_LEN)?;
        let op = match h.first()? {
            0 => TmhOp::NoTag,
            1 => TmhOp::Rndv,
            2 => TmhOp::Fin,
            3 => TmhOp::Eager,
            _ => return None,
        };
        let app_ctx = u32::from_be_bytes(h.get(4..8)?.try_into().ok()?);
        let tag = u64::from_be_bytes(h.get(8..16)?.try_into().ok()?);
        Some(Self { op, app_ctx, tag })
    }
}

/// A rendezvous header (`struct ibv_rvh`): the sender's buffer, big-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rvh {
    /// Address of the sender's buffer.
    pub va: u64,
    /// Its remote key (the sender registers it with `REMOTE_READ`).
    pub rkey: Rkey,
    /// Bytes to read.
    pub len: u32,
}

impl Rvh {
    /// The header's 16 bytes.
    pub fn to_bytes(&self) -> [u8; RVH_LEN] {
        let mut b = [0u8; RVH_LEN];
        b[..8].copy_from_slice(&self.va.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.0.to_be_bytes());
        b[12..16].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// The header at the start of `b`.
    pub fn parse(b: &[u8]) -> Option<Self> {
        let h = b.get(..RVH_LEN)?;
        Some(Self {
            va: u64::from_be_bytes(h.get(..8)?.try_into().ok()?),
            rkey: Rkey(u32::from_be_bytes(h.get(8..12)?.try_into().ok()?)),
            len: u32::from_be_bytes(h.get(12..16)?.try_into().ok()?),
        })
    }
}

/// Tag-matching capacities of an SRQ (`struct ibv_tm_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TmCaps {
    /// Tags the list can hold.
    pub max_num_tags: u32,
    /// List operations one `post_srq_ops` call may carry.
    pub max_ops: u32,
}

crate::types::bitflags_u32! {
    /// Flags of a list operation (`enum ibv_ops_flags`).
    OpsFlags {
        /// Complete on the SRQ's CQ on success too.
        SIGNALED = 1;
        /// Report `unexpected_cnt` (phase synchronisation).
        TM_SYNC = 2;
    }
}

/// A list operation (`ibv_ops_wr_opcode` with its operands).
#[derive(Debug, Clone, Copy)]
pub enum TagOp<'a> {
    /// Add a tagged buffer (`IBV_WR_TAG_ADD`).
    Add {
        /// Reported by the completion of the message that takes the buffer.
        recv_wr_id: u64,
        /// The buffer.
        sg_list: &'a [Sge],
        /// The tag.
        tag: u64,
        /// Which bits of the tag must match.
        mask: u64,
    },
    /// Remove a tagged buffer by the handle its `Add` returned (`IBV_WR_TAG_DEL`).
    Del {
        /// The handle.
        handle: u32,
    },
    /// Only report `unexpected_cnt` (`IBV_WR_TAG_SYNC`).
    Sync,
}

/// A list operation on a tag-matching SRQ (`struct ibv_ops_wr`).
#[derive(Debug, Clone, Copy)]
pub struct OpsWr<'a> {
    /// Returned in the operation's completion.
    pub wr_id: u64,
    /// What to do.
    pub op: TagOp<'a>,
    /// `SIGNALED`, `TM_SYNC`.
    pub flags: OpsFlags,
    /// Unexpected messages the application has handled so far (read with `TM_SYNC` and by
    /// `TagOp::Sync`).
    pub unexpected_cnt: u32,
}

impl<'a> OpsWr<'a> {
    /// Adds a tagged buffer, signaled.
    pub fn add(wr_id: u64, recv_wr_id: u64, sg_list: &'a [Sge], tag: u64, mask: u64) -> Self {
        Self {
            wr_id,
            op: TagOp::Add {
                recv_wr_id,
                sg_list,
                tag,
                mask,
            },
            flags: OpsFlags::SIGNALED,
            unexpected_cnt: 0,
        }
    }

    /// Removes a tagged buffer, signaled.
    pub fn del(wr_id: u64, handle: u32) -> Self {
        Self {
            wr_id,
            op: TagOp::Del { handle },
            flags: OpsFlags::SIGNALED,
            unexpected_cnt: 0,
        }
    }

    /// Reports `unexpected_cnt` handled unexpected messages, signaled.
    pub fn sync(wr_id: u64, unexpected_cnt: u32) -> Self {
        Self {
            wr_id,
            op: TagOp::Sync,
            flags: OpsFlags::SIGNALED | OpsFlags::TM_SYNC,
            unexpected_cnt,
        }
    }

    /// Also reports `unexpected_cnt` handled unexpected messages.
    pub fn with_sync(mut self, unexpected_cnt: u32) -> Self {
        self.flags |= OpsFlags::TM_SYNC;
        self.unexpected_cnt = unexpected_cnt;
        self
    }
}
