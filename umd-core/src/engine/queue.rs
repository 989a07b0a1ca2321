//! One queue as the engine sees it: its timeline (lock-free), its emitted
//! and processed marks (atomics), its failure history, and the backend's
//! per-queue state behind the submit lock.

use lock_api::{Mutex, RawMutex};

use crate::debug::trace::TraceStage;
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::history::{Admission, FailureHistory, HISTORY};
use crate::sync::{FenceError, Seqno, Timeline};

/// Where a fence stands, as its queue knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Done.
    Signalled,
    /// Abandoned, and why.
    Failed(FenceError),
    /// Not done yet.
    Pending,
    /// Done, at or before the point the application acknowledged: its
    /// answer is no longer kept.
    Acknowledged,
}

/// One queue.
pub(crate) struct QueueCore<R: RawMutex, Q> {
    /// The last completed sequence number (written by whoever reads the
    /// device; only moves forward).
    pub(crate) timeline: Timeline,
    /// The last emitted sequence number (written under `submit`).
    pub(crate) emitted: AtomicU64,
    /// With deferred doorbells (`engine::batch`): the last sequence
    /// number handed to the hardware; the ones after it, up to `emitted`,
    /// are held (written under `submit`; unused with the window off).
    pub(crate) published: AtomicU64,
    /// With deferred doorbells: when the oldest held submission was
    /// emitted (platform ns; meaningful while one is held; written under
    /// `submit`).
    pub(crate) held_since: AtomicU64,
    /// How far completion bookkeeping (trace spans, dependency and buffer
    /// reclaim) has followed the timeline.
    pub(crate) processed: AtomicU64,
    /// The newest failed sequence number, 0 with `failures` 0: lets status
    /// checks skip the history lock for work after every failure.
    history_top: AtomicU64,
    failures: AtomicU64,
    /// The acknowledged point: fences at or before it answer
    /// [`Outcome::Acknowledged`] (0: none, no fence is 0).
    floor: AtomicU64,
    history: Mutex<R, FailureHistory<HISTORY>>,
    /// The backend's state; holding this lock is holding the queue.
    pub(crate) submit: Mutex<R, Q>,
    /// Submissions staged for the trace, written under `submit`
    /// ([`TraceStage`]).
    pub(crate) trace_stage: TraceStage,
}

impl<R: RawMutex, Q> QueueCore<R, Q> {
    pub(crate) fn new(q: Q) -> Self {
        QueueCore {
            timeline: Timeline::new(0),
            emitted: AtomicU64::new(0),
            published: AtomicU64::new(0),
            held_since: AtomicU64::new(0),
            processed: AtomicU64::new(0),
            history_top: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            floor: AtomicU64::new(0),
            history: Mutex::new(FailureHistory::new()),
            submit: Mutex::new(q),
            trace_stage: TraceStage::new(),
        }
    }

    pub(crate) fn emitted(&self) -> Seqno {
        Seqno(self.emitted.load(Ordering::Acquire))
    }

    /// The last sequence number handed to the hardware (deferred
    /// doorbells only: see `published`).
    pub(crate) fn published(&self) -> Seqno {
        Seqno(self.published.load(Ordering::Acquire))
    }

    pub(crate) fn completed(&self) -> Seqno {
        self.timeline.completed()
    }

    /// Why `s` failed, if it did. Call after reading the timeline: a reset
    /// records the failure before it forces the timeline forward.
    pub(crate) fn failure(&self, s: Seqno) -> Option<FenceError> {
        if self.failures.load(Ordering::Acquire) == 0 {
            return None;
        }
        if s.is_after(Seqno(self.history_top.load(Ordering::Acquire))) {
            return None;
        }
        self.history.lock().lookup(s)
    }

    /// Where fence `s` stands: its failure if it has one, else signalled
    /// or pending. The timeline is read before the failure history: a
    /// reset records the failure before it forces the timeline, so a
    /// reader that sees the forced value also sees the failure.
    pub(crate) fn outcome(&self, s: Seqno) -> Outcome {
        let done = self.completed();
        if let Some(e) = self.failure(s) {
            return Outcome::Failed(e);
        }
        // After the lookup: an acknowledgement moves the floor before it
        // drops the records under it, so a fence whose record is gone is
        // seen under the floor here. (A failure found above answers as it
        // did before the acknowledgement: the answer does not change.)
        let floor = self.floor.load(Ordering::Acquire);
        if floor != 0 && !s.is_after(Seqno(floor)) {
            return Outcome::Acknowledged;
        }
        if s.is_signalled_by(done) {
            Outcome::Signalled
        } else {
            Outcome::Pending
        }
    }

    /// Takes the completions not processed yet, `(before, now]`: exactly
    /// one caller gets each range (trace spans, reclaim run once).
    pub(crate) fn claim(&self) -> Option<(Seqno, Seqno)> {
        let now = self.completed();
        let before = Seqno(self.processed.load(Ordering::Acquire));
        if now.is_after(before)
            && self.processed.compare_exchange(before.0, now.0, Ordering::AcqRel, Ordering::Acquire).is_ok()
        {
            Some((before, now))
        } else {
            None
        }
    }

    /// Whether the queue has never recorded a failure (its history then
    /// admits anything a dependency table can hold).
    #[inline]
    pub(crate) fn no_failures(&self) -> bool {
        self.failures.load(Ordering::Acquire) == 0
    }

    /// Whether a new submission fits in the failure history (see
    /// [`FailureHistory::admit`]); `waiters` counts the queue's pending
    /// submissions with waits (not the new one). The caller holds the
    /// submit lock (nothing else records pending work meanwhile).
    pub(crate) fn admit(&self, waiters: usize, waits: bool) -> Admission {
        if self.failures.load(Ordering::Acquire) == 0 {
            // Nothing recorded, and a full dependency table fits (checked
            // at compile time below `HISTORY`).
            return Admission::Admit;
        }
        self.history.lock().admit(self.completed(), waiters, waits)
    }

    /// Whether a submission fits however many submissions with waits are
    /// pending (the dependency table's capacity): no need to count them.
    pub(crate) fn admits_any(&self, waits: bool) -> bool {
        self.admit(crate::sync::deps::PENDING_WAITS, waits) == Admission::Admit
    }

    /// Acknowledges the outcomes of the queue's fences up to `upto`, or up
    /// to the completed point if that is earlier (pending work may still
    /// fail): their failure records are dropped and they answer
    /// [`Outcome::Acknowledged`] from then on. Returns the acknowledged
    /// point (it never moves back).
    pub(crate) fn acknowledge(&self, upto: Seqno) -> Seqno {
        let mut h = self.history.lock();
        let done = self.completed();
        let point = if upto.is_after(done) { done } else { upto };
        let old = Seqno(self.floor.load(Ordering::Acquire));
        if !point.is_after(old) {
            return old;
        }
        // The floor first: a reader that still finds a dropped record's
        // fence above the floor would take it for a success.
        self.floor.store(point.0, Ordering::Release);
        h.acknowledge(point);
        point
    }

    /// Calls `f` with each failed range the history keeps, oldest first,
    /// and returns the acknowledged point (0: none).
    pub(crate) fn failures(&self, f: &mut dyn FnMut(&crate::sync::history::FailedRange)) -> Seqno {
        if self.failures.load(Ordering::Acquire) != 0 {
            self.history.lock().ranges().for_each(f);
        }
        Seqno(self.floor.load(Ordering::Acquire))
    }

    /// How often the failure history merged ranges to make room (0 unless
    /// the admission bound is broken, see [`FailureHistory`]).
    pub(crate) fn history_merges(&self) -> u64 {
        if self.failures.load(Ordering::Acquire) == 0 {
            return 0;
        }
        self.history.lock().merges()
    }

    /// Takes and drops the history lock (loom models make their locks on
    /// first use, before sharing).
    #[cfg(loom)]
    pub(crate) fn warm_up_history_lock(&self) {
        drop(self.history.lock());
    }

    /// Fails the queue's pending work `(completed, emitted]` with `error`
    /// under its submit lock, after `observe` (a last reading of the
    /// device) ran under that lock too; `held`: the caller holds the lock
    /// already. A submission publishes its sequence number under the lock,
    /// so none is published between the reading of `emitted` here and the
    /// failure: a submitter that held the lock first is failed here, one
    /// that takes it afterwards must see why the queue failed (the caller
    /// makes that visible before the call, as a device loss's flag) and
    /// publish nothing. Returns the failed range, if any. Like the reset,
    /// it records the failure before it forces the timeline past it.
    pub(crate) fn fail_pending(
        &self,
        held: bool,
        error: FenceError,
        observe: impl FnOnce(),
    ) -> Option<(Seqno, Seqno)> {
        let _guard = if held { None } else { Some(self.submit.lock()) };
        observe();
        let (after, upto) = (self.completed(), self.emitted());
        if !upto.is_after(after) {
            return None;
        }
        self.record_failure(after, upto, error);
        self.timeline.force(upto);
        self.processed.store(upto.0, Ordering::Release);
        Some((after, upto))
    }

    /// Records that `(after, upto]` failed with `error`, before anyone can
    /// see the timeline pass it.
    pub(crate) fn record_failure(&self, after: Seqno, upto: Seqno, error: FenceError) {
        if !upto.is_after(after) {
            return;
        }
        let mut h = self.history.lock();
        h.record(after, upto, error);
        if let Some(top) = h.newest() {
            self.history_top.store(top.0, Ordering::Release);
        }
        self.failures.fetch_add(1, Ordering::AcqRel);
    }
}
