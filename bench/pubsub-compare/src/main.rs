//! pubsub-compare: pub/sub through Redis or NATS, measured the way
//! `rdmx perf --layer mcast --local` measures an rdmx multicast group, so that
//! `bench/compare-pubsub.sh` can put the three side by side.
//!
//! ```text
//! pubsub-compare (redis|nats) --port P --subs N --size S --count C [--rate R] [--json]
//! ```
//!
//! N subscriber connections to 127.0.0.1:P (a thread each) subscribe to one channel (Redis)
//! or subject (NATS), named uniquely for the run; once every subscription is in effect
//! (Redis: the subscribe confirmation has been read; NATS: a PING sent after the SUB has
//! been answered), one publisher connection publishes C messages of S bytes. The first 8
//! bytes of a message are its publish time (ns since the Unix epoch, little-endian); the rest
//! is the filler byte 0xA5.
//!
//! * without `--rate` (test "rate"): as fast as the server takes them, pipelined through a
//!   buffered writer;
//! * with `--rate R` (test "lat"): R messages per second, each written out at once.
//!
//! Each subscriber takes messages until it has C (or nothing new came for 30 s) and keeps
//! each message's receive time minus its stamp, and the times of its first and last message.
//! The output (`--json`: one JSON object, else a short table) has the fields of rdmx's mcast
//! report that apply: per-subscriber msg/s from its first message to its last, publish to
//! deliver latency percentiles (nearest rank, all subscribers' samples together), messages
//! missing per subscriber. `pub_msgs_per_s` is C over the time from the first publish until
//! the server had acknowledged the last (Redis: the reply to the last PUBLISH; NATS: the
//! PONG to a PING sent after the last PUB).
//!
//! Wire protocols are spoken directly: Redis RESP2 and the NATS text protocol, binary safe,
//! std only.

use std::io::{self, BufRead, BufReader, BufWriter, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const USAGE: &str = "\
usage: pubsub-compare (redis|nats) --port P [--subs N] [--size S] [--count C] [--rate R] [--json]

  redis|nats   the server speaking on 127.0.0.1:P (RESP / the NATS text protocol)
  --port P     its TCP port (required)
  --subs N     subscriber connections, one thread each (default 1)
  --size S     message size in bytes, at least 8: an 8-byte publish time and filler (default 8)
  --count C    messages to publish (default 200000)
  --rate R     publish R messages per second, each flushed (test \"lat\"); without it, publish
               as fast as possible, pipelined (test \"rate\")
  --json       print one JSON object instead of a table
";

/// The filler byte after the stamp (as rdmx perf uses).
const FILLER: u8 = 0xA5;
/// A subscriber gives up after this long without a new message; also the longest wait for
/// the server to take or acknowledge what the publisher sends.
const IDLE: Duration = Duration::from_secs(30);
/// Longest wait for a connection's handshake (greeting, subscription, PONG).
const HANDSHAKE: Duration = Duration::from_secs(10);
/// Longest protocol line accepted (NATS INFO lines are a few hundred bytes).
const MAX_LINE: u64 = 1 << 20;
/// Largest bulk string / payload accepted from a server.
const MAX_PAYLOAD: usize = 1 << 28;
/// Largest --size.
const MAX_SIZE: usize = 64 << 20;
/// Most latency samples a subscriber keeps (beyond them it keeps every k-th, like rdmx).
const MAX_SAMPLES: usize = 1 << 21;
/// Buffer sizes of the readers and the publisher's writer.
const BUF: usize = 64 << 10;

type Res<T> = Result<T, String>;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum System {
    Redis,
    Nats,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            Self::Redis => "redis",
            Self::Nats => "nats",
        }
    }
}

#[derive(Clone, Debug)]
struct Args {
    system: System,
    port: u16,
    subs: usize,
    size: usize,
    count: u64,
    rate: Option<f64>,
    json: bool,
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse_args(&argv) {
        Ok(Some(a)) => a,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("pubsub-compare: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("pubsub-compare {}: {e}", args.system.name());
            ExitCode::FAILURE
        }
    }
}

/// The arguments, or `None` for --help.
fn parse_args(argv: &[String]) -> Res<Option<Args>> {
    let mut system = None;
    let mut port = None;
    let mut subs = 1usize;
    let mut size = 8usize;
    let mut count = 200_000u64;
    let mut rate = None;
    let mut json = false;
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let mut value = |name: &str| -> Res<String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it
                    .next()
                    .cloned()
                    .ok_or_else(|| format!("{name} needs a value")),
            }
        };
        match flag {
            "-h" | "--help" => return Ok(None),
            "--json" => json = true,
            "--port" => port = Some(num::<u16>("--port", &value("--port")?)?),
            "--subs" => subs = num("--subs", &value("--subs")?)?,
            "--size" => size = num("--size", &value("--size")?)?,
            "--count" => count = num("--count", &value("--count")?)?,
            "--rate" => rate = Some(num::<f64>("--rate", &value("--rate")?)?),
            "redis" if system.is_none() => system = Some(System::Redis),
            "nats" if system.is_none() => system = Some(System::Nats),
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    let system = system.ok_or("say which server: redis or nats")?;
    let port = port.ok_or("--port is required")?;
    if port == 0 {
        return Err("--port 0: give the server's port".into());
    }
    if subs == 0 {
        return Err("--subs must be at least 1".into());
    }
    if !(8..=MAX_SIZE).contains(&size) {
        return Err(format!(
            "--size {size}: messages are 8 B (their publish time) to {MAX_SIZE} B"
        ));
    }
    if count == 0 {
        return Err("--count must be at least 1".into());
    }
    if let Some(r) = rate
        && !(r.is_finite() && r > 0.0)
    {
        return Err(format!(
            "--rate {r}: give a positive number of messages per second"
        ));
    }
    Ok(Some(Args {
        system,
        port,
        subs,
        size,
        count,
        rate,
        json,
    }))
}

fn num<T: std::str::FromStr>(name: &str, v: &str) -> Res<T> {
    v.trim()
        .parse()
        .map_err(|_| format!("{name} {v:?}: not a valid number"))
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn proto(msg: impl Into<String>) -> io::Error {
    io::Error::new(ErrorKind::InvalidData, msg.into())
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Bytes as text for messages (lossy, shortened).
fn show(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(&b[..b.len().min(200)]).into_owned();
    if b.len() > 200 { s + "..." } else { s }
}

/// A handshake's error as text: a timeout says what was awaited.
fn handshake_err(sys: System, e: &io::Error) -> String {
    if is_timeout(e) {
        format!(
            "no answer within {} s (is this a {} server?)",
            HANDSHAKE.as_secs(),
            match sys {
                System::Redis => "Redis",
                System::Nats => "NATS",
            }
        )
    } else {
        e.to_string()
    }
}

fn connect(sys: System, port: u16) -> Res<TcpStream> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("cannot connect to {} at {addr}: {e}", sys.name()))?;
    s.set_nodelay(true)
        .and_then(|()| s.set_read_timeout(Some(HANDSHAKE)))
        .and_then(|()| s.set_write_timeout(Some(IDLE)))
        .map_err(|e| format!("setting up the connection to {addr}: {e}"))?;
    Ok(s)
}

// ----------------------------------------------------------------------------- reading --

/// A buffered reader of one server connection, line and length framed.
struct Conn {
    r: BufReader<TcpStream>,
    line: Vec<u8>,
}

/// One RESP element's header, read by [`Conn::resp_elem`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Elem {
    /// A bulk string (its bytes in the buffer given).
    Bulk,
    /// A null bulk string or null array.
    Null,
    /// An integer.
    Int(i64),
    /// A simple string (its text in the buffer given).
    Simple,
    /// An error (its text in the buffer given).
    Error,
    /// An array (or RESP3 push) of this many elements, still to be read.
    Array(usize),
}

impl Conn {
    fn new(s: TcpStream) -> Self {
        Self {
            r: BufReader::with_capacity(BUF, s),
            line: Vec::with_capacity(256),
        }
    }

    /// Reads one line into `self.line`, without its CR LF.
    fn read_line(&mut self) -> io::Result<()> {
        self.line.clear();
        let n = (&mut self.r)
            .take(MAX_LINE)
            .read_until(b'\n', &mut self.line)?;
        if n == 0 {
            return Err(io::Error::new(
                ErrorKind::UnexpectedEof,
                "the server closed the connection",
            ));
        }
        if self.line.last() != Some(&b'\n') {
            return Err(if n as u64 >= MAX_LINE {
                proto("a protocol line longer than 1 MiB")
            } else {
                io::Error::new(
                    ErrorKind::UnexpectedEof,
                    "the server closed the connection in the middle of a line",
                )
            });
        }
        self.line.pop();
        if self.line.last() == Some(&b'\r') {
            self.line.pop();
        }
        Ok(())
    }

    /// Reads `len` bytes into `out` and the CR LF after them.
    fn read_payload(&mut self, out: &mut Vec<u8>, len: usize) -> io::Result<()> {
        if len > MAX_PAYLOAD {
            return Err(proto(format!(
                "a payload of {len} bytes (more than {MAX_PAYLOAD})"
            )));
        }
        out.clear();
        out.resize(len, 0);
        self.r.read_exact(out)?;
        let mut crlf = [0u8; 2];
        self.r.read_exact(&mut crlf)?;
        if crlf != *b"\r\n" {
            return Err(proto("a payload not followed by CR LF"));
        }
        Ok(())
    }

    /// Reads one RESP element header, and the bytes of a bulk string, simple string or
    /// error into `out`.
    fn resp_elem(&mut self, out: &mut Vec<u8>) -> io::Result<Elem> {
        self.read_line()?;
        let Some((&kind, rest)) = self.line.split_first() else {
            return Err(proto("an empty line where a RESP value was expected"));
        };
        let int = |rest: &[u8]| -> io::Result<i64> {
            std::str::from_utf8(rest)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .ok_or_else(|| proto(format!("a bad RESP number {:?}", show(rest))))
        };
        match kind {
            b'+' | b'-' => {
                out.clear();
                out.extend_from_slice(rest);
                Ok(if kind == b'+' {
                    Elem::Simple
                } else {
                    Elem::Error
                })
            }
            b':' => Ok(Elem::Int(int(rest)?)),
            b'$' => {
                let n = int(rest)?;
                if n < 0 {
                    return Ok(Elem::Null);
                }
                let n = usize::try_from(n).map_err(|_| proto("a bulk string too long"))?;
                self.read_payload(out, n)?;
                Ok(Elem::Bulk)
            }
            b'*' | b'>' => {
                let n = int(rest)?;
                if n < 0 {
                    return Ok(Elem::Null);
                }
                usize::try_from(n)
                    .ok()
                    .filter(|&n| n <= 1 << 20)
                    .map(Elem::Array)
                    .ok_or_else(|| proto(format!("an array of {n} elements")))
            }
            b'_' => Ok(Elem::Null),
            _ => Err(proto(format!(
                "not a RESP reply (is this a Redis server?): {:?}",
                show(&self.line)
            ))),
        }
    }

    /// Reads and drops `n` elements (arrays nested at most 8 deep).
    fn resp_skip(&mut self, n: usize, depth: u32) -> io::Result<()> {
        if depth > 8 {
            return Err(proto("RESP arrays nested too deep"));
        }
        let mut scratch = Vec::new();
        for _ in 0..n {
            if let Elem::Array(m) = self.resp_elem(&mut scratch)? {
                self.resp_skip(m, depth + 1)?;
            }
        }
        Ok(())
    }

    /// Reads a Redis push of up to 3 elements into `parts` (an array element of one is
    /// skipped and shows as `Elem::Array`). The header of the push is `Elem::Array(3)` when
    /// it is one; anything else is returned as read (a longer array is skipped).
    fn redis_push(&mut self, parts: &mut [Vec<u8>; 3], kinds: &mut [Elem; 3]) -> io::Result<Elem> {
        let head = self.resp_elem(&mut parts[0])?;
        match head {
            Elem::Array(3) => {
                for i in 0..3 {
                    kinds[i] = self.resp_elem(&mut parts[i])?;
                    if let Elem::Array(m) = kinds[i] {
                        self.resp_skip(m, 1)?;
                    }
                }
            }
            Elem::Array(n) => self.resp_skip(n, 1)?,
            _ => {}
        }
        Ok(head)
    }

    /// NATS: reads the INFO line the server greets with.
    fn nats_info(&mut self) -> io::Result<()> {
        self.read_line()?;
        if self.line.len() >= 4 && self.line[..4].eq_ignore_ascii_case(b"INFO") {
            Ok(())
        } else {
            Err(proto(format!(
                "expected the NATS server's INFO line (is this a NATS server?), got {:?}",
                show(&self.line)
            )))
        }
    }

    /// NATS: reads until PONG, answering PING on `w`; errors on -ERR and on messages.
    fn nats_until_pong(&mut self, w: &mut TcpStream) -> io::Result<()> {
        loop {
            self.read_line()?;
            match nats_op(&self.line) {
                NatsOp::Pong => return Ok(()),
                NatsOp::Ping => w.write_all(b"PONG\r\n")?,
                NatsOp::Ok | NatsOp::Info => {}
                NatsOp::Err => return Err(proto(format!("nats: {}", show(&self.line)))),
                _ => {
                    return Err(proto(format!(
                        "unexpected from the NATS server: {:?}",
                        show(&self.line)
                    )));
                }
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum NatsOp {
    Msg,
    Hmsg,
    Ping,
    Pong,
    Ok,
    Err,
    Info,
    Other,
}

fn nats_op(line: &[u8]) -> NatsOp {
    let word = line
        .split(|&b| b == b' ' || b == b'\t')
        .next()
        .unwrap_or(&[]);
    let is = |w: &[u8]| word.eq_ignore_ascii_case(w);
    if is(b"MSG") {
        NatsOp::Msg
    } else if is(b"HMSG") {
        NatsOp::Hmsg
    } else if is(b"PING") {
        NatsOp::Ping
    } else if is(b"PONG") {
        NatsOp::Pong
    } else if is(b"+OK") {
        NatsOp::Ok
    } else if is(b"-ERR") {
        NatsOp::Err
    } else if is(b"INFO") {
        NatsOp::Info
    } else {
        NatsOp::Other
    }
}

// -------------------------------------------------------------------------- subscribers --

/// What one subscriber saw.
#[derive(Debug, Default)]
struct SubResult {
    got: u64,
    first_ns: u64,
    last_ns: u64,
    /// Receive time minus stamp (ns), every `every`-th message.
    samples: Vec<u64>,
    every: u64,
    /// Messages of the wrong size or filler (never expected).
    corrupt: u64,
    /// Messages shorter than a stamp (not counted).
    runts: u64,
    /// Why it stopped before having every message (an error, or the idle timeout).
    stopped: Option<String>,
    /// Whether `stopped` is an error (not the idle timeout).
    failed: bool,
}

impl SubResult {
    fn record(&mut self, payload: &[u8], size: usize) {
        let now = unix_ns();
        let Some(stamp) = payload.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()) else {
            self.runts += 1;
            return;
        };
        if payload.len() != size || payload[8..].iter().any(|&b| b != FILLER) {
            self.corrupt += 1;
        }
        if self.got == 0 {
            self.first_ns = now;
        }
        self.last_ns = now;
        self.got += 1;
        if self.got.is_multiple_of(self.every) {
            self.samples
                .push(now.saturating_sub(u64::from_le_bytes(stamp)));
            if self.samples.len() >= MAX_SAMPLES {
                let kept: Vec<u64> = self.samples.iter().step_by(2).copied().collect();
                self.samples = kept;
                self.every *= 2;
            }
        }
    }

    fn msgs_per_s(&self) -> f64 {
        let ns = self.last_ns.saturating_sub(self.first_ns).max(1);
        self.got.saturating_sub(1) as f64 * 1e9 / ns as f64
    }
}

/// What a subscriber thread is given.
#[derive(Clone)]
struct SubJob {
    system: System,
    port: u16,
    channel: String,
    size: usize,
    count: u64,
}

/// A subscriber thread: subscribes, says so on `ready` (or sends its error there), then
/// takes the messages.
fn subscriber(job: SubJob, ready: mpsc::Sender<Res<()>>) -> SubResult {
    let mut r = SubResult {
        every: 1,
        samples: Vec::with_capacity(job.count.min(MAX_SAMPLES as u64) as usize),
        ..SubResult::default()
    };
    let conn = connect(job.system, job.port).and_then(|s| {
        let w = s
            .try_clone()
            .map_err(|e| format!("cloning a socket: {e}"))?;
        Ok((Conn::new(s), w))
    });
    let (mut c, mut w) = match conn {
        Ok(x) => x,
        Err(e) => {
            let _ = ready.send(Err(e));
            return r;
        }
    };
    let subscribed = match job.system {
        System::Redis => redis_subscribe(&mut c, &mut w, &job.channel),
        System::Nats => nats_subscribe(&mut c, &mut w, &job.channel),
    }
    .and_then(|()| c.r.get_ref().set_read_timeout(Some(IDLE)));
    if let Err(e) = subscribed {
        let _ = ready.send(Err(format!(
            "subscribing: {}",
            handshake_err(job.system, &e)
        )));
        return r;
    }
    let _ = ready.send(Ok(()));
    drop(ready);
    let res = match job.system {
        System::Redis => redis_take(&mut c, &job, &mut r),
        System::Nats => nats_take(&mut c, &mut w, &job, &mut r),
    };
    if let Err(e) = res {
        if is_timeout(&e) {
            r.stopped = Some(format!(
                "nothing new for {} s after {} of {} messages",
                IDLE.as_secs(),
                r.got,
                job.count
            ));
        } else {
            r.stopped = Some(format!("after {} of {} messages: {e}", r.got, job.count));
            r.failed = true;
        }
    }
    r
}

fn resp_command(args: &[&[u8]]) -> Vec<u8> {
    let mut v = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        v.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        v.extend_from_slice(a);
        v.extend_from_slice(b"\r\n");
    }
    v
}

fn redis_subscribe(c: &mut Conn, w: &mut TcpStream, channel: &str) -> io::Result<()> {
    w.write_all(&resp_command(&[b"SUBSCRIBE", channel.as_bytes()]))?;
    let mut parts: [Vec<u8>; 3] = Default::default();
    let mut kinds = [Elem::Null; 3];
    loop {
        match c.redis_push(&mut parts, &mut kinds)? {
            Elem::Array(3) => {
                if kinds[0] == Elem::Bulk
                    && parts[0].eq_ignore_ascii_case(b"subscribe")
                    && parts[1] == channel.as_bytes()
                {
                    return Ok(());
                }
            }
            Elem::Error => return Err(proto(format!("redis: {}", show(&parts[0])))),
            Elem::Array(_) => {}
            other => {
                return Err(proto(format!(
                    "unexpected reply to SUBSCRIBE: {other:?} {:?}",
                    show(&parts[0])
                )));
            }
        }
    }
}

fn redis_take(c: &mut Conn, job: &SubJob, r: &mut SubResult) -> io::Result<()> {
    let mut parts: [Vec<u8>; 3] = Default::default();
    let mut kinds = [Elem::Null; 3];
    let channel = job.channel.as_bytes();
    while r.got < job.count {
        match c.redis_push(&mut parts, &mut kinds)? {
            Elem::Array(3) => {
                if kinds[0] == Elem::Bulk
                    && parts[0] == b"message"
                    && kinds[1] == Elem::Bulk
                    && parts[1] == channel
                    && kinds[2] == Elem::Bulk
                {
                    r.record(&parts[2], job.size);
                }
            }
            Elem::Array(_) => {}
            Elem::Error => return Err(proto(format!("redis: {}", show(&parts[0])))),
            other => {
                return Err(proto(format!(
                    "unexpected from redis in subscribe mode: {other:?} {:?}",
                    show(&parts[0])
                )));
            }
        }
    }
    Ok(())
}

const NATS_CONNECT: &[u8] = b"CONNECT {\"verbose\":false,\"pedantic\":false}\r\n";

fn nats_subscribe(c: &mut Conn, w: &mut TcpStream, subject: &str) -> io::Result<()> {
    c.nats_info()?;
    w.write_all(NATS_CONNECT)?;
    w.write_all(format!("SUB {subject} 1\r\nPING\r\n").as_bytes())?;
    c.nats_until_pong(w)
}

/// The payload length at the end of a MSG (or the total length of an HMSG) line, checked
/// against the number of fields the operation has.
fn nats_len<'a>(line: &'a [u8], fields: &[usize]) -> io::Result<(usize, Vec<&'a [u8]>)> {
    let f: Vec<&[u8]> = line
        .split(|&b| b == b' ' || b == b'\t')
        .filter(|t| !t.is_empty())
        .collect();
    if !fields.contains(&f.len()) {
        return Err(proto(format!("a malformed NATS line {:?}", show(line))));
    }
    let len = std::str::from_utf8(f[f.len() - 1])
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .ok_or_else(|| proto(format!("a bad length in {:?}", show(line))))?;
    Ok((len, f))
}

fn nats_take(c: &mut Conn, w: &mut TcpStream, job: &SubJob, r: &mut SubResult) -> io::Result<()> {
    let mut payload = Vec::with_capacity(job.size);
    let subject = job.channel.as_bytes();
    while r.got < job.count {
        c.read_line()?;
        match nats_op(&c.line) {
            NatsOp::Msg => {
                // MSG <subject> <sid> [reply-to] <#bytes>
                let (len, f) = nats_len(&c.line, &[4, 5])?;
                let ours = f[1] == subject && f[2] == b"1";
                c.read_payload(&mut payload, len)?;
                if ours {
                    r.record(&payload, job.size);
                }
            }
            NatsOp::Hmsg => {
                // HMSG <subject> <sid> [reply-to] <#header bytes> <#total bytes>: not ours
                let (len, _) = nats_len(&c.line, &[5, 6])?;
                c.read_payload(&mut payload, len)?;
            }
            NatsOp::Ping => w.write_all(b"PONG\r\n")?,
            NatsOp::Pong | NatsOp::Ok | NatsOp::Info => {}
            NatsOp::Err => return Err(proto(format!("nats: {}", show(&c.line)))),
            NatsOp::Other => {
                return Err(proto(format!(
                    "unexpected from the NATS server: {:?}",
                    show(&c.line)
                )));
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------- publisher --

/// Waits until `due`: sleeps while more than 200 us early, spins the last stretch.
fn wait_until(due: Instant) {
    loop {
        let now = Instant::now();
        if now >= due {
            return;
        }
        if due - now > Duration::from_micros(200) {
            thread::sleep(Duration::from_micros(100));
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Publishes the messages; returns the time from the first publish until the server had
/// acknowledged the last, and warnings.
fn publish(args: &Args, channel: &str) -> Res<(Duration, Vec<String>)> {
    let s = connect(args.system, args.port)?;
    let mut c = Conn::new(
        s.try_clone()
            .map_err(|e| format!("cloning a socket: {e}"))?,
    );
    let mut ws = s
        .try_clone()
        .map_err(|e| format!("cloning a socket: {e}"))?;
    // The message: header, payload (stamp + filler), trailer.
    let (head, tail): (Vec<u8>, &[u8]) = match args.system {
        System::Redis => {
            // PUBLISH <channel> <payload>: the payload's bulk string header ends the head.
            let h = format!(
                "*3\r\n$7\r\nPUBLISH\r\n${}\r\n{channel}\r\n${}\r\n",
                channel.len(),
                args.size
            );
            (h.into_bytes(), b"\r\n")
        }
        System::Nats => (
            format!("PUB {channel} {}\r\n", args.size).into_bytes(),
            b"\r\n",
        ),
    };
    // Handshake, then a thread that reads what the server says while we publish.
    let pong_due = Arc::new(AtomicBool::new(false));
    let reader: thread::JoinHandle<Res<(Instant, Vec<String>)>> = match args.system {
        System::Redis => {
            ws.write_all(&resp_command(&[b"PING"]))
                .map_err(|e| format!("publisher: sending PING: {e}"))?;
            let mut buf = Vec::new();
            match c.resp_elem(&mut buf) {
                Ok(Elem::Simple) if buf.eq_ignore_ascii_case(b"PONG") => {}
                Ok(Elem::Error) => return Err(format!("publisher: redis: {}", show(&buf))),
                Ok(e) => return Err(format!("publisher: unexpected reply to PING: {e:?}")),
                Err(e) => {
                    return Err(format!(
                        "publisher: waiting for PONG: {}",
                        handshake_err(args.system, &e)
                    ));
                }
            }
            let (count, subs) = (args.count, args.subs as i64);
            thread::Builder::new()
                .name("publish-replies".into())
                .spawn(move || redis_replies(c, count, subs))
                .map_err(|e| format!("starting a thread: {e}"))?
        }
        System::Nats => {
            c.nats_info()
                .and_then(|()| ws.write_all(NATS_CONNECT))
                .and_then(|()| ws.write_all(b"PING\r\n"))
                .and_then(|()| c.nats_until_pong(&mut ws))
                .map_err(|e| {
                    format!("publisher: connecting: {}", handshake_err(args.system, &e))
                })?;
            let due = pong_due.clone();
            thread::Builder::new()
                .name("publish-replies".into())
                .spawn(move || nats_replies(c, &due))
                .map_err(|e| format!("starting a thread: {e}"))?
        }
    };
    s.set_read_timeout(Some(IDLE))
        .map_err(|e| format!("publisher: {e}"))?;
    let mut w = BufWriter::with_capacity(BUF, ws);
    let mut payload = vec![FILLER; args.size];
    let start = Instant::now();
    let sent = (|| -> io::Result<()> {
        for i in 0..args.count {
            if let Some(r) = args.rate {
                wait_until(start + Duration::from_secs_f64(i as f64 / r));
            }
            if args.system == System::Nats && pong_due.swap(false, Ordering::Relaxed) {
                w.write_all(b"PONG\r\n")?;
            }
            payload[..8].copy_from_slice(&unix_ns().to_le_bytes());
            w.write_all(&head)?;
            w.write_all(&payload)?;
            w.write_all(tail)?;
            if args.rate.is_some() {
                w.flush()?;
            }
        }
        if args.system == System::Nats {
            if pong_due.swap(false, Ordering::Relaxed) {
                w.write_all(b"PONG\r\n")?;
            }
            w.write_all(b"PING\r\n")?;
        }
        w.flush()
    })();
    if let Err(e) = sent {
        // Let the reader see the end too, and prefer what the server said.
        let _ = s.shutdown(Shutdown::Both);
        let said = match reader.join() {
            Ok(Err(r)) => format!(" ({r})"),
            _ => String::new(),
        };
        return Err(format!("publishing: {e}{said}"));
    }
    let (acked, warnings) = reader
        .join()
        .map_err(|_| "the publisher's reader thread panicked".to_string())??;
    Ok((acked.saturating_duration_since(start), warnings))
}

/// Reads the replies to `count` PUBLISH commands: when the last came, and warnings.
fn redis_replies(mut c: Conn, count: u64, subs: i64) -> Res<(Instant, Vec<String>)> {
    let mut buf = Vec::new();
    let mut short = 0u64;
    for i in 0..count {
        match c.resp_elem(&mut buf) {
            Ok(Elem::Int(n)) => short += u64::from(n < subs),
            Ok(Elem::Error) => {
                return Err(format!("redis answered PUBLISH {i} with {}", show(&buf)));
            }
            Ok(e) => return Err(format!("redis answered PUBLISH {i} with {e:?}")),
            Err(e) => {
                return Err(format!(
                    "redis answered {i} of {count} PUBLISH commands: {e}"
                ));
            }
        }
    }
    let at = Instant::now();
    let mut warnings = Vec::new();
    if short > 0 {
        warnings.push(format!(
            "{short} PUBLISH replies counted fewer than {subs} receivers"
        ));
    }
    Ok((at, warnings))
}

/// Reads the NATS publisher connection until the PONG to the PING after the last PUB,
/// flagging server PINGs in `pong_due`.
fn nats_replies(mut c: Conn, pong_due: &AtomicBool) -> Res<(Instant, Vec<String>)> {
    loop {
        if let Err(e) = c.read_line() {
            return Err(format!("waiting for the server to take the messages: {e}"));
        }
        match nats_op(&c.line) {
            NatsOp::Pong => return Ok((Instant::now(), Vec::new())),
            NatsOp::Ping => pong_due.store(true, Ordering::Relaxed),
            NatsOp::Ok | NatsOp::Info => {}
            NatsOp::Err => return Err(format!("nats: {}", show(&c.line))),
            _ => {
                return Err(format!(
                    "unexpected from the NATS server: {:?}",
                    show(&c.line)
                ));
            }
        }
    }
}

// ------------------------------------------------------------------------------- report --

struct Report {
    system: System,
    lat: bool,
    subs: usize,
    size: usize,
    published: u64,
    target_rate: Option<f64>,
    pub_msgs_per_s: f64,
    sub_msgs_per_s: Vec<f64>,
    min_sub_msgs_per_s: f64,
    /// p50, p99, p99.9, max in us (none without samples).
    lat_us: Option<[f64; 4]>,
    missing: Vec<u64>,
}

/// Nearest-rank p50, p99, p99.9 and max of `samples` (ns), in us.
fn percentiles(samples: &mut [u64]) -> Option<[f64; 4]> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_unstable();
    let n = samples.len();
    let us = |ns: u64| ns as f64 / 1000.0;
    let pct = |p: f64| {
        let rank = ((p / 100.0) * n as f64).ceil() as usize;
        us(samples[rank.clamp(1, n) - 1])
    };
    Some([pct(50.0), pct(99.0), pct(99.9), us(samples[n - 1])])
}

/// A JSON number (null when not finite), 3 decimals.
fn jnum(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3}")
    } else {
        "null".into()
    }
}

impl Report {
    fn json(&self) -> String {
        let list = |v: &[String]| format!("[{}]", v.join(","));
        let lat = |i: usize| self.lat_us.map_or("null".into(), |l| jnum(l[i]));
        format!(
            concat!(
                "{{\"system\":\"{}\",\"test\":\"{}\",\"subs\":{},\"size\":{},\"published\":{},",
                "\"target_rate\":{},\"pub_msgs_per_s\":{},\"sub_msgs_per_s\":{},",
                "\"min_sub_msgs_per_s\":{},\"lat_p50_us\":{},\"lat_p99_us\":{},",
                "\"lat_p999_us\":{},\"lat_max_us\":{},\"missing\":{}}}"
            ),
            self.system.name(),
            if self.lat { "lat" } else { "rate" },
            self.subs,
            self.size,
            self.published,
            self.target_rate.map_or("null".into(), jnum),
            jnum(self.pub_msgs_per_s),
            list(
                &self
                    .sub_msgs_per_s
                    .iter()
                    .map(|&x| jnum(x))
                    .collect::<Vec<_>>()
            ),
            jnum(self.min_sub_msgs_per_s),
            lat(0),
            lat(1),
            lat(2),
            lat(3),
            list(&self.missing.iter().map(u64::to_string).collect::<Vec<_>>()),
        )
    }

    fn print(&self) {
        println!(
            "{}/{} {} B, {} subscriber(s), {} messages{}",
            self.system.name(),
            if self.lat { "lat" } else { "rate" },
            self.size,
            self.subs,
            self.published,
            self.target_rate
                .map_or(String::new(), |r| format!(" at {r} msg/s"))
        );
        println!("  publisher        {:>12.0} msg/s", self.pub_msgs_per_s);
        for (i, r) in self.sub_msgs_per_s.iter().enumerate() {
            println!(
                "  subscriber {i:<3}   {r:>12.0} msg/s   missing {}",
                self.missing[i]
            );
        }
        if let Some([p50, p99, p999, max]) = self.lat_us {
            println!(
                "  publish->deliver p50 {p50:.1} us  p99 {p99:.1} us  p99.9 {p999:.1} us  max {max:.1} us"
            );
        }
    }
}

fn run(args: &Args) -> Res<ExitCode> {
    let channel = format!(
        "pubsub-compare.{}.{}",
        std::process::id(),
        unix_ns() % 1_000_000_000
    );
    let (tx, rx) = mpsc::channel();
    let mut subs = Vec::with_capacity(args.subs);
    for i in 0..args.subs {
        let job = SubJob {
            system: args.system,
            port: args.port,
            channel: channel.clone(),
            size: args.size,
            count: args.count,
        };
        let tx = tx.clone();
        let h = thread::Builder::new()
            .name(format!("sub-{i}"))
            .spawn(move || subscriber(job, tx))
            .map_err(|e| format!("starting a subscriber thread: {e}"))?;
        subs.push(h);
    }
    drop(tx);
    // Every subscription in effect before the first publish.
    let wait = HANDSHAKE + Duration::from_secs(5);
    for i in 0..args.subs {
        match rx.recv_timeout(wait) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(format!("subscriber: {e}")),
            Err(_) => {
                return Err(format!(
                    "only {i} of {} subscribers subscribed within {} s",
                    args.subs,
                    wait.as_secs()
                ));
            }
        }
    }
    let (took, warnings) = publish(args, &channel)?;
    let mut results = Vec::with_capacity(args.subs);
    for h in subs {
        results.push(
            h.join()
                .map_err(|_| "a subscriber thread panicked".to_string())?,
        );
    }
    let mut failed = false;
    for w in &warnings {
        eprintln!("pubsub-compare {}: warning: {w}", args.system.name());
    }
    for (i, r) in results.iter().enumerate() {
        if let Some(why) = &r.stopped {
            eprintln!(
                "pubsub-compare {}: subscriber {i} stopped {why}",
                args.system.name()
            );
            failed |= r.failed;
        }
        if r.corrupt > 0 || r.runts > 0 {
            eprintln!(
                "pubsub-compare {}: subscriber {i}: {} messages of the wrong size or content, {} too short to count",
                args.system.name(),
                r.corrupt,
                r.runts
            );
        }
    }
    let sub_msgs_per_s: Vec<f64> = results.iter().map(SubResult::msgs_per_s).collect();
    let mut all: Vec<u64> = results
        .iter()
        .flat_map(|r| r.samples.iter().copied())
        .collect();
    let report = Report {
        system: args.system,
        lat: args.rate.is_some(),
        subs: args.subs,
        size: args.size,
        published: args.count,
        target_rate: args.rate,
        pub_msgs_per_s: args.count as f64 / took.as_secs_f64().max(1e-9),
        min_sub_msgs_per_s: sub_msgs_per_s.iter().copied().fold(f64::INFINITY, f64::min),
        sub_msgs_per_s,
        lat_us: percentiles(&mut all),
        missing: results
            .iter()
            .map(|r| args.count.saturating_sub(r.got))
            .collect(),
    };
    if args.json {
        println!("{}", report.json());
    } else {
        report.print();
    }
    // A subscriber that failed (the server closed it, a protocol error) makes the exit
    // status 3; the report is printed all the same.
    Ok(if failed {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A connection whose server side writes `bytes` in pieces of `chunk` and closes.
    fn conn_fed(bytes: Vec<u8>, chunk: usize) -> Conn {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.set_nodelay(true).unwrap();
            for piece in bytes.chunks(chunk.max(1)) {
                s.write_all(piece).unwrap();
                s.flush().unwrap();
                thread::sleep(Duration::from_micros(50));
            }
        });
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // The writer goes on while the test reads: lines and payloads arrive in pieces.
        drop(t);
        Conn::new(s)
    }

    fn payload(size: usize, stamp: u64) -> Vec<u8> {
        let mut p = vec![FILLER; size];
        p[..8].copy_from_slice(&stamp.to_le_bytes());
        p
    }

    fn job(system: System, count: u64, size: usize) -> SubJob {
        SubJob {
            system,
            port: 1,
            channel: "ch".into(),
            size,
            count,
        }
    }

    fn fresh() -> SubResult {
        SubResult {
            every: 1,
            ..SubResult::default()
        }
    }

    #[test]
    fn redis_pushes_binary_and_split() {
        let now = unix_ns();
        let mut wire = Vec::new();
        // A payload holding CR LF and "*3" and "$": binary safe.
        let mut p = payload(40, now);
        p[10..16].copy_from_slice(b"\r\n*3\r\n");
        for _ in 0..3 {
            wire.extend_from_slice(b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$40\r\n");
            wire.extend_from_slice(&p);
            wire.extend_from_slice(b"\r\n");
        }
        // Another channel's message is not counted.
        wire.extend_from_slice(b"*3\r\n$7\r\nmessage\r\n$2\r\nxx\r\n$8\r\n12345678\r\n");
        wire.extend_from_slice(b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$40\r\n");
        wire.extend_from_slice(&payload(40, now));
        wire.extend_from_slice(b"\r\n");
        for chunk in [1, 3, 7, 1000] {
            let mut c = conn_fed(wire.clone(), chunk);
            let mut r = fresh();
            redis_take(&mut c, &job(System::Redis, 4, 40), &mut r).unwrap();
            assert_eq!(r.got, 4);
            assert_eq!(r.corrupt, 3); // the CR LF written into the filler
            assert_eq!(r.samples.len(), 4);
        }
    }

    #[test]
    fn redis_subscribe_confirmation_and_errors() {
        let mut c = conn_fed(b"*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n".to_vec(), 5);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut w = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        redis_subscribe(&mut c, &mut w, "ch").unwrap();
        let mut c = conn_fed(b"-NOAUTH Authentication required.\r\n".to_vec(), 5);
        let e = redis_subscribe(&mut c, &mut w, "ch").unwrap_err();
        assert!(e.to_string().contains("NOAUTH"), "{e}");
        let mut c = conn_fed(b"INFO {\"server_id\":\"x\"}\r\n".to_vec(), 5);
        let e = redis_subscribe(&mut c, &mut w, "ch").unwrap_err();
        assert!(e.to_string().contains("Redis server"), "{e}");
        // Odd input: never a panic, always an error.
        for junk in [
            &b"*3\r\n$-5\r\n"[..],
            b"*99999999999999999999\r\n",
            b"$99999999999\r\n",
            b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$4\r\nabcdXY",
            b"*3\r\n*3\r\n*3\r\n*3\r\n*3\r\n*3\r\n*3\r\n*3\r\n*3\r\n*3\r\n*3\r\n",
            b"\r\n",
            b"*1\r\n:abc\r\n",
        ] {
            let mut c = conn_fed(junk.to_vec(), 2);
            let mut r = fresh();
            assert!(redis_take(&mut c, &job(System::Redis, 1, 8), &mut r).is_err());
        }
    }

    #[test]
    fn nats_msgs_binary_split_and_ping() {
        let now = unix_ns();
        let mut wire = Vec::new();
        let mut p = payload(30, now);
        p[12..20].copy_from_slice(b"\r\nMSG x ");
        wire.extend_from_slice(b"MSG ch 1 30\r\n");
        wire.extend_from_slice(&p);
        wire.extend_from_slice(b"\r\nPING\r\n+OK\r\nMSG ch 1 reply.to 30\r\n");
        wire.extend_from_slice(&payload(30, now));
        wire.extend_from_slice(b"\r\nHMSG ch 1 12 42\r\nNATS/1.0\r\n\r\n");
        wire.extend_from_slice(&payload(30, now));
        wire.extend_from_slice(b"\r\nMSG ch 2 30\r\n"); // another sid: not counted
        wire.extend_from_slice(&payload(30, now));
        wire.extend_from_slice(b"\r\nMSG ch 1 30\r\n");
        wire.extend_from_slice(&payload(30, now));
        wire.extend_from_slice(b"\r\n");
        for chunk in [1, 4, 1000] {
            let mut c = conn_fed(wire.clone(), chunk);
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let mut w = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (mut peer, _) = l.accept().unwrap();
            let mut r = fresh();
            nats_take(&mut c, &mut w, &job(System::Nats, 3, 30), &mut r).unwrap();
            assert_eq!(r.got, 3);
            assert_eq!(r.corrupt, 1);
            let mut pong = [0u8; 6];
            peer.read_exact(&mut pong).unwrap();
            assert_eq!(&pong, b"PONG\r\n");
        }
        for junk in [
            &b"-ERR 'Slow Consumer'\r\n"[..],
            b"MSG ch 1\r\n",
            b"MSG ch 1 zz\r\n",
            b"MSG ch 1 4\r\nabcdef",
            b"HELLO\r\n",
            b"MSG ch 1 99999999999999\r\n",
        ] {
            let mut c = conn_fed(junk.to_vec(), 3);
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let mut w = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let mut r = fresh();
            assert!(nats_take(&mut c, &mut w, &job(System::Nats, 1, 8), &mut r).is_err());
        }
    }

    #[test]
    fn percentiles_nearest_rank() {
        let mut v: Vec<u64> = (1..=1000).map(|x| x * 1000).collect();
        let p = percentiles(&mut v).unwrap();
        // The same formula as rdmx perf (ceil(p / 100 * n)), floating point and all:
        // 0.999 * 1000 rounds up to rank 1000.
        assert_eq!(p, [500.0, 990.0, 1000.0, 1000.0]);
        let mut v: Vec<u64> = (1..=7).map(|x| x * 1000).collect();
        assert_eq!(percentiles(&mut v).unwrap(), [4.0, 7.0, 7.0, 7.0]);
        assert!(percentiles(&mut []).is_none());
    }

    #[test]
    fn args() {
        let a: Vec<String> = "nats --port 4222 --subs 3 --size=256 --count 10 --rate 5000 --json"
            .split(' ')
            .map(String::from)
            .collect();
        let a = parse_args(&a).unwrap().unwrap();
        assert_eq!(a.system, System::Nats);
        assert_eq!((a.port, a.subs, a.size, a.count), (4222, 3, 256, 10));
        assert_eq!(a.rate, Some(5000.0));
        assert!(a.json);
        for bad in [
            "redis",
            "redis --port 1 --size 7",
            "kafka --port 1",
            "redis --port 1 --rate 0",
            "redis --port x",
            "redis --port 1 --subs 0",
        ] {
            let v: Vec<String> = bad.split(' ').map(String::from).collect();
            assert!(parse_args(&v).is_err(), "{bad}");
        }
    }

    #[test]
    fn json_shape() {
        let r = Report {
            system: System::Redis,
            lat: false,
            subs: 2,
            size: 8,
            published: 10,
            target_rate: None,
            pub_msgs_per_s: 1.5,
            sub_msgs_per_s: vec![1.0, 2.0],
            min_sub_msgs_per_s: 1.0,
            lat_us: None,
            missing: vec![0, 1],
        };
        assert_eq!(
            r.json(),
            "{\"system\":\"redis\",\"test\":\"rate\",\"subs\":2,\"size\":8,\"published\":10,\
             \"target_rate\":null,\"pub_msgs_per_s\":1.500,\"sub_msgs_per_s\":[1.000,2.000],\
             \"min_sub_msgs_per_s\":1.000,\"lat_p50_us\":null,\"lat_p99_us\":null,\
             \"lat_p999_us\":null,\"lat_max_us\":null,\"missing\":[0,1]}"
        );
    }
}
