//! The submission path, shared by both modes.
//!
//! 1. Check the queue, the waits (device, failure, order) and the declared
//!    buffers; a wait on a failed fence refuses the submission
//!    ([`SubmitError::DependencyFailed`]): it never reaches the GPU.
//! 2. Record the commands into IB chunks, with no lock held (a full pool
//!    waits for the oldest fence holding a chunk, or fails, per policy).
//! 3. Under the queue's submit lock: take the next sequence number; under
//!    the dependency lock re-check the waits' failures (closing the race
//!    with a concurrent reset), reject a wait cycle, record the waits (a
//!    full table waits for room, then `TooManyPending`; so does a queue
//!    whose failure history has room only once pending work completes, and
//!    one full of failures not acknowledged refuses, `HistoryFull`: see
//!    `sync::history`); under the memory
//!    lock check the declared buffers; hand the job to the backend (a full
//!    ring releases every lock and waits); note the buffers' use (the
//!    memory lock held across the hand-over, so a concurrent free sees
//!    it); publish the sequence number; commit the chunks.
//!
//! Nothing reaches the hardware after any error, and the queue stays
//! usable.

use crate::cmd::{Command, CommandBuffer, EncodeError, Finished};
use crate::config::PoolExhaustion;
use crate::debug::trace::SubmitRecord;
use crate::error::{FenceStatus, SubmitError};
use crate::hw::{GpuVa, IbRef};
use crate::ibpool::{Pending, Recorder};
use crate::sync::atomic::Ordering;
use crate::sync::deps::MAX_WAITS;
use crate::sync::history::Admission;
use crate::sync::{Fence, FenceId, QueueId, Seqno};

use super::backend::{Backend, EmitError, Job};
use super::buffers::{BufferUse, MAX_BUFFER_USES};
use super::queue::QueueCore;
use super::{Counters, DeviceCore, Raw};

/// A queue's state, as the engine keeps it.
type Queue<B> = QueueCore<Raw<B>, <B as Backend>::Queue>;
use crate::platform::{ForeignSync, Platform};

/// What to submit: the queue, the fences to wait for (of other queues,
/// possibly not emitted yet), and the buffers the work reads and writes.
#[derive(Clone, Copy, Debug)]
pub struct Submit<'a> {
    /// The queue.
    pub queue: QueueId,
    /// Fences to wait for first.
    pub waits: &'a [Fence],
    /// Buffers the work uses (checked, and their frees gated on this
    /// submission: [`crate::mem::buffer::Tracking::Declared`]).
    pub buffers: &'a [BufferUse],
    /// Syncs from outside the device (a sync_file, a syncobj another
    /// process shared) the kernel waits for first. Kernel mode only: the
    /// core can not see them, so they take no part in its dependency
    /// checks.
    pub foreign: &'a [ForeignSync],
}

impl<'a> Submit<'a> {
    /// Work on `queue`, no waits, no declared buffers.
    pub const fn on(queue: QueueId) -> Submit<'a> {
        Submit { queue, waits: &[], buffers: &[], foreign: &[] }
    }

    /// After `waits`.
    pub const fn after(mut self, waits: &'a [Fence]) -> Submit<'a> {
        self.waits = waits;
        self
    }

    /// Using `buffers`.
    pub const fn using(mut self, buffers: &'a [BufferUse]) -> Submit<'a> {
        self.buffers = buffers;
        self
    }

    /// After the foreign syncs `foreign` (kernel mode).
    pub const fn after_foreign(mut self, foreign: &'a [ForeignSync]) -> Submit<'a> {
        self.foreign = foreign;
        self
    }
}

/// The waits a submission still needs the hardware to wait for (fences
/// of this device: `filter_waits` refuses others, so the ids are enough).
struct Waits {
    ids: [FenceId; MAX_WAITS],
    n: usize,
}

impl Waits {
    /// No waits.
    const NONE: Waits = Waits { ids: [FenceId { queue: QueueId(0), seqno: Seqno(0) }; MAX_WAITS], n: 0 };

    fn ids(&self) -> &[FenceId] {
        self.ids.get(..self.n).unwrap_or(&[])
    }
}

impl<'d, B: Backend, const CHUNKS: usize> DeviceCore<'d, B, CHUNKS> {
    /// Records commands with `record` and submits them to `queue` after
    /// `waits` (fences of other queues, possibly not emitted yet) have
    /// signalled. Returns the submission's fence.
    pub fn submit<F>(&self, queue: QueueId, waits: &[Fence], record: F) -> Result<Fence, SubmitError>
    where
        F: FnOnce(&mut Recorder<'_>) -> Result<(), EncodeError>,
    {
        self.submit_with(&Submit { queue, waits, buffers: &[], foreign: &[] }, record)
    }

    /// [`DeviceCore::submit`] with declared buffers.
    pub fn submit_with<F>(&self, s: &Submit<'_>, record: F) -> Result<Fence, SubmitError>
    where
        F: FnOnce(&mut Recorder<'_>) -> Result<(), EncodeError>,
    {
        self.submit_inner(s, record, false)
    }

    /// A submission of the driver's own (buffer moves): no residency
    /// preparation, no validation (it uses temporary mappings).
    pub(crate) fn submit_internal<F>(&self, s: &Submit<'_>, record: F) -> Result<Fence, SubmitError>
    where
        F: FnOnce(&mut Recorder<'_>) -> Result<(), EncodeError>,
    {
        self.submit_inner(s, record, true)
    }

    fn submit_inner<F>(&self, s: &Submit<'_>, record: F, internal: bool) -> Result<Fence, SubmitError>
    where
        F: FnOnce(&mut Recorder<'_>) -> Result<(), EncodeError>,
    {
        let (qi, q) = self.precheck(s)?;
        // Local-memory buffers in place (and pinned until the submission
        // has noted their use). Without declared buffers there is nothing
        // to pin: skip the call and the move of its (large) result.
        let _pins = if internal || s.buffers.is_empty() { None } else { self.prepare_residency(s)? };
        let mut table = None;
        let waits = self.needed_waits(s, qi, &mut table)?;
        let queue = s.queue;
        let batching = self.cfg.batching;
        let completed = |q: QueueId| self.completed_of(q);
        let waited = core::cell::Cell::new(false);
        let mut make_room = |f: FenceId| -> bool {
            waited.set(true);
            self.wait_for_chunk(f)
        };
        // Built where it stays: the recording is not moved between the
        // layers, and the pending chunks are read in its source.
        let mut cb = CommandBuffer::with_encoder(
            self.enc,
            self.ib.recorder(queue, batching, &completed, &mut make_room),
        );
        let finished = record_into(&mut cb, record)?;
        let pending = cb.source().pending();
        if waited.get() {
            Counters::add(&self.stats.pool_waits, 1);
        }
        // Dropping `pending` on a refusal gives its chunks back.
        #[cfg(feature = "validation")]
        if !internal && self.validation() {
            self.validate_ib(s.queue, finished.ib(), s.buffers)?;
        }
        // The commands must be visible to the device before the ring points
        // at them (a no-op on coherent platforms).
        let p = self.b.platform();
        pending.dirty(|off, len| p.cache_clean(self.ib.region(), off, len));
        self.commit(s, (qi, q), waits, finished.ib(), finished.total_dwords, Some(pending))
    }

    /// Submits an IB the caller built and placed in GPU memory itself
    /// (`size_dw` dwords at `ib_va`). With validation on, the IB and every
    /// IB its CHAINs name are read through the CPU's view of their buffers
    /// and checked packet by packet as a recorded IB is; one that can not
    /// be read (a device-only or mapped buffer), whose CHAINs loop or hold
    /// more than [`MAX_CHAIN_HOPS`](super::validate::MAX_CHAIN_HOPS) IBs,
    /// is refused ([`SubmitError::Invalid`]).
    pub fn submit_ib(&self, s: &Submit<'_>, ib_va: u64, size_dw: u64) -> Result<Fence, SubmitError> {
        let max = self.enc.desc().limits.max_ib_dwords;
        if size_dw == 0 {
            return Err(SubmitError::Empty);
        }
        if size_dw > u64::from(max) {
            return Err(SubmitError::IbTooLarge { dwords: size_dw, max });
        }
        let (qi, q) = self.precheck(s)?;
        let _pins = self.prepare_residency(s)?;
        let ib = Command::IndirectBuffer { addr: ib_va, size_dw: size_dw as u32 };
        self.enc.check(&ib).map_err(SubmitError::Encode)?;
        // The IB must lie in a live buffer the CPU can read, and its
        // packets (CHAINs followed) are checked as a recorded IB's are.
        #[cfg(feature = "validation")]
        if self.validation() {
            self.validate_caller_ib(s.queue, IbRef::new(ib_va, size_dw as u32), s.buffers)?;
        }
        let mut table = None;
        let waits = self.needed_waits(s, qi, &mut table)?;
        self.commit(s, (qi, q), waits, IbRef::new(ib_va, size_dw as u32), size_dw, None)
    }

    /// The submission's checks before recording: its queue (index and
    /// state, looked up once for the whole submission), or why not.
    fn precheck(&self, s: &Submit<'_>) -> Result<(usize, &Queue<B>), SubmitError> {
        let qi = usize::from(s.queue.0);
        let q = self.queue(s.queue).ok_or(SubmitError::UnknownQueue(s.queue))?;
        if self.is_lost() {
            return Err(SubmitError::DeviceLost);
        }
        if s.waits.len() > MAX_WAITS {
            return Err(SubmitError::TooManyWaits { given: s.waits.len() });
        }
        if !s.foreign.is_empty() && B::MODE != super::Mode::Kernel {
            return Err(SubmitError::ForeignSyncUnsupported);
        }
        if s.foreign.len() > crate::platform::MAX_FOREIGN {
            return Err(SubmitError::TooManyWaits { given: s.foreign.len() });
        }
        if s.buffers.len() > MAX_BUFFER_USES {
            return Err(SubmitError::TooManyBuffers { given: s.buffers.len() });
        }
        if !s.buffers.is_empty() {
            let mem = self.mem.lock();
            for u in s.buffers {
                mem.buffers.check(u.buffer).map_err(SubmitError::Buffer)?;
            }
        }
        Ok((qi, q))
    }

    /// The waits of `s` that need a hardware wait ([`DeviceCore::filter_waits`]),
    /// noted in `table`; a submission without waits (the usual case)
    /// neither fills a table nor makes the call.
    #[inline(always)]
    fn needed_waits<'w>(
        &self,
        s: &Submit<'_>,
        qi: usize,
        table: &'w mut Option<Waits>,
    ) -> Result<&'w [FenceId], SubmitError> {
        if s.waits.is_empty() {
            return Ok(&[]);
        }
        let w = table.insert(Waits::NONE);
        self.filter_waits(s, qi, w)?;
        Ok(w.ids())
    }

    /// Notes in `w` (empty) the waits that need a hardware wait: drops
    /// those that need none (signalled, same queue) and refuses waits on
    /// failed, foreign or impossible fences. (Filled in place: returning
    /// the table by value cost a copy on every submission.)
    fn filter_waits(&self, s: &Submit<'_>, qi: usize, w: &mut Waits) -> Result<(), SubmitError> {
        for f in s.waits {
            if f.device != self.id {
                return Err(SubmitError::ForeignFence(*f));
            }
            let wq = self.queue(f.id.queue).ok_or(SubmitError::UnknownQueue(f.id.queue))?;
            let same = usize::from(f.id.queue.0) == qi;
            if same && f.id.seqno.is_after(wq.emitted()) {
                return Err(SubmitError::WaitsOnItself(*f));
            }
            match self.status(*f) {
                Ok(FenceStatus::Failed(error)) => {
                    return Err(SubmitError::DependencyFailed { fence: *f, error })
                }
                // An acknowledged fence passed; the application that
                // acknowledged it answers for what depends on it.
                Ok(FenceStatus::Signalled) | Err(crate::error::WaitError::Acknowledged(_)) => continue,
                Ok(FenceStatus::Pending) | Err(crate::error::WaitError::NotSubmitted(_)) => {}
                Err(_) => return Err(SubmitError::UnknownQueue(f.id.queue)),
            }
            if same {
                // Earlier work on the same queue: ring order covers it.
                continue;
            }
            if let Some(id) = w.ids.get_mut(w.n) {
                *id = f.id;
                w.n = w.n.saturating_add(1);
            }
        }
        Ok(())
    }

    /// Waits (servicing the device) until `f`, the oldest fence holding an
    /// IB chunk, has signalled or failed; false to give up.
    fn wait_for_chunk(&self, f: FenceId) -> bool {
        if self.tun.lock().pool_exhaustion == PoolExhaustion::Error {
            return false;
        }
        let limit = self.progress_limit_ns();
        let fence = Fence { id: f, device: self.id };
        crate::log::log_warn!("queue {}: IB pool empty, waiting for {}", f.queue.0, f.seqno.0);
        // A failed fence frees its chunk too, and an acknowledged one has
        // passed.
        matches!(
            self.wait_done(fence, limit),
            Ok(()) | Err(crate::error::WaitError::Failed(_) | crate::error::WaitError::Acknowledged(_))
        )
    }

    /// Whether the failure history of `q` (which has recorded a failure)
    /// has room for a new submission, only once pending work completes, or
    /// not until old failures are acknowledged (see `sync::history`). The
    /// waiters are counted only when a full dependency table would not fit.
    /// Out of line: the submit path of a queue that never failed does not
    /// carry it.
    #[cold]
    #[inline(never)]
    fn history_room(&self, q: &Queue<B>, queue: QueueId, waiting: bool) -> Admission {
        if q.admits_any(waiting) {
            return Admission::Admit;
        }
        let waiters = self.deps.lock().tracked(queue);
        q.admit(waiters, waiting)
    }

    /// One pause of a submission that found no room in its queue's failure
    /// history or the dependency table (the submit lock released): lets
    /// work complete, or refuses with `TooManyPending` once the wait began
    /// `dep_wait_ns` ago. Out of line: a submission that finds room does
    /// not carry it.
    #[cold]
    #[inline(never)]
    fn wait_for_room(&self, queue: QueueId, started: &mut Option<u64>) -> Result<(), SubmitError> {
        let p = self.b.platform();
        let now = p.now_ns();
        let start = *started.get_or_insert_with(|| {
            Counters::add(&self.stats.dep_waits, 1);
            now
        });
        if now.saturating_sub(start) > self.cfg.dep_wait_ns {
            return Err(SubmitError::TooManyPending(queue));
        }
        self.service();
        p.delay_ns(10_000);
        Ok(())
    }

    /// The locked part: sequence number, dependencies, buffers, emit.
    fn commit(
        &self,
        s: &Submit<'_>,
        (qi, q): (usize, &Queue<B>),
        waits: &[FenceId],
        ib: IbRef,
        dwords: u64,
        pending: Option<Pending<'_>>,
    ) -> Result<Fence, SubmitError> {
        let queue = s.queue;
        let p = self.b.platform();
        // When the first wait began (read only once a wait is needed: the
        // clock is not free on every platform).
        let mut start: Option<u64> = None;
        let mut waited_ns = || {
            let now = p.now_ns();
            now.saturating_sub(*start.get_or_insert(now))
        };
        // When the wait for room in the history or the dependency table
        // began (see `wait_for_room`).
        let mut dep_started: Option<u64> = None;
        // Read once: through the loop's calls the compiler would reload it
        // (and keep the dependency code of a submission without waits).
        let waiting = !waits.is_empty();
        // Built once: a retry changes only its sequence number.
        let mut job =
            Job { queue: qi, seqno: Seqno(0), waits, foreign: s.foreign, ib, hold: self.batching() };
        loop {
            let mut qs = q.submit.lock();
            if self.is_lost() {
                return Err(SubmitError::DeviceLost);
            }
            let seqno = q.emitted().next();
            // Room for this submission: in the queue's failure history, for
            // every failure its pending work and this submission could still
            // bring (one load until the queue's first failure), and in the
            // dependency table. Without room: release the queue, let work
            // complete, try again (`TooManyPending` past the wait limit).
            let mut room = q.no_failures() || {
                match self.history_room(q, queue, waiting) {
                    Admission::Admit => true,
                    Admission::WaitForRoom => false,
                    Admission::Full => return Err(SubmitError::HistoryFull(queue)),
                }
            };
            // Dependencies (a submission without waits can not close a cycle).
            if room && waiting {
                let mut deps = self.deps.lock();
                for &id in waits {
                    if let Some(error) = self.queue(id.queue).and_then(|wq| wq.failure(id.seqno)) {
                        return Err(SubmitError::DependencyFailed {
                            fence: Fence { id, device: self.id },
                            error,
                        });
                    }
                }
                deps.check(queue, seqno, waits, |o| self.completed_of(o)).map_err(SubmitError::from)?;
                room = deps.has_room(queue);
                if room {
                    deps.record(queue, seqno, waits).map_err(SubmitError::from)?;
                }
            }
            if !room {
                drop(qs);
                self.wait_for_room(queue, &mut dep_started)?;
                continue;
            }
            // Declared buffers: checked and noted under the memory lock,
            // held across the emit so a concurrent free sees this use.
            let mut mem = if s.buffers.is_empty() { None } else { Some(self.mem.lock()) };
            if let Some(m) = mem.as_ref() {
                if let Some(e) = s.buffers.iter().find_map(|u| m.buffers.check(u.buffer).err()) {
                    drop(mem);
                    if waiting {
                        self.deps.lock().unrecord(queue, seqno);
                    }
                    return Err(SubmitError::Buffer(e));
                }
            }
            job.seqno = seqno;
            match self.b.emit(&mut qs, &job) {
                Ok(info) => {
                    #[cfg(feature = "capture")]
                    let caller = pending.is_none();
                    if let Some(m) = mem.as_mut() {
                        for u in s.buffers {
                            m.buffers.note_use(u.buffer, qi, seqno);
                        }
                    }
                    q.emitted.store(seqno.0, Ordering::Release);
                    drop(mem);
                    // Deferred doorbells: held, or handed over with the
                    // rest once the window passed or the limit is reached.
                    if job.hold {
                        self.note_held(qi, q, &mut qs, seqno);
                    }
                    let fence = FenceId { queue, seqno };
                    // Under the submit lock: the queue's commits are in
                    // order, so the pool's lock can wait for the next pick.
                    if let Some(pd) = pending {
                        pd.commit_in_order(fence);
                    }
                    // Under the submit lock too: the queue's trace stage
                    // has one writer at a time.
                    self.trace_submit((qi, q), seqno, dwords, ib.va, info.wptr);
                    // Under the submit lock: a queue's records in order.
                    #[cfg(feature = "capture")]
                    self.capture_submit(queue, seqno, s.waits, ib, caller);
                    drop(qs);
                    if info.wrapped {
                        Counters::add(&self.stats.ring_wraps, 1);
                    }
                    // Work held back for this submission may go now.
                    self.flush_held();
                    return Ok(Fence { id: fence, device: self.id });
                }
                Err(e) => {
                    drop(mem);
                    if waiting {
                        self.deps.lock().unrecord(queue, seqno);
                    }
                    match e {
                        EmitError::Full(err) => {
                            // Held work first: the engine frees room only
                            // once it was given the work that fills it.
                            if job.hold && self.publish_for_room(qi, q, &mut qs) {
                                drop(qs);
                                return Err(SubmitError::DeviceLost);
                            }
                            // Wait for the engine to consume, checking it
                            // for a hang ourselves (we hold its queue).
                            if let Ok(true) = self.check_locked(qi, &mut qs) {
                                drop(qs);
                                continue;
                            }
                            drop(qs);
                            if waited_ns() > self.tun.lock().hang.window_ns {
                                return Err(err);
                            }
                            self.process_all();
                            p.delay_ns(10_000);
                        }
                        EmitError::Refused(err) => return Err(err),
                        EmitError::Lost => {
                            drop(qs);
                            self.device_lost();
                            return Err(SubmitError::DeviceLost);
                        }
                    }
                }
            }
        }
    }

    /// Notes a submission for the trace: staged in its queue's
    /// [`TraceStage`](crate::debug::trace::TraceStage), without the trace's
    /// lock; when the stage is full, recorded under that lock after the
    /// staged ones. The caller holds `q`'s submit lock.
    fn trace_submit(&self, (qi, q): (usize, &Queue<B>), seqno: Seqno, dwords: u64, ib_va: GpuVa, wptr: u64) {
        if !cfg!(feature = "trace") {
            return;
        }
        let ts_ns = self.b.platform().now_ns();
        let r = SubmitRecord { ts_ns, seqno: seqno.0, dwords, ib_va: ib_va.get(), wptr };
        if !q.trace_stage.push(&r) {
            self.trace_locked().record_submit(qi, &r);
        }
    }
}

/// Runs `record` over `cb`, a command buffer over a recording from
/// [`IbPool::recorder`](crate::ibpool::IbPool::recorder) that nothing was
/// recorded into yet, and closes it: what to call from the ring. The
/// recording's chunks are then still pending: the caller takes
/// [`PoolSource::pending`](crate::ibpool::PoolSource::pending) of `cb`'s
/// source and commits them once the submission reached the GPU, or aborts
/// (dropping the [`Pending`] aborts too). On error the chunks are given
/// back here, and the recording's error becomes the submission's. The
/// buffer and its source stay where the caller built them (no move of
/// either, no copy of the recording); shared by every submission mode.
fn record_into<'a, F>(cb: &mut Recorder<'a>, record: F) -> Result<Finished, SubmitError>
where
    F: FnOnce(&mut Recorder<'a>) -> Result<(), EncodeError>,
{
    let recorded = record(cb);
    match (recorded, cb.finish_in_place()) {
        (Ok(()), Ok(f)) => Ok(f),
        (Err(e), _) | (Ok(()), Err(e)) => {
            // No reference to a chunk's memory outlives its return.
            cb.release_chunks();
            cb.source().pending().abort();
            Err(match e {
                EncodeError::ChunkUnavailable => SubmitError::PoolEmpty,
                EncodeError::Empty => SubmitError::Empty,
                e => SubmitError::Encode(e),
            })
        }
    }
}
