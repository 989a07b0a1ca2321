//! Kernel-mediated mode: a kernel driver owns the rings, the fence slots
//! and the page tables; the core chooses GPU addresses (as libdrm's VA
//! manager does), records IBs into its pool, checks dependencies, and hands
//! each IB to the kernel with the timeline points it waits for and signals.
//!
//! Everything but the hardware access is the shared engine's
//! ([`crate::engine`]); [`KernelDevice`] is the engine over this backend.

use crate::config::Config;
use crate::engine::backend::{sealed, Backend, EmitError, EmitInfo, Failure, Gone, Job, Poll, QueueView};
use crate::engine::{Engine, InitError};
use crate::hw::{probe, ChipId};
use crate::mem::pagetable::Perms;
use crate::mem::pool::BackingError;
use crate::platform::{DmaRegion, KernelError, KernelIo, KernelSync, PlatformError};
use crate::queue::SubmitError;
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::deps::MAX_WAITS;
use crate::sync::{FenceError, Seqno, MAX_QUEUES};

/// A refgpu driven through a kernel driver, with `CHUNKS` IB chunks.
pub type KernelDevice<'d, P, const CHUNKS: usize = 16> = Engine<'d, Kernel<'d, P>, CHUNKS>;

/// The kernel-mode backend.
#[derive(Debug)]
pub struct Kernel<'d, P: KernelIo> {
    p: &'d P,
    chip: ChipId,
    nq: usize,
    /// A reset the kernel reported and the engine has not handled yet
    /// (`upto + 1`; 0: none): the kernel says it once, the engine may be
    /// busy on that queue when it hears it.
    pending_reset: [AtomicU64; MAX_QUEUES],
}

impl<P: KernelIo> sealed::Sealed for Kernel<'_, P> {}

impl<'d, P: KernelIo> Backend for Kernel<'d, P> {
    type P = P;
    type Queue = ();
    type Maps = ();
    const MODE: crate::engine::Mode = crate::engine::Mode::Kernel;

    fn platform(&self) -> &P {
        self.p
    }

    fn chip(&self) -> ChipId {
        self.chip
    }

    fn queues(&self) -> usize {
        self.nq
    }

    fn translates(&self) -> bool {
        true
    }

    fn map(&self, _: &mut (), va: u64, region: &DmaRegion, perms: Perms) -> Result<(), BackingError> {
        self.p.bind_va(va, region, region.len(), perms.write).map_err(|e| match e {
            PlatformError::DeviceLost => BackingError::DeviceLost,
            _ => BackingError::Map,
        })
    }

    fn unmap(&self, _: &mut (), va: u64, len: u64) {
        let _ = self.p.unbind_va(va, usize::try_from(len).unwrap_or(usize::MAX));
    }

    fn emit(&self, _: &mut (), job: &Job<'_>) -> Result<EmitInfo, EmitError> {
        let mut syncs = [KernelSync { engine: 0, value: 0 }; MAX_WAITS];
        let mut n = 0usize;
        for w in job.waits {
            if let Some(s) = syncs.get_mut(n) {
                *s = KernelSync { engine: u32::from(w.queue.0), value: w.seqno.0 };
                n = n.saturating_add(1);
            }
        }
        let signal = KernelSync { engine: job.queue as u32, value: job.seqno.0 };
        match self.p.submit(job.queue as u32, job.ib.0, job.ib.1, syncs.get(..n).unwrap_or(&[]), signal) {
            Ok(()) => Ok(EmitInfo::default()),
            Err(PlatformError::DeviceLost) => Err(EmitError::Lost),
            Err(e) => Err(EmitError::Refused(SubmitError::Platform(e))),
        }
    }

    fn poll(&self, q: usize) -> Poll {
        let latched = self.pending_reset.get(q).map_or(0, |r| r.load(Ordering::Acquire));
        if latched != 0 {
            return Poll::Reset { upto: Seqno(latched.wrapping_sub(1)), error: FenceError::DeviceHung };
        }
        match self.p.completed(q as u32) {
            Ok(v) => Poll::Completed(Seqno(v)),
            Err(KernelError::Reset { upto }) => {
                if let Some(r) = self.pending_reset.get(q) {
                    r.store(upto.wrapping_add(1), Ordering::Release);
                }
                Poll::Reset { upto: Seqno(upto), error: FenceError::DeviceHung }
            }
            Err(KernelError::DeviceLost) | Err(KernelError::Platform(_)) => Poll::Lost,
        }
    }

    fn ack_interrupts(&self) -> Result<bool, Gone> {
        Ok(false)
    }

    fn check(&self, _: &mut (), _: &QueueView<'_>) -> Result<Option<Failure>, Gone> {
        // The kernel watches its engines; resets arrive through `poll`.
        Ok(None)
    }

    fn reset(&self, _: &mut (), _q: usize) -> Result<(), Gone> {
        // The kernel reset the engine already.
        Ok(())
    }

    fn resume(&self, _: &mut (), q: usize, _upto: Seqno) -> Result<(), Gone> {
        // Acknowledge the reset report.
        if let Some(r) = self.pending_reset.get(q) {
            r.store(0, Ordering::Release);
        }
        Ok(())
    }

    fn stop(&self) {}

    fn release_queue(&self, _: &mut ()) {}

    fn release(&mut self, _: &mut ()) {}
}

impl<'d, P: KernelIo, const CHUNKS: usize> Engine<'d, Kernel<'d, P>, CHUNKS> {
    /// Probes the chip through the kernel and sets up the IB pool inside
    /// the VA arena `[va_base, va_base + va_size)`. The large tables live in
    /// `storage`; the device borrows it and the platform for its lifetime.
    pub fn new<const BUF: usize, const VA: usize, const SL: usize, const TR: usize>(
        p: &'d P,
        storage: &'d mut crate::storage::DeviceStorage<BUF, VA, SL, TR>,
        cfg: Config,
        va_base: u64,
        va_size: u64,
    ) -> Result<Self, InitError> {
        let chip = probe(p.chip_id().map_err(InitError::Platform)?).map_err(InitError::Probe)?;
        if cfg.ib_chunk_bytes < 1024 || cfg.ib_chunk_bytes % 256 != 0 {
            return Err(InitError::BadConfig("ib_chunk_bytes must be a multiple of 256 from 1 KiB"));
        }
        let k = Kernel {
            p,
            chip,
            nq: crate::hw::regs::ENGINES as usize,
            pending_reset: core::array::from_fn(|_| AtomicU64::new(0)),
        };
        let mut dev = Engine::assemble(k, storage, cfg, Some((va_base, va_size)), (), [(); MAX_QUEUES])?;
        dev.init_ib_pool()?;
        Ok(dev)
    }
}
