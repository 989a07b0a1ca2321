//! The validation mode: every packet of a submission checked against the
//! device's buffers before the GPU sees it (the article's section 5.3: a
//! DMA size that disagrees with the buffer's real size runs past the
//! allocation, faults, and becomes a hang).
//!
//! Compiled in with the `validation` feature and switched on at run time
//! ([`Engine::set_validation`](super::Engine::set_validation)); without the feature no checking code
//! exists and a submission costs what it always did. The error types are
//! always present, so code that matches on [`SubmitError`] builds either
//! way.
//!
//! What is checked, for every memory operand of every packet (WRITE_DATA,
//! DMA_COPY, FILL, FENCE, WAIT_MEM, TIMESTAMP, DISPATCH, INDIRECT_BUFFER),
//! following CHAINs through the IB pool:
//!
//! - the range `[addr, addr + len)` does not wrap past the top of the
//!   generation's address space;
//! - it lies inside one buffer of the device, whole; a range that starts in
//!   a buffer and runs past its requested size is an overrun (by how many
//!   bytes), one in no buffer is outside (the nearest buffer is named);
//! - the buffer is live, not freed;
//! - a write does not target a GPU read-only buffer;
//! - a buffer with declared tracking is declared by the submission, and a
//!   write targets one declared for writing (otherwise its free would not
//!   wait for this work).
//!
//! A refused submission is not executed; the error names the packet (its
//! index in the IB, counting across chained chunks), the field, the
//! address, the buffer and the problem.

use core::fmt;

use crate::hw::{Field, PacketKind};
use crate::queue::SubmitError;

/// A buffer as a validation error names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferRef {
    /// Its tag.
    pub tag: &'static str,
    /// Its GPU address.
    pub va: u64,
    /// Its requested size.
    pub size: u64,
}

impl fmt::Display for BufferRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "buffer '{}' ({} bytes at {:#x})", self.tag, self.size, self.va)
    }
}

/// What is wrong with an operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Problem {
    /// `addr + len` wraps around the address space.
    Wraps,
    /// Starts inside `buffer` and runs past its end
    /// ([`ValidationError::overrun`] says by how much).
    Overrun {
        /// The buffer.
        buffer: BufferRef,
    },
    /// In no buffer of the device (`nearest`: the closest one, if any).
    Outside {
        /// The closest buffer.
        nearest: Option<BufferRef>,
    },
    /// Inside a buffer that was freed.
    Freed {
        /// The freed buffer.
        buffer: BufferRef,
    },
    /// A write to a GPU read-only buffer.
    ReadOnly {
        /// The buffer.
        buffer: BufferRef,
    },
    /// A buffer with declared tracking that the submission does not
    /// declare (or declares only for reading, and the packet writes it).
    Undeclared {
        /// The buffer.
        buffer: BufferRef,
        /// The packet writes it.
        write: bool,
    },
    /// The recorded stream does not decode (a driver bug).
    Undecodable,
}

/// Why the validation mode refused a submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValidationError {
    /// Index of the packet among the submission's commands, as recorded
    /// (across chained chunks; NOPs, such as alignment padding, are not
    /// counted).
    pub packet: u32,
    /// The packet (`PacketKind::name` gives the specification's name).
    pub opcode: PacketKind,
    /// The operand's field (`SRC`, `DST`, `ADDR`, `A`, `B`).
    pub field: Field,
    /// The operand's address.
    pub addr: u64,
    /// The operand's length in bytes.
    pub len: u64,
    /// What is wrong.
    pub problem: Problem,
}

impl ValidationError {
    /// For an overrun, how many bytes past the buffer's end the operand
    /// reaches (0 otherwise).
    pub fn overrun(&self) -> u64 {
        match self.problem {
            Problem::Overrun { buffer } => {
                self.addr.saturating_add(self.len).saturating_sub(buffer.va.saturating_add(buffer.size))
            }
            _ => 0,
        }
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "packet {} ({}) {} [{:#x}, +{}): ",
            self.packet,
            self.opcode.name(),
            self.field.name(),
            self.addr,
            self.len
        )?;
        match self.problem {
            Problem::Wraps => write!(f, "the range wraps around the address space"),
            Problem::Overrun { buffer } => {
                write!(f, "runs {} bytes past the end of {buffer}", self.overrun())
            }
            Problem::Outside { nearest: Some(b) } => write!(f, "in no buffer (nearest: {b})"),
            Problem::Outside { nearest: None } => write!(f, "in no buffer"),
            Problem::Freed { buffer } => write!(f, "inside freed {buffer}"),
            Problem::ReadOnly { buffer } => write!(f, "writes GPU read-only {buffer}"),
            Problem::Undeclared { buffer, write: false } => {
                write!(f, "uses {buffer}, which has declared tracking, without declaring it")
            }
            Problem::Undeclared { buffer, write: true } => {
                write!(f, "writes {buffer}, which the submission does not declare for writing")
            }
            Problem::Undecodable => write!(f, "the recorded stream does not decode"),
        }
    }
}

impl core::error::Error for ValidationError {}

/// The validation mode is not compiled into this build (the `validation`
/// feature of `umd-core`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValidationUnavailable;

impl fmt::Display for ValidationUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "umd-core was built without the validation feature")
    }
}

impl core::error::Error for ValidationUnavailable {}

impl From<ValidationError> for SubmitError {
    fn from(e: ValidationError) -> SubmitError {
        SubmitError::Invalid(e)
    }
}

impl<'d, B: super::Backend, const CHUNKS: usize> super::Engine<'d, B, CHUNKS> {
    /// Switches the validation mode on or off (off by default). Without
    /// the `validation` feature, switching it on is refused.
    pub fn set_validation(&self, on: bool) -> Result<(), ValidationUnavailable> {
        #[cfg(feature = "validation")]
        {
            self.validating.store(on, crate::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
        #[cfg(not(feature = "validation"))]
        {
            if on {
                Err(ValidationUnavailable)
            } else {
                Ok(())
            }
        }
    }

    /// Whether submissions are validated.
    pub fn validation(&self) -> bool {
        #[cfg(feature = "validation")]
        {
            self.validating.load(crate::sync::atomic::Ordering::Relaxed)
        }
        #[cfg(not(feature = "validation"))]
        {
            false
        }
    }
}

#[cfg(feature = "validation")]
mod check {
    use super::{BufferRef, Problem, ValidationError};
    use crate::cmd::{Command, DispatchOp};
    use crate::decode::Decoder;
    use crate::engine::buffers::{BufferAccess, BufferUse};
    use crate::engine::{Backend, Engine};
    use crate::hw::{Field, PacketKind};
    use crate::mem::buffer::{BufferInfo, Tracking};
    use crate::mem::manager::Buffers;

    /// One memory operand of a packet.
    #[derive(Clone, Copy)]
    struct Operand {
        field: Field,
        addr: u64,
        len: u64,
        write: bool,
    }

    const fn op(field: Field, addr: u64, len: u64, write: bool) -> Option<Operand> {
        Some(Operand { field, addr, len, write })
    }

    /// The memory a command reads and writes (`docs/refgpu.md` section 6).
    fn operands(c: &Command<'_>) -> [Option<Operand>; 3] {
        match *c {
            Command::WriteData { dst, data } => {
                [op(Field::Dst, dst, (data.len() as u64).saturating_mul(4), true), None, None]
            }
            Command::Copy { src, dst, size } => {
                [op(Field::Src, src, size, false), op(Field::Dst, dst, size, true), None]
            }
            Command::Fill { dst, size, .. } => [op(Field::Dst, dst, size, true), None, None],
            Command::Fence { addr, .. } => [op(Field::Addr, addr, 8, true), None, None],
            Command::WaitMem { addr, wide, .. } => {
                [op(Field::Addr, addr, if wide { 8 } else { 4 }, false), None, None]
            }
            Command::Timestamp { addr } => [op(Field::Addr, addr, 8, true), None, None],
            Command::IndirectBuffer { addr, size_dw } => {
                [op(Field::Addr, addr, u64::from(size_dw).saturating_mul(4), false), None, None]
            }
            Command::Dispatch { op: o, a, b, dst, count, .. } => {
                let n = u64::from(count).saturating_mul(4);
                let b = match o {
                    DispatchOp::AddU32 | DispatchOp::MulU32 | DispatchOp::SaxpyF32 => {
                        op(Field::B, b, n, false)
                    }
                };
                [op(Field::A, a, n, false), b, op(Field::Dst, dst, n, true)]
            }
            Command::Nop { .. } | Command::Chain { .. } | Command::Barrier { .. } => [None, None, None],
        }
    }

    fn buffer_ref(i: &BufferInfo) -> BufferRef {
        BufferRef { tag: i.tag, va: i.va, size: i.size }
    }

    impl<'d, B: Backend, const CHUNKS: usize> Engine<'d, B, CHUNKS> {
        /// Checks every packet of the IB at `ib` (in the IB pool), following
        /// CHAINs, against the device's buffers and `declared`.
        pub(crate) fn validate_ib(
            &self,
            ib: (u64, u32),
            declared: &[BufferUse],
        ) -> Result<(), ValidationError> {
            let gen = self.enc.desc().generation;
            let (pool_va, pool_len) = self.ib.range();
            let bytes = self.ib.region().bytes();
            // One lock for the whole walk: buffers can not change under it.
            let mem = self.mem.lock();
            let mut next = Some(ib);
            let mut index = 0u32;
            // Each chunk is visited once; a CHAIN loop would be a recorder bug.
            let mut hops = 0usize;
            while let Some((va, dw)) = next.take() {
                hops = hops.saturating_add(1);
                let undecodable = ValidationError {
                    packet: index,
                    opcode: PacketKind::Chain,
                    field: Field::Addr,
                    addr: va,
                    len: u64::from(dw).saturating_mul(4),
                    problem: Problem::Undecodable,
                };
                let off =
                    va.checked_sub(pool_va).filter(|o| *o < pool_len as u64).ok_or(undecodable)? as usize;
                let end = off.saturating_add((dw as usize).saturating_mul(4));
                let seg =
                    bytes.get(off..end).filter(|_| hops <= CHUNKS.saturating_add(1)).ok_or(undecodable)?;
                for item in Decoder::new(gen, seg, va) {
                    let p = item.result.map_err(|_| ValidationError { packet: index, ..undecodable })?;
                    if let Command::Chain { addr, size_dw } = p.command {
                        next = Some((addr, size_dw));
                        continue;
                    }
                    if let Command::Nop { .. } = p.command {
                        // Padding the encoder inserted is not counted.
                        continue;
                    }
                    {
                        for o in operands(&p.command).into_iter().flatten() {
                            self.check_operand(&mem.buffers, o, declared).map_err(|problem| {
                                ValidationError {
                                    packet: index,
                                    opcode: p.desc.kind,
                                    field: o.field,
                                    addr: o.addr,
                                    len: o.len,
                                    problem,
                                }
                            })?;
                        }
                    }
                    index = index.saturating_add(1);
                }
            }
            Ok(())
        }

        /// Checks one read of `len` bytes at `addr` (an IB the caller built).
        pub(crate) fn validate_operand(
            &self,
            opcode: PacketKind,
            field: Field,
            addr: u64,
            len: u64,
            declared: &[BufferUse],
        ) -> Result<(), ValidationError> {
            let o = Operand { field, addr, len, write: false };
            self.check_operand(&self.mem.lock().buffers, o, declared).map_err(|problem| ValidationError {
                packet: 0,
                opcode,
                field,
                addr,
                len,
                problem,
            })
        }

        fn check_operand(
            &self,
            buffers: &Buffers<'_, crate::engine::buffers::Backed>,
            o: Operand,
            declared: &[BufferUse],
        ) -> Result<(), Problem> {
            if o.len == 0 {
                return Ok(());
            }
            // The device's addresses have the generation's width: a range
            // that runs past the top wraps to address 0.
            let top = self.enc.desc().va_limit();
            let end = o.addr.checked_add(o.len).filter(|e| *e <= top).ok_or(Problem::Wraps)?;
            let found = buffers.nearest(o.addr);
            let Some((info, handle)) =
                found.filter(|(i, _)| o.addr >= i.va && o.addr < i.va.saturating_add(i.size))
            else {
                return Err(Problem::Outside { nearest: found.map(|(i, _)| buffer_ref(&i)) });
            };
            let buffer = buffer_ref(&info);
            let Some(handle) = handle else { return Err(Problem::Freed { buffer }) };
            let buf_end = info.va.saturating_add(info.size);
            if end > buf_end {
                return Err(Problem::Overrun { buffer });
            }
            if o.write && info.kind.gpu_read_only {
                return Err(Problem::ReadOnly { buffer });
            }
            if info.tracking == Tracking::Declared {
                let decl = declared.iter().find(|u| u.buffer == handle);
                match decl {
                    None => return Err(Problem::Undeclared { buffer, write: o.write }),
                    Some(u) if o.write && u.access == BufferAccess::Read => {
                        return Err(Problem::Undeclared { buffer, write: true })
                    }
                    Some(_) => {}
                }
            }
            Ok(())
        }
    }
}
