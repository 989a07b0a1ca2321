//! The device's buffers: handles over size-class pools, with frees gated
//! on the fences of the work that may still use the memory.
//!
//! The rule (`docs/memory.md`, section 3): a block is never handed out again
//! until every fence of the work that may use it has signalled. A free
//! therefore makes the handle stale at once (no later use can name the
//! buffer) but keeps the memory and its GPU address out of circulation
//! until its *gate* has passed: for each queue, the last fence that may use
//! the buffer. The gate comes from the submissions that declared the buffer
//! ([`Tracking::Declared`]) or, by default, from every queue's last emitted
//! fence at the time of the free ([`Tracking::Implicit`]).
//!
//! A retiring buffer waits in the FIFO of one queue of its gate; when that
//! queue has passed its fence it moves to the FIFO of the next queue of the
//! gate, or goes back to the pool. A FIFO is checked from its oldest entry
//! and stops at the first whose fence has not signalled, so reclaiming is
//! O(entries released). A reset forces the queue's timeline past the
//! cancelled work (the engine is idle after it), which releases what that
//! work held; a lost device releases nothing until teardown.

use core::fmt;

use heapless::deque::DequeView;

use crate::config::Limit;
use crate::mem::buffer::{
    BufferDesc, BufferError, BufferHandle, BufferInfo, BufferSlot, BufferTable, LeakEntry, Live, Tracking,
};
use crate::mem::pool::{
    Backing, BackingError, Pool, PoolAlloc, PoolError, PoolStats, SizeClass, Slab, LARGE_GRANULE,
};
use crate::mem::va::{VaError, MIN_ALIGN};
use crate::sync::{DeviceId, Seqno, MAX_QUEUES};

/// Why an allocation failed: every cause is named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AllocError {
    /// Size 0.
    ZeroSize,
    /// Alignment not a power of two, or above 2 MiB.
    BadAlignment {
        /// Alignment asked.
        align: u64,
    },
    /// The size overflows the address space.
    TooLarge {
        /// Bytes asked.
        size: u64,
    },
    /// Every buffer handle is in use (live or waiting for a fence;
    /// [`Limit::Buffers`]).
    TableFull {
        /// The table's capacity.
        capacity: usize,
    },
    /// No GPU VA range is large enough.
    VaSpace {
        /// The class of the request.
        class: SizeClass,
    },
    /// The VA allocator's node storage is exhausted ([`Limit::VaNodes`]).
    VaNodes,
    /// The platform has no memory left for the block.
    PlatformMemory {
        /// The class of the request.
        class: SizeClass,
        /// Bytes the platform was asked for.
        len: usize,
    },
    /// The small or medium class has no slab descriptor left
    /// ([`Limit::Slabs`]).
    SlabCapacity {
        /// The class.
        class: SizeClass,
    },
    /// Mapping the memory for the GPU failed (no page-table page left, or
    /// the kernel refused the bind).
    Map {
        /// The class of the request.
        class: SizeClass,
    },
    /// The buffer asks for a GPU address alignment the platform's memory
    /// does not have: with the MMU bypassed a buffer's GPU address is its
    /// memory's own, so only the platform's alignment (4 KiB promised) is
    /// certain. Only an alignment the caller asked for
    /// ([`BufferDesc::align`]) is ever checked this way.
    Unaligned {
        /// Alignment the buffer asked for.
        align: u64,
        /// Device address of the memory the platform gave (and took back).
        got: u64,
    },
    /// The device is gone.
    DeviceLost,
    /// Local memory had no room (only while the driver frees some by
    /// eviction; a buffer that prefers local memory falls back to system
    /// memory rather than fail with this).
    LocalMemory,
    /// The fixed address ([`crate::engine::DeviceCore::alloc_at`]) is not a
    /// multiple of 4 KiB (one GPU page) and of the buffer's alignment.
    AddressUnaligned {
        /// Address asked.
        at: u64,
    },
    /// The fixed address range overlaps memory the device holds (a live
    /// buffer, or a slab of small ones).
    AddressInUse {
        /// Address asked.
        at: u64,
    },
    /// The fixed address range is not inside the device's GPU VA arena.
    AddressOutsideArena {
        /// Address asked.
        at: u64,
    },
    /// Fixed addresses need the driver to choose GPU addresses: with the
    /// MMU bypassed a buffer's address is its memory's.
    FixedAddressUnsupported,
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::ZeroSize => f.write_str("zero-sized buffer"),
            AllocError::BadAlignment { align } => {
                write!(f, "alignment {align:#x} is not a power of two up to 2 MiB")
            }
            AllocError::TooLarge { size } => write!(f, "{size} bytes overflow the address space"),
            AllocError::TableFull { capacity } => {
                write!(f, "all {capacity} buffer handles are in use; {}", Limit::Buffers)
            }
            AllocError::LocalMemory => write!(f, "local memory full"),
            AllocError::VaSpace { class } => {
                write!(f, "{} buffer: no GPU VA range is large enough", class.name())
            }
            AllocError::VaNodes => {
                write!(f, "GPU VA allocator node storage is exhausted; {}", Limit::VaNodes)
            }
            AllocError::PlatformMemory { class, len } => {
                write!(f, "{} buffer: platform memory exhausted ({len} bytes asked)", class.name())
            }
            AllocError::SlabCapacity { class } => {
                write!(f, "{} class exhausted: no slab descriptor left; {}", class.name(), Limit::Slabs)
            }
            AllocError::Map { class } => write!(f, "{} buffer: mapping for the GPU failed", class.name()),
            AllocError::Unaligned { align, got } => write!(
                f,
                "the buffer asks for {align:#x} alignment, the platform's memory is at {got:#x} (MMU bypassed: the GPU address is the memory's own)"
            ),
            AllocError::DeviceLost => f.write_str("device lost"),
            AllocError::AddressUnaligned { at } => {
                write!(f, "fixed GPU address {at:#x} is not 4 KiB- and alignment-aligned")
            }
            AllocError::AddressInUse { at } => write!(f, "GPU address range at {at:#x} is in use"),
            AllocError::AddressOutsideArena { at } => {
                write!(f, "GPU address range at {at:#x} is outside the VA arena")
            }
            AllocError::FixedAddressUnsupported => {
                f.write_str("no fixed GPU addresses with the MMU bypassed")
            }
        }
    }
}

impl core::error::Error for AllocError {}

impl AllocError {
    /// The capacity this error ran into, if it is a full table
    /// ([`Limit`] names the parameter to raise); `None` for every other
    /// cause.
    pub const fn limit(&self) -> Option<Limit> {
        match self {
            AllocError::TableFull { .. } => Some(Limit::Buffers),
            AllocError::VaNodes => Some(Limit::VaNodes),
            AllocError::SlabCapacity { .. } => Some(Limit::Slabs),
            _ => None,
        }
    }

    fn from_pool(e: PoolError, align: u64, at: Option<u64>) -> AllocError {
        match e {
            PoolError::ZeroSize => AllocError::ZeroSize,
            PoolError::BadAlignment { align } => match at {
                Some(at) => AllocError::AddressUnaligned { at },
                None => AllocError::BadAlignment { align },
            },
            PoolError::TooLarge { size } => AllocError::TooLarge { size },
            PoolError::SlabCapacity { class } => AllocError::SlabCapacity { class },
            PoolError::Backing { class, error } => match (error, at) {
                (BackingError::Va(VaError::Overlap), Some(at)) => AllocError::AddressInUse { at },
                (BackingError::Va(VaError::OutOfRange), Some(at)) => AllocError::AddressOutsideArena { at },
                (BackingError::Va(VaError::BadAlignment), Some(at)) => AllocError::AddressUnaligned { at },
                (error, _) => AllocError::from_backing(class, error, align),
            },
            PoolError::ForeignToken => AllocError::Map { class: SizeClass::Large },
        }
    }

    fn from_backing(class: SizeClass, error: BackingError, align: u64) -> AllocError {
        match error {
            BackingError::Va(VaError::NodeCapacity) => AllocError::VaNodes,
            BackingError::Va(VaError::Overflow) => AllocError::TooLarge { size: u64::MAX },
            BackingError::Va(_) => AllocError::VaSpace { class },
            BackingError::PlatformMemory { len } => AllocError::PlatformMemory { class, len },
            BackingError::Map => AllocError::Map { class },
            BackingError::Unaligned { addr } => AllocError::Unaligned { align, got: addr },
            BackingError::DeviceLost => AllocError::DeviceLost,
            BackingError::LocalMemory => AllocError::LocalMemory,
            BackingError::FixedAddress => AllocError::FixedAddressUnsupported,
        }
    }
}

/// Checks what a request asks for by itself (a size, an alignment that
/// is a power of two up to 2 MiB; 0 means 128 bytes) and returns the
/// alignment to use. The engine checks this before it touches anything,
/// so a bad request changes nothing, not even the frees it would
/// otherwise take back first.
pub(crate) fn checked_request(desc: &BufferDesc) -> Result<u64, AllocError> {
    if desc.size == 0 {
        return Err(AllocError::ZeroSize);
    }
    let align = if desc.align == 0 { MIN_ALIGN } else { desc.align };
    if !align.is_power_of_two() || align > crate::mem::pool::MAX_ALIGN {
        return Err(AllocError::BadAlignment { align: desc.align });
    }
    Ok(align)
}

/// What a fixed address asks for by itself, after [`checked_request`]: a
/// backing that can place one (`fixed`), a multiple of 4 KiB and of the
/// alignment, a range that does not wrap.
pub(crate) fn checked_address(at: u64, size: u64, align: u64, fixed: bool) -> Result<(), AllocError> {
    if !fixed {
        return Err(AllocError::FixedAddressUnsupported);
    }
    let need = align.max(LARGE_GRANULE);
    if at & need.wrapping_sub(1) != 0 {
        return Err(AllocError::AddressUnaligned { at });
    }
    fixed_range_end(at, size).ok_or(AllocError::TooLarge { size })?;
    Ok(())
}

/// End of the range a buffer of `size` bytes at fixed address `at` takes
/// (a large block: whole pages); `None` if it wraps.
pub(crate) fn fixed_range_end(at: u64, size: u64) -> Option<u64> {
    size.checked_next_multiple_of(LARGE_GRANULE).and_then(|l| at.checked_add(l))
}

/// Buffer statistics, O(1) to read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BufferStats {
    /// Pools per class (live, high water, fragmentation, backed bytes).
    pub pool: PoolStats,
    /// Live buffers.
    pub live: u64,
    /// Requested bytes of live buffers.
    pub live_bytes: u64,
    /// Freed buffers waiting for a fence.
    pub waiting: u64,
    /// Reserved bytes of those.
    pub waiting_bytes: u64,
    /// Handle table capacity.
    pub capacity: u64,
    /// Frees that had to wait for a fence.
    pub deferred_frees: u64,
    /// Frees released at once (nothing pending could use the buffer).
    pub immediate_frees: u64,
}

/// The device's buffers (see the module docs).
pub struct Buffers<'s, B> {
    table: BufferTable<'s, B>,
    pool: Pool<&'s mut [Slab<B>], B>,
    retiring: [&'s mut DequeView<u32>; MAX_QUEUES],
    serial: u64,
    deferred_frees: u64,
    immediate_frees: u64,
}

impl<B> fmt::Debug for Buffers<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffers").field("stats", &self.stats()).finish()
    }
}

impl<'s, B> Buffers<'s, B> {
    /// Buffers of `device` over caller storage (everything is reset).
    pub fn new(
        device: DeviceId,
        slots: &'s mut [BufferSlot<B>],
        slabs: &'s mut [Slab<B>],
        retiring: [&'s mut DequeView<u32>; MAX_QUEUES],
    ) -> Self {
        for s in slabs.iter_mut() {
            *s = Slab::EMPTY;
        }
        let mut retiring = retiring;
        for r in retiring.iter_mut() {
            r.clear();
        }
        Buffers {
            table: BufferTable::new(device, slots),
            pool: Pool::new(slabs),
            retiring,
            serial: 0,
            deferred_frees: 0,
            immediate_frees: 0,
        }
    }

    /// Handles the table holds (live and retiring buffers together).
    pub(crate) fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// Statistics.
    pub fn stats(&self) -> BufferStats {
        let (waiting, waiting_bytes) = self.table.retiring();
        BufferStats {
            pool: self.pool.stats(),
            live: u64::from(self.table.live()),
            live_bytes: self.table.live_bytes(),
            waiting: u64::from(waiting),
            waiting_bytes,
            capacity: self.table.capacity() as u64,
            deferred_frees: self.deferred_frees,
            immediate_frees: self.immediate_frees,
        }
    }

    /// Allocates a buffer. Short of memory it fails (`PlatformMemory`,
    /// `VaSpace`, ...) and changes nothing: kept empty slabs stay until
    /// [`Buffers::trim`] gives them back, after which a retry may succeed.
    pub fn alloc<K: Backing<Block = B>>(
        &mut self,
        backing: &mut K,
        desc: &BufferDesc,
    ) -> Result<BufferHandle, AllocError> {
        self.alloc_info(backing, desc).map(|(h, _)| h)
    }

    /// [`Buffers::alloc`], also returning what was allocated.
    pub fn alloc_info<K: Backing<Block = B>>(
        &mut self,
        backing: &mut K,
        desc: &BufferDesc,
    ) -> Result<(BufferHandle, BufferInfo), AllocError> {
        let align = checked_request(desc)?;
        self.alloc_placed(backing, desc, align, None)
    }

    /// [`Buffers::alloc_info`] at exactly GPU address `at` (see
    /// [`crate::engine::DeviceCore::alloc_at`]): a large block of its own.
    /// A range the backing holds is [`AllocError::AddressInUse`].
    pub fn alloc_at<K: Backing<Block = B>>(
        &mut self,
        backing: &mut K,
        desc: &BufferDesc,
        at: u64,
    ) -> Result<(BufferHandle, BufferInfo), AllocError> {
        let align = checked_request(desc)?;
        checked_address(at, desc.size, align, K::PLACES_AT)?;
        self.alloc_placed(backing, desc, align, Some(at))
    }

    /// The allocation of a checked request, anywhere (`at` `None`) or at
    /// a fixed address.
    #[inline(always)]
    fn alloc_placed<K: Backing<Block = B>>(
        &mut self,
        backing: &mut K,
        desc: &BufferDesc,
        align: u64,
        at: Option<u64>,
    ) -> Result<(BufferHandle, BufferInfo), AllocError> {
        // (Refused before without `PLACES_AT`; said here so that no code
        // for fixed addresses is left then.)
        let at = at.filter(|_| K::PLACES_AT);
        if self.table.is_full() {
            return Err(AllocError::TableFull { capacity: self.table.capacity() });
        }
        // One attempt: a caller short of memory gives kept slabs back
        // (`trim`) and tries again (the engine's slow path does).
        let a = match at {
            Some(at) => self.pool.alloc_at(backing, desc.size, at, desc.kind),
            None => self.pool.alloc(backing, desc.size, align, desc.kind),
        }
        .map_err(|e| AllocError::from_pool(e, align, at))?;
        self.serial = self.serial.wrapping_add(1);
        let info = BufferInfo {
            va: a.addr(),
            size: desc.size,
            reserved: a.reserved(),
            class: a.class(),
            kind: desc.kind,
            tracking: desc.tracking,
            tag: desc.tag,
            serial: self.serial,
        };
        match self.table.insert(info, a, desc.driver) {
            Ok(h) => Ok((h, info)),
            Err(a) => {
                // Unreachable in practice (checked above); give the memory back.
                let _ = self.pool.free(backing, a);
                Err(AllocError::TableFull { capacity: self.table.capacity() })
            }
        }
    }

    /// The live buffer `h` names.
    pub fn info(&self, h: BufferHandle) -> Result<BufferInfo, BufferError> {
        self.table.get(h).map(|l| l.info)
    }

    /// Checks that `h` names a live buffer of this device.
    pub fn check(&self, h: BufferHandle) -> Result<(), BufferError> {
        self.table.get(h).map(|_| ())
    }

    /// Records that submission `seqno` of `queue` uses `h` (the handle was
    /// checked under the same lock).
    pub fn note_use(&mut self, h: BufferHandle, queue: usize, seqno: Seqno) {
        if let Ok(l) = self.table.get_mut(h) {
            if let Some(s) = l.last_use.get_mut(queue) {
                *s = seqno.0;
                l.used |= 1u8 << (queue & 7);
            }
        }
    }

    /// The memory of `h`: its block, byte offset there, and size.
    pub fn memory(&self, h: BufferHandle) -> Result<(&B, u64, u64), BufferError> {
        let l = self.table.get(h)?;
        if l.info.kind.device_only {
            return Err(BufferError::NoCpuAccess);
        }
        let (b, off) = self.pool.block_of(&l.alloc).ok_or(BufferError::Stale)?;
        Ok((b, off, l.info.size))
    }

    /// Marks `h` mapped for the CPU (exclusive) or not.
    pub fn set_mapped(&mut self, h: BufferHandle, mapped: bool) -> Result<(), BufferError> {
        let l = self.table.get_mut(h)?;
        if mapped && l.mapped {
            return Err(BufferError::Mapped);
        }
        l.mapped = mapped;
        Ok(())
    }

    /// Frees `h`. `completed(q)` and `emitted(q)` read each queue's
    /// timeline; memory that pending work may use waits for it. With the
    /// device `lost`, the memory is kept until teardown (the device may
    /// still be using it; its fences will never come).
    pub fn free<K: Backing<Block = B>>(
        &mut self,
        backing: &mut K,
        h: BufferHandle,
        queues: usize,
        completed: &dyn Fn(usize) -> Seqno,
        emitted: &dyn Fn(usize) -> Seqno,
        lost: bool,
    ) -> Result<(), BufferError> {
        let l = self.table.get(h)?;
        if l.mapped {
            return Err(BufferError::Mapped);
        }
        if lost {
            let index = self.table.retire(h, [u64::MAX; MAX_QUEUES], 1)?;
            self.deferred_frees = self.deferred_frees.wrapping_add(1);
            self.enqueue(backing, index, 1);
            return Ok(());
        }
        let mut gate = [0u64; MAX_QUEUES];
        let mut mask = 0u8;
        for (q, g) in gate.iter_mut().enumerate().take(queues.min(MAX_QUEUES)) {
            let upto = match l.info.tracking {
                Tracking::Implicit => emitted(q),
                Tracking::Declared if l.used & (1u8 << (q & 7)) != 0 => {
                    Seqno(l.last_use.get(q).copied().unwrap_or(0))
                }
                Tracking::Declared => continue,
            };
            if upto.is_after(completed(q)) {
                *g = upto.0;
                mask |= 1u8 << (q & 7);
            }
        }
        let index = self.table.retire(h, gate, mask)?;
        if mask == 0 {
            self.immediate_frees = self.immediate_frees.wrapping_add(1);
            self.release(backing, index);
            return Ok(());
        }
        self.deferred_frees = self.deferred_frees.wrapping_add(1);
        self.enqueue(backing, index, mask);
        Ok(())
    }

    /// Puts retiring slot `index` in the FIFO of the first queue of `mask`.
    /// One copy on bare metal, where bytes count more than the call (three
    /// uses).
    #[cfg_attr(target_os = "none", inline(never))]
    fn enqueue<K: Backing<Block = B>>(&mut self, backing: &mut K, index: u32, mask: u8) {
        let q = mask.trailing_zeros() as usize;
        let pushed = self.retiring.get_mut(q).is_some_and(|f| f.push_back(index).is_ok());
        if !pushed {
            // Every FIFO holds the whole table, so this cannot happen; never
            // lose memory silently: keep it out of circulation until teardown.
            let _ = backing;
        }
    }

    fn release<K: Backing<Block = B>>(&mut self, backing: &mut K, index: u32) {
        if let Some(a) = self.table.release(index) {
            let _ = self.pool.free(backing, a);
        }
    }

    /// Returns to the pools up to `budget` buffers waiting on `queue` whose
    /// fence `completed(queue)` covers, oldest first, stopping early when
    /// the backing can take no more blocks now ([`Backing::can_release`]).
    /// Returns how many moved on (released or passed to another queue's
    /// FIFO).
    pub fn reclaim<K: Backing<Block = B>>(
        &mut self,
        backing: &mut K,
        queue: usize,
        completed: &dyn Fn(usize) -> Seqno,
        budget: usize,
    ) -> usize {
        let done = completed(queue);
        let mut n = 0usize;
        while n < budget && backing.can_release() {
            let Some(&index) = self.retiring.get(queue).and_then(|f| f.front()) else { break };
            let gate = self.table.retiring_mut(index).map(|r| (r.gate, r.mask));
            let Some((g, mask)) = gate else {
                // Not retiring any more (cannot happen): drop the entry.
                if let Some(f) = self.retiring.get_mut(queue) {
                    f.pop_front();
                }
                continue;
            };
            if !Seqno(g.get(queue).copied().unwrap_or(0)).is_signalled_by(done) {
                break;
            }
            if let Some(f) = self.retiring.get_mut(queue) {
                f.pop_front();
            }
            // Drop every queue of the gate that has passed too.
            let mut left = mask & !(1u8 << (queue & 7));
            for q in 0..MAX_QUEUES {
                let bit = 1u8 << q;
                if left & bit != 0 && Seqno(g.get(q).copied().unwrap_or(0)).is_signalled_by(completed(q)) {
                    left &= !bit;
                }
            }
            if let Some(r) = self.table.retiring_mut(index) {
                r.mask = left;
            }
            if left == 0 {
                self.release(backing, index);
            } else {
                self.enqueue(backing, index, left);
            }
            n = n.saturating_add(1);
        }
        n
    }

    /// Whether the oldest free waiting on `queue` may move on (its gate on
    /// that queue is covered by `done`): what a reclaim that ran out of
    /// budget left behind.
    pub fn front_ready(&self, queue: usize, done: Seqno) -> bool {
        let Some(&index) = self.retiring.get(queue).and_then(|f| f.front()) else { return false };
        self.table
            .retiring_ref(index)
            .is_some_and(|r| Seqno(r.gate.get(queue).copied().unwrap_or(0)).is_signalled_by(done))
    }

    /// The fence the oldest waiting free of some queue waits for (queue
    /// index, sequence number): what to wait for when memory runs out.
    pub fn oldest_waiting(&self) -> Option<(usize, Seqno)> {
        self.retiring.iter().enumerate().find_map(|(q, f)| {
            let index = *f.front()?;
            let r = self.table.retiring_ref(index)?;
            Some((q, Seqno(r.gate.get(q).copied().unwrap_or(0))))
        })
    }

    /// Whether `[lo, hi)` meets memory that will come free without its
    /// owner: a freed buffer waiting for its fences, or an empty slab the
    /// pool keeps ([`Buffers::trim`]). A fixed address held otherwise is
    /// refused at once. O(buffers + slab descriptors).
    pub fn frees_overlap(&self, lo: u64, hi: u64) -> bool {
        self.table.retiring_overlaps(lo, hi) || self.pool.kept_overlaps(lo, hi)
    }

    /// Buffers waiting on `queue`.
    pub fn waiting_on(&self, queue: usize) -> usize {
        self.retiring.get(queue).map_or(0, |f| f.storage_len())
    }

    /// Gives kept empty slabs back (memory pressure), as many as the
    /// backing can take now ([`Pool::trim`]). Returns bytes.
    pub fn trim<K: Backing<Block = B>>(&mut self, backing: &mut K) -> u64 {
        self.pool.trim(backing)
    }

    /// Whether the pools keep empty slabs ([`Buffers::trim`] would give
    /// some back).
    pub fn has_kept(&self) -> bool {
        self.pool.kept() > 0
    }

    /// The leak report: every live buffer with size, tag and number.
    pub fn leak_report(&self, f: impl FnMut(LeakEntry)) {
        self.table.for_each_live(f)
    }

    /// Teardown (the GPU is stopped): every buffer, live or waiting, and
    /// every slab goes back to the backing.
    pub fn release_all<K: Backing<Block = B>>(&mut self, backing: &mut K) {
        let pool = &mut self.pool;
        self.table.drain(|a: PoolAlloc<B>| {
            let _ = pool.free(backing, a);
        });
        for r in self.retiring.iter_mut() {
            r.clear();
        }
        self.pool.release_all(backing);
    }

    /// The live buffer state (for the device's checks).
    pub(crate) fn live(&self, h: BufferHandle) -> Result<&Live<B>, BufferError> {
        self.table.get(h)
    }

    /// The live buffer `h` names, mutably.
    pub(crate) fn live_mut(&mut self, h: BufferHandle) -> Result<&mut Live<B>, BufferError> {
        self.table.get_mut(h)
    }

    /// The live buffer with the smallest `key` (see `BufferTable::min_live`).
    pub(crate) fn min_live(&self, key: impl FnMut(&Live<B>) -> Option<u64>) -> Option<BufferHandle> {
        self.table.min_live(key)
    }

    /// The buffer (live, or freed and waiting for its fences) nearest to
    /// GPU address `addr`, with its handle when live. O(N).
    pub fn nearest(&self, addr: u64) -> Option<(BufferInfo, Option<BufferHandle>)> {
        self.table.nearest(addr)
    }
}
