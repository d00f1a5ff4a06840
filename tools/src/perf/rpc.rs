//! `rdmx perf --layer rpc --local`: rdmx-rpc calls of an echo method against a server
//! process of this program (`--rpc-serve`), over `--transport rc|xrc|ud`.
//!
//! * `--test lat`: sequential calls; the call latency (a round trip) p50/p99/p99.9, and
//!   calls per second;
//! * `--test rate`: `--rpc-depth` calls kept in flight; calls per second.
//!
//! Every call sends `--size` bytes and checks that the same bytes come back: in the call's
//! serde body, or with `--rpc-payload` as a payload beside it (shared bytes in, the
//! server's pool buffer back: zero-copy at rendezvous sizes on RC and XRC).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdmx::rpc::{Attach, Client, ClientConfig, Method, Server, ServerConfig, Service, Status};
use serde::Serialize;

use super::msg::{RdmxResultExt, open_context, transport, transport_name};
use super::report::{LatStats, Progress};
use super::{PerfArgs, TestArg};
use crate::error::{Error, Result, ResultExt};

/// The echo method: bytes in, the same bytes out.
const ECHO: Method<Vec<u8>, Vec<u8>> = Method::new("perf.echo");
/// The echo of a payload: the request's payload comes back as the response's.
const ECHO_PAYLOAD: Method<(), ()> = Method::new("perf.echo_payload");

/// What `rdmx perf --layer rpc` prints (one JSON object with `--json`).
#[derive(Debug, Serialize)]
struct RpcReport {
    test: &'static str,
    layer: &'static str,
    transport: &'static str,
    size: usize,
    payload: bool,
    depth: usize,
    calls: u64,
    busy_poll: bool,
    calls_per_s: f64,
    lat_p50_us: Option<f64>,
    lat_p99_us: Option<f64>,
    lat_p999_us: Option<f64>,
    lat_max_us: Option<f64>,
    server_threads: usize,
}

/// The server process: listens, prints `LISTEN <addr>`, serves one client until it goes.
fn serve(args: &PerfArgs) -> Result<()> {
    let t = transport(args.transport)?;
    let ctx = open_context(args.device.as_deref(), t, args.busy_poll)?;
    let listener = ctx.listen("127.0.0.1:0").rctx("listening")?;
    println!("LISTEN {}", listener.local_addr());
    let ep = listener.accept().rctx("accepting")?;
    let service = Service::builder()
        .method(ECHO, |_, b: Vec<u8>| Ok(b))
        .method(ECHO_PAYLOAD, |cx, ()| {
            let p = cx
                .take_payload()
                .ok_or_else(|| Status::invalid_argument("no payload"))?;
            match p.into_buf() {
                Ok(b) => cx.attach(b),
                Err(p) => cx.attach(p.into_vec()),
            }
            Ok(())
        })
        .build()
        .map_err(|e| Error::msg(e.to_string()))?;
    let server = Server::new(
        service,
        ServerConfig {
            threads: args.rpc_threads,
            ..ServerConfig::default()
        },
    )
    .ctx("starting the server")?;
    let reader = server.serve(ep).ctx("serving")?;
    let _ = reader.join();
    Ok(())
}

/// Runs the test.
pub(crate) fn run(args: &PerfArgs) -> Result<()> {
    if args.rpc_serve {
        return serve(args);
    }
    if !args.local {
        return Err(Error::msg(
            "--layer rpc runs its server as a child process on this host: give --local",
        ));
    }
    let lat = match args.test {
        Some(TestArg::Lat) | None => true,
        Some(TestArg::Rate) => false,
        Some(t) => {
            return Err(Error::msg(format!(
                "--layer rpc has the tests lat and rate, not {}",
                t.name()
            )));
        }
    };
    if args.rpc_payload && !lat {
        return Err(Error::msg(
            "--rpc-payload is measured with --test lat (sequential calls)",
        ));
    }
    let size = args.size.first().copied().unwrap_or(8) as usize;
    let depth = if lat { 1 } else { args.rpc_depth.max(1) };
    let calls = args.iters.unwrap_or(if lat { 20_000 } else { 200_000 });
    let warmup = args.warmup.unwrap_or((calls / 10).min(1000));
    let t = transport(args.transport)?;

    let exe = std::env::current_exe().ctx("finding this program")?;
    let mut cmd = Command::new(exe);
    cmd.args(["perf", "--layer", "rpc", "--rpc-serve"])
        .args(["--transport", transport_name(t)])
        .args(["--rpc-threads", &args.rpc_threads.to_string()]);
    if let Some(d) = &args.device {
        cmd.args(["--device", d]);
    }
    if args.busy_poll {
        cmd.arg("--busy-poll");
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .ctx("starting the server")?;
    let out = child
        .stdout
        .take()
        .ok_or_else(|| Error::msg("the server has no stdout"))?;
    let mut line = String::new();
    BufReader::new(out)
        .read_line(&mut line)
        .ctx("reading the server's address")?;
    let Some(addr) = line.strip_prefix("LISTEN ").map(str::trim) else {
        let _ = child.kill();
        return Err(Error::msg(format!("the server did not start: {line:?}")));
    };
    let ctx = open_context(args.device.as_deref(), t, args.busy_poll)?;
    let ep = ctx.connect(addr).rctx("connecting")?;
    let client = Client::new(ep, ClientConfig::default()).ctx("starting the client")?;
    let req: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
    let shared = rdmx::SharedBytes::from(req.clone());
    let timeout = Duration::from_secs(30);
    let check_bytes = |b: &[u8]| -> Result<()> {
        if b == req.as_slice() {
            Ok(())
        } else {
            Err(Error::msg(format!(
                "the echo came back different ({} bytes for {size})",
                b.len()
            )))
        }
    };
    let check = |r: std::result::Result<Vec<u8>, Status>| -> Result<()> {
        check_bytes(&r.map_err(|s| Error::msg(format!("a call failed: {s}")))?)
    };
    let check_payload =
        |r: std::result::Result<((), Option<rdmx::rpc::Payload>), Status>| -> Result<()> {
            let (_, p) = r.map_err(|s| Error::msg(format!("a call failed: {s}")))?;
            check_bytes(p.as_deref().unwrap_or_default())
        };
    let payload = args.rpc_payload;
    let call = || -> Result<()> {
        if payload {
            let att = Some(Attach::Shared(shared.clone()));
            check_payload(
                client
                    .start_with(ECHO_PAYLOAD, &(), att, timeout)
                    .and_then(|p| p.wait_with()),
            )
        } else {
            check(client.call_timeout(ECHO, &req, timeout))
        }
    };
    for _ in 0..warmup {
        call()?;
    }
    let mut progress = Progress::new(format!("rpc/{}", if lat { "lat" } else { "rate" }), calls);
    let mut samples = Vec::with_capacity(if lat { calls as usize } else { 0 });
    let start = Instant::now();
    if lat {
        for i in 0..calls {
            let t0 = Instant::now();
            call()?;
            samples.push(t0.elapsed().as_nanos() as u64);
            progress.update(i);
        }
    } else {
        // Keep `depth` calls in flight: wait for the oldest, take whatever else has come,
        // and start as many new calls in one send batch.
        let mut ring = std::collections::VecDeque::with_capacity(depth);
        let mut started = 0u64;
        while started < calls || !ring.is_empty() {
            if ring.len() == depth || started == calls {
                if let Some(p) = ring.pop_front() {
                    check(rdmx::rpc::PendingCall::wait(p))?;
                }
                while let Some(p) = ring.front_mut() {
                    match p.try_wait() {
                        Some(r) => {
                            check(r)?;
                            ring.pop_front();
                        }
                        None => break,
                    }
                }
            }
            let _batch = client.batch();
            while ring.len() < depth && started < calls {
                ring.push_back(
                    client
                        .start(ECHO, &req, timeout)
                        .map_err(|s| Error::msg(format!("a call failed to start: {s}")))?,
                );
                started += 1;
            }
            progress.update(started);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    progress.finish();
    drop(client);
    let _ = child.wait();
    let l = LatStats::from_ns(&samples, 1.0);
    let report = RpcReport {
        test: if lat { "lat" } else { "rate" },
        layer: "rpc",
        transport: transport_name(t),
        size,
        payload,
        depth,
        calls,
        busy_poll: args.busy_poll,
        calls_per_s: calls as f64 / secs.max(1e-9),
        lat_p50_us: l.map(|l| l.p50),
        lat_p99_us: l.map(|l| l.p99),
        lat_p999_us: l.map(|l| l.p999),
        lat_max_us: l.map(|l| l.max),
        server_threads: args.rpc_threads,
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report).ctx("encoding the report")?
        );
    } else {
        println!(
            "rpc/{} {} B{} over {}, depth {}, {} calls: {:.0} calls/s{}",
            report.test,
            size,
            if payload { " as a payload" } else { "" },
            report.transport,
            depth,
            calls,
            report.calls_per_s,
            l.map_or(String::new(), |l| format!(
                "; call latency p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us, max {:.1} us",
                l.p50, l.p99, l.p999, l.max
            ))
        );
    }
    Ok(())
}
