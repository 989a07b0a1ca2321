//! Bring-up checks over any direct-mode platform: the `no_std` checks of
//! `conformance::bringup` (copy/fill/write, fences in order, a cross-queue
//! wait), re-exported with a `String` summary, and a `std`-only check of
//! the interrupt path ([`fence_wait_sleeps_on_the_interrupt`]).
//!
//! Used by the tests of the in-process and co-simulation backends (and
//! handy after porting: run them right after `Device::new`).

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use umd_core::config::{Config, HangConfig};
use umd_core::direct::{Device, MmuMode};
use umd_core::engine::{Backend, DeviceCore};
use umd_core::platform::{DirectIo, DmaFlags, DmaRegion, IrqWait, Platform, PlatformError};
use umd_core::storage::DeviceStorage;
use umd_core::sync::QueueId;

pub use conformance::bringup::{copy_fill_write, cross_queue, fences_in_order, Failure, WAIT_GUARD_NS};

/// Every bring-up check (`conformance::bringup`) on every queue; the first
/// failure as text.
pub fn all<B: Backend, const C: usize>(dev: &DeviceCore<'_, B, C>) -> Result<(), String> {
    let mut msg = None;
    if conformance::bringup::all(dev, |name, f| msg = Some(format!("{name}: {f}"))) {
        Ok(())
    } else {
        Err(msg.unwrap_or_default())
    }
}

/// Forwards everything to `inner`, except that the first `wait_irq` call
/// first sets the 64-bit semaphore at `sem` (once the test armed it) to 1.
/// Work that waits for that semaphore can not complete before a fence wait
/// has gone to sleep, however the threads are scheduled.
pub struct ReleaseOnWait<P> {
    inner: P,
    sem: AtomicPtr<u64>,
}

// SAFETY: every method forwards to `inner`, which upholds the contract;
// the wrapper hands out no memory of its own.
unsafe impl<P: Platform> Platform for ReleaseOnWait<P> {
    type RawMutex = P::RawMutex;
    fn dma_alloc(&self, len: usize, flags: DmaFlags) -> Result<DmaRegion, PlatformError> {
        self.inner.dma_alloc(len, flags)
    }
    fn dma_free(&self, region: DmaRegion) {
        self.inner.dma_free(region)
    }
    fn cache_clean(&self, region: &DmaRegion, offset: usize, len: usize) {
        self.inner.cache_clean(region, offset, len)
    }
    fn cache_invalidate(&self, region: &DmaRegion, offset: usize, len: usize) {
        self.inner.cache_invalidate(region, offset, len)
    }
    fn now_ns(&self) -> u64 {
        self.inner.now_ns()
    }
    fn delay_ns(&self, ns: u64) {
        self.inner.delay_ns(ns)
    }
    fn wait_irq(&self, timeout_ns: u64) -> IrqWait {
        let p = self.sem.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !p.is_null() {
            // SAFETY: `fence_wait_sleeps_on_the_interrupt` arms `sem` with the
            // first word of a live buffer's CPU mapping (a pool slot, at
            // least 128-byte aligned) that it frees only after the wait; the
            // device only reads it.
            unsafe { AtomicU64::from_ptr(p) }.store(1, Ordering::Release);
        }
        self.inner.wait_irq(timeout_ns)
    }
}

impl<P: DirectIo> DirectIo for ReleaseOnWait<P> {
    fn read_reg(&self, offset: u32) -> Result<u32, PlatformError> {
        self.inner.read_reg(offset)
    }
    fn write_reg(&self, offset: u32, value: u32) -> Result<(), PlatformError> {
        self.inner.write_reg(offset, value)
    }
    fn doorbell(&self, engine: u32) -> Result<(), PlatformError> {
        self.inner.doorbell(engine)
    }
    fn control_doorbell(&self) -> Result<(), PlatformError> {
        self.inner.control_doorbell()
    }
}

/// Checks a platform's interrupt path: a fence wait must sleep in
/// `wait_irq` and be woken by the fence interrupt. The job first waits for
/// a semaphore that [`ReleaseOnWait`] sets only when the wait calls
/// `wait_irq`, so the fence can not land during the wait's initial spin
/// however the threads are scheduled; a long hang window makes each
/// `wait_irq` long (a quarter of it), so a slow device can not make the
/// wait time out and then find the fence by polling. `irq_wakeups` reads
/// the platform's count of interrupt wake-ups. Returns the platform.
pub fn fence_wait_sleeps_on_the_interrupt<P: DirectIo>(
    platform: P,
    irq_wakeups: impl Fn(&P) -> u64,
) -> Result<P, String> {
    let cfg =
        Config { hang: HangConfig { window_ns: 60_000_000_000, ..Config::DEFAULT.hang }, ..Config::DEFAULT };
    let wrapped = ReleaseOnWait { inner: platform, sem: AtomicPtr::new(std::ptr::null_mut()) };
    let mut storage: Box<DeviceStorage> = Box::default();
    {
        let dev: Device<'_, ReleaseOnWait<P>> = Device::new(&wrapped, &mut storage, cfg, MmuMode::DEFAULT)
            .map_err(|e| format!("Device::new: {e}"))?;
        check_interrupt_wait(&dev, &wrapped, &irq_wakeups)?;
    }
    Ok(wrapped.inner)
}

fn check_interrupt_wait<P: DirectIo>(
    dev: &Device<'_, ReleaseOnWait<P>>,
    wrapped: &ReleaseOnWait<P>,
    irq_wakeups: &impl Fn(&P) -> u64,
) -> Result<(), String> {
    let sem = dev.alloc_buffer(4096).map_err(|e| format!("alloc: {e}"))?;
    let buf = dev.alloc_buffer(4096).map_err(|e| format!("alloc: {e}"))?;
    let (sem_va, va) = (dev.va(sem).map_err(|e| e.to_string())?, dev.va(buf).map_err(|e| e.to_string())?);
    // An interrupt left over from bringing the device up does not count.
    let _ = wrapped.inner.wait_irq(0);
    let before = irq_wakeups(&wrapped.inner);
    let f = dev
        .submit(QueueId::COPY, &[], |cb| {
            cb.wait_seqno(sem_va, 1)?;
            cb.write_data(va, &[77])
        })
        .map_err(|e| format!("submit: {e}"))?;
    {
        let mut m = dev.map(sem).map_err(|e| format!("map: {e}"))?;
        wrapped.sem.store(m.words_mut().as_mut_ptr().cast::<u64>(), Ordering::Release);
        // Dropping the mapping cleans it: the semaphore still reads 0 for
        // the GPU until `wait_irq` sets it through the pointer.
    }
    dev.wait(f, WAIT_GUARD_NS).map_err(|e| format!("wait: {e}"))?;
    if !wrapped.sem.load(Ordering::Acquire).is_null() {
        return Err("the wait never called wait_irq".into());
    }
    let got = dev.read_u32(buf, 0).map_err(|e| e.to_string())?;
    if got != 77 {
        return Err(format!("result {got:#x}, expected 77"));
    }
    if irq_wakeups(&wrapped.inner) <= before {
        return Err("the wait never woke on an interrupt".into());
    }
    dev.free(sem).map_err(|e| e.to_string())?;
    dev.free(buf).map_err(|e| e.to_string())?;
    Ok(())
}
