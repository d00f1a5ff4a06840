//! `wire`: the RoCEv2 packet parsers of the soft NIC (`rdmx_verbs::soft::wire`):
//! `PacketHeaders::parse`, each extension header's view and `*Repr::parse` at the start of
//! the input, the ICRC check, and `finish_packet`. A packet that parses emits and parses
//! back to the same headers and payload.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use rdmx_verbs::soft::wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, IcrcPath, Opcode, PacketHeaders,
    ROCE_UDP_PORT, RethRepr, XrcEthRepr, aeth, atomic, bth, deth, finish_packet, icrc, imm, reth,
    xrceth,
};

use super::{FnRunner, Runner, Target, nic, numbered};

pub(crate) const TARGET: Target = Target {
    name: "wire",
    about: "soft NIC RoCEv2 headers: PacketHeaders::parse, per-header parsers, ICRC",
    max_alloc: 16 * 1024,
    max_total: 64 * 1024,
    max_len: 4200,
    framed: false,
    seeds,
    runner,
};

fn runner() -> Box<dyn Runner> {
    Box::new(FnRunner(run))
}

fn path() -> IcrcPath {
    IcrcPath::new(
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), ROCE_UDP_PORT),
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), ROCE_UDP_PORT),
    )
}

/// A buffer for emitted headers (the longest header set is far shorter).
const SCRATCH: usize = 128;

fn run(input: &[u8]) {
    whole(input);
    headers(input);
    let p = path();
    let valid = icrc::verify(&p, input);
    if let Some(body) = input.len().checked_sub(icrc::ICRC_LEN) {
        let crc = icrc::compute(&p, &input[..body]);
        assert_eq!(valid, icrc::received(input) == Some(crc));
    } else {
        assert!(!valid && icrc::received(input).is_none());
    }
    // Finishing the input as a packet pads it and appends a valid ICRC.
    let mut buf = input.to_vec();
    buf.resize(input.len() + 3 + icrc::ICRC_LEN, 0);
    if let Ok(total) = finish_packet(&mut buf, input.len(), &p) {
        assert!(icrc::verify(&p, &buf[..total]));
        assert_eq!(total % 4, 0);
    }
}

/// The whole packet: parse, emit, parse again.
fn whole(input: &[u8]) {
    let Ok((h, payload)) = PacketHeaders::parse(input) else {
        return;
    };
    let _ = h.to_string();
    let n = h.header_len();
    let pad = usize::from(h.bth.pad_count);
    assert!(n + payload.len() + pad + icrc::ICRC_LEN <= input.len());
    let mut again = vec![0u8; n + payload.len() + pad + icrc::ICRC_LEN];
    assert_eq!(h.emit(&mut again), Ok(n), "parsed headers emit");
    again[n..n + payload.len()].copy_from_slice(payload);
    let (h2, p2) = PacketHeaders::parse(&again).expect("emitted headers parse");
    assert_eq!(h2, h, "headers round trip");
    assert_eq!(p2, payload, "payload round trip");
    assert!(h.packet_len(payload.len()) >= n + payload.len() + icrc::ICRC_LEN);
}

/// Each header's view (every getter, before and after `check_len`) and parser at the start
/// of `input`; what parses emits and parses back.
fn headers(input: &[u8]) {
    let v = bth::Packet::new_unchecked(input);
    let _ = (
        v.opcode(),
        v.solicited(),
        v.mig_req(),
        v.pad_count(),
        v.tver(),
        v.pkey(),
        v.fecn(),
        v.becn(),
        v.dest_qp(),
        v.ack_req(),
        v.psn(),
        v.payload().len(),
    );
    let _ = v.opcode().headers().map(|s| s.len());
    let _ = (
        v.opcode().name(),
        v.opcode().is_response(),
        v.opcode().carries_payload(),
    );
    let mut out = [0u8; SCRATCH];
    if let Ok(r) = BthRepr::parse(&v) {
        r.emit(&mut bth::Packet::new_unchecked(&mut out[..]));
        assert_eq!(BthRepr::parse(&bth::Packet::new_unchecked(&out[..])), Ok(r));
        let _ = r.to_string();
    }
    let v = deth::Packet::new_unchecked(input);
    let _ = (v.qkey(), v.src_qp());
    if let Ok(r) = DethRepr::parse(&v) {
        r.emit(&mut deth::Packet::new_unchecked(&mut out[..]));
        assert_eq!(
            DethRepr::parse(&deth::Packet::new_unchecked(&out[..])),
            Ok(r)
        );
    }
    let v = reth::Packet::new_unchecked(input);
    let _ = (v.va(), v.rkey(), v.dma_len());
    if let Ok(r) = RethRepr::parse(&v) {
        r.emit(&mut reth::Packet::new_unchecked(&mut out[..]));
        assert_eq!(
            RethRepr::parse(&reth::Packet::new_unchecked(&out[..])),
            Ok(r)
        );
    }
    let v = aeth::Packet::new_unchecked(input);
    let _ = (v.syndrome(), v.msn());
    if let Ok(r) = AethRepr::parse(&v) {
        let _ = r.kind();
        r.emit(&mut aeth::Packet::new_unchecked(&mut out[..]));
        assert_eq!(
            AethRepr::parse(&aeth::Packet::new_unchecked(&out[..])),
            Ok(r)
        );
        let _ = (
            aeth::rnr_timer_ns(r.syndrome & 0x1F),
            aeth::ack_credits(r.syndrome & 0x1F),
        );
    }
    let v = atomic::eth::Packet::new_unchecked(input);
    let _ = (v.va(), v.rkey(), v.swap_add(), v.compare());
    if let Ok(r) = AtomicEthRepr::parse(&v) {
        r.emit(&mut atomic::eth::Packet::new_unchecked(&mut out[..]));
        assert_eq!(
            AtomicEthRepr::parse(&atomic::eth::Packet::new_unchecked(&out[..])),
            Ok(r)
        );
    }
    let v = atomic::ack::Packet::new_unchecked(input);
    let _ = v.orig();
    if let Ok(r) = AtomicAckEthRepr::parse(&v) {
        r.emit(&mut atomic::ack::Packet::new_unchecked(&mut out[..]));
        assert_eq!(
            AtomicAckEthRepr::parse(&atomic::ack::Packet::new_unchecked(&out[..])),
            Ok(r)
        );
    }
    let v = xrceth::Packet::new_unchecked(input);
    let _ = v.srqn();
    if let Ok(r) = XrcEthRepr::parse(&v) {
        r.emit(&mut xrceth::Packet::new_unchecked(&mut out[..]));
        assert_eq!(
            XrcEthRepr::parse(&xrceth::Packet::new_unchecked(&out[..])),
            Ok(r)
        );
    }
    let v = imm::Packet::new_unchecked(input);
    let _ = v.value();
    if let Ok(x) = imm::parse(&v) {
        imm::emit(x, &mut imm::Packet::new_unchecked(&mut out[..]));
        assert_eq!(imm::parse(&imm::Packet::new_unchecked(&out[..])), Ok(x));
    }
}

/// A packet of every supported opcode, made with the encoders, and the packets of a real
/// exchange between two NICs.
fn seeds() -> Vec<(String, Vec<u8>)> {
    let p = path();
    let mut out = Vec::new();
    for op in 0..=u8::MAX {
        let opcode = Opcode(op);
        if opcode.headers().is_none() {
            continue;
        }
        let mut h = PacketHeaders::new(BthRepr {
            opcode,
            solicited: false,
            mig_req: true,
            pad_count: 0,
            pkey: 0xFFFF,
            fecn: false,
            becn: false,
            dest_qp: 0x12_3456,
            ack_req: true,
            psn: 0x00FF_FFFE,
        });
        h.deth = Some(DethRepr {
            qkey: 0x1111_0000,
            src_qp: 0x42,
        });
        h.xrceth = Some(XrcEthRepr { srqn: 0x77 });
        h.reth = Some(RethRepr {
            va: 0x7f00_0000_1000,
            rkey: 0xABCD_0001,
            dma_len: 700,
        });
        h.atomic_eth = Some(AtomicEthRepr {
            va: 0x7f00_0000_2000,
            rkey: 0xABCD_0002,
            swap_add: 9,
            compare: 5,
        });
        h.aeth = Some(AethRepr::ack(3));
        h.atomic_ack_eth = Some(AtomicAckEthRepr { orig: 5 });
        h.immdt = Some(0xDEAD_BEEF);
        h.ieth = Some(0xABCD_0001);
        let mut buf = vec![0u8; 256];
        let Ok(n) = h.emit(&mut buf) else {
            continue;
        };
        let payload = if opcode.carries_payload() { 5 } else { 0 };
        buf[n..n + payload].copy_from_slice(&b"hello"[..payload]);
        if let Ok(total) = finish_packet(&mut buf, n + payload, &p) {
            buf.truncate(total);
            out.push(buf);
        }
    }
    let mut all = numbered("opcode", out);
    all.extend(numbered("exchange", nic::recorded_packets()));
    all
}
