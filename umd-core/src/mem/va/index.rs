//! The allocation index: allocations by start address, for `free`,
//! `lookup`, `retire` and `alloc_fixed`. The arena is cut into regions;
//! region `r`'s directory slot (in node `r`) holds the root of its tree
//! (`avl`) or, with the list index, its first allocation (module
//! documentation, "Data structure").

use super::avl::MAX_HEIGHT;
use super::{State, VaAllocator, VaNode, NIL};

/// Regions per group: the directory bitmap has one bit per group, and each
/// group keeps a count of its non-empty regions. 64 (rather than 16) lets a
/// large node array cut the arena into 4x more, smaller regions, so region
/// trees stay a few nodes deep under many small allocations (docs/perf.md,
/// talc's suite); `prev_region` scans at most 2 x 64 slots.
pub(super) const GROUP: u32 = 64;

/// Regions of at most `1 << LIST_GRANULES_LOG2` granules (4 KiB) index
/// their allocations with a list instead of a tree (see the module
/// documentation, "Data structure"): a lookup walks at most that many
/// ranges, plus `LIST_WALK`'s margin.
pub(super) const LIST_GRANULES_LOG2: u32 = 5;

/// Most ranges a lookup walks in a list-indexed region: one per granule of
/// the region (every range starting in it is at least a granule), the
/// range after them where a walk stops, and one to spare.
const LIST_WALK: usize = (1 << LIST_GRANULES_LOG2) + 2;

/// With the `size-first` feature every allocator uses the list index,
/// whatever its regions' size, and no region tree code is linked: the
/// same allocations, frees and addresses, but a lookup walks the ranges
/// of its region, which with regions above 2^[`LIST_GRANULES_LOG2`]
/// granules (fewer nodes than one per 4 KiB of arena) is O(n) in the
/// allocator's ranges instead of O(log n) (`docs/memory.md`, "Cost of
/// each operation").
pub(super) const LIST_ONLY: bool = cfg!(feature = "size-first");

/// Words of the group bitmap (one bit per group).
pub(super) const GROUP_WORDS: usize = 64;

impl<S: AsRef<[VaNode]> + AsMut<[VaNode]>, const RECYCLE: bool> VaAllocator<S, RECYCLE> {
    /// Whether the address list is the index (no region trees): a
    /// constant with [`LIST_ONLY`], so the trees' code is not linked.
    #[inline(always)]
    pub(super) fn list_index(&self) -> bool {
        LIST_ONLY || self.list_index
    }

    /// Most ranges a walk of one list-indexed region visits: with
    /// [`LIST_ONLY`] a region may hold every range of the allocator.
    #[inline(always)]
    fn list_walk(&self) -> usize {
        if LIST_ONLY {
            (self.capacity as usize).saturating_add(2)
        } else {
            LIST_WALK
        }
    }

    /// Enters allocation `n` (`size` bytes at `addr`) into the index and
    /// the counters.
    #[inline(always)]
    pub(super) fn index_alloc(&mut self, n: u32, addr: u64, size: u64) {
        if let Some(r) = self.region_of(addr) {
            if self.list_index() {
                let first = self.root(r);
                if first == NIL || addr < self.start(first) {
                    self.set_root(r, n);
                }
            } else {
                self.tree_insert_region(r, n);
            }
        }
        self.count_alloc(size);
    }

    /// The range (hole or allocation) that contains `addr`, which must be
    /// inside the arena. Exact with the recycled ranges flushed (holes
    /// coalesced, and no region of the list index holding only recycled
    /// ranges); without, still a range of the address list or `NIL`.
    pub(super) fn containing(&self, addr: u64) -> u32 {
        let Some(r) = self.region_of(addr) else {
            return NIL;
        };
        let a = if self.list_index() {
            self.list_pred_or_eq(r, addr).or_else(|| {
                let p = self.prev_region(r)?;
                self.list_pred_or_eq(p, u64::MAX)
            })
        } else {
            self.tree_pred_or_eq(self.root(r), addr).or_else(|| {
                let p = self.prev_region(r)?;
                self.tree_max(self.root(p))
            })
        };
        match a {
            // Holes are coalesced, so whatever follows the last allocation
            // at or before `addr` is a hole reaching past `addr`.
            Some(a) if self.start(a).wrapping_add(self.len(a)) <= addr => self.next(a),
            Some(a) => a,
            None => self.head,
        }
    }

    /// List index: takes range `x` of region `r` (an allocation or a
    /// recycled range) out of the index (the directory slot moves on if `x`
    /// was the region's first). O(1).
    #[inline(always)]
    pub(super) fn list_unindex(&mut self, r: u32, x: u32) {
        if self.root(r) == x {
            // The region's next indexed range, if any: holes are coalesced
            // and recycled ranges are indexed too, so it is at most two
            // ranges on.
            let mut y = self.next(x);
            if self.state(y) == State::Hole {
                y = self.next(y);
            }
            let first = if y != NIL && self.region_of(self.start(y)) == Some(r) { y } else { NIL };
            self.set_root(r, first);
        }
    }

    /// Region of an address inside the arena.
    #[inline]
    pub(super) fn region_of(&self, addr: u64) -> Option<u32> {
        let off = addr.checked_sub(self.base)?;
        if off >= self.size {
            return None;
        }
        Some(off.checked_shr(self.region_shift).unwrap_or(0) as u32)
    }

    #[inline]
    pub(super) fn root(&self, r: u32) -> u32 {
        self.node(r).map_or(NIL, |x| x.root)
    }

    #[inline]
    pub(super) fn set_root(&mut self, r: u32, root: u32) {
        let Some(x) = self.node_mut(r) else { return };
        let was = x.root;
        x.root = root;
        if (was == NIL) == (root == NIL) {
            return;
        }
        let g = r / GROUP;
        let Some(gx) = self.node_mut(g) else { return };
        let (before, after) = if root == NIL {
            (gx.group, gx.group.wrapping_sub(1))
        } else {
            (gx.group, gx.group.wrapping_add(1))
        };
        gx.group = after;
        if (before == 0) == (after == 0) {
            return;
        }
        let w = (g / 64) as usize;
        let bit = 1u64.wrapping_shl(g % 64);
        if let Some(word) = self.group_bits.get_mut(w) {
            if after == 0 {
                *word &= !bit;
            } else {
                *word |= bit;
            }
            let top = 1u64.wrapping_shl(w as u32);
            if *word == 0 {
                self.group_top &= !top;
            } else {
                self.group_top |= top;
            }
        }
    }

    /// Greatest non-empty region below `r`: at most [`GROUP`] directory
    /// slots of `r`'s group, a bitmap search, and [`GROUP`] slots of the
    /// group found.
    pub(super) fn prev_region(&self, r: u32) -> Option<u32> {
        let g = r / GROUP;
        let first = g.wrapping_mul(GROUP);
        if let Some(q) = (first..r).rev().find(|&q| self.root(q) != NIL) {
            return Some(q);
        }
        let w = g / 64;
        let below = 1u64.wrapping_shl(g % 64).wrapping_sub(1);
        let bits = self.group_bits.get(w as usize).copied().unwrap_or(0) & below;
        let pg = if bits != 0 {
            w.wrapping_mul(64) | 63u32.wrapping_sub(bits.leading_zeros())
        } else {
            let words = self.group_top & 1u64.wrapping_shl(w).wrapping_sub(1);
            if words == 0 {
                return None;
            }
            let w = 63u32.wrapping_sub(words.leading_zeros());
            let bits = self.group_bits.get(w as usize).copied().unwrap_or(0);
            w.wrapping_mul(64) | 63u32.wrapping_sub(bits.leading_zeros())
        };
        let first = pg.wrapping_mul(GROUP);
        let last = first.wrapping_add(GROUP).min(self.regions);
        (first..last).rev().find(|&q| self.root(q) != NIL)
    }

    pub(super) fn find_alloc(&self, addr: u64) -> Option<u32> {
        let r = self.region_of(addr)?;
        if self.list_index() {
            return self.list_find(r, addr);
        }
        let mut x = self.root(r);
        for _ in 0..MAX_HEIGHT {
            let v = self.node(x)?;
            if addr == v.start {
                // Recycled ranges stay in their trees.
                return v.is_allocation().then_some(x);
            }
            x = if addr < v.start { v.left() } else { v.right() };
        }
        None
    }

    /// List index: the allocation of region `r` (which holds `addr`) that
    /// starts at `addr`. Walks the address list from the region's first
    /// allocation while ranges start below `addr`: they are all in the
    /// region, so at most [`LIST_WALK`] of them.
    #[inline]
    pub(super) fn list_find(&self, r: u32, addr: u64) -> Option<u32> {
        let mut x = self.root(r);
        for _ in 0..self.list_walk() {
            let v = self.node(x)?;
            if v.start >= addr {
                return (v.start == addr && v.is_allocation()).then_some(x);
            }
            x = v.next;
        }
        None
    }

    /// List index: the last allocation of region `r` starting at or before
    /// `key`. Walks the address list from the region's first allocation, at
    /// most [`LIST_WALK`] ranges (every range is at least a granule).
    pub(super) fn list_pred_or_eq(&self, r: u32, key: u64) -> Option<u32> {
        self.region_walk(r, self.root(r), true)
            .take_while(|(_, v)| v.start <= key)
            .filter(|(_, v)| v.is_allocation())
            .last()
            .map(|(n, _)| n)
    }

    /// List index: the ranges of region `r` from range `from` on, in address
    /// order (`forward`) or backwards, while they start in the region; at
    /// most [`LIST_WALK`] of them (every range is at least a granule).
    pub(super) fn region_walk(&self, r: u32, from: u32, forward: bool) -> RegionWalk<'_, S, RECYCLE> {
        RegionWalk { va: self, region: r, at: from, left: self.list_walk(), forward }
    }
}

/// Iterator of [`VaAllocator::region_walk`]: `(node, range)` pairs.
pub(super) struct RegionWalk<'a, S, const RECYCLE: bool> {
    va: &'a VaAllocator<S, RECYCLE>,
    region: u32,
    at: u32,
    left: usize,
    forward: bool,
}

impl<'a, S: AsRef<[VaNode]> + AsMut<[VaNode]>, const RECYCLE: bool> Iterator for RegionWalk<'a, S, RECYCLE> {
    type Item = (u32, &'a VaNode);

    #[inline(always)]
    fn next(&mut self) -> Option<Self::Item> {
        self.left = self.left.checked_sub(1)?;
        let n = self.at;
        let v = self.va.node(n)?;
        if self.va.region_of(v.start) != Some(self.region) {
            self.left = 0;
            return None;
        }
        self.at = if self.forward { v.next } else { v.prev };
        Some((n, v))
    }
}
