//! The raw lock behind the core's locks on Linux ([`FairLock`]).
//!
//! An unfair spin lock lets a thread that releases the lock and takes it
//! again at once (a loop of allocations and frees) win over a thread that
//! has been waiting: measured against a thread looping alloc/free, single
//! allocations of another thread waited for seconds. A ticket lock serves
//! waiters in the order they came, so a call waits for at most one hold
//! per thread ahead of it. Waiters yield the CPU between looks, so a
//! holder that was descheduled (more threads than cores) gets to run and
//! release.

/// The relax step of [`FairLock`]: gives the CPU to another thread.
#[derive(Debug)]
pub struct YieldNow;

impl spin::relax::RelaxStrategy for YieldNow {
    #[inline]
    fn relax() {
        std::thread::yield_now();
    }
}

/// A fair (first come, first served) raw lock: spin's ticket lock, yielding
/// while it waits. [`umd_core::platform::Platform::RawMutex`] of
/// [`crate::InProcess`], [`crate::Cosim`] and the DRM platform.
pub type FairLock = spin::mutex::TicketMutex<(), YieldNow>;

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::YieldNow;

    /// Set by a waiter that found the lock taken and is queued for it.
    static QUEUED: AtomicBool = AtomicBool::new(false);

    /// [`YieldNow`], noting that a thread waits: the test releases the
    /// lock only once its waiter is queued, however loaded the machine.
    struct NoteWaiting;

    impl spin::relax::RelaxStrategy for NoteWaiting {
        fn relax() {
            QUEUED.store(true, Ordering::Release);
            <YieldNow as spin::relax::RelaxStrategy>::relax();
        }
    }

    /// Cycles in which a thread releasing the lock, with another thread
    /// queued for it, finds it taken when it tries to take it back at
    /// once (the lock went to the waiter), out of `cycles`.
    fn handovers<L: lock_api::RawMutex + Send + Sync>(cycles: usize) -> usize {
        let mut handed = 0;
        for _ in 0..cycles {
            let m = lock_api::Mutex::<L, ()>::new(());
            // The waiter keeps the lock until the holder has tried to take
            // it back, so the try meets the waiter's turn, never a lock the
            // waiter already gave up again.
            let tried = AtomicBool::new(false);
            QUEUED.store(false, Ordering::Release);
            let g = m.lock();
            std::thread::scope(|s| {
                s.spawn(|| {
                    let g = m.lock();
                    while !tried.load(Ordering::Acquire) {
                        std::thread::yield_now();
                    }
                    drop(g);
                });
                while !QUEUED.load(Ordering::Acquire) {
                    std::thread::yield_now();
                }
                drop(g);
                match m.try_lock() {
                    None => handed += 1,
                    Some(g) => drop(g),
                }
                tried.store(true, Ordering::Release);
            });
        }
        handed
    }

    /// A thread that releases the lock and takes it again at once (a loop
    /// of buffer calls) never goes before a thread already queued: the
    /// starvation an unfair lock allows. Counted, not timed. The lock is
    /// [`super::FairLock`]'s ticket lock with a relax step that notes the
    /// waiter (the order of service is the lock's, not the relax
    /// step's); spin's unfair lock hands over in few cycles.
    #[test]
    fn a_released_lock_goes_to_the_thread_waiting_not_back_to_its_holder() {
        let cycles = 100;
        let fair = handovers::<spin::mutex::TicketMutex<(), NoteWaiting>>(cycles);
        assert_eq!(fair, cycles, "the ticket lock went back to its holder with a waiter queued");
    }

    /// The platforms' locks are this one (a compile-time check).
    #[cfg(feature = "model")]
    #[test]
    fn the_linux_platforms_use_the_fair_lock() {
        fn fair<P: umd_core::platform::Platform<RawMutex = super::FairLock>>() {}
        fair::<crate::InProcess>();
        fair::<crate::Cosim>();
    }
}
