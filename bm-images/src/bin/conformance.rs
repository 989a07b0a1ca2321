//! Conformance image: runs the whole `conformance` suite on the refgpu behind ivshmem-doorbell, one `@@ RESULT` line
//! per scenario, the page-fault scenario's decoded fault report between
//! `@@ REPORT <scenario> BEGIN` / `@@ REPORT END`, then exits through
//! semihosting: 0 when nothing failed, 1 otherwise.
//!
//! Semihosting command line: `polling` (default) or `msi`; `validation`
//! runs the suite with umd-core's validation mode on (the image must be
//! built with the `validation` feature: otherwise `@@ FATAL`, exit 2);
//! `umd.<key>=<value>` entries configure the driver (`bm_images::knobs`);
//! `dump`: the driver's state dump at the end too
//! (`@@ REPORT state-on-request`).
#![no_std]
#![no_main]

use bm_images::{boot, suite};
use conformance::{Env, SUITE_CHUNKS, SUITE_CONFIG, SUITE_MMU};
use platform_baremetal::arch::exit;
use platform_baremetal::{image_main, println};

image_main!(main);

/// The device's memory.
static DEVICE: boot::Slot<SUITE_CHUNKS> = boot::slot();

fn main() -> ! {
    let (dev, mode) = boot::device("conformance", &DEVICE, SUITE_CONFIG, SUITE_MMU);
    suite::validation_from_args(&dev, boot::has_arg("validation"));
    // One core, no scheduler: no threads for the multi-submitter scenario.
    let env = Env { parallel: None };
    let n = suite::run(&dev, &env);
    if boot::has_arg("dump") {
        suite::print_state(&dev, "state-on-", "request");
    }
    boot::print_irqs(mode);
    println!("stats: {:?}", dev.stats());
    println!("@@ DONE passed={} failed={} skipped={}", n.passed, n.failed, n.skipped);
    exit::exit(if n.failed == 0 { 0 } else { 1 })
}
