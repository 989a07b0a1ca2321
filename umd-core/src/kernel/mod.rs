//! Kernel mode: the device whose work goes through a kernel driver
//! ([`KernelDevice`], the [`Kernel`] backend of the device core). Not the
//! kernel driver itself (`kmd/`), nor the platform trait the device
//! submits through ([`crate::platform::KernelIo`]).
//!
//! The kernel driver owns the rings, the page tables and hang recovery;
//! the core chooses GPU addresses (as libdrm's VA manager does), records
//! IBs into its pool, checks dependencies, and hands each IB to the kernel
//! with the timeline points it waits for and signals.
//!
//! Everything but the kernel calls is the shared device core's
//! ([`crate::engine`]); [`KernelDevice`] is the device core over this
//! backend.
//! What this backend adds:
//!
//! - **One context per queue.** Queue `q`'s submissions go to a kernel
//!   context on engine `q` and signal points of queue `q`'s timeline equal
//!   to their sequence numbers. When the kernel finds a context guilty (its
//!   job hung or faulted), the engine fails the culprit and everything
//!   after it, and the backend replaces the context; innocent contexts
//!   (their work ran again after another context's reset) go on.
//! - **Completion never runs ahead of a failure.** The timeline also
//!   passes failed work, so a completion read is capped below a guilty
//!   context's culprit until the engine has recorded the failure.
//! - **Wait before signal.** A kernel refuses to wait for a timeline point
//!   nobody submitted yet (DRM: `EINVAL`), but the engine allows waiting for
//!   fences of other queues that are not emitted yet. Such a submission is
//!   *held* here (emitted for the engine, not yet given to the kernel), and
//!   so is every later submission of its queue (order), until the
//!   producers reach the kernel; the wait-before-signal limit
//!   ([`crate::config::HangConfig::unsubmitted_wait_ns`]) fails it as in
//!   direct mode. This is what Mesa's threaded Vulkan queues do.
//! - **Held work goes in one call.** `flush` hands every held submission
//!   of a queue that is ready, from the front, to the kernel in one
//!   [`KernelIo::submit_batch`] (the refgpu driver's `SUBMIT_BATCH`: all
//!   or none), so N held submissions cost one ioctl. With a batch window
//!   ([`crate::config::Config::batch_window_ns`]) every submission is held
//!   until the engine's deferred-doorbell rules flush its queue: the
//!   submissions of one window share one SUBMIT_BATCH.
//! - **Waits in the kernel.** A host wait blocks in the kernel on the
//!   fence's timeline point ([`KernelIo::wait`]), never in a polling loop.

use core::mem::MaybeUninit;

use heapless::Deque;

use crate::config::Config;
use crate::debug::HangReason;
use crate::engine::backend::{
    sealed, Acked, Backend, Block, EmitError, EmitInfo, Failure, Gone, Job, Poll, QueueView,
};
use crate::engine::{DeviceCore, InPlace, InitError};
use crate::error::{SubmitError, WaitError};
use crate::hw::{probe, ChipId, IbRef};
use crate::mem::pagetable::Perms;
use crate::mem::pool::BackingError;
use crate::platform::{
    ContextId, ContextStatus, DmaRegion, ForeignSync, Guilt, KernelIo, KernelJob, KernelSubmitError,
    KernelSync, KernelWait, PlatformError,
};
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::deps::MAX_WAITS;
use crate::sync::{FaultInfo, Fence, FenceError, QueueId, Seqno, MAX_QUEUES};

/// A refgpu driven through a kernel driver, with `CHUNKS` IB chunks.
pub type KernelDevice<'d, P, const CHUNKS: usize = 16> = DeviceCore<'d, Kernel<'d, P>, CHUNKS>;

pub use crate::platform::MAX_FOREIGN;

/// Submissions a queue may hold back (wait before signal, or a batch
/// window) before further submissions to it wait, as for a full ring: as
/// many as a batch window holds at most, so a window's submissions fit.
pub const HELD_JOBS: usize = crate::engine::batch::MAX_HELD as usize;

/// How long teardown waits for the kernel to finish submitted work.
const STOP_WAIT_NS: u64 = 5_000_000_000;

/// A submission the kernel has not been given yet.
#[derive(Clone, Copy, Debug)]
struct Held {
    seqno: Seqno,
    waits: [KernelWait; MAX_WAITS + MAX_FOREIGN],
    n: usize,
    ib: IbRef,
}

impl Held {
    fn waits(&self) -> &[KernelWait] {
        self.waits.get(..self.n).unwrap_or(&[])
    }
}

/// A queue's kernel-side state (behind the queue's submit lock).
#[derive(Debug)]
pub struct KernelQueue {
    /// The context the queue submits to (None only during bring-up or
    /// after teardown).
    ctx: Option<ContextId>,
    /// The core's sequence number = `base` + the context's own.
    base: u64,
    /// Submissions held back, oldest first.
    held: Deque<Held, HELD_JOBS>,
    /// When the oldest held submission was first found waiting for a
    /// fence nobody submitted.
    blocked_since_ns: Option<u64>,
}

impl KernelQueue {
    const fn new() -> KernelQueue {
        KernelQueue { ctx: None, base: 0, held: Deque::new(), blocked_since_ns: None }
    }
}

/// The kernel-mode backend.
#[derive(Debug)]
pub struct Kernel<'d, P: KernelIo> {
    p: &'d P,
    chip: ChipId,
    nq: usize,
    /// Each queue's context, for lock-free completion reads (`id + 1`;
    /// 0: none). Changes only after a failure is recorded.
    ctx: [AtomicU64; MAX_QUEUES],
    /// Each queue's `base` (see [`KernelQueue`]), likewise.
    base: [AtomicU64; MAX_QUEUES],
    /// The last sequence number of each queue the kernel knows (given to
    /// it, or cancelled and signalled): what a held submission waits for.
    submitted: [AtomicU64; MAX_QUEUES],
    /// Submit calls made to the kernel (statistics: `DeviceStats::doorbells`).
    submit_calls: AtomicU64,
}

impl<P: KernelIo> sealed::Sealed for Kernel<'_, P> {}

impl<'d, P: KernelIo> Kernel<'d, P> {
    fn ctx_of(&self, q: usize) -> Option<ContextId> {
        let v = self.ctx.get(q)?.load(Ordering::Acquire);
        v.checked_sub(1).map(|id| ContextId(id as u32))
    }

    fn publish_ctx(&self, q: usize, ctx: Option<ContextId>, base: u64) {
        if let (Some(c), Some(b)) = (self.ctx.get(q), self.base.get(q)) {
            b.store(base, Ordering::Release);
            c.store(ctx.map_or(0, |c| u64::from(c.0).wrapping_add(1)), Ordering::Release);
        }
    }

    fn submitted(&self, q: usize) -> Seqno {
        Seqno(self.submitted.get(q).map_or(0, |s| s.load(Ordering::Acquire)))
    }

    fn note_submitted(&self, q: usize, s: Seqno) {
        if let Some(a) = self.submitted.get(q) {
            a.fetch_max(s.0, Ordering::AcqRel);
        }
    }

    /// Whether every timeline point `waits` names is known to the kernel.
    fn ready(&self, waits: &[KernelWait]) -> bool {
        waits.iter().all(|w| match w {
            KernelWait::Point(s) => Seqno(s.point).is_signalled_by(self.submitted(s.queue as usize)),
            KernelWait::Foreign(_) => true,
        })
    }

    /// Gives `h` to the kernel.
    fn give(&self, qs: &KernelQueue, q: usize, h: &Held) -> Result<(), KernelSubmitError> {
        let ctx = qs.ctx.ok_or(KernelSubmitError::DeviceLost)?;
        let signal = KernelSync { queue: q as u32, point: h.seqno.0 };
        self.submit_calls.fetch_add(1, Ordering::Relaxed);
        let seq = self.p.submit(ctx, h.ib.va.get(), h.ib.dwords, h.waits(), signal)?;
        // The context numbers its jobs from 1; ours continue from `base`.
        if qs.base.wrapping_add(seq) != h.seqno.0 {
            crate::log::log_error!(
                "queue {}: kernel context sequence {} does not match submission {}",
                q,
                seq,
                h.seqno.0
            );
        }
        self.note_submitted(q, h.seqno);
        Ok(())
    }
}

fn submit_error(q: usize, e: KernelSubmitError) -> EmitError {
    match e {
        // The context turned guilty: the engine's check records the
        // failure and replaces the context, then the submission is retried.
        KernelSubmitError::Cancelled => EmitError::Full(SubmitError::QueueRecovering(QueueId(q as u8))),
        KernelSubmitError::DeviceLost | KernelSubmitError::Platform(PlatformError::DeviceLost) => {
            EmitError::Lost
        }
        KernelSubmitError::Platform(p) => EmitError::Refused(SubmitError::Platform(p)),
    }
}

impl<'d, P: KernelIo> Backend for Kernel<'d, P> {
    type P = P;
    type Queue = KernelQueue;
    type Maps = ();
    const MODE: crate::engine::Mode = crate::engine::Mode::Kernel;
    const VA_ALLOCATOR: bool = true;
    type Va<'v> = Option<crate::engine::buffers::DriverVa<'v>>;

    fn platform(&self) -> &P {
        self.p
    }

    fn chip(&self) -> ChipId {
        self.chip
    }

    fn queues(&self) -> usize {
        self.nq
    }

    fn translates(&self) -> bool {
        true
    }

    fn map(&self, _: &mut (), va: u64, region: &DmaRegion, perms: Perms) -> Result<(), BackingError> {
        self.p.bind(va, region, 0, region.len() as u64, !perms.write).map_err(|e| match e {
            PlatformError::DeviceLost => BackingError::DeviceLost,
            _ => BackingError::Map,
        })
    }

    fn unmap(&self, _: &mut (), va: u64, len: u64) -> Result<(), BackingError> {
        self.p.unbind(va, len).map_err(|e| {
            crate::log::log_error!("unbind of {:#x}+{:#x} failed", va, len);
            match e {
                PlatformError::DeviceLost => BackingError::DeviceLost,
                _ => BackingError::Map,
            }
        })
    }

    fn emit(&self, qs: &mut KernelQueue, job: &Job<'_>) -> Result<EmitInfo, EmitError> {
        let mut h = Held {
            seqno: job.seqno,
            waits: [KernelWait::Foreign(ForeignSync(0)); MAX_WAITS + MAX_FOREIGN],
            n: 0,
            ib: job.ib,
        };
        let points = job
            .waits
            .iter()
            .map(|w| KernelWait::Point(KernelSync { queue: u32::from(w.queue.0), point: w.seqno.0 }));
        for w in points.chain(job.foreign.iter().map(|f| KernelWait::Foreign(*f))) {
            if let Some(slot) = h.waits.get_mut(h.n) {
                *slot = w;
                h.n = h.n.saturating_add(1);
            }
        }
        let q = job.queue;
        // A job the engine defers (its batch window) stays held until the
        // engine's flush, which hands the queue's held jobs over in one
        // call.
        if !job.hold && qs.held.is_empty() && self.ready(h.waits()) {
            self.give(qs, q, &h).map_err(|e| submit_error(q, e))?;
            return Ok(EmitInfo::default());
        }
        // Held: after the queue's earlier held work, until its producers
        // reach the kernel.
        qs.held.push_back(h).map_err(|_| EmitError::Full(SubmitError::TooManyPending(QueueId(q as u8))))?;
        Ok(EmitInfo::default())
    }

    fn flush(&self, qs: &mut KernelQueue, q: usize) -> Result<(), Gone> {
        // Every held submission that is ready, from the front (order), in
        // one kernel call: N held jobs flushed are one batch ioctl.
        let mut jobs: heapless::Vec<KernelJob<'_>, HELD_JOBS> = heapless::Vec::new();
        for h in qs.held.iter().take_while(|h| self.ready(h.waits())) {
            let signal = KernelSync { queue: q as u32, point: h.seqno.0 };
            let job = KernelJob { ib_va: h.ib.va.get(), ib_dwords: h.ib.dwords, waits: h.waits(), signal };
            if jobs.push(job).is_err() {
                break;
            }
        }
        let Some(first) = jobs.first().map(|j| j.signal.point) else { return Ok(()) };
        let ctx = qs.ctx.ok_or(Gone)?;
        self.submit_calls.fetch_add(1, Ordering::Relaxed);
        let (queued, error) = match self.p.submit_batch(ctx, &jobs) {
            Ok(seq) => {
                // The context numbers its jobs from 1; ours continue from `base`.
                if qs.base.wrapping_add(seq) != first {
                    crate::log::log_error!(
                        "queue {}: kernel context sequence {} does not match submission {}",
                        q,
                        seq,
                        first
                    );
                }
                (jobs.len(), None)
            }
            Err(e) => (e.queued, Some(e.error)),
        };
        drop(jobs);
        for _ in 0..queued {
            if let Some(h) = qs.held.pop_front() {
                self.note_submitted(q, h.seqno);
                qs.blocked_since_ns = None;
            }
        }
        match error {
            None => Ok(()),
            // Guilty: the check fails the held work with the rest.
            Some(KernelSubmitError::Cancelled) => Ok(()),
            Some(KernelSubmitError::DeviceLost | KernelSubmitError::Platform(PlatformError::DeviceLost)) => {
                Err(Gone)
            }
            Some(KernelSubmitError::Platform(_)) => {
                // The kernel refused work the engine already counts as
                // emitted: it stays held until the wait-before-signal
                // limit fails it.
                let seq = qs.held.front().map_or(0, |h| h.seqno.0);
                crate::log::log_error!("queue {}: kernel refused held submission {}", q, seq);
                Ok(())
            }
        }
    }

    fn queue_state(&self, qs: &KernelQueue, _q: usize) -> crate::engine::backend::QueueHw {
        crate::engine::backend::QueueHw { ring: None, held: Some((qs.held.len(), qs.ctx.is_some())) }
    }

    fn holds(&self) -> bool {
        true
    }

    fn flush_doorbells(&self) -> u64 {
        self.submit_calls.load(Ordering::Relaxed)
    }

    fn poll(&self, q: usize) -> Poll {
        // The timeline first, then the context: a failure is marked on the
        // context before the timeline passes the failed job, so this order
        // never takes a failed job for a completed one.
        let v = match self.p.completed(q as u32) {
            Ok(v) => Seqno(v),
            Err(PlatformError::DeviceLost) => return Poll::Lost,
            Err(_) => return Poll::Unchanged,
        };
        let Some(ctx) = self.ctx_of(q) else { return Poll::Completed(v) };
        let base = self.base.get(q).map_or(0, |b| b.load(Ordering::Acquire));
        match self.p.context_status(ctx) {
            Ok(ContextStatus::Ok | ContextStatus::Innocent) => Poll::Completed(v),
            Ok(ContextStatus::Guilty { seqno, .. }) => {
                let before = Seqno(base.wrapping_add(seqno).wrapping_sub(1));
                Poll::Completed(if v.is_after(before) { before } else { v })
            }
            Ok(ContextStatus::DeviceLost) | Err(PlatformError::DeviceLost) => Poll::Lost,
            Err(_) => Poll::Unchanged,
        }
    }

    fn ack_interrupts(&self) -> Result<Acked, Gone> {
        Ok(Acked::default())
    }

    fn check(&self, qs: &mut KernelQueue, v: &QueueView<'_>) -> Result<Option<Failure>, Gone> {
        let Some(ctx) = qs.ctx else { return Ok(None) };
        match self.p.context_status(ctx) {
            Ok(ContextStatus::Guilty { seqno, cause }) => {
                let culprit = Seqno(qs.base.wrapping_add(seqno));
                // Work before the culprit completed; wait until the engine
                // has seen it (the next completion pass), so only the
                // culprit and what follows it fail.
                if Seqno(culprit.0.wrapping_sub(1)).is_after(v.completed) {
                    return Ok(None);
                }
                let (error, reason) = match cause {
                    Guilt::Hang => (FenceError::DeviceHung, HangReason::KernelReset),
                    Guilt::Fault { status, addr } => match FaultInfo::from_regs(status, addr) {
                        Some(i) => (FenceError::Fault(i), HangReason::Fault(i)),
                        None => (FenceError::DeviceHung, HangReason::KernelReset),
                    },
                };
                return Ok(Some(Failure { error, report: v.uncaptured_report(self, reason) }));
            }
            Ok(ContextStatus::DeviceLost) | Err(PlatformError::DeviceLost) => return Err(Gone),
            Ok(ContextStatus::Ok | ContextStatus::Innocent) | Err(_) => {}
        }
        // Held work waiting for a fence nobody submitted: blocked, not hung,
        // unless the wait-before-signal limit says otherwise.
        let Some(front) = qs.held.front() else {
            qs.blocked_since_ns = None;
            return Ok(None);
        };
        // Held for the batch window (after what the engine published): not
        // the kernel's yet and not judged; the window's rules flush it.
        if front.seqno.is_after(v.emitted) {
            qs.blocked_since_ns = None;
            return Ok(None);
        }
        let missing = front.waits().iter().find_map(|w| match w {
            KernelWait::Point(s) if !Seqno(s.point).is_signalled_by(self.submitted(s.queue as usize)) => {
                Some(crate::sync::FenceId { queue: QueueId(s.queue as u8), seqno: Seqno(s.point) })
            }
            _ => None,
        });
        let Some(producer) = missing else {
            // Ready but still held: the kernel refused it (a flush ran
            // since it became ready). It can never run; fail it and what
            // follows it on the queue rather than hold them forever.
            self.flush(qs, v.queue)?;
            if qs.held.front().is_some_and(|h| self.ready(h.waits())) {
                return Ok(Some(Failure {
                    error: FenceError::DeviceHung,
                    report: v.uncaptured_report(self, HangReason::KernelReset),
                }));
            }
            return Ok(None);
        };
        let now = self.p.now_ns();
        let since = *qs.blocked_since_ns.get_or_insert(now);
        match v.hang.unsubmitted_wait_ns {
            Some(limit) if now.saturating_sub(since) >= limit => Ok(Some(Failure {
                error: FenceError::NeverSignalled { producer },
                report: v.uncaptured_report(self, HangReason::NeverSignalled { producer }),
            })),
            _ => Ok(None),
        }
    }

    fn reset(&self, qs: &mut KernelQueue, _q: usize) -> Result<(), Gone> {
        // The kernel reset its engine already; what the core drops here is
        // the held work (it fails with the rest); `resume` replaces the
        // guilty context.
        qs.held.clear();
        qs.blocked_since_ns = None;
        Ok(())
    }

    fn resume(&self, qs: &mut KernelQueue, q: usize, upto: Seqno) -> Result<(), Gone> {
        // Points the kernel never got (held work) are reached by hand, so
        // waiters, the kernel's included, move on.
        if upto.is_after(self.submitted(q)) {
            self.p.signal(KernelSync { queue: q as u32, point: upto.0 }).map_err(|_| Gone)?;
            self.note_submitted(q, upto);
        }
        let guilty = match qs.ctx {
            Some(c) => matches!(self.p.context_status(c), Ok(ContextStatus::Guilty { .. })),
            None => true,
        };
        if guilty {
            if let Some(old) = qs.ctx.take() {
                self.p.destroy_context(old);
            }
            let ctx = self.p.create_context(q as u32).map_err(|_| Gone)?;
            qs.ctx = Some(ctx);
            qs.base = upto.0;
            self.publish_ctx(q, Some(ctx), upto.0);
        }
        Ok(())
    }

    fn stop(&self) {
        // The kernel finishes (or times out) what it was given.
        let start = self.p.now_ns();
        for q in 0..self.nq {
            let last = self.submitted(q);
            let left = STOP_WAIT_NS.saturating_sub(self.p.now_ns().saturating_sub(start));
            if last.0 != 0 && left > 0 {
                let _ = self.p.wait(KernelSync { queue: q as u32, point: last.0 }, left);
            }
        }
    }

    fn release_queue(&self, qs: &mut KernelQueue) {
        qs.held.clear();
        if let Some(c) = qs.ctx.take() {
            self.p.destroy_context(c);
        }
    }

    fn release(&mut self, _: &mut ()) {
        for q in 0..self.nq {
            self.publish_ctx(q, None, 0);
        }
    }

    fn block(&self, q: usize, seqno: Seqno, timeout_ns: u64) -> Block {
        match self.p.wait(KernelSync { queue: q as u32, point: seqno.0 }, timeout_ns) {
            Ok(true) => Block::Done,
            Ok(false) => Block::TimedOut,
            // The engine's next pass finds out what happened.
            Err(PlatformError::Unsupported) => Block::Unsupported,
            Err(_) => Block::TimedOut,
        }
    }
}

impl<'d, P: KernelIo, const CHUNKS: usize> DeviceCore<'d, Kernel<'d, P>, CHUNKS> {
    /// Brings the device up through the kernel: reads its info, creates a
    /// context per queue and sets up the IB pool in the kernel's VA range.
    /// The large tables live in `storage`; the device borrows it and the
    /// platform for its lifetime.
    pub fn new<
        const BUF: usize,
        const VA: usize,
        const SL: usize,
        const TR: usize,
        const LW: usize,
        const HG: usize,
    >(
        p: &'d P,
        storage: &'d mut crate::storage::DeviceStorage<BUF, VA, SL, TR, LW, HG>,
        cfg: Config,
    ) -> Result<Self, InitError> {
        let info = p.info().map_err(InitError::Platform)?;
        let chip = probe(info.chip_id).map_err(InitError::Probe)?;
        cfg.validate().map_err(InitError::OutOfRange)?;
        let va_size = info.va_end.checked_sub(info.va_start).filter(|s| *s > 0);
        let va_size = va_size.ok_or(InitError::BadConfig("the kernel reports an empty VA range"))?;
        let nq = (info.engines as usize).min(MAX_QUEUES).min(crate::hw::regs::ENGINES as usize);
        let k = Kernel {
            p,
            chip,
            nq,
            ctx: core::array::from_fn(|_| AtomicU64::new(0)),
            base: core::array::from_fn(|_| AtomicU64::new(0)),
            submitted: core::array::from_fn(|_| AtomicU64::new(0)),
            submit_calls: AtomicU64::new(0),
        };
        let mut queues: [KernelQueue; MAX_QUEUES] = core::array::from_fn(|_| KernelQueue::new());
        for (q, qs) in queues.iter_mut().enumerate().take(nq) {
            match p.create_context(q as u32) {
                Ok(c) => {
                    qs.ctx = Some(c);
                    k.publish_ctx(q, Some(c), 0);
                }
                Err(e) => {
                    for qs in queues.iter_mut() {
                        if let Some(c) = qs.ctx.take() {
                            p.destroy_context(c);
                        }
                    }
                    return Err(InitError::Platform(e));
                }
            }
        }
        let mut slot = MaybeUninit::uninit();
        let mut dev =
            DeviceCore::assemble_in(&mut slot, k, storage, cfg, Some((info.va_start, va_size)), (), queues)?;
        dev.init_ib_pool()?;
        Ok(InPlace::into_inner(dev))
    }

    /// The timeline point `fence` signals, for a platform to export (as a
    /// sync_file or a syncobj point) to another process or device.
    /// `NotSubmitted` while the fence's submission is held back (its
    /// producers have not reached the kernel) or not emitted.
    pub fn sync_point(&self, fence: Fence) -> Result<KernelSync, WaitError> {
        if fence.device != self.id() {
            return Err(WaitError::ForeignFence(fence));
        }
        let q = usize::from(fence.id.queue.0);
        if q >= self.queue_count() {
            return Err(WaitError::UnknownQueue(fence.id.queue));
        }
        self.flush_held();
        if !fence.id.seqno.is_signalled_by(self.b.submitted(q)) {
            return Err(WaitError::NotSubmitted(fence));
        }
        Ok(KernelSync { queue: q as u32, point: fence.id.seqno.0 })
    }

    /// What resets did to queue `queue`'s current kernel context (a guilty
    /// context is replaced once the engine has recorded its failure, so a
    /// later call reports the new one).
    pub fn context_status(&self, queue: QueueId) -> Result<ContextStatus, SubmitError> {
        let q = usize::from(queue.0);
        let ctx =
            self.b.ctx_of(q).filter(|_| q < self.queue_count()).ok_or(SubmitError::UnknownQueue(queue))?;
        self.b.platform().context_status(ctx).map_err(SubmitError::Platform)
    }
}
