//! Smoke image: brings up `umd_core::device::Device` on the refgpu behind
//! ivshmem-doorbell (GPU MMU on), runs copy + fill + fence checks on every
//! queue and a cross-queue wait, prints one result line per check and
//! exits through semihosting with 0 when all passed.
//!
//! Semihosting command line: `polling` (default) or `msi`.
#![no_std]
#![no_main]

use bm_images::smoke;
use platform_baremetal::arch::board::{self, IrqMode};
use platform_baremetal::arch::exit;
use platform_baremetal::{image_main, println};
use umd_core::config::Config;
use umd_core::device::{Device, MmuMode};

image_main!(main);

fn main() -> ! {
    let mut buf = [0u8; 256];
    let cmd = exit::cmdline(&mut buf);
    let mode = if cmd.split_whitespace().any(|a| a == "msi") { IrqMode::Msi } else { IrqMode::Polling };
    println!("@@ BOOT smoke mode={}", if mode == IrqMode::Msi { "msi" } else { "polling" });
    let gpu = match board::bring_up(mode) {
        Ok(g) => g,
        Err(e) => {
            println!("@@ FATAL bring-up: {e}");
            exit::exit(2)
        }
    };
    let mut dev: Device<_, 8> = match Device::new(gpu.io, Config::DEFAULT, MmuMode::DEFAULT) {
        Ok(d) => d,
        Err((e, _)) => {
            println!("@@ FATAL Device::new: {e}");
            exit::exit(2)
        }
    };
    let chip = dev.chip();
    println!("@@ DEVICE gen={} rev={}", chip.generation.number(), chip.revision);
    let (mut passed, mut failed) = (0u32, 0u32);
    for (name, check) in smoke::list() {
        match check(&mut dev) {
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
