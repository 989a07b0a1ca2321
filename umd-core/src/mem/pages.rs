//! Runs of 4 KiB pages out of a fixed window (a RAM carve-out, a shared
//! system-memory file): a first-fit allocator over a bitmap the caller
//! provides, one bit per page.
//!
//! This is what a platform's `dma_alloc` needs underneath: few, large,
//! page-granular blocks (rings, IB pools, page tables, the pools' backing
//! blocks). The bookkeeping is out of band on purpose: an allocator that
//! keeps its free list inside the free memory (`linked_list_allocator`,
//! most `GlobalAlloc` heaps) would write metadata into GPU-visible memory,
//! where a stray GPU write corrupts the allocator, where the CPU may have no
//! mapping at all (device-only memory) and where every metadata store would
//! need cache maintenance on a non-coherent SoC. Here the memory itself is
//! never touched.
//!
//! The storage is anything that borrows as `[u64]`: a `[u64; N]` in a
//! firmware's static (no heap), a `Vec<u64>` on a host. First fit from the
//! lowest page, skipping whole used or free words, so the worst case is
//! O(pages / 64 + run length). Bad input (zero pages, a run that is not
//! allocated, double free) is a typed error and changes nothing.

use core::borrow::{Borrow, BorrowMut};
use core::fmt;

/// Page size (bytes).
pub const PAGE: usize = 4096;

/// Why a page operation was refused (nothing changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PagesError {
    /// A run of zero pages was asked for or given back.
    Zero,
    /// No run of free pages is long enough.
    Exhausted {
        /// Pages asked for.
        pages: usize,
        /// Pages free in total (possibly fragmented).
        free: usize,
    },
    /// The run is not (entirely) allocated or lies outside the window: a
    /// double free or a foreign address.
    NotAllocated {
        /// First page of the run.
        first: usize,
        /// Pages in the run.
        pages: usize,
    },
    /// The storage holds fewer bits than the window has pages.
    StorageTooSmall {
        /// Pages of the window.
        pages: usize,
        /// Bits the storage holds.
        capacity: usize,
    },
}

impl fmt::Display for PagesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PagesError::Zero => write!(f, "zero pages"),
            PagesError::Exhausted { pages, free } => {
                write!(f, "no run of {pages} free pages ({free} free in total)")
            }
            PagesError::NotAllocated { first, pages } => {
                write!(f, "pages {first}..{} are not an allocated run", first.saturating_add(*pages))
            }
            PagesError::StorageTooSmall { pages, capacity } => {
                write!(f, "bitmap storage holds {capacity} pages, the window has {pages}")
            }
        }
    }
}

impl core::error::Error for PagesError {}

/// A page allocator over `pages` pages whose used/free bits live in `S`.
#[derive(Debug)]
pub struct PageBitmap<S> {
    bits: S,
    pages: usize,
    used: usize,
}

impl<S: Borrow<[u64]> + BorrowMut<[u64]>> PageBitmap<S> {
    /// All `pages` pages free; `bits` is overwritten. Refused when `bits`
    /// holds fewer than `pages` bits.
    pub fn new(mut bits: S, pages: usize) -> Result<Self, PagesError> {
        let words: &mut [u64] = bits.borrow_mut();
        let capacity = words.len().saturating_mul(64);
        if pages > capacity {
            return Err(PagesError::StorageTooSmall { pages, capacity });
        }
        words.fill(0);
        Ok(Self { bits, pages, used: 0 })
    }

    /// Pages of the window.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Pages handed out.
    pub fn used_pages(&self) -> usize {
        self.used
    }

    /// Pages free (possibly fragmented).
    pub fn free_pages(&self) -> usize {
        self.pages.saturating_sub(self.used)
    }

    fn word(&self, p: usize) -> u64 {
        // Bits past `pages` in the last word never get set; a missing word
        // (impossible after `new`'s check) reads as used.
        self.bits.borrow().get(p / 64).copied().unwrap_or(u64::MAX)
    }

    /// Whether page `p` is handed out (false outside the window).
    pub fn is_used(&self, p: usize) -> bool {
        p < self.pages && self.word(p) & (1u64 << (p % 64)) != 0
    }

    fn set(&mut self, first: usize, n: usize, used: bool) {
        let words: &mut [u64] = self.bits.borrow_mut();
        for p in first..first.saturating_add(n) {
            if let Some(w) = words.get_mut(p / 64) {
                if used {
                    *w |= 1u64 << (p % 64);
                } else {
                    *w &= !(1u64 << (p % 64));
                }
            }
        }
    }

    /// Takes a run of `n` pages, the lowest that fits; returns its first
    /// page.
    pub fn alloc(&mut self, n: usize) -> Result<usize, PagesError> {
        if n == 0 {
            return Err(PagesError::Zero);
        }
        let exhausted = PagesError::Exhausted { pages: n, free: self.free_pages() };
        if n > self.free_pages() {
            return Err(exhausted);
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
                    return Ok(first);
                }
            }
            p = p.saturating_add(1);
        }
        Err(exhausted)
    }

    /// Gives back the run of `n` pages from `first`. Refused, changing
    /// nothing, unless every page of the run is handed out.
    pub fn free(&mut self, first: usize, n: usize) -> Result<(), PagesError> {
        if n == 0 {
            return Err(PagesError::Zero);
        }
        let not = PagesError::NotAllocated { first, pages: n };
        let end = first.checked_add(n).ok_or(not)?;
        if end > self.pages || !(first..end).all(|p| self.is_used(p)) {
            return Err(not);
        }
        self.set(first, n, false);
        self.used = self.used.saturating_sub(n);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;
    use std::vec::Vec;

    #[test]
    fn first_fit_reuse_and_exhaustion() {
        let mut h = PageBitmap::new([0u64; 3], 130).unwrap();
        assert_eq!((h.alloc(64), h.alloc(64)), (Ok(0), Ok(64)));
        assert_eq!(h.alloc(3), Err(PagesError::Exhausted { pages: 3, free: 2 }));
        assert_eq!(h.alloc(2), Ok(128));
        assert_eq!(h.free(0, 64), Ok(()));
        assert_eq!(h.alloc(10), Ok(0));
        assert_eq!(h.alloc(54), Ok(10));
        assert_eq!(h.alloc(1), Err(PagesError::Exhausted { pages: 1, free: 0 }));
        assert_eq!(h.free(64, 64), Ok(()));
        assert_eq!(h.used_pages(), 66);
        assert_eq!(h.alloc(64), Ok(64));
        assert_eq!(h.alloc(0), Err(PagesError::Zero));
        assert_eq!(h.alloc(1000), Err(PagesError::Exhausted { pages: 1000, free: 0 }));
    }

    #[test]
    fn a_hole_too_small_is_skipped_then_reused() {
        let mut h = PageBitmap::new(vec![0u64; 1], 16).unwrap();
        assert_eq!((h.alloc(1), h.alloc(3)), (Ok(0), Ok(1)));
        assert_eq!(h.free(0, 1), Ok(()));
        assert_eq!(h.alloc(2), Ok(4), "the 1-page hole is too small");
        assert_eq!(h.alloc(1), Ok(0), "the hole is reused");
    }

    #[test]
    fn runs_across_word_boundaries() {
        let mut h = PageBitmap::new([0u64; 4], 256).unwrap();
        assert_eq!(h.alloc(60), Ok(0));
        assert_eq!(h.alloc(130), Ok(60));
        assert_eq!(h.alloc(66), Ok(190));
        assert_eq!(h.free_pages(), 0);
        assert_eq!(h.free(60, 130), Ok(()));
        assert_eq!(h.alloc(131), Err(PagesError::Exhausted { pages: 131, free: 130 }));
        assert_eq!(h.alloc(130), Ok(60));
    }

    #[test]
    fn bad_input_changes_nothing() {
        let mut h = PageBitmap::new([0u64; 1], 64).unwrap();
        let a = h.alloc(4).unwrap();
        let before = (h.used_pages(), (0..64).map(|p| h.is_used(p)).collect::<Vec<_>>());
        let bad = [(a, 0), (a, 5), (a + 1, 4), (10, 1), (60, 8), (usize::MAX, 2)];
        for (first, n) in bad {
            assert!(h.free(first, n).is_err(), "free({first}, {n})");
            assert_eq!((h.used_pages(), (0..64).map(|p| h.is_used(p)).collect::<Vec<_>>()), before);
        }
        assert_eq!(h.free(a, 4), Ok(()));
        assert_eq!(h.free(a, 4), Err(PagesError::NotAllocated { first: a, pages: 4 }), "double free");
        assert_eq!(
            PageBitmap::new([0u64; 1], 65).unwrap_err(),
            PagesError::StorageTooSmall { pages: 65, capacity: 64 }
        );
    }

    #[test]
    fn new_clears_the_storage() {
        let h = PageBitmap::new([u64::MAX; 2], 100).unwrap();
        assert_eq!(h.free_pages(), 100);
        assert!(!h.is_used(0) && !h.is_used(99) && !h.is_used(100));
    }

    #[test]
    fn no_overlap_under_churn() {
        let mut h = PageBitmap::new(vec![0u64; 4], 250).unwrap();
        let mut live: Vec<(usize, usize)> = Vec::new();
        let mut x = 12345u64;
        for _ in 0..5000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x % 3 != 0 || live.is_empty() {
                let n = (x >> 8) as usize % 70 + 1;
                if let Ok(f) = h.alloc(n) {
                    assert!(f + n <= 250);
                    assert!(live.iter().all(|&(g, m)| f + n <= g || g + m <= f), "overlap");
                    live.push((f, n));
                }
            } else {
                let (f, n) = live.swap_remove((x >> 8) as usize % live.len());
                assert_eq!(h.free(f, n), Ok(()));
            }
            assert_eq!(h.used_pages(), live.iter().map(|l| l.1).sum::<usize>());
            for p in 0..250 {
                assert_eq!(h.is_used(p), live.iter().any(|&(f, n)| (f..f + n).contains(&p)), "page {p}");
            }
        }
    }
}
