//! A write-back CPU data cache, modelled for the in-process platform
//! ([`crate::inproc::InProcess`] with [`Cache::WriteBack`]).
//!
//! Real SoCs often have no hardware coherence between the CPU's data cache
//! and the GPU: a CPU store sits in a dirty cache line until the line is
//! cleaned (`dc cvac`) or evicted, and a GPU write to memory is not seen by
//! a CPU that still holds the line until the line is invalidated
//! (`dc ivac`). The coherent in-process platform hands the driver pointers
//! straight into the model's memory, so a missing clean or invalidate can
//! never show. This model can:
//!
//! - every DMA region gets a CPU-side **shadow** (a page-aligned host
//!   allocation): the driver's CPU loads and stores go there, the model
//!   (the GPU) reads and writes its own memory at the region's device
//!   address;
//! - for every 64-byte **line** the model keeps what the line held the last
//!   time it was in sync with memory. A line is **dirty** when the shadow
//!   differs from that record;
//! - **clean** writes each dirty line overlapping the range to memory,
//!   whole (64 bytes, as hardware does: bytes of the line the CPU did not
//!   store are written too, with whatever the CPU's copy holds) and makes it
//!   clean. The model cannot see stores, so a store of the values a line
//!   already held (zeroing a recycled buffer whose stale CPU copy was zero)
//!   leaves the shadow equal to the record; a real cache would still write
//!   that line back. So a clean also writes a line whose CPU copy is
//!   unchanged when memory no longer matches it (the GPU wrote it since).
//!   The cost of that choice: a clean over a stale line the CPU never
//!   stored to also overwrites the GPU's data, which a real cache would not
//!   do; drivers clean what they wrote, so this is the rarer case;
//! - **invalidate** refetches each line overlapping the range from memory
//!   into the shadow and **discards dirty CPU data**. This is the strict
//!   choice: Arm's `dc ivac` may write a dirty line back first, and on some
//!   CPUs invalidate is only offered as clean + invalidate; a driver that
//!   relies on either is wrong on the CPUs that do not, so the model takes
//!   the behaviour that exposes the bug;
//! - **spontaneous write-back**: at every doorbell (engine and control),
//!   each dirty line of every region is written back with probability
//!   `evict_per_mille / 1000` from a seeded generator, at a time the driver
//!   did not choose. A stale dirty line therefore can overwrite data the GPU
//!   wrote, as a real eviction does;
//! - every line is always resident: a CPU load never misses and refetches
//!   by itself (the strict choice again: GPU writes reach the CPU only
//!   through invalidate).
//!
//! Fault injection: `WriteBackCache::ignore_cleans` (crate-internal) drops the cleans of
//! lines in a device-address range (the line stays dirty), so a test can
//! prove that the suite notices a clean that never happened. Counters:
//! [`CacheStats`].
//!
//! Concurrency: the platform keeps this state behind a mutex. The shadow
//! itself is read and written here with atomic loads and stores (as the
//! model accesses its memory), so an eviction running on one thread while
//! the driver stores into the same region on another behaves like the
//! hardware (the line goes out with whatever it holds at that moment); in
//! the Rust memory model such a concurrent plain store is the same kind of
//! race as a device write into DMA memory, which the `DmaRegion` contract
//! already places outside it.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::BTreeMap;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use refgpu_model::faultinject::SplitMix64;
use refgpu_model::Model;

/// Cache line size of the model (bytes), the common size on Arm cores.
pub const LINE: usize = 64;

/// How the platform's DMA memory behaves towards the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Cache {
    /// The CPU reaches the model's memory directly: every store is seen by
    /// the GPU at once and every GPU write by the CPU (cache maintenance
    /// does nothing).
    #[default]
    Coherent,
    /// A write-back data cache between the CPU and the model's memory (see
    /// the module documentation).
    WriteBack {
        /// Seed of the spontaneous write-back choices.
        seed: u64,
        /// Probability, per mille, that a dirty line is written back at a
        /// doorbell (0: never; 1000: every dirty line at every doorbell).
        evict_per_mille: u16,
    },
}

/// What the cache model did so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CacheStats {
    /// Dirty lines written to memory by `cache_clean`.
    pub lines_cleaned: u64,
    /// Lines refetched from memory by `cache_invalidate`.
    pub lines_invalidated: u64,
    /// Dirty lines among those that held CPU data no clean had written
    /// (discarded by `cache_invalidate`).
    pub dirty_lines_discarded: u64,
    /// Lines among `lines_cleaned` whose CPU copy had not changed since the
    /// last sync while memory had (see the module documentation: the CPU may
    /// have stored the values it already held).
    pub stale_lines_cleaned: u64,
    /// Dirty lines written back spontaneously at a doorbell.
    pub lines_evicted: u64,
    /// Dirty lines whose clean was dropped by `WriteBackCache::ignore_cleans`.
    pub cleans_ignored: u64,
}

/// Why a cache-model control call was refused (nothing changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheControlError {
    /// The platform was built coherent: there is no cache to control.
    Coherent,
    /// The device-address range is empty (`start >= end`).
    EmptyRange {
        /// The range's start.
        start: u64,
        /// The range's end.
        end: u64,
    },
}

impl std::fmt::Display for CacheControlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CacheControlError::Coherent => write!(f, "the platform is coherent: it has no cache model"),
            CacheControlError::EmptyRange { start, end } => {
                write!(f, "empty device-address range {start:#x}..{end:#x}")
            }
        }
    }
}

impl std::error::Error for CacheControlError {}

/// The CPU side of one DMA region.
struct Shadow {
    /// Page-aligned host allocation of `len` bytes (what the driver's
    /// `DmaRegion` points at).
    ptr: NonNull<u8>,
    len: usize,
    /// What each line held the last time it was in sync with memory.
    synced: Box<[u8]>,
}

impl Shadow {
    fn layout(len: usize) -> Option<Layout> {
        Layout::from_size_align(len, 4096).ok()
    }

    /// A zeroed shadow of `len` bytes (a non-zero multiple of `LINE`).
    fn new(len: usize) -> Option<Shadow> {
        if len == 0 || len % LINE != 0 {
            return None;
        }
        let layout = Self::layout(len)?;
        // SAFETY: the layout has a non-zero size (checked above).
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })?;
        Some(Shadow { ptr, len, synced: vec![0u8; len].into_boxed_slice() })
    }

    fn words(&self, line: usize) -> impl Iterator<Item = &AtomicU64> + '_ {
        (0..LINE / 8).map(move |w| {
            // SAFETY: `line * LINE + 8 * w + 8 <= len` for every line index
            // below `len / LINE` (callers iterate only those); the
            // allocation is 4096-aligned so the address is 8-aligned; the
            // shadow is only accessed atomically here, and the reference
            // lives no longer than `&self`, which keeps the allocation.
            unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(line * LINE + 8 * w).cast::<u64>()) }
        })
    }

    /// What the CPU holds for `line` now.
    fn load(&self, line: usize) -> [u8; LINE] {
        let mut out = [0u8; LINE];
        for (chunk, word) in out.chunks_exact_mut(8).zip(self.words(line)) {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        out
    }

    /// Replaces the CPU's copy of `line`.
    fn store(&self, line: usize, data: &[u8; LINE]) {
        for (chunk, word) in data.chunks_exact(8).zip(self.words(line)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            word.store(u64::from_le_bytes(b), Ordering::Relaxed);
        }
    }

    fn synced(&self, line: usize) -> &[u8] {
        &self.synced[line * LINE..(line + 1) * LINE]
    }

    fn set_synced(&mut self, line: usize, data: &[u8; LINE]) {
        self.synced[line * LINE..(line + 1) * LINE].copy_from_slice(data);
    }

    fn lines(&self) -> usize {
        self.len / LINE
    }
}

impl Drop for Shadow {
    fn drop(&mut self) {
        if let Some(layout) = Self::layout(self.len) {
            // SAFETY: `ptr` came from `alloc_zeroed` with this same layout
            // in `Shadow::new` and is freed only here.
            unsafe { dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// The state of the write-back cache: one shadow per live DMA region.
pub(crate) struct WriteBackCache {
    /// Shadows by the region's device address.
    shadows: BTreeMap<u64, Shadow>,
    rng: SplitMix64,
    evict_per_mille: u16,
    ignored: Vec<Range<u64>>,
    stats: CacheStats,
}

// SAFETY: the shadows are heap allocations owned by this value (freed in
// `Shadow::drop`); nothing ties them to a thread.
unsafe impl Send for WriteBackCache {}

/// Line indices of `region[off..off + len]` clamped to the region, as a
/// range (empty when `len` is 0 or `off` is past the end).
fn line_range(region_len: usize, off: usize, len: usize) -> Range<usize> {
    let end = off.saturating_add(len).min(region_len);
    if off >= end {
        return 0..0;
    }
    off / LINE..end.div_ceil(LINE)
}

impl WriteBackCache {
    pub(crate) fn new(seed: u64, evict_per_mille: u16) -> Self {
        Self {
            shadows: BTreeMap::new(),
            rng: SplitMix64::new(seed),
            evict_per_mille: evict_per_mille.min(1000),
            ignored: Vec::new(),
            stats: CacheStats::default(),
        }
    }

    /// A zeroed shadow for the region at `dev_addr` (memory is zeroed by
    /// the caller, so every line starts clean); its CPU pointer, or None
    /// when the host allocation failed (nothing changed).
    pub(crate) fn attach(&mut self, dev_addr: u64, len: usize) -> Option<NonNull<u8>> {
        if self.shadows.contains_key(&dev_addr) {
            return None;
        }
        let shadow = Shadow::new(len)?;
        let ptr = shadow.ptr;
        self.shadows.insert(dev_addr, shadow);
        Some(ptr)
    }

    /// Drops the shadow of the region at `dev_addr` whose CPU pointer is
    /// `cpu`, with its dirty lines (they are not written back: the memory is
    /// being freed). False when there is no such shadow (nothing changed).
    pub(crate) fn detach(&mut self, dev_addr: u64, cpu: Option<NonNull<u8>>) -> bool {
        match self.shadows.get(&dev_addr) {
            Some(s) if Some(s.ptr) == cpu => {
                self.shadows.remove(&dev_addr);
                true
            }
            _ => false,
        }
    }

    fn ignored(&self, pa: u64) -> bool {
        self.ignored.iter().any(|r| pa < r.end && pa + LINE as u64 > r.start)
    }

    /// `cache_clean`: dirty lines overlapping the range go to memory.
    pub(crate) fn clean(
        &mut self,
        model: &Model,
        dev_addr: u64,
        cpu: Option<NonNull<u8>>,
        off: usize,
        len: usize,
    ) {
        let Some(shadow) = self.shadows.get(&dev_addr).filter(|s| Some(s.ptr) == cpu) else {
            return;
        };
        let lines = line_range(shadow.len, off, len);
        let ignored: Vec<bool> = lines.clone().map(|l| self.ignored(dev_addr + (l * LINE) as u64)).collect();
        let Some(shadow) = self.shadows.get_mut(&dev_addr) else {
            return;
        };
        for (line, ignore) in lines.zip(ignored) {
            let pa = dev_addr + (line * LINE) as u64;
            let now = shadow.load(line);
            let stale = now[..] == *shadow.synced(line);
            if stale {
                // Unchanged since the last sync: either the CPU did not
                // store to the line, or it stored the values it already held
                // (zeroing a line that was zero). A real cache marks the
                // second dirty and writes it back; the model cannot see
                // stores, so it writes the line when memory moved on since
                // (the GPU wrote it), and skips it when memory agrees.
                let mut mem = [0u8; LINE];
                if model.read_mem(pa, &mut mem).is_err() || mem == now {
                    continue;
                }
            }
            if ignore {
                self.stats.cleans_ignored += 1;
                continue;
            }
            if model.write_mem(pa, &now).is_ok() {
                shadow.set_synced(line, &now);
                self.stats.lines_cleaned += 1;
                self.stats.stale_lines_cleaned += u64::from(stale);
            }
        }
    }

    /// `cache_invalidate`: lines overlapping the range are refetched from
    /// memory, dirty CPU data discarded.
    pub(crate) fn invalidate(
        &mut self,
        model: &Model,
        dev_addr: u64,
        cpu: Option<NonNull<u8>>,
        off: usize,
        len: usize,
    ) {
        let Some(shadow) = self.shadows.get_mut(&dev_addr).filter(|s| Some(s.ptr) == cpu) else {
            return;
        };
        for line in line_range(shadow.len, off, len) {
            let mut mem = [0u8; LINE];
            if model.read_mem(dev_addr + (line * LINE) as u64, &mut mem).is_err() {
                continue;
            }
            if shadow.load(line)[..] != *shadow.synced(line) {
                self.stats.dirty_lines_discarded += 1;
            }
            shadow.store(line, &mem);
            shadow.set_synced(line, &mem);
            self.stats.lines_invalidated += 1;
        }
    }

    /// Spontaneous write-back (called at doorbells): each dirty line is
    /// written to memory with probability `evict_per_mille / 1000`. The
    /// candidate lines are drawn with geometric gaps, so the cost is
    /// proportional to the lines chosen, not to all memory.
    pub(crate) fn evict_some(&mut self, model: &Model) {
        if self.evict_per_mille == 0 || self.shadows.is_empty() {
            return;
        }
        let p = f64::from(self.evict_per_mille) / 1000.0;
        let skip = |rng: &mut SplitMix64| -> usize {
            if p >= 1.0 {
                return 0;
            }
            // Lines skipped before the next chosen one: Geometric(p).
            let u = 1.0 - rng.next_f64(); // (0, 1]
            let g = (u.ln() / (1.0 - p).ln()).floor();
            if g.is_finite() && g >= 0.0 && g < usize::MAX as f64 {
                g as usize
            } else {
                usize::MAX
            }
        };
        let mut next = skip(&mut self.rng);
        for (&dev_addr, shadow) in self.shadows.iter_mut() {
            let lines = shadow.lines();
            while next < lines {
                let line = next;
                let now = shadow.load(line);
                if now[..] != *shadow.synced(line)
                    && model.write_mem(dev_addr + (line * LINE) as u64, &now).is_ok()
                {
                    shadow.set_synced(line, &now);
                    self.stats.lines_evicted += 1;
                }
                next = next.saturating_add(1).saturating_add(skip(&mut self.rng));
            }
            next -= lines;
        }
    }

    /// Drops cleans of lines overlapping device addresses `range`.
    pub(crate) fn ignore_cleans(&mut self, range: Range<u64>) {
        self.ignored.push(range);
    }

    /// Honours every clean again.
    pub(crate) fn clear_ignored_cleans(&mut self) {
        self.ignored.clear();
    }

    pub(crate) fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Lines whose CPU copy differs from memory's last synced value.
    pub(crate) fn dirty_lines(&self) -> usize {
        self.shadows.values().map(|s| (0..s.lines()).filter(|&l| s.load(l)[..] != *s.synced(l)).count()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::line_range;

    #[test]
    fn line_ranges_cover_every_overlapping_line() {
        assert_eq!(line_range(4096, 0, 4096), 0..64);
        assert_eq!(line_range(4096, 0, 1), 0..1);
        assert_eq!(line_range(4096, 63, 2), 0..2);
        assert_eq!(line_range(4096, 64, 64), 1..2);
        assert_eq!(line_range(4096, 100, 0), 0..0);
        assert_eq!(line_range(4096, 4000, 1000), 62..64);
        assert_eq!(line_range(4096, 5000, 10), 0..0);
        assert_eq!(line_range(4096, usize::MAX, usize::MAX), 0..0);
    }
}
