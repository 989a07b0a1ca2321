//! The refgpu MMU format (`docs/refgpu.md` section 3): page-table entry bits
//! and the VA split the device walks.
//!
//! This is the one place the format is encoded; the page-table builder
//! ([`crate::mem::pagetable`]) and any software walker use these constants.
//!
//! A GPU virtual address is 48 bits wide and translated by a four-level walk:
//!
//! | level | VA bits | one entry maps |
//! | ----- | ------- | -------------- |
//! | L0    | 47:39   | 512 GiB        |
//! | L1    | 38:30   | 1 GiB          |
//! | L2    | 29:21   | 2 MiB          |
//! | L3    | 20:12   | 4 KiB          |
//!
//! Every table is one 4 KiB page of 512 little-endian 64-bit entries.

/// Bits of a GPU virtual address; bits 63:48 must be zero.
pub const VA_BITS: u32 = 48;
/// One past the highest valid GPU virtual address.
pub const VA_LIMIT: u64 = 1 << VA_BITS;
/// Number of levels in a walk (L0..L3).
pub const LEVELS: usize = 4;
/// Entries per table.
pub const ENTRIES_PER_TABLE: usize = 512;
/// Size of one table in bytes (also its alignment).
pub const TABLE_SIZE: u64 = 4096;
/// Size of a small page (an L3 leaf).
pub const PAGE_SIZE_4K: u64 = 1 << 12;
/// Size of a block (an L2 leaf).
pub const PAGE_SIZE_2M: u64 = 1 << 21;

/// Entry bit 0: the entry is valid; otherwise the access is a TRANSLATION fault.
pub const PTE_VALID: u64 = 1 << 0;
/// Entry bit 1: points to a next-level table (L0, L1 must; L2 may; L3 must, meaning "4 KiB page").
pub const PTE_TABLE: u64 = 1 << 1;
/// Entry bit 2 (leaf): reads and command fetches allowed.
pub const PTE_READ: u64 = 1 << 2;
/// Entry bit 3 (leaf): writes allowed.
pub const PTE_WRITE: u64 = 1 << 3;
/// Entry bits 5:4 (leaf): cache policy hint.
pub const PTE_CACHE_SHIFT: u32 = 4;
/// Mask of the cache field.
pub const PTE_CACHE_MASK: u64 = 0b11 << PTE_CACHE_SHIFT;
/// Cache field value 0: uncached.
pub const CACHE_UNCACHED: u64 = 0;
/// Cache field value 1: write-combined.
pub const CACHE_WRITE_COMBINED: u64 = 1;
/// Cache field value 2: cached.
pub const CACHE_CACHED: u64 = 2;
/// Cache field value 3 is reserved: BAD_PTE.
pub const CACHE_RESERVED: u64 = 3;
/// Bits 11:6 are reserved and must be zero (BAD_PTE).
pub const PTE_RESERVED_LOW: u64 = 0x3F << 6;
/// Bits 47:12: physical address of the next table or of the page.
pub const PTE_ADDR_MASK: u64 = 0x0000_FFFF_FFFF_F000;
/// Bits 63:48 are reserved and must be zero (BAD_PTE).
pub const PTE_RESERVED_HIGH: u64 = 0xFFFF_0000_0000_0000;

/// VA shift of the index at each level: `index = (va >> shift) & 511`.
pub const LEVEL_SHIFT: [u32; LEVELS] = [39, 30, 21, 12];
/// The level whose leaves are 2 MiB blocks.
pub const BLOCK_LEVEL: usize = 2;
/// The level whose leaves are 4 KiB pages.
pub const PAGE_LEVEL: usize = 3;

/// Index into the table at `level` (0..=3) for `va`. Levels above 3 are
/// clamped to 3 so the function stays total.
#[inline]
pub const fn va_index(level: usize, va: u64) -> usize {
    let shift = match level {
        0 => 39,
        1 => 30,
        2 => 21,
        _ => 12,
    };
    ((va >> shift) & 0x1FF) as usize
}

/// Bytes mapped by one entry of a table at `level` (512 GiB, 1 GiB, 2 MiB, 4 KiB).
#[inline]
pub const fn entry_span(level: usize) -> u64 {
    match level {
        0 => 1 << 39,
        1 => 1 << 30,
        2 => 1 << 21,
        _ => 1 << 12,
    }
}

/// A table entry pointing to the next-level table at physical `table`.
#[inline]
pub const fn table_entry(table: u64) -> u64 {
    (table & PTE_ADDR_MASK) | PTE_TABLE | PTE_VALID
}

/// Encodes a leaf entry. `level` 3 gives a 4 KiB page (TABLE = 1), level 2
/// a 2 MiB block (TABLE = 0). `cache` is one of the `CACHE_*` values.
#[inline]
pub const fn leaf_entry(level: usize, phys: u64, read: bool, write: bool, cache: u64) -> u64 {
    let mut e = (phys & PTE_ADDR_MASK) | PTE_VALID | ((cache & 0b11) << PTE_CACHE_SHIFT);
    if level == PAGE_LEVEL {
        e |= PTE_TABLE;
    }
    if read {
        e |= PTE_READ;
    }
    if write {
        e |= PTE_WRITE;
    }
    e
}

/// Physical address field of an entry.
#[inline]
pub const fn entry_addr(entry: u64) -> u64 {
    entry & PTE_ADDR_MASK
}

/// True when the entry is valid.
#[inline]
pub const fn is_valid(entry: u64) -> bool {
    entry & PTE_VALID != 0
}

/// True when a valid entry at `level` points to a next-level table.
#[inline]
pub const fn is_table(level: usize, entry: u64) -> bool {
    level < PAGE_LEVEL && entry & PTE_TABLE != 0
}

/// True when the entry would make the device report BAD_PTE at `level`
/// (section 3.2): reserved bits set, reserved cache value, a TABLE bit the
/// level forbids, or a misaligned block address. Invalid entries are never bad.
#[inline]
pub const fn is_bad(level: usize, entry: u64) -> bool {
    if !is_valid(entry) {
        return false;
    }
    if entry & (PTE_RESERVED_LOW | PTE_RESERVED_HIGH) != 0 {
        return true;
    }
    let table = entry & PTE_TABLE != 0;
    match level {
        0 | 1 => !table,
        2 => {
            if table {
                false
            } else {
                (entry & PTE_CACHE_MASK) >> PTE_CACHE_SHIFT == CACHE_RESERVED
                    || entry & (PAGE_SIZE_2M - 1) & PTE_ADDR_MASK != 0
            }
        }
        _ => !table || (entry & PTE_CACHE_MASK) >> PTE_CACHE_SHIFT == CACHE_RESERVED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The example walk of docs/refgpu.md section 3.3.
    #[test]
    fn spec_example() {
        let va = 0x0000_0012_3456_7800u64;
        assert_eq!(va_index(0, va), 0);
        assert_eq!(va_index(1, va), 0x48);
        assert_eq!(va_index(2, va), 0x1A2);
        assert_eq!(va_index(3, va), 0x167);
        assert_eq!(leaf_entry(3, 0x4010_3000, true, true, CACHE_UNCACHED), 0x0000_0000_4010_300F);
        assert_eq!(leaf_entry(2, 0x4020_0000, true, true, CACHE_UNCACHED), 0x0000_0000_4020_000D);
        assert!(!is_bad(3, 0x4010_300F));
        assert!(!is_bad(2, 0x4020_000D));
        assert!(is_bad(2, 0x4020_100D));
        assert!(is_bad(3, 0x4010_300D));
        assert!(is_bad(0, 0x4010_3005));
        assert!(is_bad(3, 0x4010_303F));
    }
}
