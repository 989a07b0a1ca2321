//! Synchronisation primitives shared by the queues and the memory manager.
//!
//! Only the sequence-number type lives here so far: the memory manager needs
//! it for fence-gated reuse, and the submission code (later) for timelines.

pub mod seqno;

pub use seqno::{FenceId, QueueId, Seqno};
