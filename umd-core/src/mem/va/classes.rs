//! Size classes and the segregated hole lists (TLSF): one doubly-linked
//! list of holes per class, and a two-level bitmap of the non-empty classes.

use super::{VaAllocator, VaNode, GRANULE_SHIFT, NIL};

/// log2 of the number of sub-classes per power of two.
const SL_LOG2: u32 = 4;
/// Sub-classes per power of two.
pub(super) const SL_COUNT: usize = 1 << SL_LOG2;
/// Powers of two (first-level classes).
pub(super) const FL_COUNT: usize = 64;
/// All classes.
pub(super) const CLASSES: usize = FL_COUNT * SL_COUNT;

/// Size class of a hole of `g` granules (`g >= 1`).
#[inline]
pub(super) fn class_of(g: u64) -> usize {
    let t = 63u32.wrapping_sub(g.max(1).leading_zeros());
    if t < SL_LOG2 {
        return g as usize;
    }
    let fl = t.wrapping_sub(SL_LOG2 - 1) as usize;
    let sl = (g.wrapping_shr(t.wrapping_sub(SL_LOG2)) as usize) & (SL_COUNT - 1);
    fl.wrapping_mul(SL_COUNT) | sl
}

/// Smallest class whose every hole has at least `g` granules.
#[inline]
pub(super) fn class_at_least(g: u64) -> usize {
    let t = 63u32.wrapping_sub(g.max(1).leading_zeros());
    if t < SL_LOG2 {
        return g as usize;
    }
    let step = 1u64.wrapping_shl(t.wrapping_sub(SL_LOG2)).wrapping_sub(1);
    class_of(g.saturating_add(step))
}

impl<S: AsRef<[VaNode]> + AsMut<[VaNode]>, const RECYCLE: bool> VaAllocator<S, RECYCLE> {
    pub(super) fn largest_hole(&self) -> u64 {
        if self.fl_bits == 0 {
            return 0;
        }
        let fl = 63u32.wrapping_sub(self.fl_bits.leading_zeros()) as usize;
        let w = self.sl_bits.get(fl).copied().unwrap_or(0);
        let sl = 31u32.wrapping_sub(w.leading_zeros()) as usize;
        let mut x = self.head_of(fl.wrapping_mul(SL_COUNT) | sl);
        let mut best = 0;
        let mut steps = 0u64;
        while x != NIL && steps <= self.hole_count {
            steps = steps.wrapping_add(1);
            let Some(v) = self.node(x) else { break };
            best = best.max(v.len);
            x = v.class_next();
        }
        best
    }

    #[inline]
    pub(super) fn head_of(&self, c: usize) -> u32 {
        self.heads.get(c).copied().unwrap_or(NIL)
    }

    /// First non-empty class `>= c`. One shared copy with `size-first`
    /// (`find_fit` searches up to three times).
    #[cfg_attr(feature = "size-first", inline(never))]
    #[cfg_attr(not(feature = "size-first"), inline)]
    pub(super) fn find_class(&self, c: usize) -> Option<usize> {
        let fl = c / SL_COUNT;
        let sl = (c % SL_COUNT) as u32;
        let w = self.sl_bits.get(fl).copied().unwrap_or(0) & u32::MAX.wrapping_shl(sl);
        if w != 0 {
            return Some(fl.wrapping_mul(SL_COUNT) | w.trailing_zeros() as usize);
        }
        let above = u64::MAX.checked_shl(fl.wrapping_add(1) as u32).unwrap_or(0);
        let f = self.fl_bits & above;
        if f == 0 {
            return None;
        }
        let fl = f.trailing_zeros() as usize;
        let w = self.sl_bits.get(fl).copied().unwrap_or(0);
        Some(fl.wrapping_mul(SL_COUNT) | w.trailing_zeros() as usize)
    }

    pub(super) fn list_push(&mut self, h: u32) {
        self.list_push_in(h, class_of(self.len(h) >> GRANULE_SHIFT));
    }

    /// Pushes hole `h` on the list of class `c` (its class).
    #[inline]
    pub(super) fn list_push_in(&mut self, h: u32, c: usize) {
        let old = self.head_of(c);
        if let Some(v) = self.node_mut(h) {
            v.set_class_prev(NIL);
            v.set_class_next(old);
        }
        if let Some(v) = self.node_mut(old) {
            v.set_class_prev(h);
        }
        if let Some(slot) = self.heads.get_mut(c) {
            *slot = h;
        }
        let fl = c / SL_COUNT;
        if let Some(w) = self.sl_bits.get_mut(fl) {
            *w |= 1u32.wrapping_shl((c % SL_COUNT) as u32);
        }
        self.fl_bits |= 1u64.wrapping_shl(fl as u32);
    }

    pub(super) fn list_unlink(&mut self, h: u32) {
        self.list_unlink_in(h, class_of(self.len(h) >> GRANULE_SHIFT));
    }

    /// Takes hole `h` off the list of class `c` (its class).
    #[inline]
    pub(super) fn list_unlink_in(&mut self, h: u32, c: usize) {
        let (p, n) = self.node(h).map_or((NIL, NIL), |v| (v.class_prev(), v.class_next()));
        if let Some(v) = self.node_mut(n) {
            v.set_class_prev(p);
        }
        if p != NIL {
            if let Some(v) = self.node_mut(p) {
                v.set_class_next(n);
            }
            return;
        }
        if let Some(slot) = self.heads.get_mut(c) {
            *slot = n;
        }
        if n == NIL {
            let fl = c / SL_COUNT;
            if let Some(w) = self.sl_bits.get_mut(fl) {
                *w &= !1u32.wrapping_shl((c % SL_COUNT) as u32);
                if *w == 0 {
                    self.fl_bits &= !1u64.wrapping_shl(fl as u32);
                }
            }
        }
    }

    /// Gives hole `h` a new start and length, moving it to another list if
    /// its class changes. The new range must keep its place in address order.
    #[inline]
    pub(super) fn resize_hole(&mut self, h: u32, start: u64, len: u64) {
        let old = class_of(self.len(h) >> GRANULE_SHIFT);
        let new = class_of(len >> GRANULE_SHIFT);
        if old != new {
            self.list_unlink_in(h, old);
        }
        if let Some(v) = self.node_mut(h) {
            v.start = start;
            v.len = len;
        }
        if old != new {
            self.list_push_in(h, new);
        }
    }
}
