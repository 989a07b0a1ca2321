//! fdinfo (docs/linux.md, "fdinfo"): the drm-usage-stats keys of an open
//! file in `/proc/self/fdinfo/<fd>`.
//!
//! Engine time is checked against the guest's own CLOCK_MONOTONIC, the
//! clock the kernel counts it with, never against a threshold: a job that
//! wrote a marker and then waits for the test is running from before the
//! test saw the marker until after the test released it, so its busy time
//! is at least the time between the two; and it was not running before
//! its SUBMIT nor after its fence signalled.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use refgpu_uapi as u;
use umd_core::cmd::{Command, Payload};

use crate::drm::{self, map_op, now_ns, Dev};
use crate::ensure;
use crate::fixture::{self, Fx, DATA_VA};
use crate::recovery::wait_step;
use crate::R;

/// The engines' fdinfo names, in engine order.
const ENGINES: [&str; 3] = ["gfx", "compute", "copy"];

/// The `drm-` keys of `fd`'s fdinfo, with their values as printed.
fn fdinfo(fd: i32) -> Result<BTreeMap<String, String>, String> {
    let p = format!("/proc/self/fdinfo/{fd}");
    let s = std::fs::read_to_string(&p).map_err(|e| format!("{p}: {e}"))?;
    Ok(s.lines()
        .filter(|l| l.starts_with("drm-"))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect())
}

/// A key's value, present or an error naming it.
fn key<'a>(info: &'a BTreeMap<String, String>, k: &str) -> Result<&'a str, String> {
    info.get(k).map(String::as_str).ok_or_else(|| format!("fdinfo has no {k}: {info:?}"))
}

/// `drm-engine-<name>` in nanoseconds (`<n> ns`).
fn engine_ns(info: &BTreeMap<String, String>, name: &str) -> Result<u64, String> {
    let k = format!("drm-engine-{name}");
    let v = key(info, &k)?;
    v.strip_suffix(" ns").and_then(|n| n.parse().ok()).ok_or_else(|| format!("{k}: {v:?} is not `<n> ns`"))
}

/// The busy time of each engine, in engine order.
fn engines_ns(fd: i32) -> Result<[u64; 3], String> {
    let info = fdinfo(fd)?;
    let mut ns = [0; 3];
    for (n, name) in ns.iter_mut().zip(ENGINES) {
        *n = engine_ns(&info, name)?;
    }
    Ok(ns)
}

/// A memory key (`drm-<stat>-memory`) in bytes: DRM core prints `<n>`,
/// `<n> KiB` or `<n> MiB`.
fn memory(info: &BTreeMap<String, String>, stat: &str) -> Result<u64, String> {
    let k = format!("drm-{stat}-memory");
    let v = key(info, &k)?;
    let (n, unit) = match v.split_once(' ') {
        Some((n, "KiB")) => (n, 1 << 10),
        Some((n, "MiB")) => (n, 1 << 20),
        None => (v, 1),
        Some(_) => return Err(format!("{k}: {v:?} has an unknown unit")),
    };
    n.parse::<u64>().map(|n| n * unit).map_err(|_| format!("{k}: {v:?} is not a size"))
}

/// Waits (up to 10 s, a failure guard) until the dword at `off` of `map`
/// is `v`.
fn wait_word(map: &drm::Map, off: usize, v: u32, what: &str) -> R {
    let t0 = Instant::now();
    while map.r32(off) != v {
        ensure!(t0.elapsed() < Duration::from_secs(10), "{what}: still {:#x}", map.r32(off));
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// A job that writes 1 to `marker`, then waits until `step` is at least
/// 1, then runs `then`.
fn gated<'a>(marker: u64, step: u64, then: &[Command<'a>]) -> Vec<Command<'a>> {
    let mut v = vec![Command::WriteData { dst: marker, data: Payload::Words(&[1]) }, wait_step(step, 1)];
    v.extend_from_slice(then);
    v
}

/// A file runs a job on GFX that faults and one on COMPUTE that succeeds,
/// each held by the test after it started; COPY stays idle. The keys are
/// there and parse; a fresh file's engines are at 0; while the jobs are
/// held, the two engines' values already cover the time since the test saw
/// them start (a running job counts), afterwards the time until the test
/// released them (the faulting job's up to its reset), and neither exceeds
/// the time from SUBMIT to the end of the wait; COPY stays 0. A second
/// file has another client id and all its engines at 0.
pub fn fdinfo_engine_time() -> R {
    let mut fx = Fx::new()?;
    fixture::clear_devcoredumps()?;
    let fd = fx.dev.fd();
    let info = fdinfo(fd)?;
    ensure!(key(&info, "drm-driver")? == "refgpu", "drm-driver {:?}", info.get("drm-driver"));
    let id: u64 = key(&info, "drm-client-id")?.parse().map_err(|_| format!("drm-client-id {info:?}"))?;
    ensure!(engines_ns(fd)? == [0; 3], "a fresh file's engine time {:?}", engines_ns(fd)?);

    let other = Dev::open().map_err(|e| format!("open: errno {e}"))?;
    let other_id: u64 =
        key(&fdinfo(other.fd())?, "drm-client-id")?.parse().map_err(|_| "drm-client-id".to_string())?;
    ensure!(other_id != id, "two open files have the same drm-client-id {id}");

    let (gm, gs, cm, cs) = (0x600, 0x640, 0x680, 0x6C0);
    let unmapped = 0x7000_0000u64;
    let g = fx.ctx(u::engine::GFX)?;
    let c = fx.ctx(u::engine::COMPUTE)?;
    let gfx_cmds = gated(
        DATA_VA + gm,
        DATA_VA + gs,
        &[Command::WriteData { dst: unmapped, data: Payload::Words(&[1]) }],
    );
    let compute_cmds = gated(DATA_VA + cm, DATA_VA + cs, &[]);
    let submitted = now_ns();
    let (gib, gdw) = fx.ib(&gfx_cmds)?;
    let gjob = fx
        .dev
        .submit_full(g, gib, gdw, &[], &[], u::SUBMIT_OUT_SYNC_FILE)
        .map_err(|e| format!("SUBMIT gfx: errno {e}"))?;
    // SAFETY: the sync_file the kernel just gave us, owned by nobody else.
    let gfence = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(gjob.out_fence_fd) };
    let cpoint = fx.run(c, &compute_cmds)?;
    wait_word(&fx.data.map, gm as usize, 1, "the GFX job's marker")?;
    wait_word(&fx.data.map, cm as usize, 1, "the COMPUTE job's marker")?;
    let seen = now_ns();
    std::thread::sleep(Duration::from_millis(50));
    let before_mid = now_ns();
    let mid = engines_ns(fd)?;
    let held = (before_mid - seen) as u64;
    ensure!(mid[0] >= held && mid[1] >= held, "while held {held} ns: engine time {mid:?}");
    ensure!(mid[2] == 0, "COPY ran nothing: {mid:?}");

    let released = now_ns();
    fx.data.map.w32(gs as usize, 1);
    fx.data.map.w32(cs as usize, 1);
    fx.wait(cpoint)?;
    ensure!(drm::poll_in(gfence.as_raw_fd(), 10_000), "the faulting GFX job did not end");
    let ended = now_ns();
    let st =
        drm::sync_file_status(gfence.as_raw_fd()).map_err(|e| format!("SYNC_IOC_FILE_INFO: errno {e}"))?;
    ensure!(st == -libc::EIO, "the GFX job's status {st}, expected -EIO (a fault)");
    let after = engines_ns(fd)?;
    let (lo, hi) = ((released - seen) as u64, (ended - submitted) as u64);
    for (e, name) in ENGINES.iter().enumerate().take(2) {
        ensure!(
            after[e] >= lo && after[e] <= hi && after[e] >= mid[e],
            "{name}: {} ns, expected {lo} to {hi} ns and at least the {} ns read while held",
            after[e],
            mid[e]
        );
    }
    ensure!(after[2] == 0, "COPY ran nothing: {after:?}");
    ensure!(engines_ns(other.fd())? == [0; 3], "the other file's engine time {:?}", engines_ns(other.fd())?);
    fixture::take_devcoredump().map(|_| ())
}

/// The memory keys follow the file's buffer objects, in bytes: a created
/// object counts in drm-total-memory, in drm-resident-memory once its
/// pages are taken (a CPU mapping, a GPU mapping), in drm-shared-memory
/// once exported; closing its handle takes it out. Nothing is active (jobs
/// add no fences to objects) or purgeable.
pub fn fdinfo_memory() -> R {
    let dev = Dev::open().map_err(|e| format!("open: errno {e}"))?;
    let fd = dev.fd();
    let check = |what: &str, total: u64, resident: u64, shared: u64| -> R {
        let info = fdinfo(fd)?;
        // DRM core prints these two only when an object of the file
        // reports a status: with no objects, they are absent.
        let status = |stat: &str| match total {
            0 if !info.contains_key(&format!("drm-{stat}-memory")) => Ok(0),
            _ => memory(&info, stat),
        };
        let got = [
            memory(&info, "total")?,
            status("resident")?,
            memory(&info, "shared")?,
            memory(&info, "active")?,
            status("purgeable")?,
        ];
        ensure!(
            got == [total, resident, shared, 0, 0],
            "{what}: total, resident, shared, active, purgeable {got:?}, expected {:?}",
            [total, resident, shared, 0, 0]
        );
        Ok(())
    };
    check("no objects", 0, 0, 0)?;
    let (a, b, c) = (64u64 << 10, 1u64 << 20, (2u64 << 20) + (12 << 10));
    let ha = dev.bo_create(a, 0).map_err(|e| format!("BO_CREATE: errno {e}"))?;
    check("an object, unpopulated", a, 0, 0)?;
    let off = dev.mmap_offset(ha).map_err(|e| format!("MMAP_OFFSET: errno {e}"))?;
    let map = dev.mmap(off, a as usize).map_err(|e| format!("mmap: errno {e}"))?;
    check("its CPU mapping", a, a, 0)?;
    let hb = dev.bo_create(b, 0).map_err(|e| format!("BO_CREATE: errno {e}"))?;
    dev.vm_bind(&[map_op(hb, 0, DATA_VA, b, 0)]).map_err(|e| format!("VM_BIND: errno {e}"))?;
    check("a second object, GPU-mapped", a + b, a + b, 0)?;
    let hc = dev.bo_create(c, 0).map_err(|e| format!("BO_CREATE: errno {e}"))?;
    check("a third object, unpopulated", a + b + c, a + b, 0)?;
    let exported = dev.prime_export(hb).map_err(|e| format!("PRIME export: errno {e}"))?;
    check("the second object exported", a + b + c, a + b, b)?;
    dev.gem_close(hc).map_err(|e| format!("GEM_CLOSE: errno {e}"))?;
    check("the third object's handle closed", a + b, a + b, b)?;
    drop((map, exported));
    dev.vm_bind(&[drm::unmap_op(DATA_VA, b)]).map_err(|e| format!("VM_BIND unmap: errno {e}"))?;
    dev.gem_close(hb).map_err(|e| format!("GEM_CLOSE: errno {e}"))?;
    dev.gem_close(ha).map_err(|e| format!("GEM_CLOSE: errno {e}"))?;
    check("every handle closed", 0, 0, 0)
}

/// The DRM clients of the device (debugfs `clients`, one line each after
/// the header): a file is there from its open until its release.
fn clients() -> Result<usize, String> {
    let p = fixture::debugfs_dir()?.join("clients");
    let s = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    Ok(s.lines().skip(1).filter(|l| !l.trim().is_empty()).count())
}

/// A file is closed while its job runs on COPY (held after it started),
/// then the job ends: the kernel does not touch the closed file's state
/// (on the debug kernel KASAN would report it), the job succeeds, and a
/// file opened after the close, which may get the freed memory, shows no
/// engine time it did not use. The file must really be released: nothing
/// of it may stay mapped (a CPU mapping of a DRM descriptor holds the
/// file), so the gate the job waits on is a buffer of a second file,
/// imported, and debugfs `clients` loses one entry at the close.
pub fn fdinfo_file_closed_mid_job() -> R {
    let gate = Dev::open().map_err(|e| format!("open: errno {e}"))?;
    let gbo = fixture::buf(&gate, 64 << 10, DATA_VA)?;
    let dmabuf = gate.prime_export(gbo.handle).map_err(|e| format!("PRIME export: errno {e}"))?;
    let dev = Dev::open().map_err(|e| format!("open: errno {e}"))?;
    let gen = if dev.param(u::param::GENERATION) == Ok(1) {
        umd_core::hw::Generation::Gen1
    } else {
        umd_core::hw::Generation::Gen2
    };
    let imported = dev.prime_import(dmabuf.as_raw_fd()).map_err(|e| format!("PRIME import: errno {e}"))?;
    dev.vm_bind(&[map_op(imported, 0, DATA_VA, 64 << 10, 0)]).map_err(|e| format!("VM_BIND: errno {e}"))?;
    let cp = dev.ctx_create(u::engine::COPY).map_err(|e| format!("CTX_CREATE: errno {e}"))?;
    let (m, s) = (0x700, 0x740);
    let (ib, dw) = {
        // Its CPU mapping goes at the end of the block: the IB stays bound.
        let ibuf = fixture::buf(&dev, fixture::IB_SIZE, fixture::IB_VA)?;
        fixture::encode_ib(gen, &ibuf, &mut 0, &gated(DATA_VA + m, DATA_VA + s, &[]))?
    };
    let job = dev
        .submit_full(cp, ib, dw, &[], &[], u::SUBMIT_OUT_SYNC_FILE)
        .map_err(|e| format!("SUBMIT: errno {e}"))?;
    // SAFETY: the sync_file the kernel just gave us, owned by nobody else.
    let fence = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(job.out_fence_fd) };
    wait_word(&gbo.map, m as usize, 1, "the COPY job's marker")?;
    let open = clients()?;
    drop(dev);
    ensure!(
        clients()? + 1 == open,
        "the file was not released at its close: {open} clients -> {}",
        clients()?
    );
    ensure!(!drm::poll_in(fence.as_raw_fd(), 0), "the job ended before the test released it");
    let fresh = Dev::open().map_err(|e| format!("open: errno {e}"))?;
    gbo.map.w32(s as usize, 1);
    ensure!(drm::poll_in(fence.as_raw_fd(), 10_000), "the closed file's job did not end");
    let st =
        drm::sync_file_status(fence.as_raw_fd()).map_err(|e| format!("SYNC_IOC_FILE_INFO: errno {e}"))?;
    ensure!(st == 1, "the closed file's job: status {st}");
    ensure!(
        engines_ns(fresh.fd())? == [0; 3],
        "a file opened after the close: {:?}",
        engines_ns(fresh.fd())?
    );
    ensure!(engines_ns(gate.fd())? == [0; 3], "the gate's file ran nothing: {:?}", engines_ns(gate.fd())?);
    Ok(())
}
