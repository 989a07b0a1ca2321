//! What a queue remembers about work that failed, in bounded memory.
//!
//! A reset cancels a range of a queue's sequence numbers `(after, upto]`;
//! a submission that waited on failed work is poisoned on its own queue as
//! the one-fence range `(s - 1, s]`. A fence answers from here before it
//! looks at the timeline: the timeline is forced past a cancelled range so
//! that engines waiting on it move on, so "completed" alone would report
//! success.
//!
//! The history keeps at most `N` disjoint ranges, in sequence order. When a
//! new range does not fit, the two neighbouring ranges with the smallest gap
//! between them are merged into one: cancelled fences never leave the
//! history, so failed work can never turn into success, however many resets
//! follow. The price is paid only after more than `N` separate failures
//! with successful work between them: successful fences inside a merged gap
//! then report a failure, and when the merged ranges failed for different
//! reasons, the fences of one of them report the other's reason (the merge
//! chosen is the one that misreports the fewest fences; `merges` counts
//! them, and `DeviceStats::history_merges` shows them). Resets in a row (a queue that
//! keeps hanging) leave no gap and merge exactly. `docs/architecture.md`
//! ("Failure history") explains the choice.

use super::fence::{Access, Cause, FaultInfo, FaultKind, FenceError};
use super::seqno::{FenceId, QueueId, Seqno};

/// One failed range `(after, upto]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailedRange {
    /// The last sequence number before the range (not failed).
    pub after: Seqno,
    /// The last failed sequence number.
    pub upto: Seqno,
    /// Why (for a merged range: the longer range's reason).
    pub error: FenceError,
}

impl FailedRange {
    /// Whether `s` lies in the range.
    pub fn contains(&self, s: Seqno) -> bool {
        s.is_after(self.after) && s.is_signalled_by(self.upto)
    }
}

/// Failed ranges of one queue, at most `N`, sorted and disjoint.
#[derive(Clone, Copy)]
pub struct FailureHistory<const N: usize> {
    /// The first `len` are the ranges; the slots from `len` on hold the
    /// placeholder or stale copies and are never read (plain values rather
    /// than `Option`s: no tag to test on every read).
    ranges: [FailedRange; N],
    len: usize,
    merges: u64,
}

/// What the slots of a new history hold (never read as a range; a slot
/// freed later keeps a stale copy, never read either). Every field zero,
/// so that a new history is cleared rather than copied from a template
/// in read-only data (which `DeviceHung`, a tag in a niche, needed).
const UNUSED: FailedRange = FailedRange {
    after: Seqno(0),
    upto: Seqno(0),
    error: FenceError::Dependency {
        producer: FenceId { queue: QueueId(0), seqno: Seqno(0) },
        cause: Cause::Fault(FaultInfo {
            kind: FaultKind::Translation,
            access: Access::Read,
            addr: 0,
            opcode: 0,
        }),
    },
};

/// The recorded ranges only (not the unused slots).
impl<const N: usize> core::fmt::Debug for FailureHistory<N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("FailureHistory").field("ranges", &self.live()).field("merges", &self.merges).finish()
    }
}

impl<const N: usize> Default for FailureHistory<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> FailureHistory<N> {
    /// Nothing failed yet.
    pub const fn new() -> Self {
        FailureHistory { ranges: [UNUSED; N], len: 0, merges: 0 }
    }

    /// The ranges, oldest first.
    pub fn ranges(&self) -> impl Iterator<Item = &FailedRange> {
        self.live().iter()
    }

    /// The recorded ranges (the first `len` slots).
    fn live(&self) -> &[FailedRange] {
        self.ranges.get(..self.len).unwrap_or(&[])
    }

    /// The recorded ranges, mutable.
    fn live_mut(&mut self) -> &mut [FailedRange] {
        self.ranges.get_mut(..self.len).unwrap_or(&mut [])
    }

    /// How many times two ranges were merged to make room.
    pub fn merges(&self) -> u64 {
        self.merges
    }

    /// The highest failed sequence number, if any.
    pub fn newest(&self) -> Option<Seqno> {
        self.live().last().map(|r| r.upto)
    }

    /// Why `s` failed, if it did.
    pub fn lookup(&self, s: Seqno) -> Option<FenceError> {
        // Newest first: most lookups are about recent work.
        self.live().iter().rev().find(|r| r.contains(s)).map(|r| r.error)
    }

    /// Records that `(after, upto]` failed with `error`. Fences already
    /// recorded keep their reason (a fence answered `Dependency` stays so
    /// when its queue is reset later): only the parts of the range not
    /// recorded yet are added. A part that touches an existing range of the
    /// same error joins it; an empty range (`upto` not after `after`)
    /// records nothing.
    pub fn record(&mut self, after: Seqno, upto: Seqno, error: FenceError) {
        if !upto.is_after(after) || N == 0 {
            return;
        }
        // Each pass skips one recorded range or adds one gap before it, and
        // there are at most N ranges (a merge to make room only joins them).
        let mut cursor = after;
        for _ in 0..N.saturating_mul(2).saturating_add(2) {
            if !upto.is_after(cursor) {
                return;
            }
            // The bounds of the next range only (not a copy of it).
            let next = self.ranges().find(|r| r.upto.is_after(cursor)).map(|r| (r.after, r.upto));
            // The gap up to the next range (or to `upto`) is added; one
            // call of `insert`, so that it folds into this loop.
            let end = match next {
                // `cursor` lies inside a recorded range: skip what it covers.
                Some((r_after, r_upto)) if !r_after.is_after(cursor) => {
                    cursor = r_upto;
                    continue;
                }
                Some((r_after, _)) => earlier(r_after, upto),
                None => upto,
            };
            self.insert(cursor, end, error);
            cursor = end;
        }
    }

    /// Adds `(after, upto]` (not overlapping a recorded range, see
    /// `record`); it joins a touching range of the same error, and an
    /// overlapping one if there is one after all. Ranges are read in
    /// place and changed field by field: a range with its error is 48
    /// bytes on 32-bit targets, and copies of it were most of the code.
    fn insert(&mut self, after: Seqno, upto: Seqno, error: FenceError) {
        if !upto.is_after(after) || N == 0 {
            return;
        }
        // Position: after every range that ends at or before `after`.
        let at = self.live().iter().position(|r| r.upto.is_after(after)).unwrap_or(self.len);
        // Overlap with the range at `at` (or a touching one before it with
        // the same error): merge instead of inserting.
        if let Some(i) = at.checked_sub(1) {
            if let Some(p) = self.live_mut().get_mut(i) {
                if p.upto == after && same_error(&p.error, &error) {
                    p.upto = later(p.upto, upto);
                    p.error = error;
                    self.absorb_following(i);
                    return;
                }
            }
        }
        if let Some(r) = self.live_mut().get_mut(at) {
            if upto.is_after(r.after) || r.after == upto && same_error(&r.error, &error) {
                *r = FailedRange { after: earlier(r.after, after), upto: later(r.upto, upto), error };
                self.absorb_following(at);
                return;
            }
        }
        if self.len >= N {
            if N == 1 {
                // No pair to merge: the one range grows over the new one
                // and the gap between them, with the longer one's reason.
                if let Some(r) = self.live_mut().first_mut() {
                    let fresh = FailedRange { after, upto, error };
                    let error = if len(&fresh) > len(r) { error } else { r.error };
                    *r = FailedRange { after: earlier(r.after, after), upto: later(r.upto, upto), error };
                    self.merges = self.merges.saturating_add(1);
                }
                return;
            }
            self.merge_closest();
            // The merge removed one slot before or around `at`.
            self.insert(after, upto, error);
            return;
        }
        // Shift `at..len` up by one (the free slot at `len` moves down to
        // `at`) and insert.
        let mut i = self.len;
        while i > at && i < N {
            self.ranges.swap(i.wrapping_sub(1), i);
            i = i.wrapping_sub(1);
        }
        if let Some(slot) = self.ranges.get_mut(at) {
            *slot = FailedRange { after, upto, error };
            self.len = self.len.saturating_add(1);
        }
    }

    /// Joins ranges after `i` that the (grown) range `i` now overlaps or
    /// touches with the same error.
    fn absorb_following(&mut self, i: usize) {
        for _ in 0..N {
            let live = self.live();
            let (Some(cur), Some(next)) = (live.get(i), live.get(i.saturating_add(1))) else {
                return;
            };
            // Overlapping, or touching with the same error (a touching range
            // of another error keeps its own).
            let joins = cur.upto.is_after(next.after)
                || next.after == cur.upto && same_error(&next.error, &cur.error);
            if !joins {
                return;
            }
            let upto = later(cur.upto, next.upto);
            if let Some(cur) = self.ranges.get_mut(i) {
                cur.upto = upto;
            }
            self.remove(i.saturating_add(1));
        }
    }

    fn remove(&mut self, i: usize) {
        if i >= self.len {
            return;
        }
        if let Some(s) = self.ranges.get_mut(i..self.len) {
            s.copy_within(1.., 0);
        }
        self.len = self.len.saturating_sub(1);
    }

    /// Merges the two neighbours whose merge misreports the fewest fences:
    /// the successful ones in the gap between them, plus, when their
    /// reasons differ, the fences of the shorter range (the merged range
    /// keeps the longer one's reason; the later one's on a tie).
    fn merge_closest(&mut self) {
        let mut best: Option<(usize, u64)> = None;
        for i in 0..self.len.saturating_sub(1) {
            let live = self.live();
            let (Some(a), Some(b)) = (live.get(i), live.get(i.saturating_add(1))) else {
                continue;
            };
            let gap = b.after.distance(a.upto).max(0) as u64;
            let cost =
                if same_error(&a.error, &b.error) { gap } else { gap.saturating_add(len(a).min(len(b))) };
            if best.is_none_or(|(_, c)| cost < c) {
                best = Some((i, cost));
            }
        }
        let Some((i, _)) = best else { return };
        let live = self.live();
        let (Some(a), Some(b)) = (live.get(i), live.get(i.saturating_add(1))) else {
            return;
        };
        let (upto, error) = (b.upto, if len(a) > len(b) { a.error } else { b.error });
        if let Some(a) = self.ranges.get_mut(i) {
            a.upto = upto;
            a.error = error;
        }
        self.remove(i.saturating_add(1));
        self.merges = self.merges.saturating_add(1);
    }
}

/// Whether two ranges failed for the same reason: the derived comparison
/// (nested enums with fault details), kept in one copy rather than inlined
/// at each use.
#[inline(never)]
fn same_error(a: &FenceError, b: &FenceError) -> bool {
    a == b
}

/// Fences in `r`.
fn len(r: &FailedRange) -> u64 {
    r.upto.distance(r.after).max(0) as u64
}

fn later(a: Seqno, b: Seqno) -> Seqno {
    if b.is_after(a) {
        b
    } else {
        a
    }
}

fn earlier(a: Seqno, b: Seqno) -> Seqno {
    if b.is_after(a) {
        a
    } else {
        b
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::sync::FenceId;
    use crate::sync::QueueId;

    const HUNG: FenceError = FenceError::DeviceHung;

    /// A history of one range has no pair to merge: the range grows over
    /// a disjoint new one (it used to recurse without end).
    #[test]
    fn a_history_of_one_range_grows_it_over_a_new_one() {
        let mut h = FailureHistory::<1>::new();
        h.record(Seqno(0), Seqno(1), FenceError::DeviceLost);
        h.record(Seqno(5), Seqno(8), HUNG);
        let got: std::vec::Vec<FailedRange> = h.ranges().copied().collect();
        assert_eq!(got, [FailedRange { after: Seqno(0), upto: Seqno(8), error: HUNG }]);
        assert_eq!((h.merges(), h.lookup(Seqno(1)), h.lookup(Seqno(9))), (1, Some(HUNG), None));
        let shown = std::format!("{h:?}");
        assert!(shown.contains("merges: 1") && shown.matches("upto").count() == 1, "{shown}");
    }

    /// A full history merges the neighbours whose merge misreports the
    /// fewest fences: two ranges of the same reason before two of
    /// different reasons at the same distance, so a fence keeps its reason.
    #[test]
    fn a_merge_prefers_neighbours_of_the_same_reason() {
        let mut h = FailureHistory::<3>::new();
        h.record(Seqno(0), Seqno(1), FenceError::DeviceLost);
        h.record(Seqno(2), Seqno(3), HUNG);
        h.record(Seqno(4), Seqno(5), HUNG);
        h.record(Seqno(6), Seqno(7), FenceError::DeviceLost);
        assert_eq!(h.merges(), 1);
        assert_eq!(h.lookup(Seqno(1)), Some(FenceError::DeviceLost), "fence 1 kept its reason");
        assert_eq!(h.lookup(Seqno(3)), Some(HUNG));
        assert_eq!(h.lookup(Seqno(4)), Some(HUNG), "the success in the merged gap now reports a failure");
        assert_eq!(h.lookup(Seqno(5)), Some(HUNG));
        assert_eq!(h.lookup(Seqno(7)), Some(FenceError::DeviceLost));
        assert_eq!(h.lookup(Seqno(6)), None);
    }

    /// Merging ranges of different reasons keeps the longer one's reason.
    #[test]
    fn a_merge_of_different_reasons_keeps_the_longer_ranges() {
        let mut h = FailureHistory::<2>::new();
        h.record(Seqno(0), Seqno(5), HUNG);
        h.record(Seqno(6), Seqno(7), FenceError::DeviceLost);
        h.record(Seqno(20), Seqno(21), FenceError::DeviceLost);
        assert_eq!(h.merges(), 1);
        assert_eq!(h.lookup(Seqno(3)), Some(HUNG));
        assert_eq!(h.lookup(Seqno(7)), Some(HUNG));
        assert_eq!(h.lookup(Seqno(21)), Some(FenceError::DeviceLost));
    }

    #[test]
    fn ranges_answer_and_gaps_do_not() {
        let mut h = FailureHistory::<4>::new();
        h.record(Seqno(10), Seqno(15), HUNG);
        assert_eq!(h.lookup(Seqno(10)), None);
        assert_eq!(h.lookup(Seqno(11)), Some(HUNG));
        assert_eq!(h.lookup(Seqno(15)), Some(HUNG));
        assert_eq!(h.lookup(Seqno(16)), None);
        assert_eq!(h.newest(), Some(Seqno(15)));
    }

    #[test]
    fn thousands_of_resets_never_forget_a_cancelled_fence() {
        let mut h = FailureHistory::<4>::new();
        let mut cancelled = std::vec::Vec::new();
        let mut succeeded = std::vec::Vec::new();
        let mut s = 0u64;
        for i in 0..5000u64 {
            // A few successes, then a reset cancelling a few.
            let ok = i % 3;
            succeeded.extend(s + 1..=s + ok);
            s += ok;
            let n = 1 + i % 4;
            h.record(Seqno(s), Seqno(s + n), HUNG);
            cancelled.extend(s + 1..=s + n);
            s += n;
        }
        for c in &cancelled {
            assert!(h.lookup(Seqno(*c)).is_some(), "cancelled fence {c} forgotten");
        }
        assert!(h.merges() > 0);
        // The most recent gaps are still exact.
        let recent_ok = succeeded.iter().rev().take(1).copied().collect::<std::vec::Vec<_>>();
        for ok in recent_ok {
            assert_eq!(h.lookup(Seqno(ok)), None, "recent success {ok}");
        }
    }

    #[test]
    fn resets_in_a_row_merge_exactly() {
        let mut h = FailureHistory::<2>::new();
        for k in 0..100u64 {
            h.record(Seqno(k * 2), Seqno(k * 2 + 2), HUNG);
        }
        assert_eq!(h.ranges().count(), 1);
        assert_eq!(h.lookup(Seqno(0)), None);
        assert_eq!(h.lookup(Seqno(1)), Some(HUNG));
        assert_eq!(h.lookup(Seqno(200)), Some(HUNG));
        assert_eq!(h.lookup(Seqno(201)), None);
        assert_eq!(h.merges(), 0, "touching ranges join without a lossy merge");
    }

    #[test]
    fn poisoned_fences_are_single_ranges_with_their_producer() {
        let mut h = FailureHistory::<4>::new();
        let producer = FenceId::new(QueueId(2), 7);
        let e = FenceError::Dependency { producer, cause: crate::sync::fence::Cause::Hung };
        h.record(Seqno(4), Seqno(5), e);
        assert_eq!(h.lookup(Seqno(5)), Some(e));
        assert_eq!(h.lookup(Seqno(4)), None);
        assert_eq!(h.lookup(Seqno(6)), None);
        // A later reset range after it stays separate (different error).
        h.record(Seqno(5), Seqno(9), HUNG);
        assert_eq!(h.lookup(Seqno(5)), Some(e));
        assert_eq!(h.lookup(Seqno(6)), Some(HUNG));
    }

    #[test]
    fn a_failed_fence_keeps_its_first_reason() {
        let mut h = FailureHistory::<8>::new();
        let producer = FenceId::new(QueueId(2), 7);
        let dep = FenceError::Dependency { producer, cause: crate::sync::fence::Cause::Hung };
        // Two poisoned fences, then a reset cancelling the range around them.
        h.record(Seqno(11), Seqno(12), dep);
        h.record(Seqno(14), Seqno(15), dep);
        h.record(Seqno(10), Seqno(17), HUNG);
        for (s, want) in [(11, HUNG), (12, dep), (13, HUNG), (14, HUNG), (15, dep), (16, HUNG), (17, HUNG)] {
            assert_eq!(h.lookup(Seqno(s)), Some(want), "fence {s}");
        }
        assert_eq!(h.lookup(Seqno(10)), None);
        assert_eq!(h.lookup(Seqno(18)), None);
        assert_eq!(h.merges(), 0);
        // A range covering everything recorded adds only what is new.
        h.record(Seqno(5), Seqno(20), FenceError::DeviceLost);
        assert_eq!(h.lookup(Seqno(12)), Some(dep));
        assert_eq!(h.lookup(Seqno(13)), Some(HUNG));
        assert_eq!(h.lookup(Seqno(6)), Some(FenceError::DeviceLost));
        assert_eq!(h.lookup(Seqno(20)), Some(FenceError::DeviceLost));
        assert_eq!(h.lookup(Seqno(21)), None);
    }

    #[test]
    fn a_range_grown_to_touch_another_reason_does_not_swallow_it() {
        let mut h = FailureHistory::<8>::new();
        let producer = FenceId::new(QueueId(0), 7);
        let dep = FenceError::Dependency { producer, cause: crate::sync::fence::Cause::Hung };
        h.record(Seqno(0), Seqno(2), HUNG);
        h.record(Seqno(5), Seqno(6), dep);
        // The gap (2, 5] joins (0, 2] and now touches the poisoned fence.
        h.record(Seqno(2), Seqno(8), HUNG);
        assert_eq!(h.lookup(Seqno(6)), Some(dep));
        assert_eq!(h.lookup(Seqno(5)), Some(HUNG));
        assert_eq!(h.lookup(Seqno(7)), Some(HUNG));
        assert_eq!(h.ranges().count(), 3);
    }

    #[test]
    fn out_of_order_and_overlapping_records() {
        let mut h = FailureHistory::<4>::new();
        h.record(Seqno(20), Seqno(25), HUNG);
        h.record(Seqno(5), Seqno(6), HUNG);
        h.record(Seqno(22), Seqno(30), HUNG);
        assert_eq!(h.ranges().count(), 2);
        assert_eq!(h.lookup(Seqno(6)), Some(HUNG));
        assert_eq!(h.lookup(Seqno(30)), Some(HUNG));
        assert_eq!(h.lookup(Seqno(21)), Some(HUNG));
        assert_eq!(h.lookup(Seqno(10)), None);
        h.record(Seqno(9), Seqno(9), HUNG);
        assert_eq!(h.ranges().count(), 2, "empty range ignored");
    }

    #[test]
    fn wraps_around_the_timeline() {
        let mut h = FailureHistory::<4>::new();
        h.record(Seqno(u64::MAX - 2), Seqno(3), HUNG);
        assert_eq!(h.lookup(Seqno(u64::MAX)), Some(HUNG));
        assert_eq!(h.lookup(Seqno(0)), Some(HUNG));
        assert_eq!(h.lookup(Seqno(4)), None);
        assert_eq!(h.lookup(Seqno(u64::MAX - 2)), None);
    }
}
