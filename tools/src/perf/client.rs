//! `rdmx perf --connect` / `--local`: the measuring side.

use std::io::{BufRead, BufReader};
use std::net::{TcpStream, ToSocketAddrs};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rdmx::verbs::{Context, ProtectionDomain};

use super::endpoint::{Endpoint, EpSpec, Role};
use super::exchange::{self, IO_TIMEOUT, Msg, TestParams, expect_msg, unexpected, write_msg};
use super::report::{PerfResult, Printer, Progress};
use super::{
    MAX_ITERS, MAX_RX_DEPTH, MAX_SIZE, MAX_TX_DEPTH, PerfArgs, TestKind, Transport, bw, lat,
};
use crate::error::{Error, Result, ResultExt};

/// Client options, validated.
#[derive(Debug, Clone)]
pub(crate) struct ClientConfig {
    test: TestKind,
    transport: Transport,
    /// Empty for UD send_bw without --size: the port's MTU, once the device is open.
    sizes: Vec<u64>,
    iters: u64,
    warmup: u64,
    tx_depth: u32,
    rx_depth: u32,
    inline_size: u32,
    busy_poll: bool,
    json: bool,
    device: Option<String>,
}

impl ClientConfig {
    /// Validates the command line.
    pub(crate) fn from_args(a: &PerfArgs) -> Result<Self> {
        let test = a.test.ok_or_else(|| {
            Error::msg("--test is required (send_lat, write_lat, read_lat, atomic_lat, send_bw, write_bw, read_bw)")
        })?;
        let test = test.verbs().ok_or_else(|| {
            Error::msg(format!(
                "--test {} is a message-layer test; add --layer msg (the verbs-level tests \
                 are send_lat, write_lat, read_lat, atomic_lat, send_bw, write_bw, read_bw)",
                test.name()
            ))
        })?;
        let transport = a.transport.unwrap_or(super::TransportArg::Rc).verbs()?;
        transport.check_test(test)?;
        let mut sizes = if a.size.is_empty() {
            match (test.is_lat(), transport) {
                (true, _) => vec![8],
                (false, Transport::Rc) => vec![65536],
                (false, Transport::Ud) => Vec::new(),
            }
        } else {
            a.size.clone()
        };
        if test == TestKind::AtomicLat {
            if sizes.iter().any(|&s| s != 8) {
                eprintln!(
                    "rdmx perf: note: atomic_lat always works on 8-byte words; --size ignored"
                );
            }
            sizes = vec![8];
        }
        if let Some(&s) = sizes.iter().find(|&&s| s == 0 || s > MAX_SIZE) {
            return Err(Error::msg(format!("--size {s} is outside 1..={MAX_SIZE}")));
        }
        let iters = a.iters.unwrap_or(if test.is_lat() { 1000 } else { 5000 });
        if iters == 0 || iters > MAX_ITERS {
            return Err(Error::msg(format!(
                "--iters {iters} is outside 1..={MAX_ITERS}"
            )));
        }
        let warmup = a.warmup.unwrap_or((iters / 10).min(100));
        if warmup > MAX_ITERS {
            return Err(Error::msg(format!(
                "--warmup {warmup} is above {MAX_ITERS}"
            )));
        }
        if a.tx_depth == 0 || a.tx_depth > MAX_TX_DEPTH {
            return Err(Error::msg(format!(
                "--tx-depth {} is outside 1..={MAX_TX_DEPTH}",
                a.tx_depth
            )));
        }
        if a.rx_depth == 0 || a.rx_depth > MAX_RX_DEPTH {
            return Err(Error::msg(format!(
                "--rx-depth {} is outside 1..={MAX_RX_DEPTH}",
                a.rx_depth
            )));
        }
        Ok(Self {
            test,
            transport,
            sizes,
            iters,
            warmup,
            tx_depth: a.tx_depth,
            rx_depth: a.rx_depth,
            inline_size: a.inline_size,
            busy_poll: a.busy_poll,
            json: a.json,
            device: a.device.clone(),
        })
    }

    /// Checks the sizes against the device, before anything runs: UD messages must fit in
    /// one packet of the port's active MTU (which is also the default UD send_bw size).
    fn check_device(&self, ctx: &Context) -> Result<Self> {
        let mut cfg = self.clone();
        if cfg.transport != Transport::Ud {
            return Ok(cfg);
        }
        let port = ctx.query_port(1).ctx("querying port 1")?;
        let mtu = port.active_mtu.bytes() as u64;
        if cfg.sizes.is_empty() {
            cfg.sizes = vec![mtu];
        }
        if let Some(&s) = cfg.sizes.iter().find(|&&s| s > mtu) {
            return Err(Error::msg(format!(
                "--size {s} is too large for --transport ud: a UD message must fit in one \
                 packet, and the active MTU of {} port 1 is {mtu} bytes",
                ctx.name()
            )));
        }
        Ok(cfg)
    }

    fn params(&self, size: u64) -> TestParams {
        TestParams {
            test: self.test,
            transport: self.transport,
            size,
            iters: self.iters,
            warmup: self.warmup,
            tx_depth: self.tx_depth,
            inline_size: self.inline_size,
            rx_depth: self.rx_depth,
            mem_poll: self.busy_poll,
        }
    }
}

fn connect(target: &str) -> Result<TcpStream> {
    let addrs: Vec<_> = target
        .to_socket_addrs()
        .with_ctx(|| format!("resolving {target:?} (expected HOST:PORT)"))?
        .collect();
    let mut last = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, IO_TIMEOUT) {
            Ok(s) => {
                exchange::configure(&s)?;
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) => Err(Error::with_source(format!("connecting to {target}"), e)),
        None => Err(Error::msg(format!("{target:?} resolves to no address"))),
    }
}

/// Runs every size against the server at `target`.
pub(crate) fn run(cfg: &ClientConfig, target: &str) -> Result<()> {
    let ctx = super::open_device(cfg.device.as_deref())?;
    let cfg = cfg.check_device(&ctx)?;
    run_with(&ctx, &cfg, target)
}

fn run_with(ctx: &Context, cfg: &ClientConfig, target: &str) -> Result<()> {
    let pd = ctx.alloc_pd().ctx("allocating a protection domain")?;
    let mut stream = connect(target)?;
    let mut printer = Printer::new(cfg.json, cfg.transport == Transport::Ud);
    for &size in &cfg.sizes {
        let p = cfg.params(size);
        match run_round(ctx, &pd, &mut stream, cfg, &p) {
            Ok(r) => printer.print(&r),
            Err(e) => {
                tracing::info!(counters = ?ctx.counters(), "client NIC after the failure");
                let _ = write_msg(&mut stream, &Msg::Error(e.to_string()));
                return Err(Error::with_source(
                    format!("{} with {size}-byte messages", p.test.name()),
                    e,
                ));
            }
        }
    }
    write_msg(&mut stream, &Msg::Bye)
}

fn run_round(
    ctx: &Context,
    pd: &ProtectionDomain,
    stream: &mut TcpStream,
    cfg: &ClientConfig,
    p: &TestParams,
) -> Result<PerfResult> {
    let spec = EpSpec::for_test(p, Role::Client);
    let watch = stream.try_clone().ctx("cloning the side channel")?;
    let mut ep = Endpoint::new(ctx, pd, &spec, cfg.busy_poll, Some(watch))?;
    write_msg(
        stream,
        &Msg::Setup {
            params: *p,
            ep: ep.info()?,
        },
    )?;
    let remote = match expect_msg(stream, "SetupReply")? {
        Msg::SetupReply { ep } => ep,
        m => return Err(unexpected(&m, "SetupReply")),
    };
    ep.connect(&remote)?;
    write_msg(stream, &Msg::Go)?;
    let steps = if p.test.is_lat() { p.total() } else { p.iters };
    let mut progress = Progress::new(format!("{} {} B", p.test.name(), p.size), steps);
    let m = if p.test.is_lat() {
        lat::client(&mut ep, p, &mut progress)?
    } else {
        bw::client(&mut ep, p, &mut progress)?
    };
    progress.finish();
    write_msg(stream, &Msg::Finished { ops: p.total() })?;
    let report = match expect_msg(stream, "Report")? {
        Msg::Report(r) => r,
        m => return Err(unexpected(&m, "Report")),
    };
    if let Some(e) = report.check_error {
        return Err(Error::msg(format!("server-side check failed: {e}")));
    }
    let counted = matches!(
        p.test,
        TestKind::SendLat | TestKind::WriteLat | TestKind::SendBw
    );
    let ud_bw = p.transport == Transport::Ud && p.test == TestKind::SendBw;
    if ud_bw && report.received > p.total() {
        return Err(Error::msg(format!(
            "the server received {} messages, {} were sent",
            report.received,
            p.total()
        )));
    }
    if counted && !ud_bw && report.received != p.total() {
        return Err(Error::msg(format!(
            "the server received {} of {} messages",
            report.received,
            p.total()
        )));
    }
    if p.test == TestKind::AtomicLat && report.value != p.total() {
        return Err(Error::msg(format!(
            "the atomic counter ended at {} after {} fetch-and-adds",
            report.value,
            p.total()
        )));
    }
    super::check_received(&ep, p, Role::Client)?;
    tracing::debug!(counters = ?ctx.counters(), tx_errors = ctx.tx_errors(), "client NIC");
    let mut r = PerfResult::new(p, &m, ctx.name(), cfg.busy_poll, ep.mtu());
    if ud_bw {
        let dropped = p.total() - report.received;
        let measured = report.received.saturating_sub(m.ud_base).min(p.iters);
        r.set_ud_counts(measured, dropped);
        if dropped * 100 > p.total() {
            eprintln!(
                "rdmx perf: warning: UD send_bw with {}-byte messages: {dropped} of {} \
                 datagrams ({:.2} %) were dropped (lost, or the server could not keep up)",
                p.size,
                p.total(),
                100.0 * dropped as f64 / p.total() as f64
            );
        }
    }
    Ok(r)
}

/// A child process that is killed and reaped when dropped.
#[derive(Debug)]
pub(crate) struct ChildGuard {
    child: Option<Child>,
}

impl ChildGuard {
    /// Reads the port the server prints as its first line on stdout.
    fn read_port(&mut self) -> Result<u16> {
        let out = self
            .child
            .as_mut()
            .and_then(|c| c.stdout.take())
            .ok_or_else(|| Error::msg("the local server has no stdout"))?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(out);
            let mut line = String::new();
            let res = r.read_line(&mut line).map(|_| line);
            let _ = tx.send(res);
            // Keep draining so the server can never block on a full pipe.
            let _ = std::io::copy(&mut r, &mut std::io::sink());
        });
        let line = match rx.recv_timeout(IO_TIMEOUT) {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => return Err(Error::with_source("reading the local server's port", e)),
            Err(_) => {
                return Err(Error::msg(format!(
                    "the local server did not print its port within {} s",
                    IO_TIMEOUT.as_secs()
                )));
            }
        };
        let t = line.trim();
        if t.is_empty() {
            return Err(Error::msg(
                "the local server exited before printing its port",
            ));
        }
        t.parse()
            .map_err(|_| Error::msg(format!("the local server printed {t:?}, not a port")))
    }

    /// Waits up to `grace` for the child to exit, then kills it.
    fn finish(&mut self, grace: Duration) -> Result<ExitStatus> {
        let Some(mut child) = self.child.take() else {
            return Err(Error::msg("the local server was already reaped"));
        };
        let deadline = Instant::now() + grace;
        loop {
            if let Some(st) = child.try_wait().ctx("waiting for the local server")? {
                return Ok(st);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::msg(format!(
                    "the local server did not exit within {} s and was killed",
                    grace.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `--local`: starts `rdmx perf --server --once` as a child and runs against it.
pub(crate) fn run_local(cfg: &ClientConfig) -> Result<()> {
    check_local_device(cfg.device.as_deref())?;
    // Open our side first: a bad device name or size is reported once, before anything
    // starts.
    let ctx = super::open_device(cfg.device.as_deref())?;
    let cfg = &cfg.check_device(&ctx)?;
    let mut extra = Vec::new();
    if let Some(d) = &cfg.device {
        extra.extend(["--device", d.as_str()]);
    }
    if cfg.busy_poll {
        extra.push("--busy-poll");
    }
    let (mut guard, port) = spawn_local_server(&extra)?;
    let result = run_with(&ctx, cfg, &format!("127.0.0.1:{port}"));
    finish_local(&mut guard, result)
}

/// `--local` opens the device in two processes on this host, so it must not name a fixed
/// UDP port.
pub(crate) fn check_local_device(device: Option<&str>) -> Result<()> {
    if let Some(d) = device {
        // Both sides open the device on this host: a fixed UDP port cannot be bound twice.
        if let Ok(addrs) = rdmx::verbs::soft::parse_name(d)
            && addrs.iter().any(|a| a.port() != 0)
        {
            return Err(Error::msg(format!(
                "--local opens device {d} in two processes on this host, so it cannot \
                     have a fixed UDP port; name it without one (e.g. soft:{})",
                addrs[0].ip()
            )));
        }
    }
    Ok(())
}

/// Starts `rdmx perf --server --once` on an ephemeral loopback port, with `extra` options,
/// as a child process; returns it and the port it listens on.
pub(crate) fn spawn_local_server(extra: &[&str]) -> Result<(ChildGuard, u16)> {
    let exe = std::env::current_exe().ctx("locating the rdmx executable")?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "perf",
        "--server",
        "--once",
        "--port",
        "0",
        "--print-port",
        "--bind",
        "127.0.0.1",
    ]);
    cmd.args(extra);
    // RDMX_PCAP names one file per process; two processes writing it would interleave their
    // records. This client's capture already holds every frame of the connection (its
    // device records what it sends and what it receives), so the server does not capture.
    cmd.env_remove("RDMX_PCAP");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let child = cmd.spawn().ctx("starting the local server")?;
    let mut guard = ChildGuard { child: Some(child) };
    let port = guard.read_port()?;
    Ok((guard, port))
}

/// Ends a `--local` run: waits for the server to exit and combines its status with the
/// client's `result` (the client's error wins).
pub(crate) fn finish_local(guard: &mut ChildGuard, result: Result<()>) -> Result<()> {
    let status = guard.finish(Duration::from_secs(5));
    match (result, status) {
        (Err(e), _) => Err(e),
        (Ok(()), Ok(st)) if st.success() => Ok(()),
        (Ok(()), Ok(st)) => Err(Error::msg(format!("the local server exited with {st}"))),
        (Ok(()), Err(e)) => Err(e),
    }
}
