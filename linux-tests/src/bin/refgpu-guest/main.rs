//! The guest side of `linux-tests`: `/init` of the initramfs (PID 1).
//!
//! Mounts proc, sysfs, devtmpfs and debugfs, loads the DRM modules and
//! `refgpu.ko` (the order is in `/lib/modules/order`; `refgpu.*` kernel
//! command-line parameters are passed to it, as modprobe would), runs the
//! suite (`linux_tests::Suite::tests` for the kernel it runs on: the
//! main suite, or the adversarial one when the kernel command line says
//! `rgtest.suite=adversarial`; one `@@ TEST <name> PASS|FAIL <why>` line
//! each, `@@ BENCH` lines, then `N passed, N failed`) and leaves QEMU
//! through `isa-debug-exit` with 0 when everything passed, 1 otherwise.
//! `@@ PHASE init` (first), `@@ PHASE ready` (modules loaded) and
//! `@@ RUN <name>` (before each test) tell the harness where a boot that
//! timed out was.

mod adversarial;
mod batch;
mod debug_kernel;
mod debugging;
mod drm;
mod fdinfo;
mod fixture;
mod fuzz;
mod hostile;
mod kernel_mode;
mod profile;
mod recovery;
mod tests;
mod tracing;
mod unplug;
mod vm_tables;

use std::ffi::CString;
use std::io::Write;
use std::time::{Duration, Instant};

/// A test's result: `Err` carries the reason.
pub type R = Result<(), String>;

/// Fails the test with a message unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!("{} (at line {})", format!($($fmt)+), line!()));
        }
    };
}

fn mount(src: &str, target: &str, fstype: &str) {
    let c = |s: &str| CString::new(s).unwrap_or_default();
    let (s, t, f) = (c(src), c(target), c(fstype));
    let _ = std::fs::create_dir_all(target);
    // SAFETY: mount(2) with NUL-terminated strings and no data.
    let r = unsafe { libc::mount(s.as_ptr(), t.as_ptr(), f.as_ptr(), 0, std::ptr::null()) };
    if r != 0 {
        println!("guest: mount {fstype} on {target} failed: errno {}", drm::errno());
    }
}

fn load_module(path: &str, params: &str) -> Result<(), String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{path}: {e}"))?;
    let p = CString::new(params).map_err(|_| "bad params".to_string())?;
    use std::os::fd::AsRawFd;
    // SAFETY: finit_module(2) on an open file with NUL-terminated params.
    let r = unsafe { libc::syscall(libc::SYS_finit_module, f.as_raw_fd(), p.as_ptr(), 0) };
    if r != 0 {
        return Err(format!("finit_module({path}): errno {}", drm::errno()));
    }
    Ok(())
}

/// `refgpu.NAME=VALUE` words of the kernel command line, as module
/// parameters.
fn module_params(cmdline: &str, module: &str) -> String {
    let prefix = format!("{module}.");
    cmdline.split_whitespace().filter_map(|w| w.strip_prefix(&prefix)).collect::<Vec<_>>().join(" ")
}

/// Loads `refgpu.ko` again (after `unplug::module_reload` unloaded it)
/// with module parameters `params`.
pub fn load_refgpu(params: &str) -> Result<(), String> {
    load_module("/lib/modules/refgpu.ko", params)
}

/// The GPU generation the harness booted (`rgtest.gen=N`).
fn expected_gen(cmdline: &str) -> Option<u32> {
    cmdline.split_whitespace().find_map(|w| w.strip_prefix("rgtest.gen=")).and_then(|g| g.parse().ok())
}

/// The kernel the harness booted: the debug kernel says so on its command
/// line.
pub fn kernel_kind(cmdline: &str) -> linux_tests::KernelKind {
    if cmdline.split_whitespace().any(|w| w == linux_tests::KernelKind::DEBUG_WORD) {
        linux_tests::KernelKind::Debug
    } else {
        linux_tests::KernelKind::Stock
    }
}

/// The suite the harness chose (`rgtest.suite=adversarial`, else the
/// main one) on the kernel it booted: its tests and the host's list of
/// their names.
fn suite(cmdline: &str) -> (Vec<tests::Test>, Vec<&'static str>) {
    let kind = kernel_kind(cmdline);
    if cmdline.split_whitespace().any(|w| w == "rgtest.suite=adversarial") {
        (adversarial::all(kind), linux_tests::Suite::Adversarial.tests(kind))
    } else if cmdline.split_whitespace().any(|w| w == "rgtest.suite=profile") {
        (profile::all(), linux_tests::Suite::Profile.tests(kind))
    } else {
        (tests::all(kind), linux_tests::Suite::Main.tests(kind))
    }
}

fn exit_qemu(code: u8) -> ! {
    let _ = std::io::stdout().flush();
    // The serial console transmits asynchronously: let it drain, or QEMU
    // exits with the last lines still in the kernel's tty buffer.
    // SAFETY: tcdrain(3) on our stdout.
    unsafe { libc::tcdrain(1) };
    std::thread::sleep(Duration::from_millis(100));
    if let Ok(f) = std::fs::OpenOptions::new().write(true).open("/dev/port") {
        use std::os::unix::fs::FileExt;
        let _ = f.write_at(&[code], 0xf4);
    }
    std::thread::sleep(Duration::from_secs(1));
    // SAFETY: reboot(2) powering the machine off (we are PID 1).
    unsafe { libc::reboot(libc::RB_POWER_OFF) };
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn setup() -> Result<(), String> {
    mount("proc", "/proc", "proc");
    mount("sysfs", "/sys", "sysfs");
    mount("devtmpfs", "/dev", "devtmpfs");
    mount("debugfs", "/sys/kernel/debug", "debugfs");
    tests::kmsg_start();
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    if kernel_kind(&cmdline) == linux_tests::KernelKind::Debug {
        debug_kernel::kmemleak_clear()?;
    }
    let order = std::fs::read_to_string("/lib/modules/order").map_err(|e| format!("module order: {e}"))?;
    for m in order.lines().filter(|l| !l.is_empty()) {
        load_module(&format!("/lib/modules/{m}.ko"), &module_params(&cmdline, m))?;
    }
    let t0 = Instant::now();
    while drm::render_node().is_none_or(|n| std::fs::metadata(n).is_err()) {
        if t0.elapsed() > Duration::from_secs(10) {
            return Err("the refgpu render node did not appear".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    fixture::set_expected_gen(expected_gen(&cmdline));
    Ok(())
}

/// Waits (up to 5 s) for the live BO, VM, context and job counts to return
/// to `before`.
pub fn no_leak(before: Result<[i64; 4], String>) -> R {
    let before = before?;
    let t0 = Instant::now();
    loop {
        let now = fixture::live()?;
        if now == before {
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(5) {
            let engines = fixture::debugfs_dir()
                .and_then(|d| std::fs::read_to_string(d.join("engines")).map_err(|e| e.to_string()))
                .unwrap_or_default();
            return Err(format!(
                "live objects (bos, vms, contexts, jobs) {before:?} -> {now:?} after the test; engines: {}",
                engines.replace('\n', " / ")
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Tests after which the device is gone, with its counts: they wait for
/// its release (`device released`, which warns on a leak) themselves, and
/// no test after them has live objects to compare.
const REMOVES_DEVICE: &[&str] = &["surprise_removal"];

fn main() {
    // Panics are test failures: keep their message on one line.
    std::panic::set_hook(Box::new(|info| {
        println!("guest: panic: {info}");
    }));
    println!("{}", linux_tests::INIT_LINE);
    if let Err(e) = setup() {
        println!("guest: setup failed: {e}");
        println!("0 passed, 1 failed");
        exit_qemu(1);
    }
    println!("@@ PHASE ready");
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let (list, expected) = suite(&cmdline);
    let names: Vec<&str> = list.iter().map(|(n, _)| *n).collect();
    let (mut passed, mut failed) = (0, 0);
    let mut removed = false;
    if names != expected {
        println!("@@ TEST suite_list FAIL the guest's tests differ from the host's list");
        failed += 1;
    }
    for (name, f) in list {
        println!("@@ RUN {name}");
        let _ = std::io::stdout().flush();
        let t0 = Instant::now();
        let before = fixture::live();
        let mut r = std::panic::catch_unwind(f).unwrap_or_else(|_| Err("panicked".into()));
        let ms = t0.elapsed().as_millis();
        // Every test closes what it opened: the driver's live objects
        // (freed asynchronously after the last job) return to where they
        // were. A failed test is waited for too, so the next one does not
        // start with its leftovers in its baseline; its leak, if any, is
        // part of its failure.
        removed |= REMOVES_DEVICE.contains(&name);
        if !removed {
            let drained = no_leak(before);
            r = match (r, drained) {
                (Ok(()), d) => d,
                (Err(why), Ok(())) => Err(why),
                (Err(why), Err(leak)) => Err(format!("{why}; and {leak}")),
            };
        }
        match r {
            Ok(()) => {
                passed += 1;
                println!("@@ TEST {name} PASS ({ms} ms)");
            }
            Err(why) => {
                failed += 1;
                println!("@@ TEST {name} FAIL {}", why.replace('\n', " | "));
            }
        }
        let _ = std::io::stdout().flush();
    }
    println!("{passed} passed, {failed} failed");
    exit_qemu(if failed == 0 { 0 } else { 1 });
}
