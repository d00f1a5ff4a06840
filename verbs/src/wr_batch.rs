//! Batch posting (`ibv_wr_*`): open a batch on a QP ([`QueuePair::wr_start`]), build each
//! work request with a builder (`send`, `rdma_write`, `bind_mw`, …) followed by its setters
//! (`set_sge`, `set_inline_data`, `set_ud_addr`, …), then post the whole batch with
//! [`WrBatch::complete`] or drop it with [`WrBatch::abort`].
//!
//! As in verbs, the builders and setters report nothing: the first broken rule is kept and
//! [`complete`](WrBatch::complete) returns it, posting none of the batch. The rules are the
//! manual page's:
//!
//! - each request takes its `wr_id` and `wr_flags` from the batch's fields as they are when
//!   its builder is called;
//! - a setter applies to the request built last; calling one before any builder is an error;
//! - sends, RDMA and atomics take one DATA setter (`set_sge`, `set_sge_list`,
//!   `set_inline_data`, `set_inline_data_list`; none means no data); a second one, or any
//!   on `bind_mw` / `local_inv`, is an error; inline data is for sends and RDMA writes only;
//! - UD requests need `set_ud_addr`, XRC requests `set_xrc_srqn` (and no other QP type
//!   takes them);
//! - each operation is valid on the QP types the manual lists (RDMA read and atomics on RC
//!   and XRC, writes, binds and invalidations also on UC, sends on all), and, when the QP
//!   was created with [`QpInitAttr::send_ops`](crate::QpInitAttr::send_ops), only the
//!   operations named there.
//!
//! The batch is posted whole or not at all: on the soft provider every request is checked
//! (queue room, keys, lengths) before the first is queued; on libibverbs through
//! `ibv_wr_start` / `ibv_wr_complete` when the QP was created with `send_ops`, otherwise as
//! one `ibv_post_send` chain (see `QpInitAttr::send_ops` for what that means on refusal).
//!
//! An open batch holds the QP's batch lock: a second `wr_start` on the same QP (from another
//! thread) waits until this batch completes or aborts. Ordinary `post_send` calls are not
//! held back; the batch's requests are queued after whatever was posted before `complete`.

use crate::ah::AddressHandle;
use crate::error::PostError;
use crate::qp::QueuePair;
use crate::types::{QpType, Qpn, Rkey, SendFlags, SendOps};
use crate::wr::{MwBindWr, SendWr, Sge, UdDest, WrOpcode};

/// Why a batch was not posted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WrError {
    /// Request `index` broke a calling rule; nothing was posted.
    #[error("work request {index} of the batch: {reason}")]
    Invalid {
        /// The request (0-based, in building order; a setter before any builder: 0).
        index: usize,
        /// The rule.
        reason: &'static str,
    },
    /// The provider refused request `index`; nothing was posted (see the module docs for
    /// the exception on libibverbs without `send_ops`).
    #[error("work request {index} of the batch: {error}")]
    Post {
        /// The request (0-based).
        index: usize,
        /// What the provider said.
        error: PostError,
    },
}

/// Where a request's data is.
#[derive(Debug, Clone, Copy)]
enum Data {
    None,
    /// `sges[start..start + n]`.
    Sges(usize, usize),
    /// `inline[start..start + n]`.
    Inline(usize, usize),
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    wr_id: u64,
    flags: SendFlags,
    opcode: WrOpcode,
    data: Data,
    ud: Option<UdDest>,
    srqn: Option<u32>,
}

/// An open batch (`ibv_wr_start` … `ibv_wr_complete` / `ibv_wr_abort`); dropping it
/// aborts it.
#[derive(Debug)]
pub struct WrBatch<'q> {
    qp: &'q QueuePair,
    _lock: parking_lot::MutexGuard<'q, ()>,
    /// The `wr_id` of the next request built (`qpx->wr_id`).
    pub wr_id: u64,
    /// The flags of the next request built (`qpx->wr_flags`): `SIGNALED`, `FENCE`,
    /// `SOLICITED`, `INLINE`.
    pub wr_flags: SendFlags,
    entries: Vec<Entry>,
    sges: Vec<Sge>,
    inline: Vec<u8>,
    error: Option<(usize, &'static str)>,
}

impl QueuePair {
    /// Opens a batch of work requests on this QP (`ibv_wr_start`). Waits while another
    /// thread has a batch open on it.
    pub fn wr_start(&self) -> WrBatch<'_> {
        WrBatch {
            qp: self,
            _lock: self.wr_lock.lock(),
            wr_id: 0,
            wr_flags: SendFlags::EMPTY,
            entries: Vec::new(),
            sges: Vec::new(),
            inline: Vec::new(),
            error: None,
        }
    }
}

impl WrBatch<'_> {
    fn fail(&mut self, reason: &'static str) {
        if self.error.is_none() {
            self.error = Some((self.entries.len().saturating_sub(1), reason));
        }
    }

    /// Starts a request: checks the operation against the QP type and its `send_ops`.
    fn build(&mut self, opcode: WrOpcode, op: SendOps) -> &mut Self {
        let t = self.qp.qp_type();
        let allowed = match op {
            SendOps::RDMA_READ | SendOps::ATOMIC_CMP_AND_SWP | SendOps::ATOMIC_FETCH_AND_ADD => {
                matches!(t, QpType::Rc | QpType::XrcSend)
            }
            SendOps::SEND | SendOps::SEND_WITH_IMM => {
                matches!(t, QpType::Rc | QpType::Uc | QpType::Ud | QpType::XrcSend)
            }
            _ => matches!(t, QpType::Rc | QpType::Uc | QpType::XrcSend),
        };
        self.entries.push(Entry {
            wr_id: self.wr_id,
            flags: self.wr_flags,
            opcode,
            data: Data::None,
            ud: None,
            srqn: None,
        });
        if !allowed {
            self.fail("the operation is not available on this QP type");
        } else if self.qp.send_ops != SendOps::EMPTY && !self.qp.send_ops.contains(op) {
            self.fail("the QP was not created for this operation (QpInitAttr::send_ops)");
        }
        self
    }

    /// The request built last, for a setter.
    fn last(&mut self) -> Option<&mut Entry> {
        if self.entries.is_empty() {
            self.fail("a setter was called before any work request builder");
        }
        self.entries.last_mut()
    }

    /// Checks that the last request takes a DATA setter (and has none yet).
    fn data_slot(&mut self, inline: bool) -> bool {
        let Some(e) = self.last() else {
            return false;
        };
        let (local, has, op) = (e.opcode.is_local(), !matches!(e.data, Data::None), e.opcode);
        let inline_ok = matches!(
            op,
            WrOpcode::Send
                | WrOpcode::SendWithImm { .. }
                | WrOpcode::SendWithInv { .. }
                | WrOpcode::RdmaWrite { .. }
                | WrOpcode::RdmaWriteWithImm { .. }
        );
        if local {
            self.fail("bind_mw and local_inv take no data setter");
        } else if has {
            self.fail("a second data setter on one work request");
        } else if inline && !inline_ok {
            self.fail("inline data is for sends and RDMA writes only");
        } else {
            return true;
        }
        false
    }

    // Builders.

    /// A send (`ibv_wr_send`).
    pub fn send(&mut self) -> &mut Self {
        self.build(WrOpcode::Send, SendOps::SEND)
    }

    /// A send with immediate data (`ibv_wr_send_imm`; `imm` as `SendWr` takes it).
    pub fn send_imm(&mut self, imm: u32) -> &mut Self {
        self.build(WrOpcode::SendWithImm { imm }, SendOps::SEND_WITH_IMM)
    }

    /// A send that invalidates the peer's window `rkey` (`ibv_wr_send_inv`).
    pub fn send_inv(&mut self, rkey: Rkey) -> &mut Self {
        self.build(WrOpcode::SendWithInv { rkey }, SendOps::SEND_WITH_INV)
    }

    /// An RDMA write (`ibv_wr_rdma_write`).
    pub fn rdma_write(&mut self, rkey: Rkey, remote_addr: u64) -> &mut Self {
        self.build(
            WrOpcode::RdmaWrite { remote_addr, rkey },
            SendOps::RDMA_WRITE,
        )
    }

    /// An RDMA write with immediate data (`ibv_wr_rdma_write_imm`).
    pub fn rdma_write_imm(&mut self, rkey: Rkey, remote_addr: u64, imm: u32) -> &mut Self {
        let op = WrOpcode::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm,
        };
        self.build(op, SendOps::RDMA_WRITE_WITH_IMM)
    }

    /// An RDMA read into the request's SGEs (`ibv_wr_rdma_read`).
    pub fn rdma_read(&mut self, rkey: Rkey, remote_addr: u64) -> &mut Self {
        self.build(WrOpcode::RdmaRead { remote_addr, rkey }, SendOps::RDMA_READ)
    }

    /// An atomic compare-and-swap (`ibv_wr_atomic_cmp_swp`); the original value lands in
    /// the request's 8-byte SGE.
    pub fn atomic_cmp_swp(
        &mut self,
        rkey: Rkey,
        remote_addr: u64,
        compare: u64,
        swap: u64,
    ) -> &mut Self {
        let op = WrOpcode::AtomicCmpSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        };
        self.build(op, SendOps::ATOMIC_CMP_AND_SWP)
    }

    /// An atomic fetch-and-add (`ibv_wr_atomic_fetch_add`).
    pub fn atomic_fetch_add(&mut self, rkey: Rkey, remote_addr: u64, add: u64) -> &mut Self {
        let op = WrOpcode::AtomicFetchAdd {
            remote_addr,
            rkey,
            add,
        };
        self.build(op, SendOps::ATOMIC_FETCH_AND_ADD)
    }

    /// Binds a type 2 memory window (`ibv_wr_bind_mw`); `bind` from
    /// [`MemoryWindow::bind_wr`](crate::MemoryWindow::bind_wr).
    pub fn bind_mw(&mut self, bind: MwBindWr) -> &mut Self {
        self.build(WrOpcode::BindMw(bind), SendOps::BIND_MW)
    }

    /// Invalidates a type 2 memory window (`ibv_wr_local_inv`).
    pub fn local_inv(&mut self, rkey: Rkey) -> &mut Self {
        self.build(WrOpcode::LocalInv { rkey }, SendOps::LOCAL_INV)
    }

    // Setters.

    /// The request's data is one buffer (`ibv_wr_set_sge`).
    pub fn set_sge(&mut self, sge: Sge) -> &mut Self {
        self.set_sge_list(std::slice::from_ref(&sge))
    }

    /// The request's data is these buffers, concatenated (`ibv_wr_set_sge_list`).
    pub fn set_sge_list(&mut self, sges: &[Sge]) -> &mut Self {
        if self.data_slot(false) {
            let start = self.sges.len();
            self.sges.extend_from_slice(sges);
            if let Some(e) = self.entries.last_mut() {
                e.data = Data::Sges(start, sges.len());
            }
        }
        self
    }

    /// The request's data is copied from `data` now (`ibv_wr_set_inline_data`): the
    /// buffer may be reused at once.
    pub fn set_inline_data(&mut self, data: &[u8]) -> &mut Self {
        self.set_inline_data_list(&[data])
    }

    /// The request's data is copied now from these buffers, concatenated
    /// (`ibv_wr_set_inline_data_list`).
    pub fn set_inline_data_list(&mut self, bufs: &[&[u8]]) -> &mut Self {
        if self.data_slot(true) {
            let start = self.inline.len();
            for b in bufs {
                self.inline.extend_from_slice(b);
            }
            let n = self.inline.len() - start;
            if let Some(e) = self.entries.last_mut() {
                e.data = Data::Inline(start, n);
            }
        }
        self
    }

    /// The destination of a UD request (`ibv_wr_set_ud_addr`).
    pub fn set_ud_addr(
        &mut self,
        ah: &AddressHandle,
        remote_qpn: Qpn,
        remote_qkey: u32,
    ) -> &mut Self {
        let ud = self.qp.qp_type() == QpType::Ud;
        match self.last() {
            Some(e) if ud => {
                e.ud = Some(UdDest {
                    ah: *ah.attr(),
                    remote_qpn,
                    remote_qkey,
                });
            }
            Some(_) => self.fail("set_ud_addr on a QP that is not UD"),
            None => {}
        }
        self
    }

    /// The remote XRC SRQ of an XRC request (`ibv_wr_set_xrc_srqn`).
    pub fn set_xrc_srqn(&mut self, remote_srqn: u32) -> &mut Self {
        let xrc = self.qp.qp_type() == QpType::XrcSend;
        match self.last() {
            Some(e) if xrc => e.srqn = Some(remote_srqn),
            Some(_) => self.fail("set_xrc_srqn on a QP that is not an XRC initiator"),
            None => {}
        }
        self
    }

    /// The number of requests built so far.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing was built.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Posts the whole batch (`ibv_wr_complete`), or none of it.
    ///
    /// # Errors
    /// [`WrError::Invalid`] for the first broken calling rule, [`WrError::Post`] for the
    /// first request the provider refused.
    pub fn complete(self) -> Result<(), WrError> {
        if let Some((index, reason)) = self.error {
            return Err(WrError::Invalid { index, reason });
        }
        let t = self.qp.qp_type();
        let mut wrs = Vec::with_capacity(self.entries.len());
        for (index, e) in self.entries.iter().enumerate() {
            if t == QpType::Ud && e.ud.is_none() {
                let reason = "a UD request needs set_ud_addr";
                return Err(WrError::Invalid { index, reason });
            }
            if t == QpType::XrcSend && e.srqn.is_none() && !e.opcode.is_local() {
                let reason = "an XRC request needs set_xrc_srqn";
                return Err(WrError::Invalid { index, reason });
            }
            let mut wr = SendWr::new(e.wr_id, e.opcode, &[]);
            wr.send_flags = e.flags;
            wr.ud = e.ud;
            wr.remote_srqn = e.srqn;
            match e.data {
                Data::None => {}
                Data::Sges(s, n) => wr.sg_list = &self.sges[s..s + n],
                Data::Inline(s, n) => {
                    wr.inline_data = Some(&self.inline[s..s + n]);
                    wr.send_flags |= SendFlags::INLINE;
                }
            }
            wrs.push(wr);
        }
        if wrs.is_empty() {
            return Ok(());
        }
        self.qp
            .post_send_all(&wrs)
            .map_err(|(index, error)| WrError::Post { index, error })
    }

    /// Drops every request of the batch (`ibv_wr_abort`); the same as dropping it.
    pub fn abort(self) {}
}
