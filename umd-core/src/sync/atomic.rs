//! The atomics the core shares between a submitter and an interrupt
//! handler or another thread: `core`'s normally, loom's under `--cfg loom`
//! so the model checker can explore every interleaving.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicU64, Ordering};

/// A pause hint inside spin loops (loom: a yield so the checker moves on).
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}
