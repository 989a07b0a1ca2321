//! What [`Device::new`](super::Device) takes from the platform's DMA
//! memory before the first buffer: the page tables, the fence slots, a
//! ring per queue and the IB pool, in that order. A firmware whose
//! carve-out is fixed at build time checks its size against this plan at
//! bring-up and gets a typed error naming the first pool that does not
//! fit, instead of an `OutOfMemory` from somewhere inside `Device::new`.
//!
//! Sizes are computed with `usize` arithmetic that saturates: on a 32-bit
//! target a plan whose total would overflow `usize` is reported as not
//! fitting, never wrapped into a small number.

use core::fmt;

use super::MmuMode;
use crate::config::Config;

/// Page granule of DMA allocations.
const PAGE: usize = 4096;

fn pages(len: usize) -> usize {
    len.max(1).checked_next_multiple_of(PAGE).unwrap_or(usize::MAX)
}

/// The fixed DMA memory of a direct-mode device, in allocation order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Page-table pages (0 with the MMU bypassed).
    pub page_tables: usize,
    /// The fence-slot page.
    pub fence_slots: usize,
    /// One ring (rounded to pages).
    pub ring: usize,
    /// Rings: one per queue.
    pub queues: usize,
    /// The IB pool: `CHUNKS` chunks of `ib_chunk_bytes`, rounded to pages.
    pub ib_pool: usize,
}

/// A pool that did not fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DoesNotFit {
    /// What did not fit: `"page tables"`, `"fence slots"`, `"ring"` or
    /// `"IB pool"`.
    pub what: &'static str,
    /// Its size in bytes.
    pub need: usize,
    /// Bytes left for it after the pools before it.
    pub left: usize,
    /// Bytes the whole plan needs.
    pub total: usize,
    /// Bytes available.
    pub available: usize,
}

impl fmt::Display for DoesNotFit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the {} ({} bytes) does not fit: {} bytes left of {}; the device needs {} bytes in all",
            self.what, self.need, self.left, self.available, self.total
        )
    }
}

impl core::error::Error for DoesNotFit {}

impl MemoryPlan {
    /// The plan of a device with `cfg`, `mmu`, `chunks` IB chunks and
    /// `queues` queues (the chip's engines, 3 on refgpu).
    pub fn new(cfg: &Config, mmu: MmuMode, chunks: usize, queues: usize) -> MemoryPlan {
        let page_tables = match mmu {
            MmuMode::Bypass => 0,
            MmuMode::Enabled { table_pages, .. } => table_pages.saturating_mul(PAGE),
        };
        MemoryPlan {
            page_tables,
            fence_slots: PAGE,
            ring: pages(cfg.ring_bytes),
            queues,
            ib_pool: pages(cfg.ib_chunk_bytes.saturating_mul(chunks)),
        }
    }

    fn pools(&self) -> impl Iterator<Item = (&'static str, usize)> + '_ {
        [("page tables", self.page_tables), ("fence slots", self.fence_slots)]
            .into_iter()
            .chain((0..self.queues).map(|_| ("ring", self.ring)))
            .chain([("IB pool", self.ib_pool)])
            .filter(|(_, n)| *n > 0)
    }

    /// Bytes in all (saturating).
    pub fn total(&self) -> usize {
        self.pools().fold(0usize, |a, (_, n)| a.saturating_add(n))
    }

    /// Whether the plan fits in `available` bytes of page-granular memory
    /// allocated first fit from empty; else the first pool that does not.
    pub fn check(&self, available: usize) -> Result<(), DoesNotFit> {
        let total = self.total();
        let mut left = available;
        for (what, need) in self.pools() {
            match left.checked_sub(need) {
                Some(l) => left = l,
                None => return Err(DoesNotFit { what, need, left, total, available }),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::string::ToString;

    const CFG: Config = Config { ring_bytes: 16 * 1024, ib_chunk_bytes: 4096, ..Config::DEFAULT };

    #[test]
    fn order_and_sizes() {
        let p = MemoryPlan::new(&CFG, MmuMode::DEFAULT, 16, 3);
        assert_eq!(p.total(), 64 * 4096 + 4096 + 3 * 16384 + 16 * 4096);
        assert_eq!(p.check(p.total()), Ok(()));
        let e = p.check(p.total() - 1).unwrap_err();
        assert_eq!((e.what, e.need, e.left), ("IB pool", 65536, 65535));
        let e = p.check(64 * 4096 + 4096 + 16384).unwrap_err();
        assert_eq!((e.what, e.left), ("ring", 0));
        assert_eq!(p.check(100).unwrap_err().what, "page tables");
        let b = MemoryPlan::new(&CFG, MmuMode::Bypass, 16, 3);
        assert_eq!(b.check(4095).unwrap_err().what, "fence slots");
        assert!(e.to_string().contains("the ring (16384 bytes) does not fit"), "{e}");
    }

    #[test]
    fn sizes_saturate_instead_of_wrapping() {
        let huge = Config { ib_chunk_bytes: usize::MAX / 2, ..CFG };
        let p = MemoryPlan::new(&huge, MmuMode::DEFAULT, 16, 3);
        assert_eq!(p.ib_pool, usize::MAX);
        assert_eq!(p.total(), usize::MAX);
        assert_eq!(p.check(usize::MAX - 1).unwrap_err().what, "IB pool");
    }
}
