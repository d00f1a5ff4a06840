//! `rdmx perf --layer msg --connect` / `--local`: the measuring side.

use std::time::{Duration, Instant};

use rdmx::{Context, Endpoint, Message, Stats, Transport as MsgTransport};

use super::control::{self, Ctl};
use super::{
    MsgTest, RdmxResultExt, RoundParams, check_data, check_payload, check_size, open_context,
    stamp, transport_name,
};
use crate::error::{Error, Result, ResultExt};
use crate::perf::endpoint::PROGRESS_TIMEOUT;
use crate::perf::exchange::IO_TIMEOUT;
use crate::perf::lat::Measured;
use crate::perf::report::{LatStats, PerfResult, Printer, Progress};
use crate::perf::{CLIENT_SEED, MAX_ITERS, PerfArgs, SERVER_SEED, client as verbs_client, pattern};

/// How long a failing client looks for the server's own error report.
const PEER_ERROR_WAIT: Duration = Duration::from_millis(500);

/// Client options, validated.
#[derive(Debug, Clone)]
pub(crate) struct ClientConfig {
    test: MsgTest,
    transport: MsgTransport,
    sizes: Vec<u64>,
    iters: u64,
    warmup: u64,
    busy_poll: bool,
    /// Messages per send batch (0 or 1: none).
    batch: u32,
    json: bool,
    device: Option<String>,
    /// Where every latency sample goes (`--samples`).
    samples: Option<std::path::PathBuf>,
}

impl ClientConfig {
    /// Validates the command line.
    pub(crate) fn from_args(a: &PerfArgs, transport: MsgTransport) -> Result<Self> {
        let test = a
            .test
            .ok_or_else(|| Error::msg("--test is required with --layer msg (lat, bw, rate)"))?;
        let test = test.msg().ok_or_else(|| {
            Error::msg(format!(
                "--test {} is a verbs-level test; --layer msg runs lat, bw or rate",
                test.name()
            ))
        })?;
        let sizes = if a.size.is_empty() {
            vec![test.default_size()]
        } else {
            a.size.clone()
        };
        for &s in &sizes {
            check_size(s, usize::MAX).map_err(|e| Error::msg(format!("--size: {e}")))?;
        }
        let iters = a.iters.unwrap_or(test.default_iters());
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
        Ok(Self {
            test,
            transport,
            sizes,
            iters,
            warmup,
            busy_poll: a.busy_poll,
            batch: a.batch,
            json: a.json,
            device: a.device.clone(),
            samples: a.samples.clone(),
        })
    }

    /// Opens this side's context and checks the sizes against it.
    fn open(&self) -> Result<Context> {
        let ctx = open_context(self.device.as_deref(), self.transport, self.busy_poll)?;
        let max = ctx.config().max_message;
        for &s in &self.sizes {
            check_size(s, max).map_err(|e| Error::msg(format!("--size: {e}")))?;
        }
        Ok(ctx)
    }

    fn params(&self, size: u64) -> RoundParams {
        RoundParams {
            test: self.test,
            size,
            iters: self.iters,
            warmup: self.warmup,
        }
    }
}

/// Runs every size against the message-layer server at `target`.
pub(crate) fn run(cfg: &ClientConfig, target: &str) -> Result<()> {
    let ctx = cfg.open()?;
    run_with(&ctx, cfg, target)
}

/// `--local`: starts `rdmx perf --layer msg --server --once` as a child and runs against it.
pub(crate) fn run_local(cfg: &ClientConfig) -> Result<()> {
    verbs_client::check_local_device(cfg.device.as_deref())?;
    // Our side first: a bad device, transport or size is reported once, before anything
    // starts.
    let ctx = cfg.open()?;
    let mut extra = vec![
        "--layer",
        "msg",
        "--transport",
        transport_name(cfg.transport),
    ];
    if let Some(d) = &cfg.device {
        extra.extend(["--device", d.as_str()]);
    }
    if cfg.busy_poll {
        extra.push("--busy-poll");
    }
    let (mut guard, port) = verbs_client::spawn_local_server(&extra)?;
    let result = run_with(&ctx, cfg, &format!("127.0.0.1:{port}"));
    verbs_client::finish_local(&mut guard, result)
}

fn run_with(ctx: &Context, cfg: &ClientConfig, target: &str) -> Result<()> {
    let ep = ctx.connect(target).with_rctx(|| {
        format!(
            "connecting to the message-layer server at {target} (is it `rdmx perf --layer msg \
             --server`?)"
        )
    })?;
    let mut printer = Printer::new(cfg.json, false);
    let mut samples = match &cfg.samples {
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::File::create(path).map_err(|e| {
                Error::msg(format!("--samples: cannot create {}: {e}", path.display()))
            })?,
        )),
        None => None,
    };
    for &size in &cfg.sizes {
        let p = cfg.params(size);
        match run_round(ctx, &ep, cfg, &p) {
            Ok((r, m)) => {
                printer.print(&r);
                if let Some(w) = samples.as_mut() {
                    write_samples(w, size, &m)?;
                }
            }
            Err(e) => {
                tracing::info!(stats = ?ctx.stats(), counters = ?ctx.device_counters(),
                    "client after the failure");
                let e = match control::pending_peer_error(&ep, PEER_ERROR_WAIT) {
                    Some(theirs) => Error::msg(format!("{e}; the server reported: {theirs}")),
                    None => {
                        control::send_error(&ep, &e);
                        e
                    }
                };
                return Err(Error::with_source(
                    format!("msg {} with {size}-byte messages", p.test.name()),
                    e,
                ));
            }
        }
    }
    control::send(&ep, &Ctl::Bye)?;
    super::close(ep)
}

/// Writes a round's one-way latencies (half of each round trip), one `size ns` line each.
fn write_samples(w: &mut impl std::io::Write, size: u64, m: &Measured) -> Result<()> {
    let io = |e: std::io::Error| Error::msg(format!("--samples: {e}"));
    for ns in &m.rtt_ns {
        writeln!(w, "{size} {}", ns / 2).map_err(io)?;
    }
    w.flush().map_err(io)
}

fn run_round(
    ctx: &Context,
    ep: &Endpoint,
    cfg: &ClientConfig,
    p: &RoundParams,
) -> Result<(PerfResult, Measured)> {
    control::send(ep, &Ctl::Setup(*p))?;
    match control::recv(ep, "Ready", IO_TIMEOUT)? {
        Ctl::Ready => {}
        c => return Err(control::unexpected(&c, "Ready")),
    }
    let before = ctx.stats();
    let ud_before = ctx.ud().map(|u| u.stats());
    let steps = if p.test == MsgTest::Lat {
        p.total()
    } else {
        p.iters
    };
    let mut progress = Progress::new(format!("msg {} {} B", p.test.name(), p.size), steps);
    let m = match p.test {
        MsgTest::Lat => lat(ep, p, &mut progress)?,
        MsgTest::Bw | MsgTest::Rate | MsgTest::BwShared => {
            stream(ctx, ep, p, cfg.batch, &mut progress)?
        }
    };
    progress.finish();
    let after = ctx.stats();
    let ud = ud_before.zip(ctx.ud().map(|u| u.stats()));
    let (received, check_error) = match control::recv(ep, "Report", IO_TIMEOUT)? {
        Ctl::Report {
            received,
            check_error,
        } => (received, check_error),
        c => return Err(control::unexpected(&c, "Report")),
    };
    if let Some(e) = check_error {
        return Err(Error::msg(format!("server-side check failed: {e}")));
    }
    if received != p.total() {
        return Err(Error::msg(format!(
            "the server received {received} of {} messages",
            p.total()
        )));
    }
    tracing::debug!(stats = ?after, pool = ?ctx.pool_stats(),
        counters = ?ctx.device_counters(), "client after the round");
    let mut r = result(ctx, cfg, p, &m, &before, &after)?;
    if let Some((b, a)) = ud {
        r.ud_retransmits = Some(a.retransmits.saturating_sub(b.retransmits));
        r.ud_duplicates = Some(a.duplicates.saturating_sub(b.duplicates));
        r.ud_refused = Some(a.refused.saturating_sub(b.refused));
    }
    Ok((r, m))
}

/// Builds the result line (the verbs tests' schema, plus the message-layer fields).
fn result(
    ctx: &Context,
    cfg: &ClientConfig,
    p: &RoundParams,
    m: &Measured,
    before: &Stats,
    after: &Stats,
) -> Result<PerfResult> {
    let stats = if p.test == MsgTest::Lat {
        LatStats::from_ns(&m.rtt_ns, 2.0)
    } else {
        None
    };
    let secs = m.elapsed.as_secs_f64().max(1e-9);
    let vctx = ctx.verbs_context();
    let port = vctx.query_port(1).ctx("querying port 1")?;
    let sent = [
        (
            after.sent_inline.saturating_sub(before.sent_inline),
            "inline",
        ),
        (after.sent_eager.saturating_sub(before.sent_eager), "eager"),
        (
            after.sent_rndv.saturating_sub(before.sent_rndv),
            "rendezvous",
        ),
        (
            after.sent_packed.saturating_sub(before.sent_packed),
            "packed",
        ),
    ];
    let mut used = sent.iter().filter(|(n, _)| *n > 0).map(|&(_, name)| name);
    let msg_protocol = match (used.next(), used.next()) {
        // (UD endpoints send everything as datagrams, segmented above the MTU.)
        _ if ctx.ud().is_some() => Some("datagram"),
        (Some(name), None) => Some(name),
        (Some(_), Some(_)) => Some("mixed"),
        (None, _) => None,
    };
    let config = ctx.config();
    Ok(PerfResult {
        test: p.test.name(),
        transport: transport_name(cfg.transport),
        device: vctx.name().to_string(),
        busy_poll: cfg.busy_poll,
        size: p.size,
        iters: p.iters,
        warmup: p.warmup,
        tx_depth: None,
        mtu: port.active_mtu.bytes() as u32,
        lat_p50_us: stats.map(|s| s.p50),
        lat_p99_us: stats.map(|s| s.p99),
        lat_p999_us: stats.map(|s| s.p999),
        lat_avg_us: stats.map(|s| s.avg),
        lat_min_us: stats.map(|s| s.min),
        lat_max_us: stats.map(|s| s.max),
        lat_is_rtt: false,
        bw_mbps: (p.size as f64) * (p.iters as f64) / secs / 1e6,
        msg_rate: p.iters as f64 / secs,
        elapsed_s: m.elapsed.as_secs_f64(),
        write_lat_sync: None,
        ud_dropped: None,
        layer: Some("msg"),
        msg_protocol,
        credits: Some(config.credits),
        credit_waits: Some(after.credit_waits.saturating_sub(before.credit_waits)),
        busy_poll_us: Some(u64::try_from(config.busy_poll.as_micros()).unwrap_or(u64::MAX)),
        batch: (cfg.batch > 1 && p.test != MsgTest::Lat).then_some(cfg.batch),
        ud_retransmits: None,
        ud_duplicates: None,
        ud_refused: None,
    })
}

/// The client of `lat`: sends message `i`, waits for the server's reply `i`, and times the
/// round trip.
fn lat(ep: &Endpoint, p: &RoundParams, progress: &mut Progress) -> Result<Measured> {
    let size = p.size as usize;
    let total = p.total();
    let mut tx = pattern(CLIENT_SEED, size);
    let mut rtt = Vec::with_capacity(p.iters.min(1 << 24) as usize);
    let mut last: Option<Message> = None;
    let mut start = Instant::now();
    for i in 0..total {
        if i == p.warmup {
            start = Instant::now();
        }
        stamp(&mut tx, i);
        let t0 = Instant::now();
        ep.send_timeout(&tx, PROGRESS_TIMEOUT)
            .with_rctx(|| format!("sending message {i}"))?;
        let m = ep
            .recv_timeout(PROGRESS_TIMEOUT)
            .with_rctx(|| format!("waiting for the server's reply {i}"))?;
        let t = t0.elapsed();
        check_data(&m, size, i, "the server's reply")?;
        if i >= p.warmup {
            rtt.push(t.as_nanos() as u64);
        }
        if i + 1 == total {
            last = Some(m);
        }
        progress.update(i + 1);
    }
    let elapsed = start.elapsed();
    if let Some(m) = last {
        check_payload(&m, SERVER_SEED, "the server's last reply")?;
    }
    Ok(Measured {
        rtt_ns: rtt,
        elapsed,
        ud_base: 0,
    })
}

/// What a stream sends from: the pattern, and (`bw_shared`) the one shared buffer made from
/// it, registered once by the registration cache.
struct Source {
    tx: Vec<u8>,
    shared: Option<rdmx::SharedBytes>,
}

/// The client of `bw`, `bw_shared` and `rate`: the warm-up stream and its acknowledgement,
/// then the timed stream, which ends when the server acknowledges the last message.
fn stream(
    ctx: &Context,
    ep: &Endpoint,
    p: &RoundParams,
    batch: u32,
    progress: &mut Progress,
) -> Result<Measured> {
    let mut src = Source {
        tx: pattern(CLIENT_SEED, p.size as usize),
        shared: None,
    };
    if p.warmup > 0 {
        send_range(ctx, ep, p, &mut src, 0, p.warmup, batch, None)?;
        wait_ack(ep, p.warmup)?;
    }
    let t0 = Instant::now();
    send_range(
        ctx,
        ep,
        p,
        &mut src,
        p.warmup,
        p.total(),
        batch,
        Some(progress),
    )?;
    wait_ack(ep, p.total())?;
    Ok(Measured {
        rtt_ns: Vec::new(),
        elapsed: t0.elapsed(),
        ud_base: 0,
    })
}

/// Sends data messages `from..to`: `bw` from pooled buffers (`send_buf`; only the last
/// message of the round gets the whole pattern, the others just their index), `rate` from
/// the pattern (`send`, a copy), `bw_shared` one immutable copy of the pattern stamped 0
/// (`send_shared`). With `batch` above 1, every `batch` messages share a send batch.
#[expect(
    clippy::too_many_arguments,
    reason = "one internal helper of the stream tests"
)]
fn send_range(
    ctx: &Context,
    ep: &Endpoint,
    p: &RoundParams,
    src: &mut Source,
    from: u64,
    to: u64,
    batch: u32,
    mut progress: Option<&mut Progress>,
) -> Result<()> {
    let size = p.size as usize;
    let last = p.total() - 1;
    let mut open = None;
    for i in from..to {
        if batch > 1 && (i - from).is_multiple_of(u64::from(batch)) {
            // Ends the previous batch (sending what it held) and opens the next.
            drop(open.take());
            open = Some(ctx.batch());
        }
        match p.test {
            MsgTest::Bw => {
                let mut b = ctx
                    .alloc(size)
                    .with_rctx(|| format!("allocating a {size}-byte pool buffer"))?;
                if i == last {
                    b.copy_from_slice(&src.tx);
                }
                stamp(&mut b, i);
                ep.send_buf(b)
                    .with_rctx(|| format!("sending message {i}"))?;
            }
            MsgTest::BwShared => {
                let tx = &mut src.tx;
                let b = src.shared.get_or_insert_with(|| {
                    stamp(tx, 0);
                    rdmx::SharedBytes::from(tx.clone())
                });
                ep.send_shared(b.clone())
                    .with_rctx(|| format!("sending message {i}"))?;
            }
            MsgTest::Rate | MsgTest::Lat => {
                stamp(&mut src.tx, i);
                ep.send_timeout(&src.tx, PROGRESS_TIMEOUT)
                    .with_rctx(|| format!("sending message {i}"))?;
            }
        }
        if let Some(pr) = progress.as_deref_mut() {
            pr.update(i + 1 - from);
        }
    }
    drop(open);
    Ok(())
}

/// Waits for the server's acknowledgement of `want` messages.
fn wait_ack(ep: &Endpoint, want: u64) -> Result<()> {
    match control::recv(ep, "the server's acknowledgement", PROGRESS_TIMEOUT)? {
        Ctl::Ack { received } if received == want => Ok(()),
        Ctl::Ack { received } => Err(Error::msg(format!(
            "the server acknowledged {received} messages, {want} were sent"
        ))),
        c => Err(control::unexpected(&c, "Ack")),
    }
}
