//! The ivshmem register binding (`docs/refgpu.md` section 2.3), shared by
//! every platform that reaches the register page as plain shared memory
//! (the bare-metal guest through the ivshmem BAR, a Linux co-simulation
//! host through a mapping): the core keeps MMIO semantics, and this module
//! turns them into the binding's atomics.
//!
//! - IRQ_STATUS "write 1 to clear" becomes an atomic AND of the complement;
//! - writes to read-only registers are dropped (they would clobber state
//!   the device owns), as an MMIO device ignores them;
//! - CLOCK_LO reads HI/LO/HI until HI is stable and latches HI for the next
//!   CLOCK_HI read (the device updates the clock as one 64-bit value);
//! - a write to an engine's DOORBELL register asks the caller to ring that
//!   engine's doorbell vector.
//!
//! The caller still rings doorbells and the control doorbell itself.

use core::sync::atomic::{AtomicU32, Ordering};

use crate::hw::regs::{self, engine as er};
use crate::platform::PlatformError;

/// Dword access to a register page in shared memory.
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
                let hi = Self::reg(page, regs::CLOCK_HI)?;
                let lo = Self::reg(page, regs::CLOCK_LO)?;
                let mut h1 = hi.load(Ordering::Acquire);
                // Bounded in practice: HI changes once per 4.3 s of device time.
                loop {
                    let l = lo.load(Ordering::Acquire);
                    let h2 = hi.load(Ordering::Acquire);
                    if h1 == h2 {
                        self.clock_hi.store(h2, Ordering::Relaxed);
                        return Ok(l);
                    }
                    h1 = h2;
                }
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

    /// Writes register `off` with MMIO semantics.
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
