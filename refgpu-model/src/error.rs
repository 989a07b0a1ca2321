//! Typed errors: device faults (what the guest sees in FAULT_STATUS) and
//! host-side errors (bad model configuration, host accesses outside memory).

use core::fmt;

/// Fault KIND values of FAULT_STATUS (`docs/refgpu.md` section 2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum FaultKind {
    /// No valid mapping (or a VA with bits 63:48 set).
    Translation = 1,
    /// The leaf does not grant the access.
    Permission = 2,
    /// A header or operand the engine cannot execute (section 4.4).
    InvalidPacket = 3,
    /// A page-table entry with a reserved encoding.
    BadPte = 4,
    /// A physical address outside system memory.
    Bus = 5,
}

impl FaultKind {
    /// Decodes a KIND field value.
    pub fn from_bits(v: u32) -> Option<Self> {
        Some(match v {
            1 => Self::Translation,
            2 => Self::Permission,
            3 => Self::InvalidPacket,
            4 => Self::BadPte,
            5 => Self::Bus,
            _ => return None,
        })
    }
}

/// ACCESS values of FAULT_STATUS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Access {
    /// Operand read (needs READ).
    Read = 0,
    /// Operand write (needs WRITE).
    Write = 1,
    /// Command fetch (needs READ).
    Fetch = 2,
}

impl Access {
    /// Decodes an ACCESS field value.
    pub fn from_bits(v: u32) -> Option<Self> {
        Some(match v {
            0 => Self::Read,
            1 => Self::Write,
            2 => Self::Fetch,
            _ => return None,
        })
    }
}

/// A fault as latched in an engine's FAULT registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// What went wrong.
    pub kind: FaultKind,
    /// Which kind of access.
    pub access: Access,
    /// Faulting GPU address (FAULT_ADDR).
    pub addr: u64,
    /// OPCODE field of the packet that faulted, 0 if the header was not read.
    pub opcode: u8,
}

impl Fault {
    /// Bit 31 of FAULT_STATUS.
    pub const VALID: u32 = 1 << 31;

    /// The FAULT_STATUS register value for this fault.
    pub fn status_bits(&self) -> u32 {
        Self::VALID | (self.kind as u32) | ((self.access as u32) << 4) | (u32::from(self.opcode) << 8)
    }

    /// Decodes FAULT_STATUS and FAULT_ADDR; `None` when VALID is clear or a
    /// field holds a value the spec does not define.
    pub fn from_regs(status: u32, addr: u64) -> Option<Self> {
        if status & Self::VALID == 0 {
            return None;
        }
        Some(Self {
            kind: FaultKind::from_bits(status & 0xF)?,
            access: Access::from_bits((status >> 4) & 0x3)?,
            addr,
            opcode: ((status >> 8) & 0xFF) as u8,
        })
    }

    /// An INVALID_PACKET fault at a packet header.
    pub(crate) fn invalid(header_addr: u64, opcode: u8) -> Self {
        Self { kind: FaultKind::InvalidPacket, access: Access::Fetch, addr: header_addr, opcode }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} fault ({:?}) at {:#x}, opcode {:#04x}",
            self.kind, self.access, self.addr, self.opcode
        )
    }
}

/// Errors of the host-side API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelError {
    /// The configuration can not be modelled; the text says why.
    Config(&'static str),
    /// A host memory access outside `[mem_base, mem_base + mem_size)`.
    OutOfRange {
        /// First byte of the access.
        addr: u64,
        /// Its length in bytes.
        len: u64,
    },
    /// A host memory access with an address not aligned to its size.
    Misaligned {
        /// The address.
        addr: u64,
    },
    /// An engine did not acknowledge a reset (its thread is gone).
    EngineGone(usize),
    /// A thread of the model could not be started.
    Spawn,
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(why) => write!(f, "invalid model configuration: {why}"),
            Self::OutOfRange { addr, len } => {
                write!(f, "host access of {len} bytes at {addr:#x} is outside system memory")
            }
            Self::Misaligned { addr } => write!(f, "misaligned host access at {addr:#x}"),
            Self::EngineGone(e) => write!(f, "engine {e} thread is not running"),
            Self::Spawn => write!(f, "could not spawn a model thread"),
        }
    }
}

impl std::error::Error for ModelError {}
