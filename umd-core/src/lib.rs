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
//! - [`mem`]: GPU virtual-address allocator, pools, page tables, buffers;
//! - [`platform`]: the traits an integrator implements (memory, time,
//!   interrupts, and direct register access or kernel submission);
//! - [`ring`], [`ibpool`], [`gpuvm`]: the direct-mode ring, the IB chunk
//!   pool with fence-gated reuse, and the GPU's view of memory;
//! - [`sync`]: fences, timelines, cross-queue dependencies;
//! - [`ivshmem`]: the shared-memory register binding for ivshmem platforms;
//! - [`device`]: a refgpu in direct mode: submit, wait, hang recovery;
//! - [`kernel`]: the same over a kernel driver (kernel-mediated mode);
//! - [`queue`]: submission and wait errors;
//! - [`debug`]: hang reports and the event trace;
//! - [`config`]: every tunable, with documented defaults.
//!
//! Features: `defmt` (driver logs as defmt frames, for firmware) or `log`
//! (the `log` facade, for Linux); neither by default (no logging code).
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
pub mod config;
pub mod debug;
pub mod decode;
pub mod device;
pub mod gpuvm;
pub mod hw;
pub mod ibpool;
pub mod ivshmem;
pub mod kernel;
mod log;
pub mod mem;
pub mod platform;
pub mod queue;
pub mod ring;
pub mod sync;
