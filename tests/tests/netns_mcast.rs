//! UD multicast between hosts (network namespaces; root only, skipped otherwise unless
//! `RDMX_REQUIRE_NETNS=1`): three receivers and a sender that is not a member, on one
//! bridge. Every receiver gets every datagram in order; after one detaches it gets nothing
//! more while the others still do.
//!
//! The roles run as the `rdmx-netns-roles` program of this package (`mcast-recv`,
//! `mcast-send`).
#![forbid(unsafe_code)]

use std::process::Command;
use std::time::Duration;

use rdmx_tests::lines::{Line, describe, lines_with, wait_for_line, wait_for_nth};
use rdmx_tests::netns::{Bridge, Hosts, Topology, list_netns, require_netns_or_skip};
use rdmx_tests::process::Proc;

const ROLES: &str = env!("CARGO_BIN_EXE_rdmx-netns-roles");

/// Datagrams per round.
const N: u64 = 200;
/// The multicast group (the namespaces keep it private to this test).
const GROUP: &str = "239.18.7.1";
const QKEY: &str = "0x11112222";
/// Sender pacing: UD has no flow control.
const PACE_US: &str = "200";
/// How long the detached receiver keeps listening; must outlast the second round.
const GRACE_MS: u64 = 4000;
/// Bound for every wait on a role's output.
const WAIT: Duration = Duration::from_secs(30);
/// Hard limit of every role process.
const LIMIT: Duration = Duration::from_secs(90);

fn device(hosts: &Hosts, host: &str) -> String {
    format!("soft:{}", hosts.host(host).addr("lan"))
}

fn start_receiver(hosts: &Hosts, host: &str, count: u64, detach_after: Option<u64>) -> Proc {
    let mut c = Command::new(ROLES);
    c.args(["mcast-recv", "--device", &device(hosts, host)])
        .args(["--group", GROUP, "--qkey", QKEY])
        .args(["--count", &count.to_string()])
        .args(["--grace-ms", &GRACE_MS.to_string(), "--wait-s", "60"])
        .args(["--limit-s", &LIMIT.as_secs().to_string()]);
    if let Some(k) = detach_after {
        c.args(["--detach-after", &k.to_string()]);
    }
    hosts
        .spawn_with_timeout(host, c, LIMIT + Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("start the receiver in {host}: {e}"))
}

/// Runs the sender for datagrams `first..first + N` and checks it sent them all.
fn send_round(hosts: &Hosts, first: u64) {
    let mut c = Command::new(ROLES);
    c.args(["mcast-send", "--device", &device(hosts, "snd")])
        .args(["--group", GROUP, "--qkey", QKEY, "--pace-us", PACE_US])
        .args(["--count", &N.to_string(), "--first", &first.to_string()])
        .args(["--limit-s", "60"]);
    let out = hosts
        .run_with_timeout("snd", c, Duration::from_secs(70))
        .expect("run the sender");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "sender failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let result = lines_with(&stdout, "RESULT");
    let r = result
        .first()
        .unwrap_or_else(|| panic!("no RESULT from the sender:\n{stdout}"));
    assert_eq!(r.num("sent"), Some(N), "{stdout}");
    assert_eq!(r.num("completed"), Some(N), "{stdout}");
    eprintln!("sender round from {first}: {}", r.words.join(" "));
}

/// The sequence numbers a receiver has printed so far.
fn seqs(p: &Proc, keyword: &str) -> Vec<u64> {
    lines_with(&p.stdout_now(), keyword)
        .iter()
        .map(|l| l.pos(0).unwrap_or(u64::MAX))
        .collect()
}

/// Waits for `p`'s `RESULT` line and its exit; returns the line and whether it succeeded.
fn result_of(p: &Proc, who: &str) -> (String, bool) {
    let line = wait_for_line(p, "RESULT", WAIT).unwrap_or_else(|e| panic!("{who}: {e}"));
    let ok = p.wait().is_ok_and(|o| o.status.success());
    (line, ok)
}

#[test]
fn multicast_across_three_namespaces() {
    if !require_netns_or_skip("multicast_across_three_namespaces") {
        return;
    }
    let receivers = ["r1", "r2", "r3"];
    let hosts = Topology::new()
        .host("r1")
        .host("r2")
        .host("r3")
        .host("snd")
        .bridge(Bridge::new("lan", ["r1", "r2", "r3", "snd"]))
        .build()
        .expect("build the topology");

    // r1 leaves the group after the first round; r2 and r3 stay for both.
    let procs: Vec<Proc> = receivers
        .iter()
        .map(|&h| {
            if h == "r1" {
                start_receiver(&hosts, h, 2 * N, Some(N))
            } else {
                start_receiver(&hosts, h, 2 * N, None)
            }
        })
        .collect();
    for p in &procs {
        let ready = wait_for_line(p, "READY", WAIT).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("{ready}");
    }

    // Round 1: everybody gets 0..N, in order.
    send_round(&hosts, 0);
    for (h, p) in receivers.iter().zip(&procs) {
        wait_for_nth(p, "RECV", N as usize, WAIT)
            .unwrap_or_else(|e| panic!("{h}: round 1 incomplete: {e}"));
        let got = seqs(p, "RECV");
        assert_eq!(
            got,
            (0..N).collect::<Vec<u64>>(),
            "{h}: round 1 out of order"
        );
    }
    let detached = wait_for_line(&procs[0], "DETACHED", WAIT).unwrap_or_else(|e| panic!("{e}"));

    // Round 2: r1 has left; r2 and r3 get N..2N.
    send_round(&hosts, N);
    let r1 = &procs[0];
    for (h, p) in receivers.iter().zip(&procs).skip(1) {
        let (line, ok) = result_of(p, h);
        let r = Line::parse(&line).expect("a RESULT line");
        eprintln!("{h}: {line}");
        assert_eq!(r.num("got"), Some(2 * N), "{h}: {line}");
        assert_eq!(r.flag("seqs_ok"), Some(true), "{h}: {line}");
        assert_eq!(r.flag("intact"), Some(true), "{h}: {line}");
        assert_eq!(
            seqs(p, "RECV"),
            (0..2 * N).collect::<Vec<u64>>(),
            "{h}: out of order"
        );
        assert!(ok, "{h}: {}", describe(p));
        // r1 must still be listening when the others have everything.
        assert!(
            r1.try_status().is_none() && lines_with(&r1.stdout_now(), "RESULT").is_empty(),
            "r1 stopped listening before round 2 was over; raise GRACE_MS: {}",
            describe(r1)
        );
    }
    let (line, ok) = result_of(r1, "r1");
    eprintln!("r1: {detached}\nr1: {line}");
    let r = Line::parse(&line).expect("a RESULT line");
    assert_eq!(r.num("got"), Some(N), "r1: {line}");
    assert_eq!(r.flag("seqs_ok"), Some(true), "r1: {line}");
    assert_eq!(r.flag("detached"), Some(true), "r1: {line}");
    assert_eq!(
        r.num("late"),
        Some(0),
        "r1 received after detaching: {:?}",
        seqs(r1, "LATE")
    );
    assert!(seqs(r1, "LATE").is_empty());
    assert!(ok, "r1: {}", describe(r1));

    drop(procs);
    let run_id = hosts.run_id().to_string();
    drop(hosts);
    let left: Vec<String> = list_netns()
        .expect("ip netns list")
        .into_iter()
        .filter(|n| n.starts_with(&format!("{run_id}-")))
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}
