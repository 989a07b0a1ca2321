//! Cross-queue dependencies and deadlock rejection.
//!
//! A submission may make its engine wait (WAIT_MEM) for a fence of another
//! queue, including a fence that has not been emitted yet (wait before
//! signal). Engines run in order, so a submission on queue `q` at seqno `s`
//! also waits for everything before it on `q`. A new submission closes a
//! cycle when what it waits for, followed transitively through the waits
//! of pending submissions, needs its own queue to reach its own seqno: the
//! engines would then wait for each other forever. [`DepGraph::check`]
//! finds that before anything reaches the GPU and names the cycle.
//!
//! The search is a fixpoint over "the highest seqno needed per queue":
//! bounded by `QUEUES × PENDING` steps, no recursion, no allocation.

use core::fmt;

use heapless::Deque;

use super::seqno::{FenceId, QueueId, Seqno};

/// Most waits one submission can carry.
pub const MAX_WAITS: usize = 4;

/// Submissions with cross-queue waits tracked per queue (deadlock checks):
/// the depth of a device's dependency graph.
pub const PENDING_WAITS: usize = 32;
/// Submissions a reported cycle names (a cycle through refgpu's three
/// queues has at most three; longer ones, with more queues, are detected
/// all the same and named by their first four).
pub const MAX_CYCLE: usize = 4;

/// A wait cycle: `fences[0]` is the rejected submission; each entry waits
/// (directly or by queue order) for the queue of the next, and the last
/// waits for `fences[0]`'s queue at or after `fences[0]`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Cycle {
    fences: [FenceId; MAX_CYCLE],
    len: usize,
}

impl Cycle {
    /// The submissions in the cycle, starting with the rejected one.
    pub fn fences(&self) -> &[FenceId] {
        self.fences.get(..self.len).unwrap_or(&[])
    }
}

impl fmt::Debug for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, fence) in self.fences().iter().enumerate() {
            if i > 0 {
                write!(f, " waits for ")?;
            }
            write!(f, "{fence}")?;
        }
        if let Some(first) = self.fences().first() {
            write!(f, " waits for {first}")?;
        }
        Ok(())
    }
}

/// Why a dependency could not be recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DepError {
    /// The submission would deadlock the engines.
    Cycle(Cycle),
    /// More than [`MAX_WAITS`] waits.
    TooManyWaits {
        /// Waits given.
        given: usize,
    },
    /// The queue already tracks `PENDING` submissions with waits.
    Full {
        /// The queue.
        queue: QueueId,
    },
    /// A queue index outside the graph.
    UnknownQueue {
        /// The queue.
        queue: QueueId,
    },
}

#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    seqno: Seqno,
    waits: [FenceId; MAX_WAITS],
    nwaits: usize,
}

impl Entry {
    fn waits(&self) -> &[FenceId] {
        self.waits.get(..self.nwaits).unwrap_or(&[])
    }
}

/// Pending submissions with waits, per queue, oldest first.
#[derive(Debug)]
pub struct DepGraph<const QUEUES: usize, const PENDING: usize> {
    pending: [Deque<Entry, PENDING>; QUEUES],
}

impl<const QUEUES: usize, const PENDING: usize> Default for DepGraph<QUEUES, PENDING> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const QUEUES: usize, const PENDING: usize> DepGraph<QUEUES, PENDING> {
    /// An empty graph.
    pub const fn new() -> Self {
        DepGraph { pending: [const { Deque::new() }; QUEUES] }
    }

    /// Pending entries of queue `q`, oldest first.
    fn pending(&self, q: usize) -> impl Iterator<Item = &Entry> {
        self.pending.get(q).into_iter().flat_map(|d| d.iter())
    }

    /// Submissions with waits tracked on `queue`.
    pub fn tracked(&self, queue: QueueId) -> usize {
        self.pending.get(usize::from(queue.0)).map_or(0, Deque::len)
    }

    /// Whether `queue` can record one more submission with waits.
    pub fn has_room(&self, queue: QueueId) -> bool {
        self.pending.get(usize::from(queue.0)).is_some_and(|d| !d.is_full())
    }

    /// Would a submission on `queue` at `seqno` waiting for `waits`
    /// deadlock? `completed(q)` is each queue's completed value.
    pub fn check(
        &self,
        queue: QueueId,
        seqno: Seqno,
        waits: &[FenceId],
        completed: impl Fn(QueueId) -> Seqno,
    ) -> Result<(), DepError> {
        let qi = usize::from(queue.0);
        if qi >= QUEUES {
            return Err(DepError::UnknownQueue { queue });
        }
        if waits.len() > MAX_WAITS {
            return Err(DepError::TooManyWaits { given: waits.len() });
        }
        // need[q]: highest seqno on q the new submission transitively waits
        // for; via[q]: the pending submission whose wait raised it (None:
        // the new submission itself).
        let mut need: [Option<Seqno>; QUEUES] = [None; QUEUES];
        let mut via: [Option<FenceId>; QUEUES] = [None; QUEUES];
        for w in waits {
            let wq = usize::from(w.queue.0);
            let Some(n) = need.get_mut(wq) else {
                return Err(DepError::UnknownQueue { queue: w.queue });
            };
            if n.is_none_or(|cur| w.seqno.is_after(cur)) {
                *n = Some(w.seqno);
            }
        }
        // Each round raises at least one need or stops; a need can only be
        // raised by a pending entry, so QUEUES * PENDING + 1 rounds suffice.
        let rounds = QUEUES.saturating_mul(PENDING).saturating_add(1);
        for _ in 0..rounds {
            let mut changed = false;
            for q in 0..QUEUES {
                let Some(upto) = need.get(q).copied().flatten() else { continue };
                let done = completed(QueueId(q as u8));
                for e in self.pending(q) {
                    if !e.seqno.is_after(done) || e.seqno.is_after(upto) {
                        continue;
                    }
                    for w in e.waits() {
                        let wq = usize::from(w.queue.0);
                        if let (Some(n), Some(v)) = (need.get_mut(wq), via.get_mut(wq)) {
                            if n.is_none_or(|cur| w.seqno.is_after(cur)) {
                                *n = Some(w.seqno);
                                *v = Some(FenceId { queue: QueueId(q as u8), seqno: e.seqno });
                                changed = true;
                            }
                        }
                    }
                }
            }
            if !changed {
                break;
            }
        }
        match need.get(qi).copied().flatten() {
            Some(n) if seqno.is_signalled_by(n) => Err(DepError::Cycle(self.name_cycle(queue, seqno, &via))),
            _ => Ok(()),
        }
    }

    /// Walks `via` back from the new submission's queue to name the cycle.
    fn name_cycle(&self, queue: QueueId, seqno: Seqno, via: &[Option<FenceId>; QUEUES]) -> Cycle {
        let mut back = [FenceId::default(); MAX_CYCLE];
        let mut n = 0;
        let mut q = usize::from(queue.0);
        while n < MAX_CYCLE.saturating_sub(1) {
            match via.get(q).copied().flatten() {
                Some(f) => {
                    if let Some(slot) = back.get_mut(n) {
                        *slot = f;
                    }
                    n = n.saturating_add(1);
                    q = usize::from(f.queue.0);
                    if q == usize::from(queue.0) {
                        break;
                    }
                }
                None => break,
            }
        }
        // `back` lists waiters from the closing one back to the first; the
        // cycle reads new -> first waiter's queue ... -> closing waiter.
        let mut fences = [FenceId::default(); MAX_CYCLE];
        if let Some(first) = fences.first_mut() {
            *first = FenceId { queue, seqno };
        }
        let mut len = 1;
        for f in back.iter().take(n).rev() {
            if let Some(slot) = fences.get_mut(len) {
                *slot = *f;
                len = len.saturating_add(1);
            }
        }
        Cycle { fences, len }
    }

    /// Records a submission's waits (call after [`DepGraph::check`]
    /// passed, before the submission reaches the ring, under the same
    /// lock). Submissions without waits need no entry.
    pub fn record(&mut self, queue: QueueId, seqno: Seqno, waits: &[FenceId]) -> Result<(), DepError> {
        if waits.is_empty() {
            return Ok(());
        }
        if waits.len() > MAX_WAITS {
            return Err(DepError::TooManyWaits { given: waits.len() });
        }
        let d = self.pending.get_mut(usize::from(queue.0)).ok_or(DepError::UnknownQueue { queue })?;
        let mut entry = Entry { seqno, nwaits: waits.len(), ..Entry::default() };
        for (dst, w) in entry.waits.iter_mut().zip(waits) {
            *dst = *w;
        }
        d.push_back(entry).map_err(|_| DepError::Full { queue })
    }

    /// Takes back the entry [`DepGraph::record`] made for `queue`'s newest
    /// submission `seqno` (the submission did not reach the GPU).
    pub fn unrecord(&mut self, queue: QueueId, seqno: Seqno) {
        if let Some(d) = self.pending.get_mut(usize::from(queue.0)) {
            if d.back().is_some_and(|e| e.seqno == seqno) {
                d.pop_back();
            }
        }
    }

    /// The first `Some` that `f(consumer, producer)` returns, over every
    /// pending submission (`consumer`) and each fence it waits on
    /// (`producer`), in queue and submission order: e.g. the work that
    /// inherits a producer's failure.
    pub fn find_waiter<T>(&self, mut f: impl FnMut(FenceId, FenceId) -> Option<T>) -> Option<T> {
        for (q, d) in self.pending.iter().enumerate() {
            for e in d.iter() {
                let consumer = FenceId { queue: QueueId(q as u8), seqno: e.seqno };
                if let Some(t) = e.waits().iter().find_map(|w| f(consumer, *w)) {
                    return Some(t);
                }
            }
        }
        None
    }

    /// The unsignalled fence of another queue that `queue`'s next
    /// submission (the one after `completed`) waits for, if any: the engine
    /// is then blocked on purpose, and a hang is the other queue's.
    pub fn blocked_on(
        &self,
        queue: QueueId,
        completed: Seqno,
        completed_of: impl Fn(QueueId) -> Seqno,
    ) -> Option<FenceId> {
        let next = completed.next();
        self.pending(usize::from(queue.0))
            .find(|e| e.seqno == next)
            .and_then(|e| e.waits().iter().find(|w| !w.is_signalled_by(completed_of(w.queue))).copied())
    }

    /// How far `queue`'s timeline may be believed when it reads `seen`:
    /// just below the oldest pending submission up to `seen` that waits for
    /// a fence `resolved` does not hold yet (work can not complete before
    /// what it waits for; a timeline that says so passed failed work whose
    /// failure is not known yet).
    pub fn cap(&self, queue: QueueId, seen: Seqno, resolved: impl Fn(FenceId) -> bool) -> Seqno {
        self.pending(usize::from(queue.0))
            .take_while(|e| e.seqno.is_signalled_by(seen))
            .find(|e| e.waits().iter().any(|w| !resolved(*w)))
            .map_or(seen, |e| Seqno(e.seqno.0.wrapping_sub(1)))
    }

    /// Forgets `queue`'s entries that `completed` covers (oldest first,
    /// stopping at the first pending one).
    pub fn retire(&mut self, queue: QueueId, completed: Seqno) {
        if let Some(d) = self.pending.get_mut(usize::from(queue.0)) {
            while d.pop_front_if(|e| e.seqno.is_signalled_by(completed)).is_some() {}
        }
    }

    /// Forgets every entry of `queue` (after a reset completed them all).
    pub fn clear(&mut self, queue: QueueId) {
        if let Some(d) = self.pending.get_mut(usize::from(queue.0)) {
            d.clear();
        }
    }
}
