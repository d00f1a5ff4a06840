//! `rdmx perf --layer msg`: message-level tests over `rdmx` endpoints ([`rdmx::Context`],
//! [`rdmx::Endpoint`]) instead of raw queue pairs.
//!
//! * `lat`: `send` + `recv` ping-pong; one-way latency (RTT/2), like the verbs send_lat;
//! * `bw`: a stream of pooled buffers sent with `send_buf` (so messages at or above the
//!   rendezvous threshold go zero-copy: the server RDMA-reads them), dropped by the server as
//!   they arrive; the server acknowledges the last one, and the time runs until that
//!   acknowledgement arrives;
//! * `rate`: the same stream sent from a plain slice with `send` (small messages by default);
//!   messages per second.
//!
//! The roles are those of the verbs tests (`--server`, `--connect HOST:PORT`, `--local` with
//! a child server), and so is the output (the same table and JSON lines, with
//! `"layer": "msg"`). There is no separate side channel: the endpoint's own bootstrap is the
//! TCP connection, and the round's control messages ([`control`]) travel on the endpoint
//! itself, outside the timed loops:
//!
//! ```text
//! client                                server
//!   connect (rdmx bootstrap)         ->  accept
//!   Setup{test, size, iters, warmup} ->
//!                                    <-  Ready
//!   lat:       total x (data ->, <- data)
//!   bw / rate: warmup x data         ->
//!                                    <-  Ack{warmup}          (only with a warm-up)
//!              iters x data          ->
//!                                    <-  Ack{total}           (the timed part ends here)
//!                                    <-  Report{received, check_error}
//!   (next size: Setup ... | Bye, then both close the endpoint)
//! ```
//!
//! Every data message is `size` bytes of the test pattern whose first (up to) 8 bytes hold
//! its index (little-endian), so the receiver checks order and exactly-once delivery of every
//! message cheaply and the whole pattern of the last one.

mod client;
mod control;
mod server;

use std::time::Duration;

use rdmx::{Context, Transport as MsgTransport};
use serde::{Deserialize, Serialize};

use super::{MAX_ITERS, MAX_SIZE, PerfArgs, TransportArg, pattern_byte};
use crate::error::{Error, Result};

/// With `--busy-poll`, how long blocking calls poll before they sleep: longer than any wait
/// inside a test round, short enough that an idle server stops spinning soon.
const BUSY_POLL: Duration = Duration::from_secs(1);

/// How long a side keeps its endpoint (and device) after a graceful close before it lets
/// them go: the soft NIC holds ACKs back for coalescing (up to 50 us), and a process that
/// exits the moment its `close` returns can take the ACK of the peer's Close with it, which
/// leaves the peer's `close` retransmitting until its retries run out (about a second).
const CLOSE_LINGER: Duration = Duration::from_millis(10);

/// Closes `ep` gracefully, then keeps it for [`CLOSE_LINGER`].
fn close(ep: rdmx::Endpoint) -> Result<()> {
    let r = ep.close();
    std::thread::sleep(CLOSE_LINGER);
    drop(ep);
    r.rctx("closing the endpoint")
}

/// Context for the errors of the message layer. Its errors print their cause and also return
/// it as their source, so the chain is flattened here with the repeats left out.
pub(super) trait RdmxResultExt<T> {
    /// Wraps the error with "`what`: error".
    fn rctx(self, what: &str) -> Result<T>;
    /// Like [`rctx`](Self::rctx) with a message built only on error.
    fn with_rctx(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> RdmxResultExt<T> for std::result::Result<T, rdmx::Error> {
    fn rctx(self, what: &str) -> Result<T> {
        self.map_err(|e| rdmx_error(what.to_string(), &e))
    }

    fn with_rctx(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| rdmx_error(what(), &e))
    }
}

/// "`what`: `e`: its causes", leaving out a cause whose text the previous one already
/// contains.
fn rdmx_error(what: String, e: &rdmx::Error) -> Error {
    let mut text = what;
    let mut last = String::new();
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        let s = c.to_string();
        if !last.contains(&s) {
            text.push_str(": ");
            text.push_str(&s);
            last = s;
        }
        cause = c.source();
    }
    Error::msg(text)
}

/// The message-level tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum MsgTest {
    /// Ping-pong; one-way latency.
    Lat,
    /// Stream of pooled buffers (`send_buf`).
    Bw,
    /// Stream of copied slices (`send`).
    Rate,
    /// Stream of one shared application buffer (`send_shared`), every message stamped 0.
    BwShared,
}

impl MsgTest {
    /// The name used on the command line and in reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Lat => "lat",
            Self::Bw => "bw",
            Self::Rate => "rate",
            Self::BwShared => "bw_shared",
        }
    }

    /// The default message size.
    fn default_size(self) -> u64 {
        match self {
            Self::Lat | Self::Rate => 8,
            Self::Bw | Self::BwShared => 65536,
        }
    }

    /// The default number of measured iterations.
    fn default_iters(self) -> u64 {
        match self {
            Self::Lat => 1000,
            Self::Bw | Self::BwShared => 5000,
            Self::Rate => 100_000,
        }
    }
}

/// What the client asks the server to run (one round: one message size).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RoundParams {
    /// The test.
    pub(crate) test: MsgTest,
    /// Message size in bytes.
    pub(crate) size: u64,
    /// Measured iterations.
    pub(crate) iters: u64,
    /// Warm-up iterations (run before the measured ones).
    pub(crate) warmup: u64,
}

impl RoundParams {
    /// Iterations in total, warm-up included.
    pub(crate) fn total(&self) -> u64 {
        self.iters + self.warmup
    }

    /// Checks values received from a peer (never trusted) against this side's largest
    /// message.
    pub(crate) fn validate(&self, max_message: usize) -> Result<()> {
        check_size(self.size, max_message)?;
        if self.iters == 0 || self.iters > MAX_ITERS || self.warmup > MAX_ITERS {
            return Err(Error::msg(format!(
                "iteration count {} (+{} warm-up) is outside 1..={MAX_ITERS}",
                self.iters, self.warmup
            )));
        }
        Ok(())
    }
}

/// Checks a message size against the tool's limit and the context's largest message.
fn check_size(size: u64, max_message: usize) -> Result<()> {
    if size == 0 || size > MAX_SIZE {
        return Err(Error::msg(format!(
            "message size {size} is outside 1..={MAX_SIZE}"
        )));
    }
    if size > max_message as u64 {
        return Err(Error::msg(format!(
            "message size {size} exceeds the message layer's largest message, {max_message} \
             bytes (raise it with RDMX_MAX_MESSAGE on both sides)"
        )));
    }
    Ok(())
}

/// Runs `rdmx perf --layer msg` (the mode has been checked: exactly one of server, local,
/// connect).
pub(crate) fn run(args: &PerfArgs) -> Result<()> {
    let transport = transport(args.transport)?;
    if args.server {
        return server::run(&server::ServerConfig {
            bind: args.bind,
            port: args.port,
            once: args.once,
            print_port: args.print_port,
            device: args.device.clone(),
            busy_poll: args.busy_poll,
            transport,
        });
    }
    let cfg = client::ClientConfig::from_args(args, transport)?;
    match &args.connect {
        Some(target) => client::run(&cfg, target),
        None => client::run_local(&cfg),
    }
}

/// The message-layer transport for `--transport`, else `RDMX_TRANSPORT` (as a context
/// reads it), else RC.
pub(super) fn transport(arg: Option<TransportArg>) -> Result<MsgTransport> {
    let Some(arg) = arg else {
        return match std::env::var("RDMX_TRANSPORT").as_deref() {
            Err(_) | Ok("rc") => Ok(MsgTransport::Rc),
            Ok("xrc") => Ok(MsgTransport::Xrc),
            Ok("ud") => Ok(MsgTransport::Ud),
            Ok(other) => Err(Error::msg(format!(
                "RDMX_TRANSPORT={other}: the message layer runs over rc, xrc or ud"
            ))),
        };
    };
    match arg {
        TransportArg::Rc => Ok(MsgTransport::Rc),
        TransportArg::Xrc => Ok(MsgTransport::Xrc),
        TransportArg::Ud => Ok(MsgTransport::Ud),
    }
}

/// The name of a message-layer transport in reports.
pub(super) fn transport_name(t: MsgTransport) -> &'static str {
    match t {
        MsgTransport::Rc => "rc",
        MsgTransport::Xrc => "xrc",
        MsgTransport::Ud => "ud",
    }
}

/// Creates this side's context: `device` (else `$RDMX_DEVICE`, else `soft:127.0.0.1`), the
/// transport, and with `busy` a busy-poll time of [`BUSY_POLL`]; everything else comes from
/// the `RDMX_*` variables.
pub(super) fn open_context(
    device: Option<&str>,
    transport: MsgTransport,
    busy: bool,
) -> Result<Context> {
    let mut b = Context::builder().transport(transport);
    if let Some(d) = device {
        b = b.device(d);
    }
    if busy {
        b = b.busy_poll(BUSY_POLL);
    }
    b.build().map_err(|e| {
        let what = match (transport, &e, device) {
            (_, _, Some(d)) => format!("creating the message-layer context on device {d}"),
            (_, _, None) => "creating the message-layer context".to_string(),
        };
        rdmx_error(what, &e)
    })
}

/// Bytes at the start of a `size`-byte data message that carry its index.
fn stamp_len(size: usize) -> usize {
    size.min(8)
}

/// Writes the index `i` into the first bytes of a data message.
fn stamp(buf: &mut [u8], i: u64) {
    let n = stamp_len(buf.len());
    buf[..n].copy_from_slice(&i.to_le_bytes()[..n]);
}

/// Checks the length and the index of data message `i`; a control message in its place
/// (the peer's error report) becomes that error.
fn check_data(data: &[u8], size: usize, i: u64, what: &str) -> Result<()> {
    if data.len() != size {
        if let Some(e) = control::peer_error(data) {
            return Err(Error::msg(format!(
                "waiting for {what} {i}: the peer reported an error: {e}"
            )));
        }
        return Err(Error::msg(format!(
            "{what} {i} (counting from 0, warm-up included) has {} bytes, expected {size}",
            data.len()
        )));
    }
    let n = stamp_len(size);
    let want = &i.to_le_bytes()[..n];
    if &data[..n] != want {
        let mut got = [0u8; 8];
        got[..n].copy_from_slice(&data[..n]);
        return Err(Error::msg(format!(
            "{what} {i} (counting from 0, warm-up included) carries index {}: messages were \
             lost, duplicated or reordered",
            u64::from_le_bytes(got)
        )));
    }
    Ok(())
}

/// Checks that everything after the index of a data message is the pattern with `seed`.
fn check_payload(data: &[u8], seed: u8, what: &str) -> Result<()> {
    let n = stamp_len(data.len());
    match data
        .iter()
        .enumerate()
        .skip(n)
        .find(|&(i, &b)| b != pattern_byte(seed, i))
    {
        None => Ok(()),
        Some((i, &b)) => Err(Error::msg(format!(
            "data check failed: {what}: byte {i} of {} is {b:#04x}, expected {:#04x}",
            data.len(),
            pattern_byte(seed, i)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{CLIENT_SEED, SERVER_SEED, pattern};
    use super::*;

    #[test]
    fn stamped_data_checks() {
        for size in [1usize, 3, 8, 9, 100] {
            let mut d = pattern(CLIENT_SEED, size);
            stamp(&mut d, 0x0102_0304_0506_0708);
            assert!(check_data(&d, size, 0x0102_0304_0506_0708, "message").is_ok());
            assert!(check_payload(&d, CLIENT_SEED, "message").is_ok());
            let e = check_data(&d, size, 7, "message").unwrap_err().to_string();
            assert!(e.contains("reordered"), "{e}");
            assert!(check_data(&d, size + 1, 0x0102_0304_0506_0708, "message").is_err());
            if size > 8 {
                assert!(check_payload(&d, SERVER_SEED, "message").is_err());
                d[size - 1] ^= 1;
                let e = check_payload(&d, CLIENT_SEED, "message").unwrap_err();
                assert!(e.to_string().contains(&format!("byte {}", size - 1)), "{e}");
            }
        }
    }

    #[test]
    fn a_control_error_in_place_of_data_is_reported() {
        let frame = control::encode(&control::Ctl::Error("boom".into())).unwrap();
        let e = check_data(&frame, 4096, 3, "the client's message")
            .unwrap_err()
            .to_string();
        assert!(e.contains("reported an error: boom"), "{e}");
    }

    #[test]
    fn params_from_a_peer_are_checked() {
        let mut p = RoundParams {
            test: MsgTest::Bw,
            size: 1 << 20,
            iters: 10,
            warmup: 1,
        };
        assert!(p.validate(64 << 20).is_ok());
        assert!(p.validate(1 << 19).is_err());
        p.size = 0;
        assert!(p.validate(64 << 20).is_err());
        p.size = 8;
        p.iters = 0;
        assert!(p.validate(64 << 20).is_err());
        p.iters = 1;
        p.warmup = MAX_ITERS + 1;
        assert!(p.validate(64 << 20).is_err());
    }
}
