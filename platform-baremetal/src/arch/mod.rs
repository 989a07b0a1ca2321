//! The aarch64 hardware half: boot glue, console, timer, caches,
//! exceptions, GIC, PCI ECAM access and the board bring-up.

pub mod board;
pub mod cache;
pub mod console;
pub mod exceptions;
pub mod exit;
pub mod irq;
pub mod timer;

pub use aarch64_rt as rt;

// The defmt global logger (frames over semihosting); nothing names it, so
// link it explicitly.
#[cfg(feature = "defmt")]
use defmt_semihosting as _;

/// `critical-section` for `defmt-semihosting` (single core: mask IRQs at
/// EL1, restore them as they were).
#[cfg(feature = "defmt")]
mod cs {
    use core::arch::asm;

    struct IrqMask;
    critical_section::set_impl!(IrqMask);

    // SAFETY: single core, so masking IRQs (DAIF.I) excludes every other
    // context that could enter a critical section (the exception handlers
    // do not log through defmt); `release` restores the mask state that
    // `acquire` found, so nesting works.
    unsafe impl critical_section::Impl for IrqMask {
        unsafe fn acquire() -> critical_section::RawRestoreState {
            let daif: u64;
            // SAFETY: reading DAIF and setting its I bit only masks IRQs.
            unsafe {
                asm!("mrs {}, daif", "msr daifset, #2", out(reg) daif, options(nomem, nostack, preserves_flags))
            };
            daif & (1 << 7) != 0
        }

        unsafe fn release(was_masked: critical_section::RawRestoreState) {
            if !was_masked {
                // SAFETY: unmasks IRQs that were unmasked before `acquire`.
                unsafe { asm!("msr daifclr, #2", options(nomem, nostack, preserves_flags)) };
            }
        }
    }
}

// The initial page table: aarch64-rt's entry code loads it and turns the
// MMU and caches on before the first Rust instruction, so nothing runs with
// every access Device (where unaligned accesses fault).
aarch64_rt::initial_pagetable!(aarch64_rt::InitialPagetable(crate::map::idmap()), crate::map::MAIR);

/// Declares the image's entry point: `$main` is `fn() -> !`, called at EL1
/// with the MMU, caches and FP/SIMD on and the exception vectors set. Also
/// provides the panic handler (prints the message, exits with status 101).
#[macro_export]
macro_rules! image_main {
    ($main:path) => {
        fn __image_main(_x0: u64, _x1: u64, _x2: u64, _x3: u64) -> ! {
            $crate::arch::console::init();
            $main()
        }
        $crate::arch::rt::entry!(__image_main, 256);

        #[panic_handler]
        fn __panic(info: &core::panic::PanicInfo) -> ! {
            $crate::arch::console::force_unlock();
            $crate::println!("@@ PANIC {}", info);
            $crate::arch::exit::exit(101)
        }
    };
}
