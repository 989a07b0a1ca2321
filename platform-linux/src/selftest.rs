//! Bring-up checks over any direct-mode platform: copy, fill and write
//! data checked word by word, fences in order, and a cross-queue wait.
//!
//! Used by the tests of the in-process and co-simulation backends (and
//! handy after porting: run them right after `Device::new`). The
//! conformance suite (`conformance`) is the full list; these are the
//! smallest checks that prove a platform's memory, doorbells and waits
//! work.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use umd_core::config::{Config, HangConfig};
use umd_core::device::{Device, MmuMode};
use umd_core::platform::{DirectIo, DmaRegion, IrqWait, Platform, PlatformError};
use umd_core::queue::FenceStatus;
use umd_core::sync::QueueId;

/// Generous failure guard for one wait (not a performance threshold).
pub const WAIT_GUARD_NS: u64 = 20_000_000_000;

fn pattern(i: usize, seed: u32) -> u32 {
    (i as u32).wrapping_mul(0x9E37_79B1) ^ seed
}

/// Copies 8 KiB, fills 4 KiB and writes 4 dwords in one submission on
/// `queue`, waits for its fence, and checks every dword of the destination.
pub fn copy_fill_write<P: DirectIo, const C: usize>(
    dev: &mut Device<P, C>,
    queue: QueueId,
    seed: u32,
) -> Result<(), String> {
    let mut src = dev.alloc_buffer(16384).map_err(|e| format!("alloc src: {e:?}"))?;
    let mut dst = dev.alloc_buffer(16384).map_err(|e| format!("alloc dst: {e:?}"))?;
    for (i, w) in src.words_mut().iter_mut().enumerate() {
        *w = pattern(i, seed);
    }
    dst.words_mut().fill(0xDEAD_BEEF);
    dev.flush(&src);
    dev.flush(&dst);
    let (s, d) = (src.va(), dst.va());
    let fence = dev
        .submit(queue, &[], |cb| {
            cb.copy(s, d, 8192)?;
            cb.fill(d + 8192, 4096, 0xA5A5_5A5A)?;
            cb.write_data(d + 12288, &[1, 2, 3, seed])?;
            Ok(())
        })
        .map_err(|e| format!("submit: {e:?}"))?;
    dev.wait(fence, WAIT_GUARD_NS).map_err(|e| format!("wait {fence}: {e:?}"))?;
    dev.invalidate(&dst);
    for i in 0..4096 {
        let want = match i {
            0..2048 => pattern(i, seed),
            2048..3072 => 0xA5A5_5A5A,
            3072 => 1,
            3073 => 2,
            3074 => 3,
            3075 => seed,
            _ => 0xDEAD_BEEF,
        };
        let got = dst.read_u32(i).ok_or("read out of range")?;
        if got != want {
            return Err(format!(
                "queue {}: dword {i} of the destination is {got:#x}, expected {want:#x}",
                queue.0
            ));
        }
    }
    dev.free_buffer(src);
    dev.free_buffer(dst);
    Ok(())
}

/// Submits `n` WRITE_DATA submissions to `queue`, waits for the last, and
/// checks every earlier fence reads as signalled and every value landed.
pub fn fences_in_order<P: DirectIo, const C: usize>(
    dev: &mut Device<P, C>,
    queue: QueueId,
    n: u32,
) -> Result<(), String> {
    let buf = dev.alloc_buffer(4096).map_err(|e| format!("alloc: {e:?}"))?;
    let va = buf.va();
    let mut fences = Vec::new();
    for i in 0..n.min(1024) {
        let f = dev
            .submit(queue, &[], |cb| cb.write_data(va + 4 * u64::from(i), &[0x1000 + i]))
            .map_err(|e| format!("submit {i}: {e:?}"))?;
        fences.push(f);
    }
    let last = *fences.last().ok_or("no submissions")?;
    dev.wait(last, WAIT_GUARD_NS).map_err(|e| format!("wait {last}: {e:?}"))?;
    for f in &fences {
        match dev.query(*f) {
            Ok(FenceStatus::Signalled) => {}
            other => return Err(format!("fence {f} after the last one signalled: {other:?}")),
        }
    }
    dev.invalidate(&buf);
    for i in 0..n.min(1024) {
        let got = buf.read_u32(i as usize).ok_or("read out of range")?;
        if got != 0x1000 + i {
            return Err(format!("dword {i} is {got:#x}"));
        }
    }
    dev.free_buffer(buf);
    Ok(())
}

/// COPY copies a buffer to a middle buffer; GFX waits for that fence (a
/// WAIT_MEM in its ring) and copies on to the destination.
pub fn cross_queue<P: DirectIo, const C: usize>(dev: &mut Device<P, C>) -> Result<(), String> {
    let mut a = dev.alloc_buffer(4096).map_err(|e| format!("alloc: {e:?}"))?;
    let mid = dev.alloc_buffer(4096).map_err(|e| format!("alloc: {e:?}"))?;
    let dst = dev.alloc_buffer(4096).map_err(|e| format!("alloc: {e:?}"))?;
    for (i, w) in a.words_mut().iter_mut().enumerate() {
        *w = pattern(i, 0x55);
    }
    dev.flush(&a);
    let (va, vm, vd) = (a.va(), mid.va(), dst.va());
    let f1 =
        dev.submit(QueueId(2), &[], |cb| cb.copy(va, vm, 4096)).map_err(|e| format!("submit copy: {e:?}"))?;
    let f2 = dev
        .submit(QueueId(0), &[f1], |cb| cb.copy(vm, vd, 4096))
        .map_err(|e| format!("submit gfx: {e:?}"))?;
    dev.wait(f2, WAIT_GUARD_NS).map_err(|e| format!("wait {f2}: {e:?}"))?;
    dev.invalidate(&dst);
    for i in 0..1024 {
        let got = dst.read_u32(i).ok_or("read out of range")?;
        if got != pattern(i, 0x55) {
            return Err(format!("dword {i} is {got:#x}, expected {:#x}", pattern(i, 0x55)));
        }
    }
    dev.free_buffer(a);
    dev.free_buffer(mid);
    dev.free_buffer(dst);
    Ok(())
}

/// All of the above on every queue.
pub fn all<P: DirectIo, const C: usize>(dev: &mut Device<P, C>) -> Result<(), String> {
    for q in 0..3u8 {
        copy_fill_write(dev, QueueId(q), 0x100 + u32::from(q))?;
        fences_in_order(dev, QueueId(q), 40)?;
    }
    cross_queue(dev)
}

/// Forwards everything to `inner`, except that the first `wait_irq` call
/// first sets the 64-bit semaphore at `sem` (once the test armed it) to 1.
/// Work that waits for that semaphore can not complete before a fence wait
/// has gone to sleep, however the threads are scheduled.
pub struct ReleaseOnWait<P> {
    inner: P,
    sem: Option<NonNull<u64>>,
}

// SAFETY: every method forwards to `inner`, which upholds the contract;
// the wrapper hands out no memory of its own.
unsafe impl<P: Platform> Platform for ReleaseOnWait<P> {
    fn dma_alloc(&mut self, len: usize) -> Result<DmaRegion, PlatformError> {
        self.inner.dma_alloc(len)
    }
    fn dma_free(&mut self, region: DmaRegion) {
        self.inner.dma_free(region)
    }
    fn cache_clean(&mut self, region: &DmaRegion, offset: usize, len: usize) {
        self.inner.cache_clean(region, offset, len)
    }
    fn cache_invalidate(&mut self, region: &DmaRegion, offset: usize, len: usize) {
        self.inner.cache_invalidate(region, offset, len)
    }
    fn now_ns(&mut self) -> u64 {
        self.inner.now_ns()
    }
    fn delay_ns(&mut self, ns: u64) {
        self.inner.delay_ns(ns)
    }
    fn wait_irq(&mut self, timeout_ns: u64) -> IrqWait {
        if let Some(p) = self.sem.take() {
            // SAFETY: `fence_wait_sleeps_on_the_interrupt` arms `sem` with the
            // first word of a live GPU buffer (page aligned) that it frees
            // only after the wait; the device only reads it.
            unsafe { AtomicU64::from_ptr(p.as_ptr()) }.store(1, Ordering::Release);
        }
        self.inner.wait_irq(timeout_ns)
    }
}

impl<P: DirectIo> DirectIo for ReleaseOnWait<P> {
    fn read_reg(&mut self, offset: u32) -> Result<u32, PlatformError> {
        self.inner.read_reg(offset)
    }
    fn write_reg(&mut self, offset: u32, value: u32) -> Result<(), PlatformError> {
        self.inner.write_reg(offset, value)
    }
    fn doorbell(&mut self, engine: u32) -> Result<(), PlatformError> {
        self.inner.doorbell(engine)
    }
    fn control_doorbell(&mut self) -> Result<(), PlatformError> {
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
    irq_wakeups: impl Fn(&mut P) -> u64,
) -> Result<P, String> {
    let cfg =
        Config { hang: HangConfig { window_ns: 60_000_000_000, ..Config::DEFAULT.hang }, ..Config::DEFAULT };
    let mut dev: Device<ReleaseOnWait<P>> =
        Device::new(ReleaseOnWait { inner: platform, sem: None }, cfg, MmuMode::DEFAULT)
            .map_err(|(e, _)| format!("Device::new: {e}"))?;
    let mut sem = dev.alloc_buffer(4096).map_err(|e| format!("alloc: {e}"))?;
    let buf = dev.alloc_buffer(4096).map_err(|e| format!("alloc: {e}"))?;
    let (sem_va, va) = (sem.va(), buf.va());
    // An interrupt left over from bringing the device up does not count.
    let _ = dev.platform().inner.wait_irq(0);
    let before = irq_wakeups(&mut dev.platform().inner);
    let f = dev
        .submit(QueueId(2), &[], |cb| {
            cb.wait_seqno(sem_va, 1)?;
            cb.write_data(va, &[77])
        })
        .map_err(|e| format!("submit: {e}"))?;
    dev.platform().sem = NonNull::new(sem.words_mut().as_mut_ptr().cast::<u64>());
    dev.wait(f, WAIT_GUARD_NS).map_err(|e| format!("wait: {e}"))?;
    if dev.platform().sem.is_some() {
        return Err("the wait never called wait_irq".into());
    }
    if buf.read_u32(0) != Some(77) {
        return Err(format!("result {:?}, expected 77", buf.read_u32(0)));
    }
    if irq_wakeups(&mut dev.platform().inner) <= before {
        return Err("the wait never woke on an interrupt".into());
    }
    dev.free_buffer(sem);
    dev.free_buffer(buf);
    Ok(dev.shutdown().inner)
}
