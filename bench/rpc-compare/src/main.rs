//! rpc-compare: a gRPC unary echo through tonic, measured the way `rdmx perf --layer rpc`
//! measures an rdmx-rpc echo method, so that `bench/compare-rpc.sh` can put the two side by
//! side.
//!
//! ```text
//! rpc-compare serve [--port P] [--threads T]
//! rpc-compare bench (--port P | --local) [--size S] [--secs D] [--depth K] [--warmup W]
//!                   [--threads T] [--server-threads T] [--json]
//! ```
//!
//! * `serve`: an HTTP/2 gRPC server on 127.0.0.1:P (P = 0: a free port) with one service,
//!   `rpccompare.Echo`, and one unary method, `Echo(EchoMsg) -> EchoMsg` (`EchoMsg` is one
//!   `bytes data = 1` field); the handler returns the request's message. Once listening it
//!   prints `LISTEN 127.0.0.1:<port>` on stdout. It runs until killed.
//! * `bench`: one client connection (one tonic `Channel`, i.e. one HTTP/2 connection; every
//!   call is a stream on it) and K tasks, each making one call after another, so K calls are
//!   in flight (K = 1: sequential calls). Each call sends S bytes (an 8-byte call number,
//!   then filler) and checks that the same bytes come back. After W seconds of warm-up the
//!   calls that complete in the next D seconds are counted and their latencies (from just
//!   before the call to the decoded response) kept: calls/s = calls / D, latency
//!   percentiles by nearest rank, in microseconds. A failed call or a wrong echo counts as
//!   an error (and the run exits 1 after printing its report).
//! * `bench --local`: starts `rpc-compare serve --port 0` as a child process of this
//!   program, benchmarks it, and kills it. (The child also exits by itself when its stdin,
//!   a pipe from this process, closes: a killed bench leaves no server behind.)
//!
//! Runtimes (both tokio): `--threads T` (client side) and `--server-threads T` / `serve
//! --threads T` (server side) give the worker threads of a multi-thread runtime; 0 means a
//! current-thread runtime. Defaults: the client runs on a current-thread runtime (one core
//! driving all K tasks and the connection, like one rdmx-rpc client thread), the server on a
//! multi-thread runtime of 1 worker: on a 2-core machine shared with the client, that was
//! tonic's best server setting (8 B echo, 64 in flight: ~100k calls/s with 1 worker, ~80k on
//! a current-thread runtime, 58-77k with 2 workers; sequential calls about the same for all).
//! TCP_NODELAY is set on both ends. Each call carries a 30 s deadline (`grpc-timeout`), as
//! every rdmx-rpc call carries one.
//!
//! The service and client are written out by hand in the shape of tonic-build's generated
//! code (a prost message derived in Rust, `tonic::server::Grpc::unary` and
//! `tonic::client::Grpc::unary` with `tonic_prost::ProstCodec`), so building needs no
//! `protoc` and no .proto file.

use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitCode, Stdio};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use prost::bytes::{BufMut, Bytes, BytesMut};
use tonic::codegen::{BoxFuture, StdError, http};
use tonic::server::NamedService;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

const USAGE: &str = "\
usage: rpc-compare serve [--port P] [--threads T]
       rpc-compare bench (--port P | --local) [--size S] [--secs D] [--depth K]
                         [--warmup W] [--threads T] [--server-threads T] [--json]

  serve             gRPC echo server on 127.0.0.1:P (0: a free port; default 0); prints
                    `LISTEN 127.0.0.1:<port>` once listening
  bench             echo calls over one HTTP/2 connection to 127.0.0.1:P
  --local           (bench) start `rpc-compare serve` as a child process and bench it
  --size S          payload bytes per call, request and response (default 8)
  --secs D          measured seconds (default 5)
  --depth K         calls kept in flight, one task each (default 1: sequential)
  --warmup W        seconds of calls before measuring (default 0.5)
  --threads T       tokio worker threads of this process; 0: current-thread runtime
                    (default: bench 0, serve 1)
  --server-threads T  (bench --local) the child server's --threads (default 1)
  --exit-with-stdin (serve) exit when stdin reaches end of file (used by --local)
  --json            print one JSON line instead of a table
";

/// The service's full name (`package.Service`).
const SERVICE: &str = "rpccompare.Echo";
/// The method's path.
const ECHO_PATH: &str = "/rpccompare.Echo/Echo";
/// The filler byte after the call number.
const FILLER: u8 = 0xA5;
/// Largest --size (tonic's default message limit is 4 MiB; both ends are raised to this).
const MAX_SIZE: usize = 64 << 20;
/// How long `--local` waits for the child server's LISTEN line, and a call's deadline.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The request and the response: `message EchoMsg { bytes data = 1; }`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EchoMsg {
    /// The payload.
    #[prost(bytes = "bytes", tag = "1")]
    pub data: Bytes,
}

// ---------------------------------------------------------------------------------------
// Server: what tonic-build generates for `service Echo { rpc Echo(EchoMsg) returns (EchoMsg); }`

/// The echo service as a tower service of HTTP requests (tonic's `Router` takes these).
#[derive(Clone, Debug, Default)]
struct EchoServer;

impl NamedService for EchoServer {
    const NAME: &'static str = SERVICE;
}

/// The unary method's handler: the request's message back.
#[derive(Clone, Copy, Debug)]
struct EchoMethod;

impl tonic::server::UnaryService<EchoMsg> for EchoMethod {
    type Response = EchoMsg;
    type Future = std::future::Ready<Result<Response<EchoMsg>, Status>>;

    fn call(&mut self, request: Request<EchoMsg>) -> Self::Future {
        std::future::ready(Ok(Response::new(request.into_inner())))
    }
}

impl<B> tonic::codegen::Service<http::Request<B>> for EchoServer
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() == ECHO_PATH {
            Box::pin(async move {
                let codec = tonic_prost::ProstCodec::<EchoMsg, EchoMsg>::default();
                let mut grpc = tonic::server::Grpc::new(codec)
                    .max_decoding_message_size(MAX_SIZE + 64)
                    .max_encoding_message_size(MAX_SIZE + 64);
                Ok(grpc.unary(EchoMethod, req).await)
            })
        } else {
            Box::pin(async move { Ok(Status::unimplemented("no such method").into_http()) })
        }
    }
}

/// Builds a tokio runtime: `threads` workers, or a current-thread runtime for 0.
fn runtime(threads: usize) -> Result<tokio::runtime::Runtime, String> {
    let mut b = if threads == 0 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    b.enable_all()
        .build()
        .map_err(|e| format!("starting the tokio runtime: {e}"))
}

/// `serve`: listens on 127.0.0.1:port, prints LISTEN, serves until killed.
fn serve(port: u16, threads: usize, watch_stdin: bool) -> Result<(), String> {
    if watch_stdin {
        // Started by `bench --local`: exit once the parent is gone (its end of our stdin
        // closes however it ends, even killed), so no server is left behind.
        std::thread::spawn(|| {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            std::process::exit(0);
        });
    }
    runtime(threads)?.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .map_err(|e| format!("listening on 127.0.0.1:{port}: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("reading the listening address: {e}"))?;
        // serve_with_incoming ignores Server::tcp_nodelay: set it on the incoming stream.
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        println!("LISTEN {addr}");
        let _ = std::io::Write::flush(&mut std::io::stdout());
        Server::builder()
            .add_service(EchoServer)
            .serve_with_incoming(incoming)
            .await
            .map_err(|e| format!("serving: {e}"))
    })
}

// ---------------------------------------------------------------------------------------
// Client

/// One echo call over `grpc` (what a generated client's method does).
async fn echo(grpc: &mut tonic::client::Grpc<Channel>, data: Bytes) -> Result<Bytes, Status> {
    grpc.ready()
        .await
        .map_err(|e| Status::unknown(format!("the channel is not ready: {e}")))?;
    let codec = tonic_prost::ProstCodec::<EchoMsg, EchoMsg>::default();
    let path = http::uri::PathAndQuery::from_static(ECHO_PATH);
    let mut req = Request::new(EchoMsg { data });
    req.set_timeout(TIMEOUT);
    Ok(grpc.unary(req, path, codec).await?.into_inner().data)
}

/// What one task measured.
#[derive(Default)]
struct TaskResult {
    /// Latencies (ns) of the calls that completed in the measured window.
    samples: Vec<u64>,
    errors: u64,
    /// The first error's text.
    first_error: Option<String>,
}

/// One of the K tasks: calls until `end`; keeps the calls that complete in [`start`, `end`).
async fn caller(
    mut grpc: tonic::client::Grpc<Channel>,
    task: u64,
    size: usize,
    start: Instant,
    end: Instant,
) -> TaskResult {
    let mut r = TaskResult::default();
    let mut buf = BytesMut::with_capacity(size);
    let mut n: u64 = 0;
    loop {
        let t0 = Instant::now();
        if t0 >= end {
            break;
        }
        // A distinct payload per call: (task, call number) in the first 8 bytes.
        let stamp = (task << 40 | n).to_le_bytes();
        n += 1;
        buf.clear();
        buf.put_slice(&stamp[..size.min(8)]);
        buf.put_bytes(FILLER, size.saturating_sub(8));
        let req = buf.split().freeze();
        let res = echo(&mut grpc, req.clone()).await;
        let t1 = Instant::now();
        let err = match res {
            Ok(back) if back == req => None,
            Ok(back) => Some(format!(
                "the echo came back different ({} bytes for {size})",
                back.len()
            )),
            Err(s) => Some(format!("a call failed: {s}")),
        };
        if let Some(e) = err {
            r.errors += 1;
            r.first_error.get_or_insert(e);
            if r.errors >= 1000 {
                break; // the server is gone or broken: stop hammering it
            }
            continue;
        }
        if t1 >= start && t1 < end {
            r.samples.push((t1 - t0).as_nanos() as u64);
        }
    }
    r
}

/// The bench's parameters.
struct BenchArgs {
    port: u16,
    size: usize,
    secs: f64,
    depth: usize,
    warmup: f64,
    threads: usize,
    json: bool,
}

/// The percentile `p` (0..1] of sorted `v`, by nearest rank, in microseconds.
fn pct_us(v: &[u64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1] as f64 / 1000.0)
}

/// A JSON number or null.
fn num(v: Option<f64>) -> String {
    v.map_or_else(|| "null".to_string(), |x| format!("{x:.1}"))
}

/// `bench`: runs the calls, prints the report; Ok(errors).
fn bench(a: &BenchArgs) -> Result<u64, String> {
    let rt = runtime(a.threads)?;
    let results = rt.block_on(async {
        let ep = Endpoint::from_shared(format!("http://127.0.0.1:{}", a.port))
            .map_err(|e| format!("the endpoint: {e}"))?
            .tcp_nodelay(true)
            .connect_timeout(TIMEOUT);
        let channel = ep
            .connect()
            .await
            .map_err(|e| format!("connecting to 127.0.0.1:{}: {e}", a.port))?;
        let grpc = tonic::client::Grpc::new(channel)
            .max_decoding_message_size(MAX_SIZE + 64)
            .max_encoding_message_size(MAX_SIZE + 64);
        let start = Instant::now() + Duration::from_secs_f64(a.warmup);
        let end = start + Duration::from_secs_f64(a.secs);
        let tasks: Vec<_> = (0..a.depth)
            .map(|i| tokio::spawn(caller(grpc.clone(), i as u64, a.size, start, end)))
            .collect();
        let mut out = Vec::with_capacity(a.depth);
        for t in tasks {
            out.push(t.await.map_err(|e| format!("a caller task failed: {e}"))?);
        }
        Ok::<_, String>(out)
    })?;
    drop(rt);

    let mut samples: Vec<u64> = Vec::new();
    let mut errors = 0;
    let mut first_error = None;
    for r in results {
        samples.extend_from_slice(&r.samples);
        errors += r.errors;
        if first_error.is_none() {
            first_error = r.first_error;
        }
    }
    samples.sort_unstable();
    let calls = samples.len() as u64;
    let rate = calls as f64 / a.secs;
    let (p50, p99, p999, max) = (
        pct_us(&samples, 0.50),
        pct_us(&samples, 0.99),
        pct_us(&samples, 0.999),
        pct_us(&samples, 1.0),
    );
    if let Some(e) = &first_error {
        eprintln!("rpc-compare: {errors} errors; the first: {e}");
    }
    if a.json {
        println!(
            "{{\"system\":\"tonic\",\"size\":{},\"depth\":{},\"calls\":{calls},\"secs\":{},\
             \"calls_per_s\":{rate:.1},\"lat_p50_us\":{},\"lat_p99_us\":{},\
             \"lat_p999_us\":{},\"lat_max_us\":{},\"errors\":{errors}}}",
            a.size,
            a.depth,
            a.secs,
            num(p50),
            num(p99),
            num(p999),
            num(max),
        );
    } else {
        let f = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |x| format!("{x:.1}"));
        println!(
            "{:<7} {:>8} {:>6} {:>10} {:>12} {:>9} {:>9} {:>9} {:>9} {:>7}",
            "system",
            "size",
            "depth",
            "calls",
            "calls/s",
            "p50 us",
            "p99 us",
            "p99.9 us",
            "max us",
            "errors"
        );
        println!(
            "{:<7} {:>8} {:>6} {:>10} {:>12.0} {:>9} {:>9} {:>9} {:>9} {:>7}",
            "tonic",
            a.size,
            a.depth,
            calls,
            rate,
            f(p50),
            f(p99),
            f(p999),
            f(max),
            errors
        );
    }
    Ok(errors)
}

/// The child server of `--local`; killed and reaped when dropped.
struct ChildServer(Child);

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `rpc-compare serve --port 0` and reads the port it listens on.
fn start_child(threads: usize) -> Result<(ChildServer, u16), String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let mut child = ChildServer(
        Command::new(exe)
            .args(["serve", "--port", "0", "--threads", &threads.to_string()])
            .arg("--exit-with-stdin")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting the server: {e}"))?,
    );
    let out = child
        .0
        .stdout
        .take()
        .ok_or_else(|| "the server has no stdout".to_string())?;
    // Read the LISTEN line on a thread so that a server that never prints cannot hang us.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let r = BufReader::new(out).read_line(&mut line).map(|_| line);
        let _ = tx.send(r);
    });
    let line = match rx.recv_timeout(TIMEOUT) {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => return Err(format!("reading the server's address: {e}")),
        Err(_) => return Err("the server printed no LISTEN line in time".to_string()),
    };
    let addr: SocketAddr = line
        .strip_prefix("LISTEN ")
        .and_then(|a| a.trim().parse().ok())
        .ok_or_else(|| format!("the server did not start: {line:?}"))?;
    Ok((child, addr.port()))
}

// ---------------------------------------------------------------------------------------
// Command line

fn parse<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Result<T, String> {
    let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
    v.parse().map_err(|_| format!("{flag}: cannot read {v:?}"))
}

fn run() -> Result<ExitCode, String> {
    let mut args = std::env::args().skip(1);
    let cmd = args.next().ok_or_else(|| USAGE.to_string())?;
    let mut port: Option<u16> = None;
    let mut size = 8usize;
    let mut secs = 5.0f64;
    let mut depth = 1usize;
    let mut warmup = 0.5f64;
    let mut threads: Option<usize> = None;
    let mut server_threads = 1usize;
    let mut local = false;
    let mut json = false;
    let mut exit_with_stdin = false;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--port" => port = Some(parse(&a, args.next())?),
            "--size" => size = parse(&a, args.next())?,
            "--secs" => secs = parse(&a, args.next())?,
            "--depth" => depth = parse(&a, args.next())?,
            "--warmup" => warmup = parse(&a, args.next())?,
            "--threads" => threads = Some(parse(&a, args.next())?),
            "--server-threads" => server_threads = parse(&a, args.next())?,
            "--local" => local = true,
            "--json" => json = true,
            "--exit-with-stdin" => exit_with_stdin = true,
            "-h" | "--help" => {
                print!("{USAGE}");
                return Ok(ExitCode::SUCCESS);
            }
            _ => return Err(format!("unknown argument {a:?}\n{USAGE}")),
        }
    }
    match cmd.as_str() {
        "serve" => {
            serve(port.unwrap_or(0), threads.unwrap_or(1), exit_with_stdin)?;
            Ok(ExitCode::SUCCESS)
        }
        "bench" => {
            if size > MAX_SIZE {
                return Err(format!("--size is at most {MAX_SIZE}"));
            }
            if depth == 0 {
                return Err("--depth is at least 1".to_string());
            }
            if !(secs > 0.0 && secs.is_finite() && warmup >= 0.0 && warmup.is_finite()) {
                return Err("--secs must be > 0 and --warmup >= 0".to_string());
            }
            let (child, port) = match (local, port) {
                (true, None) => {
                    let (c, p) = start_child(server_threads)?;
                    (Some(c), p)
                }
                (false, Some(p)) => (None, p),
                (true, Some(_)) => return Err("give --local or --port, not both".to_string()),
                (false, None) => return Err(format!("bench needs --port P or --local\n{USAGE}")),
            };
            let errors = bench(&BenchArgs {
                port,
                size,
                secs,
                depth,
                warmup,
                threads: threads.unwrap_or(0),
                json,
            });
            drop(child);
            Ok(if errors? == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        "-h" | "--help" => {
            print!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        _ => Err(format!("unknown command {cmd:?}\n{USAGE}")),
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rpc-compare: {e}");
            ExitCode::from(2)
        }
    }
}
