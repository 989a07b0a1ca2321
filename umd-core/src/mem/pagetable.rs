//! Page-table builder for the refgpu MMU (`docs/refgpu.md` section 3).
//!
//! The builder never touches memory itself: table pages come from, and are
//! read and written through, a [`PageSource`] the platform implements. On
//! bare metal that is a carve-out of physical memory (see
//! [`ArrayPageSource`], which works on any slice the integrator maps); on
//! Linux with a kernel driver the kernel owns the tables and this module is
//! not used; a test fake is a few lines over a `Vec`.
//!
//! Mappings use 2 MiB blocks wherever the VA, the physical address and the
//! remaining length allow it and no table exists for that 2 MiB yet, and
//! 4 KiB pages elsewhere.
//!
//! Invariant: every table other than the root holds at least one valid
//! entry. Unmapping frees tables that become empty, and a failed map is
//! rolled back, so the invariant holds after every call; this is what makes
//! "state unchanged on error" checkable.
//!
//! Errors are detected before anything is written (a first read-only pass),
//! except running out of table pages, which is undone by unmapping what was
//! written. Costs are O(pages touched + 512 × tables touched).

use core::fmt;

use crate::hw::mmu::{
    self, entry_addr, entry_span, is_table, is_valid, leaf_entry, table_entry, va_index, BLOCK_LEVEL,
    ENTRIES_PER_TABLE, PAGE_LEVEL, PAGE_SIZE_2M, PAGE_SIZE_4K,
};

/// Where page-table pages come from and how they are accessed.
///
/// Physical addresses are what the device sees (they go into `MMU_ROOT` and
/// into table entries). The implementation translates them to whatever it
/// needs to reach the memory (an identity map, a linear offset, a `Vec`).
pub trait PageSource {
    /// A zero-filled, 4 KiB-aligned page for one table; `None` when out of pages.
    fn alloc_table(&mut self) -> Option<u64>;
    /// Gives back a page obtained from `alloc_table` (it is all zeroes again).
    fn free_table(&mut self, phys: u64);
    /// Reads entry `index` (0..512) of the table at `phys`.
    fn read_entry(&self, phys: u64, index: usize) -> u64;
    /// Writes entry `index` (0..512) of the table at `phys`. Implementations
    /// on real hardware make the write visible to the device (cache clean or
    /// uncached memory) before returning.
    fn write_entry(&mut self, phys: u64, index: usize, value: u64);
}

/// Hook called when a valid entry was changed, so the platform can write
/// `MMU_INVALIDATE` and wait for it (section 3.2).
pub trait TlbInvalidate {
    /// Cached translations of `[va, va + size)` must be dropped.
    fn invalidate(&mut self, va: u64, size: u64);
}

/// A TLB hook that does nothing (MMU disabled, or tables not yet live).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoTlb;

impl TlbInvalidate for NoTlb {
    fn invalidate(&mut self, _va: u64, _size: u64) {}
}

/// Cache policy hint of a leaf (PTE bits 5:4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CachePolicy {
    /// 0: uncached.
    #[default]
    Uncached,
    /// 1: write-combined.
    WriteCombined,
    /// 2: cached.
    Cached,
}

impl CachePolicy {
    const fn bits(self) -> u64 {
        match self {
            CachePolicy::Uncached => mmu::CACHE_UNCACHED,
            CachePolicy::WriteCombined => mmu::CACHE_WRITE_COMBINED,
            CachePolicy::Cached => mmu::CACHE_CACHED,
        }
    }
}

/// Access rights and cache policy of a mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Perms {
    /// Reads and command fetches allowed.
    pub read: bool,
    /// Writes allowed (false for GPU read-only buffers).
    pub write: bool,
    /// Cache policy hint.
    pub cache: CachePolicy,
}

impl Perms {
    /// Read-write, uncached: the safe default for shared buffers.
    pub const RW: Perms = Perms { read: true, write: true, cache: CachePolicy::Uncached };
    /// Read-only, uncached: command buffers and constants.
    pub const RO: Perms = Perms { read: true, write: false, cache: CachePolicy::Uncached };
}

/// Why a page-table operation was refused. Tables are unchanged after any error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PtError {
    /// Size 0.
    ZeroSize,
    /// VA, physical address or size not 4 KiB aligned.
    Misaligned,
    /// The range wraps, leaves the 48-bit VA space or the 48-bit physical space.
    OutOfRange,
    /// Part of the range is already mapped.
    AlreadyMapped,
    /// Part of the range is not mapped.
    NotMapped,
    /// The range covers only part of a 2 MiB block.
    SplitsBlock,
    /// The page source has no page for a table.
    OutOfTables,
}

impl fmt::Display for PtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PtError::ZeroSize => "zero-sized mapping",
            PtError::Misaligned => "address or size is not 4 KiB aligned",
            PtError::OutOfRange => "range outside the 48-bit address space",
            PtError::AlreadyMapped => "range is already (partly) mapped",
            PtError::NotMapped => "range is not (fully) mapped",
            PtError::SplitsBlock => "range covers part of a 2 MiB block",
            PtError::OutOfTables => "no page left for a page table",
        })
    }
}

impl core::error::Error for PtError {}

/// What the device would do with an access, per the spec's walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalkFault {
    /// An invalid entry, or VA bits 63:48 set (fault KIND 1).
    Translation {
        /// Level of the invalid entry (0..=3); 0 for a non-canonical VA.
        level: u8,
    },
    /// An entry with a reserved encoding (fault KIND 4).
    BadPte {
        /// Level of the bad entry.
        level: u8,
    },
}

/// A successful translation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Translation {
    /// Physical address of the byte.
    pub phys: u64,
    /// 4 KiB or 2 MiB.
    pub page_size: u64,
    /// The leaf's rights.
    pub read: bool,
    /// The leaf's rights.
    pub write: bool,
    /// Raw cache field (0..=2).
    pub cache: u8,
}

/// Counters of one page table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PtStats {
    /// Table pages in use, root included.
    pub tables: u64,
    /// Valid 4 KiB leaves.
    pub pages_4k: u64,
    /// Valid 2 MiB leaves.
    pub blocks_2m: u64,
}

impl PtStats {
    /// Bytes of VA currently mapped.
    pub fn mapped_bytes(&self) -> u64 {
        self.pages_4k.saturating_mul(PAGE_SIZE_4K).saturating_add(self.blocks_2m.saturating_mul(PAGE_SIZE_2M))
    }
}

/// One GPU address space: a root table and the tables below it.
#[derive(Debug)]
pub struct PageTable {
    root: u64,
    stats: PtStats,
}

const LAST_LEVEL: usize = PAGE_LEVEL;

impl PageTable {
    /// Allocates an empty root table.
    pub fn new(src: &mut impl PageSource) -> Result<Self, PtError> {
        let root = src.alloc_table().ok_or(PtError::OutOfTables)?;
        Ok(PageTable { root, stats: PtStats { tables: 1, ..PtStats::default() } })
    }

    /// Physical address of the level-0 table, for `MMU_ROOT`.
    pub fn root(&self) -> u64 {
        self.root
    }

    /// Counters.
    pub fn stats(&self) -> PtStats {
        self.stats
    }

    /// Maps `[va, va + size)` to `[pa, pa + size)` with `perms`. All three
    /// must be 4 KiB aligned, and nothing in the range may be mapped. `tlb`
    /// is used only if a failure has to undo entries it made valid.
    pub fn map(
        &mut self,
        src: &mut impl PageSource,
        tlb: &mut impl TlbInvalidate,
        va: u64,
        pa: u64,
        size: u64,
        perms: Perms,
    ) -> Result<(), PtError> {
        let end = check_range(va, size)?;
        if pa % PAGE_SIZE_4K != 0 {
            return Err(PtError::Misaligned);
        }
        if pa.checked_add(size).is_none_or(|e| e > mmu::VA_LIMIT) {
            return Err(PtError::OutOfRange);
        }
        self.check_free(src, self.root, 0, va, end)?;
        let leaf = Leaf { pa, va, perms };
        if let Err(e) = self.map_level(src, self.root, 0, va, end, &leaf) {
            // Everything in [va, end) was free before: clearing it restores
            // the previous state, and frees the tables made on the way.
            self.unmap_level(src, self.root, 0, va, end);
            tlb.invalidate(va, size);
            return Err(e);
        }
        Ok(())
    }

    /// Unmaps `[va, va + size)`, which must be fully mapped and must not
    /// cover part of a 2 MiB block. Frees tables that become empty and calls
    /// `tlb` once.
    pub fn unmap(
        &mut self,
        src: &mut impl PageSource,
        tlb: &mut impl TlbInvalidate,
        va: u64,
        size: u64,
    ) -> Result<(), PtError> {
        let end = check_range(va, size)?;
        self.check_mapped(src, self.root, 0, va, end)?;
        self.unmap_level(src, self.root, 0, va, end);
        tlb.invalidate(va, size);
        Ok(())
    }

    /// Walks the tables for `va` exactly as the device does (section 3.2).
    pub fn translate(&self, src: &impl PageSource, va: u64) -> Result<Translation, WalkFault> {
        if va >= mmu::VA_LIMIT {
            return Err(WalkFault::Translation { level: 0 });
        }
        let mut table = self.root;
        for level in 0..mmu::LEVELS {
            let lv = level as u8;
            let e = src.read_entry(table, va_index(level, va));
            if !is_valid(e) {
                return Err(WalkFault::Translation { level: lv });
            }
            if mmu::is_bad(level, e) {
                return Err(WalkFault::BadPte { level: lv });
            }
            if is_table(level, e) {
                table = entry_addr(e);
                continue;
            }
            let span = entry_span(level);
            let leaf = mmu::Pte(e);
            return Ok(Translation {
                phys: leaf.addr() | (va & span.wrapping_sub(1)),
                page_size: span,
                read: leaf.read(),
                write: leaf.write(),
                cache: leaf.cache(),
            });
        }
        Err(WalkFault::BadPte { level: 3 })
    }

    /// Unmaps everything and frees every table including the root.
    pub fn destroy(mut self, src: &mut impl PageSource, tlb: &mut impl TlbInvalidate) {
        self.unmap_level(src, self.root, 0, 0, mmu::VA_LIMIT);
        src.free_table(self.root);
        tlb.invalidate(0, mmu::VA_LIMIT);
    }

    // ----- passes ----------------------------------------------------------

    /// Errors unless no valid leaf lies in `[va, end)` below `table`.
    fn check_free(
        &self,
        src: &impl PageSource,
        table: u64,
        level: usize,
        va: u64,
        end: u64,
    ) -> Result<(), PtError> {
        let mut res = Ok(());
        for_each_entry(level, va, end, |idx, rs, re| {
            let e = src.read_entry(table, idx);
            if !is_valid(e) {
                return true;
            }
            if level < LAST_LEVEL && is_table(level, e) {
                res = self.check_free(src, entry_addr(e), level.wrapping_add(1), rs, re);
            } else {
                res = Err(PtError::AlreadyMapped);
            }
            res.is_ok()
        });
        res
    }

    /// Errors unless every page of `[va, end)` is mapped and no block is cut.
    fn check_mapped(
        &self,
        src: &impl PageSource,
        table: u64,
        level: usize,
        va: u64,
        end: u64,
    ) -> Result<(), PtError> {
        let mut res = Ok(());
        for_each_entry(level, va, end, |idx, rs, re| {
            let e = src.read_entry(table, idx);
            if !is_valid(e) {
                res = Err(PtError::NotMapped);
            } else if level < LAST_LEVEL && is_table(level, e) {
                res = self.check_mapped(src, entry_addr(e), level.wrapping_add(1), rs, re);
            } else if re.wrapping_sub(rs) != entry_span(level) {
                res = Err(PtError::SplitsBlock);
            }
            res.is_ok()
        });
        res
    }

    fn map_level(
        &mut self,
        src: &mut impl PageSource,
        table: u64,
        level: usize,
        va: u64,
        end: u64,
        leaf: &Leaf,
    ) -> Result<(), PtError> {
        let mut res = Ok(());
        for_each_entry(level, va, end, |idx, rs, re| {
            let pa = leaf.pa.wrapping_add(rs.wrapping_sub(leaf.va));
            let p = leaf.perms;
            if level == PAGE_LEVEL {
                src.write_entry(table, idx, leaf_entry(level, pa, p.read, p.write, p.cache.bits()));
                self.stats.pages_4k = self.stats.pages_4k.wrapping_add(1);
                return true;
            }
            let e = src.read_entry(table, idx);
            let whole = re.wrapping_sub(rs) == PAGE_SIZE_2M;
            if level == BLOCK_LEVEL && !is_valid(e) && whole && pa % PAGE_SIZE_2M == 0 {
                src.write_entry(table, idx, leaf_entry(level, pa, p.read, p.write, p.cache.bits()));
                self.stats.blocks_2m = self.stats.blocks_2m.wrapping_add(1);
                return true;
            }
            let child = if is_valid(e) {
                entry_addr(e)
            } else {
                let Some(t) = src.alloc_table() else {
                    res = Err(PtError::OutOfTables);
                    return false;
                };
                src.write_entry(table, idx, table_entry(t));
                self.stats.tables = self.stats.tables.wrapping_add(1);
                t
            };
            res = self.map_level(src, child, level.wrapping_add(1), rs, re, leaf);
            res.is_ok()
        });
        res
    }

    /// Clears every valid entry in `[va, end)` below `table`, freeing child
    /// tables that end up empty. Tolerates holes (used for rollback).
    /// Returns true when `table` is empty afterwards.
    fn unmap_level(
        &mut self,
        src: &mut impl PageSource,
        table: u64,
        level: usize,
        va: u64,
        end: u64,
    ) -> bool {
        for_each_entry(level, va, end, |idx, rs, re| {
            let e = src.read_entry(table, idx);
            if !is_valid(e) {
                return true;
            }
            if level < LAST_LEVEL && is_table(level, e) {
                let child = entry_addr(e);
                if self.unmap_level(src, child, level.wrapping_add(1), rs, re) {
                    src.write_entry(table, idx, 0);
                    src.free_table(child);
                    self.stats.tables = self.stats.tables.wrapping_sub(1);
                }
            } else {
                src.write_entry(table, idx, 0);
                if level == PAGE_LEVEL {
                    self.stats.pages_4k = self.stats.pages_4k.wrapping_sub(1);
                } else {
                    self.stats.blocks_2m = self.stats.blocks_2m.wrapping_sub(1);
                }
            }
            true
        });
        // A range that covers this table's whole span cleared every entry.
        let table_span = entry_span(level) << 9;
        let covers = va & table_span.wrapping_sub(1) == 0 && end.wrapping_sub(va) >= table_span;
        if covers {
            return true;
        }
        (0..ENTRIES_PER_TABLE).all(|i| !is_valid(src.read_entry(table, i)))
    }
}

/// The mapping being written: VA `va` goes to `pa`.
struct Leaf {
    pa: u64,
    va: u64,
    perms: Perms,
}

/// Validates a range and returns its end.
fn check_range(va: u64, size: u64) -> Result<u64, PtError> {
    if size == 0 {
        return Err(PtError::ZeroSize);
    }
    if va % PAGE_SIZE_4K != 0 || size % PAGE_SIZE_4K != 0 {
        return Err(PtError::Misaligned);
    }
    let end = va.checked_add(size).ok_or(PtError::OutOfRange)?;
    if end > mmu::VA_LIMIT {
        return Err(PtError::OutOfRange);
    }
    Ok(end)
}

/// Calls `f(index, start, end)` for each entry of a table at `level` that
/// `[va, end)` touches, with the part of the range under that entry; stops
/// when `f` returns false. `[va, end)` must lie within one table's span.
/// At most 512 iterations.
fn for_each_entry(level: usize, va: u64, end: u64, mut f: impl FnMut(usize, u64, u64) -> bool) {
    let span = entry_span(level);
    let mut cur = va;
    let first = va_index(level, va);
    for idx in first..ENTRIES_PER_TABLE {
        if cur >= end {
            return;
        }
        let next = (cur | span.wrapping_sub(1)).saturating_add(1);
        let re = next.min(end);
        if !f(idx, cur, re) {
            return;
        }
        cur = re;
    }
}

/// A heap-free [`PageSource`] over a caller-provided array of table pages
/// whose device-visible physical address is `phys_base + 4096 * i`. On bare
/// metal, pass the page-table carve-out (identity- or linearly mapped); in
/// tests, any array.
pub struct ArrayPageSource<'a> {
    pages: &'a mut [[u64; ENTRIES_PER_TABLE]],
    phys_base: u64,
    free_head: usize,
    bump: usize,
    in_use: usize,
}

const NO_PAGE: usize = usize::MAX;

impl<'a> ArrayPageSource<'a> {
    /// Serves `pages`, which the device sees at `phys_base` (4 KiB aligned).
    pub fn new(pages: &'a mut [[u64; ENTRIES_PER_TABLE]], phys_base: u64) -> Self {
        ArrayPageSource { pages, phys_base, free_head: NO_PAGE, bump: 0, in_use: 0 }
    }

    /// Pages handed out and not yet freed.
    pub fn in_use(&self) -> usize {
        self.in_use
    }

    fn index(&self, phys: u64) -> Option<usize> {
        let off = phys.checked_sub(self.phys_base)?;
        usize::try_from(off >> 12).ok()
    }
}

impl PageSource for ArrayPageSource<'_> {
    fn alloc_table(&mut self) -> Option<u64> {
        let i = if self.free_head != NO_PAGE {
            let i = self.free_head;
            let next = self.pages.get(i)?.first().copied().unwrap_or(0);
            // Free pages keep "next + 1" in entry 0 (0 = end of list).
            self.free_head = usize::try_from(next).ok()?.checked_sub(1).unwrap_or(NO_PAGE);
            i
        } else if self.bump < self.pages.len() {
            let i = self.bump;
            self.bump = self.bump.wrapping_add(1);
            i
        } else {
            return None;
        };
        let page = self.pages.get_mut(i)?;
        *page = [0; ENTRIES_PER_TABLE];
        self.in_use = self.in_use.wrapping_add(1);
        let off = u64::try_from(i).ok()?.checked_mul(mmu::TABLE_SIZE)?;
        self.phys_base.checked_add(off)
    }

    fn free_table(&mut self, phys: u64) {
        let Some(i) = self.index(phys) else {
            return;
        };
        let link = if self.free_head == NO_PAGE { 0 } else { self.free_head.wrapping_add(1) as u64 };
        if let Some(page) = self.pages.get_mut(i) {
            *page = [0; ENTRIES_PER_TABLE];
            if let Some(e) = page.first_mut() {
                *e = link;
            }
            self.free_head = i;
            self.in_use = self.in_use.wrapping_sub(1);
        }
    }

    fn read_entry(&self, phys: u64, index: usize) -> u64 {
        self.index(phys).and_then(|i| self.pages.get(i)).and_then(|p| p.get(index)).copied().unwrap_or(0)
    }

    fn write_entry(&mut self, phys: u64, index: usize, value: u64) {
        if let Some(e) = self.index(phys).and_then(|i| self.pages.get_mut(i)).and_then(|p| p.get_mut(index)) {
            *e = value;
        }
    }
}
