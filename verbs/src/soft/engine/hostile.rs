//! Hostile input: random, truncated and mutated datagrams never panic the engine, and are
//! counted as drops.

use proptest::prelude::*;

use super::sim::{LinkCfg, Sim, connect, sge};
use crate::types::{Mtu, SendFlags};
use crate::wr::{SendWr, WrOpcode};

/// A few valid packets from a real exchange, to mutate.
fn sample_packets() -> (Sim, Vec<Vec<u8>>) {
    let mut sim = Sim::new(77, LinkCfg::clean());
    let [a, b] = connect(&mut sim, Mtu::Mtu256, 8192, [1, 2]);
    let s = [sge(&a, 0, 600)];
    let w = WrOpcode::RdmaWrite {
        remote_addr: b.mr.addr(),
        rkey: crate::types::Rkey(b.key),
    };
    sim.nics[0]
        .post_send(
            sim.now,
            a.qpn,
            &SendWr::new(1, w, &s).flags(SendFlags::SIGNALED),
        )
        .unwrap();
    let r = WrOpcode::RdmaRead {
        remote_addr: b.mr.addr(),
        rkey: crate::types::Rkey(b.key),
    };
    sim.nics[0]
        .post_send(
            sim.now,
            a.qpn,
            &SendWr::new(2, r, &s).flags(SendFlags::SIGNALED),
        )
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let mut pkts = Vec::new();
    while let Some(t) = sim.nics[0].poll_transmit(sim.now, &mut buf) {
        pkts.push(buf[..t.len].to_vec());
    }
    (sim, pkts)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_datagrams_never_panic(data in proptest::collection::vec(any::<u8>(), 0..300)) {
        let (mut sim, _) = sample_packets();
        let src = sim.addrs[0];
        let dst = sim.addrs[1].ip();
        sim.nics[1].handle_datagram(sim.now, 0, src, dst, &data);
        let c = sim.nics[1].counters();
        prop_assert_eq!(c.rx_packets, 1);
        prop_assert_eq!(c.rx_bad_icrc + c.rx_malformed + c.rx_no_qp, 1);
    }

    #[test]
    fn mutated_packets_with_icrc_off_never_panic(
        which in 0usize..8,
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        cut in any::<usize>(),
    ) {
        let (mut sim, pkts) = sample_packets();
        // Skip the ICRC so the mutations reach the transport logic.
        sim.nics[1].set_verify_icrc(false);
        let mut p = pkts[which % pkts.len()].clone();
        for (pos, v) in flips {
            let i = pos % p.len();
            p[i] ^= v;
        }
        p.truncate(cut % (p.len() + 1));
        let src = sim.addrs[0];
        let dst = sim.addrs[1].ip();
        sim.nics[1].handle_datagram(sim.now, 0, src, dst, &p);
        // Run whatever it triggered to completion.
        for _ in 0..1000 {
            if !sim.step() {
                break;
            }
        }
    }
}
