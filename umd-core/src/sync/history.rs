//! What a queue remembers about work that failed, in bounded memory.
//!
//! A reset cancels a range of a queue's sequence numbers `(after, upto]`;
//! a submission that waited on failed work is poisoned on its own queue as
//! the one-fence range `(s - 1, s]`. A fence answers from here before it
//! looks at the timeline: the timeline is forced past a cancelled range so
//! that engines waiting on it move on, so "completed" alone would report
//! success.
//!
//! The history keeps at most `N` disjoint ranges, in sequence order, each
//! exact: touching ranges of the same reason join (resets in a row, a
//! queue that keeps hanging, make one range), and nothing else is ever
//! merged, so a success between two failures stays a success and every
//! failed fence keeps its first reason. A fence's answer therefore never
//! changes, as long as the ranges fit.
//!
//! They always fit when the queue admits submissions through
//! [`FailureHistory::admit`]: failures are only ever recorded for pending
//! work (sequence numbers after the completed one), and the pending work
//! of a queue can add at most `1 + P + 2 W` ranges, where `P` is the
//! number of recorded ranges that reach into the pending window and `W`
//! the number of pending submissions with cross-queue waits (each may be
//! poisoned, one range, and split the reset of the window that follows,
//! one more; the reset's first piece is the `1`). A submission is admitted
//! only while the ranges held plus that bound (with the new submission
//! counted) stay within `N`; when only completions can make room it waits
//! (like a full dependency table), and when even a queue with no waiters
//! pending would not fit, the queue refuses new work until the application
//! acknowledges old failures ([`FailureHistory::acknowledge`]: the ranges
//! at or before a settled point are dropped and those fences answer
//! "acknowledged" from then on, never a different outcome).
//!
//! A recorded range that did not fit anyway would be a broken bound: the
//! history then merges the two neighbours that misreport the fewest
//! fences (so a failure is still never forgotten) and counts it in
//! `merges` (`DeviceStats::history_merges`, 0 unless that bound is wrong).
//! `docs/architecture.md` ("Failure history") explains the choice.

use super::deps::PENDING_WAITS;
use super::fence::{Access, Cause, FaultInfo, FaultKind, FenceError};
use super::seqno::{FenceId, QueueId, Seqno};

/// Failed ranges a queue's history holds: room for everything the pending
/// work of a queue with a full dependency table can add (`2 PENDING_WAITS +
/// 1`, see [`FailureHistory`]) plus 15 settled ranges. Submissions are
/// admitted so that a failure always fits exactly; the bound is in
/// `docs/reliability.md`.
pub const HISTORY: usize = 2 * PENDING_WAITS + 16;

// An empty history admits a full dependency table: one range for the
// window's reset, two for each of `PENDING_WAITS` submissions with waits.
const _: () = assert!(2 * PENDING_WAITS < HISTORY);

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

/// What [`FailureHistory::admit`] says about a new submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// It fits, with everything pending.
    Admit,
    /// It fits once pending work has completed.
    WaitForRoom,
    /// It does not fit even with nothing pending: old failures must be
    /// acknowledged first.
    Full,
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

    /// How many times two ranges were merged to make room (0 while the
    /// queue admits work through [`FailureHistory::admit`]).
    pub fn merges(&self) -> u64 {
        self.merges
    }

    /// Ranges held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no range is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Ranges that reach past `completed` (into the pending window).
    pub fn pending(&self, completed: Seqno) -> usize {
        self.live().iter().rev().take_while(|r| r.upto.is_after(completed)).count()
    }

    /// Whether a new submission fits, its queue's work completed up to
    /// `completed`, with `waiters` pending submissions with cross-queue
    /// waits on the queue (not counting it) and `waits` telling whether it
    /// has cross-queue waits itself: every range the pending work could
    /// still add must fit (see the module docs for the bound).
    pub fn admit(&self, completed: Seqno, waiters: usize, waits: bool) -> Admission {
        // With nothing pending (all of it completed), the ranges held and
        // what this submission could add.
        let alone = self.len.saturating_add(1).saturating_add(if waits { 2 } else { 0 });
        let with_pending =
            alone.saturating_add(self.pending(completed)).saturating_add(waiters.saturating_mul(2));
        if alone > N {
            Admission::Full
        } else if with_pending > N {
            Admission::WaitForRoom
        } else {
            Admission::Admit
        }
    }

    /// Forgets the ranges at or before `floor` (a range that reaches past
    /// it keeps only its part after it). The caller answers fences at or
    /// before `floor` without the history from then on; `floor` must not be
    /// after the queue's completed point (pending work may still fail).
    pub fn acknowledge(&mut self, floor: Seqno) {
        let gone = self.live().iter().take_while(|r| !r.upto.is_after(floor)).count();
        if gone > 0 {
            if let Some(s) = self.ranges.get_mut(..self.len) {
                s.copy_within(gone.., 0);
            }
            self.len = self.len.saturating_sub(gone);
        }
        if let Some(first) = self.live_mut().first_mut() {
            if floor.is_after(first.after) {
                first.after = floor;
            }
        }
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
        let producer = FenceId::new(QueueId::COPY, 7);
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
        let producer = FenceId::new(QueueId::COPY, 7);
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
        let producer = FenceId::new(QueueId::GFX, 7);
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

    /// A small deterministic generator (splitmix64) for the schedule.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
    }

    /// The shadow's view of one fence.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Shadow {
        Pending,
        Signalled,
        Failed(FenceError),
    }

    /// A random schedule of submissions (half with cross-queue waits),
    /// completions, poisoned waiters, resets of the pending window and
    /// acknowledgements, on one queue whose submissions are admitted by
    /// `admit` into a history of the engine's size, against a shadow that
    /// remembers every fence's first outcome. Every step re-checks random
    /// fences not acknowledged (and every 4096th step all of the last
    /// thousand): the history must answer what the shadow remembers, and it
    /// must never have merged (the bound held). `UMD_HISTORY_STEPS` sets the
    /// number of steps (default 10^6), `UMD_HISTORY_SEED` the seed (default
    /// from the clock; printed, so a failure can be replayed).
    #[test]
    fn a_random_schedule_never_changes_an_answer() {
        const N: usize = HISTORY;
        let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
        let steps = env("UMD_HISTORY_STEPS").unwrap_or(1_000_000);
        let seed = env("UMD_HISTORY_SEED").unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
        std::println!("history schedule: {steps} steps, seed {seed} (UMD_HISTORY_SEED={seed} replays it)");
        let started = std::time::Instant::now();
        let mut rng = Rng(seed);
        let mut h = FailureHistory::<N>::new();
        // Index = sequence number (0 is never a fence).
        let mut shadow = std::vec![Shadow::Signalled];
        let mut waits = std::vec![false];
        let (mut completed, mut emitted, mut floor) = (0u64, 0u64, 0u64);
        let mut counts = [0u64; 8]; // admitted, waited, full, acks, completions, poisoned, resets, checks
        let mut most = 0usize;
        let cause = |rng: &mut Rng| match rng.below(4) {
            0 => FenceError::DeviceHung,
            1 => FenceError::Fault(FaultInfo {
                kind: FaultKind::Translation,
                access: Access::Write,
                addr: rng.below(4) * 0x1000,
                opcode: 3,
            }),
            2 => FenceError::NeverSignalled { producer: FenceId::new(QueueId::COMPUTE, rng.below(8)) },
            _ => FenceError::DeviceLost,
        };
        let complete = |n: u64, emitted: u64, completed: &mut u64, shadow: &mut std::vec::Vec<Shadow>| {
            for _ in 0..n {
                if *completed == emitted {
                    return;
                }
                *completed += 1;
                if let Some(o @ Shadow::Pending) = shadow.get_mut(*completed as usize) {
                    *o = Shadow::Signalled;
                }
            }
        };
        let check = |h: &FailureHistory<N>, shadow: &[Shadow], s: u64| {
            let want = match shadow[s as usize] {
                Shadow::Failed(e) => Some(e),
                Shadow::Signalled | Shadow::Pending => None,
            };
            assert_eq!(h.lookup(Seqno(s)), want, "fence {s} (seed {seed})");
        };
        // Calm phases complete work as it comes; storms (one phase in
        // three) complete nothing, poison many pending waiters and end in
        // resets: the worst case the admission bound is made for.
        let mut storm = false;
        for step in 0..steps {
            if step % 512 == 0 {
                storm = rng.below(3) == 0;
            }
            let waiters = (completed + 1..=emitted).filter(|&s| waits[s as usize]).count();
            let roll = rng.below(100);
            let roll = match (storm, roll) {
                (true, 0..=54) => 0,   // submit
                (true, 55..=94) => 75, // poison
                (true, 95..=97) => 90, // reset
                (true, _) => 95,       // acknowledge
                (false, r) => r,
            };
            match roll {
                0..=44 => {
                    let w = rng.below(2) == 0;
                    match h.admit(Seqno(completed), waiters, w) {
                        Admission::Admit => {
                            emitted += 1;
                            shadow.push(Shadow::Pending);
                            waits.push(w);
                            counts[0] += 1;
                        }
                        // Waiting lets the engines run.
                        Admission::WaitForRoom => {
                            complete(1 + rng.below(4), emitted, &mut completed, &mut shadow);
                            counts[1] += 1;
                        }
                        // The application acknowledges what completed.
                        Admission::Full => {
                            h.acknowledge(Seqno(completed));
                            floor = completed;
                            counts[2] += 1;
                        }
                    }
                }
                45..=74 => {
                    complete(1 + rng.below(4), emitted, &mut completed, &mut shadow);
                    counts[4] += 1;
                }
                75..=89 => {
                    // A pending waiter whose producer failed is poisoned.
                    let pending: std::vec::Vec<u64> = (completed + 1..=emitted)
                        .filter(|&s| waits[s as usize] && shadow[s as usize] == Shadow::Pending)
                        .collect();
                    if !pending.is_empty() {
                        let s = pending[rng.below(pending.len() as u64) as usize];
                        let producer = FenceId::new(QueueId::COPY, rng.below(16));
                        let e = FenceError::Dependency { producer, cause: cause(&mut rng).cause() };
                        h.record(Seqno(s - 1), Seqno(s), e);
                        shadow[s as usize] = Shadow::Failed(e);
                        counts[5] += 1;
                    }
                }
                90..=94 => {
                    // A reset fails the pending window (what is not failed yet).
                    let e = cause(&mut rng);
                    h.record(Seqno(completed), Seqno(emitted), e);
                    for o in shadow.iter_mut().skip(completed as usize + 1) {
                        if *o == Shadow::Pending {
                            *o = Shadow::Failed(e);
                        }
                    }
                    completed = emitted;
                    counts[6] += 1;
                }
                _ => {
                    // Now and then the application acknowledges a settled
                    // point on its own.
                    if rng.below(20) == 0 && completed > floor {
                        floor += 1 + rng.below(completed - floor);
                        h.acknowledge(Seqno(floor));
                        counts[3] += 1;
                    }
                }
            }
            assert_eq!(h.merges(), 0, "a range did not fit at step {step} (seed {seed})");
            most = most.max(h.len());
            if emitted > floor {
                for _ in 0..4 {
                    check(&h, &shadow, floor + 1 + rng.below(emitted - floor));
                    counts[7] += 1;
                }
            }
            if step % 4096 == 0 {
                for s in floor.max(emitted.saturating_sub(1000)) + 1..=emitted {
                    check(&h, &shadow, s);
                }
            }
        }
        std::println!(
            "history schedule: {} admitted, {} waits for room, {} refused full (acknowledged), {} other \
             acknowledgements, {} completion steps, {} poisoned, {} resets, {} random checks; \
             at most {most} of {N} ranges held, 0 merges; {:.1} s",
            counts[0],
            counts[1],
            counts[2],
            counts[3],
            counts[4],
            counts[5],
            counts[6],
            counts[7],
            started.elapsed().as_secs_f64()
        );
        assert!(
            counts[2] > 0 && counts[5] > 0 && counts[6] > 0 || steps < 100_000,
            "the schedule reached every case"
        );
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
