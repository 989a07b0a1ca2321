//! The platform traits: the only door from the core to hardware or an OS.
//!
//! [`Platform`] is what every integrator implements: GPU-visible memory,
//! cache maintenance, time, and (optionally) waiting for an interrupt. On
//! top of it comes one of the two submission modes:
//!
//! - [`DirectIo`] (bare metal, co-simulation, the in-process model): the
//!   core owns the rings and the page tables and talks to the register page
//!   through `read_reg`/`write_reg` and the doorbell;
//! - [`KernelIo`] (Linux DRM): a kernel driver owns the rings; the core
//!   builds IBs, chooses GPU addresses and hands both to the kernel.
//!
//! See `docs/porting.md` for what an integrator writes for a new board.

use core::fmt;
use core::ptr::NonNull;

use crate::mem::local::{LocalPages, Residency};
#[cfg(target_has_atomic = "64")]
use core::sync::atomic::AtomicU64;
use core::sync::atomic::{AtomicU32, Ordering};

/// Why the platform could not do what the core asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlatformError {
    /// No GPU-visible memory left for the request (bytes asked).
    OutOfMemory {
        /// Bytes requested.
        len: usize,
    },
    /// The device is gone (unplugged, model process died, link down).
    DeviceLost,
    /// The platform does not support this operation.
    Unsupported,
    /// An OS call failed with this error number.
    Os(i32),
}

impl fmt::Display for PlatformError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlatformError::OutOfMemory { len } => write!(f, "out of GPU-visible memory ({len} bytes asked)"),
            PlatformError::DeviceLost => write!(f, "device lost"),
            PlatformError::Unsupported => write!(f, "not supported by this platform"),
            PlatformError::Os(e) => write!(f, "OS error {e}"),
        }
    }
}

impl core::error::Error for PlatformError {}

/// How memory is allocated by [`Platform::dma_alloc`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DmaFlags {
    /// The CPU does not need to reach the memory: a platform may give
    /// memory without a CPU mapping (a DRM BO created with no CPU mapping,
    /// carve-outs the CPU cannot see). The core never touches such memory
    /// from the CPU.
    pub device_only: bool,
}

impl DmaFlags {
    /// Memory the CPU and the device both reach (rings, IBs, fences, most
    /// buffers).
    pub const CPU: DmaFlags = DmaFlags { device_only: false };
    /// Memory only the device needs.
    pub const DEVICE_ONLY: DmaFlags = DmaFlags { device_only: true };
}

/// A block of GPU-visible memory: a CPU mapping (unless allocated
/// [`DmaFlags::DEVICE_ONLY`]), the address the device uses for it (a
/// physical address in direct mode) and the platform's own name for it
/// (a GEM handle on DRM; 0 where the platform needs none).
///
/// The region is owned: only its holder accesses it from the CPU, and it
/// goes back with [`Platform::dma_free`]. The device may read and write it
/// at any time; the core reads device-written words with atomic loads
/// (volatile ones where the target has no atomics of that width), so that
/// a device modelled in the same process, writing with atomics, is
/// race-free in Rust's memory model and under ThreadSanitizer.
/// Shared references only read (`&self` methods never write), which is why
/// a region may be shared between threads.
#[derive(Debug)]
pub struct DmaRegion {
    cpu: Option<NonNull<u32>>,
    dev_addr: u64,
    len: usize,
    handle: u64,
}

// SAFETY: a region is an owning handle to memory no other CPU code touches
// (the `new` contract); moving it to another thread moves that ownership.
unsafe impl Send for DmaRegion {}
// SAFETY: through `&DmaRegion` the memory is only read (atomic loads, or
// a shared slice while no `&mut` exists, which `&self` guarantees); the
// device's own writes are outside the CPU's memory model as for any DMA.
unsafe impl Sync for DmaRegion {}

impl DmaRegion {
    /// Wraps memory the platform allocated, reachable by the CPU at `cpu`.
    ///
    /// # Safety
    /// `cpu` must be valid for reads and writes of `len` bytes, 4-byte
    /// aligned (4 KiB aligned for regions from [`Platform::dma_alloc`]),
    /// not accessed by anything else on the CPU side until the region is
    /// returned through [`Platform::dma_free`], and the device must reach
    /// the same bytes at `dev_addr` (after cache maintenance, on a
    /// non-coherent system).
    ///
    /// "Anything else on the CPU side" is other code of the host: another
    /// allocation, another driver, another thread writing through its own
    /// pointer. The device is not, and neither is whatever implements it
    /// (a model in another process that maps the same memory, as
    /// `refgpu-sim` does on the shared-memory transports): its accesses are
    /// DMA, which the contract expects. The mapping behind `cpu` must stay
    /// valid until the region is freed: unmap it only after the device has
    /// been shut down.
    pub unsafe fn new(cpu: NonNull<u8>, dev_addr: u64, len: usize) -> DmaRegion {
        DmaRegion { cpu: Some(cpu.cast()), dev_addr, len, handle: 0 }
    }

    /// Wraps memory the platform allocated, with the platform's name for it
    /// (`handle`) and an optional CPU mapping.
    ///
    /// # Safety
    /// As [`DmaRegion::new`] for `cpu` when it is `Some`; `len` bytes at
    /// `dev_addr` (or named by `handle`) must belong to this region alone.
    pub unsafe fn with_handle(cpu: Option<NonNull<u8>>, dev_addr: u64, len: usize, handle: u64) -> DmaRegion {
        DmaRegion { cpu: cpu.map(NonNull::cast), dev_addr, len, handle }
    }

    /// The name a region of local memory carries in place of a
    /// platform's (with no CPU mapping, which a local region never has).
    /// Local memory is the driver's, not the platform's; the name is
    /// kept in the `handle` field rather than a field of its own so that a
    /// region, which every buffer holds, stays four words.
    const LOCAL: u64 = u64::MAX - 1;

    /// Wraps pages of the device's local memory (no CPU mapping, no
    /// platform name); [`DmaRegion::into_local_pages`] gives them back.
    pub(crate) fn local(p: LocalPages) -> DmaRegion {
        // The pages are this region's alone: `LocalPages` comes from the
        // allocator, which gives a page out once until it is freed.
        DmaRegion { cpu: None, dev_addr: p.addr, len: p.len, handle: DmaRegion::LOCAL }
    }

    /// Where the memory is: local memory (a region from
    /// [`DmaRegion::local`]) or the platform's.
    pub(crate) fn residency(&self) -> Residency {
        if self.handle == DmaRegion::LOCAL && self.cpu.is_none() {
            Residency::Local
        } else {
            Residency::System
        }
    }

    /// The pages of a region from [`DmaRegion::local`], for the
    /// local-memory allocator to take back. The caller knows the region
    /// is local ([`DmaRegion::residency`]): the platform's memory goes
    /// back through [`Platform::dma_free`] instead.
    pub(crate) fn into_local_pages(self) -> LocalPages {
        LocalPages { addr: self.dev_addr, len: self.len }
    }

    /// A region of no memory (a placeholder before allocation, or after
    /// the memory was given back).
    pub const fn empty() -> DmaRegion {
        DmaRegion { cpu: None, dev_addr: 0, len: 0, handle: 0 }
    }

    /// The device address of the first byte.
    pub fn dev_addr(&self) -> u64 {
        self.dev_addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The platform's name for the memory (a GEM handle, a carve-out
    /// index; 0 when the platform needs none).
    pub fn handle(&self) -> u64 {
        self.handle
    }

    /// The CPU pointer, for platforms that need it back in `dma_free`;
    /// None for device-only memory.
    pub fn cpu_ptr(&self) -> Option<NonNull<u8>> {
        self.cpu.map(NonNull::cast)
    }

    /// Whether the CPU can reach the memory.
    pub fn cpu_visible(&self) -> bool {
        self.cpu.is_some()
    }

    /// The CPU-visible length (0 for device-only memory).
    fn cpu_len(&self) -> usize {
        if self.cpu.is_some() {
            self.len
        } else {
            0
        }
    }

    /// The region as dwords, for the core to write commands into (empty for
    /// device-only memory).
    pub fn words_mut(&mut self) -> &mut [u32] {
        match self.cpu {
            // SAFETY: `new`'s contract: valid, aligned, exclusively ours on
            // the CPU side for `len` bytes; `&mut self` makes this the only view.
            Some(p) => unsafe { core::slice::from_raw_parts_mut(p.as_ptr(), self.len / 4) },
            None => &mut [],
        }
    }

    /// A read-only byte view (empty for device-only memory).
    pub fn bytes(&self) -> &[u8] {
        match self.cpu {
            // SAFETY: as `words`; bytes have no alignment requirement.
            Some(p) => unsafe { core::slice::from_raw_parts(p.as_ptr().cast::<u8>(), self.len) },
            None => &[],
        }
    }

    /// A read-only dword view (for dumps of memory the device only reads;
    /// empty for device-only memory).
    pub fn words(&self) -> &[u32] {
        match self.cpu {
            // SAFETY: `new`'s contract: valid and aligned for `len` bytes;
            // the shared borrow of `self` excludes CPU writers.
            Some(p) => unsafe { core::slice::from_raw_parts(p.as_ptr(), self.len / 4) },
            None => &[],
        }
    }

    /// The word at `byte_offset`, if it lies in the region and the address
    /// is aligned to `size`.
    fn word_ptr(&self, byte_offset: usize, size: usize) -> Option<*mut u32> {
        let end = byte_offset.checked_add(size)?;
        if end > self.cpu_len() {
            return None;
        }
        let base = self.cpu?;
        // SAFETY: offset checked to lie inside the region.
        let p = unsafe { base.as_ptr().cast::<u8>().add(byte_offset) };
        ((p as usize).checked_rem(size) == Some(0)).then_some(p.cast::<u32>())
    }

    /// 64-bit load of a value the device writes (a fence slot), with
    /// acquire ordering; None when out of range, misaligned or not
    /// CPU-visible.
    pub fn read_u64(&self, byte_offset: usize) -> Option<u64> {
        let p = self.word_ptr(byte_offset, 8)?.cast::<u64>();
        #[cfg(target_has_atomic = "64")]
        // SAFETY: in range and 8-byte aligned (checked), valid per `new`;
        // every CPU-side access to device-shared words is atomic.
        return Some(unsafe { AtomicU64::from_ptr(p) }.load(Ordering::Acquire));
        #[cfg(not(target_has_atomic = "64"))]
        // SAFETY: in range and aligned (checked), valid per `new`.
        Some(unsafe { core::ptr::read_volatile(p) })
    }

    /// 64-bit store with release ordering; false when out of range,
    /// misaligned or not CPU-visible.
    pub fn write_u64(&mut self, byte_offset: usize, value: u64) -> bool {
        let Some(p) = self.word_ptr(byte_offset, 8) else {
            return false;
        };
        let p = p.cast::<u64>();
        #[cfg(target_has_atomic = "64")]
        // SAFETY: as in `read_u64`; `&mut self` is exclusive on the CPU.
        unsafe { AtomicU64::from_ptr(p) }.store(value, Ordering::Release);
        #[cfg(not(target_has_atomic = "64"))]
        // SAFETY: as in `read_u64`; `&mut self` is exclusive on the CPU.
        unsafe {
            core::ptr::write_volatile(p, value)
        };
        true
    }

    /// 32-bit store with release ordering through a shared reference;
    /// false when out of range, misaligned or not CPU-visible.
    ///
    /// # Safety
    /// While the region is shared, no slice view of it ([`DmaRegion::words`],
    /// [`DmaRegion::bytes`]) may be alive, and every CPU access to the word
    /// must go through the atomic accessors ([`DmaRegion::read_u32`] and
    /// this one): a word the CPU and the device hand each other while both
    /// run (an event's word, `engine::events`).
    pub unsafe fn store_u32_shared(&self, byte_offset: usize, value: u32) -> bool {
        let Some(p) = self.word_ptr(byte_offset, 4) else {
            return false;
        };
        // SAFETY: in range and 4-byte aligned (checked), valid per `new`;
        // the caller guarantees every CPU access to the word is atomic.
        unsafe { AtomicU32::from_ptr(p) }.store(value, Ordering::Release);
        true
    }

    /// 32-bit load with acquire ordering.
    pub fn read_u32(&self, byte_offset: usize) -> Option<u32> {
        let p = self.word_ptr(byte_offset, 4)?;
        // SAFETY: in range, 4-byte aligned (checked), valid per `new`.
        Some(unsafe { AtomicU32::from_ptr(p) }.load(Ordering::Acquire))
    }

    /// 32-bit store with release ordering; false when out of range,
    /// misaligned or not CPU-visible.
    pub fn write_u32(&mut self, byte_offset: usize, value: u32) -> bool {
        match self.word_ptr(byte_offset, 4) {
            Some(p) => {
                // SAFETY: as in `read_u32`; `&mut self` is exclusive.
                unsafe { AtomicU32::from_ptr(p) }.store(value, Ordering::Release);
                true
            }
            None => false,
        }
    }
}

/// A region from [`Platform::dma_alloc`] that goes back to the platform
/// ([`Platform::dma_free`]) when the guard is dropped, unless the step
/// that needed it succeeded and took it ([`DmaGuard::keep`]): the error
/// paths of a set-up step return without freeing by hand.
///
/// The free runs where the guard is dropped: a guard is never held under
/// a lock that rules out the platform's memory calls
/// (`docs/architecture.md`, "The memory lock and the platform's memory
/// calls").
pub(crate) struct DmaGuard<'p, P: Platform + ?Sized> {
    p: &'p P,
    /// The region (`None` once kept).
    region: Option<DmaRegion>,
}

impl<'p, P: Platform + ?Sized> DmaGuard<'p, P> {
    /// Guards `region`, which `p` allocated.
    pub(crate) fn new(p: &'p P, region: DmaRegion) -> Self {
        DmaGuard { p, region: Some(region) }
    }

    /// The region, no longer freed on drop.
    pub(crate) fn keep(mut self) -> DmaRegion {
        // (Always `Some`: only `keep`, which consumes the guard, takes it.)
        self.region.take().unwrap_or(DmaRegion::empty())
    }
}

impl<P: Platform + ?Sized> core::ops::Deref for DmaGuard<'_, P> {
    type Target = DmaRegion;

    fn deref(&self) -> &DmaRegion {
        // (Always `Some`, as in `keep`.)
        const EMPTY: &DmaRegion = &DmaRegion::empty();
        self.region.as_ref().unwrap_or(EMPTY)
    }
}

impl<P: Platform + ?Sized> Drop for DmaGuard<'_, P> {
    fn drop(&mut self) {
        if let Some(r) = self.region.take() {
            self.p.dma_free(r);
        }
    }
}

/// What [`Platform::wait_irq`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IrqWait {
    /// An interrupt arrived (any vector; the core reads IRQ_STATUS).
    Interrupt,
    /// The timeout passed with no interrupt.
    TimedOut,
    /// This platform cannot wait for interrupts: the core polls.
    Unsupported,
}

/// The part every platform implements: memory, caches, time, interrupts,
/// and the kind of lock the core uses.
///
/// Every method takes `&self`: the core calls the platform from several
/// threads or tasks at once (submissions on different queues, a waiter, a
/// service loop). Platforms lock what they need internally (the memory
/// allocator); register access, cache maintenance and time are naturally
/// shareable.
///
/// # Safety
/// Implementations must honour [`DmaRegion::new`]'s contract for every
/// region they return, and `now_ns` must be monotonic.
pub unsafe trait Platform {
    /// The raw lock behind the core's locks (`docs/architecture.md`,
    /// "Thread model"). The core holds a lock only for bounded bookkeeping,
    /// never across a wait, a sleep or user code, and never from an
    /// interrupt handler. [`SpinLock`] suits bare metal without preemptive
    /// priorities; hosted threads want a fair lock (the Linux platforms'
    /// is a ticket lock); a preemptive RTOS plugs in its mutex
    /// with priority inheritance (a spinning high-priority task would never
    /// let a preempted low-priority holder run on one core); a single-core
    /// MCU may use a critical-section lock.
    type RawMutex: lock_api::RawMutex + Send + Sync;

    /// Allocates `len` bytes (a multiple of 4096) of zeroed GPU-visible
    /// memory, 4 KiB aligned on both the CPU and the device side.
    fn dma_alloc(&self, len: usize, flags: DmaFlags) -> Result<DmaRegion, PlatformError>;

    /// Returns memory obtained from [`Platform::dma_alloc`].
    fn dma_free(&self, region: DmaRegion);

    /// Makes CPU writes to `region[offset..offset + len]` visible to the
    /// device (clean the data cache); a no-op on coherent systems.
    fn cache_clean(&self, region: &DmaRegion, offset: usize, len: usize) {
        let _ = (region, offset, len);
    }

    /// Makes device writes to `region[offset..offset + len]` visible to the
    /// CPU (invalidate the data cache); a no-op on coherent systems.
    fn cache_invalidate(&self, region: &DmaRegion, offset: usize, len: usize) {
        let _ = (region, offset, len);
    }

    /// Monotonic time in nanoseconds.
    fn now_ns(&self) -> u64;

    /// Waits at least `ns` nanoseconds (sleep, `wfe`, or a timer spin).
    fn delay_ns(&self, ns: u64);

    /// Waits for a device interrupt for at most `timeout_ns`. The default
    /// says the platform can not; the core then polls.
    fn wait_irq(&self, timeout_ns: u64) -> IrqWait {
        let _ = timeout_ns;
        IrqWait::Unsupported
    }
}

/// A device-clock reading paired with the platform clock
/// ([`DeviceCore::clock_sync`](crate::engine::DeviceCore::clock_sync)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockSync {
    /// Platform time (ns) of the reading.
    pub cpu_ns: u64,
    /// Device clock (ns) at that moment.
    pub gpu_ns: u64,
    /// Half the window the device clock was read in (ns).
    pub uncertainty_ns: u64,
}

impl ClockSync {
    /// Platform time of device-clock time `gpu_ns` (both clocks count
    /// nanoseconds; saturates at 0).
    pub const fn to_cpu_ns(&self, gpu_ns: u64) -> u64 {
        if gpu_ns >= self.gpu_ns {
            self.cpu_ns.saturating_add(gpu_ns.saturating_sub(self.gpu_ns))
        } else {
            self.cpu_ns.saturating_sub(self.gpu_ns.saturating_sub(gpu_ns))
        }
    }
}

#[cfg(any(test, feature = "fake"))]
pub mod fake;
mod kernel_io;
pub(crate) mod slots;
pub use kernel_io::{
    submit_each, BatchError, ContextId, ContextStatus, ForeignSync, Guilt, KernelInfo, KernelIo, KernelJob,
    KernelSubmitError, KernelSync, KernelWait, MAX_FOREIGN,
};

/// The spin lock the project's bare-metal platforms use
/// ([`Platform::RawMutex`]): spin's. It is not fair: a thread that
/// releases it and takes it again at once can keep it from a waiting one,
/// so hosted platforms with more threads than cores want a fair lock
/// (the Linux platforms use a ticket lock, `docs/architecture.md`,
/// "Thread model"). On bare metal (`target_os = "none"`) the wait for a held lock
/// is one out-of-line copy: each of the two dozen places the core takes a
/// lock inlines a single attempt instead of spin's whole acquire loop
/// (`docs/perf.md`, "Code size on embedded targets"); with the `size-first`
/// feature even that attempt is one shared out-of-line copy, a call at each
/// place (`docs/perf.md`, "Per configuration", `size-first`). Elsewhere
/// spin's loop stays inline (hosted builds count instructions, not bytes).
pub struct SpinLock(spin::Mutex<()>);

#[cfg(target_os = "none")]
impl SpinLock {
    /// The lock was held: spin's acquire loop, shared.
    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        lock_api::RawMutex::lock(&self.0)
    }

    /// The whole acquisition, one shared copy (`size-first`: a call where
    /// the lock is taken instead of the attempt inlined there).
    #[cfg(feature = "size-first")]
    #[inline(never)]
    fn lock_shared(&self) {
        if !lock_api::RawMutex::try_lock(&self.0) {
            self.lock_contended();
        }
    }
}

// SAFETY: every method acquires and releases only through spin's
// `RawMutex` implementation (`try_lock`, `lock`, `unlock`), which upholds
// the trait's contract; `lock` acquires exactly once (one attempt, then
// spin's loop if that failed, possibly through the shared `lock_shared`).
unsafe impl lock_api::RawMutex for SpinLock {
    const INIT: Self = SpinLock(<spin::Mutex<()> as lock_api::RawMutex>::INIT);
    type GuardMarker = <spin::Mutex<()> as lock_api::RawMutex>::GuardMarker;

    #[inline]
    fn lock(&self) {
        #[cfg(all(target_os = "none", feature = "size-first"))]
        self.lock_shared();
        #[cfg(all(target_os = "none", not(feature = "size-first")))]
        if !lock_api::RawMutex::try_lock(&self.0) {
            self.lock_contended();
        }
        #[cfg(not(target_os = "none"))]
        lock_api::RawMutex::lock(&self.0)
    }

    #[inline]
    fn try_lock(&self) -> bool {
        lock_api::RawMutex::try_lock(&self.0)
    }

    #[inline]
    unsafe fn unlock(&self) {
        // SAFETY: the caller holds the lock (the trait's contract).
        unsafe { lock_api::RawMutex::unlock(&self.0) }
    }

    #[inline]
    fn is_locked(&self) -> bool {
        lock_api::RawMutex::is_locked(&self.0)
    }
}

/// Direct mode: the core drives the register page itself.
///
/// Once the platform knows the device is gone, every register read, write
/// and doorbell fails with [`PlatformError::DeviceLost`]: a submission
/// reads `RING_RPTR` only when the ring looks full, so writing `RING_WPTR`
/// is usually where it meets a loss.
pub trait DirectIo: Platform {
    /// Reads the 32-bit register at `offset` of the register page.
    fn read_reg(&self, offset: u32) -> Result<u32, PlatformError>;

    /// Writes the 32-bit register at `offset`.
    fn write_reg(&self, offset: u32, value: u32) -> Result<(), PlatformError>;

    /// Rings engine `engine`'s doorbell, after the core published its
    /// write pointer (MMIO: the engine's DOORBELL register; ivshmem: the
    /// doorbell vector; shared RAM: one atomic add of 1 to the vector's
    /// doorbell word, `docs/refgpu.md` section 2.3).
    ///
    /// The core rings only engines the chip reports (below
    /// `ENGINE_COUNT`, 3 on refgpu). For any other `engine` return
    /// [`PlatformError::Unsupported`] and touch nothing: on the
    /// shared-memory transports vector 3 is the control doorbell and the
    /// words after it are reserved.
    fn doorbell(&self, engine: u32) -> Result<(), PlatformError>;

    /// Applies control-register writes (CTRL, IRQ_MASK, MMU_*,
    /// ENGINE_ROOT). MMIO platforms apply them on the write and need
    /// nothing here; the shared-memory transports (ivshmem, shared RAM)
    /// ring the control doorbell, vector 3: without it the model never
    /// sees the writes, and bring-up fails with "device did not complete
    /// MMU invalidate" (`umd_core::ivshmem`).
    fn control_doorbell(&self) -> Result<(), PlatformError> {
        Ok(())
    }
}
