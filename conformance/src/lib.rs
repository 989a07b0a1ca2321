//! The conformance suite: scenarios written once (`no_std`, no allocator)
//! and run on every direct-mode platform: the in-process model, Linux
//! co-simulation against `refgpu-sim`, and bare metal under QEMU.
//!
//! Each scenario takes a freshly probed [`Device`] and returns a
//! [`ScenarioResult`]: pass, fail with a reason, or skip with the reason it
//! cannot run on this platform (a scenario never passes silently). The
//! scenarios: data correctness, fence order, IB chaining, ring
//! wrap-around, a copy -> compute -> copy pipeline over three queues with
//! semaphores, deadlock rejection, page faults, hang recovery, IB pool
//! exhaustion, the gen2 misaligned-fence rule, and a seeded stress run.
//!
//! Run them with [`run_all`] on a device made with [`SUITE_CONFIG`] and
//! [`SUITE_MMU`]; every wait has a generous failure guard ([`GUARD_NS`]),
//! never a performance threshold.
#![no_std]

pub mod bringup;

use core::fmt::{self, Write};

use umd_core::cmd::{Command, CompareOp, DispatchOp, EncodeError};
use umd_core::config::{Config, HangConfig, PoolExhaustion};
use umd_core::debug::HangReason;
use umd_core::device::{Device, GpuBuffer, MmuMode};
use umd_core::hw::Generation;
use umd_core::platform::DirectIo;
use umd_core::queue::{FenceStatus, SubmitError, WaitError};
use umd_core::sync::{Access, FaultKind, Fence, FenceError, FenceId, QueueId};

/// Graphics queue.
pub const GFX: QueueId = QueueId(0);
/// Compute queue (the only one that runs DISPATCH).
pub const COMPUTE: QueueId = QueueId(1);
/// Copy queue.
pub const COPY: QueueId = QueueId(2);

/// Failure guard for one wait: far beyond any expected time, so a slow
/// platform (QEMU under TCG) never fails for being slow.
pub const GUARD_NS: u64 = 30_000_000_000;

/// IB chunks of the suite's device.
pub const SUITE_CHUNKS: usize = 16;

/// The suite's configuration: small chunks and rings so chaining and
/// wrap-around happen quickly, and a 1 s hang window: short enough that the
/// hang scenario is quick, long enough that an engine thread starved on a
/// loaded host (or a slow TCG guest) is not mistaken for a hang.
pub const SUITE_CONFIG: Config = Config {
    ib_chunk_bytes: 4096,
    ring_bytes: 16 * 1024,
    hang: HangConfig { window_ns: 1_000_000_000, min_progress_bytes: 16, max_windows_without_fence: 4 },
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
    /// Why it failed or was skipped (empty on a pass).
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

/// A scenario's body: `Err` carries the failure (or skip) text.
type Body<P, const C: usize> = fn(&mut Device<P, C>, &mut Detail) -> Result<(), Stop>;

/// Why a scenario body stopped early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// A check failed (text in the detail).
    Fail,
    /// The platform cannot run it (text in the detail).
    Skip,
}

/// One scenario.
pub struct Scenario<P: DirectIo, const C: usize> {
    /// Name, stable across platforms (the harnesses key results by it).
    pub name: &'static str,
    body: Body<P, C>,
}

impl<P: DirectIo, const C: usize> Scenario<P, C> {
    /// Runs it.
    pub fn run(&self, dev: &mut Device<P, C>) -> ScenarioResult {
        let mut detail = Detail::new();
        let outcome = match (self.body)(dev, &mut detail) {
            Ok(()) => Outcome::Pass,
            Err(Stop::Fail) => Outcome::Fail,
            Err(Stop::Skip) => Outcome::Skip,
        };
        ScenarioResult { name: self.name, outcome, detail }
    }
}

/// Every scenario, in a fixed order.
pub fn scenarios<P: DirectIo, const C: usize>() -> [Scenario<P, C>; 11] {
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
    ]
}

/// Names of every scenario (for harnesses that enumerate results).
pub const SCENARIO_NAMES: [&str; 11] = [
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
];

/// Runs every scenario on `dev`, handing each result to `out`.
pub fn run_all<P: DirectIo, const C: usize>(dev: &mut Device<P, C>, mut out: impl FnMut(ScenarioResult)) {
    for s in scenarios::<P, C>() {
        out(s.run(dev));
    }
}

// ----- helpers -------------------------------------------------------------

macro_rules! fail {
    ($d:expr, $($arg:tt)*) => {{
        let _ = write!($d, $($arg)*);
        return Err(Stop::Fail);
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

fn alloc<P: DirectIo, const C: usize>(
    dev: &mut Device<P, C>,
    len: usize,
    d: &mut Detail,
) -> Result<GpuBuffer, Stop> {
    match dev.alloc_buffer(len) {
        Ok(b) => Ok(b),
        Err(e) => fail!(d, "alloc {len}: {e}"),
    }
}

fn submit<P: DirectIo, const C: usize, F>(
    dev: &mut Device<P, C>,
    q: QueueId,
    waits: &[Fence],
    d: &mut Detail,
    f: F,
) -> Result<Fence, Stop>
where
    F: for<'a, 's, 'b> FnOnce(&mut umd_core::device::Recorder<'a, 's, 'b, C>) -> Result<(), EncodeError>,
{
    match dev.submit(q, waits, f) {
        Ok(fence) => Ok(fence),
        Err(e) => fail!(d, "submit on {q}: {e}"),
    }
}

fn wait<P: DirectIo, const C: usize>(dev: &mut Device<P, C>, f: Fence, d: &mut Detail) -> Result<(), Stop> {
    match dev.wait(f, GUARD_NS) {
        Ok(()) => Ok(()),
        Err(e) => fail!(d, "wait {f}: {e}"),
    }
}

/// Checks `n` dwords of `buf` against `want(i)`.
fn expect_words<P: DirectIo, const C: usize>(
    dev: &mut Device<P, C>,
    buf: &GpuBuffer,
    n: usize,
    d: &mut Detail,
    want: impl Fn(usize) -> u32,
) -> Result<(), Stop> {
    dev.invalidate(buf);
    for i in 0..n {
        let got = buf.read_u32(i);
        check!(d, got == Some(want(i)), "word {i}: got {got:#x?}, want {:#x}", want(i));
    }
    Ok(())
}

// ----- scenarios -----------------------------------------------------------

fn copy_fill_write<P: DirectIo, const C: usize>(dev: &mut Device<P, C>, d: &mut Detail) -> Result<(), Stop> {
    for (k, q) in [GFX, COMPUTE, COPY].into_iter().enumerate() {
        let seed = 0x1234_5678 ^ k as u32;
        let mut src = alloc(dev, 16384, d)?;
        let mut dst = alloc(dev, 16384, d)?;
        for (i, w) in src.words_mut().iter_mut().enumerate() {
            *w = pattern(i, seed);
        }
        dst.words_mut().fill(0xDEAD_BEEF);
        dev.flush(&src);
        dev.flush(&dst);
        let (s, t) = (src.va(), dst.va());
        let f = submit(dev, q, &[], d, |cb| {
            cb.copy(s, t, 8192)?;
            cb.fill(t + 8192, 4096, 0xA5A5_A5A5)?;
            cb.write_data(t + 12288, &[1, 2, 3, 4])
        })?;
        wait(dev, f, d)?;
        expect_words(dev, &dst, 3076, d, |i| match i {
            0..=2047 => pattern(i, seed),
            2048..=3071 => 0xA5A5_A5A5,
            _ => (i - 3071) as u32,
        })?;
        dev.free_buffer(src);
        dev.free_buffer(dst);
    }
    Ok(())
}

fn fences_in_order<P: DirectIo, const C: usize>(dev: &mut Device<P, C>, d: &mut Detail) -> Result<(), Stop> {
    let buf = alloc(dev, 4096, d)?;
    let b = buf.va();
    let mut fences = [None; 64];
    for (i, slot) in fences.iter_mut().enumerate() {
        // Each job writes a timestamp: in-order execution means they never decrease.
        *slot = Some(submit(dev, GFX, &[], d, |cb| cb.timestamp(b + 8 * i as u64))?);
    }
    let last = fences[63].ok_or(Stop::Fail)?;
    wait(dev, last, d)?;
    let mut prev_seq = 0;
    for f in fences.iter().flatten() {
        check!(d, dev.query(*f) == Ok(FenceStatus::Signalled), "fence {f} not signalled after the last one");
        check!(d, f.seqno().0 > prev_seq, "seqnos not increasing at {f}");
        prev_seq = f.seqno().0;
    }
    dev.invalidate(&buf);
    let mut prev = 0u64;
    for i in 0..64 {
        let t = u64::from(buf.read_u32(2 * i).unwrap_or(0))
            | (u64::from(buf.read_u32(2 * i + 1).unwrap_or(0)) << 32);
        check!(d, t >= prev && t != 0, "timestamp {i} = {t} after {prev}: not in order");
        prev = t;
    }
    dev.free_buffer(buf);
    Ok(())
}

fn ib_chaining<P: DirectIo, const C: usize>(dev: &mut Device<P, C>, d: &mut Detail) -> Result<(), Stop> {
    let buf = alloc(dev, 3000 * 4, d)?;
    let b = buf.va();
    // 3000 WRITE_DATA packets of 4 dwords each: ~60 KB of commands through
    // 4 KiB chunks, so the buffer is chained over about 15 chunks.
    let f = submit(dev, COPY, &[], d, |cb| {
        for i in 0..3000u64 {
            cb.write_data(b + 4 * i, &[pattern(i as usize, 0xC4A1)])?;
        }
        Ok(())
    })?;
    wait(dev, f, d)?;
    expect_words(dev, &buf, 3000, d, |i| pattern(i, 0xC4A1))?;
    dev.free_buffer(buf);
    Ok(())
}

fn ring_wraparound<P: DirectIo, const C: usize>(dev: &mut Device<P, C>, d: &mut Detail) -> Result<(), Stop> {
    let buf = alloc(dev, 4096, d)?;
    let b = buf.va();
    let wraps0 = dev.stats().ring_wraps;
    // Each submission puts ~36 bytes in a 16 KiB ring: 1200 of them wrap it
    // at least twice, at shifting offsets.
    let mut last = None;
    for i in 0..1200u64 {
        let f = submit(dev, COMPUTE, &[], d, |cb| cb.write_data(b + 4 * (i % 1024), &[i as u32]))?;
        if i % 100 == 99 {
            wait(dev, f, d)?;
        }
        last = Some(f);
    }
    wait(dev, last.ok_or(Stop::Fail)?, d)?;
    let wraps = dev.stats().ring_wraps.saturating_sub(wraps0);
    check!(d, wraps >= 2, "ring wrapped {wraps} times, expected at least 2");
    expect_words(dev, &buf, 1024, d, |i| if i < 1200 - 1024 { (i + 1024) as u32 } else { i as u32 })?;
    dev.free_buffer(buf);
    Ok(())
}

/// `scalar * a + b` exactly as the spec says (product rounded, then sum).
fn saxpy(scalar: f32, a: f32, b: f32) -> f32 {
    let p = core::hint::black_box(scalar * a);
    p + b
}

fn pipeline<P: DirectIo, const C: usize>(dev: &mut Device<P, C>, d: &mut Detail) -> Result<(), Stop> {
    const N: usize = 1024;
    let mut input = alloc(dev, 2 * N * 4, d)?;
    let staging = alloc(dev, 2 * N * 4, d)?;
    let result = alloc(dev, N * 4, d)?;
    let out = alloc(dev, N * 4, d)?;
    let a = |i: usize| (i as f32) * 0.5 - 100.0;
    let bv = |i: usize| 1.0 / ((i as f32) + 1.0);
    for (i, w) in input.words_mut().iter_mut().enumerate() {
        *w = if i < N { a(i).to_bits() } else { bv(i - N).to_bits() };
    }
    dev.flush(&input);
    let (inp, stg, res, o) = (input.va(), staging.va(), result.va(), out.va());
    let n4 = (N * 4) as u64;
    // COPY: stage both inputs. COMPUTE (waits COPY): SAXPY. GFX (waits COMPUTE): copy out.
    let c1 = submit(dev, COPY, &[], d, |cb| cb.copy(inp, stg, 2 * n4))?;
    let c2 = submit(dev, COMPUTE, &[c1], d, |cb| {
        cb.dispatch(DispatchOp::SaxpyF32, stg, stg + n4, res, N as u32, 2.5)
    })?;
    let c3 = submit(dev, GFX, &[c2], d, |cb| cb.copy(res, o, n4))?;
    wait(dev, c3, d)?;
    check!(d, dev.query(c1) == Ok(FenceStatus::Signalled), "copy fence not signalled before the final one");
    check!(
        d,
        dev.query(c2) == Ok(FenceStatus::Signalled),
        "compute fence not signalled before the final one"
    );
    expect_words(dev, &out, N, d, |i| saxpy(2.5, a(i), bv(i)).to_bits())?;
    for b in [input, staging, result, out] {
        dev.free_buffer(b);
    }
    Ok(())
}

fn deadlock_rejected<P: DirectIo, const C: usize>(
    dev: &mut Device<P, C>,
    d: &mut Detail,
) -> Result<(), Stop> {
    let Some(copy_last) = dev.last_emitted(COPY) else { fail!(d, "no COPY queue") };
    // COMPUTE waits for COPY's next fence (wait before signal) ...
    let copy_next =
        Fence { id: FenceId { queue: COPY, seqno: copy_last.seqno().next() }, epoch: copy_last.epoch };
    let compute = submit(dev, COMPUTE, &[copy_next], d, |cb| cb.barrier())?;
    // ... so COPY's next submission may not wait for that COMPUTE work.
    match dev.submit(COPY, &[compute], |cb| cb.barrier()) {
        Err(SubmitError::Cycle(c)) => {
            check!(d, c.fences().len() == 2, "cycle named {} submissions: {c}", c.fences().len());
        }
        other => fail!(d, "expected a wait-cycle error, got {other:?}"),
    }
    // The same submission without the cycle runs and releases COMPUTE.
    let copy = submit(dev, COPY, &[], d, |cb| cb.barrier())?;
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

fn page_fault<P: DirectIo, const C: usize>(dev: &mut Device<P, C>, d: &mut Detail) -> Result<(), Stop> {
    if !dev.mmu_enabled() {
        let _ = write!(d, "MMU bypassed on this device: no faults to take");
        return Err(Stop::Skip);
    }
    let dst = alloc(dev, 4096, d)?;
    // 3 GiB into the 4 GiB arena: never mapped by anything in the suite.
    let unmapped = (1u64 << 32) + (3u64 << 30) + 0x40;
    let t = dst.va();
    let f = submit(dev, COPY, &[], d, |cb| cb.copy(unmapped, t, 256))?;
    match dev.wait(f, GUARD_NS) {
        Err(WaitError::Failed(FenceError::Fault(info))) => {
            check!(d, info.kind == FaultKind::Translation, "fault kind {:?}", info.kind);
            check!(d, info.access == Access::Read, "fault access {:?}", info.access);
            check!(d, info.addr == unmapped, "fault address {:#x}, expected {unmapped:#x}", info.addr);
            let Some(r) = dev.last_hang() else { fail!(d, "no fault report") };
            check!(d, r.queue == COPY, "fault reported on {}", r.queue);
        }
        other => fail!(d, "expected a translation fault, got {other:?}"),
    }
    // The queue works again.
    let g = submit(dev, COPY, &[], d, |cb| cb.fill(t, 64, 7))?;
    wait(dev, g, d)?;
    dev.free_buffer(dst);
    Ok(())
}

fn hang_recovery<P: DirectIo, const C: usize>(dev: &mut Device<P, C>, d: &mut Detail) -> Result<(), Stop> {
    let buf = alloc(dev, 4096, d)?;
    let b = buf.va();
    let resets = dev.stats().resets;
    // A semaphore that is never released: the engine waits forever.
    let stuck = submit(dev, COMPUTE, &[], d, |cb| {
        cb.push(&Command::WaitMem {
            addr: b,
            reference: 0xFEED,
            mask: u64::MAX,
            op: CompareOp::Eq,
            wide: true,
        })
    })?;
    let behind = submit(dev, COMPUTE, &[], d, |cb| cb.write_data(b + 64, &[1]))?;
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
    check!(d, r.queue == COMPUTE, "hang blamed on {}", r.queue);
    check!(d, matches!(r.reason, HangReason::NoProgress { .. }), "reason {}", r.reason);
    check!(d, dev.stats().resets == resets + 1, "expected one reset");
    // The next submission on the reset queue succeeds.
    let next = submit(dev, COMPUTE, &[], d, |cb| cb.write_data(b + 128, &[0x600D]))?;
    wait(dev, next, d)?;
    expect_words(dev, &buf, 33, d, |i| if i == 32 { 0x600D } else { 0 })?;
    dev.free_buffer(buf);
    Ok(())
}

fn pool_exhaustion<P: DirectIo, const C: usize>(dev: &mut Device<P, C>, d: &mut Detail) -> Result<(), Stop> {
    let mut sem = alloc(dev, 4096, d)?;
    let s = sem.va();
    // Block GFX on a semaphore the host releases, then submit jobs that each
    // need most of a chunk until the pool runs dry.
    let gate = submit(dev, GFX, &[], d, |cb| {
        cb.push(&Command::WaitMem { addr: s, reference: 1, mask: u64::MAX, op: CompareOp::Eq, wide: true })
    })?;
    dev.set_pool_exhaustion(PoolExhaustion::Error);
    let exhausted = fill_pool(dev, s, d);
    // Whatever happened, release the gate and restore the policy so later
    // scenarios find a working queue.
    if let Some(w) = sem.words_mut().get_mut(..2) {
        w.copy_from_slice(&[1, 0]);
    }
    dev.flush(&sem);
    dev.set_pool_exhaustion(PoolExhaustion::WaitOldest);
    let last = exhausted?;
    wait(dev, gate, d)?;
    // With the waiting policy the next submission gets a chunk back as soon
    // as the oldest fence signals.
    let after = submit(dev, GFX, &[], d, |cb| cb.write_data(s + 8, &[0xAB]))?;
    wait(dev, after, d)?;
    check!(d, dev.query(last) == Ok(FenceStatus::Signalled), "earlier work not done");
    dev.free_buffer(sem);
    Ok(())
}

/// Submits chunk-sized jobs to the blocked GFX queue until the pool refuses
/// one; returns the last accepted fence.
fn fill_pool<P: DirectIo, const C: usize>(
    dev: &mut Device<P, C>,
    s: u64,
    d: &mut Detail,
) -> Result<Fence, Stop> {
    let big = [0u32; 200];
    // Three 200-dword WRITE_DATA take ~600 of a chunk's 1024 dwords; with
    // batching two jobs can share a chunk, so 2C + 2 jobs cannot all fit.
    let mut last = None;
    for i in 0..(2 * C + 2) {
        match dev.submit(GFX, &[], |cb| {
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

fn misaligned_fence<P: DirectIo, const C: usize>(dev: &mut Device<P, C>, d: &mut Detail) -> Result<(), Stop> {
    let buf = alloc(dev, 4096, d)?;
    let b = buf.va();
    match dev.chip().generation {
        Generation::Gen2 => {
            // 8-byte aligned but not 64: the device would drop it silently,
            // so the encoder refuses it and nothing is submitted.
            let before = dev.last_emitted(GFX);
            match dev.submit(GFX, &[], |cb| cb.fence(b + 8, 5, false)) {
                Err(SubmitError::Encode(EncodeError::MisalignedFence { align: 64, .. })) => {}
                other => fail!(d, "expected MisalignedFence(64), got {other:?}"),
            }
            check!(d, dev.last_emitted(GFX) == before, "a refused submission emitted a fence");
            let f = submit(dev, GFX, &[], d, |cb| cb.fence(b + 64, 5, false))?;
            wait(dev, f, d)?;
            expect_words(dev, &buf, 18, d, |i| if i == 16 { 5 } else { 0 })?;
        }
        Generation::Gen1 => {
            // Gen1 only needs 8-byte alignment: the same fence lands.
            let f = submit(dev, GFX, &[], d, |cb| cb.fence(b + 8, 5, false))?;
            wait(dev, f, d)?;
            expect_words(dev, &buf, 4, d, |i| if i == 2 { 5 } else { 0 })?;
            match dev.submit(GFX, &[], |cb| cb.fence(b + 4, 5, false)) {
                Err(SubmitError::Encode(EncodeError::MisalignedFence { align: 8, .. })) => {}
                other => fail!(d, "expected MisalignedFence(8), got {other:?}"),
            }
        }
    }
    dev.free_buffer(buf);
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

fn stress<P: DirectIo, const C: usize>(dev: &mut Device<P, C>, d: &mut Detail) -> Result<(), Stop> {
    const JOBS: usize = 2000;
    const KEEP: usize = 32;
    let buf = alloc(dev, JOBS * 4, d)?;
    let b = buf.va();
    let mut rng = Rng(0x5EED_0FC0_FFEE);
    let before = dev.stats();
    let queues = [GFX, COMPUTE, COPY];
    // The last KEEP fences of each queue, to draw waits from.
    let mut recent = [[None::<Fence>; KEEP]; 3];
    let mut count = [0usize; 3];
    for i in 0..JOBS {
        let qi = rng.below(3) as usize;
        let q = queues.get(qi).copied().unwrap_or(GFX);
        let mut waits = [None; 2];
        for w in waits.iter_mut() {
            let oq = rng.below(3) as usize;
            let n = count.get(oq).copied().unwrap_or(0);
            if oq != qi && n > 0 && rng.below(2) == 0 {
                let pick = n.saturating_sub(1 + rng.below(KEEP.min(n) as u64) as usize);
                *w = recent.get(oq).and_then(|r| r.get(pick % KEEP)).copied().flatten();
            }
        }
        let mut wl = [Fence { id: FenceId::default(), epoch: 0 }; 2];
        let mut nw = 0;
        for f in waits.iter().flatten() {
            if let Some(s) = wl.get_mut(nw) {
                *s = *f;
                nw += 1;
            }
        }
        let f = submit(dev, q, wl.get(..nw).unwrap_or(&[]), d, |cb| {
            cb.write_data(b + 4 * i as u64, &[i as u32 ^ 0x5A5A])
        })?;
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
    expect_words(dev, &buf, JOBS, d, |i| i as u32 ^ 0x5A5A)?;
    let s = dev.stats();
    let (hangs, faults) = (s.hangs.saturating_sub(before.hangs), s.faults.saturating_sub(before.faults));
    check!(d, hangs == 0 && faults == 0, "stress saw {hangs} hangs and {faults} faults");
    dev.free_buffer(buf);
    Ok(())
}
