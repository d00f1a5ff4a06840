//! The bootstrap side channel over real loopback TCP: broken and hostile peers fail with the
//! right error within the deadline (plus a margin for a loaded machine), and a well-behaved
//! Hello/Accept exchange succeeds.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use rdmx_core::bootstrap::{
    self, BootstrapError, EndpointInfo, Frame, HEADER_LEN, MAGIC, MAX_REJECT_REASON,
    PROTOCOL_VERSION, PathInfo, Transport,
};

/// The deadline of every exchange under test.
const DEADLINE: Duration = Duration::from_millis(300);
/// How late past its deadline a call may return on a busy machine.
const MARGIN: Duration = Duration::from_millis(1500);
/// Generous deadline for the well-behaved side of a test.
const PATIENT: Duration = Duration::from_secs(10);
/// An allocation this large during a receive means an announced length was believed: a frame
/// needs at most its payload, 64 KiB, and the decoded value.
const ALLOCATION_LIMIT: usize = 128 * 1024;

/// A global allocator that records, per thread, the largest single allocation, so that tests
/// can prove a hostile length was not allocated (Linux would happily hand out 4 GiB of
/// untouched zeroed memory, so a test without this would pass either way).
struct Tracking;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: the thread-local may already be gone while the thread exits.
    let _ = LARGEST.try_with(|largest| largest.set(largest.get().max(size)));
}

// SAFETY: every method forwards its arguments unchanged to `System`, so `System`'s guarantees
// are ours; the bookkeeping only updates a const-initialised thread-local `Cell`, which
// neither allocates nor registers a destructor.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: our caller upholds `GlobalAlloc::alloc`'s contract, which is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through this allocator, with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: `ptr` came from `System` through this allocator, with this layout, and our
        // caller upholds the rest of `GlobalAlloc::realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

/// Runs `f` and returns its result with the largest allocation this thread made meanwhile.
fn largest_allocation_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|largest| largest.set(0));
    let out = f();
    (out, LARGEST.with(Cell::get))
}

fn path(port_num: u8) -> PathInfo {
    PathInfo {
        gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1],
        udp_port: 18_515,
        port_num,
    }
}

fn info(qpn: u32) -> EndpointInfo {
    EndpointInfo {
        transport: Transport::Rc,
        qpn,
        psn: 0x00_1234,
        mtu: 1024,
        primary: path(1),
        alternate: Some(path(2)),
        srq_nums: Vec::new(),
        credits: 128,
        mailbox_addr: 0x7f12_3400_0000,
        mailbox_rkey: 0x77,
        max_message: 1 << 24,
        eager_limit: 16 * 1024,
        context_id: u64::from(qpn) << 32 | 0xabc,
        node_id: 0x1234,
        tag: 7,
        xrc_target: None,
        xrc_target_path: None,
        xrc_target_alt: None,
        xrc_in_use: None,
        token: 0,
        app_data: Vec::new(),
    }
}

fn header(version: u16, payload_len: u32) -> Vec<u8> {
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&version.to_be_bytes());
    bytes.extend_from_slice(&payload_len.to_be_bytes());
    bytes
}

/// A frame of our version around an arbitrary payload.
fn frame_with_payload(payload: &[u8]) -> Vec<u8> {
    let mut bytes = header(PROTOCOL_VERSION, u32::try_from(payload.len()).unwrap());
    bytes.extend_from_slice(payload);
    bytes
}

/// A bootstrap listener on an ephemeral loopback port.
fn listening() -> (std::net::TcpListener, SocketAddr) {
    let listener = bootstrap::listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

/// A connected pair: (connector, accepted listener side).
fn pair() -> (TcpStream, TcpStream) {
    let (listener, addr) = listening();
    let connector = bootstrap::connect(addr, Instant::now() + PATIENT).unwrap();
    let (accepted, _) = bootstrap::accept(&listener).unwrap();
    (connector, accepted)
}

/// Runs `f` with a deadline `DEADLINE` from now and checks that it returned by the deadline
/// plus `MARGIN`. Returns the result and the deadline.
fn bounded<T>(f: impl FnOnce(Instant) -> T) -> (T, Instant) {
    let start = Instant::now();
    let deadline = start + DEADLINE;
    let out = f(deadline);
    let elapsed = start.elapsed();
    assert!(
        elapsed < DEADLINE + MARGIN,
        "took {elapsed:?} with a deadline of {DEADLINE:?}"
    );
    (out, deadline)
}

/// Reads everything until the peer closes (or resets), bounded by a read timeout.
fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    stream.set_read_timeout(Some(PATIENT)).unwrap();
    let mut bytes = Vec::new();
    let mut chunk = [0_u8; 4096];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => return bytes,
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(err) if err.kind() == ErrorKind::ConnectionReset => return bytes,
            Err(err) => panic!("reading until the peer closes: {err}"),
        }
    }
}

#[test]
fn garbage_bytes_are_bad_magic_and_get_no_answer() {
    let (mut connector, mut accepted) = pair();
    connector
        .write_all(b"GET / HTTP/1.1\r\nHost: example\r\n\r\n")
        .unwrap();
    let (result, _) = bounded(|deadline| bootstrap::expect_hello(&mut accepted, deadline));
    assert!(
        matches!(result, Err(BootstrapError::BadMagic(m)) if m == *b"GET "),
        "{result:?}"
    );
    drop(accepted);
    // Someone who does not speak the protocol is not answered.
    assert_eq!(read_until_closed(&mut connector), b"");
}

#[test]
fn close_before_any_byte_is_closed() {
    let (connector, mut accepted) = pair();
    drop(connector);
    let (result, _) = bounded(|deadline| bootstrap::recv_frame(&mut accepted, deadline));
    assert!(matches!(result, Err(BootstrapError::Closed)), "{result:?}");
}

#[test]
fn truncated_frame_then_close_is_truncated() {
    let bytes = bootstrap::encode(&Frame::Hello(info(7)));
    let half = bytes.len() / 2;
    assert!(half > HEADER_LEN);
    let (mut connector, mut accepted) = pair();
    connector.write_all(&bytes[..half]).unwrap();
    drop(connector);
    let (result, _) = bounded(|deadline| bootstrap::recv_frame(&mut accepted, deadline));
    match result {
        Err(BootstrapError::Truncated { got, expected }) => {
            assert_eq!((got, expected), (half, bytes.len()));
        }
        other => panic!("expected Truncated, got {other:?}"),
    }
}

#[test]
fn truncated_header_then_close_is_truncated() {
    let (mut connector, mut accepted) = pair();
    connector
        .write_all(&header(PROTOCOL_VERSION, 20)[..7])
        .unwrap();
    drop(connector);
    let (result, _) = bounded(|deadline| bootstrap::recv_frame(&mut accepted, deadline));
    assert!(
        matches!(
            result,
            Err(BootstrapError::Truncated {
                got: 7,
                expected: HEADER_LEN
            })
        ),
        "{result:?}"
    );
}

#[test]
fn wrong_version_is_a_mismatch_and_the_peer_reads_a_reject() {
    let (listener, addr) = listening();
    // A peer from the future: the next version's header, a payload we cannot know the format of.
    let peer = thread::spawn(move || {
        let mut stream = TcpStream::connect(addr).unwrap();
        let mut hello = header(PROTOCOL_VERSION + 1, 3);
        hello.extend_from_slice(b"v2!");
        stream.write_all(&hello).unwrap();
        read_until_closed(&mut stream)
    });
    let (mut accepted, _) = bootstrap::accept(&listener).unwrap();
    let (result, _) = bounded(|deadline| bootstrap::expect_hello(&mut accepted, deadline));
    assert!(
        matches!(
            result,
            Err(BootstrapError::VersionMismatch { ours, theirs })
                if ours == PROTOCOL_VERSION && theirs == PROTOCOL_VERSION + 1
        ),
        "{result:?}"
    );
    drop(accepted);
    let answer = peer.join().unwrap();
    // Whatever its version, the peer can read our header and so our version...
    let head = bootstrap::decode_header(&answer)
        .unwrap()
        .expect("a whole header");
    assert_eq!(head.version, PROTOCOL_VERSION);
    assert_eq!(head.frame_len(), answer.len());
    // ...and a peer of our version can read the reason.
    let (frame, consumed) = bootstrap::decode(&answer).unwrap().expect("a whole frame");
    assert_eq!(consumed, answer.len());
    match frame {
        Frame::Reject(reason) => assert!(
            reason.contains("version")
                && reason.contains(&format!("v{PROTOCOL_VERSION}"))
                && reason.contains(&format!("v{}", PROTOCOL_VERSION + 1)),
            "{reason}"
        ),
        other => panic!("expected a Reject, got {other:?}"),
    }
}

#[test]
fn a_reject_from_a_newer_listener_is_a_version_mismatch_for_the_connector() {
    let (mut connector, mut accepted) = pair();
    let mut newer = bootstrap::encode(&Frame::Reject("speak v2".to_owned()));
    newer[4..6].copy_from_slice(&(PROTOCOL_VERSION + 1).to_be_bytes());
    accepted.write_all(&newer).unwrap();
    let (result, _) = bounded(|deadline| bootstrap::expect_accept(&mut connector, deadline));
    assert!(
        matches!(
            result,
            Err(BootstrapError::VersionMismatch { theirs, .. }) if theirs == PROTOCOL_VERSION + 1
        ),
        "{result:?}"
    );
}

#[test]
fn an_announced_4_gib_payload_is_too_large_and_not_allocated() {
    let (mut connector, mut accepted) = pair();
    connector
        .write_all(&header(PROTOCOL_VERSION, u32::MAX))
        .unwrap();
    connector.write_all(&[0; 64]).unwrap();
    let ((result, _), largest) = largest_allocation_during(|| {
        bounded(|deadline| bootstrap::recv_frame(&mut accepted, deadline))
    });
    assert!(
        matches!(result, Err(BootstrapError::TooLarge(u32::MAX))),
        "{result:?}"
    );
    assert!(largest < ALLOCATION_LIMIT, "allocated {largest} bytes");
}

#[test]
fn hostile_lengths_inside_the_payload_are_not_allocated() {
    // A reject whose reason claims 2^60 bytes.
    let mut payload = vec![2, 0, 0, 0];
    payload.extend_from_slice(&(1_u64 << 60).to_le_bytes());
    payload.extend_from_slice(&[b'x'; 100]);
    let (mut connector, mut accepted) = pair();
    connector.write_all(&frame_with_payload(&payload)).unwrap();
    let ((result, _), largest) = largest_allocation_during(|| {
        bounded(|deadline| bootstrap::recv_frame(&mut accepted, deadline))
    });
    assert!(
        matches!(result, Err(BootstrapError::Decode(_))),
        "{result:?}"
    );
    assert!(largest < ALLOCATION_LIMIT, "allocated {largest} bytes");

    // A hello whose SRQ list claims 2^60 entries (see the offset in the unit tests).
    let quiet = EndpointInfo {
        alternate: None,
        ..info(9)
    };
    let mut payload = bootstrap::encode(&Frame::Hello(quiet))[HEADER_LEN..].to_vec();
    payload[40..48].copy_from_slice(&(1_u64 << 60).to_le_bytes());
    payload.extend_from_slice(&[0xff; 4096]);
    let (mut connector, mut accepted) = pair();
    connector.write_all(&frame_with_payload(&payload)).unwrap();
    let ((result, _), largest) = largest_allocation_during(|| {
        bounded(|deadline| bootstrap::recv_frame(&mut accepted, deadline))
    });
    assert!(
        matches!(result, Err(BootstrapError::Decode(_))),
        "{result:?}"
    );
    assert!(largest < ALLOCATION_LIMIT, "allocated {largest} bytes");
}

#[test]
fn a_silent_peer_times_out_at_the_deadline() {
    let (_connector, mut accepted) = pair();
    let (result, deadline) = bounded(|deadline| bootstrap::expect_hello(&mut accepted, deadline));
    assert!(
        matches!(result, Err(BootstrapError::Timeout { .. })),
        "{result:?}"
    );
    assert!(Instant::now() >= deadline, "gave up before the deadline");
}

#[test]
fn a_peer_that_stops_mid_frame_times_out() {
    let bytes = bootstrap::encode(&Frame::Hello(info(7)));
    for cut in [3, HEADER_LEN + 1, bytes.len() - 1] {
        let (mut connector, mut accepted) = pair();
        connector.write_all(&bytes[..cut]).unwrap();
        let (result, deadline) = bounded(|deadline| bootstrap::recv_frame(&mut accepted, deadline));
        assert!(
            matches!(result, Err(BootstrapError::Timeout { .. })),
            "cut at {cut}: {result:?}"
        );
        assert!(Instant::now() >= deadline, "gave up before the deadline");
        drop(connector);
    }
}

#[test]
fn send_never_blocks_past_the_deadline_when_the_peer_does_not_read() {
    let (mut connector, _accepted) = pair();
    let big = Frame::Hello(EndpointInfo {
        transport: Transport::Xrc,
        srq_nums: vec![1; 4096],
        ..info(3)
    });
    let (result, _) = bounded(|deadline| {
        loop {
            if let Err(err) = bootstrap::send_frame(&mut connector, &big, deadline) {
                return err;
            }
        }
    });
    assert!(
        matches!(result, BootstrapError::Timeout { .. }),
        "{result:?}"
    );
}

#[test]
fn connect_fails_fast() {
    // Refused: bind a port, then close it.
    let (listener, addr) = listening();
    drop(listener);
    let (result, _) = bounded(|deadline| bootstrap::connect(addr, deadline));
    assert!(
        matches!(result, Err(BootstrapError::Io { op: "connect", .. })),
        "{result:?}"
    );
    // The message says why (it used to be "bootstrap connect failed" alone).
    let text = result.unwrap_err().to_string();
    assert!(text.contains("refused"), "{text}");
    // A deadline already passed.
    let (_listener, addr) = listening();
    let result = bootstrap::connect(addr, Instant::now());
    assert!(
        matches!(result, Err(BootstrapError::Timeout { .. })),
        "{result:?}"
    );
}

#[test]
fn hello_accept_exchange_succeeds() {
    let (listener, addr) = listening();
    let server = thread::spawn(move || {
        let (mut stream, _) = bootstrap::accept(&listener).unwrap();
        let deadline = Instant::now() + PATIENT;
        let theirs = bootstrap::expect_hello(&mut stream, deadline).unwrap();
        bootstrap::send_frame(&mut stream, &Frame::Accept(info(0x20)), deadline).unwrap();
        theirs
    });
    let (result, _) = bounded(|deadline| {
        let mut stream = bootstrap::connect(addr, deadline)?;
        assert!(stream.nodelay().unwrap());
        stream.set_read_timeout(Some(PATIENT)).unwrap();
        bootstrap::send_frame(&mut stream, &Frame::Hello(info(0x10)), deadline)?;
        let accepted = bootstrap::expect_accept(&mut stream, deadline)?;
        // The caller's read timeout is left as it was.
        assert_eq!(stream.read_timeout().unwrap(), Some(PATIENT));
        Ok::<_, BootstrapError>(accepted)
    });
    assert_eq!(result.unwrap(), info(0x20));
    assert_eq!(server.join().unwrap(), info(0x10));
}

#[test]
fn a_refused_connector_reads_the_reason() {
    let (listener, addr) = listening();
    let server = thread::spawn(move || {
        let (mut stream, _) = bootstrap::accept(&listener).unwrap();
        let deadline = Instant::now() + PATIENT;
        bootstrap::expect_hello(&mut stream, deadline).unwrap();
        bootstrap::reject(&mut stream, "no room for another endpoint", deadline).unwrap();
    });
    let (result, _) = bounded(|deadline| {
        let mut stream = bootstrap::connect(addr, deadline)?;
        bootstrap::send_frame(&mut stream, &Frame::Hello(info(0x10)), deadline)?;
        bootstrap::expect_accept(&mut stream, deadline)
    });
    assert!(
        matches!(&result, Err(BootstrapError::Rejected(reason)) if reason == "no room for another endpoint"),
        "{result:?}"
    );
    server.join().unwrap();
}

#[test]
fn a_bad_hello_is_refused_with_the_reason() {
    let cases = [
        (
            Frame::Hello(EndpointInfo {
                mtu: 1500,
                ..info(1)
            }),
            "mtu",
        ),
        (Frame::Accept(info(1)), "Accept while waiting for Hello"),
    ];
    for (hello, needle) in cases {
        let (listener, addr) = listening();
        let server = thread::spawn(move || {
            let (mut stream, _) = bootstrap::accept(&listener).unwrap();
            bootstrap::expect_hello(&mut stream, Instant::now() + PATIENT)
        });
        let (result, _) = bounded(|deadline| {
            let mut stream = bootstrap::connect(addr, deadline)?;
            bootstrap::send_frame(&mut stream, &hello, deadline)?;
            bootstrap::expect_accept(&mut stream, deadline)
        });
        assert!(
            matches!(&result, Err(BootstrapError::Rejected(reason)) if reason.contains(needle)),
            "{needle}: {result:?}"
        );
        let listener_side = server.join().unwrap();
        assert!(
            matches!(
                listener_side,
                Err(BootstrapError::Invalid(_) | BootstrapError::Unexpected(_))
            ),
            "{listener_side:?}"
        );
    }
}

#[test]
fn long_reject_reasons_are_cut_at_a_character_boundary() {
    let (mut connector, mut accepted) = pair();
    let server = thread::spawn(move || {
        let reason = "é".repeat(MAX_REJECT_REASON);
        bootstrap::reject(&mut accepted, &reason, Instant::now() + PATIENT).unwrap();
    });
    let (result, _) = bounded(|deadline| bootstrap::expect_accept(&mut connector, deadline));
    drop(connector);
    match result {
        Err(BootstrapError::Rejected(reason)) => {
            assert!(reason.len() <= MAX_REJECT_REASON && reason.len() > MAX_REJECT_REASON - 2);
            assert!(reason.chars().all(|c| c == 'é'));
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    server.join().unwrap();
}

#[test]
fn frames_sent_back_to_back_are_received_one_at_a_time() {
    let (mut connector, mut accepted) = pair();
    let deadline = Instant::now() + PATIENT;
    let frames = [
        Frame::Hello(info(1)),
        Frame::Reject("one".to_owned()),
        Frame::Accept(info(2)),
    ];
    let mut all = Vec::new();
    for frame in &frames {
        all.extend_from_slice(&bootstrap::encode(frame));
    }
    connector.write_all(&all).unwrap();
    for frame in &frames {
        assert_eq!(
            &bootstrap::recv_frame(&mut accepted, deadline).unwrap(),
            frame
        );
    }
}
