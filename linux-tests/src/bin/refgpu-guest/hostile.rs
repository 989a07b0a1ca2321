//! Hostile user work: what one client's jobs can and cannot do to another
//! client, and a fault racing later submissions (docs/linux.md, "Trust
//! model" and "Hangs, faults and reset").

use std::io::{BufRead, BufReader, Read};
use std::os::fd::{FromRawFd, RawFd};
use std::time::{Duration, Instant};

use refgpu_uapi as u;
use umd_core::cmd::{Command, Payload};

use crate::drm::{self, sync};
use crate::ensure;
use crate::fixture::{self, buf, Fx, DATA_VA};
use crate::tests::wait_eq;
use crate::R;

/// Where the victim (and the hostile process, in its own VM) has a buffer.
const X: u64 = 0x4000_0000;
/// Its size.
const X_SIZE: u64 = 4 << 20;
/// The hostile process's buffer at [`X`]: it covers the victim's and more,
/// so a FILL of it that ran on in the victim's VM would write all of the
/// victim's buffer, then fault there.
const A_SIZE: u64 = 16 << 20;
/// Bytes per FILL (at most 16 MiB - 4 on gen1).
const FILL_SIZE: u64 = A_SIZE - 4096;
/// FILLs after the forged fence: several hundred milliseconds of work,
/// longer than the driver ever waited for an engine to drain before a
/// switch of address space.
const FILLS: u32 = 200;
/// Nothing is mapped here in any VM of these tests.
const UNMAPPED: u64 = 0x7000_0000;

/// What the hostile job does after it forged its completion.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Then {
    /// FILLs of its own buffer at [`X`], then a fault.
    Fill,
    /// A WAIT_MEM nobody satisfies (a hang).
    Wait,
}

/// The victim's word `i` of the buffer at [`X`].
fn pattern(i: usize) -> u32 {
    0xB000_0000 ^ i as u32
}

/// A forged fence, then FILLs over the VA where the victim has its buffer.
pub fn forged_fence_fill() -> R {
    forged_fence(Then::Fill)
}

/// A forged fence, then a hang.
pub fn forged_fence_wait() -> R {
    forged_fence(Then::Wait)
}

/// A hostile process A writes a huge value with an interrupt to its own
/// GFX fence slot (mapped writable in its VM at `VA_END + 3 MiB`, FENCE is
/// legal in an IB), then keeps GFX busy ([`Then`]). The victim B, this
/// process, has a 4 MiB buffer at [`X`] in its own VM and submits one
/// small job on GFX meanwhile. A's forged value completes nothing: B's job
/// runs only once A's IB has ended (the engine's root changes only when it
/// is idle), so B's memory is untouched, B's job succeeds and its context
/// stays OK; A's job fails (fault or hang), A's context alone is guilty
/// and the devcoredump names A's process. A keeps its file (its VM) open
/// until B is done, as a real attacker would: its IB must not be ended by
/// the teardown of its own VM.
fn forged_fence(then: Then) -> R {
    fixture::clear_devcoredumps()?;
    let mut b = Fx::new()?;
    let xb = buf(&b.dev, X_SIZE, X)?;
    for i in 0..(X_SIZE / 4) as usize {
        xb.map.w32(4 * i, pattern(i));
    }
    let cb = b.ctx(u::engine::GFX)?;
    let (ib, dw) = b.ib(&[Command::WriteData { dst: DATA_VA + 0x40, data: Payload::Words(&[0x600D]) }])?;

    let (from_a_rd, from_a_wr) = pipe()?;
    let (to_a_rd, to_a_wr) = pipe()?;
    // SAFETY: fork(2); the child runs `hostile` and _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: the child's copies of the parent's ends.
        unsafe {
            libc::close(from_a_rd);
            libc::close(to_a_wr);
        }
        hostile(then, from_a_wr, to_a_rd);
    }
    ensure!(pid > 0, "fork: errno {}", drm::errno());
    // SAFETY: the child's ends, and ours from here.
    let (mut from_a, to_a) = unsafe {
        libc::close(from_a_wr);
        libc::close(to_a_rd);
        (BufReader::new(std::fs::File::from_raw_fd(from_a_rd)), std::fs::File::from_raw_fd(to_a_wr))
    };
    let report = victim(&mut b, &xb, cb, ib, dw, then, &mut from_a);
    let mut line = String::new();
    let _ = from_a.read_line(&mut line);
    drop(to_a);
    let mut st = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    let said = line.trim_end().trim_start_matches('R');
    report.map_err(|e| format!("{e}; the hostile process said: {said}"))?;
    ensure!(said == "ok", "the hostile process: {said}");
    let dump = fixture::take_devcoredump()?;
    ensure!(
        dump.contains(&format!("process: {pid} ")),
        "the devcoredump does not name the hostile process {pid}:\n{dump}"
    );
    Ok(())
}

/// pipe(2): (read end, write end).
fn pipe() -> Result<(RawFd, RawFd), String> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe(2) into a two-element array.
    ensure!(unsafe { libc::pipe(fds.as_mut_ptr()) } == 0, "pipe: errno {}", drm::errno());
    Ok((fds[0], fds[1]))
}

/// B's side: waits until A has submitted, lets A's forged FENCE run,
/// submits and checks.
fn victim(
    b: &mut Fx,
    xb: &fixture::Buf,
    cb: u32,
    ib: u64,
    dw: u32,
    then: Then,
    from_a: &mut BufReader<std::fs::File>,
) -> R {
    let mut byte = [0u8; 1];
    ensure!(
        from_a.read_exact(&mut byte).is_ok() && byte[0] == b'S',
        "the hostile process did not submit (it sent {:?})",
        byte[0] as char
    );
    std::thread::sleep(Duration::from_millis(50));
    b.point += 1;
    let p = b.point;
    let s = b
        .dev
        .submit_full(cb, ib, dw, &[], &[sync(b.sync, p)], u::SUBMIT_OUT_SYNC_FILE)
        .map_err(|e| format!("the victim's SUBMIT: errno {e}"))?;
    let t0 = Instant::now();
    b.wait(p)?;
    let waited = t0.elapsed();
    let what = if then == Then::Fill { "fill" } else { "wait" };
    println!("guest: forged_fence_{what}: the victim's job waited {} ms", waited.as_millis());
    let status = drm::sync_file_status(s.out_fence_fd).map_err(|e| format!("SYNC_IOC_FILE_INFO: errno {e}"));
    // SAFETY: closing the fd the kernel gave us.
    unsafe { libc::close(s.out_fence_fd) };
    let status = status?;
    let q = b.dev.ctx_query(cb).map_err(|e| format!("CTX_QUERY: errno {e}"))?;
    let bad: Vec<usize> = (0..(X_SIZE / 4) as usize).filter(|&i| xb.map.r32(4 * i) != pattern(i)).collect();
    ensure!(
        bad.is_empty(),
        "{} of the victim's {} words were overwritten (first: word {} = {:#x}); its job waited {waited:?}",
        bad.len(),
        X_SIZE / 4,
        bad[0],
        xb.map.r32(4 * bad[0])
    );
    ensure!(status == 1, "the victim's fence status {status}, expected success");
    ensure!(
        q.state == u::ctx_state::OK,
        "the victim's context state {} (guilty_seqno {})",
        q.state,
        q.guilty_seqno
    );
    // Untouched: its job was never in the ring at the hostile job's reset
    // (it waited for the engine to leave A's VM), so no reset counts for
    // it and it carries no fault of A's.
    ensure!(
        q.reset_count == 0 && q.fault_status == 0 && q.fault_addr == 0 && q.guilty_seqno == 0,
        "the victim's context after A's reset: {q:?}"
    );
    ensure!(
        b.dev.query_point(b.sync).map_err(|e| format!("SYNCOBJ_QUERY: errno {e}"))? == p,
        "the victim's timeline is not at its job's point {p}"
    );
    ensure!(b.data.map.r32(0x40) == 0x600D, "the victim's job did not run");
    Ok(())
}

/// A's side, in the child: its own device file (its own VM) with a buffer
/// at [`X`] too (so its FILLs are legal in its VM), the job
/// ([`hostile_job`]), then a report line to the parent (`R` and `ok` or
/// the failure). The file stays open until the parent closes its pipe.
fn hostile(then: Then, to_b: RawFd, from_b: RawFd) -> ! {
    let mut setup = Fx::new().and_then(|a| Ok((buf(&a.dev, A_SIZE, X)?, a)));
    let r = match &mut setup {
        Ok((_, a)) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hostile_job(then, a, to_b)))
            .unwrap_or_else(|_| Err("panicked".into())),
        Err(e) => Err(e.clone()),
    };
    let msg = format!("R{}\n", r.err().unwrap_or_else(|| "ok".into()).replace('\n', " | "));
    let mut byte = [0u8; 1];
    // SAFETY: the report, a read that returns at the parent's EOF, and
    // _exit in the child (no destructor of the parent's state runs).
    unsafe {
        libc::write(to_b, msg.as_ptr().cast(), msg.len());
        libc::read(from_b, byte.as_mut_ptr().cast(), 1);
        libc::_exit(0)
    }
}

/// The forged fence, then [`Then`]. Tells the parent `S` once submitted;
/// returns what it saw of its job and context.
fn hostile_job(then: Then, a: &mut Fx, to_b: RawFd) -> R {
    let va_end = a.dev.param(u::param::VA_END).map_err(|e| format!("VA_END: errno {e}"))?;
    // GFX's slot in this VM's fence page (docs/linux.md, the kernel region).
    let slot = va_end + (3 << 20) + 64 * u64::from(u::engine::GFX);
    let ca = a.ctx(u::engine::GFX)?;
    let mut cmds = vec![Command::Fence { addr: slot, value: 1 << 62, irq: true }];
    match then {
        Then::Fill => {
            cmds.extend((0..FILLS).map(|i| Command::Fill {
                dst: X,
                size: FILL_SIZE,
                value: 0xA5A5_0000 | i,
            }));
            cmds.push(Command::Copy { src: UNMAPPED, dst: DATA_VA, size: 4 });
        }
        Then::Wait => cmds.push(wait_eq(DATA_VA + 0x40, 0xDEAD)),
    }
    let (ib, dw) = a.ib(&cmds)?;
    a.point += 1;
    let p = a.point;
    let s = a
        .dev
        .submit_full(ca, ib, dw, &[], &[sync(a.sync, p)], u::SUBMIT_OUT_SYNC_FILE)
        .map_err(|e| format!("SUBMIT: errno {e}"))?;
    // SAFETY: one byte to the parent.
    unsafe { libc::write(to_b, b"S".as_ptr().cast(), 1) };
    a.wait(p)?;
    let status =
        drm::sync_file_status(s.out_fence_fd).map_err(|e| format!("SYNC_IOC_FILE_INFO: errno {e}"))?;
    let q = a.dev.ctx_query(ca).map_err(|e| format!("CTX_QUERY: errno {e}"))?;
    // A fill variant slower than the timeout hangs instead of faulting.
    let want: &[i32] = match then {
        Then::Fill => &[-libc::EIO, -libc::ETIMEDOUT],
        Then::Wait => &[-libc::ETIMEDOUT],
    };
    ensure!(want.contains(&status), "its fence status {status}, expected one of {want:?}");
    ensure!(q.state == u::ctx_state::GUILTY, "its context state {}, expected GUILTY", q.state);
    ensure!(q.guilty_seqno == s.seqno, "guilty_seqno {} is not its job's {}", q.guilty_seqno, s.seqno);
    ensure!(q.reset_count == 1, "its context counts {} resets, expected 1", q.reset_count);
    Ok(())
}

/// Rounds of [`fault_racing_submits`].
const ROUNDS: u32 = 24;
/// Jobs per context and round at most.
const RACE_JOBS: u32 = 120;

/// A COMPUTE job F faults while its process keeps submitting, on F's
/// context C and on a second context K of the same file, from two
/// threads. Submissions arrive between the fault interrupt and the
/// recovery, which alone resets the engine: F's fence reports -EIO, never
/// success; every later job of C fails with -ECANCELED and never ran;
/// every job of K succeeds and ran (run again if it was in the ring).
/// Job `i` writes its marker `i + 1`, so a fence that reports success for
/// a job that never ran shows.
pub fn fault_racing_submits() -> R {
    let mut fx = Fx::new()?;
    fixture::clear_devcoredumps()?;
    let marks = buf(&fx.dev, 64 << 10, 0x5000_0000)?;
    let mut ibs = Vec::new();
    for i in 0..2 * RACE_JOBS {
        let va = marks.va + 4 * u64::from(i);
        ibs.push(fx.ib(&[Command::WriteData { dst: va, data: Payload::Words(&[i + 1]) }])?);
    }
    let mut f_cmds: Vec<Command<'_>> =
        (0..8).map(|i| Command::Fill { dst: DATA_VA, size: 1 << 20, value: i }).collect();
    f_cmds.push(Command::Copy { src: UNMAPPED, dst: DATA_VA, size: 4 });
    let (fib, fdw) = fx.ib(&f_cmds)?;
    let mut hits = 0u32;
    for round in 0..ROUNDS {
        for i in 0..2 * RACE_JOBS as usize {
            marks.map.w32(4 * i, 0);
        }
        let c = fx.ctx(u::engine::COMPUTE)?;
        let k = fx.ctx(u::engine::COMPUTE)?;
        let dev = &fx.dev;
        let fs = dev
            .submit_full(c, fib, fdw, &[], &[], u::SUBMIT_OUT_SYNC_FILE)
            .map_err(|e| format!("round {round}: SUBMIT F: errno {e}"))?;
        let done = std::sync::atomic::AtomicBool::new(false);
        let submit = |ctx: u32, first: u32, stop_on_guilty: bool| {
            let mut fds = Vec::new();
            for i in first..first + RACE_JOBS {
                if !stop_on_guilty && done.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let (ib, dw) = ibs[i as usize];
                match dev.submit_full(ctx, ib, dw, &[], &[], u::SUBMIT_OUT_SYNC_FILE) {
                    Ok(s) => fds.push((i, s.out_fence_fd)),
                    Err(e) => return (fds, Some(e)),
                }
            }
            (fds, None)
        };
        let ((c_jobs, c_end), (k_jobs, k_end)) = std::thread::scope(|s| {
            let kt = s.spawn(|| submit(k, RACE_JOBS, false));
            let cr = submit(c, 0, true);
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            (cr, kt.join().unwrap_or((Vec::new(), Some(-1))))
        });
        let fstatus = end_status(fs.out_fence_fd)?;
        let c_res: Vec<(u32, i32)> =
            c_jobs.iter().map(|&(i, fd)| end_status(fd).map(|st| (i, st))).collect::<Result<_, _>>()?;
        let k_res: Vec<(u32, i32)> =
            k_jobs.iter().map(|&(i, fd)| end_status(fd).map(|st| (i, st))).collect::<Result<_, _>>()?;
        let q = dev.ctx_query(c).map_err(|e| format!("CTX_QUERY C: errno {e}"))?;
        let qk = dev.ctx_query(k).map_err(|e| format!("CTX_QUERY K: errno {e}"))?;
        ensure!(
            fstatus == -libc::EIO,
            "round {round}: the faulting job's fence status {fstatus}, expected -EIO"
        );
        ensure!(
            c_end.is_none() || c_end == Some(libc::ECANCELED),
            "round {round}: SUBMIT on C failed with errno {c_end:?}"
        );
        ensure!(k_end.is_none(), "round {round}: SUBMIT on K failed with errno {k_end:?}");
        for &(i, st) in &c_res {
            ensure!(
                st == -libc::ECANCELED && marks.map.r32(4 * i as usize) == 0,
                "round {round}: C's job {i} after the fault: status {st}, marker {:#x} (expected -ECANCELED, 0)",
                marks.map.r32(4 * i as usize)
            );
        }
        for &(i, st) in &k_res {
            ensure!(
                st == 1 && marks.map.r32(4 * i as usize) == i + 1,
                "round {round}: K's job {i}: status {st}, marker {:#x} (expected success, {:#x})",
                marks.map.r32(4 * i as usize),
                i + 1
            );
        }
        ensure!(
            q.state == u::ctx_state::GUILTY && q.guilty_seqno == fs.seqno,
            "round {round}: C's state {q:?}"
        );
        ensure!(qk.state != u::ctx_state::GUILTY, "round {round}: K is guilty");
        hits += u32::from(qk.state == u::ctx_state::INNOCENT);
        fx.dev.ctx_destroy(c).map_err(|e| format!("CTX_DESTROY: errno {e}"))?;
        fx.dev.ctx_destroy(k).map_err(|e| format!("CTX_DESTROY: errno {e}"))?;
    }
    println!("guest: fault_racing_submits: K had jobs in the ring at the reset in {hits} of {ROUNDS} rounds");
    fixture::clear_devcoredumps()
}

/// Waits (up to 10 s) for a sync_file to signal, returns its status and
/// closes it.
fn end_status(fd: RawFd) -> Result<i32, String> {
    let signalled = drm::poll_in(fd, 10_000);
    let st = drm::sync_file_status(fd).map_err(|e| format!("SYNC_IOC_FILE_INFO: errno {e}"));
    // SAFETY: closing a sync_file the kernel gave us.
    unsafe { libc::close(fd) };
    ensure!(signalled, "a job's fence did not signal within 10 s");
    st
}
