//! Buffers through the device: allocation from the size-class pools, frees
//! gated on fences, CPU access with the cache maintenance done for the
//! caller, and the leak report.
//!
//! CPU access never hands out memory that can outlive the buffer: copies
//! ([`DeviceCore::write`], [`DeviceCore::read`]) check the handle and do the cache
//! maintenance over the exact range, and a mapping ([`DeviceCore::map`]) is a
//! guard that borrows the device (so the device can not be dropped under
//! it), keeps the buffer from being freed or mapped twice, invalidates the
//! CPU cache when created and cleans it when dropped.

use core::fmt;
use core::marker::PhantomData;

use crate::mem::buffer::{BufferDesc, BufferError, BufferHandle, BufferInfo, LeakEntry};
use crate::mem::local::Residency;
use crate::mem::manager::AllocError;
use crate::mem::pagetable::{CachePolicy, Perms};
use crate::mem::pool::{Backing, BackingError, MemKind, Place};
use crate::mem::va::{VaAllocator, VaNode, VaPlacement};
use crate::platform::{DmaFlags, DmaRegion, Platform};
use crate::storage::Backed;
use crate::sync::QueueId;

use super::backend::sealed::VaHold;
use super::backend::Backend;
use super::{Counters, DeviceCore};

/// Most buffers one submission declares.
pub const MAX_BUFFER_USES: usize = 64;

/// How a submission uses a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferAccess {
    /// The GPU reads it.
    Read,
    /// The GPU writes it.
    Write,
    /// Both.
    ReadWrite,
}

/// A buffer a submission declares (its BO list entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferUse {
    /// The buffer.
    pub buffer: BufferHandle,
    /// How it is used.
    pub access: BufferAccess,
}

impl BufferUse {
    /// Read by the GPU.
    pub const fn read(buffer: BufferHandle) -> BufferUse {
        BufferUse { buffer, access: BufferAccess::Read }
    }
    /// Written by the GPU.
    pub const fn write(buffer: BufferHandle) -> BufferUse {
        BufferUse { buffer, access: BufferAccess::Write }
    }
    /// Read and written by the GPU.
    pub const fn read_write(buffer: BufferHandle) -> BufferUse {
        BufferUse { buffer, access: BufferAccess::ReadWrite }
    }
}

/// The pools' view of memory: platform blocks, GPU addresses from the VA
/// allocator (or the memory's own address with the MMU bypassed), mapped
/// by the backend.
pub(crate) struct Backer<'a, 'd, B: Backend> {
    pub(crate) b: &'a B,
    pub(crate) va: &'a mut VaSlot<'d, B>,
    pub(crate) maps: &'a mut B::Maps,
    pub(crate) local: &'a mut crate::mem::local::LocalMem<'d>,
    /// A local-memory block that finds no room comes from system memory
    /// instead (after eviction failed to make room).
    pub(crate) fallback: bool,
    /// The platform calls this pass leaves for after the memory lock.
    pub(crate) off: &'a mut OffLock,
}

/// Blocks one pass under the memory lock may give back: they are freed
/// once the lock is dropped. A pass that would release more stops
/// ([`Backing::can_release`]) and the caller runs another.
pub(crate) const DEAD_MAX: usize = 8;

/// The platform's memory calls of one pass under the memory lock, done
/// outside it: `dma_alloc` zeroes memory and `dma_free` may take an OS
/// call, so neither runs while the lock is held (`docs/architecture.md`,
/// "Thread model"). An allocation that needs a new block reserves
/// nothing the first time: it notes the block's size and flags
/// ([`OffLock::need`]), leaves no trace, and the caller allocates the
/// memory with the lock dropped ([`OffLock::prepare`]) and tries again
/// with it at hand ([`OffLock::spare`]); memory the second try did not use
/// goes back after it. Blocks released under the lock wait in
/// [`OffLock::dead`] until [`OffLock::finish`].
#[derive(Debug)]
pub(crate) struct OffLock {
    /// Memory allocated with the lock dropped: its length, flags and the
    /// platform's answer.
    spare: Option<(usize, DmaFlags, Result<DmaRegion, BackingError>)>,
    /// The block the last pass needed and found no spare for.
    need: Option<(usize, DmaFlags)>,
    /// Blocks released under the lock, to free after it (a length, not
    /// eight empty slots: a pass that releases nothing costs nothing).
    dead: heapless::Vec<DmaRegion, DEAD_MAX>,
}

impl OffLock {
    /// Nothing at hand, nothing to free.
    pub(crate) const fn new() -> OffLock {
        OffLock { spare: None, need: None, dead: heapless::Vec::new() }
    }

    /// Whether a block may be released under the lock (there is room to
    /// keep it until the lock is dropped).
    pub(crate) fn can_release(&self) -> bool {
        !self.dead.is_full()
    }

    /// Whether nothing waits to be freed after the lock (nothing for
    /// [`OffLock::finish`] to do).
    pub(crate) fn is_empty(&self) -> bool {
        self.spare.is_none() && self.dead.is_empty()
    }

    /// Whether the pass needed platform memory it did not have.
    pub(crate) fn needs_memory(&self) -> bool {
        self.need.is_some()
    }

    /// The memory for a block of `len` bytes with `flags`: the spare if it
    /// is that block (taken), else `None` and the block is noted as needed.
    fn take(&mut self, len: usize, flags: DmaFlags) -> Option<Result<DmaRegion, BackingError>> {
        match self.spare.take() {
            Some((l, f, mem)) if l == len && f == flags => Some(mem),
            other => {
                self.spare = other;
                self.need = Some((len, flags));
                None
            }
        }
    }

    /// Memory taken by [`OffLock::take`] that the block did not keep (its
    /// address could not be had or mapped): freed after the lock. Handed
    /// back when there is no room for it (the caller frees it at once).
    fn unused(&mut self, region: DmaRegion, flags: DmaFlags) -> Result<(), DmaRegion> {
        if self.spare.is_some() {
            // (Cannot happen: the spare was taken.)
            return self.bury(region);
        }
        self.spare = Some((region.len(), flags, Ok(region)));
        Ok(())
    }

    /// Keeps a released block for [`OffLock::finish`]; hands it back when
    /// there is no room (the caller frees it at once).
    fn bury(&mut self, region: DmaRegion) -> Result<(), DmaRegion> {
        self.dead.push(region)
    }

    /// With the lock dropped: frees the spare the last pass did not use
    /// and allocates the block it needed, if any. Returns whether there
    /// is a block to try again with.
    pub(crate) fn prepare<P: Platform>(&mut self, p: &P) -> bool {
        if let Some((_, _, Ok(r))) = self.spare.take() {
            p.dma_free(r);
        }
        let Some((len, flags)) = self.need.take() else { return false };
        let mem = p.dma_alloc(len, flags).map_err(|e| match e {
            crate::platform::PlatformError::DeviceLost => BackingError::DeviceLost,
            _ => BackingError::PlatformMemory { len },
        });
        self.spare = Some((len, flags, mem));
        true
    }

    /// With the lock dropped: frees the unused spare and every block
    /// released under the lock.
    pub(crate) fn finish<P: Platform>(&mut self, p: &P) {
        if let Some((_, _, Ok(r))) = self.spare.take() {
            p.dma_free(r);
        }
        self.need = None;
        while let Some(r) = self.dead.pop() {
            p.dma_free(r);
        }
    }
}

/// The platform's flags for memory of `kind`.
fn flags_of(kind: MemKind) -> DmaFlags {
    if kind.device_only {
        DmaFlags::DEVICE_ONLY
    } else {
        DmaFlags::CPU
    }
}

/// The driver's GPU VA allocator: with recycling
/// ([`VaAllocator::new_recycling`]), so a freed range of up to 8 KiB (an
/// 8 KiB slab of 128 B slots given back, a 4 or 8 KiB block of its own) is
/// handed to the next request of its length in O(1) instead of being
/// coalesced; an allocation that would fail flushes the kept ranges into
/// the holes and tries again, so out-of-VA errors are those of the plain
/// allocator.
pub(crate) type DriverVa<'d> = VaAllocator<&'d mut [VaNode], true>;

/// The engine's GPU VA allocator as backend `B` may use it: empty with
/// the MMU bypassed, and always empty when `B` can not translate at all
/// ([`Backend::VA_ALLOCATOR`] false: direct mode without the `mmu`
/// feature). There the answer is a compile-time constant, so none of the
/// allocator's code is linked; every use goes through [`VaSlot::get_mut`]
/// or [`VaSlot::get`].
/// Where `B` can not use one, the slot is [`Backend::Va`]'s nothing: no
/// bytes of the device.
pub(crate) struct VaSlot<'d, B: Backend> {
    alloc: B::Va<'d>,
    _backend: PhantomData<fn() -> B>,
}

impl<'d, B: Backend> VaSlot<'d, B> {
    /// Holds `alloc` (ignored when `B` can not use one).
    pub(crate) fn new(alloc: Option<DriverVa<'d>>) -> Self {
        VaSlot { alloc: B::Va::hold(alloc), _backend: PhantomData }
    }

    /// Whether GPU addresses come from the allocator (false: they are the
    /// memory's device addresses).
    #[inline(always)]
    pub(crate) fn is_some(&self) -> bool {
        self.get().is_some()
    }

    /// The allocator, if any.
    #[inline(always)]
    pub(crate) fn get(&self) -> Option<&DriverVa<'d>> {
        if B::VA_ALLOCATOR {
            self.alloc.get()
        } else {
            None
        }
    }

    /// The allocator, if any.
    #[inline(always)]
    pub(crate) fn get_mut(&mut self) -> Option<&mut DriverVa<'d>> {
        if B::VA_ALLOCATOR {
            self.alloc.get_mut()
        } else {
            None
        }
    }
}

impl<'d, B: Backend> Backer<'_, 'd, B> {
    /// The memory of a block of `bytes`: local memory when `kind` asks for
    /// it and there is room (else [`BackingError::LocalMemory`] unless
    /// falling back), otherwise the platform's.
    ///
    /// Platform memory is never allocated here (under the memory lock):
    /// it is the spare allocated before the pass ([`OffLock`]), or the
    /// block is noted as needed and refused with
    /// [`BackingError::PlatformMemory`], which the engine answers by
    /// allocating it with the lock dropped and trying again.
    fn memory(&mut self, bytes: u64, kind: MemKind) -> Result<DmaRegion, BackingError> {
        let len = usize::try_from(bytes).map_err(|_| BackingError::PlatformMemory { len: usize::MAX })?;
        let local = if kind.local && self.va.is_some() {
            self.local.alloc(bytes).map(DmaRegion::local)
        } else {
            None
        };
        match local {
            Some(r) => Ok(r),
            None if kind.local && self.local.is_active() && self.va.is_some() && !self.fallback => {
                Err(BackingError::LocalMemory)
            }
            None => self.off.take(len, flags_of(kind)).unwrap_or(Err(BackingError::PlatformMemory { len })),
        }
    }

    /// Gives back memory [`Backer::memory`] returned that the block did not
    /// keep: local memory at once, the platform's after the lock.
    fn unused(&mut self, region: DmaRegion, kind: MemKind) {
        if region.residency() == Residency::Local {
            self.local.free(region.into_local_pages());
        } else if let Err(r) = self.off.unused(region, flags_of(kind)) {
            self.b.platform().dma_free(r);
        }
    }
}

impl<'d, B: Backend> Backing for Backer<'_, 'd, B> {
    type Block = Backed;
    const PLACES_AT: bool = B::VA_ALLOCATOR;

    fn acquire(&mut self, bytes: u64, place: Place, kind: MemKind) -> Result<(u64, Backed), BackingError> {
        // A fixed address takes its range first: one that is taken or
        // outside the arena is refused before any memory is asked for.
        let (fixed, align) = match place {
            Place::At(at) => {
                let Some(va) = self.va.get_mut() else {
                    return Err(BackingError::FixedAddress);
                };
                (Some(va.alloc_fixed_handle(at, bytes).map_err(BackingError::Va)?), 0)
            }
            Place::Aligned(align) => (None, align),
        };
        let region = match self.memory(bytes, kind) {
            Ok(region) => region,
            Err(e) => {
                if let (Some(h), Some(va)) = (fixed, self.va.get_mut()) {
                    let _ = va.free_handle(h);
                }
                return Err(e);
            }
        };
        let Some(va) = self.va.get_mut() else {
            // MMU bypassed: the GPU address is the memory's (a fixed
            // address was refused above).
            // Only the alignment the buffer needs is checked: there are no
            // page tables, so no 2 MiB preference.
            let addr = region.dev_addr();
            if addr.checked_rem(align) != Some(0) {
                self.unused(region, kind);
                return Err(BackingError::Unaligned { addr });
            }
            return Ok((addr, Backed { region, va: None }));
        };
        // A block of 2 MiB or more goes on a 2 MiB boundary, so the page
        // tables can map it with 2 MiB entries.
        let align =
            if bytes >= crate::mem::pool::MAX_ALIGN { align.max(crate::mem::pool::MAX_ALIGN) } else { align };
        let handle = match fixed.map_or_else(|| va.alloc_handle(bytes, align, VaPlacement::BottomUp), Ok) {
            Ok(h) => h,
            Err(e) => {
                self.unused(region, kind);
                return Err(BackingError::Va(e));
            }
        };
        let addr = handle.addr();
        let perms = Perms { read: true, write: !kind.gpu_read_only, cache: CachePolicy::Uncached };
        if let Err(e) = self.b.map(self.maps, addr, &region, perms) {
            let _ = va.free_handle(handle);
            self.unused(region, kind);
            return Err(e);
        }
        Ok((addr, Backed { region, va: Some(handle) }))
    }

    fn can_release(&self) -> bool {
        self.off.can_release()
    }

    fn release(&mut self, addr: u64, bytes: u64, block: Backed) {
        if let Some(va) = self.va.get_mut() {
            // A range that may still be mapped keeps its VA reserved for
            // good: given out again, the next map of it would fail (or
            // alias the old memory).
            if self.b.unmap(self.maps, addr, bytes).is_ok() {
                let _ = match block.va {
                    Some(h) if h.addr() == addr => va.free_handle(h),
                    _ => va.free(addr),
                };
            }
        }
        let block = block.region;
        if block.residency() == Residency::Local {
            self.local.free(block.into_local_pages());
        } else if let Err(block) = self.off.bury(block) {
            // No room to keep it until the lock is dropped: only where no
            // lock is held (teardown) or a caller released more than it
            // checked for (`can_release`).
            self.b.platform().dma_free(block);
        }
    }
}

impl<'d, B: Backend, const CHUNKS: usize> DeviceCore<'d, B, CHUNKS> {
    /// Allocates a buffer: small and medium ones are slots of a slab mapped
    /// once (no platform allocation, no page-table update), large ones get
    /// a block of their own. CPU-visible memory comes zeroed. When memory
    /// or handles run out while freed buffers wait for their fences, it
    /// waits (servicing the device) for the oldest of those, up to the
    /// hang-check limit. Every failure names its cause.
    pub fn alloc(&self, desc: &BufferDesc) -> Result<BufferHandle, AllocError> {
        self.alloc_info(desc).map(|(h, _)| h)
    }

    /// [`DeviceCore::alloc`], also returning what was allocated.
    pub fn alloc_info(&self, desc: &BufferDesc) -> Result<(BufferHandle, BufferInfo), AllocError> {
        if self.is_lost() {
            return Err(AllocError::DeviceLost);
        }
        // A bad request is refused before anything is touched.
        crate::mem::manager::checked_request(desc)?;
        // Memory whose fences have signalled goes back first.
        self.process_all();
        match self.try_alloc(desc, None, false, None) {
            Ok(r) => Ok(r),
            Err(_) => self.alloc_waiting(desc, None),
        }
    }

    /// Allocates a buffer at exactly GPU address `va`, as libdrm's
    /// `va_base_required` or Vulkan's capture/replay addresses: a replayed
    /// command stream, or an address agreed with another agent. `va` must
    /// be a multiple of 4 KiB (one GPU page) and of `desc.align`
    /// ([`AllocError::AddressUnaligned`]); the buffer is a block of its
    /// own (never a slab slot) and needs the driver to choose GPU addresses,
    /// with the MMU on or in kernel mode
    /// ([`AllocError::FixedAddressUnsupported`]). A range outside the VA
    /// arena is [`AllocError::AddressOutsideArena`], one a live buffer
    /// holds [`AllocError::AddressInUse`] at once; a range that buffers
    /// freed under in-flight work still hold is waited for as memory is in
    /// [`DeviceCore::alloc`], so it is never handed out while that work may
    /// use it. A refusal changes nothing.
    pub fn alloc_at(&self, desc: &BufferDesc, va: u64) -> Result<BufferHandle, AllocError> {
        if self.is_lost() {
            return Err(AllocError::DeviceLost);
        }
        let align = crate::mem::manager::checked_request(desc)?;
        crate::mem::manager::checked_address(va, desc.size, align, B::VA_ALLOCATOR)?;
        // No completion pass first (as `alloc_info` makes): a range that
        // frees whose fences have passed hold is taken back by the retry.
        match self.try_alloc(desc, Some(va), false, None) {
            Ok((h, _)) => Ok(h),
            Err(_) => self.alloc_waiting(desc, Some(va)).map(|(h, _)| h),
        }
    }

    /// One allocation attempt (`fallback`: a local-memory buffer may go to
    /// system memory); a slab slot handed out is zeroed. A failure leaves
    /// no trace; with `oldest` it also notes there the queue and fence the
    /// oldest free still waiting waits for (what a caller may wait for).
    ///
    /// The platform's memory is never allocated or freed under the memory
    /// lock: a pass that needs a new block (a slab, a large buffer) fails
    /// without a trace and notes the block; the block is allocated with the
    /// lock dropped and the pass runs again with it at hand, which either
    /// uses it or (another thread made room meanwhile) gives it back after
    /// the lock ([`OffLock`]). The needed block depends on the request
    /// only, so the second pass never needs another one; a third is allowed
    /// for safety, then the pass's error stands.
    #[inline(always)]
    fn try_alloc(
        &self,
        desc: &BufferDesc,
        at: Option<u64>,
        fallback: bool,
        mut oldest: Option<&mut Option<(usize, crate::sync::Seqno)>>,
    ) -> Result<(BufferHandle, BufferInfo), AllocError> {
        let mut off = OffLock::new();
        let mut passes = 0u8;
        loop {
            let r = self.alloc_pass(desc, at, fallback, &mut off, oldest.as_deref_mut());
            passes = passes.saturating_add(1);
            // Lock dropped: allocate the block the pass needed, if any.
            if r.is_err() && passes < 3 && off.prepare(self.b.platform()) {
                continue;
            }
            off.finish(self.b.platform());
            return r;
        }
    }

    /// One pass of [`DeviceCore::try_alloc`] under the memory lock, with the
    /// platform memory `off` holds.
    #[inline(always)]
    fn alloc_pass(
        &self,
        desc: &BufferDesc,
        at: Option<u64>,
        fallback: bool,
        off: &mut OffLock,
        oldest: Option<&mut Option<(usize, crate::sync::Seqno)>>,
    ) -> Result<(BufferHandle, BufferInfo), AllocError> {
        let mut mem = self.mem.lock();
        let (buffers, mut backer) = mem.split(&self.b, off);
        backer.fallback = fallback;
        // (`alloc_at` refused a fixed address already without a VA
        // allocator; said here so that no code for one is left then.)
        let r = match at.filter(|_| B::VA_ALLOCATOR) {
            Some(at) => buffers.alloc_at(&mut backer, desc, at),
            None => buffers.alloc_info(&mut backer, desc),
        };
        let needs_memory = backer.off.needs_memory();
        match r {
            Ok((h, info)) => {
                self.zero_new(&mem.buffers, h);
                Ok((h, info))
            }
            Err(e) => {
                if let Some(o) = oldest.filter(|_| !needs_memory) {
                    *o = buffers.oldest_waiting();
                }
                Err(e)
            }
        }
    }

    /// [`DeviceCore::alloc_info`] once the first try failed: make room in local
    /// memory or fall back, take back frees whose fences have passed and
    /// the pools' kept empty slabs, wait
    /// for the fence of the oldest waiting free, up to the limit (the
    /// failed try left no trace, so this tries again first). Out of line:
    /// the fast path does not pay for it.
    #[inline(never)]
    fn alloc_waiting(
        &self,
        desc: &BufferDesc,
        at: Option<u64>,
    ) -> Result<(BufferHandle, BufferInfo), AllocError> {
        let limit = self.progress_limit_ns();
        let start = self.b.platform().now_ns();
        // A local-memory buffer that finds no room evicts idle ones, then
        // falls back to system memory.
        let mut fallback = false;
        loop {
            let mut waiting = None;
            let oldest = match self.try_alloc(desc, at, fallback, Some(&mut waiting)) {
                Ok((h, info)) => {
                    if fallback {
                        Counters::add(&self.stats.local_fallbacks, 1);
                    }
                    return Ok((h, info));
                }
                Err(AllocError::LocalMemory) => {
                    // One eviction per failed try: each evicted buffer
                    // leaves local memory for good, so this ends.
                    if !self.make_room() {
                        fallback = true;
                    }
                    continue;
                }
                Err(
                    e @ (AllocError::TableFull { .. }
                    | AllocError::VaSpace { .. }
                    | AllocError::VaNodes
                    | AllocError::PlatformMemory { .. }
                    | AllocError::SlabCapacity { .. }
                    | AllocError::AddressInUse { .. }),
                ) => {
                    // A fixed address is waited for only where freed
                    // buffers waiting for their fences, or kept empty
                    // slabs, hold it; held otherwise (a live buffer, a
                    // slab with live slots, the driver's own memory) it
                    // is refused at once.
                    if let AllocError::AddressInUse { at } = e {
                        // (`checked_address` refused a wrapping range.)
                        let end = crate::mem::manager::fixed_range_end(at, desc.size).unwrap_or(u64::MAX);
                        if !B::VA_ALLOCATOR || !self.mem.lock().buffers.frees_overlap(at, end) {
                            return Err(e);
                        }
                    }
                    // Completion processing reclaims a bounded number
                    // of frees at a time, so frees whose fences have
                    // passed may still wait with every queue idle:
                    // take them all back before waiting for a fence,
                    // then the empty slabs the pools keep.
                    if self.reclaim_ready() > 0 || self.trim_kept() > 0 {
                        continue;
                    }
                    match waiting {
                        Some(f) if self.b.platform().now_ns().saturating_sub(start) < limit => f,
                        _ => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            };
            // Memory is waiting for a fence: wait for it, then try again.
            self.wait_for_memory(
                oldest,
                limit.saturating_sub(self.b.platform().now_ns().saturating_sub(start)),
            );
            if self.is_lost() {
                return Err(AllocError::DeviceLost);
            }
        }
    }

    /// Waits up to `timeout_ns` for queue `oldest.0` to pass `oldest.1`,
    /// the fence the oldest waiting free waits for. It waits for the work
    /// to stop running, not for the fence's answer: work poisoned through
    /// a dependency fails at once but still runs and holds the memory.
    fn wait_for_memory(&self, oldest: (usize, crate::sync::Seqno), timeout_ns: u64) {
        let fence = crate::sync::Fence {
            id: crate::sync::FenceId { queue: QueueId(oldest.0 as u8), seqno: oldest.1 },
            device: self.id,
        };
        // A timeout ends in the caller's limit check.
        let _ = self.wait_passed(fence, timeout_ns.max(1));
        self.process_all();
    }

    /// Zeroes a new slab slot (fresh blocks come zeroed from the platform;
    /// reused slots hold their last owner's data).
    fn zero_new(&self, buffers: &crate::mem::manager::Buffers<'d, Backed>, h: BufferHandle) {
        let Ok(info) = buffers.info(h) else { return };
        if info.class == crate::mem::pool::SizeClass::Large || info.kind.device_only {
            return;
        }
        let Ok((region, off, size)) = buffers.memory(h) else { return };
        let (Ok(off), Ok(len)) =
            (usize::try_from(off), usize::try_from(info.reserved.min(size.next_multiple_of(128).max(size))))
        else {
            return;
        };
        let Some(base) = region.cpu_ptr() else { return };
        if off.checked_add(len).is_none_or(|e| e > region.len()) {
            return;
        }
        // SAFETY: `off + len` lies inside the slot's region (checked); the
        // slot was just handed out under the memory lock, so nothing else
        // reaches it yet.
        unsafe { core::ptr::write_bytes(base.as_ptr().add(off), 0, len) };
        self.b.platform().cache_clean(region, off, len);
    }

    /// Allocates `size` bytes, read-write, CPU-visible, implicitly tracked.
    pub fn alloc_buffer(&self, size: u64) -> Result<BufferHandle, AllocError> {
        self.alloc(&BufferDesc::new(size))
    }

    /// Frees a buffer. The handle is stale at once; the memory and its GPU
    /// address are reused only after the work that may use them has
    /// finished (see [`crate::mem::buffer::Tracking`]). Refused while the
    /// buffer is mapped.
    pub fn free(&self, h: BufferHandle) -> Result<(), BufferError> {
        let mut off = OffLock::new();
        let r = {
            let mut mem = self.mem.lock();
            let (buffers, mut backer) = mem.split(&self.b, &mut off);
            let q = |i: usize| self.queues.get(i);
            buffers.free(
                &mut backer,
                h,
                self.nq,
                &|i| q(i).map_or(crate::sync::Seqno(0), |q| q.completed()),
                &|i| q(i).map_or(crate::sync::Seqno(0), |q| q.emitted()),
                self.is_lost(),
            )
        };
        // The block the free released, if any, goes back with the lock
        // dropped.
        off.finish(self.b.platform());
        r
    }

    /// What the device knows about a buffer (GPU address, size, class, tag).
    pub fn buffer(&self, h: BufferHandle) -> Result<BufferInfo, BufferError> {
        self.mem.lock().buffers.info(h)
    }

    /// The GPU address of a buffer.
    pub fn va(&self, h: BufferHandle) -> Result<u64, BufferError> {
        self.buffer(h).map(|i| i.va)
    }

    /// Copies `data` into the buffer at byte `offset` and makes it visible
    /// to the GPU (cache clean of that range). A cache line the range
    /// covers only in part is invalidated first (`docs/memory.md` 3b), so
    /// the clean writes the GPU's data back with the rest of that line,
    /// not the CPU's stale copy of it.
    pub fn write(&self, h: BufferHandle, offset: u64, data: &[u8]) -> Result<(), BufferError> {
        self.with_range(h, offset, data.len() as u64, |p, region, off| {
            invalidate_edges(p, region, off, data.len());
            let Some(base) = region.cpu_ptr() else { return };
            // SAFETY: `with_range` checked that `off + data.len()` lies in
            // the buffer, which lies in `region`; the memory lock is held,
            // so no guard maps it (mapped buffers are refused) and nothing
            // else on the CPU writes it; the GPU is not in Rust's model.
            unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), base.as_ptr().add(off), data.len()) };
            p.cache_clean(region, off, data.len());
        })
    }

    /// Copies dwords into the buffer at byte `offset` (little-endian), with
    /// the cache maintenance of [`DeviceCore::write`].
    pub fn write_words(&self, h: BufferHandle, offset: u64, words: &[u32]) -> Result<(), BufferError> {
        let len = (words.len() as u64).saturating_mul(4);
        self.with_range(h, offset, len, |p, region, off| {
            invalidate_edges(p, region, off, words.len().saturating_mul(4));
            let Some(base) = region.cpu_ptr() else { return };
            for (i, w) in words.iter().enumerate() {
                // SAFETY: as in `write`; `off + 4 * i + 4` is inside the range.
                unsafe {
                    core::ptr::write_unaligned(
                        base.as_ptr().add(off).add(i.wrapping_mul(4)).cast::<u32>(),
                        w.to_le(),
                    )
                };
            }
            p.cache_clean(region, off, words.len().saturating_mul(4));
        })
    }

    /// Makes GPU writes visible (cache invalidate of the range: the
    /// platform invalidates whole lines, those it covers in part included,
    /// which hold nothing dirty, `docs/memory.md` 3b) and copies the
    /// buffer's bytes at `offset` into `out`.
    pub fn read(&self, h: BufferHandle, offset: u64, out: &mut [u8]) -> Result<(), BufferError> {
        self.with_range(h, offset, out.len() as u64, |p, region, off| {
            p.cache_invalidate(region, off, out.len());
            let Some(base) = region.cpu_ptr() else { return };
            // SAFETY: as in `write`; reading memory the GPU may write is a
            // copy of whatever is there (the caller waited for the fence).
            unsafe { core::ptr::copy_nonoverlapping(base.as_ptr().add(off), out.as_mut_ptr(), out.len()) };
        })
    }

    /// Reads dword `index` of the buffer (after a cache invalidate).
    pub fn read_u32(&self, h: BufferHandle, index: u64) -> Result<u32, BufferError> {
        let mut b = [0u8; 4];
        self.read(h, index.saturating_mul(4), &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn with_range(
        &self,
        h: BufferHandle,
        offset: u64,
        len: u64,
        f: impl FnOnce(&B::P, &DmaRegion, usize),
    ) -> Result<(), BufferError> {
        let mem = self.mem.lock();
        if mem.buffers.live(h)?.mapped {
            return Err(BufferError::Mapped);
        }
        let (region, base, size) = mem.buffers.memory(h)?;
        let end = offset.checked_add(len).ok_or(BufferError::OutOfRange { offset, len, size })?;
        if end > size {
            return Err(BufferError::OutOfRange { offset, len, size });
        }
        let off = base
            .checked_add(offset)
            .and_then(|o| usize::try_from(o).ok())
            .ok_or(BufferError::OutOfRange { offset, len, size })?;
        f(self.b.platform(), region, off);
        Ok(())
    }

    /// Maps the buffer for the CPU: a guard with its bytes, exclusive (a
    /// second map, a copy or a free of the buffer is refused while it
    /// lives). The CPU cache is invalidated now over the whole buffer,
    /// the lines at both ends included (GPU writes become visible, and
    /// every line the guard can write starts from memory), and cleaned
    /// when the guard drops (CPU writes reach the GPU). While the guard
    /// lives its lines may be dirty in the CPU cache, so the GPU must not
    /// write the buffer meanwhile: the clean at the drop (or the cache
    /// evicting a line before it) would put the CPU's copy over it.
    pub fn map(&self, h: BufferHandle) -> Result<Mapped<'_, 'd, B, CHUNKS>, BufferError> {
        let mut mem = self.mem.lock();
        let (ptr, len, region_off) = {
            let (region, off, size) = mem.buffers.memory(h)?;
            let base = region.cpu_ptr().ok_or(BufferError::NoCpuAccess)?;
            let off = usize::try_from(off).map_err(|_| BufferError::Stale)?;
            let size = usize::try_from(size).map_err(|_| BufferError::Stale)?;
            // SAFETY: `off + size` lies inside the region (the pool's slot).
            (unsafe { base.as_ptr().add(off) }, size, off)
        };
        // Refuse a second mapping before touching the cache: invalidating
        // would drop what the first mapping wrote and has not cleaned.
        mem.buffers.set_mapped(h, true)?;
        if let Ok((region, _, _)) = mem.buffers.memory(h) {
            self.b.platform().cache_invalidate(region, region_off, len);
        }
        Ok(Mapped { dev: self, h, ptr, len, off: region_off })
    }

    /// The leak report: every live buffer with its size, tag and allocation
    /// number.
    pub fn leak_report(&self, f: impl FnMut(LeakEntry)) {
        self.mem.lock().buffers.leak_report(f)
    }

    /// Gives kept empty slabs back to the platform. Returns bytes.
    pub fn trim(&self) -> u64 {
        // Slabs held only by frees whose fences have passed empty first.
        self.reclaim_ready();
        self.trim_kept()
    }

    /// Gives the pools' kept empty slabs back. Returns bytes. A pass under
    /// the memory lock releases at most [`DEAD_MAX`] slabs, freed with the
    /// lock dropped; passes repeat while slabs are kept, at most as many as
    /// the pools can keep need ([`crate::mem::pool::KEEP_EMPTY`] per kind
    /// and bin).
    fn trim_kept(&self) -> u64 {
        const PASSES: usize =
            crate::mem::pool::KINDS * crate::mem::pool::BINS * crate::mem::pool::KEEP_EMPTY as usize
                / DEAD_MAX
                + 1;
        let mut bytes = 0u64;
        for _ in 0..PASSES {
            let mut off = OffLock::new();
            let more = {
                let mut mem = self.mem.lock();
                let (buffers, mut backer) = mem.split(&self.b, &mut off);
                bytes = bytes.saturating_add(buffers.trim(&mut backer));
                buffers.has_kept()
            };
            off.finish(self.b.platform());
            if !more {
                break;
            }
        }
        bytes
    }

    /// Buffers waiting for fences of `queue` before their memory is reused.
    pub fn frees_waiting_on(&self, queue: QueueId) -> usize {
        self.mem.lock().buffers.waiting_on(usize::from(queue.0))
    }
}

/// The largest CPU cache line the driver's CPU copies allow for: the
/// smallest slot and alignment of the buffer pools (128 bytes), so a line
/// never holds bytes of two buffers.
pub(crate) const CPU_LINE_MAX: usize = 128;
const _: () = assert!(CPU_LINE_MAX.is_power_of_two());

/// Invalidates the CPU cache over the [`CPU_LINE_MAX`]-byte granules that
/// `region[off..off + len]` covers only in part (at most two), before a
/// CPU copy into that range.
///
/// On a CPU cache that is not coherent with the GPU, a copy that covers
/// part of a line stores into the CPU's copy of the whole line, and the
/// clean that follows writes that whole line back: without this, the
/// rest of the line would be the CPU's copy from before the GPU last wrote
/// it, and would overwrite the GPU's data. Invalidating the line first
/// makes the copy start from memory. This discards nothing: outside a
/// [`Mapped`] guard, which excludes every copy, a buffer's lines are never
/// dirty in the CPU cache (every CPU write through the device cleans
/// before it returns), and a granule lies inside one buffer's slot (slots
/// and blocks are [`CPU_LINE_MAX`]-aligned, their sizes multiples of it).
/// Lines the range covers whole need nothing: the copy overwrites them.
/// What this can not do is make a CPU write and a GPU write to the same
/// line at the same time both land: the GPU must not be writing a line
/// the CPU writes (the buffer's work finished, as for any copy).
fn invalidate_edges<P: Platform>(p: &P, region: &DmaRegion, off: usize, len: usize) {
    if len == 0 {
        return;
    }
    let end = off.saturating_add(len);
    let head = off & !(CPU_LINE_MAX - 1);
    if off != head {
        p.cache_invalidate(region, head, CPU_LINE_MAX);
    }
    let tail = end & !(CPU_LINE_MAX - 1);
    if end != tail && (tail != head || off == head) {
        p.cache_invalidate(region, tail, CPU_LINE_MAX);
    }
}

/// A buffer mapped for the CPU (see [`DeviceCore::map`]): derefs to its bytes.
pub struct Mapped<'e, 'd, B: Backend, const CHUNKS: usize> {
    dev: &'e DeviceCore<'d, B, CHUNKS>,
    h: BufferHandle,
    ptr: *mut u8,
    len: usize,
    off: usize,
}

impl<B: Backend, const CHUNKS: usize> fmt::Debug for Mapped<'_, '_, B, CHUNKS> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mapped").field("buffer", &self.h).field("len", &self.len).finish()
    }
}

impl<B: Backend, const CHUNKS: usize> Mapped<'_, '_, B, CHUNKS> {
    /// The buffer's bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` is the buffer's memory (`map` checked
        // it); the buffer is marked mapped, so no other guard, copy or free
        // reaches it while `self` lives, and `self` borrows the device.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The buffer's bytes, for writing.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes this the only view.
        unsafe { core::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// The buffer as dwords (its length rounded down), for writing.
    pub fn words_mut(&mut self) -> &mut [u32] {
        // SAFETY: as in `bytes_mut`; buffer addresses are at least 128-byte
        // aligned (pool slots), so the pointer is aligned for u32.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.cast::<u32>(), self.len / 4) }
    }

    /// The buffer as dwords (its length rounded down).
    pub fn words(&self) -> &[u32] {
        // SAFETY: as in `words_mut`, shared.
        unsafe { core::slice::from_raw_parts(self.ptr.cast::<u32>(), self.len / 4) }
    }
}

impl<B: Backend, const CHUNKS: usize> Drop for Mapped<'_, '_, B, CHUNKS> {
    fn drop(&mut self) {
        let mut mem = self.dev.mem.lock();
        if let Ok((region, _, _)) = mem.buffers.memory(self.h) {
            self.dev.b.platform().cache_clean(region, self.off, self.len);
        }
        let _ = mem.buffers.set_mapped(self.h, false);
    }
}
