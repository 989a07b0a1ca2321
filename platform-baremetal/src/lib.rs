//! Bare-metal platform for `umd-core` on QEMU's aarch64 `virt` machine.
//!
//! Not written yet (issue 6).
#![no_std]
