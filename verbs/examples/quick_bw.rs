//! A quick single-process check of RDMA WRITE bandwidth and SEND latency between two soft
//! devices on loopback (the full benchmark is `rdmx perf`).
//!
//! `cargo run --release -p rdmx-verbs --example quick_bw -- [size] [iters]`
#![expect(clippy::disallowed_methods, reason = "a benchmark reads the clock")]

use std::time::Instant;

use rdmx_verbs::{
    AccessFlags, AhAttr, Device, Mtu, QpAttr, QpAttrMask as M, QpCap, QpInitAttr, QpState, RecvWr,
    Rkey, SendWr, WorkCompletion, WrOpcode,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let size: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1 << 20);
    let iters: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(200);
    let mut sides = Vec::new();
    for _ in 0..2 {
        let ctx = Device::open("soft:127.0.0.1")?;
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(4096, None)?;
        let mut a = QpInitAttr::rc(&cq, &cq);
        a.cap = QpCap {
            max_send_wr: 1024,
            max_recv_wr: 1024,
            ..QpCap::default()
        };
        let qp = pd.create_qp(&a)?;
        let mr = pd.reg_mr(
            size.max(64),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )?;
        sides.push((ctx, pd, cq, qp, mr));
    }
    for i in 0..2 {
        let j = 1 - i;
        let (ctx, _, _, qp, _) = &sides[i];
        let (pctx, _, _, pqp, _) = &sides[j];
        let _ = ctx;
        let init = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            ..QpAttr::default()
        };
        qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)?;
        let av = AhAttr::new(pctx.query_gid(1, 0)?).with_udp_port(pctx.port_addr(1)?.port());
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            ah_attr: av,
            path_mtu: Mtu::Mtu4096,
            dest_qp_num: pqp.qp_num().0,
            rq_psn: 0,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 1,
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
            sq_psn: 0,
            max_rd_atomic: 1,
            ..QpAttr::default()
        };
        qp.modify(
            &rts,
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
        )?;
    }
    let (a_ctx, _, a_cq, a_qp, a_mr) = &sides[0];
    let (b_ctx, _, b_cq, b_qp, b_mr) = &sides[1];
    let mut wc = [WorkCompletion::EMPTY; 64];
    // Write bandwidth, 16 outstanding.
    let s = [a_mr.sge(0, size)];
    let op = WrOpcode::RdmaWrite {
        remote_addr: b_mr.addr(),
        rkey: Rkey(b_mr.rkey().0),
    };
    let t = Instant::now();
    let (mut posted, mut done) = (0, 0);
    while done < iters {
        while posted < iters && posted - done < 16 {
            a_qp.post_send(&SendWr::new(posted as u64, op, &s).signaled())?;
            posted += 1;
        }
        let n = a_cq.poll(&mut wc);
        for w in &wc[..n] {
            assert!(w.is_ok(), "{w:?}");
        }
        done += n;
    }
    let el = t.elapsed().as_secs_f64();
    println!(
        "write_bw size={size} iters={iters}: {:.1} MB/s",
        (size * iters) as f64 / el / 1e6
    );
    println!(
        "counters A {:?}\ncounters B {:?}",
        a_ctx.counters(),
        b_ctx.counters()
    );
    // Send ping-pong latency, 8 bytes, busy poll.
    let n = 20_000;
    let ra = [a_mr.sge(0, 64)];
    let rb = [b_mr.sge(0, 64)];
    let mut lats = Vec::with_capacity(n);
    for _ in 0..16 {
        a_qp.post_recv(&RecvWr::new(0, &ra))?;
        b_qp.post_recv(&RecvWr::new(0, &rb))?;
    }
    let data = [7u8; 8];
    for i in 0..n {
        let t = Instant::now();
        a_qp.post_send(&SendWr::send_inline(i as u64, &data))?;
        loop {
            let k = b_cq.poll(&mut wc);
            if wc[..k]
                .iter()
                .any(|w| w.opcode == rdmx_verbs::WcOpcode::Recv)
            {
                b_qp.post_recv(&RecvWr::new(0, &rb))?;
                break;
            }
        }
        b_qp.post_send(&SendWr::send_inline(i as u64, &data))?;
        loop {
            let k = a_cq.poll(&mut wc);
            if wc[..k]
                .iter()
                .any(|w| w.opcode == rdmx_verbs::WcOpcode::Recv)
            {
                a_qp.post_recv(&RecvWr::new(0, &ra))?;
                break;
            }
        }
        lats.push(t.elapsed().as_nanos() as f64 / 2000.0);
    }
    lats.sort_by(|a, b| a.total_cmp(b));
    println!(
        "send_lat 8B one-way (same process, busy poll): p50 {:.2} us p99 {:.2} us",
        lats[n / 2],
        lats[n * 99 / 100]
    );
    Ok(())
}
