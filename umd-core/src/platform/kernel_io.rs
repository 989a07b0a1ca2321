//! The kernel-mode platform trait, [`KernelIo`]: what the core needs from a
//! kernel driver's uAPI (the device that submits through it is
//! [`crate::kernel::KernelDevice`]; the driver itself is `kmd/`).
//!
//! The shape is a DRM render node's (the refgpu driver of `kmd/`, and the
//! same concepts in amdgpu, panthor, msm, xe): buffer objects the platform
//! names ([`DmaRegion::handle`]), one GPU VM per device in which the core
//! chooses addresses and binds ranges of buffer objects, contexts (kernel
//! queues) on one engine each, one timeline per queue on which every
//! submission signals its sequence number (a timeline syncobj), waits that
//! name timeline points (the kernel waits, never a polling loop), foreign
//! syncs (sync_file, syncobj fds) a submission can wait for, and per-context
//! reset status.

use core::fmt;

use super::{DmaRegion, Platform, PlatformError};

/// What the kernel driver reports about the device (its info ioctl).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelInfo {
    /// The chip's ID register.
    pub chip_id: u32,
    /// Engines (queues) the kernel exposes.
    pub engines: u32,
    /// First GPU address the core may bind.
    pub va_start: u64,
    /// One past the last.
    pub va_end: u64,
    /// Alignment of an IB's address.
    pub ib_align: u64,
}

/// A kernel context: a queue of the kernel's on one engine, named by the id
/// the kernel returned (DRM contexts, submit queues and groups are `u32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContextId(pub u32);

/// A point on a queue's timeline: reached once the submission with that
/// sequence number, and every earlier one of the queue, completed (or
/// failed: a timeline moves past failed work, the error is the context's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSync {
    /// The queue (engine index) whose timeline it is.
    pub queue: u32,
    /// The point (a sequence number of that queue).
    pub point: u64,
}

/// A sync object the platform imported from outside the device (a
/// sync_file, a syncobj fd): an opaque platform handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ForeignSync(pub u64);

/// Foreign syncs one submission may wait for.
pub const MAX_FOREIGN: usize = 4;

/// What a kernel submission waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelWait {
    /// A point of one of this device's queue timelines.
    Point(KernelSync),
    /// A foreign sync (the kernel waits for it; the core can not see it).
    Foreign(ForeignSync),
}

/// Why a context's work was cancelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guilt {
    /// A job made no progress within the kernel's timeout.
    Hang,
    /// A job faulted (the fault registers as the kernel latched them).
    Fault {
        /// FAULT_STATUS.
        status: u32,
        /// FAULT_ADDR.
        addr: u64,
    },
}

/// What resets did to a context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContextStatus {
    /// No reset touched it.
    Ok,
    /// Its engine was reset for another context's work; its own work ran
    /// again and completes.
    Innocent,
    /// One of its jobs hung or faulted: that job and every later one of the
    /// context failed; the context takes no more work.
    Guilty {
        /// The context sequence number (as [`KernelIo::submit`] returned
        /// it) of the job that hung or faulted.
        seqno: u64,
        /// Why.
        cause: Guilt,
    },
    /// The device stopped answering.
    DeviceLost,
}

/// Why the kernel refused a submission. Nothing was queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelSubmitError {
    /// The context is guilty: it takes no more work (DRM: `ECANCELED`).
    Cancelled,
    /// The device is gone: lost (`EIO`) or unplugged (`ENODEV`).
    DeviceLost,
    /// Anything else.
    Platform(PlatformError),
}

impl fmt::Display for KernelSubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelSubmitError::Cancelled => {
                write!(f, "the context is guilty of a reset and takes no more work")
            }
            KernelSubmitError::DeviceLost => write!(f, "device lost"),
            KernelSubmitError::Platform(e) => write!(f, "{e}"),
        }
    }
}

impl core::error::Error for KernelSubmitError {}

/// One job of [`KernelIo::submit_batch`]: what [`KernelIo::submit`] takes
/// for one IB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelJob<'a> {
    /// The IB's GPU address.
    pub ib_va: u64,
    /// Its length in dwords.
    pub ib_dwords: u32,
    /// What it runs after.
    pub waits: &'a [KernelWait],
    /// The point its completion reaches.
    pub signal: KernelSync,
}

/// Why [`KernelIo::submit_batch`] stopped: the first `queued` jobs were
/// queued (in order), the next one was refused with `error`, and no later
/// one was queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchError {
    /// Jobs queued before the refusal (0 for a kernel batch call, which
    /// takes all of its jobs or none).
    pub queued: usize,
    /// Why the next one was refused.
    pub error: KernelSubmitError,
}

/// [`KernelIo::submit_batch`] one job at a time with [`KernelIo::submit`]:
/// what a kernel without a batch call allows. Returns the first job's
/// sequence number (`Ok(0)` for no jobs).
pub fn submit_each<P: KernelIo + ?Sized>(
    p: &P,
    ctx: ContextId,
    jobs: &[KernelJob<'_>],
) -> Result<u64, BatchError> {
    let mut first = 0;
    for (queued, j) in jobs.iter().enumerate() {
        let seq = p
            .submit(ctx, j.ib_va, j.ib_dwords, j.waits, j.signal)
            .map_err(|error| BatchError { queued, error })?;
        if queued == 0 {
            first = seq;
        }
    }
    Ok(first)
}

/// Kernel-mediated mode: the kernel owns the rings, the page tables and
/// hang recovery; the core owns GPU addresses, IBs, dependencies and the
/// meaning of failures.
///
/// Memory: [`Platform::dma_alloc`] creates a buffer object (its
/// [`DmaRegion::handle`] names it to the kernel) and, unless the flags are
/// [`super::DmaFlags::DEVICE_ONLY`], maps it for the CPU.
pub trait KernelIo: Platform {
    /// The device, as the kernel reports it.
    fn info(&self) -> Result<KernelInfo, PlatformError>;

    /// Creates a context on engine `queue`.
    fn create_context(&self, queue: u32) -> Result<ContextId, PlatformError>;

    /// Destroys a context (its queued work is flushed to the hardware by the
    /// kernel first).
    fn destroy_context(&self, ctx: ContextId);

    /// What resets did to `ctx`.
    fn context_status(&self, ctx: ContextId) -> Result<ContextStatus, PlatformError>;

    /// Maps `len` bytes of `region` from byte `offset` at GPU address `va`
    /// (the core chose `va`, as libdrm's VA manager does); the GPU may not
    /// write it when `read_only`. All or nothing.
    fn bind(
        &self,
        va: u64,
        region: &DmaRegion,
        offset: u64,
        len: u64,
        read_only: bool,
    ) -> Result<(), PlatformError>;

    /// Removes what is mapped in `[va, va + len)` and returns once the GPU
    /// can no longer reach it. The core calls it only after every
    /// submission that may use the range has completed or failed (its
    /// buffers are fence-gated), so it passes the kernel no fences to order
    /// it after.
    fn unbind(&self, va: u64, len: u64) -> Result<(), PlatformError>;

    /// Queues the IB at `ib_va` (`ib_dwords` long) on `ctx`, to run after
    /// `waits`; when it completes, queue `signal.queue`'s timeline reaches
    /// `signal.point`. Returns the job's sequence number on its context
    /// (1 for a context's first job, then one more per job).
    fn submit(
        &self,
        ctx: ContextId,
        ib_va: u64,
        ib_dwords: u32,
        waits: &[KernelWait],
        signal: KernelSync,
    ) -> Result<u64, KernelSubmitError>;

    /// Queues `jobs` on `ctx` in order, as many [`KernelIo::submit`]s
    /// would, in as few kernel calls as the kernel allows (a DRM driver's
    /// multi-job submit takes all of its jobs or none). Returns the first
    /// job's sequence number on the context; the others follow it one by
    /// one. The provided method is [`submit_each`]: one call per job.
    fn submit_batch(&self, ctx: ContextId, jobs: &[KernelJob<'_>]) -> Result<u64, BatchError> {
        submit_each(self, ctx, jobs)
    }

    /// The point queue `queue`'s timeline has reached.
    fn completed(&self, queue: u32) -> Result<u64, PlatformError>;

    /// Waits in the kernel until `sync` is reached (`Ok(true)`), or
    /// `timeout_ns` passes (`Ok(false)`). A point nobody submitted yet is
    /// waited for too (it may be submitted meanwhile).
    fn wait(&self, sync: KernelSync, timeout_ns: u64) -> Result<bool, PlatformError>;

    /// Moves queue `sync.queue`'s timeline to `sync.point` without work: the
    /// core cancelled work it never gave the kernel, and waiters (the
    /// kernel's too) must move on.
    fn signal(&self, sync: KernelSync) -> Result<(), PlatformError>;
}
