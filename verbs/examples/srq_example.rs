//! The RDMA Aware Networks Programming User Manual's shared receive queue example, on
//! rdmx-verbs: a receiver with one SRQ shared by several RC queue pairs, receive buffers
//! posted to the SRQ (not to the queue pairs), senders on another device; every message
//! lands in an SRQ buffer and its completion names the queue pair it came on. The SRQ's
//! limit event fires when the posted buffers fall below the armed limit. Every step is
//! checked; a mismatch exits non-zero.
//!
//! `cargo run -p rdmx-verbs --example srq_example [-- QPS [MESSAGES]]` (`RDMX_TEST_DEVICE`
//! names the device, default `soft:127.0.0.1`).
#![expect(
    clippy::disallowed_methods,
    reason = "an application program: its waits are bounded in time"
)]

use std::time::{Duration, Instant};

use rdmx_verbs::{
    AccessFlags, AhAttr, AsyncEvent, CompletionQueue, Context, Device, Mtu, QpAttr,
    QpAttrMask as M, QpInitAttr, QpState, QueuePair, RecvWr, SendWr, SrqInitAttr, WcStatus,
    WorkCompletion,
};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const BUF: usize = 256;

fn device() -> Res<Context> {
    let dev = std::env::var("RDMX_TEST_DEVICE").unwrap_or_else(|_| "soft:127.0.0.1".into());
    Ok(Device::open(&dev)?)
}

/// INIT, RTR towards (`peer`, `dqpn`), RTS.
fn connect(qp: &QueuePair, peer: &Context, dqpn: u32, psn: u32, peer_psn: u32) -> Res<()> {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: AccessFlags::LOCAL_WRITE,
        ..QpAttr::default()
    };
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)?;
    let port = peer.port_addr(1).map_or(4791, |a| a.port());
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: AhAttr::new(peer.query_gid(1, 0)?).with_udp_port(port),
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: dqpn,
        rq_psn: peer_psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ..QpAttr::default()
    };
    qp.modify(
        &rtr,
        M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER,
    )?;
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
    Ok(())
}

/// `n` completions from `cq`, within 5 s.
fn wait(cq: &CompletionQueue, n: usize) -> Res<Vec<WorkCompletion>> {
    let end = Instant::now() + Duration::from_secs(5);
    let mut out = Vec::with_capacity(n);
    let mut wc = [WorkCompletion::EMPTY; 32];
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

/// `qps` queue pairs on one SRQ, `msgs` messages on each.
pub(crate) fn run(qps: usize, msgs: usize) -> Res<()> {
    let total = qps * msgs;
    let posted = total + 8;
    // The receiver: one SRQ, `posted` buffers on it, its limit armed at 8 + 1.
    let rctx = device()?;
    let rpd = rctx.alloc_pd()?;
    let rcq = rctx.create_cq(posted, None)?;
    let srq = rpd.create_srq(&SrqInitAttr {
        max_wr: posted as u32,
        max_sge: 1,
        srq_limit: 0,
    })?;
    let rmr = rpd.reg_mr(posted * BUF, AccessFlags::LOCAL_WRITE)?;
    for i in 0..posted {
        srq.post_recv(&RecvWr::new(i as u64, &[rmr.sge(i * BUF, BUF)]))?;
    }
    srq.arm_limit(9)?;
    // The senders, on another device.
    let sctx = device()?;
    let spd = sctx.alloc_pd()?;
    let scq = sctx.create_cq(total, None)?;
    let smr = spd.reg_mr(total * 16, AccessFlags::LOCAL_WRITE)?;
    let mut pairs = Vec::new();
    for k in 0..qps {
        let mut ra = QpInitAttr::rc(&rcq, &rcq);
        ra.srq = Some(&srq);
        let rqp = rpd.create_qp(&ra)?;
        let sqp = spd.create_qp(&QpInitAttr::rc(&scq, &scq))?;
        let (rpsn, spsn) = (100 + k as u32, 5000 + k as u32);
        connect(&rqp, &sctx, sqp.qp_num().0, rpsn, spsn)?;
        connect(&sqp, &rctx, rqp.qp_num().0, spsn, rpsn)?;
        pairs.push((rqp, sqp));
    }
    for m in 0..msgs {
        for (k, (_, sqp)) in pairs.iter().enumerate() {
            let off = (m * qps + k) * 16;
            smr.write(off, &[k as u8, m as u8, 0xAB])?;
            sqp.post_send(&SendWr::send(off as u64, &[smr.sge(off, 3)]).signaled())?;
        }
    }
    for w in wait(&scq, total)? {
        if w.status != WcStatus::Success {
            return Err(format!("a send failed: {w:?}").into());
        }
    }
    let mut seen = vec![vec![false; msgs]; qps];
    for w in wait(&rcq, total)? {
        if w.status != WcStatus::Success || w.byte_len != 3 {
            return Err(format!("a bad receive: {w:?}").into());
        }
        let b = rmr.to_vec(w.wr_id as usize * BUF, 3)?;
        let (k, m) = (b[0] as usize, b[1] as usize);
        let on = pairs.iter().position(|(r, _)| r.qp_num() == w.qp_num);
        if on != Some(k) || m >= msgs || b[2] != 0xAB || std::mem::replace(&mut seen[k][m], true) {
            return Err(format!("message {b:?} on QP {:?} (index {on:?})", w.qp_num).into());
        }
    }
    // 8 buffers are left, below the limit of 9: the event came, and the limit is disarmed.
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        match rctx.get_async_event(Duration::from_millis(50)) {
            Some(AsyncEvent::SrqLimitReached(h)) if h == srq.handle() => break,
            _ if Instant::now() > end => return Err("no SRQ limit event".into()),
            _ => {}
        }
    }
    if srq.query()?.srq_limit != 0 {
        return Err("the limit stayed armed after its event".into());
    }
    println!("{total} messages on {qps} QPs through one SRQ; the limit event came");
    Ok(())
}

#[allow(dead_code, reason = "the tests call run, not main")]
fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let qps = args.first().copied().unwrap_or(8).clamp(1, 255);
    let msgs = args.get(1).copied().unwrap_or(4).clamp(1, 255);
    if let Err(e) = run(qps, msgs) {
        eprintln!("srq_example: {e}");
        std::process::exit(1);
    }
}
