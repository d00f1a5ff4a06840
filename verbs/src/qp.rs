//! Queue pairs.

use std::sync::Arc;

use crate::cq::{CompletionQueue, CqInner};
use crate::error::{PostError, VerbsError};
use crate::pd::{PdInner, ProtectionDomain};
use crate::provider::Provider;
use crate::srq::{SharedReceiveQueue, SrqInner};
use crate::types::{Gid, QpAttr, QpAttrMask, QpCap, QpState, QpType, Qpn, SendOps};
use crate::vocab::QpConfig;
use crate::wr::{RecvWr, SendWr};
use crate::xrc::XrcDomain;

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
    /// The operations the batch posting API ([`QueuePair::wr_start`]) will post
    /// (`send_ops_flags` of `ibv_qp_init_attr_ex`). A batch with another operation fails
    /// at [`WrBatch::complete`](crate::WrBatch::complete). Empty (the default): the QP is
    /// created plainly, and a batch takes any operation the QP type has; on libibverbs it
    /// is then posted with `ibv_post_send` rather than `ibv_wr_*`, so a device refusing a
    /// request mid-batch leaves the requests before it posted.
    pub send_ops: SendOps,
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
            send_ops: SendOps::EMPTY,
        }
    }

    /// XRC initiator (send-only) attributes: send completions go to `cq`.
    pub fn xrc_send(cq: &'a CompletionQueue) -> Self {
        Self {
            qp_type: QpType::XrcSend,
            ..Self::rc(cq, cq)
        }
    }

    /// UC attributes with default capacities: sends and RDMA writes over a connection with
    /// no acknowledgement or retransmission (a lost packet loses its message).
    pub fn uc(send_cq: &'a CompletionQueue, recv_cq: &'a CompletionQueue) -> Self {
        Self {
            qp_type: QpType::Uc,
            ..Self::rc(send_cq, recv_cq)
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
    _xrcd: Option<XrcDomain>,
    /// The provider the QP lives on when it is not the PD's device (a target of a shared
    /// XRC domain hosted by another soft device).
    via: Option<Arc<dyn Provider>>,
    /// Multicast groups this QP is attached to, with the port they were joined on.
    groups: parking_lot::Mutex<Vec<(Gid, u8)>>,
    /// The operations it was created for (batch posting).
    pub(crate) send_ops: SendOps,
    /// Held by an open batch (`wr_start` … `complete` / `abort`): one batch at a time.
    pub(crate) wr_lock: parking_lot::Mutex<()>,
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
            send_ops: a.send_ops,
        })?;
        Ok(Self {
            pd: pd.inner.clone(),
            qpn,
            qp_type: a.qp_type,
            _send_cq: Some(a.send_cq.inner.clone()),
            _recv_cq: Some(a.recv_cq.inner.clone()),
            _srq: a.srq.map(|s| s.inner.clone()),
            _xrcd: None,
            via: None,
            groups: parking_lot::Mutex::new(Vec::new()),
            send_ops: a.send_ops,
            wr_lock: parking_lot::Mutex::new(()),
        })
    }

    fn dev(&self) -> &Arc<dyn Provider> {
        self.via.as_ref().unwrap_or_else(|| self.pd.ctx.dev())
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
    /// The transition and the mask are checked against the QP's current state here, before
    /// the provider is called, so every provider reports them the same way.
    ///
    /// # Errors
    /// `IllegalTransition`, `MissingAttribute` or `UnexpectedAttribute` (naming the mask
    /// bit) exactly where verbs returns EINVAL, on every provider; `InvalidAttribute` for a
    /// `CUR_STATE` that is not the QP's state and for out-of-range values. What only the
    /// device can judge (on hardware: port, P_Key index, MTU or RDMA-read depth beyond the
    /// device's limits, or a state the device changed on its own since the check) is
    /// reported by the provider, on libibverbs as `Io` with the kernel's errno.
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<(), VerbsError> {
        modify_on(&**self.dev(), self.qpn, self.qp_type, attr, mask)
    }

    /// Current attributes and capacities (`ibv_query_qp`).
    ///
    /// # Errors
    /// `NoSuchObject` if the device lost the QP (never in normal operation).
    pub fn query(&self) -> Result<(QpAttr, QpCap), VerbsError> {
        let qpn = self.qpn;
        self.dev()
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
        self.dev()
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
        self.dev().post_send(qpn, wrs)
    }

    /// Posts a batch whole or not at all (see `wr_batch.rs`).
    pub(crate) fn post_send_all(&self, wrs: &[SendWr<'_>]) -> Result<(), (usize, PostError)> {
        self.dev().post_send_all(self.qpn, wrs, self.send_ops)
    }

    /// Posts a type 1 memory-window bind (see `mw.rs`); returns the window's new key.
    pub(crate) fn bind_mw_raw(
        &self,
        wr_id: u64,
        flags: crate::types::SendFlags,
        wr: &crate::wr::MwBindWr,
    ) -> Result<u32, PostError> {
        self.dev().bind_mw(self.qpn, wr_id, flags, wr)
    }

    /// Posts a receive work request (`ibv_post_recv`).
    ///
    /// # Errors
    /// See [`PostError`].
    pub fn post_recv(&self, wr: &RecvWr<'_>) -> Result<(), PostError> {
        let qpn = self.qpn;
        self.dev().post_recv(qpn, wr)
    }
}

/// `QueuePair::modify` on `dev`: the common state-machine check on the state the provider
/// reports, then the provider's own modify.
fn modify_on(
    dev: &dyn Provider,
    qpn: Qpn,
    qp_type: QpType,
    attr: &QpAttr,
    mask: QpAttrMask,
) -> Result<(), VerbsError> {
    if let Some(from) = dev.qp_state(qpn) {
        crate::qp_state::check_modify(qp_type, from, attr, mask)?;
    }
    dev.modify_qp(qpn, attr, mask)
}

impl QueuePair {
    /// Creates an XRC target (receive-only) QP in `xrcd`: it takes receive WQEs, the
    /// protection domain and the completion queue from whichever XRC SRQ of the domain a
    /// message names.
    pub(crate) fn new_xrc_target(
        pd: &ProtectionDomain,
        xrcd: &XrcDomain,
    ) -> Result<Self, VerbsError> {
        let ctx = &pd.inner.ctx;
        if !Arc::ptr_eq(&xrcd.ctx.inner, &ctx.inner) {
            return Err(VerbsError::InvalidArgument(
                "XRC domain of another device".into(),
            ));
        }
        let (pdid, d) = (pd.inner.id, xrcd.id);
        let via = xrcd.dev();
        let qpn = via
            .as_ref()
            .unwrap_or_else(|| ctx.dev())
            .create_qp(&QpConfig {
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
                send_ops: SendOps::EMPTY,
            })?;
        Ok(Self {
            pd: pd.inner.clone(),
            qpn,
            qp_type: QpType::XrcRecv,
            _send_cq: None,
            _recv_cq: None,
            _srq: None,
            _xrcd: Some(xrcd.clone()),
            via,
            groups: parking_lot::Mutex::new(Vec::new()),
            send_ops: SendOps::EMPTY,
            wr_lock: parking_lot::Mutex::new(()),
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
        self.dev().attach_mcast(qpn, gid, port)?;
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
        self.dev().detach_mcast(qpn, gid, port)?;
        if let Some(i) = i {
            groups.swap_remove(i);
        }
        Ok(())
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        let qpn = self.qpn;
        let dev = self.dev();
        for (gid, port) in self.groups.lock().drain(..) {
            let _ = dev.detach_mcast(qpn, gid, port);
        }
        dev.destroy_qp(qpn);
    }
}

impl ProtectionDomain {
    /// Creates a queue pair (`ibv_create_qp`).
    ///
    /// # Errors
    /// `Unsupported` for QP types this provider lacks, `InvalidAttribute` for capacities
    /// above the device limits, `InvalidArgument` for CQs of another device.
    pub fn create_qp(&self, attr: &QpInitAttr<'_>) -> Result<QueuePair, VerbsError> {
        QueuePair::new(self, attr)
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

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::os::fd::RawFd;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use parking_lot::Mutex;

    use super::*;
    use crate::mem::RegisteredMemory;
    use crate::os::ChannelInner;
    use crate::types::{AccessFlags, DeviceAttr, PortAttr, WorkCompletion};
    use crate::vocab::{AsyncEvent, SrqState};

    const QPN: Qpn = Qpn(0x11);

    /// A provider that applies every modify it gets without checking it, as libibverbs
    /// hands it to the kernel: whatever reaches it got through the common check.
    #[derive(Debug)]
    struct Unchecked {
        /// The QP's state as the provider reports it (`None`: cannot tell).
        state: Mutex<Option<QpState>>,
        modifies: AtomicUsize,
    }

    impl Unchecked {
        fn in_state(s: Option<QpState>) -> Self {
            Self {
                state: Mutex::new(s),
                modifies: AtomicUsize::new(0),
            }
        }

        fn modifies(&self) -> usize {
            self.modifies.load(Ordering::Relaxed)
        }
    }

    impl Provider for Unchecked {
        fn query_device(&self) -> DeviceAttr {
            unreachable!()
        }
        fn query_port(&self, _: u8) -> Result<PortAttr, VerbsError> {
            unreachable!()
        }
        fn query_gid(&self, _: u8, _: u32) -> Result<Gid, VerbsError> {
            unreachable!()
        }
        fn port_addr(&self, _: u8) -> Result<SocketAddr, VerbsError> {
            unreachable!()
        }
        fn pop_event(&self) -> Option<AsyncEvent> {
            None
        }
        fn event_fd(&self) -> RawFd {
            -1
        }
        fn shutdown(&self) {}
        fn alloc_pd(&self) -> Result<u32, VerbsError> {
            unreachable!()
        }
        fn reg_mr(
            &self,
            _: u32,
            _: &Arc<RegisteredMemory>,
            _: AccessFlags,
        ) -> Result<(u32, u32), VerbsError> {
            unreachable!()
        }
        fn dereg_mr(&self, _: u32, _: &Arc<RegisteredMemory>) {}
        fn dereg_mr_checked(&self, _: u32) -> Result<(), VerbsError> {
            unreachable!()
        }
        fn create_cq(&self, _: usize, _: &Arc<ChannelInner>) -> Result<u32, VerbsError> {
            unreachable!()
        }
        fn destroy_cq(&self, _: u32) {}
        fn poll_cq(&self, _: u32, _: &mut [WorkCompletion]) -> usize {
            0
        }
        fn req_notify_cq(&self, _: u32, _: bool) {}
        fn progress(&self) -> usize {
            0
        }
        fn release(&self) {}
        fn create_qp(&self, _: &QpConfig) -> Result<Qpn, VerbsError> {
            unreachable!()
        }
        fn destroy_qp(&self, _: Qpn) {}
        fn modify_qp(&self, qpn: Qpn, attr: &QpAttr, mask: QpAttrMask) -> Result<(), VerbsError> {
            assert_eq!(qpn, QPN);
            self.modifies.fetch_add(1, Ordering::Relaxed);
            if mask.contains(QpAttrMask::STATE) {
                *self.state.lock() = Some(attr.qp_state);
            }
            Ok(())
        }
        fn query_qp(&self, _: Qpn) -> Option<(QpAttr, QpCap)> {
            unreachable!("the common check asks for the state only")
        }
        fn qp_state(&self, qpn: Qpn) -> Option<QpState> {
            assert_eq!(qpn, QPN);
            *self.state.lock()
        }
        fn post_send(&self, _: Qpn, _: &[SendWr<'_>]) -> Result<(), (usize, PostError)> {
            unreachable!()
        }
        fn post_recv(&self, _: Qpn, _: &RecvWr<'_>) -> Result<(), PostError> {
            unreachable!()
        }
        fn attach_mcast(&self, _: Qpn, _: Gid, _: u8) -> Result<(), VerbsError> {
            unreachable!()
        }
        fn detach_mcast(&self, _: Qpn, _: Gid, _: u8) -> Result<(), VerbsError> {
            unreachable!()
        }
        fn create_srq(
            &self,
            _: u32,
            _: Option<(u32, u32)>,
            _: u32,
            _: u32,
        ) -> Result<u32, VerbsError> {
            unreachable!()
        }
        fn destroy_srq(&self, _: u32) -> Result<(), VerbsError> {
            unreachable!()
        }
        fn post_srq_recv(&self, _: u32, _: &RecvWr<'_>) -> Result<(), PostError> {
            unreachable!()
        }
        fn modify_srq(&self, _: u32, _: Option<u32>, _: Option<u32>) -> Result<(), VerbsError> {
            unreachable!()
        }
        fn query_srq(&self, _: u32) -> Option<SrqState> {
            unreachable!()
        }
        fn alloc_xrcd(&self) -> Result<u32, VerbsError> {
            unreachable!()
        }
    }

    fn to(s: QpState) -> QpAttr {
        QpAttr {
            qp_state: s,
            ..QpAttr::default()
        }
    }

    /// The mask verbs requires for RC RESET -> INIT.
    fn rc_init() -> QpAttrMask {
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS
    }

    #[test]
    fn illegal_transition_is_named_and_never_reaches_the_provider() {
        let dev = Unchecked::in_state(Some(QpState::Reset));
        let e = modify_on(&dev, QPN, QpType::Rc, &to(QpState::Rts), QpAttrMask::STATE);
        assert!(
            matches!(
                e,
                Err(VerbsError::IllegalTransition {
                    qp_type: QpType::Rc,
                    from: QpState::Reset,
                    to: QpState::Rts,
                })
            ),
            "{e:?}"
        );
        assert_eq!(dev.modifies(), 0);
    }

    #[test]
    fn missing_and_extra_mask_bits_are_named_before_the_provider() {
        let dev = Unchecked::in_state(Some(QpState::Reset));
        let e = modify_on(
            &dev,
            QPN,
            QpType::Rc,
            &to(QpState::Init),
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT,
        );
        assert!(
            matches!(
                e,
                Err(VerbsError::MissingAttribute {
                    attr: "ACCESS_FLAGS",
                    ..
                })
            ),
            "{e:?}"
        );
        let e = modify_on(
            &dev,
            QPN,
            QpType::Ud,
            &to(QpState::Init),
            rc_init() | QpAttrMask::QKEY,
        );
        assert!(
            matches!(
                e,
                Err(VerbsError::UnexpectedAttribute {
                    attr: "ACCESS_FLAGS",
                    ..
                })
            ),
            "{e:?}"
        );
        assert_eq!(dev.modifies(), 0);
    }

    #[test]
    fn the_check_uses_the_state_the_provider_reports() {
        // RTS -> RTS may change MIN_RNR_TIMER; once the device has moved the QP to ERR on
        // its own, the same call is ERR -> ERR, which allows no attributes.
        let dev = Unchecked::in_state(Some(QpState::Rts));
        modify_on(
            &dev,
            QPN,
            QpType::Rc,
            &QpAttr::default(),
            QpAttrMask::MIN_RNR_TIMER,
        )
        .unwrap();
        assert_eq!(dev.modifies(), 1);
        *dev.state.lock() = Some(QpState::Err);
        let e = modify_on(
            &dev,
            QPN,
            QpType::Rc,
            &QpAttr::default(),
            QpAttrMask::MIN_RNR_TIMER,
        );
        assert!(
            matches!(
                e,
                Err(VerbsError::UnexpectedAttribute {
                    from: QpState::Err,
                    attr: "MIN_RNR_TIMER",
                    ..
                })
            ),
            "{e:?}"
        );
        assert_eq!(dev.modifies(), 1);
    }

    #[test]
    fn a_legal_transition_reaches_the_provider() {
        let dev = Unchecked::in_state(Some(QpState::Reset));
        modify_on(&dev, QPN, QpType::Rc, &to(QpState::Init), rc_init()).unwrap();
        assert_eq!(dev.modifies(), 1);
        assert_eq!(*dev.state.lock(), Some(QpState::Init));
    }

    #[test]
    fn cur_state_must_name_the_current_state() {
        let dev = Unchecked::in_state(Some(QpState::Rts));
        let a = QpAttr {
            cur_qp_state: QpState::Sqe,
            ..to(QpState::Rts)
        };
        let e = modify_on(
            &dev,
            QPN,
            QpType::Ud,
            &a,
            QpAttrMask::STATE | QpAttrMask::CUR_STATE,
        );
        assert!(
            matches!(
                e,
                Err(VerbsError::InvalidAttribute {
                    attr: "CUR_STATE",
                    ..
                })
            ),
            "{e:?}"
        );
        assert_eq!(dev.modifies(), 0);
    }

    #[test]
    fn an_unknown_state_leaves_the_check_to_the_provider() {
        let dev = Unchecked::in_state(None);
        modify_on(&dev, QPN, QpType::Rc, &to(QpState::Rts), QpAttrMask::STATE).unwrap();
        assert_eq!(dev.modifies(), 1);
    }
}
