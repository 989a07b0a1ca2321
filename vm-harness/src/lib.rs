//! Host-side pieces shared by the harnesses that boot QEMU guests
//! (`qemu-tests`: bare-metal images; `linux-tests`: the Linux guest with the
//! kernel driver).
//!
//! Both start the model server and QEMU as child processes, collect their
//! output lines from reader threads, and build their artifacts with a nested
//! `cargo` in a target directory of their own (so the nested cargo never
//! waits on the outer one's lock). Every child is owned by a [`ChildGuard`],
//! which stops and reaps it on every path, a panicking test included.
//! [`setup`] installs what a fresh machine lacks (Rust targets, QEMU, the
//! guest's tools), once, under a file lock. [`Outcome`] and [`Status`] are
//! what both read from a boot's console, [`HarnessError`] why a boot could
//! not be made. A boot starts the model and waits for it
//! ([`wait_for_model`]), then starts QEMU and polls it until it exits or
//! the harness's failure guard passes ([`wait_for_exit`]).

use std::io::{BufRead, BufReader, Read};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

mod error;
pub mod guide;
mod outcome;
pub mod setup;

pub use error::HarnessError;
pub use outcome::{Outcome, Status};

/// How long a polite stop waits for the child after SIGTERM before SIGKILL.
pub const TERM_GRACE: Duration = Duration::from_secs(5);

/// A child process stopped and reaped when dropped.
#[derive(Debug)]
pub struct ChildGuard {
    /// The process (its pipes may be taken for [`collect`]).
    pub child: Child,
    /// SIGTERM first (lets the model remove its socket), then SIGKILL.
    polite: bool,
}

impl ChildGuard {
    /// Guards `child`; `polite`: stop it with SIGTERM first and SIGKILL
    /// only after [`TERM_GRACE`].
    pub fn new(child: Child, polite: bool) -> Self {
        ChildGuard { child, polite }
    }

    /// Stops the child (if it still runs) and reaps it. Idempotent.
    pub fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        if self.polite {
            if let Ok(pid) = i32::try_from(self.child.id()) {
                // SAFETY: kill(2) on our own child's pid; it is not reaped
                // yet (try_wait saw it running), so the pid is still ours.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
            let deadline = Instant::now() + TERM_GRACE;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Lines collected from a child's pipes.
pub type Lines = Arc<Mutex<Vec<String>>>;

/// Reads `r` line by line into `lines` on a thread of its own (until end of
/// file or a read error); join the handle to have every line.
pub fn collect(r: impl Read + Send + 'static, lines: Lines) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        for l in BufReader::new(r).lines() {
            let Ok(l) = l else { break };
            if let Ok(mut v) = lines.lock() {
                v.push(l);
            }
        }
    })
}

/// Collects both of `guard`'s pipes (those not taken yet) into `lines`,
/// adding the reader threads to `readers`.
pub fn collect_output(guard: &mut ChildGuard, lines: &Lines, readers: &mut Vec<thread::JoinHandle<()>>) {
    if let Some(o) = guard.child.stdout.take() {
        readers.push(collect(o, lines.clone()));
    }
    if let Some(e) = guard.child.stderr.take() {
        readers.push(collect(e, lines.clone()));
    }
}

/// A copy of what was collected so far (empty if a reader panicked while
/// holding the lock).
pub fn snapshot<T: Clone>(lines: &Mutex<Vec<T>>) -> Vec<T> {
    lines.lock().map(|v| v.clone()).unwrap_or_default()
}

/// Failure guard for the model server's start ([`wait_for_model`]).
pub const MODEL_START_LIMIT: Duration = Duration::from_secs(30);

/// Waits until `ready()` says the model server `sim` is up (its socket
/// exists, or it printed that it attached). `lines` and `readers`: where
/// [`collect_output`] collects its output. `awaited` names what `ready`
/// looks for in the errors (e.g. "listening"). A model that exits first is
/// an error holding everything it printed (its readers joined: its pipes
/// are at end of file); one not ready within [`MODEL_START_LIMIT`] is an
/// error too.
pub fn wait_for_model(
    sim: &mut ChildGuard,
    lines: &Lines,
    readers: &mut Vec<thread::JoinHandle<()>>,
    awaited: &str,
    mut ready: impl FnMut() -> bool,
) -> Result<(), HarnessError> {
    let deadline = Instant::now() + MODEL_START_LIMIT;
    while !ready() {
        if let Ok(Some(st)) = sim.child.try_wait() {
            for r in readers.drain(..) {
                let _ = r.join();
            }
            return Err(HarnessError::Setup(format!(
                "refgpu-sim exited ({st}) before {awaited}:\n{}",
                snapshot(lines).join("\n")
            )));
        }
        if Instant::now() > deadline {
            return Err(HarnessError::Setup(format!(
                "refgpu-sim was not {awaited} after {} s",
                MODEL_START_LIMIT.as_secs()
            )));
        }
        thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// How [`wait_for_exit`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// The child exited with this status.
    Exited(ExitStatus),
    /// Its status could not be read (`try_wait` failed).
    Unknown,
    /// The deadline passed first.
    TimedOut,
    /// The caller's step stopped the wait.
    Stopped,
}

impl Exit {
    /// The child's exit code, if it exited with one.
    pub fn code(self) -> Option<i32> {
        match self {
            Exit::Exited(s) => s.code(),
            _ => None,
        }
    }
}

/// Polls `child` every `period` until it exits, `deadline` passes or
/// `step` breaks (in that order of precedence). `step` runs first in every
/// round, to act on the output collected so far; a break stops the wait
/// after that round's checks. The child is left running unless it exited:
/// the caller stops it ([`ChildGuard::stop`]).
pub fn wait_for_exit(
    child: &mut ChildGuard,
    deadline: Instant,
    period: Duration,
    mut step: impl FnMut() -> ControlFlow<()>,
) -> Exit {
    loop {
        let flow = step();
        match child.child.try_wait() {
            Ok(Some(s)) => return Exit::Exited(s),
            Ok(None) => {}
            Err(_) => return Exit::Unknown,
        }
        if Instant::now() > deadline {
            return Exit::TimedOut;
        }
        if flow.is_break() {
            return Exit::Stopped;
        }
        thread::sleep(period);
    }
}

/// The workspace's root directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// The outer build's target directory (`CARGO_TARGET_DIR` or `target/`);
/// each harness keeps its nested builds and caches below it.
pub fn target_base() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join("target"))
}

/// Whether `cmd arg` runs and exits with success (a tool is installed).
pub fn tool_runs(cmd: &str, arg: &str) -> bool {
    Command::new(cmd).arg(arg).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// Runs `cargo args` in the workspace with `env` set, into `target_dir`,
/// without the outer build's flags and target (an instrumented or
/// cross-compiling outer build must not leak into the nested one). A
/// `--target` whose standard library is missing is added first
/// ([`setup::ensure_rust_target`]). The error holds cargo's stderr.
pub fn cargo(args: &[&str], env: &[(&str, &str)], target_dir: &Path) -> Result<(), String> {
    if let Some(target) = setup::target_of(args) {
        setup::ensure_rust_target(target)?;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(workspace_root())
        .env("CARGO_TARGET_DIR", target_dir)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo {} failed:\n{}", args.join(" "), String::from_utf8_lossy(&out.stderr)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spawn(script: &str) -> ChildGuard {
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sh");
        ChildGuard::new(child, true)
    }

    #[test]
    fn both_pipes_are_collected() {
        let mut g = spawn("echo out1; echo err1 >&2; echo out2");
        let lines = Lines::default();
        let mut readers = Vec::new();
        collect_output(&mut g, &lines, &mut readers);
        for r in readers {
            r.join().unwrap();
        }
        let mut got = snapshot(&lines);
        got.sort();
        assert_eq!(got, ["err1", "out1", "out2"]);
    }

    #[test]
    fn a_polite_stop_terminates_and_reaps() {
        // The shell traps SIGTERM and exits 7: a SIGKILL would give no code.
        // It says "ready" once the trap is set, and the stop waits for that.
        let mut g = spawn("trap 'exit 7' TERM; echo ready; while :; do sleep 0.05; done");
        let mut ready = String::new();
        BufReader::new(g.child.stdout.take().expect("stdout")).read_line(&mut ready).unwrap();
        assert_eq!(ready.trim(), "ready");
        g.stop();
        let status = g.child.try_wait().unwrap().expect("reaped");
        assert_eq!(status.code(), Some(7));
    }

    #[test]
    fn dropping_the_guard_kills_the_child() {
        let g = spawn("sleep 30");
        let pid = g.child.id() as i32;
        drop(g);
        // SAFETY: kill(2) with signal 0 only checks whether the pid exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0;
        assert!(!alive, "child {pid} still exists after the guard's drop");
    }

    #[test]
    fn the_wait_for_an_exit_reports_the_status() {
        let mut g = spawn("exit 3");
        let mut steps = 0;
        let end =
            wait_for_exit(&mut g, Instant::now() + Duration::from_secs(60), Duration::from_millis(5), || {
                steps += 1;
                ControlFlow::Continue(())
            });
        assert_eq!(end.code(), Some(3), "{end:?}");
        assert!(steps >= 1);
    }

    #[test]
    fn the_wait_for_an_exit_ends_at_its_deadline_or_a_break() {
        let mut g = spawn("sleep 30");
        let end =
            wait_for_exit(&mut g, Instant::now(), Duration::from_millis(5), || ControlFlow::Continue(()));
        assert_eq!(end, Exit::TimedOut);
        assert_eq!(end.code(), None);
        let mut rounds = 0;
        let end =
            wait_for_exit(&mut g, Instant::now() + Duration::from_secs(60), Duration::from_millis(5), || {
                rounds += 1;
                if rounds == 3 {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            });
        assert_eq!((end, rounds), (Exit::Stopped, 3));
        assert!(g.child.try_wait().unwrap().is_none(), "the child is left running");
    }

    #[test]
    fn the_model_is_awaited_until_ready() {
        let mut g = spawn("echo attached to ram; sleep 30");
        let lines = Lines::default();
        let mut readers = Vec::new();
        collect_output(&mut g, &lines, &mut readers);
        let ready = || snapshot(&lines).iter().any(|l| l.contains("attached to"));
        wait_for_model(&mut g, &lines, &mut readers, "attached", ready).unwrap();
    }

    #[test]
    fn a_model_that_exits_first_is_an_error_with_its_output() {
        let mut g = spawn("echo bad RAM file >&2; exit 1");
        let lines = Lines::default();
        let mut readers = Vec::new();
        collect_output(&mut g, &lines, &mut readers);
        let e = wait_for_model(&mut g, &lines, &mut readers, "listening", || false).unwrap_err().to_string();
        assert!(e.contains("refgpu-sim exited (exit status: 1) before listening"), "{e}");
        assert!(e.ends_with("bad RAM file"), "{e}");
        assert!(readers.is_empty(), "the readers are joined");
    }

    #[test]
    fn paths_and_tools() {
        assert!(workspace_root().join("Cargo.toml").is_file());
        assert!(tool_runs("true", "x"));
        assert!(!tool_runs("vm-harness-no-such-tool", "--version"));
    }

    #[test]
    fn a_failing_cargo_reports_its_stderr() {
        let dir = target_base().join("vm-harness-test");
        let e = cargo(&["build", "-p", "no-such-package-here"], &[], &dir).unwrap_err();
        assert!(e.contains("cargo build -p no-such-package-here failed"), "{e}");
        assert!(e.contains("no-such-package-here"), "{e}");
    }
}
