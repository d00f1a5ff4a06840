//! `rdmx perf`: a perftest-style benchmark between two processes: at the verbs level over RC
//! or UD queue pairs (the default), or at the message level (`--layer msg`) over `rdmx`
//! endpoints.
//!
//! * [`exchange`]: the TCP side channel (framed, versioned bincode messages);
//! * [`spec`] / [`endpoint`]: per-test verbs resources, QP bring-up and completion polling;
//! * [`lat`] / [`bw`]: the measurement loops of both sides;
//! * [`server`] / [`client`]: the two roles (and `--local`, which runs both);
//! * [`report`]: statistics, the table / JSON output and the progress line;
//! * [`msg`]: the message-layer tests (`--layer msg`: lat, bw, rate), which reuse the
//!   roles, `--local` and the output of the verbs tests;
//! * [`mcast`]: a multicast group, one publisher and `--subs` subscriber processes
//!   (`--layer mcast --local`: rate, lat).

mod bw;
mod client;
mod endpoint;
mod exchange;
mod lat;
mod mcast;
mod msg;
mod report;
mod rpc;
mod server;
mod spec;

use std::net::IpAddr;

use clap::{Args, ValueEnum};
use rdmx::verbs::{Context, Device};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result, ResultExt};

/// Largest message size accepted (both from the command line and from a peer).
pub(crate) const MAX_SIZE: u64 = 1 << 30;
/// Largest iteration count accepted from a peer.
pub(crate) const MAX_ITERS: u64 = 1 << 40;
/// Largest `--tx-depth`.
pub(crate) const MAX_TX_DEPTH: u32 = 8192;
/// Largest `--rx-depth`.
pub(crate) const MAX_RX_DEPTH: u32 = 32768;

/// The benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum, Serialize, Deserialize)]
#[value(rename_all = "snake_case")]
pub(crate) enum TestKind {
    /// Send/receive ping-pong; one-way latency (RTT/2).
    SendLat,
    /// RDMA WRITE ping-pong; one-way latency (RTT/2).
    WriteLat,
    /// RDMA READ round trips; latency is the full round trip.
    ReadLat,
    /// Atomic fetch-and-add round trips; latency is the full round trip.
    AtomicLat,
    /// Streaming sends.
    SendBw,
    /// Streaming RDMA WRITEs.
    WriteBw,
    /// Streaming RDMA READs.
    ReadBw,
}

impl TestKind {
    /// The name used on the command line and in reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::SendLat => "send_lat",
            Self::WriteLat => "write_lat",
            Self::ReadLat => "read_lat",
            Self::AtomicLat => "atomic_lat",
            Self::SendBw => "send_bw",
            Self::WriteBw => "write_bw",
            Self::ReadBw => "read_bw",
        }
    }

    /// Latency test (as opposed to a bandwidth test).
    pub(crate) fn is_lat(self) -> bool {
        matches!(
            self,
            Self::SendLat | Self::WriteLat | Self::ReadLat | Self::AtomicLat
        )
    }

    /// Tests whose server side only has to stay alive (one-sided operations).
    pub(crate) fn is_one_sided(self) -> bool {
        matches!(
            self,
            Self::ReadLat | Self::AtomicLat | Self::WriteBw | Self::ReadBw
        )
    }
}

/// Transport to benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub(crate) enum Transport {
    /// Reliable connected queue pairs.
    Rc,
    /// Unreliable datagram queue pairs (send_lat and send_bw only; messages up to the MTU).
    Ud,
}

impl Transport {
    /// The name used on the command line and in reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Rc => "rc",
            Self::Ud => "ud",
        }
    }

    /// The name in messages.
    pub(crate) fn upper(self) -> &'static str {
        match self {
            Self::Rc => "RC",
            Self::Ud => "UD",
        }
    }

    /// Checks that the transport can run `test`.
    pub(crate) fn check_test(self, test: TestKind) -> Result<()> {
        if self == Self::Ud && !matches!(test, TestKind::SendLat | TestKind::SendBw) {
            return Err(Error::msg(format!(
                "--transport ud supports only the send_lat and send_bw tests, not {} \
                 (UD has no RDMA reads, writes or atomics)",
                test.name()
            )));
        }
        Ok(())
    }
}

/// The layer `rdmx perf` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Layer {
    /// Queue pairs and work requests (tests send_lat ... read_bw).
    Verbs,
    /// `rdmx` endpoints and messages (tests lat, bw, rate).
    Msg,
    /// A reliable multicast group: one publisher, `--subs` subscribers (tests rate, lat;
    /// `--local` only).
    Mcast,
    /// rdmx-rpc echo calls against a server process (tests lat, rate; `--local` only).
    Rpc,
}

/// The values of `--test`: the verbs-level tests and the message-level ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub(crate) enum TestArg {
    /// Verbs: send/receive ping-pong; one-way latency (RTT/2).
    SendLat,
    /// Verbs: RDMA WRITE ping-pong; one-way latency (RTT/2).
    WriteLat,
    /// Verbs: RDMA READ round trips; latency is the full round trip.
    ReadLat,
    /// Verbs: atomic fetch-and-add round trips; latency is the full round trip.
    AtomicLat,
    /// Verbs: streaming sends.
    SendBw,
    /// Verbs: streaming RDMA WRITEs.
    WriteBw,
    /// Verbs: streaming RDMA READs.
    ReadBw,
    /// Messages (--layer msg): send/recv ping-pong; one-way latency (RTT/2).
    Lat,
    /// Messages (--layer msg): a stream of pooled buffers (send_buf; zero-copy rendezvous
    /// when large), acknowledged at the end.
    Bw,
    /// Messages (--layer msg): a stream of small messages (send); messages per second.
    Rate,
    /// Messages (--layer msg): one application buffer sent again and again with
    /// send_shared (zero-copy through the registration cache at rendezvous sizes, the way
    /// write_bw re-sends one region); every message carries index 0.
    BwShared,
}

impl TestArg {
    /// The verbs-level test, if this is one.
    fn verbs(self) -> Option<TestKind> {
        Some(match self {
            Self::SendLat => TestKind::SendLat,
            Self::WriteLat => TestKind::WriteLat,
            Self::ReadLat => TestKind::ReadLat,
            Self::AtomicLat => TestKind::AtomicLat,
            Self::SendBw => TestKind::SendBw,
            Self::WriteBw => TestKind::WriteBw,
            Self::ReadBw => TestKind::ReadBw,
            Self::Lat | Self::Bw | Self::Rate | Self::BwShared => return None,
        })
    }

    /// The message-level test, if this is one.
    fn msg(self) -> Option<msg::MsgTest> {
        match self {
            Self::Lat => Some(msg::MsgTest::Lat),
            Self::Bw => Some(msg::MsgTest::Bw),
            Self::Rate => Some(msg::MsgTest::Rate),
            Self::BwShared => Some(msg::MsgTest::BwShared),
            _ => None,
        }
    }

    /// The name on the command line.
    fn name(self) -> &'static str {
        match (self.verbs(), self.msg()) {
            (Some(t), _) => t.name(),
            (None, Some(t)) => t.name(),
            (None, None) => "?",
        }
    }
}

/// The values of `--transport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum TransportArg {
    /// Reliable connected queue pairs (both layers).
    Rc,
    /// Unreliable datagram queue pairs (verbs layer: send_lat and send_bw only; messages up
    /// to the MTU).
    Ud,
    /// XRC (message layer only).
    Xrc,
}

impl TransportArg {
    /// The verbs-level transport.
    fn verbs(self) -> Result<Transport> {
        match self {
            Self::Rc => Ok(Transport::Rc),
            Self::Ud => Ok(Transport::Ud),
            Self::Xrc => Err(Error::msg(
                "--transport xrc is not a verbs-level perf transport (use rc or ud); XRC \
                 endpoints belong to the message layer (--layer msg --transport xrc)",
            )),
        }
    }
}

/// Options of `rdmx perf`.
#[derive(Debug, Args)]
pub(crate) struct PerfArgs {
    /// What to measure: verbs-level queue pairs, or `rdmx` message endpoints (lat, bw,
    /// rate).
    #[arg(long, value_enum, default_value_t = Layer::Verbs)]
    layer: Layer,
    /// Run the server side: listen on TCP and serve test runs one after another.
    #[arg(long)]
    server: bool,
    /// Run the client side against the server at HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    connect: Option<String>,
    /// Run the client against a server started as a child process of this one.
    #[arg(long)]
    local: bool,
    /// Server: exit after one connection.
    #[arg(long)]
    once: bool,
    /// Server: TCP port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 18515)]
    port: u16,
    /// Server: address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    bind: IpAddr,
    /// Server: print the bound TCP port on stdout (first line) once listening.
    #[arg(long)]
    print_port: bool,
    /// Test to run (verbs: send_lat ... read_bw; --layer msg: lat, bw, rate).
    #[arg(long, short = 't', value_enum)]
    test: Option<TestArg>,
    /// Message size(s) in bytes (K/M/G suffixes allowed); repeat or comma-separate to run
    /// several sizes [default: 8 for latency tests and rate, 65536 for bandwidth tests].
    #[arg(long, short = 's', value_delimiter = ',', value_parser = parse_size)]
    size: Vec<u64>,
    /// Measured iterations per size [default: 1000 for latency tests, 5000 for bandwidth,
    /// 100000 for rate].
    #[arg(long, short = 'n', value_parser = parse_count)]
    iters: Option<u64>,
    /// Warm-up iterations, not measured [default: iters/10, at most 100].
    #[arg(long, value_parser = parse_count)]
    warmup: Option<u64>,
    /// Verbs bandwidth tests: work requests kept outstanding.
    #[arg(long, default_value_t = 128)]
    tx_depth: u32,
    /// Verbs send_bw: receives the server keeps posted. RC: the client is not flow-controlled;
    /// when they run out, the server's NIC answers with RNR NAKs and the client retries. UD:
    /// the client keeps at most --tx-depth messages beyond the server's last credit, and
    /// datagrams that find no receive are dropped (and reported).
    #[arg(long, default_value_t = 4096)]
    rx_depth: u32,
    /// Verbs tests: sends and writes up to this size are posted inline.
    #[arg(long, default_value_t = 64)]
    inline_size: u32,
    /// Spin on the completion queue instead of sleeping on the completion channel (--layer
    /// msg: blocking calls poll for up to a second before they sleep).
    #[arg(long)]
    busy_poll: bool,
    /// --layer msg, bw and rate: send the messages in batches of this many
    /// (`Context::batch`; the soft device then sends a batch's small messages with one
    /// system call). 0 or 1: no batches.
    #[arg(long, default_value_t = 0)]
    batch: u32,
    /// Print one JSON object per result line.
    #[arg(long)]
    json: bool,
    /// --layer msg, lat: also write every measured one-way latency to FILE, one line per
    /// iteration (`size nanoseconds`, in the order measured), for a look at the tail.
    #[arg(long, value_name = "FILE")]
    samples: Option<std::path::PathBuf>,
    /// RDMA device [default: $RDMX_DEVICE, else the first listed device (verbs) or
    /// soft:127.0.0.1 (--layer msg)].
    #[arg(long, short = 'd')]
    device: Option<String>,
    /// Transport [default: rc; with --layer msg, $RDMX_TRANSPORT when set].
    #[arg(long, value_enum)]
    transport: Option<TransportArg>,
    /// --layer mcast: subscribers (processes), each a member of the group.
    #[arg(long, default_value_t = 1)]
    subs: usize,
    /// --layer mcast, lat: messages published per second.
    #[arg(long, default_value_t = 20_000.0)]
    mcast_rate: f64,
    /// --layer mcast: an unreliable group (no repairs, no pacing; losses counted).
    #[arg(long)]
    unreliable: bool,
    /// --layer mcast: faults injected into what each subscriber's (soft) device receives,
    /// in the RDMX_FAULTS syntax without a seed (e.g. drop=5%): loss at the members.
    #[arg(long, value_name = "SPEC")]
    sub_faults: Option<String>,
    /// --layer mcast: the group's window in datagrams (what a publisher keeps for repairs,
    /// and how far the slowest member may lag) [default: McastConfig's].
    #[arg(long)]
    mcast_window: Option<u32>,
    /// --layer mcast: the longest random delay before a member asks for a repair, and the
    /// publisher's repair holdoff, in microseconds [default: McastConfig's].
    #[arg(long)]
    mcast_nak_delay_us: Option<u64>,
    /// --layer rpc, rate: calls kept in flight.
    #[arg(long, default_value_t = 64)]
    rpc_depth: usize,
    /// --layer rpc: the server's handler threads.
    #[arg(long, default_value_t = 2)]
    rpc_threads: usize,
    /// --layer rpc: the echo's bytes travel as a payload beside the call (shared bytes in,
    /// the server's pool buffer back: zero-copy at rendezvous sizes) instead of in its
    /// serde body.
    #[arg(long)]
    rpc_payload: bool,
    /// (The server process of --layer rpc.)
    #[arg(long, hide = true)]
    rpc_serve: bool,
    /// (The subscriber process of --layer mcast: the group to join.)
    #[arg(long, hide = true)]
    mcast_sub: Option<String>,
    /// (--layer mcast: how long a subscriber waits for the end of the run, in seconds.)
    #[arg(long, hide = true, default_value_t = 300)]
    mcast_secs_limit: u64,
}

/// Parses `4096`, `4K`, `64k`, `1M`, `1G` (binary multiples).
fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&t[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a number (e.g. 4096, 64K, 1M)"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Parses `1000`, `10k`, `2M` (decimal multiples).
fn parse_count(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1_000u64),
        Some((i, 'm' | 'M')) => (&t[..i], 1_000_000),
        _ => (t, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a count (e.g. 1000, 10k, 1M)"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Runs `rdmx perf`.
pub(crate) fn run(args: &PerfArgs) -> Result<()> {
    if args.layer == Layer::Mcast {
        return mcast::run(args);
    }
    if args.layer == Layer::Rpc {
        return rpc::run(args);
    }
    let modes =
        usize::from(args.server) + usize::from(args.local) + usize::from(args.connect.is_some());
    if modes != 1 {
        return Err(Error::msg(
            "give exactly one of --server, --connect HOST:PORT or --local",
        ));
    }
    if args.layer == Layer::Msg {
        return msg::run(args);
    }
    if args.samples.is_some() {
        return Err(Error::msg(
            "--samples is for the message layer (--layer msg)",
        ));
    }
    if args.server {
        return server::run(&server::ServerConfig {
            bind: args.bind,
            port: args.port,
            once: args.once,
            print_port: args.print_port,
            device: args.device.clone(),
            busy_poll: args.busy_poll,
        });
    }
    let cfg = client::ClientConfig::from_args(args)?;
    if args.local {
        client::run_local(&cfg)
    } else {
        let target = args.connect.clone().unwrap_or_default();
        client::run(&cfg, &target)
    }
}

/// Opens `name`, or `$RDMX_DEVICE`, or the first listed device.
pub(crate) fn open_device(name: Option<&str>) -> Result<Context> {
    let name = match name {
        Some(n) => n.to_string(),
        None => match std::env::var("RDMX_DEVICE") {
            Ok(n) if !n.is_empty() => n,
            _ => Device::list()
                .ctx("listing RDMA devices")?
                .first()
                .map(|d| d.name().to_string())
                .ok_or_else(|| Error::msg("no RDMA device found"))?,
        },
    };
    Device::open(&name).with_ctx(|| format!("opening device {name}"))
}

/// A random 24-bit initial PSN (from rdmx's one source of randomness).
pub(crate) fn random_psn() -> u32 {
    (rdmx::verbs::random_u64() as u32) & 0x00FF_FFFF
}

/// Seed of the data pattern the client sends.
pub(crate) const CLIENT_SEED: u8 = 0x3C;
/// Seed of the data pattern the server sends.
pub(crate) const SERVER_SEED: u8 = 0xA7;

/// Byte `i` of the test pattern with `seed` (not periodic in 256, so shifted data is caught).
pub(crate) fn pattern_byte(seed: u8, i: usize) -> u8 {
    let x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((x >> 56) as u8) ^ seed ^ (i as u8)
}

/// `len` bytes of the test pattern.
pub(crate) fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| pattern_byte(seed, i)).collect()
}

/// Checks that `data` is the pattern with `seed` (the first `len` bytes).
pub(crate) fn check_pattern(data: &[u8], seed: u8, what: &str) -> Result<()> {
    match data
        .iter()
        .enumerate()
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

/// Checks, at the end of a round, the data `role` received from its peer (the last
/// message's content is enough: every message carries the same pattern).
pub(crate) fn check_received(
    ep: &endpoint::Endpoint,
    p: &exchange::TestParams,
    role: endpoint::Role,
) -> Result<()> {
    use TestKind as T;
    let (checked, seed, who) = match role {
        endpoint::Role::Server => (
            matches!(p.test, T::SendLat | T::WriteLat | T::SendBw | T::WriteBw),
            CLIENT_SEED,
            "server",
        ),
        endpoint::Role::Client => (
            matches!(p.test, T::SendLat | T::WriteLat | T::ReadLat | T::ReadBw),
            SERVER_SEED,
            "client",
        ),
    };
    let what = format!("{} data received by the {who}", p.test.name());
    ep.check_grh(&what)?;
    if !checked {
        return Ok(());
    }
    let l = ep.layout();
    let data = ep
        .mr()
        .to_vec(l.rx_data(), l.size)
        .ctx("reading the receive buffer")?;
    if p.test == T::WriteLat && p.mem_poll {
        let (body, last) = data.split_at(l.size - 1);
        check_pattern(body, seed, &what)?;
        let want = lat::counter(p.total() - 1);
        if last[0] != want {
            return Err(Error::msg(format!(
                "data check failed: {what}: last byte is {}, expected {want}",
                last[0]
            )));
        }
        return Ok(());
    }
    check_pattern(&data, seed, &what)
}
