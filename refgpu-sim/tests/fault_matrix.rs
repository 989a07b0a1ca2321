//! The fault matrix over co-simulation: every fault-injection knob of
//! `refgpu-sim` (set on its command line, so it stays on for the whole
//! run) plus a server killed halfway × both generations × interrupts and
//! polling. Each cell runs `conformance::faults`' seeded workload and
//! checks its accounting: every accepted submission signalled (with its
//! data) or failed with a reason, none lost, every buffer, IB chunk and
//! DMA page back, the device usable afterwards on the queues without a
//! lasting fault (or reported lost when the server died). The in-process
//! half is `conformance/tests/fault_matrix.rs`; the table of results is in
//! `docs/reliability.md`.

mod common;

use common::Sim;
use conformance::faults::{self, Accounting, Workload};
use conformance::{SUITE_CHUNKS, SUITE_CONFIG, SUITE_MMU};
use platform_linux::Cosim;
use umd_core::direct::Device;
use umd_core::storage::DeviceStorage;

/// Submissions per cell.
const JOBS: usize = 48;

/// A knob: name, server arguments, queues (mask) whose fault outlives
/// the run, whether the server is killed halfway.
struct Knob {
    name: &'static str,
    args: &'static [&'static str],
    lasting: u8,
    kill: bool,
}

const KNOBS: &[Knob] = &[
    Knob { name: "none", args: &[], lasting: 0, kill: false },
    Knob { name: "packet_latency 200us", args: &["--packet-latency", "200us"], lasting: 0, kill: false },
    Knob { name: "drop_fence_nth 3", args: &["--drop-fence-nth", "3"], lasting: 0b111, kill: false },
    Knob {
        name: "drop_fence_prob 0.25",
        args: &["--drop-fence-prob", "0.25", "--seed", "7"],
        lasting: 0b111,
        kill: false,
    },
    Knob { name: "stalled COPY", args: &["--stall-engines", "0x4"], lasting: 0b100, kill: false },
    Knob { name: "irq_delay 2ms", args: &["--irq-delay", "2ms"], lasting: 0, kill: false },
    Knob { name: "server killed", args: &[], lasting: 0, kill: true },
];

fn cell(gen: &str, use_irq: bool, k: &Knob) -> Accounting {
    let mut args = vec!["--gen", gen];
    args.extend_from_slice(k.args);
    let mut sim = Sim::start(&args);
    let p = Cosim::connect(&sim.socket).expect("connect to refgpu-sim");
    let cfg = umd_core::config::Config { use_irq, ..SUITE_CONFIG };
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, Cosim, SUITE_CHUNKS> = match Device::new(&p, &mut storage, cfg, SUITE_MMU) {
        Ok(d) => d,
        Err(e) => panic!("Device::new: {e}\n{}", sim.log_text()),
    };
    let w = Workload { seed: 0xFA17 ^ u64::from(use_irq), jobs: JOBS, impaired_after: k.lasting };
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
        if matches!(k.name, "none" | "packet_latency 200us" | "irq_delay 2ms") {
            assert_eq!((acc.signalled, acc.refused), (acc.submitted, 0), "{}: {acc}", k.name);
        }
        if k.name == "stalled COPY" {
            assert!(acc.failed_hung > 0, "{}: no hang reported: {acc}", k.name);
        }
        if k.kill {
            assert!(acc.device_lost, "{}: the device did not report itself lost: {acc}", k.name);
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
