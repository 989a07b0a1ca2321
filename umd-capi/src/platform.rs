//! The C platform: a struct of function pointers and a context pointer,
//! and the Rust side that implements [`Platform`] and [`DirectIo`] over it.

use core::ffi::c_void;
use core::ptr::NonNull;

use umd_core::platform::{DirectIo, DmaFlags, DmaRegion, IrqWait, Platform, PlatformError, SpinLock};

use crate::status::umd_status;

/// One block of GPU-visible memory, as the C platform hands it out and
/// takes it back.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct umd_dma {
    /// The CPU's pointer to the first byte: at least 8-byte aligned (the
    /// driver reads 64-bit fence words atomically; 4096 is usual), valid
    /// for reads and writes of `len` bytes; NULL only for memory allocated
    /// with `UMD_DMA_DEVICE_ONLY`.
    pub cpu: *mut c_void,
    /// The address the GPU uses for the first byte (a physical address in
    /// direct mode), 4096-byte aligned.
    pub dev_addr: u64,
    /// Length in bytes: at least the length asked.
    pub len: usize,
    /// The platform's own name for the block (0 when it needs none); given
    /// back unchanged to `dma_free`.
    pub handle: u64,
}

/// `dma_alloc` flag: the CPU need not reach the memory (`cpu` may be NULL).
pub const UMD_DMA_DEVICE_ONLY: u32 = 1;

/// What `wait_irq` reports: an interrupt arrived.
pub const UMD_IRQ_INTERRUPT: i32 = 0;
/// What `wait_irq` reports: the timeout passed with no interrupt.
pub const UMD_IRQ_TIMED_OUT: i32 = 1;
/// What `wait_irq` reports: this platform can not wait for interrupts (the
/// driver then polls, sleeping with `delay_ns`).
pub const UMD_IRQ_UNSUPPORTED: i32 = 2;

/// The platform a device runs on: what the driver needs from the board.
///
/// Every callback gets `ctx` first. Status-returning callbacks return
/// `UMD_OK` (0) on success, `UMD_ERR_OUT_OF_MEMORY`, `UMD_ERR_DEVICE_LOST`
/// or `UMD_ERR_UNSUPPORTED` for those failures, and any other value for an
/// OS error (reported to the caller as `UMD_ERR_PLATFORM`).
///
/// Preconditions (the C side of the driver's safety contract):
/// - the struct is copied at `umd_device_init`; `ctx` and the callbacks
///   must stay valid until `umd_device_shutdown` returns;
/// - the callbacks are called from whichever thread or task calls into the
///   API (several at once when several call at once), never from an
///   interrupt handler, and must be safe to call that way;
/// - `dma_alloc` returns zeroed memory that nothing else on the CPU touches
///   until it comes back through `dma_free`, and the GPU reaches the same
///   bytes at `dev_addr` (after `cache_clean`, on a non-coherent system);
/// - `now_ns` is monotonic;
/// - no callback calls back into this API.
///
/// The driver's locks are its own spin lock (`docs/c-api.md`, "Threads and
/// reentrancy"): it holds one only for bounded bookkeeping, never across a
/// callback that may block (`delay_ns`, `wait_irq`) or across a wait.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct umd_platform {
    /// Passed to every callback.
    pub ctx: *mut c_void,
    /// Required. Allocates `len` bytes (a multiple of 4096) of zeroed
    /// GPU-visible memory into `*out` (flags: `UMD_DMA_DEVICE_ONLY`).
    pub dma_alloc:
        Option<unsafe extern "C" fn(ctx: *mut c_void, len: usize, flags: u32, out: *mut umd_dma) -> i32>,
    /// Required. Gives back a block `dma_alloc` returned (the same four
    /// fields).
    pub dma_free: Option<unsafe extern "C" fn(ctx: *mut c_void, region: *const umd_dma)>,
    /// Required. Reads the 32-bit register at byte `offset` of the register
    /// page into `*value`.
    pub read_reg: Option<unsafe extern "C" fn(ctx: *mut c_void, offset: u32, value: *mut u32) -> i32>,
    /// Required. Writes the 32-bit register at byte `offset`.
    pub write_reg: Option<unsafe extern "C" fn(ctx: *mut c_void, offset: u32, value: u32) -> i32>,
    /// Required. Rings engine `engine`'s doorbell.
    pub doorbell: Option<unsafe extern "C" fn(ctx: *mut c_void, engine: u32) -> i32>,
    /// Optional (NULL: control-register writes apply at once, as on MMIO).
    /// Applies control-register writes (the shared-memory bindings' control
    /// doorbell).
    pub control_doorbell: Option<unsafe extern "C" fn(ctx: *mut c_void) -> i32>,
    /// Required. Monotonic time in nanoseconds.
    pub now_ns: Option<unsafe extern "C" fn(ctx: *mut c_void) -> u64>,
    /// Required. Waits at least `ns` nanoseconds.
    pub delay_ns: Option<unsafe extern "C" fn(ctx: *mut c_void, ns: u64)>,
    /// Optional (NULL: coherent). Makes CPU writes to
    /// `region[offset, offset + len)` visible to the GPU.
    pub cache_clean:
        Option<unsafe extern "C" fn(ctx: *mut c_void, region: *const umd_dma, offset: usize, len: usize)>,
    /// Optional (NULL: coherent). Makes GPU writes to
    /// `region[offset, offset + len)` visible to the CPU.
    pub cache_invalidate:
        Option<unsafe extern "C" fn(ctx: *mut c_void, region: *const umd_dma, offset: usize, len: usize)>,
    /// Optional (NULL: the driver polls). Waits at most `timeout_ns` for a
    /// device interrupt; returns one of `UMD_IRQ_*`.
    pub wait_irq: Option<unsafe extern "C" fn(ctx: *mut c_void, timeout_ns: u64) -> i32>,
}

type AllocFn = unsafe extern "C" fn(*mut c_void, usize, u32, *mut umd_dma) -> i32;
type FreeFn = unsafe extern "C" fn(*mut c_void, *const umd_dma);
type ReadFn = unsafe extern "C" fn(*mut c_void, u32, *mut u32) -> i32;
type WriteFn = unsafe extern "C" fn(*mut c_void, u32, u32) -> i32;
type BellFn = unsafe extern "C" fn(*mut c_void, u32) -> i32;
type NowFn = unsafe extern "C" fn(*mut c_void) -> u64;
type DelayFn = unsafe extern "C" fn(*mut c_void, u64);

/// A checked [`umd_platform`]: the required callbacks present.
#[derive(Debug)]
pub(crate) struct CPlatform {
    c: umd_platform,
    dma_alloc: AllocFn,
    dma_free: FreeFn,
    read_reg: ReadFn,
    write_reg: WriteFn,
    doorbell: BellFn,
    now_ns: NowFn,
    delay_ns: DelayFn,
}

// SAFETY: the C contract of `umd_platform`: its callbacks may be called
// from any thread that calls into the API, several at once.
unsafe impl Send for CPlatform {}
// SAFETY: as for `Send`; the struct itself is only read after init.
unsafe impl Sync for CPlatform {}

impl CPlatform {
    /// The platform, if every required callback is there.
    pub(crate) fn new(c: umd_platform) -> Option<CPlatform> {
        Some(CPlatform {
            dma_alloc: c.dma_alloc?,
            dma_free: c.dma_free?,
            read_reg: c.read_reg?,
            write_reg: c.write_reg?,
            doorbell: c.doorbell?,
            now_ns: c.now_ns?,
            delay_ns: c.delay_ns?,
            c,
        })
    }
}

/// A callback's status as the core's platform error.
fn result(rc: i32) -> Result<(), PlatformError> {
    match rc {
        0 => Ok(()),
        x if x == umd_status::UMD_ERR_OUT_OF_MEMORY as i32 => Err(PlatformError::OutOfMemory { len: 0 }),
        x if x == umd_status::UMD_ERR_DEVICE_LOST as i32 => Err(PlatformError::DeviceLost),
        x if x == umd_status::UMD_ERR_UNSUPPORTED as i32 => Err(PlatformError::Unsupported),
        x => Err(PlatformError::Os(x)),
    }
}

/// The C view of a region.
fn c_region(r: &DmaRegion) -> umd_dma {
    umd_dma {
        cpu: r.cpu_ptr().map_or(core::ptr::null_mut(), |p| p.as_ptr().cast()),
        dev_addr: r.dev_addr(),
        len: r.len(),
        handle: r.handle(),
    }
}

/// The status a platform returns when its `dma_alloc` handed out a block
/// that breaks the contract (too short, misaligned, no CPU pointer).
pub(crate) const BAD_REGION: i32 = umd_status::UMD_ERR_PLATFORM as i32;

// SAFETY: the regions come from the C platform under the contract written
// on `umd_platform` (valid, aligned, zeroed, exclusively ours); what can be
// checked is checked before a region is made (length, alignment, a CPU
// pointer where one is needed); `now_ns` is monotonic by that contract.
unsafe impl Platform for CPlatform {
    type RawMutex = SpinLock;

    fn dma_alloc(&self, len: usize, flags: DmaFlags) -> Result<DmaRegion, PlatformError> {
        let mut out = umd_dma { cpu: core::ptr::null_mut(), dev_addr: 0, len: 0, handle: 0 };
        let f = if flags.device_only { UMD_DMA_DEVICE_ONLY } else { 0 };
        // SAFETY: the callback's contract (`umd_platform`); `out` is valid.
        result(unsafe { (self.dma_alloc)(self.c.ctx, len, f, &mut out) })?;
        let cpu = NonNull::new(out.cpu.cast::<u8>());
        let aligned = out.dev_addr & 0xFFF == 0 && out.cpu.cast::<u64>().is_aligned();
        if out.len < len || !aligned || (cpu.is_none() && !flags.device_only) {
            // SAFETY: `out` is the block the platform just returned.
            unsafe { (self.dma_free)(self.c.ctx, &out) };
            return Err(PlatformError::Os(BAD_REGION));
        }
        // SAFETY: checked above: long enough, 4 KiB aligned on the device
        // side and 8-byte aligned on the CPU side (the core's widest atomic
        // access), a CPU pointer unless device-only; the rest (valid, zeroed, ours
        // alone, the same bytes at `dev_addr`) is the C contract.
        Ok(unsafe { DmaRegion::with_handle(cpu, out.dev_addr, out.len, out.handle) })
    }

    fn dma_free(&self, region: DmaRegion) {
        let r = c_region(&region);
        // SAFETY: `r` names a block `dma_alloc` returned, given back once.
        unsafe { (self.dma_free)(self.c.ctx, &r) }
    }

    fn cache_clean(&self, region: &DmaRegion, offset: usize, len: usize) {
        if let Some(f) = self.c.cache_clean {
            let r = c_region(region);
            // SAFETY: the callback's contract; `r` names a live block.
            unsafe { f(self.c.ctx, &r, offset, len) }
        }
    }

    fn cache_invalidate(&self, region: &DmaRegion, offset: usize, len: usize) {
        if let Some(f) = self.c.cache_invalidate {
            let r = c_region(region);
            // SAFETY: the callback's contract; `r` names a live block.
            unsafe { f(self.c.ctx, &r, offset, len) }
        }
    }

    fn now_ns(&self) -> u64 {
        // SAFETY: the callback's contract.
        unsafe { (self.now_ns)(self.c.ctx) }
    }

    fn delay_ns(&self, ns: u64) {
        // SAFETY: the callback's contract.
        unsafe { (self.delay_ns)(self.c.ctx, ns) }
    }

    fn wait_irq(&self, timeout_ns: u64) -> IrqWait {
        let Some(f) = self.c.wait_irq else {
            return IrqWait::Unsupported;
        };
        // SAFETY: the callback's contract.
        match unsafe { f(self.c.ctx, timeout_ns) } {
            UMD_IRQ_INTERRUPT => IrqWait::Interrupt,
            UMD_IRQ_TIMED_OUT => IrqWait::TimedOut,
            _ => IrqWait::Unsupported,
        }
    }
}

impl DirectIo for CPlatform {
    fn read_reg(&self, offset: u32) -> Result<u32, PlatformError> {
        let mut v = 0u32;
        // SAFETY: the callback's contract; `v` is valid for the write.
        result(unsafe { (self.read_reg)(self.c.ctx, offset, &mut v) })?;
        Ok(v)
    }

    fn write_reg(&self, offset: u32, value: u32) -> Result<(), PlatformError> {
        // SAFETY: the callback's contract.
        result(unsafe { (self.write_reg)(self.c.ctx, offset, value) })
    }

    fn doorbell(&self, engine: u32) -> Result<(), PlatformError> {
        // SAFETY: the callback's contract.
        result(unsafe { (self.doorbell)(self.c.ctx, engine) })
    }

    fn control_doorbell(&self) -> Result<(), PlatformError> {
        match self.c.control_doorbell {
            // SAFETY: the callback's contract.
            Some(f) => result(unsafe { f(self.c.ctx) }),
            None => Ok(()),
        }
    }
}
