//! The physical page allocator's benchmark workloads (`benches/pages.rs`
//! for time, `benches/icount.rs` for instruction counts), and the baseline
//! they are compared with: the first-fit bitmap page allocator
//! `umd_core::mem::pages` used before [`PageAlloc`] (one bit per page, a
//! scan from the lowest page, skipping whole used or free words: O(pages /
//! 64 + run)). The baseline lives here only, as the reference of the
//! same-run ratios in `docs/perf.md` ("Physical pages").

use umd_core::mem::pages::PageAlloc;
use umd_core::mem::va::VaNode;

/// An allocator of runs of pages, for the workloads.
pub trait Pages {
    /// A run of `n` pages: its first page.
    fn alloc(&mut self, n: usize) -> Option<usize>;
    /// Gives back the run of `n` pages from `first`.
    fn free(&mut self, first: usize, n: usize);
}

impl Pages for PageAlloc<Box<[VaNode]>> {
    #[inline(always)]
    fn alloc(&mut self, n: usize) -> Option<usize> {
        PageAlloc::alloc(self, n).ok()
    }
    #[inline(always)]
    fn free(&mut self, first: usize, n: usize) {
        let _ = PageAlloc::free(self, first, n);
    }
}

/// The baseline: first fit over a bitmap, one bit per page.
pub struct Bitmap {
    bits: Vec<u64>,
    pages: usize,
    used: usize,
}

impl Bitmap {
    /// All `pages` pages free.
    pub fn new(pages: usize) -> Bitmap {
        Bitmap { bits: vec![0; pages.div_ceil(64)], pages, used: 0 }
    }

    fn word(&self, p: usize) -> u64 {
        self.bits.get(p / 64).copied().unwrap_or(u64::MAX)
    }

    fn is_used(&self, p: usize) -> bool {
        p < self.pages && self.word(p) & (1u64 << (p % 64)) != 0
    }

    fn set(&mut self, first: usize, n: usize, used: bool) {
        for p in first..first.saturating_add(n) {
            if let Some(w) = self.bits.get_mut(p / 64) {
                if used {
                    *w |= 1u64 << (p % 64);
                } else {
                    *w &= !(1u64 << (p % 64));
                }
            }
        }
    }
}

impl Pages for Bitmap {
    fn alloc(&mut self, n: usize) -> Option<usize> {
        if n == 0 || n > self.pages - self.used {
            return None;
        }
        let mut run = 0usize;
        let mut p = 0usize;
        while p < self.pages {
            let w = self.word(p);
            if p % 64 == 0 && self.pages.saturating_sub(p) >= 64 {
                if w == u64::MAX {
                    run = 0;
                    p = p.saturating_add(64);
                    continue;
                }
                if w == 0 && run.saturating_add(64) < n {
                    run = run.saturating_add(64);
                    p = p.saturating_add(64);
                    continue;
                }
            }
            if w & (1u64 << (p % 64)) != 0 {
                run = 0;
            } else {
                run = run.saturating_add(1);
                if run == n {
                    let first = p.saturating_add(1).saturating_sub(n);
                    self.set(first, n, true);
                    self.used = self.used.saturating_add(n);
                    return Some(first);
                }
            }
            p = p.saturating_add(1);
        }
        None
    }

    fn free(&mut self, first: usize, n: usize) {
        let end = first.saturating_add(n);
        if n == 0 || end > self.pages || !(first..end).all(|p| self.is_used(p)) {
            return;
        }
        self.set(first, n, false);
        self.used = self.used.saturating_sub(n);
    }
}

/// Which sizes the blocks have.
#[derive(Clone, Copy, Debug)]
pub enum Load {
    /// Every block 8 KiB (2 pages): the buffers of their own of the
    /// measured driver workload.
    Block8k,
    /// 60 % 1 page, 25 % 2-4, 10 % 5-16, 5 % 17-64 pages.
    Mixed,
}

/// A deterministic generator (xorshift64), so every run and both
/// allocators replay the same sequence.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 >> 8
    }

    fn pages(&mut self, load: Load) -> usize {
        match load {
            Load::Block8k => 2,
            Load::Mixed => {
                let r = self.next() % 100;
                let (lo, span) = match r {
                    0..60 => (1, 1),
                    60..85 => (2, 3),
                    85..95 => (5, 12),
                    _ => (17, 48),
                };
                lo + (self.next() % span) as usize
            }
        }
    }
}

/// A workload: the blocks to allocate first, then steps that each free
/// one live block and allocate a new one.
pub struct Schedule {
    /// Pages of the window: twice the pages of the first blocks.
    pub window: usize,
    /// Sizes of the first blocks, in allocation order.
    pub fill: Vec<usize>,
    /// Per step: which live block to free (an index into the live list,
    /// which is kept with `swap_remove` and `push`), then the new size.
    pub steps: Vec<(usize, usize)>,
}

impl Schedule {
    /// `live` blocks of `load`, then `steps` steps. The live pages stay
    /// at most 5/8 of the window (a new size that would pass it is drawn
    /// again), so neither allocator runs out.
    pub fn new(load: Load, live: usize, steps: usize) -> Schedule {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ live as u64);
        let fill: Vec<usize> = (0..live).map(|_| rng.pages(load)).collect();
        let mut total: usize = fill.iter().sum();
        let window = 2 * total;
        let mut sizes = fill.clone();
        let steps = (0..steps)
            .map(|_| {
                let victim = (rng.next() as usize) % live;
                total -= sizes.swap_remove(victim);
                let mut n = rng.pages(load);
                while 8 * (total + n) > 5 * window {
                    n = rng.pages(load);
                }
                total += n;
                sizes.push(n);
                (victim, n)
            })
            .collect();
        Schedule { window, fill, steps }
    }

    /// Allocates the first blocks: the live list.
    pub fn fill<P: Pages>(&self, p: &mut P) -> Vec<(usize, usize)> {
        self.fill.iter().map(|&n| (p.alloc(n).expect("the window holds twice the blocks"), n)).collect()
    }
}

/// Runs `steps` on `p`: frees the chosen live block, allocates the new
/// size. Returns the sum of the first pages (so nothing is optimised out).
#[inline(always)]
pub fn replay<P: Pages>(p: &mut P, live: &mut Vec<(usize, usize)>, steps: &[(usize, usize)]) -> usize {
    let mut sum = 0usize;
    for &(victim, n) in steps {
        let (f, m) = live.swap_remove(victim % live.len());
        p.free(f, m);
        let first = p.alloc(n).expect("the window holds twice the blocks");
        sum = sum.wrapping_add(first);
        live.push((first, n));
    }
    sum
}

/// The page allocator for a schedule: one node per page of the window
/// (as the host platforms build it). A boxed slice rather than a `Vec`:
/// the instruction-count benchmarks' `VaAllocator<Vec<VaNode>>` then keeps
/// its own code (and counts) whether or not this one is linked beside it.
pub fn page_alloc(s: &Schedule) -> PageAlloc<Box<[VaNode]>> {
    PageAlloc::new(vec![VaNode::EMPTY; s.window].into_boxed_slice(), s.window).expect("window")
}
