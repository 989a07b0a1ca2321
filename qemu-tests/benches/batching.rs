//! Deferred doorbells on bare metal (`docs/perf.md`, "Deferred
//! doorbells"): the `bench` image's `batch` scenarios on aarch64 under
//! QEMU, both generations, polling, booted with the batch window off
//! (`window=0`) and on (`window=200000`, 200 µs) in the same run:
//! doorbells per submission and the time of a burst of 8 submissions
//! then a wait (`bm_images::bench::bursts`), and submit -> GPU write with
//! only `service` calls (`bm_images::bench::service_latency`, where the
//! window is the latency's bound).
//!
//! ```sh
//! CARGO_TARGET_DIR=/work/target-bm cargo bench -p qemu-tests --bench batching
//! ```
//!
//! Prints a Markdown table: median / p90 in µs, and on / off ratios of
//! the medians. Needs QEMU (`.ci/install-qemu.sh`).

use bm_images::bench::Figures;
use qemu_tests::{artifacts, boot, Mode, Run};

/// What one boot printed.
#[derive(Default)]
struct Boot {
    burst: Figures,
    latency: Figures,
    submissions: u64,
    doorbells: u64,
}

/// The value of `key=` among `words`.
fn field(words: &str, key: &str) -> u64 {
    words
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in `{words}`"))
}

fn figures(words: &str) -> Figures {
    Figures {
        n: field(words, "n") as usize,
        median: field(words, "median_ns"),
        p90: field(words, "p90_ns"),
        mean: field(words, "mean_ns"),
    }
}

fn guest(generation: u8, window: &'static str) -> Boot {
    let run = Run { args: vec!["batch", window], ..Run::new("bench", generation, Mode::Polling) };
    let out = boot(&run).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.boot.exit_code, Some(0), "bench image failed\n{}", out.tail(30));
    let mut b = Boot::default();
    for l in &out.boot.console {
        if let Some(w) = l.strip_prefix("@@ BENCH burst8 ") {
            b.burst = figures(w);
        } else if let Some(w) = l.strip_prefix("@@ BENCH service_latency ") {
            b.latency = figures(w);
        } else if let Some(w) = l.strip_prefix("@@ DOORBELLS burst8 ") {
            (b.submissions, b.doorbells) = (field(w, "submissions"), field(w, "doorbells"));
        }
    }
    assert!(b.submissions > 0 && b.burst.n > 0 && b.latency.n > 0, "figures missing\n{}", out.tail(30));
    b
}

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1000.0)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    artifacts().unwrap_or_else(|e| panic!("{e}"));
    println!();
    println!("aarch64 QEMU virt (TCG), polling, MMU on, Config::DEFAULT but the window; µs");
    println!();
    println!("| gen | window | doorbells / submission | burst of 8 + wait, median / p90 | submit → write (service only), median / p90 |");
    println!("| --- | --- | ---: | ---: | ---: |");
    for generation in [1u8, 2] {
        let off = guest(generation, "window=0");
        let on = guest(generation, "window=200000");
        for (name, b) in [("off", &off), ("200 µs", &on)] {
            println!(
                "| gen{generation} | {name} | {:.3} | {} / {} | {} / {} |",
                b.doorbells as f64 / b.submissions as f64,
                us(b.burst.median),
                us(b.burst.p90),
                us(b.latency.median),
                us(b.latency.p90)
            );
        }
        println!(
            "| gen{generation} | on / off | {:.3} | {:.2}x | {:.2}x |",
            (on.doorbells as f64 / on.submissions as f64) / (off.doorbells as f64 / off.submissions as f64),
            on.burst.median as f64 / off.burst.median.max(1) as f64,
            on.latency.median as f64 / off.latency.median.max(1) as f64
        );
    }
}
