//! Kernel-mediated mode: a kernel driver owns the rings and the page
//! tables; the core chooses GPU addresses (as libdrm's VA manager does),
//! records IBs into its pool, checks dependencies, and hands each IB to the
//! kernel with the timeline points it waits for and signals.
//!
//! The pieces are the direct mode's: [`crate::ibpool`] for IB chunks with
//! fence-gated reuse, [`crate::sync::deps`] for deadlock rejection, the
//! same [`Config`] wait schedule; only the ring, the fence slots, the page
//! tables and hang recovery move into the kernel.

use crate::cmd::{EncodeError, Encoder};
use crate::config::{Config, PoolExhaustion};
use crate::device::{InitError, QUEUES};
use crate::hw::{probe, ChipId};
use crate::ibpool::{record_into, IbPool, IbPoolStats, Recorder};
use crate::mem::{Placement, VaAllocator, VaNode};
use crate::platform::{DmaRegion, KernelError, KernelIo, KernelSync, PlatformError};
use crate::queue::{FenceStatus, SubmitError, WaitError};
use crate::sync::deps::{DepGraph, MAX_WAITS};
use crate::sync::{ErroredRange, Fence, FenceError, FenceId, QueueId, Seqno, Timeline};

/// VA allocator nodes of a kernel-mode device.
const VA_NODES: usize = 256;
/// Submissions with waits tracked per queue.
const PENDING_WAITS: usize = 32;

/// A buffer bound into the GPU VA space by the kernel.
#[derive(Debug)]
pub struct BoundBuffer {
    region: DmaRegion,
    va: u64,
}

impl BoundBuffer {
    /// GPU address.
    pub fn va(&self) -> u64 {
        self.va
    }

    /// CPU view for filling it.
    pub fn words_mut(&mut self) -> &mut [u32] {
        self.region.words_mut()
    }

    /// Reads dword `index` as the GPU left it.
    pub fn read_u32(&self, index: usize) -> Option<u32> {
        self.region.read_u32(index.checked_mul(4)?)
    }
}

#[derive(Debug)]
struct KQueue {
    emitted: Seqno,
    timeline: Timeline,
    epoch: u32,
    errored: Option<ErroredRange>,
}

/// A refgpu driven through a kernel driver.
pub struct KernelDevice<P: KernelIo, const CHUNKS: usize = 16> {
    p: P,
    chip: ChipId,
    enc: Encoder,
    cfg: Config,
    va: VaAllocator<[VaNode; VA_NODES]>,
    pool: IbPool<CHUNKS>,
    pool_mem: DmaRegion,
    pool_va: u64,
    queues: [KQueue; QUEUES],
    deps: DepGraph<QUEUES, PENDING_WAITS>,
}

impl<P: KernelIo, const CHUNKS: usize> core::fmt::Debug for KernelDevice<P, CHUNKS> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("KernelDevice")
            .field("chip", &self.chip)
            .field("va", &self.va.stats())
            .field("pool", &self.pool.stats())
            .field("queues", &self.queues)
            .finish()
    }
}

impl<P: KernelIo, const CHUNKS: usize> KernelDevice<P, CHUNKS> {
    /// Probes the chip through the kernel, and allocates and binds the IB
    /// pool inside the VA arena `[va_base, va_base + va_size)`.
    pub fn new(p: P, cfg: Config, va_base: u64, va_size: u64) -> Result<Self, (InitError, P)> {
        let chip = match p.chip_id() {
            Ok(id) => match probe(id) {
                Ok(c) => c,
                Err(e) => return Err((InitError::Probe(e), p)),
            },
            Err(e) => return Err((InitError::Platform(e), p)),
        };
        let enc = Encoder::new(chip.generation);
        let mut va = match VaAllocator::new([VaNode::EMPTY; VA_NODES], va_base, va_size) {
            Ok(v) => v,
            Err(_) => return Err((InitError::BadConfig("VA arena"), p)),
        };
        let len = cfg.ib_chunk_bytes.saturating_mul(CHUNKS).next_multiple_of(4096);
        let pool_mem = match p.dma_alloc(len, crate::platform::DmaFlags::CPU) {
            Ok(r) => r,
            Err(e) => return Err((InitError::Platform(e), p)),
        };
        let pool_va = match va.alloc(len as u64, 4096, Placement::BottomUp) {
            Ok(a) => a,
            Err(e) => {
                p.dma_free(pool_mem);
                return Err((InitError::Vm(crate::gpuvm::VmError::Va(e)), p));
            }
        };
        if let Err(e) = p.bind_va(pool_va, &pool_mem, len, false) {
            p.dma_free(pool_mem);
            return Err((InitError::Platform(e), p));
        }
        let pool = match IbPool::new(len, pool_va, cfg.ib_chunk_bytes) {
            Ok(pl) => pl,
            Err(e) => {
                let _ = p.unbind_va(pool_va, len);
                p.dma_free(pool_mem);
                return Err((InitError::Pool(e), p));
            }
        };
        let queues = core::array::from_fn(|_| KQueue {
            emitted: Seqno(0),
            timeline: Timeline::new(0),
            epoch: 0,
            errored: None,
        });
        Ok(KernelDevice { p, chip, enc, cfg, va, pool, pool_mem, pool_va, queues, deps: DepGraph::new() })
    }

    /// The chip.
    pub fn chip(&self) -> ChipId {
        self.chip
    }

    /// The platform.
    pub fn platform(&self) -> &P {
        &self.p
    }

    /// IB pool occupancy.
    pub fn pool_stats(&self) -> IbPoolStats {
        self.pool.stats()
    }

    /// Allocates `len` bytes of memory and binds it read-write at a VA the
    /// core chooses.
    pub fn alloc_buffer(&mut self, len: usize) -> Result<BoundBuffer, SubmitError> {
        let len = len.max(1).next_multiple_of(4096);
        let region = self.p.dma_alloc(len, crate::platform::DmaFlags::CPU).map_err(SubmitError::Platform)?;
        let va = match self.va.alloc(len as u64, 4096, Placement::BottomUp) {
            Ok(a) => a,
            Err(_) => {
                self.p.dma_free(region);
                return Err(SubmitError::Platform(PlatformError::OutOfMemory { len }));
            }
        };
        if let Err(e) = self.p.bind_va(va, &region, len, true) {
            let _ = self.va.free(va);
            self.p.dma_free(region);
            return Err(SubmitError::Platform(e));
        }
        Ok(BoundBuffer { region, va })
    }

    /// Unbinds and frees a buffer no submitted work still uses.
    pub fn free_buffer(&mut self, buf: BoundBuffer) {
        let _ = self.p.unbind_va(buf.va, buf.region.len());
        let _ = self.va.free(buf.va);
        self.p.dma_free(buf.region);
    }

    /// Reads `queue`'s completed value from the kernel; a kernel reset
    /// records the cancelled range and starts a new epoch.
    fn refresh(&mut self, qi: usize) -> Result<Seqno, FenceError> {
        let r = self.p.completed(qi as u32);
        let Some(q) = self.queues.get_mut(qi) else { return Ok(Seqno(0)) };
        match r {
            Ok(v) => {
                let done = q.timeline.advance(Seqno(v));
                self.pool.reclaim(QueueId(qi as u8), done);
                self.deps.retire(QueueId(qi as u8), done);
                Ok(done)
            }
            Err(KernelError::Reset { upto }) => {
                let after = q.timeline.completed();
                q.epoch = q.epoch.wrapping_add(1);
                q.errored = Some(ErroredRange {
                    after,
                    upto: Seqno(upto),
                    error: FenceError::DeviceHung,
                    epoch: q.epoch,
                });
                q.timeline.force(Seqno(upto));
                self.pool.release_queue(QueueId(qi as u8));
                self.deps.clear(QueueId(qi as u8));
                Ok(Seqno(upto))
            }
            Err(KernelError::DeviceLost) | Err(KernelError::Platform(_)) => Err(FenceError::DeviceLost),
        }
    }

    /// Records with `record` and hands the IB to the kernel for `queue`,
    /// after `waits`. Same contract as [`crate::device::Device::submit`].
    pub fn submit<F>(&mut self, queue: QueueId, waits: &[Fence], record: F) -> Result<Fence, SubmitError>
    where
        F: for<'a, 's, 'b> FnOnce(&mut Recorder<'a, 's, 'b, CHUNKS>) -> Result<(), EncodeError>,
    {
        let qi = usize::from(queue.0);
        if qi >= QUEUES {
            return Err(SubmitError::UnknownQueue(queue));
        }
        if waits.len() > MAX_WAITS {
            return Err(SubmitError::TooManyWaits { given: waits.len() });
        }
        let mut ids = [FenceId::default(); MAX_WAITS];
        let mut syncs = [KernelSync { engine: 0, value: 0 }; MAX_WAITS];
        let mut n = 0usize;
        for w in waits {
            let wq = usize::from(w.id.queue.0);
            let done = self.refresh(wq).map_err(|_| SubmitError::DeviceLost)?;
            let state = self.queues.get(wq).ok_or(SubmitError::UnknownQueue(w.id.queue))?;
            if w.epoch != state.epoch {
                if state.errored.is_some_and(|r| r.contains(w.id.seqno)) {
                    return Err(SubmitError::FenceFromResetQueue(*w));
                }
                continue;
            }
            if w.id.is_signalled_by(done) {
                continue;
            }
            if wq == qi && w.id.seqno.is_after(state.emitted) {
                return Err(SubmitError::WaitsOnItself(*w));
            }
            if let (Some(i), Some(s)) = (ids.get_mut(n), syncs.get_mut(n)) {
                *i = w.id;
                *s = KernelSync { engine: u32::from(w.id.queue.0), value: w.id.seqno.0 };
                n = n.saturating_add(1);
            }
        }
        let seqno = self.queues.get(qi).map(|q| q.emitted.next()).ok_or(SubmitError::UnknownQueue(queue))?;
        let queues = &self.queues;
        self.deps
            .check(queue, seqno, ids.get(..n).unwrap_or(&[]), |q| {
                queues.get(usize::from(q.0)).map_or(Seqno(0), |s| s.timeline.completed())
            })
            .map_err(SubmitError::from)?;
        let KernelDevice { p, cfg, pool, pool_mem, queues, enc, .. } = &mut *self;
        let policy = cfg.pool_exhaustion;
        let limit = cfg.hang.window_ns;
        let mut make_room = |f: FenceId| -> Option<Seqno> {
            if policy == PoolExhaustion::Error {
                return None;
            }
            let start = p.now_ns();
            loop {
                let v = p.completed(u32::from(f.queue.0)).ok()?;
                let done = queues.get(usize::from(f.queue.0))?.timeline.advance(Seqno(v));
                if f.is_signalled_by(done) {
                    return Some(done);
                }
                if p.now_ns().saturating_sub(start) > limit {
                    return None;
                }
                p.delay_ns(10_000);
            }
        };
        let (fin, pending) = record_into(pool, pool_mem, *enc, queue, cfg.batching, &mut make_room, record)?;
        pending.dirty(|off, len| p.cache_clean(pool_mem, off, len));
        let signal = KernelSync { engine: qi as u32, value: seqno.0 };
        match p.submit(qi as u32, fin.gpu_va, fin.size_dw, syncs.get(..n).unwrap_or(&[]), signal) {
            Ok(()) => pending.commit(FenceId { queue, seqno }),
            Err(e) => {
                pending.abort();
                return Err(SubmitError::Platform(e));
            }
        }
        let _ = self.deps.record(queue, seqno, ids.get(..n).unwrap_or(&[]));
        let q = self.queues.get_mut(qi).ok_or(SubmitError::UnknownQueue(queue))?;
        q.emitted = seqno;
        Ok(Fence { id: FenceId { queue, seqno }, epoch: q.epoch })
    }

    /// Where `fence` stands.
    pub fn query(&mut self, fence: Fence) -> Result<FenceStatus, WaitError> {
        let qi = usize::from(fence.id.queue.0);
        let q = self.queues.get(qi).ok_or(WaitError::UnknownQueue(fence.id.queue))?;
        if fence.epoch == q.epoch && fence.id.seqno.is_after(q.emitted) {
            return Err(WaitError::NotSubmitted(fence));
        }
        let done = match self.refresh(qi) {
            Ok(d) => d,
            Err(e) => return Ok(FenceStatus::Failed(e)),
        };
        let q = self.queues.get(qi).ok_or(WaitError::UnknownQueue(fence.id.queue))?;
        if let Some(r) = q.errored.filter(|r| r.epoch > fence.epoch && r.contains(fence.id.seqno)) {
            return Ok(FenceStatus::Failed(r.error));
        }
        Ok(if fence.id.is_signalled_by(done) || fence.epoch != q.epoch {
            FenceStatus::Signalled
        } else {
            FenceStatus::Pending
        })
    }

    /// Waits for `fence` on the configured schedule (interrupts when the
    /// platform has them); 0 is a non-blocking query.
    pub fn wait(&mut self, fence: Fence, timeout_ns: u64) -> Result<(), WaitError> {
        let start = self.p.now_ns();
        crate::sync::wait::wait_for(self, fence, timeout_ns, start)
    }

    /// Unbinds and frees the pool; returns the platform.
    pub fn shutdown(self) -> P {
        let KernelDevice { p, pool_mem, pool_va, .. } = self;
        let _ = p.unbind_va(pool_va, pool_mem.len());
        p.dma_free(pool_mem);
        p
    }
}

impl<P: KernelIo, const CHUNKS: usize> crate::sync::wait::Waiter for KernelDevice<P, CHUNKS> {
    type P = P;
    fn status(&mut self, fence: Fence) -> Result<FenceStatus, WaitError> {
        self.query(fence)
    }
    fn platform(&self) -> &P {
        &self.p
    }
    fn config(&self) -> &Config {
        &self.cfg
    }
}
