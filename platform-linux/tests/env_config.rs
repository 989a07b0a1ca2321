//! The platforms read the `UMD_*` environment when they are made: a bad
//! value fails the constructor with an error naming the variable (or the
//! `UMD_CONFIG` file's line), a good one is the platform's `config()`, and
//! a device made with it runs with it. One test: it changes the process
//! environment, which the other tests of this binary (none) would see.

use platform_linux::{InProcess, InProcessError};
use refgpu_model::ModelConfig;
use umd_core::direct::{Device, MmuMode};
use umd_core::storage::DeviceStorage;
use umd_core::sync::QueueId;

fn model() -> ModelConfig {
    ModelConfig { mem_size: 32 << 20, ..ModelConfig::default() }
}

#[test]
fn the_environment_configures_every_platform_made_after_it() {
    let file = std::env::temp_dir().join(format!("umd-env-config-{}.conf", std::process::id()));
    std::fs::write(&file, "# a bring-up board\nhang_window_ns=2000000000\nring_size=4K\n").unwrap();

    std::env::set_var("UMD_RING_BYTES", "12288");
    let e = InProcess::new(model()).unwrap_err();
    assert!(matches!(e, InProcessError::Config(_)), "{e}");
    assert_eq!(
        e.to_string(),
        "configuration from the environment: UMD_RING_BYTES=\"12288\": out of range: expected a power of two from 4 KiB to 4 MiB"
    );

    std::env::set_var("UMD_RING_BYTES", "8K");
    std::env::set_var("UMD_CONFIG", &file);
    let e = InProcess::new(model()).unwrap_err().to_string();
    assert!(e.ends_with("(UMD_CONFIG) line 3: `ring_size`: unknown key `ring_size`"), "{e}");

    std::fs::write(&file, "# a bring-up board\nhang_window_ns=2000000000\nring_bytes=32K\n").unwrap();
    let p = InProcess::new(model()).unwrap();
    std::env::remove_var("UMD_RING_BYTES");
    std::env::remove_var("UMD_CONFIG");
    std::fs::remove_file(&file).unwrap();
    let cfg = p.config();
    assert_eq!(
        (cfg.ring_bytes, cfg.hang.window_ns),
        (8 << 10, 2_000_000_000),
        "the variable wins over the file"
    );

    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, InProcess, 4> = Device::new(&p, &mut storage, cfg, MmuMode::DEFAULT).unwrap();
    assert_eq!(dev.config().ring_bytes, 8 << 10);
    let f = dev.submit(QueueId::COPY, &[], |cb| cb.barrier()).unwrap();
    dev.wait(f, 10_000_000_000).unwrap();
    // Made after the environment was cleared: the defaults.
    assert_eq!(InProcess::new(model()).unwrap().config(), umd_core::config::Config::DEFAULT);
}
