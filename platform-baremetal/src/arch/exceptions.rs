//! Exception handlers: interrupts go to the GIC code; everything else is
//! unexpected and prints a decoded report (class, fault status, FAR, ELR,
//! SPSR and the saved registers), then exits with status 3.

use core::arch::asm;
use core::sync::atomic::{AtomicBool, Ordering};

use aarch64_rt::{ExceptionHandlers, RegisterStateRef};

use crate::esr::Syndrome;

/// Exit status after an unexpected CPU exception.
pub const EXIT_EXCEPTION: i32 = 3;

/// The image's exception handlers.
pub struct Handlers;

aarch64_rt::exception_handlers!(Handlers);

fn sysreg_esr_far() -> (u64, u64) {
    let (esr, far): (u64, u64);
    // SAFETY: reading ESR_EL1 and FAR_EL1 has no side effects.
    unsafe {
        asm!("mrs {}, esr_el1", "mrs {}, far_el1", out(reg) esr, out(reg) far, options(nomem, nostack, preserves_flags))
    };
    (esr, far)
}

static REPORTING: AtomicBool = AtomicBool::new(false);

fn report(kind: &str, regs: &RegisterStateRef<'_>) -> ! {
    crate::arch::console::force_unlock();
    let (esr, far) = sysreg_esr_far();
    if REPORTING.swap(true, Ordering::AcqRel) {
        // An exception while reporting one: say the least and leave.
        crate::println!("\n@@ EXCEPTION (nested) ESR {esr:#x} ELR {:#x}", regs.elr);
        crate::arch::exit::exit(EXIT_EXCEPTION)
    }
    let s = Syndrome(esr);
    crate::println!("@@ EXCEPTION {kind}: ELR_EL1 {:#018x}", regs.elr);
    crate::println!("   {s}");
    crate::println!(
        "   ESR_EL1 {esr:#018x}  FAR_EL1 {far:#018x}{}",
        if s.is_abort() { "" } else { " (not valid)" }
    );
    crate::println!("   SPSR_EL1 {:#018x}", regs.spsr);
    for (i, pair) in regs.registers.chunks(2).enumerate() {
        match pair {
            [a, b] => crate::println!("   x{:<2} {a:#018x}  x{:<2} {b:#018x}", 2 * i, 2 * i + 1),
            [a] => crate::println!("   x{:<2} {a:#018x}", 2 * i),
            _ => {}
        }
    }
    // aarch64-rt's `sp` field holds x30, the link register (its doc says
    // "x30, the Stack Pointer").
    crate::println!("   fp  {:#018x}  lr  {:#018x}", regs.fp, regs.sp);
    crate::arch::exit::exit(EXIT_EXCEPTION)
}

impl ExceptionHandlers for Handlers {
    extern "C" fn sync_current(regs: RegisterStateRef) {
        report("synchronous exception at EL1", &regs)
    }

    extern "C" fn irq_current(_regs: RegisterStateRef) {
        crate::arch::board::handle_irq();
    }

    extern "C" fn fiq_current(regs: RegisterStateRef) {
        report("FIQ", &regs)
    }

    extern "C" fn serror_current(regs: RegisterStateRef) {
        report("SError", &regs)
    }

    extern "C" fn sync_lower(regs: RegisterStateRef) {
        report("synchronous exception from EL0", &regs)
    }

    extern "C" fn irq_lower(regs: RegisterStateRef) {
        report("IRQ from EL0", &regs)
    }

    extern "C" fn fiq_lower(regs: RegisterStateRef) {
        report("FIQ from EL0", &regs)
    }

    extern "C" fn serror_lower(regs: RegisterStateRef) {
        report("SError from EL0", &regs)
    }
}
