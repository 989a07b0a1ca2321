//! The adversarial suite (`linux_tests::ADVERSARIAL_TESTS`, its own boot):
//! random ioctls ([`crate::fuzz`]), threads racing on one file, unmap and
//! GEM_CLOSE under a running job, fork with an inherited file and jobs in
//! flight, ring and credit saturation, a flood of SUBMITs past the file's
//! job limit, signals during waits
//! (docs/linux.md, "The adversarial suite"). After each test the runner
//! checks that the driver's live objects are back where they were.
//!
//! A job that must stay in flight for a while is paced as in
//! [`crate::recovery`]: a list of WAIT_MEMs on a step counter that a
//! thread raises every 100 ms, so its engine keeps moving (no hang is
//! detected) and it ends only when the test lets it.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use refgpu_uapi as u;
use umd_core::cmd::{Command, CompareOp, Encoder, Payload};

use crate::drm::{self, map_op, sync, unmap_op, Dev, Errno, Map};
use crate::ensure;
use crate::fixture::{self, buf, encode_ib, live, Buf, Fx, DATA_VA, IB_SIZE, IB_VA, WAIT_NS};
use crate::fuzz::Rng;
use crate::recovery::wait_step;
use crate::tests::Test;
use crate::R;

/// The suite on kernel `kind`, in order (the debug kernel adds its
/// kmemleak scan before the last test: `linux_tests::Suite::tests`).
pub fn all(kind: linux_tests::KernelKind) -> Vec<Test> {
    let mut v: Vec<Test> = vec![
        ("ioctl_fuzz", crate::fuzz::ioctl_fuzz),
        ("faults_in_a_row", faults_in_a_row),
        ("hang_with_submissions_trickling", hang_with_submissions_trickling),
        ("threads_race_one_fd", threads_race_one_fd),
        ("unmap_under_running_job", unmap_under_running_job),
        ("gem_close_under_running_job", gem_close_under_running_job),
        ("fork_inherited_fd", fork_inherited_fd),
        ("ring_saturation", ring_saturation),
        ("submit_flood", submit_flood),
        ("signals_during_waits", signals_during_waits),
        ("kmsg_clean", crate::tests::kmsg_clean),
    ];
    if kind == linux_tests::KernelKind::Debug {
        let last = v.pop();
        v.push(("kmemleak_clean", crate::debug_kernel::kmemleak_clean));
        v.extend(last);
    }
    v
}

/// A job submitted with a sync_file (closed on drop).
struct Job {
    point: u64,
    fd: RawFd,
    seqno: u64,
}

impl Job {
    /// 1 signalled, 0 active, or the fence's negative error.
    fn status(&self) -> Result<i32, String> {
        drm::sync_file_status(self.fd).map_err(|e| format!("SYNC_IOC_FILE_INFO: errno {e}"))
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // SAFETY: closing the sync_file the kernel gave us.
        unsafe { libc::close(self.fd) };
    }
}

/// Submits `cmds` on `ctx`: the next point of the fixture's timeline, the
/// binary syncobjs `also`, a sync_file.
fn submit(fx: &mut Fx, ctx: u32, cmds: &[Command<'_>], also: &[u32]) -> Result<Job, String> {
    let (ib, dw) = fx.ib(cmds)?;
    fx.point += 1;
    let mut outs = vec![sync(fx.sync, fx.point)];
    outs.extend(also.iter().map(|&h| sync(h, 0)));
    let s = fx
        .dev
        .submit_full(ctx, ib, dw, &[], &outs, u::SUBMIT_OUT_SYNC_FILE)
        .map_err(|e| format!("SUBMIT: errno {e}"))?;
    Ok(Job { point: fx.point, fd: s.out_fence_fd, seqno: s.seqno })
}

/// Waits (up to 10 s) until the dword at `off` of `map` is `v`.
fn wait_word(map: &Map, off: usize, v: u32, what: &str) -> R {
    let t0 = Instant::now();
    while map.r32(off) != v {
        ensure!(
            t0.elapsed() < Duration::from_secs(10),
            "{what}: the word is {:#x}, not {v:#x}",
            map.r32(off)
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// Waits (up to 10 s) for a sync_file to signal and returns its status.
fn end_status(fd: RawFd) -> Result<i32, String> {
    ensure!(drm::poll_in(fd, 10_000), "a job's fence did not signal within 10 s");
    drm::sync_file_status(fd).map_err(|e| format!("SYNC_IOC_FILE_INFO: errno {e}"))
}

/// Steps of a paced job ([`paced`]) and their pace.
const STEPS: u32 = 600;
const EVERY: Duration = Duration::from_millis(100);

/// A paced job's commands: `first` (its start marker), then WAIT_MEMs
/// until the step counter at `step` reaches 1..=[`STEPS`], then `then`.
fn paced<'a>(first: Command<'a>, step: u64, then: &[Command<'a>]) -> Vec<Command<'a>> {
    let mut v = vec![first];
    v.extend((1..=STEPS).map(|s| wait_step(step, s)));
    v.extend_from_slice(then);
    v
}

/// Raises the step counter at `off` of `map` every [`EVERY`] while
/// `hold` is set, up to `STEPS - 1`; then to [`STEPS`], which releases
/// the job.
fn pacer(map: &Map, off: usize, hold: &AtomicBool) {
    let mut s = 0;
    while hold.load(Ordering::SeqCst) {
        std::thread::sleep(EVERY);
        if s + 1 < STEPS {
            s += 1;
            map.w32(off, s);
        }
    }
    map.w32(off, STEPS);
}

// ----- faults behind faults

/// Faulting jobs in [`faults_in_a_row`], each on its own context.
const FAULTS: u32 = 48;
/// Nothing is mapped here.
const UNMAPPED: u64 = 0x7000_0000;

/// 48 jobs of 48 contexts on GFX, each faulting at once, then an innocent
/// job: a fault is handled as it happens (docs/linux.md, "Hangs, faults
/// and reset"), also when it happens while the handler recovers from
/// the one before (it writes the next faulting job back into the ring,
/// which faults before the handler has returned). Every faulting job
/// fails with -EIO and makes its own context guilty, the innocent job
/// succeeds, and all of it ends within 20 job_timeout_ms windows (a
/// failure guard: the timeout path alone, a window per fault, needs 47).
/// Against the handler that let such a fault wait for the next timeout,
/// the ioctl fuzzer's jobs drained at one fault per window.
fn faults_in_a_row() -> R {
    let mut fx = Fx::new()?;
    fixture::clear_devcoredumps()?;
    let window = fx.dev.param(u::param::JOB_TIMEOUT_MS).map_err(|e| format!("GET_PARAM: errno {e}"))?;
    let bad = [Command::WriteData { dst: UNMAPPED, data: Payload::Words(&[1]) }];
    let mut jobs = Vec::new();
    let t0 = Instant::now();
    for _ in 0..FAULTS {
        let c = fx.ctx(u::engine::GFX)?;
        jobs.push((c, submit(&mut fx, c, &bad, &[])?));
    }
    let i = fx.ctx(u::engine::GFX)?;
    let innocent = submit(
        &mut fx,
        i,
        &[Command::WriteData { dst: DATA_VA + 0xD00, data: Payload::Words(&[0x600D]) }],
        &[],
    )?;
    fx.dev
        .wait_point(fx.sync, innocent.point, 60_000_000_000)
        .map_err(|e| format!("the innocent job (60 s guard): errno {e}"))?;
    let took = t0.elapsed();
    for (n, (c, j)) in jobs.iter().enumerate() {
        ensure!(end_status(j.fd)? == -libc::EIO, "faulting job {n}: status {}", j.status()?);
        let q = fx.dev.ctx_query(*c).map_err(|e| format!("CTX_QUERY: errno {e}"))?;
        ensure!(
            q.state == u::ctx_state::GUILTY && q.guilty_seqno == j.seqno,
            "faulting job {n}'s context: {q:?}"
        );
    }
    ensure!(
        innocent.status()? == 1 && fx.data.map.r32(0xD00) == 0x600D,
        "the innocent job: {}",
        innocent.status()?
    );
    let q = fx.dev.ctx_query(i).map_err(|e| format!("CTX_QUERY: errno {e}"))?;
    ensure!(q.state != u::ctx_state::GUILTY, "the innocent context is guilty");
    println!("guest: faults_in_a_row: {FAULTS} faults handled in {} ms", took.as_millis());
    // The time bound is the stock kernel's: on the debug kernel (KASAN,
    // lockdep, kmemleak under TCG) each reset and its devcoredump capture
    // take long enough that 48 of them on a loaded host can pass 20
    // windows without any fault waiting for one.
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    ensure!(
        crate::kernel_kind(&cmdline) == linux_tests::KernelKind::Debug
            || took < Duration::from_millis(20 * window),
        "{FAULTS} faults took {took:?}: faults waited for the timeout ({window} ms windows)"
    );
    for (c, _) in &jobs {
        fx.dev.ctx_destroy(*c).map_err(|e| format!("CTX_DESTROY: errno {e}"))?;
    }
    fixture::clear_devcoredumps()
}

/// A job hangs on GFX (a WAIT_MEM nobody satisfies) while another
/// context of the same client submits a small job behind it every half
/// window, as long as the hung job's fence has not signalled (at most 24:
/// each goes into the ring at once, well within the 64 credits). The hang
/// is detected as promised, one to two windows after the job stopped,
/// however often jobs arrive (failure guard: 12 windows): the hung job
/// fails with -ETIMEDOUT, the trickled jobs all succeed. Against the
/// handler run by 6.12's drm_sched timeout, which every run_job re-armed a
/// whole window ahead, the hang was not checked until the submissions
/// stopped.
fn hang_with_submissions_trickling() -> R {
    let mut fx = Fx::new()?;
    fixture::clear_devcoredumps()?;
    let window = fx.dev.param(u::param::JOB_TIMEOUT_MS).map_err(|e| format!("GET_PARAM: errno {e}"))?;
    let h = fx.ctx(u::engine::GFX)?;
    let t = fx.ctx(u::engine::GFX)?;
    let hung = submit(&mut fx, h, &[crate::tests::wait_eq(DATA_VA + 0xE00, 0xDEAD)], &[])?;
    let mut trickled = Vec::new();
    let mut detected = false;
    for n in 0..24u32 {
        std::thread::sleep(Duration::from_millis(window / 2));
        if hung.status()? != 0 {
            detected = true;
            break;
        }
        let dst = DATA_VA + 0xE40 + 4 * u64::from(n);
        trickled.push((
            n,
            submit(&mut fx, t, &[Command::WriteData { dst, data: Payload::Words(&[n + 1]) }], &[])?,
        ));
    }
    ensure!(
        detected,
        "the hung job was not detected in 12 windows of {window} ms while {} jobs arrived behind it",
        trickled.len()
    );
    ensure!(hung.status()? == -libc::ETIMEDOUT, "the hung job's status {}", hung.status()?);
    for (n, j) in &trickled {
        ensure!(end_status(j.fd)? == 1, "trickled job {n}: status {}", j.status()?);
        let v = fx.data.map.r32(0xE40 + 4 * *n as usize);
        ensure!(v == n + 1, "trickled job {n} wrote {v}");
    }
    let q = fx.dev.ctx_query(h).map_err(|e| format!("CTX_QUERY: errno {e}"))?;
    ensure!(q.state == u::ctx_state::GUILTY && q.guilty_seqno == hung.seqno, "the hung context: {q:?}");
    println!("guest: hang_with_submissions_trickling: detected after {} jobs behind it", trickled.len());
    fixture::take_devcoredump().map(|_| ())
}

// ----- threads racing on one file

/// Rounds of [`threads_race_one_fd`].
const RACE_ROUNDS: u64 = 16;
/// The racing mappings: [`RACE_SLOTS`] slots of 1 MiB from here.
const RACE_VA: u64 = 0x4000_0000;
const RACE_SLOTS: u64 = 8;
/// Jobs per round at most, one IB each.
const RACE_JOBS: usize = 96;

const GEM_CLOSE: u32 = (1 << 30) | (8 << 16) | ((b'd' as u32) << 8) | 0x09;

/// The racing threads stop when their file is gone from the fd table
/// (EBADF), or the number is now another kind of file (ENOTTY: a
/// sync_file made by a SUBMIT that was already inside the driver).
fn gone(e: Errno) -> bool {
    e == libc::EBADF || e == libc::ENOTTY
}

/// Per round: a fresh file whose only other reference is none (no CPU
/// mapping: the IBs are in a BO of a helper file, imported with PRIME), 4
/// BOs of 1 MiB mapped into every other slot; threads race on it: one maps BOs into 8 slots and unmaps
/// them, one closes BOs and creates new ones, one submits jobs that write
/// into the slots, one closes the file after a delay that grows with the
/// round. Every ioctl returns 0 or its expected error, every job's fence
/// signals (success, -EIO where its slot was unmapped, -ECANCELED behind
/// such a fault), and nothing stays allocated.
fn threads_race_one_fd() -> R {
    fixture::clear_devcoredumps()?;
    let helper = Dev::open().map_err(|e| format!("open: errno {e}"))?;
    let gen = helper_gen(&helper)?;
    let ibs = buf(&helper, IB_SIZE, IB_VA)?;
    let mut pos = 0;
    let mut ib = Vec::new();
    for j in 0..RACE_JOBS as u64 {
        let dst = RACE_VA + (j % RACE_SLOTS) * (1 << 20) + 4 * (j / RACE_SLOTS);
        ib.push(encode_ib(
            gen,
            &ibs,
            &mut pos,
            &[Command::WriteData { dst, data: Payload::Words(&[0x5000 | j as u32]) }],
        )?);
    }
    let dmabuf = helper.prime_export(ibs.handle).map_err(|e| format!("PRIME export: errno {e}"))?;
    let mut tally = [0u32; 3];
    let mut cut = 0;
    // Maps that took effect, and where the guilty contexts faulted: in a
    // racing slot, in the IBs, elsewhere (with the first such address).
    let maps = AtomicU32::new(0);
    let mut faults = [0u32; 3];
    let mut stray = None;
    for round in 0..RACE_ROUNDS {
        let dev = Dev::open().map_err(|e| format!("open: errno {e}"))?;
        let ibh = dev.prime_import(dmabuf.as_raw_fd()).map_err(|e| format!("PRIME import: errno {e}"))?;
        dev.map(ibh, 0, IB_VA, IB_SIZE, 0).map_err(|e| format!("map the IBs: errno {e}"))?;
        let mut bos = Vec::new();
        for _ in 0..4 {
            bos.push(dev.bo_create(1 << 20, 0).map_err(|e| format!("BO_CREATE: errno {e}"))?);
        }
        // Even slots start mapped, odd ones unmapped: the first jobs of
        // contexts 0 and 2 (even slots) succeed and those of contexts 1
        // and 3 fault, however slowly the racing maps go.
        for (i, slot) in (0..RACE_SLOTS).step_by(2).enumerate() {
            dev.map(bos[i % bos.len()], 0, RACE_VA + slot * (1 << 20), 1 << 20, 0)
                .map_err(|e| format!("map slot {slot}: errno {e}"))?;
        }
        let bos = Mutex::new(bos);
        let fd = dev.into_raw_fd();
        let failure = Mutex::new(None::<String>);
        let fail = |what: String| {
            if let Ok(mut f) = failure.lock() {
                f.get_or_insert(what);
            }
        };
        let fences = std::thread::scope(|s| {
            s.spawn(|| {
                let mut rng = Rng::new(round * 3 + 1);
                for _ in 0..400 {
                    let slot = RACE_VA + rng.below(RACE_SLOTS) * (1 << 20);
                    let r = if rng.chance(2, 3) {
                        let h = bos.lock().map(|b| rng.pick(&b)).unwrap_or(0);
                        vm_bind(fd, &[map_op(h, 0, slot, 1 << 20, 0)]).map(|()| true).or_else(|e| {
                            if e == libc::EEXIST || e == libc::ENOENT {
                                Ok(false)
                            } else {
                                Err(e)
                            }
                        })
                    } else {
                        vm_bind(fd, &[unmap_op(slot, 1 << 20)]).map(|()| false)
                    };
                    match r {
                        Err(e) if gone(e) => return,
                        Err(e) => return fail(format!("VM_BIND: errno {e}")),
                        Ok(mapped) => {
                            maps.fetch_add(u32::from(mapped), Ordering::Relaxed);
                        }
                    }
                }
            });
            s.spawn(|| {
                let mut rng = Rng::new(round * 3 + 2);
                for _ in 0..200 {
                    let Ok(mut b) = bos.lock() else { return };
                    let i = rng.below(b.len() as u64) as usize;
                    let mut arg = [b[i], 0u32];
                    match drm::ioctl(fd, GEM_CLOSE, &mut arg) {
                        Err(e) if gone(e) => return,
                        Err(e) => return fail(format!("GEM_CLOSE: errno {e}")),
                        Ok(()) => {}
                    }
                    let mut c = u::BoCreate { size: 1 << 20, flags: 0, handle: 0 };
                    match drm::ioctl(fd, u::DRM_IOCTL_REFGPU_BO_CREATE, &mut c) {
                        Err(e) if gone(e) => return,
                        Err(e) => return fail(format!("BO_CREATE: errno {e}")),
                        Ok(()) => b[i] = c.handle,
                    }
                }
            });
            let closer = s.spawn(|| {
                std::thread::sleep(Duration::from_millis(round * round / 2));
                // SAFETY: the racing file's descriptor, closed only here.
                unsafe { libc::close(fd) };
            });
            let fences = submitter(fd, &ib, &fail);
            let _ = closer.join();
            fences
        });
        if let Some(f) = failure.into_inner().map_err(|_| "lock".to_string())? {
            return Err(format!("round {round}: {f}"));
        }
        let Submitted { fences, guilty } = fences?;
        cut += u32::from(fences.len() < RACE_JOBS);
        for (status, addr) in guilty {
            let slots = RACE_VA..RACE_VA + RACE_SLOTS * (1 << 20);
            let k = if slots.contains(&addr) {
                0
            } else if (IB_VA..IB_VA + IB_SIZE).contains(&addr) {
                1
            } else {
                stray.get_or_insert((status, addr));
                2
            };
            faults[k] += 1;
        }
        for fd in fences {
            let st = end_status(fd);
            // SAFETY: a sync_file the kernel gave us.
            unsafe { libc::close(fd) };
            match st? {
                1 => tally[0] += 1,
                e if e == -libc::EIO => tally[1] += 1,
                e if e == -libc::ECANCELED => tally[2] += 1,
                e => return Err(format!("round {round}: a job's fence ended with {e}")),
            }
        }
    }
    let maps = maps.into_inner();
    println!(
        "guest: threads_race_one_fd: fences: {} succeeded, {} faulted (-EIO), {} cancelled; the close cut the submitter short in {cut} of {RACE_ROUNDS} rounds; {maps} maps took effect; guilty contexts faulted {} times in the slots, {} in the IBs, {} elsewhere (first: {stray:x?})",
        tally[0], tally[1], tally[2], faults[0], faults[1], faults[2]
    );
    ensure!(
        tally[0] > 0 && tally[1] > 0,
        "the race never ran a job or never faulted one: {tally:?}, {maps} maps, faults (slots, IBs, elsewhere) {faults:?}, first stray (status, address) {stray:x?}"
    );
    fixture::clear_devcoredumps()
}

fn helper_gen(d: &Dev) -> Result<umd_core::hw::Generation, String> {
    match d.param(u::param::GENERATION) {
        Ok(1) => Ok(umd_core::hw::Generation::Gen1),
        Ok(2) => Ok(umd_core::hw::Generation::Gen2),
        other => Err(format!("GET_PARAM GENERATION: {other:?}")),
    }
}

fn vm_bind(fd: RawFd, ops: &[u::VmBindOp]) -> Result<(), Errno> {
    let mut a = u::VmBind { op_count: ops.len() as u32, ops: ops.as_ptr() as u64, ..Default::default() };
    drm::ioctl(fd, u::DRM_IOCTL_REFGPU_VM_BIND, &mut a)
}

/// The racing submitter: jobs on four GFX contexts in turn (a new one
/// for a guilty one, whose fault it records), each with a sync_file;
/// stops when the file is gone.
fn submitter(fd: RawFd, ib: &[(u64, u32)], fail: &dyn Fn(String)) -> Result<Submitted, String> {
    let mut fences = Vec::new();
    let mut guilty = Vec::new();
    let mut ctxs = [None; 4];
    for (j, &(va, dw)) in ib.iter().enumerate() {
        let ctx = &mut ctxs[j % 4];
        let c = match *ctx {
            Some(c) => c,
            None => {
                let mut a = u::CtxCreate { engine: u::engine::GFX, ..Default::default() };
                match drm::ioctl(fd, u::DRM_IOCTL_REFGPU_CTX_CREATE, &mut a) {
                    Err(e) if gone(e) => break,
                    Err(e) => {
                        fail(format!("CTX_CREATE: errno {e}"));
                        break;
                    }
                    Ok(()) => *ctx.insert(a.ctx_id),
                }
            }
        };
        let mut a = u::Submit {
            ctx_id: c,
            flags: u::SUBMIT_OUT_SYNC_FILE,
            ib_va: va,
            ib_size_dw: dw,
            out_fence_fd: -1,
            ..Default::default()
        };
        match drm::ioctl(fd, u::DRM_IOCTL_REFGPU_SUBMIT, &mut a) {
            Ok(()) => fences.push(a.out_fence_fd),
            Err(e) if gone(e) => break,
            Err(e) if e == libc::ECANCELED => {
                let mut q = u::CtxQuery { ctx_id: c, ..Default::default() };
                match drm::ioctl(fd, u::DRM_IOCTL_REFGPU_CTX_QUERY, &mut q) {
                    Ok(()) => guilty.push((q.fault_status, q.fault_addr)),
                    Err(e) if gone(e) => break,
                    Err(e) => {
                        fail(format!("CTX_QUERY of a guilty context: errno {e}"));
                        break;
                    }
                }
                let mut d = u::CtxDestroy { ctx_id: c, pad: 0 };
                if let Err(e) = drm::ioctl(fd, u::DRM_IOCTL_REFGPU_CTX_DESTROY, &mut d) {
                    if !gone(e) {
                        fail(format!("CTX_DESTROY of a guilty context: errno {e}"));
                    }
                    break;
                }
                *ctx = None;
            }
            Err(e) => {
                fail(format!("SUBMIT: errno {e}"));
                break;
            }
        }
    }
    Ok(Submitted { fences, guilty })
}

/// What [`submitter`] leaves: the sync_files of its jobs, and the
/// (FAULT_STATUS, fault address) of each context it found guilty.
struct Submitted {
    fences: Vec<RawFd>,
    guilty: Vec<(u64, u64)>,
}

// ----- unmap and GEM_CLOSE under a running job

/// Where the running job's target buffer is.
const X_VA: u64 = 0x4000_0000;
const X_SIZE: u64 = 64 << 10;

/// A GFX job marks its start, waits (paced) and then writes into a buffer
/// X; X is unmapped while the job waits. The UNMAP returns at once (it
/// does not wait for the VM's jobs) and takes the translation away: the
/// job's write faults (-EIO, its context GUILTY at X's address) and X's
/// pages, still alive through the CPU mapping, never see the write
/// (docs/linux.md, "VMs and VM_BIND").
fn unmap_under_running_job() -> R {
    let mut fx = Fx::new()?;
    fixture::clear_devcoredumps()?;
    let x = buf(&fx.dev, X_SIZE, X_VA)?;
    let (started, step, after) = (0x600, 0x640, 0x680);
    let c = fx.ctx(u::engine::GFX)?;
    let cmds = paced(
        Command::WriteData { dst: DATA_VA + started, data: Payload::Words(&[1]) },
        DATA_VA + step,
        &[
            Command::WriteData { dst: X_VA + 0x100, data: Payload::Words(&[0xBAD0]) },
            Command::WriteData { dst: DATA_VA + after, data: Payload::Words(&[0x600D]) },
        ],
    );
    let job = submit(&mut fx, c, &cmds, &[])?;
    let hold = AtomicBool::new(true);
    let r = std::thread::scope(|s| {
        s.spawn(|| pacer(&fx.data.map, step as usize, &hold));
        let r = (|| {
            wait_word(&fx.data.map, started as usize, 1, "the job's start")?;
            fx.dev.unmap(X_VA, X_SIZE).map_err(|e| format!("UNMAP under the job: errno {e}"))?;
            ensure!(job.status()? == 0, "the job ended ({}) before it was released", job.status()?);
            Ok(())
        })();
        hold.store(false, Ordering::SeqCst);
        r
    });
    r?;
    fx.wait(job.point)?;
    ensure!(job.status()? == -libc::EIO, "the job's status {}, expected -EIO (a fault)", job.status()?);
    let q = fx.dev.ctx_query(c).map_err(|e| format!("CTX_QUERY: errno {e}"))?;
    ensure!(
        q.state == u::ctx_state::GUILTY && q.guilty_seqno == job.seqno && q.fault_addr & !0xFFF == X_VA,
        "the context after the fault: {q:?}"
    );
    ensure!(x.map.r32(0x100) == 0, "the unmapped buffer was written: {:#x}", x.map.r32(0x100));
    ensure!(fx.data.map.r32(after as usize) != 0x600D, "the job went on after its fault");
    fixture::take_devcoredump().map(|_| ())
}

/// The same job with a BO whose only CPU-side reference is its handle: a
/// GEM_CLOSE while the job waits leaves the mapping (which holds the BO):
/// the BO count does not drop, the job's write lands (a COPY back into
/// the data buffer shows it), the job succeeds; the BO goes only with
/// the UNMAP after the job.
fn gem_close_under_running_job() -> R {
    let mut fx = Fx::new()?;
    let h = fx.dev.bo_create(X_SIZE, 0).map_err(|e| format!("BO_CREATE: errno {e}"))?;
    fx.dev.map(h, 0, X_VA, X_SIZE, 0).map_err(|e| format!("map: errno {e}"))?;
    let (started, step, seen, after) = (0x700, 0x740, 0x780, 0x7C0);
    let c = fx.ctx(u::engine::GFX)?;
    let cmds = paced(
        Command::WriteData { dst: DATA_VA + started, data: Payload::Words(&[1]) },
        DATA_VA + step,
        &[
            Command::WriteData { dst: X_VA + 0x100, data: Payload::Words(&[0x5EED]) },
            Command::Copy { src: X_VA + 0x100, dst: DATA_VA + seen, size: 4 },
            Command::WriteData { dst: DATA_VA + after, data: Payload::Words(&[0x600D]) },
        ],
    );
    let job = submit(&mut fx, c, &cmds, &[])?;
    let hold = AtomicBool::new(true);
    let bos = std::thread::scope(|s| {
        s.spawn(|| pacer(&fx.data.map, step as usize, &hold));
        let r = (|| {
            wait_word(&fx.data.map, started as usize, 1, "the job's start")?;
            let before = live()?[0];
            fx.dev.gem_close(h).map_err(|e| format!("GEM_CLOSE under the job: errno {e}"))?;
            let after_close = live()?[0];
            ensure!(job.status()? == 0, "the job ended ({}) before it was released", job.status()?);
            Ok((before, after_close))
        })();
        hold.store(false, Ordering::SeqCst);
        r
    });
    let (before, after_close) = bos?;
    ensure!(after_close == before, "GEM_CLOSE of a mapped BO freed it: bos {before} -> {after_close}");
    fx.wait(job.point)?;
    ensure!(job.status()? == 1, "the job's status {}, expected success", job.status()?);
    ensure!(
        fx.data.map.r32(seen as usize) == 0x5EED,
        "the job's write to the closed BO: {:#x}",
        fx.data.map.r32(seen as usize)
    );
    ensure!(fx.data.map.r32(after as usize) == 0x600D, "the job did not finish");
    fx.dev.unmap(X_VA, X_SIZE).map_err(|e| format!("UNMAP: errno {e}"))?;
    let t0 = Instant::now();
    while live()?[0] != before - 1 {
        ensure!(
            t0.elapsed() < Duration::from_secs(5),
            "the UNMAP did not free the closed BO: bos {}",
            live()?[0]
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

// ----- fork with an inherited file

/// Jobs of the child in [`fork_inherited_fd`] and of the parent.
const CHILD_JOBS: u32 = 8;
const PARENT_JOBS: u32 = 24;

/// A process forks with its file open and jobs in flight: the child
/// submits, on a context the parent made and on one it makes itself, jobs
/// held behind a paced one, and dies (`_exit`, then, in a second round,
/// SIGKILL while it waits) with them in flight. The parent goes on with
/// its own jobs on another engine: they all succeed and ran once; the
/// child's jobs run to completion too (the file is the parent's as much
/// as the child's: nothing of it is torn down), each once; the child's
/// context is the parent's to destroy; nothing leaks.
fn fork_inherited_fd() -> R {
    for kill in [false, true] {
        fork_round(kill)
            .map_err(|e| format!("{}: {e}", if kill { "child killed" } else { "child exited" }))?;
    }
    Ok(())
}

fn fork_round(kill: bool) -> R {
    let mut fx = Fx::new()?;
    let marks = buf(&fx.dev, 64 << 10, 0x5000_0000)?;
    let step = 0x800usize;
    fx.data.map.w32(step, 0);
    let cc = fx.ctx(u::engine::COMPUTE)?;
    let cp = fx.ctx(u::engine::GFX)?;
    let csync = fx.dev.syncobj().map_err(|e| format!("SYNCOBJ_CREATE: errno {e}"))?;
    let mut child_ibs = Vec::new();
    child_ibs.push(fx.ib(&paced(Command::Nop { dwords: 0 }, DATA_VA + step as u64, &[]))?);
    for i in 0..CHILD_JOBS {
        child_ibs.push(fx.ib(&[Command::WriteData {
            dst: marks.va + 4 * u64::from(i),
            data: Payload::Words(&[0xC000 | i]),
        }])?);
    }
    let mut parent_ibs = Vec::new();
    for i in 0..PARENT_JOBS {
        parent_ibs.push(fx.ib(&[Command::WriteData {
            dst: marks.va + 0x1000 + 4 * u64::from(i),
            data: Payload::Words(&[0xA000 | i]),
        }])?);
    }
    let mut fds = [0i32; 2];
    // SAFETY: pipe(2) into a two-element array.
    ensure!(unsafe { libc::pipe(fds.as_mut_ptr()) } == 0, "pipe: errno {}", drm::errno());
    // SAFETY: fork(2); the child submits, reports and dies.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let r = (|| -> Result<u32, Errno> {
            let c2 = fx.dev.ctx_create(u::engine::COPY)?;
            for (i, &(va, dw)) in child_ibs.iter().enumerate() {
                let ctx = if i % 2 == 0 { cc } else { c2 };
                // Everything behind the paced job: its context's order,
                // and the COPY jobs wait for its point.
                let ins = if ctx == c2 { vec![sync(csync, 1)] } else { Vec::new() };
                fx.dev.submit_full(ctx, va, dw, &ins, &[sync(csync, i as u64 + 1)], 0)?;
            }
            Ok(c2)
        })();
        let msg = match r {
            Ok(c2) => format!("S{c2}\n"),
            Err(e) => format!("E{e}\n"),
        };
        // SAFETY: the report; then the child dies with its jobs in flight
        // (at once, or once the parent kills it), without running any
        // destructor of the parent's state.
        unsafe {
            libc::write(fds[1], msg.as_ptr().cast(), msg.len());
            if kill {
                loop {
                    libc::pause();
                }
            }
            libc::_exit(0)
        }
    }
    ensure!(pid > 0, "fork: errno {}", drm::errno());
    // SAFETY: our copy of the write end, and the read end into a File.
    let mut rd = unsafe {
        libc::close(fds[1]);
        std::io::BufReader::new(<std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fds[0]))
    };
    let mut line = String::new();
    let _ = std::io::BufRead::read_line(&mut rd, &mut line);
    if kill {
        // SAFETY: killing our own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let mut st = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    let c2: u32 = match line.trim().strip_prefix('S').and_then(|s| s.parse().ok()) {
        Some(c) => c,
        None => return Err(format!("the child: {}", line.trim())),
    };
    let hold = AtomicBool::new(true);
    let r = std::thread::scope(|s| {
        s.spawn(|| pacer(&fx.data.map, step, &hold));
        let r = (|| {
            ensure!(
                fx.dev.query_point(csync).unwrap_or(u64::MAX) == 0,
                "the child's jobs ended before the pacing did"
            );
            let mut point = fx.point;
            for &(va, dw) in &parent_ibs {
                point += 1;
                fx.dev
                    .submit(cp, va, dw, fx.sync, point)
                    .map_err(|e| format!("the parent's SUBMIT: errno {e}"))?;
            }
            fx.wait(point)?;
            ensure!(fx.dev.query_point(csync).unwrap_or(u64::MAX) == 0, "the child's paced job ended early");
            Ok(point)
        })();
        hold.store(false, Ordering::SeqCst);
        r
    });
    fx.point = r?;
    for i in 0..PARENT_JOBS {
        let m = marks.map.r32(0x1000 + 4 * i as usize);
        ensure!(m == 0xA000 | i, "the parent's job {i}: mark {m:#x}");
    }
    fx.dev
        .wait_point(csync, u64::from(CHILD_JOBS) + 1, WAIT_NS)
        .map_err(|e| format!("the child's last job: errno {e}"))?;
    for i in 0..CHILD_JOBS {
        let m = marks.map.r32(4 * i as usize);
        ensure!(m == 0xC000 | i, "the child's job {i}: mark {m:#x}");
    }
    for (ctx, who) in [(cp, "the parent's"), (cc, "the shared"), (c2, "the child's")] {
        let q = fx.dev.ctx_query(ctx).map_err(|e| format!("CTX_QUERY {who}: errno {e}"))?;
        ensure!(q.state == u::ctx_state::OK, "{who} context: state {}", q.state);
    }
    fx.dev.ctx_destroy(c2).map_err(|e| format!("CTX_DESTROY of the child's context: errno {e}"))?;
    fx.dev.syncobj_destroy(csync).map_err(|e| format!("SYNCOBJ_DESTROY: errno {e}"))?;
    Ok(())
}

// ----- ring and credit saturation

/// Contexts per engine and jobs per context in [`ring_saturation`].
const SAT_CTX_PER_ENGINE: u32 = 2;
const SAT_JOBS: u32 = 400;

/// Far more jobs than the scheduler's credits (64 per engine) and the
/// 16 KiB rings hold: 400 on each of two contexts per engine, some of
/// them big IBs, all submitted while a paced gate job holds each engine.
/// SUBMIT neither blocks nor fails (the jobs wait in their contexts'
/// queues: the live job count shows all of them while the gates hold);
/// job `i` of a context waits until its context's counter is `i` and
/// raises it to `i + 1`, so a job run out of order or twice would hang.
/// All complete, every counter reads 400, no context was reset.
fn ring_saturation() -> R {
    let mut fx = Fx::new()?;
    let ib_max =
        fx.dev.param(u::param::IB_MAX_DWORDS).map_err(|e| format!("IB_MAX_DWORDS: errno {e}"))? as u32;
    let big_max = ib_max.min(1 << 18);
    let ibs = buf(&fx.dev, 8 << 20, 0x6000_0000)?;
    let gate = 0x900usize;
    let counter = |c: u32| 0xA00 + 64 * c as usize;
    let n_ctx = SAT_CTX_PER_ENGINE * u::engine::COUNT;
    let mut ctxs = Vec::new();
    for c in 0..n_ctx {
        fx.data.map.w32(counter(c), 0);
        let ctx = fx.ctx(c % u::engine::COUNT)?;
        let s = fx.dev.syncobj().map_err(|e| format!("SYNCOBJ_CREATE: errno {e}"))?;
        ctxs.push((ctx, s));
    }
    // The IBs: small ones, and per context one big one (the first context
    // gets the largest the driver takes, capped at 1 MiB).
    let enc = Encoder::new(fx.gen);
    let mut nop = [0u32; 1];
    enc.encode(&Command::Nop { dwords: 0 }, &mut nop, 0, 0).map_err(|e| format!("encode NOP: {e}"))?;
    let mut pos = 0u64;
    let mut jobs = Vec::new();
    for c in 0..n_ctx {
        let cnt = DATA_VA + counter(c) as u64;
        let mut list = Vec::new();
        for i in 0..SAT_JOBS {
            let tail = [
                Command::WaitMem {
                    addr: cnt,
                    reference: u64::from(i),
                    mask: 0xFFFF_FFFF,
                    op: CompareOp::Eq,
                    wide: false,
                },
                Command::WriteData { dst: cnt, data: Payload::Words(&[i + 1]) },
            ];
            let big = match (c, i % 200) {
                (0, 100) => big_max - 16,
                (_, 100) => 1 << 14,
                _ => 0,
            };
            list.push(if big == 0 {
                encode_ib(fx.gen, &ibs, &mut pos, &tail)?
            } else {
                big_ib(&enc, &ibs, &mut pos, nop[0], big, &tail)?
            });
        }
        jobs.push(list);
    }
    let gates: Vec<u32> = (0..u::engine::COUNT).map(|e| fx.ctx(e)).collect::<Result<_, _>>()?;
    fx.data.map.w32(gate, 0);
    let gate_cmds: Vec<Command<'_>> = (1..=STEPS).map(|s| wait_step(DATA_VA + gate as u64, s)).collect();
    let mut gate_jobs = Vec::new();
    for &g in &gates {
        gate_jobs.push(submit(&mut fx, g, &gate_cmds, &[])?);
    }
    let base = live()?[3];
    let hold = AtomicBool::new(true);
    let queued = std::thread::scope(|s| {
        s.spawn(|| pacer(&fx.data.map, gate, &hold));
        let r = (|| {
            // Interleaved over the contexts, as several clients would.
            let order = (0..SAT_JOBS as usize).flat_map(|i| (0..ctxs.len()).map(move |c| (i, c)));
            for (i, c) in order {
                let ((ctx, so), (va, dw)) = (ctxs[c], jobs[c][i]);
                fx.dev
                    .submit(ctx, va, dw, so, i as u64 + 1)
                    .map_err(|e| format!("SUBMIT {i} on context {c}: errno {e}"))?;
            }
            let queued = live()?[3] - base;
            ensure!(gate_jobs.iter().all(|j| j.status() == Ok(0)), "a gate ended before it was released");
            Ok(queued)
        })();
        hold.store(false, Ordering::SeqCst);
        r
    })?;
    let total = i64::from(SAT_JOBS * n_ctx);
    ensure!(queued == total, "{queued} jobs alive behind the gates, {total} submitted");
    for (c, &(ctx, so)) in ctxs.iter().enumerate() {
        fx.dev
            .wait_point(so, u64::from(SAT_JOBS), 60_000_000_000)
            .map_err(|e| format!("context {c}: its last job: errno {e}"))?;
        let v = fx.data.map.r32(counter(c as u32));
        ensure!(v == SAT_JOBS, "context {c}: counter {v}, expected {SAT_JOBS}");
        let q = fx.dev.ctx_query(ctx).map_err(|e| format!("CTX_QUERY: errno {e}"))?;
        ensure!(q.state == u::ctx_state::OK && q.reset_count == 0, "context {c}: {q:?}");
    }
    for j in &gate_jobs {
        ensure!(end_status(j.fd)? == 1, "a gate job: status {}", j.status()?);
    }
    println!(
        "guest: ring_saturation: {total} jobs queued behind the gates without SUBMIT blocking or failing"
    );
    Ok(())
}

/// An IB of `dw` dwords: 1-dword NOPs, then `tail` (32-byte aligned).
fn big_ib(
    enc: &Encoder,
    b: &Buf,
    pos: &mut u64,
    nop: u32,
    dw: u32,
    tail: &[Command<'_>],
) -> Result<(u64, u32), String> {
    let start = (*pos + 63) & !63;
    let nops = (dw as usize) & !7;
    let mut out = vec![nop; nops + 64];
    let mut n = nops;
    let tail_va = b.va + start + 4 * nops as u64;
    for c in tail {
        n += enc.encode(c, &mut out, n, tail_va).map_err(|e| format!("encode {c:?}: {e}"))?;
    }
    let end = start + 4 * n as u64;
    ensure!(end <= b.size, "the big IBs do not fit");
    b.map.write(start as usize, &out[..n]);
    *pos = end;
    Ok((b.va + start, n as u32))
}

// ----- a flood of SUBMITs

/// The driver's bound on one file's jobs (module parameter).
const FILE_MAX_JOBS: &str = "/sys/module/refgpu/parameters/file_max_jobs";
/// The driver's bound on one job's run time (module parameter).
const JOB_MAX_MS: &str = "/sys/module/refgpu/parameters/job_max_ms";
/// The bound [`submit_flood`] sets for its run: below the default (4096),
/// so that the flood is queued well within the gate's pace.
const FLOOD_LIMIT: i64 = 2048;
/// The memory cgroup [`submit_flood`] floods from.
const FLOOD_CGROUP: &str = "/sys/fs/cgroup/refgpu-flood";
/// What one queued job costs its cgroup at least: the job (376 bytes on
/// 6.12, a 512-byte slab object) without its hardware fence (a 128-byte
/// one) and the scheduler's fence (not charged).
const JOB_BYTES: u64 = 512;

/// A module parameter set for a test; the old value is written back on
/// drop.
struct Param(&'static str, String);

impl Param {
    fn set(path: &'static str, v: i64) -> Result<Param, String> {
        let old = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        std::fs::write(path, v.to_string()).map_err(|e| format!("{path}: {e}"))?;
        Ok(Param(path, old.trim().to_string()))
    }
}

impl Drop for Param {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0, &self.1);
    }
}

/// One file floods SUBMIT on GFX behind a paced gate job of its own, from
/// a memory cgroup of its own, with `file_max_jobs` at [`FLOOD_LIMIT`]
/// (and `job_max_ms` off: the gate, which keeps moving, must outlast the
/// flood on a slow kernel):
/// SUBMIT takes jobs until the file has that many (the gate included) and
/// then fails with EBUSY, on that context and on another of the file,
/// and again with the limit lowered to half of what the file holds
/// (writing 0 fails with EINVAL and keeps it), queuing nothing; the cgroup's `memory.current` grew by at least
/// [`JOB_BYTES`] a job (less the charge batches). Meanwhile another file
/// runs a job on COMPUTE to its end and queues one on GFX (its own
/// budget). Once the gate is released every job completes, no context
/// is reset, and the flooding file submits again (docs/linux.md, SUBMIT).
fn submit_flood() -> R {
    let _limit = Param::set(FILE_MAX_JOBS, FLOOD_LIMIT)?;
    let _unbounded = Param::set(JOB_MAX_MS, 0)?;
    crate::vm_tables::in_memory_cgroup(FLOOD_CGROUP, flood_child)
}

/// [`submit_flood`]'s process, in its cgroup.
fn flood_child() -> R {
    use crate::vm_tables::{charge_batches, memory_current};
    let mut fx = Fx::new()?;
    let mut other = Fx::new()?;
    let (flood, second, gate_ctx) =
        (fx.ctx(u::engine::GFX)?, fx.ctx(u::engine::COPY)?, fx.ctx(u::engine::GFX)?);
    let (other_gfx, other_compute) = (other.ctx(u::engine::GFX)?, other.ctx(u::engine::COMPUTE)?);
    let gate = 0x900usize;
    fx.data.map.w32(gate, 0);
    let gate_cmds: Vec<Command<'_>> = (1..=STEPS).map(|s| wait_step(DATA_VA + gate as u64, s)).collect();
    let gate_job = submit(&mut fx, gate_ctx, &gate_cmds, &[])?;
    let (ib, dw) = fx.ib(&[Command::WriteData { dst: DATA_VA + 0xA00, data: Payload::Words(&[1]) }])?;
    let base = live()?[3];
    let mem0 = memory_current(FLOOD_CGROUP)?;
    let dev = &fx.dev;
    let hold = AtomicBool::new(true);
    let other_point = std::thread::scope(|s| {
        s.spawn(|| pacer(&fx.data.map, gate, &hold));
        let r = (|| -> Result<u64, String> {
            let mut accepted = 0i64;
            let t0 = Instant::now();

            let refused = loop {
                match dev.submit_full(flood, ib, dw, &[], &[], 0) {
                    Ok(_) => accepted += 1,
                    Err(e) => break e,
                }

                ensure!(
                    accepted < FLOOD_LIMIT,
                    "{accepted} jobs accepted besides the gate, the limit is {FLOOD_LIMIT} ({FILE_MAX_JOBS}: {:?}, gate status {:?}, {} jobs alive, {base} before, after {:?})",
                    std::fs::read_to_string(FILE_MAX_JOBS).map(|s| s.trim().to_string()),
                    gate_job.status(),
                    live()?[3],
                    t0.elapsed()
                );
            };
            ensure!(refused == libc::EBUSY, "SUBMIT {}: errno {refused}, not EBUSY", accepted + 1);
            ensure!(
                accepted + 1 == FLOOD_LIMIT,
                "{accepted} jobs accepted besides the gate before EBUSY, the limit is {FLOOD_LIMIT}"
            );
            let again = dev.submit_full(second, ib, dw, &[], &[], 0);
            ensure!(
                again.is_err_and(|e| e == libc::EBUSY),
                "SUBMIT on another context of the file: {again:?}"
            );
            // Lowered below what the file holds, the limit still refuses.
            let lowered = FLOOD_LIMIT / 2;
            std::fs::write(FILE_MAX_JOBS, lowered.to_string())
                .map_err(|e| format!("{FILE_MAX_JOBS}: {e}"))?;
            let again = dev.submit_full(flood, ib, dw, &[], &[], 0);
            ensure!(
                again.is_err_and(|e| e == libc::EBUSY),
                "SUBMIT with {FILE_MAX_JOBS} lowered to {lowered}, the file holding {}: {again:?}",
                accepted + 1
            );
            // 0 is refused and the limit kept.
            let zero = std::fs::write(FILE_MAX_JOBS, "0");
            ensure!(
                zero.as_ref().is_err_and(|e| e.raw_os_error() == Some(libc::EINVAL)),
                "writing 0 to {FILE_MAX_JOBS}: {zero:?}, not EINVAL"
            );
            let kept = std::fs::read_to_string(FILE_MAX_JOBS).map_err(|e| format!("{FILE_MAX_JOBS}: {e}"))?;
            ensure!(kept.trim() == lowered.to_string(), "{FILE_MAX_JOBS} is {kept:?} after 0 was refused");
            let now = live()?[3];
            ensure!(
                now == base + accepted,
                "{now} jobs alive, {base} + {accepted} accepted: a refused call queued one"
            );
            let mem1 = memory_current(FLOOD_CGROUP)?;
            let want = accepted as u64 * JOB_BYTES;
            ensure!(
                mem1 + charge_batches() >= mem0 + want,
                "{accepted} jobs queued (at least {want} bytes) but the cgroup's memory.current grew by {} bytes",
                mem1.saturating_sub(mem0)
            );
            // Another client is not affected: its own budget, and COMPUTE runs.
            let p = other
                .run(other_compute, &[Command::WriteData { dst: DATA_VA, data: Payload::Words(&[7]) }])?;
            other.wait(p)?;
            ensure!(other.data.map.r32(0) == 7, "the other file's job did not write");
            let q = other
                .run(other_gfx, &[Command::WriteData { dst: DATA_VA + 4, data: Payload::Words(&[9]) }])?;
            ensure!(gate_job.status()? == 0, "the gate ended before it was released");
            println!(
                "guest: submit_flood: {accepted} SUBMITs in {:?}, then EBUSY; the cgroup's memory.current grew by {} bytes",
                t0.elapsed(),
                mem1.saturating_sub(mem0)
            );
            Ok(q)
        })();
        hold.store(false, Ordering::SeqCst);
        r
    })?;
    ensure!(end_status(gate_job.fd)? == 1, "the gate job: status {}", gate_job.status()?);
    other.wait(other_point)?;
    ensure!(other.data.map.r32(4) == 9, "the other file's GFX job did not write");
    // Every job ends and is freed (the budget comes back with the frees).
    let t0 = Instant::now();
    while live()?[3] >= base {
        ensure!(
            t0.elapsed() < Duration::from_secs(60),
            "{} jobs alive 60 s after the gate ended",
            live()?[3]
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    for c in [flood, gate_ctx] {
        let q = fx.dev.ctx_query(c).map_err(|e| format!("CTX_QUERY: errno {e}"))?;
        ensure!(q.state == u::ctx_state::OK && q.reset_count == 0, "context {c}: {q:?}");
    }
    // The flood's context runs its jobs in order: this one runs last.
    let p = fx.run(flood, &[Command::WriteData { dst: DATA_VA + 0xA04, data: Payload::Words(&[3]) }])?;
    fx.wait(p)?;
    ensure!(fx.data.map.r32(0xA04) == 3, "the job after the flood did not write");
    Ok(())
}

// ----- signals during waits

static HITS: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_usr1(_: libc::c_int) {
    HITS.fetch_add(1, Ordering::SeqCst);
}

/// Installs [`on_usr1`] for SIGUSR1, with or without SA_RESTART.
fn handle_usr1(restart: bool) -> R {
    // SAFETY: sigaction(2) with a zeroed struct, an empty mask and a
    // handler that only touches an atomic.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = if restart { libc::SA_RESTART } else { 0 };
        libc::sigemptyset(&mut sa.sa_mask);
        ensure!(
            libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()) == 0,
            "sigaction: errno {}",
            drm::errno()
        );
    }
    Ok(())
}

/// How a thread waits for a job.
#[derive(Clone, Copy, Debug)]
enum WaitKind {
    /// SYNCOBJ_TIMELINE_WAIT on its point.
    Timeline,
    /// SYNCOBJ_WAIT on a binary syncobj it signals.
    Binary,
    /// poll(2) on its sync_file.
    Poll,
}

/// A thread waits (10 s timeout) for a paced job on GFX; the test sends
/// it SIGUSR1 every 20 ms. Without SA_RESTART the wait returns EINTR
/// (poll, too, with SA_RESTART: poll(2) is never restarted after a
/// handler); the syncobj waits with SA_RESTART are restarted by the
/// kernel (their timeout is absolute) and return only once the job has
/// completed, after 5 signals handled. Either way the job and its fence are
/// untouched (still running, its timeline point not reached) and it then
/// completes normally, its last write done.
fn signals_during_waits() -> R {
    let mut fx = Fx::new()?;
    let bin = fx.dev.syncobj().map_err(|e| format!("SYNCOBJ_CREATE: errno {e}"))?;
    let c = fx.ctx(u::engine::GFX)?;
    let r = (|| -> R {
        for restart in [false, true] {
            handle_usr1(restart)?;
            for kind in [WaitKind::Timeline, WaitKind::Binary, WaitKind::Poll] {
                signal_case(&mut fx, c, bin, kind, restart)
                    .map_err(|e| format!("{kind:?}, SA_RESTART {restart}: {e}"))?;
            }
        }
        Ok(())
    })();
    // SAFETY: restoring SIGUSR1's default disposition.
    unsafe { libc::signal(libc::SIGUSR1, libc::SIG_DFL) };
    r?;
    fx.dev.syncobj_destroy(bin).map_err(|e| format!("SYNCOBJ_DESTROY: errno {e}"))
}

fn signal_case(fx: &mut Fx, c: u32, bin: u32, kind: WaitKind, restart: bool) -> R {
    let (step, done) = (0xC00usize, 0xC40usize);
    fx.data.map.w32(step, 0);
    fx.data.map.w32(done, 0);
    let cmds = paced(
        Command::Nop { dwords: 0 },
        DATA_VA + step as u64,
        &[Command::WriteData { dst: DATA_VA + done as u64, data: Payload::Words(&[0x600D]) }],
    );
    let job = submit(fx, c, &cmds, &[bin])?;
    let before = fx.dev.query_point(fx.sync).map_err(|e| format!("SYNCOBJ_QUERY: errno {e}"))?;
    ensure!(before < job.point, "the job's point {} already reached ({before})", job.point);
    let hold = AtomicBool::new(true);
    let returned = AtomicBool::new(false);
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let hits0 = HITS.load(Ordering::SeqCst);
    let fxr = &*fx;
    let res = std::thread::scope(|s| {
        s.spawn(|| pacer(&fxr.data.map, step, &hold));
        let waiter = s.spawn(|| {
            // SAFETY: pthread_self(3) of this thread.
            let _ = tid_tx.send(unsafe { libc::pthread_self() } as usize);
            let r = match kind {
                WaitKind::Timeline => fxr.dev.wait_point_once(fxr.sync, job.point, WAIT_NS),
                WaitKind::Binary => fxr.dev.wait_binary_once(bin, WAIT_NS),
                WaitKind::Poll => {
                    let mut p = libc::pollfd { fd: job.fd, events: libc::POLLIN, revents: 0 };
                    // SAFETY: one valid pollfd.
                    match unsafe { libc::poll(&mut p, 1, 10_000) } {
                        1 => Ok(()),
                        0 => Err(libc::ETIME),
                        _ => Err(drm::errno()),
                    }
                }
            };
            returned.store(true, Ordering::SeqCst);
            r
        });
        let r = (|| {
            let tid = tid_rx.recv().map_err(|_| "the waiter did not start".to_string())?;
            let restarts = restart && !matches!(kind, WaitKind::Poll);
            // Signals every 20 ms until the wait returned, or (when it
            // restarts) until the handler ran 5 times; 5 s at most.
            let t0 = Instant::now();
            let hits = || HITS.load(Ordering::SeqCst) - hits0;
            while !(returned.load(Ordering::SeqCst) || (restarts && hits() >= 5)) {
                ensure!(
                    t0.elapsed() < Duration::from_secs(5),
                    "after 5 s of signals the wait still blocks ({} handled)",
                    hits()
                );
                std::thread::sleep(Duration::from_millis(20));
                // SAFETY: a signal to our own thread, alive until joined.
                unsafe { libc::pthread_kill(tid as libc::pthread_t, libc::SIGUSR1) };
            }
            // Let a last signal land.
            std::thread::sleep(Duration::from_millis(20));
            let st = job.status()?;
            let now = fxr.dev.query_point(fxr.sync).map_err(|e| format!("SYNCOBJ_QUERY: errno {e}"))?;
            ensure!(
                st == 0 && now == before,
                "the signals changed the job: status {st}, point {before} -> {now}"
            );
            ensure!(
                restarts != returned.load(Ordering::SeqCst),
                "the wait {} after {} signals handled",
                if restarts { "returned" } else { "did not return" },
                hits()
            );
            Ok(restarts)
        })();
        hold.store(false, Ordering::SeqCst);
        let w = waiter.join().map_err(|_| "the waiter panicked".to_string());
        r.and_then(|restarts| Ok((restarts, w?)))
    });
    let (restarts, w) = res?;
    if restarts {
        ensure!(w == Ok(()), "the restarted wait returned {w:?}, expected success once the job ended");
    } else {
        ensure!(w == Err(libc::EINTR), "the interrupted wait returned {w:?}, expected EINTR");
    }
    fx.wait(job.point)?;
    ensure!(end_status(job.fd)? == 1, "the job after the signals: status {}", job.status()?);
    ensure!(fx.data.map.r32(done) == 0x600D, "the job's last write is missing");
    Ok(())
}
