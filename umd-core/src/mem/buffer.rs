//! Buffer objects: generation-counted handles, descriptions and leak reports.
//!
//! Callers hold [`BufferHandle`]s, which are small and `Copy`. A handle is an
//! index plus a generation; every destroy bumps the slot's generation, so a
//! stale handle (used after destroy, or twice destroyed) is an error and can
//! never reach the buffer that reused its slot. A slot whose generation would
//! wrap is retired for good rather than risk a collision.
//!
//! [`BufferTable`] is the bare handle table (any payload); [`Buffers`] puts it
//! on top of a [`Pool`] so that creating a buffer reserves its GPU VA and
//! destroying it returns the VA, immediately or after a fence. Backing pages
//! and page-table updates belong to the platform (later issues).

use core::fmt;

use crate::mem::pagetable::CachePolicy;
use crate::mem::pool::{Pool, PoolAlloc, PoolError, PoolStats};
use crate::mem::va::VaNode;
use crate::sync::seqno::{FenceId, Seqno};

/// Buffer properties that matter to mapping and to the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BufferFlags {
    /// The CPU maps it too (unified memory): the platform must map it.
    pub cpu_visible: bool,
    /// The GPU may only read it (no WRITE bit in its PTEs).
    pub gpu_read_only: bool,
    /// Cache policy of its mappings.
    pub cache: CachePolicy,
}

/// What the table knows about one buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferInfo {
    /// GPU virtual address.
    pub va: u64,
    /// Requested size in bytes.
    pub size: u64,
    /// Flags given at creation.
    pub flags: BufferFlags,
    /// Creation tag shown in leak reports (a static string: no heap).
    pub tag: &'static str,
}

/// A generation-counted reference to a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufferHandle {
    index: u32,
    gen: u32,
}

impl BufferHandle {
    /// Packs the handle into 64 bits (for FFI or trace records).
    pub const fn to_bits(self) -> u64 {
        ((self.gen as u64) << 32) | self.index as u64
    }
    /// Unpacks a value made by [`BufferHandle::to_bits`]; validity is
    /// checked when it is used.
    pub const fn from_bits(bits: u64) -> Self {
        BufferHandle { index: bits as u32, gen: (bits >> 32) as u32 }
    }
}

impl fmt::Display for BufferHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bo#{}.{}", self.index, self.gen)
    }
}

/// Why a buffer operation was refused. Nothing changes on error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BufferError {
    /// The handle never named a buffer of this table.
    Unknown,
    /// The handle's buffer was destroyed (use after free or double free).
    Stale,
    /// Every slot is in use (or retired).
    TableFull,
    /// The pool refused the memory.
    Pool(PoolError),
}

impl fmt::Display for BufferError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BufferError::Unknown => f.write_str("unknown buffer handle"),
            BufferError::Stale => f.write_str("stale buffer handle (buffer was destroyed)"),
            BufferError::TableFull => f.write_str("buffer table is full"),
            BufferError::Pool(e) => write!(f, "buffer memory: {e}"),
        }
    }
}

impl From<PoolError> for BufferError {
    fn from(e: PoolError) -> Self {
        BufferError::Pool(e)
    }
}

/// One line of a leak report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeakEntry {
    /// The live handle.
    pub handle: BufferHandle,
    /// Its description, including the creation tag.
    pub info: BufferInfo,
}

struct Slot<T> {
    gen: u32,
    next_free: u32,
    entry: Option<(BufferInfo, T)>,
}

const NIL: u32 = u32::MAX;

/// A fixed-capacity table of `N` buffers with payload `T`.
pub struct BufferTable<T, const N: usize> {
    slots: [Slot<T>; N],
    free_head: u32,
    bump: u32,
    live: u32,
    live_bytes: u64,
}

impl<T, const N: usize> Default for BufferTable<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T, const N: usize> BufferTable<T, N> {
    /// An empty table.
    pub const fn new() -> Self {
        BufferTable {
            slots: [const { Slot { gen: 0, next_free: NIL, entry: None } }; N],
            free_head: NIL,
            bump: 0,
            live: 0,
            live_bytes: 0,
        }
    }

    /// Live buffers.
    pub fn live(&self) -> u32 {
        self.live
    }

    /// Sum of the live buffers' sizes.
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// True when `insert` would fail with [`BufferError::TableFull`].
    pub fn is_full(&self) -> bool {
        self.free_head == NIL && (self.bump as usize) >= N.min(NIL as usize)
    }

    /// Adds a buffer; O(1). On a full table the payload is handed back.
    pub fn insert(&mut self, info: BufferInfo, payload: T) -> Result<BufferHandle, (BufferError, T)> {
        let index = if self.free_head != NIL {
            self.free_head
        } else if (self.bump as usize) < N && self.bump != NIL {
            self.bump
        } else {
            return Err((BufferError::TableFull, payload));
        };
        let Some(slot) = self.slots.get_mut(index as usize) else {
            return Err((BufferError::TableFull, payload));
        };
        if index == self.free_head {
            self.free_head = slot.next_free;
        } else {
            self.bump = self.bump.wrapping_add(1);
        }
        // Generations are odd while live, even while free.
        slot.gen = slot.gen.wrapping_add(1);
        slot.next_free = NIL;
        slot.entry = Some((info, payload));
        self.live = self.live.wrapping_add(1);
        self.live_bytes = self.live_bytes.wrapping_add(info.size);
        Ok(BufferHandle { index, gen: slot.gen })
    }

    /// The buffer `h` names; O(1).
    pub fn get(&self, h: BufferHandle) -> Result<(&BufferInfo, &T), BufferError> {
        let slot = self.slot(h)?;
        match &slot.entry {
            Some((info, t)) => Ok((info, t)),
            None => Err(BufferError::Stale),
        }
    }

    /// Removes the buffer `h` names and returns it; O(1). A second remove
    /// of the same handle is [`BufferError::Stale`].
    pub fn remove(&mut self, h: BufferHandle) -> Result<(BufferInfo, T), BufferError> {
        self.slot(h)?;
        let free_head = self.free_head;
        let Some(slot) = self.slots.get_mut(h.index as usize) else {
            return Err(BufferError::Unknown);
        };
        let Some((info, t)) = slot.entry.take() else {
            return Err(BufferError::Stale);
        };
        slot.gen = slot.gen.wrapping_add(1);
        // A slot whose next live generation would wrap is never reused.
        if slot.gen < u32::MAX.wrapping_sub(1) {
            slot.next_free = free_head;
            self.free_head = h.index;
        }
        self.live = self.live.wrapping_sub(1);
        self.live_bytes = self.live_bytes.wrapping_sub(info.size);
        Ok((info, t))
    }

    /// Calls `f` for every live buffer (the leak report: handle, VA, size,
    /// flags and creation tag). O(N).
    pub fn leak_report(&self, mut f: impl FnMut(LeakEntry)) {
        for (i, slot) in self.slots.iter().enumerate() {
            if let Some((info, _)) = &slot.entry {
                f(LeakEntry {
                    handle: BufferHandle { index: u32::try_from(i).unwrap_or(NIL), gen: slot.gen },
                    info: *info,
                });
            }
        }
    }

    fn slot(&self, h: BufferHandle) -> Result<&Slot<T>, BufferError> {
        let slot = self.slots.get(h.index as usize).ok_or(BufferError::Unknown)?;
        if h.gen == 0 || h.gen % 2 == 0 || h.gen > slot.gen {
            return Err(BufferError::Unknown);
        }
        if h.gen != slot.gen || slot.entry.is_none() {
            return Err(BufferError::Stale);
        }
        Ok(slot)
    }
}

/// Buffers backed by a [`Pool`]: creation reserves VA, destruction returns
/// it now or after a fence. `N` is the buffer capacity; the other parameters
/// are the pool's.
pub struct Buffers<S, const N: usize, const SLABS: usize, const DEFERRED: usize, const QUEUES: usize> {
    pool: Pool<S, SLABS, DEFERRED, QUEUES>,
    table: BufferTable<PoolAlloc, N>,
}

impl<S, const N: usize, const SLABS: usize, const DEFERRED: usize, const QUEUES: usize>
    Buffers<S, N, SLABS, DEFERRED, QUEUES>
where
    S: AsRef<[VaNode]> + AsMut<[VaNode]>,
{
    /// Buffers over `pool`.
    pub fn new(pool: Pool<S, SLABS, DEFERRED, QUEUES>) -> Self {
        Buffers { pool, table: BufferTable::new() }
    }

    /// Creates a buffer of `size` bytes aligned to `align`.
    pub fn create(
        &mut self,
        size: u64,
        align: u64,
        flags: BufferFlags,
        tag: &'static str,
    ) -> Result<BufferHandle, BufferError> {
        if self.table.is_full() {
            return Err(BufferError::TableFull);
        }
        let a = self.pool.alloc(size, align)?;
        let info = BufferInfo { va: a.addr(), size, flags, tag };
        match self.table.insert(info, a) {
            Ok(h) => Ok(h),
            Err((e, a)) => {
                // Unreachable in practice (checked above); give the VA back.
                let _ = self.pool.free(a);
                Err(e)
            }
        }
    }

    /// The buffer's description.
    pub fn info(&self, h: BufferHandle) -> Result<BufferInfo, BufferError> {
        self.table.get(h).map(|(i, _)| *i)
    }

    /// Destroys the buffer now: the caller asserts the GPU is done with it.
    pub fn destroy(&mut self, h: BufferHandle) -> Result<(), BufferError> {
        let (_, a) = self.table.remove(h)?;
        self.pool.free(a)?;
        Ok(())
    }

    /// Destroys the handle now and returns the memory once `fence` signals.
    pub fn destroy_after(&mut self, h: BufferHandle, fence: FenceId) -> Result<(), BufferError> {
        if usize::from(fence.queue.0) >= QUEUES {
            return Err(PoolError::Deferred(crate::mem::deferred::DeferredError::BadQueue).into());
        }
        if self.pool.pending_on(fence.queue.0) >= DEFERRED {
            return Err(PoolError::Deferred(crate::mem::deferred::DeferredError::Full).into());
        }
        self.table.get(h)?;
        let (_, a) = self.table.remove(h)?;
        self.pool.free_after(a, fence).map_err(|(e, _)| e)?;
        Ok(())
    }

    /// Returns memory of signalled fences to the pool (see [`Pool::reclaim`]).
    pub fn reclaim(&mut self, queue: u8, completed: Seqno, budget: usize) -> usize {
        self.pool.reclaim(queue, completed, budget)
    }

    /// The leak report: every live buffer with size and creation tag.
    pub fn leak_report(&self, f: impl FnMut(LeakEntry)) {
        self.table.leak_report(f)
    }

    /// Live buffers.
    pub fn live(&self) -> u32 {
        self.table.live()
    }

    /// Pool statistics.
    pub fn stats(&self) -> PoolStats {
        self.pool.stats()
    }

    /// The pool underneath.
    pub fn pool(&self) -> &Pool<S, SLABS, DEFERRED, QUEUES> {
        &self.pool
    }
}
