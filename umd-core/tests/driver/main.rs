//! The driver on the scripted fake refgpu (`umd_core::platform::fake`)
//! and on a fake kernel driver, one module per behaviour: submission,
//! waits and dependencies, recovery, memory, lifecycle, kernel mode. Each
//! test states what the build it runs in must do, so the binary checks the
//! default build and the lean ones (`.ci/run`: `--no-default-features
//! --features gen1,gen2`, `--features size-first`): with an optional part
//! off (`hang-capture`, `trace`, `local-memory`, `mmu`) every check, typed
//! error, reset and recovery stays.

#[cfg(feature = "deferred-doorbells")]
mod batch;
mod kernel;
mod lifecycle;
mod memory;
mod race;
mod recovery;
mod submit;
mod waits;

use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::hw::Generation;
use umd_core::platform::fake::Fake;
use umd_core::storage::{DeviceStorage, Limit};

/// A capacity error names the parameter to raise: `limit()` says which,
/// and the message ends with it ("raise DeviceStorage's BUFFERS
/// parameter").
fn names_its_parameter(err: &dyn std::fmt::Display, got: Option<Limit>, limit: Limit, parameter: &str) {
    assert_eq!(got, Some(limit), "{err}");
    assert_eq!(limit.parameter(), parameter);
    let text = err.to_string();
    assert!(text.ends_with(&limit.to_string()), "{text}");
    assert!(text.contains(parameter), "{text}");
}

/// A 4 KiB ring and 4 KiB IB chunks, polling: small enough that the tests
/// reach the ring's and the pool's limits in a few submissions.
fn small_cfg() -> Config {
    Config { ring_bytes: 4096, ib_chunk_bytes: 4096, use_irq: false, ..Config::DEFAULT }
}

/// The storage of the tests' devices.
type Storage = DeviceStorage<256, 256, 64, 256>;

/// A fake and storage for one device.
struct Rig {
    fake: Fake,
    storage: Box<Storage>,
}

impl Rig {
    fn device<const C: usize>(&mut self, cfg: Config) -> Device<'_, Fake, C> {
        Device::new(&self.fake, &mut self.storage, cfg, MmuMode::Bypass).expect("device comes up")
    }
}

/// A rig on a coherent fake of generation `gen` with 4 MiB of memory.
fn rig(gen: Generation) -> Rig {
    Rig { fake: Fake::new(gen, 4 << 20), storage: Box::default() }
}

/// Runs `f` on a device of generation `gen` (`C` queues) on a coherent
/// fake with 8 MiB of memory.
fn with_device<const C: usize>(
    gen: Generation,
    cfg: Config,
    mmu: MmuMode,
    f: impl FnOnce(&Device<'_, Fake, C>),
) {
    let fake = Fake::new(gen, 8 << 20);
    let mut storage: Box<Storage> = Box::default();
    let dev = Device::<Fake, C>::new(&fake, &mut storage, cfg, mmu).expect("device comes up");
    f(&dev);
}
