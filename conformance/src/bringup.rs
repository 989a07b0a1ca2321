//! Bring-up checks over any platform, without an allocator:
//! copy + fill + write-data checked word by word, fences in order, and a
//! cross-queue wait. The smallest checks that prove a platform's memory,
//! doorbells and waits work: run them right after `Device::new` when
//! porting. The bare-metal smoke image and the Linux platforms' self-test
//! both use them; the scenarios of the crate root are the full suite.

use core::fmt;

use umd_core::engine::{Backend, DeviceCore};
use umd_core::error::FenceStatus;
use umd_core::mem::BufferHandle;
use umd_core::sync::QueueId;

use crate::io::{first_mismatch, write_words};

/// Generous failure guard for one wait (not a performance threshold).
pub const WAIT_GUARD_NS: u64 = 20_000_000_000;

/// Why a check failed: a static description and up to three numbers.
#[derive(Clone, Copy, Debug)]
pub struct Failure {
    /// What went wrong.
    pub what: &'static str,
    /// Details (meaning given by `what`).
    pub args: [u64; 3],
    /// The error from the core, printed with `{:?}`, when there is one.
    pub err: Option<CoreErr>,
}

/// Errors from the core that a check can fail with.
#[derive(Clone, Copy, Debug)]
pub enum CoreErr {
    /// A submission was refused.
    Submit(umd_core::error::SubmitError),
    /// A wait failed.
    Wait(umd_core::error::WaitError),
    /// An allocation failed.
    Alloc(umd_core::mem::AllocError),
    /// A buffer call failed.
    Buffer(umd_core::mem::BufferError),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{:#x} {:#x} {:#x}]", self.what, self.args[0], self.args[1], self.args[2])?;
        match self.err {
            Some(CoreErr::Submit(e)) => write!(f, ": {e:?}"),
            Some(CoreErr::Wait(e)) => write!(f, ": {e}"),
            Some(CoreErr::Alloc(e)) => write!(f, ": {e}"),
            Some(CoreErr::Buffer(e)) => write!(f, ": {e}"),
            None => Ok(()),
        }
    }
}

fn fail(what: &'static str, a: u64, b: u64, c: u64) -> Failure {
    Failure { what, args: [a, b, c], err: None }
}

fn se(what: &'static str) -> impl Fn(umd_core::error::SubmitError) -> Failure {
    move |e| Failure { what, args: [0; 3], err: Some(CoreErr::Submit(e)) }
}

fn we(what: &'static str) -> impl Fn(umd_core::error::WaitError) -> Failure {
    move |e| Failure { what, args: [0; 3], err: Some(CoreErr::Wait(e)) }
}

fn ae(what: &'static str) -> impl Fn(umd_core::mem::AllocError) -> Failure {
    move |e| Failure { what, args: [0; 3], err: Some(CoreErr::Alloc(e)) }
}

fn be(what: &'static str) -> impl Fn(umd_core::mem::BufferError) -> Failure {
    move |e| Failure { what, args: [0; 3], err: Some(CoreErr::Buffer(e)) }
}

fn alloc<B: Backend, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    len: u64,
) -> Result<(BufferHandle, u64), Failure> {
    let h = dev.alloc_buffer(len).map_err(ae("alloc"))?;
    let va = dev.va(h).map_err(be("va"))?;
    Ok((h, va))
}

fn check_words<B: Backend, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    h: BufferHandle,
    n: usize,
    want: impl Fn(usize) -> u32,
) -> Result<(), Failure> {
    match first_mismatch(dev, h, n, want).map_err(be("read"))? {
        None => Ok(()),
        Some((i, got, want)) => {
            Err(fail("dword [index, got, expected] differs", i as u64, got.into(), want.into()))
        }
    }
}

fn pattern(i: usize, seed: u32) -> u32 {
    (i as u32).wrapping_mul(0x9E37_79B1) ^ seed
}

/// Copy, fill and write-data on `queue`, every destination dword checked.
pub fn copy_fill_write<B: Backend, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    queue: QueueId,
    seed: u32,
) -> Result<(), Failure> {
    let (src, s) = alloc(dev, 16384)?;
    let (dst, d) = alloc(dev, 16384)?;
    write_words(dev, src, 4096, |i| pattern(i, seed)).map_err(be("write src"))?;
    write_words(dev, dst, 4096, |_| 0xDEAD_BEEF).map_err(be("write dst"))?;
    let fence = dev
        .submit(queue, &[], |cb| {
            cb.copy(s, d, 8192)?;
            cb.fill(d + 8192, 4096, 0xA5A5_5A5A)?;
            cb.write_data(d + 12288, &[1, 2, 3, seed])?;
            Ok(())
        })
        .map_err(se("submit"))?;
    dev.wait(fence, WAIT_GUARD_NS).map_err(we("wait"))?;
    check_words(dev, dst, 4096, |i| match i {
        0..2048 => pattern(i, seed),
        2048..3072 => 0xA5A5_5A5A,
        3072 => 1,
        3073 => 2,
        3074 => 3,
        3075 => seed,
        _ => 0xDEAD_BEEF,
    })?;
    dev.free(src).map_err(be("free"))?;
    dev.free(dst).map_err(be("free"))?;
    Ok(())
}

/// `n` (at most 64) write-data submissions on `queue`: every fence is
/// signalled once the last one is, and every write landed.
pub fn fences_in_order<B: Backend, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    queue: QueueId,
    n: u32,
) -> Result<(), Failure> {
    let n = n.min(64);
    let (buf, va) = alloc(dev, 4096)?;
    let mut fences = [None; 64];
    for i in 0..n {
        let f = dev
            .submit(queue, &[], |cb| cb.write_data(va + 4 * u64::from(i), &[0x1000 + i]))
            .map_err(se("submit"))?;
        fences[i as usize] = Some(f);
    }
    let last = fences.iter().flatten().last().copied().ok_or(fail("no submissions", 0, 0, 0))?;
    dev.wait(last, WAIT_GUARD_NS).map_err(we("wait for the last fence"))?;
    for (i, f) in fences.iter().flatten().enumerate() {
        match dev.query(*f) {
            Ok(FenceStatus::Signalled) => {}
            Ok(_) => return Err(fail("fence [index] not signalled after the last one", i as u64, 0, 0)),
            Err(e) => return Err(we("query")(e)),
        }
    }
    check_words(dev, buf, n as usize, |i| 0x1000 + i as u32)?;
    dev.free(buf).map_err(be("free"))?;
    Ok(())
}

/// COPY copies a buffer to a middle buffer; GFX waits for that fence (a
/// WAIT_MEM in its ring, or a kernel sync point) and copies on to the
/// destination.
pub fn cross_queue<B: Backend, const C: usize>(dev: &DeviceCore<'_, B, C>) -> Result<(), Failure> {
    let (a, va) = alloc(dev, 4096)?;
    let (mid, vm) = alloc(dev, 4096)?;
    let (dst, vd) = alloc(dev, 4096)?;
    write_words(dev, a, 1024, |i| pattern(i, 0x55)).map_err(be("write"))?;
    let f1 = dev.submit(QueueId::COPY, &[], |cb| cb.copy(va, vm, 4096)).map_err(se("submit copy"))?;
    let f2 = dev.submit(QueueId::GFX, &[f1], |cb| cb.copy(vm, vd, 4096)).map_err(se("submit gfx"))?;
    dev.wait(f2, WAIT_GUARD_NS).map_err(we("wait"))?;
    check_words(dev, dst, 1024, |i| pattern(i, 0x55))?;
    for h in [a, mid, dst] {
        dev.free(h).map_err(be("free"))?;
    }
    Ok(())
}

/// One named check.
pub type Check<B, const C: usize> = fn(&DeviceCore<'_, B, C>) -> Result<(), Failure>;

/// The smoke list: (scenario name, check).
pub fn list<B: Backend, const C: usize>() -> [(&'static str, Check<B, C>); 7] {
    [
        ("copy_fill_write_gfx", |d| copy_fill_write(d, QueueId::GFX, 0x100)),
        ("copy_fill_write_compute", |d| copy_fill_write(d, QueueId::COMPUTE, 0x101)),
        ("copy_fill_write_copy", |d| copy_fill_write(d, QueueId::COPY, 0x102)),
        ("fences_in_order_gfx", |d| fences_in_order(d, QueueId::GFX, 40)),
        ("fences_in_order_compute", |d| fences_in_order(d, QueueId::COMPUTE, 40)),
        ("fences_in_order_copy", |d| fences_in_order(d, QueueId::COPY, 40)),
        ("cross_queue", cross_queue),
    ]
}

/// Runs every check of [`list`] in order and stops at the first failure,
/// which it hands to `failed` with the check's name. True if all passed.
pub fn all<B: Backend, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    failed: impl FnOnce(&'static str, Failure),
) -> bool {
    for (name, check) in list::<B, C>() {
        if let Err(f) = check(dev) {
            failed(name, f);
            return false;
        }
    }
    true
}
