//! Test hosts in Linux network namespaces.
//!
//! A [`Topology`] names hosts (one network namespace each), point-to-point veth [`Link`]s
//! between two hosts and [`Bridge`]s joining several hosts on one Ethernet segment.
//! [`Topology::build`] creates it all with the `ip` command and returns [`Hosts`], which runs
//! commands inside the hosts, takes links down and up, and deletes everything it created when
//! dropped (also when the test panics).
//!
//! ```no_run
//! use std::process::Command;
//! use rdmx_tests::netns::{Link, Topology, require_netns_or_skip};
//!
//! if !require_netns_or_skip("my_test") {
//!     return;
//! }
//! let hosts = Topology::new()
//!     .host("a")
//!     .host("b")
//!     .link(Link::new("ab", "a", "b").mtu(1500))
//!     .build()
//!     .expect("build the topology");
//! let b_addr = hosts.host("b").addr("ab"); // 198.18.0.2
//! let mut ping = Command::new("ping");
//! ping.args(["-c1", &b_addr.to_string()]);
//! let out = hosts.run("a", ping).expect("run ping");
//! assert!(out.status.success());
//! ```
//!
//! # Names and addresses
//!
//! Every build gets a run id `rdmx-<pid>-<n>` (`n` counts builds within the process); host
//! `h1` is namespace `rdmx-<pid>-<n>-h1`, and a bridge in its own namespace is
//! `rdmx-<pid>-<n>-<bridge>`. Namespaces of a process that no longer exists are deleted by
//! the next build (after killing whatever still runs in them).
//!
//! Links and bridges are numbered in declaration order (one counter for both); segment `k`
//! gets the /24 `198.18.k.0` (`198.19.(k-256).0` from 256 on), inside the 198.18.0.0/15
//! benchmarking range. On a link the first host is `.1` and the second `.2`; on a bridge the
//! members are `.1`, `.2`, ... in the order given.
//!
//! Inside a host, the interface of a link or bridge is named after it (`ab` for link `ab`);
//! the ports of a bridge are named `p.<host>`. Nothing is ever created in, or changed in, the
//! root namespace: veth pairs are created inside the namespaces (`ip -n <ns> link add ... peer
//! ... netns <other>`).
//!
//! # Multicast
//!
//! Bridges flood multicast (IGMP snooping is off unless [`Bridge::multicast_snooping`] turns
//! it on), and each host gets a `224.0.0.0/4` route on the first bridge it is a member of, so
//! that multicast senders need no `IP_MULTICAST_IF`.

use std::collections::HashSet;
use std::fmt;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::Duration;

use crate::process::{self, Proc, Shared, lock};

/// Default limit for one `ip` command.
pub const IP_TIMEOUT: Duration = Duration::from_secs(20);
/// Default limit for [`Hosts::run`].
pub const RUN_TIMEOUT: Duration = Duration::from_secs(120);
/// Default limit for processes started by [`Hosts::spawn`].
pub const SPAWN_TIMEOUT: Duration = Duration::from_secs(600);
/// Default MTU of links and bridges.
pub const DEFAULT_MTU: u32 = 1500;
/// The environment variable that turns a skip into a failure.
pub const REQUIRE_ENV: &str = "RDMX_REQUIRE_NETNS";

/// Longest host, link or bridge name (so that `p.<host>` fits an interface name).
const MAX_NAME: usize = 12;
/// Number of /24 segments in 198.18.0.0/15.
const MAX_SEGMENTS: usize = 512;

/// Builds counted per process (part of the run id).
static BUILDS: AtomicU32 = AtomicU32::new(0);

/// What can go wrong building or using [`Hosts`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetnsError {
    /// Network namespaces cannot be used here (not root, no `ip`, no permission, ...).
    #[error("network namespaces are unavailable: {0}")]
    Unavailable(String),
    /// The topology is inconsistent (unknown host, duplicate or invalid name, ...).
    #[error("invalid topology: {0}")]
    Config(String),
    /// A command (usually `ip ...`) exited with a failure status.
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// Its exit status.
        status: String,
        /// Its standard error output.
        stderr: String,
    },
    /// A command did not finish in time and was killed.
    #[error("`{cmd}` did not finish within {timeout:?} and was killed; stderr: {stderr}")]
    Timeout {
        /// The command line.
        cmd: String,
        /// The time limit.
        timeout: Duration,
        /// Its standard error output so far.
        stderr: String,
    },
    /// A command could not be started.
    #[error("cannot run `{cmd}`: {source}")]
    Spawn {
        /// The command line.
        cmd: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No host, link or bridge of that name.
    #[error("no {kind} named {name:?} in this topology")]
    Unknown {
        /// "host", "link", ...
        kind: &'static str,
        /// The name asked for.
        name: String,
    },
    /// A command's output could not be understood.
    #[error("unexpected output from `{cmd}`: {detail}")]
    Parse {
        /// The command line.
        cmd: String,
        /// What was wrong.
        detail: String,
    },
}

// ---------------------------------------------------------------------------------------------
// Availability and skipping
// ---------------------------------------------------------------------------------------------

/// Checks that this process can create network namespaces and veth pairs: effective uid 0,
/// the `ip` command present, and a probe namespace (with a veth pair inside) can be created
/// and deleted. The result is computed once per process.
///
/// # Errors
/// The reason, readable by a human, when namespaces are unavailable.
pub fn netns_available() -> Result<(), String> {
    static RESULT: OnceLock<Result<(), String>> = OnceLock::new();
    RESULT.get_or_init(probe).clone()
}

fn probe() -> Result<(), String> {
    let ip_ok = {
        let mut c = Command::new("ip");
        c.arg("-V");
        process::run(c, IP_TIMEOUT).is_ok_and(|o| o.status.success())
    };
    if !ip_ok {
        return Err("the `ip` command (iproute2) is not installed \
                    (apt-get install -y iproute2)"
            .into());
    }
    match effective_uid() {
        Some(0) => {}
        Some(uid) => {
            return Err(format!(
                "not running as root (effective uid {uid}); network namespaces need root"
            ));
        }
        None => return Err("cannot read the effective uid from /proc/self/status".into()),
    }
    let ns = format!(
        "rdmx-{}-p{}",
        std::process::id(),
        BUILDS.fetch_add(1, Ordering::Relaxed)
    );
    let result = ip(&["netns", "add", &ns])
        .and_then(|_| ip(&["-n", &ns, "link", "set", "lo", "up"]))
        .and_then(|_| {
            ip(&[
                "-n", &ns, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1",
            ])
        })
        .map(|_| ())
        .map_err(|e| e.to_string());
    // Best effort: a half-created probe is also swept as stale by a later run.
    let _ = ip(&["netns", "del", &ns]);
    result
}

/// The effective uid, from `/proc/self/status` (no `unsafe` here, so no `geteuid`).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// For tests that need network namespaces: returns `true` when they are available. When they
/// are not, prints `SKIPPED <test_name>: <reason> (set RDMX_REQUIRE_NETNS=1 to make this a
/// failure)` on stderr (past the test harness's capture, so it shows in `cargo test` output)
/// and returns `false`, so that the test can return early.
///
/// # Panics
/// When namespaces are unavailable and the environment variable `RDMX_REQUIRE_NETNS` is `1`
/// (CI sets it and runs as root, so a skip there is a failure).
pub fn require_netns_or_skip(test_name: &str) -> bool {
    let reason = match netns_available() {
        Ok(()) => return true,
        Err(r) => r,
    };
    if std::env::var(REQUIRE_ENV).is_ok_and(|v| v.trim() == "1") {
        panic!("{test_name}: network namespaces are required ({REQUIRE_ENV}=1) but {reason}");
    }
    // `eprintln!` would be captured by the test harness; write to the real stderr.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test_name}: {reason} (set {REQUIRE_ENV}=1 to make this a failure)"
    );
    false
}

// ---------------------------------------------------------------------------------------------
// `ip` helpers
// ---------------------------------------------------------------------------------------------

/// Runs `ip <args>` (bounded by [`IP_TIMEOUT`]); returns its stdout.
fn ip(args: &[&str]) -> Result<String, NetnsError> {
    let mut c = Command::new("ip");
    c.args(args);
    process::run_ok(c, IP_TIMEOUT)
}

/// Names listed by `ip netns list` (lines like `name (id: 3)` or `name`).
pub fn list_netns() -> Result<Vec<String>, NetnsError> {
    Ok(parse_netns_list(&ip(&["netns", "list"])?))
}

fn parse_netns_list(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// The pid in a name `rdmx-<pid>-...`, if it has that form.
fn owner_pid(ns: &str) -> Option<u32> {
    let rest = ns.strip_prefix("rdmx-")?;
    let (pid, tail) = rest.split_once('-')?;
    if tail.is_empty() || pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// Kills every process in `ns` (`ip netns pids`), then deletes it (a few attempts).
fn kill_and_delete(ns: &str) -> Result<(), NetnsError> {
    let mut last = None;
    for attempt in 0..4 {
        if let Ok(pids) = ip(&["netns", "pids", ns]) {
            for pid in pids
                .split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok())
            {
                if pid != std::process::id() {
                    process::kill_pid(pid);
                }
            }
        }
        match ip(&["netns", "del", ns]) {
            Ok(_) => return Ok(()),
            Err(e) => {
                // Already gone (e.g. deleted concurrently): that is success.
                if !Path::new("/run/netns").join(ns).exists() {
                    return Ok(());
                }
                last = Some(e);
            }
        }
        thread::sleep(Duration::from_millis(50 << attempt));
    }
    Err(last.unwrap_or_else(|| NetnsError::Config(format!("cannot delete {ns}"))))
}

/// Deletes `rdmx-<pid>-*` namespaces whose process no longer exists; returns their names.
///
/// # Errors
/// When `ip netns list` fails; failures to delete one namespace are reported on stderr.
pub fn cleanup_stale() -> Result<Vec<String>, NetnsError> {
    let me = std::process::id();
    let mut removed = Vec::new();
    for ns in list_netns()? {
        let Some(pid) = owner_pid(&ns) else { continue };
        if pid == me || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        match kill_and_delete(&ns) {
            Ok(()) => removed.push(ns),
            Err(e) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "rdmx-tests: cannot delete stale namespace {ns}: {e}"
                );
            }
        }
    }
    Ok(removed)
}

// ---------------------------------------------------------------------------------------------
// The topology description
// ---------------------------------------------------------------------------------------------

/// A point-to-point veth link between two hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    name: String,
    a: String,
    b: String,
    mtu: u32,
}

impl Link {
    /// A link named `name` (also the interface name in both hosts) from host `a` (address
    /// `.1`) to host `b` (address `.2`), MTU [`DEFAULT_MTU`].
    pub fn new(name: impl Into<String>, a: impl Into<String>, b: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            a: a.into(),
            b: b.into(),
            mtu: DEFAULT_MTU,
        }
    }

    /// Sets the MTU of both ends.
    #[must_use]
    pub fn mtu(mut self, mtu: u32) -> Self {
        self.mtu = mtu;
        self
    }
}

/// An Ethernet bridge joining several hosts on one segment (one veth pair per member).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bridge {
    name: String,
    members: Vec<String>,
    mtu: u32,
    home: Option<String>,
    snooping: bool,
}

impl Bridge {
    /// A bridge named `name` joining `members` (addresses `.1`, `.2`, ... in this order). By
    /// default it lives in its own namespace `rdmx-<pid>-<n>-<name>`.
    pub fn new<I, S>(name: impl Into<String>, members: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            name: name.into(),
            members: members.into_iter().map(Into::into).collect(),
            mtu: DEFAULT_MTU,
            home: None,
            snooping: false,
        }
    }

    /// Sets the MTU of the bridge and of every veth end on it.
    #[must_use]
    pub fn mtu(mut self, mtu: u32) -> Self {
        self.mtu = mtu;
        self
    }

    /// Puts the bridge device into member `host` instead of a namespace of its own; that host's
    /// address is then on the bridge device itself.
    #[must_use]
    pub fn in_host(mut self, host: impl Into<String>) -> Self {
        self.home = Some(host.into());
        self
    }

    /// Turns IGMP snooping on (off by default: the bridge floods multicast to every port).
    #[must_use]
    pub fn multicast_snooping(mut self, on: bool) -> Self {
        self.snooping = on;
        self
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum SegmentSpec {
    Link(Link),
    Bridge(Bridge),
}

impl SegmentSpec {
    fn name(&self) -> &str {
        match self {
            Self::Link(l) => &l.name,
            Self::Bridge(b) => &b.name,
        }
    }
}

/// Describes hosts, links and bridges; [`Topology::build`] creates them.
#[derive(Debug, Clone)]
pub struct Topology {
    hosts: Vec<String>,
    segments: Vec<SegmentSpec>,
    ip_timeout: Duration,
    run_timeout: Duration,
    spawn_timeout: Duration,
}

impl Default for Topology {
    fn default() -> Self {
        Self::new()
    }
}

impl Topology {
    /// An empty topology.
    pub fn new() -> Self {
        Self {
            hosts: Vec::new(),
            segments: Vec::new(),
            ip_timeout: IP_TIMEOUT,
            run_timeout: RUN_TIMEOUT,
            spawn_timeout: SPAWN_TIMEOUT,
        }
    }

    /// Adds a host (a network namespace). Names: 1 to 12 characters out of `A-Z a-z 0-9 _ -`,
    /// unique among hosts, links and bridges.
    #[must_use]
    pub fn host(mut self, name: impl Into<String>) -> Self {
        self.hosts.push(name.into());
        self
    }

    /// Adds a point-to-point link.
    #[must_use]
    pub fn link(mut self, link: Link) -> Self {
        self.segments.push(SegmentSpec::Link(link));
        self
    }

    /// Adds a bridge.
    #[must_use]
    pub fn bridge(mut self, bridge: Bridge) -> Self {
        self.segments.push(SegmentSpec::Bridge(bridge));
        self
    }

    /// Limit for [`Hosts::run`] (default [`RUN_TIMEOUT`]).
    #[must_use]
    pub fn run_timeout(mut self, t: Duration) -> Self {
        self.run_timeout = t;
        self
    }

    /// Limit for processes started by [`Hosts::spawn`] (default [`SPAWN_TIMEOUT`]).
    #[must_use]
    pub fn spawn_timeout(mut self, t: Duration) -> Self {
        self.spawn_timeout = t;
        self
    }

    /// Checks names, references and sizes.
    fn validate(&self) -> Result<(), NetnsError> {
        let cfg = |m: String| Err(NetnsError::Config(m));
        let mut names = HashSet::new();
        let all = self
            .hosts
            .iter()
            .map(|h| ("host", h.as_str()))
            .chain(self.segments.iter().map(|s| match s {
                SegmentSpec::Link(l) => ("link", l.name.as_str()),
                SegmentSpec::Bridge(b) => ("bridge", b.name.as_str()),
            }));
        for (kind, name) in all {
            check_name(kind, name)?;
            if !names.insert(name) {
                return cfg(format!(
                    "name {name:?} is used twice (hosts, links and bridges share one namespace)"
                ));
            }
        }
        if self.segments.len() > MAX_SEGMENTS {
            return cfg(format!(
                "{} links and bridges; 198.18.0.0/15 has room for {MAX_SEGMENTS}",
                self.segments.len()
            ));
        }
        let host_known = |kind: &str, seg: &str, h: &str| {
            if self.hosts.iter().any(|x| x == h) {
                Ok(())
            } else {
                cfg(format!("{kind} {seg:?} names unknown host {h:?}"))
            }
        };
        for s in &self.segments {
            let mtu = match s {
                SegmentSpec::Link(l) => {
                    host_known("link", &l.name, &l.a)?;
                    host_known("link", &l.name, &l.b)?;
                    if l.a == l.b {
                        return cfg(format!("link {:?} joins host {:?} to itself", l.name, l.a));
                    }
                    l.mtu
                }
                SegmentSpec::Bridge(b) => {
                    if b.members.is_empty() || b.members.len() > 253 {
                        return cfg(format!(
                            "bridge {:?} has {} members (1 to 253)",
                            b.name,
                            b.members.len()
                        ));
                    }
                    let mut seen = HashSet::new();
                    for m in &b.members {
                        host_known("bridge", &b.name, m)?;
                        if !seen.insert(m) {
                            return cfg(format!("bridge {:?} lists {m:?} twice", b.name));
                        }
                    }
                    if let Some(h) = &b.home
                        && !b.members.contains(h)
                    {
                        return cfg(format!(
                            "bridge {:?} is placed in {h:?}, which is not a member",
                            b.name
                        ));
                    }
                    b.mtu
                }
            };
            if !(68..=65535).contains(&mtu) {
                return cfg(format!("{:?}: MTU {mtu} is outside 68..=65535", s.name()));
            }
        }
        Ok(())
    }

    /// Creates the namespaces, links and bridges: first deletes stale namespaces of dead
    /// processes, then creates everything (on failure, what was created is deleted again).
    ///
    /// # Errors
    /// [`NetnsError::Config`] for an inconsistent topology, [`NetnsError::Unavailable`] when
    /// namespaces cannot be used, or the failing `ip` command.
    pub fn build(&self) -> Result<Hosts, NetnsError> {
        self.validate()?;
        netns_available().map_err(NetnsError::Unavailable)?;
        cleanup_stale()?;
        let run_id = format!(
            "rdmx-{}-{}",
            std::process::id(),
            BUILDS.fetch_add(1, Ordering::Relaxed)
        );
        let mut hosts = Hosts {
            run_id,
            hosts: Vec::new(),
            segments: Vec::new(),
            created: Vec::new(),
            procs: Mutex::new(Vec::new()),
            run_timeout: self.run_timeout,
            spawn_timeout: self.spawn_timeout,
            ip_timeout: self.ip_timeout,
        };
        // On error, dropping `hosts` deletes whatever was created so far.
        hosts.create(self)?;
        Ok(hosts)
    }
}

fn check_name(kind: &str, name: &str) -> Result<(), NetnsError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && name != "lo";
    if ok {
        Ok(())
    } else {
        Err(NetnsError::Config(format!(
            "{kind} name {name:?} must be 1 to {MAX_NAME} characters out of A-Z a-z 0-9 _ - \
             (and not \"lo\")"
        )))
    }
}

/// Address of host number `index` (1-based) on segment `seg`.
fn segment_addr(seg: usize, index: usize) -> Ipv4Addr {
    debug_assert!(seg < MAX_SEGMENTS && (1..=254).contains(&index));
    Ipv4Addr::new(198, 18 + (seg / 256) as u8, (seg % 256) as u8, index as u8)
}

// ---------------------------------------------------------------------------------------------
// The built hosts
// ---------------------------------------------------------------------------------------------

/// One interface of a host: its end of a link, or its attachment to a bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iface {
    /// The link or bridge name.
    pub segment: String,
    /// Interface name inside the host.
    pub dev: String,
    /// IPv4 address.
    pub addr: Ipv4Addr,
    /// Prefix length (24).
    pub prefix_len: u8,
    /// MTU.
    pub mtu: u32,
}

/// A host: a network namespace with its interfaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    name: String,
    netns: String,
    ifaces: Vec<Iface>,
}

impl Host {
    /// The host's name in the topology.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The network namespace (`rdmx-<pid>-<n>-<name>`).
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// The host's interfaces, in declaration order of the links and bridges.
    pub fn ifaces(&self) -> &[Iface] {
        &self.ifaces
    }

    /// The host's interface on link or bridge `segment`.
    pub fn iface(&self, segment: &str) -> Option<&Iface> {
        self.ifaces.iter().find(|i| i.segment == segment)
    }

    /// The host's address on link or bridge `segment`, if it is attached to it.
    pub fn try_addr(&self, segment: &str) -> Option<Ipv4Addr> {
        self.iface(segment).map(|i| i.addr)
    }

    /// The host's address on link or bridge `segment`.
    ///
    /// # Panics
    /// When the host is not on `segment` (a bug in the test).
    pub fn addr(&self, segment: &str) -> Ipv4Addr {
        self.try_addr(segment).unwrap_or_else(|| {
            panic!(
                "host {:?} has no interface on {segment:?} (it has: {:?})",
                self.name,
                self.ifaces.iter().map(|i| &i.segment).collect::<Vec<_>>()
            )
        })
    }
}

/// One device of a segment, for taking it down and up.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Dev {
    netns: String,
    dev: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Segment {
    name: String,
    /// Every device of the segment, in the order to bring them up (bridge, ports, host ends).
    devs: Vec<Dev>,
}

/// Administrative and carrier state of an interface (`ip link show` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IfaceState {
    /// `UP`: administratively up.
    pub admin_up: bool,
    /// `LOWER_UP`: carrier present (for a veth: the peer is up too).
    pub carrier: bool,
}

/// Hosts built from a [`Topology`]: runs commands in them and deletes them on drop.
pub struct Hosts {
    run_id: String,
    hosts: Vec<Host>,
    segments: Vec<Segment>,
    /// Every namespace created, in creation order.
    created: Vec<String>,
    /// Processes started in the hosts, killed at teardown.
    procs: Mutex<Vec<Arc<Shared>>>,
    run_timeout: Duration,
    spawn_timeout: Duration,
    ip_timeout: Duration,
}

impl fmt::Debug for Hosts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hosts")
            .field("run_id", &self.run_id)
            .field("hosts", &self.hosts)
            .field("namespaces", &self.created)
            .finish_non_exhaustive()
    }
}

impl Hosts {
    /// Runs `ip <args>` with this topology's limit.
    fn ip(&self, args: &[&str]) -> Result<String, NetnsError> {
        let mut c = Command::new("ip");
        c.args(args);
        process::run_ok(c, self.ip_timeout)
    }

    fn add_netns(&mut self, ns: &str) -> Result<(), NetnsError> {
        self.ip(&["netns", "add", ns])?;
        self.created.push(ns.to_string());
        self.ip(&["-n", ns, "link", "set", "lo", "up"])?;
        Ok(())
    }

    fn host_ns(&self, name: &str) -> String {
        format!("{}-{name}", self.run_id)
    }

    /// Creates a veth pair `dev_a` in `ns_a` / `dev_b` in `ns_b`, directly inside the
    /// namespaces (the root namespace never sees it), with MTU `mtu` on both ends.
    fn add_veth(
        &self,
        ns_a: &str,
        dev_a: &str,
        ns_b: &str,
        dev_b: &str,
        mtu: u32,
    ) -> Result<(), NetnsError> {
        let mtu = mtu.to_string();
        self.ip(&[
            "-n", ns_a, "link", "add", dev_a, "mtu", &mtu, "type", "veth", "peer", "name", dev_b,
            "netns", ns_b, "mtu", &mtu,
        ])?;
        Ok(())
    }

    fn add_addr(&mut self, host: usize, segment: &str, dev: &str, addr: Ipv4Addr, mtu: u32) -> R {
        let ns = self.hosts[host].netns.clone();
        self.ip(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
        self.hosts[host].ifaces.push(Iface {
            segment: segment.to_string(),
            dev: dev.to_string(),
            addr,
            prefix_len: 24,
            mtu,
        });
        Ok(())
    }

    fn host_index(&self, name: &str) -> Result<usize, NetnsError> {
        self.hosts
            .iter()
            .position(|h| h.name == name)
            .ok_or_else(|| NetnsError::Unknown {
                kind: "host",
                name: name.to_string(),
            })
    }

    fn create(&mut self, topo: &Topology) -> R {
        for name in &topo.hosts {
            let ns = self.host_ns(name);
            self.add_netns(&ns)?;
            self.hosts.push(Host {
                name: name.clone(),
                netns: ns,
                ifaces: Vec::new(),
            });
        }
        let mut mcast_route = HashSet::new();
        for (k, seg) in topo.segments.iter().enumerate() {
            match seg {
                SegmentSpec::Link(l) => self.create_link(k, l)?,
                SegmentSpec::Bridge(b) => self.create_bridge(k, b, &mut mcast_route)?,
            }
        }
        Ok(())
    }

    fn create_link(&mut self, k: usize, l: &Link) -> R {
        let (ia, ib) = (self.host_index(&l.a)?, self.host_index(&l.b)?);
        let (ns_a, ns_b) = (self.hosts[ia].netns.clone(), self.hosts[ib].netns.clone());
        self.add_veth(&ns_a, &l.name, &ns_b, &l.name, l.mtu)?;
        self.add_addr(ia, &l.name, &l.name, segment_addr(k, 1), l.mtu)?;
        self.add_addr(ib, &l.name, &l.name, segment_addr(k, 2), l.mtu)?;
        for ns in [&ns_a, &ns_b] {
            self.ip(&["-n", ns, "link", "set", &l.name, "up"])?;
        }
        self.segments.push(Segment {
            name: l.name.clone(),
            devs: vec![
                Dev {
                    netns: ns_a,
                    dev: l.name.clone(),
                },
                Dev {
                    netns: ns_b,
                    dev: l.name.clone(),
                },
            ],
        });
        Ok(())
    }

    fn create_bridge(&mut self, k: usize, b: &Bridge, mcast_route: &mut HashSet<String>) -> R {
        let mtu = b.mtu.to_string();
        let br_ns = match &b.home {
            Some(h) => self.hosts[self.host_index(h)?].netns.clone(),
            None => {
                let ns = self.host_ns(&b.name);
                self.add_netns(&ns)?;
                ns
            }
        };
        let snooping = if b.snooping { "1" } else { "0" };
        self.ip(&[
            "-n",
            &br_ns,
            "link",
            "add",
            &b.name,
            "mtu",
            &mtu,
            "type",
            "bridge",
            "mcast_snooping",
            snooping,
        ])?;
        self.ip(&["-n", &br_ns, "link", "set", &b.name, "up"])?;
        let mut devs = vec![Dev {
            netns: br_ns.clone(),
            dev: b.name.clone(),
        }];
        let mut host_ends = Vec::new();
        for (i, member) in b.members.iter().enumerate() {
            let hi = self.host_index(member)?;
            let ns = self.hosts[hi].netns.clone();
            let addr = segment_addr(k, i + 1);
            if b.home.as_deref() == Some(member.as_str()) {
                // The home host's address sits on the bridge device itself.
                self.add_addr(hi, &b.name, &b.name, addr, b.mtu)?;
            } else {
                let port = format!("p.{member}");
                self.add_veth(&ns, &b.name, &br_ns, &port, b.mtu)?;
                self.ip(&["-n", &br_ns, "link", "set", &port, "master", &b.name, "up"])?;
                devs.push(Dev {
                    netns: br_ns.clone(),
                    dev: port,
                });
                self.add_addr(hi, &b.name, &b.name, addr, b.mtu)?;
                self.ip(&["-n", &ns, "link", "set", &b.name, "up"])?;
                host_ends.push(Dev {
                    netns: ns.clone(),
                    dev: b.name.clone(),
                });
            }
            if mcast_route.insert(ns.clone()) {
                self.ip(&["-n", &ns, "route", "add", "224.0.0.0/4", "dev", &b.name])?;
            }
        }
        devs.extend(host_ends);
        self.segments.push(Segment {
            name: b.name.clone(),
            devs,
        });
        Ok(())
    }

    /// The run id `rdmx-<pid>-<n>`: every namespace of these hosts starts with it and a `-`.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Every namespace created (hosts, and bridges that have their own).
    pub fn namespaces(&self) -> &[String] {
        &self.created
    }

    /// All hosts, in declaration order.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The host named `name`, if any.
    pub fn try_host(&self, name: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// The host named `name`.
    ///
    /// # Panics
    /// When there is no such host (a bug in the test).
    pub fn host(&self, name: &str) -> &Host {
        self.try_host(name)
            .unwrap_or_else(|| panic!("no host named {name:?} in {}", self.run_id))
    }

    fn host_or_err(&self, name: &str) -> Result<&Host, NetnsError> {
        self.try_host(name).ok_or_else(|| NetnsError::Unknown {
            kind: "host",
            name: name.to_string(),
        })
    }

    /// `cmd` wrapped to run in host `host`: `ip netns exec <ns> <program> <args>`, with `cmd`'s
    /// environment changes and working directory (not its stdio settings, nor `env_clear`).
    ///
    /// # Errors
    /// [`NetnsError::Unknown`] for an unknown host.
    pub fn command(&self, host: &str, cmd: &Command) -> Result<Command, NetnsError> {
        let ns = &self.host_or_err(host)?.netns;
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns])
            .arg(cmd.get_program())
            .args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        if let Some(d) = cmd.get_current_dir() {
            c.current_dir(d);
        }
        Ok(c)
    }

    /// Runs `cmd` in host `host` to completion (killed after the run timeout, by default
    /// [`RUN_TIMEOUT`]) and returns its output; a failure exit status is not an error here.
    ///
    /// # Errors
    /// Unknown host, the command cannot be started, or it timed out.
    pub fn run(&self, host: &str, cmd: Command) -> Result<Output, NetnsError> {
        self.run_with_timeout(host, cmd, self.run_timeout)
    }

    /// [`Hosts::run`] with an explicit time limit.
    ///
    /// # Errors
    /// Unknown host, the command cannot be started, or it timed out.
    pub fn run_with_timeout(
        &self,
        host: &str,
        cmd: Command,
        timeout: Duration,
    ) -> Result<Output, NetnsError> {
        self.spawn_with_timeout(host, cmd, timeout)?.wait()
    }

    /// Runs `cmd` in host `host` and returns its stdout; a failure exit status is an error
    /// (with the command line and its stderr).
    ///
    /// # Errors
    /// Unknown host, the command cannot be started, timed out, or failed.
    pub fn run_ok(&self, host: &str, cmd: Command) -> Result<String, NetnsError> {
        let c = self.command(host, &cmd)?;
        let desc = process::describe(&c);
        let out = self.run(host, cmd)?;
        process::check_status(&desc, &out)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Starts `cmd` in host `host` (see [`Proc`]); it is killed after the spawn timeout (by
    /// default [`SPAWN_TIMEOUT`]), when the [`Proc`] is dropped, and at teardown.
    ///
    /// # Errors
    /// Unknown host, or the command cannot be started.
    pub fn spawn(&self, host: &str, cmd: Command) -> Result<Proc, NetnsError> {
        self.spawn_with_timeout(host, cmd, self.spawn_timeout)
    }

    /// [`Hosts::spawn`] with an explicit time limit.
    ///
    /// # Errors
    /// Unknown host, or the command cannot be started.
    pub fn spawn_with_timeout(
        &self,
        host: &str,
        cmd: Command,
        timeout: Duration,
    ) -> Result<Proc, NetnsError> {
        let c = self.command(host, &cmd)?;
        let p = process::spawn(c, timeout)?;
        let mut procs = lock(&self.procs);
        procs.retain(|s| Arc::strong_count(s) > 1);
        procs.push(p.shared());
        Ok(p)
    }

    /// Runs `ip -n <host's namespace> <args>` and returns its stdout.
    ///
    /// # Errors
    /// Unknown host, or the `ip` command failed.
    pub fn ip_in(&self, host: &str, args: &[&str]) -> Result<String, NetnsError> {
        let ns = self.host_or_err(host)?.netns.clone();
        let mut all = vec!["-n", ns.as_str()];
        all.extend_from_slice(args);
        self.ip(&all)
    }

    fn segment(&self, name: &str) -> Result<&Segment, NetnsError> {
        self.segments
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| NetnsError::Unknown {
                kind: "link or bridge",
                name: name.to_string(),
            })
    }

    fn host_dev(&self, host: &str, segment: &str) -> Result<(String, String), NetnsError> {
        let h = self.host_or_err(host)?;
        let i = h.iface(segment).ok_or_else(|| NetnsError::Unknown {
            kind: "interface",
            name: format!("{segment} on host {host}"),
        })?;
        Ok((h.netns.clone(), i.dev.clone()))
    }

    fn set_dev(&self, ns: &str, dev: &str, state: &str) -> R {
        self.ip(&["-n", ns, "link", "set", "dev", dev, state])?;
        Ok(())
    }

    /// Cuts link or bridge `name`: `ip link set <dev> down` for every device of it (both veth
    /// ends of a link; for a bridge, every member's interface, the ports and the bridge).
    ///
    /// # Errors
    /// Unknown name, or an `ip` command failed.
    pub fn link_down(&self, name: &str) -> R {
        let seg = self.segment(name)?;
        for d in seg.devs.iter().rev() {
            self.set_dev(&d.netns, &d.dev, "down")?;
        }
        Ok(())
    }

    /// Restores link or bridge `name` (`ip link set <dev> up` for all its devices). The
    /// addresses stay configured while down, so they are back at once; the carrier takes a
    /// moment, use [`Hosts::wait_carrier`] if it matters.
    ///
    /// # Errors
    /// Unknown name, or an `ip` command failed.
    pub fn link_up(&self, name: &str) -> R {
        let seg = self.segment(name)?;
        for d in &seg.devs {
            self.set_dev(&d.netns, &d.dev, "up")?;
        }
        Ok(())
    }

    /// Takes down only host `host`'s interface on link or bridge `segment` (the peer of a veth
    /// loses its carrier; on a bridge, only this host drops off the segment).
    ///
    /// # Errors
    /// Unknown host or interface, or the `ip` command failed.
    pub fn iface_down(&self, host: &str, segment: &str) -> R {
        let (ns, dev) = self.host_dev(host, segment)?;
        self.set_dev(&ns, &dev, "down")
    }

    /// Brings host `host`'s interface on `segment` up again.
    ///
    /// # Errors
    /// Unknown host or interface, or the `ip` command failed.
    pub fn iface_up(&self, host: &str, segment: &str) -> R {
        let (ns, dev) = self.host_dev(host, segment)?;
        self.set_dev(&ns, &dev, "up")
    }

    /// The state of host `host`'s interface on `segment` (`"lo"` for the loopback).
    ///
    /// # Errors
    /// Unknown host or interface, or `ip link show` failed or printed something unexpected.
    pub fn iface_state(&self, host: &str, segment: &str) -> Result<IfaceState, NetnsError> {
        let (ns, dev) = if segment == "lo" {
            (self.host_or_err(host)?.netns.clone(), "lo".to_string())
        } else {
            self.host_dev(host, segment)?
        };
        let out = self.ip(&["-n", &ns, "-o", "link", "show", "dev", &dev])?;
        parse_link_flags(&out).ok_or_else(|| NetnsError::Parse {
            cmd: format!("ip -n {ns} -o link show dev {dev}"),
            detail: format!("no <FLAGS> in {:?}", out.trim()),
        })
    }

    /// Waits (at most `timeout`) until every device of link or bridge `name` has its carrier.
    ///
    /// # Errors
    /// Unknown name, an `ip` command failed, or the carrier did not come within `timeout`.
    pub fn wait_carrier(&self, name: &str, timeout: Duration) -> R {
        let seg = self.segment(name)?;
        let deadline = std::time::Instant::now() + timeout;
        for d in &seg.devs {
            loop {
                let out = self.ip(&["-n", &d.netns, "-o", "link", "show", "dev", &d.dev])?;
                if parse_link_flags(&out).is_some_and(|s| s.carrier) {
                    break;
                }
                if std::time::Instant::now() >= deadline {
                    return Err(NetnsError::Timeout {
                        cmd: format!("waiting for the carrier of {} in {}", d.dev, d.netns),
                        timeout,
                        stderr: out.trim().to_string(),
                    });
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// Kills the processes started in the hosts (the ones still running), then every process
    /// left in the namespaces, then deletes the namespaces (which deletes their veths and
    /// bridges). Returns the errors met on the way. [`Drop`] calls it and prints them.
    pub fn teardown(mut self) -> Vec<NetnsError> {
        self.teardown_inner()
    }

    fn teardown_inner(&mut self) -> Vec<NetnsError> {
        let procs = std::mem::take(&mut *lock(&self.procs));
        for p in procs {
            p.kill();
        }
        let mut errors = Vec::new();
        for ns in std::mem::take(&mut self.created).iter().rev() {
            if let Err(e) = kill_and_delete(ns) {
                errors.push(e);
            }
        }
        errors
    }
}

/// `Result<(), NetnsError>`.
type R = Result<(), NetnsError>;

impl Drop for Hosts {
    fn drop(&mut self) {
        for e in self.teardown_inner() {
            let _ = writeln!(
                std::io::stderr(),
                "rdmx-tests: teardown of {}: {e}",
                self.run_id
            );
        }
    }
}

/// Parses the `<FLAG,FLAG>` of an `ip -o link show` line.
fn parse_link_flags(out: &str) -> Option<IfaceState> {
    let start = out.find('<')?;
    let end = start + out[start..].find('>')?;
    let flags: Vec<&str> = out[start + 1..end].split(',').collect();
    Some(IfaceState {
        admin_up: flags.contains(&"UP"),
        carrier: flags.contains(&"LOWER_UP"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_stay_in_the_benchmarking_range() {
        assert_eq!(segment_addr(0, 1), Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(segment_addr(3, 2), Ipv4Addr::new(198, 18, 3, 2));
        assert_eq!(segment_addr(255, 254), Ipv4Addr::new(198, 18, 255, 254));
        assert_eq!(segment_addr(256, 1), Ipv4Addr::new(198, 19, 0, 1));
        assert_eq!(segment_addr(511, 9), Ipv4Addr::new(198, 19, 255, 9));
        for k in [0, 100, 256, 511] {
            // 198.18.0.0/15
            let o = segment_addr(k, 1).octets();
            assert!(o[0] == 198 && (o[1] & 0xFE) == 18, "{o:?}");
        }
    }

    #[test]
    fn owner_pid_parses_only_our_names() {
        assert_eq!(owner_pid("rdmx-123-0-h1"), Some(123));
        assert_eq!(owner_pid("rdmx-123-p4"), Some(123));
        assert_eq!(owner_pid("rdmx-123-"), None);
        assert_eq!(owner_pid("rdmx-abc-0-h1"), None);
        assert_eq!(owner_pid("rdmx--0"), None);
        assert_eq!(owner_pid("other-123-0"), None);
        assert_eq!(owner_pid("rdmx-probe-x"), None);
    }

    #[test]
    fn netns_list_and_link_flags_parse() {
        assert_eq!(
            parse_netns_list("a (id: 1)\nrdmx-1-0-h1\n\n"),
            vec!["a".to_string(), "rdmx-1-0-h1".to_string()]
        );
        let up = "2: ab@if2: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue";
        assert_eq!(
            parse_link_flags(up),
            Some(IfaceState {
                admin_up: true,
                carrier: true
            })
        );
        let nc = "2: ab@if2: <NO-CARRIER,BROADCAST,MULTICAST,UP> mtu 1500";
        assert_eq!(
            parse_link_flags(nc),
            Some(IfaceState {
                admin_up: true,
                carrier: false
            })
        );
        assert_eq!(parse_link_flags("garbage"), None);
    }

    #[test]
    fn validation_catches_mistakes() {
        let base = || Topology::new().host("a").host("b");
        let err = |t: Topology| t.validate().unwrap_err().to_string();
        assert!(base().link(Link::new("ab", "a", "b")).validate().is_ok());
        assert!(err(base().link(Link::new("ab", "a", "c"))).contains("unknown host \"c\""));
        assert!(err(base().link(Link::new("ab", "a", "a"))).contains("to itself"));
        assert!(err(base().link(Link::new("a", "a", "b"))).contains("used twice"));
        assert!(err(base().host("a")).contains("used twice"));
        assert!(err(base().host("x.y")).contains("must be"));
        assert!(err(base().host("lo")).contains("must be"));
        assert!(err(base().host("abcdefghijklm")).contains("must be"));
        assert!(err(base().link(Link::new("ab", "a", "b").mtu(10))).contains("MTU"));
        assert!(err(base().bridge(Bridge::new("br", ["a", "a"]))).contains("twice"));
        assert!(err(base().bridge(Bridge::new("br", ["a"]).in_host("b"))).contains("not a member"));
        assert!(
            base()
                .bridge(Bridge::new("br", ["a", "b"]).in_host("a").mtu(9000))
                .validate()
                .is_ok()
        );
    }
}
