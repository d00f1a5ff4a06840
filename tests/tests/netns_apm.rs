//! Automatic path migration between two hosts joined by two veth links (network namespaces;
//! root only, skipped otherwise unless `RDMX_REQUIRE_NETNS=1`).
//!
//! Each host opens a two-port soft device, port 1 on link A and port 2 on link B. The RC
//! connection's primary path is link A, its alternate link B, armed on both sides (local ACK
//! timeout 12 = 16.8 ms on both paths, retry_cnt 3). While the client streams numbered
//! messages to the server (256 bytes, one per millisecond, at most 16 outstanding), link A
//! fails; both QPs must migrate to link B (`PathMigrated` on both sides) and the server must
//! get every message exactly once and in order.
//!
//! * `apm_failover_on_link_down`: the cable is pulled — both ends of link A go down, the
//!   client's first. The client's next send fails (no route), its soft device declares port 1
//!   down and migrates at once, as a NIC does when its own port loses the link; the server
//!   follows on the first packet over link B.
//! * `apm_failover_on_far_end_down`: only the server's end goes down. The client's interface
//!   stays up (it only loses the carrier) and its packets vanish without an error: it
//!   migrates when its retries run out (or follows the server, if the server happened to
//!   acknowledge over its dead port and so migrated first).
//!
//! Both check the target 2 x (local ACK timeout x (retry_cnt + 1)) = 134 ms and print a line
//! `APM_FAILOVER scenario=.. link_down_to_first_delivery_ms=.. link_down_to_event_ms=.. ...`
//! (the numbers for docs/BENCHMARKS.md). Times count from the start of the `ip link set down`
//! command that cuts the link; the cut takes effect while it runs (`cut_cmd_ms`, a few
//! milliseconds), so they are upper bounds. `outage_ms` is the pause between the last message
//! over link A and the first over link B as the server saw it.
//!
//! The roles run as the `rdmx-netns-roles` program of this package (`apm-server`,
//! `apm-client`).
#![forbid(unsafe_code)]

use std::io::Write as _;
use std::process::Command;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rdmx_tests::lines::{Line, describe, lines_with, unix_ns, wait_for_line, wait_for_nth};
use rdmx_tests::netns::{Hosts, Link, Topology, list_netns, require_netns_or_skip};
use rdmx_tests::process::Proc;

const ROLES: &str = env!("CARGO_BIN_EXE_rdmx-netns-roles");

/// Messages streamed.
const COUNT: u64 = 2000;
/// Message size (within the 1024-byte path MTU of a 1500-byte veth).
const SIZE: u64 = 256;
/// One message per PACE_US.
const PACE_US: u64 = 1000;
const MAX_OUTSTANDING: u64 = 16;
/// Local ACK timeout exponent: 4.096 us x 2^12 = 16.8 ms.
const ACK_TIMEOUT: u8 = 12;
const RETRY_CNT: u8 = 3;
/// The link is cut once the server has this many messages.
const CUT_AFTER: usize = 300;
/// Bound for the setup waits.
const WAIT: Duration = Duration::from_secs(30);
/// Hard limit of the role processes.
const LIMIT: Duration = Duration::from_secs(120);

/// The tests of this file run one at a time: they measure.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The local ACK timeout in nanoseconds.
fn ack_timeout_ns() -> u64 {
    4096 << ACK_TIMEOUT
}

/// The failover target of the issue: 2 x (local ACK timeout x (retry_cnt + 1)).
fn target_ns() -> u64 {
    2 * ack_timeout_ns() * (u64::from(RETRY_CNT) + 1)
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn device(hosts: &Hosts, host: &str) -> String {
    let h = hosts.host(host);
    format!("soft:{},{}", h.addr("A"), h.addr("B"))
}

fn role(name: &str, device: &str) -> Command {
    let mut c = Command::new(ROLES);
    c.args([name, "--device", device])
        .args(["--count", &COUNT.to_string(), "--size", &SIZE.to_string()])
        .args(["--ack-timeout", &ACK_TIMEOUT.to_string()])
        .args(["--retry-cnt", &RETRY_CNT.to_string()])
        .args(["--linger-ms", "1000"])
        .args(["--limit-s", &LIMIT.as_secs().to_string()]);
    c
}

/// Every `EVENT <name> <ns> ...` line of `p`: `(name, ns, whole line)`.
fn events(p: &Proc) -> Vec<(String, u64, String)> {
    lines_with(&p.stdout_now(), "EVENT")
        .iter()
        .map(|l| {
            (
                l.words
                    .first()
                    .map_or_else(String::new, |w| (*w).to_string()),
                l.pos(1).unwrap_or(0),
                l.words.join(" "),
            )
        })
        .collect()
}

/// The time of `p`'s first `PathMigrated` event.
fn migrated_at(p: &Proc) -> Option<u64> {
    events(p)
        .into_iter()
        .find(|(n, _, _)| n == "PathMigrated")
        .map(|(_, t, _)| t)
}

/// Waits for `p`'s `RESULT` line and its exit; returns the line and whether it succeeded.
fn finish(p: &Proc, who: &str) -> (String, bool) {
    let line = wait_for_line(p, "RESULT", LIMIT + Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{who}: no RESULT: {e}"));
    let ok = p.wait().is_ok_and(|o| o.status.success());
    (line, ok)
}

/// How link A is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// Both ends down, the client's first.
    BothEnds,
    /// Only the server's end down.
    FarEnd,
}

/// One delivery on the server: sequence number, time, the QP's port when it was polled.
#[derive(Debug, Clone, Copy)]
struct Delivery {
    seq: u64,
    ns: u64,
    port: u64,
}

fn deliveries(server: &Proc) -> Vec<Delivery> {
    lines_with(&server.stdout_now(), "RECV")
        .iter()
        .map(|l| Delivery {
            seq: l.pos(0).unwrap_or(u64::MAX),
            ns: l.pos(1).unwrap_or(0),
            port: l.num("port").unwrap_or(0),
        })
        .collect()
}

/// The index of the first delivery over link B.
///
/// A message can only come over link B once the server's QP is on port 2, so it is a
/// `port=2` delivery; and when the server migrated by following the client (on the first
/// packet over link B), the first `port=2` delivery is the first over link B. A server that
/// migrated first, on its own (its acknowledgement over its dead port failed), may still poll
/// messages that came over link A before the cut after it moved: then the stream resumes with
/// the delivery after the longest pause, from the cut until shortly after the client (the
/// requester, whose retransmissions carry the stream to link B) migrated.
fn first_over_b(
    all: &[Delivery],
    cut_start: u64,
    cli_event: u64,
    server_went_first: bool,
) -> Option<usize> {
    let on_b = |i: &usize| all[*i].port == 2 && all[*i].ns > cut_start;
    let first = (1..all.len()).find(on_b);
    if !server_went_first {
        return first;
    }
    // The client's event is stamped when its event thread gets it: a little late.
    let until = cli_event + 5_000_000;
    (1..all.len())
        .filter(on_b)
        .filter(|&i| all[i].ns <= until)
        .max_by_key(|&i| all[i].ns - all[i - 1].ns)
        .or(first)
}

/// Streams from the client to the server, cuts link A as `cut` says once the stream runs,
/// checks the migration and the stream, and prints the failover times.
fn failover(test: &str, cut: Cut) {
    let hosts = Topology::new()
        .host("cli")
        .host("srv")
        .link(Link::new("A", "cli", "srv"))
        .link(Link::new("B", "cli", "srv"))
        .build()
        .expect("build the topology");

    let srv_a = hosts.host("srv").addr("A");
    let mut c = role("apm-server", &device(&hosts, "srv"));
    c.args(["--listen", &format!("{srv_a}:0")]);
    let server = hosts
        .spawn_with_timeout("srv", c, LIMIT + Duration::from_secs(10))
        .expect("start the server");
    let listen = wait_for_line(&server, "LISTEN", WAIT).unwrap_or_else(|e| panic!("{e}"));
    let target = Line::parse(&listen)
        .and_then(|l| l.words.first().map(|w| (*w).to_string()))
        .expect("LISTEN <addr>");

    let mut c = role("apm-client", &device(&hosts, "cli"));
    c.args(["--connect", &target])
        .args(["--pace-us", &PACE_US.to_string()])
        .args(["--max-outstanding", &MAX_OUTSTANDING.to_string()]);
    let client = hosts
        .spawn_with_timeout("cli", c, LIMIT + Duration::from_secs(10))
        .expect("start the client");

    // Both sides armed by the first messages, and the stream running on link A.
    for (who, p) in [("server", &server), ("client", &client)] {
        wait_for_line(p, "ARMED", WAIT).unwrap_or_else(|e| panic!("{who}: {e}"));
    }
    wait_for_nth(&server, "RECV", CUT_AFTER, WAIT).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        migrated_at(&server).is_none() && migrated_at(&client).is_none(),
        "migrated before the link was cut:\n{}\n{}",
        describe(&server),
        describe(&client)
    );
    assert!(
        deliveries(&server).iter().all(|d| d.port == 1),
        "deliveries over link B before the cut"
    );

    // The cut. (`Hosts::link_down` takes both ends down too; done one by one here to
    // choose the order and time the first command, which is the cut.)
    let first = match cut {
        Cut::BothEnds => "cli",
        Cut::FarEnd => "srv",
    };
    let cut_start = unix_ns();
    hosts.iface_down(first, "A").expect("take link A down");
    let cut_cmd = unix_ns() - cut_start;
    if cut == Cut::BothEnds {
        hosts.iface_down("srv", "A").expect("take link A down");
    }

    let (srv_line, srv_ok) = finish(&server, "server");
    let (cli_line, cli_ok) = finish(&client, "client");
    eprintln!("server: {srv_line}\nclient: {cli_line}");
    for (who, p) in [("server", &server), ("client", &client)] {
        for (_, t, l) in events(p) {
            eprintln!(
                "{who}: EVENT {l} ({:+.3} ms after the cut)",
                (t as f64 - cut_start as f64) / 1e6
            );
        }
    }
    let all = deliveries(&server);
    let around: Vec<String> = all
        .iter()
        .filter(|d| d.ns + 5_000_000 > cut_start && d.ns < cut_start + target_ns() + 20_000_000)
        .map(|d| {
            format!(
                "{}@{:+.2}ms/p{}",
                d.seq,
                (d.ns as f64 - cut_start as f64) / 1e6,
                d.port
            )
        })
        .collect();
    eprintln!("deliveries around the cut: {}", around.join(" "));

    // The stream: every message exactly once, in order, intact; no error on either side.
    let s = Line::parse(&srv_line).expect("server RESULT");
    let c = Line::parse(&cli_line).expect("client RESULT");
    let detail = || format!("{}\n{}", describe(&server), describe(&client));
    assert_eq!(s.num("got"), Some(COUNT), "{}", detail());
    assert_eq!(s.flag("in_order"), Some(true), "{}", detail());
    assert_eq!(s.flag("intact"), Some(true), "{}", detail());
    assert_eq!(s.num("extra"), Some(0), "duplicates: {}", detail());
    assert_eq!(s.field("error"), Some("none"), "{}", detail());
    assert_eq!(c.num("completed"), Some(COUNT), "{}", detail());
    assert_eq!(c.field("error"), Some("none"), "{}", detail());
    let seqs: Vec<u64> = all.iter().map(|d| d.seq).collect();
    assert_eq!(seqs, (0..COUNT).collect::<Vec<u64>>(), "RECV lines");
    assert!(srv_ok && cli_ok, "a role failed: {}", detail());

    // Both migrated to port 2, and the rest of the stream went over link B.
    for r in [&s, &c] {
        assert_eq!(r.field("mig_state"), Some("Migrated"), "{}", detail());
        assert_eq!(r.num("port"), Some(2), "{}", detail());
    }
    let cli_event = migrated_at(&client).unwrap_or_else(|| panic!("client: {}", detail()));
    let srv_event = migrated_at(&server).unwrap_or_else(|| panic!("server: {}", detail()));
    assert!(
        cli_event > cut_start && srv_event > cut_start,
        "PathMigrated before the cut: {}",
        detail()
    );
    assert!(
        all.iter().skip_while(|d| d.port != 2).all(|d| d.port == 2),
        "deliveries went back to link A"
    );
    let port_error = |p: &Proc| {
        events(p)
            .into_iter()
            .find(|(n, _, l)| n == "PortError" && l.contains("port=1"))
            .map(|(_, t, _)| t)
    };
    let (cli_port_error, srv_port_error) = (port_error(&client), port_error(&server));
    match cut {
        // The client saw its port fail on a send.
        Cut::BothEnds => assert!(cli_port_error.is_some(), "{}", detail()),
        // Nothing fails locally at the client when the cut happens: it migrates when its
        // retries run out, or follows the server if the server tried to acknowledge over its
        // dead port. (A veth whose far end goes down loses its carrier too; the NIC's link
        // check notices that some time later — the kernel reports carrier changes with a
        // delay — and may then report the port down, after the migration.)
        Cut::FarEnd => assert!(cli_port_error.is_none_or(|t| t > cli_event), "{}", detail()),
    }
    let server_went_first = srv_port_error.is_some_and(|t| t <= srv_event);
    // What made each side migrate: a failed send on its own port 1, its retries running out
    // (client), or the peer's MigReq bit on a packet over link B.
    let cli_retries_out = c
        .num("ack_timeouts")
        .is_some_and(|n| n > u64::from(RETRY_CNT));
    let client_cause = match cli_port_error {
        Some(_) => "port_error",
        None if cli_retries_out => "retries_exhausted",
        None => "peer_migreq",
    };
    let server_cause = if server_went_first {
        "port_error"
    } else {
        "peer_migreq"
    };

    // The failover times, from the start of the command that cut the link.
    let i = first_over_b(&all, cut_start, cli_event, server_went_first)
        .unwrap_or_else(|| panic!("no delivery after the migration: {}", detail()));
    let (resumed, before) = (all[i], all[i - 1]);
    let to_delivery = resumed.ns - cut_start;
    let to_event = cli_event - cut_start;
    let outage = resumed.ns - before.ns;
    // Past the test harness's capture, so that it shows in the `cargo test` output.
    let _ = writeln!(
        std::io::stderr(),
        "APM_FAILOVER scenario={test} link_down_to_first_delivery_ms={:.1} \
         link_down_to_event_ms={:.1} link_down_to_server_event_ms={:.1} outage_ms={:.1} \
         cut_cmd_ms={:.1} client_migrated_on={client_cause} \
         server_migrated_on={server_cause} timeout={ACK_TIMEOUT} timeout_ms={:.1} \
         retry_cnt={RETRY_CNT} target_ms={:.1} pace_us={PACE_US} size={SIZE} \
         client_retransmits={} client_ack_timeouts={}",
        ms(to_delivery),
        ms(to_event),
        ms(srv_event.saturating_sub(cut_start)),
        ms(outage),
        ms(cut_cmd),
        ms(ack_timeout_ns()),
        ms(target_ns()),
        c.field("retransmits").unwrap_or("?"),
        c.field("ack_timeouts").unwrap_or("?"),
    );
    // The cut happened at some point while its command ran (`cut_cmd`): only a failover
    // slower than the target even when counted from the command's end is a failure.
    let late = |t: u64| t.saturating_sub(cut_cmd) >= target_ns();
    assert!(
        !late(to_delivery) && !late(to_event) && outage < target_ns(),
        "failover slower than 2 x timeout x (retry_cnt + 1) = {:.1} ms: first delivery over \
         link B {:.1} ms and the client's PathMigrated {:.1} ms after the cut command started \
         (it ran {:.1} ms); deliveries stopped for {:.1} ms",
        ms(target_ns()),
        ms(to_delivery),
        ms(to_event),
        ms(cut_cmd),
        ms(outage)
    );

    drop((server, client));
    let run_id = hosts.run_id().to_string();
    drop(hosts);
    let left: Vec<String> = list_netns()
        .expect("ip netns list")
        .into_iter()
        .filter(|n| n.starts_with(&format!("{run_id}-")))
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

#[test]
fn apm_failover_on_link_down() {
    if !require_netns_or_skip("apm_failover_on_link_down") {
        return;
    }
    let _serial = serial();
    failover("link_down", Cut::BothEnds);
}

#[test]
fn apm_failover_on_far_end_down() {
    if !require_netns_or_skip("apm_failover_on_far_end_down") {
        return;
    }
    let _serial = serial();
    failover("far_end_down", Cut::FarEnd);
}
