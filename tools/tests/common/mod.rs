//! Helpers shared by the `rdmx` binary tests.
#![allow(dead_code)]

use std::io::Read;
use std::process::{Child, Output};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

fn reader(mut r: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        v
    })
}

/// Waits for `child` up to `timeout`; kills it and fails when it takes longer.
pub(crate) fn wait_with_deadline(mut child: Child, what: &str, timeout: Duration) -> Output {
    let out = child.stdout.take().map(reader);
    let err = child.stderr.take().map(reader);
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {} s", timeout.as_secs());
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
