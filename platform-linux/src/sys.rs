//! OS plumbing shared by the backends: eventfds, time. (Shared mappings:
//! [`refgpu_model::shm::Mapping`], one copy for both sides of the binding.)

use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

/// Adds 1 to an eventfd's counter.
pub(crate) fn eventfd_signal(fd: impl AsFd) -> io::Result<()> {
    rustix::io::write(fd, &1u64.to_ne_bytes())?;
    Ok(())
}

/// Reads and clears an eventfd's counter without blocking (0 if it was 0).
/// The fd must be non-blocking (the server creates its interrupt eventfds
/// with `EFD_NONBLOCK`): callers drain every vector's fd once any is
/// readable.
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
