//! The fault matrix on the in-process model: every fault-injection knob of
//! the model × both generations × interrupts and polling. Each cell runs
//! `conformance::faults`' seeded workload (random queues, cross-queue
//! waits, buffers freed in flight) with the knob set, takes the knob away,
//! and checks the accounting: every accepted submission signalled (with
//! its data) or failed with a reason, none lost, every buffer, IB chunk
//! and DMA page back, the device usable afterwards. The co-simulation half
//! (plus the killed server) is `refgpu-sim/tests/fault_matrix.rs`; the
//! table of results is in `docs/reliability.md`.

use std::time::Duration;

use conformance::faults::{self, Accounting, Workload};
use conformance::{SUITE_CHUNKS, SUITE_CONFIG, SUITE_MMU};
use platform_linux::InProcess;
use refgpu_model::{FaultInjection, Generation as ModelGen, ModelConfig};
use umd_core::direct::Device;
use umd_core::storage::DeviceStorage;

/// Submissions per cell.
const JOBS: usize = 48;

/// The knobs (name, injection, queues left impaired after healing).
fn knobs() -> Vec<(&'static str, FaultInjection)> {
    let d = FaultInjection::default;
    vec![
        ("none", d()),
        ("packet_latency 200us", FaultInjection { packet_latency: Duration::from_micros(200), ..d() }),
        ("drop_fence_nth 3", FaultInjection { drop_fence_nth: Some(3), ..d() }),
        ("drop_fence_prob 0.25", FaultInjection { drop_fence_probability: 0.25, seed: 7, ..d() }),
        ("stalled COPY", FaultInjection { stalled_engines: 1 << 2, ..d() }),
        ("irq_delay 2ms", FaultInjection { irq_delay: Duration::from_millis(2), ..d() }),
    ]
}

fn cell(gen: ModelGen, use_irq: bool, name: &str, fi: &FaultInjection) -> Accounting {
    let cfg = ModelConfig { generation: gen, mem_size: 64 << 20, ..ModelConfig::default() };
    let p = InProcess::new(cfg).expect("model starts");
    let dcfg = umd_core::config::Config { use_irq, ..SUITE_CONFIG };
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, InProcess, SUITE_CHUNKS> =
        Device::new(&p, &mut storage, dcfg, SUITE_MMU).expect("device comes up");
    p.model().set_fault_injection(fi.clone());
    let w = Workload { seed: 0xFA17 ^ u64::from(use_irq), jobs: JOBS, impaired_after: 0 };
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
    for (name, fi) in knobs() {
        let acc = cell(gen, use_irq, name, &fi);
        // Knobs that delay but never lose work: everything signals.
        if matches!(name, "none" | "packet_latency 200us" | "irq_delay 2ms") {
            assert_eq!((acc.signalled, acc.refused), (acc.submitted, 0), "{name}: {acc}");
        }
        // A stalled engine is a hang: its queue's work fails with a reason.
        if name == "stalled COPY" {
            assert!(acc.failed_hung > 0, "{name}: no hang reported: {acc}");
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
