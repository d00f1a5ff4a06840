//! What the simulations of this crate share.

/// A small deterministic generator (splitmix64): the simulations' only randomness, so that a
/// seed replays.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    /// The next 64 bits.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A draw in `0..n` (0 when `n` is 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// True with probability `p` (a draw is made whatever `p`).
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p && p > 0.0
    }

    /// One of `v`.
    #[expect(clippy::indexing_slicing, reason = "the index is below the length")]
    pub(crate) fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len() as u64) as usize]
    }
}

/// A raw UD queue pair with the rdmx Q_Key, in RTS (a stranger's, for the hostile tests):
/// `sq` sends and `rq` receives at most.
#[allow(dead_code, reason = "not every test file sends raw datagrams")]
pub(crate) fn raw_ud_qp(
    pd: &rdmx_verbs::ProtectionDomain,
    cq: &rdmx_verbs::CompletionQueue,
    sq: u32,
    rq: u32,
) -> rdmx_verbs::QueuePair {
    use rdmx_verbs::{QpAttr, QpAttrMask as M, QpInitAttr, QpState};
    let mut init = QpInitAttr::ud(cq, cq);
    init.cap.max_send_wr = sq;
    init.cap.max_recv_wr = rq;
    let qp = pd.create_qp(&init).unwrap();
    qp.modify(
        &QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qkey: rdmx_ud::QKEY,
            ..QpAttr::default()
        },
        M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY,
    )
    .unwrap();
    qp.modify(
        &QpAttr {
            qp_state: QpState::Rtr,
            ..QpAttr::default()
        },
        M::STATE,
    )
    .unwrap();
    qp.modify(
        &QpAttr {
            qp_state: QpState::Rts,
            sq_psn: 1,
            ..QpAttr::default()
        },
        M::STATE | M::SQ_PSN,
    )
    .unwrap();
    qp
}

/// A stranger on the network: a raw UD queue pair on a device of its own, aimed at one
/// transport's data queue pair.
#[allow(dead_code, reason = "not every test file sends raw datagrams")]
pub(crate) struct Stranger {
    qp: rdmx_verbs::QueuePair,
    mr: rdmx_verbs::MemoryRegion,
    ah: rdmx_verbs::AddressHandle,
    to_qpn: rdmx_verbs::Qpn,
    _cq: rdmx_verbs::CompletionQueue,
    _pd: rdmx_verbs::ProtectionDomain,
    _ctx: rdmx_verbs::Context,
}

#[allow(dead_code, reason = "not every test file sends raw datagrams")]
impl Stranger {
    /// Aimed at `t`.
    pub(crate) fn aimed_at(t: &rdmx_ud::UdTransport) -> Self {
        use rdmx_verbs::{AccessFlags, AhAttr, Device, Gid};
        let ctx = Device::open("soft:127.0.0.1").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(256, None).unwrap();
        let qp = raw_ud_qp(&pd, &cq, 128, 16);
        let mr = pd.reg_mr(1 << 16, AccessFlags::LOCAL_WRITE).unwrap();
        let to = t.addr();
        let ah = pd
            .create_ah(&AhAttr::new(Gid::from_ip(to.ip())).with_udp_port(to.port()))
            .unwrap();
        Self {
            qp,
            mr,
            ah,
            to_qpn: t.qp_num(),
            _cq: cq,
            _pd: pd,
            _ctx: ctx,
        }
    }

    /// Sends each of `datagrams`.
    pub(crate) fn send_all(&self, datagrams: &[Vec<u8>]) {
        use rdmx_verbs::SendWr;
        for (i, d) in datagrams.iter().enumerate() {
            self.mr.write(0, d).unwrap();
            let sge = [self.mr.sge(0, d.len())];
            self.qp
                .post_send(&SendWr::send(i as u64, &sge).to(&self.ah, self.to_qpn, rdmx_ud::QKEY))
                .unwrap();
        }
    }
}

/// A whole one-datagram message ("evil") for session `session` with token `token` at
/// sequence number `seq`.
#[allow(dead_code, reason = "not every test file sends raw datagrams")]
pub(crate) fn forged_data(session: u32, token: u32, seq: u32) -> Vec<u8> {
    use rdmx_ud::wire::{HEADER_LEN, Header, Kind, flags};
    let h = Header {
        kind: Kind::Data,
        flags: flags::FIRST | flags::LAST,
        dst_session: session,
        dst_token: token,
        seq: rdmx_ud::Seq(seq),
        ack: rdmx_ud::Seq(0),
        sack: 0,
        credit: rdmx_ud::Seq(0),
        len: 8,
    };
    let mut d = vec![0u8; HEADER_LEN + 8];
    h.write(&mut d);
    d[HEADER_LEN..].copy_from_slice(&[0, 0, 0, 4, b'e', b'v', b'i', b'l']);
    d
}
