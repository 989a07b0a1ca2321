//! Cortex-M benchmark image (`mps2-an386`): `bm_images::bench` (the same
//! scenario functions as the aarch64 `bench` image) on the shared-RAM
//! transport, polling. Prints `@@ BENCH <name> n= median_ns= p90_ns=
//! mean_ns=` lines like the aarch64 image, plus the submit cost in CPU
//! cycles: from the DWT cycle counter when QEMU models it
//! (`@@ CYCLES dwt ...`), else from SysTick, which counts the same 25 MHz
//! CPU clock (`@@ CYCLES systick ...`).
#![no_std]
#![no_main]

use bm_images::bench::{self, Figures};
use bm_images::boot_m::{self, Gpu};
use platform_baremetal::arch::{cycles, exit, timer};
use platform_baremetal::{image_main, println};
use umd_core::config::Config;
use umd_core::direct::MmuMode;
use umd_core::sync::QueueId;

image_main!(main);

const SUBMITS: usize = 2048;
const TRIPS: usize = 1000;
/// Submissions timed with the cycle counter directly.
const CYCLE_SUBMITS: usize = 256;

static mut SAMPLES: [u64; SUBMITS] = [0; SUBMITS];
static DEVICE: boot_m::Slot<16> = boot_m::slot();

fn line(name: &str, f: &Figures) {
    println!("@@ BENCH {name} n={} median_ns={} p90_ns={} mean_ns={}", f.n, f.median, f.p90, f.mean);
}

/// Median CPU cycles of one `submit` (WRITE_DATA on COPY), timed with
/// CYCCNT (`dwt`) or SysTick ticks.
fn submit_cycles(dev: &Gpu<16>, samples: &mut [u64], dwt: bool) -> Option<u64> {
    let buf = dev.alloc_buffer(4096).ok()?;
    let va = dev.va(buf).ok()?;
    let mut last = None;
    for (i, s) in samples.iter_mut().enumerate() {
        if i % bench::BATCH == 0 {
            if let Some(f) = last.take() {
                dev.wait(f, 30_000_000_000).ok()?;
            }
        }
        let (c0, t0) = (cycles::cyccnt(), timer::ticks());
        let f = dev
            .submit(QueueId::COPY, &[], |cb| cb.write_data(va + 4 * (i as u64 % 1024), &[i as u32]))
            .ok()?;
        *s = if dwt {
            u64::from(cycles::cyccnt().wrapping_sub(c0))
        } else {
            timer::ticks().saturating_sub(t0)
        };
        last = Some(f);
    }
    dev.wait(last?, 30_000_000_000).ok()?;
    dev.free(buf).ok()?;
    Some(bench::figures(samples).median)
}

fn main() -> ! {
    // SAFETY: single core; only `main` touches SAMPLES, once.
    let samples = unsafe { &mut *core::ptr::addr_of_mut!(SAMPLES) };
    let dev = boot_m::device("m-bench", &DEVICE, Config::DEFAULT, MmuMode::DEFAULT);
    let dwt = cycles::counts();
    println!(
        "counter: SysTick at {} Hz ({} ns per tick); DWT CYCCNT counts: {dwt}",
        timer::CPU_HZ,
        1_000_000_000 / timer::CPU_HZ
    );
    match bench::submit_cost(dev, samples) {
        Ok(f) => line("submit_cpu", &f),
        Err(e) => {
            println!("@@ RESULT bench FAIL submit_cost: {e:?}");
            exit::exit(1)
        }
    }
    match submit_cycles(dev, &mut samples[..CYCLE_SUBMITS], dwt) {
        Some(c) => println!("@@ CYCLES {} submit_median={c}", if dwt { "dwt" } else { "systick" }),
        None => {
            println!("@@ RESULT bench FAIL submit cycles");
            exit::exit(1)
        }
    }
    match bench::round_trips(dev, 100, &mut samples[..TRIPS]) {
        Ok(f) => line("round_trip_polling", &f),
        Err(e) => {
            println!("@@ RESULT bench FAIL round_trips: {e:?}");
            exit::exit(1)
        }
    }
    println!("@@ DONE passed=1 failed=0");
    exit::exit(0)
}
