//! The device going away: lost (the model frozen while the driver waits
//! for it), unbound (sysfs) while a client keeps it open with work in its
//! rings and queues, then bound again; the module unloaded and loaded
//! again; hot-unplugged by the host (QMP `device_del`) under two
//! processes' open files, for good. docs/linux.md, "Unplug and module
//! unload" and "Hangs, faults and reset".

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use refgpu_uapi as u;
use umd_core::cmd::{Command, Payload};

use crate::drm::{self, sync, unmap_op, Map};
use crate::ensure;
use crate::fixture::{self, expect_errno, Fx, DATA_VA};
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
        // Devices are links named by their address (0000:01:00.0 behind
        // the harness's root port).
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

/// Waits (up to 10 s) until the refgpu render node is present or gone.
fn render_node(present: bool) -> R {
    let t0 = Instant::now();
    while drm::render_node().is_some_and(|n| Path::new(&n).exists()) != present {
        if t0.elapsed() > Duration::from_secs(10) {
            let nodes: Vec<String> = std::fs::read_dir("/dev/dri")
                .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
                .unwrap_or_default();
            return Err(format!(
                "the refgpu render node is still {} after 10 s; /dev/dri has {nodes:?}",
                if present { "missing" } else { "present" },
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// The driver's line when the DRM device's last reference is gone (its
/// software state is released).
const RELEASED: &str = "device released";

/// New kernel log records, read from a `/dev/kmsg` opened at the end.
struct Kmsg(std::fs::File);

impl Kmsg {
    /// Starts after the records already logged.
    fn from_now() -> Result<Kmsg, String> {
        use std::io::Seek;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .map_err(|e| format!("/dev/kmsg: {e}"))?;
        f.seek(std::io::SeekFrom::End(0)).map_err(|e| format!("/dev/kmsg: {e}"))?;
        Ok(Kmsg(f))
    }

    /// Waits (up to 10 s) for a record containing `text`.
    fn wait_for(&mut self, text: &str, what: &str) -> R {
        use std::io::Read;
        let t0 = Instant::now();
        let mut buf = vec![0u8; 8192];
        loop {
            match self.0.read(&mut buf) {
                Ok(n) if String::from_utf8_lossy(&buf[..n]).contains(text) => return Ok(()),
                Ok(_) => continue,
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(_) => {}
            }
            ensure!(
                t0.elapsed() < Duration::from_secs(10),
                "{what}: no \"{text}\" in the kernel log within 10 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
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

/// Waits (up to 5 s) until `jobs` (`n` of them) are in `engine`'s ring.
fn engine_reaches(engine: u32, n: u32, jobs: &str) -> R {
    let t0 = Instant::now();
    while in_flight(engine)? < n {
        ensure!(
            t0.elapsed() < Duration::from_secs(5),
            "{jobs} did not reach engine {engine}'s ring within 5 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// Hardware fences in `engine`'s ring (debugfs `engines`).
fn in_flight(engine: u32) -> Result<u32, String> {
    let p = fixture::debugfs_dir()?.join("engines");
    let s = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    // One "  fences: emitted N completed N in_flight N ..." line per
    // engine, in engine order.
    s.lines()
        .filter(|l| l.trim_start().starts_with("fences:"))
        .nth(engine as usize)
        .and_then(|l| l.split_whitespace().skip_while(|w| *w != "in_flight").nth(1))
        .and_then(|n| n.parse().ok())
        .ok_or(format!("no in_flight count for engine {engine} in {}", p.display()))
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
/// must free everything (the old device logs its release, and warns at it
/// on a leak: `kmsg_clean`), and the device bound again must run jobs.
pub fn unbind_with_open_file() -> R {
    let bdf = bound_device()?;
    let mut fx = Fx::new()?;
    let h = fx.ctx(u::engine::GFX)?;
    let j = fx.ctx(u::engine::GFX)?;
    let q = fx.ctx(u::engine::COPY)?;
    // A WAIT_MEM nobody satisfies.
    let (ib_h, dw_h) = fx.ib(&[crate::tests::wait_eq(DATA_VA + 0x40, 0xDEAD)])?;
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
    // H and J are in GFX's ring (H waits on the flag), Q waits for H in
    // its queue. The job timeout is module_reload's [`RELOAD_TIMEOUT_MS`].
    engine_reaches(u::engine::GFX, 2, "H and J")?;
    ensure!(drm::sync_file_status(sq.0.as_raw_fd()) == Ok(0), "Q ended before the unbind");

    let mut kmsg = Kmsg::from_now()?;
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
    // The last client is gone: the old device's state is released once the
    // scheduler has freed the jobs (a leak would keep it, or warn).
    kmsg.wait_for(RELEASED, "after the close")?;

    driver_write("bind", &bdf)?;
    render_node(true)?;
    device_works("after binding again")
}

/// The job timeout `module_reload` loads the module with: the tests after
/// it hold jobs in the rings for longer than the suite's 1 s (a timeout
/// would reset the engine under them), and the lost device's timeout comes
/// after the loss (1 s).
const RELOAD_TIMEOUT_MS: u64 = 5_000;

/// Unloads the module (no client has the device open) and loads it again
/// with `job_timeout_ms` = [`RELOAD_TIMEOUT_MS`]: the render node goes and
/// comes back, GET_PARAM reports the new timeout, and the device runs jobs.
pub fn module_reload() -> R {
    // A client that has come and gone: its objects were freed at close.
    device_works("before the unload")?;
    reload(RELOAD_TIMEOUT_MS)?;
    device_works("after loading again")
}

/// Unloads the module (no client may have the device open) and loads it
/// again with `job_timeout_ms` = `timeout_ms`: the render node goes and
/// comes back, the old device logs its release, and GET_PARAM reports the
/// new timeout.
fn reload(timeout_ms: u64) -> R {
    let mut kmsg = Kmsg::from_now()?;
    within_limit("unloading refgpu".into(), || {
        let name = c"refgpu";
        // SAFETY: delete_module(2) with a NUL-terminated name.
        let r = unsafe { libc::syscall(libc::SYS_delete_module, name.as_ptr(), libc::O_NONBLOCK) };
        ensure!(r == 0, "delete_module(refgpu): errno {}", drm::errno());
        Ok(())
    })?;
    render_node(false)?;
    ensure!(!Path::new(DRIVER).exists(), "{DRIVER} is still there after the unload");
    kmsg.wait_for(RELEASED, "the unload")?;
    within_limit("loading refgpu".into(), move || {
        crate::load_refgpu(&format!("job_timeout_ms={timeout_ms}"))
    })?;
    render_node(true)?;
    let dev = drm::Dev::open().map_err(|e| format!("open after loading again: errno {e}"))?;
    let t =
        dev.param(u::param::JOB_TIMEOUT_MS).map_err(|e| format!("GET_PARAM JOB_TIMEOUT_MS: errno {e}"))?;
    ensure!(t == timeout_ms, "JOB_TIMEOUT_MS {t} after loading with job_timeout_ms={timeout_ms}");
    Ok(())
}

/// The model's CLOCK, read from the register page (the first page of BAR2)
/// through sysfs: the model publishes it every 100 µs while it runs.
struct ModelClock(Map);

impl ModelClock {
    fn open(bdf: &str) -> Result<Self, String> {
        let path = format!("/sys/bus/pci/devices/{bdf}/resource2");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| format!("{path}: {e}"))?;
        let map = drm::map_fd(f.as_raw_fd(), 0, 4096).map_err(|e| format!("mmap {path}: errno {e}"))?;
        Ok(ModelClock(map))
    }

    /// Has the harness freeze the model (`run` false: the device stops
    /// answering, as a hung GPU would) or let it run again, and waits (up
    /// to 5 s) until CLOCK stays still for 20 ms, or moves.
    fn set_running(&self, run: bool) -> R {
        use std::io::Write;
        println!("{}", if run { linux_tests::MODEL_CONT } else { linux_tests::MODEL_STOP });
        let _ = std::io::stdout().flush();
        let t0 = Instant::now();
        loop {
            let a = self.0.r32(umd_core::hw::regs::CLOCK_LO as usize);
            std::thread::sleep(Duration::from_millis(20));
            if (self.0.r32(umd_core::hw::regs::CLOCK_LO as usize) != a) == run {
                return Ok(());
            }
            ensure!(
                t0.elapsed() < Duration::from_secs(5),
                "the model did not {} within 5 s",
                if run { "resume" } else { "stop" }
            );
        }
    }
}

/// One count of debugfs `counts`.
fn count(c: &std::collections::BTreeMap<String, i64>, key: &str) -> Result<i64, String> {
    c.get(key).copied().ok_or(format!("debugfs counts has no {key}"))
}

/// The device stops answering (the model frozen) while a client unmaps a
/// buffer whose only reference is its mapping: the invalidation is not
/// acknowledged, the device is lost, and the buffer's pages must outlive
/// the unmap (a lost device may still run and reach them through stale
/// translations): the driver keeps the mapping, and at the close the VM an
/// engine still points at, until the device is unbound (stopped); then
/// both are freed (a leak warns: `kmsg_clean`). The device is lost but
/// present: the job on it ends with -EIO, SUBMIT and VM_BIND fail with EIO
/// (ENODEV is for an unplugged device: `unbind_with_open_file`) and
/// CTX_QUERY reports the loss meanwhile. Bound again, the device runs
/// jobs.
pub fn lost_device_keeps_memory() -> R {
    const X_VA: u64 = 0x3000_0000;
    const X_SIZE: u64 = 64 << 10;
    let bdf = bound_device()?;
    let clock = ModelClock::open(&bdf)?;
    let mut fx = Fx::new()?;
    // A job, so that COPY's ENGINE_ROOT is this file's VM.
    let c = fx.ctx(u::engine::COPY)?;
    let p = fx.run(c, &[Command::WriteData { dst: DATA_VA, data: Payload::Words(&[1]) }])?;
    fx.wait(p)?;
    let x = fixture::buf(&fx.dev, X_SIZE, X_VA)?;
    drop(x.map);
    fx.dev.gem_close(x.handle).map_err(|e| format!("GEM_CLOSE: errno {e}"))?;
    // H runs on GFX until its timeout (module_reload's 5 s): a WAIT_MEM
    // nobody satisfies.
    let h = fx.ctx(u::engine::GFX)?;
    let (ib_h, dw_h) = fx.ib(&[crate::tests::wait_eq(DATA_VA + 0x40, 0xDEAD)])?;
    let sh = fx
        .dev
        .submit_full(h, ib_h, dw_h, &[], &[], u::SUBMIT_OUT_SYNC_FILE)
        .map_err(|e| format!("SUBMIT H: {e}"))?;
    let sh = SyncFile::new(sh.out_fence_fd)?;
    engine_reaches(u::engine::GFX, 1, "H")?;
    let before = fixture::counts()?;

    clock.set_running(false)?;
    // Changes valid entries: the driver waits 1 s for the invalidation.
    let unmap = fx.dev.vm_bind(&[unmap_op(X_VA, X_SIZE)]);
    let lost = fixture::counts();
    clock.set_running(true)?;
    let lost = lost?;
    ensure!(
        unmap.is_ok(),
        "VM_BIND UNMAP on the stopped device: errno {:?} (the unmap itself is done)",
        unmap.err()
    );
    ensure!(count(&lost, "lost")? == 1, "the device is not lost after an unanswered invalidation");
    ensure!(count(&lost, "kept_mappings")? == 1, "the unmapped mapping was not kept: {lost:?}");
    ensure!(
        count(&lost, "bos")? == count(&before, "bos")?,
        "the unmapped buffer was freed under a device that may still reach it: {before:?} -> {lost:?}"
    );
    // H ends at its timeout, on the lost device, while the device stays
    // bound; the release at the unbind below shows it was freed too.
    let stat_h = sh.wait("H on the lost device")?;
    ensure!(stat_h == -libc::EIO, "H ended with {stat_h} on the lost device, expected -EIO");
    let (ib, dw) = fx.ib(&[Command::WriteData { dst: DATA_VA, data: Payload::Words(&[2]) }])?;
    expect_errno(fx.dev.submit_full(c, ib, dw, &[], &[], 0), libc::EIO, "SUBMIT on the lost device")?;
    expect_errno(fx.dev.vm_bind(&[unmap_op(DATA_VA, 4096)]), libc::EIO, "VM_BIND on the lost device")?;
    let q = fx.dev.ctx_query(c).map_err(|e| format!("CTX_QUERY: errno {e}"))?;
    ensure!(q.state == u::ctx_state::DEVICE_LOST, "CTX_QUERY state {} on the lost device", q.state);
    drop(sh);

    drop(fx);
    // The scheduler frees the last job asynchronously; then the VM is
    // released, but GFX and COPY may still walk it: kept.
    let t0 = Instant::now();
    loop {
        let c = fixture::counts()?;
        if count(&c, "kept_vms")? == 1 && count(&c, "contexts")? == 0 && count(&c, "jobs")? == 0 {
            ensure!(count(&c, "vms")? == 1, "a kept VM is not counted: {c:?}");
            break;
        }
        ensure!(
            t0.elapsed() < Duration::from_secs(5),
            "the VM the engines point at was not kept at the close: {c:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    drop(clock);
    let mut kmsg = Kmsg::from_now()?;
    driver_write("unbind", &bdf)?;
    // Stopped: what it was kept from is freed, then the device itself.
    kmsg.wait_for(RELEASED, "the unbind of the lost device")?;
    driver_write("bind", &bdf)?;
    render_node(true)?;
    // H's timeout may have left a devcoredump.
    fixture::clear_devcoredumps()?;
    device_works("after binding the lost device again")
}

/// The job timeout `surprise_removal` loads the module with: its blocked
/// jobs must still be in the rings when the guest kernel handles the
/// removal, however long it takes to (a 5 s timeout would reset them first).
const REMOVAL_TIMEOUT_MS: u64 = 120_000;

/// Failure guard for the device to leave sysfs after the host's request.
const REMOVAL_LIMIT: Duration = Duration::from_secs(60);

/// Where the second process maps its buffer, and its size: 16 pages, of
/// which only the first is touched before the removal.
const B_VA: u64 = 0x3800_0000;
const B_SIZE: u64 = 64 << 10;

/// A pipe's ends.
fn pipe() -> Result<(OwnedFd, OwnedFd), String> {
    let mut fds = [0; 2];
    // SAFETY: pipe2(2) fills two descriptors.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    ensure!(r == 0, "pipe2: errno {}", drm::errno());
    // SAFETY: both were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Reads one byte: false at end of file (the writer closed its end).
fn pipe_read(fd: &OwnedFd) -> bool {
    let mut b = 0u8;
    // SAFETY: read(2) of one byte into `b`.
    unsafe { libc::read(fd.as_raw_fd(), (&mut b as *mut u8).cast(), 1) == 1 }
}

/// Writes one byte.
fn pipe_write(fd: &OwnedFd) -> R {
    // SAFETY: write(2) of one byte.
    let r = unsafe { libc::write(fd.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
    ensure!(r == 1, "pipe write: errno {}", drm::errno());
    Ok(())
}

/// The ioctls of an open file of the removed device: each fails with
/// ENODEV.
fn ioctls_gone(fx: &mut Fx, ctx: u32, who: &str) -> R {
    let (ib, dw) = fx.ib(&[Command::WriteData { dst: DATA_VA, data: Payload::Words(&[3]) }])?;
    let e = libc::ENODEV;
    expect_errno(fx.dev.param(u::param::GENERATION), e, &format!("{who}: GET_PARAM"))?;
    expect_errno(fx.dev.submit_full(ctx, ib, dw, &[], &[], 0), e, &format!("{who}: SUBMIT"))?;
    expect_errno(fx.dev.ctx_create(u::engine::GFX), e, &format!("{who}: CTX_CREATE"))?;
    expect_errno(fx.dev.bo_create(4096, 0), e, &format!("{who}: BO_CREATE"))?;
    expect_errno(fx.dev.vm_bind(&[unmap_op(DATA_VA, 4096)]), e, &format!("{who}: VM_BIND"))?;
    expect_errno(fx.dev.wait_point(fx.sync, 1, 0), e, &format!("{who}: SYNCOBJ_TIMELINE_WAIT"))
}

/// The second process of `surprise_removal`: a job waiting in its queue
/// for GFX (B1: another VM's jobs are in GFX's ring, and an engine switches
/// VMs only once idle) and one blocked in COPY's ring (B2),
/// and a mapped buffer whose first page only it has touched. It says it is
/// ready on `ready`, waits for the removal on `removed` (an end of file
/// there: the parent gave up), then checks what it holds: both jobs end
/// with -ENODEV without running, the ioctls fail with ENODEV, and the
/// mapping is memory still (the touched page keeps its data, the others
/// fault in as zeroes, writes stay; a SIGBUS would end the process).
fn removal_child(ready: &OwnedFd, removed: &OwnedFd) -> R {
    let mut fx = Fx::new()?;
    let b = fixture::buf(&fx.dev, B_SIZE, B_VA)?;
    b.map.w32(0, 0xB0B0_0001);
    let g = fx.ctx(u::engine::GFX)?;
    let c = fx.ctx(u::engine::COPY)?;
    let (ib1, dw1) = fx.ib(&[Command::WriteData { dst: DATA_VA, data: Payload::Words(&[0xB1]) }])?;
    let (ib2, dw2) = fx.ib(&[crate::tests::wait_eq(DATA_VA + 0x40, 0xDEAD)])?;
    let out = u::SUBMIT_OUT_SYNC_FILE;
    let s1 = fx.dev.submit_full(g, ib1, dw1, &[], &[], out).map_err(|e| format!("SUBMIT B1: {e}"))?;
    let s1 = SyncFile::new(s1.out_fence_fd)?;
    let s2 = fx.dev.submit_full(c, ib2, dw2, &[], &[], out).map_err(|e| format!("SUBMIT B2: {e}"))?;
    let s2 = SyncFile::new(s2.out_fence_fd)?;
    pipe_write(ready)?;
    ensure!(pipe_read(removed), "the parent gave up before the removal");

    let (st1, st2) = (s1.wait("B1")?, s2.wait("B2")?);
    ensure!(st1 == -libc::ENODEV, "B1 (in its queue) ended with {st1}, expected -ENODEV");
    ensure!(st2 == -libc::ENODEV, "B2 (blocked) ended with {st2}, expected -ENODEV");
    ensure!(fx.data.map.r32(0) == 0, "B1 ran: its write is in the data buffer");
    ioctls_gone(&mut fx, g, "the second process")?;
    ensure!(b.map.r32(0) == 0xB0B0_0001, "the touched page reads {:#x}", b.map.r32(0));
    for page in 1..(B_SIZE as usize / 4096) {
        let off = page * 4096;
        ensure!(
            b.map.r32(off) == 0,
            "page {page}, first touched after the removal, reads {:#x}",
            b.map.r32(off)
        );
        b.map.w32(off, 0xB0B0_0000 | page as u32);
        ensure!(b.map.r32(off) == 0xB0B0_0000 | page as u32, "page {page} lost a write after the removal");
    }
    Ok(())
}

/// The host removes the device (QMP `device_del`; the guest kernel
/// handles QEMU's eject request) while two processes hold it open with
/// jobs on every engine: blocked ones (a WAIT_MEM nobody satisfies) on
/// each, one behind a blocked one in GFX's ring, one waiting for a blocked
/// one in its queue, one waiting in its queue for its VM's turn on GFX;
/// with mapped buffers, a dma-buf (mapped) and sync_files. Every
/// fence ends with an error (-ENODEV for what was in a ring), no job runs,
/// the open files' ioctls fail with ENODEV, the mappings stay memory (no
/// SIGBUS: the buffers are shmem, docs/linux.md "Unplug and module
/// unload"), and once everything is closed the device is released (a leak
/// warns, and a WARN panics the guest). Last of the suite but
/// `kmsg_clean`: the device does not come back.
pub fn surprise_removal() -> R {
    reload(REMOVAL_TIMEOUT_MS)?;
    let bdf = bound_device()?;
    let mut fx = Fx::new()?;
    // A buffer shared as a dma-buf, mapped through it and through the DRM
    // file, written before the removal.
    let shared = fixture::buf(&fx.dev, 8192, 0x3000_0000)?;
    shared.map.w32(0, 0xA0A0_0001);
    let dmabuf = fx.dev.prime_export(shared.handle).map_err(|e| format!("PRIME_HANDLE_TO_FD: errno {e}"))?;
    let dmabuf_map =
        drm::map_fd(dmabuf.as_raw_fd(), 0, 8192).map_err(|e| format!("mmap of the dma-buf: errno {e}"))?;
    let g = fx.ctx(u::engine::GFX)?;
    let c = fx.ctx(u::engine::COMPUTE)?;
    let j = fx.ctx(u::engine::GFX)?;
    let q = fx.ctx(u::engine::COPY)?;
    let (ib_h, dw_h) = fx.ib(&[crate::tests::wait_eq(DATA_VA + 0x40, 0xDEAD)])?;
    let (ib_w, dw_w) = fx.ib(&[Command::WriteData { dst: DATA_VA + 0x80, data: Payload::Words(&[0xA1]) }])?;
    let out = u::SUBMIT_OUT_SYNC_FILE;
    fx.point += 1;
    let ph = fx.point;
    let hg = fx
        .dev
        .submit_full(g, ib_h, dw_h, &[], &[sync(fx.sync, ph)], out)
        .map_err(|e| format!("SUBMIT on GFX: {e}"))?;
    let hg = SyncFile::new(hg.out_fence_fd)?;
    let hc =
        fx.dev.submit_full(c, ib_h, dw_h, &[], &[], out).map_err(|e| format!("SUBMIT on COMPUTE: {e}"))?;
    let hc = SyncFile::new(hc.out_fence_fd)?;
    let jg =
        fx.dev.submit_full(j, ib_w, dw_w, &[], &[], out).map_err(|e| format!("SUBMIT behind GFX's: {e}"))?;
    let jg = SyncFile::new(jg.out_fence_fd)?;
    let qc = fx
        .dev
        .submit_full(q, ib_w, dw_w, &[sync(fx.sync, ph)], &[], out)
        .map_err(|e| format!("SUBMIT on COPY: {e}"))?;
    let qc = SyncFile::new(qc.out_fence_fd)?;

    let (ready_r, ready_w) = pipe()?;
    let (removed_r, removed_w) = pipe()?;
    // SAFETY: fork(2); the child runs `removal_child` and _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        drop((ready_r, removed_w));
        let code = match removal_child(&ready_w, &removed_r) {
            Ok(()) => 0,
            Err(e) => {
                println!("guest: surprise_removal's second process: {e}");
                1
            }
        };
        // SAFETY: _exit in the child; no destructors of the parent's state.
        unsafe { libc::_exit(code) };
    }
    ensure!(pid > 0, "fork: errno {}", drm::errno());
    drop((ready_w, removed_r));
    let child = (|| -> R {
        ensure!(pipe_read(&ready_r), "the second process ended before it was ready");
        // GFX: the blocked job and the one behind it; COMPUTE: the blocked
        // job; COPY: B2. COPY's job waits for GFX's in its queue, B1 for
        // GFX to be idle.
        engine_reaches(u::engine::GFX, 2, "GFX's blocked job and the one behind it")?;
        engine_reaches(u::engine::COMPUTE, 1, "COMPUTE's blocked job")?;
        engine_reaches(u::engine::COPY, 1, "B2")?;
        ensure!(drm::sync_file_status(qc.0.as_raw_fd()) == Ok(0), "COPY's job ended before the removal");

        let mut kmsg = Kmsg::from_now()?;
        {
            use std::io::Write;
            println!("{}", linux_tests::DEVICE_DEL);
            let _ = std::io::stdout().flush();
        }
        let dev_dir = format!("/sys/bus/pci/devices/{bdf}");
        let t0 = Instant::now();
        while Path::new(&dev_dir).exists() {
            ensure!(
                t0.elapsed() < REMOVAL_LIMIT,
                "{bdf} is still present {REMOVAL_LIMIT:?} after the request"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        render_node(false)?;
        pipe_write(&removed_w)?;

        let (sg, sc, sq) =
            (hg.wait("GFX's blocked job")?, hc.wait("COMPUTE's blocked job")?, qc.wait("COPY's job")?);
        let sj = jg.wait("the job behind GFX's")?;
        ensure!(sg == -libc::ENODEV, "GFX's blocked job ended with {sg}, expected -ENODEV");
        ensure!(sj == -libc::ENODEV, "the job behind GFX's blocked one ended with {sj}, expected -ENODEV");
        ensure!(sc == -libc::ENODEV, "COMPUTE's blocked job ended with {sc}, expected -ENODEV");
        ensure!(sq < 0, "COPY's job (waiting for GFX's) ended with {sq}, expected an error");
        ensure!(fx.data.map.r32(0x80) == 0, "a job ran after the removal");
        ioctls_gone(&mut fx, g, "the first process")?;
        // Both mappings are the same pages still.
        ensure!(dmabuf_map.r32(0) == 0xA0A0_0001, "the dma-buf's mapping reads {:#x}", dmabuf_map.r32(0));
        shared.map.w32(4096, 0xA0A0_0002);
        ensure!(
            dmabuf_map.r32(4096) == 0xA0A0_0002,
            "a write through the DRM mapping is not in the dma-buf's"
        );
        let mut st = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        ensure!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "the second process failed (wait status {st:#x}{})",
            if libc::WIFSIGNALED(st) { format!(", signal {}", libc::WTERMSIG(st)) } else { String::new() }
        );
        // The DRM file closed, the dma-buf and its mapping still hold the
        // buffer (and the device): close them last.
        drop((hg, hc, qc, jg));
        drop(fx);
        ensure!(dmabuf_map.r32(4096) == 0xA0A0_0002, "the dma-buf's mapping changed at the file's close");
        drop(shared.map);
        drop(dmabuf_map);
        drop(dmabuf);
        kmsg.wait_for(RELEASED, "after the last close")
    })();
    if child.is_err() {
        // The second process sees the end of file and exits.
        drop(removed_w);
        let mut st = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
    }
    child
}
