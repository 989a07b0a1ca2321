//! The GPU page tables of direct mode, in one DMA region of table pages.
//!
//! The core writes table entries with CPU stores. On a system whose CPU
//! caches are not coherent with the GPU those stores sit in the data cache
//! until cleaned, and the GPU's page walk would read stale memory: every
//! entry written is therefore tracked (a dirty byte range over the table
//! region) and cleaned before the GPU may walk it, that is before
//! MMU_ROOT/MMU_CTRL are programmed, before MMU_INVALIDATE, and before a
//! buffer's address is handed out (`docs/refgpu.md` section 3.2).

use crate::hw::mmu::ENTRIES_PER_TABLE;
use crate::mem::{NoTlb, PageSource, PageTable, Perms, PtError};
use crate::platform::{DmaRegion, Platform};

/// Table pages one [`DmaPageSource`] can hand out (a bitmap of this many).
pub const MAX_TABLE_PAGES: usize = 256;

/// Page-table pages in one DMA region, handed out from a bitmap, with the
/// range of bytes written since the last clean.
#[derive(Debug)]
pub struct DmaPageSource {
    region: DmaRegion,
    used: [u64; MAX_TABLE_PAGES / 64],
    pages: usize,
    dirty: Option<(usize, usize)>,
    writes: u64,
}

impl DmaPageSource {
    /// Table pages over `region` (its length / 4096 pages, at most
    /// [`MAX_TABLE_PAGES`]).
    pub fn new(region: DmaRegion) -> DmaPageSource {
        let pages = (region.len() / 4096).min(MAX_TABLE_PAGES);
        DmaPageSource { region, used: [0; MAX_TABLE_PAGES / 64], pages, dirty: None, writes: 0 }
    }

    /// Gives the memory back.
    pub fn into_region(self) -> DmaRegion {
        self.region
    }

    /// Pages in use.
    pub fn in_use(&self) -> usize {
        self.used.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Entries written by the builder since the start.
    pub fn entry_writes(&self) -> u64 {
        self.writes
    }

    /// Cleans what was written since the last call from the CPU cache, so
    /// the device's walk sees it.
    pub fn flush<P: Platform>(&mut self, p: &P) {
        if let Some((lo, hi)) = self.dirty.take() {
            p.cache_clean(&self.region, lo, hi.saturating_sub(lo));
        }
    }

    fn touch(&mut self, off: usize, len: usize) {
        let end = off.saturating_add(len);
        self.dirty = Some(match self.dirty {
            Some((lo, hi)) => (lo.min(off), hi.max(end)),
            None => (off, end),
        });
    }

    fn offset(&self, phys: u64, index: usize) -> Option<usize> {
        let rel = usize::try_from(phys.checked_sub(self.region.dev_addr())?).ok()?;
        if index >= ENTRIES_PER_TABLE || rel % 4096 != 0 || rel / 4096 >= self.pages {
            return None;
        }
        rel.checked_add(index.checked_mul(8)?)
    }
}

impl PageSource for DmaPageSource {
    fn alloc_table(&mut self) -> Option<u64> {
        let page =
            (0..self.pages).find(|p| self.used.get(p / 64).is_some_and(|w| w & (1u64 << (p % 64)) == 0))?;
        let word = self.used.get_mut(page / 64)?;
        *word |= 1u64 << (page % 64);
        let base = page.checked_mul(4096)?;
        for i in 0..ENTRIES_PER_TABLE {
            self.region.write_u64(base.saturating_add(i.saturating_mul(8)), 0);
        }
        self.touch(base, 4096);
        self.region.dev_addr().checked_add(base as u64)
    }

    fn free_table(&mut self, phys: u64) {
        if let Some(off) = self.offset(phys, 0) {
            let page = off / 4096;
            if let Some(w) = self.used.get_mut(page / 64) {
                *w &= !(1u64 << (page % 64));
            }
        }
    }

    fn read_entry(&self, phys: u64, index: usize) -> u64 {
        self.offset(phys, index).and_then(|o| self.region.read_u64(o)).unwrap_or(0)
    }

    fn write_entry(&mut self, phys: u64, index: usize, value: u64) {
        if let Some(o) = self.offset(phys, index) {
            self.region.write_u64(o, value);
            self.touch(o, 8);
            self.writes = self.writes.wrapping_add(1);
        }
    }
}

/// The tables and their pages.
#[derive(Debug)]
pub struct Tables {
    pub(crate) pt: PageTable,
    pub(crate) pages: DmaPageSource,
}

impl Tables {
    /// Tables with their root in `region`; on error the region is handed back.
    pub fn new(region: DmaRegion) -> Result<Tables, (PtError, DmaRegion)> {
        let mut pages = DmaPageSource::new(region);
        match PageTable::new(&mut pages) {
            Ok(pt) => Ok(Tables { pt, pages }),
            Err(e) => Err((e, pages.into_region())),
        }
    }

    /// The physical address for MMU_ROOT.
    pub fn root(&self) -> u64 {
        self.pt.root()
    }

    /// Maps and cleans the entries written. The range was free: no TLB
    /// invalidation is needed (entries that were invalid may be made valid
    /// without one, spec section 3.2).
    pub fn map<P: Platform>(
        &mut self,
        p: &P,
        va: u64,
        pa: u64,
        len: u64,
        perms: Perms,
    ) -> Result<(), PtError> {
        let r = self.pt.map(&mut self.pages, &mut NoTlb, va, pa, len, perms);
        self.pages.flush(p);
        r
    }

    /// Unmaps and cleans the entries written; the caller invalidates the
    /// TLB afterwards.
    pub fn unmap<P: Platform>(&mut self, p: &P, va: u64, len: u64) -> Result<(), PtError> {
        let r = self.pt.unmap(&mut self.pages, &mut NoTlb, va, len);
        self.pages.flush(p);
        r
    }
}
