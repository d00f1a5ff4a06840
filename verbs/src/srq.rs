//! Shared receive queues.

use std::sync::Arc;

use crate::cq::CompletionQueue;
use crate::error::{PostError, VerbsError};
use crate::pd::{PdInner, ProtectionDomain};
use crate::provider::Provider;
use crate::wr::RecvWr;
use crate::xrc::XrcDomain;

pub use crate::vocab::SrqState as SrqAttr;

/// Creation attributes of an SRQ (`struct ibv_srq_init_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqInitAttr {
    /// Receive WQEs the SRQ can hold.
    pub max_wr: u32,
    /// SGEs per receive WQE.
    pub max_sge: u32,
    /// Initial limit (0 = not armed).
    pub srq_limit: u32,
}

impl Default for SrqInitAttr {
    fn default() -> Self {
        Self {
            max_wr: 1024,
            max_sge: 4,
            srq_limit: 0,
        }
    }
}

#[derive(Debug)]
pub(crate) struct SrqInner {
    pub(crate) pd: Arc<PdInner>,
    pub(crate) id: u32,
    /// The CQ a tag-matching SRQ completes its list operations on (kept alive).
    _cq: Option<Arc<crate::cq::CqInner>>,
    /// The provider the SRQ lives on when it is not the PD's device (an XRC SRQ of a
    /// shared domain hosted by another soft device).
    via: Option<Arc<dyn Provider>>,
}

impl SrqInner {
    fn dev(&self) -> &Arc<dyn Provider> {
        self.via.as_ref().unwrap_or_else(|| self.pd.ctx.dev())
    }
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        let id = self.id;
        // QPs hold a reference to their SRQ, so none is left when this runs.
        let _ = self.dev().destroy_srq(id);
    }
}

/// A shared receive queue (`struct ibv_srq`): receive WQEs posted once and consumed by any
/// of the QPs created on it; `WorkCompletion::qp_num` tells which QP received.
#[derive(Debug, Clone)]
pub struct SharedReceiveQueue {
    pub(crate) inner: Arc<SrqInner>,
}

impl SharedReceiveQueue {
    pub(crate) fn new(pd: &ProtectionDomain, a: &SrqInitAttr) -> Result<Self, VerbsError> {
        Self::create(pd, None, a)
    }

    /// Creates a plain (`xrc` = None) or XRC SRQ and arms its initial limit; an SRQ whose
    /// limit cannot be set is destroyed again, so a failed creation leaves nothing behind.
    pub(crate) fn create(
        pd: &ProtectionDomain,
        xrc: Option<(u32, u32)>,
        a: &SrqInitAttr,
    ) -> Result<Self, VerbsError> {
        Self::create_on(pd, None, xrc, a)
    }

    /// As [`create`](Self::create), on provider `via` instead of the PD's device.
    pub(crate) fn create_on(
        pd: &ProtectionDomain,
        via: Option<Arc<dyn Provider>>,
        xrc: Option<(u32, u32)>,
        a: &SrqInitAttr,
    ) -> Result<Self, VerbsError> {
        let dev = via.as_ref().unwrap_or_else(|| pd.inner.ctx.dev());
        let id = dev.create_srq(pd.inner.id, xrc, a.max_wr, a.max_sge)?;
        if a.srq_limit > 0
            && let Err(e) = dev.modify_srq(id, None, Some(a.srq_limit))
        {
            let _ = dev.destroy_srq(id);
            return Err(e);
        }
        Ok(Self {
            inner: Arc::new(SrqInner {
                pd: pd.inner.clone(),
                id,
                _cq: None,
                via,
            }),
        })
    }

    /// A tag-matching SRQ (see `tm.rs`).
    pub(crate) fn create_tm(
        pd: &ProtectionDomain,
        a: &SrqInitAttr,
        tm: crate::tm::TmCaps,
        cq: &CompletionQueue,
    ) -> Result<Self, VerbsError> {
        let dev = pd.inner.ctx.dev();
        if !Arc::ptr_eq(&cq.inner.ctx.inner, &pd.inner.ctx.inner) {
            return Err(VerbsError::InvalidArgument(
                "completion queue belongs to another device".into(),
            ));
        }
        let id = dev.create_srq_tm(pd.inner.id, a.max_wr, a.max_sge, tm, cq.inner.id)?;
        if a.srq_limit > 0
            && let Err(e) = dev.modify_srq(id, None, Some(a.srq_limit))
        {
            let _ = dev.destroy_srq(id);
            return Err(e);
        }
        Ok(Self {
            inner: Arc::new(SrqInner {
                pd: pd.inner.clone(),
                id,
                _cq: Some(cq.inner.clone()),
                via: None,
            }),
        })
    }

    /// `ibv_post_srq_ops` (see `tm.rs`).
    pub(crate) fn srq_ops(
        &self,
        ops: &[crate::tm::OpsWr<'_>],
    ) -> Result<Vec<u32>, (usize, PostError)> {
        self.inner.dev().post_srq_ops(self.inner.id, ops)
    }

    pub(crate) fn id(&self) -> u32 {
        self.inner.id
    }

    /// Posts a receive WQE (`ibv_post_srq_recv`).
    ///
    /// # Errors
    /// `QueueFull` when `max_wr` WQEs are posted, `TooManySge` above `max_sge`.
    pub fn post_recv(&self, wr: &RecvWr<'_>) -> Result<(), PostError> {
        let id = self.inner.id;
        self.inner.dev().post_srq_recv(id, wr)
    }

    /// Posts several receive WQEs in order (`ibv_post_srq_recv` with a list): one call to
    /// the device for all of them. Stops at the first that cannot be posted.
    ///
    /// # Errors
    /// `(index, error)` of the first WQE not posted (those before it are posted), with the
    /// errors of [`post_recv`](Self::post_recv).
    pub fn post_recv_list(&self, wrs: &[RecvWr<'_>]) -> Result<(), (usize, PostError)> {
        let id = self.inner.id;
        self.inner.dev().post_srq_recv_list(id, wrs)
    }

    /// Arms the limit event: when a WQE is taken and fewer than `limit` remain, the context
    /// gets one `AsyncEvent::SrqLimitReached` and the limit goes back to 0 (`ibv_modify_srq`
    /// with `IBV_SRQ_LIMIT`). 0 disarms.
    ///
    /// # Errors
    /// `InvalidAttribute` when `limit` exceeds `max_wr`.
    pub fn arm_limit(&self, limit: u32) -> Result<(), VerbsError> {
        let id = self.inner.id;
        self.inner.dev().modify_srq(id, None, Some(limit))
    }

    /// Grows the queue (`ibv_modify_srq` with `IBV_SRQ_MAX_WR`).
    ///
    /// # Errors
    /// `InvalidAttribute` when smaller than the WQEs posted or above the device limit.
    pub fn resize(&self, max_wr: u32) -> Result<(), VerbsError> {
        let id = self.inner.id;
        self.inner.dev().modify_srq(id, Some(max_wr), None)
    }

    /// Current attributes (`ibv_query_srq`).
    ///
    /// # Errors
    /// `NoSuchObject` if the device lost the SRQ (never in normal operation).
    pub fn query(&self) -> Result<SrqAttr, VerbsError> {
        let id = self.inner.id;
        self.inner
            .dev()
            .query_srq(id)
            .ok_or(VerbsError::NoSuchObject("SRQ"))
    }

    /// The SRQ's handle as it appears in `AsyncEvent::SrqLimitReached`.
    pub fn handle(&self) -> u32 {
        self.inner.id
    }
}

impl ProtectionDomain {
    /// Creates a shared receive queue (`ibv_create_srq`).
    ///
    /// # Errors
    /// `InvalidAttribute` for sizes of 0 or above the device limits.
    pub fn create_srq(&self, attr: &SrqInitAttr) -> Result<SharedReceiveQueue, VerbsError> {
        SharedReceiveQueue::new(self, attr)
    }

    /// Creates an XRC SRQ in `xrcd` (`ibv_create_srq_ex` with `IBV_SRQT_XRC`); its receive
    /// completions go to `cq`. Give its [`SharedReceiveQueue::srq_num`] to senders.
    ///
    /// # Errors
    /// `InvalidAttribute` for bad sizes, `InvalidArgument` for objects of another device.
    pub fn create_xrc_srq(
        &self,
        xrcd: &XrcDomain,
        cq: &CompletionQueue,
        attr: &SrqInitAttr,
    ) -> Result<SharedReceiveQueue, VerbsError> {
        let ctx = self.context();
        if !Arc::ptr_eq(&xrcd.ctx.inner, &ctx.inner)
            || !Arc::ptr_eq(&cq.inner.ctx.inner, &ctx.inner)
        {
            return Err(VerbsError::InvalidArgument(
                "objects of another device".into(),
            ));
        }
        SharedReceiveQueue::create_on(self, xrcd.dev(), Some((xrcd.id, cq.inner.id)), attr)
    }
}

impl SharedReceiveQueue {
    /// The 24-bit SRQ number senders name in `SendWr::to_srq` (`ibv_get_srq_num`).
    pub fn srq_num(&self) -> u32 {
        self.inner.id
    }
}

// Tag matching (the types and the behaviour: `tm.rs`).

impl ProtectionDomain {
    /// Creates a tag-matching SRQ (`ibv_create_srq_ex` with `IBV_SRQT_TM`): `attr` sizes
    /// its ordinary receives, `tm` its tag list; list operations complete on `cq`.
    ///
    /// # Errors
    /// `Unsupported` where the device has no tag matching (`max_num_tags` is 0);
    /// `InvalidAttribute` for capacities beyond the device's.
    pub fn create_srq_tm(
        &self,
        attr: &SrqInitAttr,
        tm: crate::tm::TmCaps,
        cq: &CompletionQueue,
    ) -> Result<SharedReceiveQueue, VerbsError> {
        SharedReceiveQueue::create_tm(self, attr, tm, cq)
    }
}

impl SharedReceiveQueue {
    /// Adds, removes or syncs tags (`ibv_post_srq_ops`). Returns one handle per operation:
    /// the new tag's for an `Add` (what a later `Del` names), 0 for the others.
    ///
    /// # Errors
    /// `(index, error)` of the first operation that could not be posted (the ones before it
    /// were): not a tag-matching SRQ, the list full, too many SGEs, more than `max_ops`
    /// operations.
    pub fn post_srq_ops(
        &self,
        ops: &[crate::tm::OpsWr<'_>],
    ) -> Result<Vec<u32>, (usize, PostError)> {
        self.srq_ops(ops)
    }
}
