//! End-to-end tests of the `rdmx` binary: `rdmx devices`, and `rdmx perf --local` for every
//! test over RC and for the UD ones (client and server as two processes over the soft
//! provider).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The machine may have few cores: run one benchmark at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const TIMEOUT: Duration = Duration::from_secs(90);

fn rdmx() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rdmx"));
    c.env_remove("RDMX_DEVICE").env_remove("RDMX_FAULTS");
    c
}

/// Waits for `child` with this file's deadline; kills it and fails on timeout.
fn wait_with_deadline(child: Child, what: &str) -> Output {
    common::wait_with_deadline(child, what, TIMEOUT)
}

fn run(args: &[&str]) -> Output {
    run_with_faults(args, None)
}

/// Runs `rdmx args` with the soft provider's `RDMX_FAULTS` set to `faults` (both processes).
fn run_with_faults(args: &[&str], faults: Option<&str>) -> Output {
    let mut cmd = rdmx();
    if let Some(f) = faults {
        cmd.env("RDMX_FAULTS", f);
    }
    let child = cmd
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rdmx");
    wait_with_deadline(child, &format!("rdmx {}", args.join(" ")))
}

fn perf_json(test: &str, size: &str, iters: u64, extra: &[&str]) -> Vec<Value> {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let iters_s = iters.to_string();
    let mut args = vec![
        "perf", "--local", "--test", test, "--size", size, "--iters", &iters_s, "--json",
    ];
    args.extend_from_slice(extra);
    let out = run(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "rdmx {args:?} failed: {}\n{stdout}\n{stderr}",
        out.status
    );
    stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect()
}

fn positive(v: &Value, key: &str) -> f64 {
    let x = v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"));
    assert!(
        x.is_finite() && x > 0.0,
        "{key} = {x} is not positive in {v}"
    );
    x
}

fn check_result(v: &Value, test: &str, size: u64, iters: u64) {
    check_result_on(v, "rc", test, size, iters);
}

fn check_result_on(v: &Value, transport: &str, test: &str, size: u64, iters: u64) {
    for key in [
        "test",
        "size",
        "iters",
        "lat_p50_us",
        "lat_p99_us",
        "lat_avg_us",
        "bw_MBps",
        "msg_rate",
        "transport",
        "busy_poll",
        "device",
    ] {
        assert!(v.get(key).is_some(), "key {key} missing in {v}");
    }
    assert_eq!(v["test"], test);
    assert_eq!(v["transport"], transport, "{v}");
    assert_eq!(v["size"].as_u64(), Some(size), "{v}");
    assert_eq!(v["iters"].as_u64(), Some(iters), "{v}");
    assert!(v["busy_poll"].is_boolean(), "{v}");
    assert!(
        v["device"].as_str().is_some_and(|d| d.starts_with("soft:")),
        "{v}"
    );
    positive(v, "bw_MBps");
    positive(v, "msg_rate");
    if test.ends_with("_lat") {
        let p50 = positive(v, "lat_p50_us");
        let p99 = positive(v, "lat_p99_us");
        positive(v, "lat_avg_us");
        assert!(p50 <= p99, "p50 {p50} > p99 {p99} in {v}");
        assert!(p50 < 1e6, "implausible latency in {v}");
        let rtt = matches!(test, "read_lat" | "atomic_lat");
        assert_eq!(v["lat_is_rtt"].as_bool(), Some(rtt), "{v}");
    } else {
        for key in ["lat_p50_us", "lat_p99_us", "lat_avg_us"] {
            assert!(v[key].is_null(), "{key} should be null for {test}: {v}");
        }
    }
}

fn perf_case(test: &str, size: u64, iters: u64, extra: &[&str]) {
    let lines = perf_json(test, &size.to_string(), iters, extra);
    assert_eq!(
        lines.len(),
        1,
        "expected one result line for {test}: {lines:?}"
    );
    let size = if test == "atomic_lat" { 8 } else { size };
    check_result(&lines[0], test, size, iters);
}

#[test]
fn send_lat() {
    perf_case("send_lat", 64, 200, &[]);
}

#[test]
fn write_lat() {
    perf_case("write_lat", 64, 200, &[]);
}

#[test]
fn write_lat_busy_poll() {
    perf_case("write_lat", 64, 200, &["--busy-poll"]);
}

#[test]
fn read_lat() {
    perf_case("read_lat", 64, 200, &[]);
}

#[test]
fn atomic_lat() {
    perf_case("atomic_lat", 64, 200, &[]);
}

#[test]
fn send_bw() {
    perf_case("send_bw", 64, 200, &[]);
}

#[test]
fn write_bw() {
    perf_case("write_bw", 64, 200, &[]);
}

#[test]
fn read_bw() {
    perf_case("read_bw", 64, 200, &[]);
}

#[test]
fn send_bw_large() {
    perf_case("send_bw", 70000, 20, &[]);
}

#[test]
fn write_bw_large() {
    perf_case("write_bw", 70000, 20, &[]);
}

#[test]
fn read_bw_large() {
    perf_case("read_bw", 70000, 20, &[]);
}

#[test]
fn several_sizes_in_one_run() {
    let lines = perf_json("send_lat", "1,64,5000", 50, &["--busy-poll"]);
    assert_eq!(lines.len(), 3, "{lines:?}");
    for (v, size) in lines.iter().zip([1, 64, 5000]) {
        check_result(v, "send_lat", size, 50);
        assert_eq!(v["busy_poll"], true);
    }
}

#[test]
fn devices_lists_the_soft_device() {
    let out = run(&["devices"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "rdmx devices failed: {stdout}");
    assert!(stdout.contains("soft:"), "{stdout}");
    assert!(stdout.contains("GID[0]"), "{stdout}");
}

#[test]
fn ud_send_lat() {
    let lines = perf_json("send_lat", "64", 500, &["--transport", "ud"]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    check_result_on(&lines[0], "ud", "send_lat", 64, 500);
    assert!(lines[0].get("ud_dropped").is_none(), "{}", lines[0]);
}

#[test]
fn ud_send_lat_busy_poll_several_sizes() {
    let lines = perf_json(
        "send_lat",
        "1,4096",
        100,
        &["--transport", "ud", "--busy-poll"],
    );
    assert_eq!(lines.len(), 2, "{lines:?}");
    for (v, size) in lines.iter().zip([1, 4096]) {
        check_result_on(v, "ud", "send_lat", size, 100);
    }
}

#[test]
fn ud_send_bw() {
    let lines = perf_json("send_bw", "1024", 5000, &["--transport", "ud"]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let v = &lines[0];
    check_result_on(v, "ud", "send_bw", 1024, 5000);
    let dropped = v["ud_dropped"]
        .as_u64()
        .unwrap_or_else(|| panic!("ud_dropped missing in {v}"));
    // Loopback with credits: nothing should be lost, but UD may drop a few under overload.
    assert!(dropped <= 51, "{dropped} of 5100 datagrams dropped: {v}");
}

#[test]
fn ud_send_bw_busy_poll_small_window() {
    let extra = [
        "--transport",
        "ud",
        "--busy-poll",
        "--tx-depth",
        "4",
        "--rx-depth",
        "16",
    ];
    let lines = perf_json("send_bw", "8", 2000, &extra);
    check_result_on(&lines[0], "ud", "send_bw", 8, 2000);
    assert!(lines[0]["ud_dropped"].as_u64().is_some(), "{}", lines[0]);
}

#[test]
fn ud_send_bw_human_output_reports_drops() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = run(&[
        "perf",
        "--local",
        "--transport",
        "ud",
        "--test",
        "send_bw",
        "--size",
        "256",
        "--iters",
        "1000",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let mut lines = stdout.lines();
    let header = lines.next().unwrap_or_default();
    assert!(header.trim_end().ends_with("dropped"), "{stdout}");
    let row = lines.next().unwrap_or_default();
    assert!(row.starts_with("send_bw"), "{stdout}");
    let dropped: u64 = row
        .split_whitespace()
        .last()
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("no drop count in {row:?}"));
    assert!(dropped <= 11, "{stdout}");
}

/// Runs a command that must fail; returns its stderr.
fn fails(args: &[&str]) -> String {
    let out = run(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "rdmx {args:?} succeeded");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn ud_refuses_rdma_tests_clearly() {
    for test in ["write_bw", "write_lat", "read_lat", "read_bw", "atomic_lat"] {
        let e = fails(&["perf", "--local", "--transport", "ud", "--test", test]);
        assert!(
            e.contains("supports only the send_lat and send_bw"),
            "{test}: {e}"
        );
    }
}

#[test]
fn ud_refuses_messages_above_the_mtu() {
    for test in ["send_bw", "send_lat"] {
        let args = [
            "perf",
            "--local",
            "--transport",
            "ud",
            "--test",
            test,
            "--size",
            "5000",
        ];
        let e = fails(&args);
        assert!(
            e.contains("--size 5000 is too large") && e.contains("4096"),
            "{test}: {e}"
        );
    }
}

#[test]
fn server_rejects_a_garbage_peer() {
    let mut server = rdmx()
        .args(["perf", "--server", "--once", "--port", "0", "--print-port"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn server");
    let mut line = String::new();
    let mut out = BufReader::new(server.stdout.take().expect("stdout"));
    out.read_line(&mut line).expect("read port");
    let port: u16 = line.trim().parse().expect("port number");
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    let out = wait_with_deadline(server, "server fed garbage");
    assert!(!out.status.success(), "server accepted garbage");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("exceeds") && !stderr.contains("panicked"),
        "{stderr}"
    );
}

#[test]
fn ud_send_bw_reports_lost_datagrams() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let args = [
        "perf",
        "--local",
        "--transport",
        "ud",
        "--test",
        "send_bw",
        "--size",
        "512",
        "--iters",
        "3000",
        "--json",
    ];
    let out = run_with_faults(&args, Some("seed=11,drop=3%"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    check_result_on(&v, "ud", "send_bw", 512, 3000);
    let dropped = v["ud_dropped"].as_u64().expect("ud_dropped");
    // 3 % of 3100 data datagrams, give or take (lost credits only slow the client down).
    assert!((30..=250).contains(&dropped), "{dropped} dropped: {v}");
    assert!(
        stderr.contains("warning") && stderr.contains("dropped"),
        "{stderr}"
    );
}

#[test]
fn ud_send_lat_fails_on_a_lost_datagram_instead_of_hanging() {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let args = [
        "perf",
        "--local",
        "--transport",
        "ud",
        "--test",
        "send_lat",
        "--iters",
        "100000",
    ];
    let t0 = Instant::now();
    let out = run_with_faults(&args, Some("seed=5,drop=5%"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(t0.elapsed() < Duration::from_secs(40), "{stderr}");
    assert!(
        stderr.contains("message ") && stderr.contains("timed out"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
