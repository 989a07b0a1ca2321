//! Demo image: the frame pipeline of `bm_images::demo` over the three
//! engines (COPY upload with a chained IB -> COMPUTE DISPATCH -> GFX
//! copy-out, semaphores between them), a readable report over the UART,
//! and the driver's timeline as a Chrome / Perfetto trace (one JSON line
//! between `@@ TRACE BEGIN` and `@@ TRACE END`; the host writes it to a
//! file).
//!
//! Semihosting command line: `polling` (default) or `msi`, `frames=<n>`,
//! `depth=<2|3>` (frames in flight, default 2).
#![no_std]
#![no_main]

use bm_images::boot::{self, Uart};
use bm_images::demo;
use platform_baremetal::arch::exit;
use platform_baremetal::{image_main, println};
use umd_core::debug::trace::TraceStorage;
use umd_core::debug::TraceRing;
use umd_core::direct::MmuMode;

image_main!(main);

/// The timeline kept for the trace (the device's own ring holds 256
/// events; the demo drains it here after every wait).
static TRACE: spin::Mutex<TraceStorage<{ demo::TRACE_CAP }>> = spin::Mutex::new(TraceStorage::new());

/// The device's memory.
static DEVICE: boot::Slot<{ demo::CHUNKS }> = boot::slot();

fn main() -> ! {
    let Some(storage) = TRACE.try_lock() else { exit::exit(2) };
    let mut trace = TraceRing::new(spin::mutex::MutexGuard::leak(storage));
    let frames = boot::arg_u64("frames").unwrap_or(8) as u32;
    let depth = boot::arg_u64("depth").unwrap_or(2) as u32;
    let (dev, mode) = boot::device("demo", &DEVICE, demo::CONFIG, MmuMode::DEFAULT);
    let sum = match demo::run(&dev, frames, depth, &mut trace) {
        Ok(s) => s,
        Err(e) => {
            println!("@@ RESULT demo FAIL {e}");
            if let Some(h) = dev.last_hang() {
                println!("{h}");
            }
            exit::exit(1)
        }
    };
    boot::print_irqs(mode);
    let events = trace.iter().count();
    let _ = demo::write_report(&mut Uart, &dev, &sum, events, trace.dropped());
    println!("@@ TRACE BEGIN");
    let _ = trace.write_chrome_json(&mut Uart);
    println!();
    println!("@@ TRACE END");
    let ok = sum.verified == sum.frames && sum.first_mismatch.is_none();
    if ok {
        println!("@@ RESULT demo PASS");
    } else {
        println!("@@ RESULT demo FAIL {} of {} frames verified", sum.verified, sum.frames);
    }
    println!("@@ DONE passed={} failed={}", u32::from(ok), u32::from(!ok));
    exit::exit(if ok { 0 } else { 1 })
}
