//! The fault matrix's workload and its accounting: a seeded run of
//! submissions over every queue, with random cross-queue waits and buffers
//! allocated for one job and freed while it is in flight, driven while a
//! fault is injected; then every fence is resolved and counted. Used by the
//! in-process (`conformance/tests/fault_matrix.rs`), co-simulation
//! (`refgpu-sim/tests/fault_matrix.rs`) and bare-metal
//! (`qemu-tests/tests/faults.rs`, through the `fault` image) matrices, and
//! by the soak's accounting; `docs/reliability.md` has the table. The
//! matrix's rows ([`KNOBS`], each with what its cells must show,
//! [`Expect`]) and its seeds ([`seed`]) are here too, for every column.
//!
//! `no_std` and heap-free like the rest of the suite: at most [`MAX_JOBS`]
//! submissions per run, and what goes wrong besides the accounting (a
//! probe attempt that failed, a refusal the injection does not explain) is
//! written to the caller's log.
//!
//! The promise checked ([`Accounting::check`]): every submission accepted by
//! the driver ends signalled (and then its data is there) or failed with a
//! reason; none stays pending past the failure guard (lost); every buffer
//! and IB chunk comes back; afterwards the device either runs new work on
//! every healthy queue or says it is lost.

use core::fmt::{self, Write};

use umd_core::engine::{Backend, BufferUse, DeviceCore, Submit};
use umd_core::error::{SubmitError, WaitError};
use umd_core::sync::{Cause, Fence, QueueId};

/// Most submissions one [`run`] attempts.
pub const MAX_JOBS: usize = 64;

/// Failure guard of one wait (never a performance threshold).
pub const GUARD_NS: u64 = 30_000_000_000;

/// The workload's seed in a cell of the matrix: the same base in every
/// column, flipped in its lowest bit with interrupts (`use_irq`), so a
/// cell draws the same workload on every platform.
pub const fn seed(use_irq: bool) -> u64 {
    0xFA17 ^ use_irq as u64
}

/// What a knob's cells must show besides the promise that
/// [`Accounting::check`] checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The knob only delays work: every submission signals, none is
    /// refused.
    AllSignalled,
    /// The knob stalls an engine: at least one fence fails because its
    /// queue hung.
    HangReported,
    /// The knob takes the device away: it reports itself lost.
    DeviceLost,
    /// The knob may cost work (a fence dropped): the accounting alone.
    AccountingOnly,
}

impl Expect {
    /// Checks the expectation against a cell's accounting; the error says
    /// what is missing.
    pub fn check(self, acc: &Accounting) -> Result<(), &'static str> {
        match self {
            Expect::AllSignalled if (acc.signalled, acc.refused) != (acc.submitted, 0) => {
                Err("not every submission signalled")
            }
            Expect::HangReported if acc.failed_hung == 0 => Err("no hang reported"),
            Expect::DeviceLost if !acc.device_lost => Err("the device did not report itself lost"),
            _ => Ok(()),
        }
    }
}

/// A knob of the fault matrix.
#[derive(Clone, Copy, Debug)]
pub struct Knob {
    /// Name in the table (`docs/reliability.md`).
    pub name: &'static str,
    /// The `refgpu-sim` arguments that set it (the in-process matrix sets
    /// the model's `FaultInjection` from them).
    pub sim_args: &'static [&'static str],
    /// Queues (bit mask) whose fault outlives the run on a server, whose
    /// knobs are fixed at its start ([`Workload::impaired_after`]); the
    /// in-process model has it taken away before the probe.
    pub lasting: u8,
    /// The server is killed halfway (no in-process cell: there is no
    /// server to lose).
    pub kill: bool,
    /// What its cells must show.
    pub expect: Expect,
}

/// Every fault-injection knob of `refgpu-sim`, then a server killed
/// halfway: the rows of the matrix in every column (in-process,
/// co-simulation, bare metal).
pub const KNOBS: &[Knob] = &[
    Knob { name: "none", sim_args: &[], lasting: 0, kill: false, expect: Expect::AllSignalled },
    Knob {
        name: "packet_latency 200us",
        sim_args: &["--packet-latency", "200us"],
        lasting: 0,
        kill: false,
        expect: Expect::AllSignalled,
    },
    Knob {
        name: "drop_fence_nth 3",
        sim_args: &["--drop-fence-nth", "3"],
        lasting: 0b111,
        kill: false,
        expect: Expect::AccountingOnly,
    },
    Knob {
        name: "drop_fence_prob 0.25",
        sim_args: &["--drop-fence-prob", "0.25", "--seed", "7"],
        lasting: 0b111,
        kill: false,
        expect: Expect::AccountingOnly,
    },
    Knob {
        name: "stalled COPY",
        sim_args: &["--stall-engines", "0x4"],
        lasting: 0b100,
        kill: false,
        expect: Expect::HangReported,
    },
    Knob {
        name: "irq_delay 2ms",
        sim_args: &["--irq-delay", "2ms"],
        lasting: 0,
        kill: false,
        expect: Expect::AllSignalled,
    },
    Knob { name: "server killed", sim_args: &[], lasting: 0, kill: true, expect: Expect::DeviceLost },
];

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
    /// Submissions refused with an error the injection does not explain
    /// (the first is written to the run's log): a driver bug.
    pub unexpected_refusals: u64,
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

    /// Checks the promise; the error's text says what broke.
    pub fn check(&self) -> Result<(), Broken<'_>> {
        if self.broken(&mut |_| {}) {
            Err(Broken(self))
        } else {
            Ok(())
        }
    }

    /// Calls `note` with each broken part of the promise; whether any was.
    fn broken(&self, note: &mut dyn FnMut(fmt::Arguments<'_>)) -> bool {
        let mut any = false;
        let mut say = |args: fmt::Arguments<'_>| {
            note(args);
            any = true;
        };
        let accounted = self.signalled + self.failed() + self.lost;
        if self.submitted != accounted {
            say(format_args!("{} submitted but {accounted} accounted", self.submitted));
        }
        if self.lost != 0 {
            say(format_args!("{} completions lost", self.lost));
        }
        if self.wrong_data != 0 {
            say(format_args!("{} signalled fences without their data", self.wrong_data));
        }
        if self.unexpected_refusals != 0 {
            say(format_args!(
                "{} submissions refused for no fault of the injection",
                self.unexpected_refusals
            ));
        }
        if self.leaked_buffers != 0 || self.frees_waiting != 0 {
            say(format_args!(
                "{} buffers leaked, {} frees still waiting",
                self.leaked_buffers, self.frees_waiting
            ));
        }
        if self.chunks_busy != 0 {
            say(format_args!("{} IB chunks not returned", self.chunks_busy));
        }
        if !self.usable_after {
            say(format_args!("the device neither ran new work nor reported itself lost"));
        }
        any
    }
}

/// What broke in an [`Accounting`] ([`Accounting::check`]); its text lists
/// each broken part.
#[derive(Clone, Copy, Debug)]
pub struct Broken<'a>(&'a Accounting);

impl fmt::Display for Broken<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        let mut r = Ok(());
        self.0.broken(&mut |args| {
            r = r.and_then(|()| write!(f, "{sep}{args}"));
            sep = "; ";
        });
        r
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

/// SplitMix64: the workloads' random choices, the same on every platform.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// The value job `i` writes.
pub fn stamp(seed: u64, i: usize) -> u32 {
    (seed as u32 ^ 0xA5A5_0000).wrapping_add(i as u32).wrapping_mul(0x9E37_79B1) | 1
}

/// Why a run could not start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunError {
    /// More jobs than [`MAX_JOBS`].
    TooManyJobs(usize),
    /// The result buffer could not be allocated.
    ResultBuffer(umd_core::mem::AllocError),
    /// The result buffer has no GPU address (a driver bug).
    ResultVa(umd_core::mem::BufferError),
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::TooManyJobs(n) => write!(f, "{n} jobs asked for, at most {MAX_JOBS} per run"),
            RunError::ResultBuffer(e) => write!(f, "result buffer: {e}"),
            RunError::ResultVa(e) => write!(f, "result buffer's address: {e}"),
        }
    }
}

/// Runs the workload on `dev`. `midway` is called once half the jobs are
/// submitted (to kill the server, say); `heal` once every fence has
/// resolved, to take the fault away before the device is probed. What the
/// accounting does not say (probe attempts that failed, the first
/// unexplained refusal) goes to `log`, a line each.
pub fn run<B: Backend + Sync, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    w: Workload,
    midway: &mut dyn FnMut(),
    heal: &mut dyn FnMut(),
    log: &mut dyn Write,
) -> Result<Accounting, RunError> {
    if w.jobs > MAX_JOBS {
        return Err(RunError::TooManyJobs(w.jobs));
    }
    let mut acc = Accounting::default();
    let nq = dev.queue_count().clamp(1, 3);
    let all = [QueueId::GFX, QueueId::COMPUTE, QueueId::COPY];
    let queues = all.get(..nq).unwrap_or(&all);
    let mut rng = Rng(w.seed);
    let out = dev.alloc_buffer((w.jobs as u64 * 4).max(4)).map_err(RunError::ResultBuffer)?;
    let out_va = match dev.va(out) {
        Ok(va) => va,
        Err(e) => {
            let _ = dev.free(out);
            return Err(RunError::ResultVa(e));
        }
    };
    // (fence, job index) of every accepted submission.
    let mut fences: heapless::Vec<(Fence, usize), MAX_JOBS> = heapless::Vec::new();
    let mut last: [Option<Fence>; 3] = [None; 3];
    for i in 0..w.jobs {
        if i == w.jobs / 2 {
            midway();
        }
        let qi = rng.below(nq as u64) as usize;
        let q = queues.get(qi).copied().unwrap_or(QueueId::GFX);
        let mut wait: Option<Fence> = None;
        let oq = rng.below(nq as u64) as usize;
        if oq != qi && rng.below(2) == 0 {
            wait = last.get(oq).copied().flatten();
        }
        let waits = wait.as_slice();
        // One job in four also writes a scratch buffer that is freed as
        // soon as the job is submitted (its memory must stay out of
        // circulation until the fence).
        let scratch = if rng.below(4) == 0 { dev.alloc_buffer(64 + rng.below(8192)).ok() } else { None };
        let scratch_va = scratch.and_then(|h| dev.va(h).ok());
        // Half of the jobs declare their buffer (drawn for every job, so the
        // sequence is the same whether a scratch buffer came or not).
        let declare = rng.below(2) == 0;
        let uses: [BufferUse; 1];
        let declared: &[BufferUse] = match scratch {
            Some(h) if declare => {
                uses = [BufferUse::write(h)];
                &uses
            }
            _ => &[],
        };
        let job = Submit::on(q).after(waits).using(declared);
        let r = dev.submit_with(&job, |cb| {
            if let Some(sva) = scratch_va {
                cb.write_data(sva, &[i as u32])?;
            }
            cb.write_data(out_va + 4 * i as u64, &[stamp(w.seed, i)])
        });
        match r {
            Ok(f) => {
                acc.submitted += 1;
                // Capacity is MAX_JOBS >= w.jobs: never full.
                let _ = fences.push((f, i));
                if let Some(l) = last.get_mut(qi) {
                    *l = Some(f);
                }
            }
            Err(SubmitError::DependencyFailed { .. }) | Err(SubmitError::DeviceLost) => acc.refused += 1,
            Err(SubmitError::Platform(_)) if dev.is_lost() => acc.refused += 1,
            Err(e) => {
                if acc.unexpected_refusals == 0 {
                    let _ = writeln!(
                        log,
                        "job {i} on {q}: submission refused for no fault of the injection: {e}"
                    );
                }
                acc.unexpected_refusals += 1;
            }
        }
        if let Some(h) = scratch {
            if let Err(e) = dev.free(h) {
                let _ = writeln!(log, "job {i}: free of its scratch buffer refused: {e}");
                acc.leaked_buffers += 1;
            }
        }
    }
    // Resolve every fence.
    let mut guard = GUARD_NS;
    for &(f, i) in &fences {
        match resolve(dev, f, guard, &mut acc) {
            FenceOutcome::Signalled => {
                if dev.read_u32(out, i as u64).ok() != Some(stamp(w.seed, i)) {
                    acc.wrong_data += 1;
                }
            }
            FenceOutcome::Failed(_) => {}
            // Lost: the rest are only queried, the run already fails.
            FenceOutcome::Lost => guard = 0,
        }
    }
    if dev.free(out).is_err() {
        acc.leaked_buffers += 1;
    }
    heal();
    acc.device_lost = dev.is_lost();
    if acc.device_lost {
        acc.usable_after = true;
    } else {
        (acc.usable_after, acc.probe_failures) = probe(dev, queues, w, log);
    }
    // Everything resolved: frees released, chunks back.
    let _ = dev.service();
    let bs = dev.buffer_stats();
    acc.leaked_buffers += bs.live;
    acc.frees_waiting = if acc.device_lost { 0 } else { bs.waiting };
    let ps = dev.pool_stats();
    acc.chunks_busy = ps.recording + ps.in_flight + ps.open;
    Ok(acc)
}

/// What became of one fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceOutcome {
    /// Signalled.
    Signalled,
    /// Failed with this reason.
    Failed(Cause),
    /// Still pending after the guard, or an error without a reason.
    Lost,
}

/// Waits for `f` (at most `guard` ns) and counts its outcome in `acc`.
pub fn resolve<B: Backend + Sync, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    f: Fence,
    guard: u64,
    acc: &mut Accounting,
) -> FenceOutcome {
    match dev.wait(f, guard) {
        Ok(()) => {
            acc.signalled += 1;
            FenceOutcome::Signalled
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
            FenceOutcome::Failed(cause)
        }
        Err(_) => {
            acc.lost += 1;
            FenceOutcome::Lost
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
pub fn probe<B: Backend + Sync, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    queues: &[QueueId],
    w: Workload,
    log: &mut dyn Write,
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
                    let _ = writeln!(
                        log,
                        "probe on {q} (lasting fault: {impaired}), attempt {attempt}: failed: {e}"
                    );
                    retries += 1;
                    if impaired {
                        good = true;
                        break;
                    }
                }
                other => {
                    let _ = writeln!(
                        log,
                        "probe on {q} (lasting fault: {impaired}), attempt {attempt}: {other:?}"
                    );
                    break;
                }
            }
        }
        ok &= good;
    }
    (dev.free(buf).is_ok() && ok, retries)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::ToString;

    use super::{Accounting, Expect};

    #[test]
    fn check_passes_exact_accounting_and_names_every_broken_part() {
        let good = Accounting {
            submitted: 3,
            signalled: 2,
            failed_hung: 1,
            usable_after: true,
            ..Accounting::default()
        };
        assert!(good.check().is_ok(), "{good}");
        let bad = Accounting { submitted: 3, signalled: 1, lost: 1, chunks_busy: 2, ..Accounting::default() };
        let text = bad.check().map_err(|e| e.to_string()).expect_err("lost work passed");
        assert_eq!(
            text,
            "3 submitted but 2 accounted; 1 completions lost; 2 IB chunks not returned; \
             the device neither ran new work nor reported itself lost"
        );
    }

    #[test]
    fn each_expectation_fails_on_what_it_is_about_and_only_on_that() {
        let all = Accounting { submitted: 4, signalled: 4, ..Accounting::default() };
        let refused = Accounting { refused: 1, ..all };
        let hung = Accounting { signalled: 3, failed_hung: 1, ..all };
        let lost = Accounting { signalled: 2, refused: 2, device_lost: true, ..all };
        assert_eq!(Expect::AllSignalled.check(&all), Ok(()));
        assert_eq!(Expect::AllSignalled.check(&refused), Err("not every submission signalled"));
        assert_eq!(Expect::AllSignalled.check(&hung), Err("not every submission signalled"));
        assert_eq!(Expect::HangReported.check(&hung), Ok(()));
        assert_eq!(Expect::HangReported.check(&all), Err("no hang reported"));
        assert_eq!(Expect::DeviceLost.check(&lost), Ok(()));
        assert_eq!(Expect::DeviceLost.check(&hung), Err("the device did not report itself lost"));
        for acc in [all, refused, hung, lost] {
            assert_eq!(Expect::AccountingOnly.check(&acc), Ok(()));
        }
    }
}
