//! The device's side of command-stream capture (`capture` feature): the
//! session it holds, the record of each committed IB (CHAINs followed),
//! and the flight recorder's emission with a hang or fault report. The
//! format, the sinks and the reader are [`crate::debug::capture`].

use crate::cmd::Command;
use crate::debug::capture::{
    write_whole, Capture, CaptureStats, RecordWriter, Segment, FLAG_CUT, MAX_SEGMENTS,
};
use crate::decode::Decoder;
use crate::hw::{Generation, IbRef, PacketKind};
use crate::platform::DmaRegion;
use crate::sync::deps::MAX_WAITS;
use crate::sync::{Fence, FenceId, QueueId, Seqno};

use super::{Backend, DeviceCore};

/// A device's capture session and its counters (behind one lock, taken
/// after the memory lock).
#[derive(Debug, Default)]
pub(crate) struct CaptureState<'d> {
    pub(crate) session: Option<Capture<'d>>,
    pub(crate) stats: CaptureStats,
}

/// The bytes and dwords of `len` bytes at GPU address `va` in `r`, whose
/// byte `off` is at GPU address `base`.
fn slice_at(r: &DmaRegion, va: u64, base: u64, off: u64, len: usize) -> Option<(&[u8], &[u32])> {
    let start = usize::try_from(va.checked_sub(base)?.checked_add(off)?).ok()?;
    let end = start.checked_add(len)?;
    if start % 4 != 0 {
        return None;
    }
    Some((r.bytes().get(start..end)?, r.words().get(start / 4..end / 4)?))
}

/// Where the first CHAIN of a segment (`bytes`, the same memory as
/// `words`, at `va`) hands the engine to: a CHAIN ends what runs of its
/// segment. Packets are skipped by their headers' length; only the CHAIN
/// is decoded.
fn chain_target(generation: Generation, bytes: &[u8], words: &[u32], va: u64) -> Option<(u64, u32)> {
    let desc = generation.desc();
    let chain = u32::from(desc.packet(PacketKind::Chain)?.opcode);
    let mut i = 0usize;
    while let Some(&h) = words.get(i) {
        let end = i.checked_add(1)?.checked_add(desc.header.ndw.get(h) as usize)?;
        if desc.header.opcode.get(h) == chain {
            let at = i.checked_mul(4)?;
            let packet = bytes.get(at..end.checked_mul(4)?)?;
            let item = Decoder::new(generation, packet, va.checked_add(at as u64)?).next()?;
            return match item.result.ok()?.command {
                Command::Chain { addr, size_dw } => Some((addr, size_dw)),
                _ => None,
            };
        }
        i = end;
    }
    None
}

impl<'d, B: Backend, const CHUNKS: usize> DeviceCore<'d, B, CHUNKS> {
    /// Starts capturing committed submissions into `c` (a running session
    /// is stopped and given back). A streaming sink gets the capture file's
    /// header first; with `c.on_failure` it gets a whole capture (header
    /// and the ring's records) with each hang or fault report. The
    /// counters ([`DeviceCore::capture_stats`]) start from zero.
    pub fn start_capture(&self, mut c: Capture<'d>) -> Option<Capture<'d>> {
        let mut st = self.capture.lock();
        st.stats = CaptureStats::default();
        if !c.on_failure {
            if let Some(sink) = c.sink.as_deref_mut() {
                if write_whole(sink, &crate::debug::capture::file_header(self.b.chip())).is_err() {
                    st.stats.lost = st.stats.lost.saturating_add(1);
                }
            }
        }
        st.session.replace(c)
    }

    /// Stops capturing and gives the session back (its ring holds what was
    /// recorded).
    pub fn stop_capture(&self) -> Option<Capture<'d>> {
        self.capture.lock().session.take()
    }

    /// The capture counters: records written, lost (a sink that failed, a
    /// record larger than the ring), dropped (overwritten in the ring),
    /// flight-recorder emissions.
    pub fn capture_stats(&self) -> CaptureStats {
        let st = self.capture.lock();
        let mut s = st.stats;
        if let Some(r) = st.session.as_ref().and_then(|c| c.ring.as_deref()) {
            s.dropped = r.dropped();
        }
        s
    }

    /// Calls `f` with the running session (to read its ring), under the
    /// capture lock.
    pub fn with_capture<T>(&self, f: impl FnOnce(Option<&Capture<'d>>) -> T) -> T {
        f(self.capture.lock().session.as_ref())
    }

    /// Records submission `seqno` of `queue` (its IB `ib`, the fences it
    /// was submitted after, signalled or not) into the session, if one runs and takes this queue. Called
    /// under the queue's submit lock once the job reached the hardware; a
    /// sink that fails only counts the loss. `caller`: the IB is the
    /// caller's (not in the IB pool), read through its buffer.
    #[cold]
    #[inline(never)]
    pub(crate) fn capture_submit(
        &self,
        queue: QueueId,
        seqno: Seqno,
        waits: &[Fence],
        ib: IbRef,
        caller: bool,
    ) {
        let bit = 1u32.checked_shl(u32::from(queue.0)).unwrap_or(0);
        // The memory lock (for a caller's IB) before the capture lock.
        let mem = if caller { Some(self.mem.lock()) } else { None };
        let mut st = self.capture.lock();
        let Some(c) = st.session.as_mut().filter(|c| c.queues & bit != 0) else { return };
        let pool = (self.ib.range().0, self.ib.region());
        let lookup = |va: u64, ndw: u32| -> Option<(&[u8], &[u32])> {
            let len = usize::try_from(ndw).ok()?.checked_mul(4)?;
            if let Some(s) = slice_at(pool.1, va, pool.0, 0, len) {
                return Some(s);
            }
            let m = mem.as_ref()?;
            let (info, h) = m.buffers.nearest(va)?;
            let (region, off, _) = m.buffers.memory(h?).ok()?;
            slice_at(region, va, info.va, off, len)
        };
        let mut segs: [Segment<'_>; MAX_SEGMENTS] = [(0, 0, None); MAX_SEGMENTS];
        let mut n = 0usize;
        let mut flags = 0;
        let mut next = Some((ib.va.get(), ib.dwords));
        while let Some((va, ndw)) = next.take() {
            if segs.iter().take(n).any(|s| s.0 == va) {
                flags |= FLAG_CUT;
                break;
            }
            let Some(slot) = segs.get_mut(n) else {
                flags |= FLAG_CUT;
                break;
            };
            let mem = lookup(va, ndw);
            *slot = (va, ndw, mem.map(|m| m.1));
            n = n.saturating_add(1);
            if let Some((bytes, words)) = mem {
                next = chain_target(self.b.chip().generation, bytes, words, va);
            }
        }
        let segs = segs.get(..n).unwrap_or(&[]);
        let mut ids = [FenceId { queue: QueueId(0), seqno: Seqno(0) }; MAX_WAITS];
        for (d, f) in ids.iter_mut().zip(waits) {
            *d = f.id;
        }
        let w = RecordWriter::new(queue, seqno, ids.get(..waits.len()).unwrap_or(&[]));
        let mut ok = true;
        if let Some(r) = c.ring.as_deref_mut() {
            ok &= w.write_flagged(r, segs, flags).is_ok();
        }
        if let Some(s) = c.sink.as_deref_mut().filter(|_| !c.on_failure) {
            ok &= w.write_flagged(s, segs, flags).is_ok();
        }
        let stats = &mut st.stats;
        if ok {
            stats.recorded = stats.recorded.saturating_add(1);
        } else {
            stats.lost = stats.lost.saturating_add(1);
        }
    }

    /// With a flight recorder running: writes its ring into its sink (a
    /// hang or fault was just reported).
    #[cold]
    #[inline(never)]
    pub(crate) fn capture_failure(&self) {
        let mut st = self.capture.lock();
        let chip = self.b.chip();
        let Some(c) = st.session.as_mut().filter(|c| c.on_failure) else { return };
        let (Some(r), Some(s)) = (c.ring.as_deref(), c.sink.as_deref_mut()) else { return };
        let ok = r.emit(chip, s).is_ok();
        let stats = &mut st.stats;
        if ok {
            stats.emitted = stats.emitted.saturating_add(1);
        } else {
            stats.lost = stats.lost.saturating_add(1);
        }
    }
}
