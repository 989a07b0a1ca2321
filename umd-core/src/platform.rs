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

/// A block of GPU-visible memory: a CPU mapping and the address the device
/// uses for it (a physical address in direct mode).
///
/// The region is owned: only its holder accesses it from the CPU, and it
/// goes back with [`Platform::dma_free`]. The device may read and write it
/// at any time; the core reads device-written words with volatile loads.
#[derive(Debug)]
pub struct DmaRegion {
    cpu: NonNull<u32>,
    dev_addr: u64,
    len: usize,
}

impl DmaRegion {
    /// Wraps memory the platform allocated.
    ///
    /// # Safety
    /// `cpu` must be valid for reads and writes of `len` bytes, 4-byte
    /// aligned, not accessed by anything else on the CPU side until the
    /// region is returned through [`Platform::dma_free`], and the device
    /// must reach the same bytes at `dev_addr`.
    pub unsafe fn new(cpu: NonNull<u8>, dev_addr: u64, len: usize) -> DmaRegion {
        DmaRegion { cpu: cpu.cast(), dev_addr, len }
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

    /// The CPU pointer, for platforms that need it back in `dma_free`.
    pub fn cpu_ptr(&self) -> NonNull<u8> {
        self.cpu.cast()
    }

    /// The region as dwords, for the core to write commands into.
    pub fn words_mut(&mut self) -> &mut [u32] {
        // SAFETY: `new`'s contract: valid, aligned, exclusively ours on the
        // CPU side for `len` bytes; `&mut self` makes this the only view.
        unsafe { core::slice::from_raw_parts_mut(self.cpu.as_ptr(), self.len / 4) }
    }

    /// A read-only dword view (for dumps of memory the device only reads).
    pub fn words(&self) -> &[u32] {
        // SAFETY: `new`'s contract: valid and aligned for `len` bytes; the
        // shared borrow of `self` excludes CPU writers through this region.
        unsafe { core::slice::from_raw_parts(self.cpu.as_ptr(), self.len / 4) }
    }

    /// Splits the dword view at `mid` dwords (None if out of range).
    pub fn split_words_mut(&mut self, mid: usize) -> Option<(&mut [u32], &mut [u32])> {
        self.words_mut().split_at_mut_checked(mid)
    }

    fn word_ptr(&self, byte_offset: usize, size: usize) -> Option<*mut u32> {
        let end = byte_offset.checked_add(size)?;
        if end > self.len || byte_offset.checked_rem(size) != Some(0) {
            return None;
        }
        // SAFETY: offset checked to lie inside the region.
        Some(unsafe { self.cpu.as_ptr().cast::<u8>().add(byte_offset).cast::<u32>() })
    }

    /// Volatile 64-bit load of a value the device writes (a fence slot);
    /// None when out of range or misaligned.
    pub fn read_u64(&self, byte_offset: usize) -> Option<u64> {
        let p = self.word_ptr(byte_offset, 8)?;
        // SAFETY: in range, 8-byte aligned (region base is at least 4 KiB
        // aligned per the platform contract), valid per `new`.
        Some(unsafe { core::ptr::read_volatile(p.cast::<u64>()) })
    }

    /// Volatile 64-bit store (the core forcing a fence slot after a reset);
    /// false when out of range or misaligned.
    pub fn write_u64(&mut self, byte_offset: usize, value: u64) -> bool {
        match self.word_ptr(byte_offset, 8) {
            Some(p) => {
                // SAFETY: as in `read_u64`; `&mut self` is exclusive.
                unsafe { core::ptr::write_volatile(p.cast::<u64>(), value) };
                true
            }
            None => false,
        }
    }

    /// Volatile 32-bit load.
    pub fn read_u32(&self, byte_offset: usize) -> Option<u32> {
        let p = self.word_ptr(byte_offset, 4)?;
        // SAFETY: in range, 4-byte aligned, valid per `new`.
        Some(unsafe { core::ptr::read_volatile(p) })
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

/// The part every platform implements: memory, caches, time, interrupts.
///
/// # Safety
/// Implementations must honour [`DmaRegion::new`]'s contract for every
/// region they return, and `now_ns` must be monotonic.
pub unsafe trait Platform {
    /// Allocates `len` bytes (a multiple of 4096) of zeroed GPU-visible
    /// memory, 4 KiB aligned on both the CPU and the device side.
    fn dma_alloc(&mut self, len: usize) -> Result<DmaRegion, PlatformError>;

    /// Returns memory obtained from [`Platform::dma_alloc`].
    fn dma_free(&mut self, region: DmaRegion);

    /// Makes CPU writes to `region[offset..offset + len]` visible to the
    /// device (clean the data cache); a no-op on coherent systems.
    fn cache_clean(&mut self, region: &DmaRegion, offset: usize, len: usize) {
        let _ = (region, offset, len);
    }

    /// Makes device writes to `region[offset..offset + len]` visible to the
    /// CPU (invalidate the data cache); a no-op on coherent systems.
    fn cache_invalidate(&mut self, region: &DmaRegion, offset: usize, len: usize) {
        let _ = (region, offset, len);
    }

    /// Monotonic time in nanoseconds.
    fn now_ns(&mut self) -> u64;

    /// Waits at least `ns` nanoseconds (sleep, `wfe`, or a timer spin).
    fn delay_ns(&mut self, ns: u64);

    /// Waits for a device interrupt for at most `timeout_ns`. The default
    /// says the platform can not; the core then polls.
    fn wait_irq(&mut self, timeout_ns: u64) -> IrqWait {
        let _ = timeout_ns;
        IrqWait::Unsupported
    }
}

/// Direct mode: the core drives the register page itself.
pub trait DirectIo: Platform {
    /// Reads the 32-bit register at `offset` of the register page.
    fn read_reg(&mut self, offset: u32) -> Result<u32, PlatformError>;

    /// Writes the 32-bit register at `offset`.
    fn write_reg(&mut self, offset: u32, value: u32) -> Result<(), PlatformError>;

    /// Rings engine `engine`'s doorbell, after the core published its
    /// write pointer (MMIO: the engine's DOORBELL register; ivshmem: the
    /// doorbell vector, `docs/refgpu.md` section 2.3).
    fn doorbell(&mut self, engine: u32) -> Result<(), PlatformError>;

    /// Applies control-register writes (CTRL, IRQ_MASK, MMU_*). MMIO
    /// platforms apply them on the write and need nothing here; ivshmem
    /// rings the control doorbell.
    fn control_doorbell(&mut self) -> Result<(), PlatformError> {
        Ok(())
    }
}

/// A point a kernel-mediated submission waits for or signals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSync {
    /// Engine whose timeline it is.
    pub engine: u32,
    /// Value on that timeline.
    pub value: u64,
}

/// Kernel-mediated mode: the kernel owns the rings and the page tables.
pub trait KernelIo: Platform {
    /// The chip's ID register value, as the kernel driver reports it (a
    /// DRM driver exposes it through its info ioctl).
    fn chip_id(&mut self) -> Result<u32, PlatformError>;

    /// Binds `len` bytes of `region` at GPU address `va` (the UMD chose
    /// `va`, as libdrm's VA manager does).
    fn bind_va(
        &mut self,
        va: u64,
        region: &DmaRegion,
        len: usize,
        writable: bool,
    ) -> Result<(), PlatformError>;

    /// Removes a binding made by [`KernelIo::bind_va`].
    fn unbind_va(&mut self, va: u64, len: usize) -> Result<(), PlatformError>;

    /// Submits the IB at `ib_va` (`ib_dwords` long) to `engine`, after the
    /// `waits` have signalled; the kernel signals `signal` when it is done.
    fn submit(
        &mut self,
        engine: u32,
        ib_va: u64,
        ib_dwords: u32,
        waits: &[KernelSync],
        signal: KernelSync,
    ) -> Result<(), PlatformError>;

    /// The last value `engine`'s timeline reached, or why the kernel
    /// abandoned its work ([`KernelError`]).
    fn completed(&mut self, engine: u32) -> Result<u64, KernelError>;
}

/// How a kernel reports that it gave up on an engine's work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelError {
    /// The kernel reset the engine after a hang; work up to `upto` failed.
    Reset {
        /// The last value of the timeline the reset cancelled.
        upto: u64,
    },
    /// The device is gone.
    DeviceLost,
    /// Another platform error.
    Platform(PlatformError),
}
