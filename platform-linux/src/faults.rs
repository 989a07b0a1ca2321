//! The fault matrix's workload and its accounting: a seeded run of
//! submissions over every queue, with random cross-queue waits and buffers
//! allocated for one job and freed while it is in flight, driven while a
//! fault is injected; then every fence is resolved and counted. Used by the
//! in-process (`conformance/tests/fault_matrix.rs`) and co-simulation
//! (`refgpu-sim/tests/fault_matrix.rs`) matrices; `docs/reliability.md`
//! has the table.
//!
//! The promise checked ([`Accounting::check`]): every submission accepted by
//! the driver ends signalled (and then its data is there) or failed with a
//! reason; none stays pending past the failure guard (lost); every buffer
//! and IB chunk comes back; afterwards the device either runs new work on
//! every healthy queue or says it is lost.

use core::fmt;

use umd_core::engine::{Backend, BufferUse, Engine, Submit};
use umd_core::queue::{SubmitError, WaitError};
use umd_core::sync::{Cause, Fence, QueueId};

/// Failure guard of one wait (never a performance threshold).
pub const GUARD_NS: u64 = 30_000_000_000;

/// The workload's shape.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    /// Seed of the random choices.
    pub seed: u64,
    /// Submissions attempted.
    pub jobs: usize,
    /// Queues (bit mask) whose engine keeps the fault after `heal` (a
    /// co-simulation server's knobs are fixed at its start): their probe
    /// job may fail with a reason instead of signalling, but must not be
    /// lost.
    pub impaired_after: u8,
}

/// What became of a run's submissions, buffers and chunks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Accounting {
    /// Submissions the driver accepted (a fence was returned).
    pub submitted: u64,
    /// Fences that signalled.
    pub signalled: u64,
    /// Fences that failed because their queue hung and was reset.
    pub failed_hung: u64,
    /// Fences that failed on a fault.
    pub failed_fault: u64,
    /// Fences that failed because the device was lost.
    pub failed_lost: u64,
    /// Fences that failed on a wait that was never satisfied.
    pub failed_never: u64,
    /// Of the failed ones, those that failed through a dependency.
    pub failed_dependency: u64,
    /// Fences still pending after the failure guard, or answered with an
    /// error that gives no reason: lost completions.
    pub lost: u64,
    /// Signalled fences whose job's data is not in memory.
    pub wrong_data: u64,
    /// Submissions refused with a typed error (a failed dependency, a lost
    /// device): never submitted, the caller told why.
    pub refused: u64,
    /// Buffers still live after everything was freed and resolved.
    pub leaked_buffers: u64,
    /// Frees still waiting for a fence after every fence resolved.
    pub frees_waiting: u64,
    /// IB chunks not free after every fence resolved.
    pub chunks_busy: usize,
    /// Probe jobs (after the run) that failed with a reason before one
    /// signalled (see [`PROBE_ATTEMPTS`]).
    pub probe_failures: u32,
    /// The device reported itself lost.
    pub device_lost: bool,
    /// After the fault was removed, a job on every healthy queue signalled
    /// with its data (or the device was lost and said so).
    pub usable_after: bool,
}

impl Accounting {
    /// Fences failed with a reason.
    pub fn failed(&self) -> u64 {
        self.failed_hung + self.failed_fault + self.failed_lost + self.failed_never
    }

    /// Checks the promise; the text says what broke.
    pub fn check(&self) -> Result<(), String> {
        let mut bad = Vec::new();
        if self.submitted != self.signalled + self.failed() + self.lost {
            bad.push(format!(
                "{} submitted but {} accounted",
                self.submitted,
                self.signalled + self.failed() + self.lost
            ));
        }
        if self.lost != 0 {
            bad.push(format!("{} completions lost", self.lost));
        }
        if self.wrong_data != 0 {
            bad.push(format!("{} signalled fences without their data", self.wrong_data));
        }
        if self.leaked_buffers != 0 || self.frees_waiting != 0 {
            bad.push(format!(
                "{} buffers leaked, {} frees still waiting",
                self.leaked_buffers, self.frees_waiting
            ));
        }
        if self.chunks_busy != 0 {
            bad.push(format!("{} IB chunks not returned", self.chunks_busy));
        }
        if !self.usable_after {
            bad.push("the device neither ran new work nor reported itself lost".into());
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(bad.join("; "))
        }
    }
}

impl fmt::Display for Accounting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "submitted {} = signalled {} + failed {} (hung {}, fault {}, device lost {}, never signalled {}; via a dependency {}) + lost {}; refused {}; leaked buffers {}, busy chunks {}; {} (probe failures {})",
            self.submitted,
            self.signalled,
            self.failed(),
            self.failed_hung,
            self.failed_fault,
            self.failed_lost,
            self.failed_never,
            self.failed_dependency,
            self.lost,
            self.refused,
            self.leaked_buffers,
            self.chunks_busy,
            if self.device_lost {
                "device reported lost"
            } else if self.usable_after {
                "usable afterwards"
            } else {
                "NOT usable afterwards"
            },
            self.probe_failures
        )
    }
}

/// SplitMix64.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The value job `i` writes.
pub(crate) fn stamp(seed: u64, i: usize) -> u32 {
    (seed as u32 ^ 0xA5A5_0000).wrapping_add(i as u32).wrapping_mul(0x9E37_79B1) | 1
}

/// Runs the workload on `dev`. `midway` is called once half the jobs are
/// submitted (to kill the server, say); `heal` once every fence has
/// resolved, to take the fault away before the device is probed.
pub fn run<B: Backend + Sync, const C: usize>(
    dev: &Engine<'_, B, C>,
    w: Workload,
    midway: &mut dyn FnMut(),
    heal: &mut dyn FnMut(),
) -> Accounting {
    let mut acc = Accounting::default();
    let nq = dev.queue_count().min(3);
    let queues: Vec<QueueId> = (0..nq as u8).map(QueueId).collect();
    let mut rng = Rng(w.seed);
    let out = dev.alloc_buffer((w.jobs as u64 * 4).max(4)).expect("result buffer");
    let out_va = dev.va(out).expect("va");
    // (fence, job index) of every accepted submission.
    let mut fences: Vec<(Fence, usize)> = Vec::new();
    let mut last: Vec<Option<Fence>> = vec![None; nq];
    for i in 0..w.jobs {
        if i == w.jobs / 2 {
            midway();
        }
        let qi = rng.below(nq as u64) as usize;
        let q = queues[qi];
        let mut waits = Vec::new();
        let oq = rng.below(nq as u64) as usize;
        if oq != qi && rng.below(2) == 0 {
            if let Some(f) = last[oq] {
                waits.push(f);
            }
        }
        // One job in four also writes a scratch buffer that is freed as
        // soon as the job is submitted (its memory must stay out of
        // circulation until the fence).
        let scratch = if rng.below(4) == 0 { dev.alloc_buffer(64 + rng.below(8192)).ok() } else { None };
        let scratch_va = scratch.and_then(|h| dev.va(h).ok());
        let uses: Vec<BufferUse> = scratch.iter().map(|h| BufferUse::write(*h)).collect();
        let job = Submit::on(q).after(&waits).using(if rng.below(2) == 0 { &uses } else { &[] });
        let r = dev.submit_with(&job, |cb| {
            if let Some(sva) = scratch_va {
                cb.write_data(sva, &[i as u32])?;
            }
            cb.write_data(out_va + 4 * i as u64, &[stamp(w.seed, i)])
        });
        match r {
            Ok(f) => {
                acc.submitted += 1;
                fences.push((f, i));
                last[qi] = Some(f);
            }
            Err(SubmitError::DependencyFailed { .. }) | Err(SubmitError::DeviceLost) => acc.refused += 1,
            Err(SubmitError::Platform(_)) if dev.is_lost() => acc.refused += 1,
            Err(e) => panic!("job {i} on {q}: submission refused for no fault of the injection: {e}"),
        }
        if let Some(h) = scratch {
            dev.free(h).expect("free scratch");
        }
    }
    // Resolve every fence.
    let mut guard = GUARD_NS;
    for &(f, i) in &fences {
        match resolve(dev, f, guard, &mut acc) {
            Outcome::Signalled => {
                if dev.read_u32(out, i as u64).ok() != Some(stamp(w.seed, i)) {
                    acc.wrong_data += 1;
                }
            }
            Outcome::Failed(_) => {}
            // Lost: the rest are only queried, the run already fails.
            Outcome::Lost => guard = 0,
        }
    }
    dev.free(out).expect("free result buffer");
    heal();
    acc.device_lost = dev.is_lost();
    if acc.device_lost {
        acc.usable_after = true;
    } else {
        (acc.usable_after, acc.probe_failures) = probe(dev, &queues, w);
    }
    // Everything resolved: frees released, chunks back.
    let _ = dev.service();
    let bs = dev.buffer_stats();
    acc.leaked_buffers = bs.live;
    acc.frees_waiting = if acc.device_lost { 0 } else { bs.waiting };
    let ps = dev.pool_stats();
    acc.chunks_busy = ps.recording + ps.in_flight + ps.open;
    acc
}

/// What became of one fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Signalled.
    Signalled,
    /// Failed with this reason.
    Failed(Cause),
    /// Still pending after the guard, or an error without a reason.
    Lost,
}

/// Waits for `f` (at most `guard` ns) and counts its outcome in `acc`.
pub(crate) fn resolve<B: Backend + Sync, const C: usize>(
    dev: &Engine<'_, B, C>,
    f: Fence,
    guard: u64,
    acc: &mut Accounting,
) -> Outcome {
    match dev.wait(f, guard) {
        Ok(()) => {
            acc.signalled += 1;
            Outcome::Signalled
        }
        Err(WaitError::Failed(e)) => {
            let cause = e.cause();
            match cause {
                Cause::Hung => acc.failed_hung += 1,
                Cause::Fault(_) => acc.failed_fault += 1,
                Cause::Lost => acc.failed_lost += 1,
                Cause::NeverSignalled => acc.failed_never += 1,
            }
            if matches!(e, umd_core::sync::FenceError::Dependency { .. }) {
                acc.failed_dependency += 1;
            }
            Outcome::Failed(cause)
        }
        Err(_) => {
            acc.lost += 1;
            Outcome::Lost
        }
    }
}

/// Attempts of the probe on a queue without a lasting fault.
pub const PROBE_ATTEMPTS: u32 = 3;

/// A job on every queue. A queue without a lasting fault must run one with
/// its data within [`PROBE_ATTEMPTS`] (an attempt may fail with a reason:
/// a queue that waited, at the hardware level, on a queue whose engine
/// stays dead is itself reset after its hang window, and the job queued
/// behind that wait fails with it); one with a lasting fault may fail every
/// time, but always with a reason. Returns whether that held and the
/// attempts that failed. Prints what went wrong.
pub(crate) fn probe<B: Backend + Sync, const C: usize>(
    dev: &Engine<'_, B, C>,
    queues: &[QueueId],
    w: Workload,
) -> (bool, u32) {
    let Ok(buf) = dev.alloc_buffer(4 * queues.len() as u64) else { return (false, 0) };
    let Ok(va) = dev.va(buf) else { return (false, 0) };
    let mut ok = true;
    let mut retries = 0;
    for (k, &q) in queues.iter().enumerate() {
        let impaired = w.impaired_after & (1 << q.0) != 0;
        let mut good = false;
        for attempt in 0..PROBE_ATTEMPTS {
            let want = 0xC0DE_0000 | (attempt << 8) | k as u32;
            let r = dev
                .submit(q, &[], |cb| cb.write_data(va + 4 * k as u64, &[want]))
                .map(|f| dev.wait(f, GUARD_NS));
            match r {
                Ok(Ok(())) => {
                    good = dev.read_u32(buf, k as u64).ok() == Some(want);
                    break;
                }
                Ok(Err(WaitError::Failed(e))) => {
                    println!("probe on {q} (lasting fault: {impaired}), attempt {attempt}: failed: {e}");
                    retries += 1;
                    if impaired {
                        good = true;
                        break;
                    }
                }
                other => {
                    println!("probe on {q} (lasting fault: {impaired}), attempt {attempt}: {other:?}");
                    break;
                }
            }
        }
        ok &= good;
    }
    (dev.free(buf).is_ok() && ok, retries)
}
