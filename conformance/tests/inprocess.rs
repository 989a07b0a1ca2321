//! The conformance suite on the in-process model, both generations, with
//! interrupts and polling only. One test per (generation, mode); each
//! prints every scenario's result and fails on any FAIL (a SKIP must carry
//! a reason and is listed).

use conformance::{SUITE_CHUNKS, SUITE_CONFIG, SUITE_MMU};
use platform_linux::suite::run_suite;
use platform_linux::InProcess;
use refgpu_model::{Generation as ModelGen, ModelConfig};
use umd_core::direct::Device;
use umd_core::storage::DeviceStorage;

fn run(gen: ModelGen, use_irq: bool) {
    let platform =
        InProcess::new(ModelConfig { generation: gen, mem_size: 96 << 20, ..ModelConfig::default() })
            .expect("model starts");
    let cfg = umd_core::config::Config { use_irq, ..SUITE_CONFIG };
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, InProcess, SUITE_CHUNKS> =
        Device::new(&platform, &mut storage, cfg, SUITE_MMU).expect("device comes up");
    let failures = run_suite(&dev, &format!("{gen:?} irq={use_irq}"));
    assert!(failures.is_empty(), "{gen:?} irq={use_irq}:\n{}", failures.join("\n"));
    let report = dev.shutdown();
    assert_eq!(report.leaked_buffers, 0, "the suite leaked buffers");
    assert_eq!(platform.dma_pages_used(), 0, "platform memory leaked");
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
