//! An XRC example on rdmx-verbs (the manual's XRC chapter): a receiving device opens an XRC
//! domain with several XRC SRQs (each with its own completion queue) and one XRC target
//! queue pair; a sending device reaches every one of those SRQs through a single XRC
//! initiator queue pair, naming the SRQ in each send. Every message is checked where it
//! lands; a mismatch exits non-zero.
//!
//! `cargo run -p rdmx-verbs --example xrc_example [-- SRQS]` (`RDMX_TEST_DEVICE` names the
//! device, default `soft:127.0.0.1`).
#![expect(
    clippy::disallowed_methods,
    reason = "an application program: its waits are bounded in time"
)]

use std::time::{Duration, Instant};

use rdmx_verbs::{
    AccessFlags, AhAttr, CompletionQueue, Context, Device, Mtu, QpAttr, QpAttrMask as M,
    QpInitAttr, QpState, QueuePair, RecvWr, SendWr, SrqInitAttr, WcStatus, WorkCompletion,
};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn device() -> Res<Context> {
    let dev = std::env::var("RDMX_TEST_DEVICE").unwrap_or_else(|_| "soft:127.0.0.1".into());
    Ok(Device::open(&dev)?)
}

fn towards(peer: &Context) -> Res<AhAttr> {
    let port = peer.port_addr(1).map_or(4791, |a| a.port());
    Ok(AhAttr::new(peer.query_gid(1, 0)?).with_udp_port(port))
}

/// INIT, RTR, RTS; `target`: the receiving end (responder attributes), else the initiator.
fn bring_up(
    qp: &QueuePair,
    target: bool,
    peer: AhAttr,
    dqpn: u32,
    psn: u32,
    peer_psn: u32,
) -> Res<()> {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)?;
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: peer,
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: dqpn,
        rq_psn: peer_psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 1,
        ..QpAttr::default()
    };
    let rtr_mask = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    if target {
        qp.modify(&rtr, rtr_mask | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER)?;
        let rts = QpAttr {
            qp_state: QpState::Rts,
            timeout: 14,
            sq_psn: psn,
            ..QpAttr::default()
        };
        qp.modify(&rts, M::STATE | M::TIMEOUT | M::SQ_PSN)?;
    } else {
        qp.modify(&rtr, rtr_mask)?;
        let rts = QpAttr {
            qp_state: QpState::Rts,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: psn,
            max_rd_atomic: 1,
            ..QpAttr::default()
        };
        qp.modify(
            &rts,
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
        )?;
    }
    Ok(())
}

fn wait(cq: &CompletionQueue, n: usize) -> Res<Vec<WorkCompletion>> {
    let end = Instant::now() + Duration::from_secs(5);
    let mut out = Vec::new();
    let mut wc = [WorkCompletion::EMPTY; 16];
    while out.len() < n {
        let k = cq.poll(&mut wc);
        out.extend_from_slice(&wc[..k]);
        if Instant::now() > end {
            return Err(format!("{} of {n} completions after 5 s", out.len()).into());
        }
        if k == 0 {
            std::thread::yield_now();
        }
    }
    Ok(out)
}

/// `srqs` XRC SRQs behind one target QP, reached by one initiator; 3 messages each.
pub(crate) fn run(srqs: usize) -> Res<()> {
    const ROUNDS: usize = 3;
    const BUF: usize = 256;
    // The receiving side.
    let rctx = device()?;
    let rpd = rctx.alloc_pd()?;
    let xrcd = rctx.open_xrcd()?;
    let rmr = rpd.reg_mr(srqs * ROUNDS * BUF, AccessFlags::LOCAL_WRITE)?;
    let mut cqs = Vec::new();
    let mut srq_list = Vec::new();
    for k in 0..srqs {
        let cq = rctx.create_cq(ROUNDS * 2, None)?;
        let srq = rpd.create_xrc_srq(&xrcd, &cq, &SrqInitAttr::default())?;
        for r in 0..ROUNDS {
            let i = k * ROUNDS + r;
            srq.post_recv(&RecvWr::new(i as u64, &[rmr.sge(i * BUF, BUF)]))?;
        }
        cqs.push(cq);
        srq_list.push(srq);
    }
    let tgt = rpd.create_xrc_target_qp(&xrcd)?;
    // The sending side: one initiator.
    let sctx = device()?;
    let spd = sctx.alloc_pd()?;
    let scq = sctx.create_cq(srqs * ROUNDS, None)?;
    let smr = spd.reg_mr(srqs * ROUNDS * 16, AccessFlags::LOCAL_WRITE)?;
    let ini = spd.create_qp(&QpInitAttr::xrc_send(&scq))?;
    bring_up(&tgt, true, towards(&sctx)?, ini.qp_num().0, 300, 700)?;
    bring_up(&ini, false, towards(&rctx)?, tgt.qp_num().0, 700, 300)?;
    for r in 0..ROUNDS {
        for (k, srq) in srq_list.iter().enumerate() {
            let off = (r * srqs + k) * 16;
            smr.write(off, &[k as u8, r as u8, 0x5A])?;
            let sge = [smr.sge(off, 3)];
            let wr = SendWr::send(off as u64, &sge)
                .signaled()
                .to_srq(srq.srq_num());
            ini.post_send(&wr)?;
        }
    }
    for w in wait(&scq, srqs * ROUNDS)? {
        if w.status != WcStatus::Success {
            return Err(format!("a send failed: {w:?}").into());
        }
    }
    for (k, cq) in cqs.iter().enumerate() {
        for (r, w) in wait(cq, ROUNDS)?.into_iter().enumerate() {
            let i = w.wr_id as usize;
            let got = rmr.to_vec(i * BUF, 3)?;
            if w.status != WcStatus::Success
                || w.qp_num != tgt.qp_num()
                || i / ROUNDS != k
                || got != [k as u8, r as u8, 0x5A]
            {
                return Err(format!("SRQ {k}, message {r}: {w:?} holding {got:?}").into());
            }
        }
    }
    println!(
        "{} messages through one initiator to {srqs} XRC SRQs behind one target",
        srqs * ROUNDS
    );
    Ok(())
}

#[allow(dead_code, reason = "the tests call run, not main")]
fn main() {
    let srqs = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(4usize)
        .clamp(1, 200);
    if let Err(e) = run(srqs) {
        eprintln!("xrc_example: {e}");
        std::process::exit(1);
    }
}
