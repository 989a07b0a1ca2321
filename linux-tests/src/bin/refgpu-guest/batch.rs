//! SUBMIT_BATCH (docs/linux.md, "`DRM_IOCTL_REFGPU_SUBMIT_BATCH`"): its
//! argument errors (nothing queued by a refused batch, the failing job
//! named), a batch's jobs running in order after their in-syncs and
//! signalling their out-syncs, and the cost of N jobs as N SUBMITs or as
//! one batch.

use std::time::Instant;

use refgpu_uapi as u;
use umd_core::cmd::Command;

use crate::drm::{Dev, Errno};
use crate::ensure;
use crate::fixture::{live, Fx, DATA_VA, WAIT_NS};
use crate::tests::{wait_eq, write_data};
use crate::R;

const JOB: usize = std::mem::size_of::<u::BatchJob>();
const SYNC: usize = std::mem::size_of::<u::BatchSync>();
const PAGE: usize = 4096;

/// The driver's bound on one file's jobs (module parameter).
const FILE_MAX_JOBS: &str = "/sys/module/refgpu/parameters/file_max_jobs";

/// A timeline point of `handle`.
fn timeline(handle: u32, point: u64) -> u::BatchSync {
    u::BatchSync { handle, flags: u::batch_sync::TIMELINE, point }
}

/// A binary syncobj.
fn binary(handle: u32) -> u::BatchSync {
    u::BatchSync { handle, flags: u::batch_sync::BINARY, point: 0 }
}

/// The bytes of a `#[repr(C)]` uAPI structure (no implicit padding:
/// refgpu-uapi's layout test).
fn bytes<T: Copy>(v: &T) -> Vec<u8> {
    // SAFETY: `v` is a live value of `size_of::<T>()` bytes, every one of
    // them a field's (the uAPI structures have explicit padding).
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }.to_vec()
}

/// `items` laid out `stride` bytes apart, the bytes past each item `fill`.
fn strided<T: Copy>(items: &[T], stride: usize, fill: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(items.len() * stride);
    for i in items {
        let mut b = bytes(i);
        b.resize(stride, fill);
        out.extend_from_slice(&b);
    }
    out
}

/// SUBMIT_BATCH of the jobs at `array` (user memory): the result and the
/// argument as the kernel wrote it back.
fn submit_batch(
    d: &Dev,
    ctx: u32,
    stride: u32,
    count: u32,
    array: u64,
) -> (Result<(), Errno>, u::SubmitBatch) {
    let mut a =
        u::SubmitBatch { ctx_id: ctx, jobs: u::ObjArray { stride, count, array }, ..Default::default() };
    let r = d.ioctl(u::DRM_IOCTL_REFGPU_SUBMIT_BATCH, &mut a);
    (r, a)
}

/// SUBMIT_BATCH of `n` jobs of the IB `(ib, dw)` on `ctx`, each waiting
/// for point `after` of timeline `tl` (nothing for point 0; a job cannot
/// wait for a point of its own batch) and job `i` signalling
/// `after + i + 1`: the first seqno and `n`.
pub fn submit_chain(
    d: &Dev,
    ctx: u32,
    ib: u64,
    dw: u32,
    tl: u32,
    after: u64,
    n: u64,
) -> Result<(u64, u64), Errno> {
    let ins = [timeline(tl, after)];
    let outs: Vec<[u::BatchSync; 1]> = (0..n).map(|i| [timeline(tl, after + i + 1)]).collect();
    let jobs: Vec<u::BatchJob> = outs
        .iter()
        .map(|o| u::BatchJob {
            ib_va: ib,
            ib_size_dw: dw,
            in_syncs: if after == 0 { u::ObjArray::default() } else { u::ObjArray::of(&ins) },
            out_syncs: u::ObjArray::of(o),
            ..Default::default()
        })
        .collect();
    let (r, a) = submit_batch(d, ctx, JOB as u32, n as u32, jobs.as_ptr() as u64);
    r.map(|()| (a.first_seqno, n))
}

/// Two pages, the second `PROT_NONE`: an address in it faults.
struct Guarded {
    base: *mut u8,
}

impl Guarded {
    fn new() -> Result<Guarded, String> {
        // SAFETY: a new private anonymous mapping; nothing else uses it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        ensure!(p != libc::MAP_FAILED, "mmap: errno {}", crate::drm::errno());
        // SAFETY: the second page of the mapping just made.
        let r = unsafe { libc::mprotect(p.cast::<u8>().add(PAGE).cast(), PAGE, libc::PROT_NONE) };
        ensure!(r == 0, "mprotect: errno {}", crate::drm::errno());
        Ok(Guarded { base: p.cast() })
    }

    /// Copies `b` so that it ends at the end of the readable page; returns
    /// its address (what follows it faults).
    fn place(&self, b: &[u8]) -> Result<u64, String> {
        ensure!(b.len() <= PAGE, "{} bytes do not fit a page", b.len());
        // SAFETY: the range lies in the mapping's first (read-write) page.
        unsafe {
            let dst = self.base.add(PAGE - b.len());
            std::ptr::copy_nonoverlapping(b.as_ptr(), dst, b.len());
            Ok(dst as u64)
        }
    }

    /// The first byte of the `PROT_NONE` page.
    fn fault_addr(&self) -> u64 {
        self.base as u64 + PAGE as u64
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, of that length.
        unsafe { libc::munmap(self.base.cast(), 2 * PAGE) };
    }
}

/// Every argument error of SUBMIT_BATCH, most in job 1, 2 or 3 of a batch
/// whose other jobs are valid: each fails with its errno, names the job
/// (or none for the batch's own fields), and queues nothing: the live job
/// count is unchanged after each, the out-syncs of the valid jobs before
/// the bad one stay unsignalled, and the first batch that succeeds gets
/// the context's first sequence number.
pub fn submit_batch_errors() -> R {
    let mut fx = Fx::new()?;
    let (v, _) = fx.dev.version().map_err(|e| format!("VERSION: errno {e}"))?;
    ensure!(v.minor >= u::MINOR_SUBMIT_BATCH, "driver minor version {} lacks SUBMIT_BATCH", v.minor);
    let max = fx.dev.param(u::param::MAX_BATCH_JOBS).map_err(|e| format!("MAX_BATCH_JOBS: errno {e}"))?;
    ensure!(max == 64, "MAX_BATCH_JOBS {max}");
    let ctx = fx.ctx(u::engine::GFX)?;
    let (ib, dw) = fx.ib(&[Command::Nop { dwords: 0 }])?;
    let s = fx.sync;
    let bin = fx.dev.syncobj().map_err(|e| format!("SYNCOBJ_CREATE: errno {e}"))?;
    let d = &fx.dev;
    let before = live()?;

    // Four valid jobs, job i signalling point i + 1 of the timeline.
    let outs: Vec<[u::BatchSync; 1]> = (1..=4).map(|p| [timeline(s, p)]).collect();
    let good: Vec<u::BatchJob> = outs
        .iter()
        .map(|o| u::BatchJob {
            ib_va: ib,
            ib_size_dw: dw,
            out_syncs: u::ObjArray::of(o),
            ..Default::default()
        })
        .collect();
    let with = |k: usize, f: &dyn Fn(&mut u::BatchJob)| {
        let mut v = good.clone();
        f(&mut v[k]);
        v
    };
    // `jobs` laid out at `stride` with `fill` past each: expects `errno`
    // and `index`, and nothing queued.
    let expect = |what: &str, ctx: u32, b: &[u8], stride: usize, count: u32, errno: Errno, index: u32| -> R {
        let (r, a) = submit_batch(d, ctx, stride as u32, count, b.as_ptr() as u64);
        ensure!(r == Err(errno), "{what}: {r:?}, expected errno {errno}");
        ensure!(a.error_index == index, "{what}: error_index {:#x}, expected {index:#x}", a.error_index);
        ensure!(live()? == before, "{what}: live objects {before:?} -> {:?}", live()?);
        let p = d.query_point(s).map_err(|e| format!("SYNCOBJ_QUERY: errno {e}"))?;
        ensure!(p == 0, "{what}: the timeline reached {p}: a job of the refused batch signalled");
        Ok(())
    };
    let none = u::BATCH_NO_INDEX;
    let plain = |jobs: &[u::BatchJob]| strided(jobs, JOB, 0);
    let (einval, enoent, efault, e2big) = (libc::EINVAL, libc::ENOENT, libc::EFAULT, libc::E2BIG);
    let all = plain(&good);

    // The batch's own fields.
    let mut a = u::SubmitBatch { ctx_id: ctx, jobs: u::ObjArray::of(&good), flags: 1, ..Default::default() };
    ensure!(d.ioctl(u::DRM_IOCTL_REFGPU_SUBMIT_BATCH, &mut a) == Err(einval), "flags 1");
    ensure!(a.error_index == none, "flags: error_index {:#x}", a.error_index);
    let mut a = u::SubmitBatch { ctx_id: ctx, jobs: u::ObjArray::of(&good), pad: 1, ..Default::default() };
    ensure!(d.ioctl(u::DRM_IOCTL_REFGPU_SUBMIT_BATCH, &mut a) == Err(einval), "pad 1");
    expect("count 0", ctx, &all, JOB, 0, einval, none)?;
    let many = plain(&vec![good[0]; max as usize + 1]);
    expect("count MAX_BATCH_JOBS + 1", ctx, &many, JOB, max as u32 + 1, einval, none)?;
    expect("stride 0", ctx, &all, 0, 4, einval, none)?;
    expect("stride below the structure", ctx, &all, JOB - 8, 4, einval, none)?;
    expect("stride over 4096", ctx, &strided(&good, PAGE + 8, 0), PAGE + 8, 4, einval, none)?;
    expect("unknown context", ctx + 100, &all, JOB, 4, enoent, none)?;
    expect("context 0", 0, &all, JOB, 4, enoent, none)?;

    // A longer stride: the bytes past the structure must be zero. Job 1's
    // tail has one non-zero byte.
    let mut tail = strided(&good, JOB + 8, 0);
    tail[(JOB + 8) + JOB + 7] = 1;
    expect("non-zero tail in job 1", ctx, &tail, JOB + 8, 4, e2big, 1)?;

    // One bad job among valid ones.
    let bad = |k: usize, f: &dyn Fn(&mut u::BatchJob)| plain(&with(k, f));
    expect("job flags", ctx, &bad(2, &|j| j.flags = 1), JOB, 4, einval, 2)?;
    expect("IB size 0", ctx, &bad(3, &|j| j.ib_size_dw = 0), JOB, 4, einval, 3)?;
    expect("IB misaligned", ctx, &bad(1, &|j| j.ib_va = ib + 2), JOB, 4, einval, 1)?;
    expect("IB below VA_START", ctx, &bad(2, &|j| j.ib_va = 4096), JOB, 4, einval, 2)?;
    let unknown = [timeline(999, 1)];
    expect(
        "unknown in-sync handle",
        ctx,
        &bad(2, &|j| j.in_syncs = u::ObjArray::of(&unknown)),
        JOB,
        4,
        enoent,
        2,
    )?;
    expect(
        "unknown out-sync handle",
        ctx,
        &bad(3, &|j| j.out_syncs = u::ObjArray::of(&unknown)),
        JOB,
        4,
        enoent,
        3,
    )?;
    let unsubmitted = [timeline(s, 100)];
    expect(
        "unsubmitted timeline point",
        ctx,
        &bad(1, &|j| j.in_syncs = u::ObjArray::of(&unsubmitted)),
        JOB,
        4,
        einval,
        1,
    )?;
    let fenceless = [binary(bin)];
    expect(
        "binary syncobj without a fence",
        ctx,
        &bad(2, &|j| j.in_syncs = u::ObjArray::of(&fenceless)),
        JOB,
        4,
        einval,
        2,
    )?;
    let too_many = vec![binary(bin); 65];
    expect("65 in-syncs", ctx, &bad(1, &|j| j.in_syncs = u::ObjArray::of(&too_many)), JOB, 4, einval, 1)?;

    // Sync entries: the type is explicit and must match the point.
    for (what, e) in [
        ("binary with a point", u::BatchSync { handle: bin, flags: u::batch_sync::BINARY, point: 1 }),
        ("timeline without a point", u::BatchSync { handle: s, flags: u::batch_sync::TIMELINE, point: 0 }),
        ("unknown sync type", u::BatchSync { handle: s, flags: 2, point: 1 }),
        (
            "sync flag past the type",
            u::BatchSync { handle: s, flags: u::batch_sync::TIMELINE | 0x100, point: 1 },
        ),
    ] {
        let one = [e];
        expect(what, ctx, &bad(3, &|j| j.out_syncs = u::ObjArray::of(&one)), JOB, 4, einval, 3)?;
    }
    // Sync arrays have a stride too.
    let sync_short = |j: &mut u::BatchJob| j.out_syncs.stride = (SYNC - 8) as u32;
    expect("sync stride below the structure", ctx, &bad(2, &sync_short), JOB, 4, einval, 2)?;
    let sync_tail = strided(&[timeline(s, 3)], SYNC + 8, 0xff);
    let tail_sync = |j: &mut u::BatchJob| {
        j.out_syncs = u::ObjArray { stride: (SYNC + 8) as u32, count: 1, array: sync_tail.as_ptr() as u64 }
    };
    expect("non-zero tail in a sync", ctx, &bad(2, &tail_sync), JOB, 4, e2big, 2)?;

    // Unmapped memory: the job array, a job in it, a job's sync array.
    let g = Guarded::new()?;
    let fault = g.fault_addr();
    let (r, a) = submit_batch(d, ctx, JOB as u32, 4, fault);
    ensure!(
        r == Err(efault) && a.error_index == 0,
        "job array in a PROT_NONE page: {r:?} {:#x}",
        a.error_index
    );
    // Jobs 0 and 1 readable, 2 and 3 in the PROT_NONE page.
    let at = g.place(&plain(&good[..2]))?;
    let (r, a) = submit_batch(d, ctx, JOB as u32, 4, at);
    ensure!(r == Err(efault) && a.error_index == 2, "job 2 in a PROT_NONE page: {r:?} {:#x}", a.error_index);
    ensure!(live()? == before && d.query_point(s) == Ok(0), "job 2 in a PROT_NONE page: jobs queued");
    let in_fault =
        |j: &mut u::BatchJob| j.in_syncs = u::ObjArray { stride: SYNC as u32, count: 1, array: fault };
    expect("in-syncs in a PROT_NONE page", ctx, &bad(3, &in_fault), JOB, 4, efault, 3)?;
    let out_fault =
        |j: &mut u::BatchJob| j.out_syncs = u::ObjArray { stride: SYNC as u32, count: 1, array: 8 };
    expect("out-syncs at address 8", ctx, &bad(1, &out_fault), JOB, 4, efault, 1)?;

    // The file's job limit covers the whole batch: 4 jobs past a limit of
    // 3 are refused together (this file has no job yet).
    let old = std::fs::read_to_string(FILE_MAX_JOBS).map_err(|e| format!("{FILE_MAX_JOBS}: {e}"))?;
    std::fs::write(FILE_MAX_JOBS, "3").map_err(|e| format!("{FILE_MAX_JOBS}: {e}"))?;
    let r = expect("4 jobs past file_max_jobs 3", ctx, &all, JOB, 4, libc::EBUSY, none);
    std::fs::write(FILE_MAX_JOBS, old.trim()).map_err(|e| format!("{FILE_MAX_JOBS}: {e}"))?;
    r?;

    // The valid batch, at a longer stride with zero tails and job 0's
    // out-sync at a longer stride too: the context's first seqnos.
    let zero_tail_sync = strided(&[timeline(s, 1)], SYNC + 8, 0);
    let mut jobs = good.clone();
    jobs[0].out_syncs =
        u::ObjArray { stride: (SYNC + 8) as u32, count: 1, array: zero_tail_sync.as_ptr() as u64 };
    let b = strided(&jobs, JOB + 8, 0);
    let (r, a) = submit_batch(d, ctx, (JOB + 8) as u32, 4, b.as_ptr() as u64);
    ensure!(r.is_ok(), "the valid batch: {r:?} (error_index {:#x})", a.error_index);
    ensure!(a.first_seqno == 1, "first_seqno {}: a refused batch used sequence numbers", a.first_seqno);
    ensure!(a.error_index == none, "error_index {:#x} after success", a.error_index);
    fx.wait(4)?;
    fx.point = 4;
    let next = fx.dev.submit_full(ctx, ib, dw, &[], &[], 0).map_err(|e| format!("SUBMIT: errno {e}"))?;
    ensure!(next.seqno == 5, "SUBMIT after the batch: seqno {}", next.seqno);
    Ok(())
}

/// A batch of 16 jobs on COPY whose first job waits for a gated GFX job:
/// nothing of the batch runs before the gate opens; then the jobs run in
/// array order (each writes its index where the last one's must be, after
/// checking it), job 0 copies what the GFX job wrote, every job's
/// timeline point is reached, the last job's binary syncobj is signalled,
/// and the seqnos are the context's first 16.
pub fn submit_batch_runs() -> R {
    let mut fx = Fx::new()?;
    let gfx = fx.ctx(u::engine::GFX)?;
    let copy = fx.ctx(u::engine::COPY)?;
    let (gate, marker, last, copied) = (DATA_VA + 0x800, DATA_VA + 0x804, DATA_VA + 0x808, DATA_VA + 0x80c);
    let results = DATA_VA + 0x1000;
    let producer = fx.run(gfx, &[wait_eq(gate, 1), write_data(marker, &[0xC0FFEE])])?;
    let n = 16u32;
    let mut ibs = Vec::new();
    for i in 0..n {
        let next = [i + 1];
        let mut cmds = vec![wait_eq(last, i), write_data(results + 4 * u64::from(i), &next)];
        if i == 0 {
            cmds.push(Command::Copy { src: marker, dst: copied, size: 4 });
        }
        cmds.push(write_data(last, &next));
        ibs.push(fx.ib(&cmds)?);
    }
    let s = fx.sync;
    let bin = fx.dev.syncobj().map_err(|e| format!("SYNCOBJ_CREATE: errno {e}"))?;
    let wait = [timeline(s, producer)];
    let outs: Vec<Vec<u::BatchSync>> = (0..n)
        .map(|i| {
            let mut o = vec![timeline(s, producer + 1 + u64::from(i))];
            if i == n - 1 {
                o.push(binary(bin));
            }
            o
        })
        .collect();
    let jobs: Vec<u::BatchJob> = ibs
        .iter()
        .zip(&outs)
        .enumerate()
        .map(|(i, (&(va, dw), o))| u::BatchJob {
            ib_va: va,
            ib_size_dw: dw,
            in_syncs: if i == 0 { u::ObjArray::of(&wait) } else { u::ObjArray::default() },
            out_syncs: u::ObjArray::of(o),
            ..Default::default()
        })
        .collect();
    let (r, a) = submit_batch(&fx.dev, copy, JOB as u32, n, jobs.as_ptr() as u64);
    ensure!(r.is_ok(), "SUBMIT_BATCH: {r:?} (error_index {:#x})", a.error_index);
    ensure!(a.first_seqno == 1, "first_seqno {}", a.first_seqno);
    // The producer waits for the gate, so nothing of the batch has run.
    ensure!(fx.data.map.r32(0x1000) == 0 && fx.data.map.r32(0x808) == 0, "the batch ran before its in-sync");
    fx.data.map.w32(0x800, 1);
    let end = producer + u64::from(n);
    fx.wait(end)?;
    fx.point = end;
    fx.dev.wait_binary_once(bin, WAIT_NS).map_err(|e| format!("binary out-sync: errno {e}"))?;
    for i in 0..n {
        let v = fx.data.map.r32(0x1000 + 4 * i as usize);
        ensure!(v == i + 1, "job {i} wrote {v}");
    }
    ensure!(fx.data.map.r32(0x808) == n, "last job {}", fx.data.map.r32(0x808));
    ensure!(fx.data.map.r32(0x80c) == 0xC0FFEE, "job 0 copied {:#x}", fx.data.map.r32(0x80c));
    let (nop, ndw) = fx.ib(&[Command::Nop { dwords: 0 }])?;
    let next = fx.dev.submit_full(copy, nop, ndw, &[], &[], 0).map_err(|e| format!("SUBMIT: errno {e}"))?;
    ensure!(next.seqno == u64::from(n) + 1, "SUBMIT after the batch: seqno {}", next.seqno);
    Ok(())
}

/// N jobs (N = 1, 4, 16) as N SUBMITs or as one SUBMIT_BATCH, each job a
/// NOP IB, without syncs and with its own point of a timeline syncobj
/// as out-sync (as kernel mode submits), against a null ioctl (VERSION
/// without buffers) in the same guest: nanoseconds per job, that ÷ the
/// null ioctl, and ioctls per job. Each run queues 1,024 jobs on an idle
/// engine, then waits for them; the two ways alternate, twice each, and
/// the faster run of each counts (the guest shares the host's CPUs).
pub fn bench_submit_batch() -> R {
    let mut fx = Fx::new()?;
    let ctx = fx.ctx(u::engine::COPY)?;
    let (ib, dw) = fx.ib(&[Command::Nop { dwords: 0 }])?;
    let d = &fx.dev;
    let s = fx.sync;
    let jobs_per_run = 1024u32;
    let t0 = Instant::now();
    for _ in 0..jobs_per_run {
        d.version_null().map_err(|e| format!("VERSION: errno {e}"))?;
    }
    let null = t0.elapsed().as_nanos() as f64 / f64::from(jobs_per_run);
    let mut point = fx.point;
    let mut line = format!("@@ BENCH submit_batch null_ioctl_ns={null:.0}");
    for (name, synced) in [("plain", false), ("timeline", true)] {
        for n in [1u32, 4, 16] {
            let rounds = jobs_per_run / n;
            let (mut each, mut batched) = (f64::MAX, f64::MAX);
            for run in 0..4 {
                let t0 = Instant::now();
                for _ in 0..rounds {
                    if run % 2 == 0 {
                        // N SUBMITs.
                        for _ in 0..n {
                            if synced {
                                point += 1;
                                d.submit(ctx, ib, dw, s, point)
                            } else {
                                d.submit_full(ctx, ib, dw, &[], &[], 0).map(|_| ())
                            }
                            .map_err(|e| format!("SUBMIT: errno {e}"))?;
                        }
                    } else {
                        // One batch of N.
                        let outs: Vec<[u::BatchSync; 1]> =
                            (1..=u64::from(n)).map(|i| [timeline(s, point + i)]).collect();
                        let jobs: Vec<u::BatchJob> = outs
                            .iter()
                            .map(|o| u::BatchJob {
                                ib_va: ib,
                                ib_size_dw: dw,
                                out_syncs: if synced { u::ObjArray::of(o) } else { u::ObjArray::default() },
                                ..Default::default()
                            })
                            .collect();
                        let (r, a) = submit_batch(d, ctx, JOB as u32, n, jobs.as_ptr() as u64);
                        ensure!(r.is_ok(), "SUBMIT_BATCH of {n}: {r:?} (error_index {:#x})", a.error_index);
                        if synced {
                            point += u64::from(n);
                        }
                    }
                }
                let ns = t0.elapsed().as_nanos() as f64 / f64::from(rounds * n);
                if run % 2 == 0 {
                    each = each.min(ns);
                } else {
                    batched = batched.min(ns);
                }
                // Drain: a last job with a point after everything queued.
                point += 1;
                d.submit(ctx, ib, dw, s, point).map_err(|e| format!("SUBMIT: errno {e}"))?;
                d.wait_point(s, point, WAIT_NS).map_err(|e| format!("wait: errno {e}"))?;
            }
            line += &format!(
                " {name}_n{n}_submit_ns={each:.0} {name}_n{n}_batch_ns={batched:.0} {name}_n{n}_submit_per_null={:.1} {name}_n{n}_batch_per_null={:.1} {name}_n{n}_batch_ioctls_per_job={:.3}",
                each / null,
                batched / null,
                1.0 / f64::from(n)
            );
        }
    }
    fx.point = point;
    println!("{line} jobs={jobs_per_run}");
    Ok(())
}
