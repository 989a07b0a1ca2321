//! Fault image: failures on purpose, for the fault tests.
//!
//! Semihosting command line (after the image name):
//!
//! - `cpu`: reads an unmapped address (GiB 4, outside the identity map)
//!   after printing `@@ FAULT_ADDR <addr>`; the exception handler prints
//!   the decoded report (class, fault status, FAR, ELR, registers) and
//!   exits with status 3.
//! - `device_loss`: submits small jobs on every queue in a loop, waiting
//!   for each; after a few prints `@@ KILL_MODEL_NOW` (the harness then
//!   kills `refgpu-sim`). When a submit or wait fails, prints
//!   `@@ DEVICE_LOST ...` with how long after the last completed fence the
//!   loss was detected, the report, and exits with status 4.
//! - `matrix`: one cell of the fault matrix (`bm_images::fault_matrix`)
//!   on the suite's device: `lasting=<mask>` names the queues whose fault
//!   outlives the run (the server's knobs are fixed at its start),
//!   `seed=<n>` the workload's seed, `kill` kills the server halfway. Then
//!   shuts the device down (leaks and DMA pages counted in
//!   `@@ SHUTDOWN leaked_buffers=<n> dma_pages=<n>`) and exits with status
//!   0 when the accounting and the shutdown hold, 1 otherwise.
//!
//! Plus `polling` (default) or `msi`.
#![no_std]
#![no_main]

use bm_images::boot;
use bm_images::device_loss;
use bm_images::fault_matrix::{self, Cell};
use conformance::{SUITE_CHUNKS, SUITE_CONFIG, SUITE_MMU};
use platform_baremetal::arch::exit;
use platform_baremetal::{image_main, println};
use umd_core::config::Config;
use umd_core::direct::{InPlace, MmuMode};

image_main!(main);

/// Unmapped: the identity map covers GiB 0, 1 and 256 only.
const UNMAPPED: usize = 0x1_0000_0040;

/// The memory of the device of `device_loss` and of `matrix` (one runs per boot).
static DEVICE: boot::Slot<8> = boot::slot();
static SUITE_DEVICE: boot::Slot<SUITE_CHUNKS> = boot::slot();

fn main() -> ! {
    if boot::has_arg("cpu") {
        println!("@@ BOOT fault mode={}", boot::mode_name(boot::mode()));
        println!("@@ FAULT_ADDR {UNMAPPED:#x}");
        // SAFETY: deliberately invalid: the read faults (translation fault,
        // level 1) and the exception handler reports it and exits; it never
        // returns a value.
        let v = unsafe { (UNMAPPED as *const u64).read_volatile() };
        println!("@@ FATAL read of an unmapped address returned {v:#x}");
        exit::exit(1)
    }
    if boot::has_arg("device_loss") {
        device_loss()
    }
    if boot::has_arg("matrix") {
        matrix()
    }
    println!("@@ FATAL fault image: say `cpu`, `device_loss` or `matrix`");
    exit::exit(2)
}

fn matrix() -> ! {
    let (mut io, _mode) = boot::transport("fault");
    // A killed server is noticed by the transport's heartbeat after one
    // hang window, as by the core's hang check.
    io.loss_window_ns = SUITE_CONFIG.hang.window_ns;
    let dev = boot::device_on(&SUITE_DEVICE, io, SUITE_CONFIG, SUITE_MMU);
    let cell = Cell {
        seed: boot::arg_u64("seed").unwrap_or(conformance::faults::seed(false)),
        lasting: boot::arg_u64("lasting").and_then(|m| u8::try_from(m).ok()).unwrap_or(0),
        kill: boot::has_arg("kill"),
    };
    let Some(acc) = fault_matrix::run(&dev, cell, &|| dev.platform().check_heartbeat()) else {
        exit::exit(2)
    };
    let report = InPlace::shutdown(dev);
    let pages = boot::transport_ref().map_or(0, |t| t.dma_pages_used());
    println!("@@ SHUTDOWN leaked_buffers={} dma_pages={pages}", report.leaked_buffers);
    let clean = acc.check().is_ok() && report.leaked_buffers == 0 && pages == 0;
    exit::exit(if clean { 0 } else { 1 })
}

fn device_loss() -> ! {
    let cfg = Config::DEFAULT;
    let (mut io, _mode) = boot::transport("fault");
    // The transport's heartbeat check gives up after one hang window, like
    // the core's hang check.
    io.loss_window_ns = cfg.hang.window_ns;
    let dev = boot::device_on(&DEVICE, io, cfg, MmuMode::DEFAULT);
    device_loss::run(&dev, cfg.hang.window_ns, &|| dev.platform().is_lost())
}
