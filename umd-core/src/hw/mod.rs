//! Hardware descriptions: one [`GenDesc`] per refgpu generation.
//!
//! Each generation's packet layouts, limits and alignment rules are written
//! down once, as data, in its own module ([`gen1`], [`gen2`]); the encoder
//! ([`crate::cmd`]), the decoder ([`crate::decode`]) and the dump's field
//! names are all derived from that data, in the spirit of Mesa's genxml. Code
//! outside the generation modules never asks "which generation is this?": it
//! reads a number or a layout from the description instead.
//!
//! The contract these tables transcribe is `docs/refgpu.md` sections 5 and 6.

#[cfg(not(any(feature = "gen1", feature = "gen2")))]
compile_error!("umd-core needs at least one generation: enable feature `gen1` or `gen2`");

pub mod addr;
#[cfg(feature = "gen1")]
pub mod gen1;
#[cfg(feature = "gen2")]
pub mod gen2;
pub mod mmu;
pub mod regs;

use core::fmt;

pub use addr::{GpuVa, IbRef};

/// A refgpu hardware generation: one variant per generation this build
/// drives (cargo features `gen1`, `gen2`; both by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Generation {
    #[cfg(feature = "gen1")]
    /// Generation 1: opcode in the top byte, 40-bit addresses, small limits.
    Gen1,
    #[cfg(feature = "gen2")]
    /// Generation 2: typed header, 48-bit addresses, 32-byte DMA alignment,
    /// 64-byte fence alignment (misaligned fences are silently dropped).
    Gen2,
}

impl Generation {
    /// The description of this generation.
    pub const fn desc(self) -> &'static GenDesc {
        match self {
            #[cfg(feature = "gen1")]
            Generation::Gen1 => &gen1::DESC,
            #[cfg(feature = "gen2")]
            Generation::Gen2 => &gen2::DESC,
        }
    }

    /// The generation number as the ID register encodes it (1 or 2).
    pub const fn number(self) -> u8 {
        match self {
            #[cfg(feature = "gen1")]
            Generation::Gen1 => 1,
            #[cfg(feature = "gen2")]
            Generation::Gen2 => 2,
        }
    }

    /// The generation with ID-register number `n`, if it is one this build
    /// drives (a generation whose feature is off is unknown here).
    pub const fn from_number(n: u8) -> Option<Generation> {
        match n {
            #[cfg(feature = "gen1")]
            1 => Some(Generation::Gen1),
            #[cfg(feature = "gen2")]
            2 => Some(Generation::Gen2),
            _ => None,
        }
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gen{}", self.number())
    }
}

/// Value of the ID register's bits 31:16 on every refgpu ("RG").
pub const ID_MAGIC: u16 = 0x5247;

/// Why an ID register value names no device we can drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeError {
    /// Bits 31:16 are not [`ID_MAGIC`]: this is not a refgpu (or the
    /// register page is not mapped where the platform says).
    NotRefgpu {
        /// The ID register value read.
        id: u32,
    },
    /// A refgpu of a generation this driver does not know.
    UnknownGeneration {
        /// The generation number from bits 15:8.
        generation: u8,
    },
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeError::NotRefgpu { id } => {
                write!(f, "ID register {id:#010x} is not a refgpu (magic {ID_MAGIC:#06x} expected)")
            }
            ProbeError::UnknownGeneration { generation } => {
                write!(f, "refgpu generation {generation} is not supported")
            }
        }
    }
}

impl core::error::Error for ProbeError {}

/// The chip identity decoded from the ID register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChipId {
    /// The generation, which selects the encoder.
    pub generation: Generation,
    /// The revision (bits 7:0), informational.
    pub revision: u8,
}

impl ChipId {
    /// The ID register value for this chip.
    pub const fn id_register(self) -> u32 {
        ((ID_MAGIC as u32) << 16) | ((self.generation.number() as u32) << 8) | self.revision as u32
    }
}

/// Decodes the ID register (`docs/refgpu.md` section 2.1): the runtime path
/// from "a chip is there" to "this is its description".
pub fn probe(id: u32) -> Result<ChipId, ProbeError> {
    let magic = (id >> 16) as u16;
    if magic != ID_MAGIC {
        return Err(ProbeError::NotRefgpu { id });
    }
    let generation = ((id >> 8) & 0xff) as u8;
    let revision = (id & 0xff) as u8;
    match Generation::from_number(generation) {
        Some(generation) => Ok(ChipId { generation, revision }),
        None => Err(ProbeError::UnknownGeneration { generation }),
    }
}

/// `value mod align` without a panic path (0 when `align` is 0).
#[inline]
pub const fn misalignment(value: u64, align: u64) -> u64 {
    match value.checked_rem(align) {
        Some(r) => r,
        None => 0,
    }
}

/// A bit field `[shift + width - 1 : shift]` of a dword.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bits {
    /// Lowest bit.
    pub shift: u8,
    /// Number of bits, 1..=32.
    pub width: u8,
}

impl Bits {
    /// The field starting at bit `shift`, `width` bits wide.
    pub const fn new(shift: u8, width: u8) -> Bits {
        Bits { shift, width }
    }

    /// The largest value the field holds.
    #[inline]
    pub const fn max(self) -> u32 {
        if self.width >= 32 {
            u32::MAX
        } else {
            (1u32 << self.width).wrapping_sub(1)
        }
    }

    /// The field's bits in place within the dword.
    #[inline]
    pub const fn mask(self) -> u32 {
        self.max() << self.shift
    }

    /// Extracts the field from `dword`.
    #[inline]
    pub const fn get(self, dword: u32) -> u32 {
        (dword >> self.shift) & self.max()
    }

    /// `dword` with the field set to `value` (truncated to the field).
    #[inline]
    pub const fn put(self, dword: u32, value: u32) -> u32 {
        (dword & !self.mask()) | ((value & self.max()) << self.shift)
    }
}

/// Where the header keeps its fields.
#[derive(Clone, Copy, Debug)]
pub struct HeaderLayout {
    /// The opcode field.
    pub opcode: Bits,
    /// The per-packet FLAGS field.
    pub flags: Bits,
    /// The payload length, in dwords after the header.
    pub ndw: Bits,
    /// A fixed tag some generations carry (field and the value it must hold).
    pub tag: Option<(Bits, u32)>,
}

impl HeaderLayout {
    /// Builds a header dword.
    #[inline(always)]
    pub const fn encode(&self, opcode: u8, flags: u32, ndw: u32) -> u32 {
        let mut h = 0;
        h = self.opcode.put(h, opcode as u32);
        h = self.flags.put(h, flags);
        h = self.ndw.put(h, ndw);
        if let Some((bits, value)) = self.tag {
            h = bits.put(h, value);
        }
        h
    }
}

/// The packets every generation has (`docs/refgpu.md` section 5.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PacketKind {
    /// Padding.
    Nop,
    /// Inline dwords written to memory.
    WriteData,
    /// Memory-to-memory copy.
    DmaCopy,
    /// 32-bit pattern fill.
    Fill,
    /// 64-bit fence value write, optional interrupt.
    Fence,
    /// Block until a memory value compares true (semaphore wait).
    WaitMem,
    /// Device clock written to memory.
    Timestamp,
    /// Call an indirect buffer from the ring.
    IndirectBuffer,
    /// Jump to the next IB chunk.
    Chain,
    /// Memory ordering point.
    Barrier,
    /// Fixed-function element-wise arithmetic (compute engine only).
    Dispatch,
}

impl PacketKind {
    /// Every packet kind, in opcode-table order.
    pub const ALL: [PacketKind; 11] = [
        PacketKind::Nop,
        PacketKind::WriteData,
        PacketKind::DmaCopy,
        PacketKind::Fill,
        PacketKind::Fence,
        PacketKind::WaitMem,
        PacketKind::Timestamp,
        PacketKind::IndirectBuffer,
        PacketKind::Chain,
        PacketKind::Barrier,
        PacketKind::Dispatch,
    ];

    /// The name the specification uses.
    pub const fn name(self) -> &'static str {
        match self {
            PacketKind::Nop => "NOP",
            PacketKind::WriteData => "WRITE_DATA",
            PacketKind::DmaCopy => "DMA_COPY",
            PacketKind::Fill => "FILL",
            PacketKind::Fence => "FENCE",
            PacketKind::WaitMem => "WAIT_MEM",
            PacketKind::Timestamp => "TIMESTAMP",
            PacketKind::IndirectBuffer => "INDIRECT_BUFFER",
            PacketKind::Chain => "CHAIN",
            PacketKind::Barrier => "BARRIER",
            PacketKind::Dispatch => "DISPATCH",
        }
    }

    /// Packets whose header must be aligned to [`Rules::exec_align`].
    pub const fn needs_exec_alignment(self) -> bool {
        matches!(self, PacketKind::DmaCopy | PacketKind::Fill | PacketKind::Dispatch)
    }
}

/// The logical operands a packet can carry; a [`FieldDesc`] says where one
/// lives in a given generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    /// Source address.
    Src,
    /// Destination address.
    Dst,
    /// Target address (fence, wait, timestamp, IB).
    Addr,
    /// Size in bytes (DMA_COPY, FILL) or dwords (INDIRECT_BUFFER, CHAIN).
    Size,
    /// Value written (FILL pattern, FENCE value).
    Value,
    /// WAIT_MEM reference value.
    Ref,
    /// WAIT_MEM mask.
    Mask,
    /// Operation selector (WAIT_MEM compare op, DISPATCH op).
    Op,
    /// WAIT_MEM 64-bit compare.
    Wide,
    /// FENCE raises an interrupt.
    Irq,
    /// BARRIER waits for earlier writes.
    WaitIdle,
    /// BARRIER discards cached reads.
    Invalidate,
    /// DISPATCH first input array.
    A,
    /// DISPATCH second input array.
    B,
    /// DISPATCH element count.
    Count,
    /// DISPATCH f32 scalar (bit pattern).
    Scalar,
}

impl Field {
    /// Number of fields; size of a [`crate::cmd::FieldValues`] table.
    pub const COUNT: usize = 16;

    /// The name the specification uses (and the dump prints).
    pub const fn name(self) -> &'static str {
        match self {
            Field::Src => "SRC",
            Field::Dst => "DST",
            Field::Addr => "ADDR",
            Field::Size => "SIZE",
            Field::Value => "VALUE",
            Field::Ref => "REF",
            Field::Mask => "MASK",
            Field::Op => "OP",
            Field::Wide => "WIDE",
            Field::Irq => "IRQ",
            Field::WaitIdle => "WAIT_IDLE",
            Field::Invalidate => "INVALIDATE",
            Field::A => "A",
            Field::B => "B",
            Field::Count => "COUNT",
            Field::Scalar => "SCALAR",
        }
    }

    /// Whether the field is a GPU address (subject to the address width).
    pub const fn is_address(self) -> bool {
        matches!(self, Field::Src | Field::Dst | Field::Addr | Field::A | Field::B)
    }
}

/// Where a field lives in a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loc {
    /// Bits of the header's FLAGS field.
    Flags(Bits),
    /// Bits of payload dword `dw`.
    Payload {
        /// Payload dword index (0 = first dword after the header).
        dw: u8,
        /// The bits within it.
        bits: Bits,
    },
    /// A 64-bit value: low half in payload dword `n`, high half in `n + 1`.
    Wide(u8),
}

impl Loc {
    /// A whole payload dword.
    pub const fn dword(dw: u8) -> Loc {
        Loc::Payload { dw, bits: Bits::new(0, 32) }
    }

    /// The largest value this location can hold.
    #[inline]
    pub const fn max(self) -> u64 {
        match self {
            Loc::Flags(b) | Loc::Payload { bits: b, .. } => b.max() as u64,
            Loc::Wide(_) => u64::MAX,
        }
    }
}

/// One operand of one packet in one generation.
#[derive(Clone, Copy, Debug)]
pub struct FieldDesc {
    /// Which operand.
    pub field: Field,
    /// Where it lives.
    pub loc: Loc,
}

/// How long a packet's payload may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ndw {
    /// Exactly this many payload dwords.
    Fixed(u16),
    /// At least `min` fixed dwords, then a variable tail of data dwords up
    /// to the generation's maximum NDW.
    Tail {
        /// Dwords before the tail.
        min: u16,
        /// Tail dwords required (WRITE_DATA needs at least one).
        min_tail: u16,
    },
}

/// One packet in one generation: opcode, payload length and field layout.
#[derive(Clone, Copy, Debug)]
pub struct PacketDesc {
    /// Which packet.
    pub kind: PacketKind,
    /// Its opcode in this generation.
    pub opcode: u8,
    /// Payload length rule.
    pub ndw: Ndw,
    /// Operand layout. Payload bits and FLAGS bits not covered here are
    /// reserved and must be 0 (derived, never listed by hand).
    pub fields: &'static [FieldDesc],
}

impl PacketDesc {
    /// The location of `field` in this packet, if it has it.
    pub fn loc(&self, field: Field) -> Option<Loc> {
        self.fields.iter().find(|f| f.field == field).map(|f| f.loc)
    }

    /// The fixed (non-tail) payload dwords.
    pub const fn fixed_ndw(&self) -> u16 {
        match self.ndw {
            Ndw::Fixed(n) => n,
            Ndw::Tail { min, .. } => min,
        }
    }

    /// FLAGS bits that belong to a field (the rest are reserved).
    pub fn flags_mask(&self) -> u32 {
        self.fields.iter().fold(0, |m, f| match f.loc {
            Loc::Flags(b) => m | b.mask(),
            _ => m,
        })
    }

    /// Bits of fixed payload dword `dw` that belong to a field.
    pub fn payload_mask(&self, dw: u8) -> u32 {
        self.fields.iter().fold(0, |m, f| match f.loc {
            Loc::Payload { dw: d, bits } if d == dw => m | bits.mask(),
            Loc::Wide(n) if n == dw || n.wrapping_add(1) == dw => u32::MAX,
            _ => m,
        })
    }
}

/// Numeric limits of a generation (`docs/refgpu.md` section 5.2).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest NDW of any packet.
    pub max_ndw: u32,
    /// GPU address width in bits.
    pub va_bits: u32,
    /// Largest INDIRECT_BUFFER / CHAIN size in dwords.
    pub max_ib_dwords: u32,
    /// Largest DMA_COPY size in bytes.
    pub max_copy_bytes: u64,
    /// Largest FILL size in bytes.
    pub max_fill_bytes: u64,
    /// Largest DISPATCH element count.
    pub max_dispatch_count: u64,
}

/// What the device does with a FENCE whose address is misaligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MisalignedFence {
    /// The engine stops with INVALID_PACKET.
    Fault,
    /// The write is silently dropped, a lost fence (`docs/refgpu.md` section 6.5).
    Dropped,
}

/// Alignment rules of a generation (`docs/refgpu.md` section 5.2).
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    /// Required alignment of INDIRECT_BUFFER / CHAIN targets, in bytes.
    pub ib_align: u64,
    /// Required alignment of DMA_COPY, FILL and DISPATCH headers, in bytes;
    /// the encoder pads with NOPs to reach it.
    pub exec_align: u64,
    /// Required FENCE address alignment, in bytes.
    pub fence_align: u64,
    /// What the device does when `fence_align` is broken.
    pub misaligned_fence: MisalignedFence,
}

/// Everything the driver knows about one generation.
#[derive(Debug)]
pub struct GenDesc {
    /// Which generation this is.
    pub generation: Generation,
    /// Header layout.
    pub header: HeaderLayout,
    /// Numeric limits.
    pub limits: Limits,
    /// Alignment rules.
    pub rules: Rules,
    /// One entry per [`PacketKind`], in [`PacketKind::ALL`] order.
    pub packets: [PacketDesc; 11],
}

impl GenDesc {
    /// The description of `kind` in this generation.
    pub fn packet(&self, kind: PacketKind) -> Option<&PacketDesc> {
        self.packets.iter().find(|p| p.kind == kind)
    }

    /// The description of the packet with `opcode`, if it is not reserved.
    pub fn by_opcode(&self, opcode: u8) -> Option<&PacketDesc> {
        self.packets.iter().find(|p| p.opcode == opcode)
    }

    /// Size in dwords of a one-dword-header packet with `ndw` payload.
    pub const fn packet_dwords(ndw: u32) -> u32 {
        ndw.saturating_add(1)
    }

    /// The largest address + 1 operands may use.
    pub const fn va_limit(&self) -> u64 {
        1u64 << self.limits.va_bits
    }
}
