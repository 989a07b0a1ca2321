//! OS plumbing: eventfds, signals. (Shared mappings:
//! [`refgpu_model::shm::Mapping`].)

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use rustix::event::{eventfd, EventfdFlags};

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
