//! Generation 2 (`docs/refgpu.md` sections 5 and 6, "gen2" columns).
//!
//! Header `[31:28] TYPE=0x7 | [27:16] NDW | [15:8] FLAGS | [7:0] OPCODE`;
//! 48-bit addresses; DMA_COPY, FILL and DISPATCH headers 32-byte aligned;
//! FENCE addresses 64-byte aligned, and a misaligned FENCE is silently
//! dropped by the device.

use super::Field::*;
use super::{
    Bits, FieldDesc, GenDesc, Generation, HeaderLayout, Limits, Loc, MisalignedFence, Ndw, PacketDesc,
    PacketKind, Rules,
};

const fn f(field: super::Field, loc: Loc) -> FieldDesc {
    FieldDesc { field, loc }
}

/// The gen2 description. A `const`, so that code specialised for gen2 (the
/// encoder) sees its values at compile time in every crate and folds them.
pub const DESC: GenDesc = GenDesc {
    generation: Generation::Gen2,
    header: HeaderLayout {
        opcode: Bits::new(0, 8),
        flags: Bits::new(8, 8),
        ndw: Bits::new(16, 12),
        tag: Some((Bits::new(28, 4), 0x7)),
    },
    limits: Limits {
        max_ndw: 4095,
        va_bits: 48,
        max_ib_dwords: 4_194_304,
        max_copy_bytes: 0x4000_0000,
        max_fill_bytes: 0x4000_0000,
        max_dispatch_count: 0x00FF_FFFF,
    },
    rules: Rules {
        ib_align: 32,
        exec_align: 32,
        fence_align: 64,
        misaligned_fence: MisalignedFence::Dropped,
    },
    packets: [
        PacketDesc {
            kind: PacketKind::Nop,
            opcode: 0x00,
            ndw: Ndw::Tail { min: 0, min_tail: 0 },
            fields: &[],
        },
        PacketDesc {
            kind: PacketKind::WriteData,
            opcode: 0x10,
            ndw: Ndw::Tail { min: 2, min_tail: 1 },
            fields: &[f(Dst, Loc::Wide(0))],
        },
        PacketDesc {
            kind: PacketKind::DmaCopy,
            opcode: 0x20,
            ndw: Ndw::Fixed(5),
            fields: &[f(Size, Loc::dword(0)), f(Src, Loc::Wide(1)), f(Dst, Loc::Wide(3))],
        },
        PacketDesc {
            kind: PacketKind::Fill,
            opcode: 0x21,
            ndw: Ndw::Fixed(4),
            fields: &[f(Size, Loc::dword(0)), f(Dst, Loc::Wide(1)), f(Value, Loc::dword(3))],
        },
        PacketDesc {
            kind: PacketKind::Fence,
            opcode: 0x30,
            ndw: Ndw::Fixed(4),
            fields: &[f(Addr, Loc::Wide(0)), f(Value, Loc::Wide(2)), f(Irq, Loc::Flags(Bits::new(0, 1)))],
        },
        PacketDesc {
            kind: PacketKind::WaitMem,
            opcode: 0x31,
            ndw: Ndw::Fixed(7),
            fields: &[
                f(Op, Loc::Payload { dw: 0, bits: Bits::new(0, 3) }),
                f(Wide, Loc::Payload { dw: 0, bits: Bits::new(3, 1) }),
                f(Addr, Loc::Wide(1)),
                f(Ref, Loc::Wide(3)),
                f(Mask, Loc::Wide(5)),
            ],
        },
        PacketDesc {
            kind: PacketKind::Timestamp,
            opcode: 0x32,
            ndw: Ndw::Fixed(2),
            fields: &[f(Addr, Loc::Wide(0))],
        },
        PacketDesc {
            kind: PacketKind::IndirectBuffer,
            opcode: 0x40,
            ndw: Ndw::Fixed(3),
            fields: &[f(Addr, Loc::Wide(0)), f(Size, Loc::dword(2))],
        },
        PacketDesc {
            kind: PacketKind::Chain,
            opcode: 0x41,
            ndw: Ndw::Fixed(3),
            fields: &[f(Addr, Loc::Wide(0)), f(Size, Loc::dword(2))],
        },
        PacketDesc {
            kind: PacketKind::Barrier,
            opcode: 0x50,
            ndw: Ndw::Fixed(1),
            fields: &[
                f(WaitIdle, Loc::Payload { dw: 0, bits: Bits::new(0, 1) }),
                f(Invalidate, Loc::Payload { dw: 0, bits: Bits::new(1, 1) }),
            ],
        },
        PacketDesc {
            kind: PacketKind::Dispatch,
            opcode: 0x60,
            ndw: Ndw::Fixed(8),
            fields: &[
                f(Op, Loc::Payload { dw: 0, bits: Bits::new(0, 4) }),
                f(Count, Loc::Payload { dw: 0, bits: Bits::new(8, 24) }),
                f(A, Loc::Wide(1)),
                f(B, Loc::Wide(3)),
                f(Dst, Loc::Wide(5)),
                f(Scalar, Loc::dword(7)),
            ],
        },
    ],
};
