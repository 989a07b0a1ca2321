//! What a submission mode provides to the shared engine.
//!
//! The engine ([`super::DeviceCore`]) owns everything both modes share: fences
//! and timelines, the failure history, the dependency graph, recording into
//! the IB pool, completion processing, buffers and the trace. A backend
//! owns what differs: how an IB reaches the hardware (a ring write or a
//! kernel submit), where completions are read (a fence slot or the
//! kernel), how failures are found (the direct-mode hang check, or a
//! kernel's reset report), and how memory is mapped for the GPU (page
//! tables the core writes, or kernel binds).
//!
//! The trait is sealed (implemented by [`crate::direct::Direct`] and
//! [`crate::kernel::Kernel`]); its items are the engine's private
//! vocabulary.

use crate::config::HangConfig;
use crate::debug::{HangReason, HangReport};
use crate::error::SubmitError;
use crate::hw::{ChipId, GpuVa, IbRef};
use crate::mem::pagetable::Perms;
use crate::mem::pool::BackingError;
use crate::platform::{DmaRegion, ForeignSync, Platform};
use crate::sync::{FenceError, FenceId, QueueId, Seqno};

pub(crate) mod sealed {
    use crate::engine::buffers::DriverVa;

    /// Only this crate's backends.
    pub trait Sealed {}

    /// Where the engine keeps its GPU VA allocator ([`super::Backend::Va`]).
    pub trait VaHold<'v> {
        /// Holds `alloc` (dropped where the backend never uses one).
        fn hold(alloc: Option<DriverVa<'v>>) -> Self;
        /// The allocator, if any.
        fn get(&self) -> Option<&DriverVa<'v>>;
        /// The allocator, if any.
        fn get_mut(&mut self) -> Option<&mut DriverVa<'v>>;
    }

    impl<'v> VaHold<'v> for Option<DriverVa<'v>> {
        fn hold(alloc: Option<DriverVa<'v>>) -> Self {
            alloc
        }
        fn get(&self) -> Option<&DriverVa<'v>> {
            self.as_ref()
        }
        fn get_mut(&mut self) -> Option<&mut DriverVa<'v>> {
            self.as_mut()
        }
    }

    /// No allocator, in no bytes: a backend that never chooses GPU
    /// addresses (direct mode without the `mmu` feature) holds this
    /// instead of an allocator of about 5 KiB.
    #[cfg(not(feature = "mmu"))]
    #[derive(Debug)]
    pub struct NoVa;

    #[cfg(not(feature = "mmu"))]
    impl<'v> VaHold<'v> for NoVa {
        fn hold(_: Option<DriverVa<'v>>) -> Self {
            NoVa
        }
        fn get(&self) -> Option<&DriverVa<'v>> {
            None
        }
        fn get_mut(&mut self) -> Option<&mut DriverVa<'v>> {
            None
        }
    }
}

/// The device stopped answering (a register access or the kernel failed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gone;

/// One submission as the backend puts it on the hardware.
#[derive(Clone, Copy, Debug)]
pub struct Job<'a> {
    /// Queue index.
    pub queue: usize,
    /// The submission's sequence number (its fence value).
    pub seqno: Seqno,
    /// Fences of other queues the hardware must wait for first.
    pub waits: &'a [FenceId],
    /// Foreign syncs to wait for first (kernel mode only).
    pub foreign: &'a [ForeignSync],
    /// The IB.
    pub ib: IbRef,
    /// The engine defers doorbells ([`crate::config::Config::batch_window_ns`]):
    /// the backend may keep the job from the hardware until
    /// [`Backend::flush`] (direct mode writes and cleans its ring packets
    /// but neither publishes the write pointer nor rings). A backend may
    /// also hand it over at once (kernel mode does): the engine's later
    /// flush then finds nothing of it left.
    pub hold: bool,
}

/// Why a backend did not take a job. Nothing reached the hardware.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmitError {
    /// No room now (a full ring): retry after the hardware moved.
    Full(SubmitError),
    /// The job can not be taken.
    Refused(SubmitError),
    /// The device is gone. Seen at a register access: the job's packets
    /// may be in the ring's memory; its write pointer was not published,
    /// unless the loss was seen only at the doorbell after it (then a
    /// device that is gone has it), and a lost device fetches nothing more.
    /// Also a read pointer the engine cannot have reported.
    Lost,
}

/// What polling a queue found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poll {
    /// The last completed sequence number.
    Completed(Seqno),
    /// Nothing could be read this time (a transient kernel error).
    Unchanged,
    /// The device is gone.
    Lost,
}

/// What the engine knows about a queue, for the backend's hang check.
#[derive(Clone, Copy, Debug)]
pub struct QueueView<'a> {
    /// Queue index.
    pub queue: usize,
    /// Last emitted sequence number.
    pub emitted: Seqno,
    /// Last completed sequence number.
    pub completed: Seqno,
    /// The next submission waits for this fence of another queue, which
    /// has not signalled; `true` when that fence is emitted already.
    pub blocked_on: Option<(FenceId, bool)>,
    /// The hang-check parameters in force.
    pub hang: HangConfig,
    /// The IB pool's GPU address and memory (for captures).
    pub ib: (GpuVa, &'a DmaRegion),
    /// The queue's engine raised a fault interrupt since the last check.
    pub fault_irq: bool,
}

impl QueueView<'_> {
    /// The report of a queue stuck for `reason` with nothing captured
    /// ([`HangReport::uncaptured`]: the reason, its fault and this view's
    /// fence counts), stamped with `b`'s clock and generation.
    pub(crate) fn uncaptured_report<B: Backend>(&self, b: &B, reason: HangReason) -> HangReport {
        HangReport::uncaptured(
            QueueId(self.queue as u8),
            reason,
            b.platform().now_ns(),
            b.chip().generation,
            (self.emitted, self.completed),
        )
    }
}

/// What [`Backend::ack_interrupts`] acknowledged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Acked {
    /// Some interrupt was pending.
    pub any: bool,
    /// Queues (bit `q`) whose engine raised a fault interrupt: checked even
    /// when they have no work (an engine that faults while idle is reset
    /// then, not when the next job finds it halted).
    pub faults: u32,
}

/// A queue the backend found stuck or faulted: reset it.
#[derive(Clone, Copy, Debug)]
pub struct Failure {
    /// Why its pending fences fail.
    pub error: FenceError,
    /// What was captured before the reset.
    pub report: HangReport,
}

/// How a backend waits for a fence without polling, if it can.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block {
    /// The fence signalled (or failed: the engine checks).
    Done,
    /// The time passed.
    TimedOut,
    /// This backend can not block on a fence: the engine polls (with
    /// interrupts when the platform has them).
    Unsupported,
}

/// A submission mode (see the module docs).
pub trait Backend: sealed::Sealed + Sized {
    /// The platform.
    type P: Platform;
    /// Per-queue state, behind the queue's submit lock (direct mode: the
    /// ring and hang watch; kernel mode: the kernel context and the
    /// submissions held back).
    type Queue: Send;
    /// Memory-mapping state, behind the engine's memory lock (direct-mode
    /// page tables; nothing in kernel mode).
    type Maps: Send;

    /// Which mode this is.
    const MODE: super::Mode;
    /// Whether this backend can ever have the core choose GPU addresses
    /// (kernel mode always; direct mode only with umd-core's `mmu`
    /// feature). When false the engine never touches its GPU VA allocator
    /// (a compile-time constant, so none of the allocator's code is
    /// linked) and every GPU address is the memory's device address.
    const VA_ALLOCATOR: bool;
    /// What holds the engine's GPU VA allocator: the allocator itself
    /// where [`Backend::VA_ALLOCATOR`] is true, else nothing (no bytes in
    /// the device).
    type Va<'v>: sealed::VaHold<'v> + Send;

    /// The platform.
    fn platform(&self) -> &Self::P;
    /// The chip.
    fn chip(&self) -> ChipId;
    /// Queues (engines) in use.
    fn queues(&self) -> usize;

    /// Whether GPU addresses are chosen by the core and mapped (false: the
    /// MMU is bypassed and an address is the memory's device address).
    fn translates(&self) -> bool;
    /// Maps `region` at `va` for the GPU.
    fn map(
        &self,
        maps: &mut Self::Maps,
        va: u64,
        region: &DmaRegion,
        perms: Perms,
    ) -> Result<(), BackingError>;
    /// Removes the mapping of `len` bytes at `va` and makes the GPU forget
    /// it (TLB invalidation). The GPU no longer uses the range. An error
    /// (kernel mode: the kernel refused the unbind) means the range may
    /// still be mapped: its VA must not be given out again.
    fn unmap(&self, maps: &mut Self::Maps, va: u64, len: u64) -> Result<(), BackingError>;

    /// Puts `job` on the hardware (under the queue's submit lock).
    fn emit(&self, qs: &mut Self::Queue, job: &Job<'_>) -> Result<EmitInfo, EmitError>;
    /// Reads queue `q`'s completion state.
    fn poll(&self, q: usize) -> Poll;

    /// Whether this backend holds emitted submissions back on its own,
    /// jobs without [`Job::hold`] too (kernel mode's wait before signal):
    /// the engine then calls [`Backend::flush`] on every queue after each
    /// submission and service pass. Jobs emitted with [`Job::hold`] are
    /// flushed by the engine's deferred-doorbell rules
    /// ([`super::batch`]) whatever this says.
    fn holds(&self) -> bool {
        false
    }
    /// Hands queue `q`'s held-back submissions to the hardware (under the
    /// queue's submit lock): every job emitted with [`Job::hold`] (direct
    /// mode: one write-pointer update and one doorbell for all of them),
    /// and those the backend held on its own whose waits are satisfiable
    /// now. Nothing held: nothing done.
    fn flush(&self, qs: &mut Self::Queue, q: usize) -> Result<(), Gone> {
        let _ = (qs, q);
        Ok(())
    }

    /// Acknowledges interrupts: which were pending (`Err` when the device
    /// is gone).
    fn ack_interrupts(&self) -> Result<Acked, Gone>;
    /// The hang and fault check of one queue (under its submit lock):
    /// `Some` when it must be reset.
    fn check(&self, qs: &mut Self::Queue, view: &QueueView<'_>) -> Result<Option<Failure>, Gone>;
    /// Resets queue `q`'s engine after a failure, before the engine records
    /// it (`Err`: the device did not complete the reset: it is lost).
    fn reset(&self, qs: &mut Self::Queue, q: usize) -> Result<(), Gone>;
    /// After the failure is recorded: lets engines waiting on the cancelled
    /// work move on (queue `q`'s completed value becomes `upto`) and takes
    /// new work.
    fn resume(&self, qs: &mut Self::Queue, q: usize, upto: Seqno) -> Result<(), Gone>;

    /// Stops the hardware (teardown; idempotent).
    fn stop(&self);
    /// Gives a queue's memory back (teardown, hardware stopped).
    fn release_queue(&self, qs: &mut Self::Queue);
    /// Gives the backend's own memory back (teardown, hardware stopped).
    fn release(&mut self, maps: &mut Self::Maps);
    /// Page-table entries written and TLB invalidations, for statistics.
    fn mapping_counters(&self) -> (u64, u64) {
        (0, 0)
    }
    /// Engine doorbells rung by [`Backend::flush`] of jobs emitted with
    /// [`Job::hold`], for statistics (direct mode: a job emitted without
    /// it rings once, counted by the engine as a submission); in kernel
    /// mode every submit call made to the kernel (a SUBMIT, or one
    /// multi-job submit for a flush), whose driver rings the engine.
    fn flush_doorbells(&self) -> u64 {
        0
    }

    /// The device clock (ns, the clock TIMESTAMP writes), if this mode can
    /// read it (direct mode reads CLOCK_LO/HI; a kernel driver does not
    /// expose it).
    fn gpu_clock_ns(&self) -> Option<u64> {
        None
    }

    /// What the hardware side of queue `q` looks like now, for the state
    /// dump (under the queue's submit lock).
    fn queue_state(&self, qs: &Self::Queue, q: usize) -> QueueHw {
        let _ = (qs, q);
        QueueHw::default()
    }

    /// Waits for `seqno` of queue `q` without polling, if the backend can.
    fn block(&self, q: usize, seqno: Seqno, timeout_ns: u64) -> Block {
        let _ = (q, seqno, timeout_ns);
        Block::Unsupported
    }
}

/// The hardware side of a queue, as the state dump shows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueHw {
    /// Direct mode: the ring's size in bytes, the write pointers written
    /// and published, the read pointer last seen by the driver, and
    /// RING_RPTR as read now (`None` when the register could not be read).
    pub ring: Option<RingState>,
    /// Kernel mode: submissions held back (waiting for a fence not yet
    /// handed to the kernel), and whether the queue has a kernel context.
    pub held: Option<(usize, bool)>,
}

/// A direct-mode ring's pointers (byte offsets).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingState {
    /// Size in bytes.
    pub size: usize,
    /// GPU address.
    pub va: u64,
    /// The write pointer written: packets up to here are in the ring.
    pub wptr: usize,
    /// The write pointer published to RING_WPTR (behind `wptr` while
    /// submissions are held: [`crate::config::Config::batch_window_ns`]).
    pub published: usize,
    /// The read pointer the driver last saw.
    pub rptr_seen: usize,
    /// RING_RPTR read now.
    pub rptr: Option<u32>,
}

/// What an emit did, for statistics and the trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmitInfo {
    /// The ring wrapped (direct mode).
    pub wrapped: bool,
    /// The write pointer written (direct mode), for the trace.
    pub wptr: u64,
}
