//! The IB chunk-size sweep (`docs/perf.md`, "IB sizing"): the same
//! workload on a device with each IB chunk size of [`CHUNK_SIZES`], on
//! any backend. The bare-metal `bench` image runs it in direct mode (one
//! device per row, all rows in one boot) and the Linux guest in kernel
//! mode; both print one [`Row`] a line (its `Display`) and check the
//! rows with [`check_shape`].
//!
//! The workload is a round of [`SMALL_PER_ROUND`] small submissions
//! (WRITE_DATA of 4 dwords, a 256-byte DMA_COPY and a 256-byte FILL) and
//! one large one ([`LARGE_PACKETS`] one-dword WRITE_DATAs: 32 KiB of IB,
//! a state upload of that many words), all on COPY, the round's last
//! fence waited for. Small chunks make the large submission CHAIN from
//! chunk to chunk; large chunks hold memory the small ones never use.
//!
//! Each row runs three passes on a fresh device:
//!
//! 1. counted ([`ROUNDS`] rounds): the chunks each submission took, read
//!    at the end of its recording (`DeviceCore::pool_stats`: the chunks
//!    in `Recording` state are this recording's, one thread submitting),
//!    give the CHAINs it follows (one fewer); after each submission the
//!    chunks not free give the peak of memory in use;
//! 2. timed ([`ROUNDS`] rounds): the CPU time of each `submit` call
//!    (recording, ring or ioctl, doorbell), the platform clock around it;
//! 3. latency: [`TRIPS`] small and [`TRIPS`] large submissions, each
//!    timed from `submit` to its fence seen by `wait`.
//!
//! The memory held is the pool's whole reservation (`pool_range`):
//! chunks × chunk bytes, allocated at bring-up for the device's life.
//! No allocation: samples go into a caller-provided [`Samples`].

use core::fmt;

use umd_core::cmd::{EncodeError, Encoder};
use umd_core::config::{Config, HangConfig};
use umd_core::engine::{Backend, DeviceCore};
use umd_core::ibpool::Recorder;
use umd_core::platform::Platform;
use umd_core::sync::{Fence, QueueId};

use crate::bench::{figures, BenchError, Figures};

/// IB chunk sizes swept, smallest first (bytes).
pub const CHUNK_SIZES: [usize; 6] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 8 << 20];
/// The row the CPU cost is compared with: `Config::DEFAULT`'s chunk size.
pub const BASELINE_CHUNK: usize = Config::DEFAULT.ib_chunk_bytes;
/// The configuration of every row but its chunk size: `Config::DEFAULT`
/// with a 5 s hang window. The hang check is only a failure guard here:
/// on a loaded 2-core host the model's engine thread can starve for more
/// than the default 500 ms, which the check takes for a hang (the
/// conformance suite's 1 s window has the same reason).
pub const BASE_CONFIG: Config =
    Config { hang: HangConfig { window_ns: 5_000_000_000, ..Config::DEFAULT.hang }, ..Config::DEFAULT };
/// Chunks of the pool in the rows up to 1 MiB (the bare-metal images'
/// device).
pub const CHUNKS: usize = 16;
/// Chunks of the pool in the rows above 1 MiB: 16 chunks of 8 MiB
/// (128 MiB) do not fit the bare-metal guest's 64 MiB GPU carve-out.
pub const CHUNKS_ABOVE_1M: usize = 4;
/// Small submissions per round.
pub const SMALL_PER_ROUND: usize = 15;
/// Packets of the large submission (one-dword WRITE_DATAs, 16 bytes
/// each in both generations: 32 KiB of IB).
pub const LARGE_PACKETS: usize = 2048;
/// Rounds of the counted and of the timed pass.
pub const ROUNDS: usize = 16;
/// Latency samples of each size.
pub const TRIPS: usize = 16;
/// Times the whole sweep runs, the chunk sizes in turn each time, so a
/// change of the machine's load spreads over every row; each row's
/// figures are the medians over the repeats ([`merge`]).
pub const REPEATS: usize = 3;

/// Bytes of the workload's buffer: the large submission's words, then
/// the small ones' writes, copies and fills.
const BUF_BYTES: u64 = 64 << 10;
/// Where the small submissions work in the buffer.
const SMALL_BASE: u64 = (LARGE_PACKETS as u64) * 4;
/// Failure guard for a wait.
const GUARD_NS: u64 = 30_000_000_000;

/// The pool's chunk count for `chunk_bytes` ([`CHUNKS`] up to 1 MiB,
/// [`CHUNKS_ABOVE_1M`] above).
pub const fn chunks_for(chunk_bytes: usize) -> usize {
    if chunk_bytes > 1 << 20 {
        CHUNKS_ABOVE_1M
    } else {
        CHUNKS
    }
}

/// The chunk sizes a generation sweeps: those within its IB limit
/// (`max_ib_bytes`: 1 MiB on gen1, 16 MiB on gen2).
pub fn sizes_within(max_ib_bytes: usize) -> impl Iterator<Item = usize> {
    CHUNK_SIZES.into_iter().filter(move |&c| c <= max_ib_bytes)
}

/// Sample storage for one row.
#[derive(Clone, Debug)]
pub struct Samples {
    small: [u64; ROUNDS * SMALL_PER_ROUND],
    large: [u64; ROUNDS],
    small_trips: [u64; TRIPS],
    large_trips: [u64; TRIPS],
}

impl Samples {
    /// All zeros (for a `static`).
    pub const fn new() -> Samples {
        Samples {
            small: [0; ROUNDS * SMALL_PER_ROUND],
            large: [0; ROUNDS],
            small_trips: [0; TRIPS],
            large_trips: [0; TRIPS],
        }
    }
}

impl Default for Samples {
    fn default() -> Self {
        Samples::new()
    }
}

/// One row of the sweep: one chunk size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Row {
    /// Bytes of one IB chunk (`Config::ib_chunk_bytes` of the device).
    pub chunk_bytes: usize,
    /// Chunks of the pool.
    pub chunks: usize,
    /// Memory held by the IB pool (bytes, its whole reservation).
    pub pool_bytes: usize,
    /// Most chunks not free after a submission of the counted pass, in
    /// bytes (what the workload had in use at its peak).
    pub peak_busy_bytes: usize,
    /// CPU time of a small submission's `submit` (ns).
    pub small_cpu: Figures,
    /// CPU time of a large submission's `submit` (ns).
    pub large_cpu: Figures,
    /// CPU cost per submission of the mix (ns): the small and the large
    /// medians weighted by their shares of a round (medians, so that a
    /// few submissions the host's scheduler delayed do not decide it).
    pub cpu_per_submit_ns: u64,
    /// Submit -> fence of a small submission (ns).
    pub small_latency: Figures,
    /// Submit -> fence of a large submission (ns).
    pub large_latency: Figures,
    /// Submissions of the counted pass.
    pub submissions: u64,
    /// CHAINs those submissions followed.
    pub chains: u64,
    /// CHAINs of the large submissions among them.
    pub large_chains: u64,
    /// Ring writes that wrapped over the row's three passes
    /// (`DeviceStats::ring_wraps`; the kernel's ring in kernel mode is
    /// not the core's, so 0 there).
    pub ring_wraps: u64,
    /// Times recording waited for a free chunk over the three passes.
    pub pool_waits: u64,
}

impl Row {
    /// The line's name: `ib_sweep`.
    pub const NAME: &'static str = "ib_sweep";

    /// A row from its [`Display`](fmt::Display) text; `None` if it is not one or a
    /// field is missing or not a number.
    pub fn parse(line: &str) -> Option<Row> {
        let mut it = line.split_whitespace();
        if it.next()? != Row::NAME {
            return None;
        }
        let mut r = Row::default();
        let mut seen = 0u32;
        for kv in it {
            let (k, v) = kv.split_once('=')?;
            let v: u64 = v.parse().ok()?;
            let (slot, bit): (&mut u64, u32) = match k {
                "small_cpu_median_ns" => (&mut r.small_cpu.median, 0),
                "small_cpu_p90_ns" => (&mut r.small_cpu.p90, 1),
                "large_cpu_median_ns" => (&mut r.large_cpu.median, 2),
                "large_cpu_p90_ns" => (&mut r.large_cpu.p90, 3),
                "cpu_per_submit_ns" => (&mut r.cpu_per_submit_ns, 4),
                "small_latency_median_ns" => (&mut r.small_latency.median, 5),
                "large_latency_median_ns" => (&mut r.large_latency.median, 6),
                "submissions" => (&mut r.submissions, 7),
                "chains" => (&mut r.chains, 8),
                "large_chains" => (&mut r.large_chains, 9),
                "ring_wraps" => (&mut r.ring_wraps, 10),
                "pool_waits" => (&mut r.pool_waits, 11),
                _ => {
                    let v = usize::try_from(v).ok()?;
                    let (slot, bit) = match k {
                        "chunk_bytes" => (&mut r.chunk_bytes, 12),
                        "chunks" => (&mut r.chunks, 13),
                        "pool_bytes" => (&mut r.pool_bytes, 14),
                        "peak_busy_bytes" => (&mut r.peak_busy_bytes, 15),
                        _ => return None,
                    };
                    *slot = v;
                    seen |= 1 << bit;
                    continue;
                }
            };
            *slot = v;
            seen |= 1 << bit;
        }
        (seen == (1 << 16) - 1).then_some(r)
    }
}

/// `ib_sweep chunk_bytes=.. chunks=.. ...`: the `@@ BENCH` line's text
/// after `@@ BENCH ` ([`Row::parse`] reads it back).
impl fmt::Display for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} chunk_bytes={} chunks={} pool_bytes={} peak_busy_bytes={} \
             small_cpu_median_ns={} small_cpu_p90_ns={} large_cpu_median_ns={} large_cpu_p90_ns={} \
             cpu_per_submit_ns={} small_latency_median_ns={} large_latency_median_ns={} \
             submissions={} chains={} large_chains={} ring_wraps={} pool_waits={}",
            Row::NAME,
            self.chunk_bytes,
            self.chunks,
            self.pool_bytes,
            self.peak_busy_bytes,
            self.small_cpu.median,
            self.small_cpu.p90,
            self.large_cpu.median,
            self.large_cpu.p90,
            self.cpu_per_submit_ns,
            self.small_latency.median,
            self.large_latency.median,
            self.submissions,
            self.chains,
            self.large_chains,
            self.ring_wraps,
            self.pool_waits,
        )
    }
}

/// Bytes of the largest IB the generation of `enc` executes (the
/// largest chunk it allows).
pub fn max_ib_bytes(enc: Encoder) -> usize {
    (enc.desc().limits.max_ib_dwords as usize).saturating_mul(4)
}

/// One submission of the workload.
#[derive(Clone, Copy, Debug)]
enum Work {
    /// Small submission number `i`.
    Small(usize),
    /// The large submission of round `r` (its words are `r * LARGE_PACKETS + k`).
    Large(usize),
}

/// The commands of `work` into `cb`; the workload's buffer is at `va`.
fn record(cb: &mut Recorder<'_>, va: u64, work: Work) -> Result<(), EncodeError> {
    match work {
        Work::Small(i) => {
            let at = va + SMALL_BASE + (i % 32) as u64 * 16;
            let area = va + SMALL_BASE + 1024;
            let v = i as u32;
            cb.write_data(at, &[v, v ^ 1, v ^ 2, v ^ 3])?;
            cb.copy(area, area + 256, 256)?;
            cb.fill(area + 512, 256, v)
        }
        Work::Large(r) => {
            for k in 0..LARGE_PACKETS {
                cb.write_data(va + 4 * k as u64, &[(r * LARGE_PACKETS + k) as u32])?;
            }
            Ok(())
        }
    }
}

/// Submits `work` on COPY. With `taken`, also stores the chunks its
/// recording took (see the module's docs).
fn submit<B: Backend, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    va: u64,
    work: Work,
    taken: Option<&mut u64>,
) -> Result<Fence, BenchError> {
    dev.submit(QueueId::COPY, &[], |cb| {
        record(cb, va, work)?;
        if let Some(t) = taken {
            *t = dev.pool_stats().recording as u64;
        }
        Ok(())
    })
    .map_err(|_| BenchError::Submit)
}

/// [`submit`] timed by the platform clock: (fence, ns).
fn timed<B: Backend, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    va: u64,
    work: Work,
) -> Result<(Fence, u64), BenchError> {
    let t0 = dev.platform().now_ns();
    let f = submit(dev, va, work, None)?;
    Ok((f, dev.platform().now_ns().saturating_sub(t0)))
}

fn wait<B: Backend, const C: usize>(dev: &DeviceCore<'_, B, C>, f: Fence) -> Result<(), BenchError> {
    dev.wait(f, GUARD_NS).map_err(|_| BenchError::Wait)
}

/// Runs the workload on `dev` (a fresh device whose configuration sets
/// the chunk size) and returns its row. Checks that the last round's
/// words landed ([`BenchError::Wrong`] otherwise).
pub fn run<B: Backend, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    s: &mut Samples,
) -> Result<Row, BenchError> {
    let buf = dev.alloc_buffer(BUF_BYTES).map_err(|_| BenchError::Alloc)?;
    let va = dev.va(buf).map_err(|_| BenchError::Alloc)?;
    let before = dev.stats();
    let chunk_bytes = dev.config().ib_chunk_bytes;
    let mut row = Row { chunk_bytes, chunks: C, pool_bytes: dev.pool_range().1, ..Row::default() };

    // 1. Counted.
    let mut busy_max = 0usize;
    let mut i = 0usize;
    for round in 0..ROUNDS {
        let mut last = None;
        for n in 0..=SMALL_PER_ROUND {
            let work = if n < SMALL_PER_ROUND { Work::Small(i + n) } else { Work::Large(round) };
            let mut taken = 0;
            let f = submit(dev, va, work, Some(&mut taken))?;
            let chains = taken.saturating_sub(1);
            row.chains += chains;
            if matches!(work, Work::Large(_)) {
                row.large_chains += chains;
            }
            row.submissions += 1;
            let p = dev.pool_stats();
            busy_max = busy_max.max(p.recording + p.in_flight + p.open);
            last = Some(f);
        }
        i += SMALL_PER_ROUND;
        if let Some(f) = last {
            wait(dev, f)?;
        }
    }
    row.peak_busy_bytes = busy_max.saturating_mul(chunk_bytes);

    // 2. Timed.
    for round in 0..ROUNDS {
        for (k, x) in s.small.iter_mut().skip(round * SMALL_PER_ROUND).take(SMALL_PER_ROUND).enumerate() {
            let (_, dt) = timed(dev, va, Work::Small(i + k))?;
            *x = dt;
        }
        i += SMALL_PER_ROUND;
        let (f, dt) = timed(dev, va, Work::Large(round))?;
        if let Some(x) = s.large.get_mut(round) {
            *x = dt;
        }
        wait(dev, f)?;
    }
    row.small_cpu = figures(&mut s.small);
    row.large_cpu = figures(&mut s.large);
    row.cpu_per_submit_ns =
        (row.small_cpu.median * SMALL_PER_ROUND as u64 + row.large_cpu.median) / (SMALL_PER_ROUND as u64 + 1);

    // 3. Latency.
    let clock = dev.platform();
    for k in 0..TRIPS {
        let trip = |work| -> Result<u64, BenchError> {
            let t0 = clock.now_ns();
            let f = submit(dev, va, work, None)?;
            wait(dev, f)?;
            Ok(clock.now_ns().saturating_sub(t0))
        };
        let small_dt = trip(Work::Small(i))?;
        i += 1;
        let large_dt = trip(Work::Large(ROUNDS + k))?;
        if let (Some(a), Some(b)) = (s.small_trips.get_mut(k), s.large_trips.get_mut(k)) {
            (*a, *b) = (small_dt, large_dt);
        }
    }
    row.small_latency = figures(&mut s.small_trips);
    row.large_latency = figures(&mut s.large_trips);

    // The last large submission's words, and the last small one's.
    let last = ((ROUNDS + TRIPS - 1) * LARGE_PACKETS) as u32;
    let word = |k: u64| dev.read_u32(buf, k).map_err(|_| BenchError::Wrong);
    let small_at = (SMALL_BASE / 4) + ((i - 1) % 32) as u64 * 4;
    if word(0)? != last
        || word(LARGE_PACKETS as u64 - 1)? != last + LARGE_PACKETS as u32 - 1
        || word(small_at)? != (i - 1) as u32
    {
        return Err(BenchError::Wrong);
    }
    let after = dev.stats();
    row.ring_wraps = after.ring_wraps.saturating_sub(before.ring_wraps);
    row.pool_waits = after.pool_waits.saturating_sub(before.pool_waits);
    dev.free(buf).map_err(|_| BenchError::Alloc)?;
    Ok(row)
}

/// The median of `f` over `reps` (at most [`REPEATS`] of them).
fn median_of(reps: &[Row], f: impl Fn(&Row) -> u64) -> u64 {
    let mut v = [0u64; REPEATS];
    let n = reps.len().min(REPEATS);
    for (x, r) in v.iter_mut().zip(reps) {
        *x = f(r);
    }
    let v = v.get_mut(..n).unwrap_or(&mut []);
    v.sort_unstable();
    v.get(n / 2).copied().unwrap_or(0)
}

/// One row from the repeats of the same chunk size (at most [`REPEATS`]):
/// each field the median of the repeats' (the counts too: the smallest
/// chunks' CHAINs and waits depend a little on when the GPU finished).
/// `None` without repeats, or if they are not of one chunk size.
pub fn merge(reps: &[Row]) -> Option<Row> {
    let first = reps.first()?;
    if reps.iter().any(|r| {
        (r.chunk_bytes, r.chunks, r.pool_bytes) != (first.chunk_bytes, first.chunks, first.pool_bytes)
    }) {
        return None;
    }
    let m = |f: fn(&Row) -> u64| median_of(reps, f);
    let fig = |median: fn(&Row) -> u64, p90: fn(&Row) -> u64, n: usize| Figures {
        n,
        median: median_of(reps, median),
        p90: median_of(reps, p90),
        mean: 0,
    };
    Some(Row {
        peak_busy_bytes: m(|r| r.peak_busy_bytes as u64) as usize,
        small_cpu: fig(|r| r.small_cpu.median, |r| r.small_cpu.p90, first.small_cpu.n),
        large_cpu: fig(|r| r.large_cpu.median, |r| r.large_cpu.p90, first.large_cpu.n),
        cpu_per_submit_ns: m(|r| r.cpu_per_submit_ns),
        small_latency: fig(|r| r.small_latency.median, |r| r.small_latency.p90, first.small_latency.n),
        large_latency: fig(|r| r.large_latency.median, |r| r.large_latency.p90, first.large_latency.n),
        submissions: m(|r| r.submissions),
        chains: m(|r| r.chains),
        large_chains: m(|r| r.large_chains),
        ring_wraps: m(|r| r.ring_wraps),
        pool_waits: m(|r| r.pool_waits),
        ..*first
    })
}

/// Why a sweep's rows do not have the expected shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShapeError {
    /// Not one row per chunk size within the IB limit.
    Rows {
        /// Rows seen.
        seen: usize,
        /// Rows expected.
        expected: usize,
    },
    /// A row's device did not run with the chunk size of its place in
    /// [`CHUNK_SIZES`] (the chunk size was not applied).
    ChunkSize {
        /// The chunk size expected.
        expected: usize,
        /// The device's.
        seen: usize,
    },
    /// A row's pool is not its chunks times the chunk size asked for
    /// (the chunk size was not applied).
    PoolSize {
        /// The row's chunk size.
        chunk_bytes: usize,
        /// Its pool's bytes.
        pool_bytes: usize,
    },
    /// A row ran a different number of submissions.
    Submissions {
        /// The row's chunk size.
        chunk_bytes: usize,
    },
    /// A larger chunk holds no more memory than the smaller one before.
    MemoryNotGrowing {
        /// The larger chunk size.
        chunk_bytes: usize,
    },
    /// A larger chunk follows more CHAINs than the smaller one before.
    ChainsGrowing {
        /// The larger chunk size.
        chunk_bytes: usize,
    },
    /// The smallest chunks do not chain the large submission as its size
    /// says they must, or the largest chain it once a submission or more.
    ChainsAtTheEnds,
}

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShapeError::Rows { seen, expected } => write!(f, "{seen} rows, expected {expected}"),
            ShapeError::ChunkSize { expected, seen } => {
                write!(f, "the row for {expected} B chunks ran with {seen} B chunks")
            }
            ShapeError::PoolSize { chunk_bytes, pool_bytes } => {
                write!(f, "{chunk_bytes} B chunks: pool of {pool_bytes} B")
            }
            ShapeError::Submissions { chunk_bytes } => {
                write!(f, "{chunk_bytes} B chunks: wrong submission count")
            }
            ShapeError::MemoryNotGrowing { chunk_bytes } => {
                write!(f, "{chunk_bytes} B chunks hold no more memory than the smaller ones")
            }
            ShapeError::ChainsGrowing { chunk_bytes } => {
                write!(f, "{chunk_bytes} B chunks follow more CHAINs than the smaller ones")
            }
            ShapeError::ChainsAtTheEnds => write!(f, "CHAIN counts at the smallest or largest chunks"),
        }
    }
}

/// Checks what must hold of a generation's sweep (`max_ib_bytes`: its IB
/// limit), whatever the machine's speed: one row per chunk size within
/// the limit, in order, each the whole workload; each pool its chunks
/// times its chunk size, growing with it; CHAINs per submission never
/// growing with the chunk size; the smallest chunks chaining every large
/// submission through at least as many chunks as its 32 KiB need, and
/// the largest chunks chaining fewer than one in a round (a large
/// submission CHAINs there only when it starts near the end of the
/// chunk the small ones left open).
pub fn check_shape(rows: &[Row], max_ib_bytes: usize) -> Result<(), ShapeError> {
    let expected = sizes_within(max_ib_bytes).count();
    if rows.len() != expected {
        return Err(ShapeError::Rows { seen: rows.len(), expected });
    }
    if let Some((r, c)) = rows.iter().zip(sizes_within(max_ib_bytes)).find(|(r, c)| r.chunk_bytes != *c) {
        return Err(ShapeError::ChunkSize { expected: c, seen: r.chunk_bytes });
    }
    let per_row = (ROUNDS * (SMALL_PER_ROUND + 1)) as u64;
    for r in rows {
        if r.pool_bytes != r.chunks.saturating_mul(r.chunk_bytes) {
            return Err(ShapeError::PoolSize { chunk_bytes: r.chunk_bytes, pool_bytes: r.pool_bytes });
        }
        if r.submissions != per_row {
            return Err(ShapeError::Submissions { chunk_bytes: r.chunk_bytes });
        }
    }
    for w in rows.windows(2) {
        let [a, b] = w else { continue };
        if b.pool_bytes <= a.pool_bytes {
            return Err(ShapeError::MemoryNotGrowing { chunk_bytes: b.chunk_bytes });
        }
        if b.chains > a.chains {
            return Err(ShapeError::ChainsGrowing { chunk_bytes: b.chunk_bytes });
        }
    }
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return Err(ShapeError::Rows { seen: 0, expected });
    };
    // 32 KiB of large submission in chunks of `first.chunk_bytes`: at
    // least this many CHAINs each.
    let ib = (LARGE_PACKETS * 16) as u64;
    let at_least = ib.div_ceil(first.chunk_bytes as u64).saturating_sub(1) * ROUNDS as u64;
    if first.large_chains < at_least || last.large_chains >= ROUNDS as u64 {
        return Err(ShapeError::ChainsAtTheEnds);
    }
    Ok(())
}
