//! What every image does first: read the mode and the driver
//! configuration (`umd.<key>=<value>`, [`crate::knobs`]) from the
//! semihosting command line, bring the board up, make the `Device`, and
//! print the `@@ BOOT`, `@@ DEVICE` and `@@ CONFIG` lines (bare-metal
//! target only).
//!
//! The transport and the device's storage are `static`s (the storage's
//! tables are placed by the loader, never moved on the stack); the device
//! borrows both for the program's life. The device itself is built in its
//! image's `static` [`Slot`] ([`Device::new_in`]: nothing device-sized
//! goes through the stack) and owned through an [`InPlace`].

use core::mem::MaybeUninit;
use core::sync::atomic::Ordering;

use platform_baremetal::arch::board::{self, IrqMode, VirtHal};
use platform_baremetal::arch::exit;
use platform_baremetal::ivshmem::IvshmemGpu;
use platform_baremetal::log::Disp;
use platform_baremetal::println;
use umd_core::config::Config;
use umd_core::direct::{Device, InPlace, MmuMode};
use umd_core::storage::DeviceStorage;

/// The device type every image drives.
pub type Gpu<const C: usize> = Device<'static, IvshmemGpu<VirtHal>, C>;

/// The memory of an image's device (a `static`, taken once).
pub type Slot<const C: usize> = spin::Mutex<MaybeUninit<Gpu<C>>>;

/// An empty [`Slot`] (for a `static`; uninitialised, so in `.bss`).
pub const fn slot<const C: usize>() -> Slot<C> {
    spin::Mutex::new(MaybeUninit::uninit())
}

/// The GPU transport, set once at bring-up.
static TRANSPORT: spin::Once<IvshmemGpu<VirtHal>> = spin::Once::new();
/// The device's tables.
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

/// The wait mode from the command line (`msi`, else polling).
pub fn mode() -> IrqMode {
    if has_arg("msi") {
        IrqMode::Msi
    } else {
        IrqMode::Polling
    }
}

/// The mode's word.
pub fn mode_name(mode: IrqMode) -> &'static str {
    match mode {
        IrqMode::Msi => "msi",
        IrqMode::Polling => "polling",
    }
}

/// Brings the board up and returns the transport, or exits with status 2.
pub fn transport(image: &str) -> (IvshmemGpu<VirtHal>, IrqMode) {
    let mode = mode();
    println!("@@ BOOT {image} mode={}", mode_name(mode));
    platform_baremetal::info!("{}: bring-up in {} mode", image, mode_name(mode));
    match board::bring_up(mode) {
        Ok(g) => (g.io, mode),
        Err(e) => {
            platform_baremetal::error!("bring-up failed: {}", Disp(&e));
            println!("@@ FATAL bring-up: {e}");
            exit::exit(2)
        }
    }
}

/// Makes a device on `io` in `slot` with `cfg` and the command line's
/// `umd.` entries applied ([`crate::knobs`]), or exits with status 2.
pub fn device_on<const C: usize>(
    slot: &'static Slot<C>,
    io: IvshmemGpu<VirtHal>,
    cfg: Config,
    mmu: MmuMode,
) -> InPlace<'static, Gpu<C>> {
    if TRANSPORT.is_completed() {
        println!("@@ FATAL device_on called twice");
        exit::exit(2)
    }
    let io: &'static IvshmemGpu<VirtHal> = TRANSPORT.call_once(|| io);
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
    let cfg = config_from_args(cfg);
    match Device::new_in(slot, io, storage, cfg, mmu) {
        Ok(d) => {
            let chip = d.chip();
            platform_baremetal::info!(
                "Device::new: refgpu gen {} rev {}, {} IB chunks of {} B",
                chip.generation.number(),
                chip.revision,
                C,
                cfg.ib_chunk_bytes
            );
            println!("@@ DEVICE gen={} rev={}", chip.generation.number(), chip.revision);
            println!("@@ CONFIG {}", d.config().text());
            d
        }
        Err(e) => {
            platform_baremetal::error!("Device::new failed: {}", Disp(&e));
            println!("@@ FATAL Device::new: {e}");
            exit::exit(2)
        }
    }
}

/// The transport [`device_on`] set up, for what a device's platform
/// still answers after [`Device::shutdown`] consumed the device (the DMA
/// pages it got back).
pub fn transport_ref() -> Option<&'static IvshmemGpu<VirtHal>> {
    TRANSPORT.get()
}

/// [`transport`] then [`device_on`].
pub fn device<const C: usize>(
    image: &str,
    slot: &'static Slot<C>,
    cfg: Config,
    mmu: MmuMode,
) -> (InPlace<'static, Gpu<C>>, IrqMode) {
    let (io, mode) = transport(image);
    (device_on(slot, io, cfg, mmu), mode)
}

/// Prints `@@ IRQS msi=<n> total=<n>`.
pub fn print_irqs(_mode: IrqMode) {
    println!(
        "@@ IRQS msi={} total={}",
        platform_baremetal::arch::irq::MSI_TOTAL.load(Ordering::Relaxed),
        platform_baremetal::arch::irq::IRQS_TAKEN.load(Ordering::Relaxed)
    );
}

/// The PL011 as a [`core::fmt::Write`] (for code that writes reports).
#[derive(Clone, Copy, Debug, Default)]
pub struct Uart;

impl core::fmt::Write for Uart {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        platform_baremetal::arch::console::write_fmt(format_args!("{s}"));
        Ok(())
    }
}
