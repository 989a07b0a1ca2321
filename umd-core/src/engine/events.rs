//! Events and timestamp queries (`docs/architecture.md`, "Validation, fault
//! reports and events").
//!
//! An [`Event`] is a state change during GPU execution that the CPU can
//! query and other GPU work can wait for: a 32-bit word in a small buffer
//! of the device, 1 when set and 0 when reset. The GPU sets and resets it
//! with WRITE_DATA and waits for it with WAIT_MEM (the commands come from
//! [`Event::set`], [`Event::reset`], [`Event::wait`], recorded like any
//! other); the CPU sets, resets, queries and waits through the device.
//!
//! A GPU wait on an event is a wait the engine can not see through: the
//! direct-mode hang check judges a queue that waits longer than its hang
//! window for an event nobody sets as hung, like any WAIT_MEM. So the work
//! that sets the event must be submitted before the work that waits for it
//! (Vulkan's rule for `vkCmdWaitEvents`), or the host must set it within
//! the hang window.
//!
//! A [`TimestampQuery`] is an 8-byte slot the GPU's TIMESTAMP packet fills
//! with the device clock in nanoseconds ([`TimestampQuery::write`]).
//!
//! Both are buffers underneath: destroying one is a buffer free (fence
//! gated), and a destroyed or foreign one is refused with the buffer's
//! typed error ([`BufferError::Stale`], [`BufferError::ForeignDevice`]).
//! Their buffers are driver-internal: a buffer handle forged from the slot
//! and generation of one is refused by every buffer operation
//! ([`BufferError::Unknown`], see [`BufferHandle::from_raw`]).

use core::fmt;

use crate::cmd::{Command, CompareOp, Payload};
use crate::mem::{AllocError, BufferDesc, BufferError, BufferHandle};
use crate::platform::{ClockSync, IrqWait, Platform};

use super::{Backend, DeviceCore};

/// An event of one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Event {
    buffer: BufferHandle,
    va: u64,
}

static SET: [u32; 1] = [1];
static RESET: [u32; 1] = [0];

impl Event {
    /// The GPU address of the event's word.
    pub const fn va(&self) -> u64 {
        self.va
    }

    /// The command that sets the event from the GPU.
    pub const fn set(&self) -> Command<'static> {
        Command::WriteData { dst: self.va, data: Payload::Words(&SET) }
    }

    /// The command that resets the event from the GPU.
    pub const fn reset(&self) -> Command<'static> {
        Command::WriteData { dst: self.va, data: Payload::Words(&RESET) }
    }

    /// The command that makes the GPU wait until the event is set.
    pub const fn wait(&self) -> Command<'static> {
        Command::WaitMem { addr: self.va, reference: 1, mask: 0xFFFF_FFFF, op: CompareOp::Eq, wide: false }
    }
}

/// A GPU timestamp slot of one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimestampQuery {
    buffer: BufferHandle,
    va: u64,
}

impl TimestampQuery {
    /// The command that writes the device clock (ns) into the slot.
    pub const fn write(&self) -> Command<'static> {
        Command::Timestamp { addr: self.va }
    }

    /// The GPU address of the slot.
    pub const fn va(&self) -> u64 {
        self.va
    }
}

/// Why an event wait ended without the event set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventError {
    /// The event is destroyed, of another device, or not CPU-readable.
    Buffer(BufferError),
    /// The time passed.
    Timeout,
    /// The device is gone.
    DeviceLost,
}

impl fmt::Display for EventError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventError::Buffer(e) => write!(f, "event: {e}"),
            EventError::Timeout => write!(f, "the event was not set in time"),
            EventError::DeviceLost => write!(f, "device lost"),
        }
    }
}

impl core::error::Error for EventError {}

impl From<BufferError> for EventError {
    fn from(e: BufferError) -> EventError {
        EventError::Buffer(e)
    }
}

impl<'d, B: Backend, const CHUNKS: usize> DeviceCore<'d, B, CHUNKS> {
    fn slot(&self, size: u64, tag: &'static str) -> Result<(BufferHandle, u64), AllocError> {
        // The default alignment (128 bytes) keeps each slot on cache lines of
        // its own (CPU writes and invalidates of one never touch another).
        self.alloc_info(&BufferDesc::new(size).tag(tag).driver()).map(|(h, info)| (h, info.va))
    }

    /// A new event, reset.
    pub fn create_event(&self) -> Result<Event, AllocError> {
        let (buffer, va) = self.slot(4, "event")?;
        Ok(Event { buffer, va })
    }

    /// Destroys an event (its memory is reused only after the work that
    /// may use it has finished).
    pub fn destroy_event(&self, e: Event) -> Result<(), BufferError> {
        self.free(e.buffer)
    }

    /// Sets the event from the CPU.
    pub fn set_event(&self, e: Event) -> Result<(), BufferError> {
        self.store_event(e, SET[0])
    }

    /// Resets the event from the CPU.
    pub fn reset_event(&self, e: Event) -> Result<(), BufferError> {
        self.store_event(e, RESET[0])
    }

    /// Whether the event is set.
    pub fn event_is_set(&self, e: Event) -> Result<bool, BufferError> {
        self.with_event_word(e, |p, region, off| {
            p.cache_invalidate(region, off, 4);
            region.read_u32(off).map(|w| w != 0).ok_or(BufferError::NoCpuAccess)
        })?
    }

    /// Stores the event's word from the CPU and cleans it to the device.
    fn store_event(&self, e: Event, value: u32) -> Result<(), BufferError> {
        self.with_event_word(e, |p, region, off| {
            // SAFETY: an event's buffer handle is private to `Event`, so
            // no map guard or buffer copy reaches its word, and every CPU
            // access to the word is this store or the `read_u32` of
            // `event_is_set`; nothing makes a slice view of a buffer
            // pool's region (a map guard covers only its own buffer).
            if !unsafe { region.store_u32_shared(off, value) } {
                return Err(BufferError::NoCpuAccess);
            }
            p.cache_clean(region, off, 4);
            Ok(())
        })?
    }

    /// Runs `f` on the event's word (the platform, the region holding it
    /// and its byte offset there) under the memory lock.
    ///
    /// The word is one the GPU reads (WAIT_MEM) and writes (WRITE_DATA)
    /// while the CPU sets, resets or polls it, so the CPU accesses it with
    /// atomics (release store, acquire load), not with the buffer copies:
    /// a device modelled in this process is inside Rust's memory model,
    /// and a plain copy racing its atomic access is a data race there
    /// (ThreadSanitizer reported both directions on the in-process model).
    fn with_event_word<R>(
        &self,
        e: Event,
        f: impl FnOnce(&B::P, &crate::platform::DmaRegion, usize) -> R,
    ) -> Result<R, BufferError> {
        let mem = self.mem.lock();
        let (region, base, _) = mem.buffers.memory(e.buffer)?;
        let off = usize::try_from(base).map_err(|_| BufferError::Stale)?;
        Ok(f(self.b.platform(), region, off))
    }

    /// Waits until the event is set or `timeout_ns` passes, following the
    /// configuration's wait schedule and servicing the device meanwhile
    /// (a WRITE_DATA raises no interrupt, so the wait polls; interrupts
    /// from other work end a sleep early).
    pub fn wait_event(&self, e: Event, timeout_ns: u64) -> Result<(), EventError> {
        let p = self.b.platform();
        let start = p.now_ns();
        let mut irq_ok = self.cfg.use_irq;
        loop {
            if self.event_is_set(e)? {
                return Ok(());
            }
            if self.is_lost() {
                return Err(EventError::DeviceLost);
            }
            let elapsed = p.now_ns().saturating_sub(start);
            if elapsed >= timeout_ns {
                return Err(EventError::Timeout);
            }
            self.service();
            let remaining = timeout_ns.saturating_sub(elapsed);
            let interval = self.cfg.wait_interval(elapsed).min(remaining);
            if interval == 0 {
                crate::sync::atomic::spin_hint();
                continue;
            }
            if irq_ok && p.wait_irq(interval) == IrqWait::Unsupported {
                irq_ok = false;
            }
            if !irq_ok {
                p.delay_ns(interval);
            }
        }
    }

    /// A new timestamp slot (0 until the GPU writes it).
    pub fn create_timestamp(&self) -> Result<TimestampQuery, AllocError> {
        let (buffer, va) = self.slot(8, "timestamp")?;
        Ok(TimestampQuery { buffer, va })
    }

    /// The device clock (ns) the GPU wrote, `None` while the slot is 0
    /// (read it after the fence of the work that writes it).
    pub fn timestamp_ns(&self, q: TimestampQuery) -> Result<Option<u64>, BufferError> {
        let mut b = [0u8; 8];
        self.read(q.buffer, 0, &mut b)?;
        let v = u64::from_le_bytes(b);
        Ok((v != 0).then_some(v))
    }

    /// Destroys a timestamp slot (fence gated, like a buffer).
    pub fn destroy_timestamp(&self, q: TimestampQuery) -> Result<(), BufferError> {
        self.free(q.buffer)
    }

    /// Pairs the device clock with the platform clock, so that GPU
    /// timestamps can be placed on the driver's timeline (the trace's
    /// GPU spans, [`crate::debug::TraceRing::record_gpu_span`]). `None` when
    /// this mode can not read the device clock (kernel mode).
    ///
    /// Over ivshmem the model publishes CLOCK into the register page every
    /// so often (`docs/refgpu.md` 2.3), so a single reading may be stale by
    /// up to that interval. The pairing therefore reads until the value
    /// changes (for at most [`CLOCK_SYNC_SPIN_NS`]): the new value was
    /// published between the last two reads, and the pair takes the middle
    /// of that window; [`ClockSync::uncertainty_ns`] is half its width.
    pub fn clock_sync(&self) -> Option<ClockSync> {
        let p = self.b.platform();
        let start = p.now_ns();
        let mut prev = self.b.gpu_clock_ns()?;
        let mut prev_before = start;
        // The read count bounds the loop on a platform whose clock stands
        // still (a test double).
        for reads in 1u32.. {
            let before = p.now_ns();
            let gpu_ns = self.b.gpu_clock_ns()?;
            let after = p.now_ns();
            let changed = gpu_ns != prev;
            if changed || after.saturating_sub(start) > CLOCK_SYNC_SPIN_NS || reads >= CLOCK_SYNC_MAX_READS {
                // Changed: published within [prev_before, after]. Not
                // changed: the reading is at most one publish interval old.
                let from = if changed { prev_before } else { before };
                let window = after.saturating_sub(from);
                return Some(ClockSync {
                    cpu_ns: from.saturating_add(window / 2),
                    gpu_ns,
                    uncertainty_ns: window / 2,
                });
            }
            prev = gpu_ns;
            prev_before = before;
        }
        None
    }
}

/// Longest [`DeviceCore::clock_sync`] waits for the device clock to move.
pub const CLOCK_SYNC_SPIN_NS: u64 = 2_000_000;
/// Most device-clock reads [`DeviceCore::clock_sync`] makes.
const CLOCK_SYNC_MAX_READS: u32 = 100_000;
