//! The DWT cycle counter (CYCCNT) for benchmarks: enabled through DEMCR
//! and DWT_CTRL. QEMU may not model it (it then reads 0 or does not
//! count); [`counts`] tells, and the benchmarks fall back to SysTick
//! ticks, which run on the same 25 MHz CPU clock.

const DEMCR: *mut u32 = 0xE000_EDFC as *mut u32;
const DWT_CTRL: *mut u32 = 0xE000_1000 as *mut u32;
const DWT_CYCCNT: *mut u32 = 0xE000_1004 as *mut u32;

/// Enables the counter (DEMCR.TRCENA, DWT_CTRL.CYCCNTENA).
pub fn init() {
    // SAFETY: DEMCR and the DWT are architectural debug registers of
    // ARMv7-M (the DWT's presence is checked by `counts`); setting the
    // enable bits has no memory effects.
    unsafe {
        DEMCR.write_volatile(DEMCR.read_volatile() | (1 << 24));
        DWT_CYCCNT.write_volatile(0);
        DWT_CTRL.write_volatile(DWT_CTRL.read_volatile() | 1);
    }
}

/// CYCCNT now.
pub fn cyccnt() -> u32 {
    // SAFETY: a side-effect-free read of a DWT register.
    unsafe { DWT_CYCCNT.read_volatile() }
}

/// Whether CYCCNT counts: DWT_CTRL.NOCYCCNT clear and the counter moved
/// over a short busy loop.
pub fn counts() -> bool {
    // SAFETY: a side-effect-free read of a DWT register.
    let ctrl = unsafe { DWT_CTRL.read_volatile() };
    if ctrl & (1 << 25) != 0 {
        return false;
    }
    let a = cyccnt();
    for _ in 0..1000 {
        core::hint::spin_loop();
    }
    cyccnt() != a
}
