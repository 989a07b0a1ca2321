//! Bare-metal platform for `umd-core` on QEMU's aarch64 `virt` machine
//! (`-M virt,gic-version=2 -cpu cortex-a53`, EL1, no firmware, no OS), and
//! on the Cortex-M4 of QEMU's `mps2-an386` (`docs/cortex-m.md`: the
//! shared-RAM transport [`shared_ram`], `cortex-m-rt` boot, SysTick time,
//! the CMSDK UART, HardFault reports decoded by [`m_fault`]).
//!
//! What it does (see `docs/baremetal.md` for the boot flow and memory map):
//!
//! - **boot**: `aarch64-rt` provides the entry point, the boot stack,
//!   FP/SIMD enable and the exception vector table; its initial page table
//!   (ours, [`map`]) turns the MMU and caches on before any Rust code runs:
//!   an identity map with Device-nGnRE for MMIO and the PCI windows and
//!   normal write-back memory for RAM;
//! - **exceptions**: every unexpected exception prints a decoded report
//!   ([`esr`]: class, fault status, FAR/ELR and the saved registers) and
//!   exits non-zero;
//! - **console**: the PL011 (`arm-pl011-uart`), a plain formatted log with
//!   machine-readable result lines (see `docs/baremetal.md`, "Output");
//! - **logs**: the [`log`] macros, defmt frames over semihosting with the
//!   `defmt` feature (decoded on the host), plain text on the PL011
//!   without;
//! - **time**: the generic timer (`CNTVCT_EL0`), also as an
//!   `embedded_hal::delay::DelayNs`;
//! - **PCI**: ECAM enumeration of bus 0 and BAR assignment ([`pci`]);
//! - **GPU transport**: the ivshmem-doorbell device carrying the refgpu
//!   register page ([`ivshmem`]), the RAM carve-out for GPU memory
//!   ([`carveout`]) and data-cache maintenance by range;
//! - **exit**: semihosting `SYS_EXIT_EXTENDED` with a status the host reads
//!   as QEMU's exit code.
//!
//! # Crate layout: what builds where
//!
//! The workspace is tested and linted on x86_64, so this crate has two
//! halves. The portable half ([`pci`], [`carveout`], [`esr`], [`ivshmem`],
//! [`map`]) has no target-specific code and is unit-tested on the host
//! against fakes (a fake config space, a page of ordinary memory standing
//! in for the register page). The hardware half (`arch`, boot, UART,
//! timer, caches, GIC, exit) is behind
//! `cfg(all(target_arch = "aarch64", target_os = "none"))`, and so are its
//! dependencies. The bootable images live in the separate `bm-images`
//! crate, whose binaries need the `image` feature and are built only by
//! `qemu-tests` (`cargo build --target aarch64-unknown-none --features
//! image,defmt`); host builds of the workspace skip them.
#![no_std]

pub mod carveout;
pub mod esr;
pub mod hal;
// The aarch64 transport (and the host's tests); not built for thumbv7em,
// whose board has no PCI (it reaches the model through `shared_ram`).
#[cfg(target_has_atomic = "64")]
pub mod ivshmem;
pub mod log;
pub mod m_fault;
// aarch64 stage-1 descriptors (64-bit constants): not for 32-bit Arm.
#[cfg(not(target_arch = "arm"))]
pub mod map;
pub mod pci;
pub mod shared_ram;
mod transport;

#[cfg(all(target_arch = "aarch64", target_os = "none"))]
pub mod arch;

/// The Cortex-M hardware half (`mps2-an386`): the same module name as the
/// aarch64 one, so the log macros and images find `arch::console`,
/// `arch::exit` and `arch::timer` on either.
#[cfg(all(target_arch = "arm", target_os = "none"))]
#[path = "arch_m/mod.rs"]
pub mod arch;
