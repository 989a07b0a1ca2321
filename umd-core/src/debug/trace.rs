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
    /// the platform clock with `sync` ([`crate::engine::Engine::clock_sync`]).
    /// The exported trace shows it on the GPU engine's own track. A span
    /// that ends before it starts is recorded with length 0.
    pub fn record_gpu_span(
        &mut self,
        queue: u8,
        seqno: u64,
        sync: &crate::engine::ClockSync,
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
}
