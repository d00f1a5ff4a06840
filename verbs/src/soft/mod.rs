//! The soft provider: a userspace RDMA NIC that carries RoCEv2-framed InfiniBand transport
//! packets over UDP.
//!
//! * [`wire`]: header views and the ICRC (pure);
//! * [`engine`]: the sans-I/O transport (requester, responder, completer per QP);
//! * [`fault`]: seeded fault injection (pure);
//! * `driver`: sockets, clock, engine thread, capture; or, for a device opened on a
//!   [`SimNet`], a simulated network on a virtual clock.
//!
//! Device names: `soft:<ip>[:<udp-port>]`, several addresses separated by `,` for a device
//! with several ports (`soft:127.0.0.1,127.0.0.2`). Port 0 or no port means an ephemeral UDP
//! port; 4791 is the RoCEv2 port for interoperating with kernel rxe or NICs.

pub mod engine;
pub mod fault;
pub mod wire;

pub(crate) mod driver;
mod provider;
pub(crate) mod xrcd;

pub use driver::simnet::{SimLink, SimNet, SimStats};

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use crate::error::VerbsError;

/// Prefix of soft device names.
pub const PREFIX: &str = "soft:";

/// The default soft device: loopback, ephemeral port.
pub const DEFAULT_DEVICE: &str = "soft:127.0.0.1";

/// Parses a soft device name into its port addresses.
pub fn parse_name(name: &str) -> Result<Vec<SocketAddr>, VerbsError> {
    let bad = |reason: &str| VerbsError::InvalidDeviceName {
        name: name.to_string(),
        reason: reason.to_string(),
    };
    let rest = name
        .strip_prefix(PREFIX)
        .ok_or_else(|| bad("soft device names start with soft:"))?;
    if rest.is_empty() {
        return Ok(vec![SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)]);
    }
    let mut out = Vec::new();
    for part in rest.split(',') {
        let part = part.trim();
        let addr = if let Ok(sa) = part.parse::<SocketAddr>() {
            sa
        } else if let Ok(ip) = part
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            SocketAddr::new(ip, 0)
        } else {
            return Err(bad(&format!("{part:?} is not an IP address or IP:port")));
        };
        if addr.ip().is_multicast() || addr.ip().is_unspecified() {
            return Err(bad("a port address must be a unicast local address"));
        }
        out.push(addr);
    }
    if out.len() > 8 {
        return Err(bad("at most 8 ports"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_loopback_port_reports_the_loopback_mtu() {
        // 127.0.0.2 has no interface address of its own; it is on `lo` (127.0.0.1/8), and
        // reports what 127.0.0.1 does (it reported the 1024 fallback).
        let one = crate::Device::open("soft:127.0.0.1,127.0.0.2").unwrap();
        let (a, b) = (one.query_port(1).unwrap(), one.query_port(2).unwrap());
        assert_eq!(a.active_mtu, b.active_mtu);
    }

    #[test]
    fn names() {
        assert_eq!(parse_name("soft:127.0.0.1").unwrap()[0].port(), 0);
        assert_eq!(parse_name("soft:127.0.0.1:4791").unwrap()[0].port(), 4791);
        assert_eq!(parse_name("soft:127.0.0.1,127.0.0.2").unwrap().len(), 2);
        assert_eq!(parse_name("soft:[::1]:5000").unwrap()[0].port(), 5000);
        assert!(parse_name("soft:nonsense").is_err());
        assert!(parse_name("mlx5_0").is_err());
        assert!(parse_name("soft:239.1.1.1").is_err());
    }
}
