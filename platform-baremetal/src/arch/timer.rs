//! The generic timer: monotonic time from `CNTVCT_EL0` at `CNTFRQ_EL0`,
//! and delays (also as `embedded_hal::delay::DelayNs`).

use core::arch::asm;

/// Counter frequency in Hz.
pub fn frequency() -> u64 {
    let f: u64;
    // SAFETY: reading CNTFRQ_EL0 has no side effects.
    unsafe { asm!("mrs {}, cntfrq_el0", out(reg) f, options(nomem, nostack, preserves_flags)) };
    f.max(1)
}

/// Raw counter value.
pub fn ticks() -> u64 {
    let t: u64;
    // SAFETY: the isb orders the read after earlier instructions; reading
    // CNTVCT_EL0 has no side effects.
    unsafe { asm!("isb", "mrs {}, cntvct_el0", out(reg) t, options(nomem, nostack, preserves_flags)) };
    t
}

/// Monotonic nanoseconds since the counter started.
pub fn now_ns() -> u64 {
    (u128::from(ticks()) * 1_000_000_000 / u128::from(frequency())) as u64
}

/// Spins for at least `ns` nanoseconds.
pub fn delay_ns(ns: u64) {
    let end = now_ns().saturating_add(ns);
    while now_ns() < end {
        core::hint::spin_loop();
    }
}

/// The generic timer as an embedded-hal delay provider.
#[derive(Clone, Copy, Debug, Default)]
pub struct Delay;

impl embedded_hal::delay::DelayNs for Delay {
    fn delay_ns(&mut self, ns: u32) {
        delay_ns(u64::from(ns));
    }
}
