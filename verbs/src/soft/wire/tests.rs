//! Whole-packet tests: the golden frames of `roce-samples.pcap`, parse/emit round trips,
//! robustness against arbitrary input, and ICRC bit-flip detection.

use proptest::prelude::*;

use super::icrc::{self, IPV4_FLAGS_DF, IcrcPath};
use super::testdata::{FRAMES, GoldenFrame, arb_path};
use super::*;

const MASK_24: u32 = bth::MASK_24;

/// A BTH with the defaults of `roce_pcap.py` (MigReq 1, P_Key 0xFFFF, nothing else set).
fn bth(opcode: Opcode, dest_qp: u32, psn: u32) -> BthRepr {
    BthRepr {
        opcode,
        solicited: false,
        mig_req: true,
        pad_count: 0,
        pkey: 0xFFFF,
        fecn: false,
        becn: false,
        dest_qp,
        ack_req: false,
        psn,
    }
}

/// RC request from QP 0x11's peer: AckReq set.
fn request(opcode: Opcode, psn: u32, pad_count: u8) -> BthRepr {
    BthRepr {
        ack_req: true,
        pad_count,
        ..bth(opcode, 0x11, psn)
    }
}

const WRITE_DATA: [u8; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

/// The headers and payload of golden frame `number`, per `roce_pcap.py` and the pcap README.
fn expected(number: usize) -> (PacketHeaders, &'static [u8]) {
    let xrc = |op: Opcode| op.with_transport(Transport::Xrc);
    match number {
        1 => (
            PacketHeaders::new(request(Opcode::RC_SEND_ONLY, 0x100, 2)),
            b"hello roce",
        ),
        2 => (
            PacketHeaders {
                bth: BthRepr {
                    solicited: true,
                    ..request(Opcode::RC_SEND_ONLY_WITH_IMMEDIATE, 0x101, 0)
                },
                immdt: Some(0xDEAD_BEEF),
                ..PacketHeaders::new(bth(Opcode::RC_SEND_FIRST, 0, 0))
            },
            b"imm!",
        ),
        3 => (
            PacketHeaders {
                reth: Some(RethRepr {
                    va: 0x7F00_1234_0000,
                    rkey: 0x1234,
                    dma_len: 16,
                }),
                immdt: Some(7),
                ..PacketHeaders::new(request(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, 0x102, 0))
            },
            &WRITE_DATA,
        ),
        4 => (
            PacketHeaders {
                reth: Some(RethRepr {
                    va: 0x7F00_1234_0000,
                    rkey: 0x1234,
                    dma_len: 8192,
                }),
                ..PacketHeaders::new(request(Opcode::RC_RDMA_READ_REQUEST, 0x103, 0))
            },
            b"",
        ),
        5 => (
            PacketHeaders {
                aeth: Some(AethRepr::ack(3)),
                ..PacketHeaders::new(bth(Opcode::RC_RDMA_READ_RESPONSE_ONLY, 0x22, 0x103))
            },
            b"READDATA",
        ),
        6 => (
            PacketHeaders {
                aeth: Some(AethRepr::ack_with_credit(8, 3)),
                ..PacketHeaders::new(bth(Opcode::RC_ACKNOWLEDGE, 0x22, 0x102))
            },
            b"",
        ),
        7 => (
            PacketHeaders {
                aeth: Some(AethRepr::rnr_nak(14, 3)),
                ..PacketHeaders::new(bth(Opcode::RC_ACKNOWLEDGE, 0x22, 0x104))
            },
            b"",
        ),
        8 => (
            PacketHeaders {
                aeth: Some(AethRepr::nak(NakCode::PsnSequence, 3)),
                ..PacketHeaders::new(bth(Opcode::RC_ACKNOWLEDGE, 0x22, 0x104))
            },
            b"",
        ),
        9 => (
            PacketHeaders {
                atomic_eth: Some(AtomicEthRepr {
                    va: 0x7F00_1234_0100,
                    rkey: 0x1234,
                    swap_add: 0x1111,
                    compare: 0x2222,
                }),
                ..PacketHeaders::new(request(Opcode::RC_COMPARE_SWAP, 0x105, 0))
            },
            b"",
        ),
        10 => (
            PacketHeaders {
                aeth: Some(AethRepr::ack(4)),
                atomic_ack_eth: Some(AtomicAckEthRepr { orig: 0x2222 }),
                ..PacketHeaders::new(bth(Opcode::RC_ATOMIC_ACKNOWLEDGE, 0x22, 0x105))
            },
            b"",
        ),
        11 => (
            PacketHeaders {
                ieth: Some(0x1234),
                ..PacketHeaders::new(request(Opcode::RC_SEND_ONLY_WITH_INVALIDATE, 0x106, 3))
            },
            b"inval",
        ),
        12 => (
            PacketHeaders {
                deth: Some(DethRepr {
                    qkey: 0x1111_1111,
                    src_qp: 0x33,
                }),
                immdt: Some(42),
                ..PacketHeaders::new(BthRepr {
                    pad_count: 3,
                    ..bth(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE, bth::MULTICAST_QPN, 1)
                })
            },
            b"mcast",
        ),
        13 => (
            PacketHeaders {
                xrceth: Some(XrcEthRepr { srqn: 0x77 }),
                ..PacketHeaders::new(BthRepr {
                    ack_req: true,
                    pad_count: 1,
                    ..bth(xrc(Opcode::RC_SEND_ONLY), 0x44, 0x10)
                })
            },
            b"to srq 0x77",
        ),
        14 => (
            PacketHeaders {
                xrceth: Some(XrcEthRepr { srqn: 0x77 }),
                reth: Some(RethRepr {
                    va: 0x1000,
                    rkey: 0x42,
                    dma_len: 4,
                }),
                ..PacketHeaders::new(BthRepr {
                    ack_req: true,
                    ..bth(xrc(Opcode::RC_RDMA_WRITE_ONLY), 0x44, 0x11)
                })
            },
            b"wxyz",
        ),
        15 => (
            PacketHeaders::new(request(Opcode::RC_SEND_ONLY, 0x107, 3)),
            b"over ipv6",
        ),
        16 => (
            PacketHeaders::new(BthRepr {
                mig_req: false,
                ..request(Opcode::RC_SEND_ONLY, 0x108, 0)
            }),
            b"bad icrc",
        ),
        17 => (
            PacketHeaders::new(BthRepr {
                mig_req: false,
                becn: true,
                ..bth(Opcode::CNP, 0x118, 0)
            }),
            b"",
        ),
        _ => panic!("no frame {number}"),
    }
}

fn path(frame: &GoldenFrame) -> IcrcPath {
    IcrcPath::new(frame.src, frame.dst)
}

/// Emits `headers` + `payload` and finishes the packet for `path`.
fn build(headers: &PacketHeaders, payload: &[u8], path: &IcrcPath) -> Vec<u8> {
    let mut buf = vec![0xEE; headers.packet_len(payload.len())];
    let header_len = headers.emit(&mut buf).unwrap();
    assert_eq!(header_len, headers.header_len());
    buf[header_len..header_len + payload.len()].copy_from_slice(payload);
    let total = finish_packet(&mut buf, header_len + payload.len(), path).unwrap();
    assert_eq!(total, buf.len());
    buf
}

#[test]
fn golden_frames_parse() {
    for frame in &FRAMES {
        let (headers, payload) = PacketHeaders::parse(frame.udp_payload)
            .unwrap_or_else(|e| panic!("frame {} ({}): {e}", frame.number, frame.what));
        let (want_headers, want_payload) = expected(frame.number);
        assert_eq!(
            headers, want_headers,
            "frame {} ({})",
            frame.number, frame.what
        );
        assert_eq!(
            payload, want_payload,
            "frame {} ({})",
            frame.number, frame.what
        );
        assert_eq!(headers.packet_len(payload.len()), frame.udp_payload.len());
    }
    // The README's summary, checked independently of `expected`.
    let opcodes: Vec<u8> = FRAMES.iter().map(|f| f.udp_payload[0]).collect();
    assert_eq!(
        opcodes,
        [
            0x04, 0x05, 0x0B, 0x0C, 0x10, 0x11, 0x11, 0x11, 0x13, 0x12, 0x17, 0x65, 0xA4, 0xAA,
            0x04, 0x04, 0x81
        ]
    );
}

#[test]
fn golden_frames_icrc() {
    for frame in &FRAMES {
        let path = path(frame);
        let (packet, _) = frame.udp_payload.split_last_chunk::<4>().unwrap();
        let computed = icrc::compute_with_ipv4_id(&path, frame.ip_id, IPV4_FLAGS_DF, packet);
        match frame.number {
            16 => {
                assert!(!icrc::verify(&path, frame.udp_payload));
                // Only the first ICRC byte was corrupted (xor 1).
                assert_eq!(
                    icrc::received(frame.udp_payload),
                    Some(computed ^ 1),
                    "frame 16"
                );
            }
            17 => {
                // Foreign sender: identification 0x718c, so only the explicit-ID check passes.
                assert_eq!(frame.ip_id, 0x718C);
                assert!(!icrc::verify(&path, frame.udp_payload));
                assert_eq!(computed, 0x2A00_FD82);
                assert_eq!(icrc::received(frame.udp_payload), Some(0x2A00_FD82));
            }
            number => {
                assert_eq!(frame.ip_id, 0);
                assert!(icrc::verify(&path, frame.udp_payload), "frame {number}");
                assert_eq!(icrc::received(frame.udp_payload), Some(computed));
            }
        }
    }
}

#[test]
fn golden_frames_re_emit() {
    for frame in &FRAMES {
        let (headers, payload) = PacketHeaders::parse(frame.udp_payload).unwrap();
        // Emit with a stale pad count: finish_packet must set it.
        let stale = PacketHeaders {
            bth: BthRepr {
                pad_count: 0,
                ..headers.bth
            },
            ..headers
        };
        let path = path(frame);
        let rebuilt = build(&stale, payload, &path);
        let len = frame.udp_payload.len();
        assert_eq!(rebuilt.len(), len, "frame {}", frame.number);
        match frame.number {
            16 => {
                assert_eq!(rebuilt[..len - 4], frame.udp_payload[..len - 4]);
                assert_eq!(rebuilt[len - 4], frame.udp_payload[len - 4] ^ 1);
                assert_eq!(rebuilt[len - 3..], frame.udp_payload[len - 3..]);
            }
            17 => {
                // Same headers; the ICRC differs because we assume identification 0.
                assert_eq!(rebuilt[..len - 4], frame.udp_payload[..len - 4]);
                assert!(icrc::verify(&path, &rebuilt));
            }
            number => assert_eq!(rebuilt, frame.udp_payload, "frame {number}"),
        }
    }
}

#[test]
fn display() {
    let (headers, _) = PacketHeaders::parse(FRAMES[2].udp_payload).unwrap();
    assert_eq!(
        headers.to_string(),
        "BTH RC RDMA_WRITE_ONLY_WITH_IMMEDIATE dqpn=0x000011 psn=258 pkey=0xffff m a \
         RETH va=0x7f0012340000 rkey=0x00001234 len=16 ImmDt=0x00000007"
    );
    let (headers, _) = PacketHeaders::parse(FRAMES[11].udp_payload).unwrap();
    assert_eq!(
        headers.to_string(),
        "BTH UD SEND_ONLY_WITH_IMMEDIATE dqpn=0xffffff psn=1 pkey=0xffff m pad=3 \
         DETH qkey=0x11111111 sqpn=0x000033 ImmDt=0x0000002a"
    );
    let (headers, _) = PacketHeaders::parse(FRAMES[16].udp_payload).unwrap();
    assert_eq!(
        headers.to_string(),
        "BTH CNP dqpn=0x000118 psn=0 pkey=0xffff becn"
    );
}

#[test]
fn parse_rejects_truncated() {
    assert_eq!(PacketHeaders::parse(&[]), Err(WireError::Truncated));
    let ack = FRAMES[5].udp_payload;
    // BTH + ICRC without the AETH.
    assert_eq!(PacketHeaders::parse(&ack[..16]), Err(WireError::Truncated));
    assert_eq!(PacketHeaders::parse(&ack[..15]), Err(WireError::Truncated));
    // RDMA WRITE ONLY WITH IMMEDIATE: BTH + RETH + 4 bytes is one ImmDt short of headers.
    let write = FRAMES[2].udp_payload;
    assert_eq!(
        PacketHeaders::parse(&write[..32]),
        Err(WireError::Truncated)
    );
    assert!(PacketHeaders::parse(&write[..36]).is_ok());
    // Every prefix of every frame either parses or is rejected, never panics.
    for frame in &FRAMES {
        for len in 0..frame.udp_payload.len() {
            let _ = PacketHeaders::parse(&frame.udp_payload[..len]);
        }
    }
}

#[test]
fn parse_rejects_bad_version_and_opcode() {
    let mut packet = FRAMES[0].udp_payload.to_vec();
    packet[1] |= 0x01;
    assert_eq!(PacketHeaders::parse(&packet), Err(WireError::BadVersion));
    for opcode in [0x15, 0x1C, 0x1D, 0x2C, 0x44, 0x60, 0x80, 0xB5, 0xC0, 0xFF] {
        let mut packet = FRAMES[0].udp_payload.to_vec();
        packet[0] = opcode;
        assert_eq!(
            PacketHeaders::parse(&packet),
            Err(WireError::UnknownOpcode(opcode))
        );
    }
}

#[test]
fn parse_rejects_bad_pad() {
    // Pad on an ACK (no payload).
    let mut packet = FRAMES[5].udp_payload.to_vec();
    packet[1] |= 0x10;
    assert_eq!(PacketHeaders::parse(&packet), Err(WireError::BadLength));
    // Pad on a CNP.
    let mut packet = FRAMES[16].udp_payload.to_vec();
    packet[1] |= 0x30;
    assert_eq!(PacketHeaders::parse(&packet), Err(WireError::BadLength));
    // Pad count larger than what follows the headers: READ RESPONSE with 2 bytes, pad 3.
    let (headers, _) = PacketHeaders::parse(FRAMES[4].udp_payload).unwrap();
    let mut buf = [0u8; 64];
    let len = headers.emit(&mut buf).unwrap();
    bth::Packet::new_unchecked(&mut buf[..]).set_pad_count(3);
    assert_eq!(
        PacketHeaders::parse(&buf[..len + 2 + 4]),
        Err(WireError::BadLength)
    );
    // Pad of 3 on a SEND_ONLY with exactly 3 bytes after the headers: empty payload.
    let mut packet = FRAMES[0].udp_payload[..12].to_vec();
    packet[1] = (packet[1] & !0x30) | 0x30;
    packet.extend_from_slice(&[0, 0, 0, 1, 2, 3, 4]);
    let (_, payload) = PacketHeaders::parse(&packet).unwrap();
    assert!(payload.is_empty());
}

#[test]
fn emit_errors_write_nothing() {
    let (headers, _) = PacketHeaders::parse(FRAMES[2].udp_payload).unwrap();
    assert_eq!(headers.header_len(), 32);
    let mut buf = [0xAAu8; 64];
    assert_eq!(headers.emit(&mut buf[..31]), Err(WireError::Truncated));
    let missing = PacketHeaders {
        immdt: None,
        ..headers
    };
    assert_eq!(missing.emit(&mut buf), Err(WireError::BadLength));
    let unsupported = PacketHeaders {
        bth: BthRepr {
            opcode: Opcode(0x40),
            ..headers.bth
        },
        ..headers
    };
    assert_eq!(
        unsupported.emit(&mut buf),
        Err(WireError::UnknownOpcode(0x40))
    );
    assert_eq!(unsupported.header_len(), 12);
    assert!(buf.iter().all(|&b| b == 0xAA));

    // Options the opcode does not use are ignored.
    let extra = PacketHeaders {
        deth: Some(DethRepr::default()),
        ieth: Some(5),
        ..headers
    };
    assert_eq!(extra.emit(&mut buf), Ok(32));
    assert_eq!(buf[..32], FRAMES[2].udp_payload[..32]);
}

#[test]
fn finish_packet_errors() {
    let path = path(&FRAMES[0]);
    let mut buf = [0u8; 32];
    assert_eq!(
        finish_packet(&mut buf, 11, &path),
        Err(WireError::BadLength)
    );
    assert_eq!(
        finish_packet(&mut buf, 33, &path),
        Err(WireError::Truncated)
    );
    // 27 bytes need 1 pad byte + 4 ICRC bytes = 32: fits; 28 + 0 + 4 = 32 fits; 29 does not.
    assert_eq!(finish_packet(&mut buf, 27, &path), Ok(32));
    assert_eq!(finish_packet(&mut buf, 28, &path), Ok(32));
    assert_eq!(
        finish_packet(&mut buf, 29, &path),
        Err(WireError::Truncated)
    );
    assert_eq!(
        finish_packet(&mut buf, usize::MAX, &path),
        Err(WireError::Truncated)
    );
}

/// Every opcode the provider supports.
fn supported_opcodes() -> Vec<Opcode> {
    (0..=255u8)
        .map(Opcode)
        .filter(|opcode| opcode.headers().is_some())
        .collect()
}

prop_compose! {
    fn arb_bth()(
        opcode in prop::sample::select(supported_opcodes()),
        flags in any::<[bool; 5]>(),
        pad_count in 0u8..4,
        pkey in any::<u16>(),
        dest_qp in 0..=MASK_24,
        psn in 0..=MASK_24,
    ) -> BthRepr {
        let [solicited, mig_req, fecn, becn, ack_req] = flags;
        BthRepr { opcode, solicited, mig_req, pad_count, pkey, fecn, becn, dest_qp, ack_req, psn }
    }
}

prop_compose! {
    fn arb_headers()(
        bth in arb_bth(),
        deth in (any::<u32>(), 0..=MASK_24),
        srqn in 0..=MASK_24,
        reth in any::<(u64, u32, u32)>(),
        atomic_eth in any::<(u64, u32, u64, u64)>(),
        aeth in (any::<u8>(), 0..=MASK_24),
        orig in any::<u64>(),
        words in any::<(u32, u32)>(),
    ) -> PacketHeaders {
        let set = bth.opcode.headers().unwrap_or_default();
        PacketHeaders {
            bth,
            deth: set.deth.then_some(DethRepr { qkey: deth.0, src_qp: deth.1 }),
            xrceth: set.xrceth.then_some(XrcEthRepr { srqn }),
            reth: set.reth.then_some(RethRepr { va: reth.0, rkey: reth.1, dma_len: reth.2 }),
            atomic_eth: set.atomic_eth.then_some(AtomicEthRepr {
                va: atomic_eth.0,
                rkey: atomic_eth.1,
                swap_add: atomic_eth.2,
                compare: atomic_eth.3,
            }),
            aeth: set.aeth.then_some(AethRepr { syndrome: aeth.0, msn: aeth.1 }),
            atomic_ack_eth: set.atomic_ack_eth.then_some(AtomicAckEthRepr { orig }),
            immdt: set.immdt.then_some(words.0),
            ieth: set.ieth.then_some(words.1),
        }
    }
}

prop_compose! {
    /// Headers, a payload (empty for opcodes without payload) and a path.
    fn arb_packet()(
        headers in arb_headers(),
        payload in prop::collection::vec(any::<u8>(), 0..80),
        path in arb_path(),
    ) -> (PacketHeaders, Vec<u8>, IcrcPath) {
        let payload = if headers.bth.opcode.carries_payload() { payload } else { Vec::new() };
        (headers, payload, path)
    }
}

/// Invariants of a successful parse.
fn check_parsed(input: &[u8], headers: &PacketHeaders, payload: &[u8]) {
    let pad = usize::from(headers.bth.pad_count);
    assert_eq!(headers.header_len() + payload.len() + pad + 4, input.len());
    let _ = headers.to_string();
}

proptest! {
    #[test]
    fn round_trip((headers, payload, path) in arb_packet()) {
        let packet = build(&headers, &payload, &path);
        prop_assert!(icrc::verify(&path, &packet));
        let (parsed, parsed_payload) = PacketHeaders::parse(&packet).unwrap();
        let pad_count = (payload.len().wrapping_neg() & 3) as u8;
        let want = PacketHeaders { bth: BthRepr { pad_count, ..headers.bth }, ..headers };
        prop_assert_eq!(parsed, want);
        prop_assert_eq!(parsed_payload, &payload[..]);
        // Re-emitting the parsed headers gives the same bytes.
        prop_assert_eq!(build(&parsed, parsed_payload, &path), packet);
    }

    #[test]
    fn parse_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Ok((headers, payload)) = PacketHeaders::parse(&bytes) {
            check_parsed(&bytes, &headers, payload);
        }
    }

    #[test]
    fn parse_arbitrary_bytes_with_valid_bth(
        opcode in prop::sample::select(supported_opcodes()),
        flags in 0u8..0x40,
        mut bytes in prop::collection::vec(any::<u8>(), 12..120),
    ) {
        bytes[0] = opcode.0;
        bytes[1] = (bytes[1] & 0xC0) | (flags & 0x30);
        if let Ok((headers, payload)) = PacketHeaders::parse(&bytes) {
            check_parsed(&bytes, &headers, payload);
        }
    }

    #[test]
    fn parse_mutated_packets(
        (headers, payload, path) in arb_packet(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut packet = build(&headers, &payload, &path);
        for (index, value) in edits {
            let at = index.index(packet.len());
            packet[at] = value;
        }
        let len = cut.index(packet.len() + 1);
        if let Ok((headers, payload)) = PacketHeaders::parse(&packet[..len]) {
            check_parsed(&packet[..len], &headers, payload);
        }
    }

    #[test]
    fn bit_flip_breaks_icrc(
        (headers, payload, path) in arb_packet(),
        index in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let mut packet = build(&headers, &payload, &path);
        let at = index.index(packet.len());
        packet[at] ^= 1 << bit;
        // BTH byte 4 (FECN, BECN, reserved) is the only masked byte of the UDP payload.
        prop_assert_eq!(icrc::verify(&path, &packet), at == 4);
    }

    #[test]
    fn other_path_breaks_icrc(
        (headers, payload, path) in arb_packet(),
        other in arb_path(),
    ) {
        prop_assume!(other != path);
        let packet = build(&headers, &payload, &path);
        prop_assert!(!icrc::verify(&other, &packet));
    }
}
