//! The packet encoder, driven entirely by a generation's [`GenDesc`].
//!
//! It validates a [`Command`] against the generation's limits and rules,
//! computes the NOP padding the generation needs in front of it, and writes
//! header, fields and tail where the description says they live. Nothing in
//! here knows which generation it is encoding for: each entry point is
//! instantiated once per generation with that generation's description as a
//! compile-time constant, so the table lookups fold into straight code.

use core::fmt;

use super::command::{Command, Payload};
use crate::hw::{
    misalignment, Field, GenDesc, Generation, Loc, MisalignedFence, Ndw, PacketDesc, PacketKind,
};

/// Why a command could not be encoded or a command buffer could not grow.
/// After any of these the output memory before the failing packet is intact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EncodeError {
    /// Not enough room: `needed` dwords (padding included), `available` left.
    BufferFull {
        /// Dwords the packet needs.
        needed: usize,
        /// Dwords left.
        available: usize,
    },
    /// A size or count of zero (the device would do nothing; almost always a
    /// caller bug).
    ZeroSize {
        /// The packet.
        kind: PacketKind,
    },
    /// An operand above the generation's limit or its field's width.
    LimitExceeded {
        /// The packet.
        kind: PacketKind,
        /// The operand.
        field: Field,
        /// The value given.
        value: u64,
        /// The largest allowed.
        max: u64,
    },
    /// The payload would exceed the generation's maximum NDW.
    PayloadTooLarge {
        /// The packet.
        kind: PacketKind,
        /// Payload dwords requested.
        ndw: u64,
        /// The generation's maximum.
        max: u32,
    },
    /// An address at or above 2^`va_bits`.
    AddressOutOfRange {
        /// The packet.
        kind: PacketKind,
        /// The operand.
        field: Field,
        /// The address given.
        addr: u64,
        /// The generation's address width.
        va_bits: u32,
    },
    /// An operand not aligned as the packet requires.
    Misaligned {
        /// The packet.
        kind: PacketKind,
        /// The operand.
        field: Field,
        /// The value given.
        value: u64,
        /// Required alignment.
        align: u64,
    },
    /// A FENCE address not aligned for this generation; `device` says what
    /// the hardware would have done with it (gen2 silently drops it).
    MisalignedFence {
        /// The fence address.
        addr: u64,
        /// Required alignment.
        align: u64,
        /// What the device would do.
        device: MisalignedFence,
    },
    /// Operands that contradict each other (a 32-bit WAIT_MEM with non-zero
    /// high reference or mask bits).
    InvalidOperand {
        /// The packet.
        kind: PacketKind,
        /// The operand.
        field: Field,
    },
    /// The generation description has no such packet.
    Unsupported {
        /// The packet.
        kind: PacketKind,
    },
    /// The chunk source had no chunk to give.
    ChunkUnavailable,
    /// A chunk whose GPU address breaks the generation's IB alignment.
    ChunkMisaligned {
        /// The chunk's address.
        va: u64,
        /// Required alignment.
        align: u64,
    },
    /// A packet that would not fit even in an empty chunk.
    PacketTooLargeForChunk {
        /// Dwords the packet needs.
        needed: usize,
        /// Usable dwords in a chunk.
        capacity: usize,
    },
    /// `finish` on a command buffer with no packets.
    Empty,
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            EncodeError::BufferFull { needed, available } => {
                write!(f, "command buffer full: {needed} dwords needed, {available} left")
            }
            EncodeError::ZeroSize { kind } => write!(f, "{}: size or count of zero", kind.name()),
            EncodeError::LimitExceeded { kind, field, value, max } => {
                write!(f, "{}: {} = {value:#x} exceeds the limit {max:#x}", kind.name(), field.name())
            }
            EncodeError::PayloadTooLarge { kind, ndw, max } => {
                write!(f, "{}: {ndw} payload dwords exceed the maximum {max}", kind.name())
            }
            EncodeError::AddressOutOfRange { kind, field, addr, va_bits } => write!(
                f,
                "{}: {} = {addr:#x} is outside the {va_bits}-bit address space",
                kind.name(),
                field.name()
            ),
            EncodeError::Misaligned { kind, field, value, align } => {
                write!(f, "{}: {} = {value:#x} is not {align}-byte aligned", kind.name(), field.name())
            }
            EncodeError::MisalignedFence { addr, align, device } => write!(
                f,
                "FENCE address {addr:#x} is not {align}-byte aligned (the device would {})",
                match device {
                    MisalignedFence::Fault => "fault",
                    MisalignedFence::Dropped => "silently drop the fence",
                }
            ),
            EncodeError::InvalidOperand { kind, field } => {
                write!(f, "{}: operand {} is invalid for this form", kind.name(), field.name())
            }
            EncodeError::Unsupported { kind } => {
                write!(f, "{} is not described for this generation", kind.name())
            }
            EncodeError::ChunkUnavailable => write!(f, "no command-buffer chunk available"),
            EncodeError::ChunkMisaligned { va, align } => {
                write!(f, "chunk at {va:#x} is not {align}-byte aligned")
            }
            EncodeError::PacketTooLargeForChunk { needed, capacity } => {
                write!(f, "a {needed}-dword packet does not fit a {capacity}-dword chunk")
            }
            EncodeError::Empty => write!(f, "command buffer is empty"),
        }
    }
}

impl core::error::Error for EncodeError {}

/// Where a command lands: `pad` NOP dwords, then a `packet`-dword packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommandSpan {
    /// Padding dwords in front (0 when already aligned).
    pub pad: usize,
    /// Packet dwords (header included).
    pub packet: usize,
}

impl CommandSpan {
    /// Total dwords.
    pub const fn total(&self) -> usize {
        self.pad.saturating_add(self.packet)
    }
}

/// A generation's encoder: a thin handle on its description.
///
/// Every method dispatches once on the generation to code specialised for
/// it: the description is a `static` known at compile time and the packet
/// kind is known in each arm of the command match, so the table walks of
/// `prepare` and `write` fold into straight stores and compares (the
/// description stays the only place layouts and limits are written down).
#[derive(Clone, Copy, Debug)]
pub struct Encoder {
    generation: Generation,
}

/// A generation known at compile time: each entry point below is
/// monomorphised once per generation, with its description as a constant.
trait Gen {
    const DESC: &'static GenDesc;
}

#[cfg(feature = "gen1")]
struct Gen1;
#[cfg(feature = "gen1")]
impl Gen for Gen1 {
    const DESC: &'static GenDesc = &crate::hw::gen1::DESC;
}

#[cfg(feature = "gen2")]
struct Gen2;
#[cfg(feature = "gen2")]
impl Gen for Gen2 {
    const DESC: &'static GenDesc = &crate::hw::gen2::DESC;
}

/// Calls `$f::<G>(...)` for the encoder's generation, so each generation
/// gets its own folded copy of `$f` (one copy, not one per call site).
macro_rules! per_gen {
    ($self:expr, $f:ident($($arg:expr),*)) => {
        match $self.generation {
            #[cfg(feature = "gen1")]
            Generation::Gen1 => $f::<Gen1>($($arg),*),
            #[cfg(feature = "gen2")]
            Generation::Gen2 => $f::<Gen2>($($arg),*),
        }
    };
}

#[cfg(not(any(feature = "compact-encoder", feature = "size-first")))]
/// Calls `$f(desc, kind, cmd, ...)` with the packet kind as a constant in
/// the arms of the packets a submission path writes often (FENCE,
/// WRITE_DATA, DMA_COPY, FILL, INDIRECT_BUFFER, CHAIN), so their description
/// entries fold too; the rest share one copy that reads the kind at run time
/// (code size: firmware links this).
macro_rules! per_kind {
    ($f:ident($desc:expr, $cmd:expr $(, $arg:expr)*)) => {
        match $cmd {
            Command::WriteData { .. } => $f($desc, PacketKind::WriteData, $cmd $(, $arg)*),
            Command::Copy { .. } => $f($desc, PacketKind::DmaCopy, $cmd $(, $arg)*),
            Command::Fill { .. } => $f($desc, PacketKind::Fill, $cmd $(, $arg)*),
            Command::Fence { .. } => $f($desc, PacketKind::Fence, $cmd $(, $arg)*),
            Command::IndirectBuffer { .. } => $f($desc, PacketKind::IndirectBuffer, $cmd $(, $arg)*),
            Command::Chain { .. } => $f($desc, PacketKind::Chain, $cmd $(, $arg)*),
            _ => $f($desc, $cmd.kind(), $cmd $(, $arg)*),
        }
    };
}

impl Encoder {
    /// The encoder for `generation`.
    pub const fn new(generation: Generation) -> Encoder {
        Encoder { generation }
    }

    /// The description this encoder follows.
    pub const fn desc(&self) -> &'static GenDesc {
        self.generation.desc()
    }

    /// Checks `cmd` against this generation's limits and rules without
    /// writing anything. This is also what the decoder uses to flag rule
    /// violations in a stream.
    pub fn check(&self, cmd: &Command<'_>) -> Result<(), EncodeError> {
        check_in(self.desc(), cmd)
    }

    /// Where `cmd` would land if written at GPU address `va`: the padding
    /// the generation requires in front, and the packet size. Validates.
    pub fn placement(&self, cmd: &Command<'_>, va: u64) -> Result<CommandSpan, EncodeError> {
        placement_in(self.desc(), cmd, va)
    }

    /// NOP dwords needed before a `kind` packet at `va`.
    #[inline]
    pub fn pad_before(&self, kind: PacketKind, va: u64) -> usize {
        pad_before(self.desc(), kind, va)
    }

    /// The largest padding any packet can need.
    pub fn max_pad(&self) -> usize {
        (self.desc().rules.exec_align / 4).saturating_sub(1) as usize
    }

    /// Writes NOP padding over all of `out` (one NOP packet; nothing for an
    /// empty slice). Fails only if `out` exceeds the maximum NDW + 1.
    pub fn write_nops(&self, out: &mut [u32]) -> Result<(), EncodeError> {
        write_nops(self.desc(), out)
    }

    /// Encodes `cmd` into `out[pos..]`, where `out[0]` is at GPU address
    /// `base_va`, padding with NOPs first if the generation requires.
    /// Returns the dwords written. On error `out` is untouched.
    pub fn encode(
        &self,
        cmd: &Command<'_>,
        out: &mut [u32],
        pos: usize,
        base_va: u64,
    ) -> Result<usize, EncodeError> {
        per_gen!(self, encode_in(cmd, out, pos, base_va))
    }

    /// [`Encoder::encode`] of a FENCE (`Command::Fence { addr, value, irq }`).
    ///
    /// This and the other per-kind entry points (`encode_write_data`,
    /// `encode_copy`, `encode_fill`, `encode_indirect_buffer`) are for the
    /// packets a command buffer or the ring writes most: inlined into the caller, with the packet kind and the
    /// generation's description constants, so the same checks and stores
    /// as `encode` fold into straight code without `encode`'s call frame
    /// and dispatch on the command. Same bytes, same errors, `out`
    /// untouched on error.
    #[inline]
    pub fn encode_fence(
        &self,
        addr: u64,
        value: u64,
        irq: bool,
        out: &mut [u32],
        pos: usize,
        base_va: u64,
    ) -> Result<usize, EncodeError> {
        let cmd = Command::Fence { addr, value, irq };
        per_gen!(self, encode_kind(PacketKind::Fence, &cmd, out, pos, base_va))
    }

    /// [`Encoder::encode`] of an INDIRECT_BUFFER of `size_dw` dwords at
    /// `addr`: the packet every submission puts in its ring, which the
    /// ring's stage encodes without `encode`'s call and dispatch (see
    /// [`Encoder::encode_fence`]; same bytes, same errors).
    #[inline]
    pub fn encode_indirect_buffer(
        &self,
        addr: u64,
        size_dw: u32,
        out: &mut [u32],
        pos: usize,
        base_va: u64,
    ) -> Result<usize, EncodeError> {
        let cmd = Command::IndirectBuffer { addr, size_dw };
        per_gen!(self, encode_kind(PacketKind::IndirectBuffer, &cmd, out, pos, base_va))
    }

    /// [`Encoder::encode`] of a WRITE_DATA of `data` at `dst` (see
    /// [`Encoder::encode_fence`]).
    #[inline]
    pub fn encode_write_data(
        &self,
        dst: u64,
        data: &[u32],
        out: &mut [u32],
        pos: usize,
        base_va: u64,
    ) -> Result<usize, EncodeError> {
        let cmd = Command::write_data(dst, data);
        per_gen!(self, encode_kind(PacketKind::WriteData, &cmd, out, pos, base_va))
    }

    /// [`Encoder::encode`] of a DMA_COPY (`Command::Copy { src, dst, size }`;
    /// see [`Encoder::encode_fence`]).
    #[inline]
    pub fn encode_copy(
        &self,
        src: u64,
        dst: u64,
        size: u64,
        out: &mut [u32],
        pos: usize,
        base_va: u64,
    ) -> Result<usize, EncodeError> {
        let cmd = Command::Copy { src, dst, size };
        per_gen!(self, encode_kind(PacketKind::DmaCopy, &cmd, out, pos, base_va))
    }

    /// [`Encoder::encode`] of a FILL (`Command::Fill { dst, size, value }`;
    /// see [`Encoder::encode_fence`]).
    #[inline]
    pub fn encode_fill(
        &self,
        dst: u64,
        size: u64,
        value: u32,
        out: &mut [u32],
        pos: usize,
        base_va: u64,
    ) -> Result<usize, EncodeError> {
        let cmd = Command::Fill { dst, size, value };
        per_gen!(self, encode_kind(PacketKind::Fill, &cmd, out, pos, base_va))
    }
}

// Checks and placements are not on the per-packet hot path of encoding
// (the encoder validates as it writes), so they share one table walk for
// both generations, with description and kind read at run time: firmware
// links them, and specialising them too would cost ~5 KiB of Cortex-M code.
// `check` is `placement` at address 0 with the placement dropped (one copy
// of the walk in the image, ~1.4 KB of Cortex-M code less than two).
fn check_in(desc: &'static GenDesc, cmd: &Command<'_>) -> Result<(), EncodeError> {
    placement_in(desc, cmd, 0).map(|_| ())
}

#[inline(never)]
fn placement_in(desc: &'static GenDesc, cmd: &Command<'_>, va: u64) -> Result<CommandSpan, EncodeError> {
    Ok(prepare_dyn(desc, cmd.kind(), cmd)?.placement(desc, va))
}

/// `prepare` with description and kind read at run time: the one copy of
/// the validation walk shared by `placement_in` and, with
/// `compact-encoder` or `size-first`, `encode_dyn` (two inlined copies
/// cost ~1.4 KB of Cortex-M code).
#[inline(never)]
fn prepare_dyn<'c>(
    desc: &'static GenDesc,
    kind: PacketKind,
    cmd: &Command<'c>,
) -> Result<Prepared<'c>, EncodeError> {
    prepare(desc, kind, cmd)
}

#[cfg(not(any(feature = "compact-encoder", feature = "size-first")))]
fn encode_in<G: Gen>(
    cmd: &Command<'_>,
    out: &mut [u32],
    pos: usize,
    base_va: u64,
) -> Result<usize, EncodeError> {
    let desc = G::DESC;
    per_kind!(encode_one_folded(desc, cmd, out, pos, base_va))
}

/// [`encode_one`] with the walk specialised for `kind` (what `per_kind!`
/// calls in each arm).
#[cfg(not(any(feature = "compact-encoder", feature = "size-first")))]
#[inline(always)]
fn encode_one_folded(
    desc: &'static GenDesc,
    kind: PacketKind,
    cmd: &Command<'_>,
    out: &mut [u32],
    pos: usize,
    base_va: u64,
) -> Result<usize, EncodeError> {
    encode_one::<false>(desc, kind, cmd, out, pos, base_va)
}

/// A per-kind entry point's body: `cmd` is a `kind` command built by the
/// caller, so with `G`'s description a constant everything folds.
#[cfg(not(feature = "compact-encoder"))]
#[inline(always)]
fn encode_kind<G: Gen>(
    kind: PacketKind,
    cmd: &Command<'_>,
    out: &mut [u32],
    pos: usize,
    base_va: u64,
) -> Result<usize, EncodeError> {
    encode_one::<false>(G::DESC, kind, cmd, out, pos, base_va)
}

/// `compact-encoder`: the per-kind entry points share the one walk.
#[cfg(feature = "compact-encoder")]
#[inline(always)]
fn encode_kind<G: Gen>(
    _kind: PacketKind,
    cmd: &Command<'_>,
    out: &mut [u32],
    pos: usize,
    base_va: u64,
) -> Result<usize, EncodeError> {
    encode_dyn(G::DESC, cmd, out, pos, base_va)
}

/// `compact-encoder` and `size-first`: one table walk for every packet
/// of the general path (`encode`: the ring's WAIT_MEMs, `push` of a
/// command, CHAIN), with the packet kind read at run time (the folded
/// copies above cost ~4-5 KB of Cortex-M code per generation; this costs
/// the walk's time on every packet). With `size-first` alone the per-kind
/// entry points keep their folded code.
#[cfg(any(feature = "compact-encoder", feature = "size-first"))]
#[inline(always)]
fn encode_in<G: Gen>(
    cmd: &Command<'_>,
    out: &mut [u32],
    pos: usize,
    base_va: u64,
) -> Result<usize, EncodeError> {
    encode_dyn(G::DESC, cmd, out, pos, base_va)
}

/// The one copy of the general walk (`compact-encoder`, `size-first`),
/// shared by the generations.
#[cfg(any(feature = "compact-encoder", feature = "size-first"))]
#[inline(never)]
fn encode_dyn(
    desc: &'static GenDesc,
    cmd: &Command<'_>,
    out: &mut [u32],
    pos: usize,
    base_va: u64,
) -> Result<usize, EncodeError> {
    encode_one::<true>(desc, cmd.kind(), cmd, out, pos, base_va)
}

/// Validates `cmd` (a `kind` command) and writes it at `out[pos..]`:
/// with `SHARED` through `prepare_dyn`, the validation walk shared with
/// `placement_in` (the general walk), otherwise with the walk inlined
/// and specialised for `kind` (the folded encoder).
#[inline(always)]
fn encode_one<const SHARED: bool>(
    desc: &'static GenDesc,
    kind: PacketKind,
    cmd: &Command<'_>,
    out: &mut [u32],
    pos: usize,
    base_va: u64,
) -> Result<usize, EncodeError> {
    let va = base_va.wrapping_add((pos as u64).wrapping_mul(4));
    let prep = if SHARED { prepare_dyn(desc, kind, cmd)? } else { prepare(desc, kind, cmd)? };
    let place = prep.placement(desc, va);
    let total = place.total();
    // One length check for the whole packet (padding included); the
    // stores below index within `dst`.
    let full = EncodeError::BufferFull { needed: total, available: out.len().saturating_sub(pos) };
    let Some(dst) = out.get_mut(pos..).and_then(|o| o.get_mut(..total)) else {
        return Err(full);
    };
    let Some((pad, pkt)) = dst.split_at_mut_checked(place.pad) else {
        return Err(full);
    };
    if !pad.is_empty() {
        write_nops(desc, pad)?;
    }
    prep.write(desc, pkt);
    Ok(total)
}

/// The description of `kind`.
#[inline(always)]
fn packet(desc: &'static GenDesc, kind: PacketKind) -> Result<&'static PacketDesc, EncodeError> {
    // Tables are in `PacketKind::ALL` order (checked by a test), so the
    // kind indexes its entry; the comparison guards a malformed table.
    match desc.packets.get(kind as usize) {
        Some(p) if p.kind == kind => Ok(p),
        _ => desc.packet(kind).ok_or(EncodeError::Unsupported { kind }),
    }
}

/// Validates `cmd` (a `kind` command) once and gathers what writing it needs.
#[inline(always)]
fn prepare<'c>(
    desc: &'static GenDesc,
    kind: PacketKind,
    cmd: &Command<'c>,
) -> Result<Prepared<'c>, EncodeError> {
    let p = packet(desc, kind)?;
    let tail = cmd.tail();
    let ndw = ndw(desc, p, cmd, tail)?;
    check_rules(desc, p, cmd)?;
    let va_limit = desc.va_limit();
    // Each operand is read from the command once, here, while the arm's
    // command variant is still known; `write` stores these values (reading
    // the command again there re-dispatched on its variant per field).
    let mut values = [0u64; MAX_FIELDS];
    for (fd, slot) in p.fields.iter().zip(values.iter_mut()) {
        let value = cmd.field(fd.field);
        *slot = value;
        if fd.field.is_address() && value >= va_limit {
            return Err(EncodeError::AddressOutOfRange {
                kind: p.kind,
                field: fd.field,
                addr: value,
                va_bits: desc.limits.va_bits,
            });
        }
        if value > fd.loc.max() {
            return Err(EncodeError::LimitExceeded {
                kind: p.kind,
                field: fd.field,
                value,
                max: fd.loc.max(),
            });
        }
    }
    Ok(Prepared { p, values, tail, ndw })
}

/// Payload dwords of `cmd` in this generation, after validating it.
#[inline(always)]
fn ndw(
    desc: &'static GenDesc,
    p: &PacketDesc,
    cmd: &Command<'_>,
    tail: Option<Payload<'_>>,
) -> Result<u32, EncodeError> {
    let kind = p.kind;
    let too_large = |ndw: u64| EncodeError::PayloadTooLarge { kind, ndw, max: desc.limits.max_ndw };
    let ndw: u64 = match (p.ndw, cmd) {
        (Ndw::Fixed(n), _) => n.into(),
        (Ndw::Tail { min, .. }, Command::Nop { dwords }) => u64::from(min).saturating_add((*dwords).into()),
        (Ndw::Tail { min, min_tail }, _) => {
            let t = tail.map_or(0, |t| t.len()) as u64;
            if t < min_tail.into() {
                return Err(EncodeError::ZeroSize { kind });
            }
            u64::from(min).saturating_add(t)
        }
    };
    if ndw > desc.limits.max_ndw.into() {
        return Err(too_large(ndw));
    }
    u32::try_from(ndw).map_err(|_| too_large(ndw))
}

/// Packet-specific rules, with every number taken from the description.
#[inline(always)]
fn check_rules(desc: &'static GenDesc, p: &PacketDesc, cmd: &Command<'_>) -> Result<(), EncodeError> {
    let kind = p.kind;
    let lim = &desc.limits;
    let rules = &desc.rules;
    let align = |field: Field, value: u64, align: u64| {
        if align > 1 && misalignment(value, align) != 0 {
            Err(EncodeError::Misaligned { kind, field, value, align })
        } else {
            Ok(())
        }
    };
    // 1..=max in one compare (0 wraps to u64::MAX).
    let range = |field: Field, value: u64, max: u64| {
        if value.wrapping_sub(1) < max {
            Ok(())
        } else if value == 0 {
            Err(EncodeError::ZeroSize { kind })
        } else {
            Err(EncodeError::LimitExceeded { kind, field, value, max })
        }
    };
    match *cmd {
        Command::Nop { .. } | Command::Barrier { .. } => Ok(()),
        Command::WriteData { dst, .. } => align(Field::Dst, dst, 4),
        Command::Copy { size, .. } => range(Field::Size, size, lim.max_copy_bytes),
        Command::Fill { dst, size, .. } => {
            range(Field::Size, size, lim.max_fill_bytes)?;
            // Both 4-byte alignments in one test on the common path.
            if misalignment(size | dst, 4) == 0 {
                return Ok(());
            }
            align(Field::Size, size, 4)?;
            align(Field::Dst, dst, 4)
        }
        Command::Fence { addr, .. } => {
            if misalignment(addr, rules.fence_align) != 0 {
                Err(EncodeError::MisalignedFence {
                    addr,
                    align: rules.fence_align,
                    device: rules.misaligned_fence,
                })
            } else {
                Ok(())
            }
        }
        Command::WaitMem { addr, reference, mask, wide, .. } => {
            if !wide && reference >> 32 != 0 {
                return Err(EncodeError::InvalidOperand { kind, field: Field::Ref });
            }
            if !wide && mask >> 32 != 0 {
                return Err(EncodeError::InvalidOperand { kind, field: Field::Mask });
            }
            align(Field::Addr, addr, if wide { 8 } else { 4 })
        }
        Command::Timestamp { addr } => align(Field::Addr, addr, 8),
        Command::IndirectBuffer { addr, size_dw } | Command::Chain { addr, size_dw } => {
            range(Field::Size, size_dw.into(), lim.max_ib_dwords.into())?;
            align(Field::Addr, addr, rules.ib_align)
        }
        Command::Dispatch { a, b, dst, count, .. } => {
            range(Field::Count, count.into(), lim.max_dispatch_count)?;
            align(Field::A, a, 4)?;
            align(Field::B, b, 4)?;
            align(Field::Dst, dst, 4)
        }
    }
}

/// NOP dwords needed before a `kind` packet at `va`.
#[inline(always)]
fn pad_before(desc: &GenDesc, kind: PacketKind, va: u64) -> usize {
    let align = desc.rules.exec_align;
    if !kind.needs_exec_alignment() || align <= 4 {
        return 0;
    }
    let misalign = misalignment(va, align);
    if misalign == 0 {
        0
    } else {
        (align.saturating_sub(misalign) / 4) as usize
    }
}

/// One NOP packet over all of `out`. Inlined so that the encoder's padding
/// folds with its generation's description constant.
#[inline(always)]
fn write_nops(desc: &'static GenDesc, out: &mut [u32]) -> Result<(), EncodeError> {
    let Some((head, payload)) = out.split_first_mut() else {
        return Ok(());
    };
    let ndw = payload.len();
    if ndw > desc.limits.max_ndw as usize {
        return Err(EncodeError::PayloadTooLarge {
            kind: PacketKind::Nop,
            ndw: ndw as u64,
            max: desc.limits.max_ndw,
        });
    }
    let nop = packet(desc, PacketKind::Nop)?;
    *head = desc.header.encode(nop.opcode, 0, ndw as u32);
    payload.fill(0);
    Ok(())
}

/// The most operands a packet description lists (checked for every
/// generation at compile time below).
const MAX_FIELDS: usize = 8;

/// Whether every packet of `desc` lists at most [`MAX_FIELDS`] operands.
const fn fields_fit(desc: &GenDesc) -> bool {
    let mut rest: &[PacketDesc] = &desc.packets;
    while let [p, tail @ ..] = rest {
        if p.fields.len() > MAX_FIELDS {
            return false;
        }
        rest = tail;
    }
    true
}
#[cfg(feature = "gen1")]
const _: () = assert!(fields_fit(&crate::hw::gen1::DESC));
#[cfg(feature = "gen2")]
const _: () = assert!(fields_fit(&crate::hw::gen2::DESC));

/// A validated command, ready to be written.
struct Prepared<'c> {
    p: &'static PacketDesc,
    /// The operands, in the order of `p.fields`.
    values: [u64; MAX_FIELDS],
    tail: Option<Payload<'c>>,
    ndw: u32,
}

impl Prepared<'_> {
    #[inline(always)]
    fn placement(&self, desc: &GenDesc, va: u64) -> CommandSpan {
        CommandSpan {
            pad: pad_before(desc, self.p.kind, va),
            packet: GenDesc::packet_dwords(self.ndw) as usize,
        }
    }

    /// Writes the packet into `pkt`, which is exactly its size.
    #[inline(always)]
    fn write(&self, desc: &GenDesc, pkt: &mut [u32]) {
        let Some((head, payload)) = pkt.split_first_mut() else {
            return;
        };
        // Zero only the fixed operands; the tail is overwritten whole.
        let fixed = usize::from(self.p.fixed_ndw());
        if let Some(f) = payload.get_mut(..fixed) {
            f.iter_mut().for_each(|d| *d = 0);
        }
        let mut flags = 0u32;
        for (fd, &v) in self.p.fields.iter().zip(self.values.iter()) {
            match fd.loc {
                Loc::Flags(bits) => flags = bits.put(flags, v as u32),
                Loc::Payload { dw, bits } => {
                    if let Some(d) = payload.get_mut(usize::from(dw)) {
                        *d = bits.put(*d, v as u32);
                    }
                }
                Loc::Wide(n) => {
                    let n = usize::from(n);
                    if let Some([lo, hi]) = payload.get_mut(n..n.saturating_add(2)) {
                        *lo = v as u32;
                        *hi = (v >> 32) as u32;
                    }
                }
            }
        }
        match self.tail {
            Some(tail) => {
                if let Some(t) = payload.get_mut(fixed..) {
                    tail.copy_to(t);
                }
            }
            // A NOP's payload is padding: zero it.
            None => {
                if let Some(t) = payload.get_mut(fixed..) {
                    t.fill(0);
                }
            }
        }
        *head = desc.header.encode(self.p.opcode, flags, self.ndw);
    }
}
