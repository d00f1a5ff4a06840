//! `rdmx perf --layer msg --server`: accepts endpoints one after another and runs the server
//! half of every round the client asks for.

use std::io;
use std::net::IpAddr;
use std::sync::mpsc;
use std::time::Duration;

use rdmx::{Context, Endpoint, Listener, Message, Transport as MsgTransport};

use super::control::{self, Ctl};
use super::{MsgTest, RdmxResultExt, RoundParams, check_data, check_payload, open_context, stamp};
use crate::error::{Error, Result, ResultExt};
use crate::perf::endpoint::PROGRESS_TIMEOUT;
use crate::perf::exchange::IO_TIMEOUT;
use crate::perf::server::ONCE_ACCEPT_TIMEOUT;
use crate::perf::{CLIENT_SEED, SERVER_SEED, pattern};

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
    /// Busy-poll in blocking calls.
    pub(crate) busy_poll: bool,
    /// Transport of the endpoints.
    pub(crate) transport: MsgTransport,
}

/// Runs the server.
pub(crate) fn run(cfg: &ServerConfig) -> Result<()> {
    let ctx = open_context(cfg.device.as_deref(), cfg.transport, cfg.busy_poll)?;
    let listener = ctx
        .listen((cfg.bind, cfg.port))
        .with_rctx(|| format!("listening on {}:{}", cfg.bind, cfg.port))?;
    let local = listener.local_addr();
    if cfg.print_port {
        println!("{}", local.port());
        io::Write::flush(&mut io::stdout()).ctx("writing the port to stdout")?;
    } else {
        eprintln!(
            "rdmx perf server (message layer): listening on {local}, device {}",
            ctx.verbs_context().name()
        );
    }
    if cfg.once {
        let ep = accept_within(listener, ONCE_ACCEPT_TIMEOUT)?;
        return serve(&ctx, ep).map(|_| ());
    }
    loop {
        match listener.accept() {
            Ok(ep) => {
                let id = ep.id();
                match serve(&ctx, ep) {
                    Ok(n) => tracing::info!(endpoint = id, rounds = n, "client done"),
                    Err(e) => eprintln!("rdmx perf server: endpoint {id}: {e}"),
                }
            }
            Err(e) => {
                let e = super::rdmx_error("a client failed to connect".into(), &e);
                eprintln!("rdmx perf server: {e}");
                // Do not spin if accepting itself keeps failing.
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Accepts one endpoint, giving up after `timeout` (so that a server started by `--local`
/// never outlives a client that died early). The listener has no accept with a deadline, so
/// a helper thread accepts; on a timeout it is left blocked, and the process exits.
fn accept_within(listener: Listener, timeout: Duration) -> Result<Endpoint> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("rdmx-perf-accept".into())
        .spawn(move || {
            let _ = tx.send(listener.accept());
        })
        .ctx("starting the accept thread")?;
    match rx.recv_timeout(timeout) {
        Ok(r) => r.rctx("accepting an endpoint"),
        Err(_) => Err(Error::msg(format!(
            "no client connected within {} s",
            timeout.as_secs()
        ))),
    }
}

/// Serves the rounds of one endpoint, then closes it; returns how many.
fn serve(ctx: &Context, ep: Endpoint) -> Result<u32> {
    let mut rounds = 0;
    loop {
        // Between rounds the client may take its time (printing, setting up): wait longer.
        let r = match control::recv(&ep, "Setup or Bye", IO_TIMEOUT * 6) {
            Ok(Ctl::Setup(p)) => p
                .validate(ctx.config().max_message)
                .and_then(|()| serve_round(&ep, &p))
                .with_ctx(|| format!("msg {} with {}-byte messages", p.test.name(), p.size)),
            Ok(Ctl::Bye) => {
                super::close(ep)?;
                return Ok(rounds);
            }
            Ok(c) => Err(control::unexpected(&c, "Setup or Bye")),
            Err(e) => Err(e),
        };
        if let Err(e) = r {
            tracing::info!(stats = ?ctx.stats(), counters = ?ctx.device_counters(),
                "server after the failure");
            control::send_error(&ep, &e);
            // Let the report reach the client before the endpoint goes.
            let _ = super::close(ep);
            return Err(e);
        }
        rounds += 1;
    }
}

fn serve_round(ep: &Endpoint, p: &RoundParams) -> Result<()> {
    control::send(ep, &Ctl::Ready)?;
    let last = match p.test {
        MsgTest::Lat => echo(ep, p)?,
        MsgTest::Bw | MsgTest::Rate | MsgTest::BwShared => sink(ep, p)?,
    };
    let check_error = last
        .and_then(|m| check_payload(&m, CLIENT_SEED, "the client's last message").err())
        .map(|e| e.to_string());
    tracing::debug!(
        test = p.test.name(),
        size = p.size,
        received = p.total(),
        "round done"
    );
    control::send(
        ep,
        &Ctl::Report {
            received: p.total(),
            check_error,
        },
    )
}

/// The server of `lat`: answers every message with one of the same size; returns the last
/// message (checked once the round is over).
fn echo(ep: &Endpoint, p: &RoundParams) -> Result<Option<Message>> {
    let size = p.size as usize;
    let total = p.total();
    let mut tx = pattern(SERVER_SEED, size);
    let mut last = None;
    for i in 0..total {
        let m = ep
            .recv_timeout(PROGRESS_TIMEOUT)
            .with_rctx(|| format!("waiting for the client's message {i}"))?;
        check_data(&m, size, i, "the client's message")?;
        stamp(&mut tx, i);
        ep.send_timeout(&tx, PROGRESS_TIMEOUT)
            .with_rctx(|| format!("sending reply {i}"))?;
        if i + 1 == total {
            last = Some(m);
        }
    }
    Ok(last)
}

/// The server of `bw` and `rate`: drops the messages as they arrive (after checking their
/// length and index) and acknowledges the end of the warm-up and of the round; returns the
/// last message (checked once the acknowledgement is out).
fn sink(ep: &Endpoint, p: &RoundParams) -> Result<Option<Message>> {
    let size = p.size as usize;
    let total = p.total();
    let mut last = None;
    let phases: &[u64] = if p.warmup > 0 {
        &[p.warmup, total]
    } else {
        &[total]
    };
    let mut i = 0;
    for &end in phases {
        while i < end {
            let m = ep
                .recv_timeout(PROGRESS_TIMEOUT)
                .with_rctx(|| format!("waiting for the client's message {i}"))?;
            let index = if p.test == MsgTest::BwShared { 0 } else { i };
            check_data(&m, size, index, "the client's message")?;
            if i + 1 == total {
                last = Some(m);
            }
            i += 1;
        }
        control::send(ep, &Ctl::Ack { received: end })?;
    }
    Ok(last)
}
