//! The demo workload: a frame pipeline over the three engines, and its
//! report.
//!
//! Every frame:
//!
//! 1. the CPU writes two input arrays (`a`, `b`, `N` f32 each) into a
//!    staging buffer;
//! 2. **COPY** uploads them into the device-side input buffer in 256-byte
//!    tiles and writes the frame's constant table with `WRITE_DATA`
//!    packets: ~9 KB of commands through 4 KiB IB chunks, so the command
//!    buffer is **chained** over three chunks;
//! 3. **COMPUTE** waits for the COPY fence (a semaphore: `WAIT_MEM` in its
//!    ring) and runs `DISPATCH saxpy` (`r = s * a + b`);
//! 4. **GFX** waits for the COMPUTE fence and copies the result out to the
//!    frame's output buffer ("present").
//!
//! Every job is bracketed by `TIMESTAMP` packets, so per-engine busy time
//! comes from the GPU clock, and the exported trace shows each job on its
//! engine's GPU track next to the driver's CPU-side events. Two or three
//! frames are in flight (`depth`): frame `f` reuses frame `f - depth`'s
//! buffers. The GPU orders the reuse itself (frame `f`'s COPY waits for
//! the old frame's COMPUTE, its COMPUTE for the old GFX); the CPU waits
//! only for the old upload before it rewrites the staging buffer, and
//! checks every output word of the old frame bit-exactly after queueing
//! the new frame's COPY and COMPUTE, before its GFX overwrites the output,
//! so the check never leaves COPY, the busiest engine, without work. Every buffer comes from
//! the driver's buffer manager: the slots' buffers live for the run, and
//! each frame's constant table is a transient buffer, checked and freed
//! when the frame retires. The report shows the pools' figures.
//!
//! Generic over the backend: the bare-metal `demo` image runs it on the
//! ivshmem transport; it would run as well over co-simulation or a kernel
//! driver.

use core::fmt::{self, Write};

use conformance::io::{first_mismatch, write_words};
use umd_core::cmd::{DispatchOp, EncodeError};
use umd_core::config::Config;
use umd_core::debug::{TraceKind, TraceRing};
use umd_core::engine::{Backend, DeviceCore};
use umd_core::ibpool::Recorder;
use umd_core::mem::{BufferDesc, BufferHandle, BufferStats};
use umd_core::platform::Platform;
use umd_core::sync::{Fence, QueueId};

/// Elements per array.
pub const N: usize = 4096;
/// Most frames one run can do (timestamp slots).
pub const MAX_FRAMES: u32 = 64;
/// Most frames in flight (buffer slots).
pub const MAX_DEPTH: u32 = 3;
/// IB chunks of the demo's device.
pub const CHUNKS: usize = 16;
/// Events the demo keeps for the exported trace (the device's own ring is
/// drained into this after every wait).
pub const TRACE_CAP: usize = 4096;

/// The demo's device configuration: 4 KiB IB chunks (so the upload chains)
/// and a 16 KiB ring; everything else default.
pub const CONFIG: Config = Config { ib_chunk_bytes: 4096, ring_bytes: 16 * 1024, ..Config::DEFAULT };

const TILE: u64 = 256;
const CONST_DWORDS: usize = 1024;
const CONST_PER_PACKET: usize = 16;
const TS_BYTES: u64 = 4096;
const FAIL_GUARD_NS: u64 = 30_000_000_000;

/// Why the demo stopped (fixed size: the step and up to 96 bytes of the
/// error's text).
#[derive(Clone, Copy, Debug)]
pub struct DemoError {
    /// What failed.
    pub what: &'static str,
    text: [u8; 96],
    len: u8,
}

impl DemoError {
    /// The error's text (possibly truncated).
    pub fn detail(&self) -> &str {
        let b = self.text.get(..usize::from(self.len)).unwrap_or(&[]);
        match core::str::from_utf8(b) {
            Ok(s) => s,
            Err(e) => core::str::from_utf8(b.get(..e.valid_up_to()).unwrap_or(&[])).unwrap_or(""),
        }
    }
}

impl Write for DemoError {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for b in s.bytes() {
            if let Some(slot) = self.text.get_mut(usize::from(self.len)) {
                *slot = b;
                self.len = self.len.saturating_add(1);
            }
        }
        Ok(())
    }
}

impl fmt::Display for DemoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.what, self.detail())
    }
}

fn err(what: &'static str, e: impl fmt::Display) -> DemoError {
    let mut d = DemoError { what, text: [0; 96], len: 0 };
    let _ = write!(d, "{e}");
    d
}

/// Per-queue figures.
#[derive(Clone, Copy, Debug, Default)]
pub struct QueueFigures {
    /// Jobs submitted.
    pub jobs: u32,
    /// Engine time inside the jobs, from the GPU's TIMESTAMPs (ns).
    pub engine_ns: u64,
    /// Union of submit -> fence-seen spans from the driver trace (ns).
    pub host_span_ns: u64,
    /// Largest command buffer (dwords, from the trace's encode events).
    pub max_cmd_dwords: u64,
    /// Jobs whose submit, GPU span and fence sighting were all found.
    pub timed_jobs: u32,
    /// Sum over those jobs of submit -> GPU start (ns): waiting for the
    /// engine and for the jobs it depends on.
    pub queued_ns: u64,
    /// Sum over those jobs of GPU end -> fence seen by the driver (ns):
    /// how late the CPU looked.
    pub unseen_ns: u64,
}

/// What a run did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Summary {
    /// Frames run.
    pub frames: u32,
    /// Frames in flight.
    pub depth: u32,
    /// Frames whose every output word was right.
    pub verified: u32,
    /// Output words checked.
    pub words_checked: u64,
    /// First wrong word, if any: (frame, index, got, want).
    pub first_mismatch: Option<(u32, usize, u32, u32)>,
    /// GFX, COMPUTE, COPY.
    pub queues: [QueueFigures; 3],
    /// First job start to last job end on the GPU clock (ns).
    pub gpu_span_ns: u64,
    /// CPU time of the whole run (platform clock, ns).
    pub cpu_ns: u64,
    /// The driver's buffers after the run (before the slots are freed).
    pub buffers: BufferStats,
    /// Buffers allocated by the run.
    pub allocs: u32,
}

impl Summary {
    /// The busiest engine (its index in [`Summary::queues`]), the share of
    /// the GPU span it was busy and the share its own jobs allow, both in
    /// per mille. However well the CPU keeps up, the busiest engine cannot
    /// start before the first frame's earlier stages have run, nor finish
    /// the span before the last frame's later stages have run after it:
    /// the span is at least its busy time plus one average job of each
    /// other stage.
    pub fn bottleneck(&self) -> Option<(usize, u64, u64)> {
        let (b, busiest) = self.queues.iter().enumerate().max_by_key(|(_, q)| q.engine_ns)?;
        let other: u64 = (self.queues.iter().enumerate())
            .filter(|(q, _)| *q != b)
            .map(|(_, q)| q.engine_ns.checked_div(u64::from(q.jobs)).unwrap_or(0))
            .sum();
        let busy = busiest.engine_ns;
        let share = busy.saturating_mul(1000).checked_div(self.gpu_span_ns)?;
        let bound = busy.saturating_mul(1000).checked_div(busy.saturating_add(other))?;
        Some((b, share, bound))
    }
}

fn pattern_a(frame: u32, i: usize) -> f32 {
    (i as f32) * 0.25 - (frame as f32) * 3.0
}

fn pattern_b(frame: u32, i: usize) -> f32 {
    1.0 / ((i + frame as usize) as f32 + 1.0)
}

fn scalar(frame: u32) -> f32 {
    1.5 + frame as f32 * 0.125
}

/// `s * a + b` as the spec computes it (product rounded, then the sum).
fn saxpy(s: f32, a: f32, b: f32) -> f32 {
    let p = core::hint::black_box(s * a);
    p + b
}

/// Moves the device's trace events into `big` (called after every wait,
/// so the device's own ring never overflows).
pub fn drain_trace<B: Backend, const C: usize>(dev: &DeviceCore<'_, B, C>, big: &mut TraceRing<'_>) {
    let mut t = dev.trace();
    for e in t.iter() {
        big.record(*e);
    }
    t.clear();
}

struct DebugText<T: fmt::Debug>(T);

impl<T: fmt::Debug> fmt::Display for DebugText<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// A buffer and its GPU address.
#[derive(Clone, Copy)]
struct Buf {
    h: BufferHandle,
    va: u64,
}

fn alloc<B: Backend, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    len: u64,
    tag: &'static str,
    allocs: &mut u32,
) -> Result<Buf, DemoError> {
    *allocs = allocs.saturating_add(1);
    let h = dev.alloc(&BufferDesc::new(len).tag(tag)).map_err(|e| err("alloc", e))?;
    let va = dev.va(h).map_err(|e| err("va", e))?;
    Ok(Buf { h, va })
}

struct Slot {
    staging: Buf,
    input: Buf,
    result: Buf,
    output: Buf,
}

struct InFlight {
    frame: u32,
    slot: usize,
    copy: Fence,
    compute: Fence,
    gfx: Fence,
    consts: Buf,
}

/// Runs `frames` frames (at most [`MAX_FRAMES`]) with `depth` of them in
/// flight (2 or 3) and returns the figures; every driver event, and every
/// job's GPU span when the device clock can be read, lands in `trace`.
pub fn run<B: Backend, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    frames: u32,
    depth: u32,
    trace: &mut TraceRing<'_>,
) -> Result<Summary, DemoError> {
    let frames = frames.clamp(1, MAX_FRAMES);
    let depth = depth.clamp(2, MAX_DEPTH);
    let start = dev.platform().now_ns();
    let mut allocs = 0u32;
    let n4 = (N * 4) as u64;
    let mut mk = |tag| -> Result<Slot, DemoError> {
        Ok(Slot {
            staging: alloc(dev, 2 * n4, tag, &mut allocs)?,
            input: alloc(dev, 2 * n4, tag, &mut allocs)?,
            result: alloc(dev, n4, tag, &mut allocs)?,
            output: alloc(dev, n4, tag, &mut allocs)?,
        })
    };
    let mut slots: [Option<Slot>; MAX_DEPTH as usize] = [None, None, None];
    for (i, s) in slots.iter_mut().take(depth as usize).enumerate() {
        *s = Some(mk(["slot 0", "slot 1", "slot 2"].get(i).copied().unwrap_or("slot"))?);
    }
    let ts = alloc(dev, TS_BYTES, "timestamps", &mut allocs)?;
    let mut sum = Summary { frames, depth, ..Summary::default() };
    let mut inflight: [Option<InFlight>; MAX_DEPTH as usize] = [None, None, None];
    // Fence seqnos per frame and queue, for the GPU spans.
    let mut seqnos = [[0u64; 3]; MAX_FRAMES as usize];

    for f in 0..frames + depth {
        let si = (f % depth) as usize;
        let Some(slot) = slots.get(si).and_then(Option::as_ref) else {
            return Err(err("slots", "a slot index past the depth"));
        };
        // The frame that used this slot `depth` frames ago. Its stages
        // free the slot's buffers one by one, and the GPU waits for them
        // where it can: COPY only needs that frame's COMPUTE to have read
        // `input`, COMPUTE its GFX to have read `result`. The CPU waits for
        // its COPY (the staging buffer it rewrites), then for its GFX and
        // checks its output only after this frame's COPY and COMPUTE are
        // queued, so the CPU's check never leaves COPY without work.
        let old = inflight.get_mut(si).and_then(Option::take);
        if f >= frames {
            if let Some(old) = old {
                retire(dev, slot, old, &mut sum, trace)?;
            }
            continue;
        }
        if let Some(o) = &old {
            let r = dev.wait(o.copy, FAIL_GUARD_NS);
            drain_trace(dev, trace);
            r.map_err(|e| err("wait for a frame's upload", e))?;
        }
        // 1. CPU writes the inputs (the copy cleans the CPU cache).
        write_words(dev, slot.staging.h, 2 * N, |i| {
            if i < N {
                pattern_a(f, i).to_bits()
            } else {
                pattern_b(f, i - N).to_bits()
            }
        })
        .map_err(|e| err("write inputs", e))?;
        let consts = alloc(dev, (CONST_DWORDS * 4) as u64, "frame constants", &mut allocs)?;
        let t = ts.va + u64::from(f) * 48;
        let (stg, inp, res, out) = (slot.staging.va, slot.input.va, slot.result.va, slot.output.va);
        // What the GPU waits for before it may overwrite `input`, `result`.
        let input_free = old.as_ref().map(|o| o.compute);
        let result_free = old.as_ref().map(|o| o.gfx);
        // 2. COPY: upload in tiles + the constant table (chained IB).
        let copy = submit(dev, QueueId::COPY, input_free.as_slice(), |cb| {
            cb.timestamp(t + 32)?;
            let mut off = 0;
            while off < 2 * n4 {
                cb.copy(stg + off, inp + off, TILE)?;
                off += TILE;
            }
            let mut row = [0u32; CONST_PER_PACKET];
            for p in 0..CONST_DWORDS / CONST_PER_PACKET {
                for (k, w) in row.iter_mut().enumerate() {
                    *w = f << 16 | (p * CONST_PER_PACKET + k) as u32;
                }
                cb.write_data(consts.va + (p * CONST_PER_PACKET * 4) as u64, &row)?;
            }
            cb.timestamp(t + 40)
        })?;
        // 3. COMPUTE: waits for the upload, DISPATCH saxpy.
        let waits = [copy, result_free.unwrap_or(copy)];
        let waits = waits.get(..if result_free.is_some() { 2 } else { 1 }).unwrap_or(&[]);
        let compute = submit(dev, QueueId::COMPUTE, waits, |cb| {
            cb.timestamp(t + 16)?;
            cb.dispatch(DispatchOp::SaxpyF32, inp, inp + n4, res, N as u32, scalar(f))?;
            cb.timestamp(t + 24)
        })?;
        // The old frame's output is checked before GFX overwrites it.
        if let Some(old) = old {
            retire(dev, slot, old, &mut sum, trace)?;
        }
        // 4. GFX: waits for the compute, copies the result out.
        let gfx = submit(dev, QueueId::GFX, &[compute], |cb| {
            cb.timestamp(t)?;
            cb.copy(res, out, n4)?;
            cb.timestamp(t + 8)
        })?;
        for q in sum.queues.iter_mut() {
            q.jobs += 1;
        }
        if let Some(s) = seqnos.get_mut(f as usize) {
            *s = [gfx.seqno().0, compute.seqno().0, copy.seqno().0];
        }
        if let Some(s) = inflight.get_mut(si) {
            *s = Some(InFlight { frame: f, slot: si, copy, compute, gfx, consts });
        }
    }
    drain_trace(dev, trace);
    sum.cpu_ns = dev.platform().now_ns().saturating_sub(start);

    // GPU timestamps: [GFX start, end, COMPUTE start, end, COPY start, end]
    // per frame; on the trace's GPU tracks through a clock pairing.
    let sync = dev.clock_sync();
    let mut raw = [0u8; 6 * 8];
    let (mut first, mut last) = (u64::MAX, 0u64);
    for f in 0..frames as u64 {
        dev.read(ts.h, f * 48, &mut raw).map_err(|e| err("read timestamps", e))?;
        let read64 = |i: usize| {
            let b = raw.get(8 * i..8 * i + 8).unwrap_or(&[0; 8]);
            u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
        };
        for (q, fig) in sum.queues.iter_mut().enumerate() {
            let (s, e) = (read64(2 * q), read64(2 * q + 1));
            fig.engine_ns += e.saturating_sub(s);
            first = first.min(s);
            last = last.max(e);
            let seqno = seqnos.get(f as usize).and_then(|r| r.get(q)).copied().unwrap_or(0);
            if let Some(sync) = &sync {
                trace.record_gpu_span(q as u8, seqno, sync, s, e);
            }
        }
    }
    sum.gpu_span_ns = last.saturating_sub(first);
    host_spans(trace, &mut sum);
    sum.buffers = dev.buffer_stats();
    sum.allocs = allocs;
    for s in slots.iter().flatten() {
        for b in [s.staging, s.input, s.result, s.output] {
            dev.free(b.h).map_err(|e| err("free", e))?;
        }
    }
    dev.free(ts.h).map_err(|e| err("free", e))?;
    Ok(sum)
}

fn submit<B: Backend, const C: usize, F>(
    dev: &DeviceCore<'_, B, C>,
    q: QueueId,
    waits: &[Fence],
    f: F,
) -> Result<Fence, DemoError>
where
    F: FnOnce(&mut Recorder<'_>) -> Result<(), EncodeError>,
{
    dev.submit(q, waits, f).map_err(|e| err("submit", e))
}

fn retire<B: Backend, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    slot: &Slot,
    old: InFlight,
    sum: &mut Summary,
    trace: &mut TraceRing<'_>,
) -> Result<(), DemoError> {
    let r = dev.wait(old.gfx, FAIL_GUARD_NS);
    // GFX waited for COMPUTE, which waited for COPY: both are done; the
    // queries record their fences (and submit -> fence spans) too.
    let earlier = [dev.query(old.copy), dev.query(old.compute)];
    drain_trace(dev, trace);
    r.map_err(|e| err("wait for a frame", e))?;
    for q in earlier {
        match q {
            Ok(umd_core::error::FenceStatus::Signalled) => {}
            other => return Err(err("an earlier stage's fence", DebugText(other))),
        }
    }
    let s = scalar(old.frame);
    let mut ok = true;
    let want = |i: usize| saxpy(s, pattern_a(old.frame, i), pattern_b(old.frame, i)).to_bits();
    match first_mismatch(dev, slot.output.h, N, want).map_err(|e| err("read output", e))? {
        None => sum.words_checked += N as u64,
        Some((i, got, w)) => {
            ok = false;
            sum.words_checked += i as u64 + 1;
            sum.first_mismatch.get_or_insert((old.frame, i, got, w));
        }
    }
    // The constant table's last row.
    let last = CONST_DWORDS - 1;
    let want = old.frame << 16 | last as u32;
    let got = dev.read_u32(old.consts.h, last as u64).map_err(|e| err("read constants", e))?;
    if got != want {
        ok = false;
        sum.first_mismatch.get_or_insert((old.frame, last, got, want));
    }
    if ok {
        sum.verified += 1;
        platform_baremetal::info!(
            "frame {} retired from slot {}: {} output words bit-exact",
            old.frame,
            old.slot,
            N
        );
    } else {
        platform_baremetal::warn!("frame {} retired with a wrong word", old.frame);
    }
    dev.free(old.consts.h).map_err(|e| err("free constants", e))
}

/// Per queue: union of [submit, fence seen] spans, the largest encode, and
/// where each job's submit -> fence-seen time went (queued before the GPU
/// started it, on the GPU, unseen after it ended), from the fence events
/// and the GPU spans of the same job.
fn host_spans(trace: &TraceRing<'_>, sum: &mut Summary) {
    for (q, fig) in sum.queues.iter_mut().enumerate() {
        for g in trace.iter().filter(|e| e.kind == TraceKind::GpuSpan && usize::from(e.queue) == q) {
            let seen = trace.iter().find(|e| {
                e.kind == TraceKind::FenceSignalled && e.queue == g.queue && e.seqno == g.seqno && e.arg != 0
            });
            if let Some(s) = seen {
                fig.timed_jobs += 1;
                fig.queued_ns += g.ts_ns.saturating_sub(s.arg);
                fig.unseen_ns += s.ts_ns.saturating_sub(g.ts_ns.saturating_add(g.arg));
            }
        }
        let (mut cur_s, mut cur_e, mut total) = (0u64, 0u64, 0u64);
        for e in trace.iter().filter(|e| usize::from(e.queue) == q) {
            match e.kind {
                TraceKind::FenceSignalled if e.arg != 0 && e.arg <= e.ts_ns => {
                    let (s, t) = (e.arg, e.ts_ns);
                    if s > cur_e {
                        total += cur_e - cur_s;
                        (cur_s, cur_e) = (s, t);
                    } else {
                        cur_e = cur_e.max(t);
                    }
                }
                TraceKind::Encode => fig.max_cmd_dwords = fig.max_cmd_dwords.max(e.arg),
                _ => {}
            }
        }
        fig.host_span_ns = total + (cur_e - cur_s);
    }
}

struct Ms(u64);

impl fmt::Display for Ms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:03} ms", self.0 / 1_000_000, (self.0 / 1000) % 1000)
    }
}

/// Writes the human-readable report.
pub fn write_report<B: Backend, const C: usize>(
    out: &mut impl Write,
    dev: &DeviceCore<'_, B, C>,
    sum: &Summary,
    trace_events: usize,
    trace_dropped: u64,
) -> fmt::Result {
    let st = dev.stats();
    let chip = dev.chip();
    let cfg = dev.config();
    writeln!(out, "==================== refgpu demo report ====================")?;
    writeln!(
        out,
        "device     : refgpu gen{} rev {}, GPU MMU {}",
        chip.generation.number(),
        chip.revision,
        if dev.mmu_enabled() { "on" } else { "bypassed" }
    )?;
    writeln!(
        out,
        "workload   : {} frames x (COPY upload -> COMPUTE DISPATCH saxpy -> GFX copy-out), {} f32 per array, {} frames in flight",
        sum.frames, N, sum.depth
    )?;
    writeln!(
        out,
        "results    : {}/{} frames verified bit-exact ({} words checked){}",
        sum.verified,
        sum.frames,
        sum.words_checked,
        if sum.first_mismatch.is_some() { "  ** MISMATCH **" } else { "" }
    )?;
    if let Some((f, i, got, want)) = sum.first_mismatch {
        writeln!(out, "             first mismatch: frame {f} word {i}: got {got:#010x}, want {want:#010x}")?;
    }
    writeln!(
        out,
        "driver     : {} submissions, {} fence signals observed, {} IRQ_STATUS acknowledgements, {} ring wraps, {} pool waits",
        st.submissions, st.fences_signalled, st.irq_status_acks, st.ring_wraps, st.pool_waits
    )?;
    writeln!(
        out,
        "time       : CPU {} for the run, {} of it waiting; GPU span {}",
        Ms(sum.cpu_ns),
        Ms(st.wait_ns),
        Ms(sum.gpu_span_ns)
    )?;
    writeln!(
        out,
        "queue     jobs  engine busy (GPU TIMESTAMPs)   submit->fence (trace)   largest cmd buffer"
    )?;
    for (name, fig) in ["GFX", "COMPUTE", "COPY"].iter().zip(sum.queues.iter()) {
        let pct = fig.engine_ns.saturating_mul(100).checked_div(sum.gpu_span_ns).unwrap_or(0);
        let chunks = (fig.max_cmd_dwords * 4).div_ceil(cfg.ib_chunk_bytes.max(1) as u64);
        writeln!(
            out,
            "{name:<8} {:>5}  {:>6}.{:03} ms ({pct:>3}% of span)    {:>6}.{:03} ms         {} dwords ({} chunk{}{})",
            fig.jobs,
            fig.engine_ns / 1_000_000,
            (fig.engine_ns / 1000) % 1000,
            fig.host_span_ns / 1_000_000,
            (fig.host_span_ns / 1000) % 1000,
            fig.max_cmd_dwords,
            chunks,
            if chunks == 1 { "" } else { "s" },
            if chunks > 1 { ", chained" } else { "" }
        )?;
    }
    writeln!(
        out,
        "per job    : submit -> GPU start (queued) | on the GPU | GPU end -> fence seen (unseen), averages"
    )?;
    for (name, fig) in ["GFX", "COMPUTE", "COPY"].iter().zip(sum.queues.iter()) {
        let n = u64::from(fig.timed_jobs.max(1));
        writeln!(
            out,
            "  {name:<8} : {} | {} | {} ({} jobs timed)",
            Ms(fig.queued_ns / n),
            Ms(fig.engine_ns / u64::from(fig.jobs.max(1))),
            Ms(fig.unseen_ns / n),
            fig.timed_jobs
        )?;
    }
    let busy: u64 = sum.queues.iter().map(|q| q.engine_ns).sum();
    if sum.gpu_span_ns > 0 {
        writeln!(
            out,
            "overlap    : engines busy {} in a {} span: {}.{:02} engines active on average",
            Ms(busy),
            Ms(sum.gpu_span_ns),
            busy / sum.gpu_span_ns,
            (busy % sum.gpu_span_ns) * 100 / sum.gpu_span_ns
        )?;
    }
    if let Some((q, share, bound)) = sum.bottleneck() {
        writeln!(
            out,
            "bottleneck : {} busy {}.{}% of the span; its jobs allow {}.{}% (one job of each other stage before or after it)",
            ["GFX", "COMPUTE", "COPY"].get(q).copied().unwrap_or("?"),
            share / 10,
            share % 10,
            bound / 10,
            bound % 10
        )?;
    }
    let p = dev.pool_stats();
    writeln!(
        out,
        "IB pool    : {} chunks x {} B; now free {}, in flight {}, open {}, recording {}",
        C, cfg.ib_chunk_bytes, p.free, p.in_flight, p.open, p.recording
    )?;
    let b = &sum.buffers;
    writeln!(
        out,
        "buffers    : {} allocated by the run; {} live, {} waiting for a fence; {} frees waited for a fence, {} were immediate",
        sum.allocs, b.live, b.waiting, b.deferred_frees, b.immediate_frees
    )?;
    for (name, c) in ["small", "medium", "large"].iter().zip(b.pool.classes.iter()) {
        writeln!(
            out,
            "  {name:<7}  : {} live, {} KiB reserved (high water {} KiB), {} KiB from the platform, fragmentation {}.{}%",
            c.live,
            c.reserved / 1024,
            c.high_water / 1024,
            c.backed / 1024,
            c.fragmentation_ppm() / 10_000,
            (c.fragmentation_ppm() / 1000) % 10
        )?;
    }
    writeln!(
        out,
        "             {} slabs ({} kept empty), {} platform blocks acquired, {} released",
        b.pool.slabs, b.pool.empty_slabs, b.pool.blocks_acquired, b.pool.blocks_released
    )?;
    if let Some(v) = dev.va_stats() {
        writeln!(
            out,
            "GPU VA     : {} KiB used of {} MiB, {} holes, nodes {}/{}",
            v.used / 1024,
            v.arena >> 20,
            v.holes,
            v.nodes_high_water,
            v.nodes_capacity
        )?;
    }
    writeln!(out, "faults     : {} faults, {} hangs, {} resets", st.faults, st.hangs, st.resets)?;
    if let Some(h) = dev.last_hang() {
        write!(out, "last fault/hang report:\n{h}")?;
    }
    writeln!(out, "trace      : {} events kept, {} dropped", trace_events, trace_dropped)?;
    writeln!(out, "=============================================================")
}
