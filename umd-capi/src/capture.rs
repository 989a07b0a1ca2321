//! Command-stream capture through the C API (feature `capture`): the
//! committed submissions of a device recorded into a caller's buffer as a
//! `.rgcs` capture file (`docs/capture-and-dump.md`), which `umd-dump`
//! decodes.

use core::ffi::c_void;

use umd_core::debug::capture::{lost_record, Capture, CaptureSink, SinkError, LOST_BYTES};
use umd_core::decode::STREAM_HEADER_LEN;

use crate::device::{capture_ctl, live, umd_device};
use crate::status::umd_status::{self, *};

/// The smallest buffer `umd_capture_start` takes: the capture file's
/// header and the loss record kept in reserve.
pub const UMD_CAPTURE_MIN_BYTES: usize = 40;
const _: () = assert!(UMD_CAPTURE_MIN_BYTES == STREAM_HEADER_LEN + LOST_BYTES);

/// A capture file filling a caller's buffer from its start: whole records
/// only, the first ones that fit; once one did not, every later one is
/// refused too (the file stays a prefix of the capture). The last
/// `LOST_BYTES` are kept for the loss record written at the end.
pub(crate) struct BufSink {
    buf: &'static mut [u8],
    len: usize,
    full: bool,
}

impl BufSink {
    /// Bytes records may use (the loss record's reserve left out).
    fn room(&self) -> usize {
        self.buf.len().saturating_sub(LOST_BYTES).saturating_sub(self.len)
    }

    /// Appends the loss record into the reserve.
    fn close(&mut self, lost: u64) {
        let r = lost_record(lost);
        let end = self.len.saturating_add(r.len());
        if let Some(d) = self.buf.get_mut(self.len..end) {
            copy(d, &r);
            self.len = end;
        }
    }
}

/// Copies `src` into `dst` (of the same length), without
/// `copy_from_slice`'s length check (a panic path the optimiser can not
/// always remove).
fn copy(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = *s;
    }
}

impl CaptureSink for BufSink {
    fn begin(&mut self, len: usize) -> Result<(), SinkError> {
        if self.full || len > self.room() {
            self.full = true;
            return Err(SinkError);
        }
        Ok(())
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), SinkError> {
        // `begin` made room for the whole record.
        if self.full || bytes.len() > self.room() {
            self.full = true;
            return Err(SinkError);
        }
        let end = self.len.saturating_add(bytes.len());
        copy(self.buf.get_mut(self.len..end).ok_or(SinkError)?, bytes);
        self.len = end;
        Ok(())
    }
}

/// The per-device state of the C API's capture: whether a session runs.
/// Its lock is held for the whole of a start and a stop; the session's
/// sink is the slot's `capture_sink`, borrowed by the core while the
/// session runs.
pub(crate) struct CaptureCtl {
    running: spin::Mutex<bool>,
}

impl CaptureCtl {
    pub(crate) const fn new() -> Self {
        CaptureCtl { running: spin::Mutex::new(false) }
    }
}

/// Starts recording every submission of the queues in `queues` (bit `q`
/// for queue `q`, `1 << UMD_QUEUE_GFX` ...; at least one, each an existing
/// queue) once it reached the hardware, into `buf` (`len` bytes, at least
/// `UMD_CAPTURE_MIN_BYTES`) as a `.rgcs` capture file: its header now,
/// then one record per submission (its fence, the fences it waited for,
/// its commands with every CHAIN followed). Records are whole: the first
/// ones that fit are kept, and once one did not fit every later one is
/// counted as lost (never blocking or failing a submission).
/// `umd_capture_stop` ends the capture and gives its length.
///
/// `UMD_ERR_BUSY` when a capture already runs on the device; a NULL `buf`,
/// a `len` too small or a bad `queues` start nothing.
///
/// Never blocks (takes the device's capture lock, which a submission
/// holds only while copying its record).
///
/// # Safety
/// `dev` as for every call; `buf` NULL or valid for writes of `len`
/// bytes, neither read nor written by the caller, moved or freed until
/// `umd_capture_stop` or `umd_device_shutdown` returns.
#[no_mangle]
pub unsafe extern "C" fn umd_capture_start(
    dev: *const umd_device,
    buf: *mut c_void,
    len: usize,
    queues: u32,
) -> umd_status {
    // SAFETY: the precondition.
    let d = match unsafe { live(dev) } {
        Ok((d, _)) => d,
        Err(e) => return e,
    };
    if buf.is_null() {
        return UMD_ERR_NULL;
    }
    if len < UMD_CAPTURE_MIN_BYTES {
        return UMD_ERR_TOO_SMALL;
    }
    if queues == 0 || queues.checked_shr(d.queue_count() as u32).unwrap_or(0) != 0 {
        return UMD_ERR_INVALID_ARGUMENT;
    }
    // SAFETY: a live device (checked above).
    let (ctl, sink) = unsafe { capture_ctl(dev) };
    let mut running = ctl.running.lock();
    if *running {
        return UMD_ERR_BUSY;
    }
    // SAFETY: non-NULL, valid for `len` bytes and the caller's own until
    // the capture ends (the precondition).
    let bytes = unsafe { core::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
    // SAFETY: no session runs (`running` is false under its lock), so
    // nothing else reaches the sink; the storage outlives the device
    // (the precondition of `umd_device_init`), and the device drops the
    // session before its storage is given back.
    let sink = unsafe {
        sink.write(BufSink { buf: bytes, len: 0, full: false });
        &mut *sink
    };
    // No session ran (none is started but here), so none is given back.
    let _ = d.start_capture(Capture::to_sink(sink).queues(queues));
    *running = true;
    UMD_OK
}

/// What a capture recorded.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct umd_capture_result {
    /// Bytes of the capture file at the start of the buffer (write them
    /// to a `.rgcs` file for `umd-dump`).
    pub bytes: u64,
    /// Submissions recorded.
    pub recorded: u64,
    /// Submissions that did not fit (counted in a loss record at the end
    /// of the file).
    pub lost: u64,
}

/// Ends the running capture and writes what it recorded to `*out`: the
/// buffer given to `umd_capture_start` then holds a complete capture file
/// of `out->bytes` bytes and is the caller's again.
///
/// `UMD_ERR_NOT_FOUND` when no capture runs; a NULL or misaligned `out`
/// leaves the capture running.
///
/// Never blocks (as `umd_capture_start`).
///
/// # Safety
/// `dev` as for every call; `out` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn umd_capture_stop(
    dev: *const umd_device,
    out: *mut umd_capture_result,
) -> umd_status {
    // SAFETY: the precondition.
    let d = match unsafe { live(dev) } {
        Ok((d, _)) => d,
        Err(e) => return e,
    };
    if out.is_null() {
        return UMD_ERR_NULL;
    }
    if !out.is_aligned() {
        return UMD_ERR_MISALIGNED;
    }
    // SAFETY: a live device (checked above).
    let (ctl, sink) = unsafe { capture_ctl(dev) };
    let mut running = ctl.running.lock();
    if !*running {
        return UMD_ERR_NOT_FOUND;
    }
    // The session (and its borrow of the sink) ends here.
    let _ = d.stop_capture();
    let stats = d.capture_stats();
    // SAFETY: written by `umd_capture_start` (a session ran); its session
    // was just dropped, so nothing else reaches it.
    let sink = unsafe { &mut *sink };
    if stats.lost > 0 {
        sink.close(stats.lost);
    }
    let r = umd_capture_result { bytes: sink.len as u64, recorded: stats.recorded, lost: stats.lost };
    *running = false;
    // SAFETY: checked non-NULL and aligned; valid by the precondition.
    unsafe { out.write(r) };
    UMD_OK
}
