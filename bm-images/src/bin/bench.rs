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
//!
//! With `ib_sweep` on the command line the image runs the IB chunk-size
//! sweep instead (`bm_images::ib_sweep`; the host's `qemu-tests` test
//! `ib_sweep`): for each chunk size within the generation's IB limit a
//! device of its own (`Config::ib_chunk_bytes` set, the command line's
//! `umd.` entries applied over `ib_sweep::BASE_CONFIG`), brought up, run and
//! shut down in turn on the one transport, the whole sweep
//! `ib_sweep::REPEATS` times, all in this boot; an `ib_sweep: repeat`
//! line per device, then one `@@ BENCH ib_sweep ...` line per chunk size
//! (the repeats' medians, `ib_sweep::merge`), then `@@ RESULT ib_sweep
//! PASS|FAIL <why>` from `ib_sweep::check_shape` (exit status 0 or 1).
#![no_std]
#![no_main]

use core::mem::MaybeUninit;

use bm_images::bench::{self, Figures};
use bm_images::boot;
use bm_images::ib_sweep::{self, Row, Samples, CHUNKS, CHUNKS_ABOVE_1M, CHUNK_SIZES, REPEATS};
use platform_baremetal::arch::board::VirtHal;
use platform_baremetal::arch::{exit, timer};
use platform_baremetal::ivshmem::IvshmemGpu;
use platform_baremetal::{image_main, println};
use umd_core::config::Config;
use umd_core::direct::{Device, InPlace, MmuMode};
use umd_core::storage::DeviceStorage;

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

/// The sweep's device tables, one device at a time.
static SWEEP_STORAGE: spin::Mutex<DeviceStorage> = spin::Mutex::new(DeviceStorage::new());
/// The sweep's samples, one row at a time.
static SWEEP_SAMPLES: spin::Mutex<Samples> = spin::Mutex::new(Samples::new());

/// One row of the sweep on a device of `C` chunks with `cfg`, brought up
/// on `io` and shut down again: the row and the generation's IB limit.
/// The device is built in place in this function's frame (about 30 KiB
/// of the 1 MiB boot stack), the tables in `storage`.
fn sweep_row<const C: usize>(
    io: &IvshmemGpu<VirtHal>,
    storage: &mut DeviceStorage,
    cfg: Config,
    samples: &mut Samples,
) -> Result<(Row, usize), &'static str> {
    let mut slot = MaybeUninit::<Device<'_, IvshmemGpu<VirtHal>, C>>::uninit();
    let dev = match Device::new_in(&mut slot, io, storage, cfg, MmuMode::DEFAULT) {
        Ok(d) => d,
        Err(e) => {
            println!("@@ FATAL Device::new with {} B chunks: {e}", cfg.ib_chunk_bytes);
            return Err("bring-up");
        }
    };
    let max_ib = ib_sweep::max_ib_bytes(dev.encoder());
    let chip = dev.chip();
    println!("@@ DEVICE gen={} rev={}", chip.generation.number(), chip.revision);
    println!("@@ CONFIG {}", dev.config().text());
    let row = ib_sweep::run(&dev, samples);
    let report = InPlace::shutdown(dev);
    let row = row.map_err(|e| match e {
        bench::BenchError::Submit => "submit",
        bench::BenchError::Wait => "wait",
        bench::BenchError::Alloc => "alloc",
        bench::BenchError::Wrong => "the work read back wrong",
    })?;
    if report.leaked_buffers != 0 {
        return Err("leaked buffers");
    }
    Ok((row, max_ib))
}

/// The IB chunk-size sweep (see the module docs).
fn sweep() -> ! {
    let (io, _mode) = boot::transport("bench");
    let (Some(mut storage), Some(mut samples)) = (SWEEP_STORAGE.try_lock(), SWEEP_SAMPLES.try_lock()) else {
        println!("@@ FATAL the sweep's storage is taken");
        exit::exit(2)
    };
    let base = boot::config_from_args(ib_sweep::BASE_CONFIG);
    // Each repeat runs every chunk size in turn: reps[size][repeat].
    let mut reps = [[Row::default(); REPEATS]; CHUNK_SIZES.len()];
    let mut max_ib = usize::MAX;
    let mut sizes = 0;
    for repeat in 0..REPEATS {
        sizes = 0;
        for chunk in CHUNK_SIZES {
            if chunk > max_ib {
                if repeat == 0 {
                    println!(
                        "ib_sweep: {chunk} B chunks skipped: above the generation's IB limit of {max_ib} B"
                    );
                }
                continue;
            }
            let cfg = Config { ib_chunk_bytes: chunk, ..base };
            let got = if ib_sweep::chunks_for(chunk) == CHUNKS {
                sweep_row::<CHUNKS>(&io, &mut storage, cfg, &mut samples)
            } else {
                sweep_row::<CHUNKS_ABOVE_1M>(&io, &mut storage, cfg, &mut samples)
            };
            match got {
                Ok((row, limit)) => {
                    println!("ib_sweep: repeat {repeat}: {row}");
                    max_ib = limit;
                    if let Some(r) = reps.get_mut(sizes).and_then(|r| r.get_mut(repeat)) {
                        *r = row;
                    }
                    sizes += 1;
                }
                Err(why) => {
                    println!("@@ RESULT ib_sweep FAIL {chunk} B chunks: {why}");
                    exit::exit(1)
                }
            }
        }
    }
    let mut rows = [Row::default(); CHUNK_SIZES.len()];
    for (row, r) in rows.iter_mut().zip(reps.iter()).take(sizes) {
        let Some(m) = ib_sweep::merge(r) else {
            let chunk = r.first().map_or(0, |x| x.chunk_bytes);
            println!("@@ RESULT ib_sweep FAIL the repeats of {chunk} B chunks differ in pool");
            exit::exit(1)
        };
        println!("@@ BENCH {m}");
        *row = m;
    }
    match ib_sweep::check_shape(rows.get(..sizes).unwrap_or(&[]), max_ib) {
        Ok(()) => {
            println!("@@ RESULT ib_sweep PASS");
            exit::exit(0)
        }
        Err(e) => {
            println!("@@ RESULT ib_sweep FAIL {e}");
            exit::exit(1)
        }
    }
}

fn main() -> ! {
    if boot::has_arg("ib_sweep") {
        sweep()
    }
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
