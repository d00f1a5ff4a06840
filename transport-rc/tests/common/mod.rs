//! Helpers for the endpoint tests: child processes and message patterns.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process running one `#[ignore]`d test of this binary, killed when dropped.
pub struct ChildProc {
    pub child: Child,
    pub lines: std::sync::mpsc::Receiver<String>,
}

impl ChildProc {
    /// Starts `test` with `envs`; the child reports with lines on stdout.
    pub fn spawn(test: &str, envs: &[(&str, String)]) -> Self {
        let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
        cmd.args([
            "--exact",
            test,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn child");
        let out = child.stdout.take().expect("child stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines: rx }
    }

    /// Waits for a stdout line containing `prefix` and returns what follows it.
    pub fn expect_line(&self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    // The test harness may have printed "test name ... " on the same line.
                    if let Some(at) = l.find(prefix) {
                        return l[at + prefix.len()..].trim().to_string();
                    }
                }
                Err(e) => panic!("child never printed {prefix:?}: {e}"),
            }
        }
    }

    /// Waits for the child to exit successfully.
    pub fn wait_ok(mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                assert!(st.success(), "child failed: {st}");
                return;
            }
            assert!(
                Instant::now() < deadline,
                "child did not finish in {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Size of message `i` in the mixed-size stream: mostly inline, some eager, a few
/// rendezvous.
pub fn mixed_size(i: u32) -> usize {
    let r = (i.wrapping_mul(2_654_435_761) >> 8) as usize;
    match i % 50 {
        0 => 32_768 + r % 16_384, // rendezvous
        1..=17 => 189 + r % 1900, // eager
        _ => 4 + r % 184,         // inline (4-byte sequence number included)
    }
}

/// Fills `buf` with the pattern of message `i` (sequence number first).
pub fn fill(i: u32, buf: &mut [u8]) {
    buf[..4].copy_from_slice(&i.to_le_bytes());
    for (j, b) in buf[4..].iter_mut().enumerate() {
        *b = (i as usize).wrapping_mul(31).wrapping_add(j) as u8;
    }
}

/// Checks a received message against the pattern; returns its sequence number.
pub fn check(buf: &[u8]) -> u32 {
    assert!(buf.len() >= 4, "message of {} bytes", buf.len());
    let i = u32::from_le_bytes(buf[..4].try_into().unwrap());
    assert_eq!(buf.len(), mixed_size(i), "length of message {i}");
    for (j, &b) in buf[4..].iter().enumerate() {
        assert_eq!(
            b,
            (i as usize).wrapping_mul(31).wrapping_add(j) as u8,
            "byte {j} of message {i}"
        );
    }
    i
}

/// A child process serving a node: every context listens (printed as `LISTEN <addr> ...`),
/// accepts `per_listener` endpoints and echoes on each until its peer disconnects; then the
/// node's queue pairs are printed as `COUNTS initiators=<n> targets=<n>`. `wait` bounds every
/// accept and receive.
pub fn serve_echo_node(
    node: &rdmx_rc::Node,
    ctxs: &[rdmx_rc::Context],
    per_listener: usize,
    wait: Duration,
) {
    let listeners: Vec<_> = ctxs
        .iter()
        .map(|c| c.listen("127.0.0.1:0").unwrap())
        .collect();
    let addrs: Vec<String> = listeners
        .iter()
        .map(|l| l.local_addr().to_string())
        .collect();
    println!("LISTEN {}", addrs.join(" "));
    // The most initiators the node's contexts had at once while serving (they go with
    // their last endpoint, so counting at the end would find none).
    let all: std::sync::Arc<Vec<rdmx_rc::Context>> = std::sync::Arc::new(ctxs.to_vec());
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // One acceptor per listener (the parent connects to them in any order), one echo
    // thread per endpoint.
    let acceptors: Vec<_> = listeners
        .into_iter()
        .map(|l| {
            let (all, peak) = (all.clone(), peak.clone());
            std::thread::spawn(move || {
                let mut echoers = Vec::new();
                for _ in 0..per_listener {
                    let ep = l.accept_timeout(wait).expect("accept");
                    let (all, peak) = (all.clone(), peak.clone());
                    echoers.push(std::thread::spawn(move || {
                        loop {
                            match ep.recv_timeout(wait) {
                                Ok(m) => {
                                    ep.send_timeout(&m, Duration::from_secs(10)).expect("echo");
                                    let n = all.iter().map(rdmx_rc::Context::queue_pairs).sum();
                                    peak.fetch_max(n, std::sync::atomic::Ordering::Relaxed);
                                }
                                Err(rdmx_core::Error::Disconnected(_)) => break,
                                Err(e) => panic!("echo: {e}"),
                            }
                        }
                    }));
                }
                for e in echoers {
                    e.join().expect("echo thread");
                }
            })
        })
        .collect();
    for a in acceptors {
        a.join().expect("acceptor");
    }
    let initiators = peak.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "COUNTS initiators={initiators} targets={}",
        node.target_qps()
    );
}

/// `n` XRC contexts on `node` (256 receive buffers each).
pub fn node_contexts(node: &rdmx_rc::Node, n: usize) -> Vec<rdmx_rc::Context> {
    (0..n)
        .map(|_| {
            rdmx_rc::Context::builder()
                .node(node)
                .srq_depth(256)
                .build()
                .unwrap()
        })
        .collect()
}

/// A client endpoint connected to a server endpoint, each in its own context built from
/// `server` and `client`: (client context, client endpoint, server context, server
/// endpoint).
pub fn connect_pair(
    server: rdmx_rc::ContextBuilder,
    client: rdmx_rc::ContextBuilder,
) -> (
    rdmx_rc::Context,
    rdmx_rc::Endpoint,
    rdmx_rc::Context,
    rdmx_rc::Endpoint,
) {
    let server = server.build().expect("server context");
    let listener = server.listen("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr();
    let t = std::thread::spawn(move || {
        listener
            .accept_timeout(Duration::from_secs(10))
            .expect("accept")
    });
    let client = client.build().expect("client context");
    let cep = client.connect(addr).expect("connect");
    let sep = t.join().expect("accept thread");
    (client, cep, server, sep)
}
pub mod raw;
