//! The engine's per-queue protocol and the IB pool, exposed to the loom
//! models (only under `--cfg loom`; `umd-core/tests/loom.rs`). These are
//! the real `QueueCore` and `IbPool` methods the engine uses, over a lock
//! that yields to loom's scheduler.

extern crate std;

use loom::sync::atomic::{AtomicBool, Ordering};

use crate::engine::queue::{Outcome, QueueCore};
use crate::sync::{FenceError, Seqno};

pub use crate::sync::atomic::LoomLock;

/// Where a fence stands, as the probe reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Done.
    Signalled,
    /// Abandoned.
    Failed,
    /// Not done.
    Pending,
    /// Done, and its outcome acknowledged by the application.
    Acknowledged,
}

/// One queue.
pub struct ProbeQueue(QueueCore<LoomLock, u64>);

impl Default for ProbeQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl ProbeQueue {
    /// A fresh queue (its locks made ready on this thread).
    pub fn new() -> Self {
        let q = ProbeQueue(QueueCore::new(0));
        drop(q.0.submit.lock());
        q.0.warm_up_history_lock();
        q
    }

    /// What the device's completion read does.
    pub fn complete(&self, s: u64) {
        self.0.timeline.advance(Seqno(s));
    }

    /// What a reset does: record `(after, upto]` as failed, then force the
    /// timeline past it.
    pub fn reset(&self, after: u64, upto: u64) {
        self.0.record_failure(Seqno(after), Seqno(upto), FenceError::DeviceHung);
        self.0.timeline.force(Seqno(upto));
    }

    /// What a status query answers.
    pub fn status(&self, s: u64) -> Status {
        match self.0.outcome(Seqno(s)) {
            Outcome::Signalled => Status::Signalled,
            Outcome::Failed(_) => Status::Failed,
            Outcome::Pending | Outcome::Acknowledged => Status::Pending,
        }
    }

    /// Completion bookkeeping: the range this caller must process.
    pub fn claim(&self) -> Option<(u64, u64)> {
        self.0.claim().map(|(a, b)| (a.0, b.0))
    }

    /// A submission: under the submit lock, the next sequence number,
    /// published with release ordering.
    pub fn submit(&self) -> u64 {
        let mut guard = self.0.submit.lock();
        let s = self.0.emitted().next();
        *guard = guard.wrapping_add(1);
        self.0.emitted.store(s.0, crate::sync::atomic::Ordering::Release);
        s.0
    }

    /// The last emitted sequence number.
    pub fn emitted(&self) -> u64 {
        self.0.emitted().0
    }
}

/// A device's queues and its loss flag: what `DeviceCore::submit` and
/// `DeviceCore::device_lost` do with them, over the real
/// `QueueCore::fail_pending`.
pub struct ProbeDevice {
    lost: AtomicBool,
    queues: [QueueCore<LoomLock, u64>; 2],
}

impl Default for ProbeDevice {
    fn default() -> Self {
        Self::new()
    }
}

impl ProbeDevice {
    /// Two fresh queues (their locks made ready on this thread), not lost.
    pub fn new() -> Self {
        let d = ProbeDevice { lost: AtomicBool::new(false), queues: [QueueCore::new(0), QueueCore::new(0)] };
        for q in &d.queues {
            drop(q.submit.lock());
            q.warm_up_history_lock();
        }
        d
    }

    /// A submission to queue `qi`, as `DeviceCore::submit`'s locked part:
    /// under the queue's submit lock, refused when the device is lost,
    /// else the next sequence number, published. `None` when refused.
    pub fn submit(&self, qi: usize) -> Option<u64> {
        let q = self.queues.get(qi)?;
        let mut guard = q.submit.lock();
        if self.lost.load(Ordering::Acquire) {
            return None;
        }
        let s = q.emitted().next();
        *guard = guard.wrapping_add(1);
        q.emitted.store(s.0, crate::sync::atomic::Ordering::Release);
        Some(s.0)
    }

    /// A thread that meets the loss holding queue `held`'s submit lock or
    /// none (`DeviceCore::device_lost_holding`): the first sets the flag and
    /// fails every queue's pending range.
    pub fn lose(&self, held: Option<usize>) {
        if self.lost.swap(true, Ordering::AcqRel) {
            return;
        }
        for (qi, q) in self.queues.iter().enumerate() {
            q.fail_pending(held == Some(qi), FenceError::DeviceLost, || {});
        }
    }

    /// A thread that meets the loss while it holds queue `qi`'s submit
    /// lock (a queue reset whose handshake finds the device gone).
    pub fn lose_in_reset(&self, qi: usize) {
        let Some(q) = self.queues.get(qi) else { return };
        let _guard = q.submit.lock();
        self.lose(Some(qi));
    }

    /// What a status query on queue `qi` answers for `s`.
    pub fn status(&self, qi: usize, s: u64) -> Status {
        match self.queues.get(qi).map(|q| q.outcome(Seqno(s))) {
            Some(Outcome::Signalled) => Status::Signalled,
            Some(Outcome::Failed(_)) => Status::Failed,
            Some(Outcome::Pending) | None => Status::Pending,
            Some(Outcome::Acknowledged) => Status::Acknowledged,
        }
    }

    /// The last sequence number queue `qi` published.
    pub fn emitted(&self, qi: usize) -> u64 {
        self.queues.get(qi).map_or(0, |q| q.emitted().0)
    }
}

/// The per-queue record of acknowledged fault interrupts
/// (`DeviceCore::fault_irqs`): the real type, over loom's atomics.
pub struct ProbeFaultIrqs(crate::sync::fault_irqs::FaultIrqs);

impl Default for ProbeFaultIrqs {
    fn default() -> Self {
        Self::new()
    }
}

impl ProbeFaultIrqs {
    /// None pending.
    pub fn new() -> Self {
        ProbeFaultIrqs(crate::sync::fault_irqs::FaultIrqs::new())
    }

    /// What `DeviceCore::service` does with the faults it acknowledged.
    pub fn note(&self, queues: u32) {
        self.0.note(queues)
    }

    /// What queue `q`'s hang check reads into its view.
    pub fn take(&self, q: usize) -> bool {
        self.0.take(q)
    }
}

/// Chunks of the probe's IB pool.
const PROBE_CHUNKS: usize = 4;
/// Bytes per chunk of the probe's IB pool (256 dwords).
const PROBE_CHUNK_BYTES: usize = 1024;

/// The IB pool (`crate::ibpool`) with its commit mailboxes: the real type
/// over the loom lock and atomics, 4 chunks of 256 dwords.
pub struct ProbePool(crate::ibpool::IbPool<LoomLock, PROBE_CHUNKS>);

impl ProbePool {
    /// A pool over leaked memory (its lock made ready on this thread), or
    /// `None` if the pool refuses it.
    pub fn new() -> Option<Self> {
        extern crate std;
        let mem: &'static mut [u32] =
            std::boxed::Box::leak(std::vec![0u32; PROBE_CHUNKS * PROBE_CHUNK_BYTES / 4].into_boxed_slice());
        let cpu = core::ptr::NonNull::from(mem).cast::<u8>();
        // SAFETY: `mem` is leaked, 4-byte aligned, `PROBE_CHUNKS *
        // PROBE_CHUNK_BYTES` bytes long, and used by this pool alone.
        let region =
            unsafe { crate::platform::DmaRegion::new(cpu, 0x1_0000, PROBE_CHUNKS * PROBE_CHUNK_BYTES) };
        let pool = crate::ibpool::IbPool::new(region, 0x1_0000, PROBE_CHUNK_BYTES).ok()?;
        pool.stats();
        Some(ProbePool(pool))
    }

    /// What a submission does with the pool: records `dwords` dwords into
    /// a chunk of `queue` (batching, no lock held), then, under `order`
    /// (the queue's submit lock, whose value is its last sequence number),
    /// takes the next sequence number and commits through the mailbox.
    /// False if no chunk was free.
    pub fn submit(&self, queue: u8, dwords: usize, order: &loom::sync::Mutex<u64>) -> bool {
        use crate::cmd::ChunkSource;
        use crate::sync::{FenceId, QueueId};
        let none_done = |_: QueueId| Seqno(0);
        let mut give_up = |_: FenceId| false;
        let mut src = self.0.recorder(QueueId(queue), true, &none_done, &mut give_up);
        let Some(chunk) = src.next_chunk() else { return false };
        src.close_chunk(chunk.gpu_va, dwords);
        let pending = src.pending();
        let Ok(mut seq) = order.lock() else { return false };
        *seq = seq.wrapping_add(1);
        pending.commit_in_order(FenceId { queue: QueueId(queue), seqno: Seqno(*seq) });
        true
    }

    /// The pool's counts (after applying every waiting commit).
    pub fn stats(&self) -> crate::ibpool::IbPoolStats {
        self.0.stats()
    }
}

/// A queue's trace stage (`crate::debug::trace::TraceStage`): the real
/// type over loom's atomics.
pub struct ProbeTraceStage(crate::debug::trace::TraceStage);

impl Default for ProbeTraceStage {
    fn default() -> Self {
        Self::new()
    }
}

impl ProbeTraceStage {
    /// Empty.
    pub fn new() -> Self {
        ProbeTraceStage(crate::debug::trace::TraceStage::new())
    }

    /// What a submitter does under its queue's submit lock: stages
    /// submission `seqno`, every field derived from it (so that a torn
    /// read shows); false if the stage was full.
    pub fn push(&self, seqno: u64) -> bool {
        self.0.push(&Self::record(seqno))
    }

    /// What a holder of the trace lock does: moves the staged submissions
    /// into a trace ring and returns their sequence numbers, oldest
    /// first, or `None` if a submission's events or submit time did not
    /// match what was staged.
    pub fn drain(&self) -> Option<std::vec::Vec<u64>> {
        use crate::debug::trace::{TraceStorage, STAGED_SUBMITS};
        use crate::debug::{TraceKind, TraceRing};
        let mut storage: std::boxed::Box<TraceStorage<{ 3 * STAGED_SUBMITS }>> = std::boxed::Box::default();
        let mut ring = TraceRing::new(&mut storage);
        self.0.drain(&mut ring, 0);
        let mut seqnos = std::vec::Vec::new();
        let events: std::vec::Vec<_> = ring.iter().copied().collect();
        for three in events.chunks(3) {
            let r = Self::record(three.first()?.seqno);
            let want =
                [(TraceKind::Encode, r.dwords), (TraceKind::Submit, r.ib_va), (TraceKind::Doorbell, r.wptr)];
            let ok = three.len() == 3
                && three
                    .iter()
                    .zip(want)
                    .all(|(e, (k, a))| e.kind == k && e.arg == a && e.seqno == r.seqno && e.ts_ns == r.ts_ns)
                && ring.submitted_at(0, r.seqno) == Some(r.ts_ns);
            if !ok {
                return None;
            }
            seqnos.push(r.seqno);
        }
        Some(seqnos)
    }

    fn record(seqno: u64) -> crate::debug::trace::SubmitRecord {
        crate::debug::trace::SubmitRecord {
            ts_ns: seqno << 33 | 7,
            seqno,
            dwords: seqno.wrapping_mul(5),
            ib_va: seqno << 40 | seqno,
            wptr: !seqno,
        }
    }
}
