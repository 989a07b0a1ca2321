//! Why the validation mode refused a submission
//! ([`SubmitError::Invalid`]): the packet, the
//! operand and what is wrong with it. The checks themselves are the
//! engine's ([`crate::engine::validate`]); these types are always present,
//! so code that matches on them builds with or without the `validation`
//! feature.

use core::fmt;

use crate::decode::Violation;
use crate::hw::{Field, PacketKind};
use crate::sync::QueueId;

use super::SubmitError;

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
    /// The stream does not decode (for a recorded IB a driver bug; for one
    /// the caller built, bytes the GPU would stop on with INVALID_PACKET).
    Undecodable,
    /// A packet of a caller-built IB the GPU would stop on with
    /// INVALID_PACKET: it breaks a rule of the generation (`violation`),
    /// or it is an INDIRECT_BUFFER, which only the ring may hold
    /// (`violation` `None`).
    InvalidPacket {
        /// The rule it breaks.
        violation: Option<Violation>,
    },
    /// A packet the queue's engine does not execute (`docs/refgpu.md`
    /// sections 1 and 4.4: DISPATCH runs on the COMPUTE engine only); the
    /// engine would stop on it with INVALID_PACKET. The error's field is
    /// `OP`, its address and length the packet's own.
    WrongEngine {
        /// The queue the packet was submitted to.
        queue: QueueId,
    },
    /// A caller-built IB (or a CHAIN target) lies in a buffer the CPU can
    /// not read (device-only): its packets can not be validated, so it is
    /// refused.
    Unreadable {
        /// The buffer.
        buffer: BufferRef,
    },
    /// A caller-built IB (or a CHAIN target) lies in a buffer mapped for
    /// the CPU: the guard's writes are not visible to the GPU yet, so what
    /// the GPU would run can not be validated, and it is refused.
    Mapped {
        /// The buffer.
        buffer: BufferRef,
    },
    /// A CHAIN of a caller-built IB names an IB already walked: the GPU
    /// would run the loop forever.
    ChainLoop,
    /// A caller-built IB chains more than [`MAX_CHAIN_HOPS`] IBs: the walk
    /// stops there and the submission is refused.
    ChainTooLong,
}

/// Most IBs a caller-built IB and its CHAINs may hold in validation mode
/// (the first IB included); bounds the walk whatever the IBs hold.
pub const MAX_CHAIN_HOPS: usize = 64;

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
            Problem::Undecodable => write!(f, "the stream does not decode"),
            Problem::InvalidPacket { violation: Some(v) } => {
                write!(f, "the GPU would stop on it with INVALID_PACKET: {v}")
            }
            Problem::InvalidPacket { violation: None } => {
                write!(f, "INDIRECT_BUFFER is allowed only in the ring, not in an IB")
            }
            Problem::WrongEngine { queue } => write!(
                f,
                "{} is not executed by queue {queue}'s engine (the GPU would stop on it with INVALID_PACKET; DISPATCH runs on the COMPUTE queue only)",
                self.opcode.name()
            ),
            Problem::Unreadable { buffer } => {
                write!(f, "the IB lies in {buffer}, which the CPU can not read: it can not be validated")
            }
            Problem::Mapped { buffer } => write!(
                f,
                "the IB lies in {buffer}, which is mapped for the CPU: it can not be validated (the guard's writes are not visible to the GPU yet)"
            ),
            Problem::ChainLoop => write!(f, "CHAIN to an IB already walked: the GPU would loop forever"),
            Problem::ChainTooLong => write!(f, "more than {MAX_CHAIN_HOPS} chained IBs: not validated"),
        }
    }
}

impl core::error::Error for ValidationError {}

impl From<ValidationError> for SubmitError {
    fn from(e: ValidationError) -> SubmitError {
        SubmitError::Invalid(e)
    }
}
