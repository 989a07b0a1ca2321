//! The static carve-out of RAM that holds GPU-visible memory: runs of 4 KiB
//! pages from `umd_core::mem::pages::PageBitmap` (first fit) over a bitmap
//! inside this value (no heap), translated to CPU and device addresses.
//!
//! On `virt` the carve-out is a physical range of guest RAM that the MMU
//! maps identity, as normal cacheable memory, so the CPU address and the
//! device (physical) address of a page are the same number. The type keeps
//! them apart anyway (`cpu_base`, `dev_base`) so a board with an offset
//! between the two only changes the constructor.

use umd_core::mem::pages::{PageBitmap, PagesError};

/// Page size of the carve-out.
pub const PAGE: usize = umd_core::mem::pages::PAGE;

/// Most pages one carve-out can manage (64 MiB): sizes the bitmap.
pub const MAX_PAGES: usize = 16384;

/// A page allocator over `[cpu_base, cpu_base + pages * PAGE)`.
#[derive(Debug)]
pub struct CarveOut {
    cpu_base: usize,
    dev_base: u64,
    pages: PageBitmap<[u64; MAX_PAGES / 64]>,
}

impl CarveOut {
    /// A carve-out of `len` bytes (rounded down to whole pages, at most
    /// [`MAX_PAGES`]) at CPU address `cpu_base` and device address
    /// `dev_base`; both must be page aligned (else `None`).
    pub fn new(cpu_base: usize, dev_base: u64, len: usize) -> Option<CarveOut> {
        if cpu_base % PAGE != 0 || dev_base % PAGE as u64 != 0 {
            return None;
        }
        let pages = PageBitmap::new([0; MAX_PAGES / 64], (len / PAGE).min(MAX_PAGES)).ok()?;
        Some(CarveOut { cpu_base, dev_base, pages })
    }

    /// Pages managed.
    pub fn pages(&self) -> usize {
        self.pages.pages()
    }

    /// Pages handed out.
    pub fn used_pages(&self) -> usize {
        self.pages.used_pages()
    }

    /// Takes `len` bytes (rounded up to pages; 0 counts as one page):
    /// returns the CPU address and the device address of the first byte.
    pub fn alloc(&mut self, len: usize) -> Result<(usize, u64), PagesError> {
        let first = self.pages.alloc(len.max(1).div_ceil(PAGE))?;
        Ok((self.cpu_base + first * PAGE, self.dev_base + (first * PAGE) as u64))
    }

    /// Gives back `len` bytes at CPU address `cpu` (from [`CarveOut::alloc`]).
    /// Refused, changing nothing, when the range is not a run of pages
    /// handed out by this carve-out (double free, foreign pointer).
    pub fn free(&mut self, cpu: usize, len: usize) -> Result<(), PagesError> {
        let n = len.max(1).div_ceil(PAGE);
        let off = cpu.checked_sub(self.cpu_base).filter(|off| off % PAGE == 0);
        let Some(off) = off else {
            return Err(PagesError::NotAllocated { first: usize::MAX, pages: n });
        };
        self.pages.free(off / PAGE, n)
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
        assert_eq!(c.free(a.0, PAGE), Ok(()));
        assert!(c.free(a.0, PAGE).is_err(), "double free is refused");
        assert_eq!(c.alloc(2 * PAGE).unwrap().0, 0x4100_4000, "the 1-page hole is too small");
        assert_eq!(c.alloc(100).unwrap().0, 0x4100_0000, "the hole is reused");
        assert!(matches!(c.alloc(16 * PAGE), Err(PagesError::Exhausted { .. })));
        assert!(c.free(0x1000, PAGE).is_err(), "foreign pointer");
        assert!(c.free(0x4100_0800, PAGE).is_err(), "not page aligned");
        assert_eq!(c.used_pages(), 6);
    }

    #[test]
    fn device_offset_and_bad_bases() {
        let mut c = CarveOut::new(0x1000, 0x8000_0000, 2 * PAGE).unwrap();
        assert_eq!(c.alloc(1), Ok((0x1000, 0x8000_0000)));
        assert!(CarveOut::new(0x1001, 0, PAGE).is_none());
        assert_eq!(CarveOut::new(0, 0, usize::MAX).unwrap().pages(), MAX_PAGES);
    }
}
