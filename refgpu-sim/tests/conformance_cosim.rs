//! The conformance suite over co-simulation: a Linux host process drives
//! the model in a `refgpu-sim` child process through the ivshmem protocol
//! (`platform_linux::Cosim`), both generations, interrupts and polling.
//! The suite lives in `conformance/` (it is `no_std`); it runs here because
//! only this package's tests can start the freshly built `refgpu-sim`.

mod common;

use common::Sim;
use conformance::{SUITE_CHUNKS, SUITE_CONFIG, SUITE_MMU};
use platform_linux::suite::run_suite;
use platform_linux::Cosim;
use umd_core::direct::Device;
use umd_core::storage::DeviceStorage;

fn run(gen: &str, use_irq: bool) {
    let sim = Sim::start(&["--gen", gen]);
    let p = Cosim::connect(&sim.socket).expect("connect to refgpu-sim");
    let cfg = umd_core::config::Config { use_irq, ..SUITE_CONFIG };
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, Cosim, SUITE_CHUNKS> = match Device::new(&p, &mut storage, cfg, SUITE_MMU) {
        Ok(d) => d,
        Err(e) => panic!("Device::new: {e}\n{}", sim.log_text()),
    };
    let failures = run_suite(&dev, &format!("cosim gen{gen} irq={use_irq}"));
    assert!(
        failures.is_empty(),
        "cosim gen{gen} irq={use_irq}:\n{}\nserver log:\n{}",
        failures.join("\n"),
        sim.log_text()
    );
    assert_eq!(dev.shutdown().leaked_buffers, 0, "the suite leaked buffers");
    assert_eq!(p.dma_pages_used(), 0, "regions leaked");
}

#[test]
fn gen1_with_interrupts() {
    run("1", true);
}

#[test]
fn gen1_polling_only() {
    run("1", false);
}

#[test]
fn gen2_with_interrupts() {
    run("2", true);
}

#[test]
fn gen2_polling_only() {
    run("2", false);
}
