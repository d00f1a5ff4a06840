//! rdmx-rpc over in-memory links: calls in flight answered out of order, deadlines and
//! cancellation that reach the server, a panicking handler, unknown methods, size limits,
//! garbage, and a peer that goes away.
#![expect(clippy::unwrap_used, reason = "test")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdmx_rpc::link::Link;
use rdmx_rpc::link::mem::{MemLink, pair};
use rdmx_rpc::{Client, ClientConfig, Code, Limits, Method, Server, ServerConfig, Service, Status};

const ECHO: Method<String, String> = Method::new("test.echo");
/// Sleeps the given microseconds, then answers them.
const SLEEP: Method<u64, u64> = Method::new("test.sleep");
/// Sleeps until cancelled (or 5 s), then says whether it saw the cancel.
const WAIT_CANCEL: Method<(), bool> = Method::new("test.wait_cancel");
const PANIC: Method<(), ()> = Method::new("test.panic");
const BLOB: Method<Vec<u8>, usize> = Method::new("test.blob");
const NOT_THERE: Method<(), ()> = Method::new("test.not_there");
/// ECHO's name with another request type: what the server gets does not decode.
const ECHO_AS_NUMBER: Method<u64, String> = Method::new("test.echo");

fn service(cancels_seen: Arc<AtomicU64>) -> Service {
    Service::builder()
        .method(ECHO, |_, s: String| Ok(s))
        .method(SLEEP, |_, us: u64| {
            std::thread::sleep(Duration::from_micros(us));
            Ok(us)
        })
        .method(WAIT_CANCEL, move |cx, ()| {
            let end = Instant::now() + Duration::from_secs(5);
            while Instant::now() < end {
                if cx.is_cancelled() {
                    cancels_seen.fetch_add(1, Ordering::Relaxed);
                    return Ok(true);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(false)
        })
        .method(PANIC, |_, ()| -> Result<(), Status> {
            panic!("on purpose")
        })
        .method(BLOB, |_, b: Vec<u8>| Ok(b.len()))
        .build()
        .unwrap()
}

fn setup(threads: usize, limits: Limits) -> (Server, Client<MemLink>, Arc<AtomicU64>) {
    let seen = Arc::new(AtomicU64::new(0));
    let server = Server::new(
        service(Arc::clone(&seen)),
        ServerConfig {
            threads,
            limits,
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let (a, b) = pair();
    server.serve(a).unwrap();
    let client = Client::new(b, ClientConfig::default()).unwrap();
    (server, client, seen)
}

#[test]
fn a_thousand_calls_in_flight_are_answered_out_of_order() {
    let (server, client, _) = setup(8, Limits::default());
    assert_eq!(client.call(ECHO, &"hello".to_string()).unwrap(), "hello");
    // Long calls first: the short ones behind them overtake.
    let calls: Vec<_> = (0..1000u64)
        .map(|i| {
            let us = if i % 10 == 0 { 20_000 } else { i % 7 * 10 };
            (
                us,
                client.start(SLEEP, &us, Duration::from_secs(30)).unwrap(),
            )
        })
        .collect();
    assert!(client.in_flight() > 100, "{} in flight", client.in_flight());
    let mut done_order = Vec::new();
    let mut calls: Vec<(u64, u64, _)> = calls
        .into_iter()
        .map(|(us, c)| (us, c.id(), Some(c)))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while done_order.len() < calls.len() {
        assert!(Instant::now() < deadline, "calls never answered");
        for (us, id, c) in &mut calls {
            if let Some(p) = c.as_mut()
                && let Some(r) = p.try_wait()
            {
                assert_eq!(r.unwrap(), *us);
                done_order.push(*id);
                *c = None;
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let sorted = {
        let mut v = done_order.clone();
        v.sort_unstable();
        v
    };
    assert_ne!(done_order, sorted, "answered in the order asked");
    assert_eq!(server.stats().ok, 1001);
    assert_eq!(client.in_flight(), 0);
}

#[test]
fn a_deadline_that_passes_reaches_the_server() {
    // One server thread, kept busy: the second call waits past its deadline in the queue.
    let (server, client, seen) = setup(1, Limits::default());
    let busy = client
        .start(SLEEP, &300_000, Duration::from_secs(5))
        .unwrap();
    let late = client.call_timeout(SLEEP, &1, Duration::from_millis(50));
    assert_eq!(late.unwrap_err().code, Code::DeadlineExceeded);
    assert_eq!(busy.wait().unwrap(), 300_000);
    // A handler still running when the deadline passes sees it. (Its answer, given the
    // moment it sees the deadline, may still reach a caller that has not yet looked at its
    // own clock: either outcome is right; the handler seeing it is the point.)
    let r = client.call_timeout(WAIT_CANCEL, &(), Duration::from_millis(50));
    let cancelled_too = match r {
        Err(e) => {
            assert_eq!(e.code, Code::DeadlineExceeded);
            true
        }
        Ok(saw) => {
            assert!(saw, "the handler answered without seeing its deadline");
            false
        }
    };
    let end = Instant::now() + Duration::from_secs(5);
    let want = if cancelled_too { 2 } else { 1 };
    while seen.load(Ordering::Relaxed) < 1
        || server.stats().cancelled + server.stats().expired < want
    {
        assert!(Instant::now() < end, "{:?}", server.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(client.call(ECHO, &"after".into()).unwrap(), "after");
}

#[test]
fn a_dropped_call_is_cancelled_at_the_server() {
    let (server, client, seen) = setup(2, Limits::default());
    let p = client
        .start(WAIT_CANCEL, &(), Duration::from_secs(10))
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    drop(p);
    let end = Instant::now() + Duration::from_secs(5);
    while seen.load(Ordering::Relaxed) < 1 {
        assert!(Instant::now() < end, "the handler never saw the cancel");
        std::thread::sleep(Duration::from_millis(5));
    }
    while server.stats().cancelled < 1 {
        assert!(Instant::now() < end, "{:?}", server.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(client.in_flight(), 0);
}

#[test]
fn a_panicking_handler_answers_internal_and_the_server_goes_on() {
    let (server, client, _) = setup(2, Limits::default());
    for _ in 0..3 {
        let e = client.call(PANIC, &()).unwrap_err();
        assert_eq!(e.code, Code::Internal);
        assert!(e.message.contains("on purpose"), "{e}");
    }
    assert_eq!(
        client.call(ECHO, &"still here".into()).unwrap(),
        "still here"
    );
    assert_eq!(server.stats().panics, 3);
}

#[test]
fn unknown_methods_bad_payloads_and_limits_get_clear_statuses() {
    let (server, client, _) = setup(
        2,
        Limits {
            max_request: 1000,
            max_response: 1 << 20,
        },
    );
    assert_eq!(
        client.call(NOT_THERE, &()).unwrap_err().code,
        Code::Unimplemented
    );
    assert_eq!(
        client.call(ECHO_AS_NUMBER, &7).unwrap_err().code,
        Code::InvalidArgument
    );
    // Over the server's limit (the client's is larger).
    let e = client.call(BLOB, &vec![1u8; 5000]).unwrap_err();
    assert_eq!(e.code, Code::ResourceExhausted, "{e}");
    assert_eq!(client.call(BLOB, &vec![1u8; 500]).unwrap(), 500);
    // Over the client's own limit: refused before sending.
    let small = Client::new(
        {
            let (a, b) = pair();
            server.serve(a).unwrap();
            b
        },
        ClientConfig {
            limits: Limits {
                max_request: 100,
                max_response: 100,
            },
            ..ClientConfig::default()
        },
    )
    .unwrap();
    assert_eq!(
        small.call(BLOB, &vec![0u8; 200]).unwrap_err().code,
        Code::ResourceExhausted
    );
    assert_eq!(
        small.call(ECHO, &"x".repeat(150)).unwrap_err().code,
        Code::ResourceExhausted,
        "a response over the client's limit"
    );
}

#[test]
fn garbage_frames_are_counted_and_change_nothing() {
    let (server, client, _) = setup(2, Limits::default());
    let (a, b) = pair();
    server.serve(a).unwrap();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for n in 0..2000usize {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let mut f: Vec<u8> = (0..n % 64).map(|i| (rng >> (i % 8 * 8)) as u8).collect();
        if n % 3 == 0 && f.len() >= 24 {
            f[0] = 0x52; // the right version, then garbage
        }
        b.send_timeout(&f, Duration::from_secs(1)).unwrap();
    }
    // A well-formed request after the garbage is still served on that link.
    let good = rdmx_rpc::wire::frame(
        rdmx_rpc::wire::Header {
            kind: rdmx_rpc::wire::Kind::Request,
            status: None,
            method: ECHO.id(),
            id: 99,
            budget_us: 1_000_000,
            len: 0,
            attached: false,
        },
        &[2, b'o', b'k'],
    );
    b.send_timeout(&good, Duration::from_secs(1)).unwrap();
    let r = b.recv_timeout(Duration::from_secs(5)).unwrap();
    let (h, body) = rdmx_rpc::wire::Header::parse(&r).unwrap();
    assert_eq!((h.id, h.status, body), (99, None, &[2, b'o', b'k'][..]));
    assert!(server.stats().bad_frames > 1000, "{:?}", server.stats());
    assert_eq!(client.call(ECHO, &"fine".into()).unwrap(), "fine");
}

#[test]
fn a_peer_that_goes_away_fails_pending_calls_with_unavailable() {
    let (server, client, _) = setup(1, Limits::default());
    let p = client
        .start(SLEEP, &200_000, Duration::from_secs(10))
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    // The server side's link ends (its reader drops it once it sees the shutdown).
    server.shutdown();
    let t = Instant::now();
    let e = p.wait().unwrap_err();
    assert_eq!(e.code, Code::Unavailable, "{e}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(
        client.call(ECHO, &"x".into()).unwrap_err().code,
        Code::Unavailable
    );
}

#[test]
fn two_methods_with_one_name_are_refused() {
    let r = Service::builder()
        .method(ECHO, |_, s: String| Ok(s))
        .method(ECHO_AS_NUMBER, |_, n: u64| Ok(n.to_string()))
        .build();
    assert!(r.is_err());
}

#[cfg(feature = "tokio")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_calls_and_a_dropped_future_cancels_at_the_server() {
    let (server, client, seen) = setup(2, Limits::default());
    assert_eq!(client.call_async(ECHO, &"a".into()).await.unwrap(), "a");
    let calls: Vec<_> = (0..64u64)
        .map(|i| {
            let c = client.clone();
            tokio::spawn(async move { c.call_async(SLEEP, &(i * 10)).await })
        })
        .collect();
    for (i, h) in calls.into_iter().enumerate() {
        assert_eq!(h.await.unwrap().unwrap(), i as u64 * 10);
    }
    let r = tokio::time::timeout(
        Duration::from_millis(50),
        client.call_async(WAIT_CANCEL, &()),
    )
    .await;
    assert!(r.is_err(), "the call finished");
    let end = Instant::now() + Duration::from_secs(5);
    while seen.load(Ordering::Relaxed) < 1 || server.stats().cancelled < 1 {
        assert!(Instant::now() < end, "{:?}", server.stats());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[test]
fn many_threads_calling_at_once_all_get_their_answers() {
    let (server, client, _) = setup(4, Limits::default());
    let threads: Vec<_> = (0..16u64)
        .map(|t| {
            let c = client.clone();
            std::thread::spawn(move || {
                for i in 0..300u64 {
                    let us = (t * 7 + i) % 13;
                    assert_eq!(c.call(SLEEP, &us).unwrap(), us);
                    let s = format!("{t}-{i}");
                    assert_eq!(c.call(ECHO, &s).unwrap(), s);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(server.stats().ok, 16 * 600);
    assert_eq!(client.in_flight(), 0);
}

#[test]
fn inline_handlers_on_the_links_reader_thread() {
    let (server, client, _) = setup(0, Limits::default());
    let calls: Vec<_> = (0..200u64)
        .map(|i| {
            (
                i,
                client
                    .start(SLEEP, &(i % 3), Duration::from_secs(10))
                    .unwrap(),
            )
        })
        .collect();
    for (i, c) in calls {
        assert_eq!(c.wait().unwrap(), i % 3);
    }
    assert_eq!(client.call(PANIC, &()).unwrap_err().code, Code::Internal);
    assert_eq!(client.call(ECHO, &"inline".into()).unwrap(), "inline");
    assert_eq!(
        client.call(NOT_THERE, &()).unwrap_err().code,
        Code::Unimplemented
    );
    assert_eq!(server.stats().ok, 201);
}

/// Takes the request's payload, answers its length and sends it back reversed.
const REVERSE: Method<u32, usize> = Method::new("test.reverse");

fn payload_setup(limits: Limits) -> (Server, Client<MemLink>) {
    let service = Service::builder()
        .method(REVERSE, |cx, tag: u32| {
            let Some(p) = cx.take_payload() else {
                return Err(Status::invalid_argument("no payload"));
            };
            let mut v = p.into_vec();
            let n = v.len();
            v.reverse();
            v.extend_from_slice(&tag.to_le_bytes());
            cx.attach(v);
            Ok(n)
        })
        .method(ECHO, |cx, s: String| {
            // (A pool is what an rdmx endpoint has; an in-memory link has none.)
            assert_eq!(cx.alloc(8).unwrap_err().code, Code::Unimplemented);
            Ok(s)
        })
        .build()
        .unwrap();
    let server = Server::new(
        service,
        ServerConfig {
            threads: 3,
            limits,
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let (a, b) = pair();
    server.serve(a).unwrap();
    let client = Client::new(
        b,
        ClientConfig {
            limits,
            ..ClientConfig::default()
        },
    )
    .unwrap();
    (server, client)
}

#[test]
fn payloads_travel_beside_calls_and_responses_from_many_threads() {
    let (server, client) = payload_setup(Limits::default());
    // Many threads, calls with and without payloads interleaved on one link: each frame
    // keeps its own payload (nothing comes between them).
    let threads: Vec<_> = (0..8u32)
        .map(|t| {
            let c = client.clone();
            std::thread::spawn(move || {
                for i in 0..200u32 {
                    let n = ((t * 131 + i * 17) % 3000) as usize;
                    let data: Vec<u8> = (0..n).map(|k| (k as u32 ^ t ^ i) as u8).collect();
                    let (len, back) = c
                        .call_with(REVERSE, &(t * 1000 + i), Some(data.clone().into()))
                        .unwrap();
                    assert_eq!(len, n);
                    let mut want = data;
                    want.reverse();
                    want.extend_from_slice(&(t * 1000 + i).to_le_bytes());
                    let back = back.unwrap();
                    assert!(!back.is_rendezvous());
                    assert_eq!(&back[..], &want[..]);
                    let s = format!("{t}/{i}");
                    assert_eq!(c.call(ECHO, &s).unwrap(), s);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // A call that expects a payload and sends none gets the handler's status; a payload
    // beside a call that does not take it is dropped and the call answered.
    assert_eq!(
        client.call(REVERSE, &1).unwrap_err().code,
        Code::InvalidArgument
    );
    let (s, none) = client
        .call_with(ECHO, &"x".to_string(), Some(b"ignored".as_slice().into()))
        .unwrap();
    assert_eq!((s.as_str(), none.is_none()), ("x", true));
    assert_eq!(server.stats().ok, 8 * 400 + 1);
    assert_eq!(server.stats().bad_frames, 0);
    assert_eq!(client.stats().bad_frames, 0);
}

#[test]
fn payload_sizes_are_limited_on_both_sides() {
    let limits = Limits {
        max_request: 1000,
        max_response: 1000,
    };
    let (server, client) = payload_setup(limits);
    // The client refuses to send more than its limit ...
    let e = client
        .call_with(REVERSE, &0, Some(vec![0u8; 1001].into()))
        .unwrap_err();
    assert_eq!(e.code, Code::ResourceExhausted, "{e}");
    // ... the server refuses a response over its own (the payload plus its 4 bytes) ...
    let e = client
        .call_with(REVERSE, &0, Some(vec![0u8; 998].into()))
        .unwrap_err();
    assert_eq!(e.code, Code::ResourceExhausted, "{e}");
    assert!(e.message.contains("the server sends at most 1000"), "{e}");
    // ... and a server that allows more than the client takes is refused by the client.
    let (a, b) = pair();
    Server::new(
        Service::builder()
            .method(REVERSE, |cx, _: u32| {
                cx.attach(vec![7u8; 5000]);
                Ok(0usize)
            })
            .build()
            .unwrap(),
        ServerConfig::default(),
    )
    .unwrap()
    .serve(a)
    .unwrap();
    let small = Client::new(
        b,
        ClientConfig {
            limits,
            ..ClientConfig::default()
        },
    )
    .unwrap();
    let e = small.call_with(REVERSE, &0, None).unwrap_err();
    assert_eq!(e.code, Code::ResourceExhausted, "{e}");
    assert!(e.message.contains("the client takes at most 1000"), "{e}");
    // The links still pair frames and payloads afterwards.
    let (n, back) = client
        .call_with(REVERSE, &9, Some(vec![1, 2, 3].into()))
        .unwrap();
    assert_eq!((n, &back.unwrap()[..]), (3, &[3, 2, 1, 9, 0, 0, 0][..]));
    assert_eq!(server.stats().bad_frames, 0);
}

#[test]
fn the_payload_is_the_next_message_whatever_it_is() {
    let (server, client) = payload_setup(Limits::default());
    drop(client);
    let (a, b) = pair();
    server.serve(a).unwrap();
    let f = rdmx_rpc::wire::frame(
        rdmx_rpc::wire::Header {
            kind: rdmx_rpc::wire::Kind::Request,
            status: None,
            method: REVERSE.id(),
            id: 1,
            budget_us: 0,
            len: 0,
            attached: true,
        },
        &[1],
    );
    b.send_timeout(&f, Duration::from_secs(1)).unwrap();
    // The payload is the next message, whatever it is: a frame of garbage here.
    b.send_timeout(b"not a frame", Duration::from_secs(1))
        .unwrap();
    let r = b.recv_timeout(Duration::from_secs(5)).unwrap();
    let (h, body) = rdmx_rpc::wire::Header::parse(&r).unwrap();
    assert_eq!((h.id, h.status, h.attached), (1, None, true));
    assert_eq!(body, [11]);
    let p = b.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(&p[..], b"emarf a ton\x01\0\0\0");
}

#[cfg(feature = "tokio")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_calls_with_payloads() {
    let (_server, client) = payload_setup(Limits::default());
    let calls: Vec<_> = (0..32u32)
        .map(|i| {
            let c = client.clone();
            tokio::spawn(async move {
                let data = vec![i as u8; i as usize * 100];
                c.call_with_async(REVERSE, &i, Some(data.into())).await
            })
        })
        .collect();
    for (i, h) in calls.into_iter().enumerate() {
        let (n, back) = h.await.unwrap().unwrap();
        let back = back.unwrap();
        assert_eq!((n, back.len()), (i * 100, i * 100 + 4));
        assert!(back[..n].iter().all(|&b| b == i as u8));
    }
}
