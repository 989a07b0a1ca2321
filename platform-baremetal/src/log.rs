//! Logging shim, in one file (as embassy does): bring-up and driver-side
//! code logs through [`error!`](crate::error), [`warn!`](crate::warn),
//! [`info!`](crate::info), [`debug!`](crate::debug) and
//! [`trace!`](crate::trace), which go
//!
//! - with the `defmt` feature: to `defmt` (compact frames with interned
//!   format strings, written over semihosting by `defmt-semihosting`; the
//!   host decodes them with `defmt-decoder` and the image ELF's `.defmt`
//!   section, see `qemu-tests`). Timestamps are the arch's clock in µs;
//! - without it, on the bare-metal target: to the board's UART (the PL011
//!   on `virt`, CMSDK UART0 on `mps2-an386`) as plain text,
//!   `LEVEL message` (e.g. `INFO  pci 00:02.0 1af4:1110`);
//! - on the host (the portable half's unit tests): nowhere; the arguments
//!   are type-checked but not evaluated.
//!
//! The `@@` result lines the harness parses are *not* logs: they are
//! printed with `println!` on that UART in every build.
//!
//! # Format strings
//!
//! Call sites use the subset both back ends understand: `{}` and `{:?}`,
//! and for integers `{:x}`, `{:#x}` and zero padding (`{:02x}`). Arguments
//! must implement `core::fmt::Display` (`Debug` for `{:?}`) *and*, with
//! the feature, `defmt::Format`: integers, `bool`, `&str`, this crate's
//! types (`defmt::Format` is derived behind the feature), and anything
//! else wrapped in [`Disp`] (logs its `Display`; on defmt as
//! `Display2Format`, i.e. formatted on the target), e.g. umd-core types.
//!
//! Crates calling these macros with the feature on need `defmt` as a
//! direct dependency (defmt's macros name `defmt::` paths).
//!
//! The macros are `#[collapse_debuginfo(yes)]`: the debug info of what
//! they expand to points at their call site, so the host shows the log
//! statement's `file:line` (defmt-decoder takes it from DWARF), not this
//! file's.

use core::fmt;

/// Logs `Display` of any value through either back end (defmt:
/// `Display2Format`, formatted on the target).
pub struct Disp<'a, T: fmt::Display + ?Sized>(pub &'a T);

impl<T: fmt::Display + ?Sized> fmt::Display for Disp<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(feature = "defmt")]
impl<T: fmt::Display + ?Sized> defmt::Format for Disp<'_, T> {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(f, "{}", defmt::Display2Format(self.0))
    }
}

/// The plain-text back end of the macros (bare-metal target, no `defmt`):
/// one `LEVEL message` line on the board's UART.
#[cfg(all(not(feature = "defmt"), target_os = "none"))]
#[doc(hidden)]
pub fn plain(level: &str, args: fmt::Arguments<'_>) {
    crate::arch::console::write_fmt(format_args!("{level:<5} {args}\n"));
}

/// The macros' dispatch; not for direct use.
#[cfg(feature = "defmt")]
#[doc(hidden)]
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! __bm_log {
    ($level:ident, $tag:literal, $($arg:tt)*) => {
        ::defmt::$level!($($arg)*)
    };
}

/// The macros' dispatch; not for direct use.
#[cfg(all(not(feature = "defmt"), target_os = "none"))]
#[doc(hidden)]
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! __bm_log {
    ($level:ident, $tag:literal, $($arg:tt)*) => {
        $crate::log::plain($tag, format_args!($($arg)*))
    };
}

/// The macros' dispatch; not for direct use.
#[cfg(all(not(feature = "defmt"), not(target_os = "none")))]
#[doc(hidden)]
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! __bm_log {
    ($level:ident, $tag:literal, $($arg:tt)*) => {
        if false {
            // Type-check the arguments without evaluating them.
            let _ = format_args!($($arg)*);
        }
    };
}

/// Error: something failed that the image cannot go on without.
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! error {
    ($($arg:tt)*) => { $crate::__bm_log!(error, "ERROR", $($arg)*) };
}

/// Warning: something unexpected that the image survives.
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! warn {
    ($($arg:tt)*) => { $crate::__bm_log!(warn, "WARN", $($arg)*) };
}

/// Info: bring-up steps (PCI, BARs, MSI-X, ivshmem).
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! info {
    ($($arg:tt)*) => { $crate::__bm_log!(info, "INFO", $($arg)*) };
}

/// Debug: details of bring-up and transport.
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! debug {
    ($($arg:tt)*) => { $crate::__bm_log!(debug, "DEBUG", $($arg)*) };
}

/// Trace: per-operation detail (off the hot paths).
#[macro_export]
#[collapse_debuginfo(yes)]
macro_rules! trace {
    ($($arg:tt)*) => { $crate::__bm_log!(trace, "TRACE", $($arg)*) };
}

// The defmt timestamp: the arch's clock (aarch64: the generic timer;
// Cortex-M: SysTick) in microseconds since it started.
#[cfg(all(feature = "defmt", target_os = "none"))]
defmt::timestamp!("{=u64:us}", crate::arch::timer::now_ns() / 1000);
