//! Instruction counts (Valgrind's callgrind through gungraun) of the hot
//! paths: encoding small packets (through `Encoder::encode`, through the
//! per-kind entry points, and the store limit: hand-written stores of the
//! same dwords), a direct-mode submission on the scripted
//! fake (1 / 10 / 100 packets; 1 packet with 4 declared buffers), a wait on an already signalled fence, VA
//! allocator steps, physical page allocator steps (`mem::pages::PageAlloc`
//! and, as the reference of the ratios in `docs/perf.md`, "Physical
//! pages", the first-fit bitmap it replaced) and buffer alloc/free through
//! the device. Built with
//! the `validation` feature it runs only the validation mode's cost
//! instead (`submit_validation`: the same submission with validation off
//! and on; `docs/perf.md`, "Validation mode"), which the gate does not.
//!
//! Counts are exact and repeat run to run on a loaded machine, so
//! `tools/perf-gate.sh` compares them against the committed baseline
//! (`umd-core/benches/icount-baseline.txt`) and fails on a regression.
//! Everything a benchmark needs is built in its setup function, which
//! callgrind does not count; each benchmark function measures only the
//! operations named in its doc line.
//!
//! Run: `tools/perf-gate.sh` (needs `valgrind` and `gungraun-runner`
//! 0.18.2; the script installs the runner), or directly
//! `cargo bench -p umd-core --bench icount`.

// gungraun's macros generate modules without docs.
#![allow(missing_docs)]

#[path = "common/store.rs"]
mod store_limit;

#[path = "common/pages_load.rs"]
mod pages_load;
use pages_load::{page_alloc, replay, Bitmap, Load, Pages, Schedule};
use store_limit::store;

use std::hint::black_box;

use gungraun::prelude::*;
use umd_core::cmd::{Command, Encoder};
use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::engine::{BufferUse, Submit};
use umd_core::hw::Generation;
use umd_core::mem::va::{VaAllocator, VaHandle, VaNode, VaPlacement};
use umd_core::mem::BufferDesc;
use umd_core::platform::fake::{Fake, Mode};
use umd_core::storage::DeviceStorage;
use umd_core::sync::{Fence, QueueId};

/// Packets per encode benchmark.
const ENCODE_PACKETS: u64 = 64;

/// The small packets of `docs/perf.md`, "Command encoding", in rotation:
/// FENCE, WRITE_DATA of 4 dwords, DMA_COPY, FILL.
fn small_packet(i: u64, data: &[u32]) -> Command<'_> {
    match i % 4 {
        0 => Command::Fence { addr: 0x50_0000 + 64 * i, value: i, irq: false },
        1 => Command::write_data(0x20_0000 + 64 * i, data),
        2 => Command::Copy { src: 0x30_0000, dst: 0x40_0000 + 256 * i, size: 256 },
        _ => Command::Fill { dst: 0x60_0000 + 256 * i, size: 256, value: 0xdead_beef },
    }
}

fn encode_setup(generation: Generation) -> (Encoder, Vec<u32>) {
    (Encoder::new(generation), vec![0u32; 64 << 10])
}

// Encodes 64 small packets (FENCE / WRITE_DATA(4) / DMA_COPY / FILL).
#[library_benchmark]
#[bench::gen1(args = (Generation::Gen1), setup = encode_setup)]
#[bench::gen2(args = (Generation::Gen2), setup = encode_setup)]
fn encode_small(input: (Encoder, Vec<u32>)) -> Vec<u32> {
    let (enc, mut out) = input;
    let data = [1u32, 2, 3, 4];
    let mut pos = 0;
    for i in 0..ENCODE_PACKETS {
        pos += enc.encode(&small_packet(i, &data), &mut out, pos, 0x10_0000).unwrap_or(0);
    }
    black_box(pos);
    out
}

// The same 64 packets through the per-kind entry points (what the command
// buffer's `fence`, `write_data`, `copy` and `fill` call).
#[library_benchmark]
#[bench::gen1(args = (Generation::Gen1), setup = encode_setup)]
#[bench::gen2(args = (Generation::Gen2), setup = encode_setup)]
fn encode_small_kinds(input: (Encoder, Vec<u32>)) -> Vec<u32> {
    let (enc, mut out) = input;
    let data = [1u32, 2, 3, 4];
    let mut pos = 0;
    for i in 0..ENCODE_PACKETS {
        let base = 0x10_0000;
        let r = match small_packet(i, &data) {
            Command::Fence { addr, value, irq } => enc.encode_fence(addr, value, irq, &mut out, pos, base),
            Command::WriteData { dst, .. } => enc.encode_write_data(dst, &data, &mut out, pos, base),
            Command::Copy { src, dst, size } => enc.encode_copy(src, dst, size, &mut out, pos, base),
            Command::Fill { dst, size, value } => enc.encode_fill(dst, size, value, &mut out, pos, base),
            c => enc.encode(&c, &mut out, pos, base),
        };
        pos += r.unwrap_or(0);
    }
    black_box(pos);
    out
}

/// The store limit's setup: the generation and a zeroed buffer, after
/// checking that the hand-written stores write the encoder's bytes for the
/// benchmark's packets.
fn store_setup(generation: Generation) -> (Generation, Vec<u32>) {
    let (enc, mut want) = encode_setup(generation);
    let mut got = vec![0u32; want.len()];
    let data = [1u32, 2, 3, 4];
    let (mut a, mut b) = (0, 0);
    for i in 0..ENCODE_PACKETS {
        a += enc.encode(&small_packet(i, &data), &mut want, a, 0x10_0000).expect("valid");
        b += store(generation, &small_packet(i, &data), &mut got, b, 0x10_0000);
    }
    assert_eq!(want[..a], got[..b], "the store limit writes the encoder's bytes");
    (generation, vec![0u32; 64 << 10])
}

// The store limit of the same 64 packets: hand-written stores of the same
// dwords (`benches/common/store.rs`: no checks, no tables).
#[library_benchmark]
#[bench::gen1(args = (Generation::Gen1), setup = store_setup)]
#[bench::gen2(args = (Generation::Gen2), setup = store_setup)]
fn encode_small_store(input: (Generation, Vec<u32>)) -> Vec<u32> {
    let (gen, mut out) = input;
    let data = [1u32, 2, 3, 4];
    let mut pos = 0;
    for i in 0..ENCODE_PACKETS {
        pos += store(gen, &small_packet(i, &data), &mut out, pos, 0x10_0000);
    }
    black_box(pos);
    out
}

/// A gen2 direct-mode device on the fake (MMU bypassed, engines run only
/// when told), warmed up by one submission that has completed, plus the
/// packet count to submit. The fake and the storage are leaked (the
/// benchmark process runs once); fixtures are boxed so that passing them
/// in and out of the measured function moves a pointer, not the device.
struct SubmitFixture {
    fake: &'static Fake,
    dev: Device<'static, Fake, 32>,
    packets: u64,
}

fn device(gen: Generation, mmu: MmuMode, ring: usize) -> (&'static Fake, Device<'static, Fake, 32>) {
    let cfg = Config { ring_bytes: ring, ib_chunk_bytes: 64 << 10, use_irq: false, ..Config::DEFAULT };
    let fake: &'static Fake = Box::leak(Box::new(Fake::new(gen, 64 << 20)));
    let storage: &'static mut DeviceStorage = Box::leak(Box::default());
    let dev = Device::new(fake, storage, cfg, mmu).expect("device");
    fake.state().mode = Mode::Manual;
    (fake, dev)
}

fn submit_n(dev: &Device<'static, Fake, 32>, packets: u64) -> Fence {
    let data = [1u32, 2, 3, 4];
    dev.submit(QueueId::GFX, &[], |cb| {
        for i in 0..packets {
            cb.write_data(0x8040_0000 + 16 * (i % 256), &data)?;
        }
        Ok(())
    })
    .expect("submit")
}

fn submit_setup(packets: u64) -> Box<SubmitFixture> {
    let (fake, dev) = device(Generation::Gen2, MmuMode::Bypass, 64 << 10);
    let f = submit_n(&dev, packets);
    fake.state().run(0);
    dev.wait(f, 1_000_000_000).expect("warm-up wait");
    // Room in the fake's log of cleaned ranges, so that the measured
    // submission never counts the test double's `Vec` growing.
    fake.state().cleaned.reserve(64);
    Box::new(SubmitFixture { fake, dev, packets })
}

// One direct-mode submission of N WRITE_DATA(4) packets: record, IB
// bookkeeping, ring write, fence, doorbell.
#[library_benchmark]
#[bench::p1(args = (1), setup = submit_setup)]
#[bench::p10(args = (10), setup = submit_setup)]
#[bench::p100(args = (100), setup = submit_setup)]
fn submit(fx: Box<SubmitFixture>) -> Box<SubmitFixture> {
    black_box(submit_n(&fx.dev, fx.packets));
    fx
}

/// [`submit_setup`] with a capture into a RAM ring running (the
/// bare-metal form: every record copied into the ring).
#[cfg(feature = "capture")]
fn captured_setup(packets: u64) -> Box<SubmitFixture> {
    use umd_core::debug::capture::{Capture, CaptureRing};
    let fx = submit_setup(packets);
    let ring: &'static mut CaptureRing<{ 256 << 10 }, 64> = Box::leak(Box::default());
    fx.dev.start_capture(Capture::to_ring(ring));
    // A record in the ring already: the measured one appends after it.
    let f = submit_n(&fx.dev, packets);
    fx.fake.state().run(0);
    fx.dev.wait(f, 1_000_000_000).expect("warm-up wait");
    fx
}

// `submit` with the capture on (feature `capture`, a RAM ring): the
// submission plus its record (docs/perf.md, "Capture").
#[cfg(feature = "capture")]
#[library_benchmark]
#[bench::p1(args = (1), setup = captured_setup)]
#[bench::p10(args = (10), setup = captured_setup)]
#[bench::p100(args = (100), setup = captured_setup)]
fn submit_captured(fx: Box<SubmitFixture>) -> Box<SubmitFixture> {
    black_box(submit_n(&fx.dev, fx.packets));
    fx
}

/// A submission fixture and `BufferUse`s of live buffers allocated with
/// declared tracking (their frees wait for the submissions that list
/// them), plus the GPU address of the first.
struct DeclaredFixture {
    fx: Box<SubmitFixture>,
    uses: Vec<BufferUse>,
    va: u64,
}

fn submit_declared(dev: &Device<'static, Fake, 32>, uses: &[BufferUse], va: u64) -> Fence {
    dev.submit_with(&Submit::on(QueueId::GFX).using(uses), |cb| cb.write_data(va, &[1, 2, 3, 4]))
        .expect("submit")
}

fn declared_setup(buffers: usize) -> Box<DeclaredFixture> {
    let fx = submit_setup(1);
    let uses: Vec<BufferUse> = (0..buffers)
        .map(|_| BufferUse::read_write(fx.dev.alloc(&BufferDesc::new(4096).declared()).expect("buffer")))
        .collect();
    let va = fx.dev.va(uses[0].buffer).expect("va");
    let f = submit_declared(&fx.dev, &uses, va);
    fx.fake.state().run(0);
    fx.dev.wait(f, 1_000_000_000).expect("warm-up wait");
    fx.fake.state().cleaned.reserve(64);
    Box::new(DeclaredFixture { fx, uses, va })
}

// One direct-mode submission of one WRITE_DATA(4) packet declaring N
// buffers: the submission above plus the buffers' checks and use notes.
#[library_benchmark]
#[bench::b4(args = (4), setup = declared_setup)]
fn submit_declared_buffers(dx: Box<DeclaredFixture>) -> Box<DeclaredFixture> {
    black_box(submit_declared(&dx.fx.dev, &dx.uses, dx.va));
    dx
}

fn wait_setup() -> (Box<SubmitFixture>, Fence) {
    let fx = submit_setup(1);
    let f = submit_n(&fx.dev, 1);
    fx.fake.state().run(0);
    (fx, f)
}

// `wait` on a fence whose value is already in memory (the fast path).
#[library_benchmark]
#[bench::signalled(setup = wait_setup)]
fn wait_signalled(input: (Box<SubmitFixture>, Fence)) -> Box<SubmitFixture> {
    let (fx, f) = input;
    black_box(fx.dev.wait(black_box(f), 1_000_000_000)).expect("wait");
    fx
}

/// A deterministic generator (64-bit LCG), so every run replays the same
/// sequence.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    /// The VA benchmark's size mix (docs/perf.md, "GPU VA allocator"): 50 % small
    /// 16 B-1 KiB and 35 % medium 1-64 KiB at 128 B alignment, 15 % large
    /// 64-256 KiB at 4 KiB alignment.
    fn request(&mut self) -> (u64, u64) {
        let r = self.next() % 100;
        if r < 50 {
            (16 + self.next() % 1009, 128)
        } else if r < 85 {
            (1024 + self.next() % (63 << 10), 128)
        } else {
            ((64 << 10) + self.next() % (192 << 10), 4096)
        }
    }
}

/// Steps per VA benchmark.
const VA_STEPS: usize = 100;

struct VaFixture<const R: bool = false> {
    va: VaAllocator<Vec<VaNode>, R>,
    live: Vec<u64>,
    /// The same allocations' handles (for `va_handle_steps`).
    handles: Vec<VaHandle>,
    /// Per step: which live allocation to free, then what to allocate.
    steps: Vec<(usize, u64, u64)>,
}

/// Which VA workload.
#[derive(Clone, Copy)]
enum VaLoad {
    /// The Memory section's mix, 4,096 nodes over 1 GiB (region trees).
    Mixed,
    /// 256 B requests, same allocator.
    Small,
    /// talc's random_actions sizes up to 200 B, 2^18 nodes over 128 MiB
    /// as in tools/talc-bench (512 B regions: the list index).
    Dense,
}

/// Nodes and arena size of a workload.
fn va_arena(load: VaLoad) -> (usize, u64) {
    match load {
        VaLoad::Dense => (1 << 18, 128 << 20),
        VaLoad::Mixed | VaLoad::Small => (4096, 1 << 30),
    }
}

/// 1,000 live allocations of the workload, plus the steps to replay.
fn va_setup(load: VaLoad) -> Box<VaFixture> {
    let (nodes, arena) = va_arena(load);
    va_fill(VaAllocator::new(vec![VaNode::EMPTY; nodes], 1 << 32, arena).expect("arena"), load)
}

/// `va_setup` with recycling (`VaAllocator::new_recycling`), as the
/// driver builds its GPU VA allocator and tools/talc-bench's adapter runs it.
fn va_recycling_setup(load: VaLoad) -> Box<VaFixture<true>> {
    let (nodes, arena) = va_arena(load);
    va_fill(VaAllocator::new_recycling(vec![VaNode::EMPTY; nodes], 1 << 32, arena).expect("arena"), load)
}

/// The live allocations and the steps of `va_setup`.
fn va_fill<const R: bool>(mut va: VaAllocator<Vec<VaNode>, R>, load: VaLoad) -> Box<VaFixture<R>> {
    let mut rng = Lcg(0x5eed);
    let request = |rng: &mut Lcg| match load {
        VaLoad::Mixed => rng.request(),
        VaLoad::Small => (256, 128),
        VaLoad::Dense => (4 + rng.next() % 196, 8),
    };
    let handles: Vec<VaHandle> = (0..1000)
        .map(|_| {
            let (s, a) = request(&mut rng);
            va.alloc_handle(s, a, VaPlacement::BottomUp).expect("fill")
        })
        .collect();
    let live = handles.iter().map(|h| h.addr()).collect();
    let steps = (0..VA_STEPS)
        .map(|_| {
            let victim = (rng.next() % 1000) as usize;
            let (s, a) = request(&mut rng);
            (victim, s, a)
        })
        .collect();
    Box::new(VaFixture { va, live, handles, steps })
}

/// The steps of `fx`: free a live allocation by address, allocate a new one.
#[inline(always)]
fn replay_steps<const R: bool>(mut fx: Box<VaFixture<R>>) -> Box<VaFixture<R>> {
    for &(victim, size, align) in &fx.steps {
        let Some(slot) = fx.live.get_mut(victim) else { continue };
        black_box(fx.va.free(*slot)).ok();
        *slot = fx.va.alloc(size, align, VaPlacement::BottomUp).unwrap_or(0);
    }
    fx
}

/// The steps of `fx` with the handle-based free (`alloc_handle`/`free_handle`:
/// no address lookup).
#[inline(always)]
fn replay_handle_steps<const R: bool>(mut fx: Box<VaFixture<R>>) -> Box<VaFixture<R>> {
    for &(victim, size, align) in &fx.steps {
        let Some(slot) = fx.handles.get_mut(victim) else { continue };
        black_box(fx.va.free_handle(*slot)).ok();
        if let Ok(h) = fx.va.alloc_handle(size, align, VaPlacement::BottomUp) {
            *slot = h;
        }
    }
    fx
}

// 100 steady-state steps of `VaAllocator`: free a live allocation (by
// address), allocate a new one; the workloads of `VaLoad`.
#[library_benchmark]
#[bench::mixed(args = (VaLoad::Mixed), setup = va_setup)]
#[bench::small(args = (VaLoad::Small), setup = va_setup)]
#[bench::dense(args = (VaLoad::Dense), setup = va_setup)]
fn va_steps(fx: Box<VaFixture>) -> Box<VaFixture> {
    replay_steps(fx)
}

// The same steps with the handle-based free.
#[library_benchmark]
#[bench::mixed(args = (VaLoad::Mixed), setup = va_setup)]
#[bench::dense(args = (VaLoad::Dense), setup = va_setup)]
fn va_handle_steps(fx: Box<VaFixture>) -> Box<VaFixture> {
    replay_handle_steps(fx)
}

// `va_steps` with recycling: a freed range of up to 8 KiB is kept for the
// next request of its exact length (`VaAllocator::new_recycling`). `mixed`
// and `small` are the driver's configuration (region trees).
#[library_benchmark]
#[bench::mixed(args = (VaLoad::Mixed), setup = va_recycling_setup)]
#[bench::small(args = (VaLoad::Small), setup = va_recycling_setup)]
#[bench::dense(args = (VaLoad::Dense), setup = va_recycling_setup)]
fn va_recycling_steps(fx: Box<VaFixture<true>>) -> Box<VaFixture<true>> {
    replay_steps(fx)
}

// `va_handle_steps` with recycling.
#[library_benchmark]
#[bench::mixed(args = (VaLoad::Mixed), setup = va_recycling_setup)]
#[bench::dense(args = (VaLoad::Dense), setup = va_recycling_setup)]
fn va_recycling_handle_steps(fx: Box<VaFixture<true>>) -> Box<VaFixture<true>> {
    replay_handle_steps(fx)
}

/// Buffers per buffer benchmark.
const BUFFERS: usize = 16;

struct BufferFixture {
    dev: Device<'static, Fake, 32>,
    size: u64,
    /// GPU address alignment (0: the smallest).
    align: u64,
}

/// A gen2 device with the MMU on (buffers take GPU addresses from the VA
/// allocator and are mapped); one buffer of the size allocated and freed
/// first, so slabs and page tables exist.
fn buffer_setup(size: u64) -> Box<BufferFixture> {
    buffer_setup_aligned(size, 0)
}

/// `buffer_setup` with buffers aligned to `align`.
fn buffer_setup_aligned(size: u64, align: u64) -> Box<BufferFixture> {
    let (_, dev) = device(Generation::Gen2, MmuMode::DEFAULT, 4096);
    let h = dev.alloc(&BufferDesc::new(size).align(align).declared()).expect("warm-up alloc");
    dev.free(h).expect("warm-up free");
    Box::new(BufferFixture { dev, size, align })
}

// 16 buffers allocated, then freed (declared tracking, nothing in
// flight): small (256 B slab slot), medium (16 KiB) and large (1 MiB,
// its own block and mapping), and 8 KiB aligned to 8 KiB (a block of its
// own, 8 KiB of VA: the length the VA allocator's recycling keeps).
#[library_benchmark]
#[bench::small(args = (256), setup = buffer_setup)]
#[bench::medium(args = (16 << 10), setup = buffer_setup)]
#[bench::large(args = (1 << 20), setup = buffer_setup)]
#[bench::block8k(args = (8 << 10, 8 << 10), setup = buffer_setup_aligned)]
fn buffer_alloc_free(fx: Box<BufferFixture>) -> Box<BufferFixture> {
    let mut hs = [None; BUFFERS];
    for h in &mut hs {
        *h = fx.dev.alloc(&BufferDesc::new(fx.size).align(fx.align).declared()).ok();
    }
    for h in hs.into_iter().flatten() {
        black_box(fx.dev.free(h)).ok();
    }
    fx
}

/// Alloc/free pairs per physical page benchmark.
const PAGES_STEPS: usize = 100;

/// A page allocator with its live blocks and the pairs to replay.
struct PagesFixture<P> {
    pages: P,
    live: Vec<(usize, usize)>,
    steps: Vec<(usize, usize)>,
}

/// `live` blocks of `load` in a `PageAlloc` (a node per page, as the
/// host platforms build it), plus [`PAGES_STEPS`] pairs.
fn pages_setup(load: Load, live: usize) -> Box<PagesFixture<umd_core::mem::pages::PageAlloc<Box<[VaNode]>>>> {
    let s = Schedule::new(load, live, PAGES_STEPS);
    let mut pages = page_alloc(&s);
    let live = s.fill(&mut pages);
    Box::new(PagesFixture { pages, live, steps: s.steps })
}

/// The same blocks and pairs in the first-fit bitmap.
fn bitmap_setup(load: Load, live: usize) -> Box<PagesFixture<Bitmap>> {
    let s = Schedule::new(load, live, PAGES_STEPS);
    let mut pages = Bitmap::new(s.window);
    let live = s.fill(&mut pages);
    Box::new(PagesFixture { pages, live, steps: s.steps })
}

fn replay_pages<P: Pages>(mut fx: Box<PagesFixture<P>>) -> Box<PagesFixture<P>> {
    let PagesFixture { pages, live, steps } = &mut *fx;
    black_box(replay(pages, live, steps));
    fx
}

// 100 pairs (free a random live block, allocate the next size) on the
// physical page allocator, at 100 / 10,000 / 50,000 live blocks of 8 KiB
// and of the mixed 1-64 page sizes (benches/common/pages_load.rs).
#[library_benchmark]
#[bench::b8k_100(args = (Load::Block8k, 100), setup = pages_setup)]
#[bench::b8k_10k(args = (Load::Block8k, 10_000), setup = pages_setup)]
#[bench::b8k_50k(args = (Load::Block8k, 50_000), setup = pages_setup)]
#[bench::mixed_100(args = (Load::Mixed, 100), setup = pages_setup)]
#[bench::mixed_10k(args = (Load::Mixed, 10_000), setup = pages_setup)]
#[bench::mixed_50k(args = (Load::Mixed, 50_000), setup = pages_setup)]
fn pages_steps(
    fx: Box<PagesFixture<umd_core::mem::pages::PageAlloc<Box<[VaNode]>>>>,
) -> Box<PagesFixture<umd_core::mem::pages::PageAlloc<Box<[VaNode]>>>> {
    replay_pages(fx)
}

// `pages_steps` on the first-fit bitmap PageAlloc replaced (the ratios'
// reference; a copy in the benchmark, so its counts only move with the
// compiler).
#[library_benchmark]
#[bench::b8k_100(args = (Load::Block8k, 100), setup = bitmap_setup)]
#[bench::b8k_10k(args = (Load::Block8k, 10_000), setup = bitmap_setup)]
#[bench::b8k_50k(args = (Load::Block8k, 50_000), setup = bitmap_setup)]
#[bench::mixed_100(args = (Load::Mixed, 100), setup = bitmap_setup)]
#[bench::mixed_10k(args = (Load::Mixed, 10_000), setup = bitmap_setup)]
#[bench::mixed_50k(args = (Load::Mixed, 50_000), setup = bitmap_setup)]
fn pages_bitmap_steps(fx: Box<PagesFixture<Bitmap>>) -> Box<PagesFixture<Bitmap>> {
    replay_pages(fx)
}

library_benchmark_group!(name = encode; benchmarks = encode_small, encode_small_kinds, encode_small_store);
library_benchmark_group!(name = submission; benchmarks = submit, submit_declared_buffers, wait_signalled);
library_benchmark_group!(name = memory; benchmarks = va_steps, va_handle_steps, va_recycling_steps, va_recycling_handle_steps, pages_steps, pages_bitmap_steps, buffer_alloc_free);

/// A gen2 device (MMU bypassed) with validation switched on or off, 16
/// live buffers, and the packet count; WRITE_DATA(4) packets go into the
/// last buffer allocated.
#[cfg(feature = "validation")]
struct ValidationFixture {
    fx: Box<SubmitFixture>,
    va: u64,
}

#[cfg(feature = "validation")]
fn validation_setup(on: bool, packets: u64) -> Box<ValidationFixture> {
    let (fake, dev) = device(Generation::Gen2, MmuMode::Bypass, 64 << 10);
    let mut va = 0;
    for _ in 0..16 {
        let h = dev.alloc(&BufferDesc::new(4096)).expect("alloc");
        va = dev.va(h).expect("va");
    }
    dev.set_validation(on).expect("validation compiled in");
    let fx = Box::new(SubmitFixture { fake, dev, packets });
    let f = submit_into(&fx, va);
    fake.state().run(0);
    fx.dev.wait(f, 1_000_000_000).expect("warm-up wait");
    fake.state().cleaned.reserve(64);
    Box::new(ValidationFixture { fx, va })
}

#[cfg(feature = "validation")]
fn submit_into(fx: &SubmitFixture, va: u64) -> Fence {
    let data = [1u32, 2, 3, 4];
    fx.dev
        .submit(QueueId::GFX, &[], |cb| {
            for i in 0..fx.packets {
                cb.write_data(va + 16 * (i % 256), &data)?;
            }
            Ok(())
        })
        .expect("submit")
}

// One submission of N WRITE_DATA(4) packets into a live buffer, with the
// validation mode off and on (feature `validation`; docs/perf.md,
// "Validation mode"): the difference is the walk.
#[cfg(feature = "validation")]
#[library_benchmark]
#[bench::off_p1(args = (false, 1), setup = validation_setup)]
#[bench::on_p1(args = (true, 1), setup = validation_setup)]
#[bench::off_p100(args = (false, 100), setup = validation_setup)]
#[bench::on_p100(args = (true, 100), setup = validation_setup)]
fn submit_validation(vx: Box<ValidationFixture>) -> Box<ValidationFixture> {
    black_box(submit_into(&vx.fx, vx.va));
    vx
}

#[cfg(feature = "validation")]
library_benchmark_group!(name = validation; benchmarks = submit_validation);

#[cfg(feature = "capture")]
library_benchmark_group!(name = capture; benchmarks = submit_captured);

#[cfg(not(any(feature = "validation", feature = "capture")))]
main!(library_benchmark_groups = encode, submission, memory);
#[cfg(all(feature = "validation", not(feature = "capture")))]
main!(library_benchmark_groups = validation);
// With the capture feature: the submissions with it off and on, for the
// ratio (docs/perf.md, "Capture").
#[cfg(feature = "capture")]
main!(library_benchmark_groups = submission, capture);
