//! Fault interrupts acknowledged but not yet checked, per queue.

use super::atomic::{AtomicU32, Ordering};

/// Queues (bit `q` for queue `q`) whose engine raised a fault interrupt
/// that was acknowledged but not yet looked at by the queue's hang check.
///
/// Whoever services the device acknowledges interrupts (any thread, or an
/// interrupt handler) and [`FaultIrqs::note`]s the faulting queues; queue
/// `q`'s check (under its submit lock, so one at a time per queue, while
/// checks of other queues and further acknowledgements run concurrently)
/// [`FaultIrqs::take`]s its bit, and a taken bit makes the check read the
/// engine's status even when the queue has no work (an engine that faults
/// while idle is reset then). Both are single atomic read-modify-writes, so
/// a bit noted while another queue's bit is taken is never lost, and each
/// noted bit is taken once (`tests/loom.rs` checks both).
#[derive(Debug)]
pub(crate) struct FaultIrqs(AtomicU32);

impl FaultIrqs {
    /// No queue pending.
    pub(crate) fn new() -> FaultIrqs {
        FaultIrqs(AtomicU32::new(0))
    }

    /// Records acknowledged fault interrupts of `queues` (a bit mask).
    #[inline]
    pub(crate) fn note(&self, queues: u32) {
        if queues != 0 {
            // AcqRel with `take`: the acknowledgement (and what was read
            // before it) happens before the check that takes the bit.
            self.0.fetch_or(queues, Ordering::AcqRel);
        }
    }

    /// Whether queue `q` had a fault interrupt noted since its last take;
    /// clears its bit.
    #[inline]
    pub(crate) fn take(&self, q: usize) -> bool {
        let Some(bit) = u32::try_from(q).ok().and_then(|q| 1u32.checked_shl(q)) else {
            return false;
        };
        self.0.fetch_and(!bit, Ordering::AcqRel) & bit != 0
    }
}
