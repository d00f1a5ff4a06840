//! `cm`: the connection manager's datagrams (`rdmx_verbs::cm::mad`): `Mad::from_frame`
//! (RoCEv2 framing, GSI checks, with and without the ICRC check) and `Mad::parse` (the MAD
//! header and the REQ, MRA, REJ, REP, RTU, DREQ and DREP layouts). A MAD that parses emits
//! and parses back to the same message.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use rdmx_verbs::cm::mad::{MAD_LEN, Mad, attr};
use rdmx_verbs::soft::wire::IcrcPath;

use super::{FnRunner, Runner, Target, numbered};

pub(crate) const TARGET: Target = Target {
    name: "cm",
    about: "rdmx-verbs CM MADs: from_frame (framing, GSI, ICRC), parse, emit round trip",
    max_alloc: 4096,
    max_total: 16 * 1024,
    max_len: 1024,
    framed: false,
    seeds,
    runner,
};

fn runner() -> Box<dyn Runner> {
    Box::new(FnRunner(run))
}

fn path() -> IcrcPath {
    IcrcPath::new(
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), 50_000),
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 7471),
    )
}

fn run(input: &[u8]) {
    let p = path();
    let checked = Mad::from_frame(input, Some(&p));
    let unchecked = Mad::from_frame(input, None);
    if let Ok(m) = &checked {
        assert_eq!(
            unchecked.as_ref().ok(),
            Some(m),
            "the ICRC check only drops frames"
        );
    }
    if let Ok(m) = unchecked {
        round_trip(&m);
    }
    if let Ok(m) = Mad::parse(input) {
        round_trip(&m);
    }
    // A MAD at the start of the input, as a socket that strips the framing would see it.
    if let Some(mad) = input.get(..MAD_LEN)
        && let Ok(m) = Mad::parse(mad)
    {
        round_trip(&m);
    }
}

fn round_trip(m: &Mad) {
    let _ = (
        m.msg.name(),
        m.msg.attr_id(),
        m.msg.local_comm_id(),
        m.msg.remote_comm_id(),
    );
    let mut again = [0u8; MAD_LEN];
    m.emit(&mut again);
    assert_eq!(Mad::parse(&again).as_ref(), Ok(m), "MAD round trip");
    let frame = m.to_frame(0x12_3456, &path());
    assert_eq!(
        Mad::from_frame(&frame, Some(&path())).as_ref(),
        Ok(m),
        "frame round trip"
    );
}

/// A frame of every message the CM handles, made by the encoder from MADs of patterned
/// bytes.
fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (i, id) in [
        attr::REQ,
        attr::MRA,
        attr::REJ,
        attr::REP,
        attr::RTU,
        attr::DREQ,
        attr::DREP,
    ]
    .into_iter()
    .enumerate()
    {
        let mut mad = [0u8; MAD_LEN];
        for (k, b) in mad.iter_mut().enumerate() {
            *b = (k * 7 + i * 13) as u8;
        }
        // Base version 1, class CM (0x07), class version 2, method Send (0x03).
        mad[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
        mad[16..18].copy_from_slice(&id.to_be_bytes());
        let m = Mad::parse(&mad).expect("a CM MAD");
        out.push(m.to_frame(i as u32, &path()).to_vec());
    }
    numbered("mad", out)
}
