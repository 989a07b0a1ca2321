//! `umd-core`: the heart of the refgpu user-mode driver.
//!
//! `#![no_std]`, no allocator, no panics: every failure is a typed error and
//! every loop is bounded, so the same code runs in firmware, on an RTOS and in
//! a Linux process. The hardware it drives is specified in `docs/refgpu.md`.
//!
//! Modules, one per concept:
//! - [`hw`]: one description per GPU generation (packet layouts, limits,
//!   alignment rules) and the probe that picks one from the ID register;
//! - [`cmd`]: logical commands, the description-driven packet encoder and the
//!   chunked command-buffer builder;
//! - [`decode`]: the description-driven decoder behind dumps and hang reports;
//! - [`mem`]: GPU virtual-address allocator, pools, page tables, buffers.
#![no_std]
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

pub mod cmd;
pub mod decode;
pub mod hw;
pub mod mem;
pub mod sync;
