//! The static carve-out of RAM that holds GPU-visible memory: a first-fit
//! allocator of runs of 4 KiB pages over a fixed bitmap (no heap).
//!
//! On `virt` the carve-out is a physical range of guest RAM that the MMU
//! maps identity, as normal cacheable memory, so the CPU address and the
//! device (physical) address of a page are the same number. The type keeps
//! them apart anyway (`cpu_base`, `dev_base`) so a board with an offset
//! between the two only changes the constructor.

/// Page size of the carve-out.
pub const PAGE: usize = 4096;

/// Most pages one carve-out can manage (64 MiB): sizes the bitmap.
pub const MAX_PAGES: usize = 16384;

/// A page allocator over `[cpu_base, cpu_base + pages * PAGE)`.
#[derive(Debug)]
pub struct CarveOut {
    cpu_base: usize,
    dev_base: u64,
    pages: usize,
    used: usize,
    bits: [u64; MAX_PAGES / 64],
}

impl CarveOut {
    /// A carve-out of `len` bytes (rounded down to whole pages, at most
    /// [`MAX_PAGES`]) at CPU address `cpu_base` and device address
    /// `dev_base`; both must be page aligned (else `None`).
    pub const fn new(cpu_base: usize, dev_base: u64, len: usize) -> Option<CarveOut> {
        if cpu_base % PAGE != 0 || dev_base % PAGE as u64 != 0 {
            return None;
        }
        let pages = if len / PAGE > MAX_PAGES { MAX_PAGES } else { len / PAGE };
        Some(CarveOut { cpu_base, dev_base, pages, used: 0, bits: [0; MAX_PAGES / 64] })
    }

    /// Pages managed.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Pages handed out.
    pub fn used_pages(&self) -> usize {
        self.used
    }

    fn is_used(&self, p: usize) -> bool {
        self.bits.get(p / 64).is_some_and(|w| w & (1 << (p % 64)) != 0)
    }

    fn set(&mut self, first: usize, n: usize, used: bool) {
        for p in first..first + n {
            if let Some(w) = self.bits.get_mut(p / 64) {
                if used {
                    *w |= 1 << (p % 64);
                } else {
                    *w &= !(1 << (p % 64));
                }
            }
        }
    }

    /// Takes `len` bytes (rounded up to pages): returns the CPU address and
    /// the device address of the first byte, or `None` when no run of free
    /// pages is long enough. First fit, O(pages).
    pub fn alloc(&mut self, len: usize) -> Option<(usize, u64)> {
        let n = len.max(1).div_ceil(PAGE);
        let mut run = 0;
        let mut p = 0;
        while p < self.pages {
            if self.is_used(p) {
                run = 0;
            } else {
                run += 1;
                if run == n {
                    let first = p + 1 - n;
                    self.set(first, n, true);
                    self.used += n;
                    return Some((self.cpu_base + first * PAGE, self.dev_base + (first * PAGE) as u64));
                }
            }
            p += 1;
        }
        None
    }

    /// Gives back `len` bytes at CPU address `cpu` (from [`CarveOut::alloc`]).
    /// Returns false, changing nothing, when the range is not a run of
    /// pages handed out by this carve-out (double free, foreign pointer).
    pub fn free(&mut self, cpu: usize, len: usize) -> bool {
        let n = len.max(1).div_ceil(PAGE);
        let Some(off) = cpu.checked_sub(self.cpu_base) else { return false };
        if off % PAGE != 0 || off / PAGE + n > self.pages {
            return false;
        }
        let first = off / PAGE;
        if !(first..first + n).all(|p| self.is_used(p)) {
            return false;
        }
        self.set(first, n, false);
        self.used -= n;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_first_fit() {
        let mut c = CarveOut::new(0x4100_0000, 0x4100_0000, 16 * PAGE).unwrap();
        let a = c.alloc(PAGE).unwrap();
        let b = c.alloc(3 * PAGE).unwrap();
        assert_eq!(a, (0x4100_0000, 0x4100_0000));
        assert_eq!(b.0, 0x4100_1000);
        assert_eq!(c.used_pages(), 4);
        assert!(c.free(a.0, PAGE));
        assert!(!c.free(a.0, PAGE), "double free is refused");
        assert_eq!(c.alloc(2 * PAGE).unwrap().0, 0x4100_4000, "the 1-page hole is too small");
        assert_eq!(c.alloc(100).unwrap().0, 0x4100_0000, "the hole is reused");
        assert!(c.alloc(16 * PAGE).is_none());
        assert!(!c.free(0x1000, PAGE), "foreign pointer");
    }

    #[test]
    fn device_offset_and_bad_bases() {
        let mut c = CarveOut::new(0x1000, 0x8000_0000, 2 * PAGE).unwrap();
        assert_eq!(c.alloc(1), Some((0x1000, 0x8000_0000)));
        assert!(CarveOut::new(0x1001, 0, PAGE).is_none());
        assert_eq!(CarveOut::new(0, 0, usize::MAX).unwrap().pages(), MAX_PAGES);
    }
}
