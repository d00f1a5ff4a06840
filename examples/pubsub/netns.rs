//! Network namespaces for `bench --netns`.

use super::*;

/// The namespaces of a `--netns` run (see the module's doc), deleted when dropped.
#[derive(Debug)]
pub(crate) struct Netns {
    /// `rdmx-<pid>-ps`: every namespace's name starts with it and a `-`.
    pub(crate) prefix: String,
    /// Namespaces created, the switch's first.
    pub(crate) created: Vec<String>,
    /// Per participant (publishers first): its namespace and address.
    pub(crate) hosts: Vec<(String, String)>,
    /// Deletes the namespaces if this process dies first (when its stdin closes).
    pub(crate) reaper: Option<Child>,
    pub(crate) reaper_stdin: Option<ChildStdin>,
}

/// `ip ARGS`: its stdout, or what went wrong.
pub(crate) fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `ip` (iproute2): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`ip {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The effective uid, from `/proc/self/status`.
pub(crate) fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

pub(crate) fn list_netns() -> Result<Vec<String>, String> {
    Ok(ip(&["netns", "list"])?
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// The pid in a namespace name `rdmx-<pid>-ps-...` (a namespace of this program's runs).
pub(crate) fn owner_pid(ns: &str) -> Option<u32> {
    let (pid, tail) = ns.strip_prefix("rdmx-")?.split_once("-ps-")?;
    if tail.is_empty() || pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// Kills what still runs in `ns`, then deletes it (a few tries).
pub(crate) fn delete_netns(ns: &str) -> Result<(), String> {
    let mut last = String::new();
    for attempt in 0..4 {
        if let Ok(pids) = ip(&["netns", "pids", ns]) {
            for pid in pids.split_whitespace() {
                let _ = Command::new("kill")
                    .args(["-KILL", pid])
                    .stderr(Stdio::null())
                    .status();
            }
        }
        match ip(&["netns", "del", ns]) {
            Ok(_) => return Ok(()),
            Err(_) if !std::path::Path::new("/run/netns").join(ns).exists() => return Ok(()),
            Err(e) => last = e,
        }
        thread::sleep(Duration::from_millis(50 << attempt));
    }
    Err(last)
}

/// `bench-reap --prefix rdmx-<pid>-ps`: once stdin closes (the run ended, or died), deletes
/// the namespaces left with that prefix.
pub(crate) fn reap(args: &[String]) -> Result<(), String> {
    let [flag, prefix] = args else {
        return Err("bench-reap --prefix rdmx-<pid>-ps".into());
    };
    if flag != "--prefix" || owner_pid(&format!("{prefix}-x")).is_none() {
        return Err(format!(
            "bench-reap: {prefix:?} is not a prefix of this program's"
        ));
    }
    let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
    let ours = format!("{prefix}-");
    for ns in list_netns()?.iter().filter(|n| n.starts_with(&ours)) {
        if let Err(e) = delete_netns(ns) {
            eprintln!("pubsub: deleting namespace {ns}: {e}");
        }
    }
    Ok(())
}

impl Netns {
    /// Namespaces for `pubs` publishers and `subs` subscribers, and the reaper.
    pub(crate) fn create(pubs: usize, subs: usize, launcher: &Launcher) -> Result<Self, String> {
        match effective_uid() {
            Some(0) => {}
            Some(uid) => {
                return Err(format!(
                    "--netns creates network namespaces and needs root (effective uid {uid}); \
                     --procs runs the same processes on this host's device"
                ));
            }
            None => return Err("--netns: cannot read the effective uid".into()),
        }
        let prefix = format!("rdmx-{}-ps", std::process::id());
        // Those of runs that died before the reaper could delete them.
        for ns in list_netns()? {
            if let Some(pid) = owner_pid(&ns)
                && pid != std::process::id()
                && !std::path::Path::new(&format!("/proc/{pid}")).exists()
            {
                eprintln!("pubsub: deleting namespace {ns} of a run that died");
                delete_netns(&ns)?;
            }
        }
        let mut reaper = launcher
            .command(
                None,
                &["bench-reap".into(), "--prefix".into(), prefix.clone()],
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            // (Not ours: Ctrl-C leaves it to clean up.)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting the namespace reaper: {e}"))?;
        let reaper_stdin = reaper.stdin.take();
        let mut me = Self {
            prefix,
            created: Vec::new(),
            hosts: Vec::new(),
            reaper: Some(reaper),
            reaper_stdin,
        };
        // (On an error, dropping `me` deletes what was made.)
        me.build(pubs, subs)?;
        Ok(me)
    }

    pub(crate) fn add_netns(&mut self, name: &str) -> Result<String, String> {
        let ns = format!("{}-{name}", self.prefix);
        ip(&["netns", "add", &ns])?;
        self.created.push(ns.clone());
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub(crate) fn build(&mut self, pubs: usize, subs: usize) -> Result<(), String> {
        let sw = self.add_netns("sw")?;
        ip(&[
            "-n",
            &sw,
            "link",
            "add",
            "br0",
            "type",
            "bridge",
            "mcast_snooping",
            "0",
        ])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        for k in 0..pubs + subs {
            let name = if k < pubs {
                format!("p{k}")
            } else {
                format!("s{}", k - pubs)
            };
            let ns = self.add_netns(&name)?;
            let port = format!("v{k}");
            // Created inside the namespaces: the host's never sees them.
            ip(&[
                "-n", &ns, "link", "add", "eth0", "type", "veth", "peer", "name", &port, "netns",
                &sw,
            ])?;
            ip(&["-n", &sw, "link", "set", &port, "master", "br0", "up"])?;
            let addr = format!("10.77.0.{}", k + 1);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "route", "add", "224.0.0.0/4", "dev", "eth0"])?;
            self.hosts.push((ns, addr));
        }
        Ok(())
    }

    /// Participant `k`'s namespace and address.
    pub(crate) fn host(&self, k: usize) -> Result<(&str, &str), String> {
        self.hosts
            .get(k)
            .map(|(ns, a)| (ns.as_str(), a.as_str()))
            .ok_or_else(|| format!("no namespace for participant {k}"))
    }

    pub(crate) fn teardown(&mut self) {
        while let Some(ns) = self.created.pop() {
            if let Err(e) = delete_netns(&ns) {
                eprintln!("pubsub: deleting namespace {ns}: {e}");
            }
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.teardown();
        drop(self.reaper_stdin.take());
        if let Some(mut r) = self.reaper.take() {
            let _ = r.wait();
        }
    }
}
