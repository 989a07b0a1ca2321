//! Logging shim, in one file (as embassy does): the driver logs through
//! these macros, which forward to `defmt` (feature `defmt`, for firmware:
//! compact frames decoded on the host), to the `log` facade (feature `log`,
//! for Linux), or compile to nothing (neither feature: no code, no strings).
//!
//! The format string goes to both back ends unchanged, so call sites keep
//! to the syntax both accept: `{}` and hex display hints (`{:x}`, `{:#x}`)
//! with integer, boolean and `&str` arguments, no named or positional
//! arguments and no width or precision beyond what defmt's hints allow.
//! The macros collapse their debug info, so decoded defmt locations name
//! the caller, not this file.

#[cfg(all(feature = "defmt", feature = "log"))]
compile_error!("umd-core: enable at most one of the `defmt` and `log` features");

#[collapse_debuginfo(yes)]
macro_rules! umd_log {
    ($level:ident, $($arg:tt)*) => {{
        #[cfg(feature = "defmt")]
        defmt::$level!($($arg)*);
        #[cfg(feature = "log")]
        log::$level!($($arg)*);
        #[cfg(not(any(feature = "defmt", feature = "log")))]
        if false {
            // Type-check the arguments; never evaluated, compiled away.
            $crate::log::discard(core::format_args!($($arg)*));
        }
    }};
}

/// Swallows arguments when no logging back end is enabled.
#[cfg(not(any(feature = "defmt", feature = "log")))]
#[inline(always)]
pub(crate) fn discard(_: core::fmt::Arguments<'_>) {}

/// Error: the device faulted, hung or was lost.
#[collapse_debuginfo(yes)]
macro_rules! log_error {
    ($($arg:tt)*) => { $crate::log::umd_log!(error, $($arg)*) };
}

/// Warning: something recoverable went wrong (pool or ring waits).
#[collapse_debuginfo(yes)]
macro_rules! log_warn {
    ($($arg:tt)*) => { $crate::log::umd_log!(warn, $($arg)*) };
}

/// Info: bring-up and teardown.
#[collapse_debuginfo(yes)]
macro_rules! log_info {
    ($($arg:tt)*) => { $crate::log::umd_log!(info, $($arg)*) };
}

pub(crate) use {log_error, log_info, log_warn, umd_log};
