//! `nic_bare`, `nic_qps` and `nic_icrc`: the soft NIC's receive path
//! (`rdmx_verbs::soft::engine::Nic::handle_datagram`: ICRC check, header parsing, dispatch
//! to the RC/UC/XRC responder and requester, UD and multicast delivery), then what the
//! packets set going (`poll_transmit`, timers, completions, events).
//!
//! * `nic_bare`: a NIC with no queue pair, ICRC check off; the input is one datagram,
//!   delivered to the NIC's address and to a multicast group.
//! * `nic_qps`: a NIC with connected RC, UC and UD queue pairs and an RC queue pair on a
//!   shared receive queue, with receives posted and work of every kind in flight; ICRC check
//!   off, so that mutated packets reach the transport. The input is records
//!   ([`crate::records`]) of datagrams from its peer.
//! * `nic_icrc`: the same with the ICRC check on (a control bit recomputes a record's ICRC).
//!
//! The seeds are recorded from a real exchange between this NIC and a peer built the same
//! way: since both are seeded, the victim's queue pair numbers, keys and PSNs are the same
//! in every run. Only its memory's address differs from run to run, so the recorded
//! packets carry remote addresses relative to [`CANON`], translated before delivery.

mod fixture;
mod states;

use std::net::{IpAddr, SocketAddr};

use rdmx_verbs::soft::engine::{Nic, NicConfig};
use rdmx_verbs::soft::wire::{IcrcPath, PacketHeaders, ROCE_UDP_PORT, icrc};
use rdmx_verbs::types::WorkCompletion;

use super::{Runner, Target, numbered};
use crate::records;
use fixture::{CANON, GROUP, Ids, MEM_LEN, Node, PEER, STRANGER, VICTIM};

pub(crate) use fixture::recorded_packets;
pub(crate) use states::STATES;

pub(crate) const BARE: Target = Target {
    name: "nic_bare",
    about: "soft NIC without queue pairs: one datagram, ICRC check off",
    max_alloc: 64 * 1024,
    max_total: 1 << 20,
    max_len: 4200,
    framed: false,
    seeds: bare_seeds,
    runner: bare_runner,
};

pub(crate) const QPS: Target = Target {
    name: "nic_qps",
    about: "soft NIC with RC, UC, UD and SRQ queue pairs in use: records of datagrams, ICRC off",
    max_alloc: 256 * 1024,
    max_total: 32 << 20,
    max_len: 32 * 1024,
    framed: true,
    seeds: qps_seeds,
    runner: qps_runner,
};

pub(crate) const ICRC: Target = Target {
    name: "nic_icrc",
    about: "the nic_qps NIC with the ICRC check on (a control bit fixes the ICRC)",
    max_alloc: 256 * 1024,
    max_total: 32 << 20,
    max_len: 32 * 1024,
    framed: true,
    seeds: qps_seeds,
    runner: icrc_runner,
};

/// The largest packet a NIC writes (4096-byte MTU plus headers).
const BUF_LEN: usize = 4096 + 256;

// -------------------------------------------------------------------------------- bare

struct Bare {
    nic: Nic,
    buf: Vec<u8>,
}

fn bare_runner() -> Box<dyn Runner> {
    Box::new(Bare {
        nic: bare_nic(),
        buf: vec![0u8; BUF_LEN],
    })
}

fn bare_nic() -> Nic {
    let mut nic = Nic::new(NicConfig::single_port(VICTIM, 7));
    nic.set_verify_icrc(false);
    nic
}

impl Runner for Bare {
    fn reset(&mut self) {
        self.nic = bare_nic();
    }

    fn run(&mut self, input: &[u8]) {
        let nic = &mut self.nic;
        nic.handle_datagram(1_000, 0, PEER, VICTIM.ip(), input);
        nic.handle_datagram(2_000, 0, PEER, IpAddr::V4(GROUP), input);
        nic.handle_datagram(3_000, 1, STRANGER, VICTIM.ip(), input);
        let c = nic.counters();
        assert_eq!(c.rx_packets, 3);
        assert!(
            nic.poll_transmit(4_000, &mut self.buf).is_none(),
            "no QP, nothing to send"
        );
    }
}

fn bare_seeds() -> Vec<(String, Vec<u8>)> {
    numbered("packet", recorded_packets())
}

// ------------------------------------------------------------------------ with queue pairs

/// Control bits of a NIC record.
mod ctrl {
    /// Bits 0-1: the source ([`super::source`]).
    pub(super) const SOURCE: u8 = 3;
    /// Sent to the multicast group rather than to the NIC's address.
    pub(super) const MULTICAST: u8 = 4;
    /// Recompute the ICRC (after any address translation).
    pub(super) const FIX_ICRC: u8 = 8;
    /// Bits 4-5: how far time moves before the record ([`super::STEPS`]).
    pub(super) const TIME_SHIFT: u8 = 4;
    /// Release coalesced acknowledgements after the record.
    pub(super) const FLUSH_ACKS: u8 = 64;
    /// Arrives on a port the NIC does not have.
    pub(super) const BAD_PORT: u8 = 128;
}

/// Time steps, in nanoseconds.
const STEPS: [u64; 4] = [5_000, 200_000, 20_000_000, 2_000_000_000];

/// Where a record comes from.
fn source(ctrl: u8) -> SocketAddr {
    match ctrl & ctrl::SOURCE {
        0 => PEER,
        1 => STRANGER,
        2 => SocketAddr::new(PEER.ip(), 50_000),
        _ => VICTIM,
    }
}

struct Qps {
    verify_icrc: bool,
    peer: Ids,
    node: Option<Node>,
    buf: Vec<u8>,
    scratch: Vec<u8>,
    wcs: Vec<WorkCompletion>,
}

fn qps_runner() -> Box<dyn Runner> {
    Box::new(Qps::new(false))
}

fn icrc_runner() -> Box<dyn Runner> {
    Box::new(Qps::new(true))
}

impl Qps {
    fn new(verify_icrc: bool) -> Self {
        let peer = fixture::peer_ids();
        Self {
            verify_icrc,
            peer,
            node: None,
            buf: vec![0u8; BUF_LEN],
            scratch: Vec::with_capacity(1 << 16),
            wcs: vec![WorkCompletion::EMPTY; 64],
        }
    }
}

impl Runner for Qps {
    fn reset(&mut self) {
        self.node = None;
        let mut node = Node::victim(self.verify_icrc, &self.peer);
        // Its first packets go out before the peer's (answers to them) come in, as when the
        // seeds were recorded.
        drain(&mut node, fixture::START, &mut self.buf, &mut self.wcs);
        self.node = Some(node);
    }

    fn run(&mut self, input: &[u8]) {
        let Some(node) = self.node.as_mut() else {
            return;
        };
        let mut now = fixture::START;
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
            locate(
                &mut self.scratch,
                node.region.addr(),
                &path,
                r.ctrl & ctrl::FIX_ICRC != 0,
            );
            node.nic.handle_datagram(now, port, src, dst, &self.scratch);
            if r.ctrl & ctrl::FLUSH_ACKS != 0 {
                node.nic.flush_acks(now, 0);
            }
            drain(node, now, &mut self.buf, &mut self.wcs);
        }
        // The timers a while: retransmissions, RNR waits, held acknowledgements.
        for _ in 0..8 {
            let Some(t) = node.nic.poll_timeout() else {
                break;
            };
            now = now.max(t);
            node.nic.handle_timeout(now);
            drain(node, now, &mut self.buf, &mut self.wcs);
        }
        let _ = node.nic.debug_dump();
    }
}

/// Translates remote addresses relative to [`CANON`] into the victim's region at `base`,
/// and recomputes the ICRC when the packet had a valid one (or `fix` says so).
fn locate(packet: &mut [u8], base: u64, path: &IcrcPath, fix: bool) {
    let Ok((mut h, _)) = PacketHeaders::parse(packet) else {
        if fix {
            fix_icrc(packet, path);
        }
        return;
    };
    let valid = icrc::verify(path, packet);
    let canon = CANON..CANON + MEM_LEN as u64;
    let mut moved = false;
    if let Some(reth) = h.reth.as_mut()
        && canon.contains(&reth.va)
    {
        reth.va = reth.va - CANON + base;
        moved = true;
    }
    if let Some(a) = h.atomic_eth.as_mut()
        && canon.contains(&a.va)
    {
        a.va = a.va - CANON + base;
        moved = true;
    }
    if moved {
        let pad = h.bth.pad_count;
        let _ = h.emit(packet);
        // (emit writes the pad count parsed: the same.)
        debug_assert_eq!(
            PacketHeaders::parse(packet).map(|(h, _)| h.bth.pad_count),
            Ok(pad)
        );
    }
    if fix || (moved && valid) {
        fix_icrc(packet, path);
    }
}

/// Writes the ICRC of `packet` for `path` into its last four bytes.
fn fix_icrc(packet: &mut [u8], path: &IcrcPath) {
    let Some(body_len) = packet.len().checked_sub(icrc::ICRC_LEN) else {
        return;
    };
    let crc = icrc::compute(path, &packet[..body_len]);
    packet[body_len..].copy_from_slice(&crc.to_le_bytes());
}

/// Takes everything the NIC has for its driver: packets (to nowhere), completions, events,
/// notifications; runs due timers.
fn drain(node: &mut Node, now: u64, buf: &mut [u8], wcs: &mut [WorkCompletion]) {
    let nic = &mut node.nic;
    for _ in 0..512 {
        if nic.poll_transmit(now, buf).is_none() {
            break;
        }
    }
    for _ in 0..64 {
        if nic.poll_cq(node.cq, wcs) == 0 {
            break;
        }
    }
    for _ in 0..64 {
        if nic.poll_event().is_none() {
            break;
        }
    }
    for _ in 0..64 {
        if nic.poll_cq_notify().is_none() {
            break;
        }
    }
    if nic.poll_timeout().is_some_and(|t| t <= now) {
        nic.handle_timeout(now);
    }
}

fn qps_seeds() -> Vec<(String, Vec<u8>)> {
    fixture::scenarios()
        .into_iter()
        .map(|(name, recs)| {
            (
                name,
                records::encode(recs.iter().map(|(c, d)| (*c, &d[..]))),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use rdmx_verbs::types::WcStatus;

    use super::*;

    /// The recorded exchange, replayed into a fresh victim with the ICRC check on, is
    /// accepted packet by packet and completes the work of both sides: the seeds reach the
    /// transport's every path, not its drop counters.
    #[test]
    fn the_recorded_exchange_replays_cleanly() {
        let peer = fixture::peer_ids();
        let mut node = Node::victim(true, &peer);
        let (name, recs) = fixture::scenarios().remove(0);
        assert_eq!(name, "exchange");
        let mut buf = vec![0u8; BUF_LEN];
        let mut wcs = vec![WorkCompletion::EMPTY; 64];
        let mut ok = 0;
        let mut now = fixture::START;
        while node.nic.poll_transmit(now, &mut buf).is_some() {}
        for (ctrl, pkt) in &recs {
            now += 5_000;
            let dst = if ctrl & ctrl::MULTICAST != 0 {
                IpAddr::V4(GROUP)
            } else {
                VICTIM.ip()
            };
            let path = IcrcPath::new(PEER, SocketAddr::new(dst, ROCE_UDP_PORT));
            let mut p = pkt.clone();
            locate(&mut p, node.region.addr(), &path, false);
            node.nic.handle_datagram(now, 0, PEER, dst, &p);
            while node.nic.poll_transmit(now, &mut buf).is_some() {}
            loop {
                let n = node.nic.poll_cq(node.cq, &mut wcs);
                if n == 0 {
                    break;
                }
                ok += wcs[..n]
                    .iter()
                    .filter(|w| w.status == WcStatus::Success)
                    .count();
            }
        }
        let c = node.nic.counters();
        assert_eq!(
            c.rx_bad_icrc + c.rx_malformed + c.rx_no_qp + c.rx_dropped_seq + c.rx_no_recv,
            0,
            "{c:?}"
        );
        // 12 of the victim's work requests and 8 receives of the peer's messages.
        assert_eq!(ok, 20, "{}", node.nic.debug_dump());
    }
}
