//! The console: UART0 of the board, an ARM CMSDK APB UART at 0x4000_4000
//! (QEMU's `-serial`), a formatted log line by line. A flag serialises
//! writers; an exception handler that finds it held takes it over.

use core::fmt::{self, Write};
use core::sync::atomic::{AtomicBool, Ordering};

/// UART0's base address on `mps2-an386`.
pub const UART0: usize = 0x4000_4000;
const DATA: usize = 0x00;
const STATE: usize = 0x04;
const CTRL: usize = 0x08;
const BAUDDIV: usize = 0x10;
const STATE_TX_FULL: u32 = 1 << 0;
const CTRL_TX_EN: u32 = 1 << 0;

static BUSY: AtomicBool = AtomicBool::new(false);

fn reg(off: usize) -> *mut u32 {
    (UART0 + off) as *mut u32
}

/// Enables the transmitter (baud divider 16, the smallest the UART takes).
pub fn init() {
    // SAFETY: UART0's registers at their fixed addresses on this board;
    // 32-bit volatile stores are how the device is programmed, and init
    // runs once before anything prints.
    unsafe {
        reg(BAUDDIV).write_volatile(16);
        reg(CTRL).write_volatile(CTRL_TX_EN);
    }
    BUSY.store(false, Ordering::Release);
}

/// Drops a lock held by interrupted code (exception and panic paths).
pub fn force_unlock() {
    BUSY.store(false, Ordering::Release);
}

/// Waits until the UART has sent everything (QEMU sends at once).
pub fn flush() {}

struct Uart;

impl Write for Uart {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for b in s.bytes() {
            // SAFETY: UART0's STATE and DATA registers (see `init`); BUSY
            // makes this the only writer.
            unsafe {
                // Bounded by the device: QEMU's FIFO never stays full.
                while reg(STATE).read_volatile() & STATE_TX_FULL != 0 {
                    core::hint::spin_loop();
                }
                reg(DATA).write_volatile(u32::from(b));
            }
        }
        Ok(())
    }
}

/// Writes formatted text to the UART.
pub fn write_fmt(args: fmt::Arguments<'_>) {
    if BUSY.swap(true, Ordering::Acquire) {
        return; // re-entered from an exception while printing: drop the text
    }
    let _ = Uart.write_fmt(args);
    BUSY.store(false, Ordering::Release);
}

/// `println!` to the UART.
#[macro_export]
macro_rules! println {
    () => { $crate::arch::console::write_fmt(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::arch::console::write_fmt(format_args!("{}\n", format_args!($($arg)*))) };
}
