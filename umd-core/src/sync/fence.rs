//! Fences as the user holds them, and what a fence can end as.

use core::fmt;

use super::seqno::{FenceId, QueueId, Seqno};

/// A submission's fence: a point on a queue's timeline, stamped with the
/// queue's reset epoch so a fence from before a reset is recognised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fence {
    /// The timeline point.
    pub id: FenceId,
    /// The queue's reset count when the fence was emitted.
    pub epoch: u32,
}

impl Fence {
    /// The queue it belongs to.
    pub fn queue(&self) -> QueueId {
        self.id.queue
    }

    /// Its value on the queue's timeline.
    pub fn seqno(&self) -> Seqno {
        self.id.seqno
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@e{}", self.id, self.epoch)
    }
}

/// How an engine fault was reported (`docs/refgpu.md` section 2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultInfo {
    /// FAULT_STATUS KIND (1 translation, 2 permission, 3 invalid packet,
    /// 4 bad PTE, 5 bus).
    pub kind: FaultKind,
    /// FAULT_STATUS ACCESS.
    pub access: Access,
    /// The faulting GPU address.
    pub addr: u64,
    /// Opcode of the packet that faulted (0 if unknown).
    pub opcode: u8,
}

/// Fault kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// No valid mapping.
    Translation,
    /// Access not allowed by the page's bits.
    Permission,
    /// A packet the engine can not execute.
    InvalidPacket,
    /// A page-table entry with a reserved encoding.
    BadPte,
    /// Physical address outside system memory.
    Bus,
    /// A KIND value the spec does not define.
    Unknown(u8),
}

/// Access kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Data read.
    Read,
    /// Data write.
    Write,
    /// Command fetch.
    Fetch,
    /// An ACCESS value the spec does not define.
    Unknown(u8),
}

impl FaultKind {
    /// A short name, for logs.
    pub const fn name(self) -> &'static str {
        match self {
            FaultKind::Translation => "translation",
            FaultKind::Permission => "permission",
            FaultKind::InvalidPacket => "invalid packet",
            FaultKind::BadPte => "bad PTE",
            FaultKind::Bus => "bus",
            FaultKind::Unknown(_) => "unknown",
        }
    }
}

impl Access {
    /// A short name, for logs.
    pub const fn name(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
            Access::Fetch => "fetch",
            Access::Unknown(_) => "unknown",
        }
    }
}

impl FaultInfo {
    /// Decodes FAULT_STATUS and FAULT_ADDR; None when VALID is clear.
    pub fn from_regs(status: u32, addr: u64) -> Option<FaultInfo> {
        let status = crate::hw::regs::FaultStatus(status);
        if !status.valid() {
            return None;
        }
        let kind = match status.kind() {
            1 => FaultKind::Translation,
            2 => FaultKind::Permission,
            3 => FaultKind::InvalidPacket,
            4 => FaultKind::BadPte,
            5 => FaultKind::Bus,
            k => FaultKind::Unknown(k),
        };
        let access = match status.access() {
            0 => Access::Read,
            1 => Access::Write,
            2 => Access::Fetch,
            a => Access::Unknown(a),
        };
        Some(FaultInfo { kind, access, addr, opcode: status.opcode() })
    }
}

impl fmt::Display for FaultInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} fault on {:?} at {:#x} (opcode {:#04x})",
            self.kind, self.access, self.addr, self.opcode
        )
    }
}

/// Why a fence completed without its work being done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceError {
    /// The queue hung (no progress) and was reset.
    DeviceHung,
    /// The queue stopped on a fault and was reset.
    Fault(FaultInfo),
    /// The device went away.
    DeviceLost,
}

impl fmt::Display for FenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FenceError::DeviceHung => write!(f, "queue hung and was reset"),
            FenceError::Fault(i) => write!(f, "queue faulted and was reset: {i}"),
            FenceError::DeviceLost => write!(f, "device lost"),
        }
    }
}

/// A range of fences a reset completed with an error: `(from, to]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErroredRange {
    /// Completed value before the reset (not errored).
    pub after: Seqno,
    /// Last value emitted before the reset (errored).
    pub upto: Seqno,
    /// Why.
    pub error: FenceError,
    /// The epoch the reset ended.
    pub epoch: u32,
}

impl ErroredRange {
    /// Whether `s` lies in this range.
    pub fn contains(&self, s: Seqno) -> bool {
        s.is_after(self.after) && s.is_signalled_by(self.upto)
    }
}
