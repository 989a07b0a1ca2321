//! Sleeping without losing wake-ups.
//!
//! [`Waker`] is a sequence counter with a condition variable: a thread that
//! wants to sleep until "something happened" samples [`Waker::seq`], checks
//! its condition, then calls [`Waker::wait`] with the sampled value; any
//! [`Waker::wake`] after the sample ends the wait. Every wait also has a
//! timeout, so a missed external event (another process writing shared
//! memory, which no waker sees) only costs one re-check interval.
//!
//! The model has one waker per engine (doorbell, reset, enable, injection
//! changes) and one for memory (every memory write made through the model,
//! used by WAIT_MEM).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// A wake-up counter with a condition variable.
#[derive(Default)]
pub struct Waker {
    seq: AtomicU64,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Waker {
    /// The current sequence number; pass it to [`Waker::wait`].
    pub fn seq(&self) -> u64 {
        self.seq.load(Ordering::SeqCst)
    }

    /// Wakes every thread waiting on a sequence number older than now.
    pub fn wake(&self) {
        self.seq.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) != 0 {
            // A poisoned lock only means a waiter panicked; the unit value
            // it protects can not be inconsistent.
            let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.cv.notify_all();
        }
    }

    /// Sleeps until the sequence number differs from `seen` or `timeout`
    /// passes (spurious returns are allowed; callers re-check).
    pub fn wait(&self, seen: u64, timeout: Duration) {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        {
            let g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            if self.seq.load(Ordering::SeqCst) == seen {
                let _ = self.cv.wait_timeout(g, timeout);
            }
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}
