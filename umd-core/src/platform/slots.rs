//! The fence slots of direct mode: one 64-bit word per queue in a DMA
//! region of their own, written by the device (a FENCE packet), read by the
//! CPU (completion polling) and by the device (WAIT_MEM), and written by
//! the CPU at bring-up and when a queue is reset (force-completion).
//!
//! [`FenceSlots`] owns that region and is the only code that touches it
//! from the CPU. Because it never hands out a slice view of the memory,
//! every CPU access to a slot is atomic, and a slot can be written through
//! a shared reference while other threads poll it: one of the two places
//! where that needs `unsafe` (the other is `DmaRegion::store_u32_shared`,
//! for event words).

#[cfg(not(target_has_atomic = "64"))]
use core::sync::atomic::AtomicU32;
#[cfg(target_has_atomic = "64")]
use core::sync::atomic::AtomicU64;
use core::sync::atomic::Ordering;

use super::{DmaRegion, Platform};
use crate::sync::Seqno;

/// Distance between two queues' fence slots in bytes: 64, the strictest
/// generation's alignment for a FENCE address.
pub const FENCE_STRIDE: usize = 64;

/// One slot as the CPU accesses it: a 64-bit atomic, or on a target
/// without 64-bit atomics its two 32-bit halves (low word first: the
/// device is little-endian).
#[cfg(target_has_atomic = "64")]
type Slot = AtomicU64;
#[cfg(not(target_has_atomic = "64"))]
type Slot = [AtomicU32; 2];

/// The per-queue fence slots: queue `q`'s slot is the 8 bytes at
/// `q * FENCE_STRIDE` of the region, at GPU address
/// `va + q * FENCE_STRIDE`.
///
/// Reads make the device's writes visible first (cache invalidate), CPU
/// writes are cleaned to the device after the store, so the slots work on
/// a non-coherent system. An out-of-range queue (or a region the CPU cannot
/// reach) reads as `None` and is never written.
#[derive(Debug)]
pub(crate) struct FenceSlots {
    region: DmaRegion,
    va: u64,
}

impl FenceSlots {
    /// No slots (before bring-up allocated them, after release).
    pub(crate) const fn empty() -> FenceSlots {
        FenceSlots { region: DmaRegion::empty(), va: 0 }
    }

    /// Slots in `region`, mapped for the device at `va`.
    pub(crate) fn new(region: DmaRegion, va: u64) -> FenceSlots {
        FenceSlots { region, va }
    }

    /// Gives the region back (for [`Platform::dma_free`]), leaving no slots.
    pub(crate) fn take_region(&mut self) -> DmaRegion {
        self.va = 0;
        core::mem::replace(&mut self.region, DmaRegion::empty())
    }

    /// Device (physical) address of slot `q`, and the device address
    /// range of the whole region.
    pub(crate) fn dev_addr(&self, q: usize) -> (u64, (u64, u64)) {
        let base = self.region.dev_addr();
        let end = base.wrapping_add(self.region.len() as u64);
        (base.wrapping_add((q as u64).wrapping_mul(FENCE_STRIDE as u64)), (base, end))
    }

    /// GPU address of queue `q`'s slot (for FENCE and WAIT_MEM packets).
    pub(crate) fn va(&self, q: usize) -> u64 {
        self.va.wrapping_add((q as u64).wrapping_mul(FENCE_STRIDE as u64))
    }

    /// Queue `q`'s slot, if it lies in the region and the CPU reaches it.
    fn slot(&self, q: usize) -> Option<&Slot> {
        let p = self.region.word_ptr(q.checked_mul(FENCE_STRIDE)?, 8)?;
        // SAFETY: `word_ptr` checked that the 8 bytes lie in the region's
        // CPU mapping and are 8-byte aligned (as `Slot` needs on every
        // target); the mapping is valid for reads and writes while the
        // region lives (`DmaRegion::new`'s contract), and the borrow of
        // `self` keeps the region alive and owned by these slots. Atomics
        // have the layout of the integers they wrap. The region is private
        // to this type, which never makes a slice of it or accesses it
        // otherwise than through `slot`, so every CPU access to the word is
        // atomic and a store through this shared reference races with no
        // non-atomic access; the device's own accesses are DMA, outside the
        // CPU's memory model (a device modelled in the same process writes
        // with atomics).
        Some(unsafe { &*p.cast::<Slot>() })
    }

    /// Queue `q`'s slot as the device last wrote it (or the CPU forced
    /// it): the cache lines are invalidated first, the load has acquire
    /// ordering (on a target without 64-bit atomics the high word is
    /// loaded before the low one, so a value being moved forward by
    /// [`FenceSlots::force`] may read smaller for a moment, never larger).
    /// None when `q` has no slot.
    pub(crate) fn read<P: Platform>(&self, p: &P, q: usize) -> Option<Seqno> {
        let off = q.saturating_mul(FENCE_STRIDE);
        p.cache_invalidate(&self.region, off, 8);
        let s = self.slot(q)?;
        #[cfg(target_has_atomic = "64")]
        let v = s.load(Ordering::Acquire);
        #[cfg(not(target_has_atomic = "64"))]
        let v = {
            let [lo, hi] = s;
            let hi = hi.load(Ordering::Acquire);
            u64::from(lo.load(Ordering::Acquire)) | u64::from(hi) << 32
        };
        Some(Seqno(v))
    }

    /// Writes `value` to queue `q`'s slot from the CPU (release ordering;
    /// low word first on a target without 64-bit atomics) and cleans it
    /// to the device, so that the device's WAIT_MEM packets see it. For a
    /// queue whose engine does not write the slot meanwhile (it was just
    /// reset), under that queue's submit lock. False when `q` has no slot.
    pub(crate) fn force<P: Platform>(&self, p: &P, q: usize, value: Seqno) -> bool {
        let Some(s) = self.slot(q) else { return false };
        #[cfg(target_has_atomic = "64")]
        s.store(value.0, Ordering::Release);
        #[cfg(not(target_has_atomic = "64"))]
        {
            let [lo, hi] = s;
            lo.store(value.0 as u32, Ordering::Release);
            hi.store((value.0 >> 32) as u32, Ordering::Release);
        }
        p.cache_clean(&self.region, q.saturating_mul(FENCE_STRIDE), 8);
        true
    }

    /// Sets every slot of the region to 0 and cleans the region to the
    /// device (bring-up, before any engine runs).
    pub(crate) fn clear<P: Platform>(&mut self, p: &P) {
        for q in 0..self.region.len() / FENCE_STRIDE {
            if let Some(s) = self.slot(q) {
                #[cfg(target_has_atomic = "64")]
                s.store(0, Ordering::Release);
                #[cfg(not(target_has_atomic = "64"))]
                s.iter().for_each(|w| w.store(0, Ordering::Release));
            }
        }
        p.cache_clean(&self.region, 0, self.region.len());
    }
}
