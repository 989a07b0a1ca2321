//! Smoke image: brings up `umd_core::direct::Device` on the refgpu behind
//! ivshmem-doorbell (GPU MMU on), runs copy + fill + fence checks on every
//! queue and a cross-queue wait, prints one result line per check and
//! exits through semihosting with 0 when all passed.
//!
//! Semihosting command line: `polling` (default) or `msi`.
#![no_std]
#![no_main]

use bm_images::{boot, smoke};
use platform_baremetal::arch::exit;
use platform_baremetal::{image_main, println};
use umd_core::config::Config;
use umd_core::direct::MmuMode;

image_main!(main);

/// The device's memory.
static DEVICE: boot::Slot<8> = boot::slot();

fn main() -> ! {
    let (dev, _mode) = boot::device("smoke", &DEVICE, Config::DEFAULT, MmuMode::DEFAULT);
    let (mut passed, mut failed) = (0u32, 0u32);
    for (name, check) in smoke::list() {
        match check(&dev) {
            Ok(()) => {
                passed += 1;
                println!("@@ RESULT {name} PASS");
            }
            Err(f) => {
                failed += 1;
                println!("@@ RESULT {name} FAIL {f}");
            }
        }
    }
    let st = dev.stats();
    println!("stats: {st:?}");
    println!(
        "@@ IRQS msi={} total={}",
        platform_baremetal::arch::irq::MSI_TOTAL.load(core::sync::atomic::Ordering::Relaxed),
        platform_baremetal::arch::irq::IRQS_TAKEN.load(core::sync::atomic::Ordering::Relaxed)
    );
    println!("@@ DONE passed={passed} failed={failed}");
    exit::exit(if failed == 0 { 0 } else { 1 })
}
