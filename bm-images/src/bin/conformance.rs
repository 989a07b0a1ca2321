//! Conformance image: runs the whole `conformance` suite on the refgpu behind ivshmem-doorbell, one `@@ RESULT` line
//! per scenario, the page-fault scenario's decoded fault report between
//! `@@ REPORT <scenario> BEGIN` / `@@ REPORT END`, then exits through
//! semihosting: 0 when nothing failed, 1 otherwise.
//!
//! Semihosting command line: `polling` (default) or `msi`.
#![no_std]
#![no_main]

use bm_images::{boot, report_line};
use conformance::{Env, Outcome, SUITE_CHUNKS, SUITE_CONFIG, SUITE_MMU};
use platform_baremetal::arch::exit;
use platform_baremetal::{image_main, println};

image_main!(main);

fn main() -> ! {
    let (dev, mode) = boot::device::<SUITE_CHUNKS>("conformance", SUITE_CONFIG, SUITE_MMU);
    // One core, no scheduler: no threads for the multi-submitter scenario.
    let env = Env { parallel: None };
    let (mut passed, mut failed, mut skipped) = (0u32, 0u32, 0u32);
    for s in conformance::scenarios() {
        let t0 = platform_baremetal::arch::timer::now_ns();
        let r = s.run(&dev, &env);
        let ms = platform_baremetal::arch::timer::now_ns().saturating_sub(t0) / 1_000_000;
        match r.outcome {
            Outcome::Pass => passed += 1,
            Outcome::Fail => failed += 1,
            Outcome::Skip => skipped += 1,
        }
        report_line(&r);
        println!("   ({} ms guest time)", ms);
        if r.name == "page_fault_reported" {
            if let Some(h) = dev.last_hang() {
                println!("@@ REPORT {} BEGIN", r.name);
                println!("{h}");
                println!("@@ REPORT END");
            }
        }
    }
    boot::print_irqs(mode);
    println!("stats: {:?}", dev.stats());
    println!("@@ DONE passed={passed} failed={failed} skipped={skipped}");
    exit::exit(if failed == 0 { 0 } else { 1 })
}
