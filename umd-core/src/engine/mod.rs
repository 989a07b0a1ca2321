//! The device core both modes share.
//!
//! [`DeviceCore`] is a whole refgpu device (the hardware's engines are its
//! queues, [`crate::sync::QueueId`]): direct mode ([`crate::direct`], the core
//! drives rings and page tables) and kernel mode ([`crate::kernel`], a
//! kernel driver does) are its two [`Backend`]s, and everything else is
//! here, once: fences with a failure history that never forgets, failure
//! propagation along dependencies, the dependency graph, recording into
//! the IB pool, completion processing, driver-owned buffers with
//! fence-gated reuse, the trace, and the adaptive wait.
//!
//! # Thread model
//!
//! Every method takes `&self`; a device is `Sync` when its platform is,
//! so threads or RTOS tasks share it by reference. Each queue has a submit
//! lock (its ring, its sequence numbers); the memory manager, the
//! dependency graph, the IB pool's bookkeeping and the trace have one lock
//! each (a submission's trace events wait in its queue's stage, under the
//! submit lock, for the next reader of the trace or the queue's completion
//! processing: `debug::trace::TraceStage`). Locks are held for bounded bookkeeping only: recording runs with
//! no lock held, waits and sleeps hold none, the platform's memory is
//! allocated and freed with the memory lock dropped ([`buffers`]), and the service path skips a
//! queue whose lock is busy (its holder services it); only the first
//! thread to meet a device loss waits for the queues' submit locks, one at
//! a time, to fail their pending work (`complete`). Timelines are
//! atomics, so completion reads take no lock. Lock order: a queue's submit
//! lock, then dependencies, then memory, then the IB pool, then the trace;
//! the failure histories are leaves. `docs/architecture.md` has the full
//! picture.
//!
//! The modules:
//! - [`backend`]: what a mode provides (sealed);
//! - `queue`: one queue (timeline, emitted and processed marks, failure
//!   history, submit lock);
//! - [`submit`]: the submission path; [`batch`]: deferred doorbells; [`validate`]: the validation mode's
//!   checks of a submission;
//! - [`complete`]: completion processing, the service loop, failure
//!   handling, resets and device loss;
//! - [`wait`]: waits; [`wait_async`]: the same waits as futures for async
//!   executors;
//! - [`buffers`]: buffer allocation, freeing and CPU access;
//!   [`residency`]: local memory and the moves to and from it;
//! - [`events`]: events and timestamp queries;
//! - [`lifecycle`]: bring-up of the shared parts, teardown, leak report.

pub mod backend;
pub mod batch;
pub mod buffers;
#[cfg(feature = "capture")]
pub mod capture;
pub mod complete;
pub mod dump;
pub mod events;
pub mod lifecycle;
pub(crate) mod queue;
pub mod residency;
pub mod submit;
pub mod validate;
pub mod wait;
pub mod wait_async;

use core::sync::atomic::{AtomicBool, AtomicU32};

use lock_api::{Mutex, MutexGuard};

use crate::cmd::Encoder;
use crate::config::{Config, HangConfig, PoolExhaustion};
use crate::debug::{HangLog, HangReport, TraceEvent, TraceKind, TraceRing};
use crate::hw::ChipId;
use crate::ibpool::{IbPool, IbPoolStats};
use crate::mem::manager::{BufferStats, Buffers};
use crate::mem::va::VaAllocator;
use crate::platform::Platform;
use crate::storage::Deps;
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::{DeviceId, Fence, FenceId, QueueId, Seqno, MAX_QUEUES};

pub use crate::platform::ClockSync;
pub use crate::storage::PENDING_WAITS;
pub use backend::Backend;
pub use batch::MAX_HELD;
pub use buffers::{BufferAccess, BufferUse, Mapped};
pub use events::{Event, EventError, TimestampQuery};
pub use lifecycle::{InPlace, InitError, ShutdownReport};
pub use residency::{LocalMemory, MoveError, Residency};
pub use submit::Submit;
pub use wait_async::{AnyFenceWait, AnyWaitError, FenceWait, Registration, Wakeups};

use queue::QueueCore;

/// The raw lock a backend's platform chose.
pub(crate) type Raw<B> = <<B as Backend>::P as Platform>::RawMutex;

/// How a device reaches the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The core drives rings, fence slots and page tables ([`crate::direct`]).
    Direct,
    /// A kernel driver does ([`crate::kernel`]).
    Kernel,
}

/// Counters of a device's life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Submissions that reached the hardware (or the kernel).
    pub submissions: u64,
    /// Fences observed signalled.
    pub fences_signalled: u64,
    /// Hangs detected (no progress, fence stall, wait never satisfied).
    pub hangs: u64,
    /// Faults reported.
    pub faults: u64,
    /// Queue resets performed (or reported by the kernel).
    pub resets: u64,
    /// Fences failed because work they waited on failed.
    pub propagated_failures: u64,
    /// Ring writes that wrapped.
    pub ring_wraps: u64,
    /// Engine doorbells rung: one per submission with the batch window
    /// off, one per flush with it on
    /// ([`crate::config::Config::batch_window_ns`]). Kernel mode, whose
    /// kernel driver rings: the submit calls made to the kernel (one per
    /// SUBMIT, one per multi-job submit of a flush).
    pub doorbells: u64,
    /// Times recording waited for an IB chunk.
    pub pool_waits: u64,
    /// Times a submission waited for room in the dependency table.
    pub dep_waits: u64,
    /// Service passes that found IRQ_STATUS bits set and cleared them.
    /// The device sets IRQ_STATUS on fences and faults whether or not the
    /// platform waits for interrupts, so a polling-only platform counts
    /// here too: this is not the number of interrupts delivered.
    pub irq_status_acks: u64,
    /// Total ns spent in `wait`.
    pub wait_ns: u64,
    /// Page-table entries written (direct mode).
    pub pte_writes: u64,
    /// GPU TLB invalidations (direct mode).
    pub tlb_invalidations: u64,
    /// Buffers moved from local to system memory.
    pub evictions: u64,
    /// Buffers moved back into local memory.
    pub restores: u64,
    /// Bytes those moves copied.
    pub bytes_moved: u64,
    /// Evictions of a buffer used within twice the minimum residency.
    pub thrash_events: u64,
    /// Restores not done for lack of an idle victim (the work used the
    /// system-memory copy).
    pub restores_deferred: u64,
    /// Local-memory buffers placed in system memory at allocation.
    pub local_fallbacks: u64,
    /// Times a queue's failure history, full, merged two failed ranges
    /// (summed over queues). Until the first, every fence's answer is
    /// exact and final; after it, some old fences may answer
    /// approximately: a success in a merged gap as failed, or a failure
    /// with its neighbour's reason, never a failure as success
    /// (`sync::history`).
    pub history_merges: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) fences_signalled: AtomicU64,
    pub(crate) hangs: AtomicU64,
    pub(crate) faults: AtomicU64,
    pub(crate) resets: AtomicU64,
    pub(crate) propagated_failures: AtomicU64,
    pub(crate) ring_wraps: AtomicU64,
    pub(crate) pool_waits: AtomicU64,
    pub(crate) dep_waits: AtomicU64,
    pub(crate) irq_status_acks: AtomicU64,
    pub(crate) wait_ns: AtomicU64,
    pub(crate) evictions: AtomicU64,
    pub(crate) restores: AtomicU64,
    pub(crate) bytes_moved: AtomicU64,
    pub(crate) thrash_events: AtomicU64,
    pub(crate) restores_deferred: AtomicU64,
    pub(crate) local_fallbacks: AtomicU64,
}

impl Counters {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// The memory manager's state, behind one lock.
pub(crate) struct MemState<'d, B: Backend> {
    pub(crate) buffers: Buffers<'d, crate::storage::Backed>,
    /// GPU VA (empty: MMU bypassed, addresses are the memory's).
    pub(crate) va: buffers::VaSlot<'d, B>,
    pub(crate) maps: B::Maps,
    /// The device's local memory, if it has any.
    pub(crate) local: crate::mem::local::LocalMem<'d>,
}

impl<'d, B: Backend> MemState<'d, B> {
    /// The buffer manager and a backing over the rest, for manager calls;
    /// the platform's memory calls the pass needs are left in `off`, for
    /// the caller to make once the lock is dropped ([`buffers::OffLock`]).
    pub(crate) fn split<'a>(
        &'a mut self,
        b: &'a B,
        off: &'a mut buffers::OffLock,
    ) -> (&'a mut Buffers<'d, crate::storage::Backed>, buffers::Backer<'a, 'd, B>) {
        let MemState { buffers, va, maps, local } = self;
        (buffers, buffers::Backer { b, va, maps, local, fallback: false, off })
    }
}

/// Runtime tunables.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tunables {
    pub(crate) pool_exhaustion: PoolExhaustion,
    pub(crate) hang: HangConfig,
}

/// A refgpu device over backend `B` with `CHUNKS` IB chunks (see the
/// module docs). Use it through [`crate::direct::Device`] or
/// [`crate::kernel::KernelDevice`].
pub struct DeviceCore<'d, B: Backend, const CHUNKS: usize = 16> {
    pub(crate) id: DeviceId,
    pub(crate) b: B,
    pub(crate) enc: Encoder,
    pub(crate) cfg: Config,
    pub(crate) tun: Mutex<Raw<B>, Tunables>,
    pub(crate) nq: usize,
    pub(crate) queues: [QueueCore<Raw<B>, B::Queue>; MAX_QUEUES],
    pub(crate) ib: IbPool<Raw<B>, CHUNKS>,
    pub(crate) mem: Mutex<Raw<B>, MemState<'d, B>>,
    pub(crate) deps: Mutex<Raw<B>, &'d mut Deps>,
    pub(crate) trace: Mutex<Raw<B>, TraceRing<'d>>,
    pub(crate) last_hang: Mutex<Raw<B>, HangLog<'d>>,
    pub(crate) stats: Counters,
    pub(crate) lost: AtomicBool,
    /// Queues (bit `q`) whose fault interrupt was acknowledged but not yet
    /// checked (see [`backend::Acked::faults`]).
    pub(crate) fault_irqs: crate::sync::fault_irqs::FaultIrqs,
    /// Queues (bit `q`) whose completion pass ran out of reclaim budget
    /// with frees still ready: the next service pass takes them back
    /// without waiting for another completion (set and cleared under the
    /// memory lock, read without it as a hint).
    pub(crate) reclaim_backlog: AtomicU32,
    /// The command-stream capture session (`capture` feature).
    #[cfg(feature = "capture")]
    pub(crate) capture: Mutex<Raw<B>, capture::CaptureState<'d>>,
    /// The validation mode is on (`validation` feature).
    #[cfg(feature = "validation")]
    pub(crate) validating: AtomicBool,
    pub(crate) torn_down: AtomicBool,
}

/// The device core under its former name (the hardware's engines are the
/// queues; the whole device is a [`DeviceCore`]).
#[deprecated(note = "renamed to `DeviceCore`")]
pub type Engine<'d, B, const CHUNKS: usize = 16> = DeviceCore<'d, B, CHUNKS>;

impl<'d, B: Backend, const CHUNKS: usize> core::fmt::Debug for DeviceCore<'d, B, CHUNKS> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("DeviceCore")
            .field("id", &self.id)
            .field("chip", &self.b.chip())
            .field("queues", &self.nq)
            .field("lost", &self.is_lost())
            .finish()
    }
}

/// A fresh device identity for every engine (checked on every fence and
/// buffer handle).
pub(crate) fn next_device_id() -> DeviceId {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    DeviceId(NEXT.fetch_add(1, core::sync::atomic::Ordering::Relaxed))
}

impl<'d, B: Backend, const CHUNKS: usize> DeviceCore<'d, B, CHUNKS> {
    /// The device's identity (stamped on its fences and buffer handles).
    pub fn id(&self) -> DeviceId {
        self.id
    }

    /// The chip found at probe time.
    pub fn chip(&self) -> ChipId {
        self.b.chip()
    }

    /// The encoder for this chip.
    pub fn encoder(&self) -> Encoder {
        self.enc
    }

    /// The configuration given at construction (runtime tunables may have
    /// changed since; see [`DeviceCore::hang_config`]).
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The submission mode.
    pub fn mode(&self) -> Mode {
        B::MODE
    }

    /// Whether GPU addresses are translated (the core chooses them and
    /// they are mapped: an MMU in direct mode, always in kernel mode);
    /// false when the MMU is bypassed and addresses are physical.
    pub fn mmu_enabled(&self) -> bool {
        self.b.translates()
    }

    /// Queues (engines) in use: the chip's count, up to [`MAX_QUEUES`].
    pub fn queue_count(&self) -> usize {
        self.nq
    }

    /// The platform.
    pub fn platform(&self) -> &B::P {
        self.b.platform()
    }

    /// Changes what recording does when every IB chunk is in flight.
    pub fn set_pool_exhaustion(&self, policy: PoolExhaustion) {
        self.tun.lock().pool_exhaustion = policy;
    }

    /// Changes the hang-check parameters (a window of 0 is ignored).
    pub fn set_hang_config(&self, hang: HangConfig) {
        if hang.window_ns > 0 {
            self.tun.lock().hang = hang;
        }
    }

    /// The hang-check parameters in force.
    pub fn hang_config(&self) -> HangConfig {
        self.tun.lock().hang
    }

    /// Submissions that reached the hardware (or the kernel): each took
    /// the next sequence number of its queue, from 0 on, so their number is
    /// the sum of the queues' emitted marks (no shared counter to bump on
    /// every submission).
    pub(crate) fn submissions(&self) -> u64 {
        self.queues.iter().take(self.nq).fold(0u64, |n, q| n.wrapping_add(q.emitted().0))
    }

    /// Engine doorbells rung (direct mode): with the batch window off one
    /// per submission that reached the hardware (an emit succeeds only
    /// once its doorbell did: no count on the submission path), with it on
    /// one per flush, counted by the backend. Kernel mode: the submit
    /// calls made to the kernel, counted by the backend.
    fn doorbells(&self) -> u64 {
        match B::MODE {
            Mode::Kernel => self.b.flush_doorbells(),
            Mode::Direct if self.batching() => self.b.flush_doorbells(),
            Mode::Direct => self.submissions(),
        }
    }

    /// Counters.
    pub fn stats(&self) -> DeviceStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let s = &self.stats;
        let (pte, tlb) = self.b.mapping_counters();
        DeviceStats {
            submissions: self.submissions(),
            fences_signalled: l(&s.fences_signalled),
            hangs: l(&s.hangs),
            faults: l(&s.faults),
            resets: l(&s.resets),
            propagated_failures: l(&s.propagated_failures),
            ring_wraps: l(&s.ring_wraps),
            doorbells: self.doorbells(),
            pool_waits: l(&s.pool_waits),
            dep_waits: l(&s.dep_waits),
            irq_status_acks: l(&s.irq_status_acks),
            wait_ns: l(&s.wait_ns),
            pte_writes: pte,
            tlb_invalidations: tlb,
            evictions: l(&s.evictions),
            restores: l(&s.restores),
            bytes_moved: l(&s.bytes_moved),
            thrash_events: l(&s.thrash_events),
            restores_deferred: l(&s.restores_deferred),
            local_fallbacks: l(&s.local_fallbacks),
            history_merges: self.queues.iter().take(self.nq).map(QueueCore::history_merges).sum(),
        }
    }

    /// IB pool occupancy (chunks whose fence signalled count as free).
    pub fn pool_stats(&self) -> IbPoolStats {
        self.ib.reclaim(&|q| self.completed_of(q));
        self.ib.stats()
    }

    /// GPU address range of the IB pool.
    pub fn pool_range(&self) -> (u64, usize) {
        self.ib.range()
    }

    /// Buffer statistics: pools per class, live and waiting buffers.
    pub fn buffer_stats(&self) -> BufferStats {
        self.mem.lock().buffers.stats()
    }

    /// GPU VA allocator statistics (None with the MMU bypassed). The
    /// allocator recycles: a freed range of up to 8 KiB counts as free but
    /// stays out of `holes` and `largest_free` until an allocation that
    /// needs the space coalesces it (`docs/memory.md`).
    pub fn va_stats(&self) -> Option<crate::mem::VaStats> {
        self.mem.lock().va.get().map(VaAllocator::stats)
    }

    /// The event trace (locked while the guard lives). Without the `trace`
    /// feature it records nothing and stays empty.
    pub fn trace(&self) -> MutexGuard<'_, Raw<B>, TraceRing<'d>> {
        self.trace_locked()
    }

    /// The trace ring, locked, after every queue's staged submissions
    /// were moved into it ([`crate::debug::trace::TraceStage`]): what a
    /// reader of the trace and a submitter whose stage is full take.
    pub(crate) fn trace_locked(&self) -> MutexGuard<'_, Raw<B>, TraceRing<'d>> {
        let mut t = self.trace.lock();
        for qi in 0..self.nq {
            self.unstage(&mut t, qi);
        }
        t
    }

    /// Moves queue `qi`'s staged submissions into the trace ring `t`
    /// (locked by the caller).
    #[inline]
    pub(crate) fn unstage(&self, t: &mut TraceRing<'d>, qi: usize) {
        if let Some(q) = self.queues.get(qi).filter(|_| cfg!(feature = "trace")) {
            q.trace_stage.drain(t, qi);
        }
    }

    /// The report of the last hang or fault, if any. Without the
    /// `hang-capture` feature a direct-mode report carries the reason, the
    /// fault and the fence counts only ([`HangReport::uncaptured`]: no
    /// registers, no command windows, no nearest buffer).
    pub fn last_hang(&self) -> Option<HangReport> {
        self.last_hang.lock().last()
    }

    /// The last hang and fault reports (as many as the device's storage
    /// keeps, [`crate::storage::DeviceStorage`]'s `HANGS`), oldest first,
    /// passed to `f` one by one under the log's lock; returns how many
    /// there were in all since the device came up.
    pub fn hang_reports(&self, mut f: impl FnMut(&HangReport)) -> u64 {
        let log = self.last_hang.lock();
        log.iter().for_each(&mut f);
        log.total()
    }

    /// Keeps `r` in the hang log (and, with a flight recorder running,
    /// writes the captured submissions before it into its sink).
    pub(crate) fn note_failure_report(&self, r: HangReport) {
        self.last_hang.lock().push(r);
        #[cfg(feature = "capture")]
        self.capture_failure();
    }

    /// Whether the device was lost.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// The last fence emitted on `queue`.
    pub fn last_emitted(&self, queue: QueueId) -> Option<Fence> {
        let q = self.queue(queue)?;
        Some(Fence { id: FenceId { queue, seqno: q.emitted() }, device: self.id })
    }

    /// The fence the next submission on `queue` will have (to wait on it
    /// before it is submitted).
    pub fn next_fence(&self, queue: QueueId) -> Option<Fence> {
        self.last_emitted(queue).map(|f| f.later(1))
    }

    pub(crate) fn queue(&self, queue: QueueId) -> Option<&QueueCore<Raw<B>, B::Queue>> {
        let i = usize::from(queue.0);
        if i < self.nq {
            self.queues.get(i)
        } else {
            None
        }
    }

    /// The completed sequence number of `queue` (0 for a queue the device
    /// does not have). One out-of-line copy on bare metal (called from
    /// eight places).
    #[cfg_attr(target_os = "none", inline(never))]
    pub(crate) fn completed_of(&self, queue: QueueId) -> Seqno {
        self.queue(queue).map_or(Seqno(0), QueueCore::completed)
    }

    pub(crate) fn record_trace(&self, kind: TraceKind, queue: usize, seqno: Seqno, arg: u64) {
        if !cfg!(feature = "trace") {
            return;
        }
        let ts_ns = self.b.platform().now_ns();
        self.trace.lock().record(TraceEvent { ts_ns, kind, queue: queue as u8, seqno: seqno.0, arg });
    }
}
