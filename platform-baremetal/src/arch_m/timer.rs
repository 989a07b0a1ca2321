//! Monotonic time from SysTick: the 24-bit down counter on the CPU clock
//! (25 MHz on `mps2-an386`, QEMU's `SYSCLK_FRQ`), reloaded every 2^24
//! ticks (0.67 s); the SysTick exception counts the wraps in a 32-bit
//! atomic (no 64-bit atomics on the M4), which gives a 64-bit tick count
//! for 91 years. Delays busy-wait on it (also as
//! `embedded_hal::delay::DelayNs`).

use core::sync::atomic::{AtomicU32, Ordering};

/// CPU (and SysTick) clock of the board in Hz.
pub const CPU_HZ: u64 = 25_000_000;
const RELOAD: u32 = 0x00FF_FFFF;
const SYST_CSR: *mut u32 = 0xE000_E010 as *mut u32;
const SYST_RVR: *mut u32 = 0xE000_E014 as *mut u32;
const SYST_CVR: *mut u32 = 0xE000_E018 as *mut u32;
const SCB_ICSR: *const u32 = 0xE000_ED04 as *const u32;
/// ICSR.PENDSTSET: the SysTick exception is pending.
const PENDSTSET: u32 = 1 << 26;

static WRAPS: AtomicU32 = AtomicU32::new(0);

/// Starts SysTick: CPU clock, full reload, exception on wrap.
pub fn init() {
    // SAFETY: the SysTick registers of the System Control Space, present
    // on every ARMv7-M; programming them has no memory effects.
    unsafe {
        SYST_CSR.write_volatile(0);
        SYST_RVR.write_volatile(RELOAD);
        SYST_CVR.write_volatile(0);
        // ENABLE | TICKINT | CLKSOURCE (processor clock).
        SYST_CSR.write_volatile(0b111);
    }
}

/// The SysTick exception: one more wrap.
pub fn on_systick() {
    WRAPS.fetch_add(1, Ordering::AcqRel);
}

/// Ticks of the CPU clock since [`init`].
pub fn ticks() -> u64 {
    loop {
        let w = WRAPS.load(Ordering::Acquire);
        // SAFETY: reads of SysTick's current value and the SCB's ICSR,
        // side-effect free.
        let (cur, icsr) = unsafe { (SYST_CVR.read_volatile() & RELOAD, SCB_ICSR.read_volatile()) };
        if WRAPS.load(Ordering::Acquire) != w {
            continue; // the exception ran in between: read again
        }
        // A wrap whose exception is still pending (interrupts masked):
        // the counter restarted high, count that wrap here.
        let pending = icsr & PENDSTSET != 0 && cur > RELOAD / 2;
        let wraps = u64::from(w) + u64::from(pending);
        return wraps * (u64::from(RELOAD) + 1) + u64::from(RELOAD - cur);
    }
}

/// Monotonic nanoseconds since [`init`] (40 ns steps).
pub fn now_ns() -> u64 {
    ticks().saturating_mul(1_000_000_000 / CPU_HZ)
}

/// Spins for at least `ns` nanoseconds.
pub fn delay_ns(ns: u64) {
    let end = now_ns().saturating_add(ns);
    while now_ns() < end {
        core::hint::spin_loop();
    }
}

/// SysTick as an embedded-hal delay provider.
#[derive(Clone, Copy, Debug, Default)]
pub struct Delay;

impl embedded_hal::delay::DelayNs for Delay {
    fn delay_ns(&mut self, ns: u32) {
        delay_ns(u64::from(ns));
    }
}
