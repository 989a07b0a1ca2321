//! Handles as C holds them: opaque 64-bit integers.
//!
//! Bits 62-63 name the kind (1 buffer, 2 event, 3 fence; 0 is never a
//! handle), bits 48-61 the device (the low 14 bits of its id: a handle is
//! checked against the device it is used on). A buffer keeps the core's
//! slot index in bits 32-47 and its generation count in bits 0-31, so the
//! core's own checks (stale, forged) apply; an event the same with the
//! index and generation of this library's event table; a fence its queue
//! in bits 46-47 and the low 46 bits of its sequence number (the rest is
//! the queue's, recovered from the queue's next sequence number: a fence
//! names the same submission for 2^45 submissions on its queue).

use umd_core::mem::BufferHandle;
use umd_core::sync::{DeviceId, Fence, FenceId, QueueId, Seqno};

use crate::status::umd_status;

/// A buffer of one device (0 is never a buffer).
pub type umd_buffer = u64;
/// An event of one device (0 is never an event).
pub type umd_event = u64;
/// A submission's fence on one device (0 is never a fence).
pub type umd_fence = u64;

const KIND_SHIFT: u32 = 62;
const TAG_SHIFT: u32 = 48;
const TAG_MASK: u64 = 0x3FFF;
const INDEX_SHIFT: u32 = 32;
const INDEX_MASK: u64 = 0xFFFF;
const QUEUE_SHIFT: u32 = 46;
const SEQ_BITS: u32 = 46;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

/// What a handle names.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Buffer = 1,
    Event = 2,
    Fence = 3,
}

/// The device bits of a handle of device `id`.
pub(crate) fn tag(id: DeviceId) -> u64 {
    u64::from(id.0) & TAG_MASK
}

/// Checks kind and device; the handle's other 48 bits.
fn open(h: u64, kind: Kind, id: DeviceId) -> Result<u64, umd_status> {
    if h >> KIND_SHIFT != kind as u64 {
        return Err(umd_status::UMD_ERR_BAD_HANDLE);
    }
    if (h >> TAG_SHIFT) & TAG_MASK != tag(id) {
        return Err(umd_status::UMD_ERR_FOREIGN_HANDLE);
    }
    Ok(h & ((1 << TAG_SHIFT) - 1))
}

/// A slot index and generation under `kind` for device `id`.
pub(crate) fn make(kind: Kind, id: DeviceId, index: u32, gen: u32) -> u64 {
    (kind as u64) << KIND_SHIFT
        | tag(id) << TAG_SHIFT
        | (u64::from(index) & INDEX_MASK) << INDEX_SHIFT
        | u64::from(gen)
}

/// The slot index and generation of a handle of `kind` on device `id`.
pub(crate) fn parts(h: u64, kind: Kind, id: DeviceId) -> Result<(u32, u32), umd_status> {
    let rest = open(h, kind, id)?;
    Ok((((rest >> INDEX_SHIFT) & INDEX_MASK) as u32, rest as u32))
}

// Every buffer slot index fits the handle's 16 bits.
const _: () = assert!(crate::device::BUFFERS as u64 <= INDEX_MASK + 1);

/// A buffer handle for C.
pub(crate) fn buffer(h: BufferHandle) -> umd_buffer {
    let (id, index, gen) = h.into_raw();
    make(Kind::Buffer, id, index, gen)
}

/// The core's handle of a C buffer handle on device `id`.
pub(crate) fn to_buffer(h: umd_buffer, id: DeviceId) -> Result<BufferHandle, umd_status> {
    let (index, gen) = parts(h, Kind::Buffer, id)?;
    Ok(BufferHandle::from_raw(id, index, gen))
}

/// A fence handle for C.
pub(crate) fn fence(f: Fence) -> umd_fence {
    (Kind::Fence as u64) << KIND_SHIFT
        | tag(f.device) << TAG_SHIFT
        | (u64::from(f.id.queue.0) & 3) << QUEUE_SHIFT
        | f.id.seqno.0 & SEQ_MASK
}

/// The core's fence of a C fence handle on device `id`, whose queue's next
/// sequence number `next` gives the bits the handle does not hold: the
/// sequence number nearest to `next` with the handle's low bits (a fence
/// up to 2^45 submissions back or ahead, for a wait before signal).
pub(crate) fn to_fence(
    h: umd_fence,
    id: DeviceId,
    next: impl FnOnce(QueueId) -> Option<u64>,
) -> Result<Fence, umd_status> {
    let rest = open(h, Kind::Fence, id)?;
    let queue = QueueId(((rest >> QUEUE_SHIFT) & 3) as u8);
    let next = next(queue).ok_or(umd_status::UMD_ERR_UNKNOWN_QUEUE)?;
    let ahead = (rest & SEQ_MASK).wrapping_sub(next) & SEQ_MASK;
    let seq = if ahead < 1 << (SEQ_BITS - 1) {
        next.checked_add(ahead)
    } else {
        next.checked_sub((1u64 << SEQ_BITS).wrapping_sub(ahead))
    };
    let seq = seq.ok_or(umd_status::UMD_ERR_BAD_HANDLE)?;
    Ok(Fence { id: FenceId { queue, seqno: Seqno(seq) }, device: id })
}
