//! Property tests of what rdmx-rpc decodes from its peer: any bytes as a frame end in an
//! error value, never a panic; a server fed any frames (with well-formed headers over
//! garbage bodies too) keeps serving; a client fed any responses fails or answers its calls,
//! never panics; headers round-trip.
#![expect(clippy::unwrap_used, reason = "test")]

use std::time::Duration;

use proptest::prelude::*;
use rdmx_rpc::link::Link;
use rdmx_rpc::link::mem::pair;
use rdmx_rpc::wire::{Header, Kind, frame};
use rdmx_rpc::{Client, ClientConfig, Code, Method, Server, ServerConfig, Service};

const ECHO: Method<Vec<String>, Vec<String>> = Method::new("fuzz.echo");

fn kind(k: u8) -> Kind {
    match k % 3 {
        0 => Kind::Request,
        1 => Kind::Response,
        _ => Kind::Cancel,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    #[test]
    fn any_bytes_parse_to_a_frame_or_an_error(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = Header::parse(&bytes);
    }

    #[test]
    fn headers_round_trip(k in any::<u8>(), method in any::<u32>(), id in any::<u64>(),
                          budget in any::<u32>(), body in prop::collection::vec(any::<u8>(), 0..100),
                          att in any::<bool>()) {
        let attached = att && kind(k) != Kind::Cancel;
        let h = Header { kind: kind(k), status: None, method, id, budget_us: budget, len: 0, attached };
        let f = frame(h, &body);
        let (g, b) = Header::parse(&f).unwrap();
        prop_assert_eq!(g, Header { len: body.len() as u32, ..h });
        prop_assert_eq!(b, &body[..]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Frames with this service's method id and a random body, random kinds and ids, some
    /// with a random payload after them, and raw garbage: the server answers or drops each,
    /// and then still echoes.
    #[test]
    fn a_server_fed_anything_keeps_serving(frames in prop::collection::vec(
        (any::<u8>(), any::<u64>(), any::<bool>(), prop::collection::vec(any::<u8>(), 0..64),
         prop::option::of(prop::collection::vec(any::<u8>(), 0..64))), 1..40)
    ) {
        let service = Service::builder().method(ECHO, |_, v: Vec<String>| Ok(v)).build().unwrap();
        let server = Server::new(service, ServerConfig { threads: 1, ..ServerConfig::default() }).unwrap();
        let (a, b) = pair();
        server.serve(a).unwrap();
        for (k, id, raw, body, payload) in &frames {
            let attached = payload.is_some() && kind(*k) != Kind::Cancel && !*raw;
            let f = if *raw {
                body.clone()
            } else {
                frame(Header { kind: kind(*k), status: None, method: ECHO.id(), id: *id, budget_us: 1_000_000, len: 0, attached }, body)
            };
            b.send_timeout(&f, Duration::from_secs(1)).unwrap();
            if let (true, Some(p)) = (attached, payload) {
                b.send_timeout(p, Duration::from_secs(1)).unwrap();
            }
        }
        let client = Client::new(b, ClientConfig::default()).unwrap();
        let v = vec!["still".to_string(), "here".to_string()];
        prop_assert_eq!(client.call(ECHO, &v).unwrap(), v);
    }

    /// A "server" that answers with anything: the client's calls fail with a status or
    /// get an answer, and nothing panics.
    #[test]
    fn a_client_fed_anything_never_panics(answers in prop::collection::vec(
        (any::<u8>(), any::<u8>(), prop::collection::vec(any::<u8>(), 0..64)), 1..6)
    ) {
        let calls = answers.len();
        let (a, b) = pair();
        let client = Client::new(b, ClientConfig { timeout: Duration::from_millis(50), ..ClientConfig::default() }).unwrap();
        let peer = std::thread::spawn(move || {
            for (status, k, body) in answers {
                let Ok(req) = a.recv_timeout(Duration::from_secs(2)) else { return };
                let Ok((h, _)) = Header::parse(&req) else { return };
                let mut f = frame(Header { kind: kind(k), status: None, method: h.method, id: h.id, budget_us: 0, len: 0, attached: false }, &body);
                f[2] = status;
                let _ = a.send_timeout(&f, Duration::from_secs(1));
            }
        });
        for _ in 0..calls {
            match client.call(ECHO, &vec!["x".into()]) {
                Ok(_) => {}
                Err(s) => prop_assert!(matches!(s.code, Code::Internal | Code::DeadlineExceeded | Code::Unavailable
                    | Code::Cancelled | Code::NotFound | Code::InvalidArgument | Code::ResourceExhausted
                    | Code::Unimplemented), "{s}"),
            }
        }
        peer.join().unwrap();
    }
}
