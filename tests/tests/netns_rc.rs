//! Multi-host tests in network namespaces (root only; skipped otherwise unless
//! `RDMX_REQUIRE_NETNS=1`):
//!
//! * `rdmx perf` over RC between two hosts joined by a veth link;
//! * self-tests of the test-hosts helper: reachability over links and bridges, taking links
//!   down and up, stale-namespace cleanup and teardown.
//!
//! The `rdmx` command is found (and built if needed) with [`rdmx_bin`]; set `RDMX_BIN` to use
//! a given binary.
#![forbid(unsafe_code)]

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rdmx_tests::bins::rdmx_bin;
use rdmx_tests::json::Json;
use rdmx_tests::netns::{Bridge, Hosts, Link, Topology, list_netns, require_netns_or_skip};
use rdmx_tests::probe::ECHO_PORT;
use rdmx_tests::process::Proc;

/// The tests of this file run one at a time: they measure (on small shared machines), and
/// each checks that nothing of this process is left once its hosts are dropped.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Largest header overhead of a full-MTU RoCEv2 packet on the wire: IPv4 (20) + UDP (8) +
/// BTH (12) + RETH (16) + ImmDt (4) + ICRC (4).
const ROCE_OVERHEAD: u64 = 64;

/// Limit for one `rdmx perf` client run.
const PERF_TIMEOUT: Duration = Duration::from_secs(240);

const PROBE: &str = env!("CARGO_BIN_EXE_rdmx-netns-probe");

fn ns_prefix() -> String {
    format!("rdmx-{}-", std::process::id())
}

/// The bytes value of a `rdmx devices` field like `active_mtu:\t1024 (3)`.
fn devices_field(out: &str, field: &str) -> Option<u64> {
    out.lines()
        .find_map(|l| l.trim().strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Transmitted and received bytes of `host`'s interface on `segment` (`ip -j -s link`).
fn iface_bytes(hosts: &Hosts, host: &str, segment: &str) -> (u64, u64) {
    let dev = &hosts.host(host).iface(segment).expect("interface").dev;
    let out = hosts
        .ip_in(host, &["-j", "-s", "link", "show", "dev", dev])
        .expect("ip -j -s link show");
    let v = Json::parse(&out).unwrap_or_else(|e| panic!("ip -j output: {e}: {out}"));
    let stats = v
        .as_array()
        .and_then(|a| a.first())
        .and_then(|l| l.get("stats64"))
        .unwrap_or_else(|| panic!("no stats64 in {out}"));
    let get = |dir: &str| {
        stats
            .path(&[dir, "bytes"])
            .and_then(Json::as_u64)
            .unwrap_or_else(|| panic!("no {dir}.bytes in {out}"))
    };
    (get("tx"), get("rx"))
}

/// Runs one `rdmx perf` client in host `b` against `target` and returns its single JSON
/// result line.
fn perf_client(
    hosts: &Hosts,
    rdmx: &Path,
    server: &Proc,
    target: &str,
    device: &str,
    args: &[&str],
) -> Json {
    let mut c = Command::new(rdmx);
    c.args(["perf", "--connect", target, "--device", device, "--json"])
        .args(args);
    let out = hosts
        .run_with_timeout("b", c, PERF_TIMEOUT)
        .unwrap_or_else(|e| panic!("rdmx perf {args:?}: {e}\nserver: {}", server.stderr_now()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "rdmx perf {args:?} failed ({}):\nstdout: {stdout}\nstderr: {stderr}\nserver stderr: {}",
        out.status,
        server.stderr_now()
    );
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with('{')).collect();
    assert_eq!(
        lines.len(),
        1,
        "one JSON line expected from {args:?}:\n{stdout}"
    );
    let v = Json::parse(lines[0]).unwrap_or_else(|e| panic!("{e}: {}", lines[0]));
    println!("{}", lines[0]);
    v
}

fn num(v: &Json, key: &str) -> f64 {
    v.get(key)
        .and_then(Json::as_f64)
        .unwrap_or_else(|| panic!("no number {key:?} in {v:?}"))
}

/// Checks the fields every result has; returns the path MTU it used.
fn check_common(v: &Json, test: &str, size: u64, iters: u64, device: &str) -> u64 {
    assert_eq!(v.get("test").and_then(Json::as_str), Some(test), "{v:?}");
    assert_eq!(v.get("transport").and_then(Json::as_str), Some("rc"));
    assert_eq!(v.get("size").and_then(Json::as_u64), Some(size));
    assert_eq!(v.get("iters").and_then(Json::as_u64), Some(iters));
    let dev = v.get("device").and_then(Json::as_str).unwrap_or_default();
    assert!(dev.starts_with(device), "device {dev:?}, expected {device}");
    let elapsed = num(v, "elapsed_s");
    assert!(
        elapsed > 0.0 && elapsed < PERF_TIMEOUT.as_secs_f64(),
        "elapsed_s {elapsed}"
    );
    let rate = num(v, "msg_rate");
    let want_rate = iters as f64 / elapsed;
    assert!(
        (rate - want_rate).abs() <= want_rate * 0.05,
        "msg_rate {rate} vs iters/elapsed {want_rate}"
    );
    v.get("mtu")
        .and_then(Json::as_u64)
        .unwrap_or_else(|| panic!("no mtu in {v:?}"))
}

fn check_latency(v: &Json) {
    let (min, p50, p99, max, avg) = (
        num(v, "lat_min_us"),
        num(v, "lat_p50_us"),
        num(v, "lat_p99_us"),
        num(v, "lat_max_us"),
        num(v, "lat_avg_us"),
    );
    assert!(min > 0.0, "lat_min_us {min}");
    assert!(
        min <= p50 && p50 <= p99 && p99 <= max,
        "{min} {p50} {p99} {max}"
    );
    assert!(min <= avg && avg <= max, "avg {avg} outside [{min}, {max}]");
    // A veth round trip between namespaces is microseconds; 20 ms would be broken.
    assert!(p50 < 20_000.0, "lat_p50_us {p50}");
}

fn check_bandwidth(v: &Json, size: u64, iters: u64) {
    assert!(v.get("lat_p50_us").is_some_and(Json::is_null), "{v:?}");
    assert!(
        v.get("tx_depth")
            .and_then(Json::as_u64)
            .is_some_and(|d| d > 0)
    );
    let bw = num(v, "bw_MBps");
    let elapsed = num(v, "elapsed_s");
    let want = (size * iters) as f64 / 1e6 / elapsed;
    assert!(
        (bw - want).abs() <= want * 0.05,
        "bw_MBps {bw} vs size*iters/elapsed {want}"
    );
    assert!(bw > 1.0 && bw < 100_000.0, "bw_MBps {bw}");
}

#[test]
fn rc_perf_between_two_hosts() {
    if !require_netns_or_skip("rc_perf_between_two_hosts") {
        return;
    }
    let _serial = serial();
    let rdmx: PathBuf =
        rdmx_bin().unwrap_or_else(|e| panic!("cannot find or build the rdmx command: {e}"));
    let link_mtu = 1500;
    let hosts = Topology::new()
        .host("a")
        .host("b")
        .link(Link::new("ab", "a", "b").mtu(link_mtu))
        .build()
        .expect("build the topology");
    let a = hosts.host("a").addr("ab");
    let b = hosts.host("b").addr("ab");
    let (dev_a, dev_b) = (format!("soft:{a}"), format!("soft:{b}"));

    // What the soft device says about itself on a 1500-byte veth.
    let mut c = Command::new(&rdmx);
    c.args(["devices", "--device", &dev_a]);
    let devices = hosts.run_ok("a", c).expect("rdmx devices");
    println!("rdmx devices --device {dev_a} (in host a):\n{devices}");
    let active_mtu = devices_field(&devices, "active_mtu:")
        .unwrap_or_else(|| panic!("no active_mtu in:\n{devices}"));
    assert!(
        active_mtu + ROCE_OVERHEAD <= u64::from(link_mtu),
        "active_mtu {active_mtu} does not fit a {link_mtu}-byte link"
    );

    let mut c = Command::new(&rdmx);
    c.args(["perf", "--server", "--port", "0", "--print-port"])
        .args(["--bind", &a.to_string(), "--device", &dev_a]);
    let server = hosts.spawn("a", c).expect("start the perf server");
    let port = server
        .wait_stdout_line(Duration::from_secs(60))
        .expect("the server's port");
    let target = format!("{a}:{port}");

    let runs: [(&str, u64, u64); 3] = [
        ("send_lat", 64, 2000),
        ("write_bw", 65536, 200),
        ("read_bw", 65536, 200),
    ];
    for (test, size, iters) in runs {
        let (a_tx0, a_rx0) = iface_bytes(&hosts, "a", "ab");
        let (b_tx0, b_rx0) = iface_bytes(&hosts, "b", "ab");
        let v = perf_client(
            &hosts,
            &rdmx,
            &server,
            &target,
            &dev_b,
            &[
                "--test",
                test,
                "--size",
                &size.to_string(),
                "--iters",
                &iters.to_string(),
            ],
        );
        let mtu = check_common(&v, test, size, iters, &dev_b);
        assert!(
            (256..=active_mtu).contains(&mtu),
            "{test}: path MTU {mtu} above the port's active MTU {active_mtu}"
        );
        assert!(
            mtu + ROCE_OVERHEAD <= u64::from(link_mtu),
            "{test}: path MTU {mtu} does not fit the {link_mtu}-byte veth"
        );
        if test.ends_with("_lat") {
            check_latency(&v);
        } else {
            check_bandwidth(&v, size, iters);
        }
        // The payload really crossed the veth, in the direction of the data.
        let (a_tx1, a_rx1) = iface_bytes(&hosts, "a", "ab");
        let (b_tx1, b_rx1) = iface_bytes(&hosts, "b", "ab");
        let payload = size * iters;
        let (sent, received) = match test {
            "read_bw" => (a_tx1 - a_tx0, b_rx1 - b_rx0),
            _ => (b_tx1 - b_tx0, a_rx1 - a_rx0),
        };
        assert!(
            sent >= payload && received >= payload,
            "{test}: {payload} payload bytes, but the veth counted {sent} sent and \
             {received} received"
        );
    }

    assert!(
        server.try_status().is_none(),
        "the perf server exited early: {}",
        server.stderr_now()
    );
    assert!(server.kill());
    drop(hosts);
    let left: Vec<String> = list_netns()
        .expect("ip netns list")
        .into_iter()
        .filter(|n| n.starts_with(&ns_prefix()))
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

/// Whether `from` gets an answer from the echo server at `to` within `timeout`.
fn reaches(hosts: &Hosts, from: &str, to: Ipv4Addr, timeout: Duration) -> bool {
    let mut c = Command::new(PROBE);
    c.args([
        "ping",
        &format!("{to}:{ECHO_PORT}"),
        &timeout.as_millis().to_string(),
    ]);
    let out = hosts
        .run_with_timeout(from, c, timeout + Duration::from_secs(10))
        .expect("run the probe");
    out.status.success()
}

/// Starts an echo server in every host.
fn start_echo_servers(hosts: &Hosts, names: &[&str]) -> Vec<Proc> {
    names
        .iter()
        .map(|h| {
            let mut c = Command::new(PROBE);
            c.args(["echo", &format!("0.0.0.0:{ECHO_PORT}"), "300"]);
            let p = hosts.spawn(h, c).expect("start the echo server");
            let line = p
                .wait_stdout_line(Duration::from_secs(30))
                .expect("echo server ready");
            assert!(line.starts_with("ready"), "{line}");
            p
        })
        .collect()
}

/// A pid that does not exist right now (for a fake stale namespace).
fn dead_pid() -> u32 {
    (3_999_000..4_000_000)
        .find(|p| !Path::new(&format!("/proc/{p}")).exists())
        .expect("a free pid")
}

#[test]
fn hosts_helper_links_bridge_and_teardown() {
    if !require_netns_or_skip("hosts_helper_links_bridge_and_teardown") {
        return;
    }
    let _serial = serial();
    let short = Duration::from_millis(300);
    let long = Duration::from_secs(3);

    // A stale namespace of a process that is gone: the next build deletes it.
    let stale = format!("rdmx-{}-0-old", dead_pid());
    let mut c = Command::new("ip");
    c.args(["netns", "add", &stale]);
    rdmx_tests::process::run_ok(c, Duration::from_secs(20)).expect("create a stale namespace");

    let names = ["h1", "h2", "h3"];
    let hosts = Topology::new()
        .host("h1")
        .host("h2")
        .host("h3")
        .link(Link::new("p12", "h1", "h2").mtu(9000))
        .bridge(Bridge::new("lan", names))
        .build()
        .expect("build the topology");
    let listed = list_netns().expect("ip netns list");
    assert!(
        !listed.contains(&stale),
        "stale namespace {stale} survived the build"
    );
    assert_eq!(hosts.namespaces().len(), 4, "3 hosts and the bridge");
    for ns in hosts.namespaces() {
        assert!(ns.starts_with(&format!("{}-", hosts.run_id())), "{ns}");
        assert!(listed.contains(ns), "{ns} not in {listed:?}");
    }
    assert_eq!(hosts.host("h1").netns(), format!("{}-h1", hosts.run_id()));

    // Addresses, loopback and MTU as described.
    assert_eq!(hosts.host("h1").addr("p12"), Ipv4Addr::new(198, 18, 0, 1));
    assert_eq!(hosts.host("h2").addr("p12"), Ipv4Addr::new(198, 18, 0, 2));
    assert_eq!(hosts.host("h3").addr("lan"), Ipv4Addr::new(198, 18, 1, 3));
    assert_eq!(hosts.host("h3").try_addr("p12"), None);
    for h in names {
        assert!(
            hosts.iface_state(h, "lo").expect("lo state").admin_up,
            "lo of {h}"
        );
        let addrs = hosts.ip_in(h, &["-4", "-o", "addr", "show"]).expect("addr");
        for i in hosts.host(h).ifaces() {
            assert!(addrs.contains(&format!("{}/24", i.addr)), "{h}: {addrs}");
        }
    }
    let p12 = hosts
        .ip_in("h2", &["-o", "link", "show", "dev", "p12"])
        .expect("link");
    assert!(p12.contains(" mtu 9000 "), "{p12}");
    // The root namespace has none of it.
    let root_addrs = rdmx_tests::process::run_ok(
        {
            let mut c = Command::new("ip");
            c.args(["-4", "-o", "addr", "show"]);
            c
        },
        Duration::from_secs(20),
    )
    .expect("root addresses");
    assert!(!root_addrs.contains("198.18."), "{root_addrs}");

    // Everybody reaches everybody: over the bridge, and over the link.
    let echo = start_echo_servers(&hosts, &names);
    for from in names {
        for to in names.iter().filter(|&&t| t != from) {
            let addr = hosts.host(to).addr("lan");
            assert!(reaches(&hosts, from, addr, long), "{from} -> {to} ({addr})");
        }
    }
    let (h1_p12, h2_p12) = (hosts.host("h1").addr("p12"), hosts.host("h2").addr("p12"));
    assert!(reaches(&hosts, "h1", h2_p12, long));
    assert!(reaches(&hosts, "h2", h1_p12, long));

    // Cut the link: both ends down, no traffic; the bridge still works.
    hosts.link_down("p12").expect("link down");
    for h in ["h1", "h2"] {
        let s = hosts.iface_state(h, "p12").expect("state");
        assert!(!s.admin_up && !s.carrier, "{h}: {s:?}");
    }
    assert!(!reaches(&hosts, "h1", h2_p12, short));
    assert!(reaches(&hosts, "h1", hosts.host("h2").addr("lan"), long));
    hosts.link_up("p12").expect("link up");
    hosts.wait_carrier("p12", long).expect("carrier back");
    assert!(reaches(&hosts, "h1", h2_p12, long), "p12 after link_up");

    // One host off the bridge.
    hosts.iface_down("h3", "lan").expect("iface down");
    assert!(!hosts.iface_state("h3", "lan").expect("state").admin_up);
    assert!(hosts.iface_state("h1", "lan").expect("state").admin_up);
    assert!(!reaches(&hosts, "h1", hosts.host("h3").addr("lan"), short));
    assert!(reaches(&hosts, "h1", hosts.host("h2").addr("lan"), long));
    hosts.iface_up("h3", "lan").expect("iface up");
    hosts.wait_carrier("lan", long).expect("carrier back");
    assert!(reaches(&hosts, "h1", hosts.host("h3").addr("lan"), long));

    // Teardown: processes killed, namespaces gone, nothing of this process left.
    drop(hosts);
    for p in &echo {
        assert!(
            p.try_status().is_some() && p.was_killed(),
            "{p:?} still running"
        );
    }
    let left: Vec<String> = list_netns()
        .expect("ip netns list")
        .into_iter()
        .filter(|n| n.starts_with(&ns_prefix()))
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

#[test]
fn bridge_in_a_host() {
    if !require_netns_or_skip("bridge_in_a_host") {
        return;
    }
    let _serial = serial();
    let hosts = Topology::new()
        .host("x")
        .host("y")
        .host("z")
        .bridge(Bridge::new("seg", ["x", "y", "z"]).in_host("x").mtu(4000))
        .build()
        .expect("build the topology");
    assert_eq!(hosts.namespaces().len(), 3, "no namespace for the bridge");
    let echo = start_echo_servers(&hosts, &["x", "y", "z"]);
    let long = Duration::from_secs(3);
    assert!(reaches(&hosts, "y", hosts.host("z").addr("seg"), long));
    assert!(reaches(&hosts, "z", hosts.host("x").addr("seg"), long));
    assert!(reaches(&hosts, "x", hosts.host("y").addr("seg"), long));
    let seg = hosts
        .ip_in("x", &["-o", "link", "show", "dev", "seg"])
        .expect("link");
    assert!(seg.contains(" mtu 4000 "), "{seg}");
    hosts.link_down("seg").expect("segment down");
    assert!(!reaches(
        &hosts,
        "y",
        hosts.host("z").addr("seg"),
        Duration::from_millis(300)
    ));
    drop(echo);
    drop(hosts);
    let left: Vec<String> = list_netns()
        .expect("ip netns list")
        .into_iter()
        .filter(|n| n.starts_with(&ns_prefix()))
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}
