//! The global route header a UD receive starts with (spec §6): its layout, and reading and
//! building one. Vocabulary the soft engine and the public objects share.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Length of the GRH at the start of every UD receive buffer.
pub const GRH_LEN: usize = 40;

/// The source address in a GRH: an IPv4 header at offset 20 (bytes 0-19 zero), or an IPv6
/// header at offset 0 (spec §6).
pub fn grh_source(grh: &[u8]) -> Option<IpAddr> {
    let g = grh.get(..GRH_LEN)?;
    if g[20] == 0x45 && g[..20].iter().all(|&b| b == 0) {
        let a: [u8; 4] = g[32..36].try_into().ok()?;
        return Some(IpAddr::V4(Ipv4Addr::from(a)));
    }
    if g[0] >> 4 == 6 {
        let a: [u8; 16] = g[8..24].try_into().ok()?;
        return Some(IpAddr::V6(Ipv6Addr::from(a)));
    }
    None
}

/// The destination address in a GRH.
pub fn grh_destination(grh: &[u8]) -> Option<IpAddr> {
    let g = grh.get(..GRH_LEN)?;
    if g[20] == 0x45 && g[..20].iter().all(|&b| b == 0) {
        let a: [u8; 4] = g[36..40].try_into().ok()?;
        return Some(IpAddr::V4(Ipv4Addr::from(a)));
    }
    if g[0] >> 4 == 6 {
        let a: [u8; 16] = g[24..40].try_into().ok()?;
        return Some(IpAddr::V6(Ipv6Addr::from(a)));
    }
    None
}

/// Writes the GRH of a received UD packet into `out` (spec §6: for IPv4, 20 zero bytes and
/// then the IPv4 header; for IPv6, the IPv6 header).
pub(crate) fn build_grh(src: IpAddr, dst: IpAddr, udp_payload_len: usize, out: &mut [u8; GRH_LEN]) {
    out.fill(0);
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let h = &mut out[20..40];
            let total = (20 + 8 + udp_payload_len).min(0xFFFF) as u16;
            h[0] = 0x45;
            h[2..4].copy_from_slice(&total.to_be_bytes());
            h[6] = 0x40; // DF
            h[8] = 64;
            h[9] = 17;
            h[12..16].copy_from_slice(&s.octets());
            h[16..20].copy_from_slice(&d.octets());
            let mut sum: u32 = 0;
            for c in h.chunks(2) {
                sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
            }
            while sum >> 16 != 0 {
                sum = (sum & 0xFFFF) + (sum >> 16);
            }
            h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        }
        (s, d) => {
            let to6 = |a: IpAddr| match a {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            out[0] = 0x60;
            let plen = (8 + udp_payload_len).min(0xFFFF) as u16;
            out[4..6].copy_from_slice(&plen.to_be_bytes());
            out[6] = 17;
            out[7] = 64;
            out[8..24].copy_from_slice(&to6(s).octets());
            out[24..40].copy_from_slice(&to6(d).octets());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grh_round_trip() {
        let mut g = [0u8; GRH_LEN];
        let (s, d) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        build_grh(s, d, 100, &mut g);
        assert_eq!(grh_source(&g), Some(s));
        assert_eq!(grh_destination(&g), Some(d));
        assert_eq!(&g[22..24], &(128u16).to_be_bytes());
        let (s6, d6): (IpAddr, IpAddr) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        build_grh(s6, d6, 100, &mut g);
        assert_eq!(grh_source(&g), Some(s6));
        assert_eq!(grh_destination(&g), Some(d6));
        assert_eq!(grh_source(&[0u8; 10]), None);
    }
}
