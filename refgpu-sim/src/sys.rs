//! OS plumbing: shared mappings, eventfds, signals.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use rustix::event::{eventfd, EventfdFlags};
use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};

/// A `MAP_SHARED` read-write mapping, unmapped on drop. Accessed only
/// through raw pointers and atomics (another process writes it too).
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory with no thread affinity; all
// accesses go through atomics or raw pointers whose users uphold their own
// contracts.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` from `offset`, shared, read-write.
    pub fn new(fd: impl AsFd, len: usize, offset: u64) -> io::Result<Self> {
        // SAFETY: a fresh mapping at an address the kernel chooses cannot
        // overlap anything Rust owns; the result is checked below.
        let p = unsafe {
            mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, fd, offset)
        }?;
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { ptr, len })
    }

    /// First byte.
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    fn check(&self, off: usize, size: usize) -> *mut u8 {
        assert!(off % size == 0 && off + size <= self.len, "mapping access {off:#x}+{size} out of range");
        // SAFETY: in range (asserted).
        unsafe { self.ptr.as_ptr().add(off) }
    }

    /// The 32-bit word at `off` (4-aligned, in range; panics otherwise).
    pub fn u32_at(&self, off: usize) -> &AtomicU32 {
        let p = self.check(off, 4);
        // SAFETY: in range and 4-aligned (the mapping is page aligned);
        // shared memory is only accessed atomically by this process.
        unsafe { AtomicU32::from_ptr(p.cast()) }
    }

    /// The 64-bit word at `off` (8-aligned, in range; panics otherwise).
    pub fn u64_at(&self, off: usize) -> &AtomicU64 {
        let p = self.check(off, 8);
        // SAFETY: as in `u32_at`, 8-aligned.
        unsafe { AtomicU64::from_ptr(p.cast()) }
    }

    /// Writes bytes at `off` (byte atomics; used once for the info page).
    pub fn write_bytes(&self, off: usize, data: &[u8]) {
        for (i, b) in data.iter().enumerate() {
            let p = self.check(off + i, 1);
            // SAFETY: in range; byte atomics need no alignment.
            unsafe { std::sync::atomic::AtomicU8::from_ptr(p) }.store(*b, Ordering::Relaxed);
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; the mapping's
        // users (the model) are gone before the owner drops it.
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A new non-blocking, close-on-exec eventfd (as QEMU's event notifiers).
pub fn new_eventfd() -> io::Result<OwnedFd> {
    Ok(eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?)
}

/// Adds 1 to an eventfd's counter.
pub fn eventfd_signal(fd: impl AsFd) -> io::Result<()> {
    rustix::io::write(fd, &1u64.to_ne_bytes())?;
    Ok(())
}

/// Reads and clears a non-blocking eventfd's counter (0 if it was 0).
pub fn eventfd_drain(fd: impl AsFd) -> u64 {
    let mut b = [0u8; 8];
    match rustix::io::read(fd, &mut b) {
        Ok(8) => u64::from_ne_bytes(b),
        _ => 0,
    }
}

/// Blocks SIGINT and SIGTERM in the calling thread (and every thread it
/// starts afterwards) and returns a signalfd that reports them.
pub fn termination_signalfd() -> io::Result<OwnedFd> {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t; the calls only write to it, and
    // pthread_sigmask changes this thread's mask (no memory effects).
    let rc = unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    // SAFETY: `set` is initialised; -1 asks for a new fd.
    let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: signalfd returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads one pending signal number from a signalfd (None if none).
pub fn read_signal(fd: &OwnedFd) -> Option<u32> {
    // SAFETY: signalfd_siginfo is plain data, zero is a valid value.
    let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::signalfd_siginfo>();
    // SAFETY: `info` is a writable buffer of `size` bytes.
    let n = unsafe { libc::read(fd.as_raw_fd(), (&mut info as *mut libc::signalfd_siginfo).cast(), size) };
    (n as usize == size).then_some(info.ssi_signo)
}
