//! Buffer handles: generation-counted, device-stamped references that can
//! not dangle.
//!
//! Callers hold [`BufferHandle`]s, which are small and `Copy`. A handle is
//! the owning device's identity, a slot index and a generation; every free
//! bumps the slot's generation, so a stale handle (used after free, freed
//! twice) is an error and never reaches the buffer that reuses its slot,
//! and a handle of another device is refused before its index is looked
//! at. A slot whose generation would wrap is retired for good rather than
//! risk a collision.
//!
//! The buffers behind events and timestamp queries share the table but
//! are the driver's own: while one is live, its slot's generation carries
//! `DRIVER_MARK` (bit 31 of the generation), which no handle from [`BufferHandle::from_raw`] has, so
//! a handle forged from such a buffer's slot and generation fails the
//! generation check of every buffer operation ([`BufferError::Unknown`])
//! and can neither free nor touch it; the driver's own handle, which has
//! the mark, passes. The check costs nothing more on the hot path.
//!
//! A freed buffer's slot stays taken ("retiring") until the work that may
//! still use its memory has finished: the slot itself is the deferred-free
//! record, so the number of frees waiting for fences is bounded by the
//! table, with no second table to run out of.

use core::fmt;

use crate::mem::pool::{MemKind, PoolAlloc, SizeClass};
use crate::sync::{DeviceId, MAX_QUEUES};

/// How the driver learns which work may use a buffer when it is freed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Tracking {
    /// Submissions may use the buffer without saying so: a free waits for
    /// the last fence every queue had emitted at the time of the free.
    #[default]
    Implicit,
    /// Every submission that uses the buffer declares it
    /// ([`crate::engine::BufferUse`]): a free waits only for those.
    Declared,
}

/// What to allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferDesc {
    /// Bytes (> 0).
    pub size: u64,
    /// GPU address alignment: a power of two up to 2 MiB (0: the smallest,
    /// 128 bytes).
    pub align: u64,
    /// GPU read-only and/or device-only memory.
    pub kind: MemKind,
    /// How frees are gated.
    pub tracking: Tracking,
    /// Shown in leak reports (a static string: no heap).
    pub tag: &'static str,
    /// A driver-internal buffer (an event's or a timestamp's word): its
    /// handle carries `DRIVER_MARK` (see the module docs).
    pub(crate) driver: bool,
}

impl BufferDesc {
    /// `size` bytes, read-write, CPU-visible, implicit tracking.
    pub const fn new(size: u64) -> BufferDesc {
        BufferDesc {
            size,
            align: 0,
            kind: MemKind::DEFAULT,
            tracking: Tracking::Implicit,
            tag: "",
            driver: false,
        }
    }

    /// With a GPU address alignment.
    pub const fn align(mut self, align: u64) -> BufferDesc {
        self.align = align;
        self
    }

    /// GPU read-only.
    pub const fn gpu_read_only(mut self) -> BufferDesc {
        self.kind.gpu_read_only = true;
        self
    }

    /// Never touched by the CPU.
    pub const fn device_only(mut self) -> BufferDesc {
        self.kind.device_only = true;
        self
    }

    /// Prefer the device's local memory (gen2, `docs/refgpu.md` 3.5): the
    /// buffer is placed there when there is room, evicted to system memory
    /// when room is needed and it is idle, and brought back when a
    /// submission declares it. Local memory has no CPU access, so the
    /// buffer is device-only; declared tracking is what tells the driver
    /// when it is idle, so it is implied. Without local memory (gen1, MMU
    /// bypassed, kernel mode) the buffer lives in system memory.
    pub const fn local(mut self) -> BufferDesc {
        self.kind.local = true;
        self.kind.device_only = true;
        self.tracking = Tracking::Declared;
        self
    }

    /// Frees gated on declared uses only.
    pub const fn declared(mut self) -> BufferDesc {
        self.tracking = Tracking::Declared;
        self
    }

    /// With a tag for leak reports.
    pub const fn tag(mut self, tag: &'static str) -> BufferDesc {
        self.tag = tag;
        self
    }

    /// A driver-internal buffer (see the module docs).
    pub(crate) const fn driver(mut self) -> BufferDesc {
        self.driver = true;
        self
    }
}

/// What the device knows about one buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferInfo {
    /// GPU virtual address.
    pub va: u64,
    /// Requested size in bytes.
    pub size: u64,
    /// Bytes reserved for it (slot or page rounded).
    pub reserved: u64,
    /// The size class it came from.
    pub class: SizeClass,
    /// Memory kind.
    pub kind: MemKind,
    /// How its free is gated.
    pub tracking: Tracking,
    /// Creation tag.
    pub tag: &'static str,
    /// Allocation sequence number on its device (1, 2, ...).
    pub serial: u64,
}

/// A generation-counted reference to a buffer of one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufferHandle {
    device: DeviceId,
    index: u32,
    gen: u32,
}

/// The bit of a slot's generation (and of its handle's) that marks a
/// driver-internal buffer while it is live; generations count in the
/// other 31 bits.
const DRIVER_MARK: u32 = 1 << 31;

impl BufferHandle {
    /// A handle from its parts (FFI, tests of forged handles); validity is
    /// checked when it is used. The top bit of `gen` is ignored (generations
    /// count in 31 bits): no such handle reaches a buffer of the driver's
    /// own, an event's or a timestamp's (see the module docs).
    pub const fn from_raw(device: DeviceId, index: u32, gen: u32) -> BufferHandle {
        BufferHandle { device, index, gen: gen & !DRIVER_MARK }
    }

    /// Its parts: device, slot, generation (of 31 bits).
    pub const fn into_raw(self) -> (DeviceId, u32, u32) {
        (self.device, self.index, self.gen & !DRIVER_MARK)
    }

    /// The device it belongs to.
    pub const fn device(self) -> DeviceId {
        self.device
    }
}

impl fmt::Display for BufferHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bo#{}.{}@{}", self.index, self.gen & !DRIVER_MARK, self.device)
    }
}

/// Why a buffer operation was refused. Nothing changes on error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BufferError {
    /// The handle belongs to another device.
    ForeignDevice {
        /// The handle's device.
        handle: DeviceId,
        /// This device.
        device: DeviceId,
    },
    /// The handle never named a buffer of this device (forged), or it
    /// names one the driver keeps for itself (an event's or a timestamp's
    /// word, see [`BufferHandle::from_raw`]).
    Unknown,
    /// The handle's buffer was freed (use after free or double free).
    Stale,
    /// The buffer is mapped for the CPU: unmap (drop the guard) first.
    Mapped,
    /// The buffer is device-only: the CPU can not reach it.
    NoCpuAccess,
    /// An access outside the buffer.
    OutOfRange {
        /// Byte offset asked.
        offset: u64,
        /// Bytes asked.
        len: u64,
        /// The buffer's size.
        size: u64,
    },
}

impl fmt::Display for BufferError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BufferError::ForeignDevice { handle, device } => {
                write!(f, "buffer handle of device {handle} used on device {device}")
            }
            BufferError::Unknown => f.write_str("unknown buffer handle"),
            BufferError::Stale => f.write_str("stale buffer handle (the buffer was freed)"),
            BufferError::Mapped => f.write_str("buffer is mapped for the CPU"),
            BufferError::NoCpuAccess => f.write_str("buffer is device-only"),
            BufferError::OutOfRange { offset, len, size } => {
                write!(f, "{len} bytes at {offset} outside a buffer of {size} bytes")
            }
        }
    }
}

impl core::error::Error for BufferError {}

/// One line of a leak report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeakEntry {
    /// The live handle.
    pub handle: BufferHandle,
    /// Its description, including tag and allocation number.
    pub info: BufferInfo,
}

/// A live buffer.
#[derive(Debug)]
pub(crate) struct Live<B> {
    pub(crate) info: BufferInfo,
    pub(crate) alloc: PoolAlloc<B>,
    /// The latest fence of each queue whose submission declared the buffer.
    pub(crate) last_use: [u64; MAX_QUEUES],
    /// Queues in `last_use` (bit per queue).
    pub(crate) used: u8,
    pub(crate) mapped: bool,
    /// When a submission last declared it (the device's submission count;
    /// local-memory LRU).
    pub(crate) touched: u64,
    /// When it was last evicted (the same clock; 0: never).
    pub(crate) evicted: u64,
    /// Submissions being prepared or moves in progress that need it where
    /// it is (never evicted while > 0).
    pub(crate) pinned: u16,
    /// A move between local and system memory is in progress: a
    /// submission that declares the buffer waits for it to end, and no
    /// second move starts (`docs/memory.md`, "Local memory and eviction").
    pub(crate) moving: bool,
}

/// A freed buffer whose memory waits for fences.
#[derive(Debug)]
pub(crate) struct Retiring<B> {
    pub(crate) alloc: PoolAlloc<B>,
    /// What it was (fault reports and validation name freed buffers).
    pub(crate) info: BufferInfo,
    /// The fence of each queue in `mask` that must signal first.
    pub(crate) gate: [u64; MAX_QUEUES],
    pub(crate) mask: u8,
}

#[derive(Debug)]
enum SlotState<B> {
    Free,
    Live(Live<B>),
    Retiring(Retiring<B>),
}

/// One slot of the buffer table (storage the integrator provides, see
/// [`crate::storage::DeviceStorage`]).
#[derive(Debug)]
pub struct BufferSlot<B> {
    gen: u32,
    next_free: u32,
    state: SlotState<B>,
}

impl<B> BufferSlot<B> {
    /// An unused slot.
    pub const EMPTY: BufferSlot<B> = BufferSlot { gen: 0, next_free: NIL, state: SlotState::Free };
}

const NIL: u32 = u32::MAX;

/// Why a handle of generation `h` is refused by a slot of generation
/// `slot` (they differ, or are even): a generation never given, or one
/// that differs only in [`DRIVER_MARK`] (forged for a driver-internal
/// buffer, see the module docs), is unknown; an older one is stale.
#[cold]
fn refusal(h: u32, slot: u32) -> BufferError {
    let (h_count, slot_count) = (h & !DRIVER_MARK, slot & !DRIVER_MARK);
    if h_count % 2 == 0 || h_count >= slot_count {
        BufferError::Unknown
    } else {
        BufferError::Stale
    }
}

/// A fixed-capacity table of buffers over caller storage.
#[derive(Debug)]
pub(crate) struct BufferTable<'s, B> {
    device: DeviceId,
    slots: &'s mut [BufferSlot<B>],
    free_head: u32,
    bump: u32,
    live: u32,
    live_bytes: u64,
    retiring: u32,
    retiring_bytes: u64,
}

impl<'s, B> BufferTable<'s, B> {
    /// An empty table of `device` over `slots` (every slot is reset).
    pub(crate) fn new(device: DeviceId, slots: &'s mut [BufferSlot<B>]) -> Self {
        for s in slots.iter_mut() {
            *s = BufferSlot::EMPTY;
        }
        BufferTable {
            device,
            slots,
            free_head: NIL,
            bump: 0,
            live: 0,
            live_bytes: 0,
            retiring: 0,
            retiring_bytes: 0,
        }
    }

    pub(crate) fn live(&self) -> u32 {
        self.live
    }

    pub(crate) fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    pub(crate) fn retiring(&self) -> (u32, u64) {
        (self.retiring, self.retiring_bytes)
    }

    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// True when `insert` would fail.
    pub(crate) fn is_full(&self) -> bool {
        self.free_head == NIL && (self.bump as usize) >= self.slots.len().min(NIL as usize)
    }

    /// Adds a live buffer, a driver-internal one when `driver` (see the
    /// module docs); O(1). On a full table the allocation is handed back.
    pub(crate) fn insert(
        &mut self,
        info: BufferInfo,
        alloc: PoolAlloc<B>,
        driver: bool,
    ) -> Result<BufferHandle, PoolAlloc<B>> {
        let index = if self.free_head != NIL {
            self.free_head
        } else if (self.bump as usize) < self.slots.len() && self.bump != NIL {
            self.bump
        } else {
            return Err(alloc);
        };
        let free_next = match self.slots.get(index as usize) {
            Some(s) => s.next_free,
            None => return Err(alloc),
        };
        let Some(slot) = self.slots.get_mut(index as usize) else { return Err(alloc) };
        if index == self.free_head {
            self.free_head = free_next;
        } else {
            self.bump = self.bump.wrapping_add(1);
        }
        // Generations are odd while live, even while free or retiring; a
        // free slot's has no mark.
        slot.gen = slot.gen.wrapping_add(1) | if driver { DRIVER_MARK } else { 0 };
        slot.next_free = NIL;
        let size = info.size;
        slot.state = SlotState::Live(Live {
            info,
            alloc,
            last_use: [0; MAX_QUEUES],
            used: 0,
            mapped: false,
            touched: 0,
            evicted: 0,
            pinned: 0,
            moving: false,
        });
        self.live = self.live.wrapping_add(1);
        self.live_bytes = self.live_bytes.wrapping_add(size);
        Ok(BufferHandle { device: self.device, index, gen: slot.gen })
    }

    fn check(&self, h: BufferHandle) -> Result<usize, BufferError> {
        if h.device != self.device {
            return Err(BufferError::ForeignDevice { handle: h.device, device: self.device });
        }
        let slot = self.slots.get(h.index as usize).ok_or(BufferError::Unknown)?;
        if h.gen == slot.gen && h.gen % 2 == 1 {
            return Ok(h.index as usize);
        }
        Err(refusal(h.gen, slot.gen))
    }

    /// The live buffer `h` names; O(1).
    pub(crate) fn get(&self, h: BufferHandle) -> Result<&Live<B>, BufferError> {
        let i = self.check(h)?;
        match self.slots.get(i).map(|s| &s.state) {
            Some(SlotState::Live(l)) => Ok(l),
            _ => Err(BufferError::Stale),
        }
    }

    /// The live buffer `h` names, mutably; O(1).
    pub(crate) fn get_mut(&mut self, h: BufferHandle) -> Result<&mut Live<B>, BufferError> {
        let i = self.check(h)?;
        match self.slots.get_mut(i).map(|s| &mut s.state) {
            Some(SlotState::Live(l)) => Ok(l),
            _ => Err(BufferError::Stale),
        }
    }

    /// Turns a live buffer into a retiring one (its handle goes stale);
    /// returns the slot index to queue behind the gate. Refused while mapped.
    pub(crate) fn retire(
        &mut self,
        h: BufferHandle,
        gate: [u64; MAX_QUEUES],
        mask: u8,
    ) -> Result<u32, BufferError> {
        let i = self.check(h)?;
        let slot = self.slots.get_mut(i).ok_or(BufferError::Unknown)?;
        let SlotState::Live(l) = &slot.state else { return Err(BufferError::Stale) };
        if l.mapped {
            return Err(BufferError::Mapped);
        }
        let size = l.info.size;
        let reserved = l.alloc.reserved();
        let SlotState::Live(l) = core::mem::replace(&mut slot.state, SlotState::Free) else {
            return Err(BufferError::Stale);
        };
        slot.state = SlotState::Retiring(Retiring { alloc: l.alloc, info: l.info, gate, mask });
        slot.gen = (slot.gen & !DRIVER_MARK).wrapping_add(1);
        self.live = self.live.wrapping_sub(1);
        self.live_bytes = self.live_bytes.wrapping_sub(size);
        self.retiring = self.retiring.wrapping_add(1);
        self.retiring_bytes = self.retiring_bytes.wrapping_add(reserved);
        Ok(h.index)
    }

    /// The retiring entry in slot `index`.
    pub(crate) fn retiring_mut(&mut self, index: u32) -> Option<&mut Retiring<B>> {
        match self.slots.get_mut(index as usize).map(|s| &mut s.state) {
            Some(SlotState::Retiring(r)) => Some(r),
            _ => None,
        }
    }

    /// The retiring entry in slot `index`, read-only.
    pub(crate) fn retiring_ref(&self, index: u32) -> Option<&Retiring<B>> {
        match self.slots.get(index as usize).map(|s| &s.state) {
            Some(SlotState::Retiring(r)) => Some(r),
            _ => None,
        }
    }

    /// Frees slot `index` (retiring) and returns its allocation.
    pub(crate) fn release(&mut self, index: u32) -> Option<PoolAlloc<B>> {
        let free_head = self.free_head;
        let slot = self.slots.get_mut(index as usize)?;
        if !matches!(slot.state, SlotState::Retiring(_)) {
            return None;
        }
        let SlotState::Retiring(r) = core::mem::replace(&mut slot.state, SlotState::Free) else {
            return None;
        };
        // A slot whose next live generation would reach the mark is never
        // reused.
        if slot.gen < DRIVER_MARK.wrapping_sub(2) {
            slot.next_free = free_head;
            self.free_head = index;
        }
        self.retiring = self.retiring.wrapping_sub(1);
        self.retiring_bytes = self.retiring_bytes.wrapping_sub(r.alloc.reserved());
        Some(r.alloc)
    }

    /// The buffer, live or freed and still waiting for its fences, whose
    /// `[va, va + size)` is nearest to `addr` (distance 0 when inside), with
    /// its handle when live. O(N): fault reports and the validation mode.
    pub(crate) fn nearest(&self, addr: u64) -> Option<(BufferInfo, Option<BufferHandle>)> {
        let dist = |i: &BufferInfo| {
            if addr < i.va {
                i.va.saturating_sub(addr)
            } else {
                addr.saturating_sub(i.va.saturating_add(i.size).saturating_sub(1))
            }
        };
        let mut best: Option<(u64, BufferInfo, Option<BufferHandle>)> = None;
        let n = (self.bump as usize).min(self.slots.len());
        for (i, slot) in self.slots.iter().enumerate().take(n) {
            let (info, handle) = match &slot.state {
                SlotState::Live(l) => {
                    let index = u32::try_from(i).unwrap_or(NIL);
                    (l.info, Some(BufferHandle { device: self.device, index, gen: slot.gen }))
                }
                SlotState::Retiring(r) => (r.info, None),
                SlotState::Free => continue,
            };
            let d = dist(&info);
            // Prefer a live buffer over a freed one at the same distance.
            let better = match &best {
                None => true,
                Some((bd, _, bh)) => d < *bd || (d == *bd && bh.is_none() && handle.is_some()),
            };
            if better {
                best = Some((d, info, handle));
            }
        }
        best.map(|(_, i, h)| (i, h))
    }

    /// Whether a freed buffer still waiting for its fences reserves part
    /// of `[lo, hi)`. O(N): a fixed-address allocation that found the
    /// range taken.
    pub(crate) fn retiring_overlaps(&self, lo: u64, hi: u64) -> bool {
        let n = (self.bump as usize).min(self.slots.len());
        self.slots.iter().take(n).any(|slot| match &slot.state {
            SlotState::Retiring(r) => r.info.va < hi && lo < r.info.va.saturating_add(r.info.reserved),
            _ => false,
        })
    }

    /// The live buffer for which `key` gives the smallest value (`None`:
    /// not a candidate). O(N).
    pub(crate) fn min_live(&self, mut key: impl FnMut(&Live<B>) -> Option<u64>) -> Option<BufferHandle> {
        let mut best: Option<(u64, BufferHandle)> = None;
        let n = (self.bump as usize).min(self.slots.len());
        for (i, slot) in self.slots.iter().enumerate().take(n) {
            let SlotState::Live(l) = &slot.state else { continue };
            let Some(k) = key(l) else { continue };
            if best.is_none_or(|(bk, _)| k < bk) {
                let index = u32::try_from(i).unwrap_or(NIL);
                best = Some((k, BufferHandle { device: self.device, index, gen: slot.gen }));
            }
        }
        best.map(|(_, h)| h)
    }

    /// Calls `f` for every live buffer (the leak report). O(N).
    pub(crate) fn for_each_live(&self, mut f: impl FnMut(LeakEntry)) {
        for (i, slot) in self.slots.iter().enumerate() {
            if let SlotState::Live(l) = &slot.state {
                f(LeakEntry {
                    handle: BufferHandle {
                        device: self.device,
                        index: u32::try_from(i).unwrap_or(NIL),
                        gen: slot.gen,
                    },
                    info: l.info,
                });
            }
        }
    }

    /// Takes every allocation out of the table, live or retiring
    /// (teardown: the GPU is stopped). O(N).
    pub(crate) fn drain(&mut self, mut f: impl FnMut(PoolAlloc<B>)) {
        for slot in self.slots.iter_mut() {
            match core::mem::replace(&mut slot.state, SlotState::Free) {
                SlotState::Live(l) => f(l.alloc),
                SlotState::Retiring(r) => f(r.alloc),
                SlotState::Free => {}
            }
        }
        self.live = 0;
        self.live_bytes = 0;
        self.retiring = 0;
        self.retiring_bytes = 0;
    }
}
