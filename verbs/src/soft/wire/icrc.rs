//! Invariant CRC (ICRC), the 4 bytes that end every RoCEv2 UDP payload (spec `roce-wire.md`
//! §4).
//!
//! CRC-32 (the Ethernet/zlib one) over, in order:
//!
//! 1. 8 bytes of 0xFF standing in for the LRH that RoCEv2 does not carry;
//! 2. the IP header as sent, with the variant fields set to all ones: IPv4 TOS, TTL and header
//!    checksum; IPv6 traffic class, flow label and hop limit;
//! 3. the UDP header with the checksum set to all ones;
//! 4. the BTH with byte 4 (FECN, BECN, reserved) set to all ones;
//! 5. the rest of the packet (extension headers, payload, pad).
//!
//! The 32-bit result is stored least significant byte first (spec §4.2, §11.1). IP and UDP
//! lengths are the final on-wire ones, including the ICRC.
//!
//! We do not see the IP header our datagrams go out with, so [`compute`] rebuilds it the way
//! our sender produces it (spec §1.7): IPv4 with IHL 5, identification 0 and flags DF
//! (unconnected socket with `IP_PMTUDISC_DO`), or IPv6 without extension headers.
//! [`compute_with_ipv4_id`] takes another identification/flags word for foreign frames.
//!
//! The pseudo-headers are built in stack arrays: no allocation, one CRC pass.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crc32fast::Hasher;

use super::bth;

/// Length of the ICRC in bytes.
pub const ICRC_LEN: usize = 4;

/// IPv4 flags/fragment-offset word of our datagrams: DF set, offset 0 (spec §1.3).
pub const IPV4_FLAGS_DF: u16 = 0x4000;

/// CRC-32 state after the 8 bytes of 0xFF that replace the LRH: `crc32(ff ff ff ff ff ff ff
/// ff)`. (rxe seeds its CRC with the equivalent raw register value 0xDEBB20E3.)
const LRH_CRC: u32 = 0x2144_DF1C;

/// IP protocol number of UDP.
const IPPROTO_UDP: u8 = 17;

/// Index of the masked byte (FECN, BECN, reserved) in the BTH.
const BTH_MASKED_BYTE: usize = 4;

/// The addresses the ICRC covers: IP source/destination and UDP ports.
///
/// The packet is taken to be IPv4 if both addresses are IPv4 (or IPv4-mapped IPv6,
/// `::ffff:a.b.c.d`, as RoCEv2 GIDs of IPv4 addresses are); otherwise it is IPv6 and an IPv4
/// address is used in its IPv4-mapped form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcrcPath {
    /// Source IP address and UDP port.
    pub src: SocketAddr,
    /// Destination IP address and UDP port.
    pub dst: SocketAddr,
}

impl IcrcPath {
    /// A path from `src` to `dst`.
    pub const fn new(src: SocketAddr, dst: SocketAddr) -> Self {
        Self { src, dst }
    }

    /// The IPv4 source and destination addresses, if the path is IPv4.
    pub fn ipv4(&self) -> Option<(Ipv4Addr, Ipv4Addr)> {
        match (as_ipv4(self.src.ip()), as_ipv4(self.dst.ip())) {
            (Some(src), Some(dst)) => Some((src, dst)),
            _ => None,
        }
    }
}

fn as_ipv4(ip: IpAddr) -> Option<Ipv4Addr> {
    match ip {
        IpAddr::V4(ip) => Some(ip),
        IpAddr::V6(ip) => ip.to_ipv4_mapped(),
    }
}

fn as_ipv6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(ip) => ip.to_ipv6_mapped(),
        IpAddr::V6(ip) => ip,
    }
}

/// Computes the ICRC of a packet as our sender puts it on the wire (IPv4 identification 0,
/// DF set). `packet_without_icrc` is the UDP payload from the BTH up to and including the pad.
pub fn compute(path: &IcrcPath, packet_without_icrc: &[u8]) -> u32 {
    compute_with_ipv4_id(path, 0, IPV4_FLAGS_DF, packet_without_icrc)
}

/// Like [`compute`] but with an explicit IPv4 identification and flags/fragment-offset word,
/// to check frames from other senders (kernel rxe, NICs), whose identification varies. Both
/// values are ignored on an IPv6 path.
pub fn compute_with_ipv4_id(
    path: &IcrcPath,
    ip_id: u16,
    ip_flags_frag: u16,
    packet_without_icrc: &[u8],
) -> u32 {
    // Lengths as on the wire; an impossible (> 64 KiB) packet simply wraps, it cannot verify.
    let udp_len = packet_without_icrc.len().wrapping_add(8 + ICRC_LEN) as u16;
    // The BTH, masked; a packet shorter than a BTH (never valid) is hashed as far as it goes.
    let mut bth = [0_u8; bth::HEADER_LEN];
    let (bth_len, rest) = match packet_without_icrc.split_first_chunk::<{ bth::HEADER_LEN }>() {
        Some((head, rest)) => {
            bth = *head;
            (bth::HEADER_LEN, rest)
        }
        None => {
            if let Some(dst) = bth.get_mut(..packet_without_icrc.len()) {
                dst.copy_from_slice(packet_without_icrc);
            }
            (packet_without_icrc.len(), &[][..])
        }
    };
    if bth_len > BTH_MASKED_BYTE {
        bth[BTH_MASKED_BYTE] = 0xFF;
    }

    let mut hasher = Hasher::new_with_initial(LRH_CRC);
    match path.ipv4() {
        Some((src, dst)) => {
            const IP_UDP_LEN: usize = 20 + 8;
            let mut head = [0_u8; IP_UDP_LEN + bth::HEADER_LEN];
            head[..20].copy_from_slice(&ipv4_header(src, dst, udp_len, ip_id, ip_flags_frag));
            head[20..IP_UDP_LEN].copy_from_slice(&udp_header(path, udp_len));
            head[IP_UDP_LEN..].copy_from_slice(&bth);
            hasher.update(head.get(..IP_UDP_LEN + bth_len).unwrap_or(&head));
        }
        None => {
            const IP_UDP_LEN: usize = 40 + 8;
            let mut head = [0_u8; IP_UDP_LEN + bth::HEADER_LEN];
            head[..40].copy_from_slice(&ipv6_header(
                as_ipv6(path.src.ip()),
                as_ipv6(path.dst.ip()),
                udp_len,
            ));
            head[40..IP_UDP_LEN].copy_from_slice(&udp_header(path, udp_len));
            head[IP_UDP_LEN..].copy_from_slice(&bth);
            hasher.update(head.get(..IP_UDP_LEN + bth_len).unwrap_or(&head));
        }
    }
    hasher.update(rest);
    hasher.finalize()
}

/// The IPv4 header with the variant fields (TOS, TTL, checksum) masked to all ones.
fn ipv4_header(src: Ipv4Addr, dst: Ipv4Addr, udp_len: u16, id: u16, flags_frag: u16) -> [u8; 20] {
    // Starts all ones: TOS (byte 1), TTL (byte 8) and checksum (bytes 10-11) stay masked.
    let mut header = [0xFF_u8; 20];
    header[0] = 0x45; // version 4, IHL 5
    header[2..4].copy_from_slice(&udp_len.wrapping_add(20).to_be_bytes());
    header[4..6].copy_from_slice(&id.to_be_bytes());
    header[6..8].copy_from_slice(&flags_frag.to_be_bytes());
    header[9] = IPPROTO_UDP;
    header[12..16].copy_from_slice(&src.octets());
    header[16..].copy_from_slice(&dst.octets());
    header
}

/// The IPv6 header with traffic class, flow label and hop limit masked to all ones.
fn ipv6_header(src: Ipv6Addr, dst: Ipv6Addr, udp_len: u16) -> [u8; 40] {
    // Starts all ones: traffic class + flow label (low nibble of byte 0, bytes 1-3) and hop
    // limit (byte 7) stay masked.
    let mut header = [0xFF_u8; 40];
    header[0] = 0x6F; // version 6, traffic class high nibble masked
    header[4..6].copy_from_slice(&udp_len.to_be_bytes());
    header[6] = IPPROTO_UDP;
    header[8..24].copy_from_slice(&src.octets());
    header[24..].copy_from_slice(&dst.octets());
    header
}

/// The UDP header with the checksum masked to all ones.
fn udp_header(path: &IcrcPath, udp_len: u16) -> [u8; 8] {
    let [s0, s1] = path.src.port().to_be_bytes();
    let [d0, d1] = path.dst.port().to_be_bytes();
    let [l0, l1] = udp_len.to_be_bytes();
    [s0, s1, d0, d1, l0, l1, 0xFF, 0xFF]
}

/// The ICRC carried in the last 4 bytes of a UDP payload, or `None` if it is shorter.
pub fn received(udp_payload: &[u8]) -> Option<u32> {
    udp_payload
        .split_last_chunk::<ICRC_LEN>()
        .map(|(_, icrc)| u32::from_le_bytes(*icrc))
}

/// Checks the ICRC at the end of a UDP payload against [`compute`] (IPv4 identification 0 and
/// DF, i.e. our own senders; spec §1.7). Returns false for a payload shorter than the ICRC.
///
/// Under `cfg(fuzzing)` this always returns true, so that fuzzers reach the code behind it.
#[allow(unexpected_cfgs, reason = "cargo-fuzz sets cfg(fuzzing)")]
pub fn verify(path: &IcrcPath, udp_payload: &[u8]) -> bool {
    if cfg!(fuzzing) {
        return true;
    }
    match udp_payload.split_last_chunk::<ICRC_LEN>() {
        Some((packet, icrc)) => compute(path, packet) == u32::from_le_bytes(*icrc),
        None => false,
    }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
mod tests {
    use proptest::prelude::*;

    use super::super::testdata::arb_path;
    use super::*;

    /// The ConnectX-4 Lx CNP frame of spec §4.2 (Ethernet + IPv4 + UDP + BTH + 16 + ICRC).
    const CNP_FRAME: [u8; 74] = [
        0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2, 0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32, 0x08, 0x00, 0x45,
        0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0a, 0x00, 0x11, 0x01,
        0x0a, 0x00, 0x12, 0x01, 0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00, 0x81, 0x00, 0xff,
        0xff, 0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x82, 0xfd, 0x00, 0x2a,
    ];

    /// Straightforward reference: builds the whole masked byte string (spec §4.1) in a Vec,
    /// following `roce_pcap.py`.
    fn reference(path: &IcrcPath, id: u16, flags: u16, packet: &[u8]) -> u32 {
        let udp_len = (8 + packet.len() + 4) as u16;
        let mut bytes = vec![0xFF; 8];
        match path.ipv4() {
            Some((src, dst)) => {
                bytes.extend_from_slice(&[0x45, 0xFF]);
                bytes.extend_from_slice(&(udp_len + 20).to_be_bytes());
                bytes.extend_from_slice(&id.to_be_bytes());
                bytes.extend_from_slice(&flags.to_be_bytes());
                bytes.extend_from_slice(&[0xFF, 17, 0xFF, 0xFF]);
                bytes.extend_from_slice(&src.octets());
                bytes.extend_from_slice(&dst.octets());
            }
            None => {
                bytes.extend_from_slice(&[0x6F, 0xFF, 0xFF, 0xFF]);
                bytes.extend_from_slice(&udp_len.to_be_bytes());
                bytes.extend_from_slice(&[17, 0xFF]);
                bytes.extend_from_slice(&as_ipv6(path.src.ip()).octets());
                bytes.extend_from_slice(&as_ipv6(path.dst.ip()).octets());
            }
        }
        bytes.extend_from_slice(&path.src.port().to_be_bytes());
        bytes.extend_from_slice(&path.dst.port().to_be_bytes());
        bytes.extend_from_slice(&udp_len.to_be_bytes());
        bytes.extend_from_slice(&[0xFF, 0xFF]);
        let start = bytes.len();
        bytes.extend_from_slice(packet);
        if packet.len() > 4 {
            bytes[start + 4] = 0xFF;
        }
        crc32fast::hash(&bytes)
    }

    fn v4_path() -> IcrcPath {
        IcrcPath::new(
            "10.0.17.1:0".parse().unwrap(),
            "10.0.18.1:4791".parse().unwrap(),
        )
    }

    #[test]
    fn lrh_seed() {
        assert_eq!(crc32fast::hash(&[0xFF; 8]), LRH_CRC);
        // The raw CRC register after 8 bytes of 0xFF is the constant rxe seeds with.
        assert_eq!(!LRH_CRC, 0xDEBB_20E3);
    }

    #[test]
    fn connectx4_cnp_vector() {
        let udp_payload = &CNP_FRAME[42..];
        let (packet, _) = udp_payload.split_last_chunk::<4>().unwrap();
        let path = v4_path();
        assert_eq!(
            compute_with_ipv4_id(&path, 0x718C, IPV4_FLAGS_DF, packet),
            0x2A00_FD82
        );
        assert_eq!(received(udp_payload), Some(0x2A00_FD82));
        assert_eq!(reference(&path, 0x718C, IPV4_FLAGS_DF, packet), 0x2A00_FD82);
        // Our own senders use identification 0, so the plain check fails on this frame.
        assert!(!verify(&path, udp_payload));
        // BTH byte 4 (BECN here) is masked.
        let mut flipped = udp_payload.to_vec();
        flipped[4] ^= 0xC0;
        let (packet, _) = flipped.split_last_chunk::<4>().unwrap();
        assert_eq!(
            compute_with_ipv4_id(&path, 0x718C, IPV4_FLAGS_DF, packet),
            0x2A00_FD82
        );
    }

    #[test]
    fn ipv4_mapped_addresses_are_ipv4() {
        let v4 = v4_path();
        let mapped = IcrcPath::new(
            "[::ffff:10.0.17.1]:0".parse().unwrap(),
            "[::ffff:10.0.18.1]:4791".parse().unwrap(),
        );
        assert_eq!(mapped.ipv4(), v4.ipv4());
        let packet = [0x04, 0x40, 0xFF, 0xFF, 0, 0, 0, 0x11, 0x80, 0, 1, 0];
        assert_eq!(compute(&mapped, &packet), compute(&v4, &packet));
        let v6 = IcrcPath::new(
            "[fd00::1]:4791".parse().unwrap(),
            "[fd00::2]:4791".parse().unwrap(),
        );
        assert_eq!(v6.ipv4(), None);
        assert_ne!(compute(&v6, &packet), compute(&v4, &packet));
    }

    #[test]
    fn short_inputs_do_not_panic() {
        let path = v4_path();
        for len in 0..16 {
            let packet = vec![0xA5; len];
            assert_eq!(
                compute(&path, &packet),
                reference(&path, 0, IPV4_FLAGS_DF, &packet),
                "len {len}"
            );
            assert!(!verify(&path, &packet[..len.min(3)]));
        }
        assert_eq!(received(&[1, 2, 3]), None);
    }

    proptest! {
        #[test]
        fn matches_reference(
            path in arb_path(),
            id in any::<u16>(),
            flags in any::<u16>(),
            packet in prop::collection::vec(any::<u8>(), 0..300),
        ) {
            prop_assert_eq!(
                compute_with_ipv4_id(&path, id, flags, &packet),
                reference(&path, id, flags, &packet)
            );
            prop_assert_eq!(compute(&path, &packet), reference(&path, 0, IPV4_FLAGS_DF, &packet));
        }
    }
}
