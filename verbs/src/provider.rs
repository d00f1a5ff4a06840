//! The interface every provider implements. The public objects (`Context`,
//! `ProtectionDomain`, `CompletionQueue`, `QueuePair`, …) hold small integer handles and call
//! through this trait, so the soft provider and a hardware provider sit behind the same API
//! without callers knowing which one they use.

use std::any::Any;
use std::fmt;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;

use crate::error::{PostError, VerbsError};
use crate::mem::RegisteredMemory;
use crate::os::ChannelInner;
use crate::types::{
    AccessFlags, DeviceAttr, Gid, MwType, PortAttr, QpAttr, QpAttrMask, QpCap, QpState, Qpn,
    SendFlags, SendOps, WorkCompletion,
};
use crate::vocab::FaultStats;
use crate::vocab::{AsyncEvent, NicCounters, QpConfig, SrqState};
use crate::wr::{MwBindWr, RecvWr, SendWr};

/// Counters only the soft provider keeps.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SoftStats {
    pub(crate) counters: NicCounters,
    pub(crate) faults: Option<FaultStats>,
    pub(crate) tx_errors: u64,
    pub(crate) tx_unreachable: u64,
}

/// What a provider does. Handles are the provider's own numbering (QPNs are real QP
/// numbers). Methods that cannot fail on a given provider still return `Result` where
/// another provider's call can. `Any` lets code that pairs with one provider (the
/// librdmacm side of `cm`) reach that provider's own type from a `Context`.
pub(crate) trait Provider: Any + Send + Sync + fmt::Debug {
    // Device.
    fn query_device(&self) -> DeviceAttr;
    fn query_port(&self, port: u8) -> Result<PortAttr, VerbsError>;
    fn query_gid(&self, port: u8, index: u32) -> Result<Gid, VerbsError>;
    /// The type of GID table entry `index` of `port` (`Unsupported` where the provider
    /// cannot tell).
    fn query_gid_type(&self, _port: u8, _index: u32) -> Result<crate::types::GidType, VerbsError> {
        Err(VerbsError::Unsupported("GID types on this provider"))
    }
    /// The UDP address of a soft port (`InvalidArgument` elsewhere).
    fn port_addr(&self, port: u8) -> Result<SocketAddr, VerbsError>;
    fn pop_event(&self) -> Option<AsyncEvent>;
    fn event_fd(&self) -> RawFd;
    fn soft_stats(&self) -> Option<SoftStats> {
        None
    }
    /// The context is being closed.
    fn shutdown(&self);
    /// The clock the device runs on (virtual on a simulated net).
    fn clock(&self) -> crate::os::Clock {
        crate::os::Clock::real()
    }

    // Protection domains and memory. `reg_mr` returns (lkey, rkey).
    fn alloc_pd(&self) -> Result<u32, VerbsError>;
    fn reg_mr(
        &self,
        pd: u32,
        mem: &Arc<RegisteredMemory>,
        access: AccessFlags,
    ) -> Result<(u32, u32), VerbsError>;
    /// Deregisters the region with local key `lkey` (its owner let it go). Memory windows
    /// still bound to it keep `mem` reachable until they close: a provider that cannot
    /// deregister yet keeps the memory alive until it can.
    fn dereg_mr(&self, lkey: u32, mem: &Arc<RegisteredMemory>);
    /// Deregisters the region with local key `lkey` unless something (a bound memory
    /// window) still uses it (`ibv_dereg_mr` with its EBUSY).
    fn dereg_mr_checked(&self, lkey: u32) -> Result<(), VerbsError>;

    // Memory windows.
    /// Allocates a window in `pd`; returns (handle, key).
    fn alloc_mw(&self, _pd: u32, _mw_type: MwType) -> Result<(u32, u32), VerbsError> {
        Err(VerbsError::Unsupported("memory windows on this provider"))
    }
    fn dealloc_mw(&self, _mw: u32) {}
    /// Posts a type 1 bind (`ibv_bind_mw`) on `qpn`; returns the key the window takes.
    fn bind_mw(
        &self,
        _qpn: Qpn,
        _wr_id: u64,
        _flags: SendFlags,
        _bind: &MwBindWr,
    ) -> Result<u32, PostError> {
        Err(PostError::InvalidWorkRequest(
            "memory windows are not supported on this provider",
        ))
    }

    // Completion queues and progress.
    fn create_cq(&self, cqe: usize, channel: &Arc<ChannelInner>) -> Result<u32, VerbsError>;
    fn destroy_cq(&self, cq: u32);
    fn poll_cq(&self, cq: u32, wc: &mut [WorkCompletion]) -> usize;
    fn req_notify_cq(&self, cq: u32, solicited_only: bool);
    /// A thread polling: make progress on this thread (busy-poll mode).
    fn progress(&self) -> usize;
    /// A polling thread is about to sleep.
    fn release(&self);
    /// Sleeps until `fd` (a completion channel's) is readable or `timeout` passes. A
    /// provider that needs a thread to move packets (soft) moves them on this one meanwhile.
    fn park(&self, fd: RawFd, timeout: std::time::Duration) -> std::io::Result<()> {
        self.release();
        crate::os::poll_readable(&[fd], Some(timeout)).map(|_| ())
    }
    /// The calling thread opens (`true`) or closes a post batch (see
    /// [`Context::batch_posts`](crate::Context::batch_posts)). Providers whose posts are
    /// cheap ignore it.
    fn batch_posts(&self, _on: bool) {}

    // Queue pairs.
    fn create_qp(&self, cfg: &QpConfig) -> Result<Qpn, VerbsError>;
    fn destroy_qp(&self, qpn: Qpn);
    fn modify_qp(&self, qpn: Qpn, attr: &QpAttr, mask: QpAttrMask) -> Result<(), VerbsError>;
    fn query_qp(&self, qpn: Qpn) -> Option<(QpAttr, QpCap)>;
    /// The QP's current state, for the common transition check in `QueuePair::modify`;
    /// `None` when the provider cannot tell (the QP is gone, or the device reports a state
    /// verbs does not name), which leaves the check to the provider.
    fn qp_state(&self, qpn: Qpn) -> Option<QpState> {
        self.query_qp(qpn).map(|(a, _)| a.qp_state)
    }
    fn post_send(&self, qpn: Qpn, wrs: &[SendWr<'_>]) -> Result<(), (usize, PostError)>;
    /// Posts `wrs` whole or not at all (`ibv_wr_complete`): a provider that can, checks
    /// every request before queueing the first. `send_ops` are the operations the QP was
    /// created for (`ibv_qp_init_attr_ex.send_ops_flags`; empty when it was not).
    fn post_send_all(
        &self,
        qpn: Qpn,
        wrs: &[SendWr<'_>],
        _send_ops: SendOps,
    ) -> Result<(), (usize, PostError)> {
        self.post_send(qpn, wrs)
    }
    fn post_recv(&self, qpn: Qpn, wr: &RecvWr<'_>) -> Result<(), PostError>;
    fn attach_mcast(&self, qpn: Qpn, gid: Gid, port: u8) -> Result<(), VerbsError>;
    fn detach_mcast(&self, qpn: Qpn, gid: Gid, port: u8) -> Result<(), VerbsError>;

    // Shared receive queues and XRC.
    /// `xrc` = (XRC domain, CQ) for an XRC SRQ.
    fn create_srq(
        &self,
        pd: u32,
        xrc: Option<(u32, u32)>,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<u32, VerbsError>;
    /// A tag-matching SRQ whose list operations complete on `cq`.
    fn create_srq_tm(
        &self,
        _pd: u32,
        _max_wr: u32,
        _max_sge: u32,
        _tm: crate::tm::TmCaps,
        _cq: u32,
    ) -> Result<u32, VerbsError> {
        Err(VerbsError::Unsupported(
            "tag-matching SRQs on this provider",
        ))
    }
    /// `ibv_post_srq_ops`; one handle per operation (an `Add`'s, else 0).
    fn post_srq_ops(
        &self,
        _srq: u32,
        _ops: &[crate::tm::OpsWr<'_>],
    ) -> Result<Vec<u32>, (usize, PostError)> {
        Err((
            0,
            PostError::InvalidWorkRequest("tag-matching SRQs are not supported on this provider"),
        ))
    }
    fn destroy_srq(&self, srq: u32) -> Result<(), VerbsError>;
    fn post_srq_recv(&self, srq: u32, wr: &RecvWr<'_>) -> Result<(), PostError>;
    /// Posts several receive WQEs in order; stops at the first that fails and returns its
    /// index with the error (`ibv_post_srq_recv` with a list and `bad_wr`).
    fn post_srq_recv_list(&self, srq: u32, wrs: &[RecvWr<'_>]) -> Result<(), (usize, PostError)> {
        for (i, wr) in wrs.iter().enumerate() {
            self.post_srq_recv(srq, wr).map_err(|e| (i, e))?;
        }
        Ok(())
    }
    fn modify_srq(
        &self,
        srq: u32,
        max_wr: Option<u32>,
        limit: Option<u32>,
    ) -> Result<(), VerbsError>;
    fn query_srq(&self, srq: u32) -> Option<SrqState>;
    fn alloc_xrcd(&self) -> Result<u32, VerbsError>;
    /// Whether `qpn` is a target QP of XRC domain `xrcd` (`Unsupported` where the provider
    /// cannot tell).
    fn xrcd_has_target(&self, _xrcd: u32, _qpn: Qpn) -> Result<bool, VerbsError> {
        Err(VerbsError::Unsupported(
            "asking a provider for its XRC targets",
        ))
    }
    /// Opens the XRC domain shared through the file at `path` (`ibv_open_xrcd` with the
    /// file's descriptor).
    fn open_xrcd_file(&self, _path: &std::path::Path) -> Result<SharedXrcd, VerbsError> {
        Err(VerbsError::Unsupported(
            "XRC domains shared through a file on this provider",
        ))
    }
}

/// A domain opened through a file.
#[derive(Debug, Clone)]
pub(crate) enum SharedXrcd {
    /// The domain is this device's own (handle in it): the soft provider's host, or
    /// hardware, where the kernel shares it.
    Local(u32),
    /// The domain lives in another soft device: its handle there, the link its SRQs and
    /// targets are created through, and the UDP addresses where its targets receive.
    Remote {
        xrcd: u32,
        link: Arc<dyn Provider>,
        ports: Vec<SocketAddr>,
    },
}
