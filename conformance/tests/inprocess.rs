//! The conformance suite on the in-process model, both generations, with
//! interrupts and polling only, on a coherent platform and on one that
//! models a write-back CPU cache (CPU stores reach the model only when
//! cleaned, GPU writes reach the CPU only when invalidated, dirty lines are
//! written back at random doorbells). One test per (generation, mode); each
//! prints every scenario's result and fails on any FAIL (a SKIP must carry
//! a reason and is listed). The last test removes one clean (the page
//! tables') and shows the suite catches it.

use conformance::{SUITE_CHUNKS, SUITE_CONFIG, SUITE_MMU};
use platform_linux::suite::run_suite;
use platform_linux::{Cache, InProcess, InProcessOptions};
use refgpu_model::{Generation as ModelGen, ModelConfig};
use std::sync::atomic::{AtomicU64, Ordering};
use umd_core::direct::{Device, MmuMode};
use umd_core::hw::regs;
use umd_core::platform::{DirectIo, DmaFlags, DmaRegion, IrqWait, Platform, PlatformError};
use umd_core::storage::DeviceStorage;

fn platform(gen: ModelGen, cache: Cache) -> InProcess {
    let cfg = ModelConfig { generation: gen, mem_size: 96 << 20, ..ModelConfig::default() };
    InProcess::with_options(cfg, InProcessOptions { cache }).expect("model starts")
}

fn run_on(platform: &InProcess, label: &str, use_irq: bool) {
    let cfg = umd_core::config::Config { use_irq, ..SUITE_CONFIG };
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, InProcess, SUITE_CHUNKS> =
        Device::new(platform, &mut storage, cfg, SUITE_MMU).expect("device comes up");
    let failures = run_suite(&dev, label);
    assert!(failures.is_empty(), "{label}:\n{}", failures.join("\n"));
    let report = dev.shutdown();
    assert_eq!(report.leaked_buffers, 0, "the suite leaked buffers");
    assert_eq!(platform.dma_pages_used(), 0, "platform memory leaked");
}

fn run(gen: ModelGen, use_irq: bool) {
    run_on(&platform(gen, Cache::Coherent), &format!("{gen:?} irq={use_irq}"), use_irq);
}

/// Write-back cache; 2 % of the dirty lines written back at each doorbell,
/// so a missing clean can also show up as data arriving at a random time.
fn run_write_back(gen: ModelGen) {
    let p = platform(gen, Cache::WriteBack { seed: 0x5EED, evict_per_mille: 20 });
    run_on(&p, &format!("{gen:?} write-back"), true);
    let stats = p.cache_stats();
    assert!(stats.lines_cleaned > 0 && stats.lines_invalidated > 0, "the cache was exercised: {stats:?}");
}

#[test]
fn gen1_with_interrupts() {
    run(ModelGen::Gen1, true);
}

#[test]
fn gen1_polling_only() {
    run(ModelGen::Gen1, false);
}

#[test]
fn gen2_with_interrupts() {
    run(ModelGen::Gen2, true);
}

#[test]
fn gen2_polling_only() {
    run(ModelGen::Gen2, false);
}

/// The whole suite with the validation mode on: no scenario's correct work
/// is refused (the scenarios that fault on purpose switch it off around
/// that submission), and `dma_overrun_caught` sees the overrun refused.
#[cfg(feature = "validation")]
#[test]
fn gen2_validation_mode() {
    let p = platform(ModelGen::Gen2, Cache::Coherent);
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, InProcess, SUITE_CHUNKS> =
        Device::new(&p, &mut storage, SUITE_CONFIG, SUITE_MMU).expect("device comes up");
    dev.set_validation(true).expect("built with the validation feature");
    let failures = run_suite(&dev, "Gen2 validation");
    assert!(failures.is_empty(), "Gen2 validation:\n{}", failures.join("\n"));
    assert!(dev.validation(), "the suite left validation on");
}

/// The whole suite with deferred doorbells (a 200 µs window): every
/// scenario's work reaches the GPU through the flush rules (a wait or
/// query on a held fence, another queue's wait, the window's expiry, a
/// full ring) and passes as with the window off; the window did defer
/// doorbells (fewer doorbells than submissions).
fn run_batching(gen: ModelGen) {
    let inner = platform(gen, Cache::Coherent);
    let p = Counting { inner: &inner, doorbells: AtomicU64::new(0) };
    let cfg = umd_core::config::Config { batch_window_ns: 200_000, ..SUITE_CONFIG };
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, Counting<'_>, SUITE_CHUNKS> =
        Device::new(&p, &mut storage, cfg, SUITE_MMU).expect("device comes up");
    let label = format!("{gen:?} batch window");
    let failures = run_suite(&dev, &label);
    assert!(failures.is_empty(), "{label}:\n{}", failures.join("\n"));
    let (submissions, doorbells) = (dev.stats().submissions, p.doorbells.load(Ordering::Relaxed));
    println!("{label}: {submissions} submissions, {doorbells} doorbells");
    assert!(doorbells < submissions, "{label}: {doorbells} doorbells for {submissions} submissions");
    let report = dev.shutdown();
    assert_eq!(report.leaked_buffers, 0, "the suite leaked buffers");
    assert_eq!(inner.dma_pages_used(), 0, "platform memory leaked");
}

/// The in-process platform, its engine doorbells counted.
struct Counting<'a> {
    inner: &'a InProcess,
    doorbells: AtomicU64,
}

// SAFETY: every region comes from the wrapped platform, which honours
// `DmaRegion::new`'s contract, and its clock is the wrapped one.
unsafe impl Platform for Counting<'_> {
    type RawMutex = <InProcess as Platform>::RawMutex;
    fn dma_alloc(&self, len: usize, flags: DmaFlags) -> Result<DmaRegion, PlatformError> {
        self.inner.dma_alloc(len, flags)
    }
    fn dma_free(&self, region: DmaRegion) {
        self.inner.dma_free(region)
    }
    fn cache_clean(&self, region: &DmaRegion, offset: usize, len: usize) {
        self.inner.cache_clean(region, offset, len)
    }
    fn cache_invalidate(&self, region: &DmaRegion, offset: usize, len: usize) {
        self.inner.cache_invalidate(region, offset, len)
    }
    fn now_ns(&self) -> u64 {
        self.inner.now_ns()
    }
    fn delay_ns(&self, ns: u64) {
        self.inner.delay_ns(ns)
    }
    fn wait_irq(&self, timeout_ns: u64) -> IrqWait {
        self.inner.wait_irq(timeout_ns)
    }
}

impl DirectIo for Counting<'_> {
    fn read_reg(&self, offset: u32) -> Result<u32, PlatformError> {
        self.inner.read_reg(offset)
    }
    fn write_reg(&self, offset: u32, value: u32) -> Result<(), PlatformError> {
        self.inner.write_reg(offset, value)
    }
    fn doorbell(&self, engine: u32) -> Result<(), PlatformError> {
        self.doorbells.fetch_add(1, Ordering::Relaxed);
        self.inner.doorbell(engine)
    }
    fn control_doorbell(&self) -> Result<(), PlatformError> {
        self.inner.control_doorbell()
    }
}

#[test]
fn gen1_batch_window() {
    run_batching(ModelGen::Gen1);
}

#[test]
fn gen2_batch_window() {
    run_batching(ModelGen::Gen2);
}

#[test]
fn gen1_write_back_cache() {
    run_write_back(ModelGen::Gen1);
}

#[test]
fn gen2_write_back_cache() {
    run_write_back(ModelGen::Gen2);
}

/// The page tables' clean removed (the cache drops every clean of the
/// table region once the device is up): the PTEs of every buffer the
/// suite maps stay in the CPU cache, the GPU faults on them, and the suite
/// must say so.
#[test]
fn removed_page_table_clean_is_caught() {
    let p = platform(ModelGen::Gen2, Cache::WriteBack { seed: 1, evict_per_mille: 0 });
    let MmuMode::Enabled { table_pages, .. } = SUITE_MMU else { panic!("the suite runs with the MMU on") };
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, InProcess, SUITE_CHUNKS> =
        Device::new(&p, &mut storage, SUITE_CONFIG, SUITE_MMU).expect("device comes up");
    // The table region starts at the root table.
    let lo = u64::from(p.read_reg(regs::MMU_ROOT_LO).unwrap());
    let hi = u64::from(p.read_reg(regs::MMU_ROOT_HI).unwrap());
    let root = hi << 32 | lo;
    p.ignore_cleans(root..root + (table_pages as u64) * 4096).unwrap();
    let failures = run_suite(&dev, "Gen2 write-back, page-table cleans dropped");
    let ignored = p.cache_stats().cleans_ignored;
    assert!(ignored > 0, "the injection dropped no clean");
    assert!(!failures.is_empty(), "the suite passed with {ignored} page-table cleans dropped");
    println!("{} scenarios failed with the page-table clean removed", failures.len());
}
