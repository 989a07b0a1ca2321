//! Register page offsets (`docs/refgpu.md` section 2). Shared by every
//! generation; platforms use these to implement register access.
//!
//! Register values with fields have typed views ([`FaultStatus`],
//! [`EngineStatus`], [`EngineCtrl`], [`IrqBits`], built with the
//! `bitfield` crate): decoding goes through them, so the bit positions are
//! written down once, here. The single-bit masks (`engine::STATUS_HALTED`,
//! [`irq_fence`], ...) stay for writes and quick tests; a unit test checks
//! that both descriptions agree.

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
/// Local memory's physical address, bits 31:0 (gen2, spec 3.5; RO).
pub const LOCAL_BASE_LO: u32 = 0x058;
/// Local memory's size in bytes, bits 31:0 (RO; 0: none; HI at +4).
pub const LOCAL_SIZE_LO: u32 = 0x060;
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

/// Engine `e`'s own address-space root, bits 31:12 (spec 2.1, section
/// 3.4; RW): the register of engine `e` (0..2).
pub const fn engine_root_lo(e: u32) -> u32 {
    ENGINE_ROOT_BASE.wrapping_add(e.wrapping_mul(8))
}
/// Bits 47:32 of engine `e`'s address-space root (RW).
pub const fn engine_root_hi(e: u32) -> u32 {
    engine_root_lo(e).wrapping_add(4)
}
/// ENGINE_ROOT_LO(0); engine `e`'s pair is 8 bytes further per engine.
pub const ENGINE_ROOT_BASE: u32 = 0x040;

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

bitfield::bitfield! {
    /// An engine's FAULT_STATUS (+0x34) as fields.
    #[derive(Clone, Copy, PartialEq, Eq)]
    pub struct FaultStatus(pub u32);
    impl Debug;
    /// KIND, bits 3:0: 1 TRANSLATION, 2 PERMISSION, 3 INVALID_PACKET,
    /// 4 BAD_PTE, 5 BUS.
    pub u8, kind, set_kind: 3, 0;
    /// ACCESS, bits 5:4: 0 READ, 1 WRITE, 2 FETCH.
    pub u8, access, set_access: 5, 4;
    /// Bits 15:8: the faulting packet's opcode (0 when unknown).
    pub u8, opcode, set_opcode: 15, 8;
    /// VALID, bit 31: a fault is latched.
    pub valid, set_valid: 31;
}

bitfield::bitfield! {
    /// An engine's STATUS (+0x18) as fields.
    #[derive(Clone, Copy, PartialEq, Eq)]
    pub struct EngineStatus(pub u32);
    impl Debug;
    /// BUSY, bit 0: a packet is executing or RPTR != WPTR.
    pub busy, set_busy: 0;
    /// WAITING, bit 1: blocked in WAIT_MEM.
    pub waiting, set_waiting: 1;
    /// HALTED, bit 2: stopped by a fault.
    pub halted, set_halted: 2;
    /// IN_IB, bit 3: executing an indirect buffer.
    pub in_ib, set_in_ib: 3;
}

bitfield::bitfield! {
    /// An engine's CTRL (+0x14) as fields.
    #[derive(Clone, Copy, PartialEq, Eq)]
    pub struct EngineCtrl(pub u32);
    impl Debug;
    /// ENABLE, bit 0: the engine fetches while set.
    pub enable, set_enable: 0;
    /// RESET, bit 1: write 1 to reset; reads 1 until the reset is done.
    pub reset, set_reset: 1;
}

bitfield::bitfield! {
    /// IRQ_STATUS / IRQ_MASK as fields: one bit per engine in each group.
    #[derive(Clone, Copy, PartialEq, Eq)]
    pub struct IrqBits(pub u32);
    impl Debug;
    /// Bits 2:0: FENCE interrupt of engine `e` at bit `e`.
    pub u8, fences, set_fences: 2, 0;
    /// Bits 10:8: FAULT of engine `e` at bit `e` of this field.
    pub u8, faults, set_faults: 10, 8;
}

#[cfg(test)]
mod tests {
    use super::engine::*;
    use super::*;

    #[test]
    fn typed_views_agree_with_the_masks() {
        assert!(FaultStatus(FAULT_VALID).valid() && !FaultStatus(!FAULT_VALID).valid());
        let st = EngineStatus(STATUS_BUSY | STATUS_HALTED);
        assert!(st.busy() && st.halted() && !st.waiting() && !st.in_ib());
        assert!(EngineStatus(STATUS_WAITING).waiting() && EngineStatus(STATUS_IN_IB).in_ib());
        let c = EngineCtrl(CTRL_ENABLE);
        assert!(c.enable() && !c.reset() && EngineCtrl(CTRL_RESET).reset());
        let mut w = EngineCtrl(0);
        w.set_reset(true);
        w.set_enable(true);
        assert_eq!(w.0, CTRL_RESET | CTRL_ENABLE);
        for e in 0..ENGINES {
            assert_eq!(IrqBits(irq_fence(e)).fences(), 1 << e);
            assert_eq!(IrqBits(irq_fence(e)).faults(), 0);
            assert_eq!(IrqBits(irq_fault(e)).faults(), 1 << e);
            assert_eq!(IrqBits(irq_fault(e)).fences(), 0);
        }
    }

    #[test]
    fn fault_status_fields_from_the_spec() {
        // VALID, KIND 4 (BAD_PTE), ACCESS 2 (FETCH), opcode 0x15.
        let v = FaultStatus((1 << 31) | (0x15 << 8) | (2 << 4) | 4);
        assert_eq!((v.valid(), v.kind(), v.access(), v.opcode()), (true, 4, 2, 0x15));
        let mut w = FaultStatus(0);
        w.set_valid(true);
        w.set_kind(4);
        w.set_access(2);
        w.set_opcode(0x15);
        assert_eq!(w, v);
        // Bits outside every field (7:6, 30:16) do not leak into them.
        let noise = FaultStatus(0x7FFF_00C0);
        assert_eq!((noise.valid(), noise.kind(), noise.access(), noise.opcode()), (false, 0, 0, 0));
    }
}
