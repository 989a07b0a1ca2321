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
pub(crate) use wide::AtomicU64;

/// The 64-bit atomic the core uses outside loom: portable-atomic's, behind
/// methods that are kept out of line where the CPU has no native 64-bit
/// atomics. There every operation is a sequence lock's read or write loop
/// (about 100 to 200 bytes of Thumb code); inlined at each of the few dozen
/// uses it was the largest single item of the embedded footprint
/// (`docs/perf.md`, "Code size on embedded targets"). Where the atomics are
/// native each method is one instruction or a short loop and stays inline.
#[cfg(not(loom))]
mod wide {
    use core::sync::atomic::Ordering;

    /// A `u64` shared between threads (see the module above).
    #[derive(Debug, Default)]
    #[repr(transparent)]
    pub(crate) struct AtomicU64(portable_atomic::AtomicU64);

    // Native 64-bit atomics: each method is portable-atomic's, inline.
    #[cfg(target_has_atomic = "64")]
    impl AtomicU64 {
        /// Holding `v`.
        #[inline]
        pub(crate) const fn new(v: u64) -> Self {
            AtomicU64(portable_atomic::AtomicU64::new(v))
        }

        /// See [`portable_atomic::AtomicU64::load`].
        #[inline]
        pub(crate) fn load(&self, order: Ordering) -> u64 {
            self.0.load(order)
        }

        /// See [`portable_atomic::AtomicU64::store`].
        #[inline]
        pub(crate) fn store(&self, v: u64, order: Ordering) {
            self.0.store(v, order)
        }

        /// See [`portable_atomic::AtomicU64::fetch_add`].
        #[inline]
        pub(crate) fn fetch_add(&self, v: u64, order: Ordering) -> u64 {
            self.0.fetch_add(v, order)
        }

        /// See [`portable_atomic::AtomicU64::fetch_max`].
        #[inline]
        pub(crate) fn fetch_max(&self, v: u64, order: Ordering) -> u64 {
            self.0.fetch_max(v, order)
        }

        /// See [`portable_atomic::AtomicU64::compare_exchange`].
        #[inline]
        pub(crate) fn compare_exchange(
            &self,
            current: u64,
            new: u64,
            success: Ordering,
            failure: Ordering,
        ) -> Result<u64, u64> {
            self.0.compare_exchange(current, new, success, failure)
        }

        /// See [`portable_atomic::AtomicU64::compare_exchange_weak`].
        #[inline]
        pub(crate) fn compare_exchange_weak(
            &self,
            current: u64,
            new: u64,
            success: Ordering,
            failure: Ordering,
        ) -> Result<u64, u64> {
            self.0.compare_exchange_weak(current, new, success, failure)
        }
    }

    // No native 64-bit atomics: load and exchange are one out-of-line copy
    // each of the lock-based fallback, always with `SeqCst`; store, add and
    // max are one out-of-line exchange loop each over those two. The strongest ordering
    // satisfies every caller's, and a constant one leaves the shared copy
    // no invalid-ordering (panicking) branch: portable-atomic checks the
    // ordering of loads, stores and exchanges, which only folds away where
    // the caller's constant ordering is inlined. A weak exchange is the
    // strong one (a valid weak exchange; one copy of the loop).
    #[cfg(not(target_has_atomic = "64"))]
    impl AtomicU64 {
        /// Holding `v`.
        #[inline]
        pub(crate) const fn new(v: u64) -> Self {
            AtomicU64(portable_atomic::AtomicU64::new(v))
        }

        /// See [`portable_atomic::AtomicU64::load`] (`SeqCst`, see above).
        #[cfg(not(feature = "size-first"))]
        #[inline(never)]
        pub(crate) fn load(&self, _order: Ordering) -> u64 {
            self.0.load(Ordering::SeqCst)
        }

        /// See [`portable_atomic::AtomicU64::load`] (`SeqCst`). With
        /// `size-first`, the build that puts code size before speed, a
        /// load is an exchange of 0 for 0, which leaves the value as it is
        /// and returns it either way: the fallback's optimistic read (about
        /// 230 bytes on Cortex-M4) is not linked, at the price of taking
        /// the fallback's lock on every load.
        #[cfg(feature = "size-first")]
        #[inline(never)]
        pub(crate) fn load(&self, _order: Ordering) -> u64 {
            match self.compare_exchange(0, 0, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(v) | Err(v) => v,
            }
        }

        /// See [`portable_atomic::AtomicU64::store`] (`SeqCst`; an
        /// exchange loop, see [`AtomicU64::update`]).
        #[inline(never)]
        pub(crate) fn store(&self, v: u64, _order: Ordering) {
            self.update(|_| v);
        }

        /// See [`portable_atomic::AtomicU64::fetch_add`] (`SeqCst`; an
        /// exchange loop).
        #[inline(never)]
        pub(crate) fn fetch_add(&self, v: u64, _order: Ordering) -> u64 {
            self.update(|cur| cur.wrapping_add(v))
        }

        /// See [`portable_atomic::AtomicU64::fetch_max`] (`SeqCst`; an
        /// exchange loop).
        #[inline(never)]
        pub(crate) fn fetch_max(&self, v: u64, _order: Ordering) -> u64 {
            self.update(|cur| cur.max(v))
        }

        /// Replaces the value `cur` with `f(cur)` atomically and returns
        /// `cur`: a load, then exchanges until one finds the value it was
        /// computed from. Stores and read-modify-writes are built on the
        /// two shared copies of the fallback (load, exchange) rather than
        /// each carrying its own copy of the sequence lock's write loop.
        #[inline]
        fn update(&self, f: impl Fn(u64) -> u64) -> u64 {
            let mut cur = self.load(Ordering::SeqCst);
            loop {
                match self.compare_exchange(cur, f(cur), Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(prev) => return prev,
                    Err(now) => cur = now,
                }
            }
        }

        /// See [`portable_atomic::AtomicU64::compare_exchange`] (`SeqCst`).
        #[inline(never)]
        pub(crate) fn compare_exchange(
            &self,
            current: u64,
            new: u64,
            _success: Ordering,
            _failure: Ordering,
        ) -> Result<u64, u64> {
            self.0.compare_exchange(current, new, Ordering::SeqCst, Ordering::SeqCst)
        }

        /// See [`portable_atomic::AtomicU64::compare_exchange_weak`]: the
        /// strong exchange here (see above).
        #[inline]
        pub(crate) fn compare_exchange_weak(
            &self,
            current: u64,
            new: u64,
            success: Ordering,
            failure: Ordering,
        ) -> Result<u64, u64> {
            self.compare_exchange(current, new, success, failure)
        }
    }
}

/// A pause hint inside spin loops (loom: a yield so the checker moves on).
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}

/// The lock the loom models run the real lock-holding types over
/// (`crate::loom_probe`, and the async waits' wake-up hub under loom).
#[cfg(loom)]
mod loom_lock {
    use core::cell::UnsafeCell;

    use loom::sync::atomic::{AtomicBool, Ordering};

    /// A spin lock on a loom atomic (so loom sees its acquire/release edges),
    /// which yields to loom's scheduler while it waits (also the lock of the
    /// async waits' wake-up hub under loom, `engine::Wakeups`). Loom atomics are not
    /// `const`, so the flag is made on first use: [`ProbeQueue::new`] takes
    /// the lock once before any thread is spawned.
    pub struct LoomLock(UnsafeCell<Option<AtomicBool>>);

    // SAFETY: the cell is written once, by the first `lock` on the thread that
    // made the queue before sharing it (`ProbeQueue::new`); afterwards it is
    // only read, and the flag inside is an atomic.
    unsafe impl Sync for LoomLock {}
    // SAFETY: as above.
    unsafe impl Send for LoomLock {}

    impl LoomLock {
        fn flag(&self) -> &AtomicBool {
            // SAFETY: see the `Sync` impl: the only write happens before the
            // lock is shared.
            let slot = unsafe { &mut *self.0.get() };
            slot.get_or_insert_with(|| AtomicBool::new(false))
        }
    }

    // SAFETY: mutual exclusion by compare-and-swap on the flag (acquire on
    // success, release on unlock); `unlock` only after a successful
    // `lock`/`try_lock` (lock_api's contract).
    unsafe impl lock_api::RawMutex for LoomLock {
        #[allow(clippy::declare_interior_mutable_const)]
        const INIT: LoomLock = LoomLock(UnsafeCell::new(None));
        type GuardMarker = lock_api::GuardSend;

        fn lock(&self) {
            while !self.try_lock() {
                loom::thread::yield_now();
            }
        }

        fn try_lock(&self) -> bool {
            self.flag().compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok()
        }

        unsafe fn unlock(&self) {
            self.flag().store(false, Ordering::Release);
        }
    }
}
#[cfg(loom)]
pub use loom_lock::LoomLock;
