//! A fixed-size ring of timestamped driver events, and its export to the
//! Chrome / Perfetto JSON trace format ("print the whole timeline").
//!
//! Recording is O(1) and never fails: when full, the oldest event is
//! overwritten (and counted). The exporter writes through
//! [`core::fmt::Write`], so firmware can stream it over a UART and a host
//! tool can write it to a file for `ui.perfetto.dev` or `chrome://tracing`.
//!
//! Without the `trace` feature (a smaller firmware) the ring keeps the
//! same API but holds no storage and records nothing: the driver skips
//! the clock read and the lock per event, and an export is an empty trace.

use core::fmt::{self, Write};

use crate::sync::atomic::{AtomicU32, Ordering};

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceKind {
    // Numbered from 1, so that `Option<TraceKind>::None` (and with it an
    // empty trace slot) is the zero byte: `DeviceStorage::new()` is then
    // all zeros and a `static` of it lands in `.bss`.
    /// A command buffer was recorded (`arg` = dwords).
    Encode = 1,
    /// A submission reached the ring (`arg` = IB address).
    Submit,
    /// The doorbell was rung (`arg` = new write pointer).
    Doorbell,
    /// A fence was seen signalled (`arg` = submit timestamp, for spans).
    FenceSignalled,
    /// A host wait began (`arg` = timeout ns).
    WaitBegin,
    /// A host wait ended (`arg` = 0 ok, 1 timeout, 2 error).
    WaitEnd,
    /// A hang was detected (`arg` = current packet address).
    Hang,
    /// A fault was reported (`arg` = fault address).
    Fault,
    /// An engine was reset (`arg` = fences completed with an error).
    Reset,
    /// A buffer was evicted from local memory (`arg` = its GPU address).
    Evict,
    /// A buffer was brought back into local memory (`arg` = its GPU address).
    Restore,
    /// Work ran on the engine (GPU side, from TIMESTAMPs): `ts_ns` is its
    /// start on the platform clock, `arg` its duration in ns
    /// ([`TraceRing::record_gpu_span`]).
    GpuSpan,
}

impl TraceKind {
    /// Name in the exported trace.
    pub const fn name(self) -> &'static str {
        match self {
            TraceKind::Encode => "encode",
            TraceKind::Submit => "submit",
            TraceKind::Doorbell => "doorbell",
            TraceKind::FenceSignalled => "fence",
            TraceKind::WaitBegin => "wait_begin",
            TraceKind::WaitEnd => "wait_end",
            TraceKind::Hang => "hang",
            TraceKind::Fault => "fault",
            TraceKind::Reset => "reset",
            TraceKind::Evict => "evict",
            TraceKind::Restore => "restore",
            TraceKind::GpuSpan => "gpu",
        }
    }
}

/// One event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// Platform time in ns.
    pub ts_ns: u64,
    /// What.
    pub kind: TraceKind,
    /// Queue (engine) it concerns.
    pub queue: u8,
    /// Fence value it concerns (0 if none).
    pub seqno: u64,
    /// Kind-specific detail.
    pub arg: u64,
}

/// Submit times kept per queue (for the submit-to-fence spans).
pub const SUBMIT_TIMES: usize = 64;

/// Whether events are recorded (the `trace` feature).
const ON: bool = cfg!(feature = "trace");

/// Queues whose submit times are kept (none without the `trace` feature).
const TS_QUEUES: usize = if ON { crate::sync::MAX_QUEUES } else { 0 };

/// Where a trace keeps its events and submit times (part of
/// [`crate::storage::DeviceStorage`]). Without the `trace` feature it
/// holds nothing, whatever `N`.
#[derive(Debug)]
pub struct TraceStorage<const N: usize> {
    #[cfg(feature = "trace")]
    events: [Option<TraceEvent>; N],
    #[cfg(not(feature = "trace"))]
    events: [Option<TraceEvent>; 0],
    submit_ts: [[(u64, u64); SUBMIT_TIMES]; TS_QUEUES],
}

impl<const N: usize> TraceStorage<N> {
    /// Empty.
    pub const fn new() -> Self {
        TraceStorage {
            #[cfg(feature = "trace")]
            events: [None; N],
            #[cfg(not(feature = "trace"))]
            events: [],
            submit_ts: [[(0, 0); SUBMIT_TIMES]; TS_QUEUES],
        }
    }
}

impl<const N: usize> Default for TraceStorage<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// The last events of a device, in storage the integrator provides. (A
/// hand-written ring over a slice rather than `heapless::HistoryBuf`: the
/// latter's size-erased view indexes with a bounds check, a panic path the
/// link-time check refuses.)
#[derive(Debug)]
pub struct TraceRing<'s> {
    events: &'s mut [Option<TraceEvent>],
    submit_ts: &'s mut [[(u64, u64); SUBMIT_TIMES]; TS_QUEUES],
    next: usize,
    dropped: u64,
    enabled: bool,
}

impl<'s> TraceRing<'s> {
    /// An empty, enabled ring over `storage`.
    pub fn new<const N: usize>(storage: &'s mut TraceStorage<N>) -> Self {
        #[cfg(feature = "trace")]
        {
            storage.events = [None; N];
        }
        TraceRing {
            events: &mut storage.events,
            submit_ts: &mut storage.submit_ts,
            next: 0,
            dropped: 0,
            enabled: true,
        }
    }

    /// Turns recording on or off (off costs one branch per event).
    pub fn set_enabled(&mut self, on: bool) {
        self.enabled = on;
    }

    /// Records an event, overwriting the oldest when full (nothing without
    /// the `trace` feature).
    pub fn record(&mut self, ev: TraceEvent) {
        if !ON || !self.enabled {
            return;
        }
        let n = self.events.len();
        if let Some(slot) = self.events.get_mut(self.next) {
            if slot.is_some() {
                self.dropped = self.dropped.saturating_add(1);
            }
            *slot = Some(ev);
            // `next < n` here: wrap with a compare, not a division.
            let next = self.next.saturating_add(1);
            self.next = if next >= n { 0 } else { next };
        }
    }

    /// Records work that ran on engine `queue` from `start_gpu` to
    /// `end_gpu` on the device clock (two TIMESTAMPs around it), placed on
    /// the platform clock with `sync` ([`crate::engine::DeviceCore::clock_sync`]).
    /// The exported trace shows it on the GPU engine's own track. A span
    /// that ends before it starts is recorded with length 0.
    pub fn record_gpu_span(
        &mut self,
        queue: u8,
        seqno: u64,
        sync: &crate::platform::ClockSync,
        start_gpu: u64,
        end_gpu: u64,
    ) {
        self.record(TraceEvent {
            ts_ns: sync.to_cpu_ns(start_gpu),
            kind: TraceKind::GpuSpan,
            queue,
            seqno,
            arg: end_gpu.saturating_sub(start_gpu),
        });
    }

    /// Events overwritten since the start.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The events held, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &TraceEvent> {
        let (newer, older) = self.events.split_at(self.next.min(self.events.len()));
        older.iter().chain(newer.iter()).filter_map(Option::as_ref)
    }

    /// Forgets every event.
    pub fn clear(&mut self) {
        for e in self.events.iter_mut() {
            *e = None;
        }
        self.next = 0;
    }

    /// Remembers when `seqno` was submitted on `queue`.
    pub fn note_submit(&mut self, queue: usize, seqno: u64, ts_ns: u64) {
        if let Some(slot) = self.submit_ts.get_mut(queue).and_then(|q| q.get_mut(ts_slot(seqno))) {
            *slot = (seqno, ts_ns);
        }
    }

    /// When `seqno` was submitted on `queue`, if still remembered.
    pub fn submitted_at(&self, queue: usize, seqno: u64) -> Option<u64> {
        self.submit_ts
            .get(queue)
            .and_then(|q| q.get(ts_slot(seqno)))
            .filter(|(s, _)| *s == seqno)
            .map(|(_, t)| *t)
    }

    /// Writes the events as a Chrome / Perfetto JSON trace: one track per
    /// queue, an instant event per driver event, and a duration slice from
    /// submit to fence for every signalled fence.
    pub fn write_chrome_json(&self, out: &mut impl Write) -> fmt::Result {
        out.write_str("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[")?;
        let mut first = true;
        for (pid, name) in [(1, "driver (CPU side)"), (2, "GPU engines (TIMESTAMPs)")] {
            sep(out, &mut first)?;
            write!(
                out,
                "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pid},\"args\":{{\"name\":\"{name}\"}}}}"
            )?;
        }
        for (pid, q) in (0..4u8).map(|q| (1, q)).chain((0..3u8).map(|q| (2, q))) {
            sep(out, &mut first)?;
            write!(
                out,
                "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{q},\"args\":{{\"name\":\"{}\"}}}}",
                match q {
                    0 => "GFX",
                    1 => "COMPUTE",
                    2 => "COPY",
                    _ => "host",
                }
            )?;
        }
        for e in self.iter() {
            sep(out, &mut first)?;
            if e.kind == TraceKind::GpuSpan {
                write!(
                    out,
                    "{{\"name\":\"job {}\",\"ph\":\"X\",\"pid\":2,\"tid\":{},\"ts\":{}.{:03},\"dur\":{}.{:03}}}",
                    e.seqno,
                    e.queue,
                    e.ts_ns / 1000,
                    e.ts_ns % 1000,
                    e.arg / 1000,
                    e.arg % 1000
                )?;
                continue;
            }
            if e.kind == TraceKind::FenceSignalled && e.arg != 0 && e.arg <= e.ts_ns {
                let start = e.arg;
                write!(
                    out,
                    "{{\"name\":\"job {}\",\"ph\":\"X\",\"pid\":1,\"tid\":{},\"ts\":{}.{:03},\"dur\":{}.{:03}}}",
                    e.seqno,
                    e.queue,
                    start / 1000,
                    start % 1000,
                    e.ts_ns.saturating_sub(start) / 1000,
                    e.ts_ns.saturating_sub(start) % 1000
                )?;
                sep(out, &mut first)?;
            }
            write!(
                out,
                "{{\"name\":\"{}\",\"ph\":\"i\",\"s\":\"t\",\"pid\":1,\"tid\":{},\"ts\":{}.{:03},\"args\":{{\"seqno\":{},\"arg\":{}}}}}",
                e.kind.name(),
                e.queue,
                e.ts_ns / 1000,
                e.ts_ns % 1000,
                e.seqno,
                e.arg
            )?;
        }
        write!(out, "],\"otherData\":{{\"dropped_events\":{}}}}}", self.dropped)
    }
}

/// What the trace keeps of one submission: its submit time
/// ([`TraceRing::note_submit`]) and its three events (`Encode`, `Submit`,
/// `Doorbell`), all at `ts_ns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SubmitRecord {
    /// Platform time in ns.
    pub(crate) ts_ns: u64,
    /// The submission's sequence number.
    pub(crate) seqno: u64,
    /// Dwords recorded (`Encode`'s argument).
    pub(crate) dwords: u64,
    /// The IB's address (`Submit`'s argument).
    pub(crate) ib_va: u64,
    /// The ring's new write pointer (`Doorbell`'s argument).
    pub(crate) wptr: u64,
}

impl TraceRing<'_> {
    /// Records submission `r` of queue `queue`: its submit time and its
    /// three events.
    pub(crate) fn record_submit(&mut self, queue: usize, r: &SubmitRecord) {
        self.note_submit(queue, r.seqno, r.ts_ns);
        for (kind, arg) in
            [(TraceKind::Encode, r.dwords), (TraceKind::Submit, r.ib_va), (TraceKind::Doorbell, r.wptr)]
        {
            self.record(TraceEvent { ts_ns: r.ts_ns, kind, queue: queue as u8, seqno: r.seqno, arg });
        }
    }
}

/// Submissions a queue's submitter leaves for the trace (none without
/// the `trace` feature).
pub(crate) const STAGED_SUBMITS: usize = if ON { 32 } else { 0 };

/// A queue's submissions on their way into the trace ring, so that a
/// submission takes no lock for its trace record (one locked
/// read-modify-write less per submission: `docs/perf.md`, "Locks on the
/// submission path"). One producer at a time: the holder of the
/// queue's submit lock ([`TraceStage::push`]); one consumer at a time: a
/// holder of the trace ring's lock ([`TraceStage::drain`]). The consumers
/// are a reader of the trace (`DeviceCore::trace`, every queue's stage
/// first), the queue's completion processing (before its fence events,
/// which look up the submit times) and a submitter whose stage is full
/// (every queue's, then its own submission). So a reader sees every
/// submission made before it took the lock, each queue's events are in
/// the ring in the queue's order and before its fence events, and the
/// `enabled` switch (set only through `DeviceCore::trace`) applies as when the
/// events were recorded directly; relative to other events (waits,
/// hangs, other queues) a submission's events may enter the ring later
/// than they happened, with their own timestamps. Both sides only load
/// and store (no read-modify-write): the producer writes a slot and
/// publishes it with a release store of `head`; the consumer reads the
/// slots after an acquire load of `head` and hands them back with a
/// release store of `tail`, which the producer loads (acquire) before it
/// writes a slot again (`tests/loom.rs` checks it). The words are 32-bit
/// atomics, native on every target.
pub(crate) struct TraceStage {
    /// Submissions staged (wrapping; written by the producer only).
    head: AtomicU32,
    /// Submissions moved into the ring (wrapping; written by the consumer
    /// only). `head - tail` is at most [`STAGED_SUBMITS`].
    tail: AtomicU32,
    /// Each a [`SubmitRecord`] as ten 32-bit halves.
    slots: [[AtomicU32; 10]; STAGED_SUBMITS],
}

impl TraceStage {
    /// Empty.
    pub(crate) fn new() -> Self {
        TraceStage {
            head: AtomicU32::new(0),
            tail: AtomicU32::new(0),
            slots: core::array::from_fn(|_| core::array::from_fn(|_| AtomicU32::new(0))),
        }
    }

    /// Stages `r`; false (nothing staged) when the stage is full. The
    /// caller holds its queue's submit lock.
    #[inline]
    pub(crate) fn push(&self, r: &SubmitRecord) -> bool {
        let h = self.head.load(Ordering::Relaxed);
        let t = self.tail.load(Ordering::Acquire);
        if h.wrapping_sub(t) as usize >= STAGED_SUBMITS {
            return false;
        }
        let Some(slot) = (h as usize).checked_rem(STAGED_SUBMITS).and_then(|i| self.slots.get(i)) else {
            return false;
        };
        let [a, b, c, d, e, f, g, i, j, k] = slot;
        for (v, lo, hi) in
            [(r.ts_ns, a, b), (r.seqno, c, d), (r.dwords, e, f), (r.ib_va, g, i), (r.wptr, j, k)]
        {
            lo.store(v as u32, Ordering::Relaxed);
            hi.store((v >> 32) as u32, Ordering::Relaxed);
        }
        self.head.store(h.wrapping_add(1), Ordering::Release);
        true
    }

    /// Records every staged submission into `ring` as queue `queue`'s,
    /// oldest first, and empties the stage. The caller holds the ring's
    /// lock.
    #[inline]
    pub(crate) fn drain(&self, ring: &mut TraceRing<'_>, queue: usize) {
        let t = self.tail.load(Ordering::Relaxed);
        let h = self.head.load(Ordering::Acquire);
        if h != t {
            self.drain_from(t, h, ring, queue);
        }
    }

    /// [`TraceStage::drain`] of the slots `t..h` (not empty), out of line:
    /// the check for an empty stage is what runs on most takes of the
    /// trace lock, the copy out only on the first after a submission.
    #[inline(never)]
    fn drain_from(&self, t: u32, h: u32, ring: &mut TraceRing<'_>, queue: usize) {
        let n = (h.wrapping_sub(t) as usize).min(self.slots.len());
        for k in 0..n {
            let i = (t as usize).wrapping_add(k).checked_rem(STAGED_SUBMITS).unwrap_or(0);
            let Some([a, b, c, d, e, g, x, y, z, w]) = self.slots.get(i) else { continue };
            let u = |lo: &AtomicU32, hi: &AtomicU32| {
                u64::from(lo.load(Ordering::Relaxed)) | u64::from(hi.load(Ordering::Relaxed)) << 32
            };
            ring.record_submit(
                queue,
                &SubmitRecord {
                    ts_ns: u(a, b),
                    seqno: u(c, d),
                    dwords: u(e, g),
                    ib_va: u(x, y),
                    wptr: u(z, w),
                },
            );
        }
        self.tail.store(h, Ordering::Release);
    }
}

impl fmt::Debug for TraceStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceStage")
            .field("head", &self.head.load(Ordering::Relaxed))
            .field("tail", &self.tail.load(Ordering::Relaxed))
            .finish()
    }
}

fn sep(out: &mut impl Write, first: &mut bool) -> fmt::Result {
    if *first {
        *first = false;
        Ok(())
    } else {
        out.write_char(',')
    }
}

fn ts_slot(seqno: u64) -> usize {
    seqno.checked_rem(SUBMIT_TIMES as u64).unwrap_or(0) as usize
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::boxed::Box;
    use std::vec::Vec;

    /// A full ring overwrites the oldest event, counts it as dropped, and
    /// keeps the newest `N` oldest first, across several wraps. Without the
    /// `trace` feature it records nothing.
    #[test]
    fn ring_wraps_oldest_first() {
        let mut storage: Box<TraceStorage<4>> = Box::default();
        let mut t = TraceRing::new(&mut storage);
        let ev = |seqno| TraceEvent { ts_ns: seqno, kind: TraceKind::Submit, queue: 0, seqno, arg: 0 };
        for s in 1..=11 {
            t.record(ev(s));
        }
        t.note_submit(0, 5, 50);
        if !ON {
            assert_eq!((t.dropped(), t.iter().count(), t.submitted_at(0, 5)), (0, 0, None));
            return;
        }
        assert_eq!(t.submitted_at(0, 5), Some(50));
        assert_eq!(t.dropped(), 7);
        assert_eq!(t.iter().map(|e| e.seqno).collect::<Vec<_>>(), [8, 9, 10, 11]);
        t.record(ev(12));
        assert_eq!(t.iter().map(|e| e.seqno).collect::<Vec<_>>(), [9, 10, 11, 12]);
    }

    /// The stage hands what was pushed to the ring, oldest first, once,
    /// across many rounds that wrap its slots; a full stage refuses a push (the
    /// submitter then records under the lock). Without the `trace`
    /// feature it holds nothing and refuses every push.
    #[test]
    fn stage_keeps_order_and_refuses_when_full() {
        let st = TraceStage::new();
        let mut storage: Box<TraceStorage<{ 3 * STAGED_SUBMITS }>> = Box::default();
        let mut ring = TraceRing::new(&mut storage);
        let rec = |k: u64| SubmitRecord {
            ts_ns: k << 40 | 1,
            seqno: k,
            dwords: k.wrapping_mul(3),
            ib_va: 0xFFFF_0000_0000 | k,
            wptr: u64::MAX - k,
        };
        let mut next = 0u64;
        let mut seen = 0u64;
        for round in 0..40u64 {
            let n = (round * 7) % (STAGED_SUBMITS as u64 + 2);
            let mut pushed = 0;
            for _ in 0..n {
                if st.push(&rec(next)) {
                    next += 1;
                    pushed += 1;
                }
            }
            assert_eq!(pushed, n.min(STAGED_SUBMITS as u64), "round {round}");
            st.drain(&mut ring, 0);
            while seen < next {
                let r = rec(seen);
                assert_eq!(ring.submitted_at(0, r.seqno), Some(r.ts_ns));
                let got: Vec<_> =
                    ring.iter().filter(|e| e.seqno == r.seqno).map(|e| (e.kind, e.arg)).collect();
                assert_eq!(
                    got,
                    [
                        (TraceKind::Encode, r.dwords),
                        (TraceKind::Submit, r.ib_va),
                        (TraceKind::Doorbell, r.wptr)
                    ]
                );
                assert!(ring.iter().all(|e| e.ts_ns == rec(e.seqno).ts_ns));
                seen += 1;
            }
            ring.clear();
        }
        if !ON {
            assert_eq!(next, 0);
        }
    }
}
