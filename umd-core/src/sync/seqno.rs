//! Wrap-safe fence sequence numbers.
//!
//! Every queue has a timeline: a 64-bit counter the GPU writes with the FENCE
//! packet as it completes work. A fence is "signalled" once the completed
//! value has reached the fence's value. Comparing with `>=` would break when
//! the counter wraps, so all comparisons here use the signed distance
//! `(a - b) as i64`, as Asahi's `event.rs` and the Linux `dma_fence` helpers
//! do: two values compare correctly as long as they are less than 2^63 apart.

use core::cmp::Ordering;
use core::fmt;

/// A value on one queue's timeline.
///
/// Ordering is wrap-safe, which is why this type deliberately does not
/// implement [`Ord`]: use [`Seqno::cmp_wrapping`] or the helpers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Seqno(pub u64);

impl Seqno {
    /// Signed distance `self - other` on the circle of 2^64 values.
    #[inline]
    pub const fn distance(self, other: Seqno) -> i64 {
        // Reinterpreting the wrapped difference as two's complement is the
        // whole point of the comparison.
        self.0.wrapping_sub(other.0) as i64
    }

    /// Wrap-safe three-way comparison.
    #[inline]
    pub const fn cmp_wrapping(self, other: Seqno) -> Ordering {
        let d = self.distance(other);
        if d > 0 {
            Ordering::Greater
        } else if d < 0 {
            Ordering::Less
        } else {
            Ordering::Equal
        }
    }

    /// True when `self` comes strictly after `other` on the timeline.
    #[inline]
    pub const fn is_after(self, other: Seqno) -> bool {
        self.distance(other) > 0
    }

    /// True when a fence with this value is signalled once the queue has
    /// completed `completed` (that is, `completed >= self`, wrap-safe).
    #[inline]
    pub const fn is_signalled_by(self, completed: Seqno) -> bool {
        completed.distance(self) >= 0
    }

    /// The next value on the timeline (wraps from `u64::MAX` to 0).
    #[inline]
    pub const fn next(self) -> Seqno {
        Seqno(self.0.wrapping_add(1))
    }
}

impl fmt::Display for Seqno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Identifies a hardware queue (an engine of the GPU): [`QueueId::GFX`],
/// [`QueueId::COMPUTE`], [`QueueId::COPY`] on refgpu (the uAPI's engine
/// numbers, `refgpu_uapi::engine`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct QueueId(pub u8);

impl QueueId {
    /// The graphics queue (engine 0).
    pub const GFX: QueueId = QueueId(0);
    /// The compute queue (engine 1), the only one that runs DISPATCH.
    pub const COMPUTE: QueueId = QueueId(1);
    /// The copy queue (engine 2): the device's moves between local and
    /// system memory run on it.
    pub const COPY: QueueId = QueueId(2);
}

impl fmt::Display for QueueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "q{}", self.0)
    }
}

/// A point on one queue's timeline: "this work is done once queue `queue`
/// has completed `seqno`". Fences of different queues are not ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FenceId {
    /// The queue whose timeline this fence is on.
    pub queue: QueueId,
    /// The value the queue writes when the fenced work is done.
    pub seqno: Seqno,
}

impl FenceId {
    /// A fence on `queue` at `seqno`.
    #[inline]
    pub const fn new(queue: QueueId, seqno: u64) -> Self {
        FenceId { queue, seqno: Seqno(seqno) }
    }

    /// True when this fence is signalled, given the completed value of its
    /// own queue.
    #[inline]
    pub const fn is_signalled_by(self, completed: Seqno) -> bool {
        self.seqno.is_signalled_by(completed)
    }
}

impl fmt::Display for FenceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.queue, self.seqno)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps() {
        let a = Seqno(u64::MAX);
        let b = a.next();
        assert_eq!(b, Seqno(0));
        assert!(b.is_after(a));
        assert!(!a.is_after(b));
        assert!(a.is_signalled_by(b));
        assert!(!b.is_signalled_by(a));
        assert!(a.is_signalled_by(a));
        assert_eq!(a.cmp_wrapping(b), Ordering::Less);
        assert_eq!(b.cmp_wrapping(b), Ordering::Equal);
    }

    #[test]
    fn half_range() {
        let a = Seqno(10);
        assert!(Seqno(10 + (1 << 62)).is_after(a));
        assert!(!Seqno(10u64.wrapping_add(1 << 63).wrapping_add(1)).is_after(a));
    }
}
