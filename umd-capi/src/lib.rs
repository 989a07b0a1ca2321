//! `umd-capi`: the driver's C API, a static library (`libumd_capi.a`) and
//! its header `include/umd.h` (generated from this crate by cbindgen;
//! `tests/header.rs` checks that it is up to date).
//!
//! A C program brings a device up over a C platform ([`platform::umd_platform`], a
//! struct of function pointers and a context pointer) in storage it places
//! itself (`UMD_DEVICE_STORAGE_SIZE` bytes, a `static` array in firmware),
//! then allocates buffers, submits arrays of commands, waits, and shuts the
//! device down. `docs/c-api.md` is the integrator's guide.
//!
//! At the ABI every argument is an integer or a pointer, checked before
//! use: NULL, alignment and length for pointers; enum values, flag bits and
//! queues converted with a typed status (no Rust enum is ever read from C);
//! handles are opaque 64-bit integers carrying their kind, their device
//! and the core's generation count, so a stale, foreign or forged one is
//! refused. A refused call changes nothing.
//!
//! No panic crosses the ABI: on the embedded targets the library has no
//! panic path at all (`tools/footprint.sh` checks the fat-LTO build at link
//! time), and its `#[panic_handler]` calls the C hook `umd_panic_hook`.
//! On hosted targets (the `host` feature, tests) the library links std,
//! whose panics abort at an `extern "C"` boundary rather than unwind
//! through it.
#![cfg_attr(target_os = "none", no_std)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented
    )
)]
#![allow(non_camel_case_types)]

pub mod api;
#[cfg(feature = "capture")]
pub mod capture;
pub mod device;
pub mod handle;
#[cfg(feature = "host")]
pub mod host;
pub mod platform;
pub mod status;

/// Called by the library if a Rust panic ever happened (none can: the
/// build's link-time check proves that no panic path survives). The
/// integrator defines it (log, reset the board); it must not return, and
/// if it does the library spins forever.
#[cfg(target_os = "none")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    extern "C" {
        fn umd_panic_hook();
    }
    // SAFETY: a C function without arguments, defined by the integrator
    // (`docs/c-api.md`, "Panics").
    unsafe { umd_panic_hook() };
    loop {
        core::hint::spin_loop();
    }
}
