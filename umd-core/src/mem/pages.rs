//! Runs of 4 KiB pages out of a fixed window (a RAM carve-out, a shared
//! system-memory file, the device's local memory): the GPU VA allocator's
//! TLSF ([`crate::mem::va`]) with one page per granule, over node storage
//! the caller provides.
//!
//! This is what a platform's `dma_alloc` needs underneath: page-granular
//! blocks (rings, IB pools, page tables, the pools' backing blocks, buffers
//! of their own). The bookkeeping is out of band on purpose: an allocator
//! that keeps its free list inside the free memory (`linked_list_allocator`,
//! most `GlobalAlloc` heaps) would write metadata into GPU-visible memory,
//! where a stray GPU write corrupts the allocator, where the CPU may have no
//! mapping at all (device-only memory) and where every metadata store would
//! need cache maintenance on a non-coherent SoC. Here the memory itself is
//! never touched.
//!
//! # Cost
//!
//! [`PageAlloc::alloc`] and [`PageAlloc::free`] cost the same whatever the
//! number of live blocks: a good-fit size-class search (two bitmap
//! lookups), a split or a coalescing of neighbours, and the address index's
//! lookup (O(1) when the storage holds one node per 32 pages of the
//! window, else one AVL tree of a region, O(log n)). No loop over pages or
//! holes. `docs/perf.md` ("Physical pages") has the figures.
//!
//! # Storage
//!
//! The storage is anything that borrows as `[VaNode]` (a `[VaNode; N]` in a
//! firmware's static, a `Vec<VaNode>` on a host): one 40-byte [`VaNode`] per
//! *range* of the window, a live block or a hole between blocks, instead of
//! the one bit per *page* of a bitmap. So `2 * live blocks + 1` nodes always
//! suffice, and the window's page count does (every range is at least one
//! page). The allocator value itself adds ~4.9 KiB (the size-class heads and
//! bitmaps). A request that would need a node when every node records a
//! range is [`PagesError::NodeTableFull`]: the caller chooses the node count
//! for the blocks it expects to keep live (`docs/memory.md`, "Physical
//! pages").
//!
//! # Placement
//!
//! Good fit, low end of the hole (not the lowest address: a hole anywhere
//! in the window is used). A run of fewer than 16 pages gets a hole of
//! the smallest size that holds it; above, the size classes are 1/16 of a
//! power of two wide, so [`PagesError::Exhausted`] is returned when no
//! hole of the next class up exists and the first
//! [`crate::mem::va::EXACT_PROBES`] holes of the request's own class are
//! all too small: there may then be a hole of less than
//! `n rounded up to 1/16 of its power of two` pages that would have held it.
//!
//! Bad input (zero pages, a run that is not an allocated block, a double
//! free, an address outside the window) is a typed error and changes
//! nothing.

use core::fmt;

use super::va::{VaAllocator, VaError, VaNode, VaPlacement, MIN_ALIGN};

/// Page size (bytes).
pub const PAGE: usize = 4096;

/// Bytes of the underlying allocator's arena per page: one granule.
const G: u64 = MIN_ALIGN;

/// Most pages a window can have (the arena's bytes must fit `u64`).
pub const MAX_WINDOW_PAGES: u64 = u64::MAX / G;

/// Why a page operation was refused (nothing changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PagesError {
    /// A run of zero pages was asked for or given back, or a window of
    /// zero pages was described.
    Zero,
    /// No run of free pages is long enough (see the module documentation,
    /// "Placement", for the size-class bound).
    Exhausted {
        /// Pages asked for.
        pages: usize,
        /// Pages free in total (possibly fragmented).
        free: usize,
    },
    /// The run is not an allocated block (its first page and length
    /// exactly), or lies outside the window: a double free, a foreign
    /// address, a part of a block.
    NotAllocated {
        /// First page of the run.
        first: usize,
        /// Pages in the run.
        pages: usize,
    },
    /// Every node of the storage records a block or a hole, and the
    /// request needed one more (to split a hole); or the storage holds no
    /// node at all.
    NodeTableFull {
        /// Nodes the storage holds.
        nodes: usize,
    },
    /// The window has more than [`MAX_WINDOW_PAGES`] pages.
    WindowTooLarge {
        /// Pages of the window.
        pages: usize,
    },
}

impl fmt::Display for PagesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PagesError::Zero => write!(f, "zero pages"),
            PagesError::Exhausted { pages, free } => {
                write!(f, "no run of {pages} free pages ({free} free in total)")
            }
            PagesError::NotAllocated { first, pages } => {
                write!(f, "pages {first}..{} are not an allocated run", first.saturating_add(*pages))
            }
            PagesError::NodeTableFull { nodes } => {
                write!(
                    f,
                    "all {nodes} nodes of the page allocator's storage are in use; raise its owner's node count (DeviceStorage's LOCAL_NODES for local memory, CarveOut's NODES for a bare-metal carve-out)"
                )
            }
            PagesError::WindowTooLarge { pages } => {
                write!(f, "a window of {pages} pages is larger than {MAX_WINDOW_PAGES}")
            }
        }
    }
}

impl core::error::Error for PagesError {}

/// A page allocator over `pages` pages whose bookkeeping lives in the node
/// storage `S`.
pub struct PageAlloc<S> {
    va: VaAllocator<S>,
    pages: usize,
    used: usize,
    nodes: usize,
}

impl<S> fmt::Debug for PageAlloc<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PageAlloc")
            .field("pages", &self.pages)
            .field("used", &self.used)
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

impl<S: AsRef<[VaNode]> + AsMut<[VaNode]>> PageAlloc<S> {
    /// All `pages` pages free; `nodes` is the bookkeeping storage (its
    /// contents are overwritten as needed; [`VaNode::ZEROED`] or
    /// [`VaNode::EMPTY`] to start with). Refused for a window of zero pages,
    /// one above [`MAX_WINDOW_PAGES`], or storage of zero nodes.
    pub fn new(nodes: S, pages: usize) -> Result<Self, PagesError> {
        if pages == 0 {
            return Err(PagesError::Zero);
        }
        let size = u64::try_from(pages)
            .ok()
            .filter(|&p| p <= MAX_WINDOW_PAGES)
            .ok_or(PagesError::WindowTooLarge { pages })?
            .wrapping_mul(G);
        let n = nodes.as_ref().len();
        let va = VaAllocator::new(nodes, 0, size).map_err(|_| PagesError::NodeTableFull { nodes: n })?;
        Ok(Self { va, pages, used: 0, nodes: n })
    }

    /// Pages of the window.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Pages handed out.
    pub fn used_pages(&self) -> usize {
        self.used
    }

    /// Pages free (possibly fragmented).
    pub fn free_pages(&self) -> usize {
        self.pages.wrapping_sub(self.used)
    }

    /// Nodes of the storage.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Nodes recording a block or a hole now, and the most ever (to size
    /// the storage from a real workload).
    pub fn nodes_used(&self) -> (usize, usize) {
        let s = self.va.stats();
        (s.nodes_used as usize, s.nodes_high_water as usize)
    }

    /// Takes a run of `n` pages (good fit: module documentation,
    /// "Placement"); returns its first page.
    pub fn alloc(&mut self, n: usize) -> Result<usize, PagesError> {
        if n == 0 {
            return Err(PagesError::Zero);
        }
        let free = self.free_pages();
        let exhausted = PagesError::Exhausted { pages: n, free };
        if n > free {
            return Err(exhausted);
        }
        // `n <= pages <= MAX_WINDOW_PAGES`: the product fits.
        let bytes = (n as u64).wrapping_mul(G);
        match self.va.alloc(bytes, G, VaPlacement::BottomUp) {
            Ok(addr) => {
                self.used = self.used.wrapping_add(n);
                Ok((addr / G) as usize)
            }
            Err(VaError::NodeCapacity) => Err(PagesError::NodeTableFull { nodes: self.nodes }),
            Err(_) => Err(exhausted),
        }
    }

    /// Gives back the block of `n` pages from `first` (as
    /// [`PageAlloc::alloc`] returned it: the same first page and length).
    /// Refused, changing nothing, for anything else.
    pub fn free(&mut self, first: usize, n: usize) -> Result<(), PagesError> {
        if n == 0 {
            return Err(PagesError::Zero);
        }
        let not = PagesError::NotAllocated { first, pages: n };
        if first >= self.pages || n > self.pages {
            return Err(not);
        }
        // Both inside the window: the products fit.
        let addr = (first as u64).wrapping_mul(G);
        let block = self.va.lookup(addr).ok_or(not)?;
        if block.size != (n as u64).wrapping_mul(G) {
            return Err(not);
        }
        self.va.free(addr).map_err(|_| not)?;
        self.used = self.used.wrapping_sub(n);
        Ok(())
    }

    /// Calls `f(first, pages)` for every block handed out, in page order.
    /// O(blocks + holes); meant for dumps and tests.
    pub fn for_each_block(&self, mut f: impl FnMut(usize, usize)) {
        self.va.for_each_allocation(|r| f((r.addr / G) as usize, (r.size / G) as usize));
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;
    use std::vec::Vec;

    fn heap(pages: usize, nodes: usize) -> PageAlloc<Vec<VaNode>> {
        PageAlloc::new(vec![VaNode::EMPTY; nodes], pages).unwrap()
    }

    fn blocks<S: AsRef<[VaNode]> + AsMut<[VaNode]>>(h: &PageAlloc<S>) -> Vec<(usize, usize)> {
        let mut v = Vec::new();
        h.for_each_block(|f, n| v.push((f, n)));
        v
    }

    #[test]
    fn good_fit_reuse_and_exhaustion() {
        let mut h = PageAlloc::new([VaNode::ZEROED; 8], 130).unwrap();
        assert_eq!((h.alloc(64), h.alloc(64)), (Ok(0), Ok(64)));
        assert_eq!(h.alloc(3), Err(PagesError::Exhausted { pages: 3, free: 2 }));
        assert_eq!(h.alloc(2), Ok(128));
        assert_eq!(h.free(0, 64), Ok(()));
        assert_eq!(h.alloc(10), Ok(0));
        assert_eq!(h.alloc(54), Ok(10));
        assert_eq!(h.alloc(1), Err(PagesError::Exhausted { pages: 1, free: 0 }));
        assert_eq!(h.free(64, 64), Ok(()));
        assert_eq!(h.used_pages(), 66);
        assert_eq!(h.alloc(64), Ok(64));
        assert_eq!(h.alloc(0), Err(PagesError::Zero));
        assert_eq!(h.alloc(1000), Err(PagesError::Exhausted { pages: 1000, free: 0 }));
        assert_eq!(blocks(&h), [(0, 10), (10, 54), (64, 64), (128, 2)]);
    }

    #[test]
    fn a_hole_too_small_is_skipped_then_reused() {
        let mut h = heap(16, 16);
        assert_eq!((h.alloc(1), h.alloc(3)), (Ok(0), Ok(1)));
        assert_eq!(h.free(0, 1), Ok(()));
        assert_eq!(h.alloc(2), Ok(4), "the 1-page hole is too small");
        assert_eq!(h.alloc(1), Ok(0), "the hole is reused");
    }

    #[test]
    fn long_runs_coalesce() {
        let mut h = heap(256, 4);
        assert_eq!(h.alloc(60), Ok(0));
        assert_eq!(h.alloc(130), Ok(60));
        assert_eq!(h.alloc(66), Ok(190));
        assert_eq!(h.free_pages(), 0);
        assert_eq!(h.free(60, 130), Ok(()));
        assert_eq!(h.alloc(131), Err(PagesError::Exhausted { pages: 131, free: 130 }));
        assert_eq!(h.alloc(130), Ok(60));
        for (f, n) in [(0, 60), (60, 130), (190, 66)] {
            assert_eq!(h.free(f, n), Ok(()));
        }
        assert_eq!(h.alloc(256), Ok(0), "the three freed runs are one hole again");
    }

    #[test]
    fn bad_input_changes_nothing() {
        let mut h = heap(64, 8);
        let a = h.alloc(4).unwrap();
        let b = h.alloc(2).unwrap();
        assert_eq!(b, a + 4);
        let before = (h.used_pages(), blocks(&h));
        let bad = [
            ((a, 0), PagesError::Zero),
            ((a, 5), PagesError::NotAllocated { first: a, pages: 5 }),
            ((a, 2), PagesError::NotAllocated { first: a, pages: 2 }),
            ((a + 1, 3), PagesError::NotAllocated { first: a + 1, pages: 3 }),
            ((a, 6), PagesError::NotAllocated { first: a, pages: 6 }),
            ((10, 1), PagesError::NotAllocated { first: 10, pages: 1 }),
            ((60, 8), PagesError::NotAllocated { first: 60, pages: 8 }),
            ((64, 1), PagesError::NotAllocated { first: 64, pages: 1 }),
            ((usize::MAX, 2), PagesError::NotAllocated { first: usize::MAX, pages: 2 }),
            ((a, usize::MAX), PagesError::NotAllocated { first: a, pages: usize::MAX }),
        ];
        for ((first, n), e) in bad {
            assert_eq!(h.free(first, n), Err(e), "free({first}, {n})");
            assert_eq!((h.used_pages(), blocks(&h)), before);
        }
        assert_eq!(h.free(a, 4), Ok(()));
        assert_eq!(h.free(a, 4), Err(PagesError::NotAllocated { first: a, pages: 4 }), "double free");
        assert_eq!(h.used_pages(), 2);
        assert_eq!(PageAlloc::new([VaNode::EMPTY; 1], 0).unwrap_err(), PagesError::Zero);
        assert_eq!(
            PageAlloc::new([VaNode::EMPTY; 0], 4).unwrap_err(),
            PagesError::NodeTableFull { nodes: 0 }
        );
        if usize::BITS >= 64 {
            let pages = usize::MAX;
            assert_eq!(
                PageAlloc::new([VaNode::EMPTY; 1], pages).unwrap_err(),
                PagesError::WindowTooLarge { pages }
            );
        }
    }

    #[test]
    fn a_full_node_table_is_an_error_and_changes_nothing() {
        let mut h = heap(100, 3);
        assert_eq!((h.alloc(1), h.alloc(1)), (Ok(0), Ok(1)));
        assert_eq!(h.nodes_used().0, 3, "two blocks and the hole after them");
        let before = (h.used_pages(), blocks(&h));
        assert_eq!(h.alloc(1), Err(PagesError::NodeTableFull { nodes: 3 }), "a split needs a fourth node");
        assert_eq!((h.used_pages(), blocks(&h)), before);
        assert_eq!(h.alloc(98), Ok(2), "an exact fit needs no node");
        assert_eq!(h.free(1, 1), Ok(()));
        assert_eq!(h.alloc(1), Ok(1));
        assert_eq!(h.free_pages(), 0);
    }

    /// The shadow model: who owns each page.
    struct Shadow {
        owner: Vec<Option<usize>>,
    }

    impl Shadow {
        fn free(&self) -> usize {
            self.owner.iter().filter(|o| o.is_none()).count()
        }

        /// Blocks in page order.
        fn blocks(&self) -> Vec<(usize, usize)> {
            let mut v: Vec<(usize, usize)> = Vec::new();
            for (p, o) in self.owner.iter().enumerate() {
                match (o, v.last_mut()) {
                    (Some(id), Some(last)) if p > 0 && self.owner[p - 1] == Some(*id) => last.1 += 1,
                    (Some(_), _) => v.push((p, 1)),
                    (None, _) => {}
                }
            }
            v
        }

        /// Maximal free runs.
        fn holes(&self) -> Vec<usize> {
            let mut v = Vec::new();
            let mut run = 0;
            for o in &self.owner {
                if o.is_none() {
                    run += 1;
                } else if run > 0 {
                    v.push(run);
                    run = 0;
                }
            }
            if run > 0 {
                v.push(run);
            }
            v
        }
    }

    /// `n` rounded up to its size class's width (1/16 of its power of two
    /// from 16 pages on): the module documentation's bound on
    /// `Exhausted`.
    fn class_round(n: usize) -> usize {
        let log = usize::BITS - 1 - n.leading_zeros();
        if log < 4 {
            return n;
        }
        n.next_multiple_of(1 << (log - 4))
    }

    /// A random schedule of allocations, frees and bad frees against the
    /// shadow page map: no overlap, every block inside the window, exact
    /// used and free counts, the same blocks, and every error justified by
    /// the shadow's state (no long enough hole, every node used, not a
    /// block).
    fn churn(pages: usize, nodes: usize, max_run: usize, seed: u64) -> (usize, usize, usize) {
        let mut h = heap(pages, nodes);
        let mut s = Shadow { owner: vec![None; pages] };
        let mut live: Vec<(usize, usize)> = Vec::new();
        let mut x = seed;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x >> 8
        };
        let (mut exhausted, mut full, mut refused) = (0, 0, 0);
        for id in 0..20_000 {
            let r = next();
            if r % 16 < 9 || live.is_empty() {
                let n = if r % 4 == 0 { next() as usize % max_run + 1 } else { next() as usize % 4 + 1 };
                match h.alloc(n) {
                    Ok(f) => {
                        assert!(f + n <= pages, "block {f}+{n} outside the window");
                        for p in f..f + n {
                            assert_eq!(s.owner[p], None, "page {p} handed out twice");
                            s.owner[p] = Some(id);
                        }
                        live.push((f, n));
                    }
                    Err(PagesError::Exhausted { pages: asked, free }) => {
                        exhausted += 1;
                        assert_eq!((asked, free), (n, s.free()));
                        let largest = s.holes().into_iter().max().unwrap_or(0);
                        assert!(largest < class_round(n), "a hole of {largest} holds {n} pages");
                    }
                    Err(PagesError::NodeTableFull { nodes: k }) => {
                        full += 1;
                        assert_eq!(k, nodes);
                        assert_eq!(s.blocks().len() + s.holes().len(), nodes, "every node records a range");
                    }
                    Err(e) => panic!("alloc({n}): {e:?}"),
                }
            } else if r % 16 < 15 {
                let (f, n) = live.swap_remove(next() as usize % live.len());
                assert_eq!(h.free(f, n), Ok(()));
                s.owner[f..f + n].fill(None);
            } else {
                // A bad free: a part of a block, a block and a page more, a
                // free page or a page outside the window.
                let f = next() as usize % (pages + 8);
                let n = next() as usize % 6 + 1;
                let is_block = live.contains(&(f, n));
                let before = blocks(&h);
                let got = h.free(f, n);
                if is_block {
                    assert_eq!(got, Ok(()));
                    live.retain(|&b| b != (f, n));
                    s.owner[f..f + n].fill(None);
                } else {
                    refused += 1;
                    assert_eq!(got, Err(PagesError::NotAllocated { first: f, pages: n }));
                    assert_eq!(blocks(&h), before, "a refused free changed the blocks");
                }
            }
            assert_eq!(h.used_pages(), pages - s.free());
            assert_eq!(h.free_pages(), s.free());
            assert_eq!(blocks(&h), s.blocks());
            assert!(h.nodes_used().0 <= nodes);
        }
        (exhausted, full, refused)
    }

    #[test]
    fn random_schedule_matches_the_shadow_page_map() {
        // Nodes for every page: never full; runs up to 70 pages.
        let (exhausted, full, refused) = churn(250, 250, 70, 12345);
        assert!(exhausted > 100 && full == 0 && refused > 100, "{exhausted} {full} {refused}");
        // Few nodes: the node table fills before the pages do.
        let (_, full, refused) = churn(400, 24, 40, 777);
        assert!(full > 100 && refused > 100, "{full} {refused}");
    }
}
