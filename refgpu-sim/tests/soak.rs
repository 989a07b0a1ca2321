//! The soak over co-simulation: `platform_linux::soak`'s workload (random
//! cross-queue waits, random buffer allocations and frees, a hang and a
//! fault injected every 5,000 submissions) on a `refgpu-sim` child process,
//! with the memory and threads of both processes, the platform's DMA pages
//! and the driver's pool statistics sampled 100 times and checked flat,
//! and the accounting checked exact at the end.
//!
//! `soak` is the long run, ignored by `cargo test --workspace` (it is meant
//! for release builds): `REFGPU_SOAK_SUBMISSIONS` submissions (default
//! 100,000, what `.ci/run` runs):
//!
//! ```sh
//! REFGPU_SOAK_SUBMISSIONS=1000000 cargo test --release -p refgpu-sim --test soak -- --ignored --nocapture
//! ```
//!
//! `REFGPU_SOAK_GEN=1` runs generation 1 (default 2), `REFGPU_SOAK_POLL=1`
//! polling only (default: interrupts); with `REFGPU_SOAK_SERIES` set, every
//! sampled value is printed.
//!
//! `short_soak` runs the same with 10,000 submissions in every test run.
//!
//! `soak_write_back` runs the workload on the in-process model behind the
//! write-back CPU cache model (`platform_linux::cache`: the CPU sees the
//! device's memory only through the driver's cleans and invalidates, and
//! dirty lines are written back at doorbells at random), with one job in
//! four copying a word the CPU wrote into its result word
//! (`Soak::copy_every`): the CPU's data must reach the GPU, the GPU's the
//! CPU, no pattern word may change, no line may be dirty at any sample
//! (outside a CPU write of the driver) and no dirty line may ever be
//! invalidated away. `REFGPU_SOAK_WB_SUBMISSIONS` submissions (default
//! 20,000, also run by the command above); `short_soak_write_back` runs
//! 1,000 in every test run.
//!
//! `docs/reliability.md` has the latest figures.

mod common;

use std::sync::Mutex;
use std::time::Instant;

use common::{Sim, MEM_SIZE};
use conformance::{SUITE_CHUNKS, SUITE_CONFIG, SUITE_MMU};
use platform_linux::cache::Cache;
use platform_linux::soak::{self, Bound, Probe, Soak};
use platform_linux::{Cosim, InProcess, InProcessOptions};
use refgpu_model::{Generation, ModelConfig};
use umd_core::config::{Config, HangConfig};
use umd_core::direct::Device;
use umd_core::storage::DeviceStorage;

/// The two tests sample their own process's threads: never run together.
static SERIAL: Mutex<()> = Mutex::new(());

/// The suite's configuration with a 200 ms hang window, so the injected
/// hangs (one every 5,000 submissions) do not dominate the run.
const CONFIG: Config =
    Config { hang: HangConfig { window_ns: 200_000_000, ..SUITE_CONFIG.hang }, ..SUITE_CONFIG };

/// `field` of `/proc/<pid>/status` (kB for memory, a count for Threads).
fn status(pid: &str, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc status");
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

fn run(jobs: usize) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let gen = std::env::var("REFGPU_SOAK_GEN").unwrap_or_else(|_| "2".into());
    let sim = Sim::start(&["--gen", &gen]);
    let server = sim.child.as_ref().expect("running").id().to_string();
    let p = Cosim::connect(&sim.socket).expect("connect to refgpu-sim");
    let mut storage: Box<DeviceStorage> = Box::default();
    let use_irq = std::env::var_os("REFGPU_SOAK_POLL").is_none();
    let cfg = Config { use_irq, ..CONFIG };
    let dev: Device<'_, Cosim, SUITE_CHUNKS> = match Device::new(&p, &mut storage, cfg, SUITE_MMU) {
        Ok(d) => d,
        Err(e) => panic!("Device::new: {e}\n{}", sim.log_text()),
    };
    // Memory in KiB. Anonymous memory (the heap) must stay within 10 % or
    // 2 MiB of its warm-up maximum; the total also counts the pages of the
    // shared memory file touched so far, so it may grow by up to its size.
    let mem_file_kib = MEM_SIZE / 1024;
    let mut measure = || {
        vec![
            status("self", "VmRSS"),
            status("self", "RssAnon"),
            status("self", "Threads"),
            status(&server, "VmRSS"),
            status(&server, "RssAnon"),
            status(&server, "Threads"),
            p.dma_pages_used() as u64,
        ]
    };
    let mut probe = Probe {
        metrics: vec![
            ("test process RSS (KiB)", Bound::AfterWarmup(mem_file_kib)),
            ("test process anonymous RSS (KiB)", Bound::AfterWarmupPct(10, 2048)),
            ("test process threads", Bound::AfterWarmup(0)),
            ("refgpu-sim RSS (KiB)", Bound::AfterWarmup(mem_file_kib)),
            ("refgpu-sim anonymous RSS (KiB)", Bound::AfterWarmupPct(10, 2048)),
            ("refgpu-sim threads", Bound::AfterWarmup(0)),
            ("platform DMA pages", Bound::AfterWarmupPct(25, 64)),
        ],
        measure: &mut measure,
    };
    let s = Soak::new(0x50A4, jobs);
    let start = Instant::now();
    let rep = soak::run(&dev, s, &mut probe);
    let secs = start.elapsed().as_secs_f64();
    println!(
        "soak gen{gen} irq={use_irq}: {jobs} submissions in {secs:.1} s ({:.0} per second); hang window {} ms, a hang and a fault every {}",
        jobs as f64 / secs,
        CONFIG.hang.window_ns / 1_000_000,
        s.hang_every
    );
    println!("{rep}");
    println!("driver counters: {:?}", dev.stats());
    println!("{}", rep.series_table());
    if std::env::var_os("REFGPU_SOAK_SERIES").is_some() {
        for s in &rep.series {
            println!("{}: {:?}", s.name, s.points.iter().map(|p| p.1).collect::<Vec<_>>());
        }
    }
    if let Err(e) = rep.check() {
        panic!("soak: {e}\n{rep}\n{}\nserver log:\n{}", rep.series_table(), sim.log_text());
    }
    assert_eq!(rep.hangs_reported, rep.hangs_injected, "an injected hang not reported as one: {rep}");
    assert!(rep.faults_reported > 0, "no injected fault reported as one: {rep}");
    let report = dev.shutdown();
    assert_eq!(report.leaked_buffers, 0, "leaked at shutdown");
    assert_eq!(p.dma_pages_used(), 0, "DMA regions leaked");
}

#[test]
fn short_soak() {
    run(10_000);
}

#[test]
#[ignore = "long: run in release (.ci/run does, with 100,000 submissions)"]
fn soak() {
    let jobs = std::env::var("REFGPU_SOAK_SUBMISSIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    run(jobs);
}

/// The soak on the in-process model behind the write-back cache model
/// (see the module documentation).
fn run_write_back(jobs: usize) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let generation = match std::env::var("REFGPU_SOAK_GEN").as_deref() {
        Ok("1") => Generation::Gen1,
        _ => Generation::Gen2,
    };
    let model = ModelConfig { generation, mem_base: 0x4000_0000, mem_size: MEM_SIZE, ..Default::default() };
    // A dirty line is written back at a doorbell with probability 1/4: a
    // line the driver left dirty would sooner or later go out over the
    // GPU's data.
    let cache = Cache::WriteBack { seed: 0x50A4, evict_per_mille: 250 };
    let p = InProcess::with_options(model, InProcessOptions { cache }).expect("model");
    let mut storage: Box<DeviceStorage> = Box::default();
    let use_irq = std::env::var_os("REFGPU_SOAK_POLL").is_none();
    let cfg = Config { use_irq, ..CONFIG };
    let dev: Device<'_, InProcess, SUITE_CHUNKS> =
        Device::new(&p, &mut storage, cfg, SUITE_MMU).expect("Device::new");
    let mut measure = || {
        vec![
            status("self", "VmRSS"),
            status("self", "RssAnon"),
            status("self", "Threads"),
            p.dma_pages_used() as u64,
            p.dirty_lines() as u64,
        ]
    };
    let mut probe = Probe {
        metrics: vec![
            // The model's memory is part of the process here: its pages
            // count once touched.
            ("process RSS (KiB)", Bound::AfterWarmup(MEM_SIZE / 1024)),
            ("process anonymous RSS (KiB)", Bound::AfterWarmupPct(10, 2048 + MEM_SIZE / 1024)),
            ("process threads", Bound::AfterWarmup(0)),
            ("platform DMA pages", Bound::AfterWarmupPct(25, 64)),
            // Between the workload's calls no line may be dirty: the
            // driver cleans what it writes before it returns.
            ("dirty CPU cache lines", Bound::Fixed(0)),
        ],
        measure: &mut measure,
    };
    let s = Soak { copy_every: 4, ..Soak::new(0x50A4, jobs) };
    let start = Instant::now();
    let rep = soak::run(&dev, s, &mut probe);
    let secs = start.elapsed().as_secs_f64();
    let cs = p.cache_stats();
    println!(
        "soak (in-process, write-back cache) {generation:?} irq={use_irq}: {jobs} submissions in {secs:.1} s ({:.0} per second); hang window {} ms, a hang and a fault every {}",
        jobs as f64 / secs,
        CONFIG.hang.window_ns / 1_000_000,
        s.hang_every
    );
    println!("{rep}");
    println!("cache: {cs:?}");
    println!("driver counters: {:?}", dev.stats());
    println!("{}", rep.series_table());
    if let Err(e) = rep.check() {
        panic!("soak: {e}\n{rep}\n{}\ncache: {cs:?}", rep.series_table());
    }
    assert_eq!(rep.hangs_reported, rep.hangs_injected, "an injected hang not reported as one: {rep}");
    assert!(rep.faults_reported > 0, "no injected fault reported as one: {rep}");
    assert!(rep.copies_checked > 0, "no CPU-written word went through the GPU: {rep}");
    assert!(cs.lines_cleaned > 0 && cs.lines_invalidated > 0, "the cache model saw no maintenance: {cs:?}");
    assert_eq!(cs.dirty_lines_discarded, 0, "an invalidate threw CPU writes away: {cs:?}");
    let report = dev.shutdown();
    assert_eq!(report.leaked_buffers, 0, "leaked at shutdown");
    assert_eq!(p.dma_pages_used(), 0, "DMA regions leaked");
}

#[test]
fn short_soak_write_back() {
    run_write_back(1_000);
}

#[test]
#[ignore = "long: run in release (.ci/run does, with 20,000 submissions)"]
fn soak_write_back() {
    let jobs =
        std::env::var("REFGPU_SOAK_WB_SUBMISSIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    run_write_back(jobs);
}
