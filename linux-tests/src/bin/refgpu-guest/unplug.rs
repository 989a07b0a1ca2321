//! Unplug: the device unbound (sysfs) while a client keeps it open, with
//! work in its rings and queues, then bound again; the module unloaded and
//! loaded again. docs/linux.md, "Unplug and module unload".

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use refgpu_uapi as u;
use umd_core::cmd::{Command, CompareOp, Payload};

use crate::drm::{self, sync, RENDER_NODE};
use crate::ensure;
use crate::fixture::{expect_errno, Fx, DATA_VA};
use crate::R;

/// The driver's directory in sysfs.
const DRIVER: &str = "/sys/bus/pci/drivers/refgpu";

/// Failure guard for an unbind, bind, unload or load (a remove that
/// waits for something that never comes would block the write forever).
const SYSFS_LIMIT: Duration = Duration::from_secs(20);

/// Failure guard for a fence the unplug must end.
const FENCE_LIMIT_MS: i32 = 10_000;

/// The PCI address of the device the driver is bound to.
fn bound_device() -> Result<String, String> {
    let entries = std::fs::read_dir(DRIVER).map_err(|e| format!("{DRIVER}: {e}"))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        // Devices are links named by their address (0000:00:03.0).
        if name.matches(':').count() == 2 && e.path().join("vendor").exists() {
            return Ok(name);
        }
    }
    Err(format!("no device bound to {DRIVER}"))
}

/// Runs `f` in a thread and fails when it does not return within
/// [`SYSFS_LIMIT`] (the thread is left blocked then; the suite reports the
/// failure and its later tests show the damage).
fn within_limit(what: String, f: impl FnOnce() -> Result<(), String> + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(SYSFS_LIMIT) {
        Ok(r) => r,
        Err(_) => Err(format!("{what} did not return within {SYSFS_LIMIT:?}")),
    }
}

/// Writes `value` to the driver's sysfs file `file` (`bind`, `unbind`).
fn driver_write(file: &str, value: &str) -> R {
    let path = format!("{DRIVER}/{file}");
    let v = value.to_string();
    within_limit(format!("writing {value} to {path}"), move || {
        std::fs::write(&path, v).map_err(|e| format!("writing to {path}: {e}"))
    })
}

/// Waits (up to 10 s) until the render node is present or gone.
fn render_node(present: bool) -> R {
    let t0 = Instant::now();
    while Path::new(RENDER_NODE).exists() != present {
        ensure!(
            t0.elapsed() < Duration::from_secs(10),
            "{RENDER_NODE} still {} after 10 s",
            if present { "missing" } else { "present" }
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// The device runs a job again: a write of the data buffer, read back.
fn device_works(what: &str) -> R {
    let mut fx = Fx::new().map_err(|e| format!("{what}: {e}"))?;
    let c = fx.ctx(u::engine::COPY)?;
    let p = fx.run(c, &[Command::WriteData { dst: DATA_VA, data: Payload::Words(&[0x5A5A_0001]) }])?;
    fx.wait(p)?;
    ensure!(fx.data.map.r32(0) == 0x5A5A_0001, "{what}: the job's write is missing");
    Ok(())
}

/// A sync_file the kernel returned, closed on drop.
struct SyncFile(OwnedFd);

impl SyncFile {
    fn new(fd: RawFd) -> Result<Self, String> {
        ensure!(fd >= 0, "SUBMIT returned no sync_file");
        // SAFETY: the kernel just installed `fd` for us; nothing else owns it.
        Ok(SyncFile(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Waits for the fence (up to [`FENCE_LIMIT_MS`]) and returns its
    /// status: 1 signalled without error, else the negative error.
    fn wait(&self, what: &str) -> Result<i32, String> {
        ensure!(drm::poll_in(self.0.as_raw_fd(), FENCE_LIMIT_MS), "{what}: its fence did not signal");
        drm::sync_file_status(self.0.as_raw_fd()).map_err(|e| format!("{what}: SYNC_IOC_FILE_INFO errno {e}"))
    }
}

/// Unbinds the device while a client has it open with a job running
/// forever (H, a WAIT_MEM nobody satisfies), a job behind it in the same
/// ring (J) and a job waiting for H's fence in its context's queue (Q).
/// The unbind must return, every fence must end with an error while the
/// file is still open, the file's ioctls must fail with ENODEV, the close
/// must free everything (the driver warns at its release otherwise:
/// `kmsg_clean`), and the device bound again must run jobs on the same
/// render node (the old one was released).
pub fn unbind_with_open_file() -> R {
    let bdf = bound_device()?;
    let mut fx = Fx::new()?;
    let h = fx.ctx(u::engine::GFX)?;
    let j = fx.ctx(u::engine::GFX)?;
    let q = fx.ctx(u::engine::COPY)?;
    let wait = Command::WaitMem {
        addr: DATA_VA + 0x40,
        reference: 0xDEAD,
        mask: 0xFFFF_FFFF,
        op: CompareOp::Eq,
        wide: false,
    };
    let (ib_h, dw_h) = fx.ib(&[wait])?;
    let (ib_w, dw_w) =
        fx.ib(&[Command::WriteData { dst: DATA_VA + 0x80, data: Payload::Words(&[0x1111]) }])?;
    fx.point += 1;
    let ph = fx.point;
    let out = u::SUBMIT_OUT_SYNC_FILE;
    let sh = fx
        .dev
        .submit_full(h, ib_h, dw_h, &[], &[sync(fx.sync, ph)], out)
        .map_err(|e| format!("SUBMIT H: {e}"))?;
    let sh = SyncFile::new(sh.out_fence_fd)?;
    let sj = fx.dev.submit_full(j, ib_w, dw_w, &[], &[], out).map_err(|e| format!("SUBMIT J: {e}"))?;
    let sj = SyncFile::new(sj.out_fence_fd)?;
    let sq = fx
        .dev
        .submit_full(q, ib_w, dw_w, &[sync(fx.sync, ph)], &[], out)
        .map_err(|e| format!("SUBMIT Q: {e}"))?;
    let sq = SyncFile::new(sq.out_fence_fd)?;
    // H reached the engine (it is waiting on the flag), J is in the ring
    // or the scheduler behind it, Q waits for H in its queue.
    std::thread::sleep(Duration::from_millis(50));
    ensure!(drm::sync_file_status(sq.0.as_raw_fd()) == Ok(0), "Q ended before the unbind");

    driver_write("unbind", &bdf)?;
    ensure!(!Path::new(&format!("{DRIVER}/{bdf}")).exists(), "{bdf} is still bound");

    // The rings are gone with the device: every job ends, with an error.
    let (stat_h, stat_j, stat_q) = (sh.wait("H")?, sj.wait("J")?, sq.wait("Q")?);
    ensure!(stat_h == -libc::ENODEV, "H (running at the unbind) ended with {stat_h}, expected -ENODEV");
    ensure!(stat_j == -libc::ENODEV, "J (queued behind H) ended with {stat_j}, expected -ENODEV");
    ensure!(stat_q < 0, "Q (waiting for H) ended with {stat_q}, expected an error");
    ensure!(fx.data.map.r32(0x80) == 0, "a job ran after the unbind");
    // The file stays open but the device is gone.
    expect_errno(fx.dev.param(u::param::GENERATION), libc::ENODEV, "GET_PARAM after the unbind")?;
    expect_errno(fx.dev.submit_full(j, ib_w, dw_w, &[], &[], 0), libc::ENODEV, "SUBMIT after the unbind")?;
    expect_errno(fx.dev.ctx_create(u::engine::GFX), libc::ENODEV, "CTX_CREATE after the unbind")?;
    drop((sh, sj, sq));
    drop(fx);

    driver_write("bind", &bdf)?;
    render_node(true)?;
    device_works("after binding again")
}

/// Unloads the module (no client has the device open) and loads it again
/// with the same parameters: the render node goes and comes back, and the
/// device runs jobs.
pub fn module_reload() -> R {
    // A client that has come and gone: its objects were freed at close.
    device_works("before the unload")?;
    within_limit("unloading refgpu".into(), || {
        let name = c"refgpu";
        // SAFETY: delete_module(2) with a NUL-terminated name.
        let r = unsafe { libc::syscall(libc::SYS_delete_module, name.as_ptr(), libc::O_NONBLOCK) };
        ensure!(r == 0, "delete_module(refgpu): errno {}", drm::errno());
        Ok(())
    })?;
    render_node(false)?;
    ensure!(!Path::new(DRIVER).exists(), "{DRIVER} is still there after the unload");
    within_limit("loading refgpu".into(), crate::load_refgpu)?;
    render_node(true)?;
    device_works("after loading again")
}
