//! The register page (`docs/refgpu.md` section 2): offsets, bit fields and
//! the storage behind them.
//!
//! The page is 1024 32-bit registers. [`RegPage`] keeps them as
//! [`AtomicU32`]s that live either in memory the model owns (in-process
//! mode) or in a 4 KiB shared mapping the caller provides (ivshmem mode,
//! where another process reads and writes the same page with 32-bit
//! atomics). Every access goes through an atomic, so the model is sound with
//! a concurrent writer in another process; no reference to plain integers is
//! ever formed over the page.
//!
//! The register *semantics* (RW1C, doorbells, RESET, the clock latch) live
//! in [`crate::Model`]; this module only stores values.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Size of the register page in bytes.
pub const PAGE_SIZE: usize = 4096;
/// Number of 32-bit registers in the page.
pub const REG_COUNT: usize = PAGE_SIZE / 4;

/// ID register (RO).
pub const ID: u32 = 0x000;
/// ENGINE_COUNT register (RO).
pub const ENGINE_COUNT: u32 = 0x004;
/// IRQ_STATUS (RW1C in-process; atomic AND by the host over ivshmem).
pub const IRQ_STATUS: u32 = 0x010;
/// IRQ_MASK (RW).
pub const IRQ_MASK: u32 = 0x014;
/// MMU_CTRL (RW), bit 0 ENABLE.
pub const MMU_CTRL: u32 = 0x020;
/// MMU_ROOT_LO (RW).
pub const MMU_ROOT_LO: u32 = 0x024;
/// MMU_ROOT_HI (RW).
pub const MMU_ROOT_HI: u32 = 0x028;
/// MMU_INVALIDATE (write 1; reads 0 once done).
pub const MMU_INVALIDATE: u32 = 0x02C;
/// CLOCK_LO (RO).
pub const CLOCK_LO: u32 = 0x030;
/// CLOCK_HI (RO).
pub const CLOCK_HI: u32 = 0x034;
/// Physical address of local memory, bits 31:0 (gen2, section 3.5; RO).
pub const LOCAL_BASE_LO: u32 = 0x058;
/// Bits 47:32 of the same address (RO).
pub const LOCAL_BASE_HI: u32 = 0x05C;
/// Size of local memory in bytes, bits 31:0 (RO; 0: none).
pub const LOCAL_SIZE_LO: u32 = 0x060;
/// Bits 63:32 of the same size (RO).
pub const LOCAL_SIZE_HI: u32 = 0x064;
/// Where the model places local memory.
pub const LOCAL_BASE: u64 = 1 << 47;
/// The model's local memory on gen2 unless configured otherwise.
pub const LOCAL_SIZE_DEFAULT: u64 = 2 << 20;

/// ENGINE_ROOT_LO(e) (RW): engine `e`'s own address-space root, bits 31:12
/// (`docs/refgpu.md` 3.4).
pub const fn engine_root_lo(e: usize) -> u32 {
    0x040 + 8 * e as u32
}

/// ENGINE_ROOT_HI(e) (RW): bits 47:32 of engine `e`'s root.
pub const fn engine_root_hi(e: usize) -> u32 {
    0x044 + 8 * e as u32
}

/// The root address held by an ENGINE_ROOT_LO/HI (or MMU_ROOT_LO/HI) pair:
/// LO bits 31:12 and HI bits 15:0.
pub const fn root_addr(lo: u32, hi: u32) -> u64 {
    ((hi as u64 & 0xFFFF) << 32) | (lo as u64 & !0xFFF)
}

/// Offset of engine `e`'s register block.
pub const fn engine_base(e: usize) -> u32 {
    0x100 + 0x40 * e as u32
}

/// Engine register offsets, relative to [`engine_base`].
pub mod eng {
    /// RING_BASE_LO (RW).
    pub const RING_BASE_LO: u32 = 0x00;
    /// RING_BASE_HI (RW).
    pub const RING_BASE_HI: u32 = 0x04;
    /// RING_SIZE (RW).
    pub const RING_SIZE: u32 = 0x08;
    /// RING_RPTR (RO).
    pub const RING_RPTR: u32 = 0x0C;
    /// RING_WPTR (RW).
    pub const RING_WPTR: u32 = 0x10;
    /// CTRL (RW): bit 0 ENABLE, bit 1 RESET.
    pub const CTRL: u32 = 0x14;
    /// STATUS (RO).
    pub const STATUS: u32 = 0x18;
    /// DOORBELL (WO).
    pub const DOORBELL: u32 = 0x1C;
    /// CUR_ADDR_LO (RO).
    pub const CUR_ADDR_LO: u32 = 0x20;
    /// CUR_ADDR_HI (RO).
    pub const CUR_ADDR_HI: u32 = 0x24;
    /// IB_BASE_LO (RO).
    pub const IB_BASE_LO: u32 = 0x28;
    /// IB_BASE_HI (RO).
    pub const IB_BASE_HI: u32 = 0x2C;
    /// IB_SIZE (RO).
    pub const IB_SIZE: u32 = 0x30;
    /// FAULT_STATUS (RO).
    pub const FAULT_STATUS: u32 = 0x34;
    /// FAULT_ADDR_LO (RO).
    pub const FAULT_ADDR_LO: u32 = 0x38;
    /// FAULT_ADDR_HI (RO).
    pub const FAULT_ADDR_HI: u32 = 0x3C;
}

/// ID register magic, bits 31:16.
pub const ID_MAGIC: u32 = 0x5247;
/// Number of engines.
pub const NUM_ENGINES: usize = 3;
/// The control doorbell vector of the ivshmem binding (section 2.3).
pub const CONTROL_VECTOR: u32 = 3;

/// CTRL bit 0.
pub const CTRL_ENABLE: u32 = 1 << 0;
/// CTRL bit 1.
pub const CTRL_RESET: u32 = 1 << 1;
/// STATUS bit 0.
pub const STATUS_BUSY: u32 = 1 << 0;
/// STATUS bit 1.
pub const STATUS_WAITING: u32 = 1 << 1;
/// STATUS bit 2.
pub const STATUS_HALTED: u32 = 1 << 2;
/// STATUS bit 3.
pub const STATUS_IN_IB: u32 = 1 << 3;
/// MMU_CTRL bit 0.
pub const MMU_ENABLE: u32 = 1 << 0;

/// IRQ_STATUS bit for a FENCE interrupt of engine `e`.
pub const fn irq_fence_bit(e: usize) -> u32 {
    1 << e
}

/// IRQ_STATUS bit for a FAULT of engine `e`.
pub const fn irq_fault_bit(e: usize) -> u32 {
    1 << (8 + e)
}

/// Both IRQ_STATUS bits of engine `e`.
pub const fn irq_engine_bits(e: usize) -> u32 {
    irq_fence_bit(e) | irq_fault_bit(e)
}

/// Backing store of the register page.
enum Backing {
    /// Owned by the model: 512 `AtomicU64`s, so the base is 8-aligned.
    Owned(#[allow(dead_code)] Box<[AtomicU64]>),
    /// A mapping provided by the caller of [`RegPage::from_raw`].
    Shared,
}

/// The 4 KiB register page as 1024 atomics.
pub struct RegPage {
    ptr: NonNull<AtomicU32>,
    _backing: Backing,
}

// SAFETY: the page is only accessed through atomics (`AtomicU32`/`AtomicU64`
// are `Sync`); the owned backing is a heap allocation, and the shared
// backing's validity for the lifetime of the page is the contract of
// `RegPage::from_raw`.
unsafe impl Send for RegPage {}
// SAFETY: as for `Send`: every access is atomic.
unsafe impl Sync for RegPage {}

impl RegPage {
    /// A zeroed page owned by the model.
    pub fn new_owned() -> Self {
        let b: Box<[AtomicU64]> = (0..REG_COUNT / 2).map(|_| AtomicU64::new(0)).collect();
        // The pointer is taken from the whole slice so that it may reach
        // every register; atomics have interior mutability, so writing
        // through it is allowed.
        let ptr = NonNull::from(&*b).cast::<AtomicU32>();
        Self { ptr, _backing: Backing::Owned(b) }
    }

    /// A page over a caller-provided mapping (the first 4 KiB of the ivshmem
    /// shared memory).
    ///
    /// # Safety
    ///
    /// `ptr` must be 8-byte aligned and valid for reads and writes of
    /// [`PAGE_SIZE`] bytes for as long as the returned page (and the model
    /// that owns it) lives. Other parties (threads or processes) may access
    /// the memory concurrently, but only with atomic (or, from another
    /// process, at least single-copy-atomic aligned 32-bit) accesses.
    pub unsafe fn from_raw(ptr: NonNull<u8>) -> Self {
        Self { ptr: ptr.cast(), _backing: Backing::Shared }
    }

    /// The register at byte offset `off` (must be < 4096, 4-aligned;
    /// otherwise `None`).
    fn slot(&self, off: u32) -> Option<&AtomicU32> {
        let idx = off as usize / 4;
        if off % 4 != 0 || idx >= REG_COUNT {
            return None;
        }
        // SAFETY: idx < REG_COUNT, so the pointer stays within the 4 KiB
        // page that is valid for the lifetime of `self` (owned box, or the
        // `from_raw` contract); `AtomicU32` has the alignment of `u32`, which
        // the base pointer satisfies. All accesses to the page are atomic.
        Some(unsafe { &*self.ptr.as_ptr().add(idx) })
    }

    /// Atomic load of the register at `off` (0 for an invalid offset).
    pub fn load(&self, off: u32) -> u32 {
        self.slot(off).map_or(0, |r| r.load(Ordering::Acquire))
    }

    /// Atomic store to the register at `off` (ignored for an invalid offset).
    pub fn store(&self, off: u32, v: u32) {
        if let Some(r) = self.slot(off) {
            r.store(v, Ordering::Release);
        }
    }

    /// Atomic OR; returns the previous value.
    pub fn fetch_or(&self, off: u32, v: u32) -> u32 {
        self.slot(off).map_or(0, |r| r.fetch_or(v, Ordering::AcqRel))
    }

    /// Atomic AND; returns the previous value.
    pub fn fetch_and(&self, off: u32, v: u32) -> u32 {
        self.slot(off).map_or(0, |r| r.fetch_and(v, Ordering::AcqRel))
    }

    /// Stores a 64-bit value as one atomic write at an 8-aligned offset (the
    /// ivshmem CLOCK_LO/HI pair). Within this process, such a pair must only
    /// ever be accessed through this function.
    pub fn store64(&self, off: u32, v: u64) {
        let idx = off as usize / 4;
        if off % 8 != 0 || idx + 1 >= REG_COUNT {
            return;
        }
        // SAFETY: the two registers at idx, idx+1 lie in the valid page; the
        // page base is 8-aligned (owned: an `AtomicU64` slice;
        // shared: `from_raw` contract) and `off` is 8-aligned, so the
        // address is valid and aligned for an `AtomicU64`. In this process
        // the pair is only accessed through `store64` (see the doc comment),
        // so there is no mixed-size access within Rust's memory model.
        let a = unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(idx).cast::<u64>()) };
        a.store(v, Ordering::Release);
    }

    /// Zeroes all registers.
    pub fn clear(&self) {
        for i in 0..REG_COUNT as u32 {
            if i * 4 == CLOCK_LO || i * 4 == CLOCK_HI {
                continue;
            }
            self.store(i * 4, 0);
        }
        self.store64(CLOCK_LO, 0);
    }
}
