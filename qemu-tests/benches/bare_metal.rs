//! Bare metal under QEMU vs host co-simulation (`docs/perf.md`, "Bare
//! metal"), measured in the
//! same run: the `bench` image (`bm_images::bench` on the ivshmem
//! transport, guest clock `CNTVCT_EL0`) in polling and MSI mode, and the
//! very same scenario functions over `platform_linux::Cosim` against a
//! `refgpu-sim` child, polling (`use_irq: false`) and interrupt waits.
//!
//! ```sh
//! CARGO_TARGET_DIR=/work/target-bm cargo bench -p qemu-tests --bench bare_metal
//! ```
//!
//! Prints a Markdown table: median / p90 / mean in µs, and the guest /
//! host ratio of the medians. Needs QEMU (`.ci/install-qemu.sh`).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bm_images::bench::{self, Figures};
use platform_linux::Cosim;
use qemu_tests::{artifacts, boot, Mode, Run};
use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::storage::DeviceStorage;

const SUBMITS: usize = 2048;
const TRIPS: usize = 1000;

/// `@@ BENCH <name> n= median_ns= p90_ns= mean_ns=` lines of a guest run.
fn guest(mode: Mode) -> Vec<(String, Figures)> {
    let out = boot(&Run::new("bench", 2, mode)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.boot.exit_code, Some(0), "bench image failed\n{}", out.tail(30));
    for l in out.boot.console.iter().filter(|l| l.starts_with("micro:") || l.starts_with("counter:")) {
        println!("guest ({}) {l}", mode.arg());
    }
    out.boot
        .console
        .iter()
        .filter_map(|l| l.strip_prefix("@@ BENCH "))
        .map(|l| {
            let mut it = l.split_whitespace();
            let name = it.next().unwrap_or("").to_string();
            let mut f = Figures::default();
            for kv in it {
                let (k, v) = kv.split_once('=').unwrap_or((kv, "0"));
                let v: u64 = v.parse().unwrap_or(0);
                match k {
                    "n" => f.n = v as usize,
                    "median_ns" => f.median = v,
                    "p90_ns" => f.p90 = v,
                    "mean_ns" => f.mean = v,
                    _ => {}
                }
            }
            (name, f)
        })
        .collect()
}

/// The model server, killed and reaped when dropped.
struct Sim(Child);

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_sim(sim: &Path, dir: &Path) -> Sim {
    let socket = dir.join("sim.sock");
    let child = Command::new(sim)
        .arg("--socket")
        .arg(&socket)
        .arg("--mem-file")
        .arg(dir.join("mem.img"))
        .args(["--mem-size", "64M", "--gen", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn refgpu-sim");
    let sim = Sim(child);
    let start = Instant::now();
    while !socket.exists() {
        assert!(start.elapsed() < Duration::from_secs(30), "refgpu-sim did not start");
        std::thread::sleep(Duration::from_millis(5));
    }
    sim
}

/// The same scenarios over co-simulation: (submit cost, round trips).
fn host(sim: &Path, irq: bool) -> (Figures, Figures) {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start_sim(sim, dir.path());
    let p = Cosim::connect(dir.path().join("sim.sock")).expect("connect");
    let cfg = Config { use_irq: irq, ..Config::DEFAULT };
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, Cosim, 16> = Device::new(&p, &mut storage, cfg, MmuMode::DEFAULT).expect("device");
    let mut s = vec![0u64; SUBMITS];
    let submit = bench::submit_cost(&dev, &mut s).expect("submit_cost");
    let trips = bench::round_trips(&dev, 100, &mut s[..TRIPS]).expect("round_trips");
    dev.shutdown();
    drop(server);
    (submit, trips)
}

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1000.0)
}

fn row(name: &str, g: &Figures, h: &Figures) {
    println!(
        "| {name} | {} / {} / {} | {} / {} / {} | {:.1}x |",
        us(g.median),
        us(g.p90),
        us(g.mean),
        us(h.median),
        us(h.p90),
        us(h.mean),
        g.median as f64 / h.median.max(1) as f64
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let art = artifacts().unwrap_or_else(|e| panic!("{e}"));
    let gp = guest(Mode::Polling);
    let gm = guest(Mode::Msi);
    let (hs_poll, ht_poll) = host(&art.sim, false);
    let (hs_irq, ht_irq) = host(&art.sim, true);
    let find = |v: &[(String, Figures)], n: &str| {
        v.iter().find(|(k, _)| k == n).map(|(_, f)| *f).unwrap_or_else(|| panic!("no {n} figure"))
    };
    println!();
    println!("gen2, MMU on, Config::DEFAULT; {SUBMITS} submits, {TRIPS} round trips after 100 warm-up; µs");
    println!();
    println!("| scenario | QEMU guest median / p90 / mean | host co-sim median / p90 / mean | guest / host (median) |");
    println!("| --- | ---: | ---: | ---: |");
    row("submit CPU cost, polling", &find(&gp, "submit_cpu"), &hs_poll);
    row("submit CPU cost, interrupts", &find(&gm, "submit_cpu"), &hs_irq);
    row("doorbell → fence, polling", &find(&gp, "round_trip_polling"), &ht_poll);
    row("doorbell → fence, interrupts (MSI / eventfd)", &find(&gm, "round_trip_msi"), &ht_irq);
    let (gpoll, gmsi) = (find(&gp, "round_trip_polling"), find(&gm, "round_trip_msi"));
    println!();
    println!(
        "interrupt / polling round trip (median): guest {:.2}x, host {:.2}x",
        gmsi.median as f64 / gpoll.median.max(1) as f64,
        ht_irq.median as f64 / ht_poll.median.max(1) as f64
    );
}
