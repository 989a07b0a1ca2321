//! The command-stream decoder, driven by the same [`GenDesc`] as the
//! encoder.
//!
//! It turns any byte slice into a sequence of [`Item`]s: decoded packets,
//! or errors for what the device would reject (truncated packets, reserved
//! opcodes, wrong lengths, reserved bits, reserved operation values). It
//! never panics and never reads outside the slice; every step consumes at
//! least one dword, so it always ends. Decoded packets also carry any rule
//! the encoder would have refused (a misaligned fence, a misaligned gen2 DMA
//! packet), which is what a bring-up engineer looks for in a hang dump.

use core::fmt;

use crate::cmd::{Command, EncodeError, Encoder, FieldValues, OperandError, Payload};
use crate::hw::{GenDesc, Generation, Loc, Ndw, PacketDesc, PacketKind};

/// Why the bytes at some offset are not an executable packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// The stream ends inside a header or payload (including a length field
    /// that points past the end): `needed` bytes from the offset, `available`
    /// present.
    Truncated {
        /// Bytes the packet claims.
        needed: usize,
        /// Bytes left in the stream.
        available: usize,
    },
    /// A gen2 header whose TYPE field is wrong.
    BadTag {
        /// The header dword.
        header: u32,
    },
    /// A reserved opcode.
    UnknownOpcode {
        /// The opcode.
        opcode: u8,
        /// The header dword.
        header: u32,
    },
    /// A payload length the packet does not allow.
    BadLength {
        /// The packet.
        kind: PacketKind,
        /// NDW found.
        ndw: u32,
        /// Smallest allowed.
        min: u32,
        /// Largest allowed.
        max: u32,
    },
    /// Reserved bits set in FLAGS (`dword` = None) or a payload dword.
    ReservedBits {
        /// The packet.
        kind: PacketKind,
        /// Payload dword index, or None for the header FLAGS field.
        dword: Option<u8>,
        /// The offending bits (in place).
        bits: u32,
    },
    /// A reserved compare or dispatch operation.
    ReservedOp {
        /// The packet.
        kind: PacketKind,
        /// The value found.
        value: u64,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DecodeError::Truncated { needed, available } => {
                write!(f, "truncated: packet needs {needed} bytes, {available} left")
            }
            DecodeError::BadTag { header } => write!(f, "bad header type in {header:#010x}"),
            DecodeError::UnknownOpcode { opcode, header } => {
                write!(f, "reserved opcode {opcode:#04x} in header {header:#010x}")
            }
            DecodeError::BadLength { kind, ndw, min, max } => {
                write!(f, "{}: NDW {ndw} outside {min}..={max}", kind.name())
            }
            DecodeError::ReservedBits { kind, dword: None, bits } => {
                write!(f, "{}: reserved FLAGS bits {bits:#x} set", kind.name())
            }
            DecodeError::ReservedBits { kind, dword: Some(d), bits } => {
                write!(f, "{}: reserved bits {bits:#010x} set in payload dword {d}", kind.name())
            }
            DecodeError::ReservedOp { kind, value } => {
                write!(f, "{}: reserved operation {value}", kind.name())
            }
        }
    }
}

impl core::error::Error for DecodeError {}

/// A rule of the generation that a decoded packet breaks: what the encoder
/// would have refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Violation {
    /// An operand rule (alignment, limits, zero size, misaligned fence).
    Operand(EncodeError),
    /// The packet header is not aligned as the generation requires.
    PacketMisaligned {
        /// Required alignment in bytes.
        align: u64,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Operand(e) => e.fmt(f),
            Violation::PacketMisaligned { align } => {
                write!(f, "packet header not {align}-byte aligned")
            }
        }
    }
}

/// A decoded packet.
#[derive(Clone, Copy, Debug)]
pub struct Packet<'a> {
    /// Its description (names, field layout).
    pub desc: &'static PacketDesc,
    /// The header dword.
    pub header: u32,
    /// Payload dwords.
    pub ndw: u32,
    /// Operand values, by field.
    pub values: FieldValues,
    /// The logical command it carries.
    pub command: Command<'a>,
    /// The first rule it breaks, if any.
    pub violation: Option<Violation>,
}

/// One step of decoding: where, the raw bytes, and what they are.
#[derive(Clone, Copy, Debug)]
pub struct Item<'a> {
    /// Byte offset in the stream.
    pub offset: usize,
    /// GPU address (stream base + offset).
    pub va: u64,
    /// The bytes this item covers (at most to the end of the stream).
    pub raw: &'a [u8],
    /// The packet, or why it is not one.
    pub result: Result<Packet<'a>, DecodeError>,
}

/// Iterator decoding a byte stream for one generation.
#[derive(Clone, Debug)]
pub struct Decoder<'a> {
    enc: Encoder,
    bytes: &'a [u8],
    base_va: u64,
    pos: usize,
    done: bool,
}

impl<'a> Decoder<'a> {
    /// Decodes `bytes`, whose first byte is at GPU address `base_va`.
    pub fn new(generation: Generation, bytes: &'a [u8], base_va: u64) -> Self {
        Decoder { enc: Encoder::new(generation), bytes, base_va, pos: 0, done: false }
    }

    fn desc(&self) -> &'static GenDesc {
        self.enc.desc()
    }

    fn dword(&self, at: usize) -> Option<u32> {
        let end = at.checked_add(4)?;
        self.bytes.get(at..end).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes)
    }

    /// Decodes the packet at `self.pos`; returns the item and the bytes to
    /// advance (0 = stop).
    fn step(&self) -> (Result<Packet<'a>, DecodeError>, usize) {
        let available = self.bytes.len().saturating_sub(self.pos);
        let Some(header) = self.dword(self.pos) else {
            return (Err(DecodeError::Truncated { needed: 4, available }), 0);
        };
        let desc = self.desc();
        let h = &desc.header;
        if let Some((bits, value)) = h.tag {
            if bits.get(header) != value {
                return (Err(DecodeError::BadTag { header }), 4);
            }
        }
        let ndw = h.ndw.get(header);
        let size = (ndw as usize).saturating_add(1).saturating_mul(4);
        if size > available {
            return (Err(DecodeError::Truncated { needed: size, available }), 0);
        }
        let opcode = h.opcode.get(header) as u8;
        let Some(p) = desc.by_opcode(opcode) else {
            return (Err(DecodeError::UnknownOpcode { opcode, header }), size);
        };
        (self.packet(p, header, ndw), size)
    }

    fn packet(&self, p: &'static PacketDesc, header: u32, ndw: u32) -> Result<Packet<'a>, DecodeError> {
        let desc = self.desc();
        let kind = p.kind;
        let fixed = u32::from(p.fixed_ndw());
        let (min, max) = match p.ndw {
            Ndw::Fixed(n) => (u32::from(n), u32::from(n)),
            Ndw::Tail { min, min_tail } => {
                (u32::from(min).saturating_add(min_tail.into()), desc.limits.max_ndw)
            }
        };
        if ndw < min || ndw > max {
            return Err(DecodeError::BadLength { kind, ndw, min, max });
        }
        let flags = desc.header.flags.get(header);
        let stray = flags & !p.flags_mask();
        if stray != 0 {
            return Err(DecodeError::ReservedBits { kind, dword: None, bits: stray });
        }
        let payload_at = self.pos.saturating_add(4);
        let pd = |i: u32| self.dword(payload_at.saturating_add((i as usize).saturating_mul(4))).unwrap_or(0);
        // NOP payload is ignored by the device; every other fixed dword's
        // uncovered bits are reserved.
        if kind != PacketKind::Nop {
            for i in 0..fixed {
                let dw = i as u8;
                let stray = pd(i) & !p.payload_mask(dw);
                if stray != 0 {
                    return Err(DecodeError::ReservedBits { kind, dword: Some(dw), bits: stray });
                }
            }
        }
        let mut values = FieldValues::default();
        for fd in p.fields {
            let v = match fd.loc {
                Loc::Flags(bits) => bits.get(flags).into(),
                Loc::Payload { dw, bits } => bits.get(pd(dw.into())).into(),
                Loc::Wide(n) => {
                    u64::from(pd(n.into())) | (u64::from(pd(u32::from(n).saturating_add(1))) << 32)
                }
            };
            values.set(fd.field, v);
        }
        let tail_start = payload_at.saturating_add((fixed as usize).saturating_mul(4));
        let tail_end = payload_at.saturating_add((ndw as usize).saturating_mul(4));
        let tail = Payload::Bytes(self.bytes.get(tail_start..tail_end).unwrap_or(&[]));
        let command = Command::from_operands(kind, &values, tail).map_err(|e| match e {
            OperandError::ReservedOp { kind, value } => DecodeError::ReservedOp { kind, value },
            OperandError::TooWide { .. } => DecodeError::ReservedBits { kind, dword: None, bits: 0 },
        })?;
        let va = self.base_va.wrapping_add(self.pos as u64);
        let violation = if self.enc.pad_before(kind, va) != 0 {
            Some(Violation::PacketMisaligned { align: desc.rules.exec_align })
        } else {
            self.enc.check(&command).err().map(Violation::Operand)
        };
        Ok(Packet { desc: p, header, ndw, values, command, violation })
    }
}

impl<'a> Iterator for Decoder<'a> {
    type Item = Item<'a>;

    fn next(&mut self) -> Option<Item<'a>> {
        if self.done || self.pos >= self.bytes.len() {
            return None;
        }
        let (result, advance) = self.step();
        let end = if advance == 0 {
            self.bytes.len()
        } else {
            self.pos.saturating_add(advance).min(self.bytes.len())
        };
        let item = Item {
            offset: self.pos,
            va: self.base_va.wrapping_add(self.pos as u64),
            raw: self.bytes.get(self.pos..end).unwrap_or(&[]),
            result,
        };
        if advance == 0 {
            self.done = true;
        } else {
            self.pos = self.pos.saturating_add(advance);
        }
        Some(item)
    }
}

impl fmt::Display for Packet<'_> {
    /// `NAME FIELD=value ...`, fields in the description's order, then the
    /// data of a WRITE_DATA (first 8 dwords) and any rule violation.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.desc.kind.name())?;
        for fd in self.desc.fields {
            let v = self.values.get(fd.field);
            match (fd.field, &self.command) {
                (crate::hw::Field::Op, Command::WaitMem { op, .. }) => write!(f, " OP={}", op.name())?,
                (crate::hw::Field::Op, Command::Dispatch { op, .. }) => write!(f, " OP={}", op.name())?,
                (crate::hw::Field::Scalar, _) => write!(f, " SCALAR={:?}", f32::from_bits(v as u32))?,
                (field, _) if matches!(fd.loc, Loc::Flags(b) | Loc::Payload { bits: b, .. } if b.width == 1) => {
                    if v != 0 {
                        write!(f, " {}", field.name())?;
                    }
                }
                (field, _) if v < 10 => write!(f, " {}={v}", field.name())?,
                (field, _) => write!(f, " {}={v:#x}", field.name())?,
            }
        }
        match self.command {
            Command::WriteData { data, .. } => {
                write!(f, " DATA=[")?;
                for (i, d) in data.iter().take(8).enumerate() {
                    write!(f, "{}{d:#010x}", if i == 0 { "" } else { ", " })?;
                }
                if data.len() > 8 {
                    write!(f, ", … {} more", data.len().saturating_sub(8))?;
                }
                write!(f, "]")?;
            }
            Command::Nop { dwords } if dwords > 0 => write!(f, " +{dwords} dwords")?,
            _ => {}
        }
        if let Some(v) = self.violation {
            write!(f, "  !! {v}")?;
        }
        Ok(())
    }
}

/// Magic of a `.rgcs` command-stream file (`docs/refgpu.md` section 8).
pub const STREAM_MAGIC: [u8; 4] = *b"RGCS";
/// Size of the `.rgcs` header.
pub const STREAM_HEADER_LEN: usize = 24;

/// Why a byte slice is not a `.rgcs` stream file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamFileError {
    /// Shorter than the header.
    TooShort,
    /// Not starting with `RGCS`.
    BadMagic,
    /// A format version this code does not read.
    UnsupportedVersion(u32),
    /// The ID field names no known device.
    Probe(crate::hw::ProbeError),
}

impl fmt::Display for StreamFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamFileError::TooShort => {
                write!(f, "shorter than the {STREAM_HEADER_LEN}-byte RGCS header")
            }
            StreamFileError::BadMagic => write!(f, "no RGCS magic"),
            StreamFileError::UnsupportedVersion(v) => {
                write!(f, "RGCS format version {v} is not supported")
            }
            StreamFileError::Probe(e) => write!(f, "RGCS header: {e}"),
        }
    }
}

impl core::error::Error for StreamFileError {}

/// A parsed `.rgcs` file: which chip, where the stream lives, the packets.
#[derive(Clone, Copy, Debug)]
pub struct StreamFile<'a> {
    /// The chip the stream was built for.
    pub chip: crate::hw::ChipId,
    /// GPU address of the first packet byte.
    pub base_va: u64,
    /// The packet bytes.
    pub packets: &'a [u8],
}

impl<'a> StreamFile<'a> {
    /// Whether `bytes` start with the `.rgcs` magic.
    pub fn is_stream_file(bytes: &[u8]) -> bool {
        bytes.get(..4) == Some(&STREAM_MAGIC[..])
    }

    /// Parses a `.rgcs` file.
    pub fn parse(bytes: &'a [u8]) -> Result<StreamFile<'a>, StreamFileError> {
        let (head, packets) = bytes.split_at_checked(STREAM_HEADER_LEN).ok_or(StreamFileError::TooShort)?;
        let u32_at = |o: usize| {
            head.get(o..o.saturating_add(4)).and_then(|b| b.try_into().ok()).map_or(0, u32::from_le_bytes)
        };
        if head.get(..4) != Some(&STREAM_MAGIC[..]) {
            return Err(StreamFileError::BadMagic);
        }
        let version = u32_at(4);
        if version != 1 {
            return Err(StreamFileError::UnsupportedVersion(version));
        }
        let chip = crate::hw::probe(u32_at(8)).map_err(StreamFileError::Probe)?;
        let base_va = u64::from(u32_at(16)) | (u64::from(u32_at(20)) << 32);
        Ok(StreamFile { chip, base_va, packets })
    }

    /// The header for a stream of `chip` placed at `base_va`.
    pub fn header(chip: crate::hw::ChipId, base_va: u64) -> [u8; STREAM_HEADER_LEN] {
        let mut h = [0u8; STREAM_HEADER_LEN];
        let fields: [(usize, &[u8]); 4] = [
            (0, &STREAM_MAGIC),
            (4, &1u32.to_le_bytes()),
            (8, &chip.id_register().to_le_bytes()),
            (16, &base_va.to_le_bytes()),
        ];
        for (at, bytes) in fields {
            // Byte by byte: `copy_from_slice`'s length check survives
            // this loop's optimisation (a panic path in a no-panic build).
            if let Some(dst) = h.get_mut(at..at.saturating_add(bytes.len())) {
                dst.iter_mut().zip(bytes).for_each(|(d, s)| *d = *s);
            }
        }
        h
    }

    /// A decoder over the packets.
    pub fn decoder(&self) -> Decoder<'a> {
        Decoder::new(self.chip.generation, self.packets, self.base_va)
    }
}
