//! Buffers, command submission, waits and events.

use core::ffi::c_void;

use umd_core::cmd::{Command, CompareOp, DispatchOp, EncodeError, Payload};
use umd_core::engine::{BufferAccess, BufferUse, Event, Submit};
use umd_core::mem::BufferDesc;
use umd_core::sync::deps::MAX_WAITS;
use umd_core::sync::{DeviceId, Fence, FenceId, QueueId, Seqno};

use crate::device::{live, umd_device, Dev, EventSlot, Events};
use crate::handle::{self, umd_buffer, umd_event, umd_fence, Kind};
use crate::status::umd_status::{self, *};

/// Converts a `Result` into the C status.
fn done(r: Result<(), umd_status>) -> umd_status {
    match r {
        Ok(()) => UMD_OK,
        Err(e) => e,
    }
}

/// Checks an output pointer: non-NULL and aligned for `T`.
fn out_ptr<T>(p: *mut T) -> Result<(), umd_status> {
    if p.is_null() {
        Err(UMD_ERR_NULL)
    } else if !p.is_aligned() {
        Err(UMD_ERR_MISALIGNED)
    } else {
        Ok(())
    }
}

/// A slice from C: NULL allowed only when `len` is 0.
///
/// # Safety
/// `p` is NULL or valid for reads of `len` elements.
unsafe fn slice<'a, T>(p: *const T, len: usize) -> Result<&'a [T], umd_status> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(UMD_ERR_NULL);
    }
    if !p.is_aligned() {
        return Err(UMD_ERR_MISALIGNED);
    }
    // SAFETY: non-NULL, aligned, valid for `len` elements (the caller).
    Ok(unsafe { core::slice::from_raw_parts(p, len) })
}

/// `umd_buffer_alloc` flag: the GPU only reads the buffer.
pub const UMD_BUFFER_GPU_READ_ONLY: u32 = 1;
/// `umd_buffer_alloc` flag: the CPU never reaches the buffer (no read or
/// write through this API).
pub const UMD_BUFFER_DEVICE_ONLY: u32 = 2;
/// `umd_buffer_alloc` flag: its free waits only for the submissions that
/// declare it (`umd_submit`'s buffers), not for every queue.
pub const UMD_BUFFER_DECLARED: u32 = 4;
/// `umd_buffer_alloc` flag: prefer the device's local memory.
pub const UMD_BUFFER_LOCAL: u32 = 8;
const BUFFER_FLAGS: u32 =
    UMD_BUFFER_GPU_READ_ONLY | UMD_BUFFER_DEVICE_ONLY | UMD_BUFFER_DECLARED | UMD_BUFFER_LOCAL;

/// Allocates a buffer of `size` bytes (zeroed), aligned to `align` bytes
/// on the GPU (0: the default, 128; else a power of two), with `flags`
/// (`UMD_BUFFER_*`), and sets `*out` to its handle.
///
/// Blocks: only when memory or handles ran out while freed buffers still
/// wait for their fences: it then waits (servicing the device) for the
/// oldest of those, at most the hang check's limit (2.5 s with the
/// default configuration), before `UMD_ERR_OUT_OF_MEMORY`.
///
/// # Safety
/// `dev` NULL or pointing to at least `UMD_DEVICE_STORAGE_SIZE` readable
/// bytes (every call's precondition); `out` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn umd_buffer_alloc(
    dev: *const umd_device,
    size: u64,
    align: u64,
    flags: u32,
    out: *mut umd_buffer,
) -> umd_status {
    // SAFETY: the precondition.
    done(unsafe { live(dev) }.and_then(|(d, _)| {
        out_ptr(out)?;
        if flags & !BUFFER_FLAGS != 0 {
            return Err(UMD_ERR_INVALID_ARGUMENT);
        }
        let mut desc = BufferDesc::new(size).tag("c");
        if align != 0 {
            desc = desc.align(align);
        }
        if flags & UMD_BUFFER_GPU_READ_ONLY != 0 {
            desc = desc.gpu_read_only();
        }
        if flags & UMD_BUFFER_DEVICE_ONLY != 0 {
            desc = desc.device_only();
        }
        if flags & UMD_BUFFER_DECLARED != 0 {
            desc = desc.declared();
        }
        if flags & UMD_BUFFER_LOCAL != 0 {
            desc = desc.local();
        }
        let h = d.alloc(&desc)?;
        // SAFETY: checked non-NULL and aligned; valid by the precondition.
        unsafe { out.write(handle::buffer(h)) };
        Ok(())
    }))
}

/// Frees a buffer. Its memory and GPU address are reused only after the
/// work that may use it has finished. Never blocks.
///
/// # Safety
/// `dev` as for every call.
#[no_mangle]
pub unsafe extern "C" fn umd_buffer_free(dev: *const umd_device, buffer: umd_buffer) -> umd_status {
    // SAFETY: the precondition.
    done(unsafe { live(dev) }.and_then(|(d, _)| Ok(d.free(handle::to_buffer(buffer, d.id())?)?)))
}

/// Copies `len` bytes from `data` into the buffer at byte `offset` and
/// makes them visible to the GPU (cache clean). `data` may be NULL when
/// `len` is 0. Never blocks.
///
/// # Safety
/// `dev` as for every call; `data` NULL or valid for reads of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn umd_buffer_write(
    dev: *const umd_device,
    buffer: umd_buffer,
    offset: u64,
    data: *const c_void,
    len: usize,
) -> umd_status {
    // SAFETY: the precondition.
    done(unsafe { live(dev) }.and_then(|(d, _)| {
        let h = handle::to_buffer(buffer, d.id())?;
        // SAFETY: the precondition.
        let bytes = unsafe { slice(data.cast::<u8>(), len) }?;
        Ok(d.write(h, offset, bytes)?)
    }))
}

/// Makes GPU writes visible (cache invalidate) and copies `len` bytes of
/// the buffer at byte `offset` into `out`. Never blocks.
///
/// # Safety
/// `dev` as for every call; `out` NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn umd_buffer_read(
    dev: *const umd_device,
    buffer: umd_buffer,
    offset: u64,
    out: *mut c_void,
    len: usize,
) -> umd_status {
    // SAFETY: the precondition.
    done(unsafe { live(dev) }.and_then(|(d, _)| {
        let h = handle::to_buffer(buffer, d.id())?;
        if len == 0 {
            return Ok(d.read(h, offset, &mut [])?);
        }
        if out.is_null() {
            return Err(UMD_ERR_NULL);
        }
        // SAFETY: non-NULL and valid for `len` bytes (the precondition).
        let bytes = unsafe { core::slice::from_raw_parts_mut(out.cast::<u8>(), len) };
        Ok(d.read(h, offset, bytes)?)
    }))
}

/// Sets `*va` to the buffer's GPU address. Never blocks.
///
/// # Safety
/// `dev` as for every call; `va` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn umd_buffer_va(
    dev: *const umd_device,
    buffer: umd_buffer,
    va: *mut u64,
) -> umd_status {
    // SAFETY: the precondition.
    done(unsafe { live(dev) }.and_then(|(d, _)| {
        out_ptr(va)?;
        let v = d.va(handle::to_buffer(buffer, d.id())?)?;
        // SAFETY: checked non-NULL and aligned; valid by the precondition.
        unsafe { va.write(v) };
        Ok(())
    }))
}

/// The graphics queue (engine 0).
pub const UMD_QUEUE_GFX: u32 = 0;
/// The compute queue (engine 1), the only one that runs `UMD_CMD_DISPATCH`.
pub const UMD_QUEUE_COMPUTE: u32 = 1;
/// The copy queue (engine 2).
pub const UMD_QUEUE_COPY: u32 = 2;

/// Command kind: `word_count` zero dwords of padding (`size`).
pub const UMD_CMD_NOP: u32 = 0;
/// Command kind: write `word_count` dwords from `words` at `dst`.
pub const UMD_CMD_WRITE_DATA: u32 = 1;
/// Command kind: copy `size` bytes from `src` to `dst`.
pub const UMD_CMD_COPY: u32 = 2;
/// Command kind: fill `size` bytes (a multiple of 4) at `dst` with the
/// 32-bit `value`.
pub const UMD_CMD_FILL: u32 = 3;
/// Command kind: write the 64-bit `value` at `dst` (`op` 1: and raise the
/// engine's fence interrupt).
pub const UMD_CMD_FENCE: u32 = 4;
/// Command kind: block until `(*src & mask) op (value & mask)`; `op` a
/// `UMD_CMP_*`; `size` 8 for a 64-bit compare, 4 for a 32-bit one.
pub const UMD_CMD_WAIT_MEM: u32 = 5;
/// Command kind: write the device clock (ns) at `dst` (8-byte aligned).
pub const UMD_CMD_TIMESTAMP: u32 = 6;
/// Command kind: a barrier (earlier writes complete, cached reads
/// discarded).
pub const UMD_CMD_BARRIER: u32 = 7;
/// Command kind: element-wise `dst[i] = src[i] op src2[i]` over `size`
/// 32-bit elements; `op` a `UMD_DISPATCH_*`; `value` the SAXPY scalar's
/// f32 bit pattern. Compute queue only.
pub const UMD_CMD_DISPATCH: u32 = 8;
/// Command kind: set `event` from the GPU.
pub const UMD_CMD_EVENT_SET: u32 = 9;
/// Command kind: reset `event` from the GPU.
pub const UMD_CMD_EVENT_RESET: u32 = 10;
/// Command kind: the GPU waits until `event` is set.
pub const UMD_CMD_EVENT_WAIT: u32 = 11;

/// Compare op: equal.
pub const UMD_CMP_EQ: u32 = 0;
/// Compare op: not equal.
pub const UMD_CMP_NE: u32 = 1;
/// Compare op: greater or equal (unsigned).
pub const UMD_CMP_GE: u32 = 2;
/// Compare op: greater (unsigned).
pub const UMD_CMP_GT: u32 = 3;
/// Compare op: less or equal (unsigned).
pub const UMD_CMP_LE: u32 = 4;
/// Compare op: less (unsigned).
pub const UMD_CMP_LT: u32 = 5;
/// Compare op: sequence-number order, `(mem - value)` as signed `>= 0`
/// (a wait for a fence value that survives wrapping).
pub const UMD_CMP_SEQ_GE: u32 = 6;

/// Dispatch op: 32-bit wrapping add.
pub const UMD_DISPATCH_ADD_U32: u32 = 0;
/// Dispatch op: 32-bit wrapping multiply.
pub const UMD_DISPATCH_MUL_U32: u32 = 1;
/// Dispatch op: `dst = value * a + b` in f32.
pub const UMD_DISPATCH_SAXPY_F32: u32 = 2;

/// One command of a submission. Fields a kind does not name are ignored.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct umd_command {
    /// `UMD_CMD_*`.
    pub kind: u32,
    /// The kind's operation (`UMD_CMP_*`, `UMD_DISPATCH_*`, the fence's
    /// interrupt flag).
    pub op: u32,
    /// Destination GPU address.
    pub dst: u64,
    /// Source GPU address (`COPY`, `DISPATCH`'s first input, `WAIT_MEM`'s
    /// polled address).
    pub src: u64,
    /// Second source GPU address (`DISPATCH`).
    pub src2: u64,
    /// Bytes (`COPY`, `FILL`), elements (`DISPATCH`), payload dwords
    /// (`NOP`), compare width in bytes (`WAIT_MEM`).
    pub size: u64,
    /// The value (`FILL` pattern, `FENCE` value, `WAIT_MEM` reference,
    /// `DISPATCH` scalar bits).
    pub value: u64,
    /// `WAIT_MEM`'s mask.
    pub mask: u64,
    /// `EVENT_*`'s event.
    pub event: umd_event,
    /// `WRITE_DATA`'s dwords.
    pub words: *const u32,
    /// How many.
    pub word_count: usize,
}

/// The event behind a C event handle.
fn event(d: &Dev, events: &Events, e: umd_event) -> Result<Event, umd_status> {
    let (index, gen) = handle::parts(e, Kind::Event, d.id())?;
    let t = events.lock();
    let slot = t.get(index as usize).ok_or(UMD_ERR_BAD_HANDLE)?;
    match slot.event {
        Some(ev) if slot.gen == gen => Ok(ev),
        _ if gen < slot.gen || (slot.event.is_none() && gen == slot.gen && gen != 0) => {
            Err(UMD_ERR_STALE_HANDLE)
        }
        _ => Err(UMD_ERR_BAD_HANDLE),
    }
}

fn u32_of(v: u64) -> Result<u32, umd_status> {
    u32::try_from(v).map_err(|_| UMD_ERR_INVALID_ARGUMENT)
}

/// The core's command for a C command.
fn command<'a>(d: &Dev, events: &Events, c: &'a umd_command) -> Result<Command<'a>, umd_status> {
    Ok(match c.kind {
        UMD_CMD_NOP => Command::Nop { dwords: u32_of(c.size)? },
        UMD_CMD_WRITE_DATA => {
            if c.word_count == 0 {
                return Err(UMD_ERR_INVALID_ARGUMENT);
            }
            // SAFETY: the precondition of `umd_submit`: `words` valid for
            // `word_count` dwords.
            Command::WriteData { dst: c.dst, data: Payload::Words(unsafe { slice(c.words, c.word_count) }?) }
        }
        UMD_CMD_COPY => Command::Copy { src: c.src, dst: c.dst, size: c.size },
        UMD_CMD_FILL => Command::Fill { dst: c.dst, size: c.size, value: u32_of(c.value)? },
        UMD_CMD_FENCE => Command::Fence {
            addr: c.dst,
            value: c.value,
            irq: match c.op {
                0 => false,
                1 => true,
                _ => return Err(UMD_ERR_INVALID_ARGUMENT),
            },
        },
        UMD_CMD_WAIT_MEM => Command::WaitMem {
            addr: c.src,
            reference: c.value,
            mask: c.mask,
            op: match c.op {
                UMD_CMP_EQ..=UMD_CMP_SEQ_GE => {
                    CompareOp::from_bits(u64::from(c.op)).ok_or(UMD_ERR_INVALID_ARGUMENT)?
                }
                _ => return Err(UMD_ERR_INVALID_ARGUMENT),
            },
            wide: match c.size {
                4 => false,
                8 => true,
                _ => return Err(UMD_ERR_INVALID_ARGUMENT),
            },
        },
        UMD_CMD_TIMESTAMP => Command::Timestamp { addr: c.dst },
        UMD_CMD_BARRIER => Command::Barrier { wait_idle: true, invalidate: true },
        UMD_CMD_DISPATCH => Command::Dispatch {
            op: DispatchOp::from_bits(u64::from(c.op)).ok_or(UMD_ERR_INVALID_ARGUMENT)?,
            a: c.src,
            b: c.src2,
            dst: c.dst,
            count: u32_of(c.size)?,
            scalar_bits: u32_of(c.value)?,
        },
        UMD_CMD_EVENT_SET => event(d, events, c.event)?.set(),
        UMD_CMD_EVENT_RESET => event(d, events, c.event)?.reset(),
        UMD_CMD_EVENT_WAIT => event(d, events, c.event)?.wait(),
        _ => return Err(UMD_ERR_INVALID_ARGUMENT),
    })
}

/// `umd_buffer_use` access: the GPU reads the buffer.
pub const UMD_ACCESS_READ: u32 = 1;
/// `umd_buffer_use` access: the GPU writes the buffer.
pub const UMD_ACCESS_WRITE: u32 = 2;
/// `umd_buffer_use` access: the GPU reads and writes the buffer.
pub const UMD_ACCESS_READ_WRITE: u32 = 3;

/// A buffer a submission declares.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct umd_buffer_use {
    /// The buffer.
    pub buffer: umd_buffer,
    /// `UMD_ACCESS_*`.
    pub access: u32,
}

/// What to submit, besides the commands.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct umd_submit_info {
    /// `UMD_QUEUE_*`.
    pub queue: u32,
    /// Fences (of other queues, possibly not submitted yet) to wait for
    /// first; NULL when `wait_count` is 0.
    pub waits: *const umd_fence,
    /// How many (at most `UMD_MAX_WAITS`).
    pub wait_count: usize,
    /// The buffers the work uses; NULL when `buffer_count` is 0.
    pub buffers: *const umd_buffer_use,
    /// How many (at most `UMD_MAX_BUFFER_USES`).
    pub buffer_count: usize,
}

/// Waits one submission may name.
pub const UMD_MAX_WAITS: usize = 4;
/// Buffers one submission may declare.
pub const UMD_MAX_BUFFER_USES: usize = 64;
const _: () = assert!(UMD_MAX_WAITS == MAX_WAITS);
const _: () = assert!(UMD_MAX_BUFFER_USES == umd_core::engine::buffers::MAX_BUFFER_USES);

/// The core's fence of a C fence handle.
fn fence_of(d: &Dev, f: umd_fence) -> Result<Fence, umd_status> {
    handle::to_fence(f, d.id(), |q| d.next_fence(q).map(|f| f.id.seqno.0))
}

/// Records `count` commands and submits them to `info->queue` after
/// `info->waits`, declaring `info->buffers`; sets `*fence` to the
/// submission's fence. A refused submission (a bad command, handle or
/// queue; an encoder refusal) submits nothing.
///
/// Blocks: only while the IB pool, the ring or the queue's dependency
/// table is full, until earlier work completes: at most the hang check's
/// limit (2.5 s with the default configuration) for an IB chunk or ring
/// room, 500 ms for dependency-table room (then `UMD_ERR_TOO_MANY`).
///
/// # Safety
/// `dev` as for every call; `info` NULL or valid; `cmds` NULL or valid for
/// `count` commands, each `words` valid for `word_count` dwords; the wait
/// and buffer arrays valid for their counts; `fence` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn umd_submit(
    dev: *const umd_device,
    info: *const umd_submit_info,
    cmds: *const umd_command,
    count: usize,
    fence: *mut umd_fence,
) -> umd_status {
    // SAFETY: the precondition.
    done(unsafe { live(dev) }.and_then(|(d, events)| {
        out_ptr(fence)?;
        if info.is_null() {
            return Err(UMD_ERR_NULL);
        }
        if !info.is_aligned() {
            return Err(UMD_ERR_MISALIGNED);
        }
        // SAFETY: non-NULL, aligned, valid (the precondition).
        let info = unsafe { &*info };
        if count == 0 {
            return Err(UMD_ERR_INVALID_ARGUMENT);
        }
        // SAFETY: the precondition.
        let cmds = unsafe { slice(cmds, count) }?;
        let queue = QueueId(u8::try_from(info.queue).map_err(|_| UMD_ERR_UNKNOWN_QUEUE)?);
        if usize::from(queue.0) >= d.queue_count() {
            return Err(UMD_ERR_UNKNOWN_QUEUE);
        }
        // SAFETY: the precondition.
        let c_waits = unsafe { slice(info.waits, info.wait_count) }?;
        let mut waits = [Fence { id: FenceId { queue, seqno: Seqno(0) }, device: DeviceId(0) }; MAX_WAITS];
        if c_waits.len() > waits.len() {
            return Err(UMD_ERR_TOO_MANY);
        }
        for (w, c) in waits.iter_mut().zip(c_waits) {
            *w = fence_of(d, *c)?;
        }
        // SAFETY: the precondition.
        let c_uses = unsafe { slice(info.buffers, info.buffer_count) }?;
        let placeholder = BufferUse::read(umd_core::mem::BufferHandle::from_raw(d.id(), 0, 0));
        let mut uses = [placeholder; UMD_MAX_BUFFER_USES];
        if c_uses.len() > uses.len() {
            return Err(UMD_ERR_TOO_MANY);
        }
        for (u, c) in uses.iter_mut().zip(c_uses) {
            let access = match c.access {
                UMD_ACCESS_READ => BufferAccess::Read,
                UMD_ACCESS_WRITE => BufferAccess::Write,
                UMD_ACCESS_READ_WRITE => BufferAccess::ReadWrite,
                _ => return Err(UMD_ERR_INVALID_ARGUMENT),
            };
            *u = BufferUse { buffer: handle::to_buffer(c.buffer, d.id())?, access };
        }
        let s = Submit::on(queue)
            .after(waits.get(..c_waits.len()).unwrap_or(&[]))
            .using(uses.get(..c_uses.len()).unwrap_or(&[]));
        // A command refused here stops the recording: nothing is submitted
        // and its status is the call's.
        let mut refused = None;
        let r = d.submit_with(&s, |cb| {
            for c in cmds {
                match command(d, events, c) {
                    Ok(cmd) => cb.push(&cmd)?,
                    Err(e) => {
                        refused = Some(e);
                        return Err(EncodeError::BufferFull { needed: 0, available: 0 });
                    }
                }
            }
            Ok(())
        });
        let f = match (r, refused) {
            (_, Some(e)) => return Err(e),
            (Err(e), None) => return Err(e.into()),
            (Ok(f), None) => f,
        };
        // SAFETY: checked non-NULL and aligned; valid by the precondition.
        unsafe { fence.write(handle::fence(f)) };
        Ok(())
    }))
}

/// `umd_wait`'s timeout that never ends.
pub const UMD_WAIT_FOREVER: u64 = u64::MAX;

/// Waits until `fence` has signalled (`UMD_OK`), failed
/// (`UMD_ERR_FENCE_FAILED`: a hang or fault, detected, reported and the
/// queue reset meanwhile) or `timeout_ns` has passed (`UMD_ERR_TIMEOUT`).
///
/// Blocks: yes, for at most `timeout_ns` (`UMD_WAIT_FOREVER`: until the
/// fence signals or fails, which a hang bounds by the hang check's window).
///
/// # Safety
/// `dev` as for every call.
#[no_mangle]
pub unsafe extern "C" fn umd_wait(dev: *const umd_device, fence: umd_fence, timeout_ns: u64) -> umd_status {
    // SAFETY: the precondition.
    done(unsafe { live(dev) }.and_then(|(d, _)| Ok(d.wait(fence_of(d, fence)?, timeout_ns)?)))
}

/// Fence state: signalled.
pub const UMD_FENCE_SIGNALLED: u32 = 0;
/// Fence state: still pending.
pub const UMD_FENCE_PENDING: u32 = 1;
/// Fence state: failed.
pub const UMD_FENCE_FAILED: u32 = 2;

/// Sets `*state` to the fence's state (`UMD_FENCE_*`) without waiting
/// (completions are processed first). Never blocks.
///
/// # Safety
/// `dev` as for every call; `state` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn umd_fence_state(
    dev: *const umd_device,
    fence: umd_fence,
    state: *mut u32,
) -> umd_status {
    use umd_core::error::FenceStatus;
    // SAFETY: the precondition.
    done(unsafe { live(dev) }.and_then(|(d, _)| {
        out_ptr(state)?;
        let v = match d.query(fence_of(d, fence)?)? {
            FenceStatus::Signalled => UMD_FENCE_SIGNALLED,
            FenceStatus::Pending => UMD_FENCE_PENDING,
            FenceStatus::Failed(_) => UMD_FENCE_FAILED,
        };
        // SAFETY: checked non-NULL and aligned; valid by the precondition.
        unsafe { state.write(v) };
        Ok(())
    }))
}

/// Creates an event (reset) and sets `*out` to it. Blocks as
/// `umd_buffer_alloc` does (an event is a small buffer).
///
/// # Safety
/// `dev` as for every call; `out` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn umd_event_create(dev: *const umd_device, out: *mut umd_event) -> umd_status {
    // SAFETY: the precondition.
    done(unsafe { live(dev) }.and_then(|(d, events)| {
        out_ptr(out)?;
        // A free entry is reserved under the table's lock, the event
        // allocated without it (an allocation may wait for memory), then
        // the entry filled or given back.
        let index = {
            let mut t = events.lock();
            let (index, slot) = t
                .iter_mut()
                .enumerate()
                .find(|(_, s)| s.event.is_none() && !s.reserved)
                .ok_or(UMD_ERR_OUT_OF_MEMORY)?;
            slot.reserved = true;
            index
        };
        let created = d.create_event();
        let mut t = events.lock();
        let slot = t.get_mut(index).ok_or(UMD_ERR_OUT_OF_MEMORY)?;
        slot.reserved = false;
        let e = created?;
        let gen = slot.gen.wrapping_add(1).max(1);
        *slot = EventSlot { event: Some(e), gen, reserved: false };
        // SAFETY: checked non-NULL and aligned; valid by the precondition.
        unsafe { out.write(handle::make(Kind::Event, d.id(), index as u32, gen)) };
        Ok(())
    }))
}

/// Destroys an event (its memory is reused only after the work that may
/// use it has finished). Never blocks.
///
/// # Safety
/// `dev` as for every call.
#[no_mangle]
pub unsafe extern "C" fn umd_event_destroy(dev: *const umd_device, ev: umd_event) -> umd_status {
    // SAFETY: the precondition.
    done(unsafe { live(dev) }.and_then(|(d, events)| {
        let e = event(d, events, ev)?;
        let (index, _) = handle::parts(ev, Kind::Event, d.id())?;
        d.destroy_event(e)?;
        if let Some(s) = events.lock().get_mut(index as usize) {
            s.event = None;
        }
        Ok(())
    }))
}

/// Sets the event from the CPU. Never blocks.
///
/// # Safety
/// `dev` as for every call.
#[no_mangle]
pub unsafe extern "C" fn umd_event_set(dev: *const umd_device, ev: umd_event) -> umd_status {
    // SAFETY: the precondition.
    done(unsafe { live(dev) }.and_then(|(d, events)| Ok(d.set_event(event(d, events, ev)?)?)))
}

/// Resets the event from the CPU. Never blocks.
///
/// # Safety
/// `dev` as for every call.
#[no_mangle]
pub unsafe extern "C" fn umd_event_reset(dev: *const umd_device, ev: umd_event) -> umd_status {
    // SAFETY: the precondition.
    done(unsafe { live(dev) }.and_then(|(d, events)| Ok(d.reset_event(event(d, events, ev)?)?)))
}

/// Sets `*set` to 1 if the event is set, else 0. Never blocks.
///
/// # Safety
/// `dev` as for every call; `set` NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn umd_event_is_set(
    dev: *const umd_device,
    ev: umd_event,
    set: *mut u32,
) -> umd_status {
    // SAFETY: the precondition.
    done(unsafe { live(dev) }.and_then(|(d, events)| {
        out_ptr(set)?;
        let v = u32::from(d.event_is_set(event(d, events, ev)?)?);
        // SAFETY: checked non-NULL and aligned; valid by the precondition.
        unsafe { set.write(v) };
        Ok(())
    }))
}

/// Waits until the event is set (`UMD_OK`) or `timeout_ns` passes
/// (`UMD_ERR_TIMEOUT`), servicing the device meanwhile.
///
/// Blocks: yes, for at most `timeout_ns`.
///
/// # Safety
/// `dev` as for every call.
#[no_mangle]
pub unsafe extern "C" fn umd_event_wait(
    dev: *const umd_device,
    ev: umd_event,
    timeout_ns: u64,
) -> umd_status {
    // SAFETY: the precondition.
    done(unsafe { live(dev) }.and_then(|(d, events)| Ok(d.wait_event(event(d, events, ev)?, timeout_ns)?)))
}
