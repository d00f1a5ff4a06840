//! Helpers shared by the integration tests: open a device, create an RC QP and connect two
//! of them.
#![allow(dead_code, unreachable_pub, missing_docs)]
#![expect(
    clippy::disallowed_methods,
    reason = "tests bound their waits with the clock"
)]

use std::time::Duration;

use rdmx_verbs::{
    AccessFlags, AhAttr, CompletionQueue, Context, Device, MemoryRegion, Mtu, ProtectionDomain,
    QpAttr, QpAttrMask as M, QpCap, QpInitAttr, QpState, QpType, QueuePair, SharedReceiveQueue,
    WorkCompletion,
};

/// What a peer needs to connect to a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerInfo {
    pub qpn: u32,
    pub psn: u32,
    pub gid: [u8; 16],
    pub udp_port: u16,
    pub addr: u64,
    pub rkey: u32,
}

impl PeerInfo {
    pub fn to_bytes(self) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&self.qpn.to_be_bytes());
        v.extend_from_slice(&self.psn.to_be_bytes());
        v.extend_from_slice(&self.gid);
        v.extend_from_slice(&self.udp_port.to_be_bytes());
        v.extend_from_slice(&self.addr.to_be_bytes());
        v.extend_from_slice(&self.rkey.to_be_bytes());
        v
    }

    pub fn from_bytes(b: &[u8]) -> Self {
        let u32_at = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().unwrap());
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[8..24]);
        Self {
            qpn: u32_at(0),
            psn: u32_at(4),
            gid,
            udp_port: u16::from_be_bytes(b[24..26].try_into().unwrap()),
            addr: u64::from_be_bytes(b[26..34].try_into().unwrap()),
            rkey: u32_at(34),
        }
    }

    pub const LEN: usize = 38;
}

/// The device the conformance suite runs on: `RDMX_TEST_DEVICE`, or a soft device on
/// loopback.
pub fn test_device() -> String {
    std::env::var("RDMX_TEST_DEVICE").unwrap_or_else(|_| "soft:127.0.0.1".to_string())
}

/// True when the suite runs on a soft device.
pub fn on_soft() -> bool {
    test_device().starts_with("soft:")
}

/// Opens the test device (a new, separate NIC each time for a soft device).
pub fn open_test_device() -> Context {
    let name = test_device();
    Device::open(&name).unwrap_or_else(|e| panic!("opening test device {name}: {e}"))
}

/// The UDP port a peer sends to: the soft device's own, or 4791 (RoCEv2) on hardware.
pub fn udp_port(ctx: &Context, port: u8) -> u16 {
    ctx.port_addr(port).map_or(4791, |a| a.port())
}

/// The IP address of a port, from its GID.
pub fn port_ip(ctx: &Context, port: u8) -> std::net::IpAddr {
    ctx.query_gid(port, 0).expect("port GID").to_ip()
}

/// Brings a UD QP to RTS with Q_Key `qkey` (RESET->INIT needs QKEY; RTR needs nothing).
pub fn bring_up_ud(qp: &QueuePair, qkey: u32, sq_psn: u32) {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qkey,
        ..QpAttr::default()
    };
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)
        .unwrap();
    qp.modify(
        &QpAttr {
            qp_state: QpState::Rtr,
            ..QpAttr::default()
        },
        M::STATE,
    )
    .unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn,
        ..QpAttr::default()
    };
    qp.modify(&rts, M::STATE | M::SQ_PSN).unwrap();
}

/// Reports a test skipped for a missing capability, saying why.
pub fn skip(test: &str, reason: &str) {
    eprintln!("SKIPPED {test} on {}: {reason}", test_device());
}

/// Checks that `srq` holds `want` receive WQEs. The soft provider must report the number;
/// libibverbs cannot (`SrqAttr::posted` is `None` there), so on hardware there is nothing
/// to check.
pub fn check_srq_posted(srq: &SharedReceiveQueue, want: u32) {
    match srq.query().expect("query the SRQ").posted {
        Some(n) => assert_eq!(n, want, "receive WQEs left in the SRQ"),
        None => assert!(!on_soft(), "the soft provider reports its posted WQEs"),
    }
}

pub struct Side {
    pub ctx: Context,
    pub pd: ProtectionDomain,
    pub cq: CompletionQueue,
    pub qp: QueuePair,
    pub mr: MemoryRegion,
    pub psn: u32,
}

impl Side {
    pub fn new(mem: usize, psn: u32) -> Self {
        let ctx = open_test_device();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(1024, None).unwrap();
        let mut attr = QpInitAttr::rc(&cq, &cq);
        attr.cap = QpCap {
            max_send_wr: 512,
            max_recv_wr: 512,
            ..QpCap::default()
        };
        let qp = pd.create_qp(&attr).unwrap();
        let mr = pd
            .reg_mr(
                mem,
                AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_ATOMIC,
            )
            .unwrap();
        assert_eq!(qp.qp_type(), QpType::Rc);
        Self {
            ctx,
            pd,
            cq,
            qp,
            mr,
            psn,
        }
    }

    pub fn info(&self) -> PeerInfo {
        PeerInfo {
            qpn: self.qp.qp_num().0,
            psn: self.psn,
            gid: self.ctx.query_gid(1, 0).unwrap().0,
            udp_port: udp_port(&self.ctx, 1),
            addr: self.mr.addr(),
            rkey: self.mr.rkey().0,
        }
    }

    pub fn connect(&self, peer: &PeerInfo) {
        connect_qp(&self.qp, self.psn, peer, Mtu::Mtu1024, 14);
    }

    pub fn connect_with_timeout(&self, peer: &PeerInfo, timeout: u8) {
        connect_qp(&self.qp, self.psn, peer, Mtu::Mtu1024, timeout);
    }

    pub fn wait(&self, n: usize) -> Vec<WorkCompletion> {
        wait_cq(&self.cq, n)
    }
}

pub fn connect_qp(qp: &QueuePair, my_psn: u32, peer: &PeerInfo, mtu: Mtu, timeout: u8) {
    connect_full(qp, my_psn, peer, mtu, timeout, 7);
}

pub fn connect_qp_with(qp: &QueuePair, my_psn: u32, peer: &PeerInfo, timeout: u8, retry: u8) {
    connect_full(qp, my_psn, peer, Mtu::Mtu1024, timeout, retry);
}

fn connect_full(qp: &QueuePair, my_psn: u32, peer: &PeerInfo, mtu: Mtu, timeout: u8, retry: u8) {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        ..QpAttr::default()
    };
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
        .unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: AhAttr::new(rdmx_verbs::Gid(peer.gid)).with_udp_port(peer.udp_port),
        path_mtu: mtu,
        dest_qp_num: peer.qpn,
        rq_psn: peer.psn,
        max_dest_rd_atomic: 16,
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
    )
    .unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout,
        retry_cnt: retry,
        rnr_retry: 7,
        sq_psn: my_psn,
        max_rd_atomic: 16,
        ..QpAttr::default()
    };
    qp.modify(
        &rts,
        M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
}

/// Waits (blocking, bounded) for `n` completions.
pub fn wait_cq(cq: &CompletionQueue, n: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut buf = [WorkCompletion::EMPTY; 32];
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while out.len() < n {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        assert!(
            !left.is_zero(),
            "timed out waiting for {n} completions (got {})",
            out.len()
        );
        let k = cq
            .poll_blocking(&mut buf[..(n - out.len()).min(32)], left)
            .unwrap();
        out.extend_from_slice(&buf[..k]);
    }
    out
}

/// Runs `body` against a peer process: this test binary re-run with `--exact <child_test>
/// --ignored` and `env_var` set to the address of a TCP listener, which `body` gets the
/// accepted connection of. The peer is killed if `body` panics; its output is shown when
/// either side fails.
pub fn with_peer_process(
    child_test: &str,
    env_var: &str,
    body: impl FnOnce(std::net::TcpStream) + std::panic::UnwindSafe,
) {
    use std::process::{Command, Stdio};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", child_test, "--ignored", "--nocapture"])
        .env(env_var, addr.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let result = std::panic::catch_unwind(move || {
        let (tcp, _) = listener.accept().unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        body(tcp);
    });
    if result.is_err() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if let Err(e) = result {
        eprintln!("peer output:\n{log}");
        std::panic::resume_unwind(e);
    }
    assert!(
        out.status.success(),
        "peer process failed: {}\n{log}",
        out.status
    );
}
