//! `nic_states`: the soft NIC's receive path into the queue pairs `nic_qps` does not have:
//! an XRC target QP with an XRC SRQ, a tag-matching SRQ (eager and rendezvous tags, ordinary
//! receives) under an RC QP, memory windows (type 1 over part of a region, type 2 bound to
//! an RC QP) and an RC QP with an alternate path loaded (APM).
//!
//! The seeds are recorded, as for `nic_qps`, from a real exchange with a peer built the same
//! way every time (seeded NICs: the same queue pair numbers, SRQ numbers, window keys and
//! PSNs in every run): XRC sends, writes and reads to the XRC SRQ; tagged eager messages, a
//! rendezvous request (TMH + RVH) with the read responses it draws, an untagged and an
//! unexpected message; writes, reads and an atomic through each window key, a send with
//! invalidate of the type 2 window and a write through its key after that; APM: the peer
//! loads its alternate path, then migrates (its packets carry MigReq = 1 from then on) and
//! the victim follows it. Memory addresses are recorded relative to fixed bases
//! ([`CANON_A`], [`CANON_W`]) and translated at delivery.
//!
//! Invariants checked after every record, besides no panic and the allocation bounds:
//! * every completion is for work the fixture posted, and none completes more often than
//!   it can (once; twice for a tag, which reports its match and then its rendezvous data);
//! * the window region ([`W_LEN`] bytes, registered with `MW_BIND` and no remote access of
//!   its own) changes only inside a window that was bound, with remote write or atomic
//!   access, before the record's datagram came: outside the windows, and in a window after
//!   it was invalidated, its sentinel pattern stays as it was;
//! * no RDMA read response the NIC sends carries the sentinel marker (bytes of the window
//!   region outside the windows; once the type 2 window is invalidated, its bytes are
//!   overwritten with the marker too, so a read through its old key would carry it).

use std::net::{IpAddr, SocketAddr};

use rdmx_verbs::soft::engine::fuzz_api::{self, Region};
use rdmx_verbs::soft::engine::{Nic, NicConfig, QpConfig};
use rdmx_verbs::soft::wire::{IcrcPath, PacketHeaders, ROCE_UDP_PORT, icrc};
use rdmx_verbs::tm::{OpsWr, Rvh, TMH_LEN, TmCaps, Tmh, TmhOp};
use rdmx_verbs::types::{
    AccessFlags, AhAttr, Gid, MigState, Mtu, MwType, QpAttr, QpAttrMask as M, QpCap, QpState,
    QpType, Qpn, Rkey, SendFlags, WorkCompletion,
};
use rdmx_verbs::wr::{RecvWr, SendWr, WrOpcode};

use super::fixture::{GROUP, PEER, START, VICTIM};
use super::{BUF_LEN, STEPS, ctrl, fix_icrc, source};
use crate::records;
use crate::targets::{Runner, Target};

/// The target: records of datagrams into the NIC with XRC, tag-matching, window and APM
/// state.
pub(crate) const STATES: Target = Target {
    name: "nic_states",
    about: "soft NIC with XRC target, tag-matching SRQ, memory windows, APM: records, ICRC off",
    max_alloc: 256 * 1024,
    max_total: 32 << 20,
    max_len: 32 * 1024,
    framed: true,
    seeds,
    runner,
};

const VICTIM_SEED: u64 = 0xF022_0011;
const PEER_SEED: u64 = 0xF022_0012;
/// First PSN of the victim's queue pairs, and of the peer's.
const VICTIM_PSN: u32 = 0x00FF_FF80;
const PEER_PSN: u32 = 0x0000_0200;

/// Length of each NIC's ordinary region.
const A_LEN: usize = 64 * 1024;
/// Length of the victim's window region.
const W_LEN: usize = 8 * 1024;
/// Where the recorded packets put the victim's ordinary region.
const CANON_A: u64 = 0x0000_5EED_0001_0000;
/// Where the recorded packets put the victim's window region.
const CANON_W: u64 = 0x0000_5EED_0002_0000;
/// Where the recorded rendezvous headers put the peer's region.
const CANON_P: u64 = 0x0000_5EED_0003_0000;

/// The victim's ordinary region: XRC SRQ receives, TM SRQ receives, tagged buffers, the
/// window QP's and the APM QP's receives, what the victim sends, where the peer writes.
const XSRQ_RECV: usize = 0;
const TM_RECV: usize = 8 * 1024;
const TAGS: usize = 16 * 1024;
const MW_RECV: usize = 32 * 1024;
const APM_RECV: usize = 36 * 1024;
const SEND_SRC: usize = 40 * 1024;
const LANDING: usize = 48 * 1024;
const SLOT: u32 = 1024;

/// The windows in the window region: type 1 and type 2 (offset, length).
const WIN1: (usize, u64) = (2048, 2048);
const WIN2: (usize, u64) = (5120, 1024);
/// The 8 bytes repeated over the window region outside the windows.
const MARKER: [u8; 8] = [0x5E, 0x47, 0x1E, 0x5E, 0xC0, 0xDE, 0xF0, 0x0D];

/// Tags added to the TM SRQ: (recv_wr_id, offset, length, tag, mask).
const TAG_LIST: [(u64, usize, u32, u64, u64); 4] = [
    (2000, TAGS, 1024, 0x100, !0),
    (2001, TAGS + 1024, 1024, 0x200, 0xFF00),
    (2002, TAGS + 4096, 4096, 0x300, !0),
    (2003, TAGS + 8192, 8192, 0x400, !0),
];

/// Every wr_id the victim posts is below this.
const MAX_WR_ID: usize = 8192;

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    }
}

fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

/// The window region's initial bytes: the marker outside the windows, zeros inside.
fn window_region_bytes() -> Vec<u8> {
    let mut v: Vec<u8> = (0..W_LEN).map(|i| MARKER[i % 8]).collect();
    for (off, len) in [WIN1, WIN2] {
        v[off..off + len as usize].fill(0);
    }
    v
}

/// What the peer needs of the victim.
#[derive(Debug, Clone, Copy)]
struct VictimIds {
    /// The XRC target QP.
    xrc_tgt: Qpn,
    /// The XRC SRQ's number.
    xsrq: u32,
    /// The RC QP on the tag-matching SRQ.
    tm_qp: Qpn,
    /// The RC QP the type 2 window is bound to.
    mw_qp: Qpn,
    /// The RC QP with an alternate path.
    apm_qp: Qpn,
    /// The ordinary region's address and key.
    a_addr: u64,
    a_key: u32,
    /// The window region's address.
    w_addr: u64,
    /// The type 1 and type 2 windows' keys.
    key1: u32,
    key2: u32,
}

/// What the victim needs of the peer.
#[derive(Debug, Clone, Copy)]
struct PeerIds {
    /// The XRC initiator QP.
    xrc_ini: Qpn,
    /// The RC QPs facing the victim's tag-matching, window and APM QPs.
    tm: Qpn,
    mw: Qpn,
    apm: Qpn,
}

/// The victim NIC and its objects.
struct Victim {
    /// The NIC under test.
    nic: Nic,
    /// Its one CQ (every completion and list operation).
    cq: u32,
    /// The ordinary region (every kind of access).
    a: Region,
    /// The window region (`MW_BIND`, no remote access of its own).
    w: Region,
    /// The type 1 and type 2 windows' handles.
    mws: [u32; 2],
    /// The type 2 window was bound after the last record.
    w2_open: bool,
    ids: VictimIds,
    /// How many more completions each wr_id may have (index: wr_id).
    allowance: Vec<u8>,
}

fn modify(nic: &mut Nic, qpn: Qpn, attr: &QpAttr, mask: M) {
    nic.modify_qp(START, qpn, attr, mask)
        .expect("a valid transition");
}

/// Brings an RC QP (or an XRC target, `xrc_tgt`) to RTS towards `peer_qpn`.
fn connect(
    nic: &mut Nic,
    qpn: Qpn,
    peer_qpn: Qpn,
    peer_ip: IpAddr,
    (sq_psn, rq_psn): (u32, u32),
    xrc_tgt: bool,
) {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        ..QpAttr::default()
    };
    modify(
        nic,
        qpn,
        &init,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    );
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: AhAttr::new(Gid::from_ip(peer_ip)),
        path_mtu: Mtu::Mtu256,
        dest_qp_num: peer_qpn.0,
        rq_psn,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        ..QpAttr::default()
    };
    modify(
        nic,
        qpn,
        &rtr,
        M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER,
    );
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout: 8,
        retry_cnt: 7,
        rnr_retry: 7,
        sq_psn,
        max_rd_atomic: 4,
        ..QpAttr::default()
    };
    let mask = if xrc_tgt {
        M::STATE | M::TIMEOUT | M::SQ_PSN
    } else {
        M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC
    };
    modify(nic, qpn, &rts, mask);
}

/// Brings an XRC initiator to RTS towards target `peer_qpn`.
fn connect_xrc_ini(nic: &mut Nic, qpn: Qpn, peer_qpn: Qpn, peer_ip: IpAddr) {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    modify(
        nic,
        qpn,
        &init,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    );
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: AhAttr::new(Gid::from_ip(peer_ip)),
        path_mtu: Mtu::Mtu256,
        dest_qp_num: peer_qpn.0,
        rq_psn: VICTIM_PSN,
        ..QpAttr::default()
    };
    modify(
        nic,
        qpn,
        &rtr,
        M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN,
    );
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout: 8,
        retry_cnt: 7,
        rnr_retry: 7,
        sq_psn: PEER_PSN,
        max_rd_atomic: 4,
        ..QpAttr::default()
    };
    modify(
        nic,
        qpn,
        &rts,
        M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
    );
}

/// Loads an alternate path to `peer_ip` (on the same port: the NICs have one) and asks for
/// REARM: the QP arms once the peer's packets say it has loaded one too.
fn load_alt_path(nic: &mut Nic, qpn: Qpn, peer_ip: IpAddr) {
    let alt = QpAttr {
        qp_state: QpState::Rts,
        path_mig_state: MigState::Rearm,
        alt_port_num: 1,
        alt_timeout: 8,
        alt_ah_attr: AhAttr::new(Gid::from_ip(peer_ip)),
        ..QpAttr::default()
    };
    modify(nic, qpn, &alt, M::STATE | M::ALT_PATH | M::PATH_MIG_STATE);
}

fn rc_qp(nic: &mut Nic, pd: u32, cq: u32, srq: Option<u32>) -> Qpn {
    nic.create_qp(&QpConfig {
        cap: cap(),
        srq,
        ..QpConfig::rc(pd, cq)
    })
    .expect("a queue pair")
}

impl Victim {
    /// The victim, connected to a peer with `peer`'s numbers, with receives, tags and
    /// windows in place and its own work posted (not yet sent).
    fn new(peer: &PeerIds) -> Self {
        let mut nic = Nic::new(NicConfig::single_port(VICTIM, VICTIM_SEED));
        nic.set_verify_icrc(false);
        let pd = nic.alloc_pd();
        let cq = nic.create_cq(4096);
        let a = fuzz_api::reg_zeroed(&mut nic, pd, A_LEN, all_access()).expect("memory");
        // The window region: no remote access but through its windows.
        let w_access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
        let w = fuzz_api::reg_zeroed(&mut nic, pd, W_LEN, w_access).expect("memory");
        assert!(fuzz_api::write(&nic, &w, 0, &window_region_bytes()));
        // XRC: a domain, an SRQ in it, a target QP.
        let xrcd = nic.alloc_xrcd();
        let xsrq = nic.create_xrc_srq(pd, xrcd, cq, 64, 2).expect("an XRC SRQ");
        let xrc_tgt = nic
            .create_qp(&QpConfig {
                qp_type: QpType::XrcRecv,
                cap: QpCap {
                    max_send_wr: 0,
                    max_recv_wr: 0,
                    ..QpCap::default()
                },
                xrcd: Some(xrcd),
                ..QpConfig::rc(pd, 0)
            })
            .expect("an XRC target QP");
        // Tag matching: an SRQ with a tag list, an RC QP on it.
        let caps = TmCaps {
            max_num_tags: 64,
            max_ops: 16,
        };
        let tm_srq = nic.create_tm_srq(pd, 64, 2, caps, cq).expect("a TM SRQ");
        let tm_qp = rc_qp(&mut nic, pd, cq, Some(tm_srq));
        // The QP type 2 windows are bound to, and the APM QP.
        let mw_qp = rc_qp(&mut nic, pd, cq, None);
        let apm_qp = rc_qp(&mut nic, pd, cq, None);
        let (mw1, _) = nic.alloc_mw(pd, MwType::Type1).expect("a type 1 window");
        let (mw2, key2_old) = nic.alloc_mw(pd, MwType::Type2).expect("a type 2 window");
        let pip = PEER.ip();
        let psns = (VICTIM_PSN, PEER_PSN);
        connect(&mut nic, xrc_tgt, peer.xrc_ini, pip, psns, true);
        connect(&mut nic, tm_qp, peer.tm, pip, psns, false);
        connect(&mut nic, mw_qp, peer.mw, pip, psns, false);
        connect(&mut nic, apm_qp, peer.apm, pip, psns, false);
        load_alt_path(&mut nic, apm_qp, pip);

        let mut allowance = vec![0u8; MAX_WR_ID];
        let mut allow = |wr_id: u64, n: u8| allowance[wr_id as usize] += n;
        let sge = |off: usize, len: u32| a.sge(off, len).expect("inside the region");
        let mut wr_id = 1000;
        for i in 0..8 {
            let s = [sge(XSRQ_RECV + i * SLOT as usize, SLOT)];
            nic.post_srq_recv(xsrq, &RecvWr::new(wr_id, &s))
                .expect("an XRC SRQ receive");
            allow(wr_id, 1);
            wr_id += 1;
        }
        for i in 0..6 {
            let s = [sge(TM_RECV + i * SLOT as usize, SLOT)];
            nic.post_srq_recv(tm_srq, &RecvWr::new(wr_id, &s))
                .expect("a TM SRQ receive");
            allow(wr_id, 1);
            wr_id += 1;
        }
        for (qp, base) in [(mw_qp, MW_RECV), (apm_qp, APM_RECV)] {
            for i in 0..4 {
                let s = [sge(base + i * SLOT as usize, SLOT)];
                nic.post_recv(qp, &RecvWr::new(wr_id, &s))
                    .expect("a receive");
                allow(wr_id, 1);
                wr_id += 1;
            }
        }
        for (k, (recv_wr_id, off, len, tag, mask)) in TAG_LIST.into_iter().enumerate() {
            let s = [sge(off, len)];
            let op_id = 3000 + k as u64;
            nic.post_srq_ops(tm_srq, &[OpsWr::add(op_id, recv_wr_id, &s, tag, mask)])
                .expect("a tag");
            allow(op_id, 1);
            // Its match, then (rendezvous) its data.
            allow(recv_wr_id, 2);
        }
        // Windows: type 1 over part of the window region, type 2 bound to the window QP.
        let rw = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        let key1 = fuzz_api::bind_type1(&mut nic, START, mw_qp, 4000, mw1, &w, WIN1.0, WIN1.1, rw)
            .expect("a type 1 bind");
        allow(4000, 1);
        let key2 = Rkey(key2_old).inc().0;
        let b = fuzz_api::type2_bind(
            mw2,
            key2,
            &w,
            WIN2.0,
            WIN2.1,
            rw | AccessFlags::REMOTE_ATOMIC,
        );
        let wr = SendWr::new(4001, WrOpcode::BindMw(b), &[]).flags(SendFlags::SIGNALED);
        nic.post_send(START, mw_qp, &wr).expect("a type 2 bind");
        allow(4001, 1);
        // Work of its own on the APM QP: its packets carry MigReq = 0 (REARM).
        let s = [sge(SEND_SRC, 100)];
        let wr = SendWr::new(4002, WrOpcode::Send, &s).flags(SendFlags::SIGNALED);
        nic.post_send(START, apm_qp, &wr).expect("a send");
        allow(4002, 1);
        let ids = VictimIds {
            xrc_tgt,
            xsrq,
            tm_qp,
            mw_qp,
            apm_qp,
            a_addr: a.addr(),
            a_key: a.key(),
            w_addr: w.addr(),
            key1,
            key2,
        };
        Self {
            nic,
            cq,
            a,
            w,
            mws: [mw1, mw2],
            w2_open: true,
            ids,
            allowance,
        }
    }

    /// Polls the CQ dry (bounded); every completion must be for posted work, and within its
    /// allowance. Returns the completions seen.
    fn poll(&mut self, wcs: &mut [WorkCompletion], mut seen: impl FnMut(&WorkCompletion)) {
        for _ in 0..64 {
            let n = self.nic.poll_cq(self.cq, wcs);
            if n == 0 {
                break;
            }
            for wc in &wcs[..n] {
                let left = usize::try_from(wc.wr_id)
                    .ok()
                    .and_then(|i| self.allowance.get_mut(i));
                match left {
                    Some(l) if *l > 0 => *l -= 1,
                    _ => {
                        panic!("a completion for work never posted, or completed too often: {wc:?}")
                    }
                }
                seen(wc);
            }
        }
    }

    /// Once the type 2 window is closed (a send with invalidate), its bytes become sentinel
    /// bytes too: nothing may read or write them through the old key.
    fn seal_closed_window(&mut self) {
        if self.w2_open && fuzz_api::window(&self.nic, self.mws[1]).is_none() {
            self.w2_open = false;
            let (off, len) = WIN2;
            let marker: Vec<u8> = (off..off + len as usize).map(|i| MARKER[i % 8]).collect();
            assert!(fuzz_api::write(&self.nic, &self.w, off, &marker));
        }
    }

    /// The windows bound now that remote writes or atomics may change: (offset, length) in
    /// the window region.
    fn writable_windows(&self) -> [Option<(usize, usize)>; 2] {
        self.mws.map(|mw| {
            let (_, addr, len, access) = fuzz_api::window(&self.nic, mw)?;
            if !access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC) {
                return None;
            }
            let off = usize::try_from(addr.checked_sub(self.w.addr())?).ok()?;
            Some((off, usize::try_from(len).ok()?))
        })
    }
}

/// Builds the peer's objects (seeded: the same numbers every time).
struct PeerNode {
    /// The peer's NIC.
    nic: Nic,
    /// Its CQ.
    cq: u32,
    /// Its region: what it sends, where reads land, the rendezvous buffer.
    p: Region,
    /// Its numbers.
    ids: PeerIds,
}

impl PeerNode {
    fn build() -> Self {
        let mut nic = Nic::new(NicConfig::single_port(PEER, PEER_SEED));
        let pd = nic.alloc_pd();
        let cq = nic.create_cq(4096);
        let p = fuzz_api::reg_zeroed(&mut nic, pd, A_LEN, all_access()).expect("memory");
        let xrc_ini = nic
            .create_qp(&QpConfig {
                qp_type: QpType::XrcSend,
                cap: QpCap {
                    max_recv_wr: 0,
                    max_recv_sge: 0,
                    ..cap()
                },
                ..QpConfig::rc(pd, cq)
            })
            .expect("an XRC initiator");
        let tm = rc_qp(&mut nic, pd, cq, None);
        let mw = rc_qp(&mut nic, pd, cq, None);
        let apm = rc_qp(&mut nic, pd, cq, None);
        Self {
            nic,
            cq,
            p,
            ids: PeerIds {
                xrc_ini,
                tm,
                mw,
                apm,
            },
        }
    }

    /// Connects to the victim; receives for what the victim sends (its message on the APM
    /// QP, the rendezvous FIN).
    fn connect(&mut self, v: &VictimIds) {
        let me = self.ids;
        let vip = VICTIM.ip();
        let psns = (PEER_PSN, VICTIM_PSN);
        connect_xrc_ini(&mut self.nic, me.xrc_ini, v.xrc_tgt, vip);
        connect(&mut self.nic, me.tm, v.tm_qp, vip, psns, false);
        connect(&mut self.nic, me.mw, v.mw_qp, vip, psns, false);
        connect(&mut self.nic, me.apm, v.apm_qp, vip, psns, false);
        load_alt_path(&mut self.nic, me.apm, vip);
        for (i, qp) in [me.tm, me.tm, me.apm, me.apm].into_iter().enumerate() {
            let s = [self.sge(60 * 1024 + i * 1024, 1024)];
            self.nic
                .post_recv(qp, &RecvWr::new(500 + i as u64, &s))
                .expect("a receive");
        }
    }

    fn sge(&self, off: usize, len: u32) -> rdmx_verbs::wr::Sge {
        self.p.sge(off, len).expect("inside the region")
    }

    fn post(&mut self, qp: Qpn, wr: &SendWr<'_>) {
        self.nic.post_send(START, qp, wr).expect("a send");
    }

    /// The first round: XRC, tag matching, windows, APM's first message.
    fn post_work(&mut self, v: &VictimIds) {
        let me = self.ids;
        let f = SendFlags::SIGNALED;
        // Tagged messages: headers written into the peer's region.
        let p = self.p;
        let tmh = |op, app_ctx, tag| Tmh { op, app_ctx, tag }.to_bytes();
        let put = |nic: &Nic, off: usize, b: &[u8]| assert!(fuzz_api::write(nic, &p, off, b));
        put(&self.nic, 0, &tmh(TmhOp::Eager, 1, 0x100));
        put(&self.nic, 16, b"an eager message for tag 0x100");
        put(&self.nic, 1024, &tmh(TmhOp::Eager, 2, 0x2AB));
        put(&self.nic, 2048, &tmh(TmhOp::Rndv, 3, 0x300));
        let rvh = Rvh {
            va: p.addr() + 8192,
            rkey: Rkey(p.key()),
            len: 3000,
        };
        put(&self.nic, 2048 + TMH_LEN, &rvh.to_bytes());
        put(&self.nic, 3072, &tmh(TmhOp::NoTag, 4, 0));
        put(&self.nic, 4096, &tmh(TmhOp::Eager, 5, 0x999));
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 1) as u8).collect();
        put(&self.nic, 8192, &data);
        let tagged = [
            (0, 216),
            (1024, 600), // three packets
            (2048, 40),  // TMH, RVH and 8 bytes of the application's header
            (3072, 100),
            (4096, 64), // no such tag: unexpected (and matching stops until a sync)
        ];
        for (i, (off, len)) in tagged.into_iter().enumerate() {
            let s = [self.sge(off, len)];
            self.post(
                me.tm,
                &SendWr::new(10 + i as u64, WrOpcode::Send, &s).flags(f),
            );
        }
        // XRC: to the victim's XRC SRQ.
        let s200 = [self.sge(12 * 1024, 200)];
        let s600 = [self.sge(12 * 1024, 600)];
        let s100 = [self.sge(12 * 1024, 100)];
        let land = [self.sge(14 * 1024, 64)];
        let a_key = Rkey(v.a_key);
        let at_a = |off: usize| v.a_addr + off as u64;
        let xrc = [
            (WrOpcode::Send, &s200[..]),
            (WrOpcode::SendWithImm { imm: 0x1234 }, &s600[..]),
            (
                WrOpcode::RdmaWrite {
                    remote_addr: at_a(LANDING),
                    rkey: a_key,
                },
                &s100[..],
            ),
            (
                WrOpcode::RdmaWriteWithImm {
                    remote_addr: at_a(LANDING + 1024),
                    rkey: a_key,
                    imm: 9,
                },
                &s100[..],
            ),
            (
                WrOpcode::RdmaRead {
                    remote_addr: at_a(LANDING),
                    rkey: a_key,
                },
                &land[..],
            ),
        ];
        for (i, (op, s)) in xrc.into_iter().enumerate() {
            let wr = SendWr::new(20 + i as u64, op, s).flags(f).to_srq(v.xsrq);
            self.post(me.xrc_ini, &wr);
        }
        // Windows: through each key, then the type 2 window invalidated by a send and a
        // write through its key after that (refused: the peer's QP fails).
        let key1 = Rkey(v.key1);
        let key2 = Rkey(v.key2);
        let at_w = |off: usize| v.w_addr + off as u64;
        let s256 = [self.sge(16 * 1024, 256)];
        let s40 = [self.sge(16 * 1024, 40)];
        let r128 = [self.sge(20 * 1024, 128)];
        let r64 = [self.sge(20 * 1024 + 512, 64)];
        let word = [self.sge(21 * 1024, 8)];
        let mw = [
            (
                WrOpcode::RdmaWrite {
                    remote_addr: at_w(WIN1.0 + 100),
                    rkey: key1,
                },
                &s256[..],
            ),
            (
                WrOpcode::RdmaRead {
                    remote_addr: at_w(WIN1.0),
                    rkey: key1,
                },
                &r128[..],
            ),
            (
                WrOpcode::RdmaWriteWithImm {
                    remote_addr: at_w(WIN2.0),
                    rkey: key2,
                    imm: 2,
                },
                &s40[..],
            ),
            (
                WrOpcode::AtomicFetchAdd {
                    remote_addr: at_w(WIN2.0 + 512),
                    rkey: key2,
                    add: 3,
                },
                &word[..],
            ),
            (
                WrOpcode::AtomicCmpSwap {
                    remote_addr: at_w(WIN2.0 + 512),
                    rkey: key2,
                    compare: 3,
                    swap: 0x77,
                },
                &word[..],
            ),
            (
                WrOpcode::RdmaRead {
                    remote_addr: at_w(WIN2.0),
                    rkey: key2,
                },
                &r64[..],
            ),
            (WrOpcode::SendWithInv { rkey: key2 }, &s40[..]),
            (
                WrOpcode::RdmaWrite {
                    remote_addr: at_w(WIN2.0),
                    rkey: key2,
                },
                &s40[..],
            ),
        ];
        for (i, (op, s)) in mw.into_iter().enumerate() {
            self.post(me.mw, &SendWr::new(30 + i as u64, op, s).flags(f));
        }
        let s = [self.sge(24 * 1024, 100)];
        self.post(me.apm, &SendWr::new(40, WrOpcode::Send, &s).flags(f));
    }

    /// The second round: the peer migrates its APM QP (its alternate is armed by now) and
    /// sends again, with MigReq = 1.
    fn migrate(&mut self) {
        let me = self.ids;
        let attr = QpAttr {
            qp_state: QpState::Rts,
            path_mig_state: MigState::Migrated,
            ..QpAttr::default()
        };
        modify(&mut self.nic, me.apm, &attr, M::STATE | M::PATH_MIG_STATE);
        let s = [self.sge(24 * 1024, 50)];
        self.post(
            me.apm,
            &SendWr::new(41, WrOpcode::Send, &s).flags(SendFlags::SIGNALED),
        );
    }
}

/// The peer's numbers (as the victim connects to them).
fn peer_ids() -> PeerIds {
    PeerNode::build().ids
}

// ------------------------------------------------------------------------------ recording

/// Records: (control byte, datagram).
type Records = Vec<(u8, Vec<u8>)>;

/// Runs both NICs over a perfect link until neither has anything to do; appends what the
/// peer sends the victim (canonical addresses) to `out`.
fn exchange(peer: &mut PeerNode, victim: &mut Victim, now: &mut u64, out: &mut Records) {
    let mut buf = vec![0u8; 8192];
    let mut wcs = vec![WorkCompletion::EMPTY; 64];
    let bases = [
        (victim.a.addr(), A_LEN, CANON_A),
        (victim.w.addr(), W_LEN, CANON_W),
    ];
    for _ in 0..10_000 {
        let mut moved = false;
        while let Some(t) = victim.nic.poll_transmit(*now, &mut buf) {
            moved = true;
            if t.dst.ip() == PEER.ip() {
                peer.nic
                    .handle_datagram(*now, 0, VICTIM, PEER.ip(), &buf[..t.len]);
            }
        }
        while let Some(t) = peer.nic.poll_transmit(*now, &mut buf) {
            moved = true;
            if t.dst.ip() == VICTIM.ip() {
                let mut pkt = buf[..t.len].to_vec();
                canonicalize(&mut pkt, &bases, (peer.p.addr(), A_LEN));
                out.push((0, pkt));
                victim
                    .nic
                    .handle_datagram(*now, 0, PEER, VICTIM.ip(), &buf[..t.len]);
            }
        }
        victim.poll(&mut wcs, |_| {});
        while peer.nic.poll_cq(peer.cq, &mut wcs) > 0 {}
        while peer.nic.poll_event().is_some() {}
        if moved {
            *now += 5_000;
            continue;
        }
        let next = [victim.nic.poll_timeout(), peer.nic.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        match next {
            Some(t) if t <= START + 10_000_000_000 => {
                *now = (*now).max(t);
                victim.nic.handle_timeout(*now);
                peer.nic.handle_timeout(*now);
            }
            _ => break,
        }
    }
}

/// Rewrites a packet from the peer: the victim's addresses (RETH, AtomicETH) relative to
/// their canonical bases, the peer's address in a rendezvous header likewise; recomputes
/// the ICRC.
fn canonicalize(pkt: &mut [u8], bases: &[(u64, usize, u64)], (p_addr, p_len): (u64, usize)) {
    let Ok((mut h, payload)) = PacketHeaders::parse(pkt) else {
        return;
    };
    let to_canon = |va: &mut u64| {
        for &(base, len, canon) in bases {
            if (base..base + len as u64).contains(va) {
                *va = *va - base + canon;
                return;
            }
        }
    };
    if let Some(r) = h.reth.as_mut() {
        to_canon(&mut r.va);
    }
    if let Some(a) = h.atomic_eth.as_mut() {
        to_canon(&mut a.va);
    }
    // A rendezvous request: TMH then RVH at the start of the payload.
    let rvh_at = (pkt.len() - icrc::ICRC_LEN - payload.len()) + TMH_LEN;
    let is_rndv = Tmh::parse(payload).is_some_and(|t| t.op == TmhOp::Rndv);
    let hl = h.emit(pkt);
    if is_rndv
        && hl.is_ok()
        && let Some(mut rvh) = pkt.get(rvh_at..).and_then(Rvh::parse)
        && (p_addr..p_addr + p_len as u64).contains(&rvh.va)
    {
        rvh.va = rvh.va - p_addr + CANON_P;
        pkt[rvh_at..rvh_at + 16].copy_from_slice(&rvh.to_bytes());
    }
    let path = IcrcPath::new(PEER, SocketAddr::new(VICTIM.ip(), ROCE_UDP_PORT));
    fix_icrc(pkt, &path);
}

/// The exchange between a fresh victim and peer: the first round, then the peer's
/// migration and message after it.
fn record() -> Records {
    let mut peer = PeerNode::build();
    let mut victim = Victim::new(&peer.ids);
    let v = victim.ids;
    peer.connect(&v);
    peer.post_work(&v);
    let mut out = Vec::new();
    let mut now = START;
    exchange(&mut peer, &mut victim, &mut now, &mut out);
    peer.migrate();
    exchange(&mut peer, &mut victim, &mut now, &mut out);
    out
}

/// The recorded exchange, whole and by queue pair, for the corpus.
fn scenarios() -> Vec<(String, Records)> {
    let all = record();
    let v = Victim::new(&peer_ids()).ids;
    let mut out = vec![("exchange".to_owned(), all.clone())];
    let to = |qpn: Qpn| -> Records {
        all.iter()
            .filter(|(_, p)| PacketHeaders::parse(p).is_ok_and(|(h, _)| h.bth.dest_qp == qpn.0))
            .cloned()
            .collect()
    };
    out.push(("xrc".to_owned(), to(v.xrc_tgt)));
    out.push(("tm".to_owned(), to(v.tm_qp)));
    out.push(("mw".to_owned(), to(v.mw_qp)));
    out.push(("apm".to_owned(), to(v.apm_qp)));
    out.push((
        "responses".to_owned(),
        all.iter()
            .filter(|(_, p)| PacketHeaders::parse(p).is_ok_and(|(h, _)| h.bth.opcode.is_response()))
            .cloned()
            .collect(),
    ));
    out.push((
        "duplicated".to_owned(),
        all.iter().flat_map(|r| [r.clone(), r.clone()]).collect(),
    ));
    out.push((
        "slow".to_owned(),
        all.iter().map(|(c, p)| (c | 0x20, p.clone())).collect(),
    ));
    out
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    scenarios()
        .into_iter()
        .map(|(name, recs)| {
            (
                name,
                records::encode(recs.iter().map(|(c, d)| (*c, &d[..]))),
            )
        })
        .collect()
}

// --------------------------------------------------------------------------------- runner

/// Translates remote addresses relative to the canonical bases into the victim's regions;
/// recomputes the ICRC when `fix` says so (the check is off: it matters only to keep the
/// packets as a NIC would see them).
fn locate(packet: &mut [u8], v: &Victim, path: &IcrcPath, fix: bool) {
    if let Ok((mut h, _)) = PacketHeaders::parse(packet) {
        let bases = [(CANON_A, A_LEN, v.a.addr()), (CANON_W, W_LEN, v.w.addr())];
        let mut moved = false;
        let mut to_real = |va: &mut u64| {
            for &(canon, len, base) in &bases {
                if (canon..canon + len as u64).contains(va) {
                    *va = *va - canon + base;
                    moved = true;
                    return;
                }
            }
        };
        if let Some(r) = h.reth.as_mut() {
            to_real(&mut r.va);
        }
        if let Some(a) = h.atomic_eth.as_mut() {
            to_real(&mut a.va);
        }
        if moved {
            let _ = h.emit(packet);
        }
    }
    if fix {
        fix_icrc(packet, path);
    }
}

struct States {
    /// The peer's numbers (the victim connects to them).
    peer: PeerIds,
    /// A fresh victim for each input.
    victim: Option<Victim>,
    /// Where the victim's packets go.
    buf: Vec<u8>,
    /// The datagram being delivered (addresses translated).
    scratch: Vec<u8>,
    /// Completions polled.
    wcs: Vec<WorkCompletion>,
    /// The window region before a record, and after it.
    before: Vec<u8>,
    after: Vec<u8>,
}

fn runner() -> Box<dyn Runner> {
    Box::new(States {
        peer: peer_ids(),
        victim: None,
        buf: vec![0u8; BUF_LEN],
        scratch: Vec::with_capacity(1 << 16),
        wcs: vec![WorkCompletion::EMPTY; 64],
        before: vec![0u8; W_LEN],
        after: vec![0u8; W_LEN],
    })
}

/// Takes everything the NIC has for its driver, checking what leaves and what completes.
fn drain(v: &mut Victim, now: u64, buf: &mut [u8], wcs: &mut [WorkCompletion]) {
    for _ in 0..512 {
        let Some(t) = v.nic.poll_transmit(now, buf) else {
            break;
        };
        check_read_response(&buf[..t.len]);
    }
    v.poll(wcs, |_| {});
    for _ in 0..64 {
        if v.nic.poll_event().is_none() {
            break;
        }
    }
    for _ in 0..64 {
        if v.nic.poll_cq_notify().is_none() {
            break;
        }
    }
    if v.nic.poll_timeout().is_some_and(|t| t <= now) {
        v.nic.handle_timeout(now);
    }
}

/// An RDMA read response must not carry the window region's bytes from outside its windows.
fn check_read_response(pkt: &[u8]) {
    let Ok((h, payload)) = PacketHeaders::parse(pkt) else {
        return;
    };
    // RDMA READ response first / middle / last / only (RC and XRC).
    if !matches!(h.bth.opcode.operation(), 0x0D..=0x10) {
        return;
    }
    assert!(
        !payload.windows(MARKER.len()).any(|w| w == MARKER),
        "a read response carries the window region's bytes from outside its windows: {h:?}"
    );
}

/// Every byte of the window region that changed lies in a window that was writable before
/// the change.
fn check_windows(before: &[u8], after: &[u8], writable: &[Option<(usize, usize)>; 2]) {
    if before == after {
        return;
    }
    for (i, (b, a)) in before.iter().zip(after).enumerate() {
        if b != a {
            let inside = writable
                .iter()
                .flatten()
                .any(|&(off, len)| (off..off + len).contains(&i));
            assert!(
                inside,
                "byte {i} of the window region changed ({b:#04x} -> {a:#04x}) outside every \
                 window writable then ({writable:?})"
            );
        }
    }
}

impl Runner for States {
    fn reset(&mut self) {
        self.victim = None;
        let mut v = Victim::new(&self.peer);
        // The victim's own first packets (the APM send) go out first, as when recorded.
        drain(&mut v, START, &mut self.buf, &mut self.wcs);
        self.victim = Some(v);
    }

    fn run(&mut self, input: &[u8]) {
        let Some(v) = self.victim.as_mut() else {
            return;
        };
        let mut now = START;
        for r in records::parse(input) {
            now += STEPS[usize::from(r.ctrl >> ctrl::TIME_SHIFT & 3)];
            let src = source(r.ctrl);
            let dst = if r.ctrl & ctrl::MULTICAST != 0 {
                IpAddr::V4(GROUP)
            } else {
                VICTIM.ip()
            };
            let port = usize::from(r.ctrl & ctrl::BAD_PORT != 0);
            self.scratch.clear();
            self.scratch.extend_from_slice(r.data);
            let path = IcrcPath::new(src, SocketAddr::new(dst, ROCE_UDP_PORT));
            locate(&mut self.scratch, v, &path, r.ctrl & ctrl::FIX_ICRC != 0);
            let writable = v.writable_windows();
            assert!(fuzz_api::read(&v.nic, &v.w, 0, &mut self.before));
            v.nic.handle_datagram(now, port, src, dst, &self.scratch);
            if r.ctrl & ctrl::FLUSH_ACKS != 0 {
                v.nic.flush_acks(now, 0);
            }
            drain(v, now, &mut self.buf, &mut self.wcs);
            assert!(fuzz_api::read(&v.nic, &v.w, 0, &mut self.after));
            check_windows(&self.before, &self.after, &writable);
            v.seal_closed_window();
        }
        let writable = v.writable_windows();
        assert!(fuzz_api::read(&v.nic, &v.w, 0, &mut self.before));
        for _ in 0..8 {
            let Some(t) = v.nic.poll_timeout() else {
                break;
            };
            now = now.max(t);
            v.nic.handle_timeout(now);
            drain(v, now, &mut self.buf, &mut self.wcs);
        }
        assert!(fuzz_api::read(&v.nic, &v.w, 0, &mut self.after));
        check_windows(&self.before, &self.after, &writable);
        let _ = v.nic.debug_dump();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use rdmx_verbs::soft::engine::AsyncEvent;
    use rdmx_verbs::types::{WcFlags, WcOpcode, WcStatus};

    use super::*;

    /// The recorded exchange, replayed into a fresh victim, is taken packet by packet and
    /// reaches each state the target is for: XRC receives, tag matches (eager and
    /// rendezvous, with the data read), an unexpected message, writes through both windows,
    /// the type 2 window invalidated and the write after it refused, the migration.
    #[test]
    fn the_recorded_exchange_replays_cleanly() {
        let peer = peer_ids();
        let mut v = Victim::new(&peer);
        let (name, recs) = scenarios().remove(0);
        assert_eq!(name, "exchange");
        let mut buf = vec![0u8; BUF_LEN];
        let mut wcs = vec![WorkCompletion::EMPTY; 64];
        let mut got: Vec<WorkCompletion> = Vec::new();
        let mut events = Vec::new();
        let mut now = START;
        while v.nic.poll_transmit(now, &mut buf).is_some() {}
        let before = {
            let mut b = vec![0u8; W_LEN];
            assert!(fuzz_api::read(&v.nic, &v.w, 0, &mut b));
            b
        };
        assert_eq!(before, window_region_bytes());
        for (_, pkt) in &recs {
            now += 5_000;
            let path = IcrcPath::new(PEER, SocketAddr::new(VICTIM.ip(), ROCE_UDP_PORT));
            let mut p = pkt.clone();
            locate(&mut p, &v, &path, false);
            v.nic.handle_datagram(now, 0, PEER, VICTIM.ip(), &p);
            while let Some(t) = v.nic.poll_transmit(now, &mut buf) {
                check_read_response(&buf[..t.len]);
            }
            v.poll(&mut wcs, |wc| got.push(*wc));
            while let Some(e) = v.nic.poll_event() {
                events.push(e);
            }
        }
        let c = v.nic.counters();
        assert_eq!(
            c.rx_bad_icrc + c.rx_malformed + c.rx_no_qp + c.rx_dropped_seq + c.rx_no_recv,
            0,
            "{c:?}"
        );
        let ok = |f: &dyn Fn(&WorkCompletion) -> bool| {
            got.iter()
                .filter(|w| w.status == WcStatus::Success && f(w))
                .count()
        };
        // XRC: the send, the send with immediate, the write with immediate.
        assert_eq!(ok(&|w| (1000..1008).contains(&w.wr_id)), 3, "{got:#?}");
        // Tags: two eager matches, the rendezvous match and its data (3000 bytes).
        let tm = |w: &WorkCompletion| w.opcode == WcOpcode::TmRecv;
        assert_eq!(ok(&|w| tm(w) && w.wr_id == 2000), 1, "{got:#?}");
        assert_eq!(ok(&|w| tm(w) && w.wr_id == 2001), 1, "{got:#?}");
        assert_eq!(ok(&|w| tm(w) && w.wr_id == 2002), 2, "{got:#?}");
        assert_eq!(
            ok(&|w| w.wr_id == 2002 && w.wc_flags.contains(WcFlags::TM_DATA_VALID)),
            1
        );
        // The untagged and the unexpected message went to ordinary receives.
        assert_eq!(ok(&|w| (1008..1014).contains(&w.wr_id)), 2, "{got:#?}");
        assert!(
            got.iter()
                .any(|w| w.wc_flags.contains(WcFlags::TM_SYNC_REQ))
        );
        // Windows: the write with immediate through the type 2 window and the send with
        // invalidate on the window QP; the type 2 window is closed, the type 1 still open.
        assert_eq!(ok(&|w| (1014..1018).contains(&w.wr_id)), 2, "{got:#?}");
        assert!(
            got.iter()
                .any(|w| w.invalidated_rkey() == Some(Rkey(v.ids.key2)))
        );
        assert!(fuzz_api::window(&v.nic, v.mws[1]).is_none());
        assert!(fuzz_api::window(&v.nic, v.mws[0]).is_some());
        // The writes landed inside the windows only; the write after the invalidation did
        // not land.
        let mut after = vec![0u8; W_LEN];
        assert!(fuzz_api::read(&v.nic, &v.w, 0, &mut after));
        let changed: HashSet<usize> = (0..W_LEN).filter(|&i| before[i] != after[i]).collect();
        assert!(!changed.is_empty());
        let win = |(off, len): (usize, u64)| off..off + len as usize;
        assert!(
            changed
                .iter()
                .all(|i| win(WIN1).contains(i) || win(WIN2).contains(i))
        );
        // APM: both of the peer's messages arrived, and the victim followed its migration.
        assert_eq!(ok(&|w| (1018..1022).contains(&w.wr_id)), 2, "{got:#?}");
        assert!(
            events
                .iter()
                .any(|e| matches!(e, AsyncEvent::PathMigrated(q) if *q == v.ids.apm_qp)),
            "{events:?}"
        );
    }

    /// The fuzz run's checks fire: a byte changed outside the windows is a finding.
    #[test]
    #[should_panic(expected = "outside every window")]
    fn a_write_outside_the_windows_is_caught() {
        let before = window_region_bytes();
        let mut after = before.clone();
        after[WIN1.0 - 1] ^= 1;
        check_windows(&before, &after, &[Some((WIN1.0, WIN1.1 as usize)), None]);
    }
}
