//! Bodies nested a million levels deep, over in-memory links: a server answers such a
//! request `InvalidArgument` and keeps serving; a client given such a response fails the
//! call `Internal` and keeps calling. Without the nesting limit either would overflow its
//! decoding thread's stack and abort the process.
#![expect(clippy::unwrap_used, reason = "test")]

use std::time::Duration;

use rdmx_rpc::link::Link;
use rdmx_rpc::link::mem::pair;
use rdmx_rpc::wire::{HEADER_LEN, Header, Kind, seal};
use rdmx_rpc::{Client, ClientConfig, Code, Method, Server, ServerConfig, Service};
use serde::{Deserialize, Serialize};

/// A recursive body type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Tree {
    Leaf(u32),
    Node(Vec<Self>),
}

impl Tree {
    /// `Node`s above the deepest leaf (iteratively: no recursion of our own).
    fn height(&self) -> u32 {
        let mut level = vec![self];
        let mut h = 0;
        loop {
            let next: Vec<&Self> = level
                .iter()
                .flat_map(|t| match t {
                    Self::Leaf(_) => &[][..],
                    Self::Node(kids) => &kids[..],
                })
                .collect();
            if next.is_empty() {
                return h;
            }
            h += 1;
            level = next;
        }
    }
}

/// A tree's height.
const HEIGHT: Method<Tree, u32> = Method::new("nesting.height");
/// A tree of the height asked (for the client's side: the test's peer answers it).
const GROW: Method<u32, Tree> = Method::new("nesting.grow");

/// `Tree::Node(vec![..])` a million times around `Tree::Leaf(0)`, in bincode's varint
/// encoding, built by hand (serializing it would overflow the stack): variant 1, a length
/// of 1, ..., variant 0, 0.
fn hostile_tree() -> Vec<u8> {
    let mut b = [1u8, 1].repeat(1_000_000);
    b.extend_from_slice(&[0, 0]);
    b
}

/// A tree of height `h`.
fn tree(h: u32) -> Tree {
    (0..h).fold(Tree::Leaf(h), |t, _| Tree::Node(vec![t, Tree::Leaf(0)]))
}

/// A frame: `header`, then `body`.
fn framed(header: Header, body: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; HEADER_LEN];
    f.extend_from_slice(body);
    seal(header, &mut f);
    f
}

fn request(method: u32, id: u64) -> Header {
    Header {
        kind: Kind::Request,
        status: None,
        method,
        id,
        budget_us: 5_000_000,
        len: 0,
        attached: false,
    }
}

#[test]
fn a_server_refuses_a_body_nested_a_million_deep_and_keeps_serving() {
    // On a pool thread, and inline on the link's reader thread.
    for threads in [1, 0] {
        let service = Service::builder()
            .method(HEIGHT, |_, t: Tree| Ok(t.height()))
            .build()
            .unwrap();
        let server = Server::new(
            service,
            ServerConfig {
                threads,
                ..ServerConfig::default()
            },
        )
        .unwrap();
        let (a, b) = pair();
        server.serve(a).unwrap();
        let body = hostile_tree();
        assert!(body.len() < 16 << 20, "within the default size limit");
        b.send_timeout(
            &framed(request(HEIGHT.id(), 77), &body),
            Duration::from_secs(5),
        )
        .unwrap();
        let answer = b.recv_timeout(Duration::from_secs(30)).unwrap();
        let (h, msg) = Header::parse(&answer).unwrap();
        assert_eq!(h.kind, Kind::Response);
        assert_eq!(h.id, 77);
        assert_eq!(h.status, Some(Code::InvalidArgument), "{threads} threads");
        let msg = String::from_utf8_lossy(msg);
        assert!(msg.contains("nesting deeper than 128 levels"), "{msg}");
        // And then a legitimate call, deep but within the limit (2 levels a node).
        let client = Client::new(b, ClientConfig::default()).unwrap();
        assert_eq!(client.call(HEIGHT, &tree(60)).unwrap(), 60);
        let e = client.call(HEIGHT, &tree(64)).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument, "{e}");
        assert_eq!(client.call(HEIGHT, &tree(3)).unwrap(), 3);
    }
}

#[test]
fn a_client_refuses_a_response_nested_a_million_deep_and_keeps_calling() {
    let (a, b) = pair();
    let client = Client::new(b, ClientConfig::default()).unwrap();
    // The peer answers the first call with the hostile body, the second with a tree.
    let peer = std::thread::spawn(move || {
        for body in [hostile_tree(), Vec::new()] {
            let req = a.recv_timeout(Duration::from_secs(10)).unwrap();
            let (h, _) = Header::parse(&req).unwrap();
            let body = if body.is_empty() {
                let mut f = rdmx_rpc::fuzz_api::encode_frame(
                    Header {
                        kind: Kind::Response,
                        ..request(h.method, h.id)
                    },
                    &tree(5),
                    1 << 20,
                )
                .unwrap();
                f.drain(..HEADER_LEN);
                f
            } else {
                body
            };
            let resp = Header {
                kind: Kind::Response,
                budget_us: 0,
                ..request(h.method, h.id)
            };
            a.send_timeout(&framed(resp, &body), Duration::from_secs(5))
                .unwrap();
        }
    });
    let e = client.call(GROW, &1_000_000).unwrap_err();
    assert_eq!(e.code, Code::Internal, "{e}");
    assert!(
        e.to_string().contains("nesting deeper than 128 levels"),
        "{e}"
    );
    assert_eq!(client.call(GROW, &5).unwrap(), tree(5));
    peer.join().unwrap();
}
