//! VA allocator benchmark against linked_list_allocator, buddy_system_allocator
//! and talc, on one workload in one run.
//!
//! Workload: 10,000 live allocations with sizes from the three size classes
//! of `docs/memory.md` section 2 (50 % small 16 B..1 KiB, 35 % medium 1..64
//! KiB, 15 % large 64..256 KiB; large ones 4 KiB aligned, others 128 B
//! aligned) in a 1 GiB arena; then STEPS steady-state steps, each freeing a
//! random live allocation and allocating a new one. Every allocator sees
//! the same sequence (same seed). Pass 1 times the whole loop (throughput);
//! pass 2 times every single operation with `Instant` (mean, p99, p99.9,
//! max; the timer itself costs ~20-40 ns and is included in all rows
//! alike).
//!
//! The baselines manage real memory, so each gets a 1 GiB zeroed allocation
//! (pages are only touched where they keep headers) and addresses are
//! translated to offsets. A second row of ours runs the same workload in a
//! 128 TiB arena, where all allocations share one region tree (the
//! allocation index's O(log n) worst-case shape); its fragmentation column
//! is not comparable (the arena is mostly one hole). A fourth row of ours is
//! the driver's configuration and path: recycling, with `alloc_handle` and
//! `free_handle` (a free without the address lookup).
//! Run: `cargo bench -p umd-core --bench va_alloc`
//! (`VA_BENCH_ONLY_OURS=1` for our four rows only, e.g. under `perf record`;
//! `VA_BENCH_LARGE_ALIGN=128` gives the large class 128 B alignment).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::hint::black_box;
use std::ptr::NonNull;
use std::time::Instant;

use umd_core::mem::va::{VaAllocator, VaHandle, VaNode, VaPlacement};

const ARENA: u64 = 1 << 30;
const LIVE: usize = 10_000;
const STEPS: usize = 100_000;
const NODES: usize = 2 * LIVE + 16;

trait RangeAlloc {
    fn name(&self) -> &'static str;
    /// What an allocation hands back and its free takes: the address, or
    /// for [`OursHandles`] the allocator's handle.
    type Token: Copy;
    fn alloc(&mut self, size: u64, align: u64) -> Option<Self::Token>;
    fn free(&mut self, token: Self::Token, size: u64, align: u64);
    /// Bytes not allocated (including rounding the allocator keeps).
    fn free_bytes(&self) -> u64;
    /// Out-of-band metadata bytes (not counting the managed range).
    fn metadata_bytes(&self) -> u64 {
        0
    }
    /// Size of the managed range.
    fn arena(&self) -> u64 {
        ARENA
    }
}

// ---- ours -----------------------------------------------------------------

/// Our allocator on the 1 GiB arena (`sparse == false`), or on a 128 TiB
/// arena (`sparse == true`): the same workload then falls entirely in the
/// first of its 8 GiB regions, so every lookup walks one AVL tree of all live
/// allocations, the O(log n) worst-case shape of the allocation index.
/// `R`: built with `VaAllocator::new_recycling` (freed ranges up to 8 KiB
/// kept for the next request of their exact length).
struct Ours<const R: bool>(VaAllocator<Box<[VaNode]>, R>, bool);

const SPARSE_ARENA: u64 = 1 << 47;

impl<const R: bool> RangeAlloc for Ours<R> {
    type Token = u64;
    fn name(&self) -> &'static str {
        match (R, self.1) {
            (true, _) => "umd-core VaAllocator, recycling",
            (false, true) => "umd-core VaAllocator, 128 TiB arena (one region tree)",
            (false, false) => "umd-core VaAllocator (TLSF + region trees)",
        }
    }
    fn arena(&self) -> u64 {
        self.0.size()
    }
    fn alloc(&mut self, size: u64, align: u64) -> Option<u64> {
        self.0.alloc(size, align, VaPlacement::BottomUp).ok()
    }
    fn free(&mut self, addr: u64, _size: u64, _align: u64) {
        self.0.free(addr).unwrap();
    }
    fn free_bytes(&self) -> u64 {
        self.0.stats().free
    }
    fn metadata_bytes(&self) -> u64 {
        self.0.stats().metadata_bytes()
    }
}

/// The driver's configuration and path: recycling, allocated with
/// `alloc_handle` and freed with `free_handle` (the driver's buffers keep
/// the handle), so a free does not look its address up.
struct OursHandles(VaAllocator<Box<[VaNode]>, true>);

impl RangeAlloc for OursHandles {
    type Token = VaHandle;
    fn name(&self) -> &'static str {
        "umd-core VaAllocator, recycling, freed by handle (the driver's path)"
    }
    fn alloc(&mut self, size: u64, align: u64) -> Option<VaHandle> {
        self.0.alloc_handle(size, align, VaPlacement::BottomUp).ok()
    }
    fn free(&mut self, handle: VaHandle, _size: u64, _align: u64) {
        self.0.free_handle(handle).unwrap();
    }
    fn free_bytes(&self) -> u64 {
        self.0.stats().free
    }
    fn metadata_bytes(&self) -> u64 {
        self.0.stats().metadata_bytes()
    }
}

// ---- real-memory baselines ------------------------------------------------

struct Region {
    ptr: *mut u8,
    layout: Layout,
}

impl Region {
    fn new() -> Self {
        // Aligned to its size so the buddy allocator can use it as one block.
        let layout = Layout::from_size_align(ARENA as usize, ARENA as usize).unwrap();
        // SAFETY: non-zero size; the region is freed in Drop with the same layout.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        // Fault every page in now so no allocator pays first-touch page
        // faults inside the timed loops.
        for off in (0..ARENA as usize).step_by(4096) {
            // SAFETY: off < ARENA, inside the allocation.
            unsafe { ptr.add(off).write_volatile(0) };
        }
        Region { ptr, layout }
    }
    fn base(&self) -> u64 {
        self.ptr as u64
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

fn layout(size: u64, align: u64) -> Layout {
    Layout::from_size_align(size as usize, align as usize).unwrap()
}

struct Lla(linked_list_allocator::Heap, Region);

impl RangeAlloc for Lla {
    type Token = u64;
    fn name(&self) -> &'static str {
        "linked_list_allocator 0.10"
    }
    fn alloc(&mut self, size: u64, align: u64) -> Option<u64> {
        let p = self.0.allocate_first_fit(layout(size, align)).ok()?;
        Some(p.as_ptr() as u64 - self.1.base())
    }
    fn free(&mut self, addr: u64, size: u64, align: u64) {
        let p = NonNull::new((self.1.base() + addr) as *mut u8).unwrap();
        // SAFETY: p was returned by allocate_first_fit with this layout.
        unsafe { self.0.deallocate(p, layout(size, align)) }
    }
    fn free_bytes(&self) -> u64 {
        self.0.free() as u64
    }
}

struct Buddy(buddy_system_allocator::Heap<32>, Region);

impl RangeAlloc for Buddy {
    type Token = u64;
    fn name(&self) -> &'static str {
        "buddy_system_allocator 0.11 Heap"
    }
    fn alloc(&mut self, size: u64, align: u64) -> Option<u64> {
        let p = self.0.alloc(layout(size, align)).ok()?;
        Some(p.as_ptr() as u64 - self.1.base())
    }
    fn free(&mut self, addr: u64, size: u64, align: u64) {
        let p = NonNull::new((self.1.base() + addr) as *mut u8).unwrap();
        self.0.dealloc(p, layout(size, align));
    }
    fn free_bytes(&self) -> u64 {
        (self.0.stats_total_bytes() - self.0.stats_alloc_actual()) as u64
    }
}

/// buddy_system_allocator's range allocator (no backing memory; BTreeSet
/// free lists on the heap), in 128-byte frames.
struct BuddyFrames(buddy_system_allocator::FrameAllocator<32>, u64);

impl RangeAlloc for BuddyFrames {
    type Token = u64;
    fn name(&self) -> &'static str {
        "buddy_system_allocator FrameAllocator"
    }
    fn alloc(&mut self, size: u64, align: u64) -> Option<u64> {
        let l = layout(size.div_ceil(128), (align / 128).max(1));
        let f = self.0.alloc_aligned(l)?;
        self.1 += l.size().next_power_of_two().max(l.align()) as u64 * 128;
        Some(f as u64 * 128)
    }
    fn free(&mut self, addr: u64, size: u64, align: u64) {
        let l = layout(size.div_ceil(128), (align / 128).max(1));
        self.0.dealloc_aligned((addr / 128) as usize, l);
        self.1 -= l.size().next_power_of_two().max(l.align()) as u64 * 128;
    }
    fn free_bytes(&self) -> u64 {
        ARENA - self.1
    }
}

struct Talc(talc::Talc<talc::ErrOnOom>, Region);

impl RangeAlloc for Talc {
    type Token = u64;
    fn name(&self) -> &'static str {
        "talc 4.4"
    }
    fn alloc(&mut self, size: u64, align: u64) -> Option<u64> {
        // SAFETY: the layout has non-zero size.
        let p = unsafe { self.0.malloc(layout(size, align)) }.ok()?;
        Some(p.as_ptr() as u64 - self.1.base())
    }
    fn free(&mut self, addr: u64, size: u64, align: u64) {
        let p = NonNull::new((self.1.base() + addr) as *mut u8).unwrap();
        // SAFETY: p was returned by malloc with this layout.
        unsafe { self.0.free(p, layout(size, align)) }
    }
    fn free_bytes(&self) -> u64 {
        self.0.get_counters().available_bytes as u64
    }
}

// ---- workload -------------------------------------------------------------

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn request(r: &mut Rng) -> (u64, u64) {
    let c = r.below(100);
    if c < 50 {
        (16 + r.below(1024 - 16), 128)
    } else if c < 85 {
        (1024 + r.below(63 * 1024), 128)
    } else {
        (64 * 1024 + 1 + r.below(192 * 1024), large_align())
    }
}

/// Alignment of the large class: 4 KiB, or 128 B with
/// `VA_BENCH_LARGE_ALIGN=128` (to separate the cost of high alignment from
/// the cost of large sizes, e.g. for talc 4's high-alignment path).
fn large_align() -> u64 {
    static ALIGN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *ALIGN.get_or_init(|| {
        std::env::var("VA_BENCH_LARGE_ALIGN").ok().and_then(|v| v.parse().ok()).unwrap_or(4096)
    })
}

#[derive(Default)]
struct Result {
    name: &'static str,
    ops_per_s: f64,
    mean_ns: f64,
    p99_ns: u64,
    p999_ns: u64,
    max_ns: u64,
    max_alloc_ns: u64,
    max_free_ns: u64,
    frag: f64,
    largest: u64,
    free: u64,
    in_arena_overhead: f64,
    metadata: f64,
    failures: u64,
}

fn populate<A: RangeAlloc>(a: &mut A, r: &mut Rng, live: &mut Vec<(A::Token, u64, u64)>, failures: &mut u64) {
    while live.len() < LIVE {
        let (s, al) = request(r);
        match a.alloc(s, al) {
            Some(x) => live.push((x, s, al)),
            None => *failures += 1,
        }
        if *failures > 1000 {
            break;
        }
    }
}

fn run<A: RangeAlloc>(mut make: impl FnMut() -> A) -> Result {
    // Pass 1: throughput.
    let mut a = make();
    let mut r = Rng(42);
    let mut live = Vec::with_capacity(LIVE);
    let mut failures = 0;
    populate(&mut a, &mut r, &mut live, &mut failures);
    let t = Instant::now();
    let mut ops = 0u64;
    for _ in 0..STEPS {
        let i = r.below(live.len() as u64) as usize;
        let (x, s, al) = live.swap_remove(i);
        a.free(x, s, al);
        let (s, al) = request(&mut r);
        match black_box(a.alloc(s, al)) {
            Some(x) => live.push((x, s, al)),
            None => failures += 1,
        }
        ops += 2;
    }
    let secs = t.elapsed().as_secs_f64();
    drop(live);
    drop(a);

    // Pass 2: per-operation latency, same sequence.
    let mut a = make();
    let mut r = Rng(42);
    let mut live = Vec::with_capacity(LIVE);
    let mut f2 = 0;
    populate(&mut a, &mut r, &mut live, &mut f2);
    let mut lat = Vec::with_capacity(2 * STEPS);
    let (mut max_alloc, mut max_free) = (0u64, 0u64);
    for _ in 0..STEPS {
        let i = r.below(live.len() as u64) as usize;
        let (x, s, al) = live.swap_remove(i);
        let t = Instant::now();
        a.free(x, s, al);
        let d = t.elapsed().as_nanos() as u64;
        max_free = max_free.max(d);
        lat.push(d);
        let (s, al) = request(&mut r);
        let t = Instant::now();
        let got = black_box(a.alloc(s, al));
        let d = t.elapsed().as_nanos() as u64;
        max_alloc = max_alloc.max(d);
        lat.push(d);
        if let Some(x) = got {
            live.push((x, s, al));
        }
    }
    lat.sort_unstable();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    let mean = lat.iter().sum::<u64>() as f64 / lat.len() as f64;

    // Fragmentation: largest allocatable block, found by binary search.
    let free = a.free_bytes();
    let (mut lo, mut hi) = (0u64, free / 128 + 1);
    while lo + 1 < hi {
        let mid = (lo + hi) / 2;
        if let Some(x) = a.alloc(mid * 128, 128) {
            a.free(x, mid * 128, 128);
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let largest = lo * 128;
    let requested: u64 = live.iter().map(|l| l.1).sum();
    let consumed = a.arena() - free;
    let n = live.len() as f64;
    Result {
        name: a.name(),
        ops_per_s: ops as f64 / secs,
        mean_ns: mean,
        p99_ns: pct(0.99),
        p999_ns: pct(0.999),
        max_ns: *lat.last().unwrap(),
        max_alloc_ns: max_alloc,
        max_free_ns: max_free,
        frag: if free == 0 { 0.0 } else { 1.0 - largest as f64 / free as f64 },
        largest,
        free,
        in_arena_overhead: (consumed as f64 - requested as f64) / n,
        metadata: a.metadata_bytes() as f64 / n,
        failures,
    }
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` runs a smoke pass.
    let quick = !std::env::args().any(|a| a == "--bench");
    if quick {
        let mut a =
            Ours(VaAllocator::new(vec![VaNode::EMPTY; 64].into_boxed_slice(), 0, ARENA).unwrap(), false);
        let x = a.alloc(4096, 4096).unwrap();
        a.free(x, 4096, 4096);
        println!("va_alloc: smoke run only; use `cargo bench` for figures");
        return;
    }
    let mut results = Vec::new();
    results.push(run(|| {
        Ours(VaAllocator::new(vec![VaNode::EMPTY; NODES].into_boxed_slice(), 0, ARENA).unwrap(), false)
    }));
    results.push(run(|| {
        Ours(VaAllocator::new(vec![VaNode::EMPTY; NODES].into_boxed_slice(), 0, SPARSE_ARENA).unwrap(), true)
    }));
    results.push(run(|| {
        Ours(
            VaAllocator::new_recycling(vec![VaNode::EMPTY; NODES].into_boxed_slice(), 0, ARENA).unwrap(),
            false,
        )
    }));
    results.push(run(|| {
        OursHandles(
            VaAllocator::new_recycling(vec![VaNode::EMPTY; NODES].into_boxed_slice(), 0, ARENA).unwrap(),
        )
    }));
    if std::env::var_os("VA_BENCH_ONLY_OURS").is_some() {
        for r in &results {
            println!(
                "{}: {:.3e} ops/s, mean {:.0} ns, p99.9 {} ns, max {} ns",
                r.name, r.ops_per_s, r.mean_ns, r.p999_ns, r.max_ns
            );
        }
        return;
    }
    results.push(run(|| {
        let region = Region::new();
        // SAFETY: the region is valid for ARENA bytes and outlives the heap.
        let heap = unsafe { linked_list_allocator::Heap::new(region.ptr, ARENA as usize) };
        Lla(heap, region)
    }));
    results.push(run(|| {
        let region = Region::new();
        let mut heap = buddy_system_allocator::Heap::<32>::new();
        // SAFETY: as above.
        unsafe { heap.init(region.ptr as usize, ARENA as usize) };
        Buddy(heap, region)
    }));
    results.push(run(|| {
        let mut f = buddy_system_allocator::FrameAllocator::<32>::new();
        f.add_frame(0, (ARENA / 128) as usize);
        BuddyFrames(f, 0)
    }));
    results.push(run(|| {
        let region = Region::new();
        let mut t = talc::Talc::new(talc::ErrOnOom);
        // SAFETY: as above.
        unsafe { t.claim(talc::Span::from_base_size(region.ptr, ARENA as usize)).unwrap() };
        Talc(t, region)
    }));

    let ours = results[0].ops_per_s;
    println!("workload: {LIVE} live allocations (50% <1 KiB, 35% 1-64 KiB, 15% 64-256 KiB), {STEPS} free+alloc steps, 1 GiB arena");
    println!(
        "| allocator | ops/s | ours / this | mean ns | p99 ns | p99.9 ns | max ns (alloc / free) | fragmentation | largest free MiB | free MiB | in-arena overhead B/alloc | out-of-band metadata B/alloc | failed allocs |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in &results {
        println!(
            "| {} | {:.2e} | {:.2} | {:.0} | {} | {} | {} ({} / {}) | {:.4} | {:.1} | {:.1} | {:.0} | {:.1} | {} |",
            r.name,
            r.ops_per_s,
            ours / r.ops_per_s,
            r.mean_ns,
            r.p99_ns,
            r.p999_ns,
            r.max_ns,
            r.max_alloc_ns,
            r.max_free_ns,
            r.frag,
            r.largest as f64 / (1 << 20) as f64,
            r.free as f64 / (1 << 20) as f64,
            r.in_arena_overhead,
            r.metadata,
            r.failures,
        );
    }
}
