//! `rpc`: the frames of rdmx-rpc (`rdmx_rpc::wire::Header::parse`), the bodies a server
//! decodes from a request (`codec::decode`, through `rdmx_rpc::fuzz_api::decode_body`) and
//! what a client makes of a response frame (`fuzz_api::decode_response`), for a few body
//! types of the shapes applications use.

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
    numbered("frame", out)
}
