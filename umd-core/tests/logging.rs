//! With the `log` feature the driver reports bring-up, hangs, faults and
//! resets through the `log` facade (run: `cargo test -p umd-core --features
//! log --test logging`).

use std::sync::Mutex;

use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::hw::Generation;
use umd_core::platform::fake::{EngineFault, Fake, Mode};
use umd_core::storage::DeviceStorage;
use umd_core::sync::QueueId;

static LINES: Mutex<Vec<(log::Level, String)>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        LINES.lock().unwrap().push((r.level(), r.args().to_string()));
    }
    fn flush(&self) {}
}

#[test]
fn bring_up_hang_and_fault_are_logged() {
    log::set_logger(&Capture).unwrap();
    log::set_max_level(log::LevelFilter::Trace);
    let cfg = Config { ring_bytes: 4096, ib_chunk_bytes: 4096, use_irq: false, ..Config::DEFAULT };
    let fake = Fake::new(Generation::Gen2, 4 << 20);
    let mut storage: Box<DeviceStorage<64, 64, 16, 64>> = Box::default();
    let dev: Device<'_, Fake, 4> = Device::new(&fake, &mut storage, cfg, MmuMode::Bypass).unwrap();
    fake.state().engines[0].fault = EngineFault::Stuck;
    let f = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    assert!(dev.wait(f, 10_000_000_000).is_err());
    fake.state().mode = Mode::Manual;
    let g = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    fake.state().inject_fault(2, 2, 1, 0xDEAD_0000);
    assert!(dev.wait(g, 1_000_000_000).is_err());
    let lines = LINES.lock().unwrap();
    let has = |lvl: log::Level, needle: &str| lines.iter().any(|(l, s)| *l == lvl && s.contains(needle));
    assert!(has(log::Level::Info, "refgpu gen2 rev 1 up"), "{lines:?}");
    assert!(has(log::Level::Error, "queue 0: hang at packet"), "{lines:?}");
    assert!(has(log::Level::Error, "queue 2: permission fault on write at 0xdead0000"), "{lines:?}");
    drop(lines);
    let leaked = dev.alloc_buffer(64).unwrap();
    let _ = leaked;
    drop(dev);
    let lines = LINES.lock().unwrap();
    assert!(lines.iter().any(|(l, s)| *l == log::Level::Warn && s.contains("leak: buffer #1")), "{lines:?}");
}
