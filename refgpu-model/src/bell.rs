//! Doorbell eventfds taken by the engine threads themselves (feature
//! `shm`, the ivshmem binding).
//!
//! Over ivshmem a doorbell is a write to one of the model's eventfds. If a
//! server thread watched them and forwarded each doorbell to the engine
//! (a condition variable), every submission would cost two thread wake-ups
//! before the engine fetched. Instead, [`crate::Model::attach_doorbells`]
//! hands the eventfds to the model: an idle engine sleeps in `poll(2)` on
//! its own doorbell eventfd (and its waker's eventfd, for resets, enables
//! and injection changes), so the host's doorbell wakes the thread that
//! runs the packets.
//!
//! Order: the host may write control registers, ring the control doorbell
//! and then ring an engine (section 2.3 puts no handshake in between).
//! Before an engine takes its own doorbell it therefore applies a pending
//! control doorbell itself, under the control lock, the same lock the
//! server's loop takes for it: a control doorbell rung before an engine
//! doorbell is always applied before that engine fetches.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::OnceLock;

use crate::engine::Shared;
use crate::regs::NUM_ENGINES;

/// The attached doorbell eventfds.
#[derive(Default)]
pub(crate) struct Bells {
    /// Engine `e`'s doorbell (vector `e`).
    pub engine: [OnceLock<OwnedFd>; NUM_ENGINES],
    /// The control doorbell (vector 3).
    pub control: OnceLock<OwnedFd>,
}

/// Reads and clears a non-blocking eventfd's counter (0 if it was 0).
fn drain(fd: impl AsFd) -> u64 {
    let mut b = [0u8; 8];
    match rustix::io::read(fd, &mut b) {
        Ok(8) => u64::from_ne_bytes(b),
        _ => 0,
    }
}

impl Shared {
    /// Attaches the doorbell eventfds: `fds[e]` for engine `e`, `fds[3]`
    /// for the control doorbell. They must be non-blocking.
    pub(crate) fn attach_bells(&self, fds: [OwnedFd; NUM_ENGINES + 1]) -> io::Result<()> {
        for es in &self.engines {
            es.waker.enable_fd()?;
        }
        let [e0, e1, e2, ctl] = fds;
        for (slot, fd) in self.bells.engine.iter().zip([e0, e1, e2]) {
            slot.set(fd)
                .map_err(|_| io::Error::new(io::ErrorKind::AlreadyExists, "doorbells already attached"))?;
        }
        self.bells
            .control
            .set(ctl)
            .map_err(|_| io::Error::new(io::ErrorKind::AlreadyExists, "doorbells already attached"))?;
        // Engines asleep on their condition variable start watching.
        for es in &self.engines {
            es.waker.wake();
        }
        Ok(())
    }

    /// Applies a pending control doorbell, if any. Returns whether there
    /// was one.
    pub fn take_control_bell(&self) -> bool {
        let Some(fd) = self.bells.control.get() else {
            return false;
        };
        let _g = self.control_lock.lock().unwrap_or_else(|p| p.into_inner());
        if drain(fd) == 0 {
            return false;
        }
        self.apply_control_locked();
        true
    }

    /// Takes engine `e`'s pending doorbell, if any: applies a control
    /// doorbell rung before it, then latches RING_WPTR. Returns whether
    /// there was one.
    pub(crate) fn take_bell(&self, e: usize) -> bool {
        let Some(fd) = self.bells.engine.get(e).and_then(OnceLock::get) else {
            return false;
        };
        if drain(fd) == 0 {
            return false;
        }
        self.take_control_bell();
        self.doorbell(e);
        true
    }
}
