//! Local memory and eviction (`docs/refgpu.md` section 3.5;
//! `docs/memory.md`, "Local memory and eviction").
//!
//! A buffer allocated with [`crate::mem::BufferDesc::local`] prefers the
//! device's local memory. It gets local pages when there are some (after
//! evicting idle buffers if needed), system memory otherwise. Its GPU
//! address never changes: a move copies the contents with the COPY engine
//! through a temporary mapping, then rewrites the buffer's page-table
//! entries to the new memory (with a TLB invalidation) and frees the old.
//!
//! - **Eviction** takes the least recently used local buffer that no
//!   unsignalled submission uses (declared tracking says which), that no
//!   submission being prepared has pinned, and that none of the last
//!   [`crate::config::Config::local_min_residency`] submissions used.
//! - **Restore**: a submission that declares a local-preferring buffer
//!   living in system memory brings it back first, evicting others (never
//!   one of its own working set). A working set larger than local memory
//!   is refused ([`crate::error::SubmitError::WorkingSetTooLarge`]); when
//!   no victim is idle and old enough the restore is deferred and the work
//!   uses the system copy. A buffer evicted less than a minimum-residency
//!   window ago is not brought back either. Together these bound
//!   thrashing: a buffer moves at most once per window, so `n` buffers
//!   over `s` submissions move at most `n * (s / window + 1)` times.
//!
//! Without local memory (gen1, MMU bypassed, kernel mode, or a build
//! without the `local-memory` feature) every such buffer lives in system
//! memory and nothing moves: [`DeviceCore::local_memory`] is `None`, and
//! [`DeviceCore::evict`] and [`DeviceCore::make_resident`] answer
//! [`MoveError::NotLocal`].

use crate::cmd::EncodeError;
use crate::error::{SubmitError, WaitError};
use crate::ibpool::Recorder;
use crate::mem::local::{ON, PAGE};
use crate::mem::pagetable::{CachePolicy, Perms};
use crate::mem::va::VaPlacement;
pub use crate::mem::Residency;
use crate::mem::{BufferError, BufferHandle, Tracking};
use crate::platform::{DmaFlags, DmaGuard, DmaRegion, Platform};
use crate::sync::{QueueId, Seqno};

use super::buffers::BufferUse;
use super::submit::Submit;
use super::{Backend, Counters, DeviceCore};

/// The device's local memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalMemory {
    /// Bytes the driver manages.
    pub size: u64,
    /// Bytes in use.
    pub used: u64,
}

/// Why a buffer could not be moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoveError {
    /// Not a live buffer of this device.
    Buffer(BufferError),
    /// The buffer does not prefer local memory, or the device has none.
    NotLocal,
    /// The buffer is in use by unsignalled work, or pinned by a submission
    /// being prepared.
    Busy,
    /// No room: no idle victim old enough to evict.
    NoRoom,
    /// The copy failed (the device hung, faulted or was lost); the buffer
    /// stayed where it was.
    Copy(WaitError),
    /// Memory for the destination or its temporary mapping.
    Memory,
}

impl core::fmt::Display for MoveError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            MoveError::Buffer(e) => write!(f, "{e}"),
            MoveError::NotLocal => write!(f, "the buffer does not use local memory (or there is none)"),
            MoveError::Busy => write!(f, "the buffer is in use"),
            MoveError::NoRoom => write!(f, "no idle buffer can be evicted to make room"),
            MoveError::Copy(e) => write!(f, "the copy failed: {e}"),
            MoveError::Memory => write!(f, "no memory for the move"),
        }
    }
}

impl core::error::Error for MoveError {}

/// Buffers a submission pinned while it is prepared (bit `i` of `pinned`
/// is `buffers[i]`, a mask rather than a copy of up to 64 handles);
/// unpinned on drop.
pub(crate) struct Pins<'e, 'd, 's, B: Backend, const C: usize> {
    dev: &'e DeviceCore<'d, B, C>,
    buffers: &'s [BufferUse],
    pinned: u64,
}

impl<'s, B: Backend, const C: usize> Pins<'_, '_, 's, B, C> {
    /// The pinned buffers.
    fn handles(&self) -> impl Iterator<Item = BufferHandle> + 's {
        let (buffers, mut bits) = (self.buffers, self.pinned);
        core::iter::from_fn(move || {
            while bits != 0 {
                let i = bits.trailing_zeros() as usize;
                bits &= bits.wrapping_sub(1);
                if let Some(u) = buffers.get(i) {
                    return Some(u.buffer);
                }
            }
            None
        })
    }
}

impl<B: Backend, const C: usize> Drop for Pins<'_, '_, '_, B, C> {
    fn drop(&mut self) {
        if self.pinned == 0 {
            return;
        }
        let mut mem = self.dev.mem.lock();
        for h in self.handles() {
            if let Ok(l) = mem.buffers.live_mut(h) {
                l.pinned = l.pinned.saturating_sub(1);
            }
        }
    }
}

/// What a move needs to know about its buffer.
#[derive(Clone, Copy)]
struct Subject {
    h: BufferHandle,
    va: u64,
    bytes: u64,
    perms: Perms,
    touched: u64,
}

impl<'d, B: Backend, const CHUNKS: usize> DeviceCore<'d, B, CHUNKS> {
    fn clock(&self) -> u64 {
        self.submissions()
    }

    fn busy(&self, last_use: &[u64], used: u8) -> bool {
        last_use.iter().enumerate().any(|(q, s)| {
            used & (1u8 << (q & 7)) != 0 && !Seqno(*s).is_signalled_by(self.completed_of(QueueId(q as u8)))
        })
    }

    /// The device's local memory (`None`: it has none, or it is not used:
    /// MMU bypassed, kernel mode).
    pub fn local_memory(&self) -> Option<LocalMemory> {
        let mem = self.mem.lock();
        mem.local.is_active().then(|| {
            let (size, used) = mem.local.usage();
            LocalMemory { size, used }
        })
    }

    /// Where a buffer's memory is now.
    pub fn residency(&self, h: BufferHandle) -> Result<Residency, BufferError> {
        let mem = self.mem.lock();
        let l = mem.buffers.live(h)?;
        Ok(match l.alloc.block() {
            Some(r) => r.residency(),
            _ => Residency::System,
        })
    }

    /// Moves an idle local buffer to system memory now (its GPU address is
    /// unchanged).
    pub fn evict(&self, h: BufferHandle) -> Result<(), MoveError> {
        let s = self.take_subject(h, Residency::Local)?;
        self.move_to_system(s)
    }

    /// Brings a local-preferring buffer in system memory back to local
    /// memory now, evicting idle buffers if needed.
    pub fn make_resident(&self, h: BufferHandle) -> Result<(), MoveError> {
        let s = self.take_subject(h, Residency::System)?;
        let r = self.move_to_local(s);
        self.end_move(h);
        r
    }

    /// Checks `h` can move away from `from`, and pins it.
    fn take_subject(&self, h: BufferHandle, from: Residency) -> Result<Subject, MoveError> {
        let mut mem = self.mem.lock();
        let active = mem.local.is_active();
        let l = mem.buffers.live_mut(h).map_err(MoveError::Buffer)?;
        if !l.info.kind.local || !active {
            return Err(MoveError::NotLocal);
        }
        let here = match l.alloc.block() {
            Some(r) => r.residency(),
            _ => Residency::System,
        };
        if here != from {
            return Err(MoveError::NotLocal);
        }
        let (last_use, used) = (l.last_use, l.used);
        if l.pinned > 0 || l.moving || self.busy(&last_use, used) {
            return Err(MoveError::Busy);
        }
        let l = mem.buffers.live_mut(h).map_err(MoveError::Buffer)?;
        l.pinned = l.pinned.saturating_add(1);
        l.moving = true;
        Ok(Subject {
            h,
            va: l.info.va,
            bytes: l.alloc.reserved(),
            perms: Perms { read: true, write: !l.info.kind.gpu_read_only, cache: CachePolicy::Uncached },
            touched: l.touched,
        })
    }

    /// Ends a move that [`DeviceCore::take_subject`] started: unpins the
    /// buffer and lets declared work use it again.
    fn end_move(&self, h: BufferHandle) {
        if let Ok(l) = self.mem.lock().buffers.live_mut(h) {
            l.pinned = l.pinned.saturating_sub(1);
            l.moving = false;
        }
    }

    /// Ends a restore that [`DeviceCore::prepare_residency`] started (the
    /// submission keeps its pin).
    fn end_restore(&self, h: BufferHandle) {
        if let Ok(l) = self.mem.lock().buffers.live_mut(h) {
            l.moving = false;
        }
    }

    /// Picks and pins the least recently used idle local buffer not used
    /// by the last `min_residency` submissions.
    fn pick_victim(&self) -> Option<Subject> {
        let now = self.clock();
        let min = u64::from(self.cfg.local_min_residency);
        let h = {
            let mem = self.mem.lock();
            mem.buffers.min_live(|l| {
                let local = l.alloc.block().is_some_and(|b| b.residency() == Residency::Local);
                let old = l.touched.saturating_add(min) <= now || l.touched == 0;
                let idle = l.pinned == 0 && !l.moving && !self.busy(&l.last_use, l.used);
                (local && idle && old).then_some(l.touched)
            })?
        };
        self.take_subject(h, Residency::Local).ok()
    }

    /// Evicts one idle buffer; false when there is none.
    fn evict_one(&self) -> bool {
        let Some(v) = self.pick_victim() else { return false };
        self.move_to_system(v).is_ok()
    }

    /// Copies `s`'s contents into `to` (mapped at a temporary address) with
    /// the COPY engine and waits.
    fn copy_out(&self, s: Subject, to: &DmaRegion) -> Result<(), MoveError> {
        let tmp = {
            let mut mem = self.mem.lock();
            // (Only the VA allocator and the maps: nothing for `off`.)
            let mut off = super::buffers::OffLock::new();
            let (_, backer) = mem.split(&self.b, &mut off);
            let va = backer.va.get_mut().ok_or(MoveError::NotLocal)?;
            let handle =
                va.alloc_handle(s.bytes, PAGE, VaPlacement::TopDown).map_err(|_| MoveError::Memory)?;
            let tmp = handle.addr();
            let rw = Perms { read: true, write: true, cache: CachePolicy::Uncached };
            if self.b.map(backer.maps, tmp, to, rw).is_err() {
                if let Some(va) = backer.va.get_mut() {
                    let _ = va.free_handle(handle);
                }
                return Err(MoveError::Memory);
            }
            handle
        };
        let (handle, tmp) = (tmp, tmp.addr());
        let uses = [BufferUse::read(s.h)];
        let r = self
            .submit_internal(
                &Submit::on(QueueId::COPY).using(&uses),
                |cb: &mut Recorder<'_>| -> Result<(), EncodeError> { cb.copy(s.va, tmp, s.bytes) },
            )
            .map_err(|e| match e {
                SubmitError::DeviceLost => {
                    MoveError::Copy(WaitError::Failed(crate::sync::FenceError::DeviceLost))
                }
                _ => MoveError::Memory,
            })
            .and_then(|f| self.wait_done(f, self.progress_limit_ns()).map_err(MoveError::Copy));
        let mut mem = self.mem.lock();
        // (Only the VA allocator and the maps: nothing for `off`.)
        let mut off = super::buffers::OffLock::new();
        let (_, backer) = mem.split(&self.b, &mut off);
        if self.b.unmap(backer.maps, tmp, s.bytes).is_ok() {
            if let Some(va) = backer.va.get_mut() {
                let _ = va.free_handle(handle);
            }
        }
        r
    }

    /// Points `s`'s GPU address at `to` and returns the memory it had;
    /// `Err(to)` when the buffer was freed meanwhile.
    fn remap(&self, s: Subject, to: DmaRegion) -> Result<DmaRegion, DmaRegion> {
        let mut mem = self.mem.lock();
        let super::MemState { buffers, maps, .. } = &mut *mem;
        let Ok(l) = buffers.live_mut(s.h) else { return Err(to) };
        let _ = self.b.unmap(maps, s.va, s.bytes);
        if self.b.map(maps, s.va, &to, s.perms).is_err() {
            // Put the old memory back under the address.
            if let Some(old) = l.alloc.block() {
                let _ = self.b.map(maps, s.va, old, s.perms);
            }
            return Err(to);
        }
        // The GPU address, and so its VA handle, stays with the buffer.
        let va = l.alloc.block().and_then(|b| b.va);
        l.alloc
            .replace_block(crate::storage::Backed { region: to, va })
            .map(|b| b.region)
            .map_err(|b| b.region)
    }

    fn move_to_system(&self, s: Subject) -> Result<(), MoveError> {
        let p = self.b.platform();
        let len = usize::try_from(s.bytes).map_err(|_| MoveError::Memory)?;
        let to = match p.dma_alloc(len, DmaFlags::DEVICE_ONLY) {
            Ok(r) => DmaGuard::new(p, r),
            Err(_) => {
                self.end_move(s.h);
                return Err(MoveError::Memory);
            }
        };
        if let Err(e) = self.copy_out(s, &to) {
            // Freed before the memory lock is taken again.
            drop(to);
            self.end_move(s.h);
            return Err(e);
        }
        match self.remap(s, to.keep()) {
            Ok(old) => {
                let mut mem = self.mem.lock();
                // Local memory: the buffer was in it (`take_subject`), and
                // stayed pinned there.
                mem.local.free(old.into_local_pages());
                if let Ok(l) = mem.buffers.live_mut(s.h) {
                    l.evicted = self.clock().max(1);
                }
            }
            Err(to) => p.dma_free(to),
        }
        self.end_move(s.h);
        Counters::add(&self.stats.evictions, 1);
        Counters::add(&self.stats.bytes_moved, s.bytes);
        let window = u64::from(self.cfg.local_min_residency).saturating_mul(2);
        if s.touched != 0 && s.touched.saturating_add(window) > self.clock() {
            Counters::add(&self.stats.thrash_events, 1);
        }
        self.record_trace(crate::debug::TraceKind::Evict, usize::from(QueueId::COPY.0), Seqno(0), s.va);
        Ok(())
    }

    /// Moves a pinned buffer, marked moving, from system into local memory,
    /// evicting idle buffers for room. The caller ends the move.
    fn move_to_local(&self, s: Subject) -> Result<(), MoveError> {
        let to = loop {
            if let Some(pages) = self.mem.lock().local.alloc(s.bytes) {
                break DmaRegion::local(pages);
            }
            if !self.evict_one() {
                return Err(MoveError::NoRoom);
            }
        };
        if let Err(e) = self.copy_out(s, &to) {
            self.mem.lock().local.free(to.into_local_pages());
            return Err(e);
        }
        match self.remap(s, to) {
            Ok(old) => self.b.platform().dma_free(old),
            Err(to) => self.mem.lock().local.free(to.into_local_pages()),
        }
        Counters::add(&self.stats.restores, 1);
        Counters::add(&self.stats.bytes_moved, s.bytes);
        self.record_trace(crate::debug::TraceKind::Restore, usize::from(QueueId::COPY.0), Seqno(0), s.va);
        Ok(())
    }

    /// Makes room for a local allocation that found none: evicts one idle
    /// buffer, after which the caller tries the allocation again (as
    /// [`DeviceCore::move_to_local`] does). Counting free bytes would not do:
    /// free pages may be fragmented, so enough free bytes can still fail
    /// the allocation, and a caller told "room enough" would retry
    /// forever. False when no victim is left (always without local
    /// memory, where no buffer is local: said here so the eviction is not
    /// linked).
    pub(crate) fn make_room(&self) -> bool {
        if !ON {
            return false;
        }
        self.evict_one()
    }

    /// Before a submission: waits for moves of its declared buffers to end,
    /// pins them, refuses a local working set larger than local memory,
    /// brings evicted ones back (or defers that), and marks them used now.
    ///
    /// A move and a declared use exclude each other: a move starts only on
    /// an unpinned, idle buffer ([`DeviceCore::take_subject`]), and a
    /// submission pins its buffers only when none of them is moving, in one
    /// section under the memory lock. A submission that finds a move in
    /// progress waits for it (the move's copy is bounded by the hang
    /// window), so its work never runs on memory that is being copied or
    /// remapped.
    pub(crate) fn prepare_residency<'s>(
        &self,
        s: &Submit<'s>,
    ) -> Result<Option<Pins<'_, 'd, 's, B, CHUNKS>>, SubmitError> {
        if s.buffers.is_empty() {
            return Ok(None);
        }
        // Nothing pinned yet: dropping it on the way out costs nothing.
        let mut pins = Pins { dev: self, buffers: s.buffers, pinned: 0 };
        let mut mem = self.mem.lock();
        let (capacity, _) = mem.local.usage();
        if capacity == 0 {
            return Ok(None);
        }
        // Pin first: a pinned buffer starts no new move, so a submission
        // waits for at most the moves already in progress.
        let mut needed = 0u64;
        let mut moving = None;
        for (i, u) in s.buffers.iter().enumerate() {
            let Ok(l) = mem.buffers.live_mut(u.buffer) else { continue };
            if !l.info.kind.local || l.info.tracking != Tracking::Declared {
                continue;
            }
            if pins.handles().any(|h| h == u.buffer) {
                continue;
            }
            needed = needed.saturating_add(l.alloc.reserved());
            l.pinned = l.pinned.saturating_add(1);
            pins.pinned |= 1u64.checked_shl(i as u32).unwrap_or(0);
            if l.moving {
                moving = Some(u.buffer);
            }
        }
        if needed > capacity {
            return Err(SubmitError::WorkingSetTooLarge { needed, local: capacity });
        }
        let mut deadline = None;
        while let Some(h) = moving {
            drop(mem);
            let platform = self.b.platform();
            let now = platform.now_ns();
            let end = *deadline.get_or_insert(now.saturating_add(self.progress_limit_ns().saturating_mul(2)));
            if now >= end {
                return Err(SubmitError::BufferMoving(h));
            }
            platform.delay_ns(MOVE_POLL_NS);
            mem = self.mem.lock();
            moving = pins.handles().find(|h| mem.buffers.live(*h).is_ok_and(|l| l.moving));
        }
        // Only with local memory: the table is 64 moves' worth.
        let mut restore = [None; super::buffers::MAX_BUFFER_USES];
        let min = u64::from(self.cfg.local_min_residency);
        for (slot, h) in restore.iter_mut().zip(pins.handles()) {
            let Ok(l) = mem.buffers.live_mut(h) else { continue };
            if l.alloc.block().is_some_and(|b| b.residency() == Residency::Local) {
                continue;
            }
            let recently_evicted = l.evicted != 0 && l.evicted.saturating_add(min) > self.clock();
            if recently_evicted {
                Counters::add(&self.stats.restores_deferred, 1);
                continue;
            }
            // This submission's own move: no other submission uses the
            // buffer until it ends.
            l.moving = true;
            *slot = Some(Subject {
                h,
                va: l.info.va,
                bytes: l.alloc.reserved(),
                perms: Perms { read: true, write: !l.info.kind.gpu_read_only, cache: CachePolicy::Uncached },
                touched: l.touched,
            });
        }
        drop(mem);
        let mut lost = false;
        for s in restore.iter().flatten() {
            let r = if lost { Ok(()) } else { self.move_to_local(*s) };
            self.end_restore(s.h);
            match r {
                Ok(()) => {}
                Err(MoveError::NoRoom) => Counters::add(&self.stats.restores_deferred, 1),
                Err(MoveError::Copy(WaitError::Failed(crate::sync::FenceError::DeviceLost))) => lost = true,
                // A failed move leaves the buffer where it was: correct,
                // just slower.
                Err(_) => Counters::add(&self.stats.restores_deferred, 1),
            }
        }
        if lost {
            return Err(SubmitError::DeviceLost);
        }
        let now = self.clock().saturating_add(1);
        let mut mem = self.mem.lock();
        for h in pins.handles() {
            if let Ok(l) = mem.buffers.live_mut(h) {
                l.touched = now;
            }
        }
        drop(mem);
        Ok(Some(pins))
    }
}

/// How long a submission sleeps between looks at a declared buffer that
/// is being moved.
const MOVE_POLL_NS: u64 = 20_000;
