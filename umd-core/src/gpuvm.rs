//! The GPU's view of memory in direct mode: which GPU virtual address each
//! piece of GPU-visible memory lives at.
//!
//! With the MMU enabled, [`GpuVm`] picks addresses with the fixed-arena VA
//! allocator ([`crate::mem::VaAllocator`]) and writes the page tables
//! ([`crate::mem::PageTable`]) into table pages carved from one DMA region
//! ([`DmaPageSource`]). With the MMU bypassed (early bring-up), a GPU
//! address is the device address of the memory.

use core::fmt;

use crate::hw::mmu::ENTRIES_PER_TABLE;
use crate::mem::{NoTlb, PageSource, PageTable, Perms, PtError, VaAllocator, VaError, VaNode};
use crate::platform::DmaRegion;

/// Table pages one [`DmaPageSource`] can hand out (a bitmap of this many).
pub const MAX_TABLE_PAGES: usize = 256;
/// VA allocator nodes (live mappings + holes) of a [`GpuVm`].
pub const VA_NODES: usize = 256;

/// Page-table pages in one DMA region, handed out from a bitmap.
#[derive(Debug)]
pub struct DmaPageSource {
    region: DmaRegion,
    used: [u64; MAX_TABLE_PAGES / 64],
    pages: usize,
}

impl DmaPageSource {
    /// Table pages over `region` (its length / 4096 pages, at most
    /// [`MAX_TABLE_PAGES`]).
    pub fn new(region: DmaRegion) -> DmaPageSource {
        let pages = (region.len() / 4096).min(MAX_TABLE_PAGES);
        DmaPageSource { region, used: [0; MAX_TABLE_PAGES / 64], pages }
    }

    /// Gives the memory back.
    pub fn into_region(self) -> DmaRegion {
        self.region
    }

    /// Pages in use.
    pub fn in_use(&self) -> usize {
        self.used.iter().map(|w| w.count_ones() as usize).sum()
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
        }
    }
}

/// Why memory could not be given a GPU address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmError {
    /// The VA allocator refused.
    Va(VaError),
    /// The page-table builder refused.
    PageTable(PtError),
}

impl fmt::Display for VmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VmError::Va(e) => write!(f, "GPU VA: {e:?}"),
            VmError::PageTable(e) => write!(f, "page table: {e}"),
        }
    }
}

/// How the GPU addresses memory.
// The mapped variant carries the allocator's node array inline: there is
// no heap to box it on, and a device holds exactly one of these.
#[allow(clippy::large_enum_variant)]
pub enum GpuVm {
    /// MMU off: GPU address = device address.
    Bypass,
    /// MMU on: addresses from the allocator, mapped by the page tables.
    Mapped {
        /// Address allocator over the GPU VA arena.
        va: VaAllocator<[VaNode; VA_NODES]>,
        /// The tables.
        pt: PageTable,
        /// Where table pages come from.
        pages: DmaPageSource,
    },
}

impl fmt::Debug for GpuVm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuVm::Bypass => f.write_str("GpuVm::Bypass"),
            GpuVm::Mapped { va, pt, pages } => f
                .debug_struct("GpuVm::Mapped")
                .field("va", &va.stats())
                .field("tables", &pt.stats())
                .field("table_pages_in_use", &pages.in_use())
                .finish(),
        }
    }
}

impl GpuVm {
    /// An MMU-mapped VM over `[va_base, va_base + va_size)` with table
    /// pages from `table_region`.
    pub fn mapped(
        va_base: u64,
        va_size: u64,
        table_region: DmaRegion,
    ) -> Result<GpuVm, (VmError, DmaRegion)> {
        let va = match VaAllocator::new([VaNode::EMPTY; VA_NODES], va_base, va_size) {
            Ok(v) => v,
            Err(e) => return Err((VmError::Va(e), table_region)),
        };
        let mut pages = DmaPageSource::new(table_region);
        match PageTable::new(&mut pages) {
            Ok(pt) => Ok(GpuVm::Mapped { va, pt, pages }),
            Err(e) => Err((VmError::PageTable(e), pages.into_region())),
        }
    }

    /// The physical address for MMU_ROOT, if mapped.
    pub fn root(&self) -> Option<u64> {
        match self {
            GpuVm::Bypass => None,
            GpuVm::Mapped { pt, .. } => Some(pt.root()),
        }
    }

    /// Gives `region` a GPU address (`len` bytes, 4 KiB multiple).
    pub fn map(&mut self, region: &DmaRegion, perms: Perms) -> Result<u64, VmError> {
        match self {
            GpuVm::Bypass => Ok(region.dev_addr()),
            GpuVm::Mapped { va, pt, pages } => {
                let len = region.len() as u64;
                // 2 MiB alignment for large regions lets the builder use blocks.
                let align = if len >= 2 << 20 { 2 << 20 } else { 4096 };
                let addr = va.alloc(len, align, crate::mem::Placement::BottomUp).map_err(VmError::Va)?;
                if let Err(e) = pt.map(pages, &mut NoTlb, addr, region.dev_addr(), len, perms) {
                    let _ = va.free(addr);
                    return Err(VmError::PageTable(e));
                }
                Ok(addr)
            }
        }
    }

    /// Removes the mapping made by [`GpuVm::map`] at `addr` (`len` bytes).
    /// The caller invalidates the device TLB afterwards.
    pub fn unmap(&mut self, addr: u64, len: u64) -> Result<(), VmError> {
        match self {
            GpuVm::Bypass => Ok(()),
            GpuVm::Mapped { va, pt, pages } => {
                pt.unmap(pages, &mut NoTlb, addr, len).map_err(VmError::PageTable)?;
                va.free(addr).map_err(VmError::Va)?;
                Ok(())
            }
        }
    }

    /// Gives the table memory back (teardown).
    pub fn into_region(self) -> Option<DmaRegion> {
        match self {
            GpuVm::Bypass => None,
            GpuVm::Mapped { pages, .. } => Some(pages.into_region()),
        }
    }
}
