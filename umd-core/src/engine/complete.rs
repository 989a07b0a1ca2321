//! Completions and failures: reading the timelines, the bookkeeping that
//! follows them, the service loop (interrupts, hang and fault checks), and
//! what a reset or a lost device does to fences.
//!
//! # Failure propagation
//!
//! A reset cancels a queue's pending range `(completed, emitted]` and
//! records it in that queue's failure history *before* the timeline is
//! forced past it (forcing releases engines waiting on those fences, as
//! amdgpu's force-completion does). Then every pending submission of any
//! queue that waits on a failed fence, directly or through other pending
//! work, is poisoned: its fence will report [`FenceError::Dependency`]
//! naming the first failed producer and the root cause, even though it
//! still runs on the GPU (on input that never arrived). This is the
//! dma-fence rule (an error set on a fence propagates to the fences that
//! depend on it) and Vulkan's: a device-lost result is sticky and nothing
//! after it is trusted. Submissions that arrive later and wait on a failed
//! fence are refused before they reach the GPU
//! ([`crate::error::SubmitError::DependencyFailed`]).

use crate::debug::{HangReason, HangReport, TraceEvent, TraceKind};
use crate::error::{FenceStatus, WaitError};
use crate::hw::GpuVa;
use crate::sync::atomic::Ordering;
use crate::sync::{Fence, FenceError, FenceId, QueueId, Seqno, MAX_QUEUES};

use super::backend::{Backend, Failure, Gone, Poll, QueueView};
use super::queue::Outcome;
use super::{Counters, DeviceCore};
use crate::platform::Platform;

/// Retiring buffers released per queue per completion pass (bounds the
/// time one wait or query spends); what is left goes back on the next
/// completion pass or [`DeviceCore::service`] pass (every wait on pending work
/// runs one), whichever comes first.
const RECLAIM_BUDGET: usize = 64;
/// Trace spans recorded per queue per completion pass.
const SPANS: u64 = 64;

impl<'d, B: Backend, const CHUNKS: usize> DeviceCore<'d, B, CHUNKS> {
    /// Reads queue `qi`'s completion state, advances its timeline, and does
    /// the bookkeeping for newly completed work (trace spans, dependency
    /// entries, retiring buffers). Returns the completed value.
    pub(crate) fn process(&self, qi: usize) -> Seqno {
        let Some(q) = self.queues.get(qi).filter(|_| qi < self.nq) else { return Seqno(0) };
        if self.read_completion(qi).is_err() {
            self.device_lost();
        }
        if let Some((before, now)) = q.claim() {
            self.after_completion(qi, before, now, false);
        }
        q.completed()
    }

    /// Reads queue `qi`'s completion from the device and moves its
    /// timeline on (no bookkeeping); `Gone` when the device is lost.
    fn read_completion(&self, qi: usize) -> Result<(), Gone> {
        let Some(q) = self.queues.get(qi).filter(|_| qi < self.nq) else { return Ok(()) };
        match self.b.poll(qi) {
            Poll::Completed(s) => {
                // A kernel's timeline also passes work whose producer
                // failed (the kernel ran it on input that never arrived):
                // it counts as complete only once its producers have
                // signalled or their failure has been propagated to it.
                let s = if B::MODE == super::Mode::Kernel {
                    self.deps
                        .lock()
                        .cap(QueueId(qi as u8), s, |w| w.is_signalled_by(self.completed_of(w.queue)))
                } else {
                    s
                };
                q.timeline.advance(s);
                Ok(())
            }
            Poll::Unchanged => Ok(()),
            Poll::Lost => Err(Gone),
        }
    }

    /// Returns to the pools up to `budget` frees waiting on queue `qi`
    /// whose fences have passed, and notes whether more are ready (see
    /// `reclaim_backlog`). Memory of a lost device is kept until teardown.
    ///
    /// A pass under the memory lock releases at most
    /// [`super::buffers::DEAD_MAX`] blocks, which are freed to the platform
    /// with the lock dropped; passes repeat until the budget is spent or a
    /// free is not ready, at most one per buffer handle (each pass that
    /// stops for room has moved frees on).
    pub(crate) fn reclaim(&self, qi: usize, budget: usize) -> usize {
        if self.is_lost() {
            return 0;
        }
        let bit = 1u32 << qi;
        let mut total = 0usize;
        let mut passes = 0usize;
        loop {
            let mut off = super::buffers::OffLock::new();
            let (n, more) = {
                let mut mem = self.mem.lock();
                let (buffers, mut backer) = mem.split(&self.b, &mut off);
                let left = budget.saturating_sub(total);
                let n = buffers.reclaim(&mut backer, qi, &|q| self.completed_of(QueueId(q as u8)), left);
                // Short of the budget and with room for released blocks, the
                // reclaim stopped at a free that is not ready (or at none).
                let stopped_early = n >= left || !backer.off.can_release();
                let ready = stopped_early && buffers.front_ready(qi, self.completed_of(QueueId(qi as u8)));
                // Stopped for room with frees still ready: another pass
                // (at most one per buffer handle).
                passes = passes.saturating_add(1);
                let more = ready && n < left && !backer.off.can_release() && passes <= buffers.capacity();
                // Short of the budget (and of room), the reclaim stopped
                // at a free that is not ready (or at none).
                if !more {
                    if ready {
                        self.reclaim_backlog.fetch_or(bit, Ordering::Relaxed);
                    } else if self.reclaim_backlog.load(Ordering::Relaxed) & bit != 0 {
                        self.reclaim_backlog.fetch_and(!bit, Ordering::Relaxed);
                    }
                }
                (n, more)
            };
            if !off.is_empty() {
                off.finish(self.b.platform());
            }
            total = total.saturating_add(n);
            if !more {
                return total;
            }
        }
    }

    /// Returns to the pools every free, on every queue, whose fences have
    /// passed (no budget). Returns how many.
    pub(crate) fn reclaim_ready(&self) -> usize {
        let mut n = 0usize;
        for qi in 0..self.nq {
            n = n.saturating_add(self.reclaim(qi, usize::MAX));
        }
        n
    }

    /// Bookkeeping for `(before, now]` of queue `qi`: done by the one
    /// caller that moved `processed` (or by a reset, for `cancelled` work,
    /// which gets no signalled count or trace span).
    fn after_completion(&self, qi: usize, before: Seqno, now: Seqno, cancelled: bool) {
        let queue = QueueId(qi as u8);
        self.deps.lock().retire(queue, now);
        let n = now.distance(before).max(0) as u64;
        if !cancelled {
            Counters::add(&self.stats.fences_signalled, n);
        }
        self.reclaim(qi, RECLAIM_BUDGET);
        if cancelled || !cfg!(feature = "trace") {
            return;
        }
        let ts = self.b.platform().now_ns();
        // This queue's submissions first (their submit times).
        let mut trace = self.trace.lock();
        self.unstage(&mut trace, qi);
        let steps = n.min(SPANS);
        for k in 0..steps {
            let s = now.0.wrapping_sub(steps.saturating_sub(1)).wrapping_add(k);
            let submitted = trace.submitted_at(qi, s).unwrap_or(0);
            trace.record(TraceEvent {
                ts_ns: ts,
                kind: TraceKind::FenceSignalled,
                queue: qi as u8,
                seqno: s,
                arg: submitted,
            });
        }
    }

    /// Reads every queue (see [`DeviceCore::process`]), after handing held
    /// work to the hardware. One shared copy with `size-first` on bare
    /// metal (four callers).
    #[cfg_attr(all(feature = "size-first", target_os = "none"), inline(never))]
    pub(crate) fn process_all(&self) {
        self.flush_held();
        self.expire_held();
        for qi in 0..self.nq {
            self.process(qi);
        }
    }

    /// Lets the backend hand held-back submissions (kernel mode's wait
    /// before signal) to the hardware, on every queue whose submit lock is
    /// free (a busy queue's holder flushes it) and that holds no work for
    /// the batch window.
    pub(crate) fn flush_held(&self) {
        if !self.b.holds() {
            return;
        }
        for qi in 0..self.nq {
            let Some(q) = self.queues.get(qi) else { continue };
            // Work held for the batch window goes by the window's rules
            // (`super::batch`); what the backend holds behind it waits
            // for it anyway (queue order).
            let Some(mut qs) = q.submit.try_lock() else { continue };
            if self.held_count(q) != 0 {
                continue;
            }
            if self.b.flush(&mut qs, qi).is_err() {
                drop(qs);
                self.device_lost();
                return;
            }
        }
    }

    /// Where `fence` stands, without waiting.
    pub(crate) fn status(&self, fence: Fence) -> Result<FenceStatus, WaitError> {
        if fence.device != self.id {
            return Err(WaitError::ForeignFence(fence));
        }
        let qi = usize::from(fence.id.queue.0);
        let q = self.queue(fence.id.queue).ok_or(WaitError::UnknownQueue(fence.id.queue))?;
        let emitted = q.emitted();
        if fence.id.seqno.is_after(emitted) {
            return Err(WaitError::NotSubmitted(fence));
        }
        // A held fence goes to the hardware before anyone waits on it.
        self.touch(qi, fence.id.seqno);
        self.process(qi);
        Ok(match q.outcome(fence.id.seqno) {
            Outcome::Signalled => FenceStatus::Signalled,
            Outcome::Failed(e) => FenceStatus::Failed(e),
            Outcome::Pending => FenceStatus::Pending,
            Outcome::Acknowledged => return Err(WaitError::Acknowledged(fence)),
        })
    }

    /// Acknowledges the outcomes of `fence`'s queue up to `fence` (or up to
    /// the queue's completed point, if that is earlier: pending work may
    /// still fail). The application has taken note of them and asks about
    /// none of them again: the queue's failure history forgets them, which
    /// makes room once it is full ([`crate::error::SubmitError::HistoryFull`]).
    /// From then on those fences answer [`WaitError::Acknowledged`] to a
    /// query or a wait, never a different outcome, and count as passed for
    /// a submission that waits on one (the application that acknowledged a
    /// failure answers for what it makes depend on it). Returns the fence up
    /// to which the queue's outcomes are acknowledged (it never moves back).
    pub fn acknowledge_failures(&self, fence: Fence) -> Result<Fence, WaitError> {
        if fence.device != self.id {
            return Err(WaitError::ForeignFence(fence));
        }
        let qi = usize::from(fence.id.queue.0);
        let q = self.queue(fence.id.queue).ok_or(WaitError::UnknownQueue(fence.id.queue))?;
        if fence.id.seqno.is_after(q.emitted()) {
            return Err(WaitError::NotSubmitted(fence));
        }
        self.process(qi);
        let point = q.acknowledge(fence.id.seqno);
        Ok(Fence { id: FenceId { queue: fence.id.queue, seqno: point }, device: self.id })
    }

    /// Where `fence` stands, without waiting (but servicing the device).
    pub fn query(&self, fence: Fence) -> Result<FenceStatus, WaitError> {
        self.status(fence)
    }

    /// Acknowledges interrupts, processes completions, takes back every
    /// free whose fences have passed, and checks every
    /// queue with work for faults and hangs. A stuck queue is reset, its
    /// pending fences fail (and the work that waits on them), and its
    /// report is kept (see [`DeviceCore::last_hang`]) and returned: when the
    /// pass failed a queue, the latest report the device kept (a device
    /// lost in the reset reports that). A queue whose submit lock is busy
    /// is skipped: its holder services it.
    pub fn service(&self) -> Option<HangReport> {
        if self.is_lost() {
            return None;
        }
        match self.b.ack_interrupts() {
            Ok(acked) => {
                if acked.any {
                    Counters::add(&self.stats.irq_status_acks, 1);
                }
                self.fault_irqs.note(acked.faults);
            }
            Err(Gone) => {
                self.device_lost();
                return None;
            }
        }
        self.process_all();
        for qi in 0..self.nq {
            if self.reclaim_backlog.load(Ordering::Relaxed) & (1u32 << qi) != 0 {
                self.reclaim(qi, usize::MAX);
            }
        }
        let mut report = None;
        for qi in 0..self.nq {
            let Some(q) = self.queues.get(qi) else { continue };
            let Some(mut qs) = q.submit.try_lock() else { continue };
            match self.check_locked(qi, &mut qs) {
                // The report fail_locked kept (one copy of it, not two).
                Ok(true) => report = self.last_hang.lock().last(),
                Ok(false) => {}
                Err(Gone) => {
                    drop(qs);
                    self.device_lost();
                    return None;
                }
            }
        }
        report
    }

    /// The hang and fault check of queue `qi`, whose submit lock the
    /// caller holds: whether the queue failed (its report is then in
    /// `last_hang`).
    pub(crate) fn check_locked(&self, qi: usize, qs: &mut B::Queue) -> Result<bool, Gone> {
        let Some(q) = self.queues.get(qi) else { return Ok(false) };
        let view = QueueView {
            queue: qi,
            // Held work (deferred doorbells) is not the hardware's yet:
            // not judged.
            emitted: if self.batching() { q.published() } else { q.emitted() },
            completed: q.completed(),
            blocked_on: self.blocked_on(qi),
            hang: self.tun.lock().hang,
            ib: (GpuVa::new(self.ib.range().0), self.ib.region()),
            fault_irq: self.fault_irqs.take(qi),
        };
        let Some(failure) = self.b.check(qs, &view)? else { return Ok(false) };
        let upto = q.emitted();
        self.fail_locked(qi, qs, failure, upto);
        Ok(true)
    }

    /// The unsignalled fence of another queue that queue `qi`'s next
    /// submission waits for, and whether it is emitted.
    fn blocked_on(&self, qi: usize) -> Option<(FenceId, bool)> {
        let q = self.queues.get(qi)?;
        let f = self.deps.lock().blocked_on(QueueId(qi as u8), q.completed(), |o| self.completed_of(o))?;
        let emitted = self.queue(f.queue).is_some_and(|o| f.seqno.is_signalled_by(o.emitted()));
        Some((f, emitted))
    }

    /// Fails queue `qi`'s pending work `(completed, upto]`: resets the
    /// queue (the caller holds its submit lock), records `failure.error`
    /// for that work, poisons the work that depends on it, moves the
    /// timeline on and records the report (the numbered steps below).
    #[cfg_attr(not(feature = "hang-capture"), allow(unused_mut))]
    pub(crate) fn fail_locked(&self, qi: usize, qs: &mut B::Queue, mut failure: Failure, upto: Seqno) {
        let Some(q) = self.queues.get(qi) else { return };
        // A fault names the buffer nearest its address (before the reset
        // recycles what the cancelled work held); part of the capture.
        #[cfg(feature = "hang-capture")]
        if let Some(info) = failure.report.fault {
            failure.report.near = self.nearest_buffer(info.addr);
        }
        let after = q.completed();
        let queue = QueueId(qi as u8);
        let n = upto.distance(after).max(0) as u64;
        // 1. Stop the engine. A device that can not even do that is gone.
        if self.b.reset(qs, qi).is_err() {
            self.device_lost_holding(Some(qi));
            return;
        }
        // 2. Remember the failure before anything can see the timeline pass it.
        q.record_failure(after, upto, failure.error);
        // Held work was cancelled with the rest (the ring starts empty).
        q.published.store(upto.0, Ordering::Release);
        // 3. Poison what waits on it.
        self.propagate();
        // 4. Release engines waiting on the cancelled work; move the timeline on.
        let resume_ok = self.b.resume(qs, qi, upto).is_ok();
        q.timeline.force(upto);
        // Cancelled work gets no trace spans (`processed` moves past it) but
        // its dependencies and the buffers it held are released below.
        q.processed.store(upto.0, Ordering::Release);
        self.deps.lock().clear(queue);
        match failure.report.reason {
            HangReason::Fault(info) => {
                Counters::add(&self.stats.faults, 1);
                crate::log::log_error!(
                    "queue {}: {} fault on {} at {:#x} (opcode {:#x}); {} fences failed",
                    qi,
                    info.kind.name(),
                    info.access.name(),
                    info.addr,
                    info.opcode,
                    n
                );
            }
            HangReason::DeviceLost => {}
            _ => {
                Counters::add(&self.stats.hangs, 1);
                crate::log::log_error!(
                    "queue {}: hang at packet {:#x} (rptr {:#x}); {} fences failed, engine reset",
                    qi,
                    failure.report.cur_addr,
                    failure.report.rptr,
                    n
                );
            }
        }
        Counters::add(&self.stats.resets, 1);
        let kind = if matches!(failure.report.reason, HangReason::Fault(_)) {
            TraceKind::Fault
        } else {
            TraceKind::Hang
        };
        self.record_trace(kind, qi, upto, failure.report.cur_addr);
        self.record_trace(TraceKind::Reset, qi, upto, n);
        self.note_failure_report(failure.report);
        // Buffers the cancelled work held are free now that the engine is idle.
        self.after_completion(qi, after, upto, true);
        if !resume_ok {
            self.device_lost_holding(Some(qi));
        }
    }

    /// The buffer nearest GPU address `addr`, for fault reports.
    #[cfg(feature = "hang-capture")]
    pub(crate) fn nearest_buffer(&self, addr: u64) -> Option<crate::debug::NearBuffer> {
        let (info, handle) = self.mem.lock().buffers.nearest(addr)?;
        Some(crate::debug::NearBuffer {
            tag: info.tag,
            serial: info.serial,
            va: info.va,
            size: info.size,
            freed: handle.is_none(),
            addr,
        })
    }

    /// Poisons every pending submission that waits (transitively) on a
    /// failed fence: its fence will fail with the producer's error. The
    /// failed fences are read from the queues' histories (where the root
    /// failure was recorded first), so no scratch list is needed.
    fn propagate(&self) {
        // Each round poisons at least one entry or stops.
        let rounds = crate::storage::PENDING_WAITS.saturating_mul(MAX_QUEUES).saturating_add(1);
        for _ in 0..rounds {
            // The first waiter of a failed fence that has not failed itself.
            let found = self.deps.lock().find_waiter(|consumer, producer| {
                let e = self.queue(producer.queue)?.failure(producer.seqno)?;
                let done = self.queue(consumer.queue).is_none_or(|q| q.failure(consumer.seqno).is_some());
                (!done).then(|| (consumer, e.propagated(producer)))
            });
            let Some((consumer, error)) = found else { break };
            if let Some(cq) = self.queue(consumer.queue) {
                cq.record_failure(Seqno(consumer.seqno.0.wrapping_sub(1)), consumer.seqno, error);
            }
            Counters::add(&self.stats.propagated_failures, 1);
        }
    }

    /// The device stopped answering: every pending fence fails with
    /// `DeviceLost`; memory that pending work held is never reused
    /// (released at teardown). The caller holds no submit lock (see
    /// [`DeviceCore::device_lost_holding`]).
    pub(crate) fn device_lost(&self) {
        self.device_lost_holding(None);
    }

    /// [`DeviceCore::device_lost`] for a caller that holds queue `held`'s
    /// submit lock (and no other lock).
    ///
    /// The first caller to meet the loss sets the flag, then fails each
    /// queue's pending range under that queue's submit lock (one lock at a
    /// time, the held one not taken again), after a last reading of the
    /// queue's completion: a submitter that holds the lock when the flag
    /// is set publishes its sequence number before the range is read, and
    /// its fence fails with the others; one that takes the lock afterwards
    /// sees the flag and is refused. So every fence emitted before or
    /// after the loss is answered, and no wait on one is left pending.
    /// Later callers return at once, and never wait for a lock. The first
    /// caller's waits end: while it waits for a submit lock it holds no
    /// lock but the one it came with, and every other holder of a submit
    /// lock waits for no submit lock (its hold is bounded bookkeeping).
    pub(crate) fn device_lost_holding(&self, held: Option<usize>) {
        if self.lost.swap(true, Ordering::AcqRel) {
            return;
        }
        crate::log::log_error!("device lost: failing every pending fence");
        for qi in 0..self.nq {
            let Some(q) = self.queues.get(qi) else { continue };
            // A fence the device wrote before the loss counts as
            // signalled, whichever thread reads it first: the reading
            // before the range is taken leaves none for another thread's
            // pass to move the timeline onto after the failure.
            let observe = || {
                let _ = self.read_completion(qi);
            };
            let Some((after, upto)) = q.fail_pending(held == Some(qi), FenceError::DeviceLost, observe)
            else {
                continue;
            };
            let report = HangReport::uncaptured(
                QueueId(qi as u8),
                HangReason::DeviceLost,
                self.b.platform().now_ns(),
                self.b.chip().generation,
                (upto, after),
            );
            self.note_failure_report(report);
        }
    }
}
