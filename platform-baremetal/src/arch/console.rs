//! The PL011 console: a formatted log line by line, shared by the main
//! program and the exception handlers (single core; a flag serialises
//! writers, and an exception handler that finds it held takes it over).

use core::fmt::{self, Write};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, Ordering};

use arm_pl011_uart::{PL011Registers, Uart, UniqueMmioPointer};

static BUSY: AtomicBool = AtomicBool::new(false);

/// Prepares the console (QEMU's PL011 needs no setup to transmit).
pub fn init() {
    BUSY.store(false, Ordering::Release);
}

/// Drops a lock held by interrupted code (exception and panic paths).
pub fn force_unlock() {
    BUSY.store(false, Ordering::Release);
}

/// Waits until the UART has sent everything (nothing to do on QEMU).
pub fn flush() {}

/// Writes formatted text to the UART.
pub fn write_fmt(args: fmt::Arguments<'_>) {
    if BUSY.swap(true, Ordering::Acquire) {
        return; // re-entered from an interrupt while printing: drop the text
    }
    let Some(regs) = NonNull::new(crate::map::UART as *mut PL011Registers) else { return };
    // SAFETY: the PL011 at `map::UART` is mapped as Device memory by the
    // initial page table, and `BUSY` makes this the only live pointer to it.
    let mut uart = Uart::new(unsafe { UniqueMmioPointer::new(regs) });
    let _ = uart.write_fmt(args);
    BUSY.store(false, Ordering::Release);
}

/// `println!` to the PL011.
#[macro_export]
macro_rules! println {
    () => { $crate::arch::console::write_fmt(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::arch::console::write_fmt(format_args!("{}\n", format_args!($($arg)*))) };
}
