//! Errors and results of submission and waiting, shared by every
//! submission mode.

use core::fmt;

pub mod validation;

use crate::cmd::EncodeError;
use crate::config::Limit;
use crate::mem::buffer::BufferError;
use crate::platform::PlatformError;
use crate::ring::RingError;
use crate::sync::deps::{Cycle, DepError};
use crate::sync::{Fence, FenceError, QueueId};

/// Why a submission was refused. Nothing reached the GPU after any of
/// these, and the queue is usable for the next submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SubmitError {
    /// No such queue.
    UnknownQueue(QueueId),
    /// The command buffer recorded nothing.
    Empty,
    /// An IB longer than the generation allows.
    IbTooLarge {
        /// Dwords given.
        dwords: u64,
        /// The generation's limit.
        max: u32,
    },
    /// Recording failed (the command that failed and why).
    Encode(EncodeError),
    /// No IB chunk free and the policy is to fail (or waiting for one
    /// timed out; [`Limit::IbChunks`]).
    PoolEmpty,
    /// The ring stayed full for the whole wait (the engine is not
    /// consuming).
    RingFull(RingError),
    /// The submission would close a wait cycle between queues.
    Cycle(Cycle),
    /// More waits than a submission can carry.
    TooManyWaits {
        /// Waits given.
        given: usize,
    },
    /// Too many submissions with waits are still pending on the queue
    /// ([`Limit::PendingWaits`]).
    TooManyPending(QueueId),
    /// A wait on a fence that failed: the submission would run on input
    /// that never arrived, so it is not executed.
    DependencyFailed {
        /// The failed fence waited on.
        fence: Fence,
        /// Why it failed (for a chain, the first failed producer and the
        /// root cause).
        error: FenceError,
    },
    /// A fence of another device.
    ForeignFence(Fence),
    /// A buffer the submission declared is not a live buffer of this device.
    Buffer(BufferError),
    /// More buffers declared than a submission can carry.
    TooManyBuffers {
        /// Buffers given.
        given: usize,
    },
    /// A wait on a fence of the submitting queue that is not emitted yet
    /// (the queue would wait for itself).
    WaitsOnItself(Fence),
    /// The device is gone.
    DeviceLost,
    /// A platform call failed.
    Platform(PlatformError),
    /// Foreign syncs (sync_file, syncobj) given in direct mode: only a
    /// kernel can wait for them.
    ForeignSyncUnsupported,
    /// The queue's kernel context was reset and the core had not finished
    /// recovering it within the hang window.
    QueueRecovering(QueueId),
    /// The validation mode found a packet that would reach memory it must
    /// not (see [`crate::engine::validate`]); nothing was executed.
    Invalid(validation::ValidationError),
    /// The local-memory buffers the submission declares do not fit in local
    /// memory together.
    WorkingSetTooLarge {
        /// Bytes they need.
        needed: u64,
        /// Bytes of local memory.
        local: u64,
    },
    /// A declared buffer was still being moved between local and system
    /// memory when the wait for the move ran out (a move's copy is bounded
    /// by the hang window, so this means the COPY engine is stuck).
    BufferMoving(crate::mem::BufferHandle),
    /// The queue's failure history is full of failures the application
    /// has not acknowledged: a new submission could fail in a way it could
    /// no longer record exactly. Acknowledge old fences first
    /// (`acknowledge_failures` of the device); nothing was executed.
    HistoryFull(QueueId),
}

impl fmt::Display for SubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubmitError::UnknownQueue(q) => write!(f, "unknown queue {q}"),
            SubmitError::Empty => write!(f, "empty submission"),
            SubmitError::IbTooLarge { dwords, max } => {
                write!(f, "IB of {dwords} dwords exceeds the limit {max}")
            }
            SubmitError::Encode(e) => write!(f, "recording failed: {e}"),
            SubmitError::PoolEmpty => write!(f, "no IB chunk available; {}", Limit::IbChunks),
            SubmitError::RingFull(e) => write!(f, "{e}"),
            SubmitError::Cycle(c) => write!(f, "wait cycle: {c}"),
            SubmitError::TooManyWaits { given } => write!(f, "{given} waits exceed the limit"),
            SubmitError::TooManyPending(q) => {
                write!(f, "too many pending submissions with waits on {q}; {}", Limit::PendingWaits)
            }
            SubmitError::DependencyFailed { fence, error } => {
                write!(f, "waits on failed fence {fence}: {error}")
            }
            SubmitError::ForeignFence(fence) => write!(f, "fence {fence} belongs to another device"),
            SubmitError::Buffer(e) => write!(f, "declared buffer: {e}"),
            SubmitError::TooManyBuffers { given } => write!(f, "{given} declared buffers exceed the limit"),
            SubmitError::WaitsOnItself(fence) => {
                write!(f, "submission waits on its own queue's future fence {fence}")
            }
            SubmitError::DeviceLost => write!(f, "device lost"),
            SubmitError::Platform(e) => write!(f, "platform: {e}"),
            SubmitError::ForeignSyncUnsupported => {
                write!(f, "foreign syncs need a kernel driver (direct mode can not wait for them)")
            }
            SubmitError::QueueRecovering(q) => write!(f, "{q} is still recovering from a kernel reset"),
            SubmitError::Invalid(e) => write!(f, "validation: {e}"),
            SubmitError::WorkingSetTooLarge { needed, local } => {
                write!(f, "local working set of {needed} bytes exceeds the {local} bytes of local memory")
            }
            SubmitError::BufferMoving(h) => {
                write!(f, "declared buffer {h:?} is still being moved between local and system memory")
            }
            SubmitError::HistoryFull(q) => write!(f, "{q}: failure history full, acknowledge old failures"),
        }
    }
}

impl core::error::Error for SubmitError {}

impl SubmitError {
    /// The capacity this error ran into, if it is a full table
    /// ([`Limit`] names the parameter to raise); `None` for every other
    /// cause.
    pub const fn limit(&self) -> Option<Limit> {
        match self {
            SubmitError::PoolEmpty => Some(Limit::IbChunks),
            SubmitError::TooManyPending(_) => Some(Limit::PendingWaits),
            _ => None,
        }
    }
}

impl From<DepError> for SubmitError {
    fn from(e: DepError) -> Self {
        match e {
            DepError::Cycle(c) => SubmitError::Cycle(c),
            DepError::TooManyWaits { given } => SubmitError::TooManyWaits { given },
            DepError::Full { queue } => SubmitError::TooManyPending(queue),
            DepError::UnknownQueue { queue } => SubmitError::UnknownQueue(queue),
        }
    }
}

/// Why a wait ended without the fence signalling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitError {
    /// The timeout passed (a timeout of 0 is a non-blocking query).
    Timeout,
    /// The fence's work was abandoned (hang, fault, device lost).
    Failed(FenceError),
    /// The fence was never emitted: waiting would never end.
    NotSubmitted(Fence),
    /// No such queue.
    UnknownQueue(QueueId),
    /// A fence of another device.
    ForeignFence(Fence),
    /// The application acknowledged the fence's outcome (`acknowledge_failures`
    /// of the device, up to this fence or a later one of its queue): its
    /// work is done, and its answer is no longer kept.
    Acknowledged(Fence),
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitError::Timeout => write!(f, "timed out"),
            WaitError::Failed(e) => write!(f, "{e}"),
            WaitError::NotSubmitted(fence) => write!(f, "fence {fence} was never submitted"),
            WaitError::UnknownQueue(q) => write!(f, "unknown queue {q}"),
            WaitError::ForeignFence(fence) => write!(f, "fence {fence} belongs to another device"),
            WaitError::Acknowledged(fence) => {
                write!(f, "fence {fence} was acknowledged, its answer is not kept")
            }
        }
    }
}

impl core::error::Error for WaitError {}

/// Where a fence stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceStatus {
    /// Its work is done.
    Signalled,
    /// Its work is not done yet.
    Pending,
    /// Its work was abandoned.
    Failed(FenceError),
}
