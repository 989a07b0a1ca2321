//! Cortex-M fault image (`mps2-an386`): failures on purpose, for the fault
//! tests. Semihosting command line (after the image name):
//!
//! - `cpu`: reads an address nothing decodes (after printing
//!   `@@ FAULT_ADDR <addr>`); the bus fault escalates to HardFault, whose
//!   handler prints the stacked registers and CFSR/HFSR/MMFAR/BFAR
//!   decoded, and exits with status 3.
//! - `device_loss`: first rings a doorbell for an engine that does not
//!   exist (`@@ BAD_DOORBELL <error>`: refused, nothing written), then
//!   submits small jobs on every queue, waiting for each; after a few
//!   prints `@@ KILL_MODEL_NOW` (the harness SIGKILLs `refgpu-sim`). When
//!   a submit or wait fails, prints `@@ DEVICE_LOST ...` with how long
//!   after the last completed fence the loss was detected, and exits 4.
//! - `small_carveout`: brings up with a 64 KiB GPU carve-out, too small
//!   for the device's pools: `@@ FATAL bring-up: ...` naming the pool
//!   that does not fit, exit 2 (before looking for the model).
//! - `matrix`: one cell of the fault matrix (`bm_images::fault_matrix`)
//!   on the suite's device: `lasting=<mask>` names the queues whose fault
//!   outlives the run, `seed=<n>` the workload's seed, `kill` kills the
//!   server halfway. Exits with status 0 when the accounting holds, 1
//!   otherwise. (The device lives in a `static` here, so there is no
//!   shutdown to count DMA pages after; the accounting's buffer and chunk
//!   counts are the leak check.)
#![no_std]
#![no_main]

use bm_images::boot_m;
use bm_images::device_loss;
use bm_images::fault_matrix::{self, Cell};
use conformance::{SUITE_CHUNKS, SUITE_CONFIG, SUITE_MMU};
use platform_baremetal::arch::exit;
use platform_baremetal::{image_main, println};
use umd_core::config::Config;
use umd_core::direct::MmuMode;
use umd_core::platform::DirectIo;

image_main!(main);

/// Nothing decodes this address on mps2-an386 (between the PSRAM's end at
/// 0x2200_0000 and the peripherals at 0x4000_0000): a precise bus fault.
const UNMAPPED: usize = 0x3000_0040;

static DEVICE: boot_m::Slot<8> = boot_m::slot();
static SUITE_DEVICE: boot_m::Slot<SUITE_CHUNKS> = boot_m::slot();

fn main() -> ! {
    if boot_m::has_arg("cpu") {
        println!("@@ BOOT m-fault mode=polling");
        println!("@@ FAULT_ADDR {UNMAPPED:#x}");
        // SAFETY: deliberately invalid: the read faults (bus error) and
        // the HardFault handler reports it and exits; it never returns.
        let v = unsafe { (UNMAPPED as *const u32).read_volatile() };
        println!("@@ FATAL read of an unmapped address returned {v:#x}");
        exit::exit(1)
    }
    if boot_m::has_arg("small_carveout") {
        let cfg = Config::DEFAULT;
        boot_m::transport("m-fault", 64 * 1024, &cfg, MmuMode::DEFAULT, 8);
        println!("@@ FATAL a 64 KiB carve-out was accepted");
        exit::exit(1)
    }
    if boot_m::has_arg("device_loss") {
        device_loss()
    }
    if boot_m::has_arg("matrix") {
        matrix()
    }
    println!("@@ FATAL m-fault image: say `cpu`, `device_loss`, `small_carveout` or `matrix`");
    exit::exit(2)
}

fn matrix() -> ! {
    let dev = boot_m::device("m-fault", &SUITE_DEVICE, SUITE_CONFIG, SUITE_MMU);
    let cell = Cell {
        seed: boot_m::arg_u64("seed").unwrap_or(conformance::faults::seed(false)),
        lasting: boot_m::arg_u64("lasting").and_then(|m| u8::try_from(m).ok()).unwrap_or(0),
        kill: boot_m::has_arg("kill"),
    };
    match fault_matrix::run(dev, cell, &|| dev.platform().check_heartbeat()) {
        Some(acc) => exit::exit(if acc.check().is_ok() { 0 } else { 1 }),
        None => exit::exit(2),
    }
}

fn device_loss() -> ! {
    let cfg = Config::DEFAULT;
    let dev = boot_m::device("m-fault", &DEVICE, cfg, MmuMode::DEFAULT);
    let before = dev.platform().doorbells_rung();
    match dev.platform().doorbell(3) {
        Ok(()) => println!("@@ FATAL a doorbell for engine 3 was accepted"),
        Err(e) => println!(
            "@@ BAD_DOORBELL engine 3: {e:?} (doorbells rung before {before}, after {})",
            dev.platform().doorbells_rung()
        ),
    }
    device_loss::run(dev, cfg.hang.window_ns, &|| dev.platform().is_lost())
}
