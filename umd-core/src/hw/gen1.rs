//! Generation 1 (`docs/refgpu.md` sections 5 and 6, "gen1" columns).
//!
//! Header `[31:24] OPCODE | [23:16] FLAGS | [15:0] NDW`; 40-bit addresses;
//! 4-byte packet alignment; FENCE addresses 8-byte aligned or the engine
//! faults.

use super::Field::*;
use super::{
    Bits, FieldDesc, GenDesc, Generation, HeaderLayout, Limits, Loc, MisalignedFence, Ndw, PacketDesc,
    PacketKind, Rules,
};

const fn f(field: super::Field, loc: Loc) -> FieldDesc {
    FieldDesc { field, loc }
}

/// The gen1 description. A `const`, so that code specialised for gen1 (the
/// encoder) sees its values at compile time in every crate and folds them.
pub const DESC: GenDesc = GenDesc {
    generation: Generation::Gen1,
    header: HeaderLayout {
        opcode: Bits::new(24, 8),
        flags: Bits::new(16, 8),
        ndw: Bits::new(0, 16),
        tag: None,
    },
    limits: Limits {
        max_ndw: 256,
        va_bits: 40,
        max_ib_dwords: 262_144,
        max_copy_bytes: 0x00FF_FFFF,
        max_fill_bytes: 0x00FF_FFFC,
        max_dispatch_count: 0xFFFF,
    },
    rules: Rules { ib_align: 4, exec_align: 4, fence_align: 8, misaligned_fence: MisalignedFence::Fault },
    packets: [
        PacketDesc {
            kind: PacketKind::Nop,
            opcode: 0x00,
            ndw: Ndw::Tail { min: 0, min_tail: 0 },
            fields: &[],
        },
        PacketDesc {
            kind: PacketKind::WriteData,
            opcode: 0x01,
            ndw: Ndw::Tail { min: 2, min_tail: 1 },
            fields: &[f(Dst, Loc::Wide(0))],
        },
        PacketDesc {
            kind: PacketKind::DmaCopy,
            opcode: 0x02,
            ndw: Ndw::Fixed(5),
            fields: &[
                f(Src, Loc::Wide(0)),
                f(Dst, Loc::Wide(2)),
                f(Size, Loc::Payload { dw: 4, bits: Bits::new(0, 24) }),
            ],
        },
        PacketDesc {
            kind: PacketKind::Fill,
            opcode: 0x03,
            ndw: Ndw::Fixed(4),
            fields: &[
                f(Dst, Loc::Wide(0)),
                f(Size, Loc::Payload { dw: 2, bits: Bits::new(0, 24) }),
                f(Value, Loc::dword(3)),
            ],
        },
        PacketDesc {
            kind: PacketKind::Fence,
            opcode: 0x04,
            ndw: Ndw::Fixed(4),
            fields: &[f(Addr, Loc::Wide(0)), f(Value, Loc::Wide(2)), f(Irq, Loc::Flags(Bits::new(0, 1)))],
        },
        PacketDesc {
            kind: PacketKind::WaitMem,
            opcode: 0x05,
            ndw: Ndw::Fixed(6),
            fields: &[
                f(Addr, Loc::Wide(0)),
                f(Ref, Loc::Wide(2)),
                f(Mask, Loc::Wide(4)),
                f(Op, Loc::Flags(Bits::new(0, 3))),
                f(Wide, Loc::Flags(Bits::new(3, 1))),
            ],
        },
        PacketDesc {
            kind: PacketKind::Timestamp,
            opcode: 0x06,
            ndw: Ndw::Fixed(2),
            fields: &[f(Addr, Loc::Wide(0))],
        },
        PacketDesc {
            kind: PacketKind::IndirectBuffer,
            opcode: 0x07,
            ndw: Ndw::Fixed(3),
            fields: &[f(Addr, Loc::Wide(0)), f(Size, Loc::dword(2))],
        },
        PacketDesc {
            kind: PacketKind::Chain,
            opcode: 0x08,
            ndw: Ndw::Fixed(3),
            fields: &[f(Addr, Loc::Wide(0)), f(Size, Loc::dword(2))],
        },
        PacketDesc {
            kind: PacketKind::Barrier,
            opcode: 0x09,
            ndw: Ndw::Fixed(0),
            fields: &[f(WaitIdle, Loc::Flags(Bits::new(0, 1))), f(Invalidate, Loc::Flags(Bits::new(1, 1)))],
        },
        PacketDesc {
            kind: PacketKind::Dispatch,
            opcode: 0x0A,
            ndw: Ndw::Fixed(8),
            fields: &[
                f(Op, Loc::Flags(Bits::new(0, 4))),
                f(A, Loc::Wide(0)),
                f(B, Loc::Wide(2)),
                f(Dst, Loc::Wide(4)),
                f(Count, Loc::Payload { dw: 6, bits: Bits::new(0, 16) }),
                f(Scalar, Loc::dword(7)),
            ],
        },
    ],
};
