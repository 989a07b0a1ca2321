//! System memory as the device sees it (`docs/refgpu.md` section 3.1).
//!
//! [`SysMem`] is the physical window `[base, base + size)`. Its bytes live
//! either in an allocation the model owns or in a raw mapping the caller
//! provides (later an `mmap` of QEMU's guest-RAM file, written concurrently
//! by another process). Because of the second case the model never forms a
//! `&[u8]` or `&mut [u8]` over the window: every access is an atomic load or
//! store through a raw pointer (`AtomicU8`/`AtomicU32`/`AtomicU64::from_ptr`),
//! which compiles to plain loads and stores on the targets we run on and is
//! sound against concurrent writers. Bulk operations use aligned 64-bit
//! atomics in the middle and byte atomics at the edges.
//!
//! All addresses here are *physical*; translation is [`crate::mmu`]'s job.
//! An access that does not lie entirely inside the window is a
//! [`OutOfWindow`] error (a BUS fault for the device, a
//! [`crate::ModelError::OutOfRange`] for the host helpers).

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

use crate::ModelError;

/// A physical access outside the window; carries the first address outside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfWindow(pub u64);

enum Backing {
    /// Owned, zero-initialised allocation (`u64`s so the base is 8-aligned).
    /// Freed in `Drop` from the raw pointer.
    Owned { words: usize },
    /// Caller-provided mapping.
    Shared,
}

/// The system-memory window.
pub struct SysMem {
    base: u64,
    size: u64,
    ptr: NonNull<u8>,
    backing: Backing,
}

// SAFETY: all accesses through `ptr` are atomic; the owned allocation is
// freed only in `Drop` (exclusive access), and a shared mapping's validity is
// the contract of `SysMem::from_raw`.
unsafe impl Send for SysMem {}
// SAFETY: as for `Send`: every access is atomic.
unsafe impl Sync for SysMem {}

impl Drop for SysMem {
    fn drop(&mut self) {
        if let Backing::Owned { words } = self.backing {
            let slice = core::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr().cast::<u64>(), words);
            // SAFETY: `ptr`/`words` came from `Box::into_raw` of a
            // `Box<[u64]>` of `words` elements in `new_owned`, and this is
            // the only place that frees it; `&mut self` means no access is in
            // flight.
            drop(unsafe { Box::from_raw(slice) });
        }
    }
}

impl SysMem {
    fn check_geometry(base: u64, size: u64) -> Result<(), ModelError> {
        if size == 0 || size % 8 != 0 || base % 8 != 0 {
            return Err(ModelError::Config("mem_base and mem_size must be multiples of 8, size > 0"));
        }
        if base.checked_add(size).is_none_or(|end| end > 1 << 48) {
            return Err(ModelError::Config("the memory window must end at or below 2^48"));
        }
        if usize::try_from(size).is_err() {
            return Err(ModelError::Config("mem_size does not fit the host address space"));
        }
        Ok(())
    }

    /// A zeroed window owned by the model.
    pub fn new_owned(base: u64, size: u64) -> Result<Self, ModelError> {
        Self::check_geometry(base, size)?;
        let words = (size / 8) as usize;
        // `vec![0; n]` uses a zeroing allocation: large windows cost nothing
        // until touched.
        let b: Box<[u64]> = vec![0u64; words].into_boxed_slice();
        let raw = Box::into_raw(b);
        let ptr = NonNull::new(raw.cast::<u8>()).ok_or(ModelError::Config("allocation failed"))?;
        Ok(Self { base, size, ptr, backing: Backing::Owned { words } })
    }

    /// A window over a caller-provided mapping of `size` bytes whose first
    /// byte is physical address `base`.
    ///
    /// # Safety
    ///
    /// `ptr` must be 8-byte aligned and valid for reads and writes of `size`
    /// bytes for the lifetime of the returned value. Other threads or
    /// processes may read and write the memory concurrently; within this
    /// process they must use atomic accesses only.
    pub unsafe fn from_raw(base: u64, size: u64, ptr: NonNull<u8>) -> Result<Self, ModelError> {
        Self::check_geometry(base, size)?;
        if ptr.as_ptr() as usize % 8 != 0 {
            return Err(ModelError::Config("the memory mapping must be 8-byte aligned"));
        }
        Ok(Self { base, size, ptr, backing: Backing::Shared })
    }

    /// First physical address of the window.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Size of the window in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Host address of the window's first byte (physical address `base`).
    /// Obtaining it is safe; every access through it must follow
    /// [`crate::Model::mem_host_ptr`]'s contract.
    pub(crate) fn host_base(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Whether `[pa, pa + len)` lies in the window.
    pub fn contains(&self, pa: u64, len: u64) -> bool {
        pa >= self.base && pa.checked_add(len).is_some_and(|end| end <= self.base + self.size)
    }

    /// Bytes from `pa` to the end of the window (0 if `pa` is outside).
    pub fn extent(&self, pa: u64) -> u64 {
        if pa >= self.base && pa < self.base + self.size {
            self.base + self.size - pa
        } else {
            0
        }
    }

    /// Host pointer of `[pa, pa + len)`, checked.
    fn host(&self, pa: u64, len: u64) -> Result<*mut u8, OutOfWindow> {
        if !self.contains(pa, len) {
            let first_bad = if pa < self.base { pa } else { pa.max(self.base + self.size) };
            return Err(OutOfWindow(first_bad));
        }
        // SAFETY: `pa - base < size` (checked just above), so the offset
        // stays inside the allocation/mapping of `size` bytes, which fits in
        // `usize` (checked in `check_geometry`).
        Ok(unsafe { self.ptr.as_ptr().add((pa - self.base) as usize) })
    }

    /// The dword containing `pa` (rounded down to 4-byte alignment).
    fn u32_at(&self, pa: u64) -> Result<&AtomicU32, OutOfWindow> {
        let p = self.host(pa & !3, 4)?;
        // SAFETY: `p` points at 4 bytes inside the window (checked by
        // `host`), 4-aligned because the mapping base is 8-aligned, `base`
        // is a multiple of 8 and the address was rounded down to a multiple
        // of 4. The memory is only accessed atomically.
        Ok(unsafe { AtomicU32::from_ptr(p.cast::<u32>()) })
    }

    /// The 64-bit word containing `pa` (rounded down to 8-byte alignment).
    fn u64_at(&self, pa: u64) -> Result<&AtomicU64, OutOfWindow> {
        let p = self.host(pa & !7, 8)?;
        // SAFETY: as in `u32_at`, with 8-byte size and alignment (the
        // address was rounded down to a multiple of 8).
        Ok(unsafe { AtomicU64::from_ptr(p.cast::<u64>()) })
    }

    fn u8_at(&self, pa: u64) -> Result<&AtomicU8, OutOfWindow> {
        let p = self.host(pa, 1)?;
        // SAFETY: `p` points at a byte inside the window; `AtomicU8` has
        // alignment 1; the memory is only accessed atomically.
        Ok(unsafe { AtomicU8::from_ptr(p) })
    }

    /// Reads the dword at 4-aligned `pa`. A misaligned `pa` is rounded down
    /// (as in every dword/qword accessor here).
    pub fn read_u32(&self, pa: u64) -> Result<u32, OutOfWindow> {
        Ok(self.u32_at(pa)?.load(Ordering::Acquire))
    }

    /// Writes the dword at 4-aligned `pa` (relaxed).
    pub fn write_u32(&self, pa: u64, v: u32) -> Result<(), OutOfWindow> {
        self.u32_at(pa & !3)?.store(v, Ordering::Relaxed);
        Ok(())
    }

    /// Reads the 64-bit value at 8-aligned `pa` with acquire ordering.
    pub fn read_u64(&self, pa: u64) -> Result<u64, OutOfWindow> {
        Ok(self.u64_at(pa & !7)?.load(Ordering::Acquire))
    }

    /// Writes the 64-bit value at 8-aligned `pa` with the given ordering
    /// (`Release` for FENCE).
    pub fn write_u64(&self, pa: u64, v: u64, order: Ordering) -> Result<(), OutOfWindow> {
        let order =
            if order == Ordering::Acquire || order == Ordering::AcqRel { Ordering::Release } else { order };
        self.u64_at(pa & !7)?.store(v, order);
        Ok(())
    }

    /// Reads `out.len()` dwords starting at 4-aligned `pa`.
    pub fn read_u32s(&self, pa: u64, out: &mut [u32]) -> Result<(), OutOfWindow> {
        self.host(pa & !3, out.len() as u64 * 4)?;
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.u32_at((pa & !3) + 4 * i as u64)?.load(Ordering::Relaxed);
        }
        Ok(())
    }

    /// Writes dwords starting at 4-aligned `pa`.
    pub fn write_u32s(&self, pa: u64, data: &[u32]) -> Result<(), OutOfWindow> {
        self.host(pa & !3, data.len() as u64 * 4)?;
        for (i, d) in data.iter().enumerate() {
            self.u32_at((pa & !3) + 4 * i as u64)?.store(*d, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Reads bytes at any alignment.
    pub fn read_bytes(&self, pa: u64, out: &mut [u8]) -> Result<(), OutOfWindow> {
        let len = out.len() as u64;
        self.host(pa, len)?;
        let mut i = 0usize;
        while i < out.len() {
            let a = pa + i as u64;
            if a % 8 == 0 && out.len() - i >= 8 {
                let v = self.u64_at(a)?.load(Ordering::Relaxed);
                out[i..i + 8].copy_from_slice(&v.to_le_bytes());
                i += 8;
            } else {
                out[i] = self.u8_at(a)?.load(Ordering::Relaxed);
                i += 1;
            }
        }
        Ok(())
    }

    /// Writes bytes at any alignment (relaxed).
    pub fn write_bytes(&self, pa: u64, data: &[u8]) -> Result<(), OutOfWindow> {
        self.host(pa, data.len() as u64)?;
        let mut i = 0usize;
        while i < data.len() {
            let a = pa + i as u64;
            if a % 8 == 0 && data.len() - i >= 8 {
                let mut w = [0u8; 8];
                w.copy_from_slice(&data[i..i + 8]);
                self.u64_at(a)?.store(u64::from_le_bytes(w), Ordering::Relaxed);
                i += 8;
            } else {
                self.u8_at(a)?.store(data[i], Ordering::Relaxed);
                i += 1;
            }
        }
        Ok(())
    }

    /// Fills `len` bytes at 4-aligned `pa` (`len` a multiple of 4) with the
    /// dword `value`.
    pub fn fill_u32(&self, pa: u64, len: u64, value: u32) -> Result<(), OutOfWindow> {
        self.host(pa, len)?;
        let wide = u64::from(value) | (u64::from(value) << 32);
        let end = pa + len;
        let mut a = pa;
        while a < end {
            if a % 8 == 0 && end - a >= 8 {
                self.u64_at(a)?.store(wide, Ordering::Relaxed);
                a += 8;
            } else {
                self.u32_at(a)?.store(value, Ordering::Relaxed);
                a += 4;
            }
        }
        Ok(())
    }
}

/// Process-wide fence used by BARRIER WAIT_IDLE: makes every earlier write
/// of this thread visible before any later one.
pub fn full_fence() {
    core::sync::atomic::fence(Ordering::SeqCst);
}
