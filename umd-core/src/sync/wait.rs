//! The adaptive fence wait, shared by both submission modes: check, then
//! spin, sleep or wait for an interrupt as [`Config::wait_steps`] says,
//! until the fence signals, fails, or the timeout passes.

use crate::config::Config;
use crate::platform::{IrqWait, Platform};
use crate::queue::{FenceStatus, WaitError};
use crate::sync::Fence;

/// What a device offers the wait loop.
pub(crate) trait Waiter {
    /// The platform, for time, sleeps and interrupts.
    type P: Platform;
    /// Where `fence` stands now.
    fn status(&mut self, fence: Fence) -> Result<FenceStatus, WaitError>;
    /// Work to do between checks (acknowledge interrupts, hang check).
    fn between_checks(&mut self) {}
    /// The platform.
    fn platform(&self) -> &Self::P;
    /// The configuration.
    fn config(&self) -> &Config;
}

/// Waits for `fence` for at most `timeout_ns` (0: one check, no sleep).
///
/// Bounded: every iteration returns, or spins, sleeps or waits for an
/// interrupt, and the platform's monotonic time moves towards the timeout.
/// Interrupt waits are capped at a quarter of the hang window so the hang
/// check keeps running.
pub(crate) fn wait_for<W: Waiter>(
    w: &mut W,
    fence: Fence,
    timeout_ns: u64,
    start: u64,
) -> Result<(), WaitError> {
    let mut irq_ok = w.config().use_irq;
    loop {
        match w.status(fence)? {
            FenceStatus::Signalled => return Ok(()),
            FenceStatus::Failed(e) => return Err(WaitError::Failed(e)),
            FenceStatus::Pending => {}
        }
        let elapsed = w.platform().now_ns().saturating_sub(start);
        if timeout_ns == 0 || elapsed >= timeout_ns {
            return Err(WaitError::Timeout);
        }
        w.between_checks();
        if let FenceStatus::Failed(e) = w.status(fence)? {
            return Err(WaitError::Failed(e));
        }
        let remaining = timeout_ns.saturating_sub(elapsed);
        let interval = w.config().wait_interval(elapsed);
        if interval == 0 {
            crate::sync::atomic::spin_hint();
            continue;
        }
        if irq_ok {
            let cap = (w.config().hang.window_ns / 4).max(1);
            match w.platform().wait_irq(remaining.min(cap)) {
                IrqWait::Unsupported => irq_ok = false,
                IrqWait::Interrupt | IrqWait::TimedOut => continue,
            }
        }
        w.platform().delay_ns(interval.min(remaining));
    }
}
