//! `tm_headers`: the tag-matching headers a message on a tag-matching SRQ starts with
//! (`rdmx_verbs::tm`): `Tmh::parse` and `Rvh::parse`, read as the soft NIC reads a message's
//! first packet (a TMH, and an RVH after a rendezvous TMH), each written back with
//! `to_bytes` and compared.

use rdmx_verbs::tm::{RVH_LEN, Rvh, TMH_LEN, Tmh, TmhOp};
use rdmx_verbs::types::Rkey;

use super::{FnRunner, Runner, Target, numbered};

/// The target: one message's first bytes.
pub(crate) const TARGET: Target = Target {
    name: "tm_headers",
    about: "tag-matching headers (TMH, RVH): parse, write back, compare",
    max_alloc: 0,
    max_total: 0,
    max_len: 256,
    framed: false,
    seeds,
    runner,
};

fn runner() -> Box<dyn Runner> {
    Box::new(FnRunner(run))
}

fn run(input: &[u8]) {
    match Tmh::parse(input) {
        Some(h) => {
            // Every field is written back; the 3 reserved bytes (1..4) are written as zeros.
            let mut expect = [0u8; TMH_LEN];
            expect.copy_from_slice(&input[..TMH_LEN]);
            expect[1..4].fill(0);
            assert_eq!(h.to_bytes(), expect, "TMH round trip");
            assert_eq!(Tmh::parse(&h.to_bytes()), Some(h), "TMH parse of its bytes");
            if h.op == TmhOp::Rndv {
                rvh(&input[TMH_LEN..]);
            }
        }
        None => assert!(
            input.len() < TMH_LEN || input[0] > 3,
            "a TMH refused: {input:02x?}"
        ),
    }
    rvh(input);
}

fn rvh(b: &[u8]) {
    match Rvh::parse(b) {
        // Every bit of the 16 bytes is a field.
        Some(r) => assert_eq!(r.to_bytes()[..], b[..RVH_LEN], "RVH round trip"),
        None => assert!(b.len() < RVH_LEN, "an RVH refused: {b:02x?}"),
    }
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let tmh = |op, app_ctx, tag| Tmh { op, app_ctx, tag }.to_bytes().to_vec();
    let rvh = Rvh {
        va: 0x0000_7F00_1234_5000,
        rkey: Rkey(0x8012_3401),
        len: 3000,
    };
    let mut rndv = tmh(TmhOp::Rndv, 3, 0x300);
    rndv.extend_from_slice(&rvh.to_bytes());
    rndv.extend_from_slice(b"app hdr!");
    let mut eager = tmh(TmhOp::Eager, 1, 0x100);
    eager.extend_from_slice(b"an eager message for tag 0x100");
    numbered(
        "header",
        vec![
            eager,
            tmh(TmhOp::NoTag, 4, 0),
            tmh(TmhOp::Fin, 3, 0x300),
            tmh(TmhOp::Eager, u32::MAX, u64::MAX),
            rndv,
            rvh.to_bytes().to_vec(),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_and_short_inputs_run() {
        for (_, s) in seeds() {
            run(&s);
            for cut in 0..s.len() {
                run(&s[..cut]);
            }
        }
    }
}
