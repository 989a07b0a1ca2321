//! The board platform of `docs/porting.md` section 2, as an integrator
//! would write it for a memory-mapped refgpu: registers through MMIO
//! accessors and memory from a carve-out, behind the board's `extern "C"`
//! functions. The footprint probe links it without them (it only
//! measures); the Cortex-M image `m-myboard` (`bm-images`) includes this
//! file and provides them on `mps2-an386`, where it runs the conformance
//! suite under QEMU (`qemu-tests/tests/cortex_m.rs`).

use core::ptr::NonNull;
use umd_core::platform::{DirectIo, DmaFlags, DmaRegion, Platform, PlatformError};

extern "C" {
    fn board_read_reg(off: u32) -> u32;
    fn board_write_reg(off: u32, v: u32);
    fn board_alloc(len: usize, dev_addr: *mut u64) -> *mut u8;
    fn board_free(p: *mut u8, len: usize);
    fn board_now_ns() -> u64;
    fn board_delay_ns(ns: u64);
}

/// The probe's platform: calls into the board's C functions, as a
/// firmware's would. Not `umd_core::platform::fake`: the probe is
/// `no_std` with no allocator on the embedded targets, and measures the
/// driver's code alone, so its platform must add none of its own.
pub struct Board;

// SAFETY: the board's allocator hands out exclusive, 4 KiB-aligned,
// device-visible blocks; its clock is monotonic (the integrator's
// obligations, stated here as they would be on a real board).
unsafe impl Platform for Board {
    type RawMutex = umd_core::platform::SpinLock;

    fn dma_alloc(&self, len: usize, _flags: DmaFlags) -> Result<DmaRegion, PlatformError> {
        let mut dev = 0u64;
        // SAFETY: FFI to the board allocator.
        let p = unsafe { board_alloc(len, &mut dev) };
        let p = NonNull::new(p).ok_or(PlatformError::OutOfMemory { len })?;
        // SAFETY: the board allocator's contract (see above).
        Ok(unsafe { DmaRegion::new(p, dev, len) })
    }
    fn dma_free(&self, region: DmaRegion) {
        if let Some(p) = region.cpu_ptr() {
            // SAFETY: returns a block from board_alloc.
            unsafe { board_free(p.as_ptr(), region.len()) }
        }
    }
    fn now_ns(&self) -> u64 {
        // SAFETY: FFI, no preconditions.
        unsafe { board_now_ns() }
    }
    fn delay_ns(&self, ns: u64) {
        // SAFETY: FFI, no preconditions.
        unsafe { board_delay_ns(ns) }
    }
}

impl DirectIo for Board {
    fn read_reg(&self, off: u32) -> Result<u32, PlatformError> {
        // SAFETY: FFI register read inside the register page.
        Ok(unsafe { board_read_reg(off) })
    }
    fn write_reg(&self, off: u32, v: u32) -> Result<(), PlatformError> {
        // SAFETY: FFI register write inside the register page.
        unsafe { board_write_reg(off, v) };
        Ok(())
    }
    fn doorbell(&self, engine: u32) -> Result<(), PlatformError> {
        if engine >= umd_core::hw::regs::ENGINES {
            return Err(PlatformError::Unsupported); // no such engine: nothing rung
        }
        let off = umd_core::hw::regs::engine_reg(engine, umd_core::hw::regs::engine::DOORBELL);
        self.write_reg(off, 1)
    }
}
