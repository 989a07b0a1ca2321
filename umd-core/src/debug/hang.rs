//! The state dump taken when a queue hangs or faults: where the engine
//! stopped, which packet, which fault, and the decoded commands around it.
//!
//! The report is plain data of fixed size (no allocation), captured before
//! the engine is reset; its `Display` decodes the captured command windows
//! with the generation's decoder, so the same text appears on a UART and in
//! a host log.
//!
//! Without the `hang-capture` feature (a smaller firmware) the direct-mode
//! backend captures nothing: its reports are [`HangReport::uncaptured`]
//! ones (reason, fault, fence counts), and the windows hold no dwords.

use core::fmt;

use crate::decode::Decoder;
use crate::hw::Generation;
use crate::sync::{FaultInfo, QueueId, Seqno};

/// Dwords captured around the engine's position: 0 without the
/// `hang-capture` feature (nothing is captured; a [`Window`] is then empty
/// and holds no storage).
pub const WINDOW_DWORDS: usize = if cfg!(feature = "hang-capture") { 48 } else { 0 };

/// A copy of command memory starting at a packet boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// GPU address of `words[0]`.
    pub va: u64,
    /// The dwords.
    pub words: [u32; WINDOW_DWORDS],
    /// How many of `words` are valid.
    pub len: usize,
    /// GPU address of the packet the engine was at (marked in the dump).
    pub mark: u64,
}

impl Window {
    /// An empty window.
    pub const EMPTY: Window = Window { va: 0, words: [0; WINDOW_DWORDS], len: 0, mark: 0 };

    /// A window of `len` dwords at `va` read one by one with `read(i)`
    /// (volatile reads of memory another thread may be writing elsewhere).
    pub fn capture_with(va: u64, len: usize, mark: u64, read: impl Fn(usize) -> Option<u32>) -> Window {
        let mut w = Window { va, mark, ..Window::EMPTY };
        for (i, d) in w.words.iter_mut().enumerate().take(len) {
            match read(i) {
                Some(v) => *d = v,
                None => break,
            }
            w.len = w.len.saturating_add(1);
        }
        w
    }

    /// Copies up to [`WINDOW_DWORDS`] dwords from `src`, which starts at `va`.
    pub fn capture(va: u64, src: &[u32], mark: u64) -> Window {
        let mut w = Window { va, mark, ..Window::EMPTY };
        for (d, s) in w.words.iter_mut().zip(src) {
            *d = *s;
            w.len = w.len.saturating_add(1);
        }
        w
    }

    fn write_decoded(&self, f: &mut fmt::Formatter<'_>, generation: Generation) -> fmt::Result {
        let mut bytes = [0u8; WINDOW_DWORDS * 4];
        for (c, w) in bytes.chunks_exact_mut(4).zip(self.words.iter().take(self.len)) {
            c.copy_from_slice(&w.to_le_bytes());
        }
        let used = bytes.get(..self.len.saturating_mul(4)).unwrap_or(&[]);
        for item in Decoder::new(generation, used, self.va) {
            let here = if item.va == self.mark { "=>" } else { "  " };
            match item.result {
                Ok(p) => writeln!(f, "    {here} {:#014x}  {p}", item.va)?,
                Err(e) => writeln!(f, "    {here} {:#014x}  !! {e}", item.va)?,
            }
        }
        Ok(())
    }
}

/// Why the queue was declared stuck.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HangReason {
    /// Read pointer, packet address and fence did not move for a window.
    NoProgress {
        /// The window in ns.
        window_ns: u64,
    },
    /// Addresses moved but the fence did not for this many windows (a
    /// loop such as a CHAIN to itself).
    FenceStalled {
        /// Windows without a fence.
        windows: u32,
    },
    /// The engine stopped on a fault.
    Fault(FaultInfo),
    /// The device stopped answering (register access failed).
    DeviceLost,
    /// The queue waited longer than the wait-before-signal limit for a
    /// fence of another queue that was never submitted.
    NeverSignalled {
        /// The fence it waited for.
        producer: crate::sync::FenceId,
    },
    /// A kernel driver reset the queue (kernel mode; the kernel has the
    /// details, e.g. in a devcoredump).
    KernelReset,
}

impl HangReason {
    /// The fault that stopped the engine, when that is the reason.
    pub const fn fault(&self) -> Option<FaultInfo> {
        match *self {
            HangReason::Fault(info) => Some(info),
            _ => None,
        }
    }
}

impl fmt::Display for HangReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HangReason::NoProgress { window_ns } => write!(f, "no progress for {} ms", window_ns / 1_000_000),
            HangReason::FenceStalled { windows } => {
                write!(f, "engine busy but no fence for {windows} hang windows (loop?)")
            }
            HangReason::Fault(i) => write!(f, "{i}"),
            HangReason::DeviceLost => write!(f, "device lost"),
            HangReason::NeverSignalled { producer } => {
                write!(
                    f,
                    "waited for {producer}, which was never submitted, beyond the wait-before-signal limit"
                )
            }
            HangReason::KernelReset => write!(f, "reset by the kernel driver"),
        }
    }
}

/// Everything known about a stuck queue at the moment it was declared
/// stuck.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HangReport {
    /// The queue.
    pub queue: QueueId,
    /// Why.
    pub reason: HangReason,
    /// When, on the platform's clock (`Platform::now_ns`, not the
    /// device's CLOCK).
    pub at_ns: u64,
    /// The generation (for decoding the windows).
    pub generation: Generation,
    /// RING_RPTR.
    pub rptr: u32,
    /// Our write pointer.
    pub wptr: u32,
    /// STATUS register.
    pub status: u32,
    /// CUR_ADDR: the packet executing.
    pub cur_addr: u64,
    /// IB_BASE / IB_SIZE (0 when in the ring).
    pub ib_base: u64,
    /// IB size in dwords.
    pub ib_size: u32,
    /// Last fence emitted on the queue.
    pub emitted: Seqno,
    /// Last fence completed on the queue.
    pub completed: Seqno,
    /// The latched fault, if any.
    pub fault: Option<FaultInfo>,
    /// Ring contents from the read pointer.
    pub ring: Window,
    /// IB contents around the current packet (empty when in the ring).
    pub ib: Window,
    /// For a fault: the buffer nearest the faulting address.
    pub near: Option<NearBuffer>,
}

/// The buffer nearest a faulting address, as the fault report names it
/// ("16 bytes past buffer 'weights' (65536 bytes)").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NearBuffer {
    /// Its tag.
    pub tag: &'static str,
    /// Its allocation number on the device.
    pub serial: u64,
    /// Its GPU address.
    pub va: u64,
    /// Its size in bytes.
    pub size: u64,
    /// It had been freed (its memory still waited for fences).
    pub freed: bool,
    /// The faulting address.
    pub addr: u64,
}

impl fmt::Display for NearBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let end = self.va.saturating_add(self.size);
        let freed = if self.freed { "freed " } else { "" };
        let what = |f: &mut fmt::Formatter<'_>| {
            write!(f, "{freed}buffer '{}' #{} ({} bytes at {:#x})", self.tag, self.serial, self.size, self.va)
        };
        if self.addr < self.va {
            write!(f, "{} bytes before ", self.va.saturating_sub(self.addr))?;
        } else if self.addr >= end {
            write!(f, "{} bytes past ", self.addr.saturating_sub(end))?;
        } else {
            write!(f, "{} bytes into ", self.addr.saturating_sub(self.va))?;
        }
        what(f)
    }
}

impl HangReport {
    /// A report with no register capture (device loss; a kernel's reset,
    /// whose capture is the kernel's devcoredump; a direct-mode build
    /// without `hang-capture`): `counts` is (emitted, completed), the
    /// fault is the reason's ([`HangReason::fault`]).
    pub const fn uncaptured(
        queue: QueueId,
        reason: HangReason,
        at_ns: u64,
        generation: Generation,
        counts: (Seqno, Seqno),
    ) -> HangReport {
        HangReport {
            queue,
            reason,
            at_ns,
            generation,
            rptr: 0,
            wptr: 0,
            status: 0,
            cur_addr: 0,
            ib_base: 0,
            ib_size: 0,
            emitted: counts.0,
            completed: counts.1,
            fault: reason.fault(),
            ring: Window::EMPTY,
            ib: Window::EMPTY,
            near: None,
        }
    }
}

impl fmt::Display for HangReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A fault is not a hang; and the time is the platform's clock
        // (`Platform::now_ns`), not the device's CLOCK.
        let what = if self.fault.is_some() { "faulted" } else { "stuck" };
        writeln!(f, "queue {} {} (platform clock {} ns): {}", self.queue, what, self.at_ns, self.reason)?;
        writeln!(
            f,
            "  rptr {:#x} wptr {:#x} status {:#x} fences emitted {} completed {} ({} pending)",
            self.rptr,
            self.wptr,
            self.status,
            self.emitted,
            self.completed,
            self.emitted.distance(self.completed).max(0)
        )?;
        writeln!(
            f,
            "  current packet {:#x}, IB {:#x} ({} dwords)",
            self.cur_addr, self.ib_base, self.ib_size
        )?;
        if let Some(fault) = self.fault {
            writeln!(f, "  fault: {fault}")?;
        }
        if let Some(near) = self.near {
            writeln!(f, "  nearest buffer: {near}")?;
        }
        if self.ring.len > 0 {
            writeln!(f, "  ring from the read pointer:")?;
            self.ring.write_decoded(f, self.generation)?;
        }
        if self.ib.len > 0 {
            writeln!(f, "  indirect buffer around the current packet:")?;
            self.ib.write_decoded(f, self.generation)?;
        }
        Ok(())
    }
}

/// Hang and fault reports a device keeps by default (the
/// `HANGS` parameter of [`crate::storage::DeviceStorage`]).
pub const HANG_REPORTS: usize = 4;

/// The last hang and fault reports, oldest overwritten first, and how many
/// there were in all.
#[derive(Debug)]
pub struct HangLog<'s> {
    reports: &'s mut [Option<HangReport>],
    /// Reports recorded since the device came up.
    total: u64,
}

impl<'s> HangLog<'s> {
    /// A log over `reports` (the device's storage), emptied.
    pub fn new(reports: &'s mut [Option<HangReport>]) -> Self {
        reports.iter_mut().for_each(|r| *r = None);
        HangLog { reports, total: 0 }
    }

    /// How many reports it keeps.
    pub fn capacity(&self) -> usize {
        self.reports.len()
    }

    /// Reports recorded in all (kept or overwritten).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Records `r`, overwriting the oldest when full.
    pub fn push(&mut self, r: HangReport) {
        let n = self.reports.len() as u64;
        if let Some(slot) = self.total.checked_rem(n).and_then(|i| self.reports.get_mut(i as usize)) {
            *slot = Some(r);
        }
        self.total = self.total.saturating_add(1);
    }

    /// The newest report.
    pub fn last(&self) -> Option<HangReport> {
        self.iter().last().copied()
    }

    /// The kept reports, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &HangReport> + '_ {
        let n = self.reports.len();
        let start =
            if self.total > n as u64 { self.total.checked_rem(n as u64).unwrap_or(0) as usize } else { 0 };
        let (a, b) = self.reports.split_at(start.min(n));
        b.iter().chain(a).flatten()
    }
}
