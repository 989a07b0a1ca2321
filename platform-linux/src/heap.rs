//! A page allocator for DMA memory carved out of a physical window: one
//! bit per 4 KiB page, first fit from a rotating hint. The window is small
//! (tens of MiB) and allocations are few and large (rings, IB pools,
//! buffers), so a bitmap scan is plenty.

/// Page size of the carving.
pub const PAGE: usize = 4096;

/// Free/used bitmap over `pages` pages.
#[derive(Debug)]
pub struct PageHeap {
    bits: Vec<u64>,
    pages: usize,
    hint: usize,
    used: usize,
}

impl PageHeap {
    /// A heap of `pages` free pages.
    pub fn new(pages: usize) -> Self {
        Self { bits: vec![0; pages.div_ceil(64)], pages, hint: 0, used: 0 }
    }

    fn is_used(&self, p: usize) -> bool {
        self.bits[p / 64] & (1 << (p % 64)) != 0
    }

    fn set(&mut self, p: usize, used: bool) {
        if used {
            self.bits[p / 64] |= 1 << (p % 64);
        } else {
            self.bits[p / 64] &= !(1 << (p % 64));
        }
    }

    /// Finds and marks `n` contiguous free pages; returns the first.
    pub fn alloc(&mut self, n: usize) -> Option<usize> {
        if n == 0 || n > self.pages {
            return None;
        }
        let starts = [self.hint, 0];
        for (pass, &from) in starts.iter().enumerate() {
            let end = if pass == 0 { self.pages } else { self.hint.min(self.pages) + n };
            let mut run = 0usize;
            let mut p = from;
            while p < end.min(self.pages) {
                if self.bits[p / 64] == u64::MAX && p % 64 == 0 {
                    run = 0;
                    p += 64;
                    continue;
                }
                if self.is_used(p) {
                    run = 0;
                } else {
                    run += 1;
                    if run == n {
                        let first = p + 1 - n;
                        for q in first..=p {
                            self.set(q, true);
                        }
                        self.hint = (p + 1) % self.pages;
                        self.used += n;
                        return Some(first);
                    }
                }
                p += 1;
            }
        }
        None
    }

    /// Frees `n` pages from `first` (pages already free are ignored).
    pub fn free(&mut self, first: usize, n: usize) {
        for p in first..(first + n).min(self.pages) {
            if self.is_used(p) {
                self.set(p, false);
                self.used -= 1;
            }
        }
    }

    /// Pages in use.
    pub fn used_pages(&self) -> usize {
        self.used
    }

    /// Pages in total.
    pub fn total_pages(&self) -> usize {
        self.pages
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_reuse_and_exhaustion() {
        let mut h = PageHeap::new(130);
        let a = h.alloc(64).unwrap();
        let b = h.alloc(64).unwrap();
        assert_eq!((a, b), (0, 64));
        assert_eq!(h.alloc(3), None);
        assert_eq!(h.alloc(2), Some(128));
        h.free(a, 64);
        assert_eq!(h.alloc(10), Some(0));
        assert_eq!(h.alloc(54), Some(10));
        assert_eq!(h.alloc(1), None);
        h.free(b, 64);
        assert_eq!(h.used_pages(), 66);
        assert_eq!(h.alloc(64), Some(64));
        assert_eq!(h.alloc(0), None);
        assert_eq!(h.alloc(1000), None);
    }

    #[test]
    fn no_overlap_under_churn() {
        let mut h = PageHeap::new(256);
        let mut live: Vec<(usize, usize)> = Vec::new();
        let mut x = 12345u64;
        for _ in 0..5000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x % 3 != 0 || live.is_empty() {
                let n = (x >> 8) as usize % 17 + 1;
                if let Some(f) = h.alloc(n) {
                    assert!(live.iter().all(|&(g, m)| f + n <= g || g + m <= f), "overlap");
                    live.push((f, n));
                }
            } else {
                let (f, n) = live.swap_remove((x >> 8) as usize % live.len());
                h.free(f, n);
            }
            assert_eq!(h.used_pages(), live.iter().map(|l| l.1).sum::<usize>());
        }
    }
}
