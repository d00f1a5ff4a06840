//! Queue pairs.

use std::sync::Arc;

use crate::cq::{CompletionQueue, CqInner};
use crate::error::{PostError, VerbsError};
use crate::pd::{PdInner, ProtectionDomain};
use crate::soft::engine::QpConfig;
use crate::srq::{SharedReceiveQueue, SrqInner};
use crate::types::{Gid, QpAttr, QpAttrMask, QpCap, QpState, QpType, Qpn};
use crate::wr::{RecvWr, SendWr};

/// Creation attributes (`struct ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy)]
pub struct QpInitAttr<'a> {
    /// Transport type.
    pub qp_type: QpType,
    /// CQ for send completions.
    pub send_cq: &'a CompletionQueue,
    /// CQ for receive completions.
    pub recv_cq: &'a CompletionQueue,
    /// Queue capacities.
    pub cap: QpCap,
    /// Every send WR generates a completion, signaled or not.
    pub sq_sig_all: bool,
    /// Take receive WQEs from this shared receive queue instead of an own receive queue.
    pub srq: Option<&'a SharedReceiveQueue>,
}

impl<'a> QpInitAttr<'a> {
    /// RC attributes with default capacities.
    pub fn rc(send_cq: &'a CompletionQueue, recv_cq: &'a CompletionQueue) -> Self {
        Self {
            qp_type: QpType::Rc,
            send_cq,
            recv_cq,
            cap: QpCap::default(),
            sq_sig_all: false,
            srq: None,
        }
    }

    /// XRC initiator (send-only) attributes: send completions go to `cq`.
    pub fn xrc_send(cq: &'a CompletionQueue) -> Self {
        Self {
            qp_type: QpType::XrcSend,
            ..Self::rc(cq, cq)
        }
    }

    /// UD attributes with default capacities.
    pub fn ud(send_cq: &'a CompletionQueue, recv_cq: &'a CompletionQueue) -> Self {
        Self {
            qp_type: QpType::Ud,
            ..Self::rc(send_cq, recv_cq)
        }
    }
}

/// A queue pair (`struct ibv_qp`). `Send + Sync`: work may be posted from several threads.
#[derive(Debug)]
pub struct QueuePair {
    pd: Arc<PdInner>,
    qpn: Qpn,
    qp_type: QpType,
    _send_cq: Option<Arc<CqInner>>,
    _recv_cq: Option<Arc<CqInner>>,
    _srq: Option<Arc<SrqInner>>,
    _xrcd: Option<crate::xrc::XrcDomain>,
    /// Multicast groups this QP is attached to, with the port they were joined on.
    groups: parking_lot::Mutex<Vec<(Gid, u8)>>,
}

impl QueuePair {
    pub(crate) fn new(pd: &ProtectionDomain, a: &QpInitAttr<'_>) -> Result<Self, VerbsError> {
        let ctx = &pd.inner.ctx;
        for cq in [a.send_cq, a.recv_cq] {
            if !Arc::ptr_eq(&cq.inner.ctx.inner, &ctx.inner) {
                return Err(VerbsError::InvalidArgument(
                    "completion queue belongs to another device".into(),
                ));
            }
        }
        let (pdid, scq, rcq) = (pd.inner.id, a.send_cq.inner.id, a.recv_cq.inner.id);
        let qpn = ctx.dev().create_qp(&QpConfig {
            pd: pdid,
            qp_type: a.qp_type,
            send_cq: scq,
            recv_cq: rcq,
            cap: a.cap,
            sq_sig_all: a.sq_sig_all,
            srq: a.srq.map(|s| s.id()),
            xrcd: None,
        })?;
        Ok(Self {
            pd: pd.inner.clone(),
            qpn,
            qp_type: a.qp_type,
            _send_cq: Some(a.send_cq.inner.clone()),
            _recv_cq: Some(a.recv_cq.inner.clone()),
            _srq: a.srq.map(|s| s.inner.clone()),
            _xrcd: None,
            groups: parking_lot::Mutex::new(Vec::new()),
        })
    }

    /// The QP number.
    pub fn qp_num(&self) -> Qpn {
        self.qpn
    }

    /// The transport type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// Modifies attributes / moves through the state machine (`ibv_modify_qp`). Only fields
    /// named in `mask` are read.
    ///
    /// # Errors
    /// `IllegalTransition`, `MissingAttribute` or `UnexpectedAttribute` (naming the mask
    /// bit) exactly where verbs returns EINVAL; `InvalidAttribute` for out-of-range values.
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<(), VerbsError> {
        let qpn = self.qpn;
        self.pd.ctx.dev().modify_qp(qpn, attr, mask)
    }

    /// Current attributes and capacities (`ibv_query_qp`).
    ///
    /// # Errors
    /// `NoSuchObject` if the device lost the QP (never in normal operation).
    pub fn query(&self) -> Result<(QpAttr, QpCap), VerbsError> {
        let qpn = self.qpn;
        self.pd
            .ctx
            .dev()
            .query_qp(qpn)
            .ok_or(VerbsError::NoSuchObject("queue pair"))
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.query().map_or(QpState::Err, |(a, _)| a.qp_state)
    }

    /// Posts a send work request (`ibv_post_send`). The packets of small messages leave from
    /// this thread before it returns.
    ///
    /// # Errors
    /// See [`PostError`]: wrong state, full queue, too many SGEs, inline too long, malformed.
    pub fn post_send(&self, wr: &SendWr<'_>) -> Result<(), PostError> {
        let qpn = self.qpn;
        self.pd
            .ctx
            .dev()
            .post_send(qpn, std::slice::from_ref(wr))
            .map_err(|(_, e)| e)
    }

    /// Posts several send work requests in order; stops at the first error and returns the
    /// number posted with it.
    ///
    /// # Errors
    /// `(posted, error)` for the first request that could not be posted.
    pub fn post_send_batch(&self, wrs: &[SendWr<'_>]) -> Result<(), (usize, PostError)> {
        let qpn = self.qpn;
        self.pd.ctx.dev().post_send(qpn, wrs)
    }

    /// Posts a receive work request (`ibv_post_recv`).
    ///
    /// # Errors
    /// See [`PostError`].
    pub fn post_recv(&self, wr: &RecvWr<'_>) -> Result<(), PostError> {
        let qpn = self.qpn;
        self.pd.ctx.dev().post_recv(qpn, wr)
    }
}

impl QueuePair {
    /// Creates an XRC target (receive-only) QP in `xrcd`: it takes receive WQEs, the
    /// protection domain and the completion queue from whichever XRC SRQ of the domain a
    /// message names.
    pub(crate) fn new_xrc_target(
        pd: &ProtectionDomain,
        xrcd: &crate::xrc::XrcDomain,
    ) -> Result<Self, VerbsError> {
        let ctx = &pd.inner.ctx;
        if !Arc::ptr_eq(&xrcd.ctx.inner, &ctx.inner) {
            return Err(VerbsError::InvalidArgument(
                "XRC domain of another device".into(),
            ));
        }
        let (pdid, d) = (pd.inner.id, xrcd.id);
        let qpn = ctx.dev().create_qp(&QpConfig {
            pd: pdid,
            qp_type: QpType::XrcRecv,
            send_cq: 0,
            recv_cq: 0,
            cap: QpCap {
                max_send_wr: 0,
                max_recv_wr: 0,
                ..QpCap::default()
            },
            sq_sig_all: false,
            srq: None,
            xrcd: Some(d),
        })?;
        Ok(Self {
            pd: pd.inner.clone(),
            qpn,
            qp_type: QpType::XrcRecv,
            _send_cq: None,
            _recv_cq: None,
            _srq: None,
            _xrcd: Some(xrcd.clone()),
            groups: parking_lot::Mutex::new(Vec::new()),
        })
    }

    /// Attaches this UD QP to a multicast group (`ibv_attach_mcast`): every datagram sent to
    /// the group (destination QPN `Qpn::MULTICAST`) reaches it, one copy per attached QP.
    /// The LID is ignored on RoCE.
    ///
    /// # Errors
    /// `Unsupported` for a QP that is not UD, `InvalidArgument` for a GID that is not
    /// multicast, `Io` when the group cannot be joined.
    pub fn attach_mcast(&self, gid: Gid, _lid: u16) -> Result<(), VerbsError> {
        let qpn = self.qpn;
        let port = self.query().map_or(1, |(a, _)| a.port_num);
        self.pd.ctx.dev().attach_mcast(qpn, gid, port)?;
        self.groups.lock().push((gid, port));
        Ok(())
    }

    /// Detaches this QP from a group (`ibv_detach_mcast`).
    ///
    /// # Errors
    /// `InvalidArgument` when the QP is not attached to `gid`.
    pub fn detach_mcast(&self, gid: Gid, _lid: u16) -> Result<(), VerbsError> {
        let qpn = self.qpn;
        let mut groups = self.groups.lock();
        let i = groups.iter().position(|(g, _)| *g == gid);
        let port = i.map_or(1, |i| groups[i].1);
        self.pd.ctx.dev().detach_mcast(qpn, gid, port)?;
        if let Some(i) = i {
            groups.swap_remove(i);
        }
        Ok(())
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        let qpn = self.qpn;
        let dev = self.pd.ctx.dev();
        for (gid, port) in self.groups.lock().drain(..) {
            let _ = dev.detach_mcast(qpn, gid, port);
        }
        dev.destroy_qp(qpn);
    }
}
