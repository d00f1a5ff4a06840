//! Blocking waits are woken when what they wait for arrives, not by the background thread's
//! tick. A lost wake-up shows as a round trip that takes about one tick (peer timeout / 4,
//! at most 100 ms); these tests use the default 2 s peer timeout, so a 100 ms tick, and
//! bound the worst round trip well below it.
//!
//! This file is its own test binary: its timing bounds are not shared with other tests'
//! load (cargo runs test binaries one after another).
#![allow(missing_docs)]

use std::time::{Duration, Instant};

use rdmx_rc::{Context, Endpoint};

const T: Duration = Duration::from_secs(20);

/// The worst round trip allowed: a lost wake-up costs a whole 100 ms tick, while a noisy
/// two-core machine delays a loopback round trip by a few milliseconds (up to ~27 ms seen
/// in a debug build with the three tests side by side).
const WORST: Duration = Duration::from_millis(70);

/// A context with the wait settings these tests are about (whatever the environment says):
/// blocking calls spin 50 us, then sleep; the tick is 100 ms.
fn context() -> Context {
    Context::builder()
        .busy_poll(Duration::from_micros(50))
        .peer_timeout(Duration::from_secs(2))
        .pool_max(64 << 20)
        .build()
        .expect("context")
}

fn pair() -> (Context, Endpoint, Context, Endpoint) {
    let server = context();
    let listener = server.listen("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr();
    let client = context();
    let (cep, sep) = std::thread::scope(|s| {
        let h = s.spawn(|| listener.accept_timeout(T).expect("accept"));
        let cep = client.connect(addr).expect("connect");
        (cep, h.join().expect("accept thread"))
    });
    (client, cep, server, sep)
}

/// Round-trip times, sorted, as a line for a failure message.
fn summary(rtts: &mut [Duration]) -> String {
    rtts.sort();
    let at = |q: f64| rtts[((rtts.len() - 1) as f64 * q) as usize];
    let slow = rtts.iter().filter(|d| **d >= WORST).count();
    format!(
        "{} round trips: p50 {:?}, p99 {:?}, max {:?}; {slow} at or over {WORST:?}",
        rtts.len(),
        at(0.5),
        at(0.99),
        at(1.0)
    )
}

/// Ping-pongs `rounds` messages of `len` bytes; the server answers from `serve`, which
/// receives one message by whichever call the test is about.
fn ping_pong(
    len: usize,
    rounds: usize,
    serve: fn(&Context, &Endpoint) -> rdmx_rc::Message,
) -> (Vec<Duration>, String) {
    let (client, cep, server, sep) = pair();
    let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..rounds {
                let m = serve(&server, &sep);
                sep.send(&m).expect("echo");
            }
        });
        let mut rtts = Vec::with_capacity(rounds);
        for i in 0..rounds {
            let t = Instant::now();
            cep.send(&payload).expect("send");
            let m = cep.recv_timeout(T).expect("echo back");
            rtts.push(t.elapsed());
            assert_eq!(m.len(), len, "round {i}");
            assert!(m[..] == payload[..], "round {i}: the echo differs");
        }
        let nics = format!(
            "client NIC {:?}; server NIC {:?}",
            client.device_counters(),
            server.device_counters()
        );
        (rtts, nics)
    })
}

/// Fails when the worst round trip reached [`WORST`] (with the devices' counters: a lost
/// packet shows as an ACK timeout, not a lost wake-up).
fn check((mut rtts, nics): (Vec<Duration>, String)) {
    let line = summary(&mut rtts);
    eprintln!("{line}");
    assert!(
        rtts.last().is_some_and(|m| *m < WORST),
        "a blocking wait slept through its wake-up: {line}; {nics}"
    );
}

/// Rendezvous messages (100,000 bytes, above the 32 KiB threshold): the server answers from
/// `Context::recv_timeout`, the client waits in `Endpoint::recv_timeout`. Before the fix
/// about 0.1-0.2 % of them waited for the tick.
#[test]
fn rendezvous_round_trips_are_never_late_by_a_tick_context_recv() {
    check(ping_pong(100_000, 4_000, |ctx, _| {
        ctx.recv_timeout(T).expect("server recv")
    }));
}

/// The same with the server in `Endpoint::recv_timeout`.
#[test]
fn rendezvous_round_trips_are_never_late_by_a_tick_endpoint_recv() {
    check(ping_pong(100_000, 4_000, |_, ep| {
        ep.recv_timeout(T).expect("server recv")
    }));
}

/// Eager messages just under the threshold, for comparison: one completion per message.
#[test]
fn eager_round_trips_are_never_late_by_a_tick() {
    check(ping_pong(30_000, 4_000, |ctx, _| {
        ctx.recv_timeout(T).expect("server recv")
    }));
}
