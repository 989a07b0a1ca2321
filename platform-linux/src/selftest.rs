//! Bring-up checks over any direct-mode platform: copy, fill and write
//! data checked word by word, fences in order, and a cross-queue wait.
//!
//! Used by the tests of the in-process and co-simulation backends (and
//! handy after porting: run them right after `Device::new`). The
//! conformance suite (`conformance`) is the full list; these are the
//! smallest checks that prove a platform's memory, doorbells and waits
//! work.

use umd_core::device::Device;
use umd_core::platform::DirectIo;
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
