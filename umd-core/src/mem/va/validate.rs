//! The checker: [`VaAllocator::validate`] walks every structure and checks
//! each invariant against the others. O(n); for tests and debug builds.

use super::avl::MAX_HEIGHT;
use super::classes::{class_of, CLASSES, SL_COUNT};
use super::index::GROUP;
use super::recycle::{stack_link, CACHED_LEN};
use super::{State, VaAllocator, VaNode, GRANULE_SHIFT, MIN_ALIGN, NIL, RECYCLE_LIMIT};

impl<S: AsRef<[VaNode]> + AsMut<[VaNode]>, const RECYCLE: bool> VaAllocator<S, RECYCLE> {
    /// Checks every internal invariant (ranges tile the arena exactly, links
    /// agree, holes coalesced and on the right size-class lists, bitmaps,
    /// region trees ordered and balanced, counters). O(n); for tests and
    /// debug builds.
    pub fn validate(&self) -> Result<(), &'static str> {
        // 1. The address list tiles the arena.
        let limit = u64::from(self.capacity).wrapping_add(1);
        let (mut holes, mut allocs, mut free, mut used, mut steps) = (0u64, 0u64, 0u64, 0u64, 0u64);
        let mut cached = 0u64;
        let mut expect = self.base;
        let mut prev = NIL;
        let mut last_was_hole = false;
        let mut x = self.head;
        while x != NIL {
            steps = steps.wrapping_add(1);
            if steps > limit {
                return Err("address list has a cycle");
            }
            let v = self.node(x).ok_or("link out of range")?;
            if v.prev != prev {
                return Err("prev link disagrees with the address list");
            }
            if v.start != expect {
                return Err("ranges leave a gap or overlap");
            }
            // A recycled range's `len` holds its stack link in the high half.
            let len = if v.state == State::Cached { v.len & CACHED_LEN } else { v.len };
            if len == 0 || v.start % MIN_ALIGN != 0 || len % MIN_ALIGN != 0 {
                return Err("empty or misaligned range");
            }
            match v.state {
                State::Hole => {
                    if last_was_hole {
                        return Err("two adjacent holes were not coalesced");
                    }
                    holes = holes.wrapping_add(1);
                    free = free.wrapping_add(v.len);
                }
                State::Alloc | State::Retired => {
                    allocs = allocs.wrapping_add(1);
                    used = used.wrapping_add(v.len);
                    if self.find_alloc(v.start) != Some(x) {
                        return Err("allocation missing from its region tree");
                    }
                }
                State::Cached => {
                    cached = cached.wrapping_add(1);
                    free = free.wrapping_add(len);
                }
                State::Unused => return Err("unused node on the address list"),
            }
            last_was_hole = v.state == State::Hole;
            expect = v.start.checked_add(len).ok_or("range wraps")?;
            prev = x;
            x = v.next;
        }
        if expect != self.base.wrapping_add(self.size) {
            return Err("ranges do not reach the end of the arena");
        }
        if holes != self.hole_count || allocs != self.alloc_count {
            return Err("node counters disagree with the address list");
        }
        if used != self.used || free.wrapping_add(used) != self.size {
            return Err("holes and allocations do not tile the arena");
        }
        if u64::from(self.nodes_used) != holes.wrapping_add(allocs).wrapping_add(cached) {
            return Err("nodes_used disagrees with the address list");
        }
        // 1b. Recycling stacks: every recycled range on the stack of its
        //     length, at most RECYCLE_LIMIT of them in all.
        if cached != u64::from(self.recycled) || (!RECYCLE && cached != 0) {
            return Err("recycled count disagrees with the address list");
        }
        if self.recycled > RECYCLE_LIMIT {
            return Err("more recycled ranges than RECYCLE_LIMIT");
        }
        let mut stacked = 0u64;
        for (i, &top) in self.recycle_heads.iter().enumerate() {
            let mut y = top;
            while y != NIL {
                if stacked >= cached {
                    return Err("recycling stacks hold more ranges than are recycled");
                }
                let v = self.node(y).ok_or("link out of range on a recycling stack")?;
                if v.state != State::Cached
                    || (v.len & CACHED_LEN) >> GRANULE_SHIFT != (i as u64).wrapping_add(1)
                {
                    return Err("wrong range on a recycling stack");
                }
                stacked = stacked.wrapping_add(1);
                y = stack_link(v.len);
            }
        }
        if stacked != cached {
            return Err("a recycled range is missing from the stacks");
        }
        // 2. Size-class lists and their bitmaps.
        let mut listed = 0u64;
        for c in 0..CLASSES {
            let h = self.heads.get(c).copied().unwrap_or(NIL);
            let (fl, sl) = (c / SL_COUNT, c % SL_COUNT);
            let sl_bit = self.sl_bits.get(fl).is_some_and(|w| w & (1u32 << sl) != 0);
            if sl_bit != (h != NIL) {
                return Err("second-level bitmap disagrees with the lists");
            }
            let fl_bit = self.fl_bits & (1u64 << fl) != 0;
            if fl_bit != self.sl_bits.get(fl).is_some_and(|&w| w != 0) {
                return Err("first-level bitmap disagrees with the lists");
            }
            let mut p = NIL;
            let mut y = h;
            while y != NIL {
                listed = listed.wrapping_add(1);
                if listed > limit {
                    return Err("size-class list has a cycle");
                }
                let v = self.node(y).ok_or("link out of range")?;
                if v.state != State::Hole {
                    return Err("non-hole on a size-class list");
                }
                if class_of(v.len >> GRANULE_SHIFT) != c {
                    return Err("hole on the wrong size-class list");
                }
                if v.class_prev() != p {
                    return Err("size-class list back link is wrong");
                }
                p = y;
                y = v.class_next();
            }
        }
        if listed != holes {
            return Err("a hole is missing from the size-class lists");
        }
        // 3. Region trees (or list index), group counts and the group bitmap.
        let mut indexed = 0u64;
        let mut indexed_cached = 0u64;
        let mut in_group = 0u8;
        for r in 0..self.regions {
            let root = self.root(r);
            if root != NIL {
                in_group = in_group.wrapping_add(1);
            }
            if self.list_index() {
                // The directory slot names the region's first indexed range:
                // an allocation or a recycled range (recycled ranges stay in
                // the list index until flushed).
                if let Some(v) = self.node(root) {
                    if !v.is_listed() {
                        return Err("directory slot is not an allocation or a recycled range");
                    }
                    if self.region_of(v.start) != Some(r) {
                        return Err("directory slot names another region's allocation");
                    }
                    // First of its region: no indexed range of the region before it.
                    if self.region_walk(r, v.prev, false).any(|(_, w)| w.is_listed()) {
                        return Err("directory slot is not the region's first allocation");
                    }
                    // Every allocation and recycled range of the region is
                    // reached by the walk.
                    for (_, w) in self.region_walk(r, root, true) {
                        if w.is_allocation() {
                            indexed = indexed.wrapping_add(1);
                        } else if w.state == State::Cached {
                            indexed_cached = indexed_cached.wrapping_add(1);
                        }
                    }
                }
            } else {
                let mut prev_key = None;
                self.check_tree(root, 0, r, &mut prev_key, &mut indexed, &mut indexed_cached)?;
            }
            let g = r / GROUP;
            if r.wrapping_add(1) % GROUP == 0 || r.wrapping_add(1) == self.regions {
                if self.node(g).map(|x| x.group) != Some(in_group) {
                    return Err("group count disagrees with the region trees");
                }
                let w = self.group_bits.get((g / 64) as usize).copied().unwrap_or(0);
                if (w & (1u64 << (g % 64)) != 0) != (in_group != 0) {
                    return Err("group bitmap disagrees with the region trees");
                }
                if (self.group_top & (1u64 << (g / 64)) != 0) != (w != 0) {
                    return Err("group summary bitmap is wrong");
                }
                in_group = 0;
            }
        }
        if indexed != allocs {
            return Err("region trees hold a different number of allocations");
        }
        if indexed_cached != cached {
            return Err("a recycled range is missing from the index");
        }
        Ok(())
    }

    pub(super) fn check_tree(
        &self,
        x: u32,
        depth: usize,
        region: u32,
        prev_key: &mut Option<u64>,
        count: &mut u64,
        cached: &mut u64,
    ) -> Result<u8, &'static str> {
        if x == NIL {
            return Ok(0);
        }
        if depth >= MAX_HEIGHT {
            return Err("tree deeper than the AVL bound");
        }
        let v = self.node(x).ok_or("link out of range")?;
        let hl = self.check_tree(v.left(), depth.wrapping_add(1), region, prev_key, count, cached)?;
        // Recycled ranges stay in their trees.
        if !v.is_listed() {
            return Err("hole in a region tree");
        }
        if self.region_of(v.start) != Some(region) {
            return Err("allocation in the wrong region tree");
        }
        if prev_key.is_some_and(|p| p >= v.start) {
            return Err("region tree out of order");
        }
        *prev_key = Some(v.start);
        if v.state == State::Cached {
            *cached = cached.wrapping_add(1);
        } else {
            *count = count.wrapping_add(1);
        }
        let hr = self.check_tree(v.right(), depth.wrapping_add(1), region, prev_key, count, cached)?;
        if hl.abs_diff(hr) > 1 {
            return Err("AVL balance violated");
        }
        if i16::from(v.bal) != i16::from(hr).wrapping_sub(i16::from(hl)) {
            return Err("stored balance factor is wrong");
        }
        Ok(hl.max(hr).wrapping_add(1))
    }
}
