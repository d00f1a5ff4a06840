//! `rpc`: the frames of rdmx-rpc (`rdmx_rpc::wire::Header::parse`), the bodies a server
//! decodes from a request (`codec::decode`, through `rdmx_rpc::fuzz_api::decode_body`) and
//! what a client makes of a response frame (`fuzz_api::decode_response`), for a few body
//! types of the shapes applications use, recursive ones among them (for the decoder's
//! nesting limit: a body nested past it must be an error, not a stack overflow).

use rdmx_rpc::fuzz_api;
use rdmx_rpc::status::Code;
use rdmx_rpc::wire::{HEADER_LEN, Header, Kind, method_id};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{FnRunner, Runner, Target, numbered};

/// The body limit: the servers' and clients' default (16 MiB).
const LIMIT: usize = 16 << 20;

pub(crate) const TARGET: Target = Target {
    name: "rpc",
    about: "rdmx-rpc frame header, request bodies (bincode), response frames",
    // bincode checks lengths against the limit, and serde reserves at most 1 MiB for a
    // sequence whatever length it claims: 1 MiB is what a few bytes can make it allocate.
    max_alloc: (1 << 20) + 64 * 1024,
    max_total: 16 << 20,
    max_len: 8 * 1024,
    framed: false,
    seeds,
    runner,
};

/// A request type with the usual shapes: enum variants, strings, byte vectors, options,
/// nested sequences.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
enum Request {
    Get {
        key: String,
    },
    Put {
        key: String,
        value: Vec<u8>,
        ttl: Option<u64>,
    },
    Scan {
        from: String,
        limit: u32,
    },
    Batch(Vec<(String, Vec<u8>)>),
    Matrix(Vec<Vec<u32>>),
    Flags([u8; 4], bool, char),
}

/// A recursive body type: every kind of nesting the decoder's depth limit counts (enum
/// variants, sequences, maps, options, tuples, newtype structs, boxes). An input of a few
/// KiB can nest thousands of levels deep (one byte a level: `Wrap`, `Wrap`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
enum Tree {
    Leaf(u32),
    Node(Vec<Self>),
    Wrap(Box<Self>),
    Pair(Box<(Self, Self)>),
    Maybe(Option<Box<Self>>),
    Map(std::collections::BTreeMap<u8, Self>),
    Named { left: Box<Self>, right: Nest },
}

/// A recursive newtype struct (its own level, then its vector's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Nest(Vec<Tree>);

/// A response type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Reply {
    id: u64,
    found: Option<Vec<u8>>,
    tags: Vec<String>,
    code: i32,
}

fn runner() -> Box<dyn Runner> {
    Box::new(FnRunner(run))
}

fn run(input: &[u8]) {
    bodies(input);
    let Ok((h, body)) = Header::parse(input) else {
        return;
    };
    let mut again = [0u8; HEADER_LEN];
    h.write(&mut again);
    assert_eq!(again[..], input[..HEADER_LEN], "header round trip");
    assert_eq!(h.len as usize, body.len());
    bodies(body);
    if h.kind == Kind::Response {
        let _ = fuzz_api::decode_response::<Reply>(input, LIMIT);
        let _ = fuzz_api::decode_response::<String>(input, LIMIT);
        let _ = fuzz_api::decode_response::<()>(input, LIMIT);
    }
}

/// Decodes `body` as every body type; a request that decodes encodes back to a body that
/// decodes to it.
fn bodies(body: &[u8]) {
    if let Ok(req) = fuzz_api::decode_body::<Request>(body, LIMIT) {
        let frame = fuzz_api::encode_frame(header(Kind::Request, None), &req, LIMIT)
            .expect("a decoded request encodes");
        let again: Request =
            fuzz_api::decode_body(&frame[HEADER_LEN..], LIMIT).expect("and decodes again");
        assert_eq!(again, req, "request round trip");
    }
    if let Ok(tree) = fuzz_api::decode_body::<Tree>(body, LIMIT) {
        // Within the nesting limit, so encoding and decoding it again recurse no deeper.
        let frame = fuzz_api::encode_frame(header(Kind::Request, None), &tree, LIMIT)
            .expect("a decoded tree encodes");
        let again: Tree =
            fuzz_api::decode_body(&frame[HEADER_LEN..], LIMIT).expect("and decodes again");
        assert_eq!(again, tree, "tree round trip");
    }
    decode::<Reply>(body);
    decode::<String>(body);
    decode::<Vec<u8>>(body);
    decode::<Vec<String>>(body);
    decode::<(u32, String, Option<Vec<u64>>)>(body);
    decode::<std::collections::BTreeMap<String, Vec<u16>>>(body);
    // A small limit too: the limit must hold whatever the body claims.
    let _ = fuzz_api::decode_body::<Vec<Vec<u8>>>(body, 64);
}

fn decode<T: DeserializeOwned>(body: &[u8]) {
    let _ = fuzz_api::decode_body::<T>(body, LIMIT);
}

fn header(kind: Kind, status: Option<Code>) -> Header {
    Header {
        kind,
        status,
        method: method_id("kv.get"),
        id: 42,
        budget_us: 1_000_000,
        len: 0,
        attached: false,
    }
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let requests = [
        Request::Get {
            key: "alpha".into(),
        },
        Request::Put {
            key: "k".into(),
            value: vec![1, 2, 3, 255],
            ttl: Some(60),
        },
        Request::Scan {
            from: "a".into(),
            limit: 100,
        },
        Request::Batch(vec![("x".into(), vec![0; 8]), ("y".into(), Vec::new())]),
        Request::Matrix(vec![vec![1, 2], vec![], vec![u32::MAX]]),
        Request::Flags([1, 2, 3, 4], true, 'é'),
    ];
    let mut out = Vec::new();
    for r in &requests {
        out.push(fuzz_api::encode_frame(header(Kind::Request, None), r, LIMIT).expect("encodes"));
    }
    let reply = Reply {
        id: 7,
        found: Some(b"value".to_vec()),
        tags: vec!["a".into(), "bc".into()],
        code: -1,
    };
    out.push(fuzz_api::encode_frame(header(Kind::Response, None), &reply, LIMIT).expect("encodes"));
    let mut failed = vec![0u8; HEADER_LEN];
    failed.extend_from_slice(b"no such key");
    rdmx_rpc::wire::seal(header(Kind::Response, Some(Code::NotFound)), &mut failed);
    out.push(failed);
    let mut cancel = vec![0u8; HEADER_LEN];
    rdmx_rpc::wire::seal(header(Kind::Cancel, None), &mut cancel);
    out.push(cancel);
    let mut attached = header(Kind::Request, None);
    attached.attached = true;
    out.push(fuzz_api::encode_frame(attached, &requests[0], LIMIT).expect("encodes"));
    // Trees: every variant, nested to about half the nesting limit (66 levels: 13 each 6
    // steps, and the leaf), then a chain just within it (127 `Wrap`s and a leaf: 128
    // levels) and one past it (200 `Wrap`s).
    let mut tree = Tree::Leaf(1);
    for i in 0..30u8 {
        tree = match i % 6 {
            0 => Tree::Node(vec![tree, Tree::Leaf(u32::from(i))]),
            1 => Tree::Wrap(Box::new(tree)),
            2 => Tree::Pair(Box::new((Tree::Leaf(0), tree))),
            3 => Tree::Maybe(Some(Box::new(tree))),
            4 => Tree::Map([(i, tree), (0, Tree::Maybe(None))].into_iter().collect()),
            _ => Tree::Named {
                left: Box::new(Tree::Leaf(2)),
                right: Nest(vec![tree]),
            },
        };
    }
    out.push(fuzz_api::encode_frame(header(Kind::Request, None), &tree, LIMIT).expect("encodes"));
    for wraps in [127, 200] {
        // `Wrap` is variant 2; `Leaf(0)` is variant 0 and a 0.
        let mut body = vec![0u8; HEADER_LEN];
        body.extend(std::iter::repeat_n(2u8, wraps));
        body.extend_from_slice(&[0, 0]);
        rdmx_rpc::wire::seal(header(Kind::Request, None), &mut body);
        out.push(body);
    }
    numbered("frame", out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tree seeds decode as trees within the nesting limit, but the one past it.
    #[test]
    fn the_tree_seeds_sit_around_the_nesting_limit() {
        let seeds = seeds();
        let n = seeds.len();
        let tree = |i: usize| {
            let (h, body) = Header::parse(&seeds[i].1).expect("a frame");
            assert_eq!(h.kind, Kind::Request);
            fuzz_api::decode_body::<Tree>(body, LIMIT)
        };
        assert!(tree(n - 3).is_ok());
        assert!(tree(n - 2).is_ok());
        let e = tree(n - 1).unwrap_err();
        assert!(e.contains("nesting deeper than 128 levels"), "{e}");
    }
}
