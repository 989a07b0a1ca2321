//! First-run set-up: what the harnesses need that a fresh machine may lack.
//!
//! `cargo test --workspace` and the demo must work on a fresh machine with
//! nothing installed by hand (`README.md`, "What the first run installs").
//! The harnesses therefore install what they miss themselves, once:
//!
//! - a Rust target a nested build compiles for ([`ensure_rust_target`],
//!   called by [`crate::cargo`] for every `--target`): `rustup target add`,
//!   independent of `RUSTUP_AUTO_INSTALL`;
//! - system packages (QEMU, the guest's tools and kernel):
//!   [`ensure_installed`] runs the repository's install script when the
//!   process is root, and otherwise fails with the exact command to run.
//!
//! Test binaries run concurrently (threads of one binary, and `cargo test`
//! may run several harness binaries one after another while an earlier
//! one's nested build still holds a lock), so every install runs under one
//! file lock, `target/.setup.lock` ([`SetupLock`]), and checks again under
//! it before it installs anything.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{target_base, workspace_root};

/// An exclusive `flock` on `target/.setup.lock`, released when dropped.
///
/// Each call opens the file anew, so two threads of one process exclude
/// each other as two processes do (a `flock` belongs to the open file
/// description).
#[derive(Debug)]
pub struct SetupLock {
    _file: File,
}

impl SetupLock {
    /// Waits for the lock.
    pub fn acquire() -> Result<Self, String> {
        let dir = target_base();
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let path = dir.join(".setup.lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| format!("opening {}: {e}", path.display()))?;
        loop {
            // SAFETY: flock(2) on a descriptor this function owns (the file
            // stays open for the call); it touches no memory of ours.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(SetupLock { _file: file });
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(format!("locking {}: {err}", path.display()));
            }
        }
    }
}

/// Writes `line` to the process's standard error itself, not through
/// `eprintln!`, which the test harness captures: what a first run installs
/// shows in `cargo test`'s output.
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Whether the process runs as root (and may install system packages).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The sysroot of the toolchain this workspace builds with
/// (`rust-toolchain.toml` applies: the command runs in the workspace).
fn sysroot() -> Result<PathBuf, String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(rustc)
        .args(["--print", "sysroot"])
        .current_dir(workspace_root())
        .output()
        .map_err(|e| format!("running rustc --print sysroot: {e}"))?;
    if !out.status.success() {
        return Err(format!("rustc --print sysroot failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Whether the standard library for `target` is installed in `sysroot`.
fn has_target(sysroot: &Path, target: &str) -> bool {
    let lib = sysroot.join("lib/rustlib").join(target).join("lib");
    std::fs::read_dir(lib).is_ok_and(|mut d| {
        d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("libcore-")))
    })
}

/// Makes sure the workspace's toolchain has the standard library for
/// `target`, adding it with `rustup target add` (once, under the
/// [`SetupLock`], with a line on stderr saying so) when it is missing.
///
/// A toolchain not managed by rustup cannot be extended: the error then
/// names the target to install.
pub fn ensure_rust_target(target: &str) -> Result<(), String> {
    let root = sysroot()?;
    if has_target(&root, target) {
        return Ok(());
    }
    let _lock = SetupLock::acquire()?;
    if has_target(&root, target) {
        return Ok(());
    }
    say(&format!(
        "vm-harness: the Rust target {target} is missing; adding it (rustup target add {target}), once"
    ));
    let out = Command::new("rustup")
        .args(["target", "add", target])
        .current_dir(workspace_root())
        .output()
        .map_err(|e| {
        format!(
            "the Rust target {target} is missing and rustup could not be run ({e}): \
                 install the target's standard library for the toolchain in {}",
            root.display()
        )
    })?;
    if !out.status.success() || !has_target(&root, target) {
        return Err(format!(
            "rustup target add {target} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Makes sure `what` is installed: when `present()` is false, runs the
/// repository's install script `script` (a path relative to the workspace,
/// e.g. `.ci/install-qemu.sh`) under the [`SetupLock`] if the process is
/// root, and checks `present()` again.
///
/// Not root: the error says what is missing and the exact command that
/// installs it. The script's output goes to this process's stderr, so a
/// first run shows what it installs.
pub fn ensure_installed(what: &str, script: &str, present: impl Fn() -> bool) -> Result<(), String> {
    if present() {
        return Ok(());
    }
    let command = format!("sudo bash {}", workspace_root().join(script).display());
    if !is_root() {
        return Err(format!("{what} is missing; install it once with: {command}"));
    }
    let _lock = SetupLock::acquire()?;
    if present() {
        return Ok(());
    }
    say(&format!("vm-harness: {what} is missing; installing it with {script} (once)"));
    let status = Command::new("bash")
        .arg(workspace_root().join(script))
        .current_dir(workspace_root())
        .stdout(std::process::Stdio::inherit())
        .stderr(std::process::Stdio::inherit())
        .status()
        .map_err(|e| format!("running {script}: {e}"))?;
    if !status.success() {
        return Err(format!("{script} failed ({status}) while installing {what}; run it by hand: {command}"));
    }
    if !present() {
        return Err(format!("{script} ran, but {what} is still missing"));
    }
    Ok(())
}

/// The value after `--target` in a cargo command line, if any.
pub(crate) fn target_of<'a>(args: &[&'a str]) -> Option<&'a str> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if *a == "--target" {
            return it.next().copied();
        }
        if let Some(t) = a.strip_prefix("--target=") {
            return Some(t);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn the_target_is_found_in_both_spellings() {
        assert_eq!(
            target_of(&["build", "--target", "thumbv7em-none-eabihf", "-p", "x"]),
            Some("thumbv7em-none-eabihf")
        );
        assert_eq!(target_of(&["build", "--target=aarch64-unknown-none"]), Some("aarch64-unknown-none"));
        assert_eq!(target_of(&["build", "-p", "x"]), None);
    }

    #[test]
    fn the_host_target_is_installed_and_a_made_up_one_is_not() {
        let root = sysroot().unwrap();
        assert!(has_target(&root, "x86_64-unknown-linux-gnu"), "{}", root.display());
        assert!(!has_target(&root, "no-such-target-here"));
    }

    #[test]
    fn a_present_tool_installs_nothing() {
        // The script does not exist: running it would fail.
        ensure_installed("true", ".ci/no-such-script.sh", || true).unwrap();
    }

    #[test]
    fn a_missing_tool_says_how_to_install_it_or_reports_the_failed_script() {
        let e = ensure_installed("the tool x", ".ci/no-such-script.sh", || false).unwrap_err();
        if is_root() {
            assert!(e.contains(".ci/no-such-script.sh failed"), "{e}");
        } else {
            assert!(e.contains("the tool x is missing; install it once with: sudo bash"), "{e}");
        }
        assert!(e.contains("no-such-script.sh"), "{e}");
    }

    #[test]
    fn the_lock_excludes_threads_of_one_process() {
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (inside, most) = (inside.clone(), most.clone());
                std::thread::spawn(move || {
                    for _ in 0..5 {
                        let _l = SetupLock::acquire().unwrap();
                        let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(n, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(2));
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 1, "two holders of the set-up lock at once");
    }
}
