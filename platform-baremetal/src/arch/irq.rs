//! Interrupts: the GICv2 (`arm-gic`), the GICv2m MSI frame that turns the
//! ivshmem-doorbell device's MSI-X writes into SPIs, and the virtual timer
//! that bounds a wait.
//!
//! Only two interrupt sources exist: the device's MSI-X vectors (counted
//! in [`MSI_COUNT`]) and the virtual timer (PPI 27) armed by [`wait`] for
//! its deadline. [`wait`] sleeps in `wfi` with IRQs masked around the
//! check, so an MSI arriving between the check and the `wfi` still wakes
//! it (a pending interrupt ends `wfi` even while masked).

use core::arch::asm;
use core::cell::UnsafeCell;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, Ordering};

use arm_gic::gicv2::GicV2;
use arm_gic::{IntId, InterruptGroup, Trigger};
use safe_mmio::fields::ReadPure;
use safe_mmio::UniqueMmioPointer;
use umd_core::platform::IrqWait;

use crate::map;

/// MSIs taken since the last [`wait`] returned.
pub static MSI_COUNT: AtomicU32 = AtomicU32::new(0);
/// Interrupts taken in total (statistics).
pub static IRQS_TAKEN: AtomicU32 = AtomicU32::new(0);
/// MSIs taken in total (statistics; the tests check MSIs really arrive).
pub static MSI_TOTAL: AtomicU32 = AtomicU32::new(0);

/// GICv2m register: MSI_TYPER (base SPI [25:16], count [9:0]).
const V2M_MSI_TYPER: usize = 0x008;
/// GICv2m register: the doorbell devices write the SPI number to.
pub const V2M_MSI_SETSPI_NS: usize = 0x040;

/// Virtual timer PPI (INTID 27).
const VTIMER: IntId = IntId::ppi(11);

struct GicCell(UnsafeCell<Option<(GicV2<'static>, InterruptGroup)>>);

// SAFETY: single core; the cell is written once by `init` with IRQs masked
// and afterwards only used by the IRQ handler (which does not nest: IRQs
// stay masked while it runs).
unsafe impl Sync for GicCell {}

static GIC: GicCell = GicCell(UnsafeCell::new(None));

/// The MSI SPIs the GICv2m frame offers: (first INTID, count).
pub fn v2m_spis() -> (u32, u32) {
    let Some(typer) = NonNull::new((map::GICV2M + V2M_MSI_TYPER) as *mut ReadPure<u32>) else {
        return (0, 0);
    };
    // SAFETY: the GICv2m frame is mapped as Device memory (GiB 0 of the
    // identity map); MSI_TYPER is a read-only register without side
    // effects, so this short-lived pointer aliases nothing that matters.
    let t = unsafe { UniqueMmioPointer::new(typer) }.read();
    ((t >> 16) & 0x3ff, t & 0x3ff)
}

fn mask_irqs() {
    // SAFETY: masking IRQs has no memory effects.
    unsafe { asm!("msr daifset, #2", options(nomem, nostack, preserves_flags)) }
}

fn unmask_irqs() {
    // SAFETY: the vector table is installed and the handler is ready.
    unsafe { asm!("msr daifclr, #2", "isb", options(nomem, nostack, preserves_flags)) }
}

fn timer_ctl(v: u64) {
    // SAFETY: CNTV_CTL_EL0 only controls the virtual timer's interrupt.
    unsafe { asm!("msr cntv_ctl_el0, {}", "isb", in(reg) v, options(nomem, nostack, preserves_flags)) }
}

fn timer_cval(v: u64) {
    // SAFETY: CNTV_CVAL_EL0 only sets the virtual timer's compare value.
    unsafe { asm!("msr cntv_cval_el0, {}", in(reg) v, options(nomem, nostack, preserves_flags)) }
}

/// Sets up the GIC for `count` MSI SPIs from `first` (edge) and the
/// virtual timer, then unmasks IRQs at the CPU. Call once.
pub fn init(first: u32, count: u32) -> Result<(), arm_gic::gicv2::Error> {
    mask_irqs();
    timer_ctl(0b10);
    // SAFETY: the distributor and CPU interface are mapped as Device
    // memory, and this is the only driver instance (`init` runs once; the
    // cell owns it from here on).
    let mut gic = unsafe { GicV2::new(map::GICD as *mut _, map::GICC as *mut _) };
    gic.setup();
    let group =
        if gic.typer().has_security_extension() { InterruptGroup::Group1 } else { InterruptGroup::Group0 };
    for id in (first..first + count).map(|i| IntId::spi(i - 32)) {
        gic.set_interrupt_priority(id, 0x80);
        gic.set_trigger(id, Trigger::Edge);
        gic.enable_interrupt(id, true)?;
    }
    gic.set_interrupt_priority(VTIMER, 0x80);
    gic.enable_interrupt(VTIMER, true)?;
    // SAFETY: IRQs are masked, so the handler cannot see the cell while it
    // is written (see `GicCell`).
    unsafe { *GIC.0.get() = Some((gic, group)) };
    unmask_irqs();
    Ok(())
}

/// The IRQ vector's work: acknowledge, count MSIs, silence the timer, end.
pub fn handle_irq() {
    // SAFETY: see `GicCell`: only this handler uses the GIC after `init`,
    // and it does not nest.
    let Some((gic, group)) = (unsafe { &mut *GIC.0.get() }).as_mut() else { return };
    while let Some(id) = gic.get_and_acknowledge_interrupt(*group) {
        IRQS_TAKEN.fetch_add(1, Ordering::Relaxed);
        if id == VTIMER {
            timer_ctl(0b10); // enabled but masked: the level drops
        } else {
            MSI_COUNT.fetch_add(1, Ordering::Release);
            MSI_TOTAL.fetch_add(1, Ordering::Relaxed);
        }
        gic.end_interrupt(id, *group);
    }
}

/// Sleeps until an MSI arrives or `timeout_ns` passes.
pub fn wait(timeout_ns: u64) -> IrqWait {
    let freq = u128::from(crate::arch::timer::frequency());
    let ticks = (u128::from(timeout_ns) * freq / 1_000_000_000).min(u128::from(u64::MAX / 2)) as u64;
    let deadline = crate::arch::timer::ticks().saturating_add(ticks);
    timer_cval(deadline);
    timer_ctl(0b01);
    let r = loop {
        mask_irqs();
        if MSI_COUNT.swap(0, Ordering::Acquire) > 0 {
            break IrqWait::Interrupt;
        }
        if crate::arch::timer::ticks() >= deadline {
            break IrqWait::TimedOut;
        }
        // SAFETY: wfi only waits; a pending (even masked) IRQ ends it.
        unsafe { asm!("wfi", options(nomem, nostack, preserves_flags)) };
        unmask_irqs(); // take what woke us
    };
    timer_ctl(0b10);
    unmask_irqs();
    r
}
