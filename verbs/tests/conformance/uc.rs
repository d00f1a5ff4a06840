//! UC queue pairs through the public API: sends, RDMA writes (with and without immediate)
//! completing without acknowledgement, what UC refuses at post time, and (soft provider,
//! fault injection) messages lost whole while later ones arrive intact.

use crate::common::{self, PeerInfo, on_soft, wait_cq};

use std::time::Duration;

use rdmx_verbs::{
    AccessFlags, AhAttr, CompletionQueue, Context, Device, DeviceOptions, FaultConfig, Gid,
    MemoryRegion, Mtu, PostError, ProtectionDomain, QpAttr, QpAttrMask as M, QpCap, QpInitAttr,
    QpState, QpType, QueuePair, RecvWr, Rkey, SendWr, WcOpcode, WcStatus, WorkCompletion, WrOpcode,
};

struct UcSide {
    ctx: Context,
    _pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
    psn: u32,
}

impl UcSide {
    fn new(ctx: Context, psn: u32) -> Self {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(1024, None).unwrap();
        let mut attr = QpInitAttr::uc(&cq, &cq);
        attr.cap = QpCap {
            max_send_wr: 512,
            max_recv_wr: 512,
            ..QpCap::default()
        };
        let qp = pd.create_qp(&attr).unwrap();
        assert_eq!(qp.qp_type(), QpType::Uc);
        let mr = pd
            .reg_mr(
                1 << 20,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .unwrap();
        Self {
            ctx,
            _pd: pd,
            cq,
            qp,
            mr,
            psn,
        }
    }

    fn info(&self) -> PeerInfo {
        PeerInfo {
            qpn: self.qp.qp_num().0,
            psn: self.psn,
            gid: self.ctx.query_gid(1, 0).unwrap().0,
            udp_port: common::udp_port(&self.ctx, 1),
            addr: self.mr.addr(),
            rkey: self.mr.rkey().0,
        }
    }

    /// RESET → INIT → RTR → RTS with UC's attributes (no timeout, retry, RNR or RD/atomic
    /// attributes: UC has none).
    fn connect(&self, peer: &PeerInfo) {
        let init = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            ..QpAttr::default()
        };
        self.qp
            .modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
            .unwrap();
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            ah_attr: AhAttr::new(Gid(peer.gid)).with_udp_port(peer.udp_port),
            path_mtu: Mtu::Mtu1024,
            dest_qp_num: peer.qpn,
            rq_psn: peer.psn,
            ..QpAttr::default()
        };
        self.qp
            .modify(
                &rtr,
                M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
            )
            .unwrap();
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: self.psn,
            ..QpAttr::default()
        };
        self.qp.modify(&rts, M::STATE | M::SQ_PSN).unwrap();
    }

    fn wait(&self, n: usize) -> Vec<WorkCompletion> {
        wait_cq(&self.cq, n)
    }
}

fn pair(a: Context, b: Context) -> (UcSide, UcSide) {
    let a = UcSide::new(a, 10);
    let b = UcSide::new(b, 0x00FF_FFFE);
    a.connect(&b.info());
    b.connect(&a.info());
    (a, b)
}

#[test]
fn uc_sends_and_writes() {
    let (a, b) = pair(common::open_test_device(), common::open_test_device());
    let acks_before = b.ctx.counters().acks_sent;
    // A 50 KiB send (multi-packet, across the PSN wrap).
    let len = 50 * 1024;
    let data: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
    a.mr.write(0, &data).unwrap();
    let r = [b.mr.sge(0, 64 * 1024)];
    b.qp.post_recv(&RecvWr::new(1, &r)).unwrap();
    let s = [a.mr.sge(0, len)];
    a.qp.post_send(&SendWr::send(10, &s).signaled()).unwrap();
    assert_eq!(a.wait(1)[0].status, WcStatus::Success);
    let wc = b.wait(1);
    assert_eq!(
        (wc[0].status, wc[0].byte_len as usize),
        (WcStatus::Success, len)
    );
    assert_eq!(b.mr.to_vec(0, len).unwrap(), data);
    // RDMA write, then write with immediate (which consumes a receive).
    a.mr.write(100_000, b"unreliable but connected").unwrap();
    let s = [a.mr.sge(100_000, 24)];
    let peer = b.info();
    let w = WrOpcode::RdmaWrite {
        remote_addr: peer.addr + 200_000,
        rkey: Rkey(peer.rkey),
    };
    a.qp.post_send(&SendWr::new(11, w, &s)).unwrap();
    let r = [b.mr.sge(300_000, 0)];
    b.qp.post_recv(&RecvWr::new(2, &r)).unwrap();
    let w = WrOpcode::RdmaWriteWithImm {
        remote_addr: peer.addr + 210_000,
        rkey: Rkey(peer.rkey),
        imm: 77,
    };
    a.qp.post_send(&SendWr::new(12, w, &s).signaled()).unwrap();
    assert_eq!(a.wait(1)[0].wr_id, 12);
    let wc = b.wait(1);
    assert_eq!(
        (wc[0].opcode, wc[0].imm_data, wc[0].wr_id, wc[0].byte_len),
        (WcOpcode::RecvRdmaWithImm, 77, 2, 24)
    );
    assert_eq!(
        b.mr.to_vec(200_000, 24).unwrap(),
        b"unreliable but connected"
    );
    assert_eq!(
        b.mr.to_vec(210_000, 24).unwrap(),
        b"unreliable but connected"
    );
    // No RDMA read or atomics on UC.
    let d = [a.mr.sge(0, 8)];
    let rd = WrOpcode::RdmaRead {
        remote_addr: peer.addr,
        rkey: Rkey(peer.rkey),
    };
    let e = a.qp.post_send(&SendWr::new(13, rd, &d)).unwrap_err();
    assert!(matches!(e, PostError::InvalidWorkRequest(_)), "{e:?}");
    if on_soft() {
        assert_eq!(b.ctx.counters().acks_sent, acks_before, "UC sends no ACKs");
    }
}

#[test]
fn uc_loses_whole_messages_under_loss() {
    if !on_soft() {
        common::skip(
            "uc_loses_whole_messages_under_loss",
            "needs the soft provider's fault injection",
        );
        return;
    }
    // Faults apply to what a device receives: B loses a tenth of its frames.
    let lossy =
        DeviceOptions::default().with_faults(FaultConfig::parse("seed=5,drop=0.1").unwrap());
    let (a, b) = pair(
        common::open_test_device(),
        Device::open_with("soft:127.0.0.1", lossy).unwrap(),
    );
    let (n, len) = (300usize, 3000usize); // three packets per message at MTU 1024
    for k in 0..n {
        let r = [b.mr.sge(k * 3072, 3072)];
        b.qp.post_recv(&RecvWr::new(k as u64, &r)).unwrap();
    }
    for k in 0..n {
        let mut m = vec![(k % 251) as u8; len];
        m[..4].copy_from_slice(&(k as u32).to_be_bytes());
        a.mr.write(k * 3072, &m).unwrap();
        let s = [a.mr.sge(k * 3072, len)];
        a.qp.post_send(&SendWr::send(k as u64, &s).signaled())
            .unwrap();
        if k % 64 == 63 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let sent = a.wait(n);
    assert!(sent.iter().all(|w| w.status == WcStatus::Success));
    // Wait until the receiver has had everything that survived.
    let mut got = Vec::new();
    let mut buf = [WorkCompletion::EMPTY; 64];
    loop {
        let k =
            b.cq.poll_blocking(&mut buf, Duration::from_millis(300))
                .unwrap();
        if k == 0 {
            break;
        }
        got.extend_from_slice(&buf[..k]);
    }
    assert!(
        got.len() > n / 3 && got.len() < n,
        "{} of {n} arrived",
        got.len()
    );
    let mut last = None;
    for (slot, w) in got.iter().enumerate() {
        assert_eq!((w.status, w.wr_id), (WcStatus::Success, slot as u64));
        assert_eq!(w.byte_len as usize, len);
        let m = b.mr.to_vec(slot * 3072, len).unwrap();
        let id = u32::from_be_bytes(m[..4].try_into().unwrap()) as usize;
        assert!(
            m[4..].iter().all(|&x| x == (id % 251) as u8),
            "message {id} damaged"
        );
        assert!(
            last.is_none_or(|l| id > l),
            "message {id} out of order or twice"
        );
        last = Some(id);
    }
    assert_eq!(b.qp.state(), QpState::Rts);
}
