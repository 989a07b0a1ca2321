//! Bring-up checks over any direct-mode platform, without an allocator:
//! copy + fill + write-data checked word by word, fences in order, and a
//! cross-queue wait. The smallest checks that prove a platform's memory,
//! doorbells and waits work: run them right after `Device::new` when
//! porting. The bare-metal smoke image and the Linux platforms' self-test
//! both use them; the scenarios of the crate root are the full suite.

use core::fmt;

use umd_core::device::Device;
use umd_core::platform::DirectIo;
use umd_core::queue::FenceStatus;
use umd_core::sync::QueueId;

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
    /// From `submit` or `alloc_buffer`.
    Submit(umd_core::queue::SubmitError),
    /// From `wait` or `query`.
    Wait(umd_core::queue::WaitError),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{:#x} {:#x} {:#x}]", self.what, self.args[0], self.args[1], self.args[2])?;
        match self.err {
            Some(CoreErr::Submit(e)) => write!(f, ": {e:?}"),
            Some(CoreErr::Wait(e)) => write!(f, ": {e}"),
            None => Ok(()),
        }
    }
}

fn fail(what: &'static str, a: u64, b: u64, c: u64) -> Failure {
    Failure { what, args: [a, b, c], err: None }
}

fn se(what: &'static str) -> impl Fn(umd_core::queue::SubmitError) -> Failure {
    move |e| Failure { what, args: [0; 3], err: Some(CoreErr::Submit(e)) }
}

fn we(what: &'static str) -> impl Fn(umd_core::queue::WaitError) -> Failure {
    move |e| Failure { what, args: [0; 3], err: Some(CoreErr::Wait(e)) }
}

fn pattern(i: usize, seed: u32) -> u32 {
    (i as u32).wrapping_mul(0x9E37_79B1) ^ seed
}

/// Copies 8 KiB, fills 4 KiB and writes 4 dwords in one submission on
/// `queue`, waits for its fence, and checks every dword of the destination.
pub fn copy_fill_write<P: DirectIo, const C: usize>(
    dev: &mut Device<P, C>,
    queue: QueueId,
    seed: u32,
) -> Result<(), Failure> {
    let mut src = dev.alloc_buffer(16384).map_err(se("alloc src"))?;
    let mut dst = dev.alloc_buffer(16384).map_err(se("alloc dst"))?;
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
        .map_err(se("submit"))?;
    dev.wait(fence, WAIT_GUARD_NS).map_err(we("wait"))?;
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
        let got = dst.read_u32(i).ok_or(fail("read out of range", i as u64, 0, 0))?;
        if got != want {
            return Err(fail(
                "destination dword [index, got, expected] differs",
                i as u64,
                got.into(),
                want.into(),
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
) -> Result<(), Failure> {
    let n = n.min(64);
    let buf = dev.alloc_buffer(4096).map_err(se("alloc"))?;
    let va = buf.va();
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
    dev.invalidate(&buf);
    for i in 0..n {
        let got = buf.read_u32(i as usize).ok_or(fail("read out of range", i.into(), 0, 0))?;
        if got != 0x1000 + i {
            return Err(fail("dword [index, got] wrong", i.into(), got.into(), 0));
        }
    }
    dev.free_buffer(buf);
    Ok(())
}

/// COPY copies a buffer to a middle buffer; GFX waits for that fence (a
/// WAIT_MEM in its ring) and copies on to the destination.
pub fn cross_queue<P: DirectIo, const C: usize>(dev: &mut Device<P, C>) -> Result<(), Failure> {
    let mut a = dev.alloc_buffer(4096).map_err(se("alloc"))?;
    let mid = dev.alloc_buffer(4096).map_err(se("alloc"))?;
    let dst = dev.alloc_buffer(4096).map_err(se("alloc"))?;
    for (i, w) in a.words_mut().iter_mut().enumerate() {
        *w = pattern(i, 0x55);
    }
    dev.flush(&a);
    let (va, vm, vd) = (a.va(), mid.va(), dst.va());
    let f1 = dev.submit(QueueId(2), &[], |cb| cb.copy(va, vm, 4096)).map_err(se("submit copy"))?;
    let f2 = dev.submit(QueueId(0), &[f1], |cb| cb.copy(vm, vd, 4096)).map_err(se("submit gfx"))?;
    dev.wait(f2, WAIT_GUARD_NS).map_err(we("wait"))?;
    dev.invalidate(&dst);
    for i in 0..1024 {
        let got = dst.read_u32(i).ok_or(fail("read out of range", i as u64, 0, 0))?;
        if got != pattern(i, 0x55) {
            return Err(fail(
                "dword [index, got, expected] wrong",
                i as u64,
                got.into(),
                pattern(i, 0x55).into(),
            ));
        }
    }
    dev.free_buffer(a);
    dev.free_buffer(mid);
    dev.free_buffer(dst);
    Ok(())
}

/// One named check.
pub type Check<P, const C: usize> = fn(&mut Device<P, C>) -> Result<(), Failure>;

/// The smoke list: (scenario name, check).
pub fn list<P: DirectIo, const C: usize>() -> [(&'static str, Check<P, C>); 7] {
    [
        ("copy_fill_write_gfx", |d| copy_fill_write(d, QueueId(0), 0x100)),
        ("copy_fill_write_compute", |d| copy_fill_write(d, QueueId(1), 0x101)),
        ("copy_fill_write_copy", |d| copy_fill_write(d, QueueId(2), 0x102)),
        ("fences_in_order_gfx", |d| fences_in_order(d, QueueId(0), 40)),
        ("fences_in_order_compute", |d| fences_in_order(d, QueueId(1), 40)),
        ("fences_in_order_copy", |d| fences_in_order(d, QueueId(2), 40)),
        ("cross_queue", cross_queue),
    ]
}

/// Runs every check of [`list`] in order and stops at the first failure,
/// which it hands to `failed` with the check's name. True if all passed.
pub fn all<P: DirectIo, const C: usize>(
    dev: &mut Device<P, C>,
    failed: impl FnOnce(&'static str, Failure),
) -> bool {
    for (name, check) in list::<P, C>() {
        if let Err(f) = check(dev) {
            failed(name, f);
            return false;
        }
    }
    true
}
