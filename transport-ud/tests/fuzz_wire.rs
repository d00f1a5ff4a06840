//! Property tests of what rdmx-ud decodes from the network: any bytes given to the datagram
//! parsers, and anything that parses given to a session or a multicast member, end in an
//! error value or a counted drop, never a panic; well-formed headers round-trip.
#![expect(clippy::unwrap_used, reason = "test")]

use std::time::{Duration, Instant};

use proptest::prelude::*;
use rdmx_ud::mcast::wire as mwire;
use rdmx_ud::mcast::{McastConfig, Member};
use rdmx_ud::wire::Header;
use rdmx_ud::{Seq, Session, SessionConfig};

fn session(now: Instant) -> Session {
    let cfg = SessionConfig {
        max_datagram: 512,
        max_message: 10_000,
        recv_window: 8,
        ..SessionConfig::default()
    };
    Session::new(cfg, 7, (1, 9), (Seq(100), Seq(200)), (8, 8), now)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn session_datagrams_never_panic(datagrams in prop::collection::vec(
        prop::collection::vec(any::<u8>(), 0..600), 1..20)
    ) {
        let now = Instant::now();
        let mut s = session(now);
        let mut out = vec![0u8; 512];
        for (i, d) in datagrams.iter().enumerate() {
            // Raw bytes, then the same with a header that names this session (so that the
            // session itself sees the rest of the bytes).
            let mut named = d.clone();
            if named.len() >= 12 {
                named[0] = 2;
                named[4..8].copy_from_slice(&0u32.to_be_bytes());
                named[8..12].copy_from_slice(&7u32.to_be_bytes());
            }
            for b in [d, &named] {
                if let Ok((h, p)) = Header::parse(b) {
                    s.handle_datagram(now + Duration::from_micros(i as u64), &h, p);
                }
            }
            while s.poll_transmit(now, &mut out).is_some() {}
            while s.recv().is_some() {}
        }
    }

    #[test]
    fn multicast_datagrams_never_panic(datagrams in prop::collection::vec(
        prop::collection::vec(any::<u8>(), 0..600), 1..20)
    ) {
        let now = Instant::now();
        let cfg = McastConfig {
            group: 5,
            max_datagram: 512,
            max_message: 10_000,
            window: 16,
            ..McastConfig::default()
        };
        let mut m = Member::new(cfg, 1, 1, Seq(0), now);
        let mut out = vec![0u8; 512];
        for (i, d) in datagrams.iter().enumerate() {
            let mut named = d.clone();
            if named.len() >= 32 {
                named[0] = mwire::VERSION;
                named[3] = 0;
                named[4..8].copy_from_slice(&5u32.to_be_bytes());
                named[30] = 0;
                named[31] = 0;
            }
            for b in [d, &named] {
                if let Ok((h, p)) = mwire::Header::parse(b) {
                    m.handle_datagram(now + Duration::from_micros(i as u64), &h, p);
                }
            }
            m.handle_timeout(now + Duration::from_millis(i as u64));
            while m.poll_transmit(now, &mut out).is_some() {}
            while m.recv().is_some() {}
            while m.poll_event().is_some() {}
        }
    }

    #[test]
    fn multicast_headers_round_trip(
        kind in 0usize..7, flags in 0u8..16, group in any::<u32>(), source in any::<u32>(),
        stream in any::<u32>(), seq in any::<u32>(), aux in any::<u32>(), epoch in any::<u32>(),
        payload in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        use mwire::Kind::*;
        let kind = [Data, Heartbeat, Status, Nak, Removed, Leave, Join][kind];
        let (flags, payload) = if kind == Data { (flags, payload) } else { (0, Vec::new()) };
        let h = mwire::Header {
            kind, flags, group, source, stream, seq: Seq(seq), aux, epoch,
            len: payload.len() as u16,
        };
        let mut b = vec![0u8; mwire::HEADER_LEN + payload.len()];
        h.write(&mut b);
        b[mwire::HEADER_LEN..].copy_from_slice(&payload);
        let (back, p) = mwire::Header::parse(&b).unwrap();
        prop_assert_eq!(back, h);
        prop_assert_eq!(p, &payload[..]);
    }
}
