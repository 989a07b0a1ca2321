//! Register page offsets (`docs/refgpu.md` section 2). Shared by every
//! generation; platforms use these to implement register access.

/// ID register: magic, generation, revision.
pub const ID: u32 = 0x000;
/// Number of engines.
pub const ENGINE_COUNT: u32 = 0x004;
/// Interrupt status (write 1 to clear in-process; atomic AND on ivshmem).
pub const IRQ_STATUS: u32 = 0x010;
/// Interrupt enable mask.
pub const IRQ_MASK: u32 = 0x014;
/// MMU enable.
pub const MMU_CTRL: u32 = 0x020;
/// Level-0 table physical address, low half.
pub const MMU_ROOT_LO: u32 = 0x024;
/// Level-0 table physical address, high half.
pub const MMU_ROOT_HI: u32 = 0x028;
/// Write 1 to invalidate cached translations; reads 0 when done.
pub const MMU_INVALIDATE: u32 = 0x02C;
/// Device clock (ns), low half; reading it latches the high half.
pub const CLOCK_LO: u32 = 0x030;
/// Device clock (ns), high half.
pub const CLOCK_HI: u32 = 0x034;

/// Number of engines on every refgpu.
pub const ENGINES: u32 = 3;
/// Offset of engine 0's register block.
pub const ENGINE_BASE: u32 = 0x100;
/// Size of one engine's register block.
pub const ENGINE_STRIDE: u32 = 0x40;

/// Offsets inside an engine's block.
pub mod engine {
    /// Ring GPU address, low half.
    pub const RING_BASE_LO: u32 = 0x00;
    /// Ring GPU address, high half.
    pub const RING_BASE_HI: u32 = 0x04;
    /// Ring size in bytes (power of two, 4 KiB ..= 4 MiB).
    pub const RING_SIZE: u32 = 0x08;
    /// Read pointer (byte offset), device-owned.
    pub const RING_RPTR: u32 = 0x0C;
    /// Write pointer (byte offset), driver-owned.
    pub const RING_WPTR: u32 = 0x10;
    /// Bit 0 ENABLE, bit 1 RESET.
    pub const CTRL: u32 = 0x14;
    /// BUSY, WAITING, HALTED, IN_IB.
    pub const STATUS: u32 = 0x18;
    /// Any write: re-read the write pointer.
    pub const DOORBELL: u32 = 0x1C;
    /// Address of the packet executing now, low half.
    pub const CUR_ADDR_LO: u32 = 0x20;
    /// Address of the packet executing now, high half.
    pub const CUR_ADDR_HI: u32 = 0x24;
    /// IB executing now, low half.
    pub const IB_BASE_LO: u32 = 0x28;
    /// IB executing now, high half.
    pub const IB_BASE_HI: u32 = 0x2C;
    /// Size in dwords of the IB executing now.
    pub const IB_SIZE: u32 = 0x30;
    /// Fault kind, access, opcode, valid.
    pub const FAULT_STATUS: u32 = 0x34;
    /// Faulting address, low half.
    pub const FAULT_ADDR_LO: u32 = 0x38;
    /// Faulting address, high half.
    pub const FAULT_ADDR_HI: u32 = 0x3C;

    /// CTRL.ENABLE.
    pub const CTRL_ENABLE: u32 = 1 << 0;
    /// CTRL.RESET.
    pub const CTRL_RESET: u32 = 1 << 1;
    /// STATUS.BUSY.
    pub const STATUS_BUSY: u32 = 1 << 0;
    /// STATUS.WAITING.
    pub const STATUS_WAITING: u32 = 1 << 1;
    /// STATUS.HALTED.
    pub const STATUS_HALTED: u32 = 1 << 2;
    /// STATUS.IN_IB.
    pub const STATUS_IN_IB: u32 = 1 << 3;
    /// FAULT_STATUS.VALID.
    pub const FAULT_VALID: u32 = 1 << 31;
}

/// Offset of register `reg` (an [`engine`] offset) of engine `e`.
pub const fn engine_reg(e: u32, reg: u32) -> u32 {
    ENGINE_BASE.wrapping_add(ENGINE_STRIDE.wrapping_mul(e)).wrapping_add(reg)
}

/// IRQ_STATUS / IRQ_MASK bit for a fence interrupt of engine `e`.
pub const fn irq_fence(e: u32) -> u32 {
    1u32.wrapping_shl(e)
}

/// IRQ_STATUS / IRQ_MASK bit for a fault of engine `e`.
pub const fn irq_fault(e: u32) -> u32 {
    1u32.wrapping_shl(e.wrapping_add(8))
}

/// The ivshmem control-doorbell vector (`docs/refgpu.md` section 2.3).
pub const CONTROL_VECTOR: u32 = 3;
