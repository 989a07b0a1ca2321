//! The adaptive fence wait, shared by both modes: check, then spin, sleep
//! or wait for an interrupt as [`crate::config::Config::wait_steps`] says
//! (or let the backend block, e.g. a kernel's timeline wait), until the
//! fence signals, fails, or the timeout passes. A wait holds no lock, so
//! submissions go on while it sleeps.

use crate::debug::TraceKind;
use crate::platform::{IrqWait, Platform};
use crate::queue::{FenceStatus, WaitError};
use crate::sync::Fence;

use super::backend::{Backend, Block};
use super::{Counters, Engine};

impl<'d, B: Backend, const CHUNKS: usize> Engine<'d, B, CHUNKS> {
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
    /// Bounded: every iteration returns, or spins, sleeps or waits for an
    /// interrupt, and the platform's monotonic time moves towards the
    /// timeout. Interrupt and backend waits are capped at a quarter of the
    /// hang window so the hang check keeps running.
    pub(crate) fn wait_done(&self, fence: Fence, timeout_ns: u64) -> Result<(), WaitError> {
        let p = self.b.platform();
        let start = p.now_ns();
        let mut irq_ok = self.cfg.use_irq;
        let mut block_ok = true;
        loop {
            match self.status(fence)? {
                FenceStatus::Signalled => return Ok(()),
                FenceStatus::Failed(e) => return Err(WaitError::Failed(e)),
                FenceStatus::Pending => {}
            }
            let elapsed = p.now_ns().saturating_sub(start);
            if timeout_ns == 0 || elapsed >= timeout_ns {
                return Err(WaitError::Timeout);
            }
            self.service();
            if let FenceStatus::Failed(e) = self.status(fence)? {
                return Err(WaitError::Failed(e));
            }
            let remaining = timeout_ns.saturating_sub(elapsed);
            let cap = (self.tun.lock().hang.window_ns / 4).max(1);
            if block_ok {
                let q = usize::from(fence.id.queue.0);
                match self.b.block(q, fence.id.seqno, remaining.min(cap)) {
                    Block::Unsupported => block_ok = false,
                    Block::Done | Block::TimedOut => continue,
                }
            }
            let interval = self.cfg.wait_interval(elapsed);
            if interval == 0 {
                crate::sync::atomic::spin_hint();
                continue;
            }
            if irq_ok {
                match p.wait_irq(remaining.min(cap)) {
                    IrqWait::Unsupported => irq_ok = false,
                    IrqWait::Interrupt | IrqWait::TimedOut => continue,
                }
            }
            p.delay_ns(interval.min(remaining));
        }
    }
}
