//! The conformance suite on the in-process model, both generations, with
//! interrupts and polling only. One test per (generation, mode); each
//! prints every scenario's result and fails on any FAIL (a SKIP must carry
//! a reason and is listed).

use conformance::{run_all, Outcome, SCENARIO_NAMES, SUITE_CHUNKS, SUITE_CONFIG, SUITE_MMU};
use platform_linux::InProcess;
use refgpu_model::{Generation as ModelGen, ModelConfig};
use umd_core::device::Device;

fn run(gen: ModelGen, use_irq: bool) {
    let platform =
        InProcess::new(ModelConfig { generation: gen, mem_size: 96 << 20, ..ModelConfig::default() })
            .expect("model starts");
    let cfg = umd_core::config::Config { use_irq, ..SUITE_CONFIG };
    let mut dev: Device<InProcess, SUITE_CHUNKS> =
        Device::new(platform, cfg, SUITE_MMU).map_err(|(e, _)| e).expect("device comes up");
    let mut failures = Vec::new();
    let mut seen = Vec::new();
    run_all(&mut dev, |r| {
        println!("{gen:?} irq={use_irq}: {r}");
        seen.push(r.name);
        match r.outcome {
            Outcome::Pass => {}
            Outcome::Skip => assert!(!r.detail.as_str().is_empty(), "{} skipped without a reason", r.name),
            Outcome::Fail => failures.push(r.to_string()),
        }
    });
    assert_eq!(seen, SCENARIO_NAMES, "every scenario reported");
    assert!(failures.is_empty(), "{gen:?} irq={use_irq}:\n{}", failures.join("\n"));
}

#[test]
fn gen1_with_interrupts() {
    run(ModelGen::Gen1, true);
}

#[test]
fn gen1_polling_only() {
    run(ModelGen::Gen1, false);
}

#[test]
fn gen2_with_interrupts() {
    run(ModelGen::Gen2, true);
}

#[test]
fn gen2_polling_only() {
    run(ModelGen::Gen2, false);
}
