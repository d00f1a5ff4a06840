//! Child processes: the roles run by `bench --procs`.

use super::*;

/// `bench-pub ...`, `bench-sub ...` or `bench-reap ...` (the children of `bench --procs`).
pub(crate) fn child_main(args: &[String]) -> Result<(), String> {
    let (cmd, rest) = args.split_first().ok_or("no subcommand")?;
    let role = match cmd.as_str() {
        "bench-pub" => Role::Pub,
        "bench-sub" => Role::Sub,
        "bench-reap" => return reap(rest),
        other => return Err(format!("{other:?} is no bench subcommand")),
    };
    let ro = RoleOptions::parse(rest)?;
    let ctl = Arc::new(Control::default());
    // The parent says GO and STOP; its end (stdin closing) stops us too.
    let c = ctl.clone();
    thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            match line.as_deref().map(str::trim) {
                Ok("GO") => c.go.store(true, Ordering::Release),
                Ok("STOP") | Err(_) => break,
                Ok(_) => {}
            }
        }
        c.stop.store(true, Ordering::Release);
    });
    let done = Arc::new(AtomicBool::new(false));
    let (c, d) = (ctl.clone(), done.clone());
    thread::spawn(move || {
        let mut last = Instant::now();
        let mut ended = false;
        while !d.load(Ordering::Acquire) {
            thread::sleep(Duration::from_millis(5));
            if c.ready.load(Ordering::Acquire) == 0 {
                continue;
            }
            // (A parent gone is seen on stdin.)
            if last.elapsed() >= PROGRESS_EVERY {
                last = Instant::now();
                let n = c.count.load(Ordering::Relaxed);
                let _ = writeln!(std::io::stdout().lock(), "PROGRESS {n}");
            }
            if !ended && c.ended.load(Ordering::Acquire) {
                ended = true;
                let n = c.count.load(Ordering::Relaxed);
                let _ = writeln!(std::io::stdout().lock(), "PROGRESS {n}\nENDED");
            }
        }
    });
    let r = run_role(role, &ro, &ctl, |id| {
        let _ = writeln!(std::io::stdout().lock(), "READY {id}");
    });
    done.store(true, Ordering::Release);
    let line = format!("RESULT {}", r?.encode());
    writeln!(std::io::stdout().lock(), "{line}").map_err(|e| format!("writing the result: {e}"))
}

/// How to start this program as a child of `bench`.
#[derive(Debug, Clone)]
pub(crate) struct Launcher {
    pub(crate) exe: PathBuf,
    /// Arguments before the child's own (the test harness's, to reach its entry).
    pub(crate) harness_args: Vec<String>,
    /// Whether the child's arguments go in [`CHILD_ENV`] (the test harness) rather than on
    /// its command line.
    pub(crate) via_env: bool,
}

impl Launcher {
    pub(crate) fn this_program() -> Result<Self, String> {
        Ok(Self {
            exe: std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?,
            harness_args: Vec::new(),
            via_env: false,
        })
    }

    /// The command running the child `args`, in network namespace `ns` when given.
    pub(crate) fn command(&self, ns: Option<&str>, args: &[String]) -> Command {
        let mut c = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.exe);
                c
            }
            None => Command::new(&self.exe),
        };
        c.args(&self.harness_args);
        if self.via_env {
            c.env(CHILD_ENV, args.join("\n"));
        } else {
            c.args(args);
        }
        c
    }
}

/// A publisher or subscriber of the run: a thread of this process, or a child process (and
/// the thread reading its output).
#[derive(Debug)]
pub(crate) struct Participant {
    pub(crate) name: String,
    pub(crate) ctl: Arc<Control>,
    /// The thread playing the role, or reading the child's lines; its result.
    pub(crate) thread: Option<JoinHandle<Result<Outcome, String>>>,
    pub(crate) child: Option<Child>,
    pub(crate) stdin: Option<ChildStdin>,
}

impl Participant {
    pub(crate) fn thread(name: String, role: Role, ro: RoleOptions) -> Result<Self, String> {
        let ctl = Arc::new(Control::default());
        let c = ctl.clone();
        let thread = thread::Builder::new()
            .name(name.clone())
            .spawn(move || run_role(role, &ro, &c, |_| {}))
            .map_err(|e| format!("starting {name}: {e}"))?;
        Ok(Self {
            name,
            ctl,
            thread: Some(thread),
            child: None,
            stdin: None,
        })
    }

    pub(crate) fn process(name: String, mut cmd: Command) -> Result<Self, String> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {name}: {e}"))?;
        let stdin = child.stdin.take();
        let ctl = Arc::new(Control::default());
        let mut me = Self {
            name,
            ctl: ctl.clone(),
            thread: None,
            child: Some(child),
            stdin,
        };
        let out = me
            .child
            .as_mut()
            .and_then(|c| c.stdout.take())
            .ok_or_else(|| format!("{}: no stdout", me.name))?;
        me.thread = Some(
            thread::Builder::new()
                .name(format!("{} reader", me.name))
                .spawn(move || read_child(out, &ctl))
                .map_err(|e| format!("starting {}'s reader: {e}", me.name))?,
        );
        Ok(me)
    }

    pub(crate) fn say(&mut self, what: &str) {
        if let Some(s) = &mut self.stdin {
            // (A child that ended early tells why when it is joined.)
            let _ = writeln!(s, "{what}");
        }
    }

    pub(crate) fn go(&mut self) {
        self.ctl.go.store(true, Ordering::Release);
        self.say("GO");
    }

    pub(crate) fn stop(&mut self) {
        self.ctl.stop.store(true, Ordering::Release);
        self.say("STOP");
    }

    pub(crate) fn count(&self) -> u64 {
        self.ctl.count.load(Ordering::Relaxed)
    }

    pub(crate) fn ready(&self) -> bool {
        self.ctl.ready.load(Ordering::Acquire) != 0
    }

    pub(crate) fn finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Whether it did its part, or will not.
    pub(crate) fn done(&self) -> bool {
        self.ctl.ended.load(Ordering::Acquire) || self.finished()
    }

    /// Its result, waiting until `deadline` for its end (then killing a child; a thread is
    /// left behind).
    pub(crate) fn join(mut self, deadline: Instant) -> Result<Outcome, String> {
        while !self.finished() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        if !self.finished() {
            match &mut self.child {
                // (Its output ends: the reader's too.)
                Some(c) => {
                    let _ = c.kill();
                }
                None => return Err(format!("{} did not end", self.name)),
            }
        }
        let r = match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err("panicked".into()),
            None => Err("never started".into()),
        };
        drop(self.stdin.take());
        let status = self.child.take().map(|mut c| c.wait());
        r.map_err(|e| match status {
            Some(Ok(s)) => format!("{} ({s}): {e}", self.name),
            _ => format!("{}: {e}", self.name),
        })
    }
}

impl Drop for Participant {
    fn drop(&mut self) {
        // (Only on an early return: `join` takes the child.)
        self.ctl.stop.store(true, Ordering::Release);
        drop(self.stdin.take());
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Reads a child's lines: `READY`, `PROGRESS`, `ENDED` and its `RESULT` (other lines, such
/// as the test harness's, are skipped).
pub(crate) fn read_child(out: ChildStdout, ctl: &Control) -> Result<Outcome, String> {
    let mut result = None;
    for line in BufReader::new(out).lines() {
        let line = line.map_err(|e| format!("reading its output: {e}"))?;
        if let Some(id) = line.strip_prefix("READY ") {
            let id: u64 = number("READY", id.trim())?;
            ctl.ready.store(id + 1, Ordering::Release);
        } else if let Some(n) = line.strip_prefix("PROGRESS ") {
            ctl.count
                .store(number("PROGRESS", n.trim())?, Ordering::Relaxed);
        } else if line == "ENDED" {
            ctl.ended.store(true, Ordering::Release);
        } else if let Some(r) = line.strip_prefix("RESULT ") {
            result = Some(Outcome::decode(r)?);
        }
    }
    result.ok_or_else(|| "ended without a result".into())
}
