//! A queue's completed-fence value, shared between whoever observes the
//! device (the waiter polling the fence slot, an interrupt handler) and
//! whoever reads it (waiters, the reclaim paths).
//!
//! The value only moves forward, wrap-safe: [`Timeline::advance`] is a CAS
//! loop that never moves it back, so two observers racing with an old and a
//! new reading leave the new one.

use super::atomic::{AtomicU64, Ordering};
use super::seqno::Seqno;

/// The completed value of one queue.
#[derive(Debug)]
pub struct Timeline {
    completed: AtomicU64,
}

impl Timeline {
    /// A timeline that has completed `start`.
    #[cfg(not(loom))]
    pub const fn new(start: u64) -> Timeline {
        Timeline { completed: AtomicU64::new(start) }
    }

    /// A timeline that has completed `start` (loom atomics are not const).
    #[cfg(loom)]
    pub fn new(start: u64) -> Timeline {
        Timeline { completed: AtomicU64::new(start) }
    }

    /// The last completed value (acquire: fence-protected data written by
    /// the device before the fence is visible after this).
    #[inline]
    pub fn completed(&self) -> Seqno {
        Seqno(self.completed.load(Ordering::Acquire))
    }

    /// Records that `seen` has completed, if it is newer than what is
    /// recorded. Returns the value now recorded. Bounded: each failed CAS
    /// means another observer moved it forward, and it can only move
    /// forward a bounded number of times per call site reading the device.
    pub fn advance(&self, seen: Seqno) -> Seqno {
        let mut cur = self.completed.load(Ordering::Acquire);
        loop {
            if !seen.is_after(Seqno(cur)) {
                return Seqno(cur);
            }
            match self.completed.compare_exchange_weak(cur, seen.0, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return seen,
                Err(now) => cur = now,
            }
        }
    }

    /// Forces the value (queue reset: pending fences are completed, with
    /// an error recorded elsewhere). Only moves forward too.
    pub fn force(&self, value: Seqno) -> Seqno {
        self.advance(value)
    }
}
