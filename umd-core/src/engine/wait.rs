//! The adaptive fence wait, shared by both modes: check, then spin, sleep
//! or wait for an interrupt as [`crate::config::Config::wait_steps`] says
//! (or let the backend block, e.g. a kernel's timeline wait), until the
//! fence signals, fails, or the timeout passes. A wait holds no lock, so
//! submissions go on while it sleeps.
//!
//! [`DeviceCore::wait_passed`] follows the same schedule but waits for the
//! queue's timeline to pass the fence, failed or not: a fence that failed
//! through a dependency answers at once, while its work may still run on
//! the GPU and use its memory.

use crate::debug::TraceKind;
use crate::error::{FenceStatus, WaitError};
use crate::platform::{IrqWait, Platform};
use crate::sync::{Fence, FenceError, Seqno};

use super::backend::{Backend, Block};
use super::{Counters, DeviceCore};

impl<'d, B: Backend, const CHUNKS: usize> DeviceCore<'d, B, CHUNKS> {
    /// Waits until `fence` signals, fails, or `timeout_ns` passes (0: just
    /// check). Follows the adaptive schedule of the configuration, with
    /// interrupts when the platform has them, and services the device
    /// while it waits (a hang detected here resets the queue and fails the
    /// fence).
    pub fn wait(&self, fence: Fence, timeout_ns: u64) -> Result<(), WaitError> {
        let p = self.b.platform();
        let start = p.now_ns();
        let qi = usize::from(fence.id.queue.0);
        self.record_trace(TraceKind::WaitBegin, qi, fence.id.seqno, timeout_ns);
        let r = self.wait_done(fence, timeout_ns);
        let end = p.now_ns();
        Counters::add(&self.stats.wait_ns, end.saturating_sub(start));
        let code = match r {
            Ok(()) => 0,
            Err(WaitError::Timeout) => 1,
            Err(_) => 2,
        };
        self.record_trace(TraceKind::WaitEnd, qi, fence.id.seqno, code);
        r
    }

    /// The wait loop (no trace, no statistics).
    ///
    /// Bounded: every second iteration returns, or spins, sleeps or waits
    /// for an interrupt, and the platform's monotonic time moves towards the
    /// timeout. Interrupt and backend waits are capped at a quarter of the
    /// hang window so the hang check keeps running.
    pub(crate) fn wait_done(&self, fence: Fence, timeout_ns: u64) -> Result<(), WaitError> {
        let p = self.b.platform();
        let start = p.now_ns();
        let mut how = Pause { irq_ok: self.cfg.use_irq, block_ok: true };
        // Each round: look, check the time, service, look again, pause
        // (one place that looks, which answers after the service pass too).
        let mut serviced = None;
        loop {
            match self.status(fence)? {
                FenceStatus::Signalled => return Ok(()),
                FenceStatus::Failed(e) => return Err(WaitError::Failed(e)),
                FenceStatus::Pending => {}
            }
            if let Some(elapsed) = serviced.take() {
                self.pause(&mut how, usize::from(fence.id.queue.0), fence.id.seqno, elapsed, timeout_ns);
                continue;
            }
            let elapsed = p.now_ns().saturating_sub(start);
            if timeout_ns == 0 || elapsed >= timeout_ns {
                return Err(WaitError::Timeout);
            }
            self.service();
            serviced = Some(elapsed);
        }
    }

    /// Waits until `fence`'s queue has passed it on the GPU, whether it
    /// signalled or failed, or `timeout_ns` passes (0: just check), on the
    /// schedule of [`DeviceCore::wait`], servicing the device meanwhile.
    ///
    /// Unlike [`DeviceCore::wait`], a failed fence does not answer at once: work
    /// that failed through a dependency still runs and uses its memory until
    /// its queue passes it, and a hung queue passes its cancelled fences
    /// when it is reset. After a device loss nothing passes any more (the
    /// device's memory stays in use until teardown): the answer is then
    /// `Failed(DeviceLost)`, also for a fence that had passed. The checks
    /// and errors of [`DeviceCore::wait`] for the fence itself are the same
    /// (`ForeignFence`, `UnknownQueue`, `NotSubmitted`).
    ///
    /// Bounded as `wait`: every iteration returns or spins, sleeps or
    /// waits for an interrupt, and time moves towards the timeout.
    pub fn wait_passed(&self, fence: Fence, timeout_ns: u64) -> Result<(), WaitError> {
        if fence.device != self.id {
            return Err(WaitError::ForeignFence(fence));
        }
        let q = self.queue(fence.id.queue).ok_or(WaitError::UnknownQueue(fence.id.queue))?;
        if fence.id.seqno.is_after(q.emitted()) {
            return Err(WaitError::NotSubmitted(fence));
        }
        let qi = usize::from(fence.id.queue.0);
        let p = self.b.platform();
        let start = p.now_ns();
        let mut how = Pause { irq_ok: self.cfg.use_irq, block_ok: true };
        self.touch(qi, fence.id.seqno);
        loop {
            let completed = self.process(qi);
            if self.is_lost() {
                return Err(WaitError::Failed(FenceError::DeviceLost));
            }
            if fence.id.seqno.is_signalled_by(completed) {
                return Ok(());
            }
            let elapsed = p.now_ns().saturating_sub(start);
            if timeout_ns == 0 || elapsed >= timeout_ns {
                return Err(WaitError::Timeout);
            }
            self.service();
            self.pause(&mut how, qi, fence.id.seqno, elapsed, timeout_ns);
        }
    }

    /// One pause of a wait loop on queue `qi` reaching `seqno`, `elapsed`
    /// into a wait of `timeout_ns` (less than it): the backend blocks, or a
    /// spin, an interrupt wait or a sleep, as the schedule says. Interrupt
    /// and backend waits are capped at a quarter of the hang window so the
    /// hang check keeps running; `how` remembers which of them the
    /// platform and backend turned out not to support. One shared copy for
    /// the two wait loops with `size-first` on bare metal.
    #[cfg_attr(all(feature = "size-first", target_os = "none"), inline(never))]
    #[cfg_attr(not(all(feature = "size-first", target_os = "none")), inline)]
    fn pause(&self, how: &mut Pause, qi: usize, seqno: Seqno, elapsed: u64, timeout_ns: u64) {
        let p = self.b.platform();
        let remaining = timeout_ns.saturating_sub(elapsed);
        let cap = (self.tun.lock().hang.window_ns / 4).max(1);
        if how.block_ok {
            match self.b.block(qi, seqno, remaining.min(cap)) {
                Block::Unsupported => how.block_ok = false,
                Block::Done | Block::TimedOut => return,
            }
        }
        let interval = self.cfg.wait_interval(elapsed);
        if interval == 0 {
            crate::sync::atomic::spin_hint();
            return;
        }
        if how.irq_ok {
            match p.wait_irq(remaining.min(cap)) {
                IrqWait::Unsupported => how.irq_ok = false,
                IrqWait::Interrupt | IrqWait::TimedOut => return,
            }
        }
        p.delay_ns(interval.min(remaining));
    }

    /// How long a wait for the driver's own progress (an IB chunk, memory
    /// held by pending work, a buffer move) lasts before it gives up: one
    /// hang window more than the hang check allows without a fence, so a
    /// hang is detected and recovered first. One out-of-line copy for its
    /// three uses (a 64-bit multiplication is long on 32-bit targets; none
    /// is on a fast path).
    #[inline(never)]
    pub(crate) fn progress_limit_ns(&self) -> u64 {
        let hang = self.tun.lock().hang;
        hang.window_ns.saturating_mul(u64::from(hang.max_windows_without_fence.max(1)).saturating_add(1))
    }
}

/// Which ways of pausing a wait loop may still work (see `DeviceCore::pause`).
struct Pause {
    irq_ok: bool,
    block_ok: bool,
}
