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
//! - [`mem`]: GPU virtual-address allocator, size-class pools, page tables,
//!   buffer handles, the buffer manager with fence-gated frees;
//! - [`platform`]: the traits an integrator implements (memory, time,
//!   interrupts, locks, and direct register access ([`platform::DirectIo`])
//!   or kernel submission ([`platform::KernelIo`]));
//! - [`engine`]: the device core both modes share ([`engine::DeviceCore`]);
//! - [`direct`]: direct mode (rings, fence slots, page tables, hang check);
//! - [`kernel`]: kernel mode, the device over a kernel driver (`kmd/` is
//!   the driver; [`platform::KernelIo`] the trait it is reached through);
//! - [`storage`]: the device's large tables, placed by the integrator;
//! - [`ring`], [`ibpool`]: the direct-mode ring and the IB chunk pool;
//! - [`sync`]: fences, timelines, failure history, cross-queue dependencies;
//! - [`ivshmem`]: the shared-memory register binding for ivshmem platforms;
//! - [`error`]: submission and wait errors;
//! - [`debug`]: hang reports and the event trace;
//! - [`config`]: every tunable, with documented defaults.
//!
//! The modules form layers, and none imports from one above it
//! (`docs/architecture.md`, "Layers"; `tests/layers.rs` checks it).
//!
//! Features: `defmt` (driver logs as defmt frames, for firmware) or `log`
//! (the `log` facade, for Linux); neither by default (no logging code).
//! `gen1`, `gen2` (both by default): the generations the build drives; a
//! firmware for one chip enables only its own and links no code of the
//! other. On by default too, each optional for a smaller firmware (the
//! checks, typed errors and recovery stay without them): `hang-capture`
//! (the hang report's register, ring and IB windows), `trace` (the ring of
//! driver events, the Perfetto export), `local-memory` (the device's local
//! memory and the moves to and from it), `mmu` (direct mode's page tables
//! and GPU VA allocator; without it only `MmuMode::Bypass` brings a device
//! up). `compact-encoder`: a smaller, slower encoder (one description
//! walk for every packet instead of code folded per packet kind); it
//! implies `size-first`: code size before speed outside the per-kind
//! encoder entry points (the general `Encoder::encode` as the compact
//! encoder's one walk, the ring written in two passes, a batching recording's first pick through
//! the general path, a 64-bit atomic load as an exchange where atomics are
//! emulated, on bare metal the lock's acquisition as one shared call instead
//! of an inlined attempt, a few small helpers of the allocation and wait
//! paths out of line, and the GPU VA allocator's index as its address
//! list without region trees), with the same behaviour.
//! `validation`: the validation mode (see [`engine`]).
//! `capture`: the command-stream capture ([`debug::capture`],
//! `DeviceCore::start_capture`); off by default, and without it the submit
//! path has no capture code (`docs/capture-and-dump.md`).
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
#[forbid(unsafe_code)]
pub mod direct;
pub mod engine;
pub mod error;
pub mod hw;
pub mod ibpool;
pub mod ivshmem;
pub mod kernel;
mod log;
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_probe;
pub mod mem;
pub mod platform;
/// The submission and wait errors under their former module name.
#[deprecated(note = "renamed to `error`")]
pub mod queue {
    /// Renamed to [`crate::error::SubmitError`].
    #[deprecated(note = "renamed to `error::SubmitError`")]
    pub type SubmitError = crate::error::SubmitError;
    /// Renamed to [`crate::error::WaitError`].
    #[deprecated(note = "renamed to `error::WaitError`")]
    pub type WaitError = crate::error::WaitError;
    /// Renamed to [`crate::error::FenceStatus`].
    #[deprecated(note = "renamed to `error::FenceStatus`")]
    pub type FenceStatus = crate::error::FenceStatus;
}
pub mod ring;
pub mod storage;
pub mod sync;
