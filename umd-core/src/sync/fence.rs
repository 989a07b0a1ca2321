//! Fences as the user holds them, and what a fence can end as.

use core::fmt;

use super::seqno::{FenceId, QueueId, Seqno};

/// Which device a fence or buffer handle belongs to: a per-device number
/// checked on every use, so a handle of one device is refused by another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct DeviceId(pub u32);

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dev{}", self.0)
    }
}

/// A submission's fence: a point on a queue's timeline of one device.
/// Sequence numbers are never reused, so a fence names one submission for
/// as long as anyone holds it; its outcome is kept by the device
/// (`crate::sync::history`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fence {
    /// The timeline point.
    pub id: FenceId,
    /// The device it belongs to.
    pub device: DeviceId,
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

    /// The fence `n` submissions later on the same queue (for a wait
    /// before signal: a submission may wait on a fence not emitted yet).
    pub fn later(&self, n: u64) -> Fence {
        Fence {
            id: FenceId { queue: self.id.queue, seqno: Seqno(self.id.seqno.0.wrapping_add(n)) },
            device: self.device,
        }
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.id, self.device)
    }
}

/// How an engine fault was reported (`docs/refgpu.md` section 2.2).
///
/// Its `Debug` shows the address and the opcode in hex, as the hang
/// report, the devcoredump and `docs/refgpu.md` write them.
#[derive(Clone, Copy, PartialEq, Eq)]
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

impl fmt::Debug for FaultInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "FaultInfo {{ kind: {:?}, access: {:?}, addr: {:#x}, opcode: {:#04x} }}",
            self.kind, self.access, self.addr, self.opcode
        )
    }
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
#[non_exhaustive]
pub enum FenceError {
    /// The queue hung (no progress) and was reset.
    DeviceHung,
    /// The queue stopped on a fault and was reset.
    Fault(FaultInfo),
    /// The device went away.
    DeviceLost,
    /// The queue waited for a fence of another queue that was not
    /// submitted within the wait-before-signal limit
    /// ([`crate::config::HangConfig::unsubmitted_wait_ns`]), and was reset.
    NeverSignalled {
        /// The fence it waited for.
        producer: FenceId,
    },
    /// The work waited on a fence that failed (directly or through other
    /// work): it may have run on input that never arrived, so its result
    /// is not trusted (dma-fence error propagation).
    Dependency {
        /// The first failed fence in the chain.
        producer: FenceId,
        /// Why that fence failed.
        cause: Cause,
    },
}

/// The root cause of a failure, carried along dependency chains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// A hang and reset.
    Hung,
    /// A fault and reset.
    Fault(FaultInfo),
    /// Device loss.
    Lost,
    /// A wait-before-signal that was never satisfied.
    NeverSignalled,
}

impl FenceError {
    /// The root cause.
    pub fn cause(&self) -> Cause {
        match *self {
            FenceError::DeviceHung => Cause::Hung,
            FenceError::Fault(i) => Cause::Fault(i),
            FenceError::DeviceLost => Cause::Lost,
            FenceError::NeverSignalled { .. } => Cause::NeverSignalled,
            FenceError::Dependency { cause, .. } => cause,
        }
    }

    /// The error of work that waited on `producer`, which failed with
    /// `self`: the chain keeps its first failed fence and root cause.
    pub fn propagated(&self, producer: FenceId) -> FenceError {
        match *self {
            FenceError::Dependency { .. } => *self,
            _ => FenceError::Dependency { producer, cause: self.cause() },
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Hung => write!(f, "a hang"),
            Cause::Fault(i) => write!(f, "a fault ({i})"),
            Cause::Lost => write!(f, "device loss"),
            Cause::NeverSignalled => write!(f, "a wait that was never satisfied"),
        }
    }
}

impl fmt::Display for FenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FenceError::DeviceHung => write!(f, "queue hung and was reset"),
            FenceError::Fault(i) => write!(f, "queue faulted and was reset: {i}"),
            FenceError::DeviceLost => write!(f, "device lost"),
            FenceError::NeverSignalled { producer } => {
                write!(f, "waited for {producer}, which was never submitted; the queue was reset")
            }
            FenceError::Dependency { producer, cause } => {
                write!(f, "depends on {producer}, which failed with {cause}")
            }
        }
    }
}

impl core::error::Error for FenceError {}
