//! A shared mapping of a file or memfd: how both sides of the ivshmem
//! binding (`docs/refgpu.md` 2.3) reach the register page, the info page
//! ([`crate::ivshmem_info`]) and the system-memory file.
//!
//! It lives here, next to the binding's layout ([`crate::ivshmem_info`])
//! and [`crate::Model::new_shared`], because this is the one crate that
//! both the co-simulation server (`refgpu-sim`) and the host side
//! (`platform-linux`'s co-simulation backend) depend on: the server must
//! not depend on the driver's crates (the model is an independent reading
//! of the spec), so the host side's copy could not be the shared one. It is
//! behind the `shm` feature so that the model stays free of OS plumbing for
//! its in-process users.
//!
//! The memory is shared with another process, so this process never forms
//! a Rust reference to its bytes: it hands out the raw base pointer (for
//! [`crate::Model::new_shared`] and DMA regions, whose contracts cover it)
//! and atomic views of single words.
//!
//! The mapping is made and removed through the C library's `mmap` and
//! `munmap`, not rustix's direct system calls: ThreadSanitizer intercepts
//! the C library's, and so learns that an unmapped range's accesses are
//! over. Without that, a range unmapped by one co-simulation test and
//! mapped again by another running in parallel kept its old access history,
//! and ThreadSanitizer reported the first test's accesses (a page-table
//! read at shutdown) racing the second's (zeroing a new DMA region) at the
//! same address in two different mappings.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

/// An access outside the mapping or misaligned (nothing was accessed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfMapping {
    /// Byte offset of the access.
    pub off: usize,
    /// Its length in bytes.
    pub len: usize,
}

impl std::fmt::Display for OutOfMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "access {:#x}+{} outside the mapping or misaligned", self.off, self.len)
    }
}

impl std::error::Error for OutOfMapping {}

/// A `MAP_SHARED` read-write mapping, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain shared memory with no thread affinity; this type only hands
// out atomics and a raw pointer whose users uphold their own contracts.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`: every access through `&Mapping` is atomic.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` from `offset`, shared, read-write.
    pub fn new(fd: impl AsFd, len: usize, offset: u64) -> io::Result<Self> {
        let offset =
            libc::off_t::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a fresh mapping at an address the kernel chooses overlaps
        // nothing Rust owns; `fd` is open for the call; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_fd().as_raw_fd(),
                offset,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { ptr, len })
    }

    /// The first byte (page aligned).
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Host address of `[off, off + size)` if in range and `size`-aligned.
    fn at(&self, off: usize, size: usize, align: usize) -> Result<*mut u8, OutOfMapping> {
        let bad = OutOfMapping { off, len: size };
        if off % align != 0 || off.checked_add(size).is_none_or(|end| end > self.len) {
            return Err(bad);
        }
        // SAFETY: `off + size <= len` (checked), inside the mapping.
        Ok(unsafe { self.ptr.as_ptr().add(off) })
    }

    /// The 32-bit word at byte `off` (4-aligned, in range).
    pub fn u32_at(&self, off: usize) -> Option<&AtomicU32> {
        let p = self.at(off, 4, 4).ok()?;
        // SAFETY: in range and 4-aligned (the mapping is page aligned); the
        // memory is only accessed atomically by this process and lives as
        // long as `self`.
        Some(unsafe { AtomicU32::from_ptr(p.cast()) })
    }

    /// The 64-bit word at byte `off` (8-aligned, in range).
    pub fn u64_at(&self, off: usize) -> Option<&AtomicU64> {
        let p = self.at(off, 8, 8).ok()?;
        // SAFETY: as in `u32_at`, 8-aligned.
        Some(unsafe { AtomicU64::from_ptr(p.cast()) })
    }

    /// Writes `data` at byte `off` with byte atomics (relaxed); nothing is
    /// written unless the whole range is inside the mapping.
    pub fn write_bytes(&self, off: usize, data: &[u8]) -> Result<(), OutOfMapping> {
        let p = self.at(off, data.len(), 1)?;
        for (i, b) in data.iter().enumerate() {
            // SAFETY: `off + i < off + data.len() <= len` (checked by `at`);
            // byte atomics need no alignment.
            unsafe { AtomicU8::from_ptr(p.add(i)) }.store(*b, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: exactly the range mmap returned; the mapping's users (a
        // model over it, DMA regions into it) are gone before its owner
        // drops it.
        let _ = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_and_bytes_in_range_only() {
        let fd = rustix::fs::memfd_create("shm-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, 8192).unwrap();
        let a = Mapping::new(&fd, 8192, 0).unwrap();
        let b = Mapping::new(&fd, 4096, 4096).unwrap();
        assert_eq!((a.len(), b.len()), (8192, 4096));
        a.u32_at(4096).unwrap().store(0x1234_5678, Ordering::Relaxed);
        assert_eq!(b.u32_at(0).unwrap().load(Ordering::Relaxed), 0x1234_5678, "same file, shared");
        a.u64_at(4104).unwrap().store(u64::MAX, Ordering::Relaxed);
        assert_eq!(b.u64_at(8).unwrap().load(Ordering::Relaxed), u64::MAX);
        assert!(a.u32_at(8190).is_none() && a.u32_at(8192).is_none() && a.u32_at(2).is_none());
        assert!(a.u64_at(8188).is_none() && a.u64_at(4).is_none() && a.u64_at(usize::MAX - 3).is_none());
        b.write_bytes(100, b"refgpu").unwrap();
        assert_eq!(a.u32_at(4196).unwrap().load(Ordering::Relaxed), u32::from_le_bytes(*b"refg"));
        assert_eq!(b.write_bytes(4094, b"xyz"), Err(OutOfMapping { off: 4094, len: 3 }));
        assert_eq!(b.u32_at(4092).unwrap().load(Ordering::Relaxed), 0, "nothing written");
    }
}
