//! Fence-gated reuse: frees that wait until the GPU is done.
//!
//! The CPU may drop its last reference to memory while commands that use it
//! are still queued. Such a free is *deferred*: the item is kept with the fence
//! (queue, seqno) of the last submission that used it and only handed back to
//! its pool once that fence has signalled.
//!
//! Each queue's timeline is monotonic, so a FIFO per queue is ordered by
//! seqno (oldest first). Reclaiming walks from the oldest entry and stops at
//! the first one that has not signalled, as Mesa's BO caches do: the rest are
//! newer and cannot have signalled either. If a caller pushes an older seqno
//! after a newer one, that entry is merely reclaimed late, never early.
//! Comparisons are wrap-safe ([`Seqno::is_signalled_by`]).

use core::fmt;

use crate::sync::seqno::{FenceId, Seqno};

/// Why a deferred free was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeferredError {
    /// The FIFO is full: reclaim (or wait for the GPU) first.
    Full,
    /// The fence names a queue this pool does not track.
    BadQueue,
}

impl fmt::Display for DeferredError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeferredError::Full => "deferred-free queue is full",
            DeferredError::BadQueue => "fence queue id out of range",
        })
    }
}

/// A bounded FIFO of `(fence, item)` pairs for one queue, capacity `N`.
pub struct DeferredFifo<T, const N: usize> {
    slots: [Option<(FenceId, T)>; N],
    head: usize,
    len: usize,
}

impl<T, const N: usize> Default for DeferredFifo<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T, const N: usize> DeferredFifo<T, N> {
    /// An empty FIFO.
    pub const fn new() -> Self {
        DeferredFifo { slots: [const { None }; N], head: 0, len: 0 }
    }

    #[inline]
    fn wrap(i: usize) -> usize {
        i.checked_rem(N).unwrap_or(0)
    }

    /// Number of waiting entries.
    pub const fn len(&self) -> usize {
        self.len
    }

    /// True when nothing waits.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when a push would fail.
    pub const fn is_full(&self) -> bool {
        self.len >= N
    }

    /// Appends `item` to wait for `fence`. O(1). On a full FIFO the item is
    /// handed back with the error, so nothing is lost.
    pub fn push(&mut self, fence: FenceId, item: T) -> Result<(), (DeferredError, T)> {
        if self.is_full() {
            return Err((DeferredError::Full, item));
        }
        // head < N and len < N, so the sum is below 2N and cannot overflow.
        let tail = Self::wrap(self.head.wrapping_add(self.len));
        match self.slots.get_mut(tail) {
            Some(slot) => {
                *slot = Some((fence, item));
                self.len = self.len.wrapping_add(1);
                Ok(())
            }
            None => Err((DeferredError::Full, item)),
        }
    }

    /// The oldest entry's fence, if any.
    pub fn oldest(&self) -> Option<FenceId> {
        if self.len == 0 {
            return None;
        }
        self.slots.get(self.head).and_then(|s| s.as_ref().map(|(f, _)| *f))
    }

    /// Removes and returns the oldest entry if its fence is signalled by
    /// `completed`. O(1).
    pub fn pop_signalled(&mut self, completed: Seqno) -> Option<(FenceId, T)> {
        let f = self.oldest()?;
        if !f.is_signalled_by(completed) {
            return None;
        }
        let e = self.slots.get_mut(self.head)?.take();
        self.head = Self::wrap(self.head.wrapping_add(1));
        self.len = self.len.wrapping_sub(1);
        e
    }

    /// Removes every entry regardless of fences (device reset or teardown:
    /// the GPU is known to be idle), oldest first, handing each to `f`.
    /// O(N).
    pub fn drain(&mut self, mut f: impl FnMut(FenceId, T)) {
        for _ in 0..N {
            if self.len == 0 {
                break;
            }
            if let Some((fence, item)) = self.slots.get_mut(self.head).and_then(Option::take) {
                f(fence, item);
            }
            self.head = Self::wrap(self.head.wrapping_add(1));
            self.len = self.len.wrapping_sub(1);
        }
    }

    /// Calls `f` on every waiting entry, oldest first. O(N).
    pub fn for_each(&self, mut f: impl FnMut(FenceId, &T)) {
        let mut i = self.head;
        for _ in 0..self.len.min(N) {
            if let Some(Some((fence, item))) = self.slots.get(i) {
                f(*fence, item);
            }
            i = Self::wrap(i.wrapping_add(1));
        }
    }
}
