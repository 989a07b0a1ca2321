//! Cortex-M conformance image (`mps2-an386`): the whole `conformance`
//! suite on the refgpu behind the shared-RAM binding (polling), one
//! `@@ RESULT` line per scenario with its guest time, the page-fault
//! scenario's decoded report between `@@ REPORT <scenario> BEGIN` /
//! `@@ REPORT END`, then exits through semihosting: 0 when nothing
//! failed, 1 otherwise. Scenarios that cannot run here (no threads; gen1
//! has no local memory) are skipped with the reason printed.
//!
//! Semihosting command line: `validation` runs the suite with umd-core's
//! validation mode on (the image must be built with the `validation`
//! feature: otherwise `@@ FATAL`, exit 2); `umd.<key>=<value>` entries
//! configure the driver (`bm_images::knobs`).
#![no_std]
#![no_main]

use bm_images::boot_m;
use bm_images::suite;
use conformance::{Env, SUITE_CHUNKS, SUITE_CONFIG, SUITE_MMU};
use platform_baremetal::arch::exit;
use platform_baremetal::{image_main, println};

image_main!(main);

static DEVICE: boot_m::Slot<SUITE_CHUNKS> = boot_m::slot();

fn main() -> ! {
    let dev = boot_m::device("m-conformance", &DEVICE, SUITE_CONFIG, SUITE_MMU);
    suite::validation_from_args(dev, boot_m::has_arg("validation"));
    // One core, no scheduler: no threads for the multi-submitter scenario.
    let env = Env { parallel: None };
    let n = suite::run(dev, &env);
    println!("stats: {:?}", dev.stats());
    println!("doorbells rung: {}", dev.platform().doorbells_rung());
    println!("@@ IRQS msi=0 total=0");
    println!("@@ DONE passed={} failed={} skipped={}", n.passed, n.failed, n.skipped);
    exit::exit(if n.failed == 0 { 0 } else { 1 })
}
