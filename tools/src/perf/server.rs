//! `rdmx perf --server`: accepts side-channel connections one after another and runs the
//! server half of every test round the client asks for.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rdmx::verbs::{Context, ProtectionDomain};

use super::endpoint::{Endpoint, EpSpec, PROGRESS_TIMEOUT, Role};
use super::exchange::{
    self, EndpointInfo, Msg, ServerReport, TestParams, expect_msg, unexpected, write_msg,
};
use super::{TestKind, bw, lat};
use crate::error::{Error, Result, ResultExt};

/// With `--once`, give up when no client connects within this time (so that a server
/// started by `--local` never outlives a client that died early).
pub(crate) const ONCE_ACCEPT_TIMEOUT: Duration = Duration::from_secs(30);

/// Server options.
#[derive(Debug, Clone)]
pub(crate) struct ServerConfig {
    /// Address to listen on.
    pub(crate) bind: IpAddr,
    /// TCP port (0: any).
    pub(crate) port: u16,
    /// Exit after one connection.
    pub(crate) once: bool,
    /// Print the bound port on stdout.
    pub(crate) print_port: bool,
    /// RDMA device.
    pub(crate) device: Option<String>,
    /// Busy-poll completion queues.
    pub(crate) busy_poll: bool,
}

/// Runs the server.
pub(crate) fn run(cfg: &ServerConfig) -> Result<()> {
    let ctx = super::open_device(cfg.device.as_deref())?;
    let pd = ctx.alloc_pd().ctx("allocating a protection domain")?;
    let listener = TcpListener::bind((cfg.bind, cfg.port))
        .with_ctx(|| format!("listening on {}:{}", cfg.bind, cfg.port))?;
    let local = listener
        .local_addr()
        .ctx("querying the listening address")?;
    if cfg.print_port {
        println!("{}", local.port());
        io::Write::flush(&mut io::stdout()).ctx("writing the port to stdout")?;
    } else {
        eprintln!(
            "rdmx perf server: listening on {local}, device {}",
            ctx.name()
        );
    }
    loop {
        let (stream, peer) = if cfg.once {
            accept_within(&listener, ONCE_ACCEPT_TIMEOUT)?
        } else {
            listener.accept().ctx("accepting a connection")?
        };
        tracing::info!(%peer, "client connected");
        let r = serve_connection(&ctx, &pd, stream, cfg.busy_poll);
        if cfg.once {
            return r.map(|_| ());
        }
        match r {
            Ok(n) => tracing::info!(%peer, rounds = n, "client done"),
            Err(e) => eprintln!("rdmx perf server: client {peer}: {e}"),
        }
    }
}

fn accept_within(listener: &TcpListener, timeout: Duration) -> Result<(TcpStream, SocketAddr)> {
    listener
        .set_nonblocking(true)
        .ctx("making the listener non-blocking")?;
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((s, a)) => {
                s.set_nonblocking(false)
                    .ctx("making the connection blocking")?;
                return Ok((s, a));
            }
            Err(e) if would_block(&e) => {
                if Instant::now() >= deadline {
                    return Err(Error::msg(format!(
                        "no client connected within {} s",
                        timeout.as_secs()
                    )));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(Error::with_source("accepting a connection", e)),
        }
    }
}

/// Serves the rounds of one connection; returns how many.
fn serve_connection(
    ctx: &Context,
    pd: &ProtectionDomain,
    mut stream: TcpStream,
    busy: bool,
) -> Result<u32> {
    exchange::configure(&stream)?;
    let mut rounds = 0;
    loop {
        // Between rounds the client may take its time (printing, setting up): wait longer.
        stream
            .set_read_timeout(Some(exchange::IO_TIMEOUT * 6))
            .ctx("setting a timeout")?;
        let msg = expect_msg(&mut stream, "Setup or Bye");
        stream
            .set_read_timeout(Some(exchange::IO_TIMEOUT))
            .ctx("setting a timeout")?;
        match msg? {
            Msg::Setup { params, ep } => {
                let r = params
                    .validate()
                    .and_then(|()| serve_round(ctx, pd, &mut stream, &params, &ep, busy))
                    .with_ctx(|| {
                        format!("{} with {}-byte messages", params.test.name(), params.size)
                    });
                if let Err(e) = r {
                    tracing::info!(counters = ?ctx.counters(), "server NIC after the failure");
                    let _ = write_msg(&mut stream, &Msg::Error(e.to_string()));
                    return Err(e);
                }
                rounds += 1;
            }
            Msg::Bye => return Ok(rounds),
            m => return Err(unexpected(&m, "Setup or Bye")),
        }
    }
}

fn serve_round(
    ctx: &Context,
    pd: &ProtectionDomain,
    stream: &mut TcpStream,
    p: &TestParams,
    remote: &EndpointInfo,
    busy: bool,
) -> Result<()> {
    let spec = EpSpec::for_test(p, Role::Server);
    let watch = stream.try_clone().ctx("cloning the side channel")?;
    let mut ep = Endpoint::new(ctx, pd, &spec, busy, Some(watch))?;
    ep.connect(remote)?;
    write_msg(stream, &Msg::SetupReply { ep: ep.info()? })?;
    match expect_msg(stream, "Go")? {
        Msg::Go => {}
        m => return Err(unexpected(&m, "Go")),
    }
    let received = if p.test.is_one_sided() {
        // Spinning helps the latency tests (the soft NIC answers from this thread without a
        // wake-up); for streams the engine thread's batched reception is faster, and a
        // spinning server would take a core from the client on a small host.
        serve_passive(&mut ep, stream, p.test.is_lat())?;
        0
    } else if p.test == TestKind::SendBw {
        bw::server_send(&mut ep, p)?
    } else {
        lat::server(&mut ep, p)?
    };
    let ops = match expect_msg(stream, "Finished")? {
        Msg::Finished { ops } => ops,
        m => return Err(unexpected(&m, "Finished")),
    };
    let check_error = super::check_received(&ep, p, Role::Server)
        .err()
        .map(|e| e.to_string());
    let value = if p.test == TestKind::AtomicLat {
        ep.mr()
            .read_u64(ep.layout().tx_off)
            .ctx("reading the atomic word")?
    } else {
        0
    };
    tracing::debug!(
        test = p.test.name(),
        size = p.size,
        ops,
        received,
        value,
        "round done"
    );
    tracing::debug!(counters = ?ctx.counters(), tx_errors = ctx.tx_errors(), "server NIC");
    write_msg(
        stream,
        &Msg::Report(ServerReport {
            received,
            value,
            check_error,
        }),
    )
}

fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// The server of the one-sided tests: keeps the NIC going until the client speaks on
/// `stream`: in busy mode (if `spin`) by spinning on the CQ, which runs the soft NIC on this
/// thread, otherwise by leaving it to the device's engine thread. Fails when neither the
/// network nor the client show a sign of life for [`PROGRESS_TIMEOUT`].
fn serve_passive(ep: &mut Endpoint, stream: &TcpStream, spin: bool) -> Result<()> {
    let mut last_rx = ep.ctx().counters().rx_packets;
    let mut last_change = Instant::now();
    let mut last_check = Instant::now();
    loop {
        if spin && ep.busy() {
            for _ in 0..64 {
                ep.poll_nowait()?;
            }
            let now = Instant::now();
            if now - last_check < Duration::from_millis(1) {
                continue;
            }
            last_check = now;
            if exchange::peer_spoke(stream) {
                return Ok(());
            }
        } else {
            let mut b = [0u8; 1];
            stream
                .set_read_timeout(Some(Duration::from_millis(200)))
                .ctx("setting a timeout")?;
            let r = stream.peek(&mut b);
            stream
                .set_read_timeout(Some(exchange::IO_TIMEOUT))
                .ctx("setting a timeout")?;
            match r {
                Ok(_) => return Ok(()),
                Err(e) if would_block(&e) => {}
                Err(e) => return Err(Error::with_source("side channel failed", e)),
            }
        }
        let rx = ep.ctx().counters().rx_packets;
        if rx != last_rx {
            last_rx = rx;
            last_change = Instant::now();
        } else if last_change.elapsed() >= PROGRESS_TIMEOUT {
            return Err(Error::msg(format!(
                "timed out: no traffic and no message from the client for {} s",
                PROGRESS_TIMEOUT.as_secs()
            )));
        }
    }
}
