//! End-to-end tests of `rdmx perf --layer msg --local`: the message-layer tests between two
//! processes over the soft provider (RC and XRC), and the clear refusals (`ud`, tests
//! of the other layer).

mod common;

use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

/// The machine may have few cores: run one benchmark at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const TIMEOUT: Duration = Duration::from_secs(60);

fn rdmx() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rdmx"));
    for v in [
        "RDMX_DEVICE",
        "RDMX_FAULTS",
        "RDMX_TRANSPORT",
        "RDMX_MAX_MESSAGE",
        "RDMX_RNDV_THRESHOLD",
        "RDMX_INLINE_THRESHOLD",
        "RDMX_BUSY_POLL_US",
    ] {
        c.env_remove(v);
    }
    c
}

/// Waits for `child` with this file's deadline; kills it and fails on timeout.
fn wait_with_deadline(child: Child, what: &str) -> Output {
    common::wait_with_deadline(child, what, TIMEOUT)
}

fn run(args: &[&str]) -> Output {
    let child = rdmx()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rdmx");
    wait_with_deadline(child, &format!("rdmx {}", args.join(" ")))
}

/// Runs `rdmx perf --layer msg --local --json` with `args`; returns the JSON lines.
fn perf_json(args: &[&str]) -> Vec<Value> {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut all = vec!["perf", "--layer", "msg", "--local", "--json"];
    all.extend_from_slice(args);
    let out = run(&all);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "rdmx {all:?} failed: {}\n{stdout}\n{stderr}",
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

/// Checks the fields every message-layer result has (the verbs tests' schema plus
/// `layer`); returns the bandwidth in MB/s.
fn check_common(v: &Value, test: &str, size: u64, iters: u64) -> f64 {
    check_transport(v, "rc", test, size, iters)
}

/// [`check_common`] for a given transport.
fn check_transport(v: &Value, transport: &str, test: &str, size: u64, iters: u64) -> f64 {
    for key in [
        "test",
        "transport",
        "device",
        "busy_poll",
        "size",
        "iters",
        "warmup",
        "mtu",
        "lat_p50_us",
        "lat_p99_us",
        "lat_avg_us",
        "lat_is_rtt",
        "bw_MBps",
        "msg_rate",
        "elapsed_s",
        "layer",
        "msg_protocol",
        "credits",
    ] {
        assert!(v.get(key).is_some(), "key {key} missing in {v}");
    }
    assert_eq!(v["layer"], "msg", "{v}");
    assert_eq!(v["test"], test, "{v}");
    assert_eq!(v["transport"], transport, "{v}");
    assert_eq!(v["size"].as_u64(), Some(size), "{v}");
    assert_eq!(v["iters"].as_u64(), Some(iters), "{v}");
    assert_eq!(v["busy_poll"], false, "{v}");
    assert!(
        v["device"].as_str().is_some_and(|d| d.starts_with("soft:")),
        "{v}"
    );
    let secs = positive(v, "elapsed_s");
    assert!(secs < 60.0, "implausible run time in {v}");
    let rate = positive(v, "msg_rate");
    let bw = positive(v, "bw_MBps");
    // The two rates describe the same run.
    let want = rate * size as f64 / 1e6;
    assert!(
        (bw - want).abs() <= want * 1e-6,
        "bw {bw} vs rate {rate} in {v}"
    );
    bw
}

#[test]
fn lat() {
    let lines = perf_json(&["--test", "lat", "--iters", "200"]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let v = &lines[0];
    check_common(v, "lat", 8, 200);
    let p50 = positive(v, "lat_p50_us");
    let p99 = positive(v, "lat_p99_us");
    let min = positive(v, "lat_min_us");
    positive(v, "lat_avg_us");
    assert!(
        min <= p50 && p50 <= p99,
        "min {min} p50 {p50} p99 {p99} in {v}"
    );
    // One-way loopback latency of 8-byte messages: microseconds, not seconds.
    assert!(p50 < 100_000.0, "implausible latency in {v}");
    assert_eq!(v["lat_is_rtt"], false, "{v}");
    assert_eq!(v["msg_protocol"], "inline", "{v}");
}

#[test]
fn bw_one_mebibyte_goes_by_rendezvous() {
    let lines = perf_json(&["--test", "bw", "--size", "1048576", "--iters", "50"]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let v = &lines[0];
    let bw = check_common(v, "bw", 1 << 20, 50);
    // Loopback through a userspace NIC: well above 1 MB/s, well below 100 GB/s.
    assert!(
        (1.0..100_000.0).contains(&bw),
        "implausible bandwidth in {v}"
    );
    for key in ["lat_p50_us", "lat_p99_us", "lat_avg_us"] {
        assert!(v[key].is_null(), "{key} should be null for bw: {v}");
    }
    assert_eq!(v["msg_protocol"], "rendezvous", "{v}");
}

#[test]
fn bw_shared_is_read_in_place() {
    let lines = perf_json(&[
        "--test",
        "bw_shared",
        "--size",
        "65536,1048576",
        "--iters",
        "50",
    ]);
    assert_eq!(lines.len(), 2, "{lines:?}");
    for (v, size) in lines.iter().zip([65536u64, 1 << 20]) {
        let bw = check_common(v, "bw_shared", size, 50);
        assert!(
            (1.0..100_000.0).contains(&bw),
            "implausible bandwidth in {v}"
        );
        assert_eq!(v["msg_protocol"], "rendezvous", "{v}");
    }
}

#[test]
fn rate_and_several_sizes() {
    let lines = perf_json(&["--test", "rate", "--size", "8,4096", "--iters", "2000"]);
    assert_eq!(lines.len(), 2, "{lines:?}");
    for (v, size) in lines.iter().zip([8, 4096]) {
        check_common(v, "rate", size, 2000);
    }
    assert_eq!(lines[0]["msg_protocol"], "inline", "{}", lines[0]);
    assert_eq!(lines[1]["msg_protocol"], "eager", "{}", lines[1]);
}

#[test]
fn batched_rate_packs_small_messages() {
    let lines = perf_json(&["--test", "rate", "--iters", "2000", "--batch", "16"]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let v = &lines[0];
    check_common(v, "rate", 8, 2000);
    assert_eq!(v["batch"], 16, "{v}");
    assert_eq!(v["msg_protocol"], "packed", "{v}");
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
fn xrc_lat_and_bw() {
    let lines = perf_json(&["--test", "lat", "--iters", "200", "--transport", "xrc"]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    check_transport(&lines[0], "xrc", "lat", 8, 200);
    let lines = perf_json(&[
        "--test",
        "bw",
        "--size",
        "65536",
        "--iters",
        "100",
        "--transport",
        "xrc",
    ]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    check_transport(&lines[0], "xrc", "bw", 65536, 100);
}

#[test]
fn ud_lat_bw_and_rate() {
    let lines = perf_json(&["--test", "lat", "--iters", "200", "--transport", "ud"]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    check_transport(&lines[0], "ud", "lat", 8, 200);
    let lines = perf_json(&[
        "--test",
        "bw",
        "--size",
        "65536",
        "--iters",
        "100",
        "--transport",
        "ud",
    ]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    check_transport(&lines[0], "ud", "bw", 65536, 100);
    let lines = perf_json(&["--test", "rate", "--iters", "2000", "--transport", "ud"]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    check_transport(&lines[0], "ud", "rate", 8, 2000);
    // The UD sessions' counters come with the result (on loopback, usually all 0).
    for key in ["ud_retransmits", "ud_duplicates", "ud_refused"] {
        assert!(lines[0][key].is_u64(), "{key} missing: {}", lines[0]);
    }
}

#[test]
fn other_layers_tests_are_refused_clearly() {
    let e = fails(&["perf", "--layer", "msg", "--local", "--test", "send_lat"]);
    assert!(e.contains("verbs-level test"), "{e}");
    let e = fails(&["perf", "--local", "--test", "bw"]);
    assert!(e.contains("--layer msg"), "{e}");
}
