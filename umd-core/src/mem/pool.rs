//! Size-class pools: where a buffer's GPU address and memory come from.
//!
//! Requests are split into three classes (`docs/memory.md`, section 2) so
//! that small and large allocations never fragment each other:
//!
//! | class | request size | where it comes from |
//! | --- | --- | --- |
//! | small | < 1 KiB | slabs, power-of-two bins 128, 256, 512, 1024 B |
//! | medium | 1 KiB ..= 64 KiB | slabs, power-of-two bins 1, 2, 4, ..., 64 KiB |
//! | large | > 64 KiB (or alignment > 4 KiB) | a block of its own, 4 KiB granular |
//!
//! A *slab* is one block of platform memory, mapped for the GPU once, carved
//! into equal slots of one bin (sub-allocation of small objects out of a
//! larger block, like Mesa's `pb_slab`): a small buffer costs no platform
//! allocation and no page-table update, only a bit in the slab's bitmap. A
//! slab has at most 64 slots (a `u64` bitmap, so a slot is found with one
//! `trailing_zeros`) and at most [`SLAB_MAX_BYTES`]. Slabs are kept apart
//! by [`MemKind`] (GPU read-only or not, CPU-visible or not), because those
//! are properties of the mapping or of the memory.
//!
//! Memory and addresses come from a [`Backing`]: on a device with an MMU a
//! VA range plus platform memory mapped by the page tables; in kernel mode
//! a VA range plus a kernel bind; with the MMU bypassed the memory's own
//! device address. The pool only keeps the bookkeeping.
//!
//! When a slab's last slot is freed it is kept (up to [`KEEP_EMPTY`] per
//! kind and bin) for
//! the next allocation, so an alloc/free loop does not map and unmap a slab
//! each time; [`Pool::trim`] gives every kept slab back (memory pressure,
//! teardown). The large class is *not* rounded to powers of two: the VA
//! allocator splits and coalesces exactly (see `docs/memory.md`).
//!
//! Costs: slab allocation and free are O(1) unless a slab is created or
//! released (one backing call); large allocation and free are one backing
//! call each.

use core::fmt;

use crate::mem::va::{self, VaError};

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
/// Largest alignment a buffer may ask for (the largest GPU page).
pub const MAX_ALIGN: u64 = 2 << 20;
/// Empty slabs kept per kind and bin for the next allocations (a batch of
/// buffers freed and allocated again maps nothing).
pub const KEEP_EMPTY: u8 = 4;
/// Kinds of memory kept apart ([`MemKind::index`]).
pub const KINDS: usize = 4;

const NIL: u32 = u32::MAX;

/// The three size classes (`docs/memory.md`, section 2).
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

    /// A short name, for logs and reports.
    pub const fn name(self) -> &'static str {
        match self {
            SizeClass::Small => "small",
            SizeClass::Medium => "medium",
            SizeClass::Large => "large",
        }
    }
}

/// Properties of memory that slabs must not mix.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemKind {
    /// The GPU may only read it (no WRITE bit in its page-table entries).
    pub gpu_read_only: bool,
    /// The CPU never touches it (the platform may give memory without a
    /// CPU mapping).
    pub device_only: bool,
    /// Placed in the device's local memory when it has some and there is
    /// room (`docs/memory.md`, "Local memory and eviction"); always a block
    /// of its own.
    pub local: bool,
}

impl MemKind {
    /// Read-write, CPU-visible: the default.
    pub const DEFAULT: MemKind = MemKind { gpu_read_only: false, device_only: false, local: false };

    /// Index of the kind in per-kind tables (`0..KINDS`).
    pub const fn index(self) -> usize {
        (self.gpu_read_only as usize) | ((self.device_only as usize) << 1)
    }
}

/// Why the backing could not provide memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackingError {
    /// The GPU VA allocator refused (no hole, alignment, node storage).
    Va(VaError),
    /// The platform had no memory for the block (bytes asked).
    PlatformMemory {
        /// Bytes asked.
        len: usize,
    },
    /// Mapping the block failed (no page-table page, kernel bind refused).
    Map,
    /// The platform's memory is not aligned as the buffer needs (MMU
    /// bypassed: the GPU address is the memory's own, which the driver can
    /// not choose).
    Unaligned {
        /// Device address of the memory the platform gave.
        addr: u64,
    },
    /// The device is gone.
    DeviceLost,
    /// Local memory has no room for the block.
    LocalMemory,
    /// A block at a fixed address was asked of a backing that does not
    /// choose GPU addresses (MMU bypassed: the address is the memory's).
    FixedAddress,
}

impl fmt::Display for BackingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackingError::Va(e) => write!(f, "GPU VA: {e}"),
            BackingError::PlatformMemory { len } => {
                write!(f, "platform memory exhausted ({len} bytes asked)")
            }
            BackingError::Map => f.write_str("mapping the memory for the GPU failed"),
            BackingError::Unaligned { addr } => write!(
                f,
                "platform memory at {addr:#x} is not aligned as the buffer asks (MMU bypassed: the GPU address is the memory's own)"
            ),
            BackingError::LocalMemory => f.write_str("local memory full"),
            BackingError::DeviceLost => f.write_str("device lost"),
            BackingError::FixedAddress => f.write_str("no fixed GPU addresses (MMU bypassed)"),
        }
    }
}

impl core::error::Error for BackingError {}

/// Where a block's GPU address goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Anywhere, aligned to this power of two.
    Aligned(u64),
    /// Exactly at this address (a multiple of [`LARGE_GRANULE`]): the
    /// backing refuses with [`BackingError::Va`] of [`VaError::Overlap`]
    /// when it is taken, [`VaError::OutOfRange`] when it is outside the
    /// arena, and [`BackingError::FixedAddress`] when it does not choose
    /// addresses (MMU bypassed).
    At(u64),
}

/// Where the pool gets blocks of GPU-visible memory and their addresses.
pub trait Backing {
    /// The memory of one block (a platform region).
    type Block;

    /// Whether [`Place::At`] can ever be honoured (false: GPU addresses
    /// are the memory's own). Where it is false the buffer manager
    /// refuses fixed addresses without calling the backing, and links no
    /// code for them.
    const PLACES_AT: bool;

    /// A block of `bytes` (a multiple of 4 KiB) at a GPU address placed as
    /// `place` says, mapped for the GPU: its address and memory.
    /// [`Place::Aligned`] is the alignment the buffer needs: a backing may
    /// align more (2 MiB for a block of 2 MiB or more, so page tables can
    /// use 2 MiB entries) but must not refuse a block for missing more.
    fn acquire(
        &mut self,
        bytes: u64,
        place: Place,
        kind: MemKind,
    ) -> Result<(u64, Self::Block), BackingError>;

    /// Unmaps and frees a block from [`Backing::acquire`] (the GPU no
    /// longer uses it).
    fn release(&mut self, addr: u64, bytes: u64, block: Self::Block);

    /// Whether one more block may be released now. A backing that defers
    /// the freeing of released memory until a lock is dropped keeps a
    /// bounded number of blocks; the calls that release many
    /// ([`Pool::trim`], the buffer manager's reclaim) stop when this is
    /// false, and their caller calls them again once it has freed what they
    /// released. A single free releases at most one block.
    fn can_release(&self) -> bool {
        true
    }
}

/// Why a pool operation was refused. The pool is unchanged after any error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolError {
    /// Size 0.
    ZeroSize,
    /// Alignment not a power of two, or above [`MAX_ALIGN`].
    BadAlignment {
        /// Alignment asked.
        align: u64,
    },
    /// The request overflows the address space.
    TooLarge {
        /// Bytes asked.
        size: u64,
    },
    /// Every slab descriptor is in use (the small or medium class is
    /// exhausted).
    SlabCapacity {
        /// The class that needed a new slab.
        class: SizeClass,
    },
    /// The backing refused.
    Backing {
        /// The class the request fell in.
        class: SizeClass,
        /// Why.
        error: BackingError,
    },
    /// The allocation does not belong to this pool's live allocations.
    ForeignToken,
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::ZeroSize => f.write_str("zero-sized allocation"),
            PoolError::BadAlignment { align } => {
                write!(f, "alignment {align:#x} is not a power of two up to {MAX_ALIGN:#x}")
            }
            PoolError::TooLarge { size } => write!(f, "{size} bytes overflow the address space"),
            PoolError::SlabCapacity { class } => {
                write!(f, "{} class exhausted: every slab descriptor is in use", class.name())
            }
            PoolError::Backing { class, error } => write!(f, "{} allocation: {error}", class.name()),
            PoolError::ForeignToken => f.write_str("not a live allocation of this pool"),
        }
    }
}

impl core::error::Error for PoolError {}

/// A live pool allocation. Deliberately neither `Clone` nor `Copy`: giving
/// it back to [`Pool::free`] consumes it. A large allocation carries its
/// own block.
#[derive(Debug, PartialEq, Eq)]
pub struct PoolAlloc<B> {
    addr: u64,
    size: u64,
    reserved: u64,
    kind: Kind<B>,
}

#[derive(Debug, PartialEq, Eq)]
enum Kind<B> {
    Slab { slab: u32, slot: u8, gen: u32 },
    Large { block: B },
}

impl<B> PoolAlloc<B> {
    /// GPU address.
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
    /// The block of a large allocation (a slab slot has none of its own).
    pub fn block(&self) -> Option<&B> {
        match &self.kind {
            Kind::Large { block } => Some(block),
            Kind::Slab { .. } => None,
        }
    }
    /// Puts `new` in place of a large allocation's block (its memory moved,
    /// same GPU address) and returns the old one; a slab slot gives `new`
    /// back.
    pub fn replace_block(&mut self, new: B) -> Result<B, B> {
        match &mut self.kind {
            Kind::Large { block } => Ok(core::mem::replace(block, new)),
            Kind::Slab { .. } => Err(new),
        }
    }
    /// The size class this allocation was served from.
    pub fn class(&self) -> SizeClass {
        match self.kind {
            Kind::Large { .. } => SizeClass::Large,
            Kind::Slab { .. } => SizeClass::of(self.size),
        }
    }
}

/// One slab descriptor (storage the integrator provides, see
/// [`crate::storage::DeviceStorage`]).
#[derive(Debug)]
pub struct Slab<B> {
    base: u64,
    used: u64,
    gen: u32,
    next: u32,
    prev: u32,
    bin: u8,
    kind: u8,
    slots: u8,
    /// The class of the request that made it (statistics).
    class: u8,
    live: bool,
    block: Option<B>,
}

impl<B> Slab<B> {
    /// An unused descriptor.
    pub const EMPTY: Slab<B> = Slab {
        base: 0,
        used: 0,
        gen: 0,
        next: NIL,
        prev: NIL,
        bin: 0,
        kind: 0,
        slots: 0,
        class: 0,
        live: false,
        block: None,
    };
}

fn class_from(c: u8) -> SizeClass {
    match c {
        0 => SizeClass::Small,
        1 => SizeClass::Medium,
        _ => SizeClass::Large,
    }
}

/// Per-class counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Live allocations.
    pub live: u64,
    /// Requested bytes of those allocations.
    pub requested: u64,
    /// Reserved bytes (slot or page rounded).
    pub reserved: u64,
    /// Highest `reserved` seen.
    pub high_water: u64,
    /// Bytes of slabs (or large blocks) of this class held from the
    /// platform, live or kept empty.
    pub backed: u64,
}

impl ClassStats {
    /// Internal fragmentation in parts per million: reserved bytes not
    /// asked for, plus backed bytes not reserved, over backed bytes.
    pub fn fragmentation_ppm(&self) -> u32 {
        if self.backed == 0 {
            return 0;
        }
        let waste = self.backed.saturating_sub(self.requested);
        u128::from(waste).saturating_mul(1_000_000).checked_div(u128::from(self.backed)).unwrap_or(0) as u32
    }
}

/// Pool statistics, O(1) to read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Small, medium, large.
    pub classes: [ClassStats; 3],
    /// Slab descriptors in use (live and kept empty).
    pub slabs: u64,
    /// Empty slabs kept for reuse.
    pub empty_slabs: u64,
    /// Slab descriptors available in total.
    pub slab_capacity: u64,
    /// Blocks acquired from the backing since the start.
    pub blocks_acquired: u64,
    /// Blocks released to the backing since the start.
    pub blocks_released: u64,
}

/// Size-class pools over slab storage `SL`, with blocks of type `B`.
pub struct Pool<SL, B> {
    slabs: SL,
    free_slab: u32,
    slab_bump: u32,
    slabs_live: u32,
    empty: u32,
    partial: [[u32; BINS]; KINDS],
    /// Empty slabs per kind and bin: a list through `Slab::next`.
    kept: [[u32; BINS]; KINDS],
    kept_n: [[u8; BINS]; KINDS],
    stats: PoolStats,
    _block: core::marker::PhantomData<B>,
}

impl<SL, B> fmt::Debug for Pool<SL, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool").field("stats", &self.stats).finish()
    }
}

impl<SL, B> Pool<SL, B>
where
    SL: AsRef<[Slab<B>]> + AsMut<[Slab<B>]>,
{
    /// A pool with the slab descriptors in `slabs` (all must be
    /// [`Slab::EMPTY`]).
    pub fn new(slabs: SL) -> Self {
        let cap = slabs.as_ref().len().min(NIL as usize) as u64;
        Pool {
            slabs,
            free_slab: NIL,
            slab_bump: 0,
            slabs_live: 0,
            empty: 0,
            partial: [[NIL; BINS]; KINDS],
            kept: [[NIL; BINS]; KINDS],
            kept_n: [[0; BINS]; KINDS],
            stats: PoolStats { slab_capacity: cap, ..PoolStats::default() },
            _block: core::marker::PhantomData,
        }
    }

    /// Statistics snapshot. O(1).
    pub fn stats(&self) -> PoolStats {
        let mut s = self.stats;
        s.slabs = u64::from(self.slabs_live);
        s.empty_slabs = u64::from(self.empty);
        s
    }

    /// Allocates `size` bytes aligned to `align` (a power of two up to
    /// [`MAX_ALIGN`]) of memory `kind`, from the class `size` falls in.
    /// Alignments above 4 KiB go to the large class.
    pub fn alloc<K: Backing<Block = B>>(
        &mut self,
        backing: &mut K,
        size: u64,
        align: u64,
        kind: MemKind,
    ) -> Result<PoolAlloc<B>, PoolError> {
        if size == 0 {
            return Err(PoolError::ZeroSize);
        }
        if !align.is_power_of_two() || align > MAX_ALIGN {
            return Err(PoolError::BadAlignment { align });
        }
        match slot_for(size, align) {
            Some((bin, _)) if size <= MEDIUM_MAX && !kind.local => self.alloc_slot(backing, size, bin, kind),
            _ => self.alloc_large(backing, size, Place::Aligned(align), kind),
        }
    }

    /// Allocates `size` bytes at exactly GPU address `at`, a multiple of
    /// [`LARGE_GRANULE`]: always a large block of its own (a slab's
    /// address is the slab's). The pool is unchanged after any error.
    pub fn alloc_at<K: Backing<Block = B>>(
        &mut self,
        backing: &mut K,
        size: u64,
        at: u64,
        kind: MemKind,
    ) -> Result<PoolAlloc<B>, PoolError> {
        if size == 0 {
            return Err(PoolError::ZeroSize);
        }
        if at % LARGE_GRANULE != 0 {
            return Err(PoolError::BadAlignment { align: LARGE_GRANULE });
        }
        self.alloc_large(backing, size, Place::At(at), kind)
    }

    /// Returns an allocation: the caller asserts the GPU no longer uses it.
    /// Returns the reserved bytes released.
    pub fn free<K: Backing<Block = B>>(
        &mut self,
        backing: &mut K,
        a: PoolAlloc<B>,
    ) -> Result<u64, PoolError> {
        if !self.owns(&a) {
            return Err(PoolError::ForeignToken);
        }
        let size = a.size;
        match a.kind {
            Kind::Slab { slab, slot, .. } => {
                let Some(s) = self.slabs.as_mut().get_mut(slab as usize) else {
                    return Err(PoolError::ForeignToken);
                };
                let was_full = s.used == slot_mask(s.slots);
                s.used &= !(1u64 << (slot & 63));
                let empty = s.used == 0;
                let (bin, kind) = (usize::from(s.bin), usize::from(s.kind));
                let slot_size = bin_size(bin);
                if !was_full {
                    self.unlink(slab);
                }
                if empty {
                    self.keep_or_release(backing, slab, bin, kind);
                } else {
                    self.push_partial(slab, bin, kind);
                }
                self.count(SizeClass::of(size), size, slot_size, false);
                Ok(slot_size)
            }
            Kind::Large { block } => {
                backing.release(a.addr, a.reserved, block);
                self.count(SizeClass::Large, size, a.reserved, false);
                self.backed(SizeClass::Large, a.reserved, false);
                self.stats.blocks_released = self.stats.blocks_released.wrapping_add(1);
                Ok(a.reserved)
            }
        }
    }

    /// The block an allocation lives in and its byte offset there.
    pub fn block_of<'a>(&'a self, a: &'a PoolAlloc<B>) -> Option<(&'a B, u64)> {
        match &a.kind {
            Kind::Large { block } => Some((block, 0)),
            Kind::Slab { slab, gen, .. } => {
                let s = self.slabs.as_ref().get(*slab as usize).filter(|s| s.live && s.gen == *gen)?;
                Some((s.block.as_ref()?, a.addr.checked_sub(s.base)?))
            }
        }
    }

    /// Gives every kept empty slab back to the backing, or as many as it
    /// can take now ([`Backing::can_release`]: call again for the rest).
    /// Returns bytes.
    pub fn trim<K: Backing<Block = B>>(&mut self, backing: &mut K) -> u64 {
        let mut bytes = 0u64;
        for kind in 0..KINDS {
            for bin in 0..BINS {
                while backing.can_release() {
                    let Some(s) = self.take_kept(kind, bin) else { break };
                    bytes = bytes.saturating_add(self.release_slab(backing, s));
                }
            }
        }
        bytes
    }

    /// Empty slabs kept for reuse.
    pub fn kept(&self) -> u64 {
        u64::from(self.empty)
    }

    /// Whether a kept empty slab's block meets `[lo, hi)` (what
    /// [`Pool::trim`] would give back there). O(slab descriptors).
    pub fn kept_overlaps(&self, lo: u64, hi: u64) -> bool {
        self.slabs.as_ref().iter().any(|s| {
            s.live && s.used == 0 && s.base < hi && lo < s.base.saturating_add(slab_bytes(usize::from(s.bin)))
        })
    }

    /// Releases every slab (live or kept) and forgets every allocation:
    /// teardown, when the GPU is stopped. Large allocations are released by
    /// whoever holds them ([`Pool::free`]).
    pub fn release_all<K: Backing<Block = B>>(&mut self, backing: &mut K) {
        let n = self.slabs.as_ref().len();
        for i in 0..n {
            if self.slabs.as_ref().get(i).is_some_and(|s| s.live) {
                self.release_slab(backing, i as u32);
            }
        }
        self.partial = [[NIL; BINS]; KINDS];
        self.kept = [[NIL; BINS]; KINDS];
        self.kept_n = [[0; BINS]; KINDS];
        self.empty = 0;
    }

    /// Takes a kept empty slab of `kind` and `bin`, if any.
    fn take_kept(&mut self, kind: usize, bin: usize) -> Option<u32> {
        let s = self.kept.get(kind).and_then(|k| k.get(bin)).copied().filter(|s| *s != NIL)?;
        let next = self.slabs.as_ref().get(s as usize).map_or(NIL, |x| x.next);
        if let Some(k) = self.kept.get_mut(kind).and_then(|k| k.get_mut(bin)) {
            *k = next;
        }
        if let Some(n) = self.kept_n.get_mut(kind).and_then(|k| k.get_mut(bin)) {
            *n = n.saturating_sub(1);
        }
        if let Some(x) = self.slabs.as_mut().get_mut(s as usize) {
            x.next = NIL;
        }
        self.empty = self.empty.saturating_sub(1);
        Some(s)
    }

    // ----- slabs -----------------------------------------------------------

    fn alloc_slot<K: Backing<Block = B>>(
        &mut self,
        backing: &mut K,
        size: u64,
        bin: usize,
        kind: MemKind,
    ) -> Result<PoolAlloc<B>, PoolError> {
        let k = kind.index();
        let mut s = self.partial.get(k).and_then(|p| p.get(bin)).copied().unwrap_or(NIL);
        if s == NIL {
            if let Some(kept) = self.take_kept(k, bin) {
                s = kept;
                self.push_partial(s, bin, k);
            }
        }
        if s == NIL {
            s = self.new_slab(backing, bin, kind, SizeClass::of(size))?;
        }
        let slab = self.slabs.as_mut().get_mut(s as usize).ok_or(PoolError::ForeignToken)?;
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
        self.count(SizeClass::of(size), size, slot_size, true);
        Ok(PoolAlloc {
            addr,
            size,
            reserved: slot_size,
            kind: Kind::Slab { slab: s, slot: u8::try_from(slot).unwrap_or(0), gen },
        })
    }

    fn new_slab<K: Backing<Block = B>>(
        &mut self,
        backing: &mut K,
        bin: usize,
        kind: MemKind,
        class: SizeClass,
    ) -> Result<u32, PoolError> {
        let idx = if self.free_slab != NIL {
            self.free_slab
        } else if (self.slab_bump as usize) < self.slabs.as_ref().len() && self.slab_bump != NIL {
            self.slab_bump
        } else {
            return Err(PoolError::SlabCapacity { class });
        };
        let slots = slots_per_slab(bin);
        let bytes = slab_bytes(bin);
        let (base, block) = backing
            .acquire(bytes, Place::Aligned(LARGE_GRANULE), kind)
            .map_err(|error| PoolError::Backing { class, error })?;
        // Committed: take the descriptor.
        if idx == self.free_slab {
            self.free_slab = self.slabs.as_ref().get(idx as usize).map_or(NIL, |s| s.next);
        } else {
            self.slab_bump = self.slab_bump.wrapping_add(1);
        }
        let gen = self.slabs.as_ref().get(idx as usize).map_or(0, |s| s.gen.wrapping_add(1));
        if let Some(s) = self.slabs.as_mut().get_mut(idx as usize) {
            *s = Slab {
                base,
                used: 0,
                gen,
                next: NIL,
                prev: NIL,
                bin: bin as u8,
                kind: kind.index() as u8,
                slots,
                class: class as u8,
                live: true,
                block: Some(block),
            };
        }
        self.push_partial(idx, bin, kind.index());
        self.slabs_live = self.slabs_live.wrapping_add(1);
        self.backed(class, bytes, true);
        self.stats.blocks_acquired = self.stats.blocks_acquired.wrapping_add(1);
        Ok(idx)
    }

    /// An empty slab: kept if its kind and bin keep fewer than
    /// [`KEEP_EMPTY`], else released.
    fn keep_or_release<K: Backing<Block = B>>(&mut self, backing: &mut K, s: u32, bin: usize, kind: usize) {
        let n = self.kept_n.get(kind).and_then(|k| k.get(bin)).copied().unwrap_or(KEEP_EMPTY);
        if n >= KEEP_EMPTY {
            self.release_slab(backing, s);
            return;
        }
        let head = self.kept.get(kind).and_then(|k| k.get(bin)).copied().unwrap_or(NIL);
        if let Some(x) = self.slabs.as_mut().get_mut(s as usize) {
            x.next = head;
            x.prev = NIL;
        }
        if let Some(k) = self.kept.get_mut(kind).and_then(|k| k.get_mut(bin)) {
            *k = s;
        }
        if let Some(c) = self.kept_n.get_mut(kind).and_then(|k| k.get_mut(bin)) {
            *c = c.saturating_add(1);
        }
        self.empty = self.empty.saturating_add(1);
    }

    /// Gives slab `s`'s block back and frees its descriptor. Returns bytes.
    fn release_slab<K: Backing<Block = B>>(&mut self, backing: &mut K, s: u32) -> u64 {
        let next = self.free_slab;
        let Some(x) = self.slabs.as_mut().get_mut(s as usize) else { return 0 };
        let (base, bin, class) = (x.base, usize::from(x.bin), class_from(x.class));
        let block = x.block.take();
        x.live = false;
        x.used = 0;
        x.next = next;
        x.prev = NIL;
        self.free_slab = s;
        self.slabs_live = self.slabs_live.wrapping_sub(1);
        let bytes = slab_bytes(bin);
        if let Some(b) = block {
            backing.release(base, bytes, b);
            self.stats.blocks_released = self.stats.blocks_released.wrapping_add(1);
        }
        self.backed(class, bytes, false);
        bytes
    }

    fn unlink(&mut self, s: u32) {
        let Some(&Slab { next, prev, bin, kind, .. }) = self.slabs.as_ref().get(s as usize) else {
            return;
        };
        let slabs = self.slabs.as_mut();
        if let Some(p) = slabs.get_mut(prev as usize) {
            p.next = next;
        } else if let Some(head) =
            self.partial.get_mut(usize::from(kind)).and_then(|k| k.get_mut(usize::from(bin)))
        {
            if *head == s {
                *head = next;
            }
        }
        if let Some(n) = slabs.get_mut(next as usize) {
            n.prev = prev;
        }
        if let Some(x) = slabs.get_mut(s as usize) {
            x.next = NIL;
            x.prev = NIL;
        }
    }

    fn push_partial(&mut self, s: u32, bin: usize, kind: usize) {
        let head = self.partial.get(kind).and_then(|k| k.get(bin)).copied().unwrap_or(NIL);
        let slabs = self.slabs.as_mut();
        if let Some(x) = slabs.get_mut(s as usize) {
            x.prev = NIL;
            x.next = head;
        }
        if let Some(h) = slabs.get_mut(head as usize) {
            h.prev = s;
        }
        if let Some(p) = self.partial.get_mut(kind).and_then(|k| k.get_mut(bin)) {
            *p = s;
        }
    }

    // ----- large -----------------------------------------------------------

    fn alloc_large<K: Backing<Block = B>>(
        &mut self,
        backing: &mut K,
        size: u64,
        place: Place,
        kind: MemKind,
    ) -> Result<PoolAlloc<B>, PoolError> {
        let rounded = round_up(size, LARGE_GRANULE).ok_or(PoolError::TooLarge { size })?;
        // The alignment the buffer needs, never more: a backing that maps
        // through page tables may place a block of 2 MiB or more on a
        // 2 MiB boundary for their 2 MiB entries (a preference of its own,
        // `Backing::acquire`), but one whose GPU address is the memory's
        // own (MMU bypassed) can only check what it got, and refusing a
        // block for missing a preference would refuse every large buffer.
        let place = match place {
            Place::Aligned(align) => Place::Aligned(align.max(LARGE_GRANULE)),
            at @ Place::At(_) => at,
        };
        let (addr, block) = backing
            .acquire(rounded, place, kind)
            .map_err(|error| PoolError::Backing { class: SizeClass::Large, error })?;
        self.count(SizeClass::Large, size, rounded, true);
        self.backed(SizeClass::Large, rounded, true);
        self.stats.blocks_acquired = self.stats.blocks_acquired.wrapping_add(1);
        Ok(PoolAlloc { addr, size, reserved: rounded, kind: Kind::Large { block } })
    }

    // ----- common ----------------------------------------------------------

    fn owns(&self, a: &PoolAlloc<B>) -> bool {
        match a.kind {
            Kind::Slab { slab, slot, gen } => self.slabs.as_ref().get(slab as usize).is_some_and(|s| {
                s.live && s.gen == gen && slot < s.slots && s.used & (1u64 << (slot & 63)) != 0
            }),
            Kind::Large { .. } => true,
        }
    }

    /// Counts an allocation (`add`) or a free in its class. One copy on
    /// bare metal, where bytes count more than the call (four uses).
    #[cfg_attr(target_os = "none", inline(never))]
    fn count(&mut self, class: SizeClass, size: u64, reserved: u64, add: bool) {
        let Some(c) = self.stats.classes.get_mut(class as usize) else { return };
        if add {
            c.live = c.live.wrapping_add(1);
            c.requested = c.requested.wrapping_add(size);
            c.reserved = c.reserved.wrapping_add(reserved);
            c.high_water = c.high_water.max(c.reserved);
        } else {
            c.live = c.live.wrapping_sub(1);
            c.requested = c.requested.wrapping_sub(size);
            c.reserved = c.reserved.wrapping_sub(reserved);
        }
    }

    fn backed(&mut self, class: SizeClass, bytes: u64, add: bool) {
        if let Some(c) = self.stats.classes.get_mut(class as usize) {
            c.backed = if add { c.backed.wrapping_add(bytes) } else { c.backed.wrapping_sub(bytes) };
        }
    }
}

/// Bytes of a slab of `bin`: its slots, rounded to whole pages.
fn slab_bytes(bin: usize) -> u64 {
    round_up(bin_size(bin).wrapping_mul(u64::from(slots_per_slab(bin))), LARGE_GRANULE)
        .unwrap_or(SLAB_MAX_BYTES)
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

/// The bits of a slab's `slots` slots. One shared copy with `size-first`
/// on bare metal (a 64-bit shift is long on 32-bit targets; three uses).
#[cfg_attr(all(feature = "size-first", target_os = "none"), inline(never))]
const fn slot_mask(slots: u8) -> u64 {
    if slots >= 64 {
        u64::MAX
    } else {
        (1u64 << slots).wrapping_sub(1)
    }
}

/// The bin and slot size for a slab request, or `None` when it must go
/// large. Slabs start 4 KiB aligned (the platform's page, which is all a
/// bypassed MMU can promise), so their slots are aligned to their size up
/// to 4 KiB: an alignment above that goes to the large class, which aligns
/// each block exactly.
fn slot_for(size: u64, align: u64) -> Option<(usize, u64)> {
    if align > LARGE_GRANULE {
        return None;
    }
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
