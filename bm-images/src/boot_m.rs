//! What every Cortex-M image does first (`mps2-an386`): read the command
//! line (the driver configuration's `umd.<key>=<value>` entries,
//! [`crate::knobs`], included), check that the device's pools fit the GPU carve-out, wait for the
//! model on the shared RAM, make the `Device`, and print the `@@ BOOT` and
//! `@@ DEVICE` lines. Bring-up failures print `@@ FATAL` and exit 2.
//!
//! The transport, the device's storage and the device itself are
//! `static`s: the 270 KB `DeviceStorage` is placed by the loader (in
//! `.bss`), never built on the stack; the device (about 10 KB) is built in
//! its image's `static` [`Slot`] ([`Device::new_in`]: bring-up writes it
//! there, nothing device-sized goes through the stack) and used through a
//! `&'static` from then on.

use core::mem::MaybeUninit;

use platform_baremetal::arch::board::{self, MpsHal};
use platform_baremetal::arch::exit;
use platform_baremetal::log::Disp;
use platform_baremetal::println;
use platform_baremetal::shared_ram::{layout, SharedRamGpu};
use umd_core::config::Config;
use umd_core::direct::{Device, InPlace, MemoryPlan, MmuMode};
use umd_core::storage::DeviceStorage;

/// The device type every Cortex-M image drives.
pub type Gpu<const C: usize> = Device<'static, SharedRamGpu<MpsHal>, C>;

/// The memory of an image's device (a `static`, taken once).
pub type Slot<const C: usize> = spin::Mutex<MaybeUninit<Gpu<C>>>;

/// An empty [`Slot`] (for a `static`; uninitialised, so in `.bss`).
pub const fn slot<const C: usize>() -> Slot<C> {
    spin::Mutex::new(MaybeUninit::uninit())
}

/// The GPU carve-out this firmware is built with: all of the PSRAM's
/// system memory (16 MiB - 8 KiB).
pub const CARVEOUT_BYTES: usize = layout::MEM_SIZE;

/// Engines (queues) of refgpu.
const QUEUES: usize = 3;

static TRANSPORT: spin::Once<SharedRamGpu<MpsHal>> = spin::Once::new();
static STORAGE: spin::Mutex<DeviceStorage> = spin::Mutex::new(DeviceStorage::new());

/// The semihosting command line, with a closure over its words.
pub fn with_args<R>(f: impl FnOnce(core::str::SplitWhitespace<'_>) -> R) -> R {
    let mut buf = [0u8; 256];
    let cmd = exit::cmdline(&mut buf);
    f(cmd.split_whitespace())
}

/// `cfg` with the command line's `umd.` entries applied
/// ([`crate::knobs`]); a refused entry prints `@@ CONFIG_ERROR`.
pub fn config_from_args(cfg: Config) -> Config {
    with_args(|words| {
        crate::knobs::apply(cfg, words, |e| {
            println!("@@ CONFIG_ERROR {e}: the image's configuration stays in effect")
        })
    })
}

/// Whether `word` is on the semihosting command line.
pub fn has_arg(word: &str) -> bool {
    with_args(|mut it| it.any(|a| a == word))
}

/// The value of `key=value` on the command line.
pub fn arg_u64(key: &str) -> Option<u64> {
    with_args(|it| {
        it.filter_map(|a| a.split_once('=')).find(|(k, _)| *k == key).and_then(|(_, v)| v.parse().ok())
    })
}

/// Checks the pools against a carve-out of `carve_bytes` and attaches to
/// the model, or exits with status 2.
pub fn transport(
    image: &str,
    carve_bytes: usize,
    cfg: &Config,
    mmu: MmuMode,
    chunks: usize,
) -> &'static SharedRamGpu<MpsHal> {
    println!("@@ BOOT {image} mode=polling");
    platform_baremetal::info!("{}: bring-up on mps2-an386 (Cortex-M4), shared RAM, polling", image);
    if TRANSPORT.is_completed() {
        println!("@@ FATAL transport set up twice");
        exit::exit(2)
    }
    let plan = MemoryPlan::new(cfg, mmu, chunks, QUEUES);
    match board::bring_up(carve_bytes, &plan) {
        Ok(g) => TRANSPORT.call_once(|| g),
        Err(e) => {
            platform_baremetal::error!("bring-up failed: {}", Disp(&e));
            println!("@@ FATAL bring-up: {e}");
            exit::exit(2)
        }
    }
}

/// Makes the device on `io` in `slot` (kept for the program's life), or
/// exits with status 2.
pub fn device_in<const C: usize>(
    slot: &'static Slot<C>,
    io: &'static SharedRamGpu<MpsHal>,
    cfg: Config,
    mmu: MmuMode,
) -> &'static Gpu<C> {
    let Some(storage) = STORAGE.try_lock() else {
        println!("@@ FATAL the device storage is taken");
        exit::exit(2)
    };
    let storage: &'static mut DeviceStorage = spin::mutex::MutexGuard::leak(storage);
    let Some(slot) = slot.try_lock() else {
        println!("@@ FATAL the device's slot is taken");
        exit::exit(2)
    };
    let slot = spin::mutex::MutexGuard::leak(slot);
    let dev: &'static Gpu<C> = match Device::new_in(slot, io, storage, cfg, mmu) {
        Ok(d) => InPlace::leak(d),
        Err(e) => {
            platform_baremetal::error!("Device::new failed: {}", Disp(&e));
            println!("@@ FATAL Device::new: {e}");
            exit::exit(2)
        }
    };
    let chip = dev.chip();
    println!("@@ DEVICE gen={} rev={}", chip.generation.number(), chip.revision);
    println!("@@ CONFIG {}", dev.config().text());
    dev
}

/// The command line's `umd.` entries applied to `cfg` ([`crate::knobs`]),
/// then [`transport`] with [`CARVEOUT_BYTES`] and [`device_in`].
pub fn device<const C: usize>(
    image: &str,
    slot: &'static Slot<C>,
    cfg: Config,
    mmu: MmuMode,
) -> &'static Gpu<C> {
    let cfg = config_from_args(cfg);
    let io = transport(image, CARVEOUT_BYTES, &cfg, mmu, C);
    device_in(slot, io, cfg, mmu)
}
