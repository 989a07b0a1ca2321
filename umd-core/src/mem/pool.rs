//! Size-class pools with fence-gated reuse.
//!
//! Following the article (section 6.2), requests are split into three
//! classes so that small and large allocations never fragment each other:
//!
//! | class | request size | where it comes from |
//! | --- | --- | --- |
//! | small | < 1 KiB | slabs, power-of-two bins 128, 256, 512, 1024 B |
//! | medium | 1 KiB ..= 64 KiB | slabs, power-of-two bins 1, 2, 4, ..., 64 KiB |
//! | large | > 64 KiB | straight from the VA allocator, 4 KiB granular |
//!
//! A *slab* is one VA range carved into equal slots of one bin (sub-allocation
//! of small objects out of a larger block, like Mesa's `pb_slab`). It has at
//! most 64 slots (a `u64` bitmap, so a slot is found with one
//! `trailing_zeros`) and at most [`SLAB_MAX_BYTES`]. Slabs are placed at the
//! high end of the hole the allocator picks and large ranges at the low end,
//! so in a fresh arena the two populations grow from opposite ends; once
//! holes open in the middle, good-fit placement may interleave them there. A slab is returned to the VA allocator as soon as
//! its last slot is freed, so after everything is freed the arena is one hole.
//!
//! The large class is *not* rounded to powers of two: the VA allocator
//! coalesces and splits exactly, and rounding a 65 KiB request to 128 KiB
//! would waste up to half of it (buddy allocation's weakness). Its bins are
//! statistics only.
//!
//! Frees can be deferred until a fence signals ([`Pool::free_after`]); see
//! [`crate::mem::deferred`].
//!
//! Costs: slab allocation and free are O(1) unless a slab is created or
//! released (one O(log n) VA operation); large allocation and free are
//! O(log n); [`Pool::reclaim`] is O(budget) pool frees.

use core::fmt;

use crate::mem::deferred::{DeferredError, DeferredFifo};
use crate::mem::va::{self, Placement, VaAllocator, VaError, VaNode, VaStats};
use crate::sync::seqno::{FenceId, Seqno};

/// Largest request served from slabs; larger ones are "large".
pub const MEDIUM_MAX: u64 = 64 * 1024;
/// Requests below this are "small".
pub const SMALL_LIMIT: u64 = 1024;
/// Smallest slot (the VA allocator's granule).
pub const MIN_SLOT: u64 = va::MIN_ALIGN;
/// Number of power-of-two slab bins: 128 B to 64 KiB.
pub const BINS: usize = 10;
/// Upper bound on one slab's size.
pub const SLAB_MAX_BYTES: u64 = 256 * 1024;
/// Granule and minimum alignment of large allocations (one GPU page).
pub const LARGE_GRANULE: u64 = 4096;

const NIL: u32 = u32::MAX;

/// The article's three size classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeClass {
    /// Below 1 KiB.
    Small = 0,
    /// 1 KiB to 64 KiB.
    Medium = 1,
    /// Above 64 KiB.
    Large = 2,
}

impl SizeClass {
    /// The class of a request of `size` bytes.
    pub const fn of(size: u64) -> SizeClass {
        if size < SMALL_LIMIT {
            SizeClass::Small
        } else if size <= MEDIUM_MAX {
            SizeClass::Medium
        } else {
            SizeClass::Large
        }
    }
}

/// Why a pool operation was refused. The pool is unchanged after any error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolError {
    /// The VA allocator refused (no space, bad size or alignment, nodes).
    Va(VaError),
    /// Every slab descriptor is in use.
    SlabCapacity,
    /// The deferred-free FIFO refused.
    Deferred(DeferredError),
    /// The token does not belong to this pool's live allocations.
    ForeignToken,
}

impl From<VaError> for PoolError {
    fn from(e: VaError) -> Self {
        PoolError::Va(e)
    }
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::Va(e) => write!(f, "pool: {e}"),
            PoolError::SlabCapacity => f.write_str("pool: slab descriptors exhausted"),
            PoolError::Deferred(e) => write!(f, "pool: {e}"),
            PoolError::ForeignToken => f.write_str("pool: token is not a live allocation of this pool"),
        }
    }
}

/// A live pool allocation. Deliberately neither `Clone` nor `Copy`: giving
/// it back to [`Pool::free`] or [`Pool::free_after`] consumes it, so a double
/// free does not compile. Handles that can be copied live one layer up
/// ([`crate::mem::buffer`]) and carry generations.
#[derive(Debug, PartialEq, Eq)]
pub struct PoolAlloc {
    addr: u64,
    size: u64,
    reserved: u64,
    kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Slab { slab: u32, slot: u8, gen: u32 },
    Large,
}

impl PoolAlloc {
    /// GPU virtual address.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Requested size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }
    /// Bytes actually reserved (slot size, or the request rounded to 4 KiB).
    pub fn reserved(&self) -> u64 {
        self.reserved
    }
    /// The size class this allocation was served from.
    pub fn class(&self) -> SizeClass {
        SizeClass::of(self.size)
    }
}

/// One slab descriptor.
#[derive(Clone, Copy, Debug)]
struct Slab {
    base: u64,
    used: u64,
    gen: u32,
    next: u32,
    prev: u32,
    bin: u8,
    slots: u8,
    live: bool,
}

const EMPTY_SLAB: Slab =
    Slab { base: 0, used: 0, gen: 0, next: NIL, prev: NIL, bin: 0, slots: 0, live: false };

/// Per-class counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Live allocations (including those waiting for a fence).
    pub live: u64,
    /// Requested bytes of those allocations.
    pub requested: u64,
    /// Reserved bytes (slot or page rounded).
    pub reserved: u64,
}

/// Pool statistics, O(1) to read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// The underlying VA allocator (slabs count as used in full).
    pub va: VaStats,
    /// Small, medium, large.
    pub classes: [ClassStats; 3],
    /// Slab descriptors in use.
    pub slabs: u64,
    /// Slab descriptors available in total.
    pub slab_capacity: u64,
    /// Allocations freed but waiting for a fence.
    pub pending: u64,
    /// Reserved bytes of those.
    pub pending_bytes: u64,
}

/// Size-class pools over a VA allocator.
///
/// `S` is the VA node storage, `SLABS` the number of slab descriptors,
/// `DEFERRED` the capacity of each queue's deferred-free FIFO and `QUEUES`
/// the number of queues whose fences gate reuse.
pub struct Pool<S, const SLABS: usize, const DEFERRED: usize, const QUEUES: usize> {
    va: VaAllocator<S>,
    slabs: [Slab; SLABS],
    free_slab: u32,
    slab_bump: u32,
    slabs_live: u32,
    partial: [u32; BINS],
    deferred: [DeferredFifo<PoolAlloc, DEFERRED>; QUEUES],
    classes: [ClassStats; 3],
    pending: u64,
    pending_bytes: u64,
}

impl<S, const SLABS: usize, const DEFERRED: usize, const QUEUES: usize> Pool<S, SLABS, DEFERRED, QUEUES>
where
    S: AsRef<[VaNode]> + AsMut<[VaNode]>,
{
    /// A pool that hands out addresses from `va`.
    pub fn new(va: VaAllocator<S>) -> Self {
        Pool {
            va,
            slabs: [EMPTY_SLAB; SLABS],
            free_slab: NIL,
            slab_bump: 0,
            slabs_live: 0,
            partial: [NIL; BINS],
            deferred: [const { DeferredFifo::new() }; QUEUES],
            classes: [ClassStats::default(); 3],
            pending: 0,
            pending_bytes: 0,
        }
    }

    /// The VA allocator underneath (read-only: for dumps and stats).
    pub fn va(&self) -> &VaAllocator<S> {
        &self.va
    }

    /// Allocates `size` bytes aligned to `align` (a power of two) from the
    /// class that `size` falls in. Alignments above 64 KiB send the request
    /// to the large class.
    pub fn alloc(&mut self, size: u64, align: u64) -> Result<PoolAlloc, PoolError> {
        if size == 0 {
            return Err(VaError::ZeroSize.into());
        }
        if !align.is_power_of_two() {
            return Err(VaError::BadAlignment.into());
        }
        match slot_for(size, align) {
            Some((bin, _)) if size <= MEDIUM_MAX => self.alloc_slot(size, bin),
            _ => self.alloc_large(size, align),
        }
    }

    /// Returns an allocation to the pool now: the caller asserts the GPU no
    /// longer uses it. Returns the reserved bytes released.
    pub fn free(&mut self, a: PoolAlloc) -> Result<u64, PoolError> {
        self.release(&a)
    }

    /// Defers the free of `a` until `fence` has signalled. On error the
    /// allocation is handed back untouched.
    pub fn free_after(&mut self, a: PoolAlloc, fence: FenceId) -> Result<(), (PoolError, PoolAlloc)> {
        if !self.owns(&a) {
            return Err((PoolError::ForeignToken, a));
        }
        let reserved = a.reserved();
        let Some(q) = self.deferred.get_mut(usize::from(fence.queue.0)) else {
            return Err((PoolError::Deferred(DeferredError::BadQueue), a));
        };
        let addr = a.addr;
        let large = a.kind == Kind::Large;
        q.push(fence, a).map_err(|(e, a)| (PoolError::Deferred(e), a))?;
        if large {
            // Keep the VA view consistent for dumps; cannot fail: owns() checked it.
            let _ = self.va.retire(addr);
        }
        self.pending = self.pending.wrapping_add(1);
        self.pending_bytes = self.pending_bytes.wrapping_add(reserved);
        Ok(())
    }

    /// Returns to the pool up to `budget` deferred allocations of `queue`
    /// whose fence is signalled by `completed`, oldest first, stopping at the
    /// first unsignalled one. Returns how many were reclaimed. O(budget)
    /// frees, so callers bound the time spent per call.
    pub fn reclaim(&mut self, queue: u8, completed: Seqno, budget: usize) -> usize {
        let mut n = 0usize;
        for _ in 0..budget {
            let Some(q) = self.deferred.get_mut(usize::from(queue)) else {
                break;
            };
            let Some((_, a)) = q.pop_signalled(completed) else {
                break;
            };
            self.pending = self.pending.wrapping_sub(1);
            self.pending_bytes = self.pending_bytes.wrapping_sub(a.reserved());
            // Cannot fail: entries were validated on the way in and are
            // owned by the FIFO since.
            let _ = self.release(&a);
            n = n.wrapping_add(1);
        }
        n
    }

    /// Reclaims every deferred allocation of every queue regardless of its
    /// fence: only for teardown or after a device reset proved the GPU idle.
    pub fn reclaim_all_idle(&mut self) -> usize {
        let mut items: usize = 0;
        for qi in 0..QUEUES {
            for _ in 0..DEFERRED {
                let Some(q) = self.deferred.get_mut(qi) else {
                    break;
                };
                let Some(f) = q.oldest() else {
                    break;
                };
                let Some((_, a)) = q.pop_signalled(f.seqno) else {
                    break;
                };
                self.pending = self.pending.wrapping_sub(1);
                self.pending_bytes = self.pending_bytes.wrapping_sub(a.reserved());
                let _ = self.release(&a);
                items = items.wrapping_add(1);
            }
        }
        items
    }

    /// Number of deferred entries waiting on `queue`.
    pub fn pending_on(&self, queue: u8) -> usize {
        self.deferred.get(usize::from(queue)).map_or(0, DeferredFifo::len)
    }

    /// Statistics snapshot. O(1).
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            va: self.va.stats(),
            classes: self.classes,
            slabs: u64::from(self.slabs_live),
            slab_capacity: SLABS as u64,
            pending: self.pending,
            pending_bytes: self.pending_bytes,
        }
    }

    // ----- slabs -----------------------------------------------------------

    fn alloc_slot(&mut self, size: u64, bin: usize) -> Result<PoolAlloc, PoolError> {
        let mut s = self.partial.get(bin).copied().unwrap_or(NIL);
        if s == NIL {
            s = self.new_slab(bin)?;
        }
        let slab = self.slabs.get_mut(s as usize).ok_or(PoolError::SlabCapacity)?;
        let free = !slab.used & slot_mask(slab.slots);
        let slot = free.trailing_zeros();
        slab.used |= 1u64 << (slot & 63);
        let full = slab.used == slot_mask(slab.slots);
        let slot_size = bin_size(bin);
        let addr = slab.base.wrapping_add(u64::from(slot).wrapping_mul(slot_size));
        let gen = slab.gen;
        if full {
            self.unlink(s);
        }
        self.count(size, slot_size, true);
        Ok(PoolAlloc {
            addr,
            size,
            reserved: slot_size,
            kind: Kind::Slab { slab: s, slot: u8::try_from(slot).unwrap_or(0), gen },
        })
    }

    fn new_slab(&mut self, bin: usize) -> Result<u32, PoolError> {
        let idx = if self.free_slab != NIL {
            self.free_slab
        } else if (self.slab_bump as usize) < SLABS {
            self.slab_bump
        } else {
            return Err(PoolError::SlabCapacity);
        };
        let slot = bin_size(bin);
        let slots = slots_per_slab(bin);
        let bytes = slot.wrapping_mul(u64::from(slots));
        let base = self.va.alloc(bytes, slot.max(LARGE_GRANULE), Placement::TopDown)?;
        // Committed: take the descriptor.
        if idx == self.free_slab {
            self.free_slab = self.slabs.get(idx as usize).map_or(NIL, |s| s.next);
        } else {
            self.slab_bump = self.slab_bump.wrapping_add(1);
        }
        let head = self.partial.get(bin).copied().unwrap_or(NIL);
        if let Some(s) = self.slabs.get_mut(idx as usize) {
            s.base = base;
            s.used = 0;
            s.gen = s.gen.wrapping_add(1);
            s.bin = u8::try_from(bin).unwrap_or(0);
            s.slots = slots;
            s.live = true;
            s.prev = NIL;
            s.next = head;
        }
        if let Some(h) = self.slabs.get_mut(head as usize) {
            h.prev = idx;
        }
        if let Some(p) = self.partial.get_mut(bin) {
            *p = idx;
        }
        self.slabs_live = self.slabs_live.wrapping_add(1);
        Ok(idx)
    }

    fn unlink(&mut self, s: u32) {
        let Some(&Slab { next, prev, bin, .. }) = self.slabs.get(s as usize) else {
            return;
        };
        if let Some(p) = self.slabs.get_mut(prev as usize) {
            p.next = next;
        } else if let Some(head) = self.partial.get_mut(usize::from(bin)) {
            *head = next;
        }
        if let Some(n) = self.slabs.get_mut(next as usize) {
            n.prev = prev;
        }
        if let Some(x) = self.slabs.get_mut(s as usize) {
            x.next = NIL;
            x.prev = NIL;
        }
    }

    fn push_partial(&mut self, s: u32, bin: usize) {
        let head = self.partial.get(bin).copied().unwrap_or(NIL);
        if let Some(x) = self.slabs.get_mut(s as usize) {
            x.prev = NIL;
            x.next = head;
        }
        if let Some(h) = self.slabs.get_mut(head as usize) {
            h.prev = s;
        }
        if let Some(p) = self.partial.get_mut(bin) {
            *p = s;
        }
    }

    // ----- large -----------------------------------------------------------

    fn alloc_large(&mut self, size: u64, align: u64) -> Result<PoolAlloc, PoolError> {
        let rounded = round_up(size, LARGE_GRANULE).ok_or(VaError::Overflow)?;
        let addr = self.va.alloc(rounded, align.max(LARGE_GRANULE), Placement::BottomUp)?;
        self.count(size, rounded, true);
        Ok(PoolAlloc { addr, size, reserved: rounded, kind: Kind::Large })
    }

    // ----- common ----------------------------------------------------------

    fn owns(&self, a: &PoolAlloc) -> bool {
        match a.kind {
            Kind::Slab { slab, slot, gen } => self.slabs.get(slab as usize).is_some_and(|s| {
                s.live && s.gen == gen && slot < s.slots && s.used & (1u64 << (slot & 63)) != 0
            }),
            Kind::Large => self.va.lookup(a.addr).is_some_and(|r| r.size == a.reserved),
        }
    }

    fn release(&mut self, a: &PoolAlloc) -> Result<u64, PoolError> {
        if !self.owns(a) {
            return Err(PoolError::ForeignToken);
        }
        match a.kind {
            Kind::Slab { slab, slot, .. } => {
                let Some(s) = self.slabs.get_mut(slab as usize) else {
                    return Err(PoolError::ForeignToken);
                };
                let was_full = s.used == slot_mask(s.slots);
                s.used &= !(1u64 << (slot & 63));
                let empty = s.used == 0;
                let bin = usize::from(s.bin);
                let base = s.base;
                let slot_size = bin_size(bin);
                if empty {
                    if !was_full {
                        self.unlink(slab);
                    }
                    let _ = self.va.free(base);
                    let next = self.free_slab;
                    if let Some(s) = self.slabs.get_mut(slab as usize) {
                        s.live = false;
                        s.next = next;
                        s.prev = NIL;
                    }
                    self.free_slab = slab;
                    self.slabs_live = self.slabs_live.wrapping_sub(1);
                } else if was_full {
                    self.push_partial(slab, bin);
                }
                self.count(a.size, slot_size, false);
                Ok(slot_size)
            }
            Kind::Large => {
                let r = self.va.free(a.addr)?;
                self.count(a.size, r, false);
                Ok(r)
            }
        }
    }

    fn count(&mut self, size: u64, reserved: u64, add: bool) {
        let c = match self.classes.get_mut(SizeClass::of(size) as usize) {
            Some(c) => c,
            None => return,
        };
        if add {
            c.live = c.live.wrapping_add(1);
            c.requested = c.requested.wrapping_add(size);
            c.reserved = c.reserved.wrapping_add(reserved);
        } else {
            c.live = c.live.wrapping_sub(1);
            c.requested = c.requested.wrapping_sub(size);
            c.reserved = c.reserved.wrapping_sub(reserved);
        }
    }
}

/// Slot size of bin `b`: 128 B << b.
const fn bin_size(bin: usize) -> u64 {
    MIN_SLOT << (bin & 15)
}

/// Slots per slab for bin `b`: 64, or fewer so the slab stays within
/// [`SLAB_MAX_BYTES`] (64 KiB slots: 4 per slab).
const fn slots_per_slab(bin: usize) -> u8 {
    // bin_size is a power of two >= 128; shifting by its log2 divides.
    let by_bytes = SLAB_MAX_BYTES >> bin_size(bin).trailing_zeros();
    if by_bytes >= 64 {
        64
    } else {
        by_bytes as u8
    }
}

const fn slot_mask(slots: u8) -> u64 {
    if slots >= 64 {
        u64::MAX
    } else {
        (1u64 << slots).wrapping_sub(1)
    }
}

/// The bin and slot size for a slab request, or `None` when it must go large.
fn slot_for(size: u64, align: u64) -> Option<(usize, u64)> {
    let need = size.max(align).max(MIN_SLOT);
    if need > MEDIUM_MAX {
        return None;
    }
    let slot = need.checked_next_power_of_two()?;
    let bin = (slot.trailing_zeros().wrapping_sub(MIN_SLOT.trailing_zeros())) as usize;
    Some((bin, slot))
}

fn round_up(v: u64, g: u64) -> Option<u64> {
    let m = g.wrapping_sub(1);
    Some(v.checked_add(m)? & !m)
}
