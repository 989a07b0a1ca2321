//! The fault matrix on the in-process model: every fault-injection knob of
//! the model (the rows of `conformance::faults::KNOBS` but the killed
//! server) × both generations × interrupts and polling. Each cell runs
//! `conformance::faults`' seeded workload (random queues, cross-queue
//! waits, buffers freed in flight) with the knob set, takes the knob away,
//! and checks the accounting: every accepted submission signalled (with
//! its data) or failed with a reason, none lost, every buffer, IB chunk
//! and DMA page back, the device usable afterwards; and the knob's own
//! expectation (`conformance::faults::Expect`). The co-simulation half
//! (plus the killed server) is `refgpu-sim/tests/fault_matrix.rs`; the
//! table of results is in `docs/reliability.md`.

use std::time::Duration;

use conformance::faults::{self, Accounting, Knob, Workload, KNOBS};
use conformance::{SUITE_CHUNKS, SUITE_CONFIG, SUITE_MMU};
use platform_linux::InProcess;
use refgpu_model::{FaultInjection, Generation as ModelGen, ModelConfig};
use umd_core::direct::Device;
use umd_core::storage::DeviceStorage;

/// Submissions per cell.
const JOBS: usize = 48;

/// The model's injection for a knob of the table: its `refgpu-sim`
/// arguments read as the server reads them (a knob the in-process model
/// cannot set fails the matrix).
fn injection(k: &Knob) -> FaultInjection {
    let duration = |v: &str| {
        let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
        let (n, unit) = v.split_at(split);
        let n: u64 = n.parse().unwrap_or_else(|_| panic!("{}: bad duration {v}", k.name));
        match unit {
            "us" => Duration::from_micros(n),
            "ms" => Duration::from_millis(n),
            _ => panic!("{}: bad duration {v}", k.name),
        }
    };
    let number = |v: &str| -> u64 {
        match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).ok(),
            None => v.parse().ok(),
        }
        .unwrap_or_else(|| panic!("{}: bad number {v}", k.name))
    };
    let mut fi = FaultInjection::default();
    for pair in k.sim_args.chunks(2) {
        let [opt, v] = pair else { panic!("{}: option without a value: {pair:?}", k.name) };
        match *opt {
            "--packet-latency" => fi.packet_latency = duration(v),
            "--irq-delay" => fi.irq_delay = duration(v),
            "--drop-fence-nth" => fi.drop_fence_nth = Some(number(v)),
            "--drop-fence-prob" => {
                fi.drop_fence_probability =
                    v.parse().unwrap_or_else(|_| panic!("{}: bad probability {v}", k.name))
            }
            "--seed" => fi.seed = number(v),
            "--stall-engines" => {
                fi.stalled_engines =
                    u8::try_from(number(v)).unwrap_or_else(|_| panic!("{}: bad mask {v}", k.name))
            }
            _ => panic!("{}: {opt} has no in-process equivalent here", k.name),
        }
    }
    fi
}

fn cell(gen: ModelGen, use_irq: bool, name: &str, fi: &FaultInjection) -> Accounting {
    let cfg = ModelConfig { generation: gen, mem_size: 64 << 20, ..ModelConfig::default() };
    let p = InProcess::new(cfg).expect("model starts");
    let dcfg = umd_core::config::Config { use_irq, ..SUITE_CONFIG };
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, InProcess, SUITE_CHUNKS> =
        Device::new(&p, &mut storage, dcfg, SUITE_MMU).expect("device comes up");
    p.model().set_fault_injection(fi.clone());
    let w = Workload { seed: faults::seed(use_irq), jobs: JOBS, impaired_after: 0 };
    let mut log = String::new();
    let heal = &mut || p.model().set_fault_injection(FaultInjection::default());
    let acc = faults::run(&dev, w, &mut || {}, heal, &mut log).expect("the workload starts");
    let report = dev.shutdown();
    print!("{log}");
    println!("{gen:?} irq={use_irq} {name}: {acc}");
    if let Err(e) = acc.check() {
        panic!("{gen:?} irq={use_irq} {name}: {e}\n{acc}");
    }
    assert_eq!(report.leaked_buffers, 0, "{name}: leaked at shutdown");
    assert_eq!(p.dma_pages_used(), 0, "{name}: platform memory leaked");
    acc
}

fn matrix(gen: ModelGen, use_irq: bool) {
    // A killed server has no in-process counterpart.
    for k in KNOBS.iter().filter(|k| !k.kill) {
        let acc = cell(gen, use_irq, k.name, &injection(k));
        if let Err(e) = k.expect.check(&acc) {
            panic!("{gen:?} irq={use_irq} {}: {e}: {acc}", k.name);
        }
    }
}

#[test]
fn gen1_with_interrupts() {
    matrix(ModelGen::Gen1, true);
}

#[test]
fn gen1_polling_only() {
    matrix(ModelGen::Gen1, false);
}

#[test]
fn gen2_with_interrupts() {
    matrix(ModelGen::Gen2, true);
}

#[test]
fn gen2_polling_only() {
    matrix(ModelGen::Gen2, false);
}
