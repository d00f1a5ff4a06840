//! The RDMA Aware Networks Programming User Manual's automatic path migration example, on
//! rdmx-verbs: two devices with two ports each (four loopback addresses on the soft
//! provider), an RC queue pair per device with its primary path on port 1 and an alternate
//! path on port 2 loaded (REARM); traffic arms it (ARMED); then a migration (MIGRATED):
//! messages go on over the second ports and the peer follows. Every step is checked; a
//! mismatch exits non-zero.
//!
//! `cargo run -p rdmx-verbs --example apm_example` (soft provider: two-port devices on
//! 127.0.0.1-4; with `RDMX_TEST_DEVICE` a device with two ports).
#![expect(
    clippy::disallowed_methods,
    reason = "an application program: its waits are bounded in time"
)]

use std::time::{Duration, Instant};

use rdmx_verbs::{
    AccessFlags, AhAttr, AsyncEvent, CompletionQueue, Context, Device, MemoryRegion, MigState, Mtu,
    QpAttr, QpAttrMask as M, QpInitAttr, QpState, QueuePair, RecvWr, SendWr, WcStatus,
    WorkCompletion,
};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// One device, its queue pair and a buffer.
struct Host {
    ctx: Context,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn host(name: &str) -> Res<Host> {
    let ctx = Device::open(name)?;
    let attr = ctx.query_device();
    if attr.phys_port_cnt < 2 || !attr.auto_path_mig {
        return Err(format!("{name}: path migration needs two ports and APM support").into());
    }
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(256, None)?;
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq))?;
    let mr = pd.reg_mr(1 << 16, AccessFlags::LOCAL_WRITE)?;
    Ok(Host { ctx, cq, qp, mr })
}

/// The way to `peer`'s port `port`.
fn path(peer: &Host, port: u8) -> Res<AhAttr> {
    let udp = peer.ctx.port_addr(port).map_or(4791, |a| a.port());
    let mut a = AhAttr::new(peer.ctx.query_gid(port, 0)?).with_udp_port(udp);
    a.port_num = port;
    Ok(a)
}

/// INIT, RTR, RTS on port 1, then the alternate path on port 2 loaded (REARM).
fn bring_up(me: &Host, peer: &Host, psn: u32, peer_psn: u32) -> Res<()> {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    me.qp
        .modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)?;
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: path(peer, 1)?,
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: peer.qp.qp_num().0,
        rq_psn: peer_psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 1,
        ..QpAttr::default()
    };
    me.qp.modify(
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
        timeout: 12,
        retry_cnt: 3,
        rnr_retry: 7,
        sq_psn: psn,
        max_rd_atomic: 1,
        ..QpAttr::default()
    };
    me.qp.modify(
        &rts,
        M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
    )?;
    let rearm = QpAttr {
        qp_state: QpState::Rts,
        path_mig_state: MigState::Rearm,
        alt_ah_attr: path(peer, 2)?,
        alt_port_num: 2,
        alt_timeout: 12,
        ..QpAttr::default()
    };
    me.qp
        .modify(&rearm, M::STATE | M::ALT_PATH | M::PATH_MIG_STATE)?;
    Ok(())
}

fn one(cq: &CompletionQueue) -> Res<WorkCompletion> {
    let end = Instant::now() + Duration::from_secs(5);
    let mut wc = [WorkCompletion::EMPTY; 1];
    while cq.poll(&mut wc) == 0 {
        if Instant::now() > end {
            return Err("no completion in 5 s".into());
        }
        std::thread::yield_now();
    }
    if wc[0].status != WcStatus::Success {
        return Err(format!("a failed completion: {:?}", wc[0]).into());
    }
    Ok(wc[0])
}

/// `n` numbered messages from `a` to `b`, each checked.
fn messages(a: &Host, b: &Host, first: u32, n: u32) -> Res<()> {
    for k in first..first + n {
        let off = (k % 64) as usize * 256;
        b.qp.post_recv(&RecvWr::new(u64::from(k), &[b.mr.sge(off, 256)]))?;
        a.mr.write(off, &k.to_be_bytes())?;
        a.qp.post_send(&SendWr::send(u64::from(k), &[a.mr.sge(off, 64)]).signaled())?;
        one(&a.cq)?;
        let w = one(&b.cq)?;
        if w.wr_id != u64::from(k) || b.mr.to_vec(off, 4)? != k.to_be_bytes() {
            return Err(format!("message {k} came as {w:?}").into());
        }
    }
    Ok(())
}

fn mig(h: &Host) -> Res<MigState> {
    Ok(h.qp.query()?.0.path_mig_state)
}

/// Waits (up to 2 s) for `PathMigrated` of `h`'s queue pair.
fn migrated_event(h: &Host) -> Res<()> {
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        if let Some(AsyncEvent::PathMigrated(q)) = h.ctx.get_async_event(Duration::from_millis(50))
            && q == h.qp.qp_num()
        {
            return Ok(());
        }
    }
    Err("no PathMigrated event".into())
}

pub(crate) fn run() -> Res<()> {
    let (na, nb) = match std::env::var("RDMX_TEST_DEVICE") {
        Ok(d) if !d.starts_with("soft:") => (d.clone(), d),
        _ => (
            "soft:127.0.0.1,127.0.0.2".to_string(),
            "soft:127.0.0.3,127.0.0.4".to_string(),
        ),
    };
    let (a, b) = (host(&na)?, host(&nb)?);
    bring_up(&a, &b, 10, 20)?;
    bring_up(&b, &a, 20, 10)?;
    // Traffic both ways arms the alternate path.
    messages(&a, &b, 0, 3)?;
    messages(&b, &a, 100, 1)?;
    if (mig(&a)?, mig(&b)?) != (MigState::Armed, MigState::Armed) {
        return Err(format!("not armed: {:?} {:?}", mig(&a)?, mig(&b)?).into());
    }
    println!("alternate paths armed");
    // Migrate A by hand; B follows when A's packets say so.
    let m = QpAttr {
        qp_state: QpState::Rts,
        path_mig_state: MigState::Migrated,
        ..QpAttr::default()
    };
    a.qp.modify(&m, M::STATE | M::PATH_MIG_STATE)?;
    migrated_event(&a)?;
    messages(&a, &b, 3, 5)?;
    migrated_event(&b)?;
    let ports = (a.qp.query()?.0.port_num, b.qp.query()?.0.port_num);
    if ports != (2, 2) {
        return Err(format!("after migrating the QPs use ports {ports:?}").into());
    }
    messages(&b, &a, 101, 2)?;
    println!("migrated to port 2 on both sides; messages go on");
    Ok(())
}

#[allow(dead_code, reason = "the tests call run, not main")]
fn main() {
    if let Err(e) = run() {
        eprintln!("apm_example: {e}");
        std::process::exit(1);
    }
}
