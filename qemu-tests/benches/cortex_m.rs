//! The Cortex-M4 image beside the aarch64 image, measured in the same run
//! (`docs/perf.md`, "Cortex-M4"): `m-bench` (`mps2-an386`, shared-RAM binding, polling) and
//! `bench` (`virt`, ivshmem, polling), both running `bm_images::bench`'s
//! scenarios against `refgpu-sim --gen 2`: the CPU time of one `submit`
//! and the doorbell -> fence round trip, in guest nanoseconds, plus the
//! M4's submit cost in CPU cycles (DWT CYCCNT when QEMU models it, else
//! SysTick on the same 25 MHz clock).
//!
//! ```sh
//! cargo bench -p qemu-tests --bench cortex_m
//! ```
//!
//! Prints a Markdown table with the M4 / A53 ratio of the medians. Needs
//! QEMU (`.ci/install-qemu.sh`).

use qemu_tests::{boot, Mode, Outcome, Run};

/// `(name, median_ns, p90_ns, mean_ns)` of every `@@ BENCH` line.
fn figures(out: &Outcome) -> Vec<(String, u64, u64, u64)> {
    out.boot
        .console
        .iter()
        .filter_map(|l| l.strip_prefix("@@ BENCH "))
        .map(|l| {
            let mut it = l.split_whitespace();
            let name = it.next().unwrap_or("").to_string();
            let (mut m, mut p, mut a) = (0, 0, 0);
            for kv in it {
                let (k, v) = kv.split_once('=').unwrap_or((kv, "0"));
                let v: u64 = v.parse().unwrap_or(0);
                match k {
                    "median_ns" => m = v,
                    "p90_ns" => p = v,
                    "mean_ns" => a = v,
                    _ => {}
                }
            }
            (name, m, p, a)
        })
        .collect()
}

fn run(r: &Run) -> Outcome {
    let out = boot(r).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.boot.exit_code, Some(0), "{} failed\n{}", r.image, out.tail(30));
    for l in out.boot.console.iter().filter(|l| l.starts_with("counter:") || l.starts_with("@@ CYCLES")) {
        println!("{}: {l}", r.image);
    }
    out
}

fn main() {
    let m = run(&Run::cortex_m("m-bench", 2));
    let a = run(&Run::new("bench", 2, Mode::Polling));
    let (fm, fa) = (figures(&m), figures(&a));
    let us = |ns: u64| format!("{:.1}", ns as f64 / 1000.0);
    println!("\n| figure | Cortex-M4 median / p90 / mean (µs) | Cortex-A53 median / p90 / mean (µs) | M4 / A53 (medians) |");
    println!("| :--- | ---: | ---: | ---: |");
    for name in ["submit_cpu", "round_trip_polling"] {
        let get =
            |f: &[(String, u64, u64, u64)]| f.iter().find(|(n, ..)| n == name).map(|&(_, a, b, c)| (a, b, c));
        let (Some(x), Some(y)) = (get(&fm), get(&fa)) else { panic!("{name} missing: m {fm:?} a {fa:?}") };
        println!(
            "| {name} | {} / {} / {} | {} / {} / {} | {:.2} |",
            us(x.0),
            us(x.1),
            us(x.2),
            us(y.0),
            us(y.1),
            us(y.2),
            x.0 as f64 / y.0.max(1) as f64
        );
    }
}
