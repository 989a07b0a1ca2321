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
//! `docs/reliability.md` has the latest figures.

mod common;

use std::sync::Mutex;
use std::time::Instant;

use common::{Sim, MEM_SIZE};
use conformance::{SUITE_CHUNKS, SUITE_CONFIG, SUITE_MMU};
use platform_linux::soak::{self, Bound, Probe, Soak};
use platform_linux::Cosim;
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
