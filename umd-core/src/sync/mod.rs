//! Synchronisation primitives shared by the queues and the memory manager.
//!
//! Sequence numbers (wrap-safe), fences and their errors, the atomic
//! per-queue timeline, and the cross-queue dependency graph that rejects
//! wait cycles.

pub(crate) mod atomic;
pub mod deps;
pub mod fence;
pub mod seqno;
pub mod timeline;
pub(crate) mod wait;

pub use fence::{Access, ErroredRange, FaultInfo, FaultKind, Fence, FenceError};
pub use seqno::{FenceId, QueueId, Seqno};
pub use timeline::Timeline;
