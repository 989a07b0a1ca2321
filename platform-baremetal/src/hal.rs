//! What a GPU transport needs from the CPU and board (shared by the
//! ivshmem and shared-RAM transports).

use embedded_hal::delay::DelayNs;
use umd_core::platform::IrqWait;

/// What the transport needs from the CPU and board.
pub trait Hal {
    /// The board's delay provider (`embedded-hal`'s `DelayNs`), borrowed
    /// per wait so that several waiters need no lock.
    type Delay<'a>: DelayNs
    where
        Self: 'a;
    /// Monotonic nanoseconds.
    fn now_ns(&self) -> u64;
    /// A delay provider for one wait.
    fn delay(&self) -> Self::Delay<'_>;
    /// Cleans the data cache over `[addr, addr + len)` to the point of
    /// coherency (CPU writes become visible to the device).
    fn cache_clean(&self, addr: usize, len: usize);
    /// Invalidates the data cache over `[addr, addr + len)` (device writes
    /// become visible to the CPU).
    fn cache_invalidate(&self, addr: usize, len: usize);
    /// Waits for a device interrupt (MSI-X) for at most `timeout_ns`.
    fn wait_irq(&self, timeout_ns: u64) -> IrqWait {
        let _ = timeout_ns;
        IrqWait::Unsupported
    }
}

/// Waits `ns` with `hal`'s delay provider (`DelayNs` takes u32 nanoseconds,
/// ~4.3 s: longer waits in steps).
pub(crate) fn delay_ns<H: Hal>(hal: &H, ns: u64) {
    let mut d = hal.delay();
    let mut left = ns;
    while left > 0 {
        let step = left.min(u64::from(u32::MAX));
        d.delay_ns(step as u32);
        left -= step;
    }
}
