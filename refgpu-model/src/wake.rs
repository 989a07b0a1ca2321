//! Sleeping without losing wake-ups.
//!
//! [`Waker`] is a sequence counter with a condition variable: a thread that
//! wants to sleep until "something happened" samples [`Waker::seq`], checks
//! its condition, then calls [`Waker::wait`] with the sampled value; any
//! [`Waker::wake`] after the sample ends the wait. Every wait also has a
//! timeout, so a missed external event (another process writing shared
//! memory, which no waker sees) only costs one re-check interval.
//!
//! The model has two wakers per engine (doorbell, reset, enable, injection
//! changes; and one that says a reset has completed) and one for memory (every memory write made through the model,
//! used by WAIT_MEM).
//!
//! With the `shm` feature a waker can also sleep in `poll(2)` on a file
//! descriptor (an engine's doorbell eventfd, see the `bell` module) together
//! with the waker's own eventfd, so that an engine thread is woken by the
//! host's doorbell directly, without a server thread in between.

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
    /// Written by [`Waker::wake`] while someone sleeps in
    /// [`Waker::wait_or_fd`].
    #[cfg(feature = "shm")]
    efd: std::sync::OnceLock<std::os::fd::OwnedFd>,
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
            #[cfg(feature = "shm")]
            if let Some(fd) = self.efd.get() {
                // A full counter (never in practice) still reads as ready.
                let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
            }
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

#[cfg(feature = "shm")]
impl Waker {
    /// Gives the waker an eventfd so that [`Waker::wait_or_fd`] can sleep
    /// in `poll(2)`. Idempotent.
    pub fn enable_fd(&self) -> std::io::Result<()> {
        use rustix::event::{eventfd, EventfdFlags};
        if self.efd.get().is_none() {
            let fd = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?;
            // Lost race: the other thread's eventfd is as good.
            let _ = self.efd.set(fd);
        }
        Ok(())
    }

    /// Sleeps until the sequence number differs from `seen`, `fd` becomes
    /// readable or `timeout` passes (spurious returns are allowed; callers
    /// re-check). Without [`Waker::enable_fd`] it only watches `fd`.
    pub fn wait_or_fd(&self, seen: u64, fd: std::os::fd::BorrowedFd<'_>, timeout: Duration) {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let ts = Timespec {
            tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        if self.seq.load(Ordering::SeqCst) == seen {
            match self.efd.get() {
                Some(efd) => {
                    let mut fds = [PollFd::new(efd, PollFlags::IN), PollFd::new(&fd, PollFlags::IN)];
                    // EINTR or another error: a spurious return.
                    let _ = poll(&mut fds, Some(&ts));
                    if !fds[0].revents().is_empty() {
                        let mut b = [0u8; 8];
                        let _ = rustix::io::read(efd, &mut b);
                    }
                }
                None => {
                    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
                    let _ = poll(&mut fds, Some(&ts));
                }
            }
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}
