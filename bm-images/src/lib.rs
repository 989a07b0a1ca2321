//! Bare-metal images: aarch64 for QEMU's `virt` machine and Cortex-M4 for
//! QEMU's `mps2-an386` (the `m-*` binaries, feature `cortex-m-image`,
//! target `thumbv7em-none-eabihf`), and the scenarios they run (shared so
//! every image reports results the same way).
//!
//! The aarch64 binaries (`src/bin/*.rs`) need the `image` feature and build
//! only for `aarch64-unknown-none`; `qemu-tests` builds them with
//! `cargo build --release --target aarch64-unknown-none --features
//! image,defmt,validation -p bm-images` (the `m-*` ones with `cortex-m-image,defmt,validation`
//! for `thumbv7em-none-eabihf`) and boots them. On the host only this
//! library builds.
//!
//! Output protocol (parsed by `qemu-tests`): one line per fact, each
//! starting with `@@ `:
//!
//! - `@@ BOOT <image> mode=<polling|msi>`
//! - `@@ DEVICE gen=<n> rev=<n>`
//! - `@@ CONFIG <key=value ...>`: the driver configuration in effect, after
//!   the `umd.<key>=<value>` words of the command line ([`knobs`]);
//!   `@@ CONFIG_ERROR <why>` before it when they were refused
//! - `@@ RESULT <scenario> PASS` / `@@ RESULT <scenario> FAIL <why>` /
//!   `@@ RESULT <scenario> SKIP <why>`; a scenario's decoded report between
//!   `@@ REPORT <scenario> BEGIN` and `@@ REPORT END`
//! - `@@ IRQS msi=<n> total=<n>`: interrupts taken
//! - `@@ TRACE BEGIN` / `@@ TRACE END` around the demo's Chrome trace
//! - `@@ BENCH <name> n=<n> median_ns=<n> p90_ns=<n> mean_ns=<n>`, and
//!   `@@ CYCLES ...` on the Cortex-M4
//! - fault images: `@@ FAULT_ADDR <addr>` (the address about to be read),
//!   `@@ KILL_MODEL_NOW ...` (the harness kills the model), `@@ DEVICE_LOST
//!   ...`, `@@ ACCOUNTING ...` and `@@ CHECK ok|FAILED <why>` (the fault
//!   matrix's accounting), `@@ SHUTDOWN ...`, `@@ BAD_DOORBELL ...`,
//!   `@@ OVERRUN ...`, `@@ DEADLOCK ...` and `@@ OVERRUN_FAILED <why>`
//!   (the overrun walk of `docs/debugging.md`, with `rgcs:` capture lines);
//!   `@@ ASYNC ...` from the Cortex-M4's async image
//! - `@@ FATAL <why>` (bring-up failed), `@@ EXCEPTION ...`, `@@ PANIC ...`
//! - `@@ DONE passed=<n> failed=<n>` then the semihosting exit status
//!   (0 all passed, 1 a scenario failed, 2 bring-up failed, 3 CPU
//!   exception, 4 device lost (`device_loss::EXIT_DEVICE_LOST`), 101
//!   panic).
#![no_std]

pub mod bench;
#[cfg(all(target_arch = "aarch64", target_os = "none"))]
pub mod boot;
#[cfg(all(target_arch = "arm", target_os = "none"))]
pub mod boot_m;
pub mod demo;
#[cfg(target_os = "none")]
pub mod device_loss;
#[cfg(target_os = "none")]
pub mod fault_matrix;
pub mod ib_sweep;
pub mod knobs;
#[cfg(target_os = "none")]
pub mod suite;
/// The bring-up checks the smoke image runs (shared with the Linux
/// platforms' self-test).
pub use conformance::bringup as smoke;
