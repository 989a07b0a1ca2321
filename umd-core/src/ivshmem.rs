//! The register binding of the shared-memory transports
//! (`docs/refgpu.md` 2.3): every platform that reaches the register page as
//! plain shared memory rather than trapping MMIO uses it. That is the
//! ivshmem binding (a QEMU guest through the ivshmem BAR, a Linux
//! co-simulation host through a mapping of the shared memory) and the
//! shared-RAM binding (a microcontroller whose RAM region the model maps
//! as a file, or a Linux process mapping that file): the register page has
//! the same rules on both. The core keeps MMIO semantics, and this module
//! turns them into the binding's atomics:
//!
//! - IRQ_STATUS "write 1 to clear" becomes an atomic AND of the complement;
//! - writes to read-only registers are dropped (they would clobber state
//!   the device owns), as an MMIO device ignores them;
//! - CLOCK_LO reads HI/LO/HI until HI is stable and latches HI for the next
//!   CLOCK_HI read (the device updates the clock as one 64-bit value);
//! - a write to an engine's DOORBELL register asks the caller to ring that
//!   engine's doorbell vector.
//!
//! The caller still rings doorbells and the control doorbell itself (an
//! ivshmem doorbell register, or an atomic add of 1 to the doorbell word
//! on shared RAM), and rings the control doorbell after writing CTRL,
//! IRQ_MASK, MMU_* or ENGINE_ROOT (the core does, through
//! [`DirectIo::control_doorbell`](crate::platform::DirectIo::control_doorbell)).
//! A plain volatile store instead of [`Binding::write`] leaves the model
//! waiting for a doorbell that never comes: bring-up then fails with
//! "device did not complete MMU invalidate".
//!
//! [`shared_ram`] is the shared-RAM binding's layout and what the model
//! publishes in its doorbell page (MEM_BASE among it: the device address
//! of the region's first byte).
//!
//! [`Liveness`] is the loss check the spec asks of a host on these
//! transports: ATTACH cleared, or CLOCK frozen for longer than
//! [`LOSS_WINDOW_NS`], marks the device lost. `docs/porting.md`,
//! "Shared-memory transports", shows a whole platform built on this
//! module.

use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::hw::regs::{self, engine as er};
use crate::platform::PlatformError;

/// Dword access to a register page in shared memory.
///
/// The trait is safe to implement, but an implementation over a raw
/// mapping has an `unsafe` block of its own (turning the mapping's pointer
/// into `&AtomicU32`): that block's justification is that the mapping
/// outlives every reference the trait hands out. Tie the page to the
/// mapping's lifetime (borrow the value that owns the mapping, as
/// `Page<'a>(&'a Mapping)` does) and unmap only after the device built
/// over it has been shut down. A platform type that holds the mapping as
/// a raw pointer is neither `Send` nor `Sync` by default: a device shared
/// between threads needs `unsafe impl Send` and `unsafe impl Sync` for it,
/// justified by the page being touched through atomics only (the
/// reasoning `docs/porting.md` gives).
pub trait SharedPage {
    /// The register at byte `offset` (dword aligned, inside the 4 KiB
    /// page), or None.
    fn word(&self, offset: u32) -> Option<&AtomicU32>;
}

/// What a register write asks of the platform.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// Stored (or dropped, for a read-only register): nothing more to do.
    Done,
    /// A DOORBELL register write: ring this engine's doorbell vector.
    Doorbell(u32),
}

/// The engine index and block offset of an engine register, if `off` is one.
pub fn engine_reg(off: u32) -> Option<(u32, u32)> {
    let rel = off.checked_sub(regs::ENGINE_BASE)?;
    let e = rel.checked_div(regs::ENGINE_STRIDE)?;
    (e < regs::ENGINES).then(|| (e, rel.checked_rem(regs::ENGINE_STRIDE).unwrap_or(0)))
}

/// Whether `off` is ENGINE_ROOT_LO or ENGINE_ROOT_HI of an engine.
fn is_engine_root(off: u32) -> bool {
    (0..regs::ENGINES).any(|e| off == regs::engine_root_lo(e) || off == regs::engine_root_hi(e))
}

/// The host's side of the binding: the only state it keeps is the latched
/// CLOCK_HI (atomic, so the binding is shared by every thread of a device;
/// a CLOCK_LO/CLOCK_HI pair read by two threads at once may mix, as on an
/// MMIO latch).
#[derive(Debug, Default)]
pub struct Binding {
    clock_hi: AtomicU32,
}

impl Binding {
    /// A fresh binding.
    pub const fn new() -> Binding {
        Binding { clock_hi: AtomicU32::new(0) }
    }

    fn reg(page: &impl SharedPage, off: u32) -> Result<&AtomicU32, PlatformError> {
        page.word(off).ok_or(PlatformError::Unsupported)
    }

    /// Reads register `off` with MMIO semantics.
    pub fn read(&self, page: &impl SharedPage, off: u32) -> Result<u32, PlatformError> {
        match off {
            regs::CLOCK_LO => {
                let c = device_clock(page).ok_or(PlatformError::Unsupported)?;
                self.clock_hi.store((c >> 32) as u32, Ordering::Relaxed);
                Ok(c as u32)
            }
            regs::CLOCK_HI => {
                Self::reg(page, off)?;
                Ok(self.clock_hi.load(Ordering::Relaxed))
            }
            _ if engine_reg(off).is_some_and(|(_, r)| r == er::DOORBELL) => {
                Self::reg(page, off)?;
                Ok(0)
            }
            _ => Ok(Self::reg(page, off)?.load(Ordering::Acquire)),
        }
    }

    /// Writes register `off` with MMIO semantics: the read-write registers
    /// of spec 2.1 and 2.2 (IRQ_MASK, MMU_CTRL, MMU_ROOT, MMU_INVALIDATE,
    /// ENGINE_ROOT of each engine, and each engine's RING_BASE, RING_SIZE,
    /// RING_WPTR and CTRL) are stored, IRQ_STATUS is cleared by an atomic
    /// AND, a DOORBELL write is returned as [`Written::Doorbell`], and every
    /// other write is dropped.
    pub fn write(&self, page: &impl SharedPage, off: u32, value: u32) -> Result<Written, PlatformError> {
        let r = Self::reg(page, off)?;
        match off {
            regs::IRQ_STATUS => {
                r.fetch_and(!value, Ordering::AcqRel);
            }
            regs::IRQ_MASK
            | regs::MMU_CTRL
            | regs::MMU_ROOT_LO
            | regs::MMU_ROOT_HI
            | regs::MMU_INVALIDATE => r.store(value, Ordering::Release),
            _ if is_engine_root(off) => r.store(value, Ordering::Release),
            _ => match engine_reg(off) {
                Some((e, er::DOORBELL)) => return Ok(Written::Doorbell(e)),
                Some((_, er::RING_BASE_LO | er::RING_BASE_HI | er::RING_SIZE | er::RING_WPTR | er::CTRL)) => {
                    r.store(value, Ordering::Release)
                }
                _ => {} // read-only or unlisted: ignored, as on MMIO
            },
        }
        Ok(Written::Done)
    }
}

/// The device clock as the binding publishes it: CLOCK_HI, CLOCK_LO and
/// CLOCK_HI again until HI is stable (no latch: this is the value a
/// liveness check compares), or None when the page has no CLOCK.
pub fn device_clock(page: &impl SharedPage) -> Option<u64> {
    let hi = page.word(regs::CLOCK_HI)?;
    let lo = page.word(regs::CLOCK_LO)?;
    let mut h1 = hi.load(Ordering::Acquire);
    // Bounded in practice: HI changes once per 4.3 s of device time.
    loop {
        let l = lo.load(Ordering::Acquire);
        let h2 = hi.load(Ordering::Acquire);
        if h1 == h2 {
            return Some((u64::from(h2) << 32) | u64::from(l));
        }
        h1 = h2;
    }
}

/// How long CLOCK may stay frozen before a host counts the device as lost
/// (`docs/refgpu.md` 2.3, "Liveness"): 2 s. The model publishes CLOCK
/// every 100 µs while it runs, so this is twenty thousand missed updates:
/// a model starved on a loaded host is late, not lost. A failure guard,
/// not a latency: a test that kills the model may pass a shorter window
/// to [`Liveness::check`].
pub const LOSS_WINDOW_NS: u64 = 2_000_000_000;

/// What a [`Liveness::check`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// The model is attached and CLOCK moved within the window.
    Alive,
    /// Lost now: ATTACH no longer reads the attach word (the model shut
    /// down cleanly).
    Detached,
    /// Lost now: CLOCK stayed at `clock` for `for_ns` of host time, longer
    /// than the window (the model was killed or stopped).
    Frozen {
        /// The clock value that did not move.
        clock: u64,
        /// How long it has not moved, in host ns.
        for_ns: u64,
    },
    /// Lost at an earlier check (or marked lost by the platform).
    Lost,
}

/// The host's loss check of a shared-memory transport (`docs/refgpu.md`
/// 2.3, "Liveness"): the device is lost once the model's attach word is
/// gone (shared RAM: ATTACH not "RGSR"; ivshmem has none and passes
/// `attached = true`) or its CLOCK stayed frozen for longer than the loss
/// window. A SIGKILLed model leaves ATTACH set, so the frozen CLOCK is
/// what notices it. Loss is sticky: the platform answers every register
/// call and doorbell with `PlatformError::DeviceLost` once
/// [`Liveness::is_lost`] says so. Call [`Liveness::check`] from the
/// platform's `delay_ns` and `wait_irq` (the core's wait loop).
///
/// Uses 32-bit atomics and a spin lock only, so it builds for targets
/// without 64-bit atomics (thumbv7em).
#[derive(Debug)]
pub struct Liveness {
    lost: AtomicBool,
    beat: spin::Mutex<Beat>,
}

/// The last CLOCK value seen and when (host ns) it last moved.
#[derive(Clone, Copy, Debug)]
struct Beat {
    clock: u64,
    seen_ns: u64,
}

impl Liveness {
    /// A check that starts from `clock` seen at host time `now_ns` (read
    /// both at attach).
    pub const fn new(clock: u64, now_ns: u64) -> Liveness {
        Liveness { lost: AtomicBool::new(false), beat: spin::Mutex::new(Beat { clock, seen_ns: now_ns }) }
    }

    /// Whether the device was found lost (sticky).
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Marks the device lost for a reason the platform found itself (a
    /// closed socket, a removed device).
    pub fn mark_lost(&self) {
        self.lost.store(true, Ordering::Release);
    }

    /// Compares what the host sees now (`attached`: the attach word is
    /// present; `clock`: the device clock, e.g. [`device_clock`]; `now_ns`:
    /// the platform's monotonic clock) with the last check, and marks the
    /// device lost when the model is gone or CLOCK has not moved for more
    /// than `window_ns` (normally [`LOSS_WINDOW_NS`]).
    pub fn check(&self, attached: bool, clock: u64, now_ns: u64, window_ns: u64) -> Health {
        if self.is_lost() {
            return Health::Lost;
        }
        if !attached {
            self.mark_lost();
            return Health::Detached;
        }
        let mut b = self.beat.lock();
        if clock != b.clock {
            *b = Beat { clock, seen_ns: now_ns };
            return Health::Alive;
        }
        let for_ns = now_ns.saturating_sub(b.seen_ns);
        if for_ns > window_ns {
            self.mark_lost();
            return Health::Frozen { clock, for_ns };
        }
        Health::Alive
    }
}

/// The shared-RAM binding's layout (`docs/refgpu.md` 2.3, "shared RAM"):
/// a RAM region both sides map, system memory first, the register page
/// and the doorbell page in its last 8 KiB. Offsets in the doorbell page
/// are bytes from its start; [`published`](shared_ram::published) reads
/// what the model wrote there.
pub mod shared_ram {
    use core::sync::atomic::Ordering;

    use super::SharedPage;

    /// Offset of the register page from the start of a region of
    /// `region` bytes (at least 8 KiB).
    pub const fn regs_offset(region: usize) -> usize {
        region.saturating_sub(0x2000)
    }
    /// Offset of the doorbell page.
    pub const fn doorbell_page_offset(region: usize) -> usize {
        region.saturating_sub(0x1000)
    }
    /// ATTACH: [`ATTACH_MAGIC`] while a model is attached.
    pub const ATTACH_OFF: u32 = 0x00;
    /// ATTACH's value while a model is attached: the bytes "RGSR".
    pub const ATTACH_MAGIC: u32 = u32::from_le_bytes(*b"RGSR");
    /// The layout version.
    pub const VERSION_OFF: u32 = 0x04;
    /// The version described here.
    pub const VERSION: u32 = 1;
    /// MEM_SIZE: bytes of system memory (the region minus 8 KiB).
    pub const MEM_SIZE_OFF: u32 = 0x08;
    /// MEM_BASE bits 31:0, the device address of the region's first byte
    /// (bits 63:32 at +0x14).
    pub const MEM_BASE_OFF: u32 = 0x10;
    /// DOORBELL(v) at `DOORBELL_OFF + 4 * v`: a counter the host rings
    /// by one atomic add of 1.
    pub const DOORBELL_OFF: u32 = 0x40;
    /// Doorbell words: the three engines and the control doorbell.
    pub const DOORBELLS: u32 = 4;

    /// What the model publishes in the doorbell page.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Published {
        /// ATTACH reads [`ATTACH_MAGIC`].
        pub attached: bool,
        /// The layout version.
        pub version: u32,
        /// MEM_SIZE.
        pub mem_size: u32,
        /// MEM_BASE: the device address of the region's first byte; the
        /// device address of any byte of system memory is this plus its
        /// offset in the region.
        pub mem_base: u64,
    }

    /// Reads the doorbell page `bells` (offsets from its start); None when
    /// the page lacks one of the words.
    pub fn published(bells: &impl SharedPage) -> Option<Published> {
        let w = |off: u32| bells.word(off).map(|w| w.load(Ordering::Acquire));
        Some(Published {
            attached: w(ATTACH_OFF)? == ATTACH_MAGIC,
            version: w(VERSION_OFF)?,
            mem_size: w(MEM_SIZE_OFF)?,
            mem_base: u64::from(w(MEM_BASE_OFF)?) | u64::from(w(MEM_BASE_OFF.wrapping_add(4))?) << 32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Page([AtomicU32; 1024]);

    impl SharedPage for Page {
        fn word(&self, off: u32) -> Option<&AtomicU32> {
            (off % 4 == 0).then(|| self.0.get(off as usize / 4)).flatten()
        }
    }

    fn page() -> Page {
        Page(core::array::from_fn(|_| AtomicU32::new(0)))
    }

    #[test]
    fn irq_status_clear_is_an_and_and_read_only_registers_keep_device_state() {
        let p = page();
        let b = Binding::new();
        p.0[(regs::IRQ_STATUS / 4) as usize].store(0b111, Ordering::Relaxed);
        assert_eq!(b.write(&p, regs::IRQ_STATUS, 0b010), Ok(Written::Done));
        assert_eq!(b.read(&p, regs::IRQ_STATUS), Ok(0b101));
        let rptr = regs::engine_reg(1, er::RING_RPTR);
        p.0[(rptr / 4) as usize].store(64, Ordering::Relaxed);
        b.write(&p, rptr, 0).unwrap();
        assert_eq!(b.read(&p, rptr), Ok(64));
        b.write(&p, regs::ID, 0).unwrap();
        let wptr = regs::engine_reg(2, er::RING_WPTR);
        b.write(&p, wptr, 36).unwrap();
        assert_eq!(b.read(&p, wptr), Ok(36));
    }

    #[test]
    fn doorbell_writes_ask_for_a_doorbell_and_read_zero() {
        let p = page();
        let b = Binding::new();
        let db = regs::engine_reg(2, er::DOORBELL);
        assert_eq!(b.write(&p, db, 1), Ok(Written::Doorbell(2)));
        assert_eq!(b.read(&p, db), Ok(0));
        assert_eq!(b.write(&p, 4096, 1), Err(PlatformError::Unsupported));
        assert_eq!(b.read(&p, 2), Err(PlatformError::Unsupported));
    }

    #[test]
    fn engine_roots_are_read_write_and_local_memory_registers_read_only() {
        let p = page();
        let b = Binding::new();
        for e in 0..regs::ENGINES {
            assert_eq!(b.write(&p, regs::engine_root_lo(e), 0x1234_5000 + e), Ok(Written::Done));
            assert_eq!(b.write(&p, regs::engine_root_hi(e), 0x7 + e), Ok(Written::Done));
            assert_eq!(b.read(&p, regs::engine_root_lo(e)), Ok(0x1234_5000 + e), "ENGINE_ROOT_LO({e})");
            assert_eq!(b.read(&p, regs::engine_root_hi(e)), Ok(0x7 + e), "ENGINE_ROOT_HI({e})");
        }
        assert_eq!(regs::engine_root_hi(2), 0x054, "the last root register (spec 2.1)");
        b.write(&p, regs::LOCAL_BASE_LO, 5).unwrap();
        b.write(&p, regs::LOCAL_SIZE_LO, 5).unwrap();
        assert_eq!((b.read(&p, regs::LOCAL_BASE_LO), b.read(&p, regs::LOCAL_SIZE_LO)), (Ok(0), Ok(0)));
    }

    #[test]
    fn liveness_needs_attach_and_a_moving_clock() {
        let w = LOSS_WINDOW_NS;
        let l = Liveness::new(10, 0);
        assert_eq!(l.check(true, 10, w, w), Health::Alive, "frozen for exactly the window");
        assert_eq!(l.check(true, 11, w + 5, w), Health::Alive, "moved: the window restarts");
        assert_eq!(l.check(true, 11, 2 * w + 5, w), Health::Alive);
        assert_eq!(l.check(true, 11, 2 * w + 6, w), Health::Frozen { clock: 11, for_ns: w + 1 });
        assert!(l.is_lost());
        assert_eq!(l.check(true, 12, 2 * w + 7, w), Health::Lost, "loss is sticky");

        let l = Liveness::new(0, 0);
        assert_eq!(l.check(false, 1, 1, w), Health::Detached, "ATTACH gone: lost at once");
        assert_eq!(l.check(true, 2, 2, w), Health::Lost);
        let l = Liveness::new(0, 0);
        l.mark_lost();
        assert_eq!(l.check(true, 1, 1, w), Health::Lost);
    }

    #[test]
    fn the_doorbell_page_publishes_attach_version_size_and_base() {
        use shared_ram as sr;
        let p = page();
        assert_eq!(sr::published(&p).map(|b| b.attached), Some(false));
        p.0[0].store(sr::ATTACH_MAGIC, Ordering::Relaxed);
        p.0[1].store(1, Ordering::Relaxed);
        p.0[2].store(0xFF_E000, Ordering::Relaxed);
        p.0[4].store(0x2100_0000, Ordering::Relaxed);
        p.0[5].store(0x1, Ordering::Relaxed);
        let b = sr::Published { attached: true, version: 1, mem_size: 0xFF_E000, mem_base: 0x1_2100_0000 };
        assert_eq!(sr::published(&p), Some(b));
        assert_eq!((sr::regs_offset(16 << 20), sr::doorbell_page_offset(16 << 20)), (0xFF_E000, 0xFF_F000));
    }

    #[test]
    fn device_clock_reads_both_halves() {
        let p = page();
        p.0[(regs::CLOCK_LO / 4) as usize].store(5, Ordering::Relaxed);
        p.0[(regs::CLOCK_HI / 4) as usize].store(7, Ordering::Relaxed);
        assert_eq!(device_clock(&p), Some((7 << 32) | 5));
    }

    #[test]
    fn clock_hi_is_latched_by_clock_lo() {
        let p = page();
        let b = Binding::new();
        p.0[(regs::CLOCK_LO / 4) as usize].store(5, Ordering::Relaxed);
        p.0[(regs::CLOCK_HI / 4) as usize].store(7, Ordering::Relaxed);
        assert_eq!(b.read(&p, regs::CLOCK_LO), Ok(5));
        p.0[(regs::CLOCK_HI / 4) as usize].store(8, Ordering::Relaxed);
        assert_eq!(b.read(&p, regs::CLOCK_HI), Ok(7), "latched at the LO read");
    }
}
