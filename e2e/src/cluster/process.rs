//! Starting, watching and stopping the control plane's processes so that none outlives its owner.
//!
//! Three layers, because the Rust test harness never runs the destructors of statics and a test
//! binary can be killed with SIGKILL:
//! 1. every component runs in its own process group (`process_group(0)`), so stopping it stops
//!    anything it forked, and the terminal's Ctrl-C reaches only the owner, which stops them in order;
//! 2. every component is exec'd through util-linux `setpriv --pdeathsig KILL`: the kernel kills it
//!    when the thread that forked it dies (and a one-line `sh` check between the two execs makes it
//!    exit if its owner died before the signal was armed, when it would never come). Those forks all happen on one dedicated spawner thread
//!    that lives as long as the [`Spawner`] (for the shared cluster: as long as the process), because
//!    the death signal follows the forking *thread*, and tokio retires idle threads;
//! 3. a watchdog `sh` reads a pipe whose only writer is the owner: when the owner dies in any way,
//!    the kernel closes the pipe, `read` sees end-of-file, and the watchdog kills every process group
//!    listed in the state directory's `pgids` file whose leader still names the directory,
//!    removes the state directory, and runs the owner's cleanup command if it gave one (real
//!    nodes leave containers, namespaces and cgroups that only `ipkeep-e2e cluster reap-nodes`
//!    removes).

use std::{
    fs::{File, OpenOptions},
    io::{Read, Seek, SeekFrom, Write},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, ExitStatus, Stdio},
    sync::{Arc, Condvar, Mutex, mpsc},
    time::{Duration, Instant},
};

use rustix::process::{Pid, Signal, kill_process_group};

/// Failures of the process layer.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The executable could not be started at all.
    #[error("failed to start {what} ({program})")]
    Spawn {
        /// Which component.
        what: String,
        /// The program exec'd.
        program: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The spawner thread is gone (it only ends when its owner is dropped).
    #[error("failed to start {what}: the spawner thread has stopped")]
    SpawnerGone {
        /// Which component.
        what: String,
    },
    /// A log or bookkeeping file could not be written.
    #[error("failed to write {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// A thread that does every fork of one control plane, so the parent-death signal of its
/// children fires exactly when the owner goes away (see the module docs).
#[derive(Debug)]
pub struct Spawner {
    requests: mpsc::Sender<SpawnRequest>,
}

impl Spawner {
    /// Starts the spawner thread; it ends when the `Spawner` is dropped.
    pub fn new() -> std::io::Result<Spawner> {
        let (requests, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("ipkeep-cluster-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })?;
        Ok(Spawner { requests })
    }

    fn spawn(&self, what: &str, command: Command) -> Result<Child, ProcessError> {
        let program = PathBuf::from(command.get_program());
        let (tx, rx) = mpsc::channel();
        let gone = || ProcessError::SpawnerGone {
            what: what.to_owned(),
        };
        self.requests.send((command, tx)).map_err(|_| gone())?;
        rx.recv()
            .map_err(|_| gone())?
            .map_err(|source| ProcessError::Spawn {
                what: what.to_owned(),
                program,
                source,
            })
    }
}

#[derive(Debug, Default)]
struct ExitState {
    exited: Option<ExitStatus>,
    stopping: bool,
    /// The control plane was ready: an exit from now on is announced as a death. Before, the
    /// start fails with the exit and says so itself.
    announce: bool,
}

/// One running control-plane process.
#[derive(Debug)]
pub struct Component {
    name: String,
    pid: u32,
    log: PathBuf,
    state: Arc<(Mutex<ExitState>, Condvar)>,
}

/// Run between `setpriv` setting the death signal and the component's exec: if the owner died
/// before the signal was armed, the child was already re-parented and would never get it, so it
/// must not start at all. `$0` is the owner's pid.
const PARENT_CHECK: &str = r#"if [ "$PPID" != "$0" ]; then echo "ipkeep-e2e: the owner (pid $0) is gone; not starting $1" >&2; exit 125; fi
exec "$@""#;

/// The resident memory (`VmRSS`) of a running process, in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// How many log lines an error shows.
pub const LOG_TAIL_LINES: usize = 25;

/// The last `lines` lines of a log file (at most 64 KiB are read), or a note why there are none.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut text = String::new();
    let mut raw = Vec::new();
    if f.read_to_end(&mut raw).is_ok() {
        text = String::from_utf8_lossy(&raw).into_owned();
    }
    let all: Vec<&str> = text.lines().collect();
    let tail = &all[all.len().saturating_sub(lines)..];
    if tail.is_empty() {
        return "(its log is empty)".into();
    }
    tail.iter()
        .map(|l| format!("    | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl Component {
    /// Starts `program args` as component `name` in its own process group with the parent-death
    /// signal set, stdout and stderr appended to `log`, and records its process group in `pgids`.
    pub fn start(
        spawner: &Spawner,
        name: &str,
        program: &Path,
        args: &[String],
        log: &Path,
        pgids: &Path,
    ) -> Result<Component, ProcessError> {
        let write_err = |path: &Path| {
            let path = path.to_owned();
            move |source| ProcessError::Write { path, source }
        };
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(write_err(log))?;
        let err = out.try_clone().map_err(write_err(log))?;
        let mut command = Command::new("setpriv");
        command
            .arg("--pdeathsig")
            .arg("KILL")
            .arg("--")
            .arg("sh")
            .arg("-c")
            .arg(PARENT_CHECK)
            .arg(std::process::id().to_string())
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let mut child = spawner.spawn(name, command)?;
        let pid = child.id();
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(pgids)
            .map_err(write_err(pgids))?;
        writeln!(file, "{pid}").map_err(write_err(pgids))?;

        let state = Arc::new((Mutex::new(ExitState::default()), Condvar::new()));
        let watched = Arc::clone(&state);
        let (who, log_path) = (name.to_owned(), log.to_owned());
        std::thread::Builder::new()
            .name(format!("wait-{name}"))
            .spawn(move || {
                let status = child.wait();
                let (lock, cvar) = &*watched;
                let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
                let status = match status {
                    Ok(s) => s,
                    Err(_) => std::os::unix::process::ExitStatusExt::from_raw(-1),
                };
                st.exited = Some(status);
                if st.announce && !st.stopping {
                    eprintln!(
                        "ipkeep-e2e cluster: {who} (pid {pid}) died while the control plane was running ({status}); last lines of {}:\n{}",
                        log_path.display(),
                        log_tail(&log_path, LOG_TAIL_LINES)
                    );
                }
                cvar.notify_all();
            })
            .map_err(|source| ProcessError::Spawn {
                what: format!("the waiter thread of {name}"),
                program: program.to_owned(),
                source,
            })?;
        Ok(Component {
            name: name.to_owned(),
            pid,
            log: log.to_owned(),
            state,
        })
    }

    /// The component's name (`etcd`, `kube-apiserver`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its process id (also its process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its log file (stdout and stderr).
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// From now on, an unexpected exit is printed at once (call when the control plane is ready).
    pub fn announce_death(&self) {
        let (lock, _) = &*self.state;
        lock.lock().unwrap_or_else(|p| p.into_inner()).announce = true;
    }

    /// How it exited, if it has.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        let (lock, _) = &*self.state;
        lock.lock().unwrap_or_else(|p| p.into_inner()).exited
    }

    fn signal(&self, signal: Signal) {
        if let Some(pid) = i32::try_from(self.pid).ok().and_then(Pid::from_raw) {
            let _ = kill_process_group(pid, signal);
        }
    }

    /// Waits up to `within` for the process to exit; true if it has.
    fn wait_exit(&self, within: Duration) -> bool {
        let (lock, cvar) = &*self.state;
        let deadline = Instant::now() + within;
        let mut st = lock.lock().unwrap_or_else(|p| p.into_inner());
        while st.exited.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = match cvar.wait_timeout(st, left) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        true
    }

    /// Stops its process group: SIGTERM, then SIGKILL after `grace`. Returns once the process has
    /// been reaped (or after a further 10 s if even SIGKILL did not end it).
    pub fn stop(&self, grace: Duration) {
        {
            let (lock, _) = &*self.state;
            lock.lock().unwrap_or_else(|p| p.into_inner()).stopping = true;
        }
        // Once it has exited (and been reaped) its pid may be reused: never signal it again.
        if self.exit_status().is_none() {
            self.signal(Signal::TERM);
            if !self.wait_exit(grace) {
                self.signal(Signal::KILL);
                self.wait_exit(Duration::from_secs(10));
            }
        }
    }
}

/// The watchdog that cleans up after an owner that died without doing so (see the module docs).
#[derive(Debug)]
pub struct Watchdog {
    pipe: Option<ChildStdin>,
    child: Child,
}

const WATCHDOG_SCRIPT: &str = r#"dir=$1
shift
while read -r _; do :; done
if [ -f "$dir/pgids" ]; then
  for g in $(cat "$dir/pgids"); do
    # Only a group whose leader still names the directory: a recycled pid is never hit.
    if tr '\0' '\n' < "/proc/$g/cmdline" 2>/dev/null | grep -qF -- "$dir"; then
      kill -KILL -- "-$g" 2>/dev/null
    fi
  done
fi
# A component that was exiting at that moment may still have been writing: remove until the
# directory stays gone.
for _ in 1 2 3 4 5; do
  rm -rf -- "$dir" 2>/dev/null
  sleep 0.2
  [ -e "$dir" ] || break
done
if [ $# -gt 0 ]; then "$@" >/dev/null 2>&1; fi
"#;

impl Watchdog {
    /// Starts a watchdog for `state_dir` (its own process group, so Ctrl-C in a terminal does not
    /// end it before the owner is gone); `cleanup` (a program and its arguments, or empty) runs
    /// last when it acts.
    pub fn start(
        spawner: &Spawner,
        state_dir: &Path,
        cleanup: &[String],
    ) -> Result<Watchdog, ProcessError> {
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(WATCHDOG_SCRIPT)
            .arg("ipkeep-cluster-watchdog")
            .arg(state_dir)
            .args(cleanup)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        let mut child = spawner.spawn("the cleanup watchdog", command)?;
        let pipe = child.stdin.take();
        Ok(Watchdog { pipe, child })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Lets the watchdog run its cleanup now and waits for it.
    pub fn finish(&mut self) {
        self.pipe = None;
        let _ = self.child.wait();
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.finish();
    }
}
