//! Options: what `bench` and its children are told.

use super::*;

/// Where `bench` runs its participants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Threads of this process.
    Threads,
    /// Child processes on this host's device.
    Procs,
    /// Child processes, each in a network namespace of its own on one bridge.
    Netns,
}

impl Mode {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Threads => "threads",
            Self::Procs => "procs",
            Self::Netns => "netns",
        }
    }
}

/// What `bench` runs.
#[derive(Debug, Clone)]
pub(crate) struct BenchOptions {
    pub(crate) pubs: usize,
    pub(crate) subs: usize,
    pub(crate) size: usize,
    pub(crate) secs: f64,
    /// Messages per second each publisher publishes at (`None`: as fast as the group takes
    /// them).
    pub(crate) rate: Option<f64>,
    pub(crate) json: bool,
    pub(crate) reliable: bool,
    pub(crate) mode: Mode,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            pubs: 1,
            subs: 1,
            size: 16,
            secs: 3.0,
            rate: None,
            json: false,
            reliable: true,
            mode: Mode::Threads,
        }
    }
}

/// `value` of option `opt`, parsed.
pub(crate) fn number<T: FromStr>(opt: &str, value: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    value.parse().map_err(|e| format!("{opt} {value:?}: {e}"))
}

impl BenchOptions {
    pub(crate) fn parse(args: &[String]) -> Result<Self, String> {
        let mut o = Self::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = || {
                it.next()
                    .map(String::as_str)
                    .ok_or_else(|| format!("{a} needs a value"))
            };
            match a.as_str() {
                "--pubs" => o.pubs = number(a, value()?)?,
                "--subs" => o.subs = number(a, value()?)?,
                "--size" => o.size = number(a, value()?)?,
                "--secs" => o.secs = number(a, value()?)?,
                "--rate" => o.rate = Some(number(a, value()?)?),
                "--json" => o.json = true,
                "--unreliable" => o.reliable = false,
                "--procs" => {
                    if o.mode == Mode::Threads {
                        o.mode = Mode::Procs;
                    }
                }
                "--netns" => o.mode = Mode::Netns,
                other => return Err(format!("bench: unknown option {other:?}\n{USAGE}")),
            }
        }
        o.check()?;
        Ok(o)
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        if self.pubs == 0 {
            return Err("--pubs: at least 1".into());
        }
        if self.subs == 0 {
            return Err("--subs: at least 1".into());
        }
        if self.pubs + self.subs > MAX_PARTICIPANTS {
            return Err(format!(
                "--pubs and --subs: at most {MAX_PARTICIPANTS} participants in all"
            ));
        }
        if !(16..=MAX_SIZE).contains(&self.size) {
            return Err(format!(
                "--size {}: 16 bytes (a sequence number and a send time) to {MAX_SIZE}",
                self.size
            ));
        }
        if !(self.secs.is_finite() && self.secs > 0.0) {
            return Err(format!(
                "--secs {}: a positive number of seconds",
                self.secs
            ));
        }
        if let Some(r) = self.rate
            && !(r.is_finite() && r > 0.0)
        {
            return Err(format!(
                "--rate {r}: a positive number of messages per second"
            ));
        }
        Ok(())
    }
}

/// A participant of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Pub,
    Sub,
}

/// What a participant needs to know (the options of the hidden `bench-pub` / `bench-sub`).
#[derive(Debug, Clone)]
pub(crate) struct RoleOptions {
    pub(crate) topic: String,
    /// Publishers in the run (a subscriber ends when it has every one's end mark).
    pub(crate) pubs: usize,
    /// Members a publisher waits to have heard of before it starts (every other one).
    pub(crate) members: usize,
    pub(crate) size: usize,
    pub(crate) secs: f64,
    pub(crate) rate: Option<f64>,
    pub(crate) reliable: bool,
    /// The device to open (`None`: `RDMX_DEVICE`, else the default).
    pub(crate) device: Option<String>,
}

impl RoleOptions {
    /// The command line of a child process in `role`.
    pub(crate) fn args(&self, role: Role) -> Vec<String> {
        let mut a: Vec<String> = vec![
            match role {
                Role::Pub => "bench-pub",
                Role::Sub => "bench-sub",
            }
            .into(),
            "--topic".into(),
            self.topic.clone(),
            "--pubs".into(),
            self.pubs.to_string(),
            "--members".into(),
            self.members.to_string(),
            "--size".into(),
            self.size.to_string(),
            "--secs".into(),
            self.secs.to_string(),
        ];
        if let Some(r) = self.rate {
            a.extend(["--rate".into(), r.to_string()]);
        }
        if !self.reliable {
            a.push("--unreliable".into());
        }
        if let Some(d) = &self.device {
            a.extend(["--device".into(), d.clone()]);
        }
        a
    }

    pub(crate) fn parse(args: &[String]) -> Result<Self, String> {
        let mut o = Self {
            topic: String::new(),
            pubs: 1,
            members: 1,
            size: 16,
            secs: 1.0,
            rate: None,
            reliable: true,
            device: None,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = || {
                it.next()
                    .map(String::as_str)
                    .ok_or_else(|| format!("{a} needs a value"))
            };
            match a.as_str() {
                "--topic" => o.topic = value()?.to_string(),
                "--pubs" => o.pubs = number(a, value()?)?,
                "--members" => o.members = number(a, value()?)?,
                "--size" => o.size = number(a, value()?)?,
                "--secs" => o.secs = number(a, value()?)?,
                "--rate" => o.rate = Some(number(a, value()?)?),
                "--unreliable" => o.reliable = false,
                "--device" => o.device = Some(value()?.to_string()),
                other => return Err(format!("unknown option {other:?}")),
            }
        }
        if o.topic.is_empty() || o.pubs == 0 || o.size < 16 || !(o.secs.is_finite() && o.secs > 0.0)
        {
            return Err(
                "a bench participant needs --topic, --pubs >= 1, --size >= 16, --secs > 0 \
                 (it is started by `bench --procs`)"
                    .into(),
            );
        }
        Ok(o)
    }
}

pub(crate) fn group_config(reliable: bool) -> McastConfig {
    McastConfig {
        reliable,
        ..McastConfig::default()
    }
}

pub(crate) fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The little-endian `u64` at `at` in `m`.
pub(crate) fn word(m: &[u8], at: usize) -> Option<u64> {
    let b: [u8; 8] = m.get(at..at + 8)?.try_into().ok()?;
    Some(u64::from_le_bytes(b))
}
