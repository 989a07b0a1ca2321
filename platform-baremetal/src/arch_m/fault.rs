//! The HardFault report: the registers the CPU stacked (r0-r3, r12, lr,
//! pc, xpsr), the fault status registers decoded ([`crate::m_fault`]:
//! CFSR, HFSR, MMFAR, BFAR), then exit status 3. Configurable faults
//! (MemManage, BusFault, UsageFault) are not enabled, so they escalate to
//! HardFault with HFSR.FORCED and their CFSR bits set.

use core::sync::atomic::{AtomicBool, Ordering};

use cortex_m_rt::ExceptionFrame;

use crate::m_fault::FaultStatus;

/// Exit status after an unexpected CPU exception.
pub const EXIT_EXCEPTION: i32 = 3;

static REPORTING: AtomicBool = AtomicBool::new(false);

fn read(addr: usize) -> u32 {
    // SAFETY: the SCB's fault registers (fixed System Control Space
    // addresses on every ARMv7-M); reading them has no side effects.
    unsafe { (addr as *const u32).read_volatile() }
}

/// The fault status registers now.
pub fn status() -> FaultStatus {
    FaultStatus {
        cfsr: read(0xE000_ED28),
        hfsr: read(0xE000_ED2C),
        mmfar: read(0xE000_ED34),
        bfar: read(0xE000_ED38),
    }
}

/// Prints the report and exits with [`EXIT_EXCEPTION`].
pub fn report(ef: &ExceptionFrame) -> ! {
    crate::arch::console::force_unlock();
    let s = status();
    if REPORTING.swap(true, Ordering::AcqRel) {
        crate::println!("\n@@ EXCEPTION (nested) HardFault CFSR {:#010x} PC {:#010x}", s.cfsr, ef.pc());
        crate::arch::exit::exit(EXIT_EXCEPTION)
    }
    crate::println!("@@ EXCEPTION HardFault: PC {:#010x}", ef.pc());
    crate::println!("   {s}");
    if let Some(a) = s.bus_fault_address() {
        crate::println!("   bus fault at address {a:#010x}");
    }
    if let Some(a) = s.mem_manage_address() {
        crate::println!("   MemManage fault at address {a:#010x}");
    }
    crate::println!("   stacked registers:");
    crate::println!(
        "   r0  {:#010x}  r1  {:#010x}  r2  {:#010x}  r3  {:#010x}",
        ef.r0(),
        ef.r1(),
        ef.r2(),
        ef.r3()
    );
    crate::println!(
        "   r12 {:#010x}  lr  {:#010x}  pc  {:#010x}  xpsr {:#010x}",
        ef.r12(),
        ef.lr(),
        ef.pc(),
        ef.xpsr()
    );
    crate::arch::exit::exit(EXIT_EXCEPTION)
}

/// An exception or interrupt nobody enabled: report and exit.
pub fn unexpected(irqn: i16) -> ! {
    crate::arch::console::force_unlock();
    crate::println!("@@ EXCEPTION unexpected exception or interrupt {irqn} ({})", status());
    crate::arch::exit::exit(EXIT_EXCEPTION)
}
