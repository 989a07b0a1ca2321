//! One-shot ticks for async waits: the board's CMSDK APB TIMER0
//! (0x4000_0000, IRQ 8, counting down on the 25 MHz clock) fires once at
//! the earliest requested time and calls the handler given to [`init`]
//! (typically `Wakeups::on_tick`, which returns the next deadline to
//! [`arm_at`]). Interrupt 8 reaches `cortex-m-rt`'s default handler
//! (there is no device crate), which [`dispatch`]es it here.

use core::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

const TIMER0: usize = 0x4000_0000;
const CTRL: usize = 0x0;
const VALUE: usize = 0x4;
const RELOAD: usize = 0x8;
const INTCLEAR: usize = 0xC;
const CTRL_EN: u32 = 1 << 0;
const CTRL_IRQEN: u32 = 1 << 3;
/// TIMER0's interrupt number on `mps2-an386`.
pub const IRQ: i16 = 8;
const NVIC_ISER0: *mut u32 = 0xE000_E100 as *mut u32;
/// Shortest one-shot: 1 µs (25 ticks).
const MIN_TICKS: u64 = 25;

static HANDLER: AtomicUsize = AtomicUsize::new(0);
static FIRED: AtomicU32 = AtomicU32::new(0);

fn reg(off: usize) -> *mut u32 {
    (TIMER0 + off) as *mut u32
}

/// Registers `handler` for the tick and enables the interrupt.
pub fn init(handler: fn()) {
    HANDLER.store(handler as usize, Ordering::Release);
    // SAFETY: TIMER0's registers at their fixed address on this board and
    // the NVIC's set-enable register (a write of 1 enables only IRQ 8).
    unsafe {
        reg(CTRL).write_volatile(0);
        reg(INTCLEAR).write_volatile(1);
        NVIC_ISER0.write_volatile(1 << IRQ);
    }
}

/// Fires the tick at `deadline_ns` (monotonic, [`crate::arch::timer`]),
/// or earlier if a tick is already due sooner.
pub fn arm_at(deadline_ns: u64) {
    let now = crate::arch::timer::now_ns();
    let ticks = (deadline_ns.saturating_sub(now) / (1_000_000_000 / crate::arch::timer::CPU_HZ))
        .clamp(MIN_TICKS, u64::from(u32::MAX / 2)) as u32;
    cortex_m::interrupt::free(|_| {
        // SAFETY: TIMER0's registers; interrupts are masked, so the tick
        // handler cannot reprogram the timer in between.
        unsafe {
            let running = reg(CTRL).read_volatile() & CTRL_EN != 0;
            if running && reg(VALUE).read_volatile() <= ticks {
                return; // an earlier tick is armed
            }
            reg(CTRL).write_volatile(0);
            reg(RELOAD).write_volatile(ticks);
            reg(VALUE).write_volatile(ticks);
            reg(CTRL).write_volatile(CTRL_EN | CTRL_IRQEN);
        }
    });
}

/// Ticks fired so far.
pub fn fired() -> u32 {
    FIRED.load(Ordering::Relaxed)
}

/// Handles interrupt `irqn` if it is the tick's; false otherwise.
pub fn dispatch(irqn: i16) -> bool {
    if irqn != IRQ {
        return false;
    }
    // SAFETY: TIMER0's registers: stop (one-shot) and acknowledge.
    unsafe {
        reg(CTRL).write_volatile(0);
        reg(INTCLEAR).write_volatile(1);
    }
    FIRED.fetch_add(1, Ordering::Relaxed);
    let h = HANDLER.load(Ordering::Acquire);
    if h != 0 {
        // SAFETY: HANDLER only ever holds 0 or a `fn()` stored by `init`.
        let f: fn() = unsafe { core::mem::transmute::<usize, fn()>(h) };
        f();
    }
    true
}
