//! Hand-driven raw verbs peers (the hostile tests' and the XRC exchange tests'): queue-pair
//! bring-up of an XRC target and initiator, and waiting for a completion.

use std::time::{Duration, Instant};

use rdmx_verbs::{
    AccessFlags, AhAttr, CompletionQueue, Mtu, QpAttr, QpAttrMask as M, QpState, QueuePair,
    WorkCompletion,
};

/// INIT with remote read and write, on port 1.
pub fn to_init(qp: &QueuePair) {
    qp.modify(
        &QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            ..QpAttr::default()
        },
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )
    .unwrap();
}

/// An XRC target queue pair through INIT, RTR and RTS, receiving from the initiator
/// `ini_qpn` (first PSN `ini_psn`) at `av`.
pub fn xrc_target_up(tgt: &QueuePair, av: AhAttr, ini_qpn: u32, ini_psn: u32) {
    to_init(tgt);
    tgt.modify(
        &QpAttr {
            qp_state: QpState::Rtr,
            ah_attr: av,
            path_mtu: Mtu::Mtu4096,
            dest_qp_num: ini_qpn,
            rq_psn: ini_psn,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 12,
            ..QpAttr::default()
        },
        M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER,
    )
    .unwrap();
    tgt.modify(
        &QpAttr {
            qp_state: QpState::Rts,
            timeout: 14,
            ..QpAttr::default()
        },
        M::STATE | M::TIMEOUT | M::SQ_PSN,
    )
    .unwrap();
}

/// An XRC initiator through INIT, RTR and RTS, sending to the target `tgt_qpn` at `av`
/// from PSN `psn`.
pub fn xrc_initiator_up(ini: &QueuePair, av: AhAttr, tgt_qpn: u32, psn: u32) {
    to_init(ini);
    ini.modify(
        &QpAttr {
            qp_state: QpState::Rtr,
            ah_attr: av,
            path_mtu: Mtu::Mtu4096,
            dest_qp_num: tgt_qpn,
            ..QpAttr::default()
        },
        M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
    )
    .unwrap();
    ini.modify(
        &QpAttr {
            qp_state: QpState::Rts,
            timeout: 10,
            retry_cnt: 3,
            rnr_retry: 7,
            sq_psn: psn,
            max_rd_atomic: 4,
            ..QpAttr::default()
        },
        M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
}

/// The next completion of `cq`, within 5 s (else the test fails, saying `what`).
pub fn wait_one(cq: &CompletionQueue, what: &str) -> WorkCompletion {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut wc = [WorkCompletion::EMPTY; 1];
    loop {
        if cq.poll(&mut wc) > 0 {
            return wc[0];
        }
        assert!(Instant::now() < deadline, "{what}: no completion");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A hand-driven XRC peer's resources: a domain with an SRQ, an initiator and a target (not
/// connected yet), and a mailbox peers may write.
pub struct RawXrcPeer {
    pub cq: CompletionQueue,
    pub ini: QueuePair,
    pub tgt: QueuePair,
    pub srq: rdmx_verbs::SharedReceiveQueue,
    pub mailbox: rdmx_verbs::MemoryRegion,
    pub path: rdmx_core::bootstrap::PathInfo,
    pub ctx: rdmx_verbs::Context,
}

impl RawXrcPeer {
    /// On a soft device of its own on loopback.
    pub fn new() -> Self {
        use rdmx_verbs::{Device, Gid, QpInitAttr, SrqInitAttr};
        let ctx = Device::open("soft:127.0.0.1").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(256, None).unwrap();
        let xrcd = ctx.open_xrcd().unwrap();
        let srq = pd
            .create_xrc_srq(&xrcd, &cq, &SrqInitAttr::default())
            .unwrap();
        let mailbox = pd
            .reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
        let ini = pd.create_qp(&QpInitAttr::xrc_send(&cq)).unwrap();
        let tgt = pd.create_xrc_target_qp(&xrcd).unwrap();
        let here = ctx.port_addr(1).unwrap();
        let path = rdmx_core::bootstrap::PathInfo {
            gid: Gid::from_ip(here.ip()).0,
            udp_port: here.port(),
            port_num: 1,
        };
        Self {
            cq,
            ini,
            tgt,
            srq,
            mailbox,
            path,
            ctx,
        }
    }

    /// What this peer says of itself in the exchange, as node `node_id`, announcing queue
    /// pair `qpn` (0 in a connector's first `Hello`) from PSN `psn`.
    pub fn info(&self, node_id: u64, qpn: u32, psn: u32) -> rdmx_core::bootstrap::EndpointInfo {
        rdmx_core::bootstrap::EndpointInfo {
            transport: rdmx_core::bootstrap::Transport::Xrc,
            qpn,
            psn,
            mtu: 4096,
            primary: self.path.clone(),
            alternate: None,
            srq_nums: vec![self.srq.srq_num()],
            credits: 8,
            mailbox_addr: self.mailbox.addr(),
            mailbox_rkey: self.mailbox.rkey().0,
            max_message: 1 << 20,
            eager_limit: 32 << 10,
            context_id: node_id,
            node_id,
            tag: 0,
            xrc_target: None,
            xrc_target_path: None,
            xrc_target_alt: None,
            xrc_in_use: None,
            token: 0,
            app_data: Vec::new(),
        }
    }
}
