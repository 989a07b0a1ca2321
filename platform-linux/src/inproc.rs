//! In-process platform: a [`refgpu_model::Model`] in this process behind
//! [`Platform`] + [`DirectIo`], for host tests without a server.
//!
//! Register calls go straight to [`Model::read_reg`] / [`Model::write_reg`]
//! (the in-process semantics of `docs/refgpu.md` 2.3: side effects act
//! before the call returns, so `control_doorbell` only gives the
//! write-back cache of `Cache::WriteBack` a moment to write lines back);
//! `doorbell(e)` writes engine `e`'s DOORBELL register. The model delivers
//! interrupt vectors to an [`IrqSink`] that counts them under a mutex;
//! `wait_irq` sleeps on the paired condition variable. DMA memory is carved
//! in 4 KiB pages out of the model's own system-memory window
//! ([`Model::mem_host_ptr`]).
//!
//! Two cache modes ([`InProcessOptions::cache`]):
//!
//! - [`Cache::Coherent`] ([`InProcess::new`]): a region's CPU pointer is
//!   the model's memory itself; cache maintenance does nothing;
//! - [`Cache::WriteBack`]: a region's CPU pointer is a shadow, and the
//!   model of a write-back data cache in [`crate::cache`] decides what the
//!   GPU and the CPU see: CPU stores reach the model on `cache_clean` (or
//!   a spontaneous write-back at a doorbell), GPU writes reach the CPU on
//!   `cache_invalidate`. `dma_alloc` zeroes the memory and the shadow;
//!   `dma_free` drops the shadow with any dirty lines (they are not written
//!   back). Fault injection: [`InProcess::ignore_cleans`]; counters:
//!   [`InProcess::cache_stats`].

use std::ops::Range;
use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use refgpu_model::{regs as mregs, IrqSink, Model, ModelConfig, ModelError};
use std::sync::atomic::{AtomicU64, Ordering};

use umd_core::config::Config;
use umd_core::platform::{DirectIo, DmaFlags, DmaRegion, IrqWait, Platform, PlatformError};

use crate::cache::{Cache, CacheControlError, CacheStats, WriteBackCache};
use crate::sys;
use crate::{page_heap, PageHeap};
use umd_core::mem::pages::PAGE;

/// Interrupts raised and not yet consumed by `wait_irq`.
#[derive(Default)]
struct IrqLatch {
    pending: Mutex<u64>,
    cv: Condvar,
}

impl IrqSink for IrqLatch {
    fn raise(&self, _vector: u32) {
        *self.pending.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.cv.notify_all();
    }
}

/// Why the in-process platform could not be made.
#[derive(Debug)]
pub enum InProcessError {
    /// The model refused its configuration.
    Model(ModelError),
    /// A bad `UMD_*` variable or `UMD_CONFIG` file ([`crate::config`]).
    Config(crate::config::ConfigError),
}

impl std::fmt::Display for InProcessError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InProcessError::Model(e) => write!(f, "model: {e}"),
            InProcessError::Config(e) => write!(f, "configuration from the environment: {e}"),
        }
    }
}

impl std::error::Error for InProcessError {}

impl From<ModelError> for InProcessError {
    fn from(e: ModelError) -> Self {
        InProcessError::Model(e)
    }
}

/// How [`InProcess::with_options`] builds the platform.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct InProcessOptions {
    /// Coherent (the default) or a modelled write-back CPU cache.
    pub cache: Cache,
}

/// The in-process platform.
pub struct InProcess {
    model: Arc<Model>,
    irq: Arc<IrqLatch>,
    heap: Mutex<PageHeap>,
    base: NonNull<u8>,
    mem_base: u64,
    irq_wakeups: AtomicU64,
    mode: Cache,
    /// The write-back cache (None when coherent). Lock order: `heap`
    /// before `cache`.
    cache: Option<Mutex<WriteBackCache>>,
    /// The configuration the environment gives ([`InProcess::config`]).
    config: Config,
}

impl std::fmt::Debug for InProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcess")
            .field("mem_base", &self.mem_base)
            .field("heap", &self.heap)
            .field("cache", &self.mode)
            .finish()
    }
}

// SAFETY: the raw base pointer points into memory owned by `model`, which
// is Send + Sync and only accessed atomically by the model's threads; the
// shadows of the write-back cache are owned heap allocations behind a mutex.
unsafe impl Send for InProcess {}
// SAFETY: every `&self` method either goes to the model (Sync), locks the
// heap or the cache, or only reads the immutable base pointer and window.
unsafe impl Sync for InProcess {}

impl InProcess {
    /// A coherent model with `cfg` (its memory window must be 4 KiB
    /// aligned); the same as [`InProcess::with_options`] with the defaults.
    pub fn new(cfg: ModelConfig) -> Result<Self, InProcessError> {
        Self::with_options(cfg, InProcessOptions::default())
    }

    /// A model with `cfg` and the given cache mode. The `UMD_*`
    /// environment is read first ([`InProcess::config`]); a bad value is
    /// [`InProcessError::Config`] and no model is started.
    pub fn with_options(cfg: ModelConfig, opts: InProcessOptions) -> Result<Self, InProcessError> {
        let config = crate::config::from_env().map_err(InProcessError::Config)?;
        if cfg.mem_base % PAGE as u64 != 0 || cfg.mem_size % PAGE as u64 != 0 {
            return Err(ModelError::Config("the in-process platform needs a 4 KiB aligned window").into());
        }
        let irq = Arc::new(IrqLatch::default());
        let sink: Arc<dyn IrqSink> = irq.clone();
        let model = Arc::new(Model::with_irq_sink(cfg, sink)?);
        let pages = (model.mem_size() / PAGE as u64) as usize;
        let heap = page_heap(pages)
            .map_err(|_| ModelError::Config("the in-process platform needs a window of at least one page"))?;
        Ok(Self {
            base: model.mem_host_ptr(),
            mem_base: model.mem_base(),
            model,
            irq,
            heap: Mutex::new(heap),
            irq_wakeups: AtomicU64::new(0),
            mode: opts.cache,
            cache: match opts.cache {
                Cache::Coherent => None,
                Cache::WriteBack { seed, evict_per_mille } => {
                    Some(Mutex::new(WriteBackCache::new(seed, evict_per_mille)))
                }
            },
            config,
        })
    }

    /// The driver configuration for devices on this platform: the
    /// defaults with the `UMD_*` environment and `UMD_CONFIG` file applied
    /// (read when the platform was made, [`crate::config`]).
    pub fn config(&self) -> Config {
        self.config
    }

    /// The cache mode the platform was built with.
    pub fn cache_mode(&self) -> Cache {
        self.mode
    }

    fn cache(&self) -> Option<MutexGuard<'_, WriteBackCache>> {
        self.cache.as_ref().map(|c| c.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Fault injection for the write-back cache: from now on, cleans of
    /// lines overlapping the device addresses `range` are dropped (the
    /// lines stay dirty and reach memory only if evicted). Refused, with
    /// nothing changed, on a coherent platform or for an empty range.
    pub fn ignore_cleans(&self, range: Range<u64>) -> Result<(), CacheControlError> {
        if range.start >= range.end {
            return Err(CacheControlError::EmptyRange { start: range.start, end: range.end });
        }
        self.cache().ok_or(CacheControlError::Coherent)?.ignore_cleans(range);
        Ok(())
    }

    /// Honours every clean again (undoes [`InProcess::ignore_cleans`]).
    pub fn clear_ignored_cleans(&self) -> Result<(), CacheControlError> {
        self.cache().ok_or(CacheControlError::Coherent)?.clear_ignored_cleans();
        Ok(())
    }

    /// What the write-back cache did so far (all zero when coherent).
    pub fn cache_stats(&self) -> CacheStats {
        self.cache().map(|c| c.stats()).unwrap_or_default()
    }

    /// Lines (64 bytes) the CPU holds dirty now, over every live region (0
    /// when coherent).
    pub fn dirty_lines(&self) -> usize {
        self.cache().map(|c| c.dirty_lines()).unwrap_or(0)
    }

    /// Spontaneous write-back at a doorbell (write-back mode only).
    fn doorbell_evictions(&self) {
        if let Some(mut c) = self.cache() {
            c.evict_some(&self.model);
        }
    }

    /// The model (fault injection, snapshots, memory helpers).
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Pages (4 KiB) in use by DMA allocations.
    pub fn dma_pages_used(&self) -> usize {
        self.heap.lock().unwrap_or_else(|p| p.into_inner()).used_pages()
    }

    /// How many times `wait_irq` woke up on an interrupt.
    pub fn irq_wakeups(&self) -> u64 {
        self.irq_wakeups.load(Ordering::Relaxed)
    }
}

// SAFETY: regions are distinct page runs of the model's owned window (the
// heap never hands a page out twice), zeroed, valid while the model (held
// by `self`) lives, and the device reaches them at `mem_base + offset`
// (physical addresses). In write-back mode the CPU pointer is instead a
// zeroed, page-aligned shadow owned by the cache model until `dma_free`,
// which reaches the same device bytes after cache maintenance (the
// non-coherent case of `DmaRegion::new`). `now_ns` is CLOCK_MONOTONIC.
unsafe impl Platform for InProcess {
    type RawMutex = crate::FairLock;

    fn dma_alloc(&self, len: usize, _flags: DmaFlags) -> Result<DmaRegion, PlatformError> {
        let len = len.max(1).checked_next_multiple_of(PAGE).ok_or(PlatformError::OutOfMemory { len })?;
        let mut heap = self.heap.lock().unwrap_or_else(|p| p.into_inner());
        let first = heap.alloc(len / PAGE).map_err(|_| PlatformError::OutOfMemory { len })?;
        let off = first * PAGE;
        let pa = self.mem_base + off as u64;
        // Zero through the model (atomic writes; no queued command can
        // touch pages that were free).
        if self.model.write_mem(pa, &vec![0u8; len]).is_err() {
            let _ = heap.free(first, len / PAGE);
            return Err(PlatformError::OutOfMemory { len });
        }
        let cpu = match self.cache() {
            None => {
                // SAFETY: `off + len` lies within the model's window of
                // `mem_size` bytes (the heap covers exactly that many pages).
                unsafe { NonNull::new_unchecked(self.base.as_ptr().add(off)) }
            }
            Some(mut cache) => match cache.attach(pa, len) {
                Some(shadow) => shadow,
                None => {
                    let _ = heap.free(first, len / PAGE);
                    return Err(PlatformError::OutOfMemory { len });
                }
            },
        };
        // SAFETY: see the impl-level comment.
        Ok(unsafe { DmaRegion::new(cpu, pa, len) })
    }

    fn dma_free(&self, region: DmaRegion) {
        let off = region.dev_addr().wrapping_sub(self.mem_base) as usize;
        let mut heap = self.heap.lock().unwrap_or_else(|p| p.into_inner());
        if off % PAGE != 0 || off >= heap.pages() * PAGE {
            return;
        }
        // A region this platform did not hand out (no shadow at that
        // address with that pointer) frees nothing.
        if let Some(mut cache) = self.cache() {
            if !cache.detach(region.dev_addr(), region.cpu_ptr()) {
                return;
            }
        }
        let _ = heap.free(off / PAGE, region.len().div_ceil(PAGE));
    }

    fn cache_clean(&self, region: &DmaRegion, offset: usize, len: usize) {
        if let Some(mut c) = self.cache() {
            c.clean(&self.model, region.dev_addr(), region.cpu_ptr(), offset, len);
        }
    }

    fn cache_invalidate(&self, region: &DmaRegion, offset: usize, len: usize) {
        if let Some(mut c) = self.cache() {
            c.invalidate(&self.model, region.dev_addr(), region.cpu_ptr(), offset, len);
        }
    }

    fn now_ns(&self) -> u64 {
        sys::monotonic_ns()
    }

    fn delay_ns(&self, ns: u64) {
        sys::delay_ns(ns);
    }

    fn wait_irq(&self, timeout_ns: u64) -> IrqWait {
        let deadline = Instant::now() + Duration::from_nanos(timeout_ns);
        let mut pending = self.irq.pending.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if *pending > 0 {
                *pending = 0;
                self.irq_wakeups.fetch_add(1, Ordering::Relaxed);
                return IrqWait::Interrupt;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return IrqWait::TimedOut;
            }
            pending = self.irq.cv.wait_timeout(pending, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

impl DirectIo for InProcess {
    fn read_reg(&self, offset: u32) -> Result<u32, PlatformError> {
        Ok(self.model.read_reg(offset))
    }

    fn write_reg(&self, offset: u32, value: u32) -> Result<(), PlatformError> {
        self.model.write_reg(offset, value);
        Ok(())
    }

    fn doorbell(&self, engine: u32) -> Result<(), PlatformError> {
        if engine as usize >= mregs::NUM_ENGINES {
            return Err(PlatformError::Unsupported);
        }
        self.doorbell_evictions();
        self.model.write_reg(mregs::engine_base(engine as usize) + mregs::eng::DOORBELL, 1);
        Ok(())
    }

    fn control_doorbell(&self) -> Result<(), PlatformError> {
        // In-process, register writes act at once: the control doorbell is
        // only a moment at which the CPU cache may write lines back.
        self.doorbell_evictions();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The write-back cache model from first principles: what the CPU (the
    //! region's pointer) and the GPU (the model's memory) each see.

    use super::*;
    use crate::cache::LINE;
    use refgpu_model::Generation;
    use umd_core::platform::DmaFlags;

    fn platform(cache: Cache) -> InProcess {
        let cfg = ModelConfig { generation: Generation::Gen2, mem_size: 4 << 20, ..Default::default() };
        InProcess::with_options(cfg, InProcessOptions { cache }).expect("model")
    }

    fn write_back(evict_per_mille: u16) -> InProcess {
        platform(Cache::WriteBack { seed: 7, evict_per_mille })
    }

    /// What the GPU sees at `pa`.
    fn gpu_u32(p: &InProcess, pa: u64) -> u32 {
        p.model().read_u32(pa).expect("in window")
    }

    #[test]
    fn cpu_write_reaches_the_gpu_only_when_cleaned() {
        let p = write_back(0);
        let mut r = p.dma_alloc(4096, DmaFlags::CPU).unwrap();
        let pa = r.dev_addr();
        assert!(r.write_u32(128, 0xAAAA_5555));
        assert_eq!(r.read_u32(128), Some(0xAAAA_5555), "the CPU sees its own store");
        assert_eq!(gpu_u32(&p, pa + 128), 0, "the GPU must not see an uncleaned store");
        assert_eq!(p.dirty_lines(), 1);
        // A clean of another line leaves it dirty.
        p.cache_clean(&r, 0, LINE);
        assert_eq!(gpu_u32(&p, pa + 128), 0);
        p.cache_clean(&r, 130, 1);
        assert_eq!(gpu_u32(&p, pa + 128), 0xAAAA_5555);
        assert_eq!(p.dirty_lines(), 0);
        assert_eq!(p.cache_stats().lines_cleaned, 1);
        // A clean line is not written again.
        p.cache_clean(&r, 0, 4096);
        assert_eq!(p.cache_stats().lines_cleaned, 1);
        p.dma_free(r);
        assert_eq!(p.dma_pages_used(), 0);
    }

    #[test]
    fn clean_writes_the_whole_line() {
        // The GPU writes a word of a line the CPU holds dirty: the clean
        // writes all 64 bytes back, including the CPU's stale copy of that
        // word (why drivers keep CPU- and GPU-written data in separate
        // lines).
        let p = write_back(0);
        let mut r = p.dma_alloc(4096, DmaFlags::CPU).unwrap();
        let pa = r.dev_addr();
        r.write_u32(0, 1);
        p.model().write_u32(pa + 8, 0xBEEF).unwrap();
        p.cache_clean(&r, 0, 4);
        assert_eq!(gpu_u32(&p, pa), 1);
        assert_eq!(gpu_u32(&p, pa + 8), 0, "the line went out whole, over the GPU's word");
        // The next line was not touched.
        p.model().write_u32(pa + 64, 0xBEEF).unwrap();
        p.cache_clean(&r, 0, 64);
        assert_eq!(gpu_u32(&p, pa + 64), 0xBEEF);
        p.dma_free(r);
    }

    #[test]
    fn storing_the_values_a_stale_line_held_still_reaches_memory() {
        // The CPU's copy of a line is stale (the GPU wrote memory since);
        // the CPU stores the very values its copy holds (zeroing memory it
        // reuses), then cleans: on hardware the stored line is dirty and
        // goes out, so memory must end up zero.
        let p = write_back(0);
        let mut r = p.dma_alloc(4096, DmaFlags::CPU).unwrap();
        let pa = r.dev_addr();
        p.model().write_u32(pa + 64, 7).unwrap(); // the last owner's GPU result
        assert_eq!(r.read_u32(64), Some(0), "stale CPU copy");
        for w in 0..16 {
            r.write_u32(64 + 4 * w, 0);
        }
        assert_eq!(p.dirty_lines(), 0, "the shadow did not change");
        p.cache_clean(&r, 64, 64);
        assert_eq!(gpu_u32(&p, pa + 64), 0);
        let s = p.cache_stats();
        assert_eq!((s.lines_cleaned, s.stale_lines_cleaned), (1, 1));
        // A line whose copy agrees with memory is not written.
        p.cache_clean(&r, 0, 4096);
        assert_eq!(p.cache_stats().lines_cleaned, 1);
        p.dma_free(r);
    }

    #[test]
    fn gpu_write_reaches_the_cpu_only_when_invalidated() {
        let p = write_back(0);
        let r = p.dma_alloc(8192, DmaFlags::CPU).unwrap();
        let pa = r.dev_addr();
        p.model().write_u64(pa + 4096 + 64, 42).unwrap();
        assert_eq!(r.read_u64(4096 + 64), Some(0), "stale until invalidated");
        p.cache_invalidate(&r, 4096, 64);
        assert_eq!(r.read_u64(4096 + 64), Some(0), "another line was invalidated");
        p.cache_invalidate(&r, 4096 + 64, 8);
        assert_eq!(r.read_u64(4096 + 64), Some(42));
        let s = p.cache_stats();
        assert_eq!((s.lines_invalidated, s.dirty_lines_discarded, s.lines_cleaned), (2, 0, 0));
        p.dma_free(r);
    }

    #[test]
    fn invalidate_discards_dirty_cpu_data() {
        let p = write_back(0);
        let mut r = p.dma_alloc(4096, DmaFlags::CPU).unwrap();
        let pa = r.dev_addr();
        r.write_u32(256, 0x1234);
        p.model().write_u32(pa + 260, 0x5678).unwrap();
        p.cache_invalidate(&r, 256, 64);
        assert_eq!(r.read_u32(256), Some(0), "the CPU's store is gone");
        assert_eq!(r.read_u32(260), Some(0x5678), "the GPU's word arrived");
        assert_eq!(gpu_u32(&p, pa + 256), 0, "and never reached memory");
        assert_eq!(p.dirty_lines(), 0);
        assert_eq!(p.cache_stats().dirty_lines_discarded, 1);
        p.dma_free(r);
    }

    #[test]
    fn spontaneous_write_back_overwrites_what_the_gpu_wrote() {
        let p = write_back(1000);
        let mut r = p.dma_alloc(4096, DmaFlags::CPU).unwrap();
        let pa = r.dev_addr();
        r.write_u32(512, 0xDEAD); // dirty, never cleaned
        p.model().write_u32(pa + 516, 0xF00D).unwrap(); // the GPU's result in the same line
        assert_eq!(gpu_u32(&p, pa + 516), 0xF00D);
        p.control_doorbell().unwrap();
        assert_eq!(gpu_u32(&p, pa + 512), 0xDEAD);
        assert_eq!(gpu_u32(&p, pa + 516), 0, "the evicted stale line destroyed the GPU's write");
        assert_eq!(p.cache_stats().lines_evicted, 1);
        assert_eq!(p.dirty_lines(), 0);
        p.dma_free(r);
    }

    #[test]
    fn no_spontaneous_write_back_at_zero_per_mille() {
        let p = write_back(0);
        let mut r = p.dma_alloc(4096, DmaFlags::CPU).unwrap();
        for i in 0..64 {
            r.write_u32(i * LINE, 1);
        }
        for _ in 0..10 {
            p.control_doorbell().unwrap();
            p.doorbell(0).unwrap();
        }
        assert_eq!(p.cache_stats().lines_evicted, 0);
        assert_eq!(p.dirty_lines(), 64);
        p.dma_free(r);
    }

    fn evictions_after_one_doorbell(seed: u64) -> (u64, Vec<u32>) {
        let p = platform(Cache::WriteBack { seed, evict_per_mille: 100 });
        let mut regions = Vec::new();
        for _ in 0..4 {
            let mut r = p.dma_alloc(4 * 4096, DmaFlags::CPU).unwrap();
            for line in 0..4 * 4096 / LINE {
                r.write_u32(line * LINE, line as u32 + 1);
            }
            regions.push(r);
        }
        p.control_doorbell().unwrap();
        let evicted = p.cache_stats().lines_evicted;
        assert_eq!(p.dirty_lines() as u64, 1024 - evicted);
        // What reached memory is exactly the evicted lines' CPU data.
        let mut seen = Vec::new();
        for r in &regions {
            for line in 0..4 * 4096 / LINE {
                let v = gpu_u32(&p, r.dev_addr() + (line * LINE) as u64);
                assert!(v == 0 || v == line as u32 + 1);
                seen.push(v);
            }
        }
        assert_eq!(seen.iter().filter(|&&v| v != 0).count() as u64, evicted);
        for r in regions {
            p.dma_free(r);
        }
        (evicted, seen)
    }

    #[test]
    fn spontaneous_write_back_is_random_seeded_and_spread_over_regions() {
        // 1024 dirty lines at 10 %: ~102 evicted (mean 102.4, sd ~9.6).
        let (n, a) = evictions_after_one_doorbell(1);
        assert!((50..=160).contains(&n), "{n} lines evicted");
        assert!(a[..256].iter().any(|&v| v != 0) && a[768..].iter().any(|&v| v != 0), "not spread");
        assert_eq!(evictions_after_one_doorbell(1).1, a, "same seed, same choices");
        assert_ne!(evictions_after_one_doorbell(2).1, a, "another seed, other choices");
    }

    #[test]
    fn ignored_cleans_leave_the_line_dirty() {
        let p = write_back(0);
        let mut r = p.dma_alloc(8192, DmaFlags::CPU).unwrap();
        let pa = r.dev_addr();
        // Bad input changes nothing.
        assert_eq!(p.ignore_cleans(pa..pa), Err(CacheControlError::EmptyRange { start: pa, end: pa }));
        p.ignore_cleans(pa + 4096 + 1..pa + 4096 + 2).unwrap(); // inside line 64 only
        r.write_u32(4096, 9); // line 64
        r.write_u32(4096 + 64, 10); // line 65
        r.write_u32(0, 11); // line 0
        p.cache_clean(&r, 0, 8192);
        assert_eq!(gpu_u32(&p, pa + 4096), 0, "the clean was dropped");
        assert_eq!(gpu_u32(&p, pa + 4096 + 64), 10);
        assert_eq!(gpu_u32(&p, pa), 11);
        let s = p.cache_stats();
        assert_eq!((s.cleans_ignored, s.lines_cleaned), (1, 2));
        assert_eq!(p.dirty_lines(), 1);
        p.clear_ignored_cleans().unwrap();
        p.cache_clean(&r, 4096, 4);
        assert_eq!(gpu_u32(&p, pa + 4096), 9);
        p.dma_free(r);
    }

    #[test]
    fn coherent_platform_has_no_cache_to_control() {
        let p = platform(Cache::Coherent);
        assert_eq!(p.ignore_cleans(0..4096), Err(CacheControlError::Coherent));
        assert_eq!(p.clear_ignored_cleans(), Err(CacheControlError::Coherent));
        let mut r = p.dma_alloc(4096, DmaFlags::CPU).unwrap();
        r.write_u32(0, 5);
        assert_eq!(gpu_u32(&p, r.dev_addr()), 5, "coherent: seen at once");
        assert_eq!(p.cache_stats(), CacheStats::default());
        assert_eq!(p.dirty_lines(), 0);
        p.dma_free(r);
    }

    #[test]
    fn alloc_zeroes_memory_and_shadow_and_free_drops_dirty_lines() {
        let p = write_back(0);
        let mut r = p.dma_alloc(4096, DmaFlags::CPU).unwrap();
        let pa = r.dev_addr();
        r.write_u32(0, 1);
        p.cache_clean(&r, 0, 4);
        r.write_u32(64, 2); // dirty at free: dropped, never written back
        p.dma_free(r);
        assert_eq!(p.dirty_lines(), 0);
        assert_eq!(gpu_u32(&p, pa + 64), 0);
        p.model().write_u32(pa + 128, 3).unwrap();
        // The whole window, so the same page comes back.
        let r = p.dma_alloc(4 << 20, DmaFlags::CPU).unwrap();
        assert_eq!(r.dev_addr(), pa);
        assert!(r.words().iter().all(|&w| w == 0), "shadow zeroed");
        let mut mem = vec![0u8; 4 << 20];
        p.model().read_mem(pa, &mut mem).unwrap();
        assert!(mem.iter().all(|&b| b == 0), "memory zeroed");
        p.dma_free(r);
    }

    #[test]
    fn a_region_of_another_platform_is_not_freed_or_maintained() {
        let a = write_back(0);
        let b = write_back(0);
        let ra = a.dma_alloc(4096, DmaFlags::CPU).unwrap();
        let mut rb = b.dma_alloc(4096, DmaFlags::CPU).unwrap();
        assert_eq!(ra.dev_addr(), rb.dev_addr());
        rb.write_u32(0, 77);
        a.cache_clean(&rb, 0, 4096);
        assert_eq!(gpu_u32(&a, ra.dev_addr()), 0, "a foreign region's clean reached nothing");
        assert_eq!(a.cache_stats(), CacheStats::default());
        a.dma_free(rb);
        assert_eq!(a.dma_pages_used(), 1, "a foreign region freed nothing");
        a.dma_free(ra);
        assert_eq!(a.dma_pages_used(), 0);
    }

    #[test]
    fn threads_share_the_platform() {
        let p = write_back(50);
        std::thread::scope(|s| {
            for t in 0..4u32 {
                let p = &p;
                s.spawn(move || {
                    for i in 0..50u32 {
                        let mut r = p.dma_alloc(4096, DmaFlags::CPU).unwrap();
                        let v = (t << 16) | i;
                        for w in 0..1024 {
                            r.write_u32(w * 4, v);
                        }
                        p.doorbell(t % 3).unwrap();
                        p.cache_clean(&r, 0, 4096);
                        let mut mem = vec![0u32; 1024];
                        p.model().read_dwords(r.dev_addr(), &mut mem).unwrap();
                        assert!(mem.iter().all(|&w| w == v));
                        p.dma_free(r);
                    }
                });
            }
        });
        assert_eq!(p.dma_pages_used(), 0);
        assert_eq!(p.dirty_lines(), 0);
    }
}
