//! Logical commands: the work a driver user asks for, independent of the
//! generation that will encode it.

use crate::hw::{Field, PacketKind};

/// A read-only run of dwords: either native `u32`s (what callers hand the
/// encoder) or little-endian bytes (what the decoder finds in a stream, which
/// may not be 4-byte aligned in host memory).
#[derive(Clone, Copy)]
pub enum Payload<'a> {
    /// Native dwords.
    Words(&'a [u32]),
    /// Little-endian bytes; the length is a multiple of 4.
    Bytes(&'a [u8]),
}

impl<'a> Payload<'a> {
    /// Number of dwords.
    pub fn len(&self) -> usize {
        match self {
            Payload::Words(w) => w.len(),
            Payload::Bytes(b) => b.len() / 4,
        }
    }

    /// Whether there are no dwords.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The dwords in order.
    pub fn iter(&self) -> PayloadIter<'a> {
        PayloadIter { payload: *self, next: 0 }
    }

    /// Copies the dwords into `out` (which must be exactly `len()` long);
    /// returns false, touching nothing, if the lengths differ.
    #[inline]
    pub fn copy_to(&self, out: &mut [u32]) -> bool {
        if out.len() != self.len() {
            return false;
        }
        match self {
            // `get_mut(..n)` has length n by construction, so the copy has
            // no length-mismatch panic path (checked by tools/footprint.sh).
            Payload::Words(w) => match out.get_mut(..w.len()) {
                Some(dst) => dst.copy_from_slice(w),
                None => return false,
            },
            Payload::Bytes(b) => {
                for (o, c) in out.iter_mut().zip(b.chunks_exact(4)) {
                    *o = c.try_into().map_or(0, u32::from_le_bytes);
                }
            }
        }
        true
    }
}

impl core::fmt::Debug for Payload<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq for Payload<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Payload<'_> {}

/// Iterator over the dwords of a [`Payload`].
#[derive(Clone, Debug)]
pub struct PayloadIter<'a> {
    payload: Payload<'a>,
    next: usize,
}

impl Iterator for PayloadIter<'_> {
    type Item = u32;
    fn next(&mut self) -> Option<u32> {
        let i = self.next;
        let v = match self.payload {
            Payload::Words(w) => w.get(i).copied(),
            Payload::Bytes(b) => {
                let start = i.checked_mul(4)?;
                let end = start.checked_add(4)?;
                b.get(start..end).and_then(|c| c.try_into().ok()).map(u32::from_le_bytes)
            }
        }?;
        self.next = i.saturating_add(1);
        Some(v)
    }
}

/// WAIT_MEM compare operations (`docs/refgpu.md` section 6.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompareOp {
    /// `m == r`.
    Eq = 0,
    /// `m != r`.
    Ne = 1,
    /// `m >= r`, unsigned.
    Ge = 2,
    /// `m > r`, unsigned.
    Gt = 3,
    /// `m <= r`, unsigned.
    Le = 4,
    /// `m < r`, unsigned.
    Lt = 5,
    /// Wrap-safe sequence compare: `(m - r)` as signed is `>= 0`.
    SeqGe = 6,
}

impl CompareOp {
    /// The op with encoding `v`, or `None` for reserved values.
    pub const fn from_bits(v: u64) -> Option<CompareOp> {
        Some(match v {
            0 => CompareOp::Eq,
            1 => CompareOp::Ne,
            2 => CompareOp::Ge,
            3 => CompareOp::Gt,
            4 => CompareOp::Le,
            5 => CompareOp::Lt,
            6 => CompareOp::SeqGe,
            _ => return None,
        })
    }

    /// The specification's name.
    pub const fn name(self) -> &'static str {
        match self {
            CompareOp::Eq => "EQ",
            CompareOp::Ne => "NE",
            CompareOp::Ge => "GE",
            CompareOp::Gt => "GT",
            CompareOp::Le => "LE",
            CompareOp::Lt => "LT",
            CompareOp::SeqGe => "SEQ_GE",
        }
    }
}

/// DISPATCH operations (`docs/refgpu.md` section 6.11).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DispatchOp {
    /// `dst[i] = a[i] + b[i]` (wrapping u32).
    AddU32 = 0,
    /// `dst[i] = a[i] * b[i]` (wrapping u32).
    MulU32 = 1,
    /// `dst[i] = scalar * a[i] + b[i]` (f32, not fused).
    SaxpyF32 = 2,
}

impl DispatchOp {
    /// The op with encoding `v`, or `None` for reserved values.
    pub const fn from_bits(v: u64) -> Option<DispatchOp> {
        Some(match v {
            0 => DispatchOp::AddU32,
            1 => DispatchOp::MulU32,
            2 => DispatchOp::SaxpyF32,
            _ => return None,
        })
    }

    /// The specification's name.
    pub const fn name(self) -> &'static str {
        match self {
            DispatchOp::AddU32 => "ADD_U32",
            DispatchOp::MulU32 => "MUL_U32",
            DispatchOp::SaxpyF32 => "SAXPY_F32",
        }
    }
}

/// One unit of GPU work, independent of generation. Each becomes exactly
/// one packet (plus alignment padding the generation may require).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command<'a> {
    /// Padding: a NOP with `dwords` zero payload dwords.
    Nop {
        /// Payload dwords after the header.
        dwords: u32,
    },
    /// Write inline dwords to `dst`.
    WriteData {
        /// Destination GPU address, 4-byte aligned.
        dst: u64,
        /// The dwords (at least one).
        data: Payload<'a>,
    },
    /// Copy `size` bytes from `src` to `dst`.
    Copy {
        /// Source GPU address.
        src: u64,
        /// Destination GPU address.
        dst: u64,
        /// Bytes, at least 1.
        size: u64,
    },
    /// Fill `size` bytes at `dst` with the 32-bit `value`.
    Fill {
        /// Destination GPU address, 4-byte aligned.
        dst: u64,
        /// Bytes, a non-zero multiple of 4.
        size: u64,
        /// The pattern.
        value: u32,
    },
    /// Write the 64-bit `value` at `addr` (release), optional interrupt.
    Fence {
        /// Fence slot address, aligned per generation.
        addr: u64,
        /// Value written.
        value: u64,
        /// Raise the engine's fence interrupt.
        irq: bool,
    },
    /// Block until `(mem & mask) op (reference & mask)`.
    WaitMem {
        /// Address polled.
        addr: u64,
        /// Reference value.
        reference: u64,
        /// Mask applied to both sides.
        mask: u64,
        /// Comparison.
        op: CompareOp,
        /// 64-bit (true) or 32-bit compare.
        wide: bool,
    },
    /// Write the device clock at `addr`.
    Timestamp {
        /// 8-byte-aligned address.
        addr: u64,
    },
    /// Execute `size_dw` dwords at `addr`, then return to the ring.
    IndirectBuffer {
        /// IB address, aligned per generation.
        addr: u64,
        /// IB size in dwords.
        size_dw: u32,
    },
    /// End this IB and continue with `size_dw` dwords at `addr`.
    Chain {
        /// Next chunk's address.
        addr: u64,
        /// Next chunk's size in dwords.
        size_dw: u32,
    },
    /// Make earlier writes visible / discard cached reads.
    Barrier {
        /// Wait for earlier writes to complete.
        wait_idle: bool,
        /// Discard cached reads.
        invalidate: bool,
    },
    /// Element-wise arithmetic over `count` 32-bit elements.
    Dispatch {
        /// The operation.
        op: DispatchOp,
        /// First input array.
        a: u64,
        /// Second input array.
        b: u64,
        /// Output array.
        dst: u64,
        /// Element count, at least 1.
        count: u32,
        /// SAXPY scalar as an f32 bit pattern (ignored by integer ops).
        scalar_bits: u32,
    },
}

/// Operand values of one packet, indexed by [`Field`]. The bridge between
/// a [`Command`] and a generation's [`crate::hw::PacketDesc`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FieldValues([u64; Field::COUNT]);

impl FieldValues {
    /// The value of `field` (0 when the packet has no such field).
    #[inline]
    pub fn get(&self, field: Field) -> u64 {
        self.0.get(field as usize).copied().unwrap_or(0)
    }

    /// Sets `field`.
    #[inline]
    pub fn set(&mut self, field: Field, value: u64) {
        if let Some(v) = self.0.get_mut(field as usize) {
            *v = value;
        }
    }
}

/// Why decoded operand values make no [`Command`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperandError {
    /// A compare or dispatch op value that is reserved.
    ReservedOp {
        /// The packet.
        kind: PacketKind,
        /// The value found.
        value: u64,
    },
    /// A field holds more bits than the command can carry.
    TooWide {
        /// The field.
        field: Field,
    },
}

impl<'a> Command<'a> {
    /// A WRITE_DATA of native dwords.
    pub const fn write_data(dst: u64, data: &'a [u32]) -> Command<'a> {
        Command::WriteData { dst, data: Payload::Words(data) }
    }

    /// A SAXPY dispatch: `dst[i] = scalar * a[i] + b[i]`.
    pub fn saxpy(a: u64, b: u64, dst: u64, count: u32, scalar: f32) -> Command<'a> {
        Command::Dispatch { op: DispatchOp::SaxpyF32, a, b, dst, count, scalar_bits: scalar.to_bits() }
    }

    /// The packet this command becomes.
    #[inline]
    pub const fn kind(&self) -> PacketKind {
        match self {
            Command::Nop { .. } => PacketKind::Nop,
            Command::WriteData { .. } => PacketKind::WriteData,
            Command::Copy { .. } => PacketKind::DmaCopy,
            Command::Fill { .. } => PacketKind::Fill,
            Command::Fence { .. } => PacketKind::Fence,
            Command::WaitMem { .. } => PacketKind::WaitMem,
            Command::Timestamp { .. } => PacketKind::Timestamp,
            Command::IndirectBuffer { .. } => PacketKind::IndirectBuffer,
            Command::Chain { .. } => PacketKind::Chain,
            Command::Barrier { .. } => PacketKind::Barrier,
            Command::Dispatch { .. } => PacketKind::Dispatch,
        }
    }

    /// The value of one operand (0 when the command has no such field):
    /// what the encoder reads field by field, without building a table.
    #[inline(always)]
    pub fn field(&self, field: Field) -> u64 {
        match (*self, field) {
            (Command::WriteData { dst, .. }, Field::Dst) => dst,
            (Command::Copy { src, .. }, Field::Src) => src,
            (Command::Copy { dst, .. }, Field::Dst) => dst,
            (Command::Copy { size, .. }, Field::Size) => size,
            (Command::Fill { dst, .. }, Field::Dst) => dst,
            (Command::Fill { size, .. }, Field::Size) => size,
            (Command::Fill { value, .. }, Field::Value) => value.into(),
            (Command::Fence { addr, .. }, Field::Addr) => addr,
            (Command::Fence { value, .. }, Field::Value) => value,
            (Command::Fence { irq, .. }, Field::Irq) => irq.into(),
            (Command::WaitMem { addr, .. }, Field::Addr) => addr,
            (Command::WaitMem { reference, .. }, Field::Ref) => reference,
            (Command::WaitMem { mask, .. }, Field::Mask) => mask,
            (Command::WaitMem { op, .. }, Field::Op) => op as u64,
            (Command::WaitMem { wide, .. }, Field::Wide) => wide.into(),
            (Command::Timestamp { addr }, Field::Addr) => addr,
            (Command::IndirectBuffer { addr, .. } | Command::Chain { addr, .. }, Field::Addr) => addr,
            (Command::IndirectBuffer { size_dw, .. } | Command::Chain { size_dw, .. }, Field::Size) => {
                size_dw.into()
            }
            (Command::Barrier { wait_idle, .. }, Field::WaitIdle) => wait_idle.into(),
            (Command::Barrier { invalidate, .. }, Field::Invalidate) => invalidate.into(),
            (Command::Dispatch { op, .. }, Field::Op) => op as u64,
            (Command::Dispatch { a, .. }, Field::A) => a,
            (Command::Dispatch { b, .. }, Field::B) => b,
            (Command::Dispatch { dst, .. }, Field::Dst) => dst,
            (Command::Dispatch { count, .. }, Field::Count) => count.into(),
            (Command::Dispatch { scalar_bits, .. }, Field::Scalar) => scalar_bits.into(),
            _ => 0,
        }
    }

    /// The variable tail: WRITE_DATA's data (NOP's zero payload is
    /// represented by its length only).
    #[inline]
    pub fn tail(&self) -> Option<Payload<'a>> {
        match *self {
            Command::WriteData { data, .. } => Some(data),
            _ => None,
        }
    }

    /// Rebuilds a command from decoded operands: the inverse of
    /// [`Command::field`] and [`Command::tail`]. `tail` is the variable payload (NOP: ignored
    /// bytes, WRITE_DATA: data).
    pub fn from_operands(
        kind: PacketKind,
        v: &FieldValues,
        tail: Payload<'a>,
    ) -> Result<Command<'a>, OperandError> {
        let u32_of = |field: Field| -> Result<u32, OperandError> {
            u32::try_from(v.get(field)).map_err(|_| OperandError::TooWide { field })
        };
        Ok(match kind {
            PacketKind::Nop => Command::Nop {
                dwords: u32::try_from(tail.len())
                    .map_err(|_| OperandError::TooWide { field: Field::Size })?,
            },
            PacketKind::WriteData => Command::WriteData { dst: v.get(Field::Dst), data: tail },
            PacketKind::DmaCopy => {
                Command::Copy { src: v.get(Field::Src), dst: v.get(Field::Dst), size: v.get(Field::Size) }
            }
            PacketKind::Fill => Command::Fill {
                dst: v.get(Field::Dst),
                size: v.get(Field::Size),
                value: u32_of(Field::Value)?,
            },
            PacketKind::Fence => Command::Fence {
                addr: v.get(Field::Addr),
                value: v.get(Field::Value),
                irq: v.get(Field::Irq) != 0,
            },
            PacketKind::WaitMem => Command::WaitMem {
                addr: v.get(Field::Addr),
                reference: v.get(Field::Ref),
                mask: v.get(Field::Mask),
                op: CompareOp::from_bits(v.get(Field::Op))
                    .ok_or(OperandError::ReservedOp { kind, value: v.get(Field::Op) })?,
                wide: v.get(Field::Wide) != 0,
            },
            PacketKind::Timestamp => Command::Timestamp { addr: v.get(Field::Addr) },
            PacketKind::IndirectBuffer => {
                Command::IndirectBuffer { addr: v.get(Field::Addr), size_dw: u32_of(Field::Size)? }
            }
            PacketKind::Chain => Command::Chain { addr: v.get(Field::Addr), size_dw: u32_of(Field::Size)? },
            PacketKind::Barrier => Command::Barrier {
                wait_idle: v.get(Field::WaitIdle) != 0,
                invalidate: v.get(Field::Invalidate) != 0,
            },
            PacketKind::Dispatch => Command::Dispatch {
                op: DispatchOp::from_bits(v.get(Field::Op))
                    .ok_or(OperandError::ReservedOp { kind, value: v.get(Field::Op) })?,
                a: v.get(Field::A),
                b: v.get(Field::B),
                dst: v.get(Field::Dst),
                count: u32_of(Field::Count)?,
                scalar_bits: u32_of(Field::Scalar)?,
            },
        })
    }
}
