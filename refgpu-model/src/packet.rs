//! Packet formats of both generations (`docs/refgpu.md` sections 5 and 6).
//!
//! This module is pure: it turns a header dword and payload dwords into a
//! validated, generation-independent [`Packet`], or says the packet is
//! INVALID_PACKET. It is written from the spec tables independently of
//! `umd-core`'s encoder, so the two cross-check each other in tests.
//!
//! Decoding happens in two steps, because the engine must know the packet
//! length before it may fetch the payload:
//!
//! 1. [`decode_header`]: TYPE (gen2), opcode, NDW against the opcode's
//!    allowed range;
//! 2. [`decode_payload`]: context rules (IB only in the ring, CHAIN only in
//!    an IB, DISPATCH only on COMPUTE, gen2 32-byte header alignment), FLAGS
//!    and reserved fields, limits, operand alignment and address width.

use crate::error::Fault;

/// Device generation (ID register bits 15:8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Generation {
    /// Generation 1.
    Gen1,
    /// Generation 2.
    Gen2,
}

impl Generation {
    /// The generation number as in the ID register.
    pub fn number(self) -> u8 {
        match self {
            Self::Gen1 => 1,
            Self::Gen2 => 2,
        }
    }

    /// The per-generation limits of section 5.2.
    pub fn rules(self) -> &'static Rules {
        match self {
            Self::Gen1 => &GEN1_RULES,
            Self::Gen2 => &GEN2_RULES,
        }
    }
}

/// Limits and alignment rules of one generation (section 5.2).
#[derive(Debug)]
pub struct Rules {
    /// Maximum NDW of any packet.
    pub max_ndw: u32,
    /// Operand / IB address width in bits.
    pub addr_bits: u32,
    /// Maximum INDIRECT_BUFFER / CHAIN size in dwords.
    pub max_ib_dwords: u32,
    /// IB address alignment in bytes.
    pub ib_align: u64,
    /// Maximum DMA_COPY size in bytes.
    pub max_dma: u32,
    /// Maximum FILL size in bytes.
    pub max_fill: u32,
    /// Maximum DISPATCH count.
    pub max_dispatch: u32,
    /// Alignment of DMA_COPY, FILL and DISPATCH headers in bytes.
    pub dma_header_align: u64,
    /// FENCE address alignment in bytes.
    pub fence_align: u64,
    /// What happens to a misaligned FENCE: `true` = silently dropped (gen2),
    /// `false` = INVALID_PACKET (gen1).
    pub misaligned_fence_dropped: bool,
}

static GEN1_RULES: Rules = Rules {
    max_ndw: 256,
    addr_bits: 40,
    max_ib_dwords: 262_144,
    ib_align: 4,
    max_dma: 16_777_215,
    max_fill: 16_777_212,
    max_dispatch: 65_535,
    dma_header_align: 4,
    fence_align: 8,
    misaligned_fence_dropped: false,
};

static GEN2_RULES: Rules = Rules {
    max_ndw: 4095,
    addr_bits: 48,
    max_ib_dwords: 4_194_304,
    ib_align: 32,
    max_dma: 1_073_741_824,
    max_fill: 1_073_741_824,
    max_dispatch: 16_777_215,
    dma_header_align: 32,
    fence_align: 64,
    misaligned_fence_dropped: true,
};

/// Packet kinds (section 5.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// NOP.
    Nop,
    /// WRITE_DATA.
    WriteData,
    /// DMA_COPY.
    DmaCopy,
    /// FILL.
    Fill,
    /// FENCE.
    Fence,
    /// WAIT_MEM.
    WaitMem,
    /// TIMESTAMP.
    Timestamp,
    /// INDIRECT_BUFFER.
    IndirectBuffer,
    /// CHAIN.
    Chain,
    /// BARRIER.
    Barrier,
    /// DISPATCH.
    Dispatch,
}

impl Op {
    /// All packet kinds.
    pub const ALL: [Op; 11] = [
        Op::Nop,
        Op::WriteData,
        Op::DmaCopy,
        Op::Fill,
        Op::Fence,
        Op::WaitMem,
        Op::Timestamp,
        Op::IndirectBuffer,
        Op::Chain,
        Op::Barrier,
        Op::Dispatch,
    ];

    /// The opcode number in `gen`.
    pub fn opcode(self, gen: Generation) -> u8 {
        let (g1, g2) = match self {
            Op::Nop => (0x00, 0x00),
            Op::WriteData => (0x01, 0x10),
            Op::DmaCopy => (0x02, 0x20),
            Op::Fill => (0x03, 0x21),
            Op::Fence => (0x04, 0x30),
            Op::WaitMem => (0x05, 0x31),
            Op::Timestamp => (0x06, 0x32),
            Op::IndirectBuffer => (0x07, 0x40),
            Op::Chain => (0x08, 0x41),
            Op::Barrier => (0x09, 0x50),
            Op::Dispatch => (0x0A, 0x60),
        };
        match gen {
            Generation::Gen1 => g1,
            Generation::Gen2 => g2,
        }
    }

    /// The packet kind of opcode `op` in `gen`, `None` if reserved.
    pub fn from_opcode(gen: Generation, op: u8) -> Option<Op> {
        Op::ALL.into_iter().find(|o| o.opcode(gen) == op)
    }

    /// Allowed NDW range in `gen` (inclusive).
    pub fn ndw_range(self, gen: Generation) -> (u32, u32) {
        let max = gen.rules().max_ndw;
        match (self, gen) {
            (Op::Nop, _) => (0, max),
            (Op::WriteData, _) => (3, max),
            (Op::DmaCopy, _) => (5, 5),
            (Op::Fill | Op::Fence, _) => (4, 4),
            (Op::WaitMem, Generation::Gen1) => (6, 6),
            (Op::WaitMem, Generation::Gen2) => (7, 7),
            (Op::Timestamp, _) => (2, 2),
            (Op::IndirectBuffer | Op::Chain, _) => (3, 3),
            (Op::Barrier, Generation::Gen1) => (0, 0),
            (Op::Barrier, Generation::Gen2) => (1, 1),
            (Op::Dispatch, _) => (8, 8),
        }
    }
}

/// A decoded header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Packet kind.
    pub op: Op,
    /// FLAGS field.
    pub flags: u8,
    /// Payload length in dwords.
    pub ndw: u32,
}

/// Raw OPCODE field of a header (whatever its validity).
pub fn raw_opcode(gen: Generation, h: u32) -> u8 {
    match gen {
        Generation::Gen1 => (h >> 24) as u8,
        Generation::Gen2 => h as u8,
    }
}

/// A header the engine can not execute (INVALID_PACKET).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidHeader {
    /// Raw OPCODE field.
    pub opcode: u8,
}

/// Decodes and checks a header. `Err` means INVALID_PACKET.
pub fn decode_header(gen: Generation, h: u32) -> Result<Header, InvalidHeader> {
    let err = InvalidHeader { opcode: raw_opcode(gen, h) };
    let (opcode, flags, ndw) = match gen {
        Generation::Gen1 => ((h >> 24) as u8, (h >> 16) as u8, h & 0xFFFF),
        Generation::Gen2 => {
            if h >> 28 != 0x7 {
                return Err(err);
            }
            (h as u8, (h >> 8) as u8, (h >> 16) & 0xFFF)
        }
    };
    let op = Op::from_opcode(gen, opcode).ok_or(err)?;
    let (lo, hi) = op.ndw_range(gen);
    if ndw < lo || ndw > hi {
        return Err(err);
    }
    Ok(Header { op, flags, ndw })
}

/// WAIT_MEM compare operations (section 6.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    /// m == r.
    Eq,
    /// m != r.
    Ne,
    /// m >= r.
    Ge,
    /// m > r.
    Gt,
    /// m <= r.
    Le,
    /// m < r.
    Lt,
    /// (m - r) as signed >= 0.
    SeqGe,
}

impl CompareOp {
    fn from_bits(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::Eq,
            1 => Self::Ne,
            2 => Self::Ge,
            3 => Self::Gt,
            4 => Self::Le,
            5 => Self::Lt,
            6 => Self::SeqGe,
            _ => return None,
        })
    }

    /// Evaluates the condition on masked values of width 32 (`wide = false`)
    /// or 64.
    pub fn holds(self, m: u64, r: u64, wide: bool) -> bool {
        match self {
            Self::Eq => m == r,
            Self::Ne => m != r,
            Self::Ge => m >= r,
            Self::Gt => m > r,
            Self::Le => m <= r,
            Self::Lt => m < r,
            Self::SeqGe => {
                if wide {
                    (m.wrapping_sub(r) as i64) >= 0
                } else {
                    ((m as u32).wrapping_sub(r as u32) as i32) >= 0
                }
            }
        }
    }
}

/// DISPATCH operations (section 6.11).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DispatchOp {
    /// Wrapping u32 add.
    AddU32,
    /// Wrapping u32 multiply.
    MulU32,
    /// Non-fused `scalar * a + b` in binary32.
    SaxpyF32,
}

impl DispatchOp {
    fn from_bits(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::AddU32,
            1 => Self::MulU32,
            2 => Self::SaxpyF32,
            _ => return None,
        })
    }
}

/// A validated packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packet {
    /// NOP.
    Nop,
    /// WRITE_DATA: `count` dwords from payload dword 2 on go to `dst`.
    WriteData {
        /// Destination (4-aligned).
        dst: u64,
        /// Number of data dwords (NDW − 2).
        count: u32,
    },
    /// DMA_COPY.
    DmaCopy {
        /// Source.
        src: u64,
        /// Destination.
        dst: u64,
        /// Bytes.
        size: u64,
    },
    /// FILL.
    Fill {
        /// Destination (4-aligned).
        dst: u64,
        /// Bytes (multiple of 4).
        size: u64,
        /// Fill value.
        value: u32,
    },
    /// FENCE.
    Fence {
        /// Address.
        addr: u64,
        /// 64-bit value.
        value: u64,
        /// FLAGS.IRQ.
        irq: bool,
        /// A gen2 misaligned fence: executes as nothing.
        dropped: bool,
    },
    /// WAIT_MEM.
    WaitMem {
        /// Address.
        addr: u64,
        /// REF (high half 0 unless wide).
        reference: u64,
        /// MASK (high half 0 unless wide).
        mask: u64,
        /// Compare operation.
        op: CompareOp,
        /// 64-bit compare.
        wide: bool,
    },
    /// TIMESTAMP.
    Timestamp {
        /// Address (8-aligned).
        addr: u64,
    },
    /// INDIRECT_BUFFER.
    IndirectBuffer {
        /// IB address.
        addr: u64,
        /// IB size in dwords.
        size: u32,
    },
    /// CHAIN.
    Chain {
        /// Next IB address.
        addr: u64,
        /// Next IB size in dwords.
        size: u32,
    },
    /// BARRIER.
    Barrier {
        /// WAIT_IDLE.
        wait_idle: bool,
        /// INVALIDATE.
        invalidate: bool,
    },
    /// DISPATCH.
    Dispatch {
        /// Operation.
        op: DispatchOp,
        /// Array A.
        a: u64,
        /// Array B.
        b: u64,
        /// Destination array.
        dst: u64,
        /// Element count.
        count: u32,
        /// SCALAR bit pattern.
        scalar: u32,
    },
}

/// Where a packet is executed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Context {
    /// Executing engine (0 GFX, 1 COMPUTE, 2 COPY).
    pub engine: usize,
    /// Executing from an IB (not the ring).
    pub in_ib: bool,
    /// GPU address of the header.
    pub addr: u64,
}

/// The COMPUTE engine's id.
pub const COMPUTE_ENGINE: usize = 1;

fn addr(lo: u32, hi: u32) -> u64 {
    u64::from(lo) | (u64::from(hi) << 32)
}

/// Decodes and checks the payload of a packet whose header passed
/// [`decode_header`]. `payload.len()` must be `header.ndw`. `Err` is the
/// INVALID_PACKET fault to latch.
pub fn decode_payload(
    gen: Generation,
    ctx: Context,
    header: Header,
    payload: &[u32],
) -> Result<Packet, Fault> {
    let invalid = Fault::invalid(ctx.addr, header.op.opcode(gen));
    let r = gen.rules();
    let p = |i: usize| payload.get(i).copied().ok_or(invalid);
    let in_width = |a: u64| a >> r.addr_bits == 0;
    let flags = header.flags;
    // FLAGS that must be 0 for this packet in this generation.
    let flags_must_be_zero = !matches!(
        (header.op, gen),
        (Op::Fence, _) | (Op::WaitMem | Op::Barrier | Op::Dispatch, Generation::Gen1)
    );
    if flags_must_be_zero && flags != 0 {
        return Err(invalid);
    }
    if payload.len() != header.ndw as usize {
        return Err(invalid);
    }
    let check = |ok: bool| if ok { Ok(()) } else { Err(invalid) };
    match header.op {
        Op::Nop => Ok(Packet::Nop),
        Op::WriteData => {
            let dst = addr(p(0)?, p(1)?);
            check(in_width(dst) && dst % 4 == 0)?;
            Ok(Packet::WriteData { dst, count: header.ndw - 2 })
        }
        Op::DmaCopy => {
            check(ctx.addr % r.dma_header_align == 0)?;
            let (src, dst, size) = match gen {
                Generation::Gen1 => {
                    let s = p(4)?;
                    check(s >> 24 == 0)?;
                    (addr(p(0)?, p(1)?), addr(p(2)?, p(3)?), s)
                }
                Generation::Gen2 => (addr(p(1)?, p(2)?), addr(p(3)?, p(4)?), p(0)?),
            };
            check(size >= 1 && size <= r.max_dma && in_width(src) && in_width(dst))?;
            Ok(Packet::DmaCopy { src, dst, size: u64::from(size) })
        }
        Op::Fill => {
            check(ctx.addr % r.dma_header_align == 0)?;
            let (dst, size) = match gen {
                Generation::Gen1 => {
                    let s = p(2)?;
                    check(s >> 24 == 0)?;
                    (addr(p(0)?, p(1)?), s)
                }
                Generation::Gen2 => (addr(p(1)?, p(2)?), p(0)?),
            };
            check(size >= 4 && size <= r.max_fill && size % 4 == 0 && in_width(dst) && dst % 4 == 0)?;
            Ok(Packet::Fill { dst, size: u64::from(size), value: p(3)? })
        }
        Op::Fence => {
            check(flags & !1 == 0)?;
            let a = addr(p(0)?, p(1)?);
            check(in_width(a))?;
            let aligned = a % r.fence_align == 0;
            check(aligned || r.misaligned_fence_dropped)?;
            Ok(Packet::Fence { addr: a, value: addr(p(2)?, p(3)?), irq: flags & 1 != 0, dropped: !aligned })
        }
        Op::WaitMem => {
            let (ctl, base) = match gen {
                Generation::Gen1 => (u32::from(flags), 0),
                Generation::Gen2 => (p(0)?, 1),
            };
            check(ctl & !0xF == 0)?;
            let op = CompareOp::from_bits(ctl & 7).ok_or(invalid)?;
            let wide = ctl & 8 != 0;
            let a = addr(p(base)?, p(base + 1)?);
            let (ref_lo, ref_hi) = (p(base + 2)?, p(base + 3)?);
            let (mask_lo, mask_hi) = (p(base + 4)?, p(base + 5)?);
            check(in_width(a) && a % if wide { 8 } else { 4 } == 0)?;
            check(wide || (ref_hi == 0 && mask_hi == 0))?;
            Ok(Packet::WaitMem {
                addr: a,
                reference: addr(ref_lo, ref_hi),
                mask: addr(mask_lo, mask_hi),
                op,
                wide,
            })
        }
        Op::Timestamp => {
            let a = addr(p(0)?, p(1)?);
            check(in_width(a) && a % 8 == 0)?;
            Ok(Packet::Timestamp { addr: a })
        }
        Op::IndirectBuffer | Op::Chain => {
            let is_ib = header.op == Op::IndirectBuffer;
            check(if is_ib { !ctx.in_ib } else { ctx.in_ib })?;
            let a = addr(p(0)?, p(1)?);
            let size = p(2)?;
            check(in_width(a) && a % r.ib_align == 0 && size >= 1 && size <= r.max_ib_dwords)?;
            Ok(if is_ib { Packet::IndirectBuffer { addr: a, size } } else { Packet::Chain { addr: a, size } })
        }
        Op::Barrier => {
            let bits = match gen {
                Generation::Gen1 => u32::from(flags),
                Generation::Gen2 => p(0)?,
            };
            check(bits & !3 == 0)?;
            Ok(Packet::Barrier { wait_idle: bits & 1 != 0, invalidate: bits & 2 != 0 })
        }
        Op::Dispatch => {
            check(ctx.engine == COMPUTE_ENGINE && ctx.addr % r.dma_header_align == 0)?;
            let (op_bits, count, base) = match gen {
                Generation::Gen1 => {
                    check(flags & 0xF0 == 0)?;
                    let c = p(6)?;
                    check(c >> 16 == 0)?;
                    (u32::from(flags & 0xF), c, 0)
                }
                Generation::Gen2 => {
                    let c = p(0)?;
                    check(c & 0xF0 == 0)?;
                    (c & 0xF, c >> 8, 1)
                }
            };
            let op = DispatchOp::from_bits(op_bits).ok_or(invalid)?;
            let a = addr(p(base)?, p(base + 1)?);
            let b = addr(p(base + 2)?, p(base + 3)?);
            let dst = addr(p(base + 4)?, p(base + 5)?);
            check(count >= 1 && count <= r.max_dispatch)?;
            for x in [a, b, dst] {
                check(in_width(x) && x % 4 == 0)?;
            }
            Ok(Packet::Dispatch { op, a, b, dst, count, scalar: p(7)? })
        }
    }
}
