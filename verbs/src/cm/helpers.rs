//! The `rdma_verbs.h` helpers: registration on the ID's protection domain, posting to the
//! ID's QP, and bounded waits for one completion. Thin functions over the verbs API.

use std::time::Duration;

use super::error::CmError;
use super::id::CmId;
use crate::ah::AddressHandle;
use crate::cq::CompletionQueue;
use crate::pd::{MemoryRegion, ProtectionDomain};
use crate::qp::QueuePair;
use crate::types::{AccessFlags, Qpn, Rkey, SendFlags, WorkCompletion};
use crate::wr::{RecvWr, SendWr, WrOpcode};

impl CmId {
    fn pd_or_err(&self) -> Result<&ProtectionDomain, CmError> {
        self.pd().ok_or(CmError::InvalidState {
            op: "register memory",
            why: "the ID has no QP and so no protection domain (create_qp)",
        })
    }

    fn qp_or_err(&self) -> Result<&QueuePair, CmError> {
        self.qp().ok_or(CmError::InvalidState {
            op: "post",
            why: "the ID has no QP (create_qp)",
        })
    }

    /// Registers `len` zeroed bytes for sends and receives on the ID's protection domain
    /// (`rdma_reg_msgs`).
    ///
    /// # Errors
    /// `InvalidState` without a QP; `Verbs` from the registration.
    pub fn reg_msgs(&self, len: usize) -> Result<MemoryRegion, CmError> {
        Ok(self.pd_or_err()?.reg_mr(len, AccessFlags::LOCAL_WRITE)?)
    }

    /// Registers `len` bytes that the peer may RDMA-read (`rdma_reg_read`).
    ///
    /// # Errors
    /// As [`reg_msgs`](Self::reg_msgs).
    pub fn reg_read(&self, len: usize) -> Result<MemoryRegion, CmError> {
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
        Ok(self.pd_or_err()?.reg_mr(len, access)?)
    }

    /// Registers `len` bytes that the peer may RDMA-write (`rdma_reg_write`).
    ///
    /// # Errors
    /// As [`reg_msgs`](Self::reg_msgs).
    pub fn reg_write(&self, len: usize) -> Result<MemoryRegion, CmError> {
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        Ok(self.pd_or_err()?.reg_mr(len, access)?)
    }

    /// Posts a receive of up to `len` bytes at `offset` of `mr` (`rdma_post_recv`).
    ///
    /// # Errors
    /// `InvalidState` without a QP; `Post` when the QP refuses it.
    pub fn post_recv(
        &self,
        wr_id: u64,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
    ) -> Result<(), CmError> {
        let sge = [mr.sge(offset, len)];
        Ok(self.qp_or_err()?.post_recv(&RecvWr::new(wr_id, &sge))?)
    }

    /// Sends `len` bytes at `offset` of `mr` (`rdma_post_send`); `flags` as in
    /// `ibv_post_send` (`SIGNALED` for a completion unless the QP signals every send).
    ///
    /// # Errors
    /// As [`post_recv`](Self::post_recv).
    pub fn post_send(
        &self,
        wr_id: u64,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        flags: SendFlags,
    ) -> Result<(), CmError> {
        let sge = [mr.sge(offset, len)];
        let wr = SendWr::send(wr_id, &sge).flags(flags);
        Ok(self.qp_or_err()?.post_send(&wr)?)
    }

    /// RDMA-reads `len` bytes at `remote_addr` (key `rkey`) into `offset` of `mr`
    /// (`rdma_post_read`).
    ///
    /// # Errors
    /// As [`post_recv`](Self::post_recv).
    #[expect(clippy::too_many_arguments, reason = "rdma_post_read's own arguments")]
    pub fn post_read(
        &self,
        wr_id: u64,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        remote_addr: u64,
        rkey: Rkey,
        flags: SendFlags,
    ) -> Result<(), CmError> {
        let sge = [mr.sge(offset, len)];
        let op = WrOpcode::RdmaRead { remote_addr, rkey };
        let wr = SendWr::new(wr_id, op, &sge).flags(flags);
        Ok(self.qp_or_err()?.post_send(&wr)?)
    }

    /// RDMA-writes `len` bytes at `offset` of `mr` to `remote_addr` (key `rkey`)
    /// (`rdma_post_write`).
    ///
    /// # Errors
    /// As [`post_recv`](Self::post_recv).
    #[expect(clippy::too_many_arguments, reason = "rdma_post_write's own arguments")]
    pub fn post_write(
        &self,
        wr_id: u64,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        remote_addr: u64,
        rkey: Rkey,
        flags: SendFlags,
    ) -> Result<(), CmError> {
        let sge = [mr.sge(offset, len)];
        let op = WrOpcode::RdmaWrite { remote_addr, rkey };
        let wr = SendWr::new(wr_id, op, &sge).flags(flags);
        Ok(self.qp_or_err()?.post_send(&wr)?)
    }

    /// Sends a datagram of `len` bytes at `offset` of `mr` to `ah`, QP `remote_qpn`, Q_Key
    /// `remote_qkey` (`rdma_post_ud_send`).
    ///
    /// # Errors
    /// As [`post_recv`](Self::post_recv).
    #[expect(
        clippy::too_many_arguments,
        reason = "rdma_post_ud_send's own arguments"
    )]
    pub fn post_ud_send(
        &self,
        wr_id: u64,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        ah: &AddressHandle,
        remote_qpn: Qpn,
        remote_qkey: u32,
        flags: SendFlags,
    ) -> Result<(), CmError> {
        let sge = [mr.sge(offset, len)];
        let wr = SendWr::send(wr_id, &sge)
            .flags(flags)
            .to(ah, remote_qpn, remote_qkey);
        Ok(self.qp_or_err()?.post_send(&wr)?)
    }

    /// Waits up to `timeout` for one completion on the send CQ (`rdma_get_send_comp`). A
    /// completion with an error status is returned like any other.
    ///
    /// # Errors
    /// `InvalidState` without a QP; `Timeout` when none came.
    pub fn get_send_comp(&self, timeout: Duration) -> Result<WorkCompletion, CmError> {
        let (send, _) = self.cqs().ok_or(CmError::InvalidState {
            op: "wait for a completion",
            why: "the ID has no QP (create_qp)",
        })?;
        one_completion(send, timeout, "a send completion")
    }

    /// Waits up to `timeout` for one completion on the receive CQ (`rdma_get_recv_comp`).
    ///
    /// # Errors
    /// As [`get_send_comp`](Self::get_send_comp).
    pub fn get_recv_comp(&self, timeout: Duration) -> Result<WorkCompletion, CmError> {
        let (_, recv) = self.cqs().ok_or(CmError::InvalidState {
            op: "wait for a completion",
            why: "the ID has no QP (create_qp)",
        })?;
        one_completion(recv, timeout, "a receive completion")
    }
}

fn one_completion(
    cq: &CompletionQueue,
    timeout: Duration,
    what: &'static str,
) -> Result<WorkCompletion, CmError> {
    let mut wc = [WorkCompletion::EMPTY];
    match cq.poll_blocking(&mut wc, timeout)? {
        0 => Err(CmError::Timeout(what)),
        _ => Ok(wc[0]),
    }
}
