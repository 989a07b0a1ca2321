//! The Cortex-M4 hardware half, for QEMU's `mps2-an386`: boot glue
//! (`cortex-m-rt`), the CMSDK UART console, SysTick time, the DWT cycle
//! counter, one-shot ticks for async waits (TIMER0), the HardFault
//! report, semihosting exit and the board
//! bring-up over the shared-RAM transport.
//!
//! No caches: the Cortex-M4 has none for data (the AN386 image has no
//! system cache either), so the transport's cache hooks do nothing.
//!
//! Memory map used (QEMU `hw/arm/mps2.c`, AN386): code in SSRAM1 at 0
//! (4 MiB), data, bss and stack in SSRAM2/3 at 0x2000_0000 (4 MiB), the
//! 16 MiB PSRAM at 0x2100_0000 (the shared RAM file: GPU memory and the
//! binding pages), UART0 at 0x4000_4000.

pub mod board;
pub mod console;
pub mod cycles;
pub mod exit;
pub mod fault;
pub mod tick;
pub mod timer;

pub use cortex_m_rt as rt;

// cortex-m's single-core critical section (for defmt-semihosting and
// portable-atomic's fallback); nothing names the crate, so link it.
use cortex_m as _;

// The defmt global logger (frames over semihosting); nothing names it, so
// link it explicitly. The critical section is cortex-m's single-core one.
#[cfg(feature = "defmt")]
use defmt_semihosting as _;

/// Declares the image's entry point: `$main` is `fn() -> !`, called after
/// `cortex-m-rt`'s reset (RAM initialised, FPU on) with the console and
/// SysTick started. Also provides the HardFault handler (decoded report,
/// exit status 3), the SysTick handler (the clock's wrap count), a
/// default handler (TIMER0's tick, anything else is reported), and the panic handler (exit 101).
/// The image crate needs `cortex-m-rt` as a dependency (its attribute
/// macros name it).
#[macro_export]
macro_rules! image_main {
    ($main:path) => {
        #[::cortex_m_rt::entry]
        fn __image_main() -> ! {
            $crate::arch::console::init();
            $crate::arch::timer::init();
            $crate::arch::cycles::init();
            $main()
        }

        #[::cortex_m_rt::exception]
        unsafe fn HardFault(ef: &::cortex_m_rt::ExceptionFrame) -> ! {
            $crate::arch::fault::report(ef)
        }

        #[::cortex_m_rt::exception]
        fn SysTick() {
            $crate::arch::timer::on_systick();
        }

        #[::cortex_m_rt::exception]
        unsafe fn DefaultHandler(irqn: i16) {
            if !$crate::arch::tick::dispatch(irqn) {
                $crate::arch::fault::unexpected(irqn)
            }
        }

        #[panic_handler]
        fn __panic(info: &core::panic::PanicInfo) -> ! {
            $crate::arch::console::force_unlock();
            $crate::println!("@@ PANIC {}", info);
            $crate::arch::exit::exit(101)
        }
    };
}
