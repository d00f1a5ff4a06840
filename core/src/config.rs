//! Configuration: every tunable of a context, from the builder, the environment or the
//! defaults (in that order of precedence).
//!
//! | Builder method | Variable | Default |
//! |---|---|---|
//! | `device` | `RDMX_DEVICE` | `soft:127.0.0.1` |
//! | `transport` | `RDMX_TRANSPORT` (`rc`, `xrc`, `ud`) | `rc` |
//! | `inline_threshold` | `RDMX_INLINE_THRESHOLD` | 188 bytes (capped by the device) |
//! | `rndv_threshold` | `RDMX_RNDV_THRESHOLD` | 32768 bytes |
//! | `credits` | `RDMX_CREDITS` | 32 per endpoint |
//! | `rndv_window` | `RDMX_RNDV_WINDOW` | 8 rendezvous messages per endpoint |
//! | `srq_depth` | `RDMX_SRQ_DEPTH` | 512 receive buffers |
//! | `pool_max` | `RDMX_POOL_MAX` (`K`/`M`/`G` suffixes) | 512 MiB |
//! | `regcache_max` | `RDMX_REGCACHE_MAX` (`K`/`M`/`G` suffixes) | 256 MiB |
//! | `max_message` | `RDMX_MAX_MESSAGE` | 64 MiB (capped by what the pool can hold) |
//! | `busy_poll` | `RDMX_BUSY_POLL_US` | 50 µs |
//! | `peer_timeout` | `RDMX_PEER_TIMEOUT_MS` | 2000 ms |
//! | `connect_timeout` | `RDMX_CONNECT_TIMEOUT_MS` | 5000 ms |
//! | `xrc_domain` | `RDMX_XRC_DOMAIN` (a file path) | none: an XRC context's node is its own |

use std::time::Duration;

use crate::bootstrap::Transport;
use crate::error::{Error, Result};
use crate::header::HEADER_LEN;

/// The effective configuration of a context (see the module docs for the sources).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Device name (`soft:<ip>[,<ip>...]` or a hardware device such as `mlx5_0`). A soft
    /// device with two addresses has two ports, which gives endpoints an alternate path.
    pub device: String,
    /// The transport endpoints use.
    pub transport: Transport,
    /// Messages up to this many payload bytes are sent inline (copied into the work request;
    /// no buffer held). Capped by what the device supports.
    pub inline_threshold: usize,
    /// Messages of at least this many bytes use rendezvous (the receiver RDMA-reads them);
    /// smaller ones are sent eagerly into the peer's receive buffers. Also sets the size of a
    /// receive buffer (this plus the message header). The default, 32 KiB, is where
    /// rendezvous starts to pay on the soft provider (docs/BENCHMARKS.md, "Eager or
    /// rendezvous").
    pub rndv_threshold: usize,
    /// Receive credits each endpoint aims for (messages the peer may send before it must
    /// wait for more).
    pub credits: u32,
    /// Rendezvous messages an endpoint may have waiting for the peer's read: a further one
    /// waits (blocks, `WouldBlock`s or pends) until a read finishes. Each holds its source
    /// buffer, so this bounds the memory a sender pins per endpoint, and it keeps the
    /// buffers a stream cycles through few and warm in cache. When the window fills, the
    /// peer signals once half of it is read, so a sleeping sender wakes without polling.
    /// The default, 8, measured best on the soft provider with 1 MiB streams, busy-polling
    /// or not (docs/BENCHMARKS.md, "Rendezvous window").
    pub rndv_window: u32,
    /// Receive buffers kept posted on the shared receive queue (shared by all endpoints).
    pub srq_depth: u32,
    /// The most registered memory the buffer pool may hold, in bytes.
    pub pool_max: usize,
    /// The most application memory the registration cache keeps registered while idle, in
    /// bytes (see [`RegCache`](crate::regcache::RegCache)). 0 disables caching: every
    /// zero-copy send registers and deregisters its bytes.
    pub regcache_max: usize,
    /// The largest message accepted, in bytes. A context lowers it to the largest buffer
    /// its pool can hold beside the receive buffers it keeps posted (a larger rendezvous
    /// message could never be received), and advertises it to its peers, whose sends of
    /// anything larger fail with `MessageTooLarge`; its `config()` shows the lowered value.
    pub max_message: usize,
    /// How long a blocking call polls before it sleeps.
    pub busy_poll: Duration,
    /// How long a silent, unreachable peer may take to be declared dead.
    pub peer_timeout: Duration,
    /// Deadline for connecting (TCP exchange plus queue pair set-up).
    pub connect_timeout: Duration,
    /// XRC: the domain file of the node an XRC context built without an explicit node
    /// joins (every process that names the same file is one node, sharing its connections
    /// per remote node). `None`: the context is a node of its own. Unused by RC.
    pub xrc_domain: Option<std::path::PathBuf>,
    /// The shared secret both sides of a bootstrap prove they hold before anything is set
    /// up (`RDMX_AUTH_KEY`, at least 16 bytes; see `bootstrap::auth`). `None`: no
    /// authentication (a listener then refuses peers that offer it, and the other way
    /// round).
    pub auth_key: Option<crate::bootstrap::AuthKey>,
    /// The GID index endpoints use on every port (`RDMX_GID_INDEX`). `None`: the port's
    /// RoCE v2 IPv4-mapped entry (`Context::roce_v2_gid_index` of rdmx-verbs; 0 on soft
    /// devices).
    pub gid_index: Option<u32>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            device: "soft:127.0.0.1".to_string(),
            transport: Transport::Rc,
            inline_threshold: 188,
            rndv_threshold: 32 << 10,
            credits: 32,
            rndv_window: 8,
            srq_depth: 512,
            pool_max: 512 << 20,
            regcache_max: 256 << 20,
            max_message: 64 << 20,
            busy_poll: Duration::from_micros(50),
            peer_timeout: Duration::from_millis(2000),
            connect_timeout: Duration::from_millis(5000),
            xrc_domain: None,
            auth_key: None,
            gid_index: None,
        }
    }
}

impl Config {
    /// The configuration from the environment and the defaults.
    ///
    /// # Errors
    /// `Config` when a variable is set to something unusable.
    pub fn from_env() -> Result<Self> {
        ConfigBuilder::default().resolve()
    }

    /// The size of one receive buffer: the eager limit plus the header.
    pub fn recv_buf_size(&self) -> usize {
        self.rndv_threshold + HEADER_LEN
    }

    /// Checks that the values fit together.
    ///
    /// # Errors
    /// `Config` naming the offending value.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(m));
        if self.credits == 0 || self.credits > 65_536 {
            return bad(format!("credits = {} (must be 1..=65536)", self.credits));
        }
        if self.rndv_window == 0 || self.rndv_window > 65_536 {
            return bad(format!(
                "rndv_window = {} (must be 1..=65536)",
                self.rndv_window
            ));
        }
        if self.srq_depth < 2 || self.srq_depth > 1 << 20 {
            return bad(format!(
                "srq_depth = {} (must be 2..=1048576)",
                self.srq_depth
            ));
        }
        if self.rndv_threshold < 64 || self.rndv_threshold > 1 << 20 {
            return bad(format!(
                "rndv_threshold = {} (must be 64..=1048576)",
                self.rndv_threshold
            ));
        }
        if self.inline_threshold > 4096 {
            return bad(format!(
                "inline_threshold = {} (must be at most 4096)",
                self.inline_threshold
            ));
        }
        if self.max_message == 0 || self.max_message > u32::MAX as usize {
            return bad(format!(
                "max_message = {} (must be 1..=4294967295)",
                self.max_message
            ));
        }
        let recv = self.recv_buf_size() as u64 * u64::from(self.srq_depth);
        if recv > self.pool_max as u64 / 2 {
            return bad(format!(
                "pool_max = {} cannot hold srq_depth ({}) receive buffers of {} bytes with room \
                 to spare (needs at least twice {recv})",
                self.pool_max,
                self.srq_depth,
                self.recv_buf_size()
            ));
        }
        // Deadlines are instants computed from these: bound them (a day is plenty).
        let day = Duration::from_secs(86_400);
        for (name, d) in [
            ("peer_timeout", self.peer_timeout),
            ("connect_timeout", self.connect_timeout),
            ("busy_poll", self.busy_poll),
        ] {
            if d > day {
                return bad(format!("{name} = {d:?} (at most a day, 86400 s)"));
            }
        }
        // Shorter than a scheduling hiccup: every connect (or peer) would time out.
        for (name, d) in [
            ("peer_timeout", self.peer_timeout),
            ("connect_timeout", self.connect_timeout),
        ] {
            if d < Duration::from_millis(10) {
                return bad(format!("{name} = {d:?} (at least 10 ms)"));
            }
        }
        Ok(())
    }
}

/// Builds a [`Config`]: values set here win over `RDMX_*` variables, which win over the
/// defaults.
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct ConfigBuilder {
    device: Option<String>,
    transport: Option<Transport>,
    inline_threshold: Option<usize>,
    rndv_threshold: Option<usize>,
    credits: Option<u32>,
    rndv_window: Option<u32>,
    srq_depth: Option<u32>,
    pool_max: Option<usize>,
    regcache_max: Option<usize>,
    max_message: Option<usize>,
    busy_poll: Option<Duration>,
    peer_timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    xrc_domain: Option<std::path::PathBuf>,
    auth_key: Option<Vec<u8>>,
    gid_index: Option<u32>,
}

macro_rules! setter {
    ($(#[$doc:meta])* $name:ident: $ty:ty) => {
        $(#[$doc])*
        pub fn $name(mut self, v: $ty) -> Self {
            self.$name = Some(v);
            self
        }
    };
}

impl ConfigBuilder {
    /// Sets the device (`RDMX_DEVICE`).
    pub fn device(mut self, name: impl Into<String>) -> Self {
        self.device = Some(name.into());
        self
    }
    /// Sets the bootstrap's shared secret (`RDMX_AUTH_KEY`; at least 16 bytes): both sides
    /// of every connection must hold the same one.
    pub fn auth_key(mut self, key: impl AsRef<[u8]>) -> Self {
        self.auth_key = Some(key.as_ref().to_vec());
        self
    }
    /// Sets the XRC domain file of the node an XRC context joins (`RDMX_XRC_DOMAIN`).
    pub fn xrc_domain(mut self, file: impl Into<std::path::PathBuf>) -> Self {
        self.xrc_domain = Some(file.into());
        self
    }
    setter!(
        /// Sets the transport (`RDMX_TRANSPORT`).
        transport: Transport
    );
    setter!(
        /// Sets the inline threshold in bytes (`RDMX_INLINE_THRESHOLD`).
        inline_threshold: usize
    );
    setter!(
        /// Sets the eager/rendezvous threshold in bytes (`RDMX_RNDV_THRESHOLD`).
        rndv_threshold: usize
    );
    setter!(
        /// Sets the credits per endpoint (`RDMX_CREDITS`).
        credits: u32
    );
    setter!(
        /// Sets the rendezvous messages an endpoint may have awaiting the peer's read
        /// (`RDMX_RNDV_WINDOW`).
        rndv_window: u32
    );
    setter!(
        /// Sets the number of receive buffers on the shared receive queue (`RDMX_SRQ_DEPTH`).
        srq_depth: u32
    );
    setter!(
        /// Sets the buffer pool's cap in bytes (`RDMX_POOL_MAX`).
        pool_max: usize
    );
    setter!(
        /// Sets the registration cache's cap in bytes (`RDMX_REGCACHE_MAX`; 0 disables it).
        regcache_max: usize
    );
    setter!(
        /// Sets the largest accepted message (`RDMX_MAX_MESSAGE`).
        max_message: usize
    );
    setter!(
        /// Sets how long blocking calls poll before sleeping (`RDMX_BUSY_POLL_US`).
        busy_poll: Duration
    );
    setter!(
        /// Sets how fast an unreachable peer is declared dead (`RDMX_PEER_TIMEOUT_MS`).
        peer_timeout: Duration
    );
    setter!(
        /// Sets the connect deadline (`RDMX_CONNECT_TIMEOUT_MS`).
        connect_timeout: Duration
    );
    setter!(
        /// Sets the GID index used on every port (`RDMX_GID_INDEX`; default: the port's
        /// RoCE v2 IPv4-mapped entry).
        gid_index: u32
    );

    /// Resolves builder values, then the environment, then the defaults, and validates.
    ///
    /// # Errors
    /// `Config` for an unparsable variable or values that do not fit together.
    pub fn resolve(self) -> Result<Config> {
        self.resolve_with(|k| std::env::var(k).ok())
    }

    /// [`resolve`](Self::resolve) with a custom environment (for tests).
    ///
    /// # Errors
    /// As `resolve`.
    pub fn resolve_with(self, env: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let d = Config::default();
        let num = |key: &str| -> Result<Option<u64>> {
            match env(key) {
                None => Ok(None),
                Some(v) => parse_size(&v)
                    .map(Some)
                    .ok_or_else(|| Error::Config(format!("{key}={v:?} is not a number"))),
            }
        };
        let usize_of = |key: &str| -> Result<Option<usize>> {
            num(key)?
                .map(|v| usize::try_from(v).map_err(|_| Error::Config(format!("{key} too large"))))
                .transpose()
        };
        let u32_of = |key: &str| -> Result<Option<u32>> {
            num(key)?
                .map(|v| u32::try_from(v).map_err(|_| Error::Config(format!("{key} too large"))))
                .transpose()
        };
        let transport = match (self.transport, env("RDMX_TRANSPORT")) {
            (Some(t), _) => t,
            (None, Some(v)) => match v.to_ascii_lowercase().as_str() {
                "rc" => Transport::Rc,
                "xrc" => Transport::Xrc,
                "ud" => Transport::Ud,
                _ => {
                    return Err(Error::Config(format!(
                        "RDMX_TRANSPORT={v:?} (expected rc, xrc or ud)"
                    )));
                }
            },
            (None, None) => d.transport,
        };
        let cfg = Config {
            device: self
                .device
                .or_else(|| env("RDMX_DEVICE"))
                .unwrap_or(d.device),
            transport,
            inline_threshold: pick(
                self.inline_threshold,
                usize_of("RDMX_INLINE_THRESHOLD")?,
                d.inline_threshold,
            ),
            rndv_threshold: pick(
                self.rndv_threshold,
                usize_of("RDMX_RNDV_THRESHOLD")?,
                d.rndv_threshold,
            ),
            credits: pick(self.credits, u32_of("RDMX_CREDITS")?, d.credits),
            rndv_window: pick(self.rndv_window, u32_of("RDMX_RNDV_WINDOW")?, d.rndv_window),
            srq_depth: pick(self.srq_depth, u32_of("RDMX_SRQ_DEPTH")?, d.srq_depth),
            pool_max: pick(self.pool_max, usize_of("RDMX_POOL_MAX")?, d.pool_max),
            regcache_max: pick(
                self.regcache_max,
                usize_of("RDMX_REGCACHE_MAX")?,
                d.regcache_max,
            ),
            max_message: pick(
                self.max_message,
                usize_of("RDMX_MAX_MESSAGE")?,
                d.max_message,
            ),
            busy_poll: pick(
                self.busy_poll,
                num("RDMX_BUSY_POLL_US")?.map(Duration::from_micros),
                d.busy_poll,
            ),
            peer_timeout: pick(
                self.peer_timeout,
                num("RDMX_PEER_TIMEOUT_MS")?.map(Duration::from_millis),
                d.peer_timeout,
            ),
            connect_timeout: pick(
                self.connect_timeout,
                num("RDMX_CONNECT_TIMEOUT_MS")?.map(Duration::from_millis),
                d.connect_timeout,
            ),
            xrc_domain: self.xrc_domain.or_else(|| {
                env("RDMX_XRC_DOMAIN")
                    .filter(|v| !v.is_empty())
                    .map(std::path::PathBuf::from)
            }),
            gid_index: match self.gid_index {
                Some(i) => Some(i),
                None => u32_of("RDMX_GID_INDEX")?,
            },
            auth_key: match self.auth_key.or_else(|| {
                env("RDMX_AUTH_KEY")
                    .filter(|v| !v.is_empty())
                    .map(String::into_bytes)
            }) {
                Some(k) => Some(
                    crate::bootstrap::AuthKey::new(&k)
                        .map_err(|e| Error::Config(format!("RDMX_AUTH_KEY / auth_key: {e}")))?,
                ),
                None => None,
            },
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

fn pick<T>(builder: Option<T>, env: Option<T>, default: T) -> T {
    builder.or(env).unwrap_or(default)
}

/// Parses `123`, `64K`, `8M`, `1G` (binary multiples, case-insensitive, optional `iB`/`B`).
fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix("ib"))
        .or_else(|| t.strip_suffix(['B', 'b']))
        .unwrap_or(t);
    let (digits, shift) = match t.chars().last()? {
        'k' | 'K' => (&t[..t.len() - 1], 10),
        'm' | 'M' => (&t[..t.len() - 1], 20),
        'g' | 'G' => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let v: u64 = digits.trim().parse().ok()?;
    v.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_string())
        }
    }

    #[test]
    fn defaults_are_valid() {
        let c = ConfigBuilder::default().resolve_with(|_| None).unwrap();
        assert_eq!(c, Config::default());
    }

    #[test]
    fn builder_beats_env_beats_default() {
        let env = env_of(&[
            ("RDMX_CREDITS", "8"),
            ("RDMX_SRQ_DEPTH", "256"),
            ("RDMX_POOL_MAX", "64M"),
            ("RDMX_REGCACHE_MAX", "0"),
            ("RDMX_TRANSPORT", "XRC"),
            ("RDMX_BUSY_POLL_US", "0"),
            ("RDMX_RNDV_WINDOW", "2"),
        ]);
        let c = ConfigBuilder::default()
            .credits(4)
            .resolve_with(env)
            .unwrap();
        assert_eq!(c.credits, 4);
        assert_eq!(c.srq_depth, 256);
        assert_eq!(c.pool_max, 64 << 20);
        assert_eq!(c.regcache_max, 0);
        assert_eq!(c.transport, Transport::Xrc);
        assert_eq!(c.busy_poll, Duration::ZERO);
        assert_eq!(c.rndv_window, 2);
    }

    #[test]
    fn gid_index_and_auth_key_come_from_the_builder_or_the_environment() {
        let env = env_of(&[
            ("RDMX_GID_INDEX", "3"),
            ("RDMX_AUTH_KEY", "a key from the environment"),
        ]);
        let c = ConfigBuilder::default().resolve_with(&env).unwrap();
        assert_eq!(c.gid_index, Some(3));
        assert_eq!(
            c.auth_key,
            Some(crate::bootstrap::AuthKey::new("a key from the environment").unwrap())
        );
        let c = ConfigBuilder::default()
            .gid_index(1)
            .auth_key("another key, long enough")
            .resolve_with(&env)
            .unwrap();
        assert_eq!(c.gid_index, Some(1));
        assert!(
            !format!("{c:?}").contains("another key"),
            "the key is not printed"
        );
        let short = env_of(&[("RDMX_AUTH_KEY", "short")]);
        assert!(ConfigBuilder::default().resolve_with(&short).is_err());
        let bad = env_of(&[("RDMX_GID_INDEX", "x")]);
        assert!(ConfigBuilder::default().resolve_with(&bad).is_err());
    }

    #[test]
    fn the_xrc_domain_comes_from_the_builder_or_the_environment() {
        let none = ConfigBuilder::default().resolve_with(|_| None).unwrap();
        assert_eq!(none.xrc_domain, None);
        let env = env_of(&[("RDMX_XRC_DOMAIN", "/run/rdmx/node")]);
        let c = ConfigBuilder::default().resolve_with(&env).unwrap();
        assert_eq!(c.xrc_domain, Some("/run/rdmx/node".into()));
        let c = ConfigBuilder::default()
            .xrc_domain("/tmp/mine")
            .resolve_with(&env)
            .unwrap();
        assert_eq!(c.xrc_domain, Some("/tmp/mine".into()));
        let empty = env_of(&[("RDMX_XRC_DOMAIN", "")]);
        assert_eq!(
            ConfigBuilder::default()
                .resolve_with(empty)
                .unwrap()
                .xrc_domain,
            None,
            "an empty variable is unset"
        );
    }

    #[test]
    fn bad_values_are_named() {
        let e = ConfigBuilder::default()
            .resolve_with(env_of(&[("RDMX_CREDITS", "lots")]))
            .unwrap_err();
        assert!(e.to_string().contains("RDMX_CREDITS"), "{e}");
        let e = ConfigBuilder::default()
            .resolve_with(env_of(&[("RDMX_TRANSPORT", "tcp")]))
            .unwrap_err();
        assert!(e.to_string().contains("RDMX_TRANSPORT"), "{e}");
        let e = ConfigBuilder::default()
            .credits(0)
            .resolve_with(|_| None)
            .unwrap_err();
        assert!(e.to_string().contains("credits"), "{e}");
        let e = ConfigBuilder::default()
            .rndv_window(0)
            .resolve_with(|_| None)
            .unwrap_err();
        assert!(e.to_string().contains("rndv_window"), "{e}");
        let e = ConfigBuilder::default()
            .pool_max(1 << 20)
            .resolve_with(|_| None)
            .unwrap_err();
        assert!(e.to_string().contains("pool_max"), "{e}");
        // A zero connect timeout used to be accepted: every connect then failed.
        let e = ConfigBuilder::default()
            .resolve_with(env_of(&[("RDMX_CONNECT_TIMEOUT_MS", "0")]))
            .unwrap_err();
        assert!(e.to_string().contains("connect_timeout"), "{e}");
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64k"), Some(64 << 10));
        assert_eq!(parse_size("8MiB"), Some(8 << 20));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("99999999999999999999G"), None);
    }
}
