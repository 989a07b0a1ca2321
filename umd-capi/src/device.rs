//! The device in caller-placed storage: bring-up, shutdown, statistics,
//! the hang report and the state dump.

use core::ffi::{c_char, c_void};
use core::fmt::{self, Write as _};
use core::mem::{align_of, size_of, MaybeUninit};
use core::ptr::{addr_of, addr_of_mut};
use core::sync::atomic::{AtomicU32, Ordering};

use umd_core::config::Config;
use umd_core::direct::{Device, InPlace, MmuMode};
use umd_core::engine::dump::DumpFormat;
use umd_core::engine::Event;
use umd_core::storage::DeviceStorage;

use crate::platform::{umd_platform, CPlatform};
use crate::status::umd_status::{self, *};

/// Buffers a device can hold at once (the storage's table).
pub const UMD_MAX_BUFFERS: u32 = 1024;
/// Events a device can hold at once.
pub const UMD_MAX_EVENTS: u32 = 64;

pub(crate) const BUFFERS: usize = UMD_MAX_BUFFERS as usize;
const EVENTS: usize = UMD_MAX_EVENTS as usize;

/// The device type behind the C API: direct mode, 16 IB chunks.
pub(crate) type Dev = Device<'static, CPlatform, 16>;

/// One entry of the event table.
#[derive(Clone, Copy)]
pub(crate) struct EventSlot {
    pub(crate) event: Option<Event>,
    pub(crate) gen: u32,
    /// Taken by an `umd_event_create` that is allocating the event (with
    /// the table's lock dropped: the allocation may wait).
    pub(crate) reserved: bool,
}

/// A live device's bookkeeping beside the core's: the events, which C
/// names by an entry of this table, so that their buffers' handles never
/// reach C (the core accesses an event's word with atomics only). A
/// buffer handle C forges from an event buffer's slot and generation is
/// refused by the core as unknown (`UMD_ERR_BAD_HANDLE`): the buffers of
/// events are the driver's own.
pub(crate) type Events = spin::Mutex<[EventSlot; EVENTS]>;

/// What `umd_device_init` writes into the caller's storage. Only ever
/// reached through raw pointers to its fields: the device holds the
/// storage and the platform by reference for its whole life.
#[repr(C)]
pub(crate) struct Slot {
    magic: AtomicU32,
    platform: CPlatform,
    pub(crate) events: Events,
    dev: Option<InPlace<'static, Dev>>,
    #[cfg(feature = "capture")]
    capture: crate::capture::CaptureCtl,
    /// The running capture's sink (`crate::capture`), written when it
    /// starts.
    #[cfg(feature = "capture")]
    capture_sink: MaybeUninit<crate::capture::BufSink>,
    dev_mem: MaybeUninit<Dev>,
    storage: DeviceStorage<BUFFERS>,
}

/// The value of `magic` while a device lives in the slot.
const LIVE: u32 = 0x554D_4431;

/// Bytes of storage `umd_device_init` needs (for a 64-bit target).
#[cfg(target_pointer_width = "64")]
pub const UMD_DEVICE_STORAGE_SIZE: usize = 356_352;
/// Bytes of storage `umd_device_init` needs (for a 32-bit target).
#[cfg(target_pointer_width = "32")]
pub const UMD_DEVICE_STORAGE_SIZE: usize = 335_872;
/// The alignment `umd_device_init` needs of its storage (a `union
/// umd_device_storage` has it).
pub const UMD_DEVICE_STORAGE_ALIGN: usize = 8;

// The header's figures hold for this build (checked at compile time;
// the sizes are the slot's rounded up to 4 KiB, so that a feature of the
// core that adds a field does not break the check).
const _: () = assert!(size_of::<Slot>() <= UMD_DEVICE_STORAGE_SIZE);
const _: () = assert!(align_of::<Slot>() <= UMD_DEVICE_STORAGE_ALIGN);
// (`umd_device_init` checks the storage's alignment as a `u64`'s.)
const _: () = assert!(UMD_DEVICE_STORAGE_ALIGN == align_of::<u64>());

/// Storage for one device with the size and alignment the library needs:
/// `static union umd_device_storage storage;` (zero-initialised or not:
/// `umd_device_init` writes all of it).
#[repr(C)]
pub union umd_device_storage {
    /// The bytes.
    pub bytes: [u8; UMD_DEVICE_STORAGE_SIZE],
    /// Gives the union its alignment.
    pub align: u64,
}

/// A device, as C holds it (a pointer into its storage): an incomplete
/// type in C.
pub struct umd_device {
    _opaque: [u8; 0],
}

/// `umd_device_init` MMU mode: on, 4 GiB of GPU virtual addresses from
/// 4 GiB up.
pub const UMD_MMU_ENABLED: u32 = 0;
/// `umd_device_init` MMU mode: off, GPU addresses are device addresses.
pub const UMD_MMU_BYPASS: u32 = 1;

/// The live device at `d`.
///
/// # Safety
/// `d` is NULL or points to at least `UMD_DEVICE_STORAGE_SIZE` readable
/// bytes (the C precondition of every call taking a device).
pub(crate) unsafe fn live<'a>(d: *const umd_device) -> Result<(&'a Dev, &'a Events), umd_status> {
    if d.is_null() {
        return Err(UMD_ERR_NULL);
    }
    if !d.cast::<Slot>().is_aligned() {
        return Err(UMD_ERR_MISALIGNED);
    }
    let s = d.cast::<Slot>();
    // SAFETY: aligned and readable (the precondition); `magic` is an
    // atomic that `umd_device_init` writes last and shutdown clears first.
    let magic = unsafe { &*addr_of!((*s).magic) };
    if magic.load(Ordering::Acquire) != LIVE {
        return Err(UMD_ERR_NOT_A_DEVICE);
    }
    // SAFETY: a live slot's `dev` and `events` are initialised and only
    // written again by shutdown, which the caller does not run at the same
    // time (`docs/c-api.md`, "Threads and reentrancy").
    let dev = unsafe { &*addr_of!((*s).dev) };
    // SAFETY: as above.
    let events = unsafe { &*addr_of!((*s).events) };
    dev.as_deref().map(|d| (d, events)).ok_or(UMD_ERR_NOT_A_DEVICE)
}

/// The capture state of the live device at `d`: its lock, and its sink's
/// place (initialised by `umd_capture_start`).
///
/// # Safety
/// `live(d)` succeeded (the slot is initialised).
#[cfg(feature = "capture")]
pub(crate) unsafe fn capture_ctl<'a>(
    d: *const umd_device,
) -> (&'a crate::capture::CaptureCtl, *mut crate::capture::BufSink) {
    // The storage is the caller's writable memory (given to
    // `umd_device_init` as such); the API passes it as `const` only
    // because most calls do not write it.
    let s = d.cast::<Slot>().cast_mut();
    // SAFETY: a live slot's `capture` is initialised (the precondition)
    // and only written again by the next `umd_device_init`.
    let ctl = unsafe { &*addr_of!((*s).capture) };
    // SAFETY: a place in the slot, not read here.
    let sink = unsafe { addr_of_mut!((*s).capture_sink) };
    (ctl, sink.cast())
}

/// Brings a device up in `storage` (`storage_len` bytes, at least
/// `UMD_DEVICE_STORAGE_SIZE`, aligned to `UMD_DEVICE_STORAGE_ALIGN`) over
/// `platform` (copied; its callbacks must stay valid until shutdown) with
/// MMU mode `mmu` (`UMD_MMU_ENABLED` or `UMD_MMU_BYPASS`), and sets
/// `*out` to it (a pointer to `storage`).
///
/// Blocks: yes, for the device's reset and MMU handshakes, then for a
/// fence round trip on every engine (a FENCE the CPU reads back, then the
/// engine's reset handshake), each step at most about 1 s. An engine that
/// stays silent costs about 1 s before bring-up goes on without it (the
/// hang check deals with it later), so with every engine silent the call
/// blocks about 1 s per engine and then fails with `UMD_ERR_INIT`, as it
/// does when a handshake is not answered. A device that answers takes
/// microseconds per step.
/// Not to be called on the same storage from two threads at once.
///
/// # Safety
/// `storage` is NULL or valid for writes of `storage_len` bytes and is not
/// moved, reused or freed until `umd_device_shutdown` returns; `platform`
/// and `out` are NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn umd_device_init(
    storage: *mut c_void,
    storage_len: usize,
    platform: *const umd_platform,
    mmu: u32,
    out: *mut *mut umd_device,
) -> umd_status {
    if storage.is_null() || platform.is_null() || out.is_null() {
        return UMD_ERR_NULL;
    }
    if !storage.cast::<u64>().is_aligned() || !out.is_aligned() {
        return UMD_ERR_MISALIGNED;
    }
    if !platform.is_aligned() {
        return UMD_ERR_MISALIGNED;
    }
    if storage_len < size_of::<Slot>() {
        return UMD_ERR_TOO_SMALL;
    }
    let mmu = match mmu {
        UMD_MMU_ENABLED => MmuMode::DEFAULT,
        UMD_MMU_BYPASS => MmuMode::Bypass,
        _ => return UMD_ERR_INVALID_ARGUMENT,
    };
    // SAFETY: checked non-NULL and aligned; valid by the precondition.
    let Some(p) = CPlatform::new(unsafe { *platform }) else {
        return UMD_ERR_NULL;
    };
    let s = storage.cast::<Slot>();
    // SAFETY: `storage` is valid for `size_of::<Slot>()` bytes (checked
    // above) and aligned (checked; `Slot`'s alignment is at most
    // `UMD_DEVICE_STORAGE_ALIGN`, asserted at compile time).
    let magic = unsafe { &*addr_of!((*s).magic) };
    if magic.load(Ordering::Acquire) == LIVE {
        return UMD_ERR_BUSY;
    }
    // SAFETY: as above; every field is written before it is read, through
    // raw pointers. (The storage's tables are a constant of all zeros,
    // `DeviceStorage::new` being so for `.bss`; an optimised build writes
    // it as a fill rather than building it on the stack, which the C
    // firmware's 64 KiB stack relies on.)
    unsafe {
        addr_of_mut!((*s).storage).write(const { DeviceStorage::new() });
        addr_of_mut!((*s).platform).write(p);
        addr_of_mut!((*s).events)
            .write(spin::Mutex::new([EventSlot { event: None, gen: 0, reserved: false }; EVENTS]));
        addr_of_mut!((*s).dev).write(None);
        #[cfg(feature = "capture")]
        addr_of_mut!((*s).capture).write(crate::capture::CaptureCtl::new());
    }
    // SAFETY: initialised above; the storage is the caller's until
    // shutdown (the precondition), so the borrows live as long as the
    // device, which shutdown ends before the storage is given back.
    let (platform, tables, mem) = unsafe {
        (&*addr_of!((*s).platform), &mut *addr_of_mut!((*s).storage), &mut *addr_of_mut!((*s).dev_mem))
    };
    match Dev::new_in(mem, platform, tables, Config::DEFAULT, mmu) {
        Ok(dev) => {
            // SAFETY: as above; nothing else reaches `dev` yet.
            unsafe { addr_of_mut!((*s).dev).write(Some(dev)) };
            magic.store(LIVE, Ordering::Release);
            // SAFETY: checked non-NULL and aligned.
            unsafe { *out = s.cast() };
            UMD_OK
        }
        Err(e) => e.into(),
    }
}

/// What was still allocated when a device was shut down.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct umd_shutdown_report {
    /// Buffers (and events) never freed.
    pub leaked_buffers: u64,
    /// Their requested bytes.
    pub leaked_bytes: u64,
    /// Freed buffers whose fences never came (device lost or hung),
    /// released now.
    pub released_waiting: u64,
}

/// Stops the device, gives its memory back to the platform and writes the
/// leak report to `*report` (which may be NULL). The storage is the
/// caller's again afterwards.
///
/// Blocks: yes, for the engines' reset handshakes, at most about 1 s each.
/// No other call on this device may run at the same time or afterwards.
///
/// # Safety
/// `dev` is NULL or points to at least `UMD_DEVICE_STORAGE_SIZE` readable
/// bytes; `report` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn umd_device_shutdown(
    dev: *mut umd_device,
    report: *mut umd_shutdown_report,
) -> umd_status {
    if !report.is_null() && !report.is_aligned() {
        return UMD_ERR_MISALIGNED;
    }
    // SAFETY: the precondition.
    if let Err(e) = unsafe { live(dev) } {
        return e;
    }
    let s = dev.cast::<Slot>();
    // SAFETY: a live slot (checked); no other call runs (the precondition).
    let taken = unsafe {
        (*addr_of!((*s).magic)).store(0, Ordering::Release);
        (*addr_of_mut!((*s).dev)).take()
    };
    let Some(d) = taken else {
        return UMD_ERR_NOT_A_DEVICE;
    };
    let r = InPlace::shutdown(d);
    if !report.is_null() {
        let out = umd_shutdown_report {
            leaked_buffers: r.leaked_buffers,
            leaked_bytes: r.leaked_bytes,
            released_waiting: r.released_waiting,
        };
        // SAFETY: checked non-NULL and aligned; valid by the precondition.
        unsafe { report.write(out) };
    }
    UMD_OK
}

/// Counters of a device's life.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct umd_stats {
    /// Submissions that reached the hardware.
    pub submissions: u64,
    /// Fences observed signalled.
    pub fences_signalled: u64,
    /// Hangs detected.
    pub hangs: u64,
    /// Faults reported.
    pub faults: u64,
    /// Queue resets performed.
    pub resets: u64,
    /// Fences failed because work they waited on failed.
    pub propagated_failures: u64,
    /// Service passes that found IRQ_STATUS bits set and cleared them (with
    /// or without interrupts: not the number of interrupts delivered).
    pub irq_status_acks: u64,
    /// Total ns spent waiting.
    pub wait_ns: u64,
    /// Live buffers (events included).
    pub live_buffers: u64,
    /// Their requested bytes.
    pub live_bytes: u64,
}

/// Writes the device's counters to `*out`. Never blocks (takes the
/// driver's memory lock for a bounded copy).
///
/// # Safety
/// `dev` as for every call; `out` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn umd_device_stats(dev: *const umd_device, out: *mut umd_stats) -> umd_status {
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
    let s = d.stats();
    let b = d.buffer_stats();
    let v = umd_stats {
        submissions: s.submissions,
        fences_signalled: s.fences_signalled,
        hangs: s.hangs,
        faults: s.faults,
        resets: s.resets,
        propagated_failures: s.propagated_failures,
        irq_status_acks: s.irq_status_acks,
        wait_ns: s.wait_ns,
        live_buffers: b.live,
        live_bytes: b.live_bytes,
    };
    // SAFETY: checked non-NULL and aligned; valid by the precondition.
    unsafe { out.write(v) };
    UMD_OK
}

/// Text into a caller's buffer: what fits, NUL-terminated, and the full
/// length counted.
struct Text<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl fmt::Write for Text<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for &b in s.as_bytes() {
            // The last byte is kept for the NUL.
            if self.len.saturating_add(1) < self.buf.len() {
                if let Some(slot) = self.buf.get_mut(self.len) {
                    *slot = b;
                }
            }
            self.len = self.len.saturating_add(1);
        }
        Ok(())
    }
}

/// Writes the last hang report (the queue, the reason, the engine's
/// registers and the decoded commands around the read pointer) as text
/// into `buf` (`cap` bytes, NUL-terminated) and its full length (without
/// the NUL) to `*len` (which may be NULL). `UMD_ERR_NOT_FOUND` when no hang
/// was seen; `UMD_ERR_TRUNCATED` when the text did not fit (`buf` holds its
/// beginning). Never blocks.
///
/// # Safety
/// `dev` as for every call; `buf` NULL or valid for writes of `cap`
/// bytes; `len` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn umd_last_hang(
    dev: *const umd_device,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> umd_status {
    // SAFETY: the precondition.
    let d = match unsafe { live(dev) } {
        Ok((d, _)) => d,
        Err(e) => return e,
    };
    if buf.is_null() {
        return UMD_ERR_NULL;
    }
    if cap == 0 {
        return UMD_ERR_TOO_SMALL;
    }
    if !len.is_null() && !len.is_aligned() {
        return UMD_ERR_MISALIGNED;
    }
    let Some(report) = d.last_hang() else {
        return UMD_ERR_NOT_FOUND;
    };
    // SAFETY: non-NULL, valid for `cap` bytes (the precondition).
    let out = unsafe { core::slice::from_raw_parts_mut(buf.cast::<u8>(), cap) };
    let mut t = Text { buf: out, len: 0 };
    let _ = write!(t, "{report}");
    let n = t.len;
    let end = n.min(cap.saturating_sub(1));
    if let Some(b) = t.buf.get_mut(end) {
        *b = 0;
    }
    if !len.is_null() {
        // SAFETY: checked non-NULL and aligned; valid by the precondition.
        unsafe { len.write(n) };
    }
    if n >= cap {
        UMD_ERR_TRUNCATED
    } else {
        UMD_OK
    }
}

/// `umd_device_dump_state` format: indented `key: value` lines, hang
/// reports with their decoded command windows.
pub const UMD_DUMP_TEXT: u32 = 0;
/// `umd_device_dump_state` format: one JSON object (the hang reports'
/// fields without their command windows).
pub const UMD_DUMP_JSON: u32 = 1;

/// Writes the whole driver state (`docs/capture-and-dump.md`, "The state
/// dump": the device, each queue with its fences, failed ranges and ring,
/// pending cross-queue waits, the IB pool, buffers, GPU addresses, the
/// counters and the kept hang and fault reports) as `format`
/// (`UMD_DUMP_TEXT` or `UMD_DUMP_JSON`) into `buf`, as `snprintf` does:
///
/// - `*written` (which may be NULL when `len` is not 0) is set to the
///   dump's full length in bytes, without the NUL;
/// - `buf` gets at most `len - 1` bytes of it and a NUL; `UMD_OK` when it
///   all fit (`*written < len`), else `UMD_ERR_TRUNCATED` (`buf` holds the
///   beginning; a truncated JSON dump does not parse);
/// - `len` 0 writes nothing to `buf` (which may then be NULL) and only
///   sets `*written` (`UMD_ERR_TRUNCATED`; `written` is required): a size
///   query. The state can grow between two calls (a hang reported
///   meanwhile), so allocate with room to spare or retry on
///   `UMD_ERR_TRUNCATED`.
///
/// An unknown `format` gives `UMD_ERR_INVALID_ARGUMENT`, a NULL `buf` with
/// `len` not 0 (or a NULL `written` with `len` 0) `UMD_ERR_NULL`, a
/// misaligned `written` `UMD_ERR_MISALIGNED`; these write nothing. The
/// device is never changed by a dump.
///
/// Never blocks: a queue whose submission lock is held by another thread
/// is shown `busy` without waiting for it; the driver's other locks
/// (dependency table, memory, hang log) are taken only for bounded walks
/// of fixed-size tables, which also bound the call's time (about one
/// register read per queue and a few KiB of text).
///
/// # Safety
/// `dev` as for every call; `buf` NULL or valid for writes of `len`
/// bytes; `written` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn umd_device_dump_state(
    dev: *const umd_device,
    format: u32,
    buf: *mut c_char,
    len: usize,
    written: *mut usize,
) -> umd_status {
    // SAFETY: the precondition.
    let d = match unsafe { live(dev) } {
        Ok((d, _)) => d,
        Err(e) => return e,
    };
    let format = match format {
        UMD_DUMP_TEXT => DumpFormat::Text,
        UMD_DUMP_JSON => DumpFormat::Json,
        _ => return UMD_ERR_INVALID_ARGUMENT,
    };
    if (len != 0 && buf.is_null()) || (len == 0 && written.is_null()) {
        return UMD_ERR_NULL;
    }
    if !written.is_null() && !written.is_aligned() {
        return UMD_ERR_MISALIGNED;
    }
    let out: &mut [u8] = if len == 0 {
        &mut []
    } else {
        // SAFETY: non-NULL, valid for `len` bytes (the precondition).
        unsafe { core::slice::from_raw_parts_mut(buf.cast::<u8>(), len) }
    };
    let mut t = Text { buf: out, len: 0 };
    // `Text` never refuses a write, so the dump runs to its end and counts
    // every byte.
    let _ = d.dump_state(&mut t, format);
    let n = t.len;
    if let Some(b) = t.buf.get_mut(n.min(len.saturating_sub(1))) {
        *b = 0;
    }
    if !written.is_null() {
        // SAFETY: checked non-NULL and aligned; valid by the precondition.
        unsafe { written.write(n) };
    }
    if n >= len {
        UMD_ERR_TRUNCATED
    } else {
        UMD_OK
    }
}
