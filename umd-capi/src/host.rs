//! The host build's convenience constructor (feature `host`): a C platform
//! over platform-linux's in-process model, so that C programs and tests on
//! Linux run the same API as firmware.

use core::ffi::c_void;
use core::ptr::NonNull;

use platform_linux::InProcess;
use refgpu_model::{Generation, ModelConfig};
use umd_core::platform::{DirectIo, DmaFlags, DmaRegion, IrqWait, Platform};

use crate::platform::{
    umd_dma, umd_platform, UMD_DMA_DEVICE_ONLY, UMD_IRQ_INTERRUPT, UMD_IRQ_TIMED_OUT, UMD_IRQ_UNSUPPORTED,
};
use crate::status::umd_status::{self, *};

/// The model behind a context pointer.
///
/// # Safety
/// `ctx` is the context `umd_host_inprocess_open` made and
/// `umd_host_inprocess_close` has not freed.
unsafe fn model<'a>(ctx: *mut c_void) -> &'a InProcess {
    // SAFETY: the caller's contract.
    unsafe { &*ctx.cast::<InProcess>() }
}

/// A platform status for C.
fn status(r: Result<(), umd_core::platform::PlatformError>) -> i32 {
    match r {
        Ok(()) => UMD_OK as i32,
        Err(e) => crate::status::platform(e) as i32,
    }
}

/// The region a C block names.
///
/// # Safety
/// `r` names a block this platform's `dma_alloc` returned.
unsafe fn region(r: &umd_dma) -> DmaRegion {
    // SAFETY: the block came from `InProcess::dma_alloc` with these fields.
    unsafe { DmaRegion::with_handle(NonNull::new(r.cpu.cast()), r.dev_addr, r.len, r.handle) }
}

unsafe extern "C" fn dma_alloc(ctx: *mut c_void, len: usize, flags: u32, out: *mut umd_dma) -> i32 {
    let f = if flags & UMD_DMA_DEVICE_ONLY != 0 { DmaFlags::DEVICE_ONLY } else { DmaFlags::CPU };
    // SAFETY: the context's contract.
    match unsafe { model(ctx) }.dma_alloc(len, f) {
        Ok(r) => {
            let c = umd_dma {
                cpu: r.cpu_ptr().map_or(core::ptr::null_mut(), |p| p.as_ptr().cast()),
                dev_addr: r.dev_addr(),
                len: r.len(),
                handle: r.handle(),
            };
            // SAFETY: the library passes a valid `out`.
            unsafe { out.write(c) };
            UMD_OK as i32
        }
        Err(e) => crate::status::platform(e) as i32,
    }
}

unsafe extern "C" fn dma_free(ctx: *mut c_void, r: *const umd_dma) {
    // SAFETY: the context's contract; `r` names a block of ours.
    unsafe { model(ctx).dma_free(region(&*r)) }
}

unsafe extern "C" fn read_reg(ctx: *mut c_void, offset: u32, value: *mut u32) -> i32 {
    // SAFETY: the context's contract.
    match unsafe { model(ctx) }.read_reg(offset) {
        Ok(v) => {
            // SAFETY: the library passes a valid `value`.
            unsafe { value.write(v) };
            UMD_OK as i32
        }
        Err(e) => crate::status::platform(e) as i32,
    }
}

unsafe extern "C" fn write_reg(ctx: *mut c_void, offset: u32, value: u32) -> i32 {
    // SAFETY: the context's contract.
    status(unsafe { model(ctx) }.write_reg(offset, value))
}

unsafe extern "C" fn doorbell(ctx: *mut c_void, engine: u32) -> i32 {
    // SAFETY: the context's contract.
    status(unsafe { model(ctx) }.doorbell(engine))
}

unsafe extern "C" fn control_doorbell(ctx: *mut c_void) -> i32 {
    // SAFETY: the context's contract.
    status(unsafe { model(ctx) }.control_doorbell())
}

unsafe extern "C" fn now_ns(ctx: *mut c_void) -> u64 {
    // SAFETY: the context's contract.
    unsafe { model(ctx) }.now_ns()
}

unsafe extern "C" fn delay_ns(ctx: *mut c_void, ns: u64) {
    // SAFETY: the context's contract.
    unsafe { model(ctx) }.delay_ns(ns)
}

unsafe extern "C" fn cache_clean(ctx: *mut c_void, r: *const umd_dma, offset: usize, len: usize) {
    // SAFETY: the context's contract; `r` names a live block of ours.
    unsafe { model(ctx).cache_clean(&region(&*r), offset, len) }
}

unsafe extern "C" fn cache_invalidate(ctx: *mut c_void, r: *const umd_dma, offset: usize, len: usize) {
    // SAFETY: the context's contract; `r` names a live block of ours.
    unsafe { model(ctx).cache_invalidate(&region(&*r), offset, len) }
}

unsafe extern "C" fn wait_irq(ctx: *mut c_void, timeout_ns: u64) -> i32 {
    // SAFETY: the context's contract.
    match unsafe { model(ctx) }.wait_irq(timeout_ns) {
        IrqWait::Interrupt => UMD_IRQ_INTERRUPT,
        IrqWait::TimedOut => UMD_IRQ_TIMED_OUT,
        IrqWait::Unsupported => UMD_IRQ_UNSUPPORTED,
    }
}

/// Starts the functional model of a refgpu of generation `generation` (1
/// or 2) in this process (64 MiB of GPU memory, coherent) and fills
/// `*out` with a platform over it, for `umd_device_init`. Host builds
/// only (feature `host`). Never blocks.
///
/// # Safety
/// `out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn umd_host_inprocess_open(generation: u32, out: *mut umd_platform) -> umd_status {
    if out.is_null() {
        return UMD_ERR_NULL;
    }
    if !out.is_aligned() {
        return UMD_ERR_MISALIGNED;
    }
    let generation = match generation {
        1 => Generation::Gen1,
        2 => Generation::Gen2,
        _ => return UMD_ERR_INVALID_ARGUMENT,
    };
    let Ok(p) = InProcess::new(ModelConfig { generation, ..ModelConfig::default() }) else {
        return UMD_ERR_PLATFORM;
    };
    let ctx = Box::into_raw(Box::new(p)).cast::<c_void>();
    let c = umd_platform {
        ctx,
        dma_alloc: Some(dma_alloc),
        dma_free: Some(dma_free),
        read_reg: Some(read_reg),
        write_reg: Some(write_reg),
        doorbell: Some(doorbell),
        control_doorbell: Some(control_doorbell),
        now_ns: Some(now_ns),
        delay_ns: Some(delay_ns),
        cache_clean: Some(cache_clean),
        cache_invalidate: Some(cache_invalidate),
        wait_irq: Some(wait_irq),
    };
    // SAFETY: checked non-NULL and aligned; valid by the precondition.
    unsafe { out.write(c) };
    UMD_OK
}

/// Stops the model `umd_host_inprocess_open` started and clears `*p`.
/// The device over it must be shut down first. Blocks: briefly, while
/// the model's threads stop.
///
/// # Safety
/// `p` is NULL or a platform `umd_host_inprocess_open` filled, not closed
/// yet.
#[no_mangle]
pub unsafe extern "C" fn umd_host_inprocess_close(p: *mut umd_platform) -> umd_status {
    if p.is_null() {
        return UMD_ERR_NULL;
    }
    if !p.is_aligned() {
        return UMD_ERR_MISALIGNED;
    }
    // SAFETY: checked non-NULL and aligned; filled by `open` (the
    // precondition).
    let ctx = unsafe { (*p).ctx };
    if ctx.is_null() {
        return UMD_ERR_NULL;
    }
    // SAFETY: `ctx` is the box `open` leaked, freed once: `*p` is cleared.
    unsafe {
        drop(Box::from_raw(ctx.cast::<InProcess>()));
        (*p).ctx = core::ptr::null_mut();
    }
    UMD_OK
}
