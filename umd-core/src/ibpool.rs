//! The IB pool: a fixed number of fixed-size chunks of GPU-visible memory
//! that command buffers are recorded into, shared by every queue and every
//! submitting thread.
//!
//! A chunk is `Free`, being recorded into (`Recording`), or in flight until
//! a fence signals (`InFlight`). With batching, the last chunk a queue used
//! stays `Open` for that queue: the next small submission on the same queue
//! continues in it after the previous one instead of taking a fresh chunk.
//! A chunk is reused only once its fence has signalled (checked lazily
//! against the queue's timeline when a chunk is needed), so the engine never
//! reads a chunk the CPU is rewriting. After a reset the timeline is forced
//! past the cancelled work, which frees its chunks the same way.
//!
//! Recording happens outside every lock: the pool's lock is held only to
//! pick a chunk and to commit or abort a recording, so two threads record
//! into different chunks at once. A chunk's memory is handed to exactly one
//! recording, the one that moved it to `Recording` under the lock; that
//! state machine is what makes the `&mut` slices of disjoint chunks sound.
//!
//! A submission takes the lock once: [`Pending::commit_in_order`] (what
//! the engine uses, under the queue's submit lock) leaves a one-chunk
//! recording's commit in its queue's mailbox, and whoever takes the lock
//! next applies it before looking at the chunks (the queue's next pick, or
//! any reader of the pool's state), so every chunk state seen under the
//! lock is the one the commit made. The chunks stay `Recording` until
//! then, which only delays their reuse.

use core::fmt;

use lock_api::{Mutex, RawMutex};

use crate::cmd::{Chunk, ChunkSource, CommandBuffer};
use crate::platform::DmaRegion;
use crate::sync::atomic::{AtomicU32, Ordering};
use crate::sync::{FenceId, QueueId, Seqno};

/// The smallest space left in an open chunk worth continuing in (dwords).
const MIN_OPEN_DWORDS: usize = 64;
/// Most queues the pool keeps open chunks for.
pub const MAX_QUEUES: usize = crate::sync::MAX_QUEUES;
/// Most chunks a pool has (a recording tracks its chunks in a `u64`).
pub const MAX_CHUNKS: usize = 64;

/// State of one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkState {
    /// Available.
    Free,
    /// Taken by a recording in progress.
    Recording,
    /// Holds submitted commands until `fence` signals.
    InFlight(FenceId),
    /// In flight until `fence` and still accepting `fence.queue`'s next
    /// submission from dword `used` on.
    Open {
        /// The latest fence of the work in it.
        fence: FenceId,
        /// Dwords used.
        used: usize,
    },
}

/// Why the pool could not be set up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolSetupError {
    /// Chunk size not a multiple of 256 bytes, zero, or above 16 MiB.
    BadChunkSize {
        /// Bytes asked.
        bytes: usize,
    },
    /// The region is smaller than `CHUNKS` chunks.
    RegionTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes given.
        given: usize,
    },
    /// No chunks, or more than [`MAX_CHUNKS`].
    BadChunkCount {
        /// Chunks asked.
        chunks: usize,
    },
}

impl fmt::Display for PoolSetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolSetupError::BadChunkSize { bytes } => write!(f, "bad IB chunk size {bytes}"),
            PoolSetupError::RegionTooSmall { needed, given } => {
                write!(f, "IB pool needs {needed} bytes, region has {given}")
            }
            PoolSetupError::BadChunkCount { chunks } => {
                write!(f, "IB pool of {chunks} chunks (1 to {MAX_CHUNKS})")
            }
        }
    }
}

impl core::error::Error for PoolSetupError {}

/// Counts of chunks per state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IbPoolStats {
    /// Free chunks (including in-flight ones whose fence has signalled but
    /// that were not looked at since).
    pub free: usize,
    /// Chunks being recorded into.
    pub recording: usize,
    /// Chunks waiting for a fence.
    pub in_flight: usize,
    /// Open chunks (in flight, still accepting work).
    pub open: usize,
}

#[derive(Debug)]
struct State<const CHUNKS: usize> {
    chunks: [ChunkState; CHUNKS],
    open: [Option<usize>; MAX_QUEUES],
}

/// A queue's commit left for the next holder of the pool's lock (see the
/// module docs): one recording of one chunk, committed with a fence of
/// that queue. `meta` is 0 while the mailbox is empty; otherwise it holds
/// [`FULL`], [`BATCHING`], the chunk index (bits 22-27) and the dwords
/// used (bits 0-21; a chunk has at most 4 Mi dwords), and the fence's
/// sequence number is in `seq_lo`/`seq_hi` (32-bit atomics: native on
/// every target). One writer (the queue's submitter, in order) fills it
/// only when empty and publishes with a release store of `meta`; readers
/// hold the pool's lock, read after an acquire load of `meta` and empty it
/// with a release store. No read-modify-write on either side.
struct Mailbox {
    meta: AtomicU32,
    seq_lo: AtomicU32,
    seq_hi: AtomicU32,
}

/// [`Mailbox::meta`]: holds a commit.
const FULL: u32 = 1 << 31;
/// [`Mailbox::meta`]: the recording was batching.
const BATCHING: u32 = 1 << 30;
/// [`Mailbox::meta`]: where the chunk index starts.
const INDEX_SHIFT: u32 = 22;
/// [`Mailbox::meta`]: the dwords-used field.
const USED_MASK: u32 = (1 << INDEX_SHIFT) - 1;

impl Mailbox {
    fn new() -> Self {
        Mailbox { meta: AtomicU32::new(0), seq_lo: AtomicU32::new(0), seq_hi: AtomicU32::new(0) }
    }
}

/// `CHUNKS` chunks of `chunk_dwords` each in one region, with the
/// bookkeeping behind a lock of kind `R`.
pub struct IbPool<R: RawMutex, const CHUNKS: usize> {
    mem: Option<DmaRegion>,
    gpu_va: u64,
    chunk_dwords: usize,
    state: Mutex<R, State<CHUNKS>>,
    /// Commits waiting for the lock, per queue.
    mailbox: [Mailbox; MAX_QUEUES],
}

impl<R: RawMutex, const CHUNKS: usize> fmt::Debug for IbPool<R, CHUNKS> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IbPool").field("gpu_va", &self.gpu_va).field("stats", &self.stats()).finish()
    }
}

/// What picking a chunk found.
enum Pick {
    /// Chunk `i`, from dword `from`.
    Got(usize, usize),
    /// Nothing free: wait for this fence, then try again.
    WaitFor(FenceId),
    /// Nothing free and nothing to wait for.
    Never,
}

/// A [`Pick`] with the chunk's memory and address looked up: one call
/// through the recording's `dyn Lend` instead of three.
enum Picked {
    /// Chunk `i` from dword `from`: its CPU pointer and dwords from there
    /// (None if outside the pool's memory) and its GPU address.
    Got { i: usize, from: usize, mem: Option<(*mut u32, usize)>, va: u64 },
    /// As [`Pick::WaitFor`].
    WaitFor(FenceId),
    /// As [`Pick::Never`].
    Never,
}

impl<R: RawMutex, const CHUNKS: usize> IbPool<R, CHUNKS> {
    /// A pool over `mem` (at least `CHUNKS * chunk_bytes`), mapped at
    /// `gpu_va`. On error the memory is handed back.
    pub fn new(mem: DmaRegion, gpu_va: u64, chunk_bytes: usize) -> Result<Self, (PoolSetupError, DmaRegion)> {
        if chunk_bytes == 0 || chunk_bytes % 256 != 0 || chunk_bytes > 16 << 20 {
            return Err((PoolSetupError::BadChunkSize { bytes: chunk_bytes }, mem));
        }
        if CHUNKS == 0 || CHUNKS > MAX_CHUNKS {
            return Err((PoolSetupError::BadChunkCount { chunks: CHUNKS }, mem));
        }
        let needed = chunk_bytes.saturating_mul(CHUNKS);
        if mem.len() < needed || !mem.cpu_visible() {
            let given = if mem.cpu_visible() { mem.len() } else { 0 };
            return Err((PoolSetupError::RegionTooSmall { needed, given }, mem));
        }
        let state = State { chunks: [ChunkState::Free; CHUNKS], open: [None; MAX_QUEUES] };
        Ok(IbPool {
            mem: Some(mem),
            gpu_va,
            chunk_dwords: chunk_bytes / 4,
            state: Mutex::new(state),
            mailbox: core::array::from_fn(|_| Mailbox::new()),
        })
    }

    /// A pool with no memory yet (every recording finds no chunk).
    pub fn unset() -> Self {
        let state = State { chunks: [ChunkState::Free; CHUNKS], open: [None; MAX_QUEUES] };
        IbPool {
            mem: None,
            gpu_va: 0,
            chunk_dwords: 0,
            state: Mutex::new(state),
            mailbox: core::array::from_fn(|_| Mailbox::new()),
        }
    }

    /// Takes the memory and its GPU address back (teardown).
    pub fn release(&mut self) -> Option<(DmaRegion, u64)> {
        self.mem.take().map(|m| (m, self.gpu_va))
    }

    /// The pool's memory (for cache maintenance and dumps).
    pub fn region(&self) -> &DmaRegion {
        static EMPTY: DmaRegion = DmaRegion::empty();
        self.mem.as_ref().unwrap_or(&EMPTY)
    }

    /// GPU address and length of the pool.
    pub fn range(&self) -> (u64, usize) {
        (self.gpu_va, self.mem.as_ref().map_or(0, DmaRegion::len))
    }

    /// Dwords per chunk.
    pub fn chunk_dwords(&self) -> usize {
        self.chunk_dwords
    }

    /// The state of chunk `i`.
    pub fn state(&self, i: usize) -> Option<ChunkState> {
        let mut st = self.state.lock();
        self.apply_all(&mut st);
        st.chunks.get(i).copied()
    }

    /// How many chunks are in each state.
    pub fn stats(&self) -> IbPoolStats {
        let mut s = IbPoolStats::default();
        let mut st = self.state.lock();
        self.apply_all(&mut st);
        for c in &st.chunks {
            let n = match c {
                ChunkState::Free => &mut s.free,
                ChunkState::Recording => &mut s.recording,
                ChunkState::InFlight(_) => &mut s.in_flight,
                ChunkState::Open { .. } => &mut s.open,
            };
            *n = n.saturating_add(1);
        }
        s
    }

    /// Marks the chunks whose fence `completed` says signalled as free
    /// (what picking does lazily; callers use it before reading stats).
    pub fn reclaim(&self, completed: &dyn Fn(QueueId) -> Seqno) {
        let mut st = self.state.lock();
        self.apply_all(&mut st);
        reclaim(&mut st, completed, None);
    }

    /// Applies the commit waiting in queue `q`'s mailbox, if any (the
    /// caller holds the lock). Inline hosted (the submit path); one
    /// out-of-line copy on bare metal, where it has three callers.
    #[cfg_attr(not(target_os = "none"), inline)]
    #[cfg_attr(target_os = "none", inline(never))]
    fn apply(&self, st: &mut State<CHUNKS>, q: usize) {
        self.apply_then(st, q, None);
    }

    /// Applies the commit waiting in queue `q`'s mailbox, if any (the
    /// caller holds the lock): `finish_locked` of a recording of that one
    /// chunk. With `next`, the first pick of a batching recording of `q`:
    /// when the commit leaves its chunk open with room enough, the chunk
    /// stays `Recording`, now for `next`, which continues it (`Some`, the
    /// pick), instead of going to `Open` and back. `None` otherwise, the
    /// commit applied and `next` untouched. The one place the mailbox is
    /// decoded; always inlined, so that `next = None` folds away.
    #[inline(always)]
    fn apply_then(&self, st: &mut State<CHUNKS>, q: usize, next: Option<&mut Recording>) -> Option<Pick> {
        let m = self.mailbox.get(q)?;
        let meta = m.meta.load(Ordering::Acquire);
        if meta & FULL == 0 {
            return None;
        }
        let seq =
            u64::from(m.seq_lo.load(Ordering::Relaxed)) | u64::from(m.seq_hi.load(Ordering::Relaxed)) << 32;
        // The fields are read: the writer may refill it.
        m.meta.store(0, Ordering::Release);
        let i = ((meta & !(FULL | BATCHING)) >> INDEX_SHIFT) as usize;
        let fence = FenceId { queue: QueueId(q as u8), seqno: Seqno(seq) };
        // Chunk `i`, used up to `used`: open with batching, else in flight.
        let mut open_now = None;
        if let Some(s) = st.chunks.get_mut(i).filter(|s| **s == ChunkState::Recording) {
            if meta & BATCHING == 0 {
                *s = ChunkState::InFlight(fence);
            } else {
                open_now = Some(i);
                let used = align_used((meta & USED_MASK) as usize, self.chunk_dwords);
                match next.filter(|_| self.chunk_dwords.saturating_sub(used) >= MIN_OPEN_DWORDS) {
                    // Stays `Recording`, now `rec`'s, and is the queue's
                    // open chunk (a different one before is only in flight).
                    Some(rec) => {
                        moved_on(st, q, open_now);
                        rec.started = true;
                        rec.resume = Some((i, used, fence));
                        rec.taken |= 1u64 << (i & 63);
                        return Some(Pick::Got(i, used));
                    }
                    None => *s = ChunkState::Open { fence, used },
                }
            }
        }
        moved_on(st, q, open_now);
        None
    }

    /// Applies every queue's waiting commit (the caller holds the lock).
    fn apply_all(&self, st: &mut State<CHUNKS>) {
        for q in 0..MAX_QUEUES {
            self.apply(st, q);
        }
    }

    /// Commits `rec` with `fence`, which the caller's queue orders after
    /// every earlier commit of that queue (see
    /// [`Pending::commit_in_order`]): through the queue's mailbox when the
    /// recording took one chunk and the mailbox is empty, else under the
    /// lock after the mailbox's own commit.
    fn commit_in_order(&self, rec: &Recording, fence: FenceId) {
        let q = usize::from(rec.queue.0);
        if let (Some(m), Some((i, used))) = (self.mailbox.get(q), rec.used_last) {
            let one = i < CHUNKS && rec.taken == 1u64 << (i & 63);
            if one
                && fence.queue == rec.queue
                && used <= USED_MASK as usize
                && m.meta.load(Ordering::Acquire) == 0
            {
                m.seq_lo.store(fence.seqno.0 as u32, Ordering::Relaxed);
                m.seq_hi.store((fence.seqno.0 >> 32) as u32, Ordering::Relaxed);
                let batching = if rec.batching { BATCHING } else { 0 };
                m.meta.store(FULL | batching | (i as u32) << INDEX_SHIFT | used as u32, Ordering::Release);
                return;
            }
        }
        self.finish(rec, Some(fence));
    }

    /// Starts a recording for `queue`. `completed` reads a queue's
    /// timeline (lazy reclaim); `make_room(fence)` is called when no chunk
    /// is free: it waits for `fence` (the oldest holding a chunk) and
    /// returns false to give up.
    pub fn recorder<'a>(
        &'a self,
        queue: QueueId,
        batching: bool,
        completed: &'a dyn Fn(QueueId) -> Seqno,
        make_room: &'a mut dyn FnMut(FenceId) -> bool,
    ) -> PoolSource<'a> {
        PoolSource {
            pool: self,
            rec: Recording { queue, batching, resume: None, used_last: None, taken: 0, started: false },
            completed,
            make_room,
            open_va: None,
        }
    }

    fn pick(&self, rec: &mut Recording, completed: &dyn Fn(QueueId) -> Seqno) -> Pick {
        if self.mem.is_none() {
            return Pick::Never;
        }
        let mut st = self.state.lock();
        let q = usize::from(rec.queue.0);
        // The queue's last commit first: it may have left the open chunk,
        // which the first pick of a batching recording continues in the
        // same step when it can (not in the `size-first` build: the general
        // path, same outcome).
        if !cfg!(feature = "size-first") && !rec.started && rec.batching {
            if let Some(got) = self.apply_then(&mut st, q, Some(&mut *rec)) {
                return got;
            }
        } else {
            self.apply(&mut st, q);
        }
        // The first chunk of a batching recording continues the queue's
        // open chunk when enough of it is left.
        if !rec.started && rec.batching {
            rec.started = true;
            if let Some(i) = st.open.get(q).copied().flatten() {
                if let Some(ChunkState::Open { fence, used }) = st.chunks.get(i).copied() {
                    if fence.queue == rec.queue && self.chunk_dwords.saturating_sub(used) >= MIN_OPEN_DWORDS {
                        if let Some(s) = st.chunks.get_mut(i) {
                            *s = ChunkState::Recording;
                        }
                        rec.resume = Some((i, used, fence));
                        rec.taken |= 1u64 << (i & 63);
                        return Pick::Got(i, used);
                    }
                }
            }
        }
        rec.started = true;
        let free = match st.chunks.iter().position(|s| *s == ChunkState::Free) {
            Some(i) => Some(i),
            None => {
                self.apply_all(&mut st);
                reclaim(&mut st, completed, None);
                st.chunks.iter().position(|s| *s == ChunkState::Free)
            }
        };
        if let Some(i) = free {
            if let Some(s) = st.chunks.get_mut(i) {
                *s = ChunkState::Recording;
            }
            rec.taken |= 1u64 << (i & 63);
            return Pick::Got(i, 0);
        }
        // Wait for the oldest fence holding a chunk that is not ours.
        let oldest = st
            .chunks
            .iter()
            .filter_map(|s| match s {
                ChunkState::InFlight(f) | ChunkState::Open { fence: f, .. } => Some(*f),
                _ => None,
            })
            .min_by(|a, b| a.seqno.cmp_wrapping(b.seqno));
        match oldest {
            Some(f) => Pick::WaitFor(f),
            None => Pick::Never,
        }
    }

    /// CPU pointer and dwords of chunk `i` from dword `from`.
    fn chunk_ptr(&self, i: usize, from: usize) -> Option<(*mut u32, usize)> {
        let mem = self.mem.as_ref()?;
        let base = mem.cpu_ptr()?;
        let start = i.checked_mul(self.chunk_dwords)?.checked_add(from)?;
        let len = self.chunk_dwords.checked_sub(from)?;
        if i >= CHUNKS || start.checked_add(len)?.checked_mul(4)? > mem.len() {
            return None;
        }
        // SAFETY: `start + len` dwords lie inside the region (checked above).
        Some((unsafe { base.as_ptr().cast::<u32>().add(start) }, len))
    }

    fn chunk_va(&self, i: usize, offset_dw: usize) -> u64 {
        let dw = i.saturating_mul(self.chunk_dwords).saturating_add(offset_dw);
        self.gpu_va.wrapping_add((dw as u64).wrapping_mul(4))
    }

    fn finish(&self, rec: &Recording, fence: Option<FenceId>) {
        let mut st = self.state.lock();
        // The queue's earlier commit first (commits apply in order).
        self.apply(&mut st, usize::from(rec.queue.0));
        self.finish_locked(&mut st, rec, fence);
    }

    /// [`IbPool::finish`] with the lock held.
    fn finish_locked(&self, st: &mut State<CHUNKS>, rec: &Recording, fence: Option<FenceId>) {
        let q = usize::from(rec.queue.0);
        let last = rec.used_last.map(|(l, _)| l);
        let mut open_now = None;
        // Only the chunks this recording took (usually one), not the pool.
        let mut taken = rec.taken;
        while taken != 0 {
            let i = taken.trailing_zeros() as usize;
            taken &= taken.wrapping_sub(1);
            let Some(s) = st.chunks.get_mut(i) else { continue };
            if *s != ChunkState::Recording {
                continue;
            }
            let resumed = rec.resume.filter(|(r, _, _)| *r == i);
            *s = match (fence, resumed) {
                // Aborted: a resumed open chunk keeps its earlier work.
                (None, Some((_, used, f))) => ChunkState::Open { fence: f, used },
                (None, None) => ChunkState::Free,
                (Some(f), _) => match rec.used_last {
                    Some((_, used)) if last == Some(i) && rec.batching => {
                        open_now = Some(i);
                        ChunkState::Open { fence: f, used: align_used(used, self.chunk_dwords) }
                    }
                    _ => ChunkState::InFlight(f),
                },
            };
        }
        if fence.is_some() {
            moved_on(st, q, open_now);
        }
    }
}

/// After a commit on queue `q` that left `open_now` open (or none): a
/// previously open chunk the queue moved away from is now only in flight.
/// Inlined hosted (into the submit path's pick).
#[cfg_attr(not(target_os = "none"), inline(always))]
fn moved_on<const CHUNKS: usize>(st: &mut State<CHUNKS>, q: usize, open_now: Option<usize>) {
    let prev = st.open.get(q).copied().flatten();
    if let Some(p) = prev.filter(|p| open_now != Some(*p)) {
        if let Some(s) = st.chunks.get_mut(p) {
            if let ChunkState::Open { fence, .. } = *s {
                *s = ChunkState::InFlight(fence);
            }
        }
    }
    if let Some(o) = st.open.get_mut(q) {
        *o = open_now;
    }
}

/// Frees every chunk whose fence has signalled, except `keep`.
fn reclaim<const CHUNKS: usize>(
    st: &mut State<CHUNKS>,
    completed: &dyn Fn(QueueId) -> Seqno,
    keep: Option<usize>,
) {
    let State { chunks, open } = st;
    for (i, s) in chunks.iter_mut().enumerate() {
        let f = match *s {
            ChunkState::InFlight(f) | ChunkState::Open { fence: f, .. } => f,
            _ => continue,
        };
        if Some(i) != keep && f.is_signalled_by(completed(f.queue)) {
            *s = ChunkState::Free;
            for o in open.iter_mut() {
                if *o == Some(i) {
                    *o = None;
                }
            }
        }
    }
}

/// Dwords an open chunk's next submission starts at: IB addresses must be
/// aligned for every generation (32 bytes on gen2), so round to 16 dwords.
#[inline(always)]
fn align_used(used: usize, chunk_dwords: usize) -> usize {
    used.saturating_add(15).checked_div(16).unwrap_or(0).saturating_mul(16).min(chunk_dwords)
}

/// What one recording holds.
#[derive(Clone, Copy, Debug)]
struct Recording {
    queue: QueueId,
    batching: bool,
    /// The open chunk continued first: index, where, and its earlier fence.
    resume: Option<(usize, usize, FenceId)>,
    /// The last chunk handed out and how much of it was used.
    used_last: Option<(usize, usize)>,
    /// Chunks taken (bit per chunk).
    taken: u64,
    started: bool,
}

/// The pool as seen by a recording, without its lock type and size.
trait Lend {
    fn pick_chunk(&self, rec: &mut Recording, completed: &dyn Fn(QueueId) -> Seqno) -> Picked;
    fn chunk_dwords(&self) -> usize;
    fn finish(&self, rec: &Recording, fence: Option<FenceId>);
    fn commit_in_order(&self, rec: &Recording, fence: FenceId);
}

impl<R: RawMutex, const CHUNKS: usize> Lend for IbPool<R, CHUNKS> {
    fn pick_chunk(&self, rec: &mut Recording, completed: &dyn Fn(QueueId) -> Seqno) -> Picked {
        match IbPool::pick(self, rec, completed) {
            Pick::Got(i, from) => Picked::Got {
                i,
                from,
                mem: IbPool::chunk_ptr(self, i, from),
                va: IbPool::chunk_va(self, i, from),
            },
            Pick::WaitFor(f) => Picked::WaitFor(f),
            Pick::Never => Picked::Never,
        }
    }
    fn chunk_dwords(&self) -> usize {
        self.chunk_dwords
    }
    fn finish(&self, rec: &Recording, fence: Option<FenceId>) {
        IbPool::finish(self, rec, fence)
    }
    fn commit_in_order(&self, rec: &Recording, fence: FenceId) {
        IbPool::commit_in_order(self, rec, fence)
    }
}

/// A recording in progress: the command buffer's chunk source.
pub struct PoolSource<'a> {
    pool: &'a dyn Lend,
    rec: Recording,
    completed: &'a dyn Fn(QueueId) -> Seqno,
    make_room: &'a mut dyn FnMut(FenceId) -> bool,
    /// GPU address of the last chunk handed out (where it was handed out
    /// from), until it is closed: closing it needs no call to the pool.
    open_va: Option<u64>,
}

impl fmt::Debug for PoolSource<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolSource").field("rec", &self.rec).finish()
    }
}

impl PoolSource<'_> {
    /// Ends recording: the chunks to commit or abort. The pending
    /// recording borrows the source, so no other chunk can be handed out
    /// while it lives (one it would not know of), and reads the source's
    /// recording in place instead of a copy of it.
    #[inline]
    pub fn pending(&self) -> Pending<'_> {
        Pending { pool: self.pool, rec: &self.rec, done: false }
    }
}

impl<'a> ChunkSource<'a> for PoolSource<'a> {
    fn next_chunk(&mut self) -> Option<Chunk<'a>> {
        // Each round either gets a chunk or waits for a fence holding one;
        // CHUNKS + 1 rounds cover every fence once.
        for _ in 0..=MAX_CHUNKS {
            match self.pool.pick_chunk(&mut self.rec, self.completed) {
                Picked::Got { i, from, mem, va } => {
                    let (ptr, len) = mem?;
                    self.rec.used_last = Some((i, from));
                    self.open_va = Some(va);
                    // SAFETY: chunk `i` was moved to `Recording` for this
                    // recording alone under the pool's lock (its bit is in
                    // `rec.taken`); nothing else creates a reference to its
                    // memory from `from` on until `commit`/`abort` hands it
                    // back, which ends the recording. The device reads
                    // it only after the submission that owns it is emitted.
                    let mem = unsafe { core::slice::from_raw_parts_mut(ptr, len) };
                    return Some(Chunk { mem, gpu_va: va });
                }
                Picked::WaitFor(f) => {
                    if !(self.make_room)(f) {
                        return None;
                    }
                }
                Picked::Never => return None,
            }
        }
        None
    }

    fn close_chunk(&mut self, gpu_va: u64, dwords: usize) {
        if let (Some((i, base)), Some(va)) = (self.rec.used_last, self.open_va) {
            if va == gpu_va {
                self.rec.used_last = Some((i, base.saturating_add(dwords)));
                self.open_va = None;
            }
        }
    }
}

/// A finished recording whose chunks are still marked `Recording`: commit
/// it with the submission's fence, or abort it. Dropping it aborts.
pub struct Pending<'a> {
    pool: &'a dyn Lend,
    rec: &'a Recording,
    done: bool,
}

impl fmt::Debug for Pending<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pending").field("rec", &self.rec).finish()
    }
}

impl Pending<'_> {
    /// Calls `f(byte_offset, bytes)` for each range of the pool's memory
    /// this recording wrote: the ranges to clean from the data cache
    /// before the GPU reads them (not the whole pool).
    pub fn dirty(&self, mut f: impl FnMut(usize, usize)) {
        let cd = self.pool.chunk_dwords();
        // Only the chunks taken (usually one), lowest first.
        let mut taken = self.rec.taken;
        while taken != 0 {
            let i = taken.trailing_zeros() as usize;
            taken &= taken.wrapping_sub(1);
            let start = self.rec.resume.filter(|(r, _, _)| *r == i).map_or(0, |(_, used, _)| used);
            let end = match self.rec.used_last {
                Some((last, used)) if last == i => used,
                _ => cd,
            };
            // Exact without overflow checks: `i` < 64, `start` <= `cd` (an
            // open chunk's start is capped at the chunk) and `cd` <= 4 Mi
            // dwords (the pool's size check): at most 1,040 MiB.
            let base = i.wrapping_mul(cd).wrapping_add(start).wrapping_mul(4);
            let len = end.saturating_sub(start).saturating_mul(4);
            if len > 0 {
                f(base, len);
            }
        }
    }

    /// The recording was submitted with `fence`: its chunks are in flight
    /// until it signals; with batching the last one stays open.
    pub fn commit(mut self, fence: FenceId) {
        self.pool.finish(self.rec, Some(fence));
        self.done = true;
    }

    /// [`Pending::commit`] without taking the pool's lock when it can: the
    /// commit is applied by the next holder of the lock, before it looks
    /// at any chunk (the chunks stay `Recording` until then). The caller
    /// must serialise the commits of the recording's queue, as the engine
    /// does under the queue's submit lock (two at once may take the slow
    /// path or, worse, overwrite each other's note). Always inlined: a
    /// call through the pool's `dyn Lend`, and no drop after it (a
    /// committed recording has nothing to give back).
    #[inline(always)]
    pub fn commit_in_order(self, fence: FenceId) {
        let this = core::mem::ManuallyDrop::new(self);
        this.pool.commit_in_order(this.rec, fence);
    }

    /// The recording failed: its chunks are free again, and a continued
    /// open chunk keeps its earlier contents and position.
    pub fn abort(mut self) {
        self.pool.finish(self.rec, None);
        self.done = true;
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.pool.finish(self.rec, None);
        }
    }
}

/// The recorder a submission's closure gets: a command buffer over chunks
/// of the IB pool.
pub type Recorder<'a> = CommandBuffer<'a, PoolSource<'a>>;
