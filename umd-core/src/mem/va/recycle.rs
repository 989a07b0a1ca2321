//! Recycling (see [`VaAllocator::new_recycling`]): freed ranges of 1 to
//! [`RECYCLE_CLASSES`] granules kept on one stack per exact length and
//! handed to the next request of that length.

use super::{
    State, VaAllocator, VaError, VaHandle, VaNode, VaPlacement, GRANULE_SHIFT, NIL, RECYCLE_CLASSES,
    RECYCLE_LIMIT,
};

/// A recycled range keeps its stack link in the high half of its `len`
/// (its length, at most `RECYCLE_CLASSES` granules, in the low half), so
/// that it keeps every other link: it stays in its region tree.
const LINK_SHIFT: u32 = 32;
/// The length part of a recycled range's `len`.
pub(super) const CACHED_LEN: u64 = (1 << LINK_SHIFT) - 1;

/// The stack link in a recycled range's `len`.
#[inline(always)]
pub(super) const fn stack_link(len: u64) -> u32 {
    (len >> LINK_SHIFT) as u32
}

impl<S: AsRef<[VaNode]> + AsMut<[VaNode]>, const RECYCLE: bool> VaAllocator<S, RECYCLE> {
    /// Coalesces every range kept by recycling (see
    /// [`VaAllocator::new_recycling`]) back into the holes. At most
    /// [`RECYCLE_LIMIT`] ranges, O(1) each; nothing to do for an allocator
    /// without recycling.
    ///
    /// Out of line and cold: each range goes back as an allocation through
    /// [`VaAllocator::free_handle`], the one release path (the count is
    /// held at the limit meanwhile, so the range is coalesced, not kept
    /// again).
    #[cold]
    #[inline(never)]
    pub fn flush_recycled(&mut self) {
        if self.recycled == 0 {
            return;
        }
        // Ranges still to take: bounds the walks below together.
        let mut left = self.recycled;
        self.recycled = RECYCLE_LIMIT;
        for i in 0..RECYCLE_CLASSES {
            let mut x = self.recycle_heads.get(i).copied().unwrap_or(NIL);
            if let Some(h) = self.recycle_heads.get_mut(i) {
                *h = NIL;
            }
            while left != 0 {
                let Some(v) = self.node_mut(x) else { break };
                left = left.wrapping_sub(1);
                let (next, addr, size) = (stack_link(v.len), v.start, v.len & CACHED_LEN);
                v.len = size;
                v.state = State::Alloc;
                self.alloc_count = self.alloc_count.wrapping_add(1);
                self.used = self.used.wrapping_add(size);
                // Still indexed (list or region tree): the release takes it
                // out. Cannot fail: `x` is an allocation at `addr`.
                let _ = self.free_handle(VaHandle { addr, node: x });
                x = next;
            }
        }
        self.recycled = 0;
    }

    /// An allocation that failed with ranges kept by recycling: flush them,
    /// then try once more.
    #[cold]
    #[inline(never)]
    pub(super) fn alloc_flushed(
        &mut self,
        size: u64,
        align: u64,
        placement: VaPlacement,
    ) -> Result<(u32, u64), VaError> {
        self.flush_recycled();
        let (hole, addr) = self.find_fit(size, align, placement)?;
        let n = self.carve(hole, addr, size)?;
        Ok((n, addr))
    }

    /// Recycling: takes the top range of the stack of `size`, if any and if
    /// it meets `align`, as a new allocation. O(1): the range is still in
    /// the index (list or region tree), so nothing is inserted.
    #[inline]
    pub(super) fn recycle_pop(&mut self, size: u64, align: u64) -> Option<(u32, u64)> {
        let i = (size >> GRANULE_SHIFT).wrapping_sub(1) as usize;
        let x = self.recycle_heads.get(i).copied()?;
        let v = self.node_mut(x)?;
        let addr = v.start;
        if addr & align.wrapping_sub(1) != 0 {
            return None;
        }
        let next = stack_link(v.len);
        v.len = size;
        v.state = State::Alloc;
        if let Some(h) = self.recycle_heads.get_mut(i) {
            *h = next;
        }
        self.recycled = self.recycled.wrapping_sub(1);
        self.count_alloc(size);
        Some((x, addr))
    }

    /// Recycling: whether a freed allocation of `size` bytes is kept (it
    /// has a stack and fewer than [`RECYCLE_LIMIT`] ranges are kept). Then
    /// it stays in the index, so `free` and `free_handle` ask first.
    #[inline(always)]
    pub(super) fn recyclable(&self, size: u64) -> bool {
        // `recycle_push`'s test: an allocation is at least one granule, so
        // this length check is its stack-index bounds check.
        RECYCLE && size >> GRANULE_SHIFT <= RECYCLE_CLASSES as u64 && self.recycled < RECYCLE_LIMIT
    }

    /// Recycling: keeps freed allocation `x` of `size` bytes (still in the
    /// index) on its stack if [`Self::recyclable`]. The stack link goes in
    /// the high half of `len`: a recycled range keeps its tree links
    /// (`a`, `b`, `bal`) and address links.
    #[inline]
    pub(super) fn recycle_push(&mut self, x: u32, size: u64) -> bool {
        // `recyclable`, with the stack's bounds check as the length check.
        let i = (size >> GRANULE_SHIFT).wrapping_sub(1) as usize;
        let Some(&top) = self.recycle_heads.get(i) else {
            return false;
        };
        if !RECYCLE || self.recycled >= RECYCLE_LIMIT {
            return false;
        }
        let Some(v) = self.node_mut(x) else { return false };
        v.state = State::Cached;
        v.len = size | u64::from(top) << LINK_SHIFT;
        if let Some(h) = self.recycle_heads.get_mut(i) {
            *h = x;
        }
        self.recycled = self.recycled.wrapping_add(1);
        true
    }
}
