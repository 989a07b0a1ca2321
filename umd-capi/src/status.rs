//! `enum umd_status`: every outcome of every call, and the conversions
//! from the core's typed errors.

use core::ffi::c_char;

use umd_core::direct::InitError;
use umd_core::engine::events::EventError;
use umd_core::error::{SubmitError, WaitError};
use umd_core::mem::{AllocError, BufferError};
use umd_core::platform::PlatformError;

/// What a call did. `UMD_OK` is 0; every error is negative, and after one
/// nothing changed (no buffer, fence, event or device state).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum umd_status {
    /// Done.
    UMD_OK = 0,
    /// A required pointer argument was NULL.
    UMD_ERR_NULL = -1,
    /// A pointer argument was not aligned as its type (or the storage as
    /// `UMD_DEVICE_STORAGE_ALIGN`) requires.
    UMD_ERR_MISALIGNED = -2,
    /// A length argument was too small (the device storage, an output
    /// buffer).
    UMD_ERR_TOO_SMALL = -3,
    /// An integer argument was outside its documented values (an unknown
    /// enum value, flag bit or command kind, a zero size).
    UMD_ERR_INVALID_ARGUMENT = -4,
    /// The pointer does not name a live device (never initialised, shut
    /// down, or not a device at all).
    UMD_ERR_NOT_A_DEVICE = -5,
    /// The storage already holds a live device, or a capture already runs
    /// on the device.
    UMD_ERR_BUSY = -6,
    /// The handle never named an object of this kind on this device
    /// (forged, or a handle of another kind).
    UMD_ERR_BAD_HANDLE = -7,
    /// The handle's object was freed or destroyed.
    UMD_ERR_STALE_HANDLE = -8,
    /// The handle belongs to another device.
    UMD_ERR_FOREIGN_HANDLE = -9,
    /// An access past the end of a buffer.
    UMD_ERR_OUT_OF_RANGE = -10,
    /// The buffer is device-only: the CPU can not reach it.
    UMD_ERR_NO_CPU_ACCESS = -11,
    /// The queue does not exist on this device.
    UMD_ERR_UNKNOWN_QUEUE = -12,
    /// Memory, a table or GPU address space ran out.
    UMD_ERR_OUT_OF_MEMORY = -13,
    /// A command was refused by the encoder (an operand out of range or
    /// misaligned for this generation).
    UMD_ERR_ENCODE = -14,
    /// More waits, declared buffers or pending submissions than the
    /// driver's fixed limits.
    UMD_ERR_TOO_MANY = -15,
    /// The submission waits on a fence that failed, or would close a
    /// cycle of waits; or it waits on its own queue's future.
    UMD_ERR_DEPENDENCY = -16,
    /// The queue is recovering from a hang or fault; try again.
    UMD_ERR_RECOVERING = -17,
    /// The time passed.
    UMD_ERR_TIMEOUT = -18,
    /// The work failed (hang, fault, or work it waited on failed); the
    /// hang report says why.
    UMD_ERR_FENCE_FAILED = -19,
    /// The fence names a submission not made yet.
    UMD_ERR_NOT_SUBMITTED = -20,
    /// The device is gone.
    UMD_ERR_DEVICE_LOST = -21,
    /// Not supported by this device or platform.
    UMD_ERR_UNSUPPORTED = -22,
    /// A platform callback failed (an OS error, or a block from
    /// `dma_alloc` that breaks its contract).
    UMD_ERR_PLATFORM = -23,
    /// Bring-up failed: the chip is not supported, the configuration does
    /// not fit, or the device did not answer a handshake.
    UMD_ERR_INIT = -24,
    /// There is nothing to report (no hang yet).
    UMD_ERR_NOT_FOUND = -25,
    /// The text did not fit the caller's buffer: it holds the beginning,
    /// NUL-terminated.
    UMD_ERR_TRUNCATED = -26,
    /// The buffer is mapped or moving; try again.
    UMD_ERR_BUFFER_BUSY = -27,
}

use umd_status::*;

/// Static, NUL-terminated text for `status` (any integer: an unknown value
/// gives "unknown status"). Never blocks.
#[no_mangle]
pub extern "C" fn umd_status_str(status: i32) -> *const c_char {
    let s: &'static core::ffi::CStr = match status {
        0 => c"ok",
        -1 => c"a required pointer was NULL",
        -2 => c"a pointer was misaligned",
        -3 => c"a length was too small",
        -4 => c"an argument was outside its documented values",
        -5 => c"not a live device",
        -6 => c"the storage already holds a live device, or a capture runs",
        -7 => c"the handle never named such an object on this device",
        -8 => c"the handle's object was freed",
        -9 => c"the handle belongs to another device",
        -10 => c"an access past the end of a buffer",
        -11 => c"the buffer is device-only",
        -12 => c"no such queue",
        -13 => c"out of memory",
        -14 => c"a command was refused by the encoder",
        -15 => c"a fixed limit was exceeded",
        -16 => c"a dependency failed or would deadlock",
        -17 => c"the queue is recovering",
        -18 => c"timed out",
        -19 => c"the work failed",
        -20 => c"the fence was not submitted",
        -21 => c"device lost",
        -22 => c"not supported",
        -23 => c"a platform call failed",
        -24 => c"bring-up failed",
        -25 => c"nothing to report",
        -26 => c"the text was truncated",
        -27 => c"the buffer is mapped or moving",
        _ => c"unknown status",
    };
    s.as_ptr()
}

pub(crate) fn platform(e: PlatformError) -> umd_status {
    match e {
        PlatformError::OutOfMemory { .. } => UMD_ERR_OUT_OF_MEMORY,
        PlatformError::DeviceLost => UMD_ERR_DEVICE_LOST,
        PlatformError::Unsupported => UMD_ERR_UNSUPPORTED,
        _ => UMD_ERR_PLATFORM,
    }
}

impl From<BufferError> for umd_status {
    fn from(e: BufferError) -> umd_status {
        match e {
            BufferError::ForeignDevice { .. } => UMD_ERR_FOREIGN_HANDLE,
            BufferError::Unknown => UMD_ERR_BAD_HANDLE,
            BufferError::Stale => UMD_ERR_STALE_HANDLE,
            BufferError::NoCpuAccess => UMD_ERR_NO_CPU_ACCESS,
            BufferError::OutOfRange { .. } => UMD_ERR_OUT_OF_RANGE,
            _ => UMD_ERR_BUFFER_BUSY,
        }
    }
}

impl From<AllocError> for umd_status {
    fn from(e: AllocError) -> umd_status {
        match e {
            AllocError::ZeroSize | AllocError::BadAlignment { .. } | AllocError::TooLarge { .. } => {
                UMD_ERR_INVALID_ARGUMENT
            }
            AllocError::DeviceLost => UMD_ERR_DEVICE_LOST,
            _ => UMD_ERR_OUT_OF_MEMORY,
        }
    }
}

impl From<SubmitError> for umd_status {
    fn from(e: SubmitError) -> umd_status {
        match e {
            SubmitError::UnknownQueue(_) => UMD_ERR_UNKNOWN_QUEUE,
            SubmitError::Empty => UMD_ERR_INVALID_ARGUMENT,
            SubmitError::Encode(_) | SubmitError::IbTooLarge { .. } | SubmitError::Invalid(_) => {
                UMD_ERR_ENCODE
            }
            SubmitError::PoolEmpty | SubmitError::RingFull(_) => UMD_ERR_OUT_OF_MEMORY,
            SubmitError::TooManyWaits { .. }
            | SubmitError::TooManyPending(_)
            | SubmitError::TooManyBuffers { .. }
            | SubmitError::WorkingSetTooLarge { .. }
            | SubmitError::HistoryFull(_) => UMD_ERR_TOO_MANY,
            SubmitError::Cycle(_) | SubmitError::DependencyFailed { .. } | SubmitError::WaitsOnItself(_) => {
                UMD_ERR_DEPENDENCY
            }
            SubmitError::ForeignFence(_) => UMD_ERR_FOREIGN_HANDLE,
            SubmitError::Buffer(b) => b.into(),
            SubmitError::DeviceLost => UMD_ERR_DEVICE_LOST,
            SubmitError::Platform(p) => platform(p),
            SubmitError::QueueRecovering(_) => UMD_ERR_RECOVERING,
            SubmitError::BufferMoving(_) => UMD_ERR_BUFFER_BUSY,
            _ => UMD_ERR_UNSUPPORTED,
        }
    }
}

impl From<WaitError> for umd_status {
    fn from(e: WaitError) -> umd_status {
        match e {
            WaitError::Timeout => UMD_ERR_TIMEOUT,
            WaitError::NotSubmitted(_) => UMD_ERR_NOT_SUBMITTED,
            WaitError::UnknownQueue(_) => UMD_ERR_UNKNOWN_QUEUE,
            WaitError::ForeignFence(_) => UMD_ERR_FOREIGN_HANDLE,
            WaitError::Failed(umd_core::sync::FenceError::DeviceLost) => UMD_ERR_DEVICE_LOST,
            _ => UMD_ERR_FENCE_FAILED,
        }
    }
}

impl From<EventError> for umd_status {
    fn from(e: EventError) -> umd_status {
        match e {
            EventError::Buffer(b) => b.into(),
            EventError::Timeout => UMD_ERR_TIMEOUT,
            EventError::DeviceLost => UMD_ERR_DEVICE_LOST,
        }
    }
}

impl From<InitError> for umd_status {
    fn from(e: InitError) -> umd_status {
        match e {
            InitError::Platform(p) => platform(p),
            _ => UMD_ERR_INIT,
        }
    }
}
