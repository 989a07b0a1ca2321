//! The soak: a long seeded run of submissions over every queue with random
//! cross-queue waits, random buffer allocations and frees (also of buffers
//! still in flight), and a hang and a fault injected every so often on the
//! device itself (a job that waits on a semaphore nobody releases, a copy
//! from an unmapped address), so it works over co-simulation, where the
//! server's fault knobs are fixed at its start. Live-object statistics of
//! the driver and whatever the caller measures (process memory and
//! threads) are sampled periodically; [`SoakReport::check`] asserts that
//! the accounting is exact and that no sampled statistic grew beyond its
//! bound. `refgpu-sim/tests/soak.rs` runs it; `docs/reliability.md` has
//! the command and the latest figures.
//!
//! The accounting ([`Accounting`]) and the probe of the device afterwards
//! are the fault matrix's ([`conformance::faults`]).

use std::collections::VecDeque;
use std::fmt::{self, Write};

use umd_core::cmd::{Command, CompareOp};
use umd_core::engine::{Backend, BufferUse, DeviceCore, Submit};
use umd_core::error::SubmitError;
use umd_core::mem::BufferHandle;
use umd_core::sync::{Cause, Fence, QueueId};

use conformance::faults::{self, Accounting, FenceOutcome, Rng, Workload, GUARD_NS};

/// A GPU address the driver never maps (3 GiB into the suite's 4 GiB VA
/// arena, which the soak's buffers never reach): a copy from it faults.
pub const UNMAPPED: u64 = (1u64 << 32) + (3u64 << 30) + 0x40;

/// Words per queue in the result buffer: each job writes its stamp into the
/// next word of its queue's ring of slots. Larger than the window, so a
/// slot is rewritten only after the job that wrote it before was resolved,
/// and by the same queue (poisoned work that still runs late can not
/// overwrite a later job's stamp).
const SLOTS: usize = 1024;

/// The soak's shape.
#[derive(Clone, Copy, Debug)]
pub struct Soak {
    /// Seed of the random choices.
    pub seed: u64,
    /// Submissions attempted (injected hangs and faults included).
    pub jobs: usize,
    /// Every this many submissions, one is a job that hangs (0: none).
    pub hang_every: usize,
    /// Every this many submissions, one is a job that faults (0: none).
    pub fault_every: usize,
    /// Unresolved submissions kept in flight before the oldest is waited
    /// for (at most 1,024: `SLOTS`, the result words per queue).
    pub window: usize,
    /// Most buffers the workload keeps allocated at once (besides the
    /// result buffer and the semaphore).
    pub max_live: usize,
    /// Largest buffer it allocates, in bytes.
    pub max_buffer: u64,
    /// Samples taken over the run (evenly spaced in submissions).
    pub samples: usize,
    /// Every this many submissions (0: never), a normal job copies a word
    /// the CPU wrote into a live buffer (its pattern) into its result word
    /// instead of writing its stamp there, over a word it first writes
    /// with something else: the CPU's data must reach the GPU (the
    /// driver's clean after a CPU write) and the GPU's back to the CPU
    /// (its invalidate before a read), which on a platform with a
    /// non-coherent cache is the driver's cache maintenance at work.
    pub copy_every: usize,
}

impl Soak {
    /// Defaults for `jobs` submissions: a hang and a fault every 5,000
    /// (at least one of each), 64 in flight, up to 48 buffers of up to
    /// 16 KiB, 100 samples.
    pub fn new(seed: u64, jobs: usize) -> Soak {
        let every = 5_000.min(jobs / 2).max(1);
        Soak {
            seed,
            jobs,
            hang_every: every,
            fault_every: every,
            window: 64,
            max_live: 48,
            max_buffer: 16 << 10,
            samples: 100,
            copy_every: 0,
        }
    }
}

/// How a sampled statistic is bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// Never above this (a limit that follows from the workload's shape).
    Fixed(u64),
    /// After warm-up, never above the warm-up maximum plus this much.
    AfterWarmup(u64),
    /// After warm-up, never above the warm-up maximum plus this fraction
    /// of it (in percent), and at least plus the given amount.
    AfterWarmupPct(u64, u64),
}

/// One sampled statistic.
#[derive(Clone, Debug)]
pub struct Series {
    /// Its name (with its unit).
    pub name: &'static str,
    /// Its bound.
    pub bound: Bound,
    /// (submissions so far, value) of every sample.
    pub points: Vec<(u64, u64)>,
}

impl Series {
    /// First, last and largest value.
    pub fn first_last_max(&self) -> (u64, u64, u64) {
        let first = self.points.first().map_or(0, |p| p.1);
        let last = self.points.last().map_or(0, |p| p.1);
        let max = self.points.iter().map(|p| p.1).max().unwrap_or(0);
        (first, last, max)
    }

    /// The limit after warm-up (the first `warmup` samples).
    pub fn limit(&self, warmup: usize) -> u64 {
        let warm = self.points.iter().take(warmup).map(|p| p.1).max().unwrap_or(0);
        match self.bound {
            Bound::Fixed(b) => b,
            Bound::AfterWarmup(slack) => warm + slack,
            Bound::AfterWarmupPct(pct, min) => warm + (warm * pct / 100).max(min),
        }
    }

    /// The first sample after warm-up above the limit.
    pub fn first_violation(&self, warmup: usize) -> Option<(u64, u64)> {
        let limit = self.limit(warmup);
        let from = if matches!(self.bound, Bound::Fixed(_)) { 0 } else { warmup };
        self.points.iter().skip(from).find(|p| p.1 > limit).copied()
    }
}

/// A statistic measured by the caller at each sample (process memory,
/// threads, DMA pages).
pub struct Probe<'a> {
    /// Names and bounds, in the order `measure` returns values.
    pub metrics: Vec<(&'static str, Bound)>,
    /// Returns one value per metric.
    pub measure: &'a mut dyn FnMut() -> Vec<u64>,
}

/// What a soak did.
#[derive(Clone, Debug, Default)]
pub struct SoakReport {
    /// Every submission's fate, leaks, the device afterwards.
    pub acc: Accounting,
    /// Hanging jobs submitted.
    pub hangs_injected: u64,
    /// Of those, failed `DeviceHung`.
    pub hangs_reported: u64,
    /// Faulting jobs submitted.
    pub faults_injected: u64,
    /// Of those, failed with `Fault`.
    pub faults_reported: u64,
    /// Injected jobs that signalled (a hang or fault the driver missed).
    pub injected_signalled: u64,
    /// Buffer words found changed that nothing of the workload wrote (a
    /// freed buffer's memory reused before its fence, or a stray write).
    pub clobbered: u64,
    /// Signalled jobs that copied a CPU-written word into their result
    /// word, found there by the CPU (`Soak::copy_every`).
    pub copies_checked: u64,
    /// Failures acknowledged once counted (`acknowledge_failures`): the
    /// workload, like an application, lets each queue's failure history
    /// forget outcomes it has taken note of, or new work would be refused
    /// with `HistoryFull` once enough separate failures pile up.
    pub acknowledged: u64,
    /// Buffers allocated and freed by the workload.
    pub allocs: u64,
    /// Allocations refused (out of memory after waiting).
    pub alloc_failures: u64,
    /// The sampled statistics.
    pub series: Vec<Series>,
    /// Samples counted as warm-up.
    pub warmup: usize,
}

impl SoakReport {
    /// Checks the accounting (exact), the injections (every one failed
    /// with a reason), the buffers (nothing clobbered, nothing refused) and
    /// the flatness of every sampled statistic; the text says what broke.
    pub fn check(&self) -> Result<(), String> {
        let mut bad = Vec::new();
        if let Err(e) = self.acc.check() {
            bad.push(e.to_string());
        }
        if self.injected_signalled != 0 {
            bad.push(format!("{} injected hangs or faults signalled", self.injected_signalled));
        }
        if self.clobbered != 0 {
            bad.push(format!("{} buffer words clobbered", self.clobbered));
        }
        if self.alloc_failures != 0 {
            bad.push(format!("{} allocations failed", self.alloc_failures));
        }
        for s in &self.series {
            if let Some((at, v)) = s.first_violation(self.warmup) {
                bad.push(format!(
                    "{} grew to {v} at submission {at}, above its bound {}",
                    s.name,
                    s.limit(self.warmup)
                ));
            }
        }
        if bad.is_empty() {
            Ok(())
        } else {
            Err(bad.join("; "))
        }
    }

    /// One line per sampled statistic: first, last, max, bound.
    pub fn series_table(&self) -> String {
        let mut t =
            String::from("| statistic | first | last | max | bound |\n| --- | --- | --- | --- | --- |\n");
        for s in &self.series {
            let (f, l, m) = s.first_last_max();
            let _ = writeln!(t, "| {} | {f} | {l} | {m} | {} |", s.name, s.limit(self.warmup));
        }
        t
    }
}

impl fmt::Display for SoakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}; hangs injected {} (reported hung {}), faults injected {} (reported as faults {}), injected that signalled {}; buffers allocated {} (refused {}), clobbered words {}; CPU-written words copied by the GPU and read back {}; failures acknowledged {}",
            self.acc,
            self.hangs_injected,
            self.hangs_reported,
            self.faults_injected,
            self.faults_reported,
            self.injected_signalled,
            self.allocs,
            self.alloc_failures,
            self.clobbered,
            self.copies_checked,
            self.acknowledged
        )
    }
}

/// What a submission in flight was.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A normal job writing `stamp` into result word `slot` (`copied`:
    /// by copying it from a CPU-written word, `Soak::copy_every`).
    Job { slot: usize, stamp: u32, copied: bool },
    /// A job waiting on the semaphore nobody releases.
    Hang,
    /// A copy from [`UNMAPPED`].
    Fault,
}

/// A buffer of the workload: every word `k` but the first holds
/// `tag * (k+1) ^ 0x5A5A_5A5A` ([`pattern`], written at allocation); jobs write only the first word.
struct Live {
    h: BufferHandle,
    va: u64,
    words: usize,
    tag: u32,
}

fn pattern(tag: u32, k: usize) -> u32 {
    tag.wrapping_mul(k as u32 + 1) ^ 0x5A5A_5A5A
}

/// The driver's own live-object statistics: names, fixed bounds from the
/// workload's shape (`base` is their value before the workload) and values.
fn driver_stats<B: Backend + Sync, const C: usize>(dev: &DeviceCore<'_, B, C>) -> Vec<(&'static str, u64)> {
    let bs = dev.buffer_stats();
    let ps = dev.pool_stats();
    let mut v = vec![
        ("buffers live", bs.live),
        ("buffers waiting for a fence", bs.waiting),
        ("buffer slabs in use", bs.pool.slabs),
        ("buffer blocks held", bs.pool.blocks_acquired - bs.pool.blocks_released),
        ("IB chunks busy (recording, open, in flight)", (ps.recording + ps.open + ps.in_flight) as u64),
    ];
    if let Some(va) = dev.va_stats() {
        v.push(("VA allocations", va.allocations));
        v.push(("VA bytes used", va.used));
        v.push(("VA nodes used", va.nodes_used));
    }
    v
}

/// Runs the soak on `dev`, sampling the driver's statistics and `probe`'s.
pub fn run<B: Backend + Sync, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    s: Soak,
    probe: &mut Probe<'_>,
) -> SoakReport {
    assert!(s.window <= SLOTS, "window {} above {SLOTS}", s.window);
    let mut rep = SoakReport::default();
    let nq = dev.queue_count().min(3);
    let queues: Vec<QueueId> = (0..nq as u8).map(QueueId).collect();
    let mut rng = Rng(s.seed);
    let out = dev.alloc_buffer((nq * SLOTS * 4) as u64).expect("result buffer");
    let out_va = dev.va(out).expect("va");
    let sem = dev.alloc_buffer(64).expect("semaphore");
    let sem_va = dev.va(sem).expect("va");
    dev.write_words(sem, 0, &[0; 16]).expect("clear semaphore");
    // Bounds of the driver's statistics, from the workload's shape: at most
    // `max_live` buffers plus the two above live, and at most one freed
    // buffer per submission in flight (plus the live set) waiting.
    let base = driver_stats(dev);
    let buffers = (s.max_live + 2 + s.window + 1) as u64;
    let bound_of = |name: &str, start: u64| -> Bound {
        match name {
            "buffers live" => Bound::Fixed(s.max_live as u64 + 2),
            "buffers waiting for a fence" => Bound::Fixed((s.max_live + s.window + 1) as u64),
            "IB chunks busy (recording, open, in flight)" => Bound::Fixed(C as u64),
            "VA allocations" => Bound::Fixed(start + buffers),
            "VA nodes used" => Bound::Fixed(start + 2 * buffers + 1),
            "VA bytes used" => Bound::Fixed(start + buffers * s.max_buffer.next_multiple_of(64 << 10)),
            // Slabs and blocks: the pools keep what they grew to, a block
            // at a time when a rare mix of sizes needs one more; after
            // warm-up they may grow by two at most.
            _ => Bound::AfterWarmup(2),
        }
    };
    rep.series =
        base.iter().map(|&(n, v)| Series { name: n, bound: bound_of(n, v), points: Vec::new() }).collect();
    rep.series.extend(probe.metrics.iter().map(|&(n, b)| Series { name: n, bound: b, points: Vec::new() }));
    let sample_every = (s.jobs / s.samples.max(1)).max(1);
    rep.warmup = (s.samples / 5).max(2);

    let mut live: Vec<Live> = Vec::new();
    let mut next_tag: u32 = 1;
    let mut slot = vec![0usize; nq];
    let mut inflight: VecDeque<(Fence, Kind)> = VecDeque::new();
    let mut last: Vec<Option<Fence>> = vec![None; nq];
    let mut word = vec![0u32; (s.max_buffer / 4) as usize];
    let mut bytes = vec![0u8; s.max_buffer as usize];

    for i in 0..s.jobs {
        if i % sample_every == 0 {
            sample(dev, &mut rep, probe, i as u64);
        }
        // Random buffer traffic: allocate (pattern written by the CPU) or
        // free a live buffer, whether or not work using it is in flight.
        // Allocations outnumber frees, so the live set fills up early (in
        // warm-up) and then stays near `max_live`.
        let op = rng.below(8);
        if op < 3 && live.len() < s.max_live {
            let size = 4 * (2 + rng.below(s.max_buffer / 4 - 1));
            match dev.alloc_buffer(size) {
                Ok(h) => {
                    let words = (size / 4) as usize;
                    let tag = next_tag;
                    next_tag = next_tag.wrapping_add(1);
                    for (k, w) in word[..words].iter_mut().enumerate() {
                        *w = pattern(tag, k);
                    }
                    dev.write_words(h, 0, &word[..words]).expect("fill");
                    live.push(Live { h, va: dev.va(h).expect("va"), words, tag });
                    rep.allocs += 1;
                }
                Err(_) => rep.alloc_failures += 1,
            }
        } else if (3..5).contains(&op) && !live.is_empty() {
            let b = live.swap_remove(rng.below(live.len() as u64) as usize);
            rep.clobbered += check_pattern(dev, &b, &mut bytes);
            dev.free(b.h).expect("free");
        }

        let qi = rng.below(nq as u64) as usize;
        let q = queues[qi];
        let injected_hang = s.hang_every != 0 && i % s.hang_every == s.hang_every / 2;
        let injected_fault = s.fault_every != 0 && i % s.fault_every == s.fault_every - 1;
        let mut waits = Vec::new();
        let oq = rng.below(nq as u64) as usize;
        if oq != qi && rng.below(2) == 0 {
            if let Some(f) = last[oq] {
                waits.push(f);
            }
        }
        // A recent fence of any queue, still in flight or not.
        if rng.below(8) == 0 && !inflight.is_empty() {
            let f = inflight[rng.below(inflight.len() as u64) as usize].0;
            if f.id.queue != q {
                waits.push(f);
            }
        }
        let target = if !live.is_empty() && rng.below(2) == 0 {
            Some(rng.below(live.len() as u64) as usize)
        } else {
            None
        };
        let uses: Vec<BufferUse> = target.iter().map(|&t| BufferUse::write(live[t].h)).collect();
        let declared = rng.below(2) == 0;
        let job = Submit::on(q).after(&waits).using(if declared { &uses } else { &[] });
        let (kind, r) = if injected_hang {
            rep.hangs_injected += 1;
            let r = dev.submit_with(&job, |cb| {
                cb.push(&Command::WaitMem {
                    addr: sem_va,
                    reference: 0xDEAD,
                    mask: u64::MAX,
                    op: CompareOp::Eq,
                    wide: true,
                })
            });
            (Kind::Hang, r)
        } else if injected_fault {
            rep.faults_injected += 1;
            let r = dev.submit_with(&job, |cb| cb.copy(UNMAPPED, sem_va, 64));
            (Kind::Fault, r)
        } else {
            let at = slot[qi];
            let mut stamp = faults::stamp(s.seed, i);
            let word_va = out_va + 4 * (qi * SLOTS + at) as u64;
            let tva = target.map(|t| live[t].va);
            // A CPU-written word of a live buffer to copy (every buffer has
            // at least two words; the first is the GPU's). The buffer is
            // tracked implicitly, so its memory outlives this job even if
            // it is freed before the job runs.
            let copy = (s.copy_every != 0 && i % s.copy_every == 0 && !live.is_empty()).then(|| {
                let b = &live[rng.below(live.len() as u64) as usize];
                let k = 1 + rng.below(b.words as u64 - 1) as usize;
                stamp = pattern(b.tag, k);
                b.va + 4 * k as u64
            });
            // One job in sixteen is long enough to fill several IB chunks
            // (the suite's are 4 KiB): the same write repeated.
            let repeats = if rng.below(16) == 0 { 50 + rng.below(350) } else { 0 };
            let r = dev.submit_with(&job, |cb| {
                if let Some(va) = tva {
                    cb.write_data(va, &[stamp])?;
                }
                match copy {
                    Some(src) => {
                        // Something else first, so only the copy leaves
                        // the pattern there.
                        for _ in 0..=repeats {
                            cb.write_data(word_va, &[!stamp])?;
                        }
                        cb.copy(src, word_va, 4)
                    }
                    None => {
                        for _ in 0..repeats {
                            cb.write_data(word_va, &[stamp])?;
                        }
                        cb.write_data(word_va, &[stamp])
                    }
                }
            });
            if r.is_ok() {
                slot[qi] = (at + 1) % SLOTS;
            }
            (Kind::Job { slot: qi * SLOTS + at, stamp, copied: copy.is_some() }, r)
        };
        match r {
            Ok(f) => {
                rep.acc.submitted += 1;
                inflight.push_back((f, kind));
                last[qi] = Some(f);
            }
            Err(SubmitError::DependencyFailed { .. }) | Err(SubmitError::DeviceLost) => rep.acc.refused += 1,
            Err(SubmitError::Platform(_)) if dev.is_lost() => rep.acc.refused += 1,
            Err(e) => panic!("soak job {i} on {q}: submission refused for no fault of the injection: {e}"),
        }
        // Now and then the CPU waits for a random fence in flight, out of
        // order (its outcome is counted when it is the oldest).
        if rng.below(64) == 0 && !inflight.is_empty() {
            let f = inflight[rng.below(inflight.len() as u64) as usize].0;
            let _ = dev.wait(f, GUARD_NS);
        }
        // After each injected hang, empty slabs go back to the platform.
        if injected_hang {
            dev.trim();
        }
        while inflight.len() > s.window {
            resolve_oldest(dev, &mut inflight, &mut last, &mut rep, out);
        }
    }
    while !inflight.is_empty() {
        resolve_oldest(dev, &mut inflight, &mut last, &mut rep, out);
    }
    sample(dev, &mut rep, probe, s.jobs as u64);
    for b in live.drain(..) {
        rep.clobbered += check_pattern(dev, &b, &mut bytes);
        dev.free(b.h).expect("free");
    }
    dev.free(out).expect("free result buffer");
    dev.free(sem).expect("free semaphore");
    rep.acc.device_lost = dev.is_lost();
    if rep.acc.device_lost {
        rep.acc.usable_after = true;
    } else {
        let w = Workload { seed: s.seed, jobs: 0, impaired_after: 0 };
        (rep.acc.usable_after, rep.acc.probe_failures) = faults::probe(dev, &queues, w, &mut Stdout);
    }
    let _ = dev.service();
    let bs = dev.buffer_stats();
    rep.acc.leaked_buffers = bs.live;
    rep.acc.frees_waiting = bs.waiting;
    let ps = dev.pool_stats();
    rep.acc.chunks_busy = ps.recording + ps.in_flight + ps.open;
    rep
}

/// Waits for the oldest submission in flight and counts its outcome.
fn resolve_oldest<B: Backend + Sync, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    inflight: &mut VecDeque<(Fence, Kind)>,
    last: &mut [Option<Fence>],
    rep: &mut SoakReport,
    out: BufferHandle,
) {
    let Some((f, kind)) = inflight.pop_front() else { return };
    let outcome = faults::resolve(dev, f, GUARD_NS, &mut rep.acc);
    match (outcome, kind) {
        (FenceOutcome::Signalled, Kind::Job { slot, stamp, .. })
            if dev.read_u32(out, slot as u64).ok() != Some(stamp) =>
        {
            rep.acc.wrong_data += 1
        }
        (FenceOutcome::Signalled, Kind::Job { copied, .. }) => rep.copies_checked += u64::from(copied),
        (FenceOutcome::Signalled, _) => rep.injected_signalled += 1,
        (FenceOutcome::Failed(Cause::Hung), Kind::Hang) => rep.hangs_reported += 1,
        (FenceOutcome::Failed(Cause::Fault(_)), Kind::Fault) => rep.faults_reported += 1,
        _ => {}
    }
    // Counted: its queue's outcomes up to it are taken note of (the queue's
    // older fences were submitted, and so resolved, before it).
    if matches!(outcome, FenceOutcome::Failed(_)) && dev.acknowledge_failures(f).is_ok() {
        rep.acknowledged += 1;
    }
    // A later submission waiting on a failed fence would be refused: wait
    // on that queue's newer work only.
    if matches!(outcome, FenceOutcome::Failed(_)) {
        if let Some(l) = last.get_mut(usize::from(f.id.queue.0)) {
            if *l == Some(f) {
                *l = None;
            }
        }
    }
}

/// Words of `b` (all but the first) that no longer hold their pattern.
fn check_pattern<B: Backend + Sync, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    b: &Live,
    bytes: &mut [u8],
) -> u64 {
    let bytes = &mut bytes[..4 * b.words];
    if dev.read(b.h, 0, bytes).is_err() {
        return b.words as u64;
    }
    let bad = bytes
        .chunks_exact(4)
        .enumerate()
        .skip(1)
        .filter(|&(k, w)| u32::from_le_bytes([w[0], w[1], w[2], w[3]]) != pattern(b.tag, k))
        .count();
    bad as u64
}

fn sample<B: Backend + Sync, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    rep: &mut SoakReport,
    probe: &mut Probe<'_>,
    at: u64,
) {
    let _ = dev.service();
    let mut values: Vec<u64> = driver_stats(dev).into_iter().map(|(_, v)| v).collect();
    values.extend((probe.measure)());
    for (s, v) in rep.series.iter_mut().zip(values) {
        s.points.push((at, v));
    }
}

/// The probe's log, printed as it comes (the soak runs in a test).
struct Stdout;

impl Write for Stdout {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        print!("{s}");
        Ok(())
    }
}
