//! `header`: the message header every transport puts in front of a message
//! (`rdmx_core::header`): `Header::parse`, `RtsInfo::parse` and the entries of a packed
//! frame (`PackedEntries::parse`, `entry_at`, iteration).

use rdmx_core::header::{HEADER_LEN, Header, Kind, PackedEntries, RTS_LEN, RtsInfo};

use super::{FnRunner, Runner, Target, numbered};

pub(crate) const TARGET: Target = Target {
    name: "header",
    about: "rdmx-core message header, rendezvous descriptor, packed frames",
    max_alloc: 0,
    max_total: 0,
    max_len: 4096,
    framed: false,
    seeds,
    runner,
};

fn runner() -> Box<dyn Runner> {
    Box::new(FnRunner(run))
}

fn run(input: &[u8]) {
    match Header::parse(input) {
        Ok(h) => {
            // Every bit of the 16 bytes is a field: writing the header gives them back.
            assert_eq!(h.to_bytes()[..], input[..HEADER_LEN], "header round trip");
            let body = &input[HEADER_LEN..];
            match h.kind {
                Kind::Rts => {
                    let rts = RtsInfo::parse(input).expect("a parsed Rts has its descriptor");
                    let mut again = [0u8; RTS_LEN];
                    assert!(rts.write(&mut again));
                    assert_eq!(
                        again[HEADER_LEN..HEADER_LEN + 12],
                        input[HEADER_LEN..HEADER_LEN + 12]
                    );
                }
                Kind::Packed => packed(body),
                Kind::Data | Kind::Close => {}
            }
        }
        Err(_) => {
            // What a receiver that skipped the check would read must still not panic.
            let _ = RtsInfo::parse(input);
        }
    }
    packed(input);
}

/// Checks a packed payload: parsing and iterating agree, and the entries tile it.
fn packed(payload: &[u8]) {
    let Some((entries, count)) = PackedEntries::parse(payload) else {
        return;
    };
    let mut n = 0;
    let mut at = 0;
    for r in entries {
        assert_eq!(r.start, at + 2, "entries follow each other");
        assert!(r.end <= payload.len());
        at = r.end;
        n += 1;
        assert!(n <= count, "more entries than parse counted");
    }
    assert_eq!(n, count);
    assert_eq!(at, payload.len(), "entries cover the payload");
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let h = |kind, len, flags| Header {
        kind,
        tag: 0x0102,
        grant: 7,
        rndv_done: u32::MAX,
        len,
        flags,
    };
    let mut out = Vec::new();
    let mut data = h(Kind::Data, 5, 0).to_bytes().to_vec();
    data.extend_from_slice(b"hello");
    out.push(data);
    let mut rts = vec![0u8; RTS_LEN];
    h(Kind::Rts, 1 << 20, Header::WAKE_ON_READ).write(&mut rts);
    RtsInfo {
        addr: 0x7f00_1234_5000,
        rkey: 0xabcd,
    }
    .write(&mut rts);
    out.push(rts);
    out.push(h(Kind::Close, 0, 0).to_bytes().to_vec());
    let mut body = vec![0u8; 64];
    let mut at = 0;
    for m in [&b"one"[..], b"", b"three"] {
        at = PackedEntries::append(&mut body, at, m).expect("fits");
    }
    body.truncate(at);
    let mut packed = h(Kind::Packed, at as u32, 0).to_bytes().to_vec();
    packed.extend_from_slice(&body);
    out.push(packed);
    numbered("header", out)
}
