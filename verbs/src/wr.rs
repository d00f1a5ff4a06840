//! Work requests: scatter/gather elements, send and receive work requests.
//!
//! An [`Sge`] names registered memory by address, length and local key, exactly like
//! `struct ibv_sge`. Posting one is always memory-safe: the provider resolves the key in its
//! memory table when it executes the request, and a key that no longer names a registered
//! region (or a range outside it) completes with `LocProtErr` instead of touching freed memory.
//!
//! An `Sge` cannot be made from an address and a key: only from a [`MemoryRegion`], whose
//! bytes are only ever accessed through atomic copies (an application that rewrites a buffer
//! while a send is in flight gets mixed contents, as on hardware, never undefined behaviour),
//! or by the owner of memory that hands out plain views of it (rdmx-core's buffer pool, which
//! makes the `Sge` of a buffer only for the transports that post it, once the application
//! can no longer reach the buffer).
//!
//! [`MemoryRegion`]: crate::MemoryRegion

use crate::types::{AccessFlags, AhAttr, Lkey, Qpn, Rkey, SendFlags};

/// A scatter/gather element (`struct ibv_sge`). Made by [`MemoryRegion::sge`]
/// (see the module docs for why it cannot be made from an address and a key).
///
/// ```compile_fail
/// // Naming memory by address and key would let safe code post bytes it is writing.
/// let sge = rdmx_verbs::Sge { addr: 0x1000, length: 8, lkey: rdmx_verbs::Lkey(7) };
/// ```
///
/// [`MemoryRegion::sge`]: crate::MemoryRegion::sge
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Virtual address of the first byte (inside a memory region).
    pub(crate) addr: u64,
    /// Length in bytes.
    pub(crate) length: u32,
    /// The memory region's local key.
    pub(crate) lkey: Lkey,
}

impl Sge {
    /// Virtual address of the first byte (inside a memory region).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn length(&self) -> u32 {
        self.length
    }

    /// The memory region's local key.
    pub fn lkey(&self) -> Lkey {
        self.lkey
    }

    /// The first `len` bytes from `off` of this element (clamped to it): a narrower view of
    /// the same memory.
    pub fn narrow(&self, off: u32, len: u32) -> Self {
        let off = off.min(self.length);
        Self {
            addr: self.addr.wrapping_add(u64::from(off)),
            length: len.min(self.length - off),
            lkey: self.lkey,
        }
    }
}

/// What a send work request does (`ibv_wr_opcode` plus its operands).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WrOpcode {
    /// Send to the peer's next receive work request.
    Send,
    /// Send with 32-bit immediate data (network order as given).
    SendWithImm {
        /// Immediate data.
        imm: u32,
    },
    /// Write into remote memory.
    RdmaWrite {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
    },
    /// Write into remote memory and consume a receive work request carrying `imm`.
    RdmaWriteWithImm {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
        /// Immediate data.
        imm: u32,
    },
    /// Read remote memory into the local SGEs.
    RdmaRead {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
    },
    /// 64-bit compare-and-swap on an 8-byte aligned remote word; the original value lands in
    /// the (8-byte) local SGE.
    AtomicCmpSwap {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
        /// Value to compare with.
        compare: u64,
        /// Value to store when equal.
        swap: u64,
    },
    /// 64-bit fetch-and-add on an 8-byte aligned remote word.
    AtomicFetchAdd {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
        /// Value to add.
        add: u64,
    },
    /// Send, and have the responder invalidate `rkey` (a type 2 memory window bound to the
    /// receiving QP) when the message is delivered (`IBV_WR_SEND_WITH_INV`). RC and XRC.
    SendWithInv {
        /// The remote key to invalidate.
        rkey: Rkey,
    },
    /// Invalidate a type 2 memory window of this QP's protection domain
    /// (`IBV_WR_LOCAL_INV`). Takes no SGEs.
    LocalInv {
        /// The window's current key.
        rkey: Rkey,
    },
    /// Bind a type 2 memory window (`IBV_WR_BIND_MW`); made by
    /// [`MemoryWindow::bind_wr`](crate::MemoryWindow::bind_wr). Takes no SGEs.
    BindMw(MwBindWr),
}

impl WrOpcode {
    /// True for the operations that run on the local NIC only (bind, local invalidate).
    pub fn is_local(&self) -> bool {
        matches!(self, Self::LocalInv { .. } | Self::BindMw(_))
    }
}

/// What a memory window bind does (`struct ibv_mw_bind_info` with the window and its new
/// key): made by [`MemoryWindow::bind_wr`](crate::MemoryWindow::bind_wr) (type 2) or by
/// [`QueuePair::bind_mw`](crate::QueuePair::bind_mw) (type 1) from a window and a memory
/// region, so that it names real objects (a stale one fails with `MwBindErr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBindWr {
    /// The provider's handle of the window.
    pub(crate) mw: u32,
    /// The key the window takes.
    pub(crate) rkey: Rkey,
    /// The memory region the window opens (its local key).
    pub(crate) lkey: Lkey,
    /// First byte of the window (a virtual address inside the region).
    pub(crate) addr: u64,
    /// Length in bytes (0 unbinds a type 1 window).
    pub(crate) length: u64,
    /// Remote access granted through the window (`REMOTE_READ`, `REMOTE_WRITE`,
    /// `REMOTE_ATOMIC`).
    pub(crate) access: AccessFlags,
    /// Made by `QueuePair::bind_mw` (a type 1 bind).
    pub(crate) type1: bool,
}

impl MwBindWr {
    /// The key the window takes.
    pub fn rkey(&self) -> Rkey {
        self.rkey
    }

    /// First byte of the window.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn length(&self) -> u64 {
        self.length
    }

    /// Remote access granted through the window.
    pub fn access(&self) -> AccessFlags {
        self.access
    }
}

/// The destination of a UD send (`wr.ud` of `struct ibv_send_wr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// The path (from an `AddressHandle`).
    pub ah: AhAttr,
    /// Destination QP number (`Qpn::MULTICAST` for a multicast group).
    pub remote_qpn: Qpn,
    /// Destination Q_Key; with bit 31 set (a controlled Q_Key) the sending QP's own Q_Key is
    /// used instead.
    pub remote_qkey: u32,
}

/// A send-queue work request (`struct ibv_send_wr`).
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Local memory to send from / read into.
    pub sg_list: &'a [Sge],
    /// The operation.
    pub opcode: WrOpcode,
    /// Flags (signaled, inline, fence, solicited).
    pub send_flags: SendFlags,
    /// Inline payload given directly as bytes (instead of through `sg_list`); implies
    /// `INLINE`. Must not exceed the QP's `max_inline_data`.
    pub inline_data: Option<&'a [u8]>,
    /// Destination of a UD send (required on UD QPs, ignored otherwise).
    pub ud: Option<UdDest>,
    /// The remote XRC SRQ number (required on XRC initiator QPs, ignored otherwise).
    pub remote_srqn: Option<u32>,
}

impl<'a> SendWr<'a> {
    /// A work request doing `opcode` on `sg_list`, unsignaled.
    pub fn new(wr_id: u64, opcode: WrOpcode, sg_list: &'a [Sge]) -> Self {
        Self {
            wr_id,
            sg_list,
            opcode,
            send_flags: SendFlags::EMPTY,
            inline_data: None,
            ud: None,
            remote_srqn: None,
        }
    }

    /// A plain send.
    pub fn send(wr_id: u64, sg_list: &'a [Sge]) -> Self {
        Self::new(wr_id, WrOpcode::Send, sg_list)
    }

    /// A send whose payload is copied from `data` at post time.
    pub fn send_inline(wr_id: u64, data: &'a [u8]) -> Self {
        let mut wr = Self::new(wr_id, WrOpcode::Send, &[]);
        wr.inline_data = Some(data);
        wr.send_flags |= SendFlags::INLINE;
        wr
    }

    /// Adds flags.
    pub fn flags(mut self, flags: SendFlags) -> Self {
        self.send_flags |= flags;
        self
    }

    /// Names the remote XRC SRQ that receives this message (XRC initiator QPs).
    pub fn to_srq(mut self, srqn: u32) -> Self {
        self.remote_srqn = Some(srqn);
        self
    }

    /// Requests a completion on success.
    pub fn signaled(self) -> Self {
        self.flags(SendFlags::SIGNALED)
    }

    /// Total bytes named by the SGEs (or the inline data).
    pub fn total_len(&self) -> u64 {
        match self.inline_data {
            Some(d) => d.len() as u64,
            None => self.sg_list.iter().map(|s| u64::from(s.length)).sum(),
        }
    }
}

/// A receive work request (`struct ibv_recv_wr`).
#[derive(Debug, Clone, Copy)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where incoming data lands.
    pub sg_list: &'a [Sge],
}

impl<'a> RecvWr<'a> {
    /// A receive into `sg_list`.
    pub fn new(wr_id: u64, sg_list: &'a [Sge]) -> Self {
        Self { wr_id, sg_list }
    }
}
