//! In-process platform: a [`refgpu_model::Model`] in this process behind
//! [`Platform`] + [`DirectIo`], for host tests without a server.
//!
//! Register calls go straight to [`Model::read_reg`] / [`Model::write_reg`]
//! (the in-process semantics of `docs/refgpu.md` 2.3: side effects act
//! before the call returns, so `control_doorbell` has nothing to do);
//! `doorbell(e)` writes engine `e`'s DOORBELL register. The model delivers
//! interrupt vectors to an [`IrqSink`] that counts them under a mutex;
//! `wait_irq` sleeps on the paired condition variable. DMA memory is carved
//! in 4 KiB pages out of the model's own system-memory window
//! ([`Model::mem_host_ptr`]).

use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use refgpu_model::{regs as mregs, IrqSink, Model, ModelConfig, ModelError};
use std::sync::atomic::{AtomicU64, Ordering};

use umd_core::platform::{DirectIo, DmaFlags, DmaRegion, IrqWait, Platform, PlatformError};

use crate::heap::{PageHeap, PAGE};
use crate::sys;

/// Interrupts raised and not yet consumed by `wait_irq`.
#[derive(Default)]
struct IrqLatch {
    pending: Mutex<u64>,
    cv: Condvar,
}

impl IrqSink for IrqLatch {
    fn raise(&self, _vector: u32) {
        *self.pending.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.cv.notify_all();
    }
}

/// The in-process platform.
pub struct InProcess {
    model: Arc<Model>,
    irq: Arc<IrqLatch>,
    heap: Mutex<PageHeap>,
    base: NonNull<u8>,
    mem_base: u64,
    irq_wakeups: AtomicU64,
}

impl std::fmt::Debug for InProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcess").field("mem_base", &self.mem_base).field("heap", &self.heap).finish()
    }
}

// SAFETY: the raw base pointer points into memory owned by `model`, which
// is Send + Sync and only accessed atomically by the model's threads.
unsafe impl Send for InProcess {}
// SAFETY: as above; every `&self` method locks what it mutates (the page
// heap) or is an atomic/model call.
unsafe impl Sync for InProcess {}

impl InProcess {
    /// A model with `cfg` (its memory window must be 4 KiB aligned).
    pub fn new(cfg: ModelConfig) -> Result<Self, ModelError> {
        if cfg.mem_base % PAGE as u64 != 0 || cfg.mem_size % PAGE as u64 != 0 {
            return Err(ModelError::Config("the in-process platform needs a 4 KiB aligned window"));
        }
        let irq = Arc::new(IrqLatch::default());
        let sink: Arc<dyn IrqSink> = irq.clone();
        let model = Arc::new(Model::with_irq_sink(cfg, sink)?);
        let pages = (model.mem_size() / PAGE as u64) as usize;
        Ok(Self {
            base: model.mem_host_ptr(),
            mem_base: model.mem_base(),
            model,
            irq,
            heap: Mutex::new(PageHeap::new(pages)),
            irq_wakeups: AtomicU64::new(0),
        })
    }

    /// The model (fault injection, snapshots, memory helpers).
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Pages (4 KiB) in use by DMA allocations.
    pub fn dma_pages_used(&self) -> usize {
        self.heap.lock().unwrap_or_else(|p| p.into_inner()).used_pages()
    }

    /// How many times `wait_irq` woke up on an interrupt.
    pub fn irq_wakeups(&self) -> u64 {
        self.irq_wakeups.load(Ordering::Relaxed)
    }
}

// SAFETY: regions are distinct page runs of the model's owned window (the
// heap never hands a page out twice), zeroed, valid while the model (held
// by `self`) lives, and the device reaches them at `mem_base + offset`
// (physical addresses). `now_ns` is CLOCK_MONOTONIC.
unsafe impl Platform for InProcess {
    type RawMutex = umd_core::platform::SpinLock;

    fn dma_alloc(&self, len: usize, _flags: DmaFlags) -> Result<DmaRegion, PlatformError> {
        let len = len.max(1).checked_next_multiple_of(PAGE).ok_or(PlatformError::OutOfMemory { len })?;
        let first = self
            .heap
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .alloc(len / PAGE)
            .ok_or(PlatformError::OutOfMemory { len })?;
        let off = first * PAGE;
        let pa = self.mem_base + off as u64;
        // Zero through the model (atomic writes; no queued command can
        // touch pages that were free).
        self.model.write_mem(pa, &vec![0u8; len]).map_err(|_| PlatformError::OutOfMemory { len })?;
        // SAFETY: `off + len` lies within the model's window of
        // `mem_size` bytes (the heap covers exactly that many pages).
        let cpu = unsafe { NonNull::new_unchecked(self.base.as_ptr().add(off)) };
        // SAFETY: see the impl-level comment.
        Ok(unsafe { DmaRegion::new(cpu, pa, len) })
    }

    fn dma_free(&self, region: DmaRegion) {
        let off = region.dev_addr().wrapping_sub(self.mem_base) as usize;
        let mut heap = self.heap.lock().unwrap_or_else(|p| p.into_inner());
        if off % PAGE == 0 && off < heap.total_pages() * PAGE {
            heap.free(off / PAGE, region.len().div_ceil(PAGE));
        }
    }

    fn now_ns(&self) -> u64 {
        sys::monotonic_ns()
    }

    fn delay_ns(&self, ns: u64) {
        sys::delay_ns(ns);
    }

    fn wait_irq(&self, timeout_ns: u64) -> IrqWait {
        let deadline = Instant::now() + Duration::from_nanos(timeout_ns);
        let mut pending = self.irq.pending.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if *pending > 0 {
                *pending = 0;
                self.irq_wakeups.fetch_add(1, Ordering::Relaxed);
                return IrqWait::Interrupt;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return IrqWait::TimedOut;
            }
            pending = self.irq.cv.wait_timeout(pending, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

impl DirectIo for InProcess {
    fn read_reg(&self, offset: u32) -> Result<u32, PlatformError> {
        Ok(self.model.read_reg(offset))
    }

    fn write_reg(&self, offset: u32, value: u32) -> Result<(), PlatformError> {
        self.model.write_reg(offset, value);
        Ok(())
    }

    fn doorbell(&self, engine: u32) -> Result<(), PlatformError> {
        if engine as usize >= mregs::NUM_ENGINES {
            return Err(PlatformError::Unsupported);
        }
        self.model.write_reg(mregs::engine_base(engine as usize) + mregs::eng::DOORBELL, 1);
        Ok(())
    }
}
