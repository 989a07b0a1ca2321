//! The fault matrix over co-simulation: every fault-injection knob of
//! `refgpu-sim` (set on its command line, so it stays on for the whole
//! run) plus a server killed halfway (the rows of
//! `conformance::faults::KNOBS`) × both generations × interrupts and
//! polling. Each cell runs `conformance::faults`' seeded workload and
//! checks its accounting: every accepted submission signalled (with its
//! data) or failed with a reason, none lost, every buffer, IB chunk and
//! DMA page back, the device usable afterwards on the queues without a
//! lasting fault (or reported lost when the server died); and the knob's
//! own expectation (`conformance::faults::Expect`). The in-process half
//! is `conformance/tests/fault_matrix.rs`; the table of results is in
//! `docs/reliability.md`.

mod common;

use common::Sim;
use conformance::faults::{self, Accounting, Knob, Workload, KNOBS};
use conformance::{SUITE_CHUNKS, SUITE_CONFIG, SUITE_MMU};
use platform_linux::Cosim;
use umd_core::direct::Device;
use umd_core::storage::DeviceStorage;

/// Submissions per cell.
const JOBS: usize = 48;

fn cell(gen: &str, use_irq: bool, k: &Knob) -> Accounting {
    let mut args = vec!["--gen", gen];
    args.extend_from_slice(k.sim_args);
    let mut sim = Sim::start(&args);
    let p = Cosim::connect(&sim.socket).expect("connect to refgpu-sim");
    let cfg = umd_core::config::Config { use_irq, ..SUITE_CONFIG };
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, Cosim, SUITE_CHUNKS> = match Device::new(&p, &mut storage, cfg, SUITE_MMU) {
        Ok(d) => d,
        Err(e) => panic!("Device::new: {e}\n{}", sim.log_text()),
    };
    let w = Workload { seed: faults::seed(use_irq), jobs: JOBS, impaired_after: k.lasting };
    let mut midway = || {
        if k.kill {
            sim.signal_and_wait(rustix::process::Signal::KILL);
        }
    };
    let mut log = String::new();
    let acc = faults::run(&dev, w, &mut midway, &mut || {}, &mut log).expect("the workload starts");
    print!("{log}");
    let label = format!("cosim gen{gen} irq={use_irq} {}", k.name);
    println!("{label}: {acc}");
    if let Err(e) = acc.check() {
        panic!("{label}: {e}\n{acc}\nserver log:\n{}", sim.log_text());
    }
    let report = dev.shutdown();
    assert_eq!(report.leaked_buffers, 0, "{label}: leaked at shutdown");
    assert_eq!(p.dma_pages_used(), 0, "{label}: regions leaked");
    acc
}

fn matrix(gen: &str, use_irq: bool) {
    for k in KNOBS {
        let acc = cell(gen, use_irq, k);
        if let Err(e) = k.expect.check(&acc) {
            panic!("cosim gen{gen} irq={use_irq} {}: {e}: {acc}", k.name);
        }
    }
}

#[test]
fn gen1_with_interrupts() {
    matrix("1", true);
}

#[test]
fn gen1_polling_only() {
    matrix("1", false);
}

#[test]
fn gen2_with_interrupts() {
    matrix("2", true);
}

#[test]
fn gen2_polling_only() {
    matrix("2", false);
}
