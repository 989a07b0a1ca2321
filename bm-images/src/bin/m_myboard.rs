//! The porting guide's board on real (emulated) hardware: the platform of
//! `docs/porting.md` section 2 (`footprint/src/board.rs`, written for a
//! memory-mapped refgpu, registers and memory behind the board's
//! `extern "C"` functions) runs the whole `conformance` suite on
//! `mps2-an386`. This image provides those functions over the shared-RAM
//! binding, as a board support package would over its hardware:
//!
//! - `board_read_reg` / `board_write_reg`: the register page with MMIO
//!   semantics (`umd_core::ivshmem::Binding`, through the transport), and a
//!   write to a register whose effect the model applies on the control
//!   doorbell rings it at once, as an MMIO device applies it on the store;
//! - `board_alloc` / `board_free`: pages of the PSRAM carve-out (device
//!   address = CPU address on this board);
//! - `board_now_ns` / `board_delay_ns`: SysTick, and the transport's delay
//!   (which watches the model's heartbeat).
//!
//! Lines as `m-conformance`'s: `@@ RESULT` per scenario, `@@ DONE`; exit 0
//! when nothing failed, 1 otherwise, 2 when bring-up failed.
#![no_std]
#![no_main]

use core::mem::MaybeUninit;
use core::ptr::NonNull;

use bm_images::{boot_m, suite};
use conformance::{Env, SUITE_CHUNKS, SUITE_CONFIG, SUITE_MMU};
use platform_baremetal::arch::board::MpsHal;
use platform_baremetal::arch::{exit, timer};
use platform_baremetal::shared_ram::SharedRamGpu;
use platform_baremetal::{image_main, println};
use umd_core::direct::{Device, InPlace};
use umd_core::hw::regs::{self, engine as er};
use umd_core::platform::{DirectIo, DmaFlags, DmaRegion, Platform};
use umd_core::storage::DeviceStorage;

#[path = "../../../footprint/src/board.rs"]
mod board;

image_main!(main);

/// The transport under the board functions (set once, before the device).
static IO: spin::Once<&'static SharedRamGpu<MpsHal>> = spin::Once::new();
static BOARD: board::Board = board::Board;
static STORAGE: spin::Mutex<DeviceStorage> = spin::Mutex::new(DeviceStorage::new());
static SLOT: spin::Mutex<MaybeUninit<Device<'static, board::Board, SUITE_CHUNKS>>> =
    spin::Mutex::new(MaybeUninit::uninit());

fn io() -> &'static SharedRamGpu<MpsHal> {
    match IO.get() {
        Some(io) => io,
        None => {
            println!("@@ FATAL a board function called before bring-up");
            exit::exit(2)
        }
    }
}

/// Whether the model applies a write to `off` on the control doorbell
/// (`docs/refgpu.md` 2.3): CTRL, IRQ_MASK, MMU_*, ENGINE_ROOT.
fn applied_on_control_doorbell(off: u32) -> bool {
    matches!(
        off,
        regs::IRQ_MASK | regs::MMU_CTRL | regs::MMU_ROOT_LO | regs::MMU_ROOT_HI | regs::MMU_INVALIDATE
    ) || (0..regs::ENGINES).any(|e| {
        off == regs::engine_reg(e, er::CTRL)
            || off == regs::engine_root_lo(e)
            || off == regs::engine_root_hi(e)
    })
}

#[no_mangle]
extern "C" fn board_read_reg(off: u32) -> u32 {
    io().read_reg(off).unwrap_or(u32::MAX) // a device gone reads all ones
}

#[no_mangle]
extern "C" fn board_write_reg(off: u32, v: u32) {
    let io = io();
    if io.write_reg(off, v).is_ok() && applied_on_control_doorbell(off) {
        let _ = io.control_doorbell();
    }
}

#[no_mangle]
extern "C" fn board_alloc(len: usize, dev_addr: *mut u64) -> *mut u8 {
    let Ok(r) = io().dma_alloc(len, DmaFlags::CPU) else { return core::ptr::null_mut() };
    match (r.cpu_ptr(), NonNull::new(dev_addr)) {
        (Some(cpu), Some(out)) => {
            // SAFETY: `board.rs` passes a pointer to a live `u64` of its own.
            unsafe { out.as_ptr().write(r.dev_addr()) };
            cpu.as_ptr()
        }
        _ => {
            io().dma_free(r);
            core::ptr::null_mut()
        }
    }
}

#[no_mangle]
extern "C" fn board_free(p: *mut u8, len: usize) {
    let Some(cpu) = NonNull::new(p) else { return };
    // SAFETY: `p` and `len` are a block `board_alloc` handed out (the
    // caller's contract), whose device address is its CPU address on this
    // board (the carve-out starts at the PSRAM's base on both sides).
    let r = unsafe { DmaRegion::new(cpu, p as usize as u64, len) };
    io().dma_free(r);
}

#[no_mangle]
extern "C" fn board_now_ns() -> u64 {
    timer::now_ns()
}

#[no_mangle]
extern "C" fn board_delay_ns(ns: u64) {
    io().delay_ns(ns);
}

fn main() -> ! {
    let io = boot_m::transport("m-myboard", boot_m::CARVEOUT_BYTES, &SUITE_CONFIG, SUITE_MMU, SUITE_CHUNKS);
    IO.call_once(|| io);
    let (Some(storage), Some(slot)) = (STORAGE.try_lock(), SLOT.try_lock()) else {
        println!("@@ FATAL the device's storage is taken");
        exit::exit(2)
    };
    let storage: &'static mut DeviceStorage = spin::mutex::MutexGuard::leak(storage);
    let slot = spin::mutex::MutexGuard::leak(slot);
    let dev = match Device::new_in(slot, &BOARD, storage, SUITE_CONFIG, SUITE_MMU) {
        Ok(d) => InPlace::leak(d),
        Err(e) => {
            println!("@@ FATAL Device::new: {e}");
            exit::exit(2)
        }
    };
    let chip = dev.chip();
    println!("@@ DEVICE gen={} rev={}", chip.generation.number(), chip.revision);
    // One core, no scheduler: no threads for the multi-submitter scenario.
    let n = suite::run(dev, &Env { parallel: None });
    println!("doorbells rung: {}", io.doorbells_rung());
    println!("@@ IRQS msi=0 total=0");
    println!("@@ DONE passed={} failed={} skipped={}", n.passed, n.failed, n.skipped);
    exit::exit(if n.failed == 0 { 0 } else { 1 })
}
