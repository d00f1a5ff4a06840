//! Path migration through the public API over real sockets: two-port soft devices on
//! loopback addresses, the alternate path armed by traffic, a manual migration, the peer
//! following, and the events (multi-host link failure is in the rdmx-tests crate).

use crate::common;

use std::time::Duration;

use rdmx_verbs::{
    AccessFlags, AhAttr, AsyncEvent, CompletionQueue, Context, Device, MemoryRegion, MigState, Mtu,
    QpAttr, QpAttrMask as M, QpInitAttr, QpState, QueuePair, RecvWr, SendWr, WcStatus,
    WorkCompletion,
};

struct Side {
    ctx: Context,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn side(name: &str) -> Side {
    let ctx = Device::open(name).unwrap();
    assert_eq!(ctx.query_device().phys_port_cnt, 2);
    assert!(ctx.query_device().auto_path_mig);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024, None).unwrap();
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let mr = pd.reg_mr(1 << 16, AccessFlags::LOCAL_WRITE).unwrap();
    Side { ctx, cq, qp, mr }
}

fn av(peer: &Side, port: u8) -> AhAttr {
    let mut a = AhAttr::new(peer.ctx.query_gid(port, 0).unwrap())
        .with_udp_port(common::udp_port(&peer.ctx, port));
    a.port_num = port;
    a
}

fn connect(me: &Side, peer: &Side, my_psn: u32, peer_psn: u32) {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    me.qp
        .modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
        .unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: av(peer, 1),
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: peer.qp.qp_num().0,
        rq_psn: peer_psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 1,
        ..QpAttr::default()
    };
    me.qp
        .modify(
            &rtr,
            M::STATE
                | M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER,
        )
        .unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout: 12,
        retry_cnt: 3,
        rnr_retry: 7,
        sq_psn: my_psn,
        max_rd_atomic: 1,
        ..QpAttr::default()
    };
    me.qp
        .modify(
            &rts,
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
        )
        .unwrap();
    // REARM without an alternate path is refused; with one it is accepted.
    let mut rearm = QpAttr {
        qp_state: QpState::Rts,
        path_mig_state: MigState::Rearm,
        ..QpAttr::default()
    };
    assert!(me.qp.modify(&rearm, M::STATE | M::PATH_MIG_STATE).is_err());
    rearm.alt_ah_attr = av(peer, 2);
    rearm.alt_port_num = 2;
    rearm.alt_timeout = 12;
    me.qp
        .modify(&rearm, M::STATE | M::ALT_PATH | M::PATH_MIG_STATE)
        .unwrap();
}

fn mig(s: &Side) -> MigState {
    s.qp.query().unwrap().0.path_mig_state
}

fn wait(cq: &CompletionQueue, n: usize) -> Vec<WorkCompletion> {
    common::wait_cq(cq, n)
}

/// Sends `n` numbered messages a -> b and checks they arrive in order.
fn exchange(a: &Side, b: &Side, first: u32, n: u32) {
    for k in first..first + n {
        let off = (k % 64) as usize * 256;
        let r = [b.mr.sge(off, 256)];
        b.qp.post_recv(&RecvWr::new(k as u64, &r)).unwrap();
        a.mr.write(off, &k.to_be_bytes()).unwrap();
        let s = [a.mr.sge(off, 64)];
        a.qp.post_send(&SendWr::send(k as u64, &s).signaled())
            .unwrap();
        assert_eq!(wait(&a.cq, 1)[0].status, WcStatus::Success);
        let wc = wait(&b.cq, 1)[0];
        assert_eq!((wc.status, wc.wr_id), (WcStatus::Success, k as u64));
        assert_eq!(b.mr.to_vec(off, 4).unwrap(), k.to_be_bytes());
    }
}

fn events(ctx: &Context) -> Vec<AsyncEvent> {
    std::iter::from_fn(|| ctx.get_async_event(Duration::from_millis(20))).collect()
}

#[test]
fn armed_by_traffic_then_manual_migration_and_the_peer_follows() {
    // Two ports per device: on the soft provider, two loopback addresses each; on hardware,
    // the test device itself when it has two ports and advertises APM.
    let (na, nb) = if common::on_soft() {
        (
            "soft:127.0.0.1,127.0.0.2".to_string(),
            "soft:127.0.0.3,127.0.0.4".to_string(),
        )
    } else {
        let attr = common::open_test_device().query_device();
        if attr.phys_port_cnt < 2 || !attr.auto_path_mig {
            return common::skip(
                "armed_by_traffic_then_manual_migration_and_the_peer_follows",
                "APM needs a device with two ports that advertises automatic path migration",
            );
        }
        (common::test_device(), common::test_device())
    };
    let a = side(&na);
    let b = side(&nb);
    connect(&a, &b, 10, 20);
    connect(&b, &a, 20, 10);
    assert_eq!(mig(&a), MigState::Rearm);
    exchange(&a, &b, 0, 3);
    exchange(&b, &a, 100, 1);
    assert_eq!((mig(&a), mig(&b)), (MigState::Armed, MigState::Armed));
    // ARMED cannot be set by software; a manual migration is MIGRATED from ARMED.
    let armed = QpAttr {
        qp_state: QpState::Rts,
        path_mig_state: MigState::Armed,
        ..QpAttr::default()
    };
    assert!(a.qp.modify(&armed, M::STATE | M::PATH_MIG_STATE).is_err());
    let m = QpAttr {
        qp_state: QpState::Rts,
        path_mig_state: MigState::Migrated,
        ..QpAttr::default()
    };
    a.qp.modify(&m, M::STATE | M::PATH_MIG_STATE).unwrap();
    let (attr, _) = a.qp.query().unwrap();
    assert_eq!(
        (attr.path_mig_state, attr.port_num),
        (MigState::Migrated, 2)
    );
    assert!(events(&a.ctx).contains(&AsyncEvent::PathMigrated(a.qp.qp_num())));
    // Traffic now uses the second ports; the peer migrates when it sees MigReq set.
    let before = b.ctx.counters().rx_packets;
    exchange(&a, &b, 3, 5);
    assert!(b.ctx.counters().rx_packets > before);
    assert!(events(&b.ctx).contains(&AsyncEvent::PathMigrated(b.qp.qp_num())));
    assert_eq!(b.qp.query().unwrap().0.port_num, 2);
    exchange(&b, &a, 101, 2);
}
