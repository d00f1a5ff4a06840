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
