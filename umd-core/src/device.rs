//! The refgpu device in direct mode: the core owns the rings, the fence
//! slots, the IB pool and the page tables, and drives the register page
//! through a [`DirectIo`] platform.
//!
//! One submission becomes, in the queue's ring: a WAIT_MEM on each other
//! queue's fence slot it depends on, an INDIRECT_BUFFER to the recorded
//! commands, and a FENCE writing the queue's next sequence number to its
//! slot (with an interrupt). Waiting follows the adaptive schedule of
//! [`Config::wait_steps`]; every check also services the device: it acks
//! interrupts, notices faults, and runs the progress-based hang check, which
//! resets a stuck engine and completes its pending fences with an error.

use core::sync::atomic::{fence as mem_fence, Ordering};

use crate::cmd::{Command, CompareOp, EncodeError, Encoder};
use crate::config::{Config, PoolExhaustion};
use crate::debug::{HangReason, HangReport, TraceEvent, TraceKind, TraceRing, Window};
use crate::gpuvm::{GpuVm, VmError};
use crate::hw::regs::{self, engine as er};
use crate::hw::{probe, ChipId, ProbeError};
use crate::ibpool::{record_into, IbPool, IbPoolStats, PoolSetupError};
use crate::mem::Perms;
use crate::platform::{DirectIo, DmaRegion, PlatformError};
use crate::queue::{FenceStatus, SubmitError, WaitError};
use crate::ring::{Ring, RingError, MAX_RING, MIN_RING};
use crate::sync::deps::{DepGraph, MAX_WAITS};
use crate::sync::{ErroredRange, FaultInfo, Fence, FenceError, FenceId, QueueId, Seqno, Timeline};

/// Queues (engines) of a refgpu.
pub const QUEUES: usize = regs::ENGINES as usize;
/// Submissions with waits tracked per queue for deadlock detection.
const PENDING_WAITS: usize = 32;
/// Resets remembered per queue (to answer for fences they cancelled).
const ERROR_HISTORY: usize = 4;
/// Events kept by the trace ring (~48 bytes each: 12 KiB, kept small for
/// firmware stacks; the oldest are overwritten and counted).
pub const TRACE_EVENTS: usize = 256;
/// Submit timestamps kept per queue (for trace spans).
const SUBMIT_TIMES: usize = 64;
/// Fence slot stride: 64 bytes, the strictest generation's alignment.
const FENCE_STRIDE: usize = 64;
/// How long register handshakes (reset, TLB invalidate) may take.
const HANDSHAKE_NS: u64 = 100_000_000;

/// How the GPU addresses memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmuMode {
    /// MMU off: GPU addresses are device (physical) addresses.
    Bypass,
    /// MMU on over the VA arena `[va_base, va_base + va_size)`, with
    /// `table_pages` 4 KiB pages for page tables.
    Enabled {
        /// First GPU address handed out.
        va_base: u64,
        /// Size of the arena.
        va_size: u64,
        /// Page-table pages to reserve.
        table_pages: usize,
    },
}

impl MmuMode {
    /// MMU on, 4 GiB of VA from 4 GiB up, 64 table pages.
    pub const DEFAULT: MmuMode = MmuMode::Enabled { va_base: 1 << 32, va_size: 1 << 32, table_pages: 64 };
}

/// Why the device could not be brought up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InitError {
    /// The ID register names no supported chip.
    Probe(ProbeError),
    /// A platform call failed.
    Platform(PlatformError),
    /// A configuration value is out of range.
    BadConfig(&'static str),
    /// The IB pool could not be laid out.
    Pool(PoolSetupError),
    /// Mapping the driver's memory failed.
    Vm(VmError),
    /// The engine did not finish a reset or invalidate handshake.
    Handshake(&'static str),
}

impl core::fmt::Display for InitError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            InitError::Probe(e) => write!(f, "probe: {e}"),
            InitError::Platform(e) => write!(f, "platform: {e}"),
            InitError::BadConfig(what) => write!(f, "bad configuration: {what}"),
            InitError::Pool(e) => write!(f, "IB pool: {e}"),
            InitError::Vm(e) => write!(f, "GPU VM: {e}"),
            InitError::Handshake(what) => write!(f, "device did not complete {what}"),
        }
    }
}

/// GPU-visible memory given to the user, mapped for the GPU.
#[derive(Debug)]
pub struct GpuBuffer {
    region: DmaRegion,
    va: u64,
}

impl GpuBuffer {
    /// GPU address.
    pub fn va(&self) -> u64 {
        self.va
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.region.len()
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.region.is_empty()
    }

    /// CPU view for filling the buffer (call [`Device::flush`] after).
    pub fn words_mut(&mut self) -> &mut [u32] {
        self.region.words_mut()
    }

    /// Reads dword `index` as the device left it (call
    /// [`Device::invalidate`] first on non-coherent platforms).
    pub fn read_u32(&self, index: usize) -> Option<u32> {
        self.region.read_u32(index.checked_mul(4)?)
    }
}

/// Counters of the device's life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Submissions that reached a ring.
    pub submissions: u64,
    /// Fences observed signalled.
    pub fences_signalled: u64,
    /// Hangs detected (no progress or fence stall).
    pub hangs: u64,
    /// Faults reported.
    pub faults: u64,
    /// Engine resets performed.
    pub resets: u64,
    /// Ring writes that wrapped.
    pub ring_wraps: u64,
    /// Times recording waited for an IB chunk.
    pub pool_waits: u64,
    /// Interrupts acknowledged.
    pub interrupts: u64,
    /// Total ns the host spent in `wait`.
    pub wait_ns: u64,
}

/// What the hang check remembers about a queue.
#[derive(Clone, Copy, Debug, Default)]
struct Watch {
    armed: bool,
    rptr: u32,
    cur_addr: u64,
    completed: Seqno,
    since_ns: u64,
    fence_since_ns: u64,
}

#[derive(Debug)]
struct QueueState {
    ring: Ring,
    emitted: Seqno,
    timeline: Timeline,
    /// Completions already processed (trace spans, pool and dependency
    /// reclaim). The timeline may be advanced by any path that reads the
    /// fence slot; this is how far the bookkeeping has followed it.
    processed: Seqno,
    epoch: u32,
    errored: [Option<ErroredRange>; ERROR_HISTORY],
    errored_next: usize,
    submit_ts: [(Seqno, u64); SUBMIT_TIMES],
    watch: Watch,
    rptr: u32,
}

impl QueueState {
    fn errored_for(&self, s: Seqno, epoch: u32) -> Option<FenceError> {
        self.errored.iter().flatten().find(|r| r.epoch > epoch && r.contains(s)).map(|r| r.error)
    }

    fn pending(&self) -> bool {
        self.emitted.is_after(self.timeline.completed())
    }
}

pub use crate::ibpool::Recorder;

/// A refgpu driven in direct mode, with `CHUNKS` IB chunks.
#[derive(Debug)]
pub struct Device<P: DirectIo, const CHUNKS: usize = 16> {
    p: P,
    chip: ChipId,
    enc: Encoder,
    cfg: Config,
    vm: GpuVm,
    fence_mem: DmaRegion,
    fence_va: u64,
    queues: [QueueState; QUEUES],
    pool: IbPool<CHUNKS>,
    pool_mem: DmaRegion,
    pool_va: u64,
    deps: DepGraph<QUEUES, PENDING_WAITS>,
    trace: TraceRing<TRACE_EVENTS>,
    last_hang: Option<HangReport>,
    stats: DeviceStats,
    lost: bool,
}

fn reg_err(e: PlatformError) -> InitError {
    InitError::Platform(e)
}

/// Writes a register and applies it (control doorbell).
fn write_ctl<P: DirectIo>(p: &P, off: u32, v: u32) -> Result<(), PlatformError> {
    p.write_reg(off, v)?;
    p.control_doorbell()
}

/// Polls until `reg & mask == 0` or the handshake time passes.
fn handshake<P: DirectIo>(p: &P, off: u32, mask: u32) -> Result<bool, PlatformError> {
    let start = p.now_ns();
    for _ in 0..1_000_000u32 {
        if p.read_reg(off)? & mask == 0 {
            return Ok(true);
        }
        if p.now_ns().saturating_sub(start) > HANDSHAKE_NS {
            break;
        }
        p.delay_ns(1_000);
    }
    Ok(false)
}

fn reset_engine<P: DirectIo>(p: &P, e: u32, enable: bool) -> Result<bool, PlatformError> {
    let ctrl = regs::engine_reg(e, er::CTRL);
    write_ctl(p, ctrl, er::CTRL_RESET | if enable { er::CTRL_ENABLE } else { 0 })?;
    handshake(p, ctrl, er::CTRL_RESET)
}

fn invalidate_tlb<P: DirectIo>(p: &P) -> Result<bool, PlatformError> {
    write_ctl(p, regs::MMU_INVALIDATE, 1)?;
    handshake(p, regs::MMU_INVALIDATE, 1)
}

/// Reads a queue's fence slot and advances its timeline.
fn refresh<P: DirectIo>(p: &P, fence_mem: &DmaRegion, q: usize, tl: &Timeline) -> Seqno {
    let off = q.saturating_mul(FENCE_STRIDE);
    p.cache_invalidate(fence_mem, off, 8);
    match fence_mem.read_u64(off) {
        Some(v) => tl.advance(Seqno(v)),
        None => tl.completed(),
    }
}

/// Slot of `s` in a queue's submit-time ring.
fn ts_slot(s: Seqno) -> usize {
    s.0.checked_rem(SUBMIT_TIMES as u64).unwrap_or(0) as usize
}

/// Frees every region in `regions` (init failure paths).
fn free_all<P: DirectIo>(p: &P, regions: impl IntoIterator<Item = Option<DmaRegion>>) {
    for r in regions.into_iter().flatten() {
        p.dma_free(r);
    }
}

fn ring_back(r: Result<Ring, (RingError, DmaRegion)>) -> DmaRegion {
    match r {
        Ok(r) => r.into_region(),
        Err((_, r)) => r,
    }
}

impl<P: DirectIo, const CHUNKS: usize> Device<P, CHUNKS> {
    /// Probes the chip, allocates and maps the rings, fence slots and IB
    /// pool, programs the MMU and the engines. On error the platform is
    /// handed back with everything it allocated freed.
    pub fn new(p: P, cfg: Config, mmu: MmuMode) -> Result<Self, (InitError, P)> {
        let chip = match p.read_reg(regs::ID) {
            Ok(id) => match probe(id) {
                Ok(c) => c,
                Err(e) => return Err((InitError::Probe(e), p)),
            },
            Err(e) => return Err((reg_err(e), p)),
        };
        let enc = Encoder::new(chip.generation);
        if let Err(what) = Self::check_config(&cfg, &enc) {
            return Err((InitError::BadConfig(what), p));
        }
        let table_bytes = match mmu {
            MmuMode::Bypass => 0,
            MmuMode::Enabled { table_pages, .. } => table_pages.saturating_mul(4096),
        };
        let sizes = [
            4096,
            cfg.ring_bytes,
            cfg.ring_bytes,
            cfg.ring_bytes,
            cfg.ib_chunk_bytes.saturating_mul(CHUNKS).next_multiple_of(4096),
            table_bytes,
        ];
        let mut regions: [Option<DmaRegion>; 6] = [const { None }; 6];
        for (slot, len) in regions.iter_mut().zip(sizes) {
            if len == 0 {
                continue;
            }
            match p.dma_alloc(len, crate::platform::DmaFlags::CPU) {
                Ok(r) => *slot = Some(r),
                Err(e) => {
                    free_all(&p, regions);
                    return Err((InitError::Platform(e), p));
                }
            }
        }
        let [Some(fence_mem), Some(r0), Some(r1), Some(r2), Some(pool_mem), tables] = regions else {
            free_all(&p, regions);
            return Err((InitError::BadConfig("allocation"), p));
        };
        let mut vm = match (mmu, tables) {
            (MmuMode::Enabled { va_base, va_size, .. }, Some(t)) => {
                match GpuVm::mapped(va_base, va_size, t) {
                    Ok(vm) => vm,
                    Err((e, t)) => {
                        free_all(
                            &p,
                            [Some(fence_mem), Some(r0), Some(r1), Some(r2), Some(pool_mem), Some(t)],
                        );
                        return Err((InitError::Vm(e), p));
                    }
                }
            }
            (MmuMode::Enabled { .. }, None) => {
                free_all(&p, [Some(fence_mem), Some(r0), Some(r1), Some(r2), Some(pool_mem)]);
                return Err((InitError::BadConfig("MMU needs table pages"), p));
            }
            (MmuMode::Bypass, t) => {
                free_all(&p, [t]);
                GpuVm::Bypass
            }
        };
        let mapped = [
            (&fence_mem, Perms::RW),
            (&r0, Perms::RO),
            (&r1, Perms::RO),
            (&r2, Perms::RO),
            (&pool_mem, Perms::RO),
        ]
        .map(|(r, perms)| vm.map(r, perms));
        let [Ok(fence_va), Ok(v0), Ok(v1), Ok(v2), Ok(pool_va)] = mapped else {
            let e =
                mapped.into_iter().find_map(Result::err).unwrap_or(VmError::Va(crate::mem::VaError::NoSpace));
            let t = vm.into_region();
            free_all(&p, [Some(fence_mem), Some(r0), Some(r1), Some(r2), Some(pool_mem), t]);
            return Err((InitError::Vm(e), p));
        };
        let rings = [
            Ring::new(r0, v0, cfg.ring_bytes),
            Ring::new(r1, v1, cfg.ring_bytes),
            Ring::new(r2, v2, cfg.ring_bytes),
        ];
        let rings = match rings {
            [Ok(a), Ok(b), Ok(c)] => [a, b, c],
            [a, b, c] => {
                let t = vm.into_region();
                free_all(
                    &p,
                    [
                        Some(fence_mem),
                        Some(ring_back(a)),
                        Some(ring_back(b)),
                        Some(ring_back(c)),
                        Some(pool_mem),
                        t,
                    ],
                );
                return Err((InitError::BadConfig("ring"), p));
            }
        };
        let pool = match IbPool::new(pool_mem.len(), pool_va, cfg.ib_chunk_bytes) {
            Ok(pl) => pl,
            Err(e) => {
                let t = vm.into_region();
                let [a, b, c] = rings;
                free_all(
                    &p,
                    [
                        Some(fence_mem),
                        Some(a.into_region()),
                        Some(b.into_region()),
                        Some(c.into_region()),
                        Some(pool_mem),
                        t,
                    ],
                );
                return Err((InitError::Pool(e), p));
            }
        };
        let queues = rings.map(|ring| QueueState {
            ring,
            emitted: Seqno(0),
            timeline: Timeline::new(0),
            processed: Seqno(0),
            epoch: 0,
            errored: [None; ERROR_HISTORY],
            errored_next: 0,
            submit_ts: [(Seqno(0), 0); SUBMIT_TIMES],
            watch: Watch::default(),
            rptr: 0,
        });
        let mut dev = Device {
            p,
            chip,
            enc,
            cfg,
            vm,
            fence_mem,
            fence_va,
            queues,
            pool,
            pool_mem,
            pool_va,
            deps: DepGraph::new(),
            trace: TraceRing::new(),
            last_hang: None,
            stats: DeviceStats::default(),
            lost: false,
        };
        match dev.program() {
            Ok(()) => {
                crate::log::log_info!(
                    "refgpu gen{} rev {} up: MMU {}, {} IB chunks of {} bytes, rings of {} bytes",
                    dev.chip.generation.number(),
                    dev.chip.revision,
                    dev.vm.root().is_some(),
                    CHUNKS,
                    dev.cfg.ib_chunk_bytes,
                    dev.cfg.ring_bytes
                );
                Ok(dev)
            }
            Err(e) => Err((e, dev.shutdown())),
        }
    }

    fn check_config(cfg: &Config, enc: &Encoder) -> Result<(), &'static str> {
        if !cfg.ring_bytes.is_power_of_two() || !(MIN_RING..=MAX_RING).contains(&cfg.ring_bytes) {
            return Err("ring_bytes must be a power of two from 4 KiB to 4 MiB");
        }
        let max_ib = (enc.desc().limits.max_ib_dwords as usize).saturating_mul(4);
        if cfg.ib_chunk_bytes < 1024 || cfg.ib_chunk_bytes % 256 != 0 || cfg.ib_chunk_bytes > max_ib {
            return Err("ib_chunk_bytes must be a multiple of 256 from 1 KiB to the generation's IB limit");
        }
        if CHUNKS == 0 {
            return Err("the IB pool needs at least one chunk");
        }
        if cfg.hang.window_ns == 0 {
            return Err("hang window must not be 0");
        }
        Ok(())
    }

    /// Programs MMU, engines and interrupts.
    fn program(&mut self) -> Result<(), InitError> {
        let p = &self.p;
        for q in 0..QUEUES {
            self.fence_mem.write_u64(q.saturating_mul(FENCE_STRIDE), 0);
        }
        p.cache_clean(&self.fence_mem, 0, self.fence_mem.len());
        if let Some(root) = self.vm.root() {
            p.write_reg(regs::MMU_ROOT_LO, root as u32).map_err(reg_err)?;
            p.write_reg(regs::MMU_ROOT_HI, (root >> 32) as u32).map_err(reg_err)?;
            write_ctl(p, regs::MMU_CTRL, 1).map_err(reg_err)?;
            if !invalidate_tlb(p).map_err(reg_err)? {
                return Err(InitError::Handshake("MMU invalidate"));
            }
        } else {
            write_ctl(p, regs::MMU_CTRL, 0).map_err(reg_err)?;
        }
        let mut mask = 0;
        for (e, q) in self.queues.iter().enumerate() {
            let e = e as u32;
            if !reset_engine(p, e, false).map_err(reg_err)? {
                return Err(InitError::Handshake("engine reset"));
            }
            let base = q.ring.gpu_va();
            p.write_reg(regs::engine_reg(e, er::RING_BASE_LO), base as u32).map_err(reg_err)?;
            p.write_reg(regs::engine_reg(e, er::RING_BASE_HI), (base >> 32) as u32).map_err(reg_err)?;
            p.write_reg(regs::engine_reg(e, er::RING_SIZE), q.ring.size() as u32).map_err(reg_err)?;
            p.write_reg(regs::engine_reg(e, er::RING_WPTR), 0).map_err(reg_err)?;
            write_ctl(p, regs::engine_reg(e, er::CTRL), er::CTRL_ENABLE).map_err(reg_err)?;
            mask |= regs::irq_fence(e) | regs::irq_fault(e);
        }
        write_ctl(p, regs::IRQ_MASK, mask).map_err(reg_err)?;
        Ok(())
    }

    /// Stops the engines and gives every region back; returns the platform.
    pub fn shutdown(self) -> P {
        for e in 0..QUEUES as u32 {
            let _ = write_ctl(&self.p, regs::engine_reg(e, er::CTRL), 0);
        }
        let _ = write_ctl(&self.p, regs::IRQ_MASK, 0);
        let _ = write_ctl(&self.p, regs::MMU_CTRL, 0);
        let Device { p, vm, fence_mem, queues, pool_mem, .. } = self;
        let [a, b, c] = queues;
        let t = vm.into_region();
        free_all(
            &p,
            [
                Some(fence_mem),
                Some(a.ring.into_region()),
                Some(b.ring.into_region()),
                Some(c.ring.into_region()),
                Some(pool_mem),
                t,
            ],
        );
        p
    }

    /// The chip found at probe time.
    pub fn chip(&self) -> ChipId {
        self.chip
    }

    /// The encoder for this chip.
    pub fn encoder(&self) -> Encoder {
        self.enc
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Changes what recording does when every IB chunk is in flight (a
    /// runtime tunable; the other `Config` fields are fixed at `new`).
    pub fn set_pool_exhaustion(&mut self, policy: PoolExhaustion) {
        self.cfg.pool_exhaustion = policy;
    }

    /// Changes the hang-check parameters (a runtime tunable).
    pub fn set_hang_config(&mut self, hang: crate::config::HangConfig) {
        if hang.window_ns > 0 {
            self.cfg.hang = hang;
        }
    }

    /// Whether GPU addresses go through the MMU (false: bypass).
    pub fn mmu_enabled(&self) -> bool {
        self.vm.root().is_some()
    }

    /// The platform (for platform-specific calls).
    pub fn platform(&self) -> &P {
        &self.p
    }

    /// Counters.
    pub fn stats(&self) -> DeviceStats {
        self.stats
    }

    /// IB pool occupancy.
    pub fn pool_stats(&self) -> IbPoolStats {
        self.pool.stats()
    }

    /// GPU address range of the IB pool.
    pub fn pool_range(&self) -> (u64, usize) {
        (self.pool_va, self.pool_mem.len())
    }

    /// The event trace.
    pub fn trace(&self) -> &TraceRing<TRACE_EVENTS> {
        &self.trace
    }

    /// Mutable access to the trace (to clear or disable it).
    pub fn trace_mut(&mut self) -> &mut TraceRing<TRACE_EVENTS> {
        &mut self.trace
    }

    /// The report of the last hang or fault, if any.
    pub fn last_hang(&self) -> Option<&HangReport> {
        self.last_hang.as_ref()
    }

    /// Whether the device was lost.
    pub fn is_lost(&self) -> bool {
        self.lost
    }

    /// GPU address of `queue`'s fence slot (for WAIT_MEM in user IBs).
    pub fn fence_slot_va(&self, queue: QueueId) -> Option<u64> {
        (usize::from(queue.0) < QUEUES)
            .then(|| self.fence_va.wrapping_add(u64::from(queue.0).wrapping_mul(FENCE_STRIDE as u64)))
    }

    /// The last fence emitted on `queue`.
    pub fn last_emitted(&self, queue: QueueId) -> Option<Fence> {
        let q = self.queues.get(usize::from(queue.0))?;
        Some(Fence { id: FenceId { queue, seqno: q.emitted }, epoch: q.epoch })
    }

    fn record_trace(&mut self, kind: TraceKind, queue: usize, seqno: Seqno, arg: u64) {
        let ts_ns = self.p.now_ns();
        self.trace.record(TraceEvent { ts_ns, kind, queue: queue as u8, seqno: seqno.0, arg });
    }

    // ----- buffers ------------------------------------------------------

    /// Allocates a GPU buffer of `len` bytes (rounded up to 4 KiB), mapped
    /// read-write for the GPU.
    pub fn alloc_buffer(&mut self, len: usize) -> Result<GpuBuffer, SubmitError> {
        let oom = SubmitError::Platform(PlatformError::OutOfMemory { len });
        let len = len.max(1).checked_next_multiple_of(4096).ok_or(oom)?;
        let region = self.p.dma_alloc(len, crate::platform::DmaFlags::CPU).map_err(SubmitError::Platform)?;
        match self.vm.map(&region, Perms::RW) {
            Ok(va) => Ok(GpuBuffer { region, va }),
            Err(_) => {
                self.p.dma_free(region);
                Err(oom)
            }
        }
    }

    /// Unmaps and frees a buffer. The caller guarantees no submitted work
    /// still uses it (wait for its last fence first).
    pub fn free_buffer(&mut self, buf: GpuBuffer) {
        let _ = self.vm.unmap(buf.va, buf.region.len() as u64);
        if self.vm.root().is_some() {
            let _ = invalidate_tlb(&self.p);
        }
        self.p.dma_free(buf.region);
    }

    /// Makes CPU writes to `buf` visible to the GPU.
    pub fn flush(&mut self, buf: &GpuBuffer) {
        self.p.cache_clean(&buf.region, 0, buf.region.len());
    }

    /// Makes GPU writes to `buf` visible to the CPU.
    pub fn invalidate(&mut self, buf: &GpuBuffer) {
        self.p.cache_invalidate(&buf.region, 0, buf.region.len());
    }

    // ----- submission ---------------------------------------------------

    /// Checks queue and waits; returns the queue index, the new seqno and
    /// the waits that still need a WAIT_MEM.
    fn prepare_submit(
        &mut self,
        queue: QueueId,
        waits: &[Fence],
    ) -> Result<(usize, Seqno, [FenceId; MAX_WAITS], usize), SubmitError> {
        let qi = usize::from(queue.0);
        if qi >= QUEUES {
            return Err(SubmitError::UnknownQueue(queue));
        }
        if self.lost {
            return Err(SubmitError::DeviceLost);
        }
        if waits.len() > MAX_WAITS {
            return Err(SubmitError::TooManyWaits { given: waits.len() });
        }
        let mut ids = [FenceId::default(); MAX_WAITS];
        let mut n = 0usize;
        for w in waits {
            let wq = usize::from(w.id.queue.0);
            let state = self.queues.get(wq).ok_or(SubmitError::UnknownQueue(w.id.queue))?;
            if w.epoch != state.epoch {
                if state.errored_for(w.id.seqno, w.epoch).is_some() {
                    return Err(SubmitError::FenceFromResetQueue(*w));
                }
                // Completed before the reset: nothing to wait for.
                continue;
            }
            let emitted = state.emitted;
            let done = self.refresh_queue(wq);
            if w.id.is_signalled_by(done) {
                continue;
            }
            if wq == qi {
                if w.id.seqno.is_after(emitted) {
                    return Err(SubmitError::WaitsOnItself(*w));
                }
                // Earlier work on the same queue: ring order covers it.
                continue;
            }
            if let Some(slot) = ids.get_mut(n) {
                *slot = w.id;
                n = n.saturating_add(1);
            }
        }
        if n > 0 {
            self.wait_for_dep_space(queue)?;
        }
        let seqno = self.queues.get(qi).map(|q| q.emitted.next()).ok_or(SubmitError::UnknownQueue(queue))?;
        let queues = &self.queues;
        self.deps
            .check(queue, seqno, ids.get(..n).unwrap_or(&[]), |q| {
                queues.get(usize::from(q.0)).map_or(Seqno(0), |s| s.timeline.completed())
            })
            .map_err(SubmitError::from)?;
        Ok((qi, seqno, ids, n))
    }

    /// The dependency table of `queue` is a fixed size: when it is full,
    /// wait (servicing the device) for its oldest entry to retire, up to
    /// the hang window, like a full ring.
    fn wait_for_dep_space(&mut self, queue: QueueId) -> Result<(), SubmitError> {
        let start = self.p.now_ns();
        while self.deps.tracked(queue) >= PENDING_WAITS {
            self.refresh_all();
            if self.deps.tracked(queue) < PENDING_WAITS {
                break;
            }
            if self.lost {
                return Err(SubmitError::DeviceLost);
            }
            if self.p.now_ns().saturating_sub(start) > self.cfg.hang.window_ns {
                return Err(SubmitError::TooManyPending(queue));
            }
            self.service();
            self.p.delay_ns(10_000);
        }
        Ok(())
    }

    /// Records commands with `record` and submits them to `queue` after
    /// `waits` (fences of other queues, possibly not emitted yet) have
    /// signalled. Returns the submission's fence.
    pub fn submit<F>(&mut self, queue: QueueId, waits: &[Fence], record: F) -> Result<Fence, SubmitError>
    where
        F: for<'a, 's, 'b> FnOnce(&mut Recorder<'a, 's, 'b, CHUNKS>) -> Result<(), EncodeError>,
    {
        let (qi, seqno, ids, n) = self.prepare_submit(queue, waits)?;
        self.refresh_all();
        let mut waited = false;
        let Device { p, cfg, pool, pool_mem, queues, fence_mem, enc, fence_va, stats, .. } = &mut *self;
        let policy = cfg.pool_exhaustion;
        let wait_limit =
            cfg.hang.window_ns.saturating_mul(u64::from(cfg.hang.max_windows_without_fence.max(1)));
        let mut make_room = |f: FenceId| -> Option<Seqno> {
            if policy == PoolExhaustion::Error {
                return None;
            }
            waited = true;
            let q = usize::from(f.queue.0);
            let tl = &queues.get(q)?.timeline;
            let start = p.now_ns();
            loop {
                let done = refresh(p, fence_mem, q, tl);
                if f.is_signalled_by(done) {
                    return Some(done);
                }
                if p.now_ns().saturating_sub(start) > wait_limit {
                    return None;
                }
                p.delay_ns(10_000);
            }
        };
        let (finished, pending) =
            record_into(pool, pool_mem, *enc, queue, cfg.batching, &mut make_room, record)?;
        if waited {
            stats.pool_waits = stats.pool_waits.saturating_add(1);
            crate::log::log_warn!("queue {}: IB pool was empty, waited for the oldest fence", qi);
        }
        // The commands must be visible to the device before the ring
        // points at them (a no-op on coherent platforms).
        pending.dirty(|off, len| p.cache_clean(pool_mem, off, len));
        let ib = Command::IndirectBuffer { addr: finished.gpu_va, size_dw: finished.size_dw };
        match emit(p, cfg, enc, *fence_va, queues, qi, seqno, ids.get(..n).unwrap_or(&[]), &ib) {
            Ok(wrapped) => {
                pending.commit(FenceId { queue, seqno });
                if wrapped {
                    stats.ring_wraps = stats.ring_wraps.saturating_add(1);
                }
            }
            Err(e) => {
                pending.abort();
                return Err(e);
            }
        }
        self.after_submit(qi, seqno, ids.get(..n).unwrap_or(&[]), finished.total_dwords, finished.gpu_va)
    }

    /// Submits an IB the caller built and placed in GPU memory itself
    /// (`size_dw` dwords at `ib_va`).
    pub fn submit_ib(
        &mut self,
        queue: QueueId,
        waits: &[Fence],
        ib_va: u64,
        size_dw: u64,
    ) -> Result<Fence, SubmitError> {
        let max = self.enc.desc().limits.max_ib_dwords;
        if size_dw == 0 {
            return Err(SubmitError::Empty);
        }
        if size_dw > u64::from(max) {
            return Err(SubmitError::IbTooLarge { dwords: size_dw, max });
        }
        let (qi, seqno, ids, n) = self.prepare_submit(queue, waits)?;
        let ib = Command::IndirectBuffer { addr: ib_va, size_dw: size_dw as u32 };
        self.enc.check(&ib).map_err(SubmitError::Encode)?;
        let Device { p, cfg, queues, enc, fence_va, stats, .. } = &mut *self;
        let wrapped = emit(p, cfg, enc, *fence_va, queues, qi, seqno, ids.get(..n).unwrap_or(&[]), &ib)?;
        if wrapped {
            stats.ring_wraps = stats.ring_wraps.saturating_add(1);
        }
        self.after_submit(qi, seqno, ids.get(..n).unwrap_or(&[]), size_dw, ib_va)
    }

    fn after_submit(
        &mut self,
        qi: usize,
        seqno: Seqno,
        waits: &[FenceId],
        dwords: u64,
        ib_va: u64,
    ) -> Result<Fence, SubmitError> {
        let queue = QueueId(qi as u8);
        // The check passed before anything was written; record cannot fail
        // for capacity because prepare_submit checked it too.
        let _ = self.deps.record(queue, seqno, waits);
        let now = self.p.now_ns();
        let q = self.queues.get_mut(qi).ok_or(SubmitError::UnknownQueue(queue))?;
        q.emitted = seqno;
        if let Some(slot) = q.submit_ts.get_mut(ts_slot(seqno)) {
            *slot = (seqno, now);
        }
        let epoch = q.epoch;
        let wptr = q.ring.wptr() as u64;
        self.stats.submissions = self.stats.submissions.saturating_add(1);
        self.record_trace(TraceKind::Encode, qi, seqno, dwords);
        self.record_trace(TraceKind::Submit, qi, seqno, ib_va);
        self.record_trace(TraceKind::Doorbell, qi, seqno, wptr);
        Ok(Fence { id: FenceId { queue, seqno }, epoch })
    }

    // ----- completion -----------------------------------------------------

    /// Reads every fence slot, records newly signalled fences, reclaims IB
    /// chunks and dependency entries.
    fn refresh_all(&mut self) {
        for qi in 0..QUEUES {
            self.refresh_queue(qi);
        }
    }

    fn refresh_queue(&mut self, qi: usize) -> Seqno {
        let Some(q) = self.queues.get(qi) else { return Seqno(0) };
        let before = q.processed;
        let now = refresh(&self.p, &self.fence_mem, qi, &q.timeline);
        if now.is_after(before) {
            let queue = QueueId(qi as u8);
            self.pool.reclaim(queue, now);
            self.deps.retire(queue, now);
            let n = now.distance(before).max(0) as u64;
            self.stats.fences_signalled = self.stats.fences_signalled.saturating_add(n);
            let ts = self.p.now_ns();
            // One span per fence we still have a submit time for.
            let steps = n.min(SUBMIT_TIMES as u64);
            for k in 0..steps {
                let s = Seqno(now.0.wrapping_sub(steps.saturating_sub(1)).wrapping_add(k));
                let submitted = self
                    .queues
                    .get(qi)
                    .and_then(|q| q.submit_ts.get(ts_slot(s)))
                    .filter(|(sq, _)| *sq == s)
                    .map_or(0, |(_, t)| *t);
                self.trace.record(TraceEvent {
                    ts_ns: ts,
                    kind: TraceKind::FenceSignalled,
                    queue: qi as u8,
                    seqno: s.0,
                    arg: submitted,
                });
            }
            if let Some(q) = self.queues.get_mut(qi) {
                q.processed = now;
            }
        }
        now
    }

    /// Where `fence` stands, without waiting (but servicing the device).
    pub fn query(&mut self, fence: Fence) -> Result<FenceStatus, WaitError> {
        let qi = usize::from(fence.id.queue.0);
        let q = self.queues.get(qi).ok_or(WaitError::UnknownQueue(fence.id.queue))?;
        if fence.epoch != q.epoch {
            return Ok(match q.errored_for(fence.id.seqno, fence.epoch) {
                Some(e) => FenceStatus::Failed(e),
                None => FenceStatus::Signalled,
            });
        }
        if fence.id.seqno.is_after(q.emitted) {
            return Err(WaitError::NotSubmitted(fence));
        }
        let done = self.refresh_queue(qi);
        if fence.id.is_signalled_by(done) {
            return Ok(FenceStatus::Signalled);
        }
        Ok(FenceStatus::Pending)
    }

    /// Waits until `fence` signals, fails, or `timeout_ns` passes (0: just
    /// check). Follows the adaptive schedule of [`Config::wait_steps`], with
    /// interrupts when the platform has them, and services the device while
    /// it waits (a hang detected here resets the queue and fails the fence).
    pub fn wait(&mut self, fence: Fence, timeout_ns: u64) -> Result<(), WaitError> {
        let start = self.p.now_ns();
        let qi = usize::from(fence.id.queue.0);
        self.record_trace(TraceKind::WaitBegin, qi, fence.id.seqno, timeout_ns);
        let r = crate::sync::wait::wait_for(self, fence, timeout_ns, start);
        let end = self.p.now_ns();
        self.stats.wait_ns = self.stats.wait_ns.saturating_add(end.saturating_sub(start));
        let code = match r {
            Ok(()) => 0,
            Err(WaitError::Timeout) => 1,
            Err(_) => 2,
        };
        self.record_trace(TraceKind::WaitEnd, qi, fence.id.seqno, code);
        r
    }

    // ----- servicing: interrupts, faults, hangs ---------------------------

    /// Acknowledges interrupts, updates fences, and checks every busy queue
    /// for faults and hangs. A stuck queue is reset, its pending fences
    /// fail, and the report is returned (and kept, see [`Device::last_hang`]).
    pub fn service(&mut self) -> Option<HangReport> {
        if self.lost {
            return None;
        }
        match self.p.read_reg(regs::IRQ_STATUS) {
            Ok(0) => {}
            Ok(bits) => {
                self.stats.interrupts = self.stats.interrupts.saturating_add(1);
                if self.p.write_reg(regs::IRQ_STATUS, bits).is_err() {
                    return self.device_lost();
                }
            }
            Err(_) => return self.device_lost(),
        }
        self.refresh_all();
        let mut report = None;
        for qi in 0..QUEUES {
            match self.check_queue(qi) {
                Ok(Some(r)) => report = Some(r),
                Ok(None) => {}
                Err(_) => return self.device_lost(),
            }
        }
        report
    }

    fn check_queue(&mut self, qi: usize) -> Result<Option<HangReport>, PlatformError> {
        let e = qi as u32;
        let Some(q) = self.queues.get(qi) else { return Ok(None) };
        if !q.pending() {
            if let Some(q) = self.queues.get_mut(qi) {
                q.watch.armed = false;
            }
            return Ok(None);
        }
        let p = &self.p;
        let status = p.read_reg(regs::engine_reg(e, er::STATUS))?;
        let fault_status = p.read_reg(regs::engine_reg(e, er::FAULT_STATUS))?;
        let rptr = p.read_reg(regs::engine_reg(e, er::RING_RPTR))?;
        let cur = u64::from(p.read_reg(regs::engine_reg(e, er::CUR_ADDR_LO))?)
            | (u64::from(p.read_reg(regs::engine_reg(e, er::CUR_ADDR_HI))?) << 32);
        let now = p.now_ns();
        if status & er::STATUS_HALTED != 0 || fault_status & er::FAULT_VALID != 0 {
            let addr = u64::from(p.read_reg(regs::engine_reg(e, er::FAULT_ADDR_LO))?)
                | (u64::from(p.read_reg(regs::engine_reg(e, er::FAULT_ADDR_HI))?) << 32);
            let info = FaultInfo::from_regs(fault_status | er::FAULT_VALID, addr);
            return self.recover(qi, info.map_or(HangReason::DeviceLost, HangReason::Fault)).map(Some);
        }
        let hang = self.cfg.hang;
        // Blocked on another queue's emitted, unsignalled fence: waiting on
        // purpose; if anything is hung it is that queue, checked on its own.
        let queues = &self.queues;
        let completed_of =
            |q: QueueId| queues.get(usize::from(q.0)).map_or(Seqno(0), |s| s.timeline.completed());
        let own_completed = completed_of(QueueId(qi as u8));
        let blocked = self.deps.blocked_on(QueueId(qi as u8), own_completed, completed_of).is_some_and(|f| {
            queues.get(usize::from(f.queue.0)).is_some_and(|other| f.seqno.is_signalled_by(other.emitted))
        });
        let Some(q) = self.queues.get_mut(qi) else { return Ok(None) };
        q.rptr = rptr;
        let completed = q.timeline.completed();
        if blocked {
            q.watch =
                Watch { armed: true, rptr, cur_addr: cur, completed, since_ns: now, fence_since_ns: now };
            return Ok(None);
        }
        let w = &mut q.watch;
        if !w.armed {
            *w = Watch { armed: true, rptr, cur_addr: cur, completed, since_ns: now, fence_since_ns: now };
            return Ok(None);
        }
        let moved = rptr != w.rptr || cur.abs_diff(w.cur_addr) > hang.min_progress_bytes;
        if completed != w.completed {
            *w = Watch { armed: true, rptr, cur_addr: cur, completed, since_ns: now, fence_since_ns: now };
            return Ok(None);
        }
        if moved {
            w.rptr = rptr;
            w.cur_addr = cur;
            w.since_ns = now;
        }
        let still = now.saturating_sub(w.since_ns);
        let no_fence = now.saturating_sub(w.fence_since_ns);
        let windows = hang.max_windows_without_fence.max(1);
        let reason = if still >= hang.window_ns {
            Some(HangReason::NoProgress { window_ns: hang.window_ns })
        } else if no_fence >= hang.window_ns.saturating_mul(u64::from(windows)) {
            Some(HangReason::FenceStalled { windows })
        } else {
            None
        };
        match reason {
            Some(r) => self.recover(qi, r).map(Some),
            None => Ok(None),
        }
    }

    /// Dumps the queue's state, resets its engine, fails its pending fences
    /// and makes it usable again.
    fn recover(&mut self, qi: usize, reason: HangReason) -> Result<HangReport, PlatformError> {
        let report = self.capture(qi, reason)?;
        let e = qi as u32;
        let queue = QueueId(qi as u8);
        let (kind, arg, error) = match reason {
            HangReason::Fault(info) => {
                self.stats.faults = self.stats.faults.saturating_add(1);
                (TraceKind::Fault, info.addr, FenceError::Fault(info))
            }
            HangReason::DeviceLost => (TraceKind::Hang, report.cur_addr, FenceError::DeviceLost),
            _ => {
                self.stats.hangs = self.stats.hangs.saturating_add(1);
                (TraceKind::Hang, report.cur_addr, FenceError::DeviceHung)
            }
        };
        let emitted = self.queues.get(qi).map_or(Seqno(0), |q| q.emitted);
        crate::log::log_error!(
            "queue {}: {} at packet {:#x} (rptr {:#x}, fences {}..={} pending); resetting the engine",
            qi,
            match reason {
                HangReason::Fault(_) => "fault",
                HangReason::NoProgress { .. } => "hang (no progress)",
                HangReason::FenceStalled { .. } => "hang (no fence)",
                HangReason::DeviceLost => "device lost",
            },
            report.cur_addr,
            report.rptr,
            report.completed.0.wrapping_add(1),
            emitted.0
        );
        if let HangReason::Fault(info) = reason {
            crate::log::log_error!(
                "queue {}: {} fault on {} at {:#x} (opcode {:#x})",
                qi,
                info.kind.name(),
                info.access.name(),
                info.addr,
                info.opcode
            );
        }
        self.record_trace(kind, qi, emitted, arg);
        if !reset_engine(&self.p, e, true)? {
            return Err(PlatformError::DeviceLost);
        }
        self.p.write_reg(regs::IRQ_STATUS, regs::irq_fence(e) | regs::irq_fault(e))?;
        let cancelled = self.cancel_pending(qi, error);
        self.pool.release_queue(queue);
        self.deps.clear(queue);
        self.stats.resets = self.stats.resets.saturating_add(1);
        self.record_trace(TraceKind::Reset, qi, emitted, cancelled);
        self.last_hang = Some(report);
        Ok(report)
    }

    /// Completes `qi`'s pending fences with `error`: records the range,
    /// writes the last emitted value into the fence slot (so other engines
    /// waiting on it move on), and starts a new epoch. Returns how many.
    fn cancel_pending(&mut self, qi: usize, error: FenceError) -> u64 {
        let Some(q) = self.queues.get_mut(qi) else { return 0 };
        let after = q.timeline.completed();
        let upto = q.emitted;
        let n = upto.distance(after).max(0) as u64;
        q.epoch = q.epoch.wrapping_add(1);
        if n > 0 {
            if let Some(slot) = q.errored.get_mut(q.errored_next % ERROR_HISTORY) {
                *slot = Some(ErroredRange { after, upto, error, epoch: q.epoch });
            }
            q.errored_next = q.errored_next.wrapping_add(1);
        }
        q.timeline.force(upto);
        // Cancelled fences are not "signalled": skip them in the bookkeeping.
        q.processed = upto;
        q.ring.reset();
        q.watch = Watch::default();
        let off = qi.saturating_mul(FENCE_STRIDE);
        self.fence_mem.write_u64(off, upto.0);
        self.p.cache_clean(&self.fence_mem, off, 8);
        n
    }

    /// The device stopped answering: fail everything.
    fn device_lost(&mut self) -> Option<HangReport> {
        if self.lost {
            return None;
        }
        self.lost = true;
        crate::log::log_error!("device lost: failing every pending fence");
        let mut report = None;
        for qi in 0..QUEUES {
            let pending = self.queues.get(qi).is_some_and(QueueState::pending);
            if pending {
                let (emitted, completed, wptr) = self
                    .queues
                    .get(qi)
                    .map_or((Seqno(0), Seqno(0), 0), |q| (q.emitted, q.timeline.completed(), q.ring.wptr()));
                report = Some(HangReport {
                    queue: QueueId(qi as u8),
                    reason: HangReason::DeviceLost,
                    at_ns: self.p.now_ns(),
                    generation: self.chip.generation,
                    rptr: 0,
                    wptr: wptr as u32,
                    status: 0,
                    cur_addr: 0,
                    ib_base: 0,
                    ib_size: 0,
                    emitted,
                    completed,
                    fault: None,
                    ring: Window::EMPTY,
                    ib: Window::EMPTY,
                });
                self.cancel_pending(qi, FenceError::DeviceLost);
            }
        }
        if report.is_some() {
            self.last_hang = report;
        }
        report
    }

    /// Reads the engine's registers and the command memory around it.
    fn capture(&mut self, qi: usize, reason: HangReason) -> Result<HangReport, PlatformError> {
        let e = qi as u32;
        let p = &self.p;
        let rd = |p: &P, r: u32| p.read_reg(regs::engine_reg(e, r));
        let rptr = rd(p, er::RING_RPTR)?;
        let status = rd(p, er::STATUS)?;
        let cur_addr = u64::from(rd(p, er::CUR_ADDR_LO)?) | (u64::from(rd(p, er::CUR_ADDR_HI)?) << 32);
        let ib_base = u64::from(rd(p, er::IB_BASE_LO)?) | (u64::from(rd(p, er::IB_BASE_HI)?) << 32);
        let ib_size = rd(p, er::IB_SIZE)?;
        let fault = match reason {
            HangReason::Fault(i) => Some(i),
            _ => None,
        };
        let at_ns = p.now_ns();
        let Some(q) = self.queues.get_mut(qi) else { return Err(PlatformError::Unsupported) };
        let (emitted, completed, wptr) = (q.emitted, q.timeline.completed(), q.ring.wptr());
        let ring_va = q.ring.gpu_va();
        let ring_size = q.ring.size();
        let ring = {
            let start = (rptr as usize).min(ring_size) / 4;
            let words = q.ring.region_words();
            let src = words.get(start..ring_size / 4).unwrap_or(&[]);
            let used_dw = q.ring.used(rptr as usize) / 4;
            let src = src.get(..used_dw.min(src.len())).unwrap_or(src);
            Window::capture(ring_va.wrapping_add(u64::from(rptr)), src, ring_va.wrapping_add(u64::from(rptr)))
        };
        let ib = self.capture_ib(ib_base, ib_size, cur_addr);
        Ok(HangReport {
            queue: QueueId(qi as u8),
            reason,
            at_ns,
            generation: self.chip.generation,
            rptr,
            wptr: wptr as u32,
            status,
            cur_addr,
            ib_base,
            ib_size,
            emitted,
            completed,
            fault,
            ring,
            ib,
        })
    }

    /// Copies the IB around `cur` if it lies in the IB pool, starting a few
    /// packets before it (found by walking packet lengths from the IB start).
    fn capture_ib(&mut self, ib_base: u64, ib_size: u32, cur: u64) -> Window {
        let (pool_va, pool_len) = (self.pool_va, self.pool_mem.len());
        let Some(off) = ib_base.checked_sub(pool_va).filter(|o| *o < pool_len as u64) else {
            return Window::EMPTY;
        };
        let words = self.pool_mem.words();
        let start = (off / 4) as usize;
        let end = start.saturating_add(ib_size as usize).min(words.len());
        let ib = words.get(start..end).unwrap_or(&[]);
        let ndw = self.enc.desc().header.ndw;
        let mut recent = [0usize; 4];
        let mut pos = 0usize;
        for _ in 0..ib.len() {
            let va = ib_base.wrapping_add((pos as u64).wrapping_mul(4));
            if va >= cur || pos >= ib.len() {
                break;
            }
            recent.rotate_left(1);
            if let Some(last) = recent.last_mut() {
                *last = pos;
            }
            let Some(h) = ib.get(pos) else { break };
            pos = pos.saturating_add(ndw.get(*h) as usize).saturating_add(1);
        }
        // Start up to three packets before the current one.
        let at_cur = pos < ib.len() && ib_base.wrapping_add((pos as u64).wrapping_mul(4)) == cur;
        let from = if at_cur {
            recent.get(1).copied().unwrap_or(0).min(pos)
        } else {
            recent.first().copied().unwrap_or(0)
        };
        let from = from.min(ib.len());
        Window::capture(
            ib_base.wrapping_add((from as u64).wrapping_mul(4)),
            ib.get(from..).unwrap_or(&[]),
            cur,
        )
    }
}

/// Writes one submission's ring packets and publishes them. Returns
/// whether the ring wrapped.
#[allow(clippy::too_many_arguments)]
fn emit<P: DirectIo>(
    p: &P,
    cfg: &Config,
    enc: &Encoder,
    fence_va: u64,
    queues: &mut [QueueState; QUEUES],
    qi: usize,
    seqno: Seqno,
    waits: &[FenceId],
    ib: &Command<'_>,
) -> Result<bool, SubmitError> {
    let e = qi as u32;
    let mut cmds = [Command::Nop { dwords: 0 }; MAX_WAITS + 2];
    let mut n = 0usize;
    for w in waits {
        if let Some(c) = cmds.get_mut(n) {
            *c = Command::WaitMem {
                addr: fence_va.wrapping_add(u64::from(w.queue.0).wrapping_mul(FENCE_STRIDE as u64)),
                reference: w.seqno.0,
                mask: u64::MAX,
                op: CompareOp::SeqGe,
                wide: true,
            };
            n = n.saturating_add(1);
        }
    }
    let fence_addr = fence_va.wrapping_add((qi as u64).wrapping_mul(FENCE_STRIDE as u64));
    for c in [*ib, Command::Fence { addr: fence_addr, value: seqno.0, irq: true }] {
        if let Some(slot) = cmds.get_mut(n) {
            *slot = c;
            n = n.saturating_add(1);
        }
    }
    let cmds = cmds.get(..n).unwrap_or(&[]);
    let q = queues.get_mut(qi).ok_or(SubmitError::UnknownQueue(QueueId(qi as u8)))?;
    let start = p.now_ns();
    let limit = cfg.hang.window_ns;
    let written = loop {
        let rptr =
            p.read_reg(regs::engine_reg(e, er::RING_RPTR)).map_err(|_| SubmitError::DeviceLost)? as usize;
        match q.ring.write(enc, cmds, rptr) {
            Ok(w) => break w,
            Err(RingError::Full { .. }) if p.now_ns().saturating_sub(start) < limit => p.delay_ns(10_000),
            Err(e @ RingError::Full { .. }) | Err(e @ RingError::TooLarge { .. }) => {
                return Err(SubmitError::RingFull(e))
            }
            Err(RingError::Encode(x)) => return Err(SubmitError::Encode(x)),
            Err(e @ RingError::BadSize { .. }) => return Err(SubmitError::RingFull(e)),
        }
    };
    // Packets visible before the write pointer that points at them.
    let len = if written.wrapped { q.ring.size() } else { written.bytes };
    let from = if written.wrapped { 0 } else { written.start };
    p.cache_clean(q.ring.region(), from, len);
    mem_fence(Ordering::Release);
    p.write_reg(regs::engine_reg(e, er::RING_WPTR), written.wptr as u32)
        .map_err(|_| SubmitError::DeviceLost)?;
    p.doorbell(e).map_err(|_| SubmitError::DeviceLost)?;
    Ok(written.wrapped)
}

impl<P: DirectIo, const CHUNKS: usize> crate::sync::wait::Waiter for Device<P, CHUNKS> {
    type P = P;
    fn status(&mut self, fence: Fence) -> Result<FenceStatus, WaitError> {
        self.query(fence)
    }
    fn between_checks(&mut self) {
        self.service();
    }
    fn platform(&self) -> &P {
        &self.p
    }
    fn config(&self) -> &Config {
        &self.cfg
    }
}
