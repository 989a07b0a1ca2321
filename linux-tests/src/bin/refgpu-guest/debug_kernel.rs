//! Tests only the debug kernel runs (`linux_tests::DEBUG_KERNEL_TESTS`):
//! every driver ioctl under failslab, then a kmemleak scan. The kernel
//! tells the guest it is the debug kernel with `rgtest.debug=1`.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use refgpu_uapi as u;

use crate::drm::{map_op, sync, unmap_op, Dev, Errno};
use crate::ensure;
use crate::fixture::{self, Fx, DATA_VA};
use crate::tests::write_data;
use crate::R;

/// The kmemleak control file.
const KMEMLEAK: &str = "/sys/kernel/debug/kmemleak";
/// failslab's knobs.
const FAILSLAB: &str = "/sys/kernel/debug/failslab";
/// The most allocations one ioctl is expected to make: past this the test
/// fails (the ioctl never succeeded).
const MAX_NTH: u32 = 400;
/// What creating a GEM shmem object may fail with besides ENOMEM: shmem
/// reports a failed inode allocation as ENOSPC (`__shmem_get_inode()`).
const SHMEM: &[Errno] = &[libc::ENOSPC];
/// Where the failslab test maps its scratch BO.
const SCRATCH_VA: u64 = 0x4000_0000;

fn write(path: &str, v: &str) -> Result<(), String> {
    std::fs::write(path, v).map_err(|e| format!("{path} <- {v:?}: {e}"))
}

/// Forgets every object kmemleak tracks so far (early-boot allocations
/// it cannot follow would be reported as leaks): the guest calls it on the
/// debug kernel before loading the modules.
pub fn kmemleak_clear() -> Result<(), String> {
    write(KMEMLEAK, "clear")
}

/// `/proc/thread-self/fail-nth`: makes the Nth slab allocation of this
/// thread fail (failslab's per-task counter; failslab's global `interval`
/// counter cannot name "the Nth from now"). Opened once, so that reading
/// and writing it allocate nothing.
struct FailNth(File);

impl FailNth {
    fn open() -> Result<FailNth, String> {
        let p = "/proc/thread-self/fail-nth";
        OpenOptions::new().read(true).write(true).open(p).map(FailNth).map_err(|e| format!("{p}: {e}"))
    }

    fn set(&self, n: u32) -> Result<(), String> {
        self.0.write_at(format!("{n}").as_bytes(), 0).map(|_| ()).map_err(|e| format!("fail-nth <- {n}: {e}"))
    }

    /// Whether the armed failure is still pending (the calls in between
    /// made fewer allocations than armed).
    fn pending(&self) -> Result<bool, String> {
        let mut b = [0u8; 16];
        let n = self.0.read_at(&mut b, 0).map_err(|e| format!("fail-nth: {e}"))?;
        let v: u32 = std::str::from_utf8(&b[..n])
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or(format!("fail-nth reads {:?}", &b[..n]))?;
        Ok(v != 0)
    }
}

/// failslab set up for this thread only: every slab allocation, sleeping
/// ones too (`ignore-gfp-wait` N), fails only where `fail-nth` says;
/// `probability` 0 keeps the random failures off and `verbose` 0 keeps the
/// injected failures out of the kernel log. Restored on drop.
struct Failslab {
    nth: FailNth,
}

impl Failslab {
    fn arm() -> Result<Failslab, String> {
        for (k, v) in [("probability", "0"), ("verbose", "0"), ("ignore-gfp-wait", "N"), ("task-filter", "Y")]
        {
            write(&format!("{FAILSLAB}/{k}"), v)?;
        }
        write("/proc/thread-self/make-it-fail", "1")?;
        Ok(Failslab { nth: FailNth::open()? })
    }
}

impl Drop for Failslab {
    fn drop(&mut self) {
        let _ = self.nth.set(0);
        let _ = write("/proc/thread-self/make-it-fail", "0");
        let _ = write(&format!("{FAILSLAB}/ignore-gfp-wait"), "Y");
    }
}

/// Waits (up to 5 s, jobs are freed asynchronously) for the live object
/// counts to be `want`.
fn settle(want: [i64; 4], what: &str) -> R {
    let t0 = Instant::now();
    loop {
        let now = fixture::live()?;
        if now == want {
            return Ok(());
        }
        ensure!(
            t0.elapsed() < Duration::from_secs(5),
            "{what}: live objects (bos, vms, contexts, jobs) {want:?} -> {now:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `call` with its Nth slab allocation failing, for N = 1, 2, ...
/// until it makes fewer than N allocations (it then succeeded). A call
/// whose allocation failed must fail with ENOMEM, or one of `also`
/// (or succeed, if the allocation was optional); `undo` releases what a
/// successful call made.
/// After each call and its undo the driver's live objects are back at
/// their count before the call. Returns how many allocations the
/// successful call made.
fn each_failure<T>(
    fs: &Failslab,
    name: &str,
    also: &[Errno],
    mut call: impl FnMut() -> Result<T, Errno>,
    mut undo: impl FnMut(T) -> R,
) -> Result<u32, String> {
    let base = fixture::live()?;
    for n in 1..=MAX_NTH {
        fs.nth.set(n)?;
        let r = call();
        let pending = fs.nth.pending()?;
        fs.nth.set(0)?;
        match r {
            Ok(v) => {
                undo(v).map_err(|e| format!("{name}: undo after allocation {n}: {e}"))?;
                settle(base, &format!("{name} succeeded with allocation {n} failing ({pending:?} pending)"))?;
                if pending {
                    return Ok(n - 1);
                }
            }
            Err(e) => {
                ensure!(!pending, "{name}: errno {e} with no allocation failed (N = {n})");
                ensure!(
                    e == libc::ENOMEM || also.contains(&e),
                    "{name}: allocation {n} failed, errno {e} (expected ENOMEM or one of {also:?})"
                );
                settle(base, &format!("{name} failed at allocation {n}"))?;
            }
        }
    }
    Err(format!("{name}: still failing with allocation {MAX_NTH} failing"))
}

/// Every driver ioctl (and opening the render node) under failslab: for
/// each, the Nth slab allocation fails for N = 1.. until the call
/// succeeds; every failing call returns ENOMEM and leaves the driver's
/// live objects as they were.
pub fn failslab_ioctls() -> R {
    let fs = Failslab::arm()?;
    let mut fx = Fx::new()?;
    let mut counts = Vec::new();
    let mut run = |name: &str, n: Result<u32, String>| -> R {
        counts.push(format!("{name} {}", n?));
        Ok(())
    };

    // The open(2) alone (finding the node reads sysfs); the device closes
    // when the undo drops it.
    let node = crate::drm::render_node().ok_or("no render node")?;
    let node = std::ffi::CString::new(node).map_err(|_| "render node path")?;
    run("open", each_failure(&fs, "open", &[], || Dev::open_node(&node), |_: Dev| Ok(())))?;
    run("GET_PARAM", each_failure(&fs, "GET_PARAM", &[], || fx.dev.param(u::param::CHIP_ID), |_| Ok(())))?;
    let dev = &fx.dev;
    let close = |h: u32| dev.gem_close(h).map_err(|e| format!("GEM_CLOSE: errno {e}"));
    run("BO_CREATE", each_failure(&fs, "BO_CREATE", SHMEM, || dev.bo_create(1 << 16, 0), close))?;

    let bo = dev.bo_create(1 << 16, 0).map_err(|e| format!("BO_CREATE: errno {e}"))?;
    run("BO_MMAP_OFFSET", each_failure(&fs, "BO_MMAP_OFFSET", &[], || dev.mmap_offset(bo), |_| Ok(())))?;
    let unmap = |_| dev.unmap(SCRATCH_VA, 1 << 16).map_err(|e| format!("unmap: errno {e}"));
    let map = || dev.vm_bind(&[map_op(bo, 0, SCRATCH_VA, 1 << 16, 0)]);
    run("VM_BIND map", each_failure(&fs, "VM_BIND map", &[], map, unmap))?;
    // Unmapping the middle page splits the mapping in two.
    let remap = |_| {
        dev.vm_bind(&[unmap_op(SCRATCH_VA, 1 << 16), map_op(bo, 0, SCRATCH_VA, 1 << 16, 0)])
            .map_err(|e| format!("remap: errno {e}"))
    };
    ok(dev.vm_bind(&[map_op(bo, 0, SCRATCH_VA, 1 << 16, 0)]), "VM_BIND map")?;
    let split = || dev.unmap(SCRATCH_VA + 0x4000, 0x1000);
    run("VM_BIND unmap split", each_failure(&fs, "VM_BIND unmap split", &[], split, remap))?;
    ok(dev.unmap(SCRATCH_VA, 1 << 16), "VM_BIND unmap")?;
    let point = std::cell::Cell::new(0u64);
    let sync_map = || {
        let p = point.get() + 1;
        let r = dev.vm_bind_syncs(&[map_op(bo, 0, SCRATCH_VA, 1 << 16, 0)], &[], &[sync(fx.sync, 1000 + p)]);
        if r.is_ok() {
            point.set(p);
        }
        r
    };
    let sync_unmap = |()| {
        dev.wait_point(fx.sync, 1000 + point.get(), fixture::WAIT_NS)
            .map_err(|e| format!("wait for the bind's out-sync: errno {e}"))?;
        unmap(())
    };
    run("VM_BIND out-sync", each_failure(&fs, "VM_BIND out-sync", &[], sync_map, sync_unmap))?;
    ok(dev.gem_close(bo), "GEM_CLOSE")?;

    let destroy = |c: u32| dev.ctx_destroy(c).map_err(|e| format!("CTX_DESTROY: errno {e}"));
    run("CTX_CREATE", each_failure(&fs, "CTX_CREATE", &[], || dev.ctx_create(u::engine::COPY), destroy))?;
    let ctx = ok(dev.ctx_create(u::engine::COPY), "CTX_CREATE")?;
    run("CTX_QUERY", each_failure(&fs, "CTX_QUERY", &[], || dev.ctx_query(ctx), |_| Ok(())))?;
    // A destroyed context is replaced (unarmed), so the counts stay level.
    let doomed = std::cell::Cell::new(ok(dev.ctx_create(u::engine::COPY), "CTX_CREATE")?);
    let replace = |()| {
        doomed.set(dev.ctx_create(u::engine::COPY).map_err(|e| format!("CTX_CREATE: errno {e}"))?);
        Ok(())
    };
    run("CTX_DESTROY", each_failure(&fs, "CTX_DESTROY", &[], || dev.ctx_destroy(doomed.get()), replace))?;
    ok(dev.ctx_destroy(doomed.get()), "CTX_DESTROY")?;

    // SUBMIT with an in-sync, an out-sync and a sync_file out.
    let (ib, dw) = fx.ib(&[write_data(DATA_VA + 0x100, &[5])])?;
    let (dev, tl) = (&fx.dev, fx.sync);
    let last = std::cell::Cell::new(0u64);
    let submit = || {
        let p = last.get();
        let ins = if p == 0 { vec![] } else { vec![sync(tl, p)] };
        let s = dev.submit_full(ctx, ib, dw, &ins, &[sync(tl, p + 1)], u::SUBMIT_OUT_SYNC_FILE)?;
        last.set(p + 1);
        Ok(s)
    };
    let done = |s: u::Submit| {
        // SAFETY: closing the sync_file fd the kernel gave us.
        unsafe { libc::close(s.out_fence_fd) };
        dev.wait_point(tl, last.get(), fixture::WAIT_NS).map_err(|e| format!("wait for the job: errno {e}"))
    };
    run("SUBMIT", each_failure(&fs, "SUBMIT", &[], submit, done))?;
    // SUBMIT_BATCH of three jobs, each with an in-sync and an out-sync.
    let batch = || {
        let p = last.get();
        let (seq, n) = crate::batch::submit_chain(dev, ctx, ib, dw, tl, p, 3)?;
        last.set(p + n);
        Ok(seq)
    };
    let batch_done = |_| {
        dev.wait_point(tl, last.get(), fixture::WAIT_NS).map_err(|e| format!("wait for the batch: errno {e}"))
    };
    run("SUBMIT_BATCH", each_failure(&fs, "SUBMIT_BATCH", &[], batch, batch_done))?;
    ok(dev.ctx_destroy(ctx), "CTX_DESTROY")?;
    drop(fs);
    println!("guest: failslab: allocations per call: {}", counts.join(", "));
    Ok(())
}

fn ok<T>(r: Result<T, Errno>, what: &str) -> Result<T, String> {
    r.map_err(|e| format!("{what}: errno {e}"))
}

/// kmemleak finds nothing unreferenced: two scans (an object must be seen
/// unreferenced by a scan and old enough to be reported), then its report,
/// which must be empty; a leak is reported with its allocation backtrace.
pub fn kmemleak_clean() -> R {
    // kmemleak reports objects older than 5 s only.
    std::thread::sleep(Duration::from_secs(6));
    write(KMEMLEAK, "scan")?;
    write(KMEMLEAK, "scan")?;
    let report = std::fs::read_to_string(KMEMLEAK).map_err(|e| format!("{KMEMLEAK}: {e}"))?;
    let leaks = report.matches("unreferenced object").count();
    ensure!(
        report.trim().is_empty(),
        "kmemleak reports {leaks} leaks: {}",
        report.lines().take(60).collect::<Vec<_>>().join(" | ")
    );
    Ok(())
}
