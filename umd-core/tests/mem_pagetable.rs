//! Page-table builder tests. The walker below is written from
//! docs/refgpu.md section 3.2 independently of the crate, and reads the
//! tables through the fake's memory exactly as the device would.

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;
use umd_core::mem::pagetable::{
    ArrayPageSource, CachePolicy, PageSource, PageTable, Perms, PtError, TlbInvalidate,
};

/// Fake physical memory: table pages live at 0x8000_0000 + 4 KiB * i.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Fake {
    pages: HashMap<u64, Box<[u64; 512]>>,
    next: u64,
    free: Vec<u64>,
    limit: usize,
}

impl Fake {
    fn new(limit: usize) -> Self {
        Fake { pages: HashMap::new(), next: 0x8000_0000, free: Vec::new(), limit }
    }
    fn read_phys(&self, pa: u64) -> Option<u64> {
        let page = self.pages.get(&(pa & !0xFFF))?;
        Some(page[((pa & 0xFFF) / 8) as usize])
    }
}

impl PageSource for Fake {
    fn alloc_table(&mut self) -> Option<u64> {
        if self.pages.len() >= self.limit {
            return None;
        }
        let pa = self.free.pop().unwrap_or_else(|| {
            self.next += 4096;
            self.next
        });
        assert!(self.pages.insert(pa, Box::new([0; 512])).is_none());
        Some(pa)
    }
    fn free_table(&mut self, phys: u64) {
        let page = self.pages.remove(&phys).expect("free of a page that is not a table");
        assert!(page.iter().all(|&e| e == 0), "freed table is not empty");
        self.free.push(phys);
    }
    fn read_entry(&self, phys: u64, index: usize) -> u64 {
        assert!(index < 512);
        self.pages.get(&phys).expect("read of a non-table page")[index]
    }
    fn write_entry(&mut self, phys: u64, index: usize, value: u64) {
        assert!(index < 512);
        self.pages.get_mut(&phys).expect("write to a non-table page")[index] = value;
    }
}

#[derive(Default)]
struct CountTlb(Vec<(u64, u64)>);
impl TlbInvalidate for CountTlb {
    fn invalidate(&mut self, va: u64, size: u64) {
        self.0.push((va, size));
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Walk {
    Ok { pa: u64, read: bool, write: bool, cache: u64 },
    Translation,
    BadPte,
    Bus,
}

/// The device's walk, from the spec: 4 levels, VA[47:39], [38:30], [29:21],
/// [20:12]; VALID bit 0; TABLE bit 1; READ 2; WRITE 3; CACHE 5:4 (3 is
/// reserved); bits 11:6 and 63:48 reserved; ADDR 47:12.
fn device_walk(mem: &Fake, root: u64, va: u64) -> Walk {
    if va >> 48 != 0 {
        return Walk::Translation;
    }
    let mut table = root;
    for level in 0..4u32 {
        let shift = 39 - 9 * level;
        let idx = (va >> shift) & 0x1FF;
        let Some(e) = mem.read_phys(table + 8 * idx) else {
            return Walk::Bus;
        };
        if e & 1 == 0 {
            return Walk::Translation;
        }
        if e & 0xFC0 != 0 || e >> 48 != 0 {
            return Walk::BadPte;
        }
        let table_bit = e & 2 != 0;
        let addr = e & 0x0000_FFFF_FFFF_F000;
        let leaf = match level {
            0 | 1 => {
                if !table_bit {
                    return Walk::BadPte;
                }
                false
            }
            2 => !table_bit,
            _ => {
                if !table_bit {
                    return Walk::BadPte;
                }
                true
            }
        };
        if !leaf {
            table = addr;
            continue;
        }
        let cache = (e >> 4) & 3;
        if cache == 3 {
            return Walk::BadPte;
        }
        let (mask, ok) = if level == 2 { (0x1F_FFFF, addr & 0x1F_F000 == 0) } else { (0xFFF, true) };
        if !ok {
            return Walk::BadPte;
        }
        return Walk::Ok { pa: addr | (va & mask), read: e & 4 != 0, write: e & 8 != 0, cache };
    }
    unreachable!()
}

const RW_WC: Perms = Perms { read: true, write: true, cache: CachePolicy::WriteCombined };

#[test]
fn spec_example_walk() {
    let mut mem = Fake::new(64);
    let mut pt = PageTable::new(&mut mem).unwrap();
    let mut tlb = CountTlb::default();
    pt.map(&mut mem, &mut tlb, 0x12_3456_7000, 0x4010_3000, 4096, Perms::RW).unwrap();
    assert_eq!(
        device_walk(&mem, pt.root(), 0x12_3456_7800),
        Walk::Ok { pa: 0x4010_3800, read: true, write: true, cache: 0 }
    );
    // The L3 entry is exactly the spec's example value.
    let mut t = pt.root();
    for level in 0..3 {
        let e = mem.read_entry(t, umd_core::hw::mmu::va_index(level, 0x12_3456_7800));
        t = e & 0x0000_FFFF_FFFF_F000;
    }
    assert_eq!(mem.read_entry(t, 0x167), 0x0000_0000_4010_300F);
    // A 2 MiB block elsewhere: VA 0x20_0000_0000 aligned, PA 0x4020_0000.
    pt.map(&mut mem, &mut tlb, 0x20_0000_0000, 0x4020_0000, 2 << 20, Perms::RW).unwrap();
    assert_eq!(pt.stats().blocks_2m, 1);
    assert_eq!(
        device_walk(&mem, pt.root(), 0x20_0016_7800),
        Walk::Ok { pa: 0x4036_7800, read: true, write: true, cache: 0 }
    );
    assert!(tlb.0.is_empty(), "mapping invalid entries needs no invalidation");
}

#[test]
fn picks_2m_where_aligned_and_frees_tables() {
    let mut mem = Fake::new(64);
    let mut pt = PageTable::new(&mut mem).unwrap();
    let mut tlb = CountTlb::default();
    let va = 0x4000_0000 - 8192; // two pages below a 2 MiB boundary
    let pa = 0x1_0000_0000 - 8192;
    let size = 8192 + 4 * (2 << 20) + 12288;
    pt.map(&mut mem, &mut tlb, va, pa, size, RW_WC).unwrap();
    let s = pt.stats();
    assert_eq!(s.blocks_2m, 4);
    assert_eq!(s.pages_4k, 5);
    assert_eq!(s.mapped_bytes(), size);
    for off in (0..size).step_by(4096 * WALK_STRIDE) {
        assert_eq!(
            device_walk(&mem, pt.root(), va + off + 8),
            Walk::Ok { pa: pa + off + 8, read: true, write: true, cache: 1 }
        );
    }
    assert_eq!(device_walk(&mem, pt.root(), va - 4096), Walk::Translation);
    assert_eq!(device_walk(&mem, pt.root(), va + size), Walk::Translation);
    // Misaligned PA: the same VA range must use only 4 KiB pages.
    let va2 = 0x80_0000_0000u64;
    pt.map(&mut mem, &mut tlb, va2, 0x4000_1000, 2 << 20, Perms::RO).unwrap();
    assert_eq!(pt.stats().blocks_2m, 4);
    assert_eq!(pt.stats().pages_4k, 5 + 512);
    assert_eq!(
        device_walk(&mem, pt.root(), va2 + 0x1234),
        Walk::Ok { pa: 0x4000_2234, read: true, write: false, cache: 0 }
    );
    pt.unmap(&mut mem, &mut tlb, va2, 2 << 20).unwrap();
    pt.unmap(&mut mem, &mut tlb, va, size).unwrap();
    assert_eq!(tlb.0, vec![(va2, 2 << 20), (va, size)]);
    assert_eq!(pt.stats().tables, 1);
    assert_eq!(mem.pages.len(), 1, "only the root is left");
    assert_eq!(pt.stats().mapped_bytes(), 0);
    pt.destroy(&mut mem, &mut tlb);
    assert!(mem.pages.is_empty());
}

fn expect_unchanged(
    mem: &mut Fake,
    pt: &mut PageTable,
    f: impl FnOnce(&mut Fake, &mut PageTable) -> Result<(), PtError>,
    want: PtError,
) {
    let before_mem = mem.clone();
    let before = pt.stats();
    assert_eq!(f(mem, pt), Err(want));
    assert_eq!(pt.stats(), before);
    assert_eq!(mem.pages, before_mem.pages, "table memory changed");
}

#[test]
fn bad_input_leaves_tables_unchanged() {
    let mut mem = Fake::new(8);
    let mut pt = PageTable::new(&mut mem).unwrap();
    let mut tlb = CountTlb::default();
    pt.map(&mut mem, &mut tlb, 0x20_0000, 0x20_0000, 2 << 20, Perms::RW).unwrap(); // block
    pt.map(&mut mem, &mut tlb, 0x60_0000, 0x1000, 8192, Perms::RW).unwrap(); // pages
    let mut t = CountTlb::default();
    expect_unchanged(&mut mem, &mut pt, |m, p| p.map(m, &mut t, 0x1000, 0, 0, Perms::RW), PtError::ZeroSize);
    expect_unchanged(
        &mut mem,
        &mut pt,
        |m, p| p.map(m, &mut t, 0x1001, 0, 4096, Perms::RW),
        PtError::Misaligned,
    );
    expect_unchanged(
        &mut mem,
        &mut pt,
        |m, p| p.map(m, &mut t, 0x1000, 0x10, 4096, Perms::RW),
        PtError::Misaligned,
    );
    expect_unchanged(
        &mut mem,
        &mut pt,
        |m, p| p.map(m, &mut t, 0x1000, 0, 100, Perms::RW),
        PtError::Misaligned,
    );
    expect_unchanged(
        &mut mem,
        &mut pt,
        |m, p| p.map(m, &mut t, u64::MAX - 4095, 0, 4096, Perms::RW),
        PtError::OutOfRange,
    );
    expect_unchanged(
        &mut mem,
        &mut pt,
        |m, p| p.map(m, &mut t, (1 << 48) - 4096, 0, 8192, Perms::RW),
        PtError::OutOfRange,
    );
    expect_unchanged(
        &mut mem,
        &mut pt,
        |m, p| p.map(m, &mut t, 0x1000, u64::MAX - 4095, 4096, Perms::RW),
        PtError::OutOfRange,
    );
    expect_unchanged(
        &mut mem,
        &mut pt,
        |m, p| p.map(m, &mut t, 0x1000, 1 << 48, 4096, Perms::RW),
        PtError::OutOfRange,
    );
    // Overlaps: the block, then the pages, from a range starting in free space.
    expect_unchanged(
        &mut mem,
        &mut pt,
        |m, p| p.map(m, &mut t, 0x10_0000, 0, 0x20_0000, Perms::RW),
        PtError::AlreadyMapped,
    );
    expect_unchanged(
        &mut mem,
        &mut pt,
        |m, p| p.map(m, &mut t, 0x5F_F000, 0, 0x2000, Perms::RW),
        PtError::AlreadyMapped,
    );
    // Unmaps of ranges never (fully) mapped, or cutting the block.
    expect_unchanged(&mut mem, &mut pt, |m, p| p.unmap(m, &mut t, 0x1_0000_0000, 4096), PtError::NotMapped);
    expect_unchanged(&mut mem, &mut pt, |m, p| p.unmap(m, &mut t, 0x60_0000, 3 * 4096), PtError::NotMapped);
    expect_unchanged(&mut mem, &mut pt, |m, p| p.unmap(m, &mut t, 0x5F_F000, 2 * 4096), PtError::NotMapped);
    expect_unchanged(&mut mem, &mut pt, |m, p| p.unmap(m, &mut t, 0x20_0000, 4096), PtError::SplitsBlock);
    expect_unchanged(&mut mem, &mut pt, |m, p| p.unmap(m, &mut t, 0x20_0000, 0), PtError::ZeroSize);
    assert!(t.0.is_empty(), "no invalidation for refused operations");
    // Out of table pages half-way: 4 used (root, L1, L2, L3); 8 allowed.
    // A map far away needs L1+L2+L3 per 1 GiB region: two regions need 6.
    expect_unchanged(
        &mut mem,
        &mut pt,
        |m, p| p.map(m, &mut t, 0x80_3FFF_F000, 0, 0x2000, Perms::RW),
        PtError::OutOfTables,
    );
    assert_eq!(mem.pages.len(), 4);
    // Still usable afterwards.
    pt.unmap(&mut mem, &mut tlb, 0x60_0000, 8192).unwrap();
    pt.unmap(&mut mem, &mut tlb, 0x20_0000, 2 << 20).unwrap();
    assert_eq!(mem.pages.len(), 1);
}

#[derive(Clone, Debug)]
enum Op {
    Map { page: u64, pages: u64, pa_page: u64, write: bool },
    Unmap { pick: usize },
}

fn op() -> impl Strategy<Value = Op> {
    // A 2 GiB window: crosses L1 entries; sizes up to ~5 MiB so blocks happen.
    prop_oneof![
        3 => (0u64..(1 << 19), 1u64..MAX_PAGES, 0u64..(1 << 20), any::<bool>()).prop_map(|(page, pages, pa_page, write)| Op::Map {
            // Bias half of the mappings onto 2 MiB boundaries.
            page: if page % 2 == 0 { page & !511 } else { page },
            pages,
            pa_page: if page % 2 == 0 { pa_page & !511 } else { pa_page },
            write,
        }),
        2 => any::<usize>().prop_map(|pick| Op::Unmap { pick }),
    ]
}

const CASES: u32 = if cfg!(miri) { 2 } else { 64 };
/// Under Miri, mappings stay small (every page is walked after every step).
const MAX_PAGES: u64 = if cfg!(miri) { 24 } else { 1300 };
/// Walk every page natively; every 61st under Miri.
const WALK_STRIDE: usize = if cfg!(miri) { 61 } else { 1 };
const STEPS: usize = if cfg!(miri) { 6 } else { 40 };

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_map_unmap(ops in proptest::collection::vec(op(), 1..STEPS), limit in 3usize..40) {
        let mut mem = Fake::new(limit);
        let mut pt = PageTable::new(&mut mem).unwrap();
        let mut tlb = CountTlb::default();
        // Shadow: start page -> (pages, pa_page, write).
        let mut live: BTreeMap<u64, (u64, u64, bool)> = BTreeMap::new();
        let base = 0x7F_0000_0000u64 >> 12;
        for op in ops {
            match op {
                Op::Map { page, pages, pa_page, write } => {
                    let vp = base + page;
                    let overlaps = live.iter().any(|(&s, &(n, _, _))| vp < s + n && s < vp + pages);
                    let before = mem.clone();
                    let perms = Perms { read: true, write, cache: CachePolicy::Cached };
                    match pt.map(&mut mem, &mut tlb, vp << 12, pa_page << 12, pages << 12, perms) {
                        Ok(()) => {
                            prop_assert!(!overlaps);
                            live.insert(vp, (pages, pa_page, write));
                        }
                        Err(PtError::AlreadyMapped) => {
                            prop_assert!(overlaps);
                            prop_assert_eq!(&mem.pages, &before.pages);
                        }
                        Err(PtError::OutOfTables) => {
                            prop_assert!(!overlaps);
                            prop_assert_eq!(&mem.pages, &before.pages);
                        }
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    }
                }
                Op::Unmap { pick } => {
                    if live.is_empty() {
                        prop_assert_eq!(pt.unmap(&mut mem, &mut tlb, base << 12, 4096), Err(PtError::NotMapped));
                        continue;
                    }
                    let (&s, &(n, pa, _)) = live.iter().nth(pick % live.len()).unwrap();
                    // Blocks are only cut if the mapping was aligned both ways.
                    match pt.unmap(&mut mem, &mut tlb, s << 12, n << 12) {
                        Ok(()) => { live.remove(&s); }
                        Err(e) => prop_assert!(false, "unmap of a whole mapping failed: {e} ({s:#x},{n},{pa:#x})"),
                    }
                }
            }
            // Every mapped page resolves; pages around each mapping fault.
            let mut count = 0u64;
            for (&s, &(n, pa, write)) in &live {
                for i in 0..n {
                    let va = ((s + i) << 12) + 0x18;
                    prop_assert_eq!(device_walk(&mem, pt.root(), va), Walk::Ok { pa: ((pa + i) << 12) + 0x18, read: true, write, cache: 2 });
                }
                for probe in [s - 1, s + n] {
                    if !live.iter().any(|(&s2, &(n2, _, _))| probe >= s2 && probe < s2 + n2) {
                        prop_assert_eq!(device_walk(&mem, pt.root(), probe << 12), Walk::Translation);
                    }
                }
                count += n;
            }
            prop_assert_eq!(pt.stats().mapped_bytes(), count << 12);
            prop_assert_eq!(pt.stats().tables as usize, mem.pages.len());
        }
        let all: Vec<_> = live.iter().map(|(&s, &(n, _, _))| (s, n)).collect();
        for (s, n) in all {
            pt.unmap(&mut mem, &mut tlb, s << 12, n << 12).unwrap();
        }
        prop_assert_eq!(mem.pages.len(), 1);
        prop_assert_eq!(pt.stats().tables, 1);
    }
}

#[test]
fn array_page_source_reuses_pages() {
    let mut pages = vec![[0u64; 512]; 6];
    let mut src = ArrayPageSource::new(&mut pages, 0x9000_0000);
    let mut tlb = CountTlb::default();
    let mut pt = PageTable::new(&mut src).unwrap();
    for round in 0..3u64 {
        pt.map(&mut src, &mut tlb, 0x1000 * (round + 1), 0x5000, 0x3000, Perms::RW).unwrap();
        assert_eq!(src.in_use(), 4);
        assert_eq!(pt.translate(&src, 0x1000 * (round + 1) + 0x10).unwrap().phys, 0x5010);
        assert_eq!(
            pt.map(&mut src, &mut tlb, 0x100_0000_0000, 0, 0x1000, Perms::RW),
            Err(PtError::OutOfTables)
        );
        assert_eq!(src.in_use(), 4);
        pt.unmap(&mut src, &mut tlb, 0x1000 * (round + 1), 0x3000).unwrap();
        assert_eq!(src.in_use(), 1);
    }
    let root = pt.root();
    pt.destroy(&mut src, &mut tlb);
    assert_eq!(src.in_use(), 0);
    assert!((0x9000_0000..0x9000_6000).contains(&root));
}
