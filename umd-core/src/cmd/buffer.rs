//! The command-buffer builder: packets into caller-provided chunks of
//! GPU-visible memory, chained with CHAIN packets when a chunk fills.
//!
//! Every chunk keeps room at its end for one CHAIN packet. When a packet does
//! not fit, the builder takes the next chunk from its [`ChunkSource`], writes
//! a CHAIN to it in the full chunk, and continues. A CHAIN must carry the
//! size of the chunk it jumps to, which is only known once that chunk is
//! closed, so the builder keeps the CHAIN's dwords (split off the old chunk)
//! and patches the size when the next chunk is closed.
//!
//! Errors are sticky: after the first failure every later call returns it
//! and writes nothing, so a caller can emit a whole sequence and check once
//! at [`CommandBuffer::finish`]. Memory written before the failing packet is
//! left intact.

use super::command::{Command, CompareOp, DispatchOp};
use super::encode::{EncodeError, Encoder};
use crate::hw::{Generation, IbRef};

/// A piece of GPU-visible memory the builder may fill with packets.
#[derive(Debug)]
pub struct Chunk<'a> {
    /// CPU view of the chunk.
    pub mem: &'a mut [u32],
    /// GPU address of `mem[0]`.
    pub gpu_va: u64,
}

/// Where the builder gets its next chunk: a static array in firmware, the
/// IB pool (which records the chunk against the submission's fence) later.
pub trait ChunkSource<'a> {
    /// The next chunk, or `None` when none is available.
    fn next_chunk(&mut self) -> Option<Chunk<'a>>;

    /// The builder is done with the chunk at `gpu_va`: it used `dwords`
    /// (its CHAIN included). Sources that batch several submissions into
    /// one chunk use this to know where the next one may start.
    fn close_chunk(&mut self, gpu_va: u64, dwords: usize) {
        let _ = (gpu_va, dwords);
    }
}

/// A chunk source over a fixed list of chunks, for firmware with a static
/// carve-out and for tests.
#[derive(Debug)]
pub struct SliceChunks<'a, I: Iterator<Item = Chunk<'a>>> {
    chunks: I,
}

impl<'a, I: Iterator<Item = Chunk<'a>>> SliceChunks<'a, I> {
    /// Hands out the chunks of `chunks` in order.
    pub fn new(chunks: I) -> Self {
        SliceChunks { chunks }
    }
}

impl<'a, I: Iterator<Item = Chunk<'a>>> ChunkSource<'a> for SliceChunks<'a, I> {
    fn next_chunk(&mut self) -> Option<Chunk<'a>> {
        self.chunks.next()
    }
}

/// Splits one contiguous region at `gpu_va` into chunks of `chunk_dwords`
/// (the last one may be shorter); a convenience for [`SliceChunks`].
pub fn split_region(mem: &mut [u32], gpu_va: u64, chunk_dwords: usize) -> impl Iterator<Item = Chunk<'_>> {
    let step = chunk_dwords.max(1);
    mem.chunks_mut(step).enumerate().map(move |(i, mem)| Chunk {
        mem,
        gpu_va: gpu_va.wrapping_add((i as u64).wrapping_mul(step as u64).wrapping_mul(4)),
    })
}

/// What a finished command buffer is: the first chunk to call from the
/// ring (an INDIRECT_BUFFER to `gpu_va`, `size_dw` dwords) and totals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finished {
    /// GPU address of the first chunk.
    pub gpu_va: u64,
    /// Dwords used in the first chunk (including its CHAIN, if any).
    pub size_dw: u32,
    /// Chunks used.
    pub chunks: u32,
    /// Packets written (padding and CHAINs excluded).
    pub packets: u32,
    /// Dwords written over all chunks (padding and CHAINs included).
    pub total_dwords: u64,
}

impl Finished {
    /// The first chunk as the IB the ring calls.
    #[inline(always)]
    pub fn ib(&self) -> IbRef {
        IbRef::new(self.gpu_va, self.size_dw)
    }
}

/// Dwords of a CHAIN packet (header + 3), the same in every generation.
const CHAIN_DWORDS: usize = 4;

/// Builds a command stream for one generation into chunks from `S`.
#[derive(Debug)]
pub struct CommandBuffer<'a, S: ChunkSource<'a>> {
    enc: Encoder,
    source: S,
    cur: Option<Chunk<'a>>,
    pos: usize,
    first: Option<IbRef>,
    /// CHAIN dwords in the previous chunk, waiting for this chunk's size.
    pending_chain: Option<&'a mut [u32]>,
    error: Option<EncodeError>,
    chunks: u32,
    packets: u32,
    total: u64,
}

/// Appends through `CommandBuffer::push_fast` with one of the encoder's
/// per-kind entry points: the command, its validation into no room (the
/// first packet) and its encoding at the current position, all from one
/// argument list.
macro_rules! push_kind {
    ($buf:expr, $cmd:expr, $encode:ident($($arg:expr),*)) => {
        $buf.push_fast(
            || $cmd,
            |enc| enc.$encode($($arg,)* &mut [], 0, 0),
            |enc, out, pos, va| enc.$encode($($arg,)* out, pos, va),
        )
    };
}

impl<'a, S: ChunkSource<'a>> CommandBuffer<'a, S> {
    /// A builder for `generation` taking chunks from `source`. No chunk is
    /// taken until the first packet.
    pub fn new(generation: Generation, source: S) -> Self {
        Self::with_encoder(Encoder::new(generation), source)
    }

    /// A builder with an explicit encoder (e.g. from a probed chip).
    pub fn with_encoder(enc: Encoder, source: S) -> Self {
        CommandBuffer {
            enc,
            source,
            cur: None,
            pos: 0,
            first: None,
            pending_chain: None,
            error: None,
            chunks: 0,
            packets: 0,
            total: 0,
        }
    }

    /// The encoder in use.
    pub fn encoder(&self) -> Encoder {
        self.enc
    }

    /// The sticky error, if any call has failed.
    pub fn error(&self) -> Option<EncodeError> {
        self.error
    }

    /// Packets written so far.
    pub fn packets(&self) -> u32 {
        self.packets
    }

    /// Usable dwords of a chunk: its length capped at the generation's IB
    /// limit, less the room kept for a CHAIN.
    fn usable(&self, chunk: &Chunk<'_>) -> usize {
        let max_ib = self.enc.desc().limits.max_ib_dwords as usize;
        chunk.mem.len().min(max_ib).saturating_sub(CHAIN_DWORDS)
    }

    fn take_chunk(&mut self) -> Result<Chunk<'a>, EncodeError> {
        let chunk = self.source.next_chunk().ok_or(EncodeError::ChunkUnavailable)?;
        self.accept(&chunk)?;
        Ok(chunk)
    }

    /// Checks a chunk the source handed out (aligned for an IB, room for
    /// a packet besides the CHAIN) and counts it.
    #[inline(always)]
    fn accept(&mut self, chunk: &Chunk<'_>) -> Result<(), EncodeError> {
        let align = self.enc.desc().rules.ib_align;
        if crate::hw::misalignment(chunk.gpu_va, align) != 0 {
            return Err(EncodeError::ChunkMisaligned { va: chunk.gpu_va, align });
        }
        if self.usable(chunk) == 0 {
            return Err(EncodeError::PacketTooLargeForChunk { needed: 1, capacity: 0 });
        }
        self.chunks = self.chunks.saturating_add(1);
        Ok(())
    }

    /// Appends one command. Errors are sticky (see the module docs).
    pub fn push(&mut self, cmd: &Command<'_>) -> Result<(), EncodeError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let r = self.push_inner(cmd);
        if let Err(e) = r {
            self.error = Some(e);
        }
        r
    }

    fn push_inner(&mut self, cmd: &Command<'_>) -> Result<(), EncodeError> {
        if self.cur.is_none() {
            // Validate first: a bad command never costs a chunk. The
            // encoder validates before it looks at the room left, so
            // encoding into no room at all is the check (the encoder's
            // folded code, not `check`'s table walk): `BufferFull` means
            // a valid command.
            match self.enc.encode(cmd, &mut [], 0, 0) {
                Ok(_) | Err(EncodeError::BufferFull { .. }) => {}
                Err(e) => return Err(e),
            }
            self.open_first()?;
        }
        // The encoder validates before it looks at the room left, so a bad
        // command fails here without touching the chunk, and `BufferFull`
        // means a valid command that does not fit: one validation per
        // packet on the common path.
        let n = match self.encode_here(cmd) {
            Err(EncodeError::BufferFull { .. }) => {
                // Move to a fresh chunk (which may be larger than what was
                // left of this one, e.g. a batched chunk resumed part-way),
                // and only then decide whether the packet can fit a chunk at
                // all. Chunks start IB-aligned, which every generation makes
                // packet-aligned (the `descriptions_are_consistent` test), so
                // no padding there.
                self.chain_to_next()?;
                let capacity = self.cur.as_ref().map_or(0, |c| self.usable(c));
                match self.encode_here(cmd) {
                    Err(EncodeError::BufferFull { needed, .. }) => {
                        return Err(EncodeError::PacketTooLargeForChunk { needed, capacity })
                    }
                    r => r?,
                }
            }
            r => r?,
        };
        self.pos = self.pos.saturating_add(n);
        self.total = self.total.saturating_add(n as u64);
        self.packets = self.packets.saturating_add(1);
        Ok(())
    }

    /// Before the first packet, already validated: takes the first chunk
    /// as [`CommandBuffer::push`] would (an error is sticky), so that the
    /// packet itself can then go through the fast path. Not inlined: one
    /// copy, off the per-packet path.
    #[cfg(not(feature = "compact-encoder"))]
    #[inline(never)]
    fn begin(&mut self) -> Result<(), EncodeError> {
        let r = self.open_first();
        if let Err(e) = r {
            self.error = Some(e);
        }
        r
    }

    /// Takes the first chunk (no chunk yet, the packet about to go in
    /// already validated).
    fn open_first(&mut self) -> Result<(), EncodeError> {
        // Checked in place, not moved through a `Result` of its own.
        let chunk = self.source.next_chunk().ok_or(EncodeError::ChunkUnavailable)?;
        self.accept(&chunk)?;
        self.first = Some(IbRef::new(chunk.gpu_va, 0));
        self.cur = Some(chunk);
        self.pos = 0;
        Ok(())
    }

    /// Encodes `cmd` at the current position of the current chunk, within
    /// its usable part (the room for a closing CHAIN stays free).
    fn encode_here(&mut self, cmd: &Command<'_>) -> Result<usize, EncodeError> {
        let Some(cur) = self.cur.as_mut() else {
            return Err(EncodeError::ChunkUnavailable);
        };
        let usable =
            cur.mem.len().min(self.enc.desc().limits.max_ib_dwords as usize).saturating_sub(CHAIN_DWORDS);
        let limit = cur.mem.get_mut(..usable).ok_or(EncodeError::ChunkUnavailable)?;
        self.enc.encode(cmd, limit, self.pos, cur.gpu_va)
    }

    /// Closes the current chunk with a CHAIN to a new one.
    fn chain_to_next(&mut self) -> Result<(), EncodeError> {
        let next = self.take_chunk()?;
        let Some(cur) = self.cur.take() else {
            return Err(EncodeError::ChunkUnavailable);
        };
        let cur_va = cur.gpu_va;
        let chain_end = self.pos.saturating_add(CHAIN_DWORDS);
        let (_, rest) = cur.mem.split_at_mut_checked(self.pos).ok_or(EncodeError::ChunkUnavailable)?;
        let slot = rest.get_mut(..CHAIN_DWORDS).ok_or(EncodeError::ChunkUnavailable)?;
        // Size 1 is a placeholder; the real size is patched when `next` closes.
        self.enc.encode(&Command::Chain { addr: next.gpu_va, size_dw: 1 }, slot, 0, 0)?;
        let closed_size = u32::try_from(chain_end).map_err(|_| EncodeError::ChunkUnavailable)?;
        self.close_chunk(cur_va, closed_size);
        self.pending_chain = Some(slot);
        self.total = self.total.saturating_add(CHAIN_DWORDS as u64);
        self.cur = Some(next);
        self.pos = 0;
        Ok(())
    }

    /// Records the final size of the chunk at `va`: in the CHAIN that jumps
    /// to it, or as the first chunk's size.
    fn close_chunk(&mut self, va: u64, size_dw: u32) {
        self.source.close_chunk(va, size_dw as usize);
        if let Some(slot) = self.pending_chain.take() {
            let _ = self.enc.encode(&Command::Chain { addr: va, size_dw }, slot, 0, 0);
        } else if let Some(first) = self.first.as_mut() {
            if first.va.get() == va {
                first.dwords = size_dw;
            }
        }
    }

    /// Closes the stream and says what to call from the ring.
    pub fn finish(self) -> Result<Finished, EncodeError> {
        self.finish_into_source().0
    }

    /// [`CommandBuffer::finish`], also handing back the chunk source (the
    /// IB pool needs it to mark the chunks as in flight).
    #[inline]
    pub fn finish_into_source(mut self) -> (Result<Finished, EncodeError>, S) {
        let r = self.close();
        (r, self.source)
    }

    /// [`CommandBuffer::finish_into_source`] without moving the buffer or
    /// its source: the buffer is closed (nothing more may be recorded; the
    /// caller drops it) and the source stays readable through
    /// [`CommandBuffer::source`].
    #[inline]
    pub(crate) fn finish_in_place(&mut self) -> Result<Finished, EncodeError> {
        self.close()
    }

    /// Lets go of the chunks' memory (a buffer that failed keeps its
    /// current chunk and a CHAIN slot until then), before its source gives
    /// the chunks back while the buffer itself lives on.
    pub(crate) fn release_chunks(&mut self) {
        self.cur = None;
        self.pending_chain = None;
    }

    /// The chunk source.
    #[inline]
    pub(crate) fn source(&self) -> &S {
        &self.source
    }

    #[inline]
    fn close(&mut self) -> Result<Finished, EncodeError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let Some(cur) = self.cur.take() else {
            return Err(EncodeError::Empty);
        };
        let size = u32::try_from(self.pos).map_err(|_| EncodeError::Empty)?;
        self.close_chunk(cur.gpu_va, size);
        let first = self.first.ok_or(EncodeError::Empty)?;
        Ok(Finished {
            gpu_va: first.va.get(),
            size_dw: first.dwords,
            chunks: self.chunks,
            packets: self.packets,
            total_dwords: self.total,
        })
    }

    /// The common case of appending `cmd`, through `encode` (one of the
    /// encoder's per-kind entry points, inlined here with its generation's
    /// constants): no sticky error, the packet fits and is valid. Before
    /// the first packet `validate` (the same entry point into no room: the
    /// encoder validates before it looks at the room left, so `BufferFull`
    /// means a valid packet; a closure of its own, so that it is inlined
    /// and folds to the checks) validates it and [`CommandBuffer::begin`] takes the first chunk,
    /// with `push`'s errors; an invalid first packet takes no chunk.
    /// Anything else (a full chunk, an invalid command, a sticky error)
    /// goes through [`CommandBuffer::push`], which encodes `cmd` again on
    /// its general path and gives the same result as if it had been called
    /// directly: `encode` leaves the chunk untouched when it fails.
    #[cfg(not(feature = "compact-encoder"))]
    #[inline(always)]
    fn push_fast<'c>(
        &mut self,
        cmd: impl Fn() -> Command<'c>,
        validate: impl FnOnce(&Encoder) -> Result<usize, EncodeError>,
        encode: impl FnOnce(&Encoder, &mut [u32], usize, u64) -> Result<usize, EncodeError>,
    ) -> Result<(), EncodeError> {
        if self.error.is_none() {
            if self.cur.is_none() {
                match validate(&self.enc) {
                    Ok(_) | Err(EncodeError::BufferFull { .. }) => self.begin()?,
                    Err(_) => return self.push(&cmd()),
                }
            }
            if let Some(cur) = self.cur.as_mut() {
                let usable = cur
                    .mem
                    .len()
                    .min(self.enc.desc().limits.max_ib_dwords as usize)
                    .saturating_sub(CHAIN_DWORDS);
                if let Some(limit) = cur.mem.get_mut(..usable) {
                    if let Ok(n) = encode(&self.enc, limit, self.pos, cur.gpu_va) {
                        // `n` dwords fitted after `pos` in `limit`: no overflow.
                        self.pos = self.pos.wrapping_add(n);
                        self.total = self.total.saturating_add(n as u64);
                        self.packets = self.packets.saturating_add(1);
                        return Ok(());
                    }
                }
            }
        }
        self.push(&cmd())
    }

    /// `compact-encoder` builds are for size: the per-kind entry points are
    /// the shared table walk there, so every packet takes the general path.
    #[cfg(feature = "compact-encoder")]
    fn push_fast<'c>(
        &mut self,
        cmd: impl FnOnce() -> Command<'c>,
        _validate: impl FnOnce(&Encoder) -> Result<usize, EncodeError>,
        _encode: impl FnOnce(&Encoder, &mut [u32], usize, u64) -> Result<usize, EncodeError>,
    ) -> Result<(), EncodeError> {
        self.push(&cmd())
    }

    /// WRITE_DATA of `data` at `dst`.
    pub fn write_data(&mut self, dst: u64, data: &[u32]) -> Result<(), EncodeError> {
        push_kind!(self, Command::write_data(dst, data), encode_write_data(dst, data))
    }

    /// DMA_COPY of `size` bytes.
    pub fn copy(&mut self, src: u64, dst: u64, size: u64) -> Result<(), EncodeError> {
        push_kind!(self, Command::Copy { src, dst, size }, encode_copy(src, dst, size))
    }

    /// FILL of `size` bytes with `value`.
    pub fn fill(&mut self, dst: u64, size: u64, value: u32) -> Result<(), EncodeError> {
        push_kind!(self, Command::Fill { dst, size, value }, encode_fill(dst, size, value))
    }

    /// FENCE writing `value` at `addr`.
    pub fn fence(&mut self, addr: u64, value: u64, irq: bool) -> Result<(), EncodeError> {
        push_kind!(self, Command::Fence { addr, value, irq }, encode_fence(addr, value, irq))
    }

    /// WAIT_MEM until the 64-bit value at `addr` has reached `seqno`
    /// (wrap-safe): the semaphore wait on another queue's fence.
    pub fn wait_seqno(&mut self, addr: u64, seqno: u64) -> Result<(), EncodeError> {
        self.push(&Command::WaitMem {
            addr,
            reference: seqno,
            mask: u64::MAX,
            op: CompareOp::SeqGe,
            wide: true,
        })
    }

    /// TIMESTAMP at `addr`.
    pub fn timestamp(&mut self, addr: u64) -> Result<(), EncodeError> {
        self.push(&Command::Timestamp { addr })
    }

    /// BARRIER (wait idle and invalidate).
    pub fn barrier(&mut self) -> Result<(), EncodeError> {
        self.push(&Command::Barrier { wait_idle: true, invalidate: true })
    }

    /// DISPATCH of `op` over `count` elements.
    pub fn dispatch(
        &mut self,
        op: DispatchOp,
        a: u64,
        b: u64,
        dst: u64,
        count: u32,
        scalar: f32,
    ) -> Result<(), EncodeError> {
        self.push(&Command::Dispatch { op, a, b, dst, count, scalar_bits: scalar.to_bits() })
    }
}
