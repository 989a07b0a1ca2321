//! Benchmark image: `bm_images::bench` on the ivshmem transport, figures
//! as `@@ BENCH <name> n=<n> median_ns=<..> p90_ns=<..> mean_ns=<..>`
//! lines (the host's `qemu-tests` bench `bare_metal` compares them with
//! the same scenarios over co-simulation).
//!
//! Semihosting command line: `polling` (default) or `msi`; `chunk=<bytes>`
//! (the IB chunk size); `window=<ns>` (`Config::batch_window_ns`, default
//! 0); `batch`: only the deferred-doorbell scenarios (`bench::bursts` of
//! 8 and `bench::service_latency`, with `@@ DOORBELLS <name>
//! submissions=<n> doorbells=<n>` lines; the host's `qemu-tests` bench
//! `batching` boots it with the window off and on). Time is the generic
//! timer (`CNTVCT_EL0`, the counter frequency is printed).
#![no_std]
#![no_main]

use bm_images::bench::{self, Figures};
use bm_images::boot;
use platform_baremetal::arch::{exit, timer};
use platform_baremetal::{image_main, println};
use umd_core::config::Config;
use umd_core::direct::MmuMode;

image_main!(main);

const SUBMITS: usize = 2048;
const TRIPS: usize = 1000;

static mut SAMPLES: [u64; SUBMITS] = [0; SUBMITS];

fn line(name: &str, f: &Figures) {
    println!("@@ BENCH {name} n={} median_ns={} p90_ns={} mean_ns={}", f.n, f.median, f.p90, f.mean);
}

/// Where a submit's time goes under TCG: the building blocks, 1000 each.
fn micro(dev: &boot::Gpu<16>) {
    use umd_core::platform::{DirectIo, Platform};
    let p = dev.platform();
    let t0 = timer::now_ns();
    for _ in 0..1000 {
        core::hint::black_box(timer::now_ns());
    }
    let t1 = timer::now_ns();
    for _ in 0..1000 {
        let _ = core::hint::black_box(p.read_reg(umd_core::hw::regs::ID));
    }
    let t2 = timer::now_ns();
    for _ in 0..1000 {
        platform_baremetal::arch::cache::clean(0x4100_0000, 4096);
    }
    let t3 = timer::now_ns();
    for _ in 0..1000 {
        core::hint::black_box(p.peer_id());
    }
    let t4 = timer::now_ns();
    for _ in 0..1000 {
        let _ = p.control_doorbell();
    }
    let t5 = timer::now_ns();
    let _ = p.now_ns();
    println!(
        "micro: now_ns {} ns, read_reg (BAR2 RAM) {} ns, clean 4 KiB {} ns, BAR0 MMIO read {} ns, doorbell (BAR0 MMIO write) {} ns (each, mean of 1000)",
        (t1 - t0) / 1000,
        (t2 - t1) / 1000,
        (t3 - t2) / 1000,
        (t4 - t3) / 1000,
        (t5 - t4) / 1000
    );
}

/// The deferred-doorbell scenarios, then the image exits.
fn batch(dev: &boot::Gpu<16>, samples: &mut [u64]) -> ! {
    match bench::bursts(dev, 8, 20, &mut samples[..200]) {
        Ok(b) => {
            line("burst8", &b.time);
            println!("@@ DOORBELLS burst8 submissions={} doorbells={}", b.submissions, b.doorbells);
        }
        Err(e) => {
            println!("@@ RESULT bench FAIL bursts: {e:?}");
            exit::exit(1)
        }
    }
    match bench::service_latency(dev, 20, &mut samples[..200]) {
        Ok(f) => line("service_latency", &f),
        Err(e) => {
            println!("@@ RESULT bench FAIL service_latency: {e:?}");
            exit::exit(1)
        }
    }
    println!("stats: {:?}", dev.stats());
    println!("@@ RESULT bench PASS");
    exit::exit(0)
}

/// The device's memory.
static DEVICE: boot::Slot<16> = boot::slot();

fn main() -> ! {
    // SAFETY: single core; only `main` touches SAMPLES, once.
    let samples = unsafe { &mut *core::ptr::addr_of_mut!(SAMPLES) };
    // `chunk=<bytes>`: IB chunk size (default: Config::DEFAULT's 64 KiB).
    let chunk = boot::arg_u64("chunk").map_or(Config::DEFAULT.ib_chunk_bytes, |c| c as usize);
    let window = boot::arg_u64("window").unwrap_or(0);
    let cfg = Config { ib_chunk_bytes: chunk, batch_window_ns: window, ..Config::DEFAULT };
    let (dev, mode) = boot::device("bench", &DEVICE, cfg, MmuMode::DEFAULT);
    println!("IB chunk {chunk} bytes, batch window {window} ns");
    if boot::has_arg("batch") {
        batch(&dev, samples);
    }
    println!(
        "counter: CNTFRQ_EL0 = {} Hz ({} ns per tick)",
        timer::frequency(),
        1_000_000_000 / timer::frequency()
    );
    match bench::submit_cost(&dev, samples) {
        Ok(f) => line("submit_cpu", &f),
        Err(e) => {
            println!("@@ RESULT bench FAIL submit_cost: {e:?}");
            exit::exit(1)
        }
    }
    match bench::round_trips(&dev, 100, &mut samples[..TRIPS]) {
        Ok(f) => line(if boot::has_arg("msi") { "round_trip_msi" } else { "round_trip_polling" }, &f),
        Err(e) => {
            println!("@@ RESULT bench FAIL round_trips: {e:?}");
            exit::exit(1)
        }
    }
    micro(&dev);
    boot::print_irqs(mode);
    println!("stats: {:?}", dev.stats());
    println!("@@ RESULT bench PASS");
    exit::exit(0)
}
