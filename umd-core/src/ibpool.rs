//! The IB pool: a fixed number of fixed-size chunks of GPU-visible memory
//! that command buffers are recorded into.
//!
//! A chunk is `Free`, being recorded into (`Recording`), or in flight until
//! a fence signals (`InFlight`). With batching, the last chunk a queue used
//! stays `Open` for that queue: the next small submission on the same queue
//! continues in it after the previous one instead of taking a fresh chunk.
//! A chunk is reused only once its fence has signalled, so the engine never
//! reads a chunk the CPU is rewriting.
//!
//! The pool keeps the bookkeeping; the memory (one [`DmaRegion`]) stays
//! with its owner and is lent to each recording, so the owner can clean
//! caches and dump it while chunks are still being committed. Recording
//! goes through a [`PoolSource`], which the command buffer uses as its
//! [`ChunkSource`]; chunk slices are split off the region with safe slice
//! splitting, so distinct chunks are distinct `&mut` borrows.

use core::fmt;

use crate::cmd::{Chunk, ChunkSource, CommandBuffer, EncodeError, Encoder, Finished};
use crate::platform::DmaRegion;
use crate::queue::SubmitError;
use crate::sync::{FenceId, QueueId, Seqno};

/// The smallest space left in an open chunk worth continuing in (dwords).
const MIN_OPEN_DWORDS: usize = 64;
/// Most queues the pool tracks open chunks for.
pub const MAX_QUEUES: usize = 4;

/// State of one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkState {
    /// Available.
    Free,
    /// Taken by the recording in progress.
    Recording,
    /// Holds submitted commands until `fence` signals.
    InFlight(FenceId),
    /// In flight until `fence` and still accepting `queue`'s next
    /// submission from dword `used` on.
    Open {
        /// The latest fence of the work in it.
        fence: FenceId,
        /// Dwords used.
        used: usize,
    },
}

/// Why the pool could not be set up or used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolSetupError {
    /// Chunk size not a multiple of 256 bytes, zero, or above the IB limit.
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
}

impl fmt::Display for PoolSetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolSetupError::BadChunkSize { bytes } => write!(f, "bad IB chunk size {bytes}"),
            PoolSetupError::RegionTooSmall { needed, given } => {
                write!(f, "IB pool needs {needed} bytes, region has {given}")
            }
        }
    }
}

/// Counts of chunks per state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IbPoolStats {
    /// Free chunks.
    pub free: usize,
    /// Chunks being recorded into.
    pub recording: usize,
    /// Chunks waiting for a fence.
    pub in_flight: usize,
    /// Open chunks (in flight, still accepting work).
    pub open: usize,
}

/// Bookkeeping of `CHUNKS` chunks of `chunk_dwords` each in one region.
#[derive(Debug)]
pub struct IbPool<const CHUNKS: usize> {
    gpu_va: u64,
    chunk_dwords: usize,
    state: [ChunkState; CHUNKS],
    open: [Option<usize>; MAX_QUEUES],
}

impl<const CHUNKS: usize> IbPool<CHUNKS> {
    /// A pool for a region of `region_len` bytes mapped at `gpu_va`, in
    /// chunks of `chunk_bytes`.
    pub fn new(region_len: usize, gpu_va: u64, chunk_bytes: usize) -> Result<Self, PoolSetupError> {
        if chunk_bytes == 0 || chunk_bytes % 256 != 0 || chunk_bytes > 16 << 20 {
            return Err(PoolSetupError::BadChunkSize { bytes: chunk_bytes });
        }
        let needed = chunk_bytes.saturating_mul(CHUNKS);
        if region_len < needed {
            return Err(PoolSetupError::RegionTooSmall { needed, given: region_len });
        }
        Ok(IbPool {
            gpu_va,
            chunk_dwords: chunk_bytes / 4,
            state: [ChunkState::Free; CHUNKS],
            open: [None; MAX_QUEUES],
        })
    }

    /// Dwords per chunk.
    pub fn chunk_dwords(&self) -> usize {
        self.chunk_dwords
    }

    /// The state of chunk `i`.
    pub fn state(&self, i: usize) -> Option<ChunkState> {
        self.state.get(i).copied()
    }

    /// How many chunks are in each state.
    pub fn stats(&self) -> IbPoolStats {
        let mut s = IbPoolStats::default();
        for st in &self.state {
            let n = match st {
                ChunkState::Free => &mut s.free,
                ChunkState::Recording => &mut s.recording,
                ChunkState::InFlight(_) => &mut s.in_flight,
                ChunkState::Open { .. } => &mut s.open,
            };
            *n = n.saturating_add(1);
        }
        s
    }

    /// The oldest fence holding a chunk of `queue`, if any (what to wait
    /// for when the pool is empty).
    pub fn oldest_fence(&self) -> Option<FenceId> {
        self.state
            .iter()
            .filter_map(|s| match s {
                ChunkState::InFlight(f) | ChunkState::Open { fence: f, .. } => Some(*f),
                _ => None,
            })
            .min_by(|a, b| a.seqno.cmp_wrapping(b.seqno))
    }

    /// Frees the chunks of `queue` whose fence `completed` covers. An open
    /// chunk stays open (its space is still usable) but its earlier work is
    /// done. Returns chunks freed.
    pub fn reclaim(&mut self, queue: QueueId, completed: Seqno) -> usize {
        reclaim_states(&mut self.state, queue, completed, false)
    }

    /// After a reset of `queue`: nothing of it is in flight any more.
    pub fn release_queue(&mut self, queue: QueueId) {
        for s in self.state.iter_mut() {
            match *s {
                ChunkState::InFlight(f) | ChunkState::Open { fence: f, .. } if f.queue == queue => {
                    *s = ChunkState::Free;
                }
                _ => {}
            }
        }
        if let Some(o) = self.open.get_mut(usize::from(queue.0)) {
            *o = None;
        }
    }

    /// Starts recording for `queue` into `region` (the pool's memory).
    /// `make_room(fence)` is called when no chunk is free: it waits for
    /// `fence` (the oldest holding a chunk) and returns its queue's
    /// completed value, or None to give up.
    pub fn recorder<'a, 's, F: FnMut(FenceId) -> Option<Seqno>>(
        &'s mut self,
        region: &'a mut DmaRegion,
        queue: QueueId,
        batching: bool,
        make_room: F,
    ) -> PoolSource<'a, 's, CHUNKS, F> {
        let IbPool { gpu_va, chunk_dwords, state, open } = self;
        let chunk_dwords = *chunk_dwords;
        let mut slices: [Option<&'a mut [u32]>; CHUNKS] = [const { None }; CHUNKS];
        for (slot, c) in slices.iter_mut().zip(region.words_mut().chunks_exact_mut(chunk_dwords.max(1))) {
            *slot = Some(c);
        }
        let open_slot = open.get_mut(usize::from(queue.0));
        let resume = match open_slot.as_deref().copied().flatten() {
            Some(i) if batching => match state.get(i) {
                Some(ChunkState::Open { used, fence })
                    if fence.queue == queue && chunk_dwords.saturating_sub(*used) >= MIN_OPEN_DWORDS =>
                {
                    Some((i, *used))
                }
                _ => None,
            },
            _ => None,
        };
        PoolSource {
            slices,
            state,
            open: open_slot,
            gpu_va: *gpu_va,
            chunk_dwords,
            queue,
            batching,
            resume,
            used_last: None,
            make_room,
        }
    }
}

fn reclaim_states(state: &mut [ChunkState], queue: QueueId, completed: Seqno, include_open: bool) -> usize {
    let mut n = 0usize;
    for s in state.iter_mut() {
        let f = match *s {
            ChunkState::InFlight(f) => f,
            ChunkState::Open { fence, .. } if include_open => fence,
            _ => continue,
        };
        if f.queue == queue && f.is_signalled_by(completed) {
            *s = ChunkState::Free;
            n = n.saturating_add(1);
        }
    }
    n
}

/// Dwords an open chunk's next submission starts at: IB addresses must be
/// aligned for every generation (32 bytes on gen2), so round to 16 dwords.
fn align_used(used: usize, chunk_dwords: usize) -> usize {
    used.saturating_add(15).checked_div(16).unwrap_or(0).saturating_mul(16).min(chunk_dwords)
}

/// A recording in progress: the command buffer's chunk source.
pub struct PoolSource<'a, 's, const CHUNKS: usize, F> {
    slices: [Option<&'a mut [u32]>; CHUNKS],
    state: &'s mut [ChunkState; CHUNKS],
    open: Option<&'s mut Option<usize>>,
    gpu_va: u64,
    chunk_dwords: usize,
    queue: QueueId,
    batching: bool,
    /// The open chunk to continue in first, and where.
    resume: Option<(usize, usize)>,
    /// The last chunk handed out and how much of it was used.
    used_last: Option<(usize, usize)>,
    make_room: F,
}

impl<const CHUNKS: usize, F> fmt::Debug for PoolSource<'_, '_, CHUNKS, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolSource").field("queue", &self.queue).field("resume", &self.resume).finish()
    }
}

impl<'a, 's, const CHUNKS: usize, F: FnMut(FenceId) -> Option<Seqno>> PoolSource<'a, 's, CHUNKS, F> {
    fn chunk_va(&self, i: usize, offset_dw: usize) -> u64 {
        let dw = i.saturating_mul(self.chunk_dwords).saturating_add(offset_dw);
        self.gpu_va.wrapping_add((dw as u64).wrapping_mul(4))
    }

    fn take(&mut self, i: usize, from_dw: usize) -> Option<Chunk<'a>> {
        let whole = self.slices.get_mut(i)?.take()?;
        let (_, mem) = whole.split_at_mut_checked(from_dw)?;
        Some(Chunk { mem, gpu_va: self.chunk_va(i, from_dw) })
    }

    fn free_index(&self) -> Option<usize> {
        self.state.iter().position(|s| *s == ChunkState::Free)
    }

    /// Ends recording: the chunk bookkeeping to commit or abort, without
    /// the wait closure (so what it borrowed is free again).
    pub fn finish(self) -> Pending<'s, CHUNKS> {
        Pending {
            state: self.state,
            open: self.open,
            chunk_dwords: self.chunk_dwords,
            batching: self.batching,
            resume: self.resume,
            used_last: self.used_last,
        }
    }
}

/// A finished recording whose chunks are still marked `Recording`.
#[derive(Debug)]
pub struct Pending<'a, const CHUNKS: usize> {
    state: &'a mut [ChunkState; CHUNKS],
    open: Option<&'a mut Option<usize>>,
    chunk_dwords: usize,
    batching: bool,
    resume: Option<(usize, usize)>,
    used_last: Option<(usize, usize)>,
}

impl<const CHUNKS: usize> Pending<'_, CHUNKS> {
    /// Calls `f(byte_offset, bytes)` for each range of the pool's memory
    /// this recording wrote: the ranges to clean from the data cache
    /// before the GPU reads them (not the whole pool).
    pub fn dirty(&self, mut f: impl FnMut(usize, usize)) {
        let cd = self.chunk_dwords;
        for (i, s) in self.state.iter().enumerate() {
            let resumed = self.resume.filter(|(r, _)| *r == i);
            if *s != ChunkState::Recording && resumed.is_none() {
                continue;
            }
            let start = resumed.map_or(0, |(_, used)| used);
            let end = match self.used_last {
                Some((last, used)) if last == i => used,
                _ => cd,
            };
            let base = i.saturating_mul(cd).saturating_add(start).saturating_mul(4);
            let len = end.saturating_sub(start).saturating_mul(4);
            if len > 0 {
                f(base, len);
            }
        }
    }

    /// The recording was submitted with `fence`: its chunks are in flight
    /// until it signals; with batching the last one stays open.
    pub fn commit(self, fence: FenceId) {
        let last = self.used_last;
        let mut open_now = None;
        for (i, s) in self.state.iter_mut().enumerate() {
            let is_last = last.map(|(l, _)| l) == Some(i);
            let resumed = self.resume.map(|(r, _)| r) == Some(i);
            if *s == ChunkState::Recording || (resumed && matches!(s, ChunkState::Open { .. })) {
                *s = match last {
                    Some((_, used)) if is_last && self.batching => {
                        open_now = Some(i);
                        ChunkState::Open { fence, used: align_used(used, self.chunk_dwords) }
                    }
                    _ => ChunkState::InFlight(fence),
                };
            }
        }
        // A previously open chunk we moved away from is now only in flight.
        if let Some(slot) = self.open {
            if let Some(prev) = *slot {
                if open_now != Some(prev) {
                    if let Some(s) = self.state.get_mut(prev) {
                        if let ChunkState::Open { fence: f, .. } = *s {
                            *s = ChunkState::InFlight(f);
                        }
                    }
                }
            }
            *slot = open_now;
        }
    }

    /// The recording failed or was dropped: its chunks are free again, and
    /// an open chunk keeps its previous contents and position.
    pub fn abort(self) {
        for s in self.state.iter_mut() {
            if *s == ChunkState::Recording {
                *s = ChunkState::Free;
            }
        }
    }
}

impl<'a, const CHUNKS: usize, F: FnMut(FenceId) -> Option<Seqno>> ChunkSource<'a>
    for PoolSource<'a, '_, CHUNKS, F>
{
    fn next_chunk(&mut self) -> Option<Chunk<'a>> {
        if let Some((i, used)) = self.resume {
            if self.used_last.is_none() {
                let c = self.take(i, used)?;
                self.used_last = Some((i, used));
                return Some(c);
            }
        }
        let i = match self.free_index() {
            Some(i) => i,
            None => {
                // Wait for the oldest fence holding a chunk we may reclaim
                // (not one of ours), then reclaim its queue's chunks.
                let resumed = self.resume.map(|(r, _)| r);
                let oldest = self
                    .state
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| match s {
                        ChunkState::InFlight(f) => Some(*f),
                        ChunkState::Open { fence, .. } if Some(i) != resumed => Some(*fence),
                        _ => None,
                    })
                    .min_by(|a, b| a.seqno.cmp_wrapping(b.seqno))?;
                let completed = (self.make_room)(oldest)?;
                reclaim_states(self.state.as_mut_slice(), oldest.queue, completed, true);
                self.free_index()?
            }
        };
        let c = self.take(i, 0)?;
        if let Some(s) = self.state.get_mut(i) {
            *s = ChunkState::Recording;
        }
        self.used_last = Some((i, 0));
        Some(c)
    }

    fn close_chunk(&mut self, gpu_va: u64, dwords: usize) {
        if let Some((i, base)) = self.used_last {
            if self.chunk_va(i, base) == gpu_va {
                self.used_last = Some((i, base.saturating_add(dwords)));
            }
        }
    }
}

/// The recorder a submission's closure gets: a command buffer over chunks
/// of the IB pool.
pub type Recorder<'a, 's, 'b, const CHUNKS: usize> =
    CommandBuffer<'a, PoolSource<'a, 's, CHUNKS, &'b mut dyn FnMut(FenceId) -> Option<Seqno>>>;

/// Runs `record` over chunks of `pool` (memory `region`) for `queue`, and
/// returns the finished command buffer with its chunks still pending: the
/// caller commits them once the submission reached the GPU, or aborts.
/// Shared by both submission modes.
pub fn record_into<'s, const CHUNKS: usize, R>(
    pool: &'s mut IbPool<CHUNKS>,
    region: &mut DmaRegion,
    enc: Encoder,
    queue: QueueId,
    batching: bool,
    make_room: &mut dyn FnMut(FenceId) -> Option<Seqno>,
    record: R,
) -> Result<(Finished, Pending<'s, CHUNKS>), SubmitError>
where
    R: for<'a, 'x, 'b> FnOnce(&mut Recorder<'a, 'x, 'b, CHUNKS>) -> Result<(), EncodeError>,
{
    let source = pool.recorder(region, queue, batching, make_room);
    let mut cb = CommandBuffer::with_encoder(enc, source);
    let recorded = record(&mut cb);
    let (finished, source) = cb.finish_into_source();
    let pending = source.finish();
    match (recorded, finished) {
        (Ok(()), Ok(f)) => Ok((f, pending)),
        (Err(e), _) | (Ok(()), Err(e)) => {
            pending.abort();
            Err(match e {
                EncodeError::ChunkUnavailable => SubmitError::PoolEmpty,
                EncodeError::Empty => SubmitError::Empty,
                e => SubmitError::Encode(e),
            })
        }
    }
}
