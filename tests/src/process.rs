//! Bounded child processes: every process started here has a deadline after which it is
//! killed (with its whole process group), its output is drained by background threads (so a
//! chatty child can never block on a full pipe), and waiting for it is bounded too.

use std::fmt;
use std::io::Read;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crate::netns::NetnsError;

/// How long [`Proc::wait`] waits for the output pipes to close once the process has exited (a
/// grandchild that inherited them may keep them open).
const PIPE_GRACE: Duration = Duration::from_secs(2);
/// How long killing a process may take before we stop waiting for it to be reaped.
const KILL_GRACE: Duration = Duration::from_secs(5);
/// Longest sleep between two checks of the reaper thread.
const MAX_POLL: Duration = Duration::from_millis(20);

/// Locks `m`, ignoring poisoning (a panicking test must not make teardown panic too).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A command line, for messages.
pub(crate) fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Sends SIGKILL to the process group `pgid` (our children lead their own group) using the
/// `kill` command (this crate has no `unsafe`, hence no `kill(2)`).
pub(crate) fn kill_group(pgid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Sends SIGKILL to the process `pid` (not a child of ours).
pub(crate) fn kill_pid(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// An output pipe drained into memory by a background thread.
#[derive(Debug, Default)]
struct Pipe {
    /// Bytes read so far, and whether the pipe has closed.
    data: Mutex<(Vec<u8>, bool)>,
    cv: Condvar,
}

impl Pipe {
    fn drain(self: Arc<Self>, mut from: impl Read + Send + 'static) {
        let spawned = thread::Builder::new()
            .name("rdmx-tests-pipe".into())
            .spawn({
                let pipe = Arc::clone(&self);
                move || {
                    let mut buf = [0u8; 8192];
                    loop {
                        match from.read(&mut buf) {
                            Ok(0) => break,
                            Ok(n) => {
                                lock(&pipe.data).0.extend_from_slice(&buf[..n]);
                                pipe.cv.notify_all();
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                            Err(_) => break,
                        }
                    }
                    lock(&pipe.data).1 = true;
                    pipe.cv.notify_all();
                }
            });
        if spawned.is_err() {
            lock(&self.data).1 = true;
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        lock(&self.data).0.clone()
    }

    /// Waits until the pipe has closed or `deadline` passes.
    fn wait_closed(&self, deadline: Instant) {
        let mut g = lock(&self.data);
        while !g.1 {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            g = self
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

#[derive(Debug)]
struct State {
    child: Child,
    status: Option<ExitStatus>,
    /// `try_wait` failed: the reaper gave up (the process is killed first).
    reap_error: Option<String>,
    /// Killed because its deadline passed.
    timed_out: bool,
    /// Killed on request ([`Proc::kill`] or teardown).
    killed: bool,
}

/// What a [`Proc`] handle and its owner (e.g. `Hosts`) share.
#[derive(Debug)]
pub(crate) struct Shared {
    cmd: String,
    pid: u32,
    timeout: Duration,
    deadline: Instant,
    state: Mutex<State>,
    cv: Condvar,
    stdout: Arc<Pipe>,
    stderr: Arc<Pipe>,
}

impl Shared {
    fn finished(&self) -> bool {
        let st = lock(&self.state);
        st.status.is_some() || st.reap_error.is_some()
    }

    /// Kills the process (group) unless it has exited, and waits (bounded) until it is reaped.
    pub(crate) fn kill(&self) {
        {
            let mut st = lock(&self.state);
            if st.status.is_some() || st.reap_error.is_some() {
                return;
            }
            st.killed = true;
            kill_group(self.pid);
            let _ = st.child.kill();
        }
        self.wait_reaped(Instant::now() + KILL_GRACE);
    }

    /// Waits until the reaper has recorded an exit status (or `until` passes).
    fn wait_reaped(&self, until: Instant) -> bool {
        let mut st = lock(&self.state);
        loop {
            if st.status.is_some() || st.reap_error.is_some() {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            st = self
                .cv
                .wait_timeout(st, until - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// The reaper: polls for the exit status, kills the process group at the deadline.
    fn reap(&self) {
        let mut pause = Duration::from_millis(1);
        loop {
            {
                let mut st = lock(&self.state);
                match st.child.try_wait() {
                    Ok(Some(s)) => {
                        st.status = Some(s);
                        break;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        kill_group(self.pid);
                        let _ = st.child.kill();
                        st.reap_error = Some(e.to_string());
                        break;
                    }
                }
                if !st.timed_out && Instant::now() >= self.deadline {
                    st.timed_out = true;
                    kill_group(self.pid);
                    let _ = st.child.kill();
                }
            }
            thread::sleep(pause);
            pause = (pause * 2).min(MAX_POLL);
        }
        self.cv.notify_all();
    }
}

/// A child process with a deadline, started by [`spawn`] (or `Hosts::spawn`).
///
/// Its stdout and stderr are captured (read them with [`Proc::stdout_now`],
/// [`Proc::wait_stdout_line`] or [`Proc::wait`]); stdin is `/dev/null`. It leads its own
/// process group, and the whole group is killed when the deadline passes, on [`Proc::kill`],
/// and when the handle is dropped.
pub struct Proc {
    shared: Arc<Shared>,
}

impl fmt::Debug for Proc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proc")
            .field("cmd", &self.shared.cmd)
            .field("pid", &self.shared.pid)
            .field("timeout", &self.shared.timeout)
            .finish_non_exhaustive()
    }
}

/// Starts `cmd` (stdin null, stdout and stderr captured, in a new process group); it is killed
/// after `timeout`.
///
/// # Errors
/// [`NetnsError::Spawn`] when the program cannot be started.
pub fn spawn(mut cmd: Command, timeout: Duration) -> Result<Proc, NetnsError> {
    use std::os::unix::process::CommandExt as _;
    let desc = describe(&cmd);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn().map_err(|source| NetnsError::Spawn {
        cmd: desc.clone(),
        source,
    })?;
    let stdout = Arc::new(Pipe::default());
    let stderr = Arc::new(Pipe::default());
    if let Some(o) = child.stdout.take() {
        Arc::clone(&stdout).drain(o);
    }
    if let Some(e) = child.stderr.take() {
        Arc::clone(&stderr).drain(e);
    }
    let shared = Arc::new(Shared {
        cmd: desc,
        pid: child.id(),
        timeout,
        deadline: Instant::now() + timeout,
        state: Mutex::new(State {
            child,
            status: None,
            reap_error: None,
            timed_out: false,
            killed: false,
        }),
        cv: Condvar::new(),
        stdout,
        stderr,
    });
    let reaper = Arc::clone(&shared);
    let spawned = thread::Builder::new()
        .name("rdmx-tests-reaper".into())
        .spawn(move || reaper.reap());
    if let Err(e) = spawned {
        // Without a reaper nothing would enforce the deadline: do not let it run.
        shared.kill_without_reaper();
        return Err(NetnsError::Spawn {
            cmd: shared.cmd.clone(),
            source: e,
        });
    }
    Ok(Proc { shared })
}

impl Shared {
    fn kill_without_reaper(&self) {
        let mut st = lock(&self.state);
        kill_group(self.pid);
        let _ = st.child.kill();
        let _ = st.child.wait();
    }
}

/// Runs `cmd` to completion (killed after `timeout`) and returns its output; a non-zero exit
/// status is not an error here.
///
/// # Errors
/// [`NetnsError::Spawn`] or [`NetnsError::Timeout`].
pub fn run(cmd: Command, timeout: Duration) -> Result<Output, NetnsError> {
    spawn(cmd, timeout)?.wait()
}

/// Runs `cmd` to completion and returns its stdout; a non-zero exit status is an error.
///
/// # Errors
/// [`NetnsError::Spawn`], [`NetnsError::Timeout`] or [`NetnsError::Command`].
pub fn run_ok(cmd: Command, timeout: Duration) -> Result<String, NetnsError> {
    let desc = describe(&cmd);
    let out = run(cmd, timeout)?;
    check_status(&desc, &out)?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `Ok` when `out` has a success status, else [`NetnsError::Command`] naming `cmd`.
pub(crate) fn check_status(cmd: &str, out: &Output) -> Result<(), NetnsError> {
    if out.status.success() {
        Ok(())
    } else {
        Err(NetnsError::Command {
            cmd: cmd.to_string(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

impl Proc {
    /// The shared state, for owners that must be able to kill the process.
    pub(crate) fn shared(&self) -> Arc<Shared> {
        Arc::clone(&self.shared)
    }

    /// Process id (of the program itself: `ip netns exec` execs it in place).
    pub fn id(&self) -> u32 {
        self.shared.pid
    }

    /// The command line, for messages.
    pub fn command(&self) -> &str {
        &self.shared.cmd
    }

    /// Everything the process has written to stdout so far.
    pub fn stdout_now(&self) -> String {
        String::from_utf8_lossy(&self.shared.stdout.snapshot()).into_owned()
    }

    /// Everything the process has written to stderr so far.
    pub fn stderr_now(&self) -> String {
        String::from_utf8_lossy(&self.shared.stderr.snapshot()).into_owned()
    }

    /// The exit status, if the process has exited.
    pub fn try_status(&self) -> Option<ExitStatus> {
        lock(&self.shared.state).status
    }

    /// Waits (at most `timeout`) for the first complete line on stdout and returns it without
    /// the line ending.
    ///
    /// # Errors
    /// [`NetnsError::Timeout`] when no line arrives in time (the process keeps running);
    /// [`NetnsError::Command`] when stdout closes (usually: the process exited) first.
    pub fn wait_stdout_line(&self, timeout: Duration) -> Result<String, NetnsError> {
        let deadline = Instant::now() + timeout;
        let pipe = &self.shared.stdout;
        let mut g = lock(&pipe.data);
        loop {
            if let Some(end) = g.0.iter().position(|&b| b == b'\n') {
                let line = String::from_utf8_lossy(&g.0[..end]);
                return Ok(line.trim_end_matches('\r').to_string());
            }
            if g.1 {
                drop(g);
                // Let the reaper record the status for the message.
                self.shared.wait_reaped(Instant::now() + PIPE_GRACE);
                return Err(NetnsError::Command {
                    cmd: self.shared.cmd.clone(),
                    status: self
                        .try_status()
                        .map_or_else(|| "stdout closed".to_string(), |s| s.to_string()),
                    stderr: self.stderr_now().trim().to_string(),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(NetnsError::Timeout {
                    cmd: format!("{} (waiting for a line on stdout)", self.shared.cmd),
                    timeout,
                    stderr: self.stderr_now().trim().to_string(),
                });
            }
            g = pipe
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Waits for the process to exit (it is killed when its deadline passes) and returns its
    /// status and output. Can be called again; it then returns the same result.
    ///
    /// # Errors
    /// [`NetnsError::Timeout`] when it had to be killed at its deadline.
    pub fn wait(&self) -> Result<Output, NetnsError> {
        let s = &self.shared;
        // The reaper kills the process at the deadline; give the kill some time to work.
        let reaped = s.wait_reaped(s.deadline + KILL_GRACE);
        let pipes_until = Instant::now() + PIPE_GRACE;
        s.stdout.wait_closed(pipes_until);
        s.stderr.wait_closed(pipes_until);
        let st = lock(&s.state);
        let stderr = s.stderr.snapshot();
        if st.timed_out || !reaped {
            return Err(NetnsError::Timeout {
                cmd: s.cmd.clone(),
                timeout: s.timeout,
                stderr: String::from_utf8_lossy(&stderr).trim().to_string(),
            });
        }
        match (st.status, &st.reap_error) {
            (Some(status), _) => Ok(Output {
                status,
                stdout: s.stdout.snapshot(),
                stderr,
            }),
            (None, e) => Err(NetnsError::Spawn {
                cmd: s.cmd.clone(),
                source: std::io::Error::other(format!(
                    "waiting for the process failed: {}",
                    e.as_deref().unwrap_or("unknown error")
                )),
            }),
        }
    }

    /// Kills the process (and its process group) unless it has exited already, and reaps it.
    /// Returns whether it was still running.
    pub fn kill(&self) -> bool {
        let running = !self.shared.finished();
        self.shared.kill();
        running
    }

    /// Whether the process was killed by [`Proc::kill`] or a teardown (rather than exiting on
    /// its own or at its deadline).
    pub fn was_killed(&self) -> bool {
        lock(&self.shared.state).killed
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.shared.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_captures_output_and_status() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo out; echo err >&2; exit 3"]);
        let out = run(c, Duration::from_secs(10)).unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
    }

    #[test]
    fn run_ok_names_the_command_on_failure() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo nope >&2; exit 1"]);
        let e = run_ok(c, Duration::from_secs(10)).unwrap_err().to_string();
        assert!(e.contains("sh -c") && e.contains("nope"), "{e}");
    }

    #[test]
    fn timeout_kills_the_whole_group() {
        let mut c = Command::new("sh");
        // A grandchild holding stdout open must not make the wait hang either.
        c.args(["-c", "sleep 30 & echo started; sleep 30"]);
        let t0 = Instant::now();
        let p = spawn(c, Duration::from_millis(300)).unwrap();
        assert_eq!(
            p.wait_stdout_line(Duration::from_secs(5)).unwrap(),
            "started"
        );
        let e = p.wait().unwrap_err();
        assert!(matches!(e, NetnsError::Timeout { .. }), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn kill_and_drop_stop_the_process() {
        let mut c = Command::new("sleep");
        c.arg("30");
        let p = spawn(c, Duration::from_secs(60)).unwrap();
        assert!(p.try_status().is_none());
        assert!(p.kill());
        assert!(p.was_killed());
        assert!(p.try_status().is_some());
        assert!(!p.kill());
    }

    #[test]
    fn missing_program_is_a_spawn_error() {
        let c = Command::new("/nonexistent/rdmx-tests-no-such-program");
        let e = run(c, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, NetnsError::Spawn { .. }), "{e}");
    }
}
