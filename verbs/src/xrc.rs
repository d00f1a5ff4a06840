//! XRC: domains, XRC SRQs and target QPs (spec §7). One XRC initiator QP
//! (`QpInitAttr::xrc_send`) reaches every XRC SRQ of the domain behind the remote target QP,
//! naming the SRQ per work request (`SendWr::to_srq`).

use std::sync::Arc;

use crate::cq::CompletionQueue;
use crate::device::Context;
use crate::error::VerbsError;
use crate::pd::ProtectionDomain;
use crate::qp::QueuePair;
use crate::srq::{SharedReceiveQueue, SrqInitAttr};

/// An XRC domain (`struct ibv_xrcd`).
#[derive(Debug, Clone)]
pub struct XrcDomain {
    pub(crate) ctx: Context,
    pub(crate) id: u32,
}

impl XrcDomain {
    pub(crate) fn open(ctx: &Context) -> Result<Self, VerbsError> {
        let id = ctx.dev().alloc_xrcd()?;
        Ok(Self {
            ctx: ctx.clone(),
            id,
        })
    }
}

impl ProtectionDomain {
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
        SharedReceiveQueue::create(self, Some((xrcd.id, cq.inner.id)), attr)
    }

    /// Creates an XRC target QP in `xrcd` (`ibv_create_qp_ex` with `IBV_QPT_XRC_RECV`).
    /// Connect it to the remote initiator like an RC QP (it needs the RC receive-side
    /// attributes); it has no send or receive queue of its own.
    ///
    /// # Errors
    /// `InvalidArgument` for a domain of another device.
    pub fn create_xrc_target_qp(&self, xrcd: &XrcDomain) -> Result<QueuePair, VerbsError> {
        QueuePair::new_xrc_target(self, xrcd)
    }
}

impl SharedReceiveQueue {
    /// The 24-bit SRQ number senders name in `SendWr::to_srq` (`ibv_get_srq_num`).
    pub fn srq_num(&self) -> u32 {
        self.inner.id
    }
}

impl Context {
    /// Opens an XRC domain (`ibv_open_xrcd`). Domains are per device in the soft provider
    /// (no file-backed sharing between processes yet).
    ///
    /// # Errors
    /// `Unsupported` on a device without XRC.
    pub fn open_xrcd(&self) -> Result<XrcDomain, VerbsError> {
        XrcDomain::open(self)
    }
}
