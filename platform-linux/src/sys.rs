//! OS plumbing shared by the backends: shared mappings, eventfds, time.

use std::io;
use std::os::fd::AsFd;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};

/// A `MAP_SHARED` read-write mapping, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain shared memory with no thread affinity; every access goes
// through atomics or through `DmaRegion`s whose contract covers it.
unsafe impl Send for Mapping {}
// SAFETY: as above: `&Mapping` only hands out atomics and the base pointer.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` from `offset`, shared, read-write.
    pub fn new(fd: impl AsFd, len: usize, offset: u64) -> io::Result<Self> {
        // SAFETY: a fresh mapping at a kernel-chosen address overlaps
        // nothing Rust owns; the result is checked.
        let p = unsafe {
            mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, fd, offset)
        }?;
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { ptr, len })
    }

    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The 32-bit word at byte `off`, if 4-aligned and in range.
    pub fn u32_at(&self, off: usize) -> Option<&AtomicU32> {
        if off % 4 != 0 || off.checked_add(4)? > self.len {
            return None;
        }
        // SAFETY: in range and 4-aligned (the mapping is page aligned); the
        // memory is shared with another process and only accessed
        // atomically here; it lives as long as `self`.
        Some(unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(off).cast()) })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: exactly the range mmap returned; users of the mapping
        // (DmaRegions) must be returned before the backend is dropped.
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Adds 1 to an eventfd's counter.
pub(crate) fn eventfd_signal(fd: impl AsFd) -> io::Result<()> {
    rustix::io::write(fd, &1u64.to_ne_bytes())?;
    Ok(())
}

/// Reads and clears an eventfd's counter without blocking (0 if it was 0;
/// the fd may be blocking: callers only read after poll said readable, and
/// the read is done with a non-blocking recv-like flag via poll first).
pub(crate) fn eventfd_drain(fd: impl AsFd) -> u64 {
    let mut b = [0u8; 8];
    match rustix::io::read(fd, &mut b) {
        Ok(8) => u64::from_ne_bytes(b),
        _ => 0,
    }
}

/// CLOCK_MONOTONIC in nanoseconds.
pub(crate) fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(t.tv_nsec as u64)
}

/// Waits at least `ns`: spins below 2 µs, yields the CPU in a loop below
/// 100 µs (a sleep would overshoot by the timer slack, ~50 µs), sleeps
/// above.
pub(crate) fn delay_ns(ns: u64) {
    let start = monotonic_ns();
    if ns <= 2_000 {
        while monotonic_ns().saturating_sub(start) < ns {
            std::hint::spin_loop();
        }
    } else if ns < 100_000 {
        while monotonic_ns().saturating_sub(start) < ns {
            std::thread::yield_now();
        }
    } else {
        std::thread::sleep(Duration::from_nanos(ns));
    }
}
