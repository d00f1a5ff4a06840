//! End-to-end tests of the `rdmx` binary: `rdmx devices`, and `rdmx perf --local` for every
//! test (client and server as two processes over the soft provider).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::thread::JoinHandle;
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

fn reader(mut r: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        v
    })
}

/// Waits for `child` with a deadline; kills it and fails on timeout.
fn wait_with_deadline(mut child: Child, what: &str) -> Output {
    let out = child.stdout.take().map(reader);
    let err = child.stderr.take().map(reader);
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {} s", TIMEOUT.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let join =
        |h: Option<JoinHandle<Vec<u8>>>| h.map(|h| h.join().expect("reader")).unwrap_or_default();
    Output {
        status,
        stdout: join(out),
        stderr: join(err),
    }
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
    assert_eq!(v["transport"], "rc");
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
fn ud_transport_is_rejected_clearly() {
    let out = run(&["perf", "--local", "--test", "send_lat", "--transport", "ud"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not supported yet"), "{stderr}");
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
