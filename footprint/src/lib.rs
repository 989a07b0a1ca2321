//! Code-size probe for `umd-core` on embedded targets.
//!
//! Exposes the encoder and the decoder through `extern "C"` entry points so
//! that a fat-LTO static library contains exactly the code a firmware image
//! would link. `tools/footprint.sh` builds it for `thumbv7em-none-eabihf`
//! and `aarch64-unknown-none` and reports `.text`/`.rodata` sizes.
//!
//! The same build is the proof that the core is panic-free. A staticlib
//! always keeps its panic handler, so "the handler is linked" proves
//! nothing; instead `tools/footprint.sh` lists the relocations of every
//! `.text` section of `umd_core` and of the entry points below (after fat
//! LTO, `opt-level = "s"`) and fails if one of them still references a
//! `core::panicking` routine (`panic_*`, `*_fail`): a panic path that
//! survived optimisation. The conformance suite (`with-conformance`) is
//! test code and is measured, not checked.
// Only the embedded builds are measured; on the host (workspace tests and
// clippy) the crate links std and has no panic handler of its own.
#![cfg_attr(target_os = "none", no_std)]

#[cfg(feature = "codec")]
use umd_core::cmd::{split_region, Command, CommandBuffer, Encoder, SliceChunks};
#[cfg(feature = "codec")]
use umd_core::decode::Decoder;
#[cfg(feature = "codec")]
use umd_core::hw::{probe, Generation};

/// Encodes a fence, a copy and a fill for the chip with ID register `id`
/// into `out` (`len` dwords, at GPU address `va`); returns the dwords used,
/// or 0 on any error.
///
/// # Safety
/// `out` must be valid for writes of `len` dwords.
#[cfg(feature = "codec")]
#[no_mangle]
pub unsafe extern "C" fn umd_fp_encode(id: u32, out: *mut u32, len: usize, va: u64) -> usize {
    let Ok(chip) = probe(id) else { return 0 };
    // SAFETY: the caller guarantees `out` is valid for `len` dwords.
    let mem = unsafe { core::slice::from_raw_parts_mut(out, len) };
    let mut cb = CommandBuffer::new(chip.generation, SliceChunks::new(split_region(mem, va, 16 * 1024)));
    let _ = cb.fence(0x1000, 1, true);
    let _ = cb.copy(0x2000, 0x3000, 64);
    let _ = cb.fill(0x4000, 64, 0);
    let _ = cb.push(&Command::Timestamp { addr: 0x5000 });
    match cb.finish() {
        Ok(f) => f.total_dwords as usize,
        Err(_) => 0,
    }
}

/// Decodes `len` bytes at `bytes` as generation `gen` (1 or 2) and returns
/// the number of packets that decoded cleanly.
///
/// # Safety
/// `bytes` must be valid for reads of `len` bytes.
#[cfg(feature = "codec")]
#[no_mangle]
pub unsafe extern "C" fn umd_fp_decode(gen: u8, bytes: *const u8, len: usize) -> usize {
    let Some(gen) = Generation::from_number(gen) else {
        return 0;
    };
    // SAFETY: the caller guarantees `bytes` is valid for `len` bytes.
    let s = unsafe { core::slice::from_raw_parts(bytes, len) };
    Decoder::new(gen, s, 0).filter(|i| i.result.is_ok()).count()
}

/// Validates one fence command for generation `gen`; 1 if it encodes.
#[cfg(feature = "codec")]
#[no_mangle]
pub extern "C" fn umd_fp_check_fence(gen: u8, addr: u64) -> u32 {
    let Some(gen) = Generation::from_number(gen) else {
        return 0;
    };
    u32::from(Encoder::new(gen).check(&Command::Fence { addr, value: 1, irq: false }).is_ok())
}

/// Required by `no_std`; never reached from the driver's code (the
/// relocation check of `tools/footprint.sh` proves it).
#[cfg(target_os = "none")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    loop {
        core::hint::spin_loop();
    }
}

/// The board platform (`board.rs`): calls into the board's `extern "C"`
/// functions, which the probe never links against (it only measures).
mod board;

/// Brings up the whole driver on the board platform, submits a copy and
/// waits for it; returns 1 on success. Pulls device, ring, IB pool, page
/// tables, VA allocator, dependency tracking and hang recovery into the
/// measured image.
#[no_mangle]
pub extern "C" fn umd_fp_device_smoke() -> u32 {
    use umd_core::config::Config;
    use umd_core::direct::{Device, MmuMode};
    use umd_core::sync::QueueId;
    let (Some(storage), Some(slot)) = (STORAGE.try_lock(), DEVICE.try_lock()) else { return 0 };
    let storage = spin::mutex::MutexGuard::leak(storage);
    let slot = spin::mutex::MutexGuard::leak(slot);
    // Without the MMU (feature `mmu` off) the driver runs in bypass.
    let mmu = if cfg!(feature = "mmu") { MmuMode::DEFAULT } else { MmuMode::Bypass };
    let Ok(dev) = Device::new_in(slot, &board::Board, storage, Config::DEFAULT, mmu) else {
        return 0;
    };
    let (Ok(a), Ok(b)) = (dev.alloc_buffer(4096), dev.alloc_buffer(4096)) else { return 0 };
    let (Ok(va), Ok(vb)) = (dev.va(a), dev.va(b)) else { return 0 };
    let ok = match dev.submit(QueueId::COPY, &[], |cb| cb.copy(va, vb, 4096)) {
        Ok(f) => dev.wait(f, 1_000_000_000).is_ok(),
        Err(_) => false,
    };
    let _ = dev.service();
    let _ = (dev.free(a), dev.free(b));
    u32::from(ok)
}

/// The probe's storage: 64 buffers, 128 VA nodes, 32 slabs, 64 trace
/// events (the other parameters default), or the MCU configuration's.
#[cfg(not(feature = "mcu"))]
type Storage = umd_core::storage::DeviceStorage<64, 128, 32, 64>;
#[cfg(feature = "mcu")]
type Storage = umd_core::storage::McuStorage;

/// The probe device's IB chunks.
#[cfg(not(feature = "mcu"))]
const CHUNKS: usize = 8;
#[cfg(feature = "mcu")]
const CHUNKS: usize = umd_core::storage::MCU_CHUNKS;

/// The device's tables (a `static`: placed by the loader, never moved; all
/// zeros, so in `.bss`, which `tools/footprint.sh` checks).
static STORAGE: spin::Mutex<Storage> = spin::Mutex::new(umd_core::storage::DeviceStorage::new());

/// The device's own memory (a `static`, so that bring-up writes the
/// engine where it stays instead of moving it through the stack; all
/// zeros, in `.bss`).
static DEVICE: spin::Mutex<core::mem::MaybeUninit<umd_core::direct::Device<'static, board::Board, CHUNKS>>> =
    spin::Mutex::new(core::mem::MaybeUninit::uninit());

/// The MCU probe's board memory: the bare-metal carve-out with the MCU
/// configuration's node table, behind the board's `board_alloc` and
/// `board_free` (which the probe then provides, as a firmware would),
/// set up by [`umd_fp_carve_out`]. Its node table is RAM the driver
/// needs, so it is measured with the device's.
/// (A `spin::Once`, all zeros until set: `.bss`, no flash image.)
#[cfg(feature = "mcu")]
static CARVE: spin::Once<spin::Mutex<platform_baremetal::carveout::McuCarveOut>> = spin::Once::new();

/// Makes `len` bytes at `base` (CPU and device address alike) the MCU
/// probe's board memory; 1 if taken (page aligned, at least a page, set
/// once).
#[cfg(feature = "mcu")]
#[no_mangle]
pub extern "C" fn umd_fp_carve_out(base: usize, len: usize) -> u32 {
    if CARVE.is_completed() {
        return 0;
    }
    match platform_baremetal::carveout::McuCarveOut::with_nodes(base, base as u64, len) {
        Some(c) => {
            CARVE.call_once(|| spin::Mutex::new(c));
            1
        }
        None => 0,
    }
}

/// The board's allocator over [`CARVE`]: whole pages, the device address
/// written to `dev_addr`; null when none is left.
///
/// # Safety
/// `dev_addr` must be valid for a write of a `u64`.
#[cfg(feature = "mcu")]
#[no_mangle]
pub unsafe extern "C" fn board_alloc(len: usize, dev_addr: *mut u64) -> *mut u8 {
    let Some(Ok((cpu, dev))) = CARVE.get().map(|c| c.lock().alloc(len)) else {
        return core::ptr::null_mut();
    };
    // SAFETY: the caller's contract.
    unsafe { dev_addr.write(dev) };
    cpu as *mut u8
}

/// Gives a block of [`board_alloc`] back (anything else frees nothing).
#[cfg(feature = "mcu")]
#[no_mangle]
pub extern "C" fn board_free(p: *mut u8, len: usize) {
    if let Some(c) = CARVE.get() {
        let _ = c.lock().free(p as usize, len);
    }
}

/// Runs the whole conformance suite on the board platform; returns the
/// number of scenarios that did not pass (built with `with-conformance`).
#[cfg(feature = "with-conformance")]
#[no_mangle]
pub extern "C" fn umd_fp_conformance() -> u32 {
    use conformance::{run_all, Env, Outcome, SUITE_CHUNKS, SUITE_CONFIG, SUITE_MMU};
    use umd_core::direct::Device;
    /// The suite's device's own memory (its `CHUNKS` differs from the
    /// smoke test's).
    static SUITE_DEVICE: spin::Mutex<core::mem::MaybeUninit<Device<'static, board::Board, SUITE_CHUNKS>>> =
        spin::Mutex::new(core::mem::MaybeUninit::uninit());
    let (Some(storage), Some(slot)) = (STORAGE.try_lock(), SUITE_DEVICE.try_lock()) else { return u32::MAX };
    let storage = spin::mutex::MutexGuard::leak(storage);
    let slot = spin::mutex::MutexGuard::leak(slot);
    let Ok(dev) = Device::new_in(slot, &board::Board, storage, SUITE_CONFIG, SUITE_MMU) else {
        return u32::MAX;
    };
    let mut bad = 0u32;
    run_all(&dev, &Env::default(), |r| {
        if r.outcome != Outcome::Pass {
            bad = bad.saturating_add(1);
        }
    });
    bad
}
