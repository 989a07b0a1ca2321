//! Synchronisation primitives shared by the queues and the memory manager.
//!
//! Sequence numbers (wrap-safe), fences and their errors, the atomic
//! per-queue timeline, and the cross-queue dependency graph that rejects
//! wait cycles.

pub(crate) mod atomic;
pub mod deps;
pub(crate) mod fault_irqs;
pub mod fence;
pub mod history;
pub mod seqno;
pub mod timeline;

pub use fence::{Access, Cause, DeviceId, FaultInfo, FaultKind, Fence, FenceError};
pub use history::FailureHistory;
pub use seqno::{FenceId, QueueId, Seqno};
pub use timeline::Timeline;

/// Most queues (engines) a device drives: the chip's ENGINE_COUNT is used
/// up to this many.
pub const MAX_QUEUES: usize = 4;
