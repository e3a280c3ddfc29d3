//! Running a program with a cleared environment, a given stdin and a hard
//! deadline, collecting everything it printed.
use std::{
    fmt,
    io::{Read, Write},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use crate::{err, Result};

/// Every program the harness runs is killed after this long.
pub const TIMEOUT: Duration = Duration::from_mins(1);

/// `PATH` of every program the harness runs (plugins run `iptables`, `tc`, ...).
pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Most the harness reads of one output stream.
const MAX_OUTPUT: u64 = 32 << 20;

/// What a finished program did.
#[derive(Clone, Debug)]
pub struct Output {
    /// The command line, for messages.
    pub what: String,
    /// Exit code; `None` when a signal ended it.
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn success(&self) -> bool {
        self.status == Some(0)
    }
}

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = self
            .status
            .map_or_else(|| "a signal".to_string(), |c| format!("exit code {c}"));
        write!(
            f,
            "`{}` ended with {status}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.what,
            self.stdout.trim_end(),
            self.stderr.trim_end()
        )
    }
}

/// Kernel features the plugin is told to do without (`tcx`), passed through.
pub const DISABLE_FEATURES: &str = "SLUICE_DISABLE_FEATURES";
/// `SLUICE_TIMING`: passed through to every program (see the plugin's `timing`).
pub const TIMING: &str = "SLUICE_TIMING";

/// The command `run` and `spawn` start: `program args` with only `PATH` and
/// `env` in its environment, in `netns` through `nsenter --net=` when given
/// (`nsenter` without `--fork` execs, so the process is `program` itself once
/// it runs); with its description for messages.
fn command(
    netns: Option<&Path>,
    program: &Path,
    args: &[&str],
    env: &[(String, String)],
) -> (Command, String) {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net={}", ns.display()))
                .arg("--")
                .arg(program);
            c
        }
        None => Command::new(program),
    };
    cmd.args(args).env_clear().env("PATH", PATH);
    // The kernel fallbacks under test (see cni-plugin/src/datapath/features.rs):
    // a run with SLUICE_DISABLE_FEATURES set passes it to every program.
    if let Ok(v) = std::env::var(DISABLE_FEATURES) {
        cmd.env(DISABLE_FEATURES, v);
    }
    // Where the plugin's steps go (cni-plugin/src/timing.rs), for profiling
    // a bench or test run.
    if let Some(v) = std::env::var_os(TIMING) {
        cmd.env(TIMING, v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let what = {
        let vars: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let ns = netns.map_or_else(String::new, |n| format!("nsenter --net={} ", n.display()));
        format!(
            "{} {ns}{} {}",
            vars.join(" "),
            program.display(),
            args.join(" ")
        )
        .trim()
        .to_string()
    };
    (cmd, what)
}

/// Runs `program args` with only `PATH` and `env` in its environment, `stdin` on
/// its standard input, and kills it after [`TIMEOUT`]. In `netns` (a path such as
/// `/run/netns/x`) when given, through `nsenter --net=` so that the mount
/// namespace, and with it bpffs, stays the test's.
pub fn run(
    netns: Option<&Path>,
    program: &Path,
    args: &[&str],
    env: &[(String, String)],
    stdin: &[u8],
) -> Result<Output> {
    let (mut cmd, what) = command(netns, program, args, env);
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| err!("cannot start `{what}`: {e}"))?;

    // stdin, stdout and stderr each on their own thread: no pipe can fill up and
    // stall the child while this thread waits for it with a deadline.
    let input = stdin.to_vec();
    let mut child_stdin = child.stdin.take();
    let writer = thread::spawn(move || {
        if let Some(s) = child_stdin.as_mut() {
            // A child that stops reading early (oversized input) breaks the pipe.
            let _ = s.write_all(&input);
        }
        drop(child_stdin);
    });
    let [out_thread, err_thread] = read_output(&mut child);

    let (status, timed_out) = wait_until(&mut child, TIMEOUT, &what)?;
    let _ = writer.join();
    let out = Output {
        what,
        status,
        stdout: out_thread.join().unwrap_or_default(),
        stderr: err_thread.join().unwrap_or_default(),
    };
    if timed_out {
        return Err(err!(
            "killed after {}s without finishing: {out}",
            TIMEOUT.as_secs()
        ));
    }
    Ok(out)
}

/// Reads the child's stdout and stderr, each on a thread of its own (at most
/// [`MAX_OUTPUT`] bytes each), so that no pipe fills up and stalls it.
fn read_output(child: &mut Child) -> [thread::JoinHandle<String>; 2] {
    let read = |s: Option<Box<dyn Read + Send>>| {
        thread::spawn(move || {
            let mut out = Vec::new();
            if let Some(s) = s {
                let _ = s.take(MAX_OUTPUT).read_to_end(&mut out);
            }
            String::from_utf8_lossy(&out).into_owned()
        })
    };
    [
        read(
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ),
        read(
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ),
    ]
}

/// Asks `child` to end (SIGTERM) and waits for it at most `timeout`, then
/// kills it: its exit code (`None` when a signal ended it).
pub fn terminate(child: &mut Child, timeout: Duration, what: &str) -> Result<Option<i32>> {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    wait_until(child, timeout, what).map(|(code, _)| code)
}

/// Waits for `child` to end, at most `timeout` (then kills it): its exit code
/// (`None` when a signal ended it) and whether the deadline killed it. A thread
/// blocks in `waitid(WEXITED | WNOWAIT)`, which returns the moment the child
/// ends without reaping it (so its pid cannot be reused before a kill here):
/// no polling interval adds to the time a run takes, which the benchmarks
/// measure.
fn wait_until(child: &mut Child, timeout: Duration, what: &str) -> Result<(Option<i32>, bool)> {
    use nix::{
        errno::Errno,
        sys::wait::{waitid, Id, WaitPidFlag},
        unistd::Pid,
    };
    let pid = i32::try_from(child.id()).map_err(|_| err!("`{what}` has pid {}", child.id()))?;
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        while let Err(Errno::EINTR) = waitid(
            Id::Pid(Pid::from_raw(pid)),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT,
        ) {}
        let _ = tx.send(());
    });
    let timed_out = rx.recv_timeout(timeout).is_err();
    if timed_out {
        let _ = child.kill();
    }
    let status = child
        .wait()
        .map_err(|e| err!("waiting for `{what}`: {e}"))?;
    Ok((status.code(), timed_out))
}

/// A background process (a server) started from a prepared [`Command`] with
/// its output discarded; killed and reaped when dropped, and killed by the
/// kernel when this process dies (`PR_SET_PDEATHSIG`).
pub struct Background(Child);

impl Background {
    pub fn spawn(mut c: Command) -> Result<Self> {
        die_with_parent(&mut c);
        let child = c
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| err!("cannot start `{c:?}`: {e}"))?;
        Ok(Self(child))
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs a helper tool (`ip`, `bpftool`, ...) with no input and requires success.
pub fn tool(netns: Option<&Path>, program: &str, args: &[&str]) -> Result<String> {
    let out = run(netns, Path::new(program), args, &[], b"")?;
    if out.success() {
        Ok(out.stdout)
    } else {
        Err(err!("{out}"))
    }
}

/// Makes the kernel kill the process `c` starts when this one dies
/// (`PR_SET_PDEATHSIG`): no server or plugin outlives a killed test run.
pub fn die_with_parent(c: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe; nothing else runs in the child before
    // exec.
    unsafe {
        c.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A program started by [`spawn`] and not yet reaped: the crash tests kill it at
/// a moment of their choosing. Killed (SIGKILL) and reaped when dropped, also
/// while a failed test unwinds, and killed by the kernel when the test process
/// dies (`PR_SET_PDEATHSIG`).
pub struct Running {
    child: Option<std::process::Child>,
    what: String,
    started: Instant,
    readers: Vec<thread::JoinHandle<String>>,
}

/// Starts `program args` as [`run`] does (only `PATH` and `env`, in `netns`
/// through `nsenter --net=`), writes `stdin` to it and closes it, and returns at
/// once. Its output is collected on threads of its own, so it never blocks on a
/// full pipe.
pub fn spawn(
    netns: Option<&Path>,
    program: &Path,
    args: &[&str],
    env: &[(String, String)],
    stdin: &[u8],
) -> Result<Running> {
    let (mut cmd, what) = command(netns, program, args, env);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    die_with_parent(&mut cmd);
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| err!("cannot start `{what}`: {e}"))?;
    let readers = read_output(&mut child).into();
    let running = Running {
        child: Some(child),
        what,
        started,
        readers,
    };
    Ok(running.with_stdin(stdin))
}

impl Running {
    /// Writes `stdin` (a config: far less than a pipe holds, so this does not
    /// block) and closes it. A program killed before it read gives EPIPE,
    /// which is ignored (SIGPIPE is ignored by the Rust runtime).
    fn with_stdin(mut self, stdin: &[u8]) -> Self {
        if let Some(mut s) = self.child.as_mut().and_then(|c| c.stdin.take()) {
            let _ = s.write_all(stdin);
        }
        self
    }

    /// The process id (`nsenter`'s until it execs the program, then the
    /// program's: the same process).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(std::process::Child::id)
    }

    /// Time since the process was started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Sends SIGKILL (a process that has already exited but is not reaped is
    /// a zombie: the signal does nothing).
    pub fn kill(&mut self) -> Result<()> {
        match self.child.as_mut() {
            Some(c) => c.kill().map_err(|e| err!("killing `{}`: {e}", self.what)),
            None => Err(err!("`{}` was reaped already", self.what)),
        }
    }

    /// Waits at most `timeout` for it to end (then kills it and fails) and
    /// returns what it did; `status` is `None` when a signal ended it.
    pub fn wait(mut self, timeout: Duration) -> Result<Output> {
        let Some(mut child) = self.child.take() else {
            return Err(err!("`{}` was reaped already", self.what));
        };
        let (status, timed_out) = wait_until(&mut child, timeout, &self.what)?;
        let mut texts = self.readers.drain(..).map(|r| r.join().unwrap_or_default());
        let out = Output {
            what: self.what.clone(),
            status,
            stdout: texts.next().unwrap_or_default(),
            stderr: texts.next().unwrap_or_default(),
        };
        if timed_out {
            return Err(err!("killed after {timeout:?} without finishing: {out}"));
        }
        Ok(out)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }
}
