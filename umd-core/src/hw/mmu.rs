//! The refgpu MMU format (`docs/refgpu.md` section 3): page-table entry bits
//! and the VA split the device walks.
//!
//! This is the one place the format is encoded: [`Pte`] is the entry as
//! typed fields (the `bitfield` crate), and the entry functions below
//! ([`leaf_entry`], [`table_entry`], [`is_bad`], ...) are written over it;
//! the page-table builder ([`crate::mem::pagetable`]) and any software
//! walker use them. The `PTE_*` masks describe the same bits for tests and
//! for code that builds entries by hand; a unit test checks both agree.
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

bitfield::bitfield! {
    /// A page-table entry (`docs/refgpu.md` section 3.2) as fields.
    #[derive(Clone, Copy, PartialEq, Eq)]
    pub struct Pte(pub u64);
    impl Debug;
    /// VALID, bit 0: otherwise a TRANSLATION fault (other bits ignored).
    pub valid, set_valid: 0;
    /// TABLE, bit 1: a next-level table (L0, L1 must; L2 may; L3 must,
    /// meaning "4 KiB page").
    pub table, set_table: 1;
    /// READ, bit 2 (leaf): reads and command fetches allowed.
    pub read, set_read: 2;
    /// WRITE, bit 3 (leaf): writes allowed.
    pub write, set_write: 3;
    /// CACHE, bits 5:4 (leaf): one of the `CACHE_*` values (3 is BAD_PTE).
    pub u8, cache, set_cache: 5, 4;
    /// Bits 11:6, reserved: must be 0 (BAD_PTE).
    pub u8, reserved_low, _: 11, 6;
    /// ADDR, bits 47:12: the physical frame (address >> 12) of the next
    /// table or of the page.
    pub u64, frame, set_frame: 47, 12;
    /// Bits 63:48, reserved: must be 0 (BAD_PTE).
    pub u16, reserved_high, _: 63, 48;
}

impl Pte {
    /// The physical address the entry points to (ADDR with bits 11:0 zero).
    #[inline]
    pub fn addr(self) -> u64 {
        self.frame() << 12
    }
}

/// A table entry pointing to the next-level table at physical `table`.
#[inline]
pub fn table_entry(table: u64) -> u64 {
    let mut e = Pte(0);
    e.set_frame(table >> 12);
    e.set_table(true);
    e.set_valid(true);
    e.0
}

/// Encodes a leaf entry. `level` 3 gives a 4 KiB page (TABLE = 1), level 2
/// a 2 MiB block (TABLE = 0). `cache` is one of the `CACHE_*` values (only
/// its two low bits are used).
#[inline]
pub fn leaf_entry(level: usize, phys: u64, read: bool, write: bool, cache: u64) -> u64 {
    let mut e = Pte(0);
    e.set_frame(phys >> 12);
    e.set_valid(true);
    e.set_table(level == PAGE_LEVEL);
    e.set_read(read);
    e.set_write(write);
    e.set_cache((cache & 0b11) as u8);
    e.0
}

/// Physical address field of an entry.
#[inline]
pub fn entry_addr(entry: u64) -> u64 {
    Pte(entry).addr()
}

/// True when the entry is valid.
#[inline]
pub fn is_valid(entry: u64) -> bool {
    Pte(entry).valid()
}

/// True when a valid entry at `level` points to a next-level table.
#[inline]
pub fn is_table(level: usize, entry: u64) -> bool {
    level < PAGE_LEVEL && Pte(entry).table()
}

/// True when the entry would make the device report BAD_PTE at `level`
/// (section 3.2): reserved bits set, reserved cache value, a TABLE bit the
/// level forbids, or a misaligned block address. Invalid entries are never bad.
#[inline]
pub fn is_bad(level: usize, entry: u64) -> bool {
    let e = Pte(entry);
    if !e.valid() {
        return false;
    }
    if e.reserved_low() != 0 || e.reserved_high() != 0 {
        return true;
    }
    let reserved_cache = u64::from(e.cache()) == CACHE_RESERVED;
    match level {
        0 | 1 => !e.table(),
        // A 2 MiB block: cache must not be reserved, ADDR bits 20:12 zero.
        2 => !e.table() && (reserved_cache || e.frame() & 0x1FF != 0),
        _ => !e.table() || reserved_cache,
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

    #[test]
    fn typed_entry_agrees_with_the_masks() {
        let all = Pte(u64::MAX);
        assert!(all.valid() && all.table() && all.read() && all.write());
        assert_eq!(u64::from(all.cache()) << PTE_CACHE_SHIFT, PTE_CACHE_MASK);
        assert_eq!(u64::from(all.reserved_low()) << 6, PTE_RESERVED_LOW);
        assert_eq!(all.addr(), PTE_ADDR_MASK);
        assert_eq!(u64::from(all.reserved_high()) << 48, PTE_RESERVED_HIGH);
        for (bit, f) in [
            (PTE_VALID, Pte::valid as fn(&Pte) -> bool),
            (PTE_TABLE, Pte::table),
            (PTE_READ, Pte::read),
            (PTE_WRITE, Pte::write),
        ] {
            assert!(f(&Pte(bit)) && !f(&Pte(!bit)));
        }
        // Every bit belongs to exactly one field.
        assert_eq!(
            PTE_VALID
                | PTE_TABLE
                | PTE_READ
                | PTE_WRITE
                | PTE_CACHE_MASK
                | PTE_RESERVED_LOW
                | PTE_ADDR_MASK
                | PTE_RESERVED_HIGH,
            u64::MAX
        );
    }

    #[test]
    fn entries_round_trip() {
        for level in [2, 3] {
            for cache in [CACHE_UNCACHED, CACHE_WRITE_COMBINED, CACHE_CACHED] {
                let e = leaf_entry(level, 0x8_0000_0000 + 0x20_0000, true, false, cache);
                let p = Pte(e);
                assert!(p.valid() && p.read() && !p.write());
                assert_eq!(
                    (p.table(), u64::from(p.cache()), entry_addr(e)),
                    (level == 3, cache, 0x8_0020_0000)
                );
                assert!(!is_bad(level, e) && is_valid(e) && !is_table(level, e));
            }
        }
        let t = table_entry(0x4000_1FFF);
        assert_eq!((t, entry_addr(t)), (0x4000_1003, 0x4000_1000), "low bits of the address dropped");
        assert!(is_table(0, t) && is_table(2, t) && !is_table(3, t));
        assert_eq!(leaf_entry(3, 0x1000, false, false, 7) >> 4 & 3, 3, "cache keeps its two low bits");
        assert!(is_bad(3, leaf_entry(3, 0x1000, true, false, CACHE_RESERVED)));
        assert!(is_bad(2, leaf_entry(2, 0x20_0000, true, false, CACHE_RESERVED)));
        assert!(is_bad(1, t | (1 << 48)) && is_bad(1, t | (1 << 6)) && !is_bad(1, t & !PTE_VALID));
    }
}
