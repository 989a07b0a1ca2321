//! The conformance suite: scenarios written once (`no_std`, no allocator)
//! and run on every platform, in both modes: the in-process model (also
//! with a non-coherent CPU cache), Linux co-simulation against
//! `refgpu-sim`, bare metal under QEMU, and through the Linux kernel driver.
//!
//! Each scenario takes a device ([`DeviceCore`], either mode) and an [`Env`]
//! saying what the platform offers (threads), and returns a
//! [`ScenarioResult`]: pass, fail with a reason, or skip with the reason it
//! cannot run on this platform (a scenario never passes silently). The list:
//! data correctness, fence order, IB chaining, ring wrap-around, a copy ->
//! compute -> copy pipeline over three queues with semaphores, deadlock
//! rejection, page faults, hang recovery, IB pool exhaustion, the gen2
//! misaligned-fence rule, a seeded stress run; buffer lifecycles (a buffer
//! freed while in flight, ten thousand buffers across the size classes);
//! a buffer asked for again at its fixed address while a copy reads it;
//! failure propagation, a failure history that survives many resets, a wait
//! before signal that is not a hang, several submitting threads; a DMA
//! overrun caught, events across queues, local memory under eviction, and
//! DISPATCH on a queue whose engine does not run it (refused by the
//! validation mode, a fault without it).
//!
//! Run them with [`run_all`] on a device made with [`SUITE_CONFIG`] and
//! [`SUITE_MMU`]; every wait has a generous failure guard ([`GUARD_NS`]),
//! never a performance threshold.
#![no_std]

pub mod bringup;
pub mod faults;
pub mod io;

use core::fmt::{self, Write};

use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use umd_core::cmd::{Command, CompareOp, DispatchOp, EncodeError};
use umd_core::config::{Config, HangConfig, PoolExhaustion};
use umd_core::debug::HangReason;
use umd_core::direct::MmuMode;
use umd_core::engine::{Backend, BufferUse, DeviceCore, Event, Mode, Submit};
use umd_core::error::{FenceStatus, SubmitError, WaitError};
use umd_core::hw::Generation;
use umd_core::ibpool::Recorder;
use umd_core::mem::{BufferDesc, BufferHandle};
use umd_core::sync::{Access, Cause, FaultKind, Fence, FenceError, QueueId};

use io::{first_mismatch, write_words};

/// Graphics queue.
#[deprecated(note = "use `QueueId::GFX`")]
pub const GFX: QueueId = QueueId::GFX;
/// Compute queue (the only one that runs DISPATCH).
#[deprecated(note = "use `QueueId::COMPUTE`")]
pub const COMPUTE: QueueId = QueueId::COMPUTE;
/// Copy queue.
#[deprecated(note = "use `QueueId::COPY`")]
pub const COPY: QueueId = QueueId::COPY;

/// Failure guard for one wait: far beyond any expected time, so a slow
/// platform (QEMU under TCG) never fails for being slow.
pub const GUARD_NS: u64 = 30_000_000_000;

/// IB chunks of the suite's device.
pub const SUITE_CHUNKS: usize = 16;

/// The suite's configuration: small chunks and rings so chaining and
/// wrap-around happen quickly, and a 1 s hang window: short enough that the
/// hang scenario is quick, long enough that an engine thread starved on a
/// loaded host (or a slow TCG guest) is not mistaken for a hang. A
/// submission waits up to 5 s for room in a full dependency table (the
/// default 0.5 s is a latency choice for applications): the wait is a
/// failure guard here, and on a loaded host a model starved for half a
/// second turned the stress scenario's waits into `TooManyPending`.
pub const SUITE_CONFIG: Config = Config {
    ib_chunk_bytes: 4096,
    ring_bytes: 16 * 1024,
    dep_wait_ns: 5_000_000_000,
    hang: HangConfig { window_ns: 1_000_000_000, ..Config::DEFAULT.hang },
    ..Config::DEFAULT
};

/// The suite's MMU layout: 4 GiB of VA from 4 GiB, 64 table pages.
pub const SUITE_MMU: MmuMode = MmuMode::DEFAULT;

/// How a scenario ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Behaved as specified.
    Pass,
    /// Did not (see the detail).
    Fail,
    /// Cannot run on this platform (see the detail).
    Skip,
}

/// A short text (what failed, or why skipped), fixed capacity.
#[derive(Clone, Copy)]
pub struct Detail {
    buf: [u8; 200],
    len: usize,
}

impl Detail {
    /// Empty.
    pub const fn new() -> Detail {
        Detail { buf: [0; 200], len: 0 }
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        let bytes = self.buf.get(..self.len).unwrap_or(&[]);
        match core::str::from_utf8(bytes) {
            Ok(s) => s,
            // Truncation may split a character: keep the valid prefix.
            Err(e) => core::str::from_utf8(bytes.get(..e.valid_up_to()).unwrap_or(&[])).unwrap_or(""),
        }
    }
}

impl Default for Detail {
    fn default() -> Self {
        Detail::new()
    }
}

impl Write for Detail {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for b in s.bytes() {
            if let Some(slot) = self.buf.get_mut(self.len) {
                *slot = b;
                self.len = self.len.saturating_add(1);
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Detail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Detail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one scenario reported.
#[derive(Clone, Copy, Debug)]
pub struct ScenarioResult {
    /// Scenario name.
    pub name: &'static str,
    /// How it ended.
    pub outcome: Outcome,
    /// Why it failed or was skipped; on a pass, empty or what the scenario
    /// saw that its checks do not fix (a count, which path it took).
    pub detail: Detail,
}

impl fmt::Display for ScenarioResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = match self.outcome {
            Outcome::Pass => "PASS",
            Outcome::Fail => "FAIL",
            Outcome::Skip => "SKIP",
        };
        write!(f, "{tag} {}", self.name)?;
        if !self.detail.as_str().is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

/// What the platform offers a scenario beyond the device.
#[derive(Clone, Copy, Default)]
pub struct Env<'a> {
    /// Runs tasks on several threads at once (None: no threads here, and
    /// the multi-submitter scenario is skipped with that reason).
    pub parallel: Option<&'a dyn Parallel>,
}

impl fmt::Debug for Env<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Env").field("parallel", &self.parallel.is_some()).finish()
    }
}

/// A platform's threads: `run` calls every task on its own thread and
/// returns when all have returned.
pub trait Parallel: Sync {
    /// Runs `tasks[i](i)` concurrently.
    fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync));
}

/// A scenario's body: `Err` carries the failure (or skip) text.
type Body<B, const C: usize> = fn(&DeviceCore<'_, B, C>, &Env<'_>, &mut Detail) -> Result<(), Stop>;

/// Why a scenario body stopped early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// A check failed (text in the detail).
    Fail,
    /// The platform cannot run it (text in the detail).
    Skip,
}

/// One scenario.
pub struct Scenario<B: Backend, const C: usize> {
    /// Name, stable across platforms (the harnesses key results by it).
    pub name: &'static str,
    body: Body<B, C>,
}

impl<B: Backend + Sync, const C: usize> Scenario<B, C> {
    /// Runs it.
    pub fn run(&self, dev: &DeviceCore<'_, B, C>, env: &Env<'_>) -> ScenarioResult {
        let mut detail = Detail::new();
        let outcome = match (self.body)(dev, env, &mut detail) {
            Ok(()) => Outcome::Pass,
            Err(Stop::Fail) => Outcome::Fail,
            Err(Stop::Skip) => Outcome::Skip,
        };
        ScenarioResult { name: self.name, outcome, detail }
    }
}

/// Number of scenarios.
pub const SCENARIOS: usize = 22;

/// Every scenario, in a fixed order.
pub fn scenarios<B: Backend + Sync, const C: usize>() -> [Scenario<B, C>; SCENARIOS] {
    [
        Scenario { name: "copy_fill_write", body: copy_fill_write },
        Scenario { name: "fences_in_order", body: fences_in_order },
        Scenario { name: "ib_chaining", body: ib_chaining },
        Scenario { name: "ring_wraparound", body: ring_wraparound },
        Scenario { name: "pipeline_copy_compute_copy", body: pipeline },
        Scenario { name: "deadlock_rejected", body: deadlock_rejected },
        Scenario { name: "page_fault_reported", body: page_fault },
        Scenario { name: "hang_detected_and_recovered", body: hang_recovery },
        Scenario { name: "pool_exhaustion", body: pool_exhaustion },
        Scenario { name: "gen2_misaligned_fence", body: misaligned_fence },
        Scenario { name: "stress_random_dependencies", body: stress },
        Scenario { name: "free_while_in_flight", body: free_while_in_flight },
        Scenario { name: "fixed_address_reuse", body: fixed_address_reuse },
        Scenario { name: "many_small_buffers", body: many_small_buffers },
        Scenario { name: "failure_propagates", body: failure_propagates },
        Scenario { name: "failure_history_survives_resets", body: history_survives_resets },
        Scenario { name: "wait_before_signal_is_not_a_hang", body: wait_before_signal },
        Scenario { name: "multi_submitter", body: multi_submitter },
        Scenario { name: "dma_overrun_caught", body: dma_overrun },
        Scenario { name: "events_across_queues", body: events },
        Scenario { name: "local_memory_eviction", body: local_memory },
        Scenario { name: "dispatch_on_wrong_queue", body: dispatch_on_wrong_queue },
    ]
}

/// Names of every scenario (for harnesses that enumerate results).
pub const SCENARIO_NAMES: [&str; SCENARIOS] = [
    "copy_fill_write",
    "fences_in_order",
    "ib_chaining",
    "ring_wraparound",
    "pipeline_copy_compute_copy",
    "deadlock_rejected",
    "page_fault_reported",
    "hang_detected_and_recovered",
    "pool_exhaustion",
    "gen2_misaligned_fence",
    "stress_random_dependencies",
    "free_while_in_flight",
    "fixed_address_reuse",
    "many_small_buffers",
    "failure_propagates",
    "failure_history_survives_resets",
    "wait_before_signal_is_not_a_hang",
    "multi_submitter",
    "dma_overrun_caught",
    "events_across_queues",
    "local_memory_eviction",
    "dispatch_on_wrong_queue",
];

/// Runs every scenario on `dev`, handing each result to `out`.
pub fn run_all<B: Backend + Sync, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    env: &Env<'_>,
    mut out: impl FnMut(ScenarioResult),
) {
    for s in scenarios::<B, C>() {
        out(s.run(dev, env));
    }
}

// ----- helpers -------------------------------------------------------------

macro_rules! fail {
    ($d:expr, $($arg:tt)*) => {{
        let _ = write!($d, $($arg)*);
        return Err(Stop::Fail);
    }};
}

/// The value of a `Result`, or a failure naming what was tried (the format
/// arguments) followed by `: ` and the error.
macro_rules! tried {
    ($d:expr, $r:expr, $($arg:tt)*) => {
        match $r {
            Ok(v) => v,
            Err(e) => {
                let _ = write!($d, $($arg)*);
                fail!($d, ": {e}");
            }
        }
    };
}

macro_rules! skip {
    ($d:expr, $($arg:tt)*) => {{
        let _ = write!($d, $($arg)*);
        return Err(Stop::Skip);
    }};
}

macro_rules! check {
    ($d:expr, $cond:expr, $($arg:tt)*) => {
        if !$cond {
            fail!($d, $($arg)*);
        }
    };
}

fn pattern(i: usize, seed: u32) -> u32 {
    (i as u32).wrapping_mul(0x9E37_79B1) ^ seed
}

type Dev<'a, 'd, B, const C: usize> = &'a DeviceCore<'d, B, C>;

fn alloc<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    len: u64,
    d: &mut Detail,
) -> Result<(BufferHandle, u64), Stop> {
    alloc_with(dev, &BufferDesc::new(len), d)
}

fn alloc_with<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    desc: &BufferDesc,
    d: &mut Detail,
) -> Result<(BufferHandle, u64), Stop> {
    let h = tried!(d, dev.alloc(desc), "alloc {}", desc.size);
    Ok((h, tried!(d, dev.va(h), "va of a new buffer")))
}

fn free<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    h: BufferHandle,
    d: &mut Detail,
) -> Result<(), Stop> {
    tried!(d, dev.free(h), "free {h}");
    Ok(())
}

fn fill<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    h: BufferHandle,
    n: usize,
    f: impl Fn(usize) -> u32,
    d: &mut Detail,
) -> Result<(), Stop> {
    tried!(d, write_words(dev, h, n, f), "write {h}");
    Ok(())
}

fn submit<B: Backend, const C: usize, F>(
    dev: Dev<'_, '_, B, C>,
    q: QueueId,
    waits: &[Fence],
    d: &mut Detail,
    f: F,
) -> Result<Fence, Stop>
where
    F: FnOnce(&mut Recorder<'_>) -> Result<(), EncodeError>,
{
    Ok(tried!(d, dev.submit(q, waits, f), "submit on {q}"))
}

/// Submits work that faults on purpose, with the validation mode (which
/// would refuse it) off for that one submission.
fn submit_unvalidated<B: Backend, const C: usize, F>(
    dev: Dev<'_, '_, B, C>,
    q: QueueId,
    d: &mut Detail,
    f: F,
) -> Result<Fence, Stop>
where
    F: FnOnce(&mut Recorder<'_>) -> Result<(), EncodeError>,
{
    let was = dev.validation();
    let _ = dev.set_validation(false);
    let r = submit(dev, q, &[], d, f);
    let _ = dev.set_validation(was);
    r
}

fn wait<B: Backend, const C: usize>(dev: Dev<'_, '_, B, C>, f: Fence, d: &mut Detail) -> Result<(), Stop> {
    tried!(d, dev.wait(f, GUARD_NS), "wait {f}");
    Ok(())
}

/// Checks `n` dwords of `h` against `want(i)` (the copy does the cache
/// maintenance).
fn expect_words<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    h: BufferHandle,
    n: usize,
    d: &mut Detail,
    want: impl Fn(usize) -> u32,
) -> Result<(), Stop> {
    match first_mismatch(dev, h, n, want) {
        Ok(None) => Ok(()),
        Ok(Some((i, got, want))) => fail!(d, "word {i}: got {got:#x}, want {want:#x}"),
        Err(e) => fail!(d, "read {h}: {e}"),
    }
}

/// A gate the host opens: an event the GPU work waits for and the host
/// sets (the driver's event word is accessed with atomics on the CPU, so
/// the host's store does not race the GPU's WAIT_MEM polling it).
fn gate<B: Backend, const C: usize>(dev: Dev<'_, '_, B, C>, d: &mut Detail) -> Result<Event, Stop> {
    Ok(tried!(d, dev.create_event(), "create the gate"))
}

fn release_gate<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    g: Event,
    d: &mut Detail,
) -> Result<(), Stop> {
    tried!(d, dev.set_event(g), "release the gate");
    Ok(())
}

fn destroy_gate<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    g: Event,
    d: &mut Detail,
) -> Result<(), Stop> {
    tried!(d, dev.destroy_event(g), "destroy the gate");
    Ok(())
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next().checked_rem(n).unwrap_or(0)
    }
}

// ----- scenarios -----------------------------------------------------------

fn copy_fill_write<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    _: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    for (k, q) in [QueueId::GFX, QueueId::COMPUTE, QueueId::COPY].into_iter().enumerate() {
        let seed = 0x1234_5678 ^ k as u32;
        let (src, s) = alloc(dev, 16384, d)?;
        let (dst, t) = alloc(dev, 16384, d)?;
        fill(dev, src, 4096, |i| pattern(i, seed), d)?;
        fill(dev, dst, 4096, |_| 0xDEAD_BEEF, d)?;
        let f = submit(dev, q, &[], d, |cb| {
            cb.copy(s, t, 8192)?;
            cb.fill(t + 8192, 4096, 0xA5A5_A5A5)?;
            cb.write_data(t + 12288, &[1, 2, 3, 4])
        })?;
        wait(dev, f, d)?;
        expect_words(dev, dst, 3076, d, |i| match i {
            0..=2047 => pattern(i, seed),
            2048..=3071 => 0xA5A5_A5A5,
            _ => (i - 3071) as u32,
        })?;
        free(dev, src, d)?;
        free(dev, dst, d)?;
    }
    Ok(())
}

fn fences_in_order<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    _: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    let (buf, b) = alloc(dev, 4096, d)?;
    let mut fences = [None; 64];
    for (i, slot) in fences.iter_mut().enumerate() {
        // Each job writes a timestamp: in-order execution means they never decrease.
        *slot = Some(submit(dev, QueueId::GFX, &[], d, |cb| cb.timestamp(b + 8 * i as u64))?);
    }
    let last = fences[63].ok_or(Stop::Fail)?;
    wait(dev, last, d)?;
    let mut prev_seq = 0;
    for f in fences.iter().flatten() {
        check!(d, dev.query(*f) == Ok(FenceStatus::Signalled), "fence {f} not signalled after the last one");
        check!(d, f.seqno().0 > prev_seq, "seqnos not increasing at {f}");
        prev_seq = f.seqno().0;
    }
    let mut bytes = [0u8; 512];
    if let Err(e) = dev.read(buf, 0, &mut bytes) {
        fail!(d, "read: {e}");
    }
    let mut prev = 0u64;
    for (i, c) in bytes.chunks_exact(8).enumerate() {
        let t = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        check!(d, t >= prev && t != 0, "timestamp {i} = {t} after {prev}: not in order");
        prev = t;
    }
    free(dev, buf, d)
}

fn ib_chaining<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    _: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    let (buf, b) = alloc(dev, 3000 * 4, d)?;
    // 3000 WRITE_DATA packets of 4 dwords each: ~60 KB of commands through
    // 4 KiB chunks, so the buffer is chained over about 15 chunks.
    let f = submit(dev, QueueId::COPY, &[], d, |cb| {
        for i in 0..3000u64 {
            cb.write_data(b + 4 * i, &[pattern(i as usize, 0xC4A1)])?;
        }
        Ok(())
    })?;
    wait(dev, f, d)?;
    expect_words(dev, buf, 3000, d, |i| pattern(i, 0xC4A1))?;
    free(dev, buf, d)
}

fn ring_wraparound<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    _: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    if dev.mode() == Mode::Kernel {
        skip!(d, "kernel mode: the kernel driver owns the rings");
    }
    let (buf, b) = alloc(dev, 4096, d)?;
    let wraps0 = dev.stats().ring_wraps;
    // Each submission puts ~36 bytes in a 16 KiB ring: 1200 of them wrap it
    // at least twice, at shifting offsets.
    let mut last = None;
    for i in 0..1200u64 {
        let f = submit(dev, QueueId::COMPUTE, &[], d, |cb| cb.write_data(b + 4 * (i % 1024), &[i as u32]))?;
        if i % 100 == 99 {
            wait(dev, f, d)?;
        }
        last = Some(f);
    }
    wait(dev, last.ok_or(Stop::Fail)?, d)?;
    let wraps = dev.stats().ring_wraps.saturating_sub(wraps0);
    check!(d, wraps >= 2, "ring wrapped {wraps} times, expected at least 2");
    expect_words(dev, buf, 1024, d, |i| if i < 1200 - 1024 { (i + 1024) as u32 } else { i as u32 })?;
    free(dev, buf, d)
}

/// `scalar * a + b` exactly as the spec says (product rounded, then sum).
fn saxpy(scalar: f32, a: f32, b: f32) -> f32 {
    let p = core::hint::black_box(scalar * a);
    p + b
}

fn pipeline<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    _: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    const N: usize = 1024;
    let (input, inp) = alloc(dev, (2 * N * 4) as u64, d)?;
    let (staging, stg) = alloc(dev, (2 * N * 4) as u64, d)?;
    let (result, res) = alloc(dev, (N * 4) as u64, d)?;
    let (out, o) = alloc(dev, (N * 4) as u64, d)?;
    let a = |i: usize| (i as f32) * 0.5 - 100.0;
    let bv = |i: usize| 1.0 / ((i as f32) + 1.0);
    fill(dev, input, 2 * N, |i| if i < N { a(i).to_bits() } else { bv(i - N).to_bits() }, d)?;
    let n4 = (N * 4) as u64;
    // COPY: stage both inputs. COMPUTE (waits COPY): SAXPY. GFX (waits COMPUTE): copy out.
    let c1 = submit(dev, QueueId::COPY, &[], d, |cb| cb.copy(inp, stg, 2 * n4))?;
    let c2 = submit(dev, QueueId::COMPUTE, &[c1], d, |cb| {
        cb.dispatch(DispatchOp::SaxpyF32, stg, stg + n4, res, N as u32, 2.5)
    })?;
    let c3 = submit(dev, QueueId::GFX, &[c2], d, |cb| cb.copy(res, o, n4))?;
    wait(dev, c3, d)?;
    check!(d, dev.query(c1) == Ok(FenceStatus::Signalled), "copy fence not signalled before the final one");
    check!(
        d,
        dev.query(c2) == Ok(FenceStatus::Signalled),
        "compute fence not signalled before the final one"
    );
    expect_words(dev, out, N, d, |i| saxpy(2.5, a(i), bv(i)).to_bits())?;
    for h in [input, staging, result, out] {
        free(dev, h, d)?;
    }
    Ok(())
}

fn deadlock_rejected<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    _: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    let Some(copy_next) = dev.next_fence(QueueId::COPY) else { fail!(d, "no COPY queue") };
    // COMPUTE waits for COPY's next fence (wait before signal) ...
    let compute = submit(dev, QueueId::COMPUTE, &[copy_next], d, |cb| cb.barrier())?;
    // ... so COPY's next submission may not wait for that COMPUTE work.
    match dev.submit(QueueId::COPY, &[compute], |cb| cb.barrier()) {
        Err(SubmitError::Cycle(c)) => {
            check!(d, c.fences().len() == 2, "cycle named {} submissions: {c}", c.fences().len());
        }
        other => fail!(d, "expected a wait-cycle error, got {other:?}"),
    }
    // The same submission without the cycle runs and releases COMPUTE.
    let copy = submit(dev, QueueId::COPY, &[], d, |cb| cb.barrier())?;
    check!(
        d,
        copy.seqno() == copy_next.seqno(),
        "COPY's next fence was {copy}, expected {}",
        copy_next.seqno()
    );
    wait(dev, copy, d)?;
    wait(dev, compute, d)?;
    Ok(())
}

/// 3 GiB into the suite's 4 GiB arena: never mapped by anything.
const UNMAPPED: u64 = (1u64 << 32) + (3u64 << 30) + 0x40;

fn page_fault<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    _: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    if !dev.mmu_enabled() {
        skip!(d, "MMU bypassed on this device: no faults to take");
    }
    let (dst, t) = alloc(dev, 4096, d)?;
    let f = submit_unvalidated(dev, QueueId::COPY, d, |cb| cb.copy(UNMAPPED, t, 256))?;
    match dev.wait(f, GUARD_NS) {
        Err(WaitError::Failed(FenceError::Fault(info))) => {
            check!(d, info.kind == FaultKind::Translation, "fault kind {:?}", info.kind);
            check!(d, info.access == Access::Read, "fault access {:?}", info.access);
            check!(d, info.addr == UNMAPPED, "fault address {:#x}, expected {UNMAPPED:#x}", info.addr);
            let Some(r) = dev.last_hang() else { fail!(d, "no fault report") };
            check!(d, r.queue == QueueId::COPY, "fault reported on {}", r.queue);
        }
        Err(WaitError::Failed(_)) if dev.mode() == Mode::Kernel => {
            // The kernel reset the context; the fault's details are in its
            // devcoredump.
        }
        other => fail!(d, "expected a translation fault, got {other:?}"),
    }
    // The queue works again.
    let g = submit(dev, QueueId::COPY, &[], d, |cb| cb.fill(t, 64, 7))?;
    wait(dev, g, d)?;
    free(dev, dst, d)
}

fn hang_recovery<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    _: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    let (buf, b) = alloc(dev, 4096, d)?;
    let resets = dev.stats().resets;
    // A semaphore that is never released: the engine waits forever.
    let stuck = submit(dev, QueueId::COMPUTE, &[], d, |cb| {
        cb.push(&Command::WaitMem {
            addr: b,
            reference: 0xFEED,
            mask: u64::MAX,
            op: CompareOp::Eq,
            wide: true,
        })
    })?;
    let behind = submit(dev, QueueId::COMPUTE, &[], d, |cb| cb.write_data(b + 64, &[1]))?;
    match dev.wait(behind, GUARD_NS) {
        Err(WaitError::Failed(FenceError::DeviceHung)) => {}
        other => fail!(d, "expected the hang to fail the fence, got {other:?}"),
    }
    check!(
        d,
        dev.query(stuck) == Ok(FenceStatus::Failed(FenceError::DeviceHung)),
        "the hung job's fence is not failed"
    );
    let Some(r) = dev.last_hang() else { fail!(d, "no hang report") };
    check!(d, r.queue == QueueId::COMPUTE, "hang blamed on {}", r.queue);
    check!(
        d,
        matches!(r.reason, HangReason::NoProgress { .. } | HangReason::KernelReset),
        "reason {}",
        r.reason
    );
    check!(d, dev.stats().resets == resets + 1, "expected one reset");
    // The next submission on the reset queue succeeds.
    let next = submit(dev, QueueId::COMPUTE, &[], d, |cb| cb.write_data(b + 128, &[0x600D]))?;
    wait(dev, next, d)?;
    expect_words(dev, buf, 33, d, |i| if i == 32 { 0x600D } else { 0 })?;
    free(dev, buf, d)
}

fn pool_exhaustion<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    _: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    let (sem, s) = alloc(dev, 4096, d)?;
    let g = gate(dev, d)?;
    // Block GFX on a gate the host releases, then submit jobs that each
    // need most of a chunk until the pool runs dry.
    let gated = submit(dev, QueueId::GFX, &[], d, |cb| cb.push(&g.wait()))?;
    dev.set_pool_exhaustion(PoolExhaustion::Error);
    let exhausted = fill_pool(dev, s, d);
    // Whatever happened, release the gate and restore the policy so later
    // scenarios find a working queue.
    release_gate(dev, g, d)?;
    dev.set_pool_exhaustion(PoolExhaustion::WaitOldest);
    let last = exhausted?;
    wait(dev, gated, d)?;
    destroy_gate(dev, g, d)?;
    // With the waiting policy the next submission gets a chunk back as soon
    // as the oldest fence signals.
    let after = submit(dev, QueueId::GFX, &[], d, |cb| cb.write_data(s + 8, &[0xAB]))?;
    wait(dev, after, d)?;
    check!(d, dev.query(last) == Ok(FenceStatus::Signalled), "earlier work not done");
    free(dev, sem, d)
}

/// Submits chunk-sized jobs to the blocked GFX queue until the pool refuses
/// one; returns the last accepted fence.
fn fill_pool<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    s: u64,
    d: &mut Detail,
) -> Result<Fence, Stop> {
    let big = [0u32; 200];
    // Three 200-dword WRITE_DATA take ~600 of a chunk's 1024 dwords; with
    // batching two jobs can share a chunk, so 2C + 2 jobs cannot all fit.
    let mut last = None;
    for i in 0..(2 * C + 2) {
        match dev.submit(QueueId::GFX, &[], |cb| {
            for _ in 0..3 {
                cb.write_data(s + 2048, &big)?;
            }
            Ok(())
        }) {
            Ok(f) => last = Some(f),
            Err(SubmitError::PoolEmpty) => {
                check!(d, i >= C / 2, "pool empty after only {i} jobs with {C} chunks");
                return last.ok_or(Stop::Fail);
            }
            Err(e) => fail!(d, "job {i}: {e}"),
        }
    }
    fail!(d, "the pool never ran empty with {C} chunks")
}

fn misaligned_fence<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    _: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    let (buf, b) = alloc(dev, 4096, d)?;
    match dev.chip().generation {
        Generation::Gen2 => {
            // 8-byte aligned but not 64: the device would drop it silently,
            // so the encoder refuses it and nothing is submitted.
            let before = dev.last_emitted(QueueId::GFX);
            match dev.submit(QueueId::GFX, &[], |cb| cb.fence(b + 8, 5, false)) {
                Err(SubmitError::Encode(EncodeError::MisalignedFence { align: 64, .. })) => {}
                other => fail!(d, "expected MisalignedFence(64), got {other:?}"),
            }
            check!(d, dev.last_emitted(QueueId::GFX) == before, "a refused submission emitted a fence");
            let f = submit(dev, QueueId::GFX, &[], d, |cb| cb.fence(b + 64, 5, false))?;
            wait(dev, f, d)?;
            expect_words(dev, buf, 18, d, |i| if i == 16 { 5 } else { 0 })?;
        }
        Generation::Gen1 => {
            // Gen1 only needs 8-byte alignment: the same fence lands.
            let f = submit(dev, QueueId::GFX, &[], d, |cb| cb.fence(b + 8, 5, false))?;
            wait(dev, f, d)?;
            expect_words(dev, buf, 4, d, |i| if i == 2 { 5 } else { 0 })?;
            match dev.submit(QueueId::GFX, &[], |cb| cb.fence(b + 4, 5, false)) {
                Err(SubmitError::Encode(EncodeError::MisalignedFence { align: 8, .. })) => {}
                other => fail!(d, "expected MisalignedFence(8), got {other:?}"),
            }
        }
    }
    free(dev, buf, d)
}

fn stress<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    _: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    const JOBS: usize = 2000;
    const KEEP: usize = 32;
    let (buf, b) = alloc(dev, (JOBS * 4) as u64, d)?;
    let mut rng = Rng(0x5EED_0FC0_FFEE);
    let before = dev.stats();
    let queues = [QueueId::GFX, QueueId::COMPUTE, QueueId::COPY];
    // The last KEEP fences of each queue, to draw waits from.
    let mut recent = [[None::<Fence>; KEEP]; 3];
    let mut count = [0usize; 3];
    for i in 0..JOBS {
        let qi = rng.below(3) as usize;
        let q = queues.get(qi).copied().unwrap_or(QueueId::GFX);
        let mut wl: [Option<Fence>; 2] = [None; 2];
        for w in wl.iter_mut() {
            let oq = rng.below(3) as usize;
            let n = count.get(oq).copied().unwrap_or(0);
            if oq != qi && n > 0 && rng.below(2) == 0 {
                let pick = n.saturating_sub(1 + rng.below(KEEP.min(n) as u64) as usize);
                *w = recent.get(oq).and_then(|r| r.get(pick % KEEP)).copied().flatten();
            }
        }
        let mut waits = [dev.last_emitted(QueueId::GFX).ok_or(Stop::Fail)?; 2];
        let mut nw = 0;
        for f in wl.iter().flatten() {
            waits[nw] = *f;
            nw += 1;
        }
        let f = submit(dev, q, &waits[..nw], d, |cb| cb.write_data(b + 4 * i as u64, &[i as u32 ^ 0x5A5A]))?;
        if let (Some(r), Some(c)) = (recent.get_mut(qi), count.get_mut(qi)) {
            if let Some(slot) = r.get_mut(*c % KEEP) {
                *slot = Some(f);
            }
            *c += 1;
        }
        if i % 250 == 249 {
            wait(dev, f, d)?;
        }
    }
    for r in recent.iter() {
        for f in r.iter().flatten() {
            wait(dev, *f, d)?;
        }
    }
    expect_words(dev, buf, JOBS, d, |i| i as u32 ^ 0x5A5A)?;
    let s = dev.stats();
    let (hangs, faults) = (s.hangs.saturating_sub(before.hangs), s.faults.saturating_sub(before.faults));
    check!(d, hangs == 0 && faults == 0, "stress saw {hangs} hangs and {faults} faults");
    free(dev, buf, d)
}

/// A buffer freed right after a submission that reads it: its memory and
/// address stay out of circulation until the fence, and the job reads the
/// original data. Both tracking modes.
fn free_while_in_flight<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    _: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    const LEN: u64 = 64 * 1024;
    const WORDS: usize = (LEN / 4) as usize;
    for declared in [false, true] {
        let g = gate(dev, d)?;
        let desc = if declared { BufferDesc::new(LEN).declared() } else { BufferDesc::new(LEN) };
        let (src, s) = alloc_with(dev, &desc.tag("freed-in-flight"), d)?;
        let (out, o) = alloc(dev, LEN, d)?;
        fill(dev, src, WORDS, |i| pattern(i, 0xF4EE), d)?;
        // The copy waits for the host's gate, so it is surely in flight
        // while the buffer is freed and its successors are allocated.
        let uses = [BufferUse::read(src), BufferUse::write(out)];
        let job = Submit::on(QueueId::COPY).using(if declared { &uses } else { &[] });
        let recorded = dev.submit_with(&job, |cb| {
            cb.push(&g.wait())?;
            cb.copy(s, o, LEN)
        });
        let f = tried!(d, recorded, "submit");
        let waiting0 = dev.buffer_stats().waiting;
        free(dev, src, d)?;
        check!(d, dev.buffer_stats().waiting == waiting0 + 1, "the free did not wait for the fence");
        check!(d, dev.free(src) == Err(umd_core::mem::BufferError::Stale), "double free not refused");
        // Successors of the same size (the pool would reuse the slot at
        // once if the free were not gated) get other addresses.
        let mut next = [None; 4];
        for slot in next.iter_mut() {
            let (h, va) = alloc_with(dev, &desc, d)?;
            check!(d, va != s, "address {s:#x} reused while its copy is in flight");
            fill(dev, h, WORDS, |i| pattern(i, 0xBAD), d)?;
            *slot = Some(h);
        }
        release_gate(dev, g, d)?;
        wait(dev, f, d)?;
        expect_words(dev, out, WORDS, d, |i| pattern(i, 0xF4EE))?;
        // After the fence the memory goes back (on the next allocation or
        // completion pass).
        let _ = dev.query(f);
        check!(d, dev.buffer_stats().waiting == waiting0, "freed memory not released after its fence");
        for h in next.iter().flatten() {
            free(dev, *h, d)?;
        }
        free(dev, out, d)?;
        destroy_gate(dev, g, d)?;
    }
    Ok(())
}

/// A buffer at a fixed GPU address (capture/replay): a buffer freed while a
/// copy reads it and asked for again at its address is given out only once
/// the copy has stopped, the copy reads the original data, and GPU writes
/// to the new buffer land at that address. A live range and a misaligned
/// address are refused with their causes. Skipped where GPU addresses are
/// the memory's own (MMU bypassed).
fn fixed_address_reuse<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    _: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    use umd_core::mem::AllocError;
    // Large: a block of its own, so the address is the buffer's.
    const LEN: u64 = 256 * 1024;
    const WORDS: usize = (LEN / 4) as usize;
    let (src, s) = alloc_with(dev, &BufferDesc::new(LEN).tag("fixed-first"), d)?;
    let (out, o) = alloc(dev, LEN, d)?;
    fill(dev, src, WORDS, |i| pattern(i, 0xF1ED), d)?;
    let f = submit(dev, QueueId::COPY, &[], d, |cb| cb.copy(s, o, LEN))?;
    free(dev, src, d)?;
    // Whether the copy was still running when its range was asked for (so
    // that the wait was exercised here, not only allowed): said in the
    // scenario's detail.
    let in_flight = matches!(dev.query(f), Ok(FenceStatus::Pending));
    let h = match dev.alloc_at(&BufferDesc::new(LEN).tag("fixed-again"), s) {
        Ok(h) => h,
        Err(AllocError::FixedAddressUnsupported) => {
            let _ = dev.wait(f, GUARD_NS);
            let _ = dev.free(out);
            skip!(d, "MMU bypassed: a GPU address is the memory's own")
        }
        Err(e) => fail!(d, "alloc at {s:#x}: {e}"),
    };
    check!(
        d,
        !matches!(dev.query(f), Ok(FenceStatus::Pending)),
        "{s:#x} given out again while the copy reading it was in flight"
    );
    check!(d, dev.va(h) == Ok(s), "asked for {s:#x}, got {:?}", dev.va(h));
    wait(dev, f, d)?;
    expect_words(dev, out, WORDS, d, |i| pattern(i, 0xF1ED))?;
    let g = submit(dev, QueueId::COPY, &[], d, |cb| cb.fill(s, LEN, 0x600D_F1ED))?;
    wait(dev, g, d)?;
    expect_words(dev, h, WORDS, d, |_| 0x600D_F1ED)?;
    let live = dev.alloc_at(&BufferDesc::new(4096), s + 8192);
    check!(d, live == Err(AllocError::AddressInUse { at: s + 8192 }), "inside a live buffer: {live:?}");
    let odd = dev.alloc_at(&BufferDesc::new(4096), o + LEN + 128);
    check!(d, odd == Err(AllocError::AddressUnaligned { at: o + LEN + 128 }), "misaligned: {odd:?}");
    let _ = d.write_str(if in_flight {
        "waited for the copy still reading the range"
    } else {
        "the copy had ended before the request"
    });
    free(dev, h, d)?;
    free(dev, out, d)
}

/// Ten thousand buffers across the size classes, in waves, a GPU job over
/// each (one FILL per buffer), every buffer's first and last dword checked.
fn many_small_buffers<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    _: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    const TOTAL: usize = 10_000;
    const WAVE: usize = 250;
    fn size_of(i: usize) -> u64 {
        match i % 10 {
            0..=3 => [64, 128, 400, 1000][i % 4],
            4..=8 => [1024, 3000, 8192, 16384, 65536][i % 5],
            _ => 70_000 + (i % 3) as u64 * 4096,
        }
    }
    let before = dev.buffer_stats().pool;
    let live_before = dev.buffer_stats().live;
    let mut done = 0usize;
    while done < TOTAL {
        let mut wave = [None::<(BufferHandle, u64, u64)>; WAVE];
        for (k, slot) in wave.iter_mut().enumerate() {
            let i = done + k;
            let size = size_of(i);
            let (h, va) = alloc(dev, size, d)?;
            *slot = Some((h, va, size));
        }
        let seed = done as u32;
        let f = submit(dev, QueueId::COPY, &[], d, |cb| {
            for (k, b) in wave.iter().enumerate() {
                if let Some((_, va, size)) = b {
                    cb.fill(*va, size & !3, seed ^ k as u32)?;
                }
            }
            Ok(())
        })?;
        wait(dev, f, d)?;
        for (k, b) in wave.iter().enumerate() {
            let Some((h, _, size)) = *b else { continue };
            let last = (size / 4 - 1) as usize;
            for idx in [0usize, last] {
                match dev.read_u32(h, idx as u64) {
                    Ok(v) if v == seed ^ k as u32 => {}
                    Ok(v) => fail!(d, "buffer {} of wave {done}: word {idx} = {v:#x}", k),
                    Err(e) => fail!(d, "read: {e}"),
                }
            }
            free(dev, h, d)?;
        }
        done += WAVE;
    }
    let after = dev.buffer_stats().pool;
    let blocks = after.blocks_acquired.saturating_sub(before.blocks_acquired);
    // Small and medium buffers are slots of slabs: far fewer platform
    // blocks than buffers (large ones take one each: a tenth).
    check!(d, blocks < (TOTAL / 5) as u64, "{blocks} platform blocks for {TOTAL} buffers: slabs not reused");
    check!(d, dev.buffer_stats().live == live_before, "buffers left live");
    Ok(())
}

/// Local memory and eviction (`docs/memory.md`, section 5b): a working set
/// of three times local memory, in buffers that prefer local memory, is
/// filled and read back with every word checked while the driver evicts
/// and restores under it; a cyclic pattern over one buffer more than fits
/// stays within the policy's bound of moves; a submission whose local
/// working set exceeds local memory is refused.
fn local_memory<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    _: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    let Some(lm) = dev.local_memory() else {
        skip!(d, "no local memory here (gen1, MMU bypassed, or kernel mode)");
    };
    let piece = (lm.size / 4) & !0xFFF;
    const N: usize = 12;
    let s0 = dev.stats();
    let (back, bv) = alloc(dev, piece, d)?;
    let mut slots: [Option<(BufferHandle, u64)>; N] = [None; N];
    for b in slots.iter_mut() {
        *b = Some(alloc_with(dev, &BufferDesc::new(piece).local().tag("working-set"), d)?);
    }
    let bufs = slots.map(|b| b.unwrap_or((back, bv)));
    // Fill each (its own value), then read each back through system memory.
    for (i, (h, va)) in bufs.iter().enumerate() {
        let uses = [BufferUse::write(*h)];
        let filled = dev.submit_with(&Submit::on(QueueId::COPY).using(&uses), |cb| {
            cb.fill(*va, piece, 0x1000 + i as u32)
        });
        let f = tried!(d, filled, "fill {i}");
        wait(dev, f, d)?;
    }
    for (i, (h, va)) in bufs.iter().enumerate() {
        let uses = [BufferUse::read(*h), BufferUse::write(back)];
        let copied = dev.submit_with(&Submit::on(QueueId::COPY).using(&uses), |cb| cb.copy(*va, bv, piece));
        let f = tried!(d, copied, "read back {i}");
        wait(dev, f, d)?;
        let want = 0x1000 + i as u32;
        let last = piece / 4 - 1;
        for w in [0, last / 2, last] {
            let got = dev.read_u32(back, w);
            check!(d, got == Ok(want), "buffer {i} word {w}: {got:?}, expected {want:#x}");
        }
    }
    let s1 = dev.stats();
    check!(
        d,
        s1.evictions > s0.evictions && s1.restores > s0.restores,
        "no eviction or restore happened: {s1:?}"
    );
    // Thrash: five buffers (one more than fits), touched in turn.
    let subs = 40u64;
    for k in 0..subs as usize {
        let (h, va) = bufs[k % 5];
        let uses = [BufferUse::write(h)];
        let filled =
            dev.submit_with(&Submit::on(QueueId::COPY).using(&uses), |cb| cb.fill(va, 256, k as u32));
        wait(dev, tried!(d, filled, "thrash step {k}"), d)?;
    }
    let s2 = dev.stats();
    let moves = (s2.evictions - s1.evictions) + (s2.restores - s1.restores);
    let window = u64::from(dev.config().local_min_residency.max(1));
    let bound = 5 * (subs / window + 1);
    check!(d, moves <= bound, "{moves} moves for {subs} cyclic submissions over 5 buffers, bound {bound}");
    // A working set larger than local memory is refused.
    let uses: [BufferUse; 5] = core::array::from_fn(|i| BufferUse::read(bufs[i].0));
    match dev.submit_with(&Submit::on(QueueId::COPY).using(&uses), |cb| cb.fill(bv, 64, 0)) {
        Err(SubmitError::WorkingSetTooLarge { .. }) => {}
        other => fail!(d, "a working set of 5/4 of local memory: {other:?}"),
    }
    let _ = write!(d, "{moves} moves in the cyclic phase (bound {bound})");
    for (h, _) in bufs {
        free(dev, h, d)?;
    }
    free(dev, back, d)
}

/// Events across queues (`docs/architecture.md`, "Validation, fault
/// reports and events"): COPY fills a buffer
/// and sets an event; COMPUTE, submitted after it with no fence between
/// them, waits for the event on the GPU and copies the buffer; the CPU
/// waits for the same event, resets it, and unblocks GFX work waiting for a
/// second event by setting it from the host. GPU timestamps around the
/// work are nanoseconds in order. A destroyed event is refused.
fn events<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    _: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    const N: u64 = 4096;
    let (src, s) = alloc(dev, N, d)?;
    let (dst, t) = alloc(dev, N, d)?;
    let (Ok(ev), Ok(host_ev)) = (dev.create_event(), dev.create_event()) else { fail!(d, "create_event") };
    let (Ok(t0), Ok(t1)) = (dev.create_timestamp(), dev.create_timestamp()) else {
        fail!(d, "create_timestamp")
    };
    check!(d, dev.event_is_set(ev) == Ok(false), "a new event is set");
    let producer = submit(dev, QueueId::COPY, &[], d, |cb| {
        cb.push(&t0.write())?;
        cb.fill(s, N, 0x5EED_0001)?;
        cb.push(&ev.set())
    })?;
    let consumer = submit(dev, QueueId::COMPUTE, &[], d, |cb| {
        cb.push(&ev.wait())?;
        cb.copy(s, t, N)?;
        cb.push(&t1.write())
    })?;
    if let Err(e) = dev.wait_event(ev, GUARD_NS) {
        fail!(d, "host wait for the GPU-set event: {e}");
    }
    wait(dev, producer, d)?;
    wait(dev, consumer, d)?;
    let mut got = [0u8; 4];
    let _ = dev.read(dst, N - 4, &mut got);
    check!(
        d,
        u32::from_le_bytes(got) == 0x5EED_0001,
        "COMPUTE copied {:#x} before the event",
        u32::from_le_bytes(got)
    );
    match (dev.timestamp_ns(t0), dev.timestamp_ns(t1)) {
        (Ok(Some(a)), Ok(Some(b))) => check!(d, b >= a, "timestamps out of order: {a} then {b}"),
        other => fail!(d, "timestamps not written: {other:?}"),
    }
    check!(d, dev.reset_event(ev).is_ok() && dev.event_is_set(ev) == Ok(false), "host reset");
    // GPU work waiting for an event the host sets.
    let gated = submit(dev, QueueId::GFX, &[], d, |cb| {
        cb.push(&host_ev.wait())?;
        cb.write_data(t, &[0xABCD])
    })?;
    check!(
        d,
        dev.query(gated) == Ok(FenceStatus::Pending) || dev.mode() == Mode::Kernel,
        "ran before the event"
    );
    check!(d, dev.set_event(host_ev).is_ok(), "host set");
    wait(dev, gated, d)?;
    check!(d, dev.read_u32(dst, 0) == Ok(0xABCD), "the host-gated write");
    for e in [ev, host_ev] {
        check!(d, dev.destroy_event(e).is_ok(), "destroy");
    }
    check!(d, dev.set_event(ev) == Err(umd_core::mem::BufferError::Stale), "a destroyed event was accepted");
    let _ = (dev.destroy_timestamp(t0), dev.destroy_timestamp(t1));
    free(dev, src, d)?;
    free(dev, dst, d)
}

/// DISPATCH on the GFX queue, whose engine does not run it
/// (`docs/refgpu.md` sections 1 and 4.4). With the validation mode (where
/// compiled in) the submission is refused before it reaches the GPU,
/// naming the packet and the queue; with it off it is submitted, the
/// engine stops on it with INVALID_PACKET, its fence fails with that
/// fault (in kernel mode: fails; the details are in the devcoredump), the
/// destination is untouched and the queue runs again afterwards.
fn dispatch_on_wrong_queue<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    _: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    const N: u32 = 64;
    let (buf, v) = alloc(dev, 4096, d)?;
    fill(dev, buf, 3 * N as usize, |i| i as u32, d)?;
    let dispatch = Command::Dispatch {
        op: DispatchOp::AddU32,
        a: v,
        b: v + 4 * u64::from(N),
        dst: v + 8 * u64::from(N),
        count: N,
        scalar_bits: 0,
    };
    let was_validating = dev.validation();
    if dev.set_validation(true).is_ok() {
        let r = dev.submit(QueueId::GFX, &[], |cb| cb.push(&dispatch));
        let _ = dev.set_validation(was_validating);
        match r {
            Err(SubmitError::Invalid(e)) => {
                check!(
                    d,
                    e.packet == 0 && e.opcode == umd_core::hw::PacketKind::Dispatch,
                    "refused at packet {} ({})",
                    e.packet,
                    e.opcode.name()
                );
                check!(
                    d,
                    e.problem == umd_core::engine::validate::Problem::WrongEngine { queue: QueueId::GFX },
                    "validation found {:?}, expected the wrong engine",
                    e.problem
                );
            }
            other => fail!(d, "validation let DISPATCH on GFX through: {other:?}"),
        }
    }
    let f = submit_unvalidated(dev, QueueId::GFX, d, |cb| cb.push(&dispatch))?;
    match dev.wait(f, GUARD_NS) {
        Err(WaitError::Failed(FenceError::Fault(info))) => {
            check!(d, info.kind == FaultKind::InvalidPacket, "fault kind {:?}", info.kind);
            let Some(r) = dev.last_hang() else { fail!(d, "no fault report") };
            check!(d, r.queue == QueueId::GFX, "fault reported on {}", r.queue);
        }
        Err(WaitError::Failed(_)) if dev.mode() == Mode::Kernel => {}
        other => fail!(d, "expected an INVALID_PACKET fault, got {other:?}"),
    }
    // The engine stopped before the packet had any effect: A, B and DST
    // hold what was written.
    let bad = tried!(d, first_mismatch(dev, buf, 3 * N as usize, |i| i as u32), "read {buf}");
    if let Some((i, got, want)) = bad {
        fail!(d, "DISPATCH on GFX changed dword {i}: {got:#x}, was {want:#x}");
    }
    // The queue works again.
    let g = submit(dev, QueueId::GFX, &[], d, |cb| cb.fill(v, 64, 7))?;
    wait(dev, g, d)?;
    free(dev, buf, d)
}

/// An overrun that becomes a hang (`docs/architecture.md`, "Validation,
/// fault reports and events"): a DMA_COPY whose size disagrees with
/// its source buffer's real size runs past the allocation into unmapped
/// memory. With the validation mode (where compiled in) the submission is
/// refused, naming the packet, the field, the buffer and the overrun; with
/// it off the device faults and the report names the buffer nearest the
/// fault address.
fn dma_overrun<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    _: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    const WEIGHTS: u64 = 128 << 10;
    const SPAN: u64 = 2 << 20;
    if !dev.mmu_enabled() {
        skip!(d, "MMU bypassed on this device: an overrun reaches memory instead of faulting");
    }
    let was_validating = dev.validation();
    let (dst, t) = alloc(dev, WEIGHTS, d)?;
    // Make room: a free 2 MiB-aligned span, so nothing is mapped right after
    // the buffer (a buffer freed before any use is unmapped at once).
    let (hole, _) = alloc_with(dev, &BufferDesc::new(SPAN).align(SPAN).declared(), d)?;
    free(dev, hole, d)?;
    let (weights, w) = alloc_with(dev, &BufferDesc::new(WEIGHTS).align(SPAN).tag("weights"), d)?;
    // The size field says WEIGHTS, but the copy starts 16 bytes in.
    let bad = |cb: &mut Recorder<'_>| cb.copy(w + 16, t, WEIGHTS);
    if dev.set_validation(true).is_ok() {
        let r = dev.submit(QueueId::COPY, &[], bad);
        match r {
            Err(SubmitError::Invalid(e)) => {
                check!(
                    d,
                    e.packet == 0 && e.field == umd_core::hw::Field::Src,
                    "refused at packet {} field {}",
                    e.packet,
                    e.field.name()
                );
                match e.problem {
                    umd_core::engine::validate::Problem::Overrun { buffer } => {
                        check!(d, buffer.tag == "weights", "names buffer '{}'", buffer.tag);
                        check!(d, e.overrun() == 16, "overrun of {} bytes, expected 16", e.overrun());
                    }
                    p => fail!(d, "validation found {p:?}, expected an overrun"),
                }
            }
            other => fail!(d, "validation let the overrun through: {other:?}"),
        }
        // A correct copy passes validation.
        let ok = submit(dev, QueueId::COPY, &[], d, |cb| cb.copy(w, t, WEIGHTS))?;
        wait(dev, ok, d)?;
    }
    let _ = dev.set_validation(false);
    let f = submit(dev, QueueId::COPY, &[], d, bad)?;
    let r = dev.wait(f, GUARD_NS);
    let _ = dev.set_validation(was_validating);
    match r {
        Err(WaitError::Failed(FenceError::Fault(info))) => {
            check!(d, info.addr >= w + WEIGHTS, "fault at {:#x}, inside the buffer", info.addr);
            let Some(report) = dev.last_hang() else { fail!(d, "no fault report") };
            let Some(near) = report.near else { fail!(d, "the report names no buffer") };
            check!(
                d,
                near.tag == "weights" && !near.freed,
                "the report names '{}' (freed: {})",
                near.tag,
                near.freed
            );
            check!(d, near.addr >= near.va + near.size, "the fault is not past the buffer: {near}");
        }
        Err(WaitError::Failed(e)) if dev.mode() == Mode::Kernel => {
            // A kernel without fault details for this context reports a
            // hang; the failure itself is what matters.
            let _ = e;
        }
        other => fail!(d, "expected a fault past the buffer, got {other:?}"),
    }
    free(dev, weights, d)?;
    free(dev, dst, d)
}

/// A producer that hangs fails its consumer on another queue (already on
/// the GPU) with a cause naming it, and a later submission that waits on
/// either is refused before it reaches the GPU.
fn failure_propagates<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    _: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    let (buf, b) = alloc(dev, 4096, d)?;
    let stuck = submit(dev, QueueId::COMPUTE, &[], d, |cb| {
        cb.push(&Command::WaitMem {
            addr: b,
            reference: 0xDEAD,
            mask: u64::MAX,
            op: CompareOp::Eq,
            wide: true,
        })
    })?;
    let consumer = submit(dev, QueueId::COPY, &[stuck], d, |cb| cb.write_data(b + 256, &[0xC0]))?;
    match dev.wait(consumer, GUARD_NS) {
        Err(WaitError::Failed(FenceError::Dependency { producer, cause: Cause::Hung })) => {
            check!(d, producer == stuck.id, "failure names {producer}, expected {}", stuck.id);
        }
        other => fail!(d, "consumer of a hung producer: expected a dependency failure, got {other:?}"),
    }
    check!(
        d,
        dev.query(stuck) == Ok(FenceStatus::Failed(FenceError::DeviceHung)),
        "the producer is not failed"
    );
    for (waits_on, what) in [(stuck, "producer"), (consumer, "consumer")] {
        match dev.submit(QueueId::GFX, &[waits_on], |cb| cb.write_data(b + 512, &[1])) {
            Err(SubmitError::DependencyFailed { fence, .. }) => {
                check!(d, fence == waits_on, "refusal names {fence}");
            }
            other => fail!(d, "a submission waiting on the failed {what}: {other:?}"),
        }
    }
    // Every queue works again.
    for q in [QueueId::GFX, QueueId::COMPUTE, QueueId::COPY] {
        let f = submit(dev, q, &[], d, |cb| cb.write_data(b + 1024, &[7]))?;
        wait(dev, f, d)?;
    }
    free(dev, buf, d)
}

/// A cancelled fence reports its failure however many resets follow, and
/// successful work between the resets stays successful.
fn history_survives_resets<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    _: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    if !dev.mmu_enabled() {
        skip!(d, "MMU bypassed on this device: no faults to take");
    }
    const RESETS: usize = 40;
    let (dst, t) = alloc(dev, 4096, d)?;
    let fault = |dev: Dev<'_, '_, B, C>, d: &mut Detail| -> Result<Fence, Stop> {
        let f = submit_unvalidated(dev, QueueId::COPY, d, |cb| cb.copy(UNMAPPED, t, 64))?;
        match dev.wait(f, GUARD_NS) {
            Err(WaitError::Failed(_)) => Ok(f),
            other => fail!(d, "expected a fault, got {other:?}"),
        }
    };
    let first = fault(dev, d)?;
    let ok = submit(dev, QueueId::COPY, &[], d, |cb| cb.write_data(t, &[1]))?;
    wait(dev, ok, d)?;
    for _ in 0..RESETS {
        fault(dev, d)?;
    }
    check!(
        d,
        matches!(dev.query(first), Ok(FenceStatus::Failed(_))),
        "the first cancelled fence forgot its failure after {RESETS} resets: {:?}",
        dev.query(first)
    );
    check!(
        d,
        dev.query(ok) == Ok(FenceStatus::Signalled),
        "successful work turned failed: {:?}",
        dev.query(ok)
    );
    match dev.submit(QueueId::GFX, &[first], |cb| cb.barrier()) {
        Err(SubmitError::DependencyFailed { .. }) => {}
        other => fail!(d, "a wait on the first cancelled fence: {other:?}"),
    }
    free(dev, dst, d)
}

/// A queue waiting on a fence that is not submitted yet is blocked, not
/// hung: longer than a hang window passes, then the producer comes.
fn wait_before_signal<B: Backend, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    _: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    let (buf, b) = alloc(dev, 4096, d)?;
    let resets = dev.stats().resets;
    let Some(future) = dev.next_fence(QueueId::COPY) else { fail!(d, "no COPY queue") };
    let consumer = submit(dev, QueueId::COMPUTE, &[future], d, |cb| cb.write_data(b, &[0xAF7E]))?;
    // One and a half hang windows of servicing (the wait runs the hang
    // check) with the producer missing.
    let window = dev.hang_config().window_ns;
    match dev.wait(consumer, window + window / 2) {
        Err(WaitError::Timeout) => {}
        other => fail!(d, "the blocked consumer: expected a timeout, got {other:?}"),
    }
    check!(d, dev.stats().resets == resets, "a blocked queue was reset as hung");
    let producer = submit(dev, QueueId::COPY, &[], d, |cb| cb.write_data(b + 4, &[0xF00D]))?;
    check!(d, producer == future, "producer fence {producer}, expected {future}");
    wait(dev, consumer, d)?;
    expect_words(dev, buf, 2, d, |i| if i == 0 { 0xAF7E } else { 0xF00D })?;
    free(dev, buf, d)
}

/// Four threads submit to random queues with random waits on each other's
/// fences while one more allocates and frees buffers; every job's output
/// is checked and no fence is lost.
fn multi_submitter<B: Backend + Sync, const C: usize>(
    dev: Dev<'_, '_, B, C>,
    env: &Env<'_>,
    d: &mut Detail,
) -> Result<(), Stop> {
    const THREADS: usize = 4;
    const JOBS: usize = 300;
    let Some(par) = env.parallel else {
        skip!(d, "no threads on this platform (single core, no scheduler)");
    };
    let (buf, b) = alloc(dev, (THREADS * JOBS * 4) as u64, d)?;
    // The latest fence each thread published per queue (seqno + 1; 0:
    // none; the scenario's sequence numbers stay far below 2^32).
    let published: [[AtomicU32; 3]; THREADS] = Default::default();
    let errors = AtomicU32::new(0);
    // The first error's message, as an index into MESSAGES (+1; 0: none).
    const MESSAGES: [&str; 5] = [
        "free during churn failed",
        "alloc during churn failed",
        "a submission failed",
        "a wait failed",
        "a final wait failed",
    ];
    let first = AtomicU32::new(0);
    let note = |m: u32| {
        errors.fetch_add(1, Ordering::Relaxed);
        let _ = first.compare_exchange(0, m + 1, Ordering::AcqRel, Ordering::Acquire);
    };
    let stop = AtomicBool::new(false);
    let queues = [QueueId::GFX, QueueId::COMPUTE, QueueId::COPY];
    par.run(THREADS + 1, &|t| {
        if t == THREADS {
            // Allocation churn next to the submitters.
            let mut n = 0u64;
            while !stop.load(Ordering::Acquire) && n < 2000 {
                // Declared tracking: never used by the GPU, so freed at once.
                match dev.alloc(&BufferDesc::new(256 + (n % 7) * 512).declared().tag("churn")) {
                    Ok(h) => {
                        if dev.free(h).is_err() {
                            note(0);
                        }
                    }
                    Err(_) => {
                        note(1);
                    }
                }
                n += 1;
            }
            return;
        }
        let mut rng = Rng(0xC0FF_EE00 + t as u64);
        let mut mine: [Option<Fence>; 3] = [None; 3];
        for j in 0..JOBS {
            let qi = rng.below(3) as usize;
            let q = queues[qi];
            // Wait on another thread's latest fence on another queue.
            let mut waits = [None; 1];
            let other = rng.below(THREADS as u64) as usize;
            let oq = rng.below(3) as usize;
            if oq != qi {
                let s = published[other][oq].load(Ordering::Acquire);
                if s > 0 {
                    if let Some(last) = dev.last_emitted(queues[oq]) {
                        waits[0] = Some(Fence {
                            id: umd_core::sync::FenceId::new(queues[oq], u64::from(s - 1)),
                            ..last
                        });
                    }
                }
            }
            let w: &[Fence] = match &waits[0] {
                Some(f) => core::slice::from_ref(f),
                None => &[],
            };
            let word = (t * JOBS + j) as u64;
            match dev.submit(q, w, |cb| cb.write_data(b + 4 * word, &[word as u32 ^ 0x3C3C])) {
                Ok(f) => {
                    published[t][qi].store(f.seqno().0 as u32 + 1, Ordering::Release);
                    mine[qi] = Some(f);
                }
                Err(_) => {
                    note(2);
                }
            }
            if j % 50 == 49 {
                if let Some(f) = mine[qi] {
                    if dev.wait(f, GUARD_NS).is_err() {
                        note(3);
                    }
                }
            }
        }
        for f in mine.iter().flatten() {
            if dev.wait(*f, GUARD_NS).is_err() {
                note(4);
            }
        }
    });
    stop.store(true, Ordering::Release);
    let e = errors.load(Ordering::Relaxed);
    let msg = first
        .load(Ordering::Acquire)
        .checked_sub(1)
        .and_then(|i| MESSAGES.get(i as usize))
        .copied()
        .unwrap_or("");
    check!(d, e == 0, "{e} errors in the threads, first: {msg}");
    expect_words(dev, buf, THREADS * JOBS, d, |i| i as u32 ^ 0x3C3C)?;
    free(dev, buf, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(r: Result<u32, &'static str>, d: &mut Detail) -> Result<u32, Stop> {
        Ok(tried!(d, r, "step {}", 3))
    }

    #[test]
    fn tried_passes_values_and_names_failures() {
        let mut d = Detail::new();
        assert_eq!(attempt(Ok(7), &mut d), Ok(7));
        assert_eq!(d.as_str(), "");
        assert_eq!(attempt(Err("refused"), &mut d), Err(Stop::Fail));
        assert_eq!(d.as_str(), "step 3: refused");
    }
}
