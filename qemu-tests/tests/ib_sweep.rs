//! The IB chunk-size sweep on bare metal (`docs/perf.md`, "IB sizing"):
//! the `bench` image with `ib_sweep` on its command line, gen2 and gen1,
//! polling, one boot each (every row's device brought up and shut down
//! in that boot). Each test asserts the sweep's shape
//! (`bm_images::ib_sweep::check_shape`, in the guest and again here on
//! the parsed rows: every row ran, memory held grows with the chunk
//! size, CHAINs per submission do not) and prints the table; no figure of
//! time is asserted.
//!
//! ```sh
//! cargo test -p qemu-tests --test ib_sweep -- --nocapture --test-threads=1
//! ```

use bm_images::ib_sweep::{self, Row, BASELINE_CHUNK};
use qemu_tests::{boot, Mode, Run, Status};

/// The IB limit of each generation (`docs/refgpu.md` 5.2).
fn max_ib(generation: u8) -> usize {
    if generation == 1 {
        1 << 20
    } else {
        16 << 20
    }
}

fn size(b: usize) -> String {
    if b >= 1 << 20 {
        format!("{} MiB", b >> 20)
    } else {
        format!("{} KiB", b >> 10)
    }
}

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1000.0)
}

/// Boots the sweep on `generation`, checks it and prints its table.
fn sweep(generation: u8) {
    let run = Run { args: vec!["ib_sweep"], ..Run::new("bench", generation, Mode::Polling) };
    let out = boot(&run).unwrap_or_else(|e| panic!("{e}"));
    let rows: Vec<Row> =
        out.boot.console.iter().filter_map(|l| l.strip_prefix("@@ BENCH ")).filter_map(Row::parse).collect();
    assert_eq!(out.boot.exit_code, Some(0), "the sweep failed\n{}", out.tail(30));
    assert_eq!(out.device_gen, Some(generation), "device generation\n{}", out.tail(30));
    assert_eq!(out.status("ib_sweep"), Some(&Status::Pass), "the image's shape check\n{}", out.tail(30));
    ib_sweep::check_shape(&rows, max_ib(generation)).unwrap_or_else(|e| panic!("gen{generation}: {e}"));
    let base =
        rows.iter().find(|r| r.chunk_bytes == BASELINE_CHUNK).map_or(1, |r| r.cpu_per_submit_ns.max(1));
    println!();
    println!("gen{generation}, bare metal (QEMU virt, Cortex-A53, TCG), polling, MMU on; times in µs");
    println!();
    println!(
        "| chunk | chunks | pool held | peak in use | CPU per submission (÷ 64 KiB) | small / large submit CPU (median) | \
         small / large submit → fence (median) | CHAINs per submission | per large submission | ring wraps | pool waits |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} ({:.2}) | {} / {} | {} / {} | {:.3} | {:.2} | {} | {} |",
            size(r.chunk_bytes),
            r.chunks,
            size(r.pool_bytes),
            size(r.peak_busy_bytes),
            us(r.cpu_per_submit_ns),
            r.cpu_per_submit_ns as f64 / base as f64,
            us(r.small_cpu.median),
            us(r.large_cpu.median),
            us(r.small_latency.median),
            us(r.large_latency.median),
            r.chains as f64 / r.submissions.max(1) as f64,
            r.large_chains as f64 / ib_sweep::ROUNDS as f64,
            r.ring_wraps,
            r.pool_waits,
        );
    }
}

#[test]
fn gen2_ib_sweep() {
    sweep(2);
}

#[test]
fn gen1_ib_sweep() {
    sweep(1);
}
