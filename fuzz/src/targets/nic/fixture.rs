//! The NICs of the `nic_*` targets: the victim, and the peer the seeds are recorded from,
//! built the same way (each seeded, so their queue pair numbers, keys and PSNs are the same
//! in every run), connected to each other, with receives posted and work of every kind
//! posted on every queue pair.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use rdmx_verbs::soft::engine::fuzz_api::{self, Region};
use rdmx_verbs::soft::engine::{Nic, NicConfig, QpConfig};
use rdmx_verbs::soft::wire::{IcrcPath, PacketHeaders, ROCE_UDP_PORT, icrc};
use rdmx_verbs::types::{
    AccessFlags, AhAttr, Gid, Mtu, QpAttr, QpAttrMask as M, QpCap, QpState, QpType, Qpn, Rkey,
    SendFlags, WorkCompletion,
};
use rdmx_verbs::wr::{RecvWr, SendWr, UdDest, WrOpcode};

/// The victim's address.
pub(crate) const VICTIM: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), ROCE_UDP_PORT);
/// The peer's address.
pub(crate) const PEER: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), ROCE_UDP_PORT);
/// An address nobody is connected to.
pub(crate) const STRANGER: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3)), ROCE_UDP_PORT);
/// The multicast group both UD queue pairs are attached to.
pub(crate) const GROUP: Ipv4Addr = Ipv4Addr::new(239, 1, 2, 3);

/// Length of each NIC's memory region.
pub(crate) const MEM_LEN: usize = 64 * 1024;
/// The address the recorded packets use for the victim's region (translated to the real
/// one before delivery).
pub(crate) const CANON: u64 = 0x0000_5EED_0000_0000;
/// The time the fixture is built at (ns).
pub(crate) const START: u64 = 1_000_000;

const VICTIM_SEED: u64 = 0xF022_0001;
const PEER_SEED: u64 = 0xF022_0002;
const QKEY: u32 = 0x1111_0000;

/// Region layout: receive buffers, then the target of the peer's RDMA, then where reads and
/// atomics land.
const RC_RECV: usize = 0;
const UC_RECV: usize = 16 * 1024;
const UD_RECV: usize = 20 * 1024;
const SRQ_RECV: usize = 24 * 1024;
const RDMA: usize = 32 * 1024;
const LANDING: usize = 48 * 1024;
const SLOT: u32 = 1024;

/// What one NIC tells the other to reach it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ids {
    rc: Qpn,
    uc: Qpn,
    ud: Qpn,
    srq_qp: Qpn,
    key: u32,
    addr: u64,
    ip: IpAddr,
    /// First PSN of its RC and SRQ queue pairs (UC: plus 0x100).
    psn: u32,
}

/// One NIC and its objects.
pub(crate) struct Node {
    pub(crate) nic: Nic,
    pub(crate) cq: u32,
    pub(crate) region: Region,
    srq: u32,
    ids: Ids,
}

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 256,
        max_recv_wr: 256,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    }
}

impl Node {
    /// A NIC with its objects, not connected yet.
    fn build(addr: SocketAddr, seed: u64, psn: u32, verify_icrc: bool) -> Self {
        let mut nic = Nic::new(NicConfig::single_port(addr, seed));
        nic.set_verify_icrc(verify_icrc);
        let pd = nic.alloc_pd();
        let cq = nic.create_cq(4096);
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let region = fuzz_api::reg_zeroed(&mut nic, pd, MEM_LEN, access).expect("memory");
        let qp = |nic: &mut Nic, qp_type, srq| {
            nic.create_qp(&QpConfig {
                qp_type,
                cap: cap(),
                srq,
                ..QpConfig::rc(pd, cq)
            })
            .expect("a queue pair")
        };
        let rc = qp(&mut nic, QpType::Rc, None);
        let uc = qp(&mut nic, QpType::Uc, None);
        let ud = qp(&mut nic, QpType::Ud, None);
        let srq = nic.create_srq(pd, 64, 2).expect("an SRQ");
        let srq_qp = qp(&mut nic, QpType::Rc, Some(srq));
        let ids = Ids {
            rc,
            uc,
            ud,
            srq_qp,
            key: region.key(),
            addr: region.addr(),
            ip: addr.ip(),
            psn,
        };
        Self {
            nic,
            cq,
            region,
            srq,
            ids,
        }
    }

    /// The victim, connected to a peer with `peer`'s numbers, receives and work posted.
    pub(crate) fn victim(verify_icrc: bool, peer: &Ids) -> Self {
        let mut n = Self::build(VICTIM, VICTIM_SEED, 0x00FF_FFF0, verify_icrc);
        n.connect(peer);
        n.post_receives();
        n.post_work(peer);
        n
    }

    /// The peer the seeds are recorded from.
    fn peer(verify_icrc: bool) -> Self {
        Self::build(PEER, PEER_SEED, 0x100, verify_icrc)
    }

    fn modify(&mut self, qpn: Qpn, attr: &QpAttr, mask: M) {
        self.nic
            .modify_qp(START, qpn, attr, mask)
            .expect("a valid transition");
    }

    /// Connects the RC, UC and SRQ queue pairs to the peer's, and readies the UD one.
    fn connect(&mut self, peer: &Ids) {
        let me = self.ids;
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let init = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: access,
            ..QpAttr::default()
        };
        for (mine, theirs, uc) in [
            (me.rc, peer.rc, false),
            (me.srq_qp, peer.srq_qp, false),
            (me.uc, peer.uc, true),
        ] {
            let offset = if uc { 0x100 } else { 0 };
            self.modify(
                mine,
                &init,
                M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
            );
            let rtr = QpAttr {
                qp_state: QpState::Rtr,
                ah_attr: AhAttr::new(Gid::from_ip(peer.ip)),
                path_mtu: Mtu::Mtu256,
                dest_qp_num: theirs.0,
                rq_psn: (peer.psn + offset) & 0x00FF_FFFF,
                max_dest_rd_atomic: 4,
                min_rnr_timer: 1,
                ..QpAttr::default()
            };
            let rts = QpAttr {
                qp_state: QpState::Rts,
                timeout: 8,
                retry_cnt: 7,
                rnr_retry: 7,
                sq_psn: (me.psn + offset) & 0x00FF_FFFF,
                max_rd_atomic: 4,
                ..QpAttr::default()
            };
            if uc {
                self.modify(
                    mine,
                    &rtr,
                    M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
                );
                self.modify(mine, &rts, M::STATE | M::SQ_PSN);
            } else {
                self.modify(
                    mine,
                    &rtr,
                    M::STATE
                        | M::AV
                        | M::PATH_MTU
                        | M::DEST_QPN
                        | M::RQ_PSN
                        | M::MAX_DEST_RD_ATOMIC
                        | M::MIN_RNR_TIMER,
                );
                self.modify(
                    mine,
                    &rts,
                    M::STATE
                        | M::TIMEOUT
                        | M::RETRY_CNT
                        | M::RNR_RETRY
                        | M::SQ_PSN
                        | M::MAX_QP_RD_ATOMIC,
                );
            }
        }
        let ud_init = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qkey: QKEY,
            ..QpAttr::default()
        };
        self.modify(
            me.ud,
            &ud_init,
            M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY,
        );
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            ..QpAttr::default()
        };
        self.modify(me.ud, &rtr, M::STATE);
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: 0x42,
            ..QpAttr::default()
        };
        self.modify(me.ud, &rts, M::STATE | M::SQ_PSN);
        self.nic
            .attach_mcast(me.ud, Gid::from_ip(IpAddr::V4(GROUP)))
            .expect("attach");
    }

    fn sge(&self, off: usize, len: u32) -> rdmx_verbs::wr::Sge {
        self.region.sge(off, len).expect("inside the region")
    }

    fn post_receives(&mut self) {
        let ids = self.ids;
        let mut wr_id = 1000;
        for (qp, base, n) in [
            (ids.rc, RC_RECV, 16),
            (ids.uc, UC_RECV, 4),
            (ids.ud, UD_RECV, 4),
        ] {
            for i in 0..n {
                let s = [self.sge(base + i * SLOT as usize, SLOT)];
                self.nic
                    .post_recv(qp, &RecvWr::new(wr_id, &s))
                    .expect("a receive");
                wr_id += 1;
            }
        }
        for i in 0..8 {
            let s = [self.sge(SRQ_RECV + i * SLOT as usize, SLOT)];
            self.nic
                .post_srq_recv(self.srq, &RecvWr::new(wr_id, &s))
                .expect("an SRQ receive");
            wr_id += 1;
        }
    }

    fn post(&mut self, qp: Qpn, wr: &SendWr<'_>) {
        self.nic.post_send(START, qp, wr).expect("a send");
    }

    /// Work of every kind towards the peer: sends (with immediate, multi-packet), writes,
    /// reads, atomics on RC; send and write with immediate on UC; UD sends to the peer and
    /// to the group; a send to the peer's SRQ queue pair.
    fn post_work(&mut self, peer: &Ids) {
        let me = self.ids;
        let rkey = Rkey(peer.key);
        let at = |off: usize| peer.addr + off as u64;
        let f = SendFlags::SIGNALED;
        let s600 = [self.sge(RDMA, 600)];
        let s10 = [self.sge(RDMA + 1024, 10)];
        let s300 = [self.sge(RDMA + 2048, 300)];
        let read = [self.sge(LANDING, 700)];
        let word = [self.sge(LANDING + 1024, 8)];
        let word2 = [self.sge(LANDING + 1032, 8)];
        let ops = [
            (me.rc, WrOpcode::Send, &s600[..]),
            (me.rc, WrOpcode::SendWithImm { imm: 0xABCD }, &s10[..]),
            (
                me.rc,
                WrOpcode::RdmaWrite {
                    remote_addr: at(RDMA),
                    rkey,
                },
                &s300[..],
            ),
            (
                me.rc,
                WrOpcode::RdmaWriteWithImm {
                    remote_addr: at(RDMA + 4096),
                    rkey,
                    imm: 7,
                },
                &s10[..],
            ),
            (
                me.rc,
                WrOpcode::RdmaRead {
                    remote_addr: at(RDMA),
                    rkey,
                },
                &read[..],
            ),
            (
                me.rc,
                WrOpcode::AtomicFetchAdd {
                    remote_addr: at(RDMA + 8192),
                    rkey,
                    add: 5,
                },
                &word[..],
            ),
            (
                me.rc,
                WrOpcode::AtomicCmpSwap {
                    remote_addr: at(RDMA + 8192),
                    rkey,
                    compare: 5,
                    swap: 9,
                },
                &word2[..],
            ),
            (me.uc, WrOpcode::Send, &s300[..]),
            (
                me.uc,
                WrOpcode::RdmaWriteWithImm {
                    remote_addr: at(RDMA + 12288),
                    rkey,
                    imm: 3,
                },
                &s10[..],
            ),
            (me.srq_qp, WrOpcode::Send, &s300[..]),
        ];
        for (i, (qp, op, sges)) in ops.into_iter().enumerate() {
            self.post(qp, &SendWr::new(i as u64, op, sges).flags(f));
        }
        let s100 = [self.sge(RDMA, 100)];
        for (i, (dgid, qpn)) in [
            (Gid::from_ip(peer.ip), peer.ud),
            (Gid::from_ip(IpAddr::V4(GROUP)), Qpn::MULTICAST),
        ]
        .into_iter()
        .enumerate()
        {
            let mut wr = SendWr::new(100 + i as u64, WrOpcode::Send, &s100).flags(f);
            wr.ud = Some(UdDest {
                ah: AhAttr::new(dgid),
                remote_qpn: qpn,
                remote_qkey: QKEY,
            });
            self.post(me.ud, &wr);
        }
    }
}

/// The peer's numbers (as the victim connects to them).
pub(crate) fn peer_ids() -> Ids {
    Node::peer(false).ids
}

/// Records the datagrams the peer sends the victim while the two run their work to
/// completion over a perfect link: (control byte 0, packet with canonical addresses).
fn record() -> Records {
    let mut peer = Node::peer(true);
    let mut victim = Node::victim(true, &peer.ids);
    peer.connect(&victim.ids);
    peer.post_receives();
    let victim_ids = victim.ids;
    peer.post_work(&victim_ids);
    let mut out = Vec::new();
    let mut buf = vec![0u8; 8192];
    let mut wcs = vec![WorkCompletion::EMPTY; 64];
    let mut now = START;
    for _ in 0..10_000 {
        let mut moved = false;
        while let Some(t) = victim.nic.poll_transmit(now, &mut buf) {
            moved = true;
            let dst = t.dst.ip();
            if dst == PEER.ip() || dst == IpAddr::V4(GROUP) {
                peer.nic.handle_datagram(now, 0, VICTIM, dst, &buf[..t.len]);
            }
        }
        while let Some(t) = peer.nic.poll_transmit(now, &mut buf) {
            moved = true;
            let dst = t.dst.ip();
            if dst == VICTIM.ip() || dst == IpAddr::V4(GROUP) {
                let mut pkt = buf[..t.len].to_vec();
                canonicalize(&mut pkt, victim.region.addr(), dst);
                out.push((u8::from(dst != VICTIM.ip()) * 4, pkt));
                victim.nic.handle_datagram(now, 0, PEER, dst, &buf[..t.len]);
            }
        }
        for n in [&mut victim, &mut peer] {
            while n.nic.poll_cq(n.cq, &mut wcs) > 0 {}
            while n.nic.poll_event().is_some() {}
        }
        if moved {
            now += 5_000;
            continue;
        }
        let next = [victim.nic.poll_timeout(), peer.nic.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        match next {
            Some(t) => {
                now = now.max(t);
                victim.nic.handle_timeout(now);
                peer.nic.handle_timeout(now);
            }
            None => break,
        }
        if now > START + 10_000_000_000 {
            break;
        }
    }
    out
}

/// Rewrites the victim's addresses in a packet from the peer relative to [`CANON`], with
/// the ICRC recomputed.
fn canonicalize(pkt: &mut [u8], base: u64, dst: IpAddr) {
    let Ok((mut h, _)) = PacketHeaders::parse(pkt) else {
        return;
    };
    let mine = base..base + MEM_LEN as u64;
    if let Some(r) = h.reth.as_mut()
        && mine.contains(&r.va)
    {
        r.va = r.va - base + CANON;
    }
    if let Some(a) = h.atomic_eth.as_mut()
        && mine.contains(&a.va)
    {
        a.va = a.va - base + CANON;
    }
    let _ = h.emit(pkt);
    let path = IcrcPath::new(PEER, SocketAddr::new(dst, ROCE_UDP_PORT));
    let body = pkt.len() - icrc::ICRC_LEN;
    let crc = icrc::compute(&path, &pkt[..body]);
    pkt[body..].copy_from_slice(&crc.to_le_bytes());
}

/// Records: (control byte, datagram).
pub(crate) type Records = Vec<(u8, Vec<u8>)>;

/// The recorded exchange, whole and in pieces, for the record targets.
pub(crate) fn scenarios() -> Vec<(String, Records)> {
    let all = record();
    let mut out = vec![("exchange".to_owned(), all.clone())];
    // By the opcode's transport and kind: each a shorter way into one state machine.
    let by = |keep: &dyn Fn(&PacketHeaders) -> bool| -> Records {
        all.iter()
            .filter(|(_, p)| PacketHeaders::parse(p).is_ok_and(|(h, _)| keep(&h)))
            .cloned()
            .collect()
    };
    out.push(("requests".to_owned(), by(&|h| !h.bth.opcode.is_response())));
    out.push(("responses".to_owned(), by(&|h| h.bth.opcode.is_response())));
    out.push(("datagrams".to_owned(), by(&|h| h.deth.is_some())));
    // Every packet twice (duplicates), and the exchange backwards (out of order).
    out.push((
        "duplicated".to_owned(),
        all.iter().flat_map(|r| [r.clone(), r.clone()]).collect(),
    ));
    out.push(("reversed".to_owned(), all.iter().rev().cloned().collect()));
    // Slowly: retransmission and RNR timers fire between packets.
    out.push((
        "slow".to_owned(),
        all.iter().map(|(c, p)| (c | 0x20, p.clone())).collect(),
    ));
    out
}

/// Every distinct packet of the recorded exchange (ICRC valid for the peer to the victim).
pub(crate) fn recorded_packets() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = record().into_iter().map(|(_, p)| p).collect();
    v.sort();
    v.dedup();
    v
}
