//! Linux guest tests for the refgpu kernel driver (`kmd/`).
//!
//! For one boot ([`boot`], cached per generation by [`outcome`]) the
//! harness:
//!
//! 1. finds Debian's 6.12 kernel extracted under `target/linux-kernel/`
//!    (`tools/fetch-linux-kernel.sh`; run here when the cache is missing);
//! 2. builds the module against its headers, in a copy of `kmd/` under the
//!    harness's target directory (`make`, the kernel's `gcc-12`, `pahole`);
//! 3. cargo-builds the guest binary `refgpu-guest` (this crate, feature
//!    `guest`) for `x86_64-unknown-linux-musl` and `refgpu-sim`, in their
//!    own target directory (`target/linux-tests/cargo`);
//! 4. writes an uncompressed `newc` initramfs: `/init` is the guest binary,
//!    `/lib/modules/` holds the kernel's DRM modules (decompressed by the
//!    fetch script), ours, and their load order;
//! 5. starts `refgpu-sim --gen N` on a shared guest-RAM file and boots
//!    `qemu-system-x86_64 -M q35` under TCG with that file as
//!    `memory-backend-file,share=on`, an `ivshmem-doorbell` device with 4
//!    vectors on the model's socket behind a PCIe root port (so that it can
//!    be hot-unplugged: [`DEVICE_DEL`]), `isa-debug-exit`, and QEMU's
//!    monitor (QMP) on a socket in the boot's temporary directory;
//! 6. collects the serial console: the guest prints `@@ TEST <name>
//!    PASS|FAIL <why>` per test, `@@ BENCH <name> <text>` per benchmark and
//!    `N passed, N failed` at the end, then exits QEMU through
//!    `isa-debug-exit` (status `(code << 1) | 1`). The guest's requests
//!    on the console are carried out meanwhile: freeze or resume the model
//!    ([`MODEL_STOP`]), remove the GPU ([`DEVICE_DEL`]).
//!
//! The stock kernel's own checks run on every boot ([`KERNEL_CHECKS`]:
//! SLUB red zones and poisoning, KFENCE on every allocation it can take,
//! freed memory zeroed, a WARN or a soft lockup panics). A panic ends the
//! boot at once (`panic=-1` reboots, `-no-reboot` makes that QEMU's exit)
//! after the kernel replayed its whole log on the console (`panic_print`),
//! and the harness reports it as a failure naming the panic and its cause
//! (the WARNING, BUG or lockup line before it, [`Outcome::panic`]).
//!
//! Everything started is owned by guards (killed and reaped on every path,
//! a panicking test included); a boot that does not end within
//! [`RUN_TIMEOUT`] (a failure guard, not a performance threshold) is
//! killed and reported with the last console lines and the [`Phase`] it
//! was in (the guest prints `@@ PHASE init` first, `@@ PHASE ready` once
//! the modules are loaded and `@@ RUN <name>` before each test). A boot
//! whose kernel does not start `/init` within [`INIT_TIMEOUT`] is stopped
//! then and booted once more: no code of ours has run by that point (our
//! module is loaded by `/init`), and the retry is reported. On a fresh
//! machine the harness sets itself up: run as root, it installs missing
//! tools and the kernel with `.ci/install-linux-guest.sh`, and the guest's
//! Rust target with rustup (`vm_harness::setup`), once, under a lock file;
//! without root a missing tool fails with the exact command to run
//! ([`HarnessError`]). Nothing passes silently.
//!
//! A boot runs one [`Suite`]: the main suite [`GUEST_TESTS`], or the
//! adversarial suite [`ADVERSARIAL_TESTS`] (ioctl fuzzing, races, fork,
//! signals, saturation: docs/linux.md, "The adversarial suite"), chosen by
//! the kernel command-line word `rgtest.suite=adversarial` that `/init`
//! reads ([`Suite::cmdline`]); the adversarial boot also passes the fuzz
//! seed of the environment variable `RGTEST_SEED`, if set, as
//! `rgtest.seed=N`. A third suite, [`PROFILE_TESTS`]
//! (`rgtest.suite=profile`, `tests/profile.rs`, ignored by default), is a
//! measurement: where a SUBMIT's time goes, from ftrace in the guest. The
//! guest binary runs exactly the chosen list (it checks its own list
//! against this one), so a test the guest did not report is a failure on
//! the host.
//!
//! Both suites boot on a debug kernel too ([`KernelKind::Debug`]:
//! lockdep, KASAN, kmemleak, DEBUG_OBJECTS, DMA-API debugging, failslab),
//! built from Debian's 6.12 source by `tools/build-debug-kernel.sh` and
//! cached outside the clone ([`debug_kernel_cache`]; the script names the
//! directory of the build it made or found on its last line of output),
//! with [`DEBUG_KERNEL_TESTS`] added ([`Suite::tests`]);
//! `tests/debug_kernel.rs` runs them (ignored by default). See docs/reliability.md, "The debug
//! kernel". Each boot's whole console is kept in
//! `target/linux-tests/console-gen<N>[-debug].log`.

pub mod cpio;

use std::collections::HashMap;
use std::fmt;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use vm_harness::{
    collect_output, snapshot, target_base, tool_runs, wait_for_exit, wait_for_model, workspace_root,
    ChildGuard, Exit, Lines,
};

/// Every test of the guest suite, in the order the guest runs them.
pub const GUEST_TESTS: &[&str] = &[
    "get_param",
    "version_ioctl",
    "unknown_ioctl",
    "bo_create_errors",
    "bo_mmap_write_read",
    "bo_no_cpu_mapping",
    "bo_mmap_offset_errors",
    "vm_bind_errors",
    "vm_bind_overlap",
    "vm_bind_read_only_bo",
    "vm_bind_batch_atomic",
    "vm_bind_unmap_split",
    "vm_bind_frees_page_tables",
    "vm_bind_table_limit",
    "vm_bind_charges_page_tables",
    "ctx_errors",
    "submit_errors",
    "submit_batch_errors",
    "submit_batch_runs",
    "syncobj_errors",
    "copy_fill_write_data",
    "timeline_wait",
    "cross_engine_order",
    "sync_file_out",
    "sync_file_failure_queues_nothing",
    "vm_bind_syncs",
    "read_only_mapping_faults",
    "isolation_two_files",
    "isolation_two_processes",
    "prime_share",
    "hang_recovery",
    "devcoredump",
    "fault_recovery",
    "fdinfo_engine_time",
    "fdinfo_memory",
    "fdinfo_file_closed_mid_job",
    "reset_resumes_innocent_jobs",
    "progressing_job_outlives_timeout",
    "job_max_ms_bound",
    "forged_fence_fill",
    "forged_fence_wait",
    "fault_racing_submits",
    "teardown_killed_process",
    "submit_racing_ctx_destroy",
    "conformance_kernel_mode",
    "conformance_kernel_mode_validation",
    "kernel_mode_sync_files_and_reset_status",
    "dma_overrun_walk",
    "tracepoints_follow_a_job",
    "tracepoints_name_resets",
    "bench_submit_vs_null_ioctl",
    "bench_wait_syncobj_vs_poll",
    "bench_vm_bind_batched",
    "bench_umd_submit_kernel_vs_direct",
    "bench_submit_batch",
    "bench_ib_sweep_kernel_mode",
    "bench_umd_batch_window",
    "module_reload",
    "lost_device_keeps_memory",
    "unbind_with_open_file",
    "surprise_removal",
    "kmsg_clean",
];

/// Every test of the adversarial suite, in the order the guest runs them.
pub const ADVERSARIAL_TESTS: &[&str] = &[
    "ioctl_fuzz",
    "faults_in_a_row",
    "hang_with_submissions_trickling",
    "threads_race_one_fd",
    "unmap_under_running_job",
    "gem_close_under_running_job",
    "fork_inherited_fd",
    "ring_saturation",
    "submit_flood",
    "signals_during_waits",
    "kmsg_clean",
];

/// The profile suite (`rgtest.suite=profile`): where a SUBMIT's time goes,
/// from ftrace's `function_graph` tracer in the guest (docs/perf.md,
/// "Where a SUBMIT's time goes").
pub const PROFILE_TESTS: &[&str] = &["submit_profile"];

/// Which list of guest tests a boot runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Suite {
    /// [`GUEST_TESTS`].
    Main,
    /// [`ADVERSARIAL_TESTS`].
    Adversarial,
    /// [`PROFILE_TESTS`].
    Profile,
}

impl Suite {
    /// The suite's tests on kernel `kind`, in order: on the debug kernel
    /// the main suite adds [`DEBUG_KERNEL_TESTS`] ([`guest_tests`]), the
    /// adversarial suite the kmemleak scan before its last test.
    pub fn tests(self, kind: KernelKind) -> Vec<&'static str> {
        match self {
            Suite::Main => guest_tests(kind),
            Suite::Adversarial => {
                let mut v = ADVERSARIAL_TESTS.to_vec();
                if kind == KernelKind::Debug {
                    let last = v.pop();
                    v.push(DEBUG_KERNEL_TESTS[1]);
                    v.extend(last);
                }
                v
            }
            Suite::Profile => PROFILE_TESTS.to_vec(),
        }
    }

    /// What the suite adds to a boot's file names (the kept console).
    fn file_suffix(self) -> &'static str {
        match self {
            Suite::Main => "",
            Suite::Adversarial => "-adversarial",
            Suite::Profile => "-profile",
        }
    }

    /// The kernel command-line words that select the suite in the guest
    /// (none for the main suite), with the fuzz seed of `RGTEST_SEED`.
    pub fn cmdline(self) -> String {
        match self {
            Suite::Main => String::new(),
            Suite::Adversarial => match std::env::var("RGTEST_SEED") {
                Ok(seed) if seed.trim().parse::<u64>().is_ok() => {
                    format!(" rgtest.suite=adversarial rgtest.seed={}", seed.trim())
                }
                _ => " rgtest.suite=adversarial".into(),
            },
            Suite::Profile => " rgtest.suite=profile".into(),
        }
    }
}

/// The tests only the debug kernel runs ([`KernelKind::Debug`]), in
/// order: failslab over every driver ioctl, just before [`REMOVES_GPU`]
/// (it needs the GPU), then a kmemleak scan, just before the suite's last
/// test (`kmsg_clean`; the scan covers the removal too). See
/// docs/reliability.md, "The debug kernel".
pub const DEBUG_KERNEL_TESTS: [&str; 2] = ["failslab_ioctls", "kmemleak_clean"];

/// The main suite's test that unplugs the GPU: no device is left for the
/// tests after it (only `kmsg_clean`, and the debug kernel's kmemleak scan).
pub const REMOVES_GPU: &str = "surprise_removal";

/// Which kernel a boot runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelKind {
    /// Debian's stock 6.12 kernel (`tools/fetch-linux-kernel.sh`).
    Stock,
    /// The debug kernel built from Debian's 6.12 source with lockdep,
    /// KASAN, kmemleak, DEBUG_OBJECTS, DMA-API debugging and failslab
    /// (`tools/build-debug-kernel.sh`).
    Debug,
}

impl KernelKind {
    /// The kernel command-line word that tells the guest which kernel it
    /// runs on, if any.
    pub const DEBUG_WORD: &'static str = "rgtest.debug=1";

    /// How many times slower than the stock kernel's guards this kernel's
    /// boot may be ([`RUN_TIMEOUT`], [`INIT_TIMEOUT`]): KASAN, lockdep
    /// and kmemleak under TCG. Failure guards only.
    pub fn guard_factor(self) -> u32 {
        match self {
            KernelKind::Stock => 1,
            KernelKind::Debug => 4,
        }
    }
}

/// The guest suite a kernel runs, in order: [`GUEST_TESTS`], with
/// [`DEBUG_KERNEL_TESTS`] added on the debug kernel (which runs every test
/// of the main suite) where that constant says.
pub fn guest_tests(kind: KernelKind) -> Vec<&'static str> {
    let mut v = GUEST_TESTS.to_vec();
    if kind == KernelKind::Debug {
        let [with_gpu, scan] = DEBUG_KERNEL_TESTS;
        let removal = v.iter().position(|t| *t == REMOVES_GPU).unwrap_or(v.len());
        v.insert(removal, with_gpu);
        let last = v.pop();
        v.push(scan);
        v.extend(last);
    }
    v
}

/// The stock kernel's checks, on every boot's command line: SLUB debugging
/// (sanity checks, red zones, poisoning, user tracking), KFENCE sampling
/// every millisecond, freed memory zeroed, and a panic on any WARN or soft
/// lockup; on a panic the whole kernel log is replayed on the console
/// (`panic_print` bit 5), so the console names the WARN even though the
/// console log level hides it while the guest runs.
pub const KERNEL_CHECKS: &str =
    "slub_debug=FZPU kfence.sample_interval=1 init_on_free=1 panic_on_warn=1 softlockup_panic=1 panic_print=0x20";

/// The debug kernel's checks, added to [`KERNEL_CHECKS`] on its command
/// line: a KASAN report panics (`panic_on_warn` already makes the first
/// one panic; this says so whatever the other words). Lockdep reports,
/// which do not WARN, are found in the log by the guest's `kmsg_clean`.
pub const DEBUG_KERNEL_CHECKS: &str = "kasan.fault=panic";

/// An environment variable whose words are appended to the guest kernel's
/// command line (to investigate: e.g. `refgpu.job_timeout_ms=5000`, which
/// `/init` passes to the module, or `ignore_loglevel`).
pub const EXTRA_CMDLINE: &str = "REFGPU_GUEST_CMDLINE";

/// Failure guard for one boot (the whole suite of one generation).
pub const RUN_TIMEOUT: Duration = Duration::from_secs(600);

/// Failure guard for the stock kernel's own boot: QEMU start to the
/// guest's `@@ PHASE init` line (a few seconds normally).
pub const INIT_TIMEOUT: Duration = Duration::from_secs(180);

/// Where a boot was when its console ended, from the guest's `@@ PHASE`
/// and `@@ RUN` lines: what a timeout names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The kernel had not started `/init`.
    Kernel,
    /// `/init` was mounting file systems and loading the modules.
    Setup,
    /// Inside this test (started, no result yet).
    Test(String),
    /// Between tests, or after the last one.
    Suite,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Phase::Kernel => f.write_str("in the kernel's boot, before /init"),
            Phase::Setup => f.write_str("in /init's setup (mounts, module loading, render node)"),
            Phase::Test(t) => write!(f, "in test {t}"),
            Phase::Suite => f.write_str("between tests"),
        }
    }
}

/// Guest RAM: QEMU `-m`, the shared file and the model's window. On q35
/// guest-physical addresses equal file offsets below 2 GiB, so the model
/// maps the file at physical address 0 (`--mem-base 0`).
pub const RAM: &str = "1G";

/// The QEMU binary.
pub const QEMU: &str = "qemu-system-x86_64";

/// What to tell someone without the tools.
pub const INSTALL_HINT: &str = "the Linux guest tests need qemu-system-x86_64 (Debian bookworm-backports), \
     make, gcc-12, pahole (package dwarves), xz and Debian's 6.12 kernel packages; run as root the harness \
     installs them itself, otherwise install them once with `sudo bash .ci/install-linux-guest.sh`";

pub use vm_harness::Status;

/// What one boot produced.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The suite the boot ran.
    pub suite: Suite,
    /// The kernel booted.
    pub kind: KernelKind,
    /// QEMU's exit code, the console and model lines, the `@@ TEST`
    /// results in order, and whether the boot hit [`RUN_TIMEOUT`] (or
    /// [`INIT_TIMEOUT`]).
    pub boot: vm_harness::Outcome,
    /// `@@ BENCH` lines: (name, the rest of the line).
    pub benches: Vec<(String, String)>,
    /// The guest's closing `N passed, N failed` line, if printed.
    pub summary: Option<String>,
    /// Where the console ended.
    pub phase: Phase,
    /// Stopped at [`INIT_TIMEOUT`]: the kernel had not started `/init`
    /// when the harness last looked.
    pub init_timeout: bool,
    /// Earlier boots of this generation whose kernel did not reach
    /// `/init` within [`INIT_TIMEOUT`] (stopped and booted again).
    pub kernel_stalls: u32,
    /// Wall time of the boot (QEMU start to exit).
    pub wall: Duration,
    /// The guest kernel panicked: its `Kernel panic` line and the line
    /// that says why (the last WARNING, BUG, Oops or lockup line before
    /// it), if any.
    pub panic: Option<(String, Option<String>)>,
}

impl Outcome {
    /// The status of `test`, if reported.
    pub fn status(&self, test: &str) -> Option<&Status> {
        self.boot.status(test)
    }

    /// The last `n` console and model lines, for failure messages.
    pub fn tail(&self, n: usize) -> String {
        let c = &self.boot.console[self.boot.console.len().saturating_sub(n)..];
        let m = &self.boot.model_log[self.boot.model_log.len().saturating_sub(n)..];
        format!(
            "--- last {} console lines ---\n{}\n--- last {} model lines ---\n{}",
            c.len(),
            c.join("\n"),
            m.len(),
            m.join("\n")
        )
    }

    /// Every failure: failed tests, tests not reported, a bad exit.
    pub fn failures(&self) -> Vec<String> {
        let mut f = Vec::new();
        if let Some((line, cause)) = &self.panic {
            f.push(format!(
                "the guest kernel panicked {}: `{line}`; cause: {}",
                self.phase,
                cause.as_deref().map_or("not in the console".into(), |c| format!("`{c}`"))
            ));
        }
        let tests = self.suite.tests(self.kind);
        for t in &tests {
            match self.status(t) {
                Some(Status::Pass) => {}
                Some(Status::Fail(why) | Status::Skip(why)) => f.push(format!("{t}: {why}")),
                None => f.push(format!("{t}: not reported")),
            }
        }
        for (n, _) in &self.boot.results {
            if !tests.contains(&n.as_str()) {
                f.push(format!(
                    "{n}: reported but not in the {:?} suite's list on the {:?} kernel",
                    self.suite, self.kind
                ));
            }
        }
        if self.boot.timed_out {
            f.push(format!("the boot timed out {}: QEMU and the model were killed", self.phase));
        } else if self.phase != Phase::Suite {
            f.push(format!("the console ended {}", self.phase));
        }
        if self.summary.is_none() {
            f.push("no closing `N passed, N failed` line".into());
        }
        let want = if f.is_empty() { Some(1) } else { self.boot.exit_code };
        if self.boot.exit_code != want || self.boot.exit_code.is_none() {
            f.push(format!("QEMU exit status {:?} (isa-debug-exit 0 gives 1)", self.boot.exit_code));
        }
        f
    }
}

/// Why a boot could not be made: a tool missing
/// ([`HarnessError::Missing`] with [`INSTALL_HINT`]), a build or the
/// set-up failed.
pub use vm_harness::HarnessError;

/// A missing tool or package, `what`, with the install hint.
fn missing(what: String) -> HarnessError {
    HarnessError::Missing { what: format!("{what} not found"), hint: INSTALL_HINT }
}

/// The harness's own directory (`target/linux-tests`).
pub fn harness_dir() -> PathBuf {
    target_base().join("linux-tests")
}

/// A kernel to boot: kind, version and directory.
#[derive(Clone, Debug)]
pub struct Kernel {
    /// Stock or debug.
    pub kind: KernelKind,
    /// e.g. `6.12.117+deb12-amd64`.
    pub version: String,
    /// `target/linux-kernel/<version>` (stock) or the debug kernel's cache
    /// directory ([`debug_kernel_cache`]).
    pub dir: PathBuf,
}

impl Kernel {
    /// The bzImage.
    pub fn image(&self) -> PathBuf {
        match self.kind {
            KernelKind::Stock => self.dir.join("root/boot").join(format!("vmlinuz-{}", self.version)),
            KernelKind::Debug => self.dir.join("bzImage"),
        }
    }

    /// The tree to build modules against.
    pub fn headers(&self) -> PathBuf {
        match self.kind {
            KernelKind::Stock => {
                self.dir.join("root/usr/src").join(format!("linux-headers-{}", self.version))
            }
            KernelKind::Debug => self.dir.join("build"),
        }
    }

    /// The kernel modules the guest loads before ours (`order` lists them,
    /// dependencies first; empty when the kernel has them built in).
    pub fn modules(&self) -> PathBuf {
        self.dir.join("modules")
    }
}

fn find_kernel() -> Option<Kernel> {
    let base = target_base().join("linux-kernel");
    let version = std::fs::read_to_string(base.join("current")).ok()?.trim().to_string();
    let dir = base.join(&version);
    dir.join("ok").exists().then_some(Kernel { kind: KernelKind::Stock, version, dir })
}

/// Where `tools/build-debug-kernel.sh` caches the debug kernel:
/// `$REFGPU_DEBUG_KERNEL_CACHE`, else `~/.cache/refgpu/debug-kernel`
/// (outside the clone, so a fresh clone reuses it).
pub fn debug_kernel_cache() -> PathBuf {
    if let Some(d) = std::env::var_os("REFGPU_DEBUG_KERNEL_CACHE") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/refgpu/debug-kernel")
}

/// What building the debug kernel needs beyond [`TOOLS`].
const DEBUG_KERNEL_SOURCE: &str = "/usr/src/linux-source-6.12.tar.xz";
const DEBUG_TOOLS: [(&str, &str); 3] = [("flex", "--version"), ("bison", "--version"), ("bc", "--version")];

/// The kernel directory `tools/build-debug-kernel.sh` names on the last
/// line of its output `stdout`: the build of this checkout's configuration
/// (never a shared pointer another run with another configuration may
/// have moved), if that directory is complete (it holds `ok`).
fn built_kernel_dir(stdout: &str) -> Option<PathBuf> {
    let dir = PathBuf::from(stdout.lines().rev().map(str::trim).find(|l| !l.is_empty())?);
    (dir.is_absolute() && dir.join("ok").is_file()).then_some(dir)
}

/// The debug kernel, built by `tools/build-debug-kernel.sh` (which returns
/// at once when the cache holds this source version and configuration;
/// a cold build takes tens of minutes, see docs/reliability.md).
fn debug_kernel() -> Result<Kernel, HarnessError> {
    let present =
        || Path::new(DEBUG_KERNEL_SOURCE).exists() && DEBUG_TOOLS.iter().all(|(c, a)| tool_runs(c, a));
    vm_harness::setup::ensure_installed(
        "the debug kernel's source (linux-source-6.12) and build tools (flex, bison, bc, libelf-dev, libssl-dev)",
        ".ci/install-debug-kernel.sh",
        present,
    )
    .map_err(HarnessError::Setup)?;
    let cache = debug_kernel_cache();
    let script = workspace_root().join("tools/build-debug-kernel.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(&cache)
        .output()
        .map_err(|e| HarnessError::Setup(format!("running {}: {e}", script.display())))?;
    if !out.status.success() {
        let log = String::from_utf8_lossy(&out.stdout);
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        return Err(HarnessError::Build(format!(
            "the debug kernel ({} failed: {}):\n{}",
            script.display(),
            String::from_utf8_lossy(&out.stderr).trim(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )));
    }
    let dir = built_kernel_dir(&String::from_utf8_lossy(&out.stdout)).ok_or_else(|| {
        HarnessError::Setup(format!(
            "{} printed no kernel directory (its last line must be one holding `ok`):\n{}",
            script.display(),
            String::from_utf8_lossy(&out.stdout).trim()
        ))
    })?;
    let read = |p: PathBuf| std::fs::read_to_string(&p).map(|s| s.trim().to_string());
    let version = read(dir.join("kver"))
        .map_err(|e| HarnessError::Setup(format!("{}: no kver: {e}", dir.display())))?;
    Ok(Kernel { kind: KernelKind::Debug, version, dir })
}

/// The kernel tree, fetched with `tools/fetch-linux-kernel.sh` if missing.
pub fn kernel() -> Result<Kernel, HarnessError> {
    if let Some(k) = find_kernel() {
        return Ok(k);
    }
    let script = workspace_root().join("tools/fetch-linux-kernel.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(target_base().join("linux-kernel"))
        .output()
        .map_err(|e| HarnessError::Setup(format!("running {}: {e}", script.display())))?;
    if !out.status.success() {
        return Err(missing(format!(
            "the kernel packages ({} failed: {})",
            script.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    find_kernel().ok_or_else(|| HarnessError::Setup("the fetch script left no kernel".into()))
}

/// Paths of everything a boot needs.
#[derive(Clone, Debug)]
pub struct Artifacts {
    /// The kernel.
    pub kernel: Kernel,
    /// The initramfs (uncompressed newc cpio).
    pub initramfs: PathBuf,
    /// The model server.
    pub sim: PathBuf,
}

/// The host tools a boot needs (QEMU, the module's compiler and BTF
/// generator) and the fetch script's `xz`.
const TOOLS: [(&str, &str); 5] = [
    (QEMU, "--version"),
    ("make", "--version"),
    ("gcc-12", "--version"),
    ("pahole", "--version"),
    ("xz", "--version"),
];

fn tools_present() -> bool {
    TOOLS.iter().all(|(cmd, arg)| tool_runs(cmd, arg))
}

/// The host tools and the kernel, installed with
/// `.ci/install-linux-guest.sh` when missing and the tests run as root
/// (once, under the set-up lock shared by every test binary); without root
/// a missing tool is an error naming it and the exact command. A missing
/// kernel alone is fetched without root ([`kernel`]).
fn ensure_setup(kind: KernelKind) -> Result<Kernel, HarnessError> {
    if vm_harness::setup::is_root() {
        vm_harness::setup::ensure_installed(
            "the Linux guest's tools (qemu-system-x86_64, make, gcc-12, pahole, xz) and kernel packages",
            ".ci/install-linux-guest.sh",
            || tools_present() && find_kernel().is_some(),
        )
        .map_err(HarnessError::Setup)?;
    }
    if let Some((cmd, _)) = TOOLS.iter().find(|(cmd, arg)| !tool_runs(cmd, arg)) {
        return Err(missing((*cmd).into()));
    }
    match kind {
        KernelKind::Stock => kernel(),
        KernelKind::Debug => debug_kernel(),
    }
}

fn build_module(k: &Kernel) -> Result<PathBuf, HarnessError> {
    let src = workspace_root().join("kmd");
    let dst = harness_dir().join(flavored("kmd", k.kind));
    copy_tree(&src, &dst).map_err(|e| HarnessError::Setup(format!("copying kmd/: {e}")))?;
    let mut make = Command::new("make");
    make.arg("-C").arg(&dst).arg(format!("KDIR={}", k.headers().display()));
    if k.kind == KernelKind::Debug {
        // The compiler the debug kernel was built with, by name (kbuild
        // warns when the version text differs).
        make.arg("CC=gcc-12");
    }
    let out = make.output().map_err(|e| HarnessError::Build(format!("running make: {e}")))?;
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        return Err(HarnessError::Build(format!("the kernel module:\n{log}")));
    }
    if log.contains("warning:") {
        return Err(HarnessError::Build(format!("the kernel module built with warnings:\n{log}")));
    }
    Ok(dst.join("refgpu.ko"))
}

/// Copies the regular files of `src` (recursively) into `dst`, leaving
/// build products already in `dst` so make rebuilds only what changed.
fn copy_tree(src: &Path, dst: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dst)?;
    for e in std::fs::read_dir(src)? {
        let e = e?;
        let to = dst.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_tree(&e.path(), &to)?;
        } else {
            let data = std::fs::read(e.path())?;
            if std::fs::read(&to).ok().as_deref() != Some(&data[..]) {
                std::fs::write(&to, data)?;
            }
        }
    }
    Ok(())
}

/// `name` for the stock kernel, `name-debug` for the debug kernel: the
/// kinds' build products do not overwrite each other.
fn flavored(name: &str, kind: KernelKind) -> String {
    match kind {
        KernelKind::Stock => name.to_string(),
        KernelKind::Debug => format!("{name}-debug"),
    }
}

fn cargo(args: &[&str]) -> Result<(), HarnessError> {
    vm_harness::cargo(args, &[], &harness_dir().join("cargo")).map_err(HarnessError::Build)
}

/// The guest's Rust target.
pub const GUEST_TARGET: &str = "x86_64-unknown-linux-musl";

fn build_initramfs(k: &Kernel, module: &Path, guest: &Path) -> Result<PathBuf, HarnessError> {
    let setup = |e: std::io::Error| HarnessError::Setup(format!("writing the initramfs: {e}"));
    let mods = k.modules();
    let order = std::fs::read_to_string(mods.join("order")).map_err(setup)?;
    let path = harness_dir().join(flavored("initramfs", k.kind) + ".cpio");
    let file = std::fs::File::create(&path).map_err(setup)?;
    let mut c = cpio::Cpio::new(std::io::BufWriter::new(file));
    for d in ["dev", "proc", "sys", "tmp", "lib", "lib/modules"] {
        c.dir(d).map_err(setup)?;
    }
    c.chardev("dev/console", 0o600, 5, 1).map_err(setup)?;
    let mut list = String::new();
    for m in order.lines().filter(|l| !l.trim().is_empty()) {
        let data = std::fs::read(mods.join(format!("{m}.ko"))).map_err(setup)?;
        c.file(&format!("lib/modules/{m}.ko"), 0o644, &data).map_err(setup)?;
        list.push_str(m);
        list.push('\n');
    }
    c.file("lib/modules/refgpu.ko", 0o644, &std::fs::read(module).map_err(setup)?).map_err(setup)?;
    list.push_str("refgpu\n");
    c.file("lib/modules/order", 0o644, list.as_bytes()).map_err(setup)?;
    c.file("init", 0o755, &std::fs::read(guest).map_err(setup)?).map_err(setup)?;
    c.finish().map_err(setup)?;
    Ok(path)
}

/// Builds everything for the stock kernel once per test process.
pub fn artifacts() -> Result<Artifacts, String> {
    artifacts_for(KernelKind::Stock)
}

/// Builds everything for `kind` once per test process.
pub fn artifacts_for(kind: KernelKind) -> Result<Artifacts, String> {
    static BUILT: [OnceLock<Result<Artifacts, String>>; 2] = [OnceLock::new(), OnceLock::new()];
    BUILT[kind as usize]
        .get_or_init(|| {
            let go = || -> Result<Artifacts, HarnessError> {
                let kernel = ensure_setup(kind)?;
                let module = build_module(&kernel)?;
                cargo(&[
                    "build",
                    "--release",
                    "--target",
                    GUEST_TARGET,
                    "-p",
                    "linux-tests",
                    "--features",
                    "guest",
                    "--bin",
                    "refgpu-guest",
                ])?;
                cargo(&["build", "--release", "-p", "refgpu-sim", "--bin", "refgpu-sim"])?;
                let c = harness_dir().join("cargo");
                let guest = c.join(GUEST_TARGET).join("release").join("refgpu-guest");
                let initramfs = build_initramfs(&kernel, &module, &guest)?;
                Ok(Artifacts { kernel, initramfs, sim: c.join("release").join("refgpu-sim") })
            };
            go().map_err(|e| e.to_string())
        })
        .clone()
}

/// Boots `suite` on GPU generation `gen` on the stock kernel
/// ([`boot_on`]).
pub fn boot(gen: u8, suite: Suite) -> Result<Outcome, HarnessError> {
    boot_on(gen, suite, KernelKind::Stock)
}

/// Boots `suite` on GPU generation `gen` on kernel `kind`; once more if
/// the kernel did not reach `/init` (at most one retry, counted in
/// [`Outcome::kernel_stalls`]).
pub fn boot_on(gen: u8, suite: Suite, kind: KernelKind) -> Result<Outcome, HarnessError> {
    let first = boot_once(gen, suite, kind)?;
    if !first.init_timeout {
        return Ok(first);
    }
    eprintln!(
        "gen{gen}: the kernel did not start /init within {} s; booting again. Console:\n{}",
        (INIT_TIMEOUT * kind.guard_factor()).as_secs(),
        first.tail(20)
    );
    let mut again = boot_once(gen, suite, kind)?;
    again.kernel_stalls = 1;
    Ok(again)
}

/// One boot of `suite` on generation `gen` and kernel `kind`.
fn boot_once(gen: u8, suite: Suite, kind: KernelKind) -> Result<Outcome, HarnessError> {
    let art = artifacts_for(kind).map_err(HarnessError::Build)?;
    let dir = tempfile::Builder::new()
        .prefix("linux-tests-")
        .tempdir()
        .map_err(|e| HarnessError::Setup(format!("temp dir: {e}")))?;
    let sock = dir.path().join("ivshmem.sock");
    let ram = dir.path().join("guest-ram");
    let qmp = dir.path().join("qmp.sock");

    let model_lines: Lines = Arc::default();
    let mut sim = ChildGuard::new(
        Command::new(&art.sim)
            .arg("--socket")
            .arg(&sock)
            .arg("--mem-file")
            .arg(&ram)
            .args(["--mem-base", "0", "--mem-size", RAM, "--gen", &gen.to_string(), "--vectors", "4"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| HarnessError::Setup(format!("starting {}: {e}", art.sim.display())))?,
        true,
    );
    let mut readers = Vec::new();
    collect_output(&mut sim, &model_lines, &mut readers);
    wait_for_model(&mut sim, &model_lines, &mut readers, "listening", || sock.exists())?;

    let console: Lines = Arc::default();
    let start = Instant::now();
    let mut qemu = ChildGuard::new(
        Command::new(QEMU)
            .args(["-accel", "tcg,thread=multi", "-cpu", "max", "-smp", "2"])
            .args(["-machine", "q35,memory-backend=mem", "-m", RAM])
            .arg("-object")
            .arg(format!("memory-backend-file,id=mem,size={RAM},mem-path={},share=on", ram.display()))
            .arg("-chardev")
            .arg(format!("socket,path={},id=ivs", sock.display()))
            // Behind a PCIe root port: q35's root bus cannot hot-unplug
            // (DEVICE_DEL); QEMU signals the removal through ACPI.
            .args(["-device", "pcie-root-port,id=rp0,chassis=1"])
            .args(["-device", &format!("ivshmem-doorbell,chardev=ivs,vectors=4,id={GPU_ID},bus=rp0")])
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp.display()))
            .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"])
            .args(["-nographic", "-nic", "none", "-no-reboot", "-monitor", "none", "-serial", "stdio"])
            .arg("-kernel")
            .arg(art.kernel.image())
            .arg("-initrd")
            .arg(&art.initramfs)
            .arg("-append")
            .arg(format!(
                "console=ttyS0 quiet loglevel=3 panic=-1 {KERNEL_CHECKS} refgpu.job_timeout_ms=1000 rgtest.gen={gen}{}{}{}",
                suite.cmdline(),
                match kind {
                    KernelKind::Stock => String::new(),
                    KernelKind::Debug => format!(" {DEBUG_KERNEL_CHECKS} {}", KernelKind::DEBUG_WORD),
                },
                std::env::var(EXTRA_CMDLINE).map(|w| format!(" {w}")).unwrap_or_default()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| HarnessError::Setup(format!("starting {QEMU}: {e}")))?,
        false,
    );
    collect_output(&mut qemu, &console, &mut readers);

    let deadline = Instant::now() + RUN_TIMEOUT * kind.guard_factor();
    let init_deadline = Instant::now() + INIT_TIMEOUT * kind.guard_factor();
    let mut reached_init = false;
    let mut seen = 0;
    // Stopped early (Exit::Stopped) only when the kernel did not reach
    // `/init` in time.
    let end = wait_for_exit(&mut qemu, deadline, Duration::from_millis(20), || {
        seen = guest_requests(&console, seen, &sim, &qmp);
        if !reached_init {
            reached_init = console.lock().map(|c| c.iter().any(|l| l.contains(INIT_LINE))).unwrap_or(false);
            if !reached_init && Instant::now() > init_deadline {
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    });
    let init_timeout = end == Exit::Stopped;
    let wall = start.elapsed();
    qemu.stop();
    signal_model(&sim, libc::SIGCONT);
    sim.stop();
    for r in readers {
        let _ = r.join();
    }
    drop(dir);
    let timed_out = matches!(end, Exit::TimedOut | Exit::Stopped);
    let mut out = parse(snapshot(&console), snapshot(&model_lines), end.code(), timed_out, wall);
    out.init_timeout = init_timeout;
    out.suite = suite;
    out.kind = kind;
    // The whole console, for what the failure's tail does not show.
    let log =
        harness_dir().join(flavored(&format!("console-gen{gen}{}", suite.file_suffix()), kind) + ".log");
    let _ = std::fs::write(&log, out.boot.console.join("\n"));
    Ok(out)
}

/// The guest asks for the model to be frozen (the device stops answering,
/// as a hung GPU would) with this line and lets it run again with
/// [`MODEL_CONT`]; it sees the effect in the model's CLOCK register.
pub const MODEL_STOP: &str = "@@ MODEL STOP";
/// See [`MODEL_STOP`].
pub const MODEL_CONT: &str = "@@ MODEL CONT";

/// The guest asks for its GPU to be hot-unplugged with this line: the
/// harness sends QEMU's monitor (QMP) `device_del` for the device
/// [`GPU_ID`], and QEMU asks the guest to eject it (ACPI hotplug of the
/// PCIe root port the device sits behind). The guest sees the device go
/// from sysfs; the harness adds a `@@ HOST` line with QEMU's answer to the
/// console.
pub const DEVICE_DEL: &str = "@@ DEVICE DEL";

/// QEMU's id of the GPU (the `ivshmem-doorbell` device).
pub const GPU_ID: &str = "gpu";

/// Failure guard for one exchange with QEMU's monitor.
const QMP_LIMIT: Duration = Duration::from_secs(10);

/// Carries out the [`MODEL_STOP`], [`MODEL_CONT`] and [`DEVICE_DEL`] lines
/// of the console after its first `seen` lines (`qmp`: QEMU's monitor
/// socket); returns how many lines it has seen.
fn guest_requests(console: &Lines, seen: usize, sim: &ChildGuard, qmp: &Path) -> usize {
    let mut unplug = false;
    let n = {
        let Ok(lines) = console.lock() else { return seen };
        for l in lines.iter().skip(seen) {
            if l.contains(MODEL_STOP) {
                signal_model(sim, libc::SIGSTOP);
            } else if l.contains(MODEL_CONT) {
                signal_model(sim, libc::SIGCONT);
            } else if l.contains(DEVICE_DEL) {
                unplug = true;
            }
        }
        lines.len().max(seen)
    };
    if unplug {
        let answer =
            qmp_command(qmp, &format!(r#"{{"execute": "device_del", "arguments": {{"id": "{GPU_ID}"}}}}"#));
        let line = match answer {
            Ok(a) => format!("@@ HOST device_del {GPU_ID}: {a}"),
            Err(e) => format!("@@ HOST device_del {GPU_ID} failed: {e}"),
        };
        // Scanned again next time (lines may have come in meanwhile): it
        // holds no request.
        if let Ok(mut lines) = console.lock() {
            lines.push(line);
        }
    }
    n
}

/// Sends `command` (one JSON object) to QEMU's monitor at `socket` after
/// the capabilities negotiation; returns QEMU's answer (its `return` or
/// `error` line; the greeting and events are skipped).
fn qmp_command(socket: &Path, command: &str) -> Result<String, String> {
    use std::io::{BufRead, BufReader, Write};
    let s =
        std::os::unix::net::UnixStream::connect(socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    s.set_read_timeout(Some(QMP_LIMIT)).map_err(|e| e.to_string())?;
    let mut w = s.try_clone().map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s);
    let mut answer = || -> Result<String, String> {
        loop {
            let mut l = String::new();
            match r.read_line(&mut l) {
                Ok(0) => return Err("QEMU closed the monitor".into()),
                Ok(_) if l.contains(r#""return""#) || l.contains(r#""error""#) => return Ok(l.trim().into()),
                Ok(_) => {}
                Err(e) => return Err(format!("reading the monitor: {e}")),
            }
        }
    };
    let mut send = |c: &str| -> Result<String, String> {
        writeln!(w, "{c}").map_err(|e| format!("writing to the monitor: {e}"))?;
        answer()
    };
    let a = send(r#"{"execute": "qmp_capabilities"}"#)?;
    if a.contains(r#""error""#) {
        return Err(format!("qmp_capabilities: {a}"));
    }
    send(command)
}

fn signal_model(sim: &ChildGuard, sig: i32) {
    if let Ok(pid) = i32::try_from(sim.child.id()) {
        // SAFETY: kill(2) on our own child, not reaped before `sim.stop()`.
        unsafe { libc::kill(pid, sig) };
    }
}

/// The guest's first line, printed as `/init` starts.
pub const INIT_LINE: &str = "@@ PHASE init";

/// How the kernel starts a panic message.
pub const PANIC_LINE: &str = "Kernel panic - not syncing";

/// What the kernel prints for what makes it panic here: a WARN (with
/// `panic_on_warn`), a BUG or KFENCE report, an oops, a soft lockup, a
/// SLUB consistency error.
const CAUSES: [&str; 5] = ["WARNING: CPU:", "BUG:", "BUG ", "Oops", "general protection fault"];

/// A console line without its carriage return.
fn kernel_line(l: &str) -> &str {
    l.trim_end_matches('\r')
}

/// Turns the console into an [`Outcome`].
pub fn parse(
    console: Vec<String>,
    model_log: Vec<String>,
    exit_code: Option<i32>,
    timed_out: bool,
    wall: Duration,
) -> Outcome {
    let mut out = Outcome {
        suite: Suite::Main,
        kind: KernelKind::Stock,
        boot: vm_harness::Outcome { exit_code, console, model_log, results: Vec::new(), timed_out },
        benches: Vec::new(),
        summary: None,
        phase: Phase::Kernel,
        init_timeout: false,
        kernel_stalls: 0,
        wall,
        panic: None,
    };
    // The first panic line is the panic; the cause is the last WARNING,
    // BUG or lockup line before the last one (after the log replay, which
    // shows what the console level hid while the guest ran).
    let panics: Vec<usize> =
        out.boot.console.iter().enumerate().filter(|(_, l)| l.contains(PANIC_LINE)).map(|(i, _)| i).collect();
    if let (Some(&first), Some(&last)) = (panics.first(), panics.last()) {
        let l = kernel_line(&out.boot.console[first]);
        let line = l[l.find(PANIC_LINE).unwrap_or(0)..].trim().to_string();
        let cause = out.boot.console[..last]
            .iter()
            .rev()
            .map(|l| kernel_line(l).trim())
            .find(|l| CAUSES.iter().any(|c| l.contains(c)))
            .map(str::to_string);
        out.panic = Some((line, cause));
    }
    for l in &out.boot.console {
        // The firmware's terminal escapes may precede the first line.
        let l = l.trim_end_matches('\r');
        let l = l.find("@@ ").map_or(l, |i| &l[i..]);
        if l.starts_with(INIT_LINE) {
            out.phase = Phase::Setup;
        } else if l.starts_with("@@ PHASE ready") {
            out.phase = Phase::Suite;
        } else if let Some(t) = l.strip_prefix("@@ RUN ") {
            out.phase = Phase::Test(t.trim().to_string());
        } else if let Some(r) = l.strip_prefix("@@ TEST ") {
            out.phase = Phase::Suite;
            let mut it = r.splitn(3, ' ');
            let (name, st, why) = (it.next().unwrap_or(""), it.next().unwrap_or(""), it.next().unwrap_or(""));
            let st =
                if st == "PASS" { Status::Pass } else { Status::Fail(format!("{st} {why}").trim().into()) };
            out.boot.results.push((name.to_string(), st));
        } else if let Some(b) = l.strip_prefix("@@ BENCH ") {
            let (name, rest) = b.split_once(' ').unwrap_or((b, ""));
            out.benches.push((name.to_string(), rest.to_string()));
        } else if l.contains(" passed, ") && l.trim_end().ends_with(" failed") {
            out.summary = Some(l.trim().to_string());
        }
    }
    out
}

/// Boots each generation and suite once per test process on the stock
/// kernel and shares the outcome.
pub fn outcome(gen: u8, suite: Suite) -> Arc<Result<Outcome, String>> {
    outcome_on(gen, suite, KernelKind::Stock)
}

/// Boots each generation, suite and kernel once per test process and
/// shares the outcome.
pub fn outcome_on(gen: u8, suite: Suite, kind: KernelKind) -> Arc<Result<Outcome, String>> {
    type Cell = Arc<OnceLock<Arc<Result<Outcome, String>>>>;
    type Boots = HashMap<(u8, Suite, KernelKind), Cell>;
    static RUNS: OnceLock<Mutex<Boots>> = OnceLock::new();
    let cell = {
        let map = RUNS.get_or_init(Mutex::default);
        let mut m = map.lock().unwrap_or_else(|p| p.into_inner());
        m.entry((gen, suite, kind)).or_default().clone()
    };
    cell.get_or_init(|| Arc::new(boot_on(gen, suite, kind).map_err(|e| e.to_string()))).clone()
}

/// Test body: the main suite of generation `gen` passed on the stock
/// kernel; otherwise a panic listing every failure with the console's tail.
pub fn check_generation(gen: u8) {
    check_suite_on(gen, Suite::Main, KernelKind::Stock);
}

/// Test body: the main suite of generation `gen` passed on kernel `kind`.
pub fn check_generation_on(gen: u8, kind: KernelKind) {
    check_suite_on(gen, Suite::Main, kind);
}

/// Test body: `suite` on generation `gen` passed on the stock kernel.
pub fn check_suite(gen: u8, suite: Suite) {
    check_suite_on(gen, suite, KernelKind::Stock);
}

/// Test body: `suite` on generation `gen` passed on kernel `kind`;
/// otherwise a panic listing every failure with the console's tail.
pub fn check_suite_on(gen: u8, suite: Suite, kind: KernelKind) {
    let out = outcome_on(gen, suite, kind);
    let out = match out.as_ref() {
        Ok(o) => o,
        Err(e) => panic!("{e}"),
    };
    for (name, text) in &out.benches {
        println!("gen{gen} bench {name}: {text}");
    }
    // The adversarial suite's seed and tallies.
    if suite == Suite::Adversarial {
        for l in out.boot.console.iter().filter_map(|l| l.find("guest: ").map(|i| &l[i..])) {
            println!("gen{gen} {}", l.trim_end());
        }
    }
    // The profile suite's table (docs/perf.md, "Where a SUBMIT's time goes").
    if suite == Suite::Profile {
        for l in out.boot.console.iter().filter_map(|l| l.find("@@ PROFILE ").map(|i| &l[i + 11..])) {
            println!("gen{gen} profile {}", l.trim_end());
        }
    }
    println!(
        "gen{gen} {suite:?}: {} guest tests on the {kind:?} kernel, boot {:.1} s",
        out.boot.results.len(),
        out.wall.as_secs_f64()
    );
    if out.kernel_stalls > 0 {
        println!("gen{gen}: booted again after the kernel stalled before /init");
    }
    let f = out.failures();
    let log =
        harness_dir().join(flavored(&format!("console-gen{gen}{}", suite.file_suffix()), kind) + ".log");
    assert!(
        f.is_empty(),
        "gen{gen}: {} failures:\n  {}\n{}\n(the whole console: {})",
        f.len(),
        f.join("\n  "),
        out.tail(60),
        log.display()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase_of(lines: &[&str], timed_out: bool) -> Outcome {
        let console = lines.iter().map(|l| l.to_string()).collect();
        parse(console, Vec::new(), None, timed_out, Duration::ZERO)
    }

    #[test]
    fn a_timeout_names_the_phase_it_ended_in() {
        let o = phase_of(&["SeaBIOS", "Booting from ROM..."], true);
        assert_eq!(o.phase, Phase::Kernel);
        assert!(o.failures().iter().any(|f| f.contains("before /init")), "{:?}", o.failures());
        assert_eq!(phase_of(&["\x1b[2J@@ PHASE init"], true).phase, Phase::Setup);
        assert_eq!(phase_of(&["@@ PHASE init", "@@ PHASE ready"], true).phase, Phase::Suite);
        let o = phase_of(&["@@ PHASE init", "@@ PHASE ready", "@@ RUN get_param"], true);
        assert_eq!(o.phase, Phase::Test("get_param".into()));
        assert!(o.failures().iter().any(|f| f.contains("in test get_param")), "{:?}", o.failures());
        let o = phase_of(
            &["@@ PHASE init", "@@ PHASE ready", "@@ RUN get_param", "@@ TEST get_param PASS (1 ms)"],
            true,
        );
        assert_eq!(o.phase, Phase::Suite);
        assert_eq!(o.status("get_param"), Some(&Status::Pass));
        let o = phase_of(&["@@ PHASE init", "guest: setup failed: x", "0 passed, 1 failed"], false);
        assert!(o.failures().iter().any(|f| f.contains("ended in /init's setup")), "{:?}", o.failures());
    }

    #[test]
    fn the_debug_kernel_runs_the_main_suite_and_its_tests() {
        assert_eq!(guest_tests(KernelKind::Stock), GUEST_TESTS);
        let d = guest_tests(KernelKind::Debug);
        // Every test of the main suite runs on the debug kernel too, in
        // its order; failslab right before the GPU's removal, the kmemleak
        // scan after it, before the last test.
        let main: Vec<_> = d.iter().filter(|t| !DEBUG_KERNEL_TESTS.contains(t)).copied().collect();
        assert_eq!(main, GUEST_TESTS);
        assert_eq!(d.len(), GUEST_TESTS.len() + DEBUG_KERNEL_TESTS.len());
        let at = |name| d.iter().position(|t| *t == name).unwrap();
        assert_eq!(at(DEBUG_KERNEL_TESTS[0]) + 1, at(REMOVES_GPU));
        assert_eq!(&d[d.len() - 2..], [DEBUG_KERNEL_TESTS[1], GUEST_TESTS[GUEST_TESTS.len() - 1]]);
        // A debug-kernel boot that did not report them fails; a stock boot
        // that reported them fails too.
        let mut lines: Vec<String> = vec!["@@ PHASE init".into(), "@@ PHASE ready".into()];
        lines.extend(GUEST_TESTS.iter().map(|t| format!("@@ TEST {t} PASS (1 ms)")));
        lines.push(format!("{} passed, 0 failed", GUEST_TESTS.len()));
        let mut o = parse(lines.clone(), Vec::new(), Some(1), false, Duration::ZERO);
        assert!(o.failures().is_empty(), "{:?}", o.failures());
        o.kind = KernelKind::Debug;
        let f = o.failures();
        assert!(f.iter().any(|f| f == "failslab_ioctls: not reported"), "{f:?}");
        assert!(f.iter().any(|f| f == "kmemleak_clean: not reported"), "{f:?}");
        lines.insert(3, "@@ TEST failslab_ioctls PASS (1 ms)".into());
        let o = parse(lines, Vec::new(), Some(1), false, Duration::ZERO);
        assert!(
            o.failures().iter().any(|f| f.contains("failslab_ioctls: reported but not in")),
            "{:?}",
            o.failures()
        );
    }

    #[test]
    fn the_debug_kernel_scans_for_leaks_after_the_adversarial_suite() {
        assert_eq!(Suite::Adversarial.tests(KernelKind::Stock), ADVERSARIAL_TESTS);
        let d = Suite::Adversarial.tests(KernelKind::Debug);
        let mut want = ADVERSARIAL_TESTS.to_vec();
        want.insert(want.len() - 1, DEBUG_KERNEL_TESTS[1]);
        assert_eq!(d, want);
    }

    #[test]
    fn the_debug_kernel_is_the_one_the_build_script_names() {
        let dir = tempfile::tempdir().unwrap();
        let k = dir.path().join("6.12-abc");
        std::fs::create_dir(&k).unwrap();
        let out = format!("building\ndebug kernel 6.12 ready in:\n{}\n", k.display());
        // Not complete yet: no `ok`.
        assert_eq!(built_kernel_dir(&out), None);
        std::fs::write(k.join("ok"), "").unwrap();
        assert_eq!(built_kernel_dir(&out), Some(k.clone()));
        // Only the last line counts; a relative path is no answer.
        assert_eq!(built_kernel_dir(&format!("{}\ndone\n", k.display())), None);
        assert_eq!(built_kernel_dir("6.12-abc\n"), None);
        assert_eq!(built_kernel_dir(""), None);
    }

    #[test]
    fn a_panic_is_named_with_its_cause() {
        let o = phase_of(
            &[
                "@@ PHASE init",
                "@@ PHASE ready",
                "@@ RUN hang_recovery",
                "[   20.1] Kernel panic - not syncing: kernel: panic_on_warn set ...\r",
                "[    0.0] Linux version 6.12",
                "[   20.0] WARNING: CPU: 1 PID: 80 at drivers/refgpu/refgpu_sched.c:500 refgpu_job_timedout+0x1/0x2",
                "[   20.0] Call Trace:",
                "[   20.1] Kernel panic - not syncing: kernel: panic_on_warn set ...",
            ],
            false,
        );
        let f = o.failures();
        let p = f.iter().find(|f| f.contains("panicked")).expect("the panic is a failure");
        assert!(p.contains("in test hang_recovery"), "{p}");
        assert!(p.contains("`Kernel panic - not syncing: kernel: panic_on_warn set ...`"), "{p}");
        assert!(
            p.contains("cause: `[   20.0] WARNING: CPU: 1 PID: 80 at drivers/refgpu/refgpu_sched.c:500"),
            "{p}"
        );
        let o = phase_of(&["@@ PHASE init", "Kernel panic - not syncing: softlockup: hung tasks"], false);
        assert!(o.failures().iter().any(|f| f.contains("cause: not in the console")), "{:?}", o.failures());
        assert!(phase_of(&["@@ PHASE init", "@@ PHASE ready"], false).panic.is_none());
    }
}
