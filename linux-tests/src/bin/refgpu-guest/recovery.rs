//! What a reset does to the jobs around the culprit, and when a long job is
//! a hang (docs/linux.md, "Hangs, faults and reset").
//!
//! Progress is driven by the test, not by the machine's speed: a "long"
//! job is a list of WAIT_MEMs on a step counter in memory that the test
//! raises at a fixed pace, so the engine's position in the IB moves
//! exactly as fast as the test says, and stops when the test stops.

use std::time::{Duration, Instant};

use refgpu_uapi as u;
use umd_core::cmd::{Command, CompareOp, DispatchOp, Payload};

use crate::drm::{self, sync};
use crate::ensure;
use crate::fixture::{self, Fx, DATA_VA};
use crate::tests::wait_eq;
use crate::R;

/// The hard bound on one job's run time, as the module has it.
const JOB_MAX_MS: &str = "/sys/module/refgpu/parameters/job_max_ms";

/// A job submitted with a sync_file: its timeline point, sync_file and
/// SUBMIT seqno.
struct Sub {
    point: u64,
    fd: i32,
    seqno: u64,
}

impl Sub {
    /// The fence's status once it has signalled: 1 (success) or a
    /// negative errno (`SYNC_IOC_FILE_INFO`).
    fn status(&self) -> Result<i32, String> {
        drm::sync_file_status(self.fd).map_err(|e| format!("SYNC_IOC_FILE_INFO: errno {e}"))
    }
}

impl Drop for Sub {
    fn drop(&mut self) {
        // SAFETY: closing the sync_file the kernel gave us.
        unsafe { libc::close(self.fd) };
    }
}

fn submit(fx: &mut Fx, ctx: u32, cmds: &[Command<'_>]) -> Result<Sub, String> {
    let (ib, dw) = fx.ib(cmds)?;
    fx.point += 1;
    let s = fx
        .dev
        .submit_full(ctx, ib, dw, &[], &[sync(fx.sync, fx.point)], u::SUBMIT_OUT_SYNC_FILE)
        .map_err(|e| format!("SUBMIT: errno {e}"))?;
    Ok(Sub { point: fx.point, fd: s.out_fence_fd, seqno: s.seqno })
}

/// DISPATCH `*counter += *one` (COMPUTE): a side effect that shows how
/// often the job ran.
fn increment(counter: u64, one: u64) -> Command<'static> {
    Command::Dispatch { op: DispatchOp::AddU32, a: counter, b: one, dst: counter, count: 1, scalar_bits: 0 }
}

/// WAIT_MEM until the 32-bit step counter at `addr` is at least `step`.
pub fn wait_step(addr: u64, step: u32) -> Command<'static> {
    Command::WaitMem { addr, reference: u64::from(step), mask: 0xFFFF_FFFF, op: CompareOp::Ge, wide: false }
}

/// A hang on COMPUTE with jobs of two contexts of the same file behind it
/// in the ring, interleaved: the innocent context's jobs each add 1 to a
/// counter, the guilty context's later job adds 1 to another. The culprit
/// fails with -ETIMEDOUT, the guilty context's later job with -ECANCELED
/// without having run, and every innocent job succeeds having run exactly
/// once (they had not started: the reset puts them into the ring again;
/// it does not submit anything twice).
pub fn reset_resumes_innocent_jobs() -> R {
    let mut fx = Fx::new()?;
    fixture::clear_devcoredumps()?;
    let (flag, counter, other, one) = (DATA_VA + 0x300, DATA_VA + 0x340, DATA_VA + 0x380, DATA_VA + 0x3C0);
    fx.data.map.w32(0x3C0, 1);
    let h = fx.ctx(u::engine::COMPUTE)?;
    let i = fx.ctx(u::engine::COMPUTE)?;
    let hung = submit(&mut fx, h, &[wait_eq(flag, 0xDEAD)])?;
    let i1 = submit(&mut fx, i, &[increment(counter, one)])?;
    let later = submit(&mut fx, h, &[increment(other, one)])?;
    let i2 = submit(&mut fx, i, &[increment(counter, one)])?;
    let i3 = submit(&mut fx, i, &[increment(counter, one), increment(counter, one)])?;
    fx.wait(i3.point)?;
    ensure!(hung.status()? == -libc::ETIMEDOUT, "the hung job's status {}", hung.status()?);
    ensure!(later.status()? == -libc::ECANCELED, "the guilty context's later job: {}", later.status()?);
    for (n, s) in [(1, &i1), (2, &i2), (3, &i3)] {
        ensure!(s.status()? == 1, "innocent job {n}: status {}", s.status()?);
    }
    ensure!(
        fx.data.map.r32(0x340) == 4,
        "the innocent jobs added {} (4 if each ran once)",
        fx.data.map.r32(0x340)
    );
    ensure!(fx.data.map.r32(0x380) == 0, "the guilty context's later job ran ({})", fx.data.map.r32(0x380));
    let qh = fx.dev.ctx_query(h).map_err(|e| format!("CTX_QUERY: errno {e}"))?;
    ensure!(qh.state == u::ctx_state::GUILTY && qh.guilty_seqno == hung.seqno, "culprit's context {qh:?}");
    let qi = fx.dev.ctx_query(i).map_err(|e| format!("CTX_QUERY: errno {e}"))?;
    ensure!(qi.state == u::ctx_state::INNOCENT, "the innocent context's state {}", qi.state);
    // The innocent context goes on.
    let p = fx.run(i, &[increment(counter, one)])?;
    fx.wait(p)?;
    ensure!(fx.data.map.r32(0x340) == 5, "after the reset: {}", fx.data.map.r32(0x340));
    fixture::take_devcoredump().map(|_| ())
}

/// Raises the step counter at `off` of the data buffer to `1..=steps`,
/// one step per `every`.
fn pace(fx: &Fx, off: usize, steps: u32, every: Duration) {
    for s in 1..=steps {
        std::thread::sleep(every);
        fx.data.map.w32(off, s);
    }
}

/// The job timeout is a no-progress window, not a run-time limit. A job
/// that takes three windows but keeps moving (WAIT_MEMs released one by
/// one every 100 ms) succeeds, and an innocent job behind it runs once; a
/// job whose engine stops moving (its next WAIT_MEM is never released)
/// fails with -ETIMEDOUT within two windows of its last step, not at the
/// hard bound.
pub fn progressing_job_outlives_timeout() -> R {
    let mut fx = Fx::new()?;
    let window = fx.dev.param(u::param::JOB_TIMEOUT_MS).map_err(|e| format!("GET_PARAM: errno {e}"))?;
    let window = Duration::from_millis(window);
    let (step, done, counter, one) = (DATA_VA + 0x400, DATA_VA + 0x440, DATA_VA + 0x480, DATA_VA + 0x4C0);
    fx.data.map.w32(0x4C0, 1);
    let every = Duration::from_millis(100);
    let steps = u32::try_from(3 * window.as_millis() / every.as_millis()).unwrap_or(30);
    let mut cmds: Vec<Command<'_>> = (1..=steps).map(|s| wait_step(step, s)).collect();
    cmds.push(Command::WriteData { dst: done, data: Payload::Words(&[0x600D]) });
    let l = fx.ctx(u::engine::COMPUTE)?;
    let i = fx.ctx(u::engine::COMPUTE)?;
    let t0 = Instant::now();
    let long = submit(&mut fx, l, &cmds)?;
    let behind = submit(&mut fx, i, &[increment(counter, one)])?;
    pace(&fx, 0x400, steps, every);
    fx.wait(behind.point)?;
    let took = t0.elapsed();
    ensure!(took > 2 * window, "the long job took {took:?}, not more than two windows of {window:?}");
    ensure!(long.status()? == 1, "the long job, {took:?} of progress: status {}", long.status()?);
    ensure!(fx.data.map.r32(0x440) == 0x600D, "the long job's last write");
    ensure!(
        behind.status()? == 1 && fx.data.map.r32(0x480) == 1,
        "the job behind it: {}",
        fx.data.map.r32(0x480)
    );
    let q = fx.dev.ctx_query(l).map_err(|e| format!("CTX_QUERY: errno {e}"))?;
    ensure!(q.state == u::ctx_state::OK, "the long job's context state {}", q.state);

    // The same job, released for three steps only: it stops moving.
    fixture::clear_devcoredumps()?;
    fx.data.map.w32(0x400, 0);
    let stuck = submit(&mut fx, l, &cmds)?;
    pace(&fx, 0x400, 3, every);
    let last = Instant::now();
    fx.wait(stuck.point)?;
    let after = last.elapsed();
    ensure!(stuck.status()? == -libc::ETIMEDOUT, "the stalled job's status {}", stuck.status()?);
    ensure!(
        after <= 2 * window + Duration::from_millis(1500),
        "the stalled job failed {after:?} after its last step (two windows of {window:?})"
    );
    let dump = fixture::take_devcoredump()?;
    ensure!(dump.contains("reason: timeout (no progress"), "devcoredump of a stall:\n{dump}");
    Ok(())
}

/// A job that keeps moving is still stopped at `job_max_ms` (here set to
/// 2.5 s): -ETIMEDOUT, its context guilty, the devcoredump says why.
pub fn job_max_ms_bound() -> R {
    let old = std::fs::read_to_string(JOB_MAX_MS).map_err(|e| format!("{JOB_MAX_MS}: {e}"))?;
    std::fs::write(JOB_MAX_MS, "2500").map_err(|e| format!("{JOB_MAX_MS}: {e}"))?;
    let r = job_max_ms_run();
    std::fs::write(JOB_MAX_MS, old.trim()).map_err(|e| format!("{JOB_MAX_MS}: {e}"))?;
    r
}

fn job_max_ms_run() -> R {
    let mut fx = Fx::new()?;
    fixture::clear_devcoredumps()?;
    let step = DATA_VA + 0x500;
    let every = Duration::from_millis(100);
    let steps = 100u32;
    let cmds: Vec<Command<'_>> = (1..=steps).map(|s| wait_step(step, s)).collect();
    let c = fx.ctx(u::engine::GFX)?;
    let t0 = Instant::now();
    let job = submit(&mut fx, c, &cmds)?;
    // Keep it moving until it ends (or the 10 s the steps last).
    let mut s = 0;
    while s < steps && !drm::poll_in(job.fd, 0) {
        std::thread::sleep(every);
        s += 1;
        fx.data.map.w32(0x500, s);
    }
    fx.wait(job.point)?;
    let took = t0.elapsed();
    ensure!(job.status()? == -libc::ETIMEDOUT, "status {} after {took:?} and {s} steps", job.status()?);
    // Not before the bound; and while the test was still moving it on (a
    // count of steps, not a time: the bound ended a job that progressed).
    ensure!(took >= Duration::from_millis(2500), "stopped after {took:?}, before job_max_ms 2500");
    ensure!(s < steps, "the job ran all {steps} steps ({took:?}): job_max_ms did not end it");
    let q = fx.dev.ctx_query(c).map_err(|e| format!("CTX_QUERY: errno {e}"))?;
    ensure!(q.state == u::ctx_state::GUILTY && q.guilty_seqno == job.seqno, "context {q:?}");
    let dump = fixture::take_devcoredump()?;
    ensure!(dump.contains("reason: timeout (ran past job_max_ms)"), "devcoredump:\n{dump}");
    Ok(())
}
