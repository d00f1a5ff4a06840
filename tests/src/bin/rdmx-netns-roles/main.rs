//! `rdmx-netns-roles`: the programs the multi-host tests run inside their hosts (network
//! namespaces), one role per subcommand.
//!
//! * `mcast-recv --device soft:<ip> --group <239.x.y.z> --count N --qkey Q
//!   [--first F] [--detach-after K] [--grace-ms G] [--wait-s W]`: a UD QP attached to the
//!   group with N receives posted (kept posted); prints `READY`, then `RECV <seq> <ns>` per
//!   datagram and `RESULT got=.. seqs_ok=.. ...` once N have arrived (or after W seconds).
//!   With `--detach-after K` it detaches after K datagrams, prints `DETACHED <ns>`, counts
//!   what still arrives during G ms (`LATE <seq> <ns>`), and ends with
//!   `RESULT got=K late=<n> ...`.
//! * `mcast-send --device soft:<ip> --group G --count N --qkey Q [--first F]
//!   [--pace-us U] [--size S]`: sends datagrams numbered F.. to the group (QPN 0xFFFFFF)
//!   without joining it; prints `RESULT sent=N ...`.
//! * `apm-server --device soft:<a>,<b> --listen <a>:<port> --count N [--size S]
//!   [--ack-timeout T] [--retry-cnt R] [--depth D] [--linger-ms L] [--wait-s W]` and
//!   `apm-client --device soft:<a>,<b> --connect <server a>:<port> --count N [--size S]
//!   [--pace-us U] [--max-outstanding K] [--ack-timeout T] [--retry-cnt R] [--linger-ms L]
//!   [--wait-s W]`: an RC connection between two two-port soft devices, primary path on
//!   port 1 (link A), alternate on port 2 (link B), re-armed on both sides (QP numbers and
//!   addresses exchanged over TCP on link A first); the client streams numbered sends (one
//!   per U us, at most K outstanding), the server checks that each arrives exactly once and
//!   in order. Defaults: T = 12 (16.8 ms) on both paths, R = 3, S = 256 bytes, U = 1000,
//!   K = 16, D = 256 receives, L = 500 ms (after the stream, to catch duplicates and late
//!   events), W = 90 s. Both print `SETTINGS ...`, `ARMED <ns>` once the QP is armed,
//!   `MIGSTATE <state> port=<n> <ns>` when its migration state or primary port changes,
//!   `EVENT <name> <ns> ...` per asynchronous event (from a thread of their own, so stamped
//!   when it arrives), and a final `RESULT ... ok=<bool>`; the server prints
//!   `RECV <seq> <ns> port=<n>` per message (`port`: the QP's primary port when the
//!   completion was polled).
//!
//! * `group-pub` / `group-sub` / `group-garbage` (see `group.rs`): members of an `rdmx`
//!   multicast group (one publishing a numbered stream, the others checking it), and a
//!   stranger sending malformed and forged datagrams to the group's address.
//!
//! * `msg-server` / `msg-client` (see `msg.rs`): the same two-link set-up through the
//!   message layer: an `rdmx` endpoint with an alternate path, a numbered stream, and the
//!   message-layer events (`EVENT PathMigrated ...`).
//!
//! Every role takes `--limit-s` (default 120): a hard limit on its whole run, after which it
//! prints `TIMEOUT` and exits with status 3. Times (`<ns>`) are nanoseconds since the Unix
//! epoch. Errors go to stderr (`rdmx-netns-roles <role>: ...`) with exit status 1.
#![forbid(unsafe_code)]

mod apm;
mod group;
mod mcast;
mod msg;

use std::collections::HashMap;
use std::error::Error;
use std::fmt::Display;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `Result` with a message.
pub(crate) type Res<T> = Result<T, String>;

/// Nanoseconds since the Unix epoch.
pub(crate) fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// An error with its chain of sources (`VerbsError::Io` keeps the OS error as its source).
pub(crate) fn err_chain(what: &str, e: &dyn Error) -> String {
    let mut s = format!("{what}: {e}");
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(&format!(": {c}"));
        src = c.source();
    }
    s
}

/// Adds context to errors.
pub(crate) trait Ctx<T> {
    /// Maps the error to `what: error: source...`.
    fn ctx(self, what: &str) -> Res<T>;
}

impl<T, E: Error> Ctx<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Res<T> {
        self.map_err(|e| err_chain(what, &e))
    }
}

/// `--key value` options.
#[derive(Debug)]
pub(crate) struct Args {
    opts: HashMap<String, String>,
}

impl Args {
    fn parse(args: &[String]) -> Res<Self> {
        let mut opts = HashMap::new();
        let mut it = args.iter();
        while let Some(k) = it.next() {
            let Some(key) = k.strip_prefix("--") else {
                return Err(format!("unexpected argument {k:?}"));
            };
            let v = it.next().ok_or_else(|| format!("{k} needs a value"))?;
            if opts.insert(key.to_string(), v.clone()).is_some() {
                return Err(format!("{k} given twice"));
            }
        }
        Ok(Self { opts })
    }

    /// Option `key`, parsed.
    pub(crate) fn opt<T: FromStr>(&self, key: &str) -> Res<Option<T>>
    where
        T::Err: Display,
    {
        self.opts
            .get(key)
            .map(|v| v.parse::<T>().map_err(|e| format!("--{key} {v:?}: {e}")))
            .transpose()
    }

    /// Option `key`, parsed, or `default`.
    pub(crate) fn or<T: FromStr>(&self, key: &str, default: T) -> Res<T>
    where
        T::Err: Display,
    {
        Ok(self.opt(key)?.unwrap_or(default))
    }

    /// Required option `key`, parsed.
    pub(crate) fn req<T: FromStr>(&self, key: &str) -> Res<T>
    where
        T::Err: Display,
    {
        self.opt(key)?.ok_or_else(|| format!("--{key} is required"))
    }

    /// A number in decimal or `0x` hexadecimal.
    pub(crate) fn u32_any(&self, key: &str) -> Res<u32> {
        let v: String = self.req(key)?;
        let r = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
            Some(h) => u32::from_str_radix(h, 16),
            None => v.parse(),
        };
        r.map_err(|e| format!("--{key} {v:?}: {e}"))
    }

    /// Fails on options the role does not know (typos would otherwise be ignored).
    pub(crate) fn only(&self, known: &[&str]) -> Res<()> {
        let mut unknown: Vec<&String> = self
            .opts
            .keys()
            .filter(|k| k.as_str() != "limit-s" && !known.contains(&k.as_str()))
            .collect();
        unknown.sort();
        match unknown.first() {
            None => Ok(()),
            Some(k) => Err(format!("unknown option --{k}")),
        }
    }
}

/// Ends the process with status 3 once `limit` has passed, whatever it is doing.
fn watchdog(role: &str, limit: Duration) {
    let name = role.to_string();
    let spawned = std::thread::Builder::new()
        .name("watchdog".into())
        .spawn(move || {
            std::thread::sleep(limit);
            println!("TIMEOUT {}", unix_ns());
            eprintln!("rdmx-netns-roles {name}: did not finish within {limit:?}; giving up");
            std::process::exit(3);
        });
    if let Err(e) = spawned {
        eprintln!("rdmx-netns-roles {role}: cannot start the watchdog: {e}");
        std::process::exit(1);
    }
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: rdmx-netns-roles (mcast-recv | mcast-send | group-pub | group-sub | group-garbage | apm-server | apm-client | msg-server | msg-client) \
         --option value ...   (see the source for the options)"
    );
    ExitCode::from(2)
}

/// With `RDMX_LOG` set (a tracing filter such as `debug`), logs go to the file named by
/// `RDMX_LOG_FILE` (`%p` becomes the process id), else to stderr.
fn init_logging() {
    let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("RDMX_LOG") else {
        return;
    };
    let file = std::env::var("RDMX_LOG_FILE")
        .ok()
        .map(|f| f.replace("%p", &std::process::id().to_string()))
        .and_then(|f| std::fs::File::create(f).ok());
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false);
    let _ = match file {
        Some(f) => b.with_writer(std::sync::Mutex::new(f)).try_init(),
        None => b.with_writer(std::io::stderr).try_init(),
    };
}

fn main() -> ExitCode {
    init_logging();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let Some(role) = argv.first().cloned() else {
        return usage();
    };
    let run: fn(&Args) -> Res<bool> = match role.as_str() {
        "mcast-recv" => mcast::recv,
        "mcast-send" => mcast::send,
        "apm-server" => apm::server,
        "apm-client" => apm::client,
        "msg-server" => msg::server,
        "msg-client" => msg::client,
        "group-pub" => group::publisher,
        "group-sub" => group::subscriber,
        "group-garbage" => group::garbage,
        _ => return usage(),
    };
    let args = match Args::parse(&argv[1..]) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rdmx-netns-roles {role}: {e}");
            return usage();
        }
    };
    let limit = match args.or("limit-s", 120u64) {
        Ok(s) => Duration::from_secs(s),
        Err(e) => {
            eprintln!("rdmx-netns-roles {role}: {e}");
            return usage();
        }
    };
    watchdog(&role, limit);
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("rdmx-netns-roles {role}: {e}");
            ExitCode::FAILURE
        }
    }
}
