//! Direct mode: the core owns the rings, the fence slots and the page
//! tables, and drives the register page through a [`DirectIo`] platform
//! (bare metal, co-simulation, the in-process model).
//!
//! One submission becomes, in the queue's ring: a WAIT_MEM on each other
//! queue's fence slot it depends on, an INDIRECT_BUFFER to the recorded
//! commands, and a FENCE writing the submission's sequence number to its
//! queue's slot (with an interrupt). [`hang`] is the progress-based hang
//! and fault check and the reset; [`tables`] the GPU page tables;
//! [`plan`] the DMA memory a device takes at bring-up.
//!
//! [`Device`] is the engine over this backend.

pub mod hang;
pub mod plan;
pub mod tables;

use core::mem::MaybeUninit;
use core::sync::atomic::fence as mem_fence;

use crate::sync::atomic::{AtomicU64, Ordering};

use crate::cmd::{Command, CompareOp, Encoder};
use crate::config::Config;
use crate::engine::backend::{
    sealed, Acked, Backend, EmitError, EmitInfo, Failure, Gone, Job, Poll, QueueView,
};
use crate::engine::DeviceCore;
use crate::error::SubmitError;
use crate::hw::regs::{self, engine as er};
use crate::hw::{probe, ChipId};
use crate::mem::pagetable::Perms;
use crate::mem::pool::BackingError;
use crate::platform::slots::FenceSlots;
use crate::platform::{DirectIo, DmaRegion, PlatformError};
use crate::ring::{Ring, RingError};
use crate::sync::deps::MAX_WAITS;
use crate::sync::{Seqno, MAX_QUEUES};

pub use crate::engine::{InPlace, InitError};
use hang::Watch;
pub use plan::{DoesNotFit, MemoryPlan};
use tables::Tables;

pub use crate::platform::slots::FENCE_STRIDE;
/// How long register handshakes (reset, TLB invalidate) may take before
/// the device counts as lost: hardware answers in microseconds, but a
/// modelled device behind a loaded host (co-simulation, QEMU under TCG)
/// can be descheduled for a good part of 100 ms, so the guard is 1 s, as
/// in the kernel driver.
const HANDSHAKE_NS: u64 = 1_000_000_000;

/// The fence slot of the bring-up round trip's scratch word: the last of
/// the fence page, past every queue's.
const SCRATCH_SLOT: usize = 4096 / FENCE_STRIDE - 1;

/// The bring-up round trip's token ("RG" and the queue in the low bits):
/// not 0, the value the scratch word is cleared to.
const ROUND_TRIP_TOKEN: u64 = 0x5247_0000;

/// A refgpu driven in direct mode, with `CHUNKS` IB chunks.
pub type Device<'d, P, const CHUNKS: usize = 16> = DeviceCore<'d, Direct<'d, P>, CHUNKS>;

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

/// Whether the MMU can be used (the `mmu` feature). Without it only
/// [`MmuMode::Bypass`] brings a device up (`Enabled` is refused with
/// [`InitError::BadConfig`]) and neither page-table code nor the GPU VA
/// allocator ([`crate::mem::VaAllocator`]) is linked: in bypass a GPU
/// address is the memory's device address.
pub const MMU: bool = cfg!(feature = "mmu");

impl MmuMode {
    /// MMU on, 4 GiB of VA from 4 GiB up, 64 table pages.
    pub const DEFAULT: MmuMode = MmuMode::Enabled { va_base: 1 << 32, va_size: 1 << 32, table_pages: 64 };
}

/// Per-queue state of direct mode (behind the queue's submit lock).
#[derive(Debug)]
pub struct DirectQueue {
    pub(crate) ring: Option<Ring>,
    pub(crate) watch: Watch,
    /// Jobs emitted with `Job::hold` wait for a flush: RING_WPTR is then
    /// `published`, behind the ring's own write pointer. (A device's jobs
    /// are all held or none: `Config::batch_window_ns` is fixed.)
    pub(crate) held: bool,
    /// The write pointer last published, while `held`.
    pub(crate) published: usize,
}

/// The direct-mode backend.
#[derive(Debug)]
pub struct Direct<'d, P: DirectIo> {
    p: &'d P,
    chip: ChipId,
    enc: Encoder,
    nq: usize,
    slots: FenceSlots,
    mmu: bool,
    programmed: bool,
    pte_writes: AtomicU64,
    tlb_invalidations: AtomicU64,
    /// Doorbells rung per engine by flushes of held jobs (an unheld job
    /// rings one of its own: the engine counts those as submissions);
    /// written under the queue's submit lock.
    flushes: [AtomicU64; MAX_QUEUES],
}

impl<P: DirectIo> sealed::Sealed for Direct<'_, P> {}

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

pub(crate) fn reset_engine<P: DirectIo>(p: &P, e: u32, enable: bool) -> Result<bool, PlatformError> {
    let ctrl = regs::engine_reg(e, er::CTRL);
    write_ctl(p, ctrl, er::CTRL_RESET | if enable { er::CTRL_ENABLE } else { 0 })?;
    handshake(p, ctrl, er::CTRL_RESET)
}

impl<'d, P: DirectIo> Direct<'d, P> {
    fn invalidate_tlb(&self) -> Result<bool, PlatformError> {
        self.tlb_invalidations.fetch_add(1, Ordering::Relaxed);
        write_ctl(self.p, regs::MMU_INVALIDATE, 1)?;
        handshake(self.p, regs::MMU_INVALIDATE, 1)
    }

    /// Writes `value` to queue `q`'s fence slot from the CPU (after the
    /// queue's engine was reset: nothing on the GPU writes it then) and
    /// cleans it to the device.
    fn force_slot(&self, q: usize, value: Seqno) -> Result<(), Gone> {
        if self.slots.force(self.p, q, value) {
            Ok(())
        } else {
            Err(Gone)
        }
    }

    /// Publishes the ring's write pointer to engine `e` and rings its
    /// doorbell, if jobs are held: every packet written (and cleaned) so
    /// far becomes the engine's.
    fn publish(&self, qs: &mut DirectQueue, e: u32) -> Result<(), Gone> {
        if !qs.held {
            return Ok(());
        }
        let Some(wptr) = qs.ring.as_ref().map(Ring::wptr) else { return Err(Gone) };
        // Packets visible before the write pointer that points at them.
        mem_fence(Ordering::Release);
        self.p.write_reg(regs::engine_reg(e, er::RING_WPTR), wptr as u32).map_err(|_| Gone)?;
        qs.held = false;
        self.p.doorbell(e).map_err(|_| Gone)?;
        // One writer at a time (the caller holds queue `e`'s submit lock,
        // or the device exclusively): a load and a store, no atomic add.
        if let Some(c) = self.flushes.get(e as usize) {
            c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        }
        Ok(())
    }

    /// GPU address of queue `q`'s fence slot.
    pub(crate) fn slot_va(&self, q: usize) -> u64 {
        self.slots.va(q)
    }
}

impl<'d, P: DirectIo> Backend for Direct<'d, P> {
    type P = P;
    type Queue = DirectQueue;
    type Maps = Option<Tables>;
    const MODE: crate::engine::Mode = crate::engine::Mode::Direct;
    // In MMU bypass a GPU address is the DMA region's device address: the
    // VA allocator is only needed (and only linked) with the MMU built in.
    const VA_ALLOCATOR: bool = MMU;
    #[cfg(feature = "mmu")]
    type Va<'v> = Option<crate::engine::buffers::DriverVa<'v>>;
    #[cfg(not(feature = "mmu"))]
    type Va<'v> = crate::engine::backend::sealed::NoVa;

    fn platform(&self) -> &P {
        self.p
    }

    fn chip(&self) -> ChipId {
        self.chip
    }

    fn gpu_clock_ns(&self) -> Option<u64> {
        // Reading CLOCK_LO latches CLOCK_HI (docs/refgpu.md 2.1).
        let lo = self.p.read_reg(regs::CLOCK_LO).ok()?;
        let hi = self.p.read_reg(regs::CLOCK_HI).ok()?;
        Some(u64::from(hi) << 32 | u64::from(lo))
    }

    fn queues(&self) -> usize {
        self.nq
    }

    fn translates(&self) -> bool {
        self.mmu
    }

    fn map(
        &self,
        maps: &mut Option<Tables>,
        va: u64,
        region: &DmaRegion,
        perms: Perms,
    ) -> Result<(), BackingError> {
        if !MMU {
            return Ok(());
        }
        let Some(t) = maps.as_mut() else { return Ok(()) };
        let before = t.pages.entry_writes();
        let r = t.map(self.p, va, region.dev_addr(), region.len() as u64, perms);
        self.pte_writes.fetch_add(t.pages.entry_writes().wrapping_sub(before), Ordering::Relaxed);
        r.map_err(|_| BackingError::Map)
    }

    fn unmap(&self, maps: &mut Option<Tables>, va: u64, len: u64) -> Result<(), BackingError> {
        if !MMU {
            return Ok(());
        }
        let Some(t) = maps.as_mut() else { return Ok(()) };
        let before = t.pages.entry_writes();
        // All or nothing: a range the driver mapped unmaps.
        let r = t.unmap(self.p, va, len);
        self.pte_writes.fetch_add(t.pages.entry_writes().wrapping_sub(before), Ordering::Relaxed);
        if self.programmed {
            let _ = self.invalidate_tlb();
        }
        r.map_err(|_| BackingError::Map)
    }

    fn emit(&self, qs: &mut DirectQueue, job: &Job<'_>) -> Result<EmitInfo, EmitError> {
        let e = job.queue as u32;
        let fence_va = self.slot_va(job.queue);
        // Most submissions wait for nothing: their two packets go to the
        // ring without a list (`Ring::write_ib_fence`). With waits the
        // list is built, the waits first.
        let plain = job.waits.is_empty();
        let mut listed;
        let cmds: &[Command<'_>] = if plain {
            &[]
        } else {
            let ib = Command::IndirectBuffer { addr: job.ib.va.get(), size_dw: job.ib.dwords };
            let fence = Command::Fence { addr: fence_va, value: job.seqno.0, irq: true };
            listed = [Command::Nop { dwords: 0 }; MAX_WAITS + 2];
            let mut n = 0usize;
            for w in job.waits {
                if let Some(c) = listed.get_mut(n) {
                    *c = Command::WaitMem {
                        addr: self.slot_va(usize::from(w.queue.0)),
                        reference: w.seqno.0,
                        mask: u64::MAX,
                        op: CompareOp::SeqGe,
                        wide: true,
                    };
                    n = n.saturating_add(1);
                }
            }
            for c in [ib, fence] {
                if let Some(slot) = listed.get_mut(n) {
                    *slot = c;
                    n = n.saturating_add(1);
                }
            }
            listed.get(..n).unwrap_or(&[])
        };
        let ring = qs.ring.as_mut().ok_or(EmitError::Lost)?;
        // The space before the read pointer last read is free (the engine
        // only moves it forward): RING_RPTR is read again only when that
        // is not enough. A lost device is then seen below, when the write
        // pointer is published, before the engine can see the packets.
        // (One call site of the write: its code is not duplicated.)
        let (mut rptr, mut refreshed) = (ring.rptr_seen(), false);
        let written = loop {
            let w = if plain {
                ring.write_ib_fence(&self.enc, job.ib, (fence_va, job.seqno.0), rptr)
            } else {
                ring.write(&self.enc, cmds, rptr)
            };
            match w {
                Err(RingError::Full { .. }) if !refreshed => {
                    let r =
                        self.p.read_reg(regs::engine_reg(e, er::RING_RPTR)).map_err(|_| EmitError::Lost)?;
                    // A value the engine cannot have reported is a device
                    // that no longer answers sensibly: lost, not trusted.
                    if !ring.rptr_plausible(r as usize) {
                        return Err(EmitError::Lost);
                    }
                    (rptr, refreshed) = (r as usize, true);
                }
                w => break w,
            }
        };
        let written = match written {
            Ok(w) => w,
            Err(e @ RingError::Full { .. }) => return Err(EmitError::Full(SubmitError::RingFull(e))),
            Err(RingError::Encode(x)) => return Err(EmitError::Refused(SubmitError::Encode(x))),
            Err(e) => return Err(EmitError::Refused(SubmitError::RingFull(e))),
        };
        // Packets visible before the write pointer that points at them.
        let len = if written.wrapped { ring.size() } else { written.bytes };
        let from = if written.wrapped { 0 } else { written.start };
        self.p.cache_clean(ring.region(), from, len);
        let info = EmitInfo { wrapped: written.wrapped, wptr: written.wptr as u64 };
        if job.hold {
            // Deferred doorbell: `flush` publishes it with the others.
            if !qs.held {
                (qs.held, qs.published) = (true, written.start);
            }
            return Ok(info);
        }
        mem_fence(Ordering::Release);
        self.p
            .write_reg(regs::engine_reg(e, er::RING_WPTR), written.wptr as u32)
            .map_err(|_| EmitError::Lost)?;
        self.p.doorbell(e).map_err(|_| EmitError::Lost)?;
        Ok(info)
    }

    fn flush(&self, qs: &mut DirectQueue, q: usize) -> Result<(), Gone> {
        self.publish(qs, q as u32)
    }

    fn poll(&self, q: usize) -> Poll {
        match self.slots.read(self.p, q) {
            Some(v) => Poll::Completed(v),
            None => Poll::Lost,
        }
    }

    fn ack_interrupts(&self) -> Result<Acked, Gone> {
        let bits = match self.p.read_reg(regs::IRQ_STATUS) {
            Ok(0) => return Ok(Acked::default()),
            Ok(bits) => bits,
            Err(_) => return Err(Gone),
        };
        self.p.write_reg(regs::IRQ_STATUS, bits).map_err(|_| Gone)?;
        let faults =
            (0..self.nq as u32).filter(|e| bits & regs::irq_fault(*e) != 0).fold(0, |m, e| m | 1 << e);
        Ok(Acked { any: true, faults })
    }

    fn check(&self, qs: &mut DirectQueue, view: &QueueView<'_>) -> Result<Option<Failure>, Gone> {
        hang::check(self, qs, view)
    }

    fn reset(&self, qs: &mut DirectQueue, q: usize) -> Result<(), Gone> {
        hang::reset(self, qs, q)
    }

    fn resume(&self, qs: &mut DirectQueue, q: usize, upto: Seqno) -> Result<(), Gone> {
        hang::resume(self, qs, q, upto)
    }

    fn queue_state(&self, qs: &DirectQueue, q: usize) -> crate::engine::backend::QueueHw {
        let ring = qs.ring.as_ref().map(|r| crate::engine::backend::RingState {
            size: r.size(),
            va: r.gpu_va(),
            wptr: r.wptr(),
            published: if qs.held { qs.published } else { r.wptr() },
            rptr_seen: r.rptr_seen(),
            rptr: self.p.read_reg(regs::engine_reg(q as u32, er::RING_RPTR)).ok(),
        });
        crate::engine::backend::QueueHw { ring, held: None }
    }

    fn mapping_counters(&self) -> (u64, u64) {
        (self.pte_writes.load(Ordering::Relaxed), self.tlb_invalidations.load(Ordering::Relaxed))
    }

    fn flush_doorbells(&self) -> u64 {
        self.flushes.iter().fold(0u64, |n, c| n.wrapping_add(c.load(Ordering::Relaxed)))
    }

    fn stop(&self) {
        if !self.programmed {
            return;
        }
        for e in 0..self.nq as u32 {
            let _ = write_ctl(self.p, regs::engine_reg(e, er::CTRL), 0);
        }
        let _ = write_ctl(self.p, regs::IRQ_MASK, 0);
        let _ = write_ctl(self.p, regs::MMU_CTRL, 0);
    }

    fn release_queue(&self, qs: &mut DirectQueue) {
        if let Some(r) = qs.ring.take() {
            self.p.dma_free(r.into_region());
        }
    }

    fn release(&mut self, maps: &mut Option<Tables>) {
        let f = self.slots.take_region();
        if !f.is_empty() {
            self.p.dma_free(f);
        }
        if let Some(t) = maps.take() {
            self.p.dma_free(t.pages.into_region());
        }
    }
}

/// The tunables' ranges, then what depends on the chip and the build: the
/// generation's IB limit and the pool's chunk count.
fn check_config(cfg: &Config, enc: &Encoder, chunks: usize) -> Result<(), InitError> {
    cfg.validate().map_err(InitError::OutOfRange)?;
    let max_ib = (enc.desc().limits.max_ib_dwords as usize).saturating_mul(4);
    if cfg.ib_chunk_bytes > max_ib {
        return Err(InitError::BadConfig("ib_chunk_bytes is past the generation's IB limit"));
    }
    if chunks == 0 || chunks > crate::ibpool::MAX_CHUNKS {
        return Err(InitError::BadConfig("the IB pool needs 1 to 64 chunks"));
    }
    Ok(())
}

impl<'d, P: DirectIo, const CHUNKS: usize> DeviceCore<'d, Direct<'d, P>, CHUNKS> {
    /// Probes the chip through `p`, allocates and maps the rings, fence
    /// slots, page tables and IB pool, and programs the MMU and the
    /// engines. The large tables live in `storage`; the device borrows it
    /// and the platform for its lifetime. On error everything allocated is
    /// freed again. The device is built in place and then moved out
    /// (about 34 KiB on 64-bit hosts, less with 32-bit pointers; `docs/perf.md`,
    /// "Size of the device per configuration"): firmware that
    /// counts stack bytes gives it its memory with [`Device::new_in`].
    pub fn new<
        const BUF: usize,
        const VA: usize,
        const SL: usize,
        const TR: usize,
        const LW: usize,
        const HG: usize,
    >(
        p: &'d P,
        storage: &'d mut crate::storage::DeviceStorage<BUF, VA, SL, TR, LW, HG>,
        cfg: Config,
        mmu: MmuMode,
    ) -> Result<Self, InitError> {
        let mut slot = MaybeUninit::uninit();
        Self::new_in(&mut slot, p, storage, cfg, mmu).map(InPlace::into_inner)
    }

    /// [`Device::new`] into `slot`, memory the integrator provides (a
    /// `static`, for instance behind a lock it takes once): every part of
    /// the device is written there, none is built on the stack and moved.
    /// The returned [`InPlace`] owns the device (dropping it stops the
    /// device and gives its memory back, as dropping a `Device` does;
    /// [`InPlace::leak`] keeps it for good). On error nothing is left in
    /// `slot` and everything allocated is freed again.
    pub fn new_in<
        's,
        const BUF: usize,
        const VA: usize,
        const SL: usize,
        const TR: usize,
        const LW: usize,
        const HG: usize,
    >(
        slot: &'s mut MaybeUninit<Self>,
        p: &'d P,
        storage: &'d mut crate::storage::DeviceStorage<BUF, VA, SL, TR, LW, HG>,
        cfg: Config,
        mmu: MmuMode,
    ) -> Result<InPlace<'s, Self>, InitError> {
        let chip = probe(p.read_reg(regs::ID).map_err(InitError::Platform)?).map_err(InitError::Probe)?;
        let engines = p.read_reg(regs::ENGINE_COUNT).map_err(InitError::Platform)? as usize;
        if engines == 0 {
            return Err(InitError::BadConfig("the chip reports no engines"));
        }
        let nq = engines.min(MAX_QUEUES);
        if engines > MAX_QUEUES {
            crate::log::log_warn!("chip has {} engines; this build drives the first {}", engines, MAX_QUEUES);
        }
        let enc = Encoder::new(chip.generation);
        check_config(&cfg, &enc, CHUNKS)?;
        if !MMU && matches!(mmu, MmuMode::Enabled { .. }) {
            return Err(InitError::BadConfig("MMU not built in (umd-core feature mmu)"));
        }
        let direct = Direct {
            p,
            chip,
            enc,
            nq,
            slots: FenceSlots::empty(),
            mmu: matches!(mmu, MmuMode::Enabled { .. }),
            programmed: false,
            pte_writes: AtomicU64::new(0),
            tlb_invalidations: AtomicU64::new(0),
            flushes: core::array::from_fn(|_| AtomicU64::new(0)),
        };
        let (va, table_pages) = match mmu {
            MmuMode::Bypass => (None, 0),
            MmuMode::Enabled { va_base, va_size, table_pages } => (Some((va_base, va_size)), table_pages),
        };
        let queues = core::array::from_fn(|_| DirectQueue {
            ring: None,
            watch: Watch::default(),
            held: false,
            published: 0,
        });
        let mut dev = DeviceCore::assemble_in(slot, direct, storage, cfg, va, None, queues)?;
        dev.init_direct(table_pages)?;
        Ok(dev)
    }

    fn init_direct(&mut self, table_pages: usize) -> Result<(), InitError> {
        let p = self.b.p;
        // Page tables first: everything else is mapped through them.
        if MMU && self.b.mmu {
            if table_pages == 0 {
                return Err(InitError::BadConfig("MMU needs table pages"));
            }
            let region = p
                .dma_alloc(table_pages.saturating_mul(4096), crate::platform::DmaFlags::CPU)
                .map_err(|e| crate::engine::lifecycle::init_alloc_error("page tables", e))?;
            let tables = Tables::new(region).map_err(|(e, r)| {
                p.dma_free(r);
                InitError::Vm(e)
            })?;
            self.mem.get_mut().maps = Some(tables);
            // Local memory (gen2, spec 3.5): only with the MMU, which moves
            // buffers between it and system memory under one address; and
            // only with the `local-memory` feature.
            let reg = |lo: u32| -> Result<u64, InitError> {
                let l = p.read_reg(lo).map_err(InitError::Platform)?;
                let h = p.read_reg(lo.wrapping_add(4)).map_err(InitError::Platform)?;
                Ok(u64::from(l) | u64::from(h) << 32)
            };
            let (base, size) = if cfg!(feature = "local-memory") {
                (reg(regs::LOCAL_BASE_LO)?, reg(regs::LOCAL_SIZE_LO)?)
            } else {
                (0, 0)
            };
            if size > 0 {
                let used = self.mem.get_mut().local.activate(base, size);
                crate::log::log_info!("local memory: {:#x} bytes at {:#x}, {:#x} managed", size, base, used);
            }
        }
        // Fence slots, then a ring per queue.
        let (region, va) = self.alloc_mapped("fence slots", 4096, Perms::RW)?;
        self.b.slots = FenceSlots::new(region, va);
        for qi in 0..self.nq {
            let (region, va) = self.alloc_mapped("ring", self.cfg.ring_bytes, Perms::RO)?;
            let ring = Ring::new(region, va, self.cfg.ring_bytes).map_err(|(_, r)| {
                p.dma_free(r);
                InitError::BadConfig("ring")
            })?;
            if let Some(q) = self.queues.get_mut(qi) {
                q.submit.get_mut().ring = Some(ring);
            }
        }
        self.init_ib_pool()?;
        self.program()?;
        self.round_trip()
    }

    /// The bring-up fence round trip: on each engine, a FENCE writing a
    /// token to the scratch word of the fence-slot page, which the CPU
    /// must then read back. It proves the device fetches the ring and
    /// writes the fence page at the device addresses the platform gave
    /// (through the page tables, with the MMU). An engine that reports a
    /// fault fails bring-up; one that stays silent (stalled) is left to
    /// the hang check, unless no engine answers at all. Afterwards the
    /// scratch word is 0 again and each engine reset, its ring empty: the
    /// device is in the state `program` left it in.
    fn round_trip(&mut self) -> Result<(), InitError> {
        let p = self.b.p;
        let pf = InitError::Platform;
        let scratch_va = self.b.slots.va(SCRATCH_SLOT);
        let (phys, fences) = self.b.slots.dev_addr(SCRATCH_SLOT);
        let window = self
            .queues
            .iter_mut()
            .filter_map(|q| {
                q.submit.get_mut().ring.as_ref().map(|r| (r.region().dev_addr(), r.region().len()))
            })
            .fold(fences, |(lo, hi), (b, len)| (lo.min(b), hi.max(b.wrapping_add(len as u64))));
        let (mut answered, mut silent) = (0usize, None);
        for qi in 0..self.nq {
            let e = qi as u32;
            let token = Seqno(ROUND_TRIP_TOKEN | qi as u64);
            let fence = [Command::Fence { addr: scratch_va, value: token.0, irq: false }];
            let Some(ring) = self.queues.get_mut(qi).and_then(|q| q.submit.get_mut().ring.as_mut()) else {
                return Err(InitError::BadConfig("ring"));
            };
            let w = ring.write(&self.b.enc, &fence, 0).map_err(|_| InitError::BadConfig("ring"))?;
            p.cache_clean(ring.region(), w.start, w.bytes);
            mem_fence(Ordering::Release);
            p.write_reg(regs::engine_reg(e, er::RING_WPTR), w.wptr as u32).map_err(pf)?;
            p.doorbell(e).map_err(pf)?;
            let start = p.now_ns();
            while self.b.slots.read(p, SCRATCH_SLOT) != Some(token) {
                if p.now_ns().saturating_sub(start) > HANDSHAKE_NS {
                    break;
                }
                p.delay_ns(1_000);
            }
            if self.b.slots.read(p, SCRATCH_SLOT) == Some(token) {
                answered = answered.saturating_add(1);
            } else {
                let reg = |r: u32| p.read_reg(regs::engine_reg(e, r)).map_err(pf);
                let status = reg(er::FAULT_STATUS)?;
                let addr = u64::from(reg(er::FAULT_ADDR_LO)?) | u64::from(reg(er::FAULT_ADDR_HI)?) << 32;
                let fault = crate::sync::FaultInfo::from_regs(status, addr);
                let failed = InitError::RoundTrip { queue: qi as u8, phys, window, fault };
                if fault.is_some() {
                    return Err(failed);
                }
                crate::log::log_warn!("engine {} did not answer the bring-up fence round trip: stalled?", e);
                silent = silent.or(Some(failed));
            }
            self.b.slots.force(p, SCRATCH_SLOT, Seqno(0));
            if !reset_engine(p, e, true).map_err(pf)? {
                return Err(InitError::Handshake("engine reset"));
            }
            ring.reset();
        }
        match silent {
            Some(failed) if answered == 0 => Err(failed),
            _ => Ok(()),
        }
    }

    /// Programs MMU, engines and interrupts.
    fn program(&mut self) -> Result<(), InitError> {
        let p = self.b.p;
        let pf = InitError::Platform;
        self.b.slots.clear(p);
        let root = self.mem.get_mut().maps.as_mut().filter(|_| MMU).map(|t| {
            t.pages.flush(p);
            t.root()
        });
        if let Some(root) = root {
            p.write_reg(regs::MMU_ROOT_LO, root as u32).map_err(pf)?;
            p.write_reg(regs::MMU_ROOT_HI, (root >> 32) as u32).map_err(pf)?;
            write_ctl(p, regs::MMU_CTRL, 1).map_err(pf)?;
            if !self.b.invalidate_tlb().map_err(pf)? {
                return Err(InitError::Handshake("MMU invalidate"));
            }
        } else {
            write_ctl(p, regs::MMU_CTRL, 0).map_err(pf)?;
        }
        let mut mask = 0;
        for qi in 0..self.nq {
            let e = qi as u32;
            if !reset_engine(p, e, false).map_err(pf)? {
                return Err(InitError::Handshake("engine reset"));
            }
            let Some(ring) = self.queues.get_mut(qi).and_then(|q| q.submit.get_mut().ring.as_ref()) else {
                return Err(InitError::BadConfig("ring"));
            };
            let base = ring.gpu_va();
            p.write_reg(regs::engine_reg(e, er::RING_BASE_LO), base as u32).map_err(pf)?;
            p.write_reg(regs::engine_reg(e, er::RING_BASE_HI), (base >> 32) as u32).map_err(pf)?;
            p.write_reg(regs::engine_reg(e, er::RING_SIZE), ring.size() as u32).map_err(pf)?;
            p.write_reg(regs::engine_reg(e, er::RING_WPTR), 0).map_err(pf)?;
            write_ctl(p, regs::engine_reg(e, er::CTRL), er::CTRL_ENABLE).map_err(pf)?;
            mask |= regs::irq_fence(e) | regs::irq_fault(e);
        }
        write_ctl(p, regs::IRQ_MASK, mask).map_err(pf)?;
        self.b.programmed = true;
        crate::log::log_info!(
            "refgpu gen{} rev {} up: {} queues, MMU {}, {} IB chunks of {} bytes, rings of {} bytes",
            self.b.chip.generation.number(),
            self.b.chip.revision,
            self.nq,
            self.b.mmu,
            CHUNKS,
            self.cfg.ib_chunk_bytes,
            self.cfg.ring_bytes
        );
        Ok(())
    }

    /// GPU address of `queue`'s fence slot (for WAIT_MEM in user IBs).
    pub fn fence_slot_va(&self, queue: crate::sync::QueueId) -> Option<u64> {
        self.queue(queue).map(|_| self.b.slot_va(usize::from(queue.0)))
    }
}
