//! Good fit: finding a hole for a request, splitting it around the new
//! allocation, and coalescing a freed range back into the holes (module
//! documentation, "Placement").

use super::classes::{class_at_least, class_of};
use super::{State, VaAllocator, VaError, VaNode, VaPlacement, EXACT_PROBES, GRANULE_SHIFT, MIN_ALIGN, NIL};

impl<S: AsRef<[VaNode]> + AsMut<[VaNode]>, const RECYCLE: bool> VaAllocator<S, RECYCLE> {
    /// Address at which `[size]` aligned to `align` fits in hole `h`. One
    /// shared copy with `size-first` (`find_fit` tries up to 10 holes).
    #[cfg_attr(feature = "size-first", inline(never))]
    #[cfg_attr(not(feature = "size-first"), inline)]
    pub(super) fn fit(&self, h: u32, size: u64, align: u64, placement: VaPlacement) -> Option<u64> {
        let v = self.node(h)?;
        let end = v.start.wrapping_add(v.len);
        match placement {
            VaPlacement::BottomUp => {
                let a = align_up(v.start, align)?;
                (a.checked_add(size)? <= end).then_some(a)
            }
            VaPlacement::TopDown => {
                let a = end.checked_sub(size)? & !(align.wrapping_sub(1));
                (a >= v.start).then_some(a)
            }
        }
    }

    pub(super) fn find_fit(
        &self,
        size: u64,
        align: u64,
        placement: VaPlacement,
    ) -> Result<(u32, u64), VaError> {
        let g = size >> GRANULE_SHIFT;
        // 1. Good fit: first hole of the smallest class whose every hole
        //    holds `size`. Always fits at 128 B alignment.
        if let Some(c) = self.find_class(class_at_least(g)) {
            let h = self.head_of(c);
            if let Some(a) = self.fit(h, size, align, placement) {
                return Ok((h, a));
            }
        }
        // 2. Larger alignment: a hole that fits whatever its address.
        if align > MIN_ALIGN {
            let need = size.checked_add(align.wrapping_sub(MIN_ALIGN)).ok_or(VaError::Overflow)?;
            if let Some(c) = self.find_class(class_at_least(need >> GRANULE_SHIFT)) {
                let h = self.head_of(c);
                if let Some(a) = self.fit(h, size, align, placement) {
                    return Ok((h, a));
                }
            }
        }
        // 3. Bounded probing from the request's own class upwards.
        let mut c = self.find_class(class_of(g));
        let mut h = c.map_or(NIL, |c| self.head_of(c));
        for _ in 0..EXACT_PROBES {
            if h == NIL {
                break;
            }
            if let Some(a) = self.fit(h, size, align, placement) {
                return Ok((h, a));
            }
            h = self.node(h).map_or(NIL, |v| v.class_next());
            if h == NIL {
                c = c.and_then(|x| self.find_class(x.wrapping_add(1)));
                h = c.map_or(NIL, |c| self.head_of(c));
            }
        }
        Err(VaError::NoSpace)
    }

    /// Splits hole `h` into `[front hole][allocation][back hole]`.
    pub(super) fn carve(&mut self, h: u32, addr: u64, size: u64) -> Result<u32, VaError> {
        let hs = self.start(h);
        let he = hs.wrapping_add(self.len(h));
        let end = addr.wrapping_add(size);
        let front = addr > hs;
        let back = end < he;
        let new_nodes = u32::from(front).wrapping_add(u32::from(back));
        if self.available_nodes() < new_nodes {
            return Err(VaError::NodeCapacity);
        }
        let n = match (front, back) {
            (false, false) => {
                self.list_unlink(h);
                self.hole_count = self.hole_count.wrapping_sub(1);
                h
            }
            (false, true) => {
                // The allocation takes the front; h keeps the back, moving
                // its start up (it stays on its list if its class holds).
                let n = self.take_node().unwrap_or(NIL);
                self.addr_insert_before(h, n);
                self.resize_hole(h, end, he.wrapping_sub(end));
                n
            }
            (true, false) => {
                let n = self.take_node().unwrap_or(NIL);
                self.addr_insert_after(h, n);
                self.resize_hole(h, hs, addr.wrapping_sub(hs));
                n
            }
            (true, true) => {
                let n = self.take_node().unwrap_or(NIL);
                let b = self.take_node().unwrap_or(NIL);
                self.addr_insert_after(h, n);
                self.addr_insert_after(n, b);
                self.set(b, end, he.wrapping_sub(end), State::Hole);
                self.list_push(b);
                self.hole_count = self.hole_count.wrapping_add(1);
                self.resize_hole(h, hs, addr.wrapping_sub(hs));
                n
            }
        };
        self.set(n, addr, size, State::Alloc);
        self.index_alloc(n, addr, size);
        Ok(n)
    }

    /// Turns range `x` (`size` bytes at `addr`, out of the index and the
    /// counters) into a hole, coalescing with its neighbours. O(1). One
    /// shared copy with `size-first` (`free`, `free_handle` and the
    /// recycling flush inline it otherwise).
    #[cfg_attr(feature = "size-first", inline(never))]
    #[cfg_attr(not(feature = "size-first"), inline(always))]
    pub(super) fn make_hole(&mut self, x: u32, addr: u64, size: u64) {
        let (p, n) = self.node(x).map_or((NIL, NIL), |v| (v.prev, v.next));
        let left = self.state(p) == State::Hole;
        let right = self.state(n) == State::Hole;
        match (left, right) {
            (true, true) => {
                // [L][x][R] -> L grows over both.
                let rlen = self.len(n);
                self.list_unlink(n);
                self.addr_unlink(n);
                self.release(n);
                self.hole_count = self.hole_count.wrapping_sub(1);
                self.addr_unlink(x);
                self.release(x);
                let ls = self.start(p);
                let llen = self.len(p).wrapping_add(size).wrapping_add(rlen);
                self.resize_hole(p, ls, llen);
            }
            (true, false) => {
                self.addr_unlink(x);
                self.release(x);
                let ls = self.start(p);
                let llen = self.len(p).wrapping_add(size);
                self.resize_hole(p, ls, llen);
            }
            (false, true) => {
                self.addr_unlink(x);
                self.release(x);
                let rlen = self.len(n).wrapping_add(size);
                self.resize_hole(n, addr, rlen);
            }
            (false, false) => {
                if let Some(v) = self.node_mut(x) {
                    v.state = State::Hole;
                }
                self.list_push(x);
                self.hole_count = self.hole_count.wrapping_add(1);
            }
        }
    }
}

#[inline]
fn align_up(v: u64, align: u64) -> Option<u64> {
    let m = align.wrapping_sub(1);
    Some(v.checked_add(m)? & !m)
}
