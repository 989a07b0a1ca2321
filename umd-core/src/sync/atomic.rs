//! The atomics the core shares between a submitter and an interrupt
//! handler or another thread: `core`'s normally, loom's under `--cfg loom`
//! so the model checker can explore every interleaving.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

// Targets without native 64-bit atomics (thumbv7em) get portable-atomic's
// lock-based fallback: correct between threads, but not safe to use from an
// interrupt handler that can preempt a holder of the lock on the same core.
// `docs/porting.md` says so; on those targets call `Device::service` from
// task context.
#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};
#[cfg(not(loom))]
pub(crate) use portable_atomic::AtomicU64;

/// A pause hint inside spin loops (loom: a yield so the checker moves on).
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}
