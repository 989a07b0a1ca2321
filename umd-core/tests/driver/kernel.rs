//! Kernel-mediated mode against a fake kernel driver with the refgpu DRM
//! driver's semantics (`docs/linux.md`): contexts on one engine each, one
//! timeline per queue that passes failed work too, guilty/innocent
//! contexts, in-syncs on points nobody submitted refused (`EINVAL`),
//! foreign syncs. The core picks VAs and binds slabs, records IBs, passes
//! wait/signal points, holds wait-before-signal work back, replaces guilty
//! contexts, and turns a kernel reset into failed fences.

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard};

use crate::race;
use umd_core::cmd::Command;
use umd_core::config::{Config, HangConfig};
use umd_core::decode::Decoder;
use umd_core::engine::InitError;
use umd_core::engine::Submit;
use umd_core::error::{FenceStatus, SubmitError, WaitError};
use umd_core::hw::{ChipId, Generation};
use umd_core::kernel::KernelDevice;
use umd_core::mem::BufferDesc;
use umd_core::platform::fake::FakeState;
use umd_core::platform::{
    submit_each, BatchError, ContextId, ContextStatus, DmaFlags, DmaRegion, ForeignSync, Guilt, KernelInfo,
    KernelIo, KernelJob, KernelSubmitError, KernelSync, KernelWait, Platform, PlatformError,
};
use umd_core::storage::DeviceStorage;
use umd_core::sync::{Cause, FaultInfo, FenceError, QueueId};

const VA_START: u64 = 1 << 20;
const VA_END: u64 = 1 << 40;

#[derive(Debug)]
struct Job {
    ctx: u32,
    ib_va: u64,
    ib_dw: u32,
    waits: Vec<KernelWait>,
    signal: KernelSync,
    seq: u64,
}

#[derive(Debug)]
struct Ctx {
    engine: u32,
    next_seq: u64,
    guilty: Option<(u64, Guilt)>,
    innocent: bool,
}

/// The kernel: VA bindings, contexts, jobs in order per engine, timelines.
struct KState {
    mem: FakeState,
    gen: Generation,
    bindings: Vec<(u64, u64, u64, bool)>,
    contexts: Vec<Option<Ctx>>,
    jobs: Vec<Job>,
    /// Each queue's timeline: the point reached, the last point added.
    reached: [u64; 3],
    added: [u64; 3],
    /// The next job run on this engine hangs or faults.
    fail_next: [Option<Guilt>; 3],
    foreign_signalled: HashSet<u64>,
    lost: bool,
    kernel_waits: u32,
    /// Refuse every submission after this many more (EFAULT).
    refuse_after: Option<u32>,
    /// Refuse unbinds (EINVAL), leaving the range bound.
    fail_unbind: bool,
    /// Calls that reach the device (submit, completed, context_status,
    /// wait, signal, create_context) counted for `lose_at`.
    calls: u64,
    /// The device is lost at this call (`calls` reaching it): that call
    /// fails as every later one does, and nothing runs any more.
    lose_at: Option<u64>,
    /// A submission accepted yields the calling thread (outside the lock):
    /// other threads run while the core is between the kernel's answer and
    /// what follows it.
    submit_yields: bool,
    /// The kernel has a multi-job submit (all or none, one call); without
    /// it `submit_batch` is the trait's one submit per job.
    batch: bool,
    /// Submit calls made: one per `submit`, one per multi-job submit.
    submit_calls: u32,
}

/// The fake kernel behind a mutex (the core calls platforms through `&self`).
struct FakeKernel(Mutex<KState>);

impl FakeKernel {
    fn new(gen: Generation) -> FakeKernel {
        FakeKernel(Mutex::new(KState {
            mem: FakeState::new(gen, 4 << 20),
            gen,
            bindings: Vec::new(),
            contexts: Vec::new(),
            jobs: Vec::new(),
            reached: [0; 3],
            added: [0; 3],
            fail_next: [None; 3],
            foreign_signalled: HashSet::new(),
            lost: false,
            kernel_waits: 0,
            refuse_after: None,
            fail_unbind: false,
            calls: 0,
            lose_at: None,
            submit_yields: false,
            batch: false,
            submit_calls: 0,
        }))
    }

    fn k(&self) -> MutexGuard<'_, KState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl KState {
    /// Counts a call that reaches the device; whether the device is lost
    /// (from the call `lose_at` names on).
    fn lost_at_call(&mut self) -> bool {
        self.calls += 1;
        if self.lose_at.is_some_and(|n| self.calls >= n) {
            self.lost = true;
        }
        self.lost
    }

    fn translate(&self, va: u64) -> Option<u64> {
        self.bindings.iter().find(|(v, _, len, _)| va >= *v && va < v + len).map(|(v, d, _, _)| d + (va - v))
    }

    fn live_contexts(&self) -> usize {
        self.contexts.iter().flatten().count()
    }

    fn ready(&self, w: &KernelWait) -> bool {
        match w {
            KernelWait::Point(s) => self.reached[s.queue as usize] >= s.point,
            KernelWait::Foreign(f) => self.foreign_signalled.contains(&f.0),
        }
    }

    /// Runs every runnable job, in order per engine.
    fn run(&mut self) {
        loop {
            let Some(i) = (0..self.jobs.len()).find(|&i| {
                let j = &self.jobs[i];
                let engine = self.contexts[j.ctx as usize].as_ref().unwrap().engine;
                let first = !self.jobs[..i]
                    .iter()
                    .any(|o| self.contexts[o.ctx as usize].as_ref().unwrap().engine == engine);
                first && j.waits.iter().all(|w| self.ready(w))
            }) else {
                return;
            };
            let j = self.jobs.remove(i);
            let ctx = self.contexts[j.ctx as usize].as_mut().unwrap();
            let engine = ctx.engine as usize;
            if ctx.guilty.is_some() {
                // Cancelled (ECANCELED): the timeline passes it.
            } else if let Some(g) = self.fail_next[engine].take() {
                ctx.guilty = Some((j.seq, g));
                // Other contexts' work on the engine "ran again": innocent.
                let others: Vec<u32> = self
                    .jobs
                    .iter()
                    .filter(|o| {
                        o.ctx != j.ctx
                            && self.contexts[o.ctx as usize].as_ref().unwrap().engine == engine as u32
                    })
                    .map(|o| o.ctx)
                    .collect();
                for o in others {
                    self.contexts[o as usize].as_mut().unwrap().innocent = true;
                }
            } else {
                self.execute(&j);
            }
            let q = j.signal.queue as usize;
            self.reached[q] = self.reached[q].max(j.signal.point);
        }
    }

    fn execute(&mut self, j: &Job) {
        let base = self.translate(j.ib_va).expect("IB is bound");
        let bytes: Vec<u8> = (0..j.ib_dw as u64)
            .flat_map(|k| self.mem.read_u32(base + 4 * k).unwrap().to_le_bytes())
            .collect();
        for item in Decoder::new(self.gen, &bytes, j.ib_va) {
            match item.result.expect("IB decodes").command {
                Command::WriteData { dst, data } => {
                    let d = self.translate(dst).unwrap();
                    for (k, w) in data.iter().enumerate() {
                        self.mem.write_u32(d + 4 * k as u64, w);
                    }
                }
                Command::Fill { dst, size, value } => {
                    let d = self.translate(dst).unwrap();
                    for k in 0..size / 4 {
                        self.mem.write_u32(d + 4 * k, value);
                    }
                }
                _ => {}
            }
        }
    }
}

// SAFETY: memory comes from the fake, whose contract holds; time grows.
unsafe impl Platform for FakeKernel {
    type RawMutex = umd_core::platform::SpinLock;

    fn dma_alloc(&self, len: usize, _flags: DmaFlags) -> Result<DmaRegion, PlatformError> {
        self.k().mem.dma_alloc(len)
    }
    fn dma_free(&self, r: DmaRegion) {
        self.k().mem.dma_free(r)
    }
    fn now_ns(&self) -> u64 {
        self.k().mem.now_ns()
    }
    fn delay_ns(&self, ns: u64) {
        self.k().mem.delay_ns(ns)
    }
}

impl KernelIo for FakeKernel {
    fn info(&self) -> Result<KernelInfo, PlatformError> {
        let k = self.k();
        let chip_id = ChipId { generation: k.gen, revision: 0 }.id_register();
        Ok(KernelInfo { chip_id, engines: 3, va_start: VA_START, va_end: VA_END, ib_align: 32 })
    }
    fn create_context(&self, queue: u32) -> Result<ContextId, PlatformError> {
        let mut k = self.k();
        if k.lost_at_call() {
            return Err(PlatformError::DeviceLost);
        }
        k.contexts.push(Some(Ctx { engine: queue, next_seq: 1, guilty: None, innocent: false }));
        Ok(ContextId(k.contexts.len() as u32 - 1))
    }
    fn destroy_context(&self, ctx: ContextId) {
        self.k().contexts[ctx.0 as usize] = None;
    }
    fn context_status(&self, ctx: ContextId) -> Result<ContextStatus, PlatformError> {
        let mut k = self.k();
        if k.lost_at_call() {
            return Ok(ContextStatus::DeviceLost);
        }
        let c = k.contexts.get(ctx.0 as usize).and_then(Option::as_ref).ok_or(PlatformError::Os(2))?;
        Ok(match (c.guilty, c.innocent) {
            (Some((seqno, cause)), _) => ContextStatus::Guilty { seqno, cause },
            (None, true) => ContextStatus::Innocent,
            (None, false) => ContextStatus::Ok,
        })
    }
    fn bind(
        &self,
        va: u64,
        region: &DmaRegion,
        offset: u64,
        len: u64,
        read_only: bool,
    ) -> Result<(), PlatformError> {
        let mut k = self.k();
        assert!(va >= VA_START && va + len <= VA_END, "bind inside the kernel's range");
        assert!(!k.bindings.iter().any(|b| va < b.0 + b.2 && b.0 < va + len), "no overlapping bind");
        k.bindings.push((va, region.dev_addr() + offset, len, read_only));
        Ok(())
    }
    fn unbind(&self, va: u64, _len: u64) -> Result<(), PlatformError> {
        let mut k = self.k();
        if k.fail_unbind {
            return Err(PlatformError::Os(22));
        }
        k.bindings.retain(|b| b.0 != va);
        Ok(())
    }
    fn submit(
        &self,
        ctx: ContextId,
        ib_va: u64,
        ib_dw: u32,
        waits: &[KernelWait],
        signal: KernelSync,
    ) -> Result<u64, KernelSubmitError> {
        let (r, yields) = {
            let mut k = self.k();
            k.submit_calls += 1;
            (k.submit(ctx, ib_va, ib_dw, waits, signal), k.submit_yields)
        };
        if yields && r.is_ok() {
            std::thread::yield_now();
        }
        r
    }
    fn submit_batch(&self, ctx: ContextId, jobs: &[KernelJob<'_>]) -> Result<u64, BatchError> {
        if !self.k().batch {
            return submit_each(self, ctx, jobs);
        }
        let mut k = self.k();
        k.submit_calls += 1;
        // All or none: what refuses one job refuses the batch (the checks
        // of `KState::submit` first, so the jobs after them all go in).
        let refuse = |error| BatchError { queued: 0, error };
        if k.lost {
            return Err(refuse(KernelSubmitError::DeviceLost));
        }
        let c = k.contexts[ctx.0 as usize].as_ref();
        match c {
            None => return Err(refuse(KernelSubmitError::Platform(PlatformError::Os(2)))),
            Some(c) if c.guilty.is_some() => return Err(refuse(KernelSubmitError::Cancelled)),
            Some(_) => {}
        }
        let unready = jobs.iter().flat_map(|j| j.waits).any(|w| !k.ready_point(w));
        if unready || k.refuse_after.is_some() {
            return Err(refuse(KernelSubmitError::Platform(PlatformError::Os(22))));
        }
        let mut first = None;
        for j in jobs {
            let seq = k.submit(ctx, j.ib_va, j.ib_dwords, j.waits, j.signal).map_err(refuse)?;
            first.get_or_insert(seq);
        }
        Ok(first.unwrap_or(0))
    }
    fn completed(&self, queue: u32) -> Result<u64, PlatformError> {
        let mut k = self.k();
        if k.lost_at_call() {
            return Err(PlatformError::DeviceLost);
        }
        Ok(k.reached[queue as usize])
    }
    fn wait(&self, sync: KernelSync, _timeout_ns: u64) -> Result<bool, PlatformError> {
        // The kernel runs the work while the caller sleeps (a lost device
        // runs nothing).
        let mut k = self.k();
        if k.lost_at_call() {
            return Err(PlatformError::DeviceLost);
        }
        k.kernel_waits += 1;
        k.run();
        Ok(k.reached[sync.queue as usize] >= sync.point)
    }
    fn signal(&self, sync: KernelSync) -> Result<(), PlatformError> {
        let mut k = self.k();
        if k.lost_at_call() {
            return Err(PlatformError::DeviceLost);
        }
        let q = sync.queue as usize;
        k.added[q] = k.added[q].max(sync.point);
        k.reached[q] = k.reached[q].max(sync.point);
        Ok(())
    }
}

impl KState {
    /// Whether the kernel would take `w` as an in-sync: a point submitted.
    fn ready_point(&self, w: &KernelWait) -> bool {
        match w {
            KernelWait::Point(s) => s.point <= self.added[s.queue as usize],
            KernelWait::Foreign(_) => true,
        }
    }

    /// The submit call, under the fake's lock.
    fn submit(
        &mut self,
        ctx: ContextId,
        ib_va: u64,
        ib_dw: u32,
        waits: &[KernelWait],
        signal: KernelSync,
    ) -> Result<u64, KernelSubmitError> {
        let k = self;
        if k.lost_at_call() {
            return Err(KernelSubmitError::DeviceLost);
        }
        match k.refuse_after {
            Some(0) => return Err(KernelSubmitError::Platform(PlatformError::Os(14))),
            Some(n) => k.refuse_after = Some(n - 1),
            None => {}
        }
        // The refgpu driver refuses an in-sync point nobody submitted.
        for w in waits {
            if let KernelWait::Point(s) = w {
                if s.point > k.added[s.queue as usize] {
                    return Err(KernelSubmitError::Platform(PlatformError::Os(22)));
                }
            }
        }
        let c =
            k.contexts[ctx.0 as usize].as_mut().ok_or(KernelSubmitError::Platform(PlatformError::Os(2)))?;
        if c.guilty.is_some() {
            return Err(KernelSubmitError::Cancelled);
        }
        let seq = c.next_seq;
        c.next_seq += 1;
        let q = signal.queue as usize;
        assert!(signal.point > k.added[q], "timeline points only grow");
        k.added[q] = signal.point;
        k.jobs.push(Job { ctx: ctx.0, ib_va, ib_dw, waits: waits.to_vec(), signal, seq });
        Ok(seq)
    }
}

fn cfg() -> Config {
    Config { ib_chunk_bytes: 4096, use_irq: false, ..Config::DEFAULT }
}

type Storage = DeviceStorage<256, 256, 64, 256>;

fn with_kernel(gen: Generation, f: impl FnOnce(&KernelDevice<'_, FakeKernel, 4>, &FakeKernel)) {
    let k = FakeKernel::new(gen);
    let mut storage: Box<Storage> = Box::default();
    let dev = KernelDevice::<FakeKernel, 4>::new(&k, &mut storage, cfg()).unwrap();
    f(&dev, &k);
}

const T: u64 = 1_000_000_000;

#[test]
fn submit_wait_and_data_through_the_kernel() {
    for gen in [Generation::Gen1, Generation::Gen2] {
        let k = FakeKernel::new(gen);
        let mut storage: Box<Storage> = Box::default();
        let dev = KernelDevice::<FakeKernel, 4>::new(&k, &mut storage, cfg()).unwrap();
        assert_eq!(dev.chip().generation, gen);
        assert_eq!(k.k().live_contexts(), 3, "a context per queue");
        let buf = dev.alloc_buffer(8192).unwrap();
        let b = dev.va(buf).unwrap();
        assert!((VA_START..VA_END).contains(&b), "the core chose the VA in the kernel's range");
        let f = dev
            .submit(QueueId::COPY, &[], |cb| {
                cb.fill(b, 4096, 0x5555_5555)?;
                cb.write_data(b + 4096, &[1, 2, 3])
            })
            .unwrap();
        assert_eq!(dev.query(f), Ok(FenceStatus::Pending));
        dev.wait(f, T).unwrap();
        assert!(k.k().kernel_waits > 0, "the wait blocked in the kernel");
        assert_eq!(k.k().mem.delays, 0, "and never polled with delays");
        assert_eq!(dev.read_u32(buf, 100), Ok(0x5555_5555));
        assert_eq!(dev.read_u32(buf, 1026), Ok(3));
        dev.free(buf).unwrap();
        assert_eq!(dev.shutdown().leaked_buffers, 0);
        let st = k.k();
        assert_eq!(st.mem.allocs, 0);
        assert!(st.bindings.is_empty(), "every bind was undone");
        assert_eq!(st.live_contexts(), 0, "every context destroyed");
    }
}

#[test]
fn small_buffers_share_one_bind() {
    with_kernel(Generation::Gen2, |dev, k| {
        let binds = k.k().bindings.len();
        let hs: Vec<_> = (0..64).map(|_| dev.alloc_buffer(256).unwrap()).collect();
        assert_eq!(k.k().bindings.len(), binds + 1, "64 small buffers, one slab bound");
        for h in hs {
            dev.free(h).unwrap();
        }
    });
}

/// An unbind the kernel refuses leaves the range bound, so its VA is not
/// given out again: the driver's VA allocator recycles a freed range for
/// the next buffer of its length at once, whose bind would then overlap
/// the old one (the fake kernel refuses that with a panic).
#[test]
fn a_range_whose_unbind_failed_is_not_given_out_again() {
    with_kernel(Generation::Gen2, |dev, k| {
        // 8 KiB aligned to 8 KiB: a block of its own, a length that recycles.
        let desc = BufferDesc::new(8192).align(8192);
        let a = dev.alloc(&desc).unwrap();
        let va = dev.va(a).unwrap();
        k.k().fail_unbind = true;
        dev.free(a).unwrap();
        k.k().fail_unbind = false;
        assert!(k.k().bindings.iter().any(|b| b.0 == va), "the refused unbind left the range bound");
        let b = dev.alloc(&desc).unwrap();
        let vb = dev.va(b).unwrap();
        assert_ne!(vb, va, "the range still bound is not given out");
        dev.free(b).unwrap();
        let c = dev.alloc(&desc).unwrap();
        assert_eq!(dev.va(c), Ok(vb), "a range unbound normally is reused by its length");
        dev.free(c).unwrap();
    });
}

#[test]
fn waits_become_timeline_points_and_wait_before_signal_is_held() {
    with_kernel(Generation::Gen2, |dev, k| {
        let copy = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x10_0000)).unwrap();
        let compute = dev.submit(QueueId::COMPUTE, &[copy], |cb| cb.timestamp(0x10_0008)).unwrap();
        {
            let st = k.k();
            assert_eq!(st.jobs.len(), 2);
            assert_eq!(st.jobs[1].waits, vec![KernelWait::Point(KernelSync { queue: 2, point: 1 })]);
            assert_eq!(st.jobs[1].signal, KernelSync { queue: 1, point: 1 });
        }
        // Wait before signal: GFX waits for COPY:2, not submitted yet. The
        // kernel would refuse the point, so the core holds the job, and the
        // next GFX job behind it.
        let future = dev.next_fence(QueueId::COPY).unwrap();
        let gfx = dev.submit(QueueId::GFX, &[future], |cb| cb.timestamp(0x10_0010)).unwrap();
        let gfx2 = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x10_0018)).unwrap();
        assert_eq!(k.k().jobs.len(), 2, "held in the core");
        assert_eq!(dev.sync_point(gfx), Err(WaitError::NotSubmitted(gfx)));
        // COPY waiting for that GFX job closes a cycle.
        let err = dev.submit(QueueId::COPY, &[gfx], |cb| cb.timestamp(0x10_0020)).unwrap_err();
        assert!(matches!(err, SubmitError::Cycle(_)), "{err:?}");
        // The producer arrives: both held GFX jobs follow it, in order.
        let producer = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x10_0020)).unwrap();
        assert_eq!(producer, future);
        {
            let st = k.k();
            assert_eq!(st.jobs.len(), 5);
            assert_eq!(st.jobs[3].waits, vec![KernelWait::Point(KernelSync { queue: 2, point: 2 })]);
            assert_eq!(st.jobs[3].signal, KernelSync { queue: 0, point: 1 });
            assert_eq!(st.jobs[4].signal, KernelSync { queue: 0, point: 2 });
        }
        assert_eq!(dev.sync_point(gfx2), Ok(KernelSync { queue: 0, point: 2 }));
        dev.wait(gfx2, T).unwrap();
        dev.wait(compute, T).unwrap();
    });
}

#[test]
fn held_jobs_reach_the_kernel_in_one_call_when_it_has_a_batch_submit() {
    // Five GFX jobs held behind a COPY fence nobody submitted: when the
    // producer arrives, a kernel with a multi-job submit gets all five in
    // one call (two calls in all, with the producer's); one without it
    // gets five SUBMITs. Either way in order, with consecutive seqnos.
    for (batch, calls) in [(true, 2), (false, 6)] {
        with_kernel(Generation::Gen2, |dev, k| {
            k.k().batch = batch;
            let future = dev.next_fence(QueueId::COPY).unwrap();
            let mut held = vec![dev.submit(QueueId::GFX, &[future], |cb| cb.timestamp(0x10_0000)).unwrap()];
            for i in 1..5u64 {
                held.push(dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x10_0000 + 8 * i)).unwrap());
            }
            assert_eq!(k.k().submit_calls, 0, "all held in the core");
            let producer = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x10_0040)).unwrap();
            assert_eq!(producer, future);
            {
                let st = k.k();
                assert_eq!(st.submit_calls, calls, "batch submit {batch}");
                let gfx: Vec<_> = st.jobs.iter().filter(|j| j.signal.queue == 0).collect();
                assert_eq!(gfx.len(), 5);
                for (i, j) in gfx.iter().enumerate() {
                    assert_eq!((j.seq, j.signal.point), (i as u64 + 1, i as u64 + 1));
                }
                assert_eq!(gfx[0].waits, vec![KernelWait::Point(KernelSync { queue: 2, point: 1 })]);
            }
            for f in held {
                dev.wait(f, T).unwrap();
            }
        });
    }
}

#[test]
fn a_batch_window_the_build_cannot_keep_is_refused_at_bring_up() {
    // Past the longest window, or any window without the deferred-doorbells
    // feature: a typed error, no device.
    let k = FakeKernel::new(Generation::Gen2);
    let mut storage: Box<Storage> = Box::default();
    let mut refused = |ns: u64| {
        matches!(
            KernelDevice::<FakeKernel, 4>::new(&k, &mut storage, Config { batch_window_ns: ns, ..cfg() }),
            Err(InitError::OutOfRange(umd_core::config::RangeError {
                key: umd_core::config::Key::BatchWindowNs
            }))
        )
    };
    assert!(refused(umd_core::config::MAX_BATCH_WINDOW_NS + 1));
    assert_eq!(refused(200_000), !cfg!(feature = "deferred-doorbells"));
    // Every other tunable's range is checked too.
    let bad = Config { dep_wait_ns: u64::MAX, ..cfg() };
    assert_eq!(
        KernelDevice::<FakeKernel, 4>::new(&k, &mut storage, bad).err(),
        Some(InitError::OutOfRange(umd_core::config::RangeError { key: umd_core::config::Key::DepWaitNs }))
    );
}

#[cfg(feature = "deferred-doorbells")]
#[test]
fn a_batch_window_sends_its_submissions_in_one_kernel_call() {
    // With a batch window every submission is held in the core until the
    // window's rules flush its queue: eight GFX submissions, then a wait on
    // the last (which flushes at once), reach the kernel as one multi-job
    // submit. Past the window, the next submission flushes what
    // it joined. Window 0: one SUBMIT each, as before.
    let window = 200_000;
    for (window_ns, calls) in [(window, 1), (0, 8)] {
        let k = FakeKernel::new(Generation::Gen2);
        k.k().batch = true;
        let mut storage: Box<Storage> = Box::default();
        let dev = KernelDevice::<FakeKernel, 4>::new(
            &k,
            &mut storage,
            Config { batch_window_ns: window_ns, ..cfg() },
        )
        .unwrap();
        let fences: Vec<_> = (0..8u64)
            .map(|i| dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x10_0000 + 8 * i)).unwrap())
            .collect();
        if window_ns != 0 {
            // Service passes within the window (the hang check among them)
            // leave them held.
            for _ in 0..3 {
                dev.service();
            }
            assert_eq!(k.k().submit_calls, 0, "all eight held for the window");
        }
        dev.wait(*fences.last().unwrap(), T).unwrap();
        assert_eq!(k.k().submit_calls, calls, "window {window_ns}");
        assert_eq!(dev.stats().doorbells, u64::from(calls), "kernel submit calls are its doorbells");
        for f in &fences {
            assert_eq!(dev.query(*f), Ok(FenceStatus::Signalled));
        }
        if window_ns != 0 {
            // One more, held; the window passes; the next submission
            // hands both over in one call.
            dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x10_0100)).unwrap();
            assert_eq!(k.k().submit_calls, 1);
            dev.platform().delay_ns(window_ns);
            let last = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x10_0108)).unwrap();
            assert_eq!(k.k().submit_calls, 2, "both in the second call");
            dev.wait(last, T).unwrap();
        }
    }
}

#[test]
fn a_batch_the_kernel_refuses_stays_held() {
    // The kernel refuses the batch as a whole: nothing of it is queued, the
    // held jobs stay held and fail as held work the kernel refuses does.
    with_kernel(Generation::Gen2, |dev, k| {
        k.k().batch = true;
        let future = dev.next_fence(QueueId::COPY).unwrap();
        let a = dev.submit(QueueId::GFX, &[future], |cb| cb.timestamp(0x10_0000)).unwrap();
        let b = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x10_0008)).unwrap();
        k.k().refuse_after = Some(1);
        let producer = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x10_0010)).unwrap();
        dev.wait(producer, T).unwrap();
        assert_eq!(
            k.k().jobs.iter().filter(|j| j.signal.queue == 0).count(),
            0,
            "nothing of the batch queued"
        );
        assert_eq!(dev.wait(a, T), Err(WaitError::Failed(FenceError::DeviceHung)));
        assert!(dev.wait(b, T).is_err());
        k.k().refuse_after = None;
        let next = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x10_0018)).unwrap();
        dev.wait(next, T).unwrap();
    });
}

#[test]
fn a_wait_before_signal_beyond_the_limit_fails_and_the_queue_goes_on() {
    let k = FakeKernel::new(Generation::Gen2);
    let mut storage: Box<Storage> = Box::default();
    let hang = HangConfig { unsubmitted_wait_ns: Some(50_000_000), ..Config::DEFAULT.hang };
    let dev = KernelDevice::<FakeKernel, 4>::new(&k, &mut storage, Config { hang, ..cfg() }).unwrap();
    let future = dev.next_fence(QueueId::COPY).unwrap();
    let held = dev.submit(QueueId::GFX, &[future], |cb| cb.timestamp(0x10_0000)).unwrap();
    assert_eq!(dev.wait(held, T), Err(WaitError::Failed(FenceError::NeverSignalled { producer: future.id })));
    assert!(k.k().jobs.is_empty(), "the held job never reached the kernel");
    let next = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x10_0008)).unwrap();
    dev.wait(next, T).unwrap();
}

#[test]
fn held_work_the_kernel_refuses_fails_instead_of_waiting_forever() {
    with_kernel(Generation::Gen2, |dev, k| {
        let future = dev.next_fence(QueueId::COPY).unwrap();
        let held = dev.submit(QueueId::GFX, &[future], |cb| cb.timestamp(0x10_0000)).unwrap();
        // The producer goes in; the held job after it is refused, on every
        // retry.
        k.k().refuse_after = Some(1);
        let producer = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x10_0008)).unwrap();
        dev.wait(producer, T).unwrap();
        assert_eq!(dev.wait(held, T), Err(WaitError::Failed(FenceError::DeviceHung)));
        k.k().refuse_after = None;
        let next = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x10_0010)).unwrap();
        dev.wait(next, T).unwrap();
    });
}

#[test]
fn a_guilty_context_fails_its_work_and_dependents_and_is_replaced() {
    with_kernel(Generation::Gen1, |dev, k| {
        let ok = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x10_0000)).unwrap();
        dev.wait(ok, T).unwrap();
        k.k().fail_next[0] = Some(Guilt::Hang);
        let f1 = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x10_0000)).unwrap();
        let f2 = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x10_0008)).unwrap();
        let consumer = dev.submit(QueueId::COMPUTE, &[f2], |cb| cb.timestamp(0x10_0010)).unwrap();
        assert_eq!(dev.wait(f1, T), Err(WaitError::Failed(FenceError::DeviceHung)));
        assert_eq!(dev.query(f2), Ok(FenceStatus::Failed(FenceError::DeviceHung)));
        assert_eq!(dev.query(ok), Ok(FenceStatus::Signalled), "work before the culprit completed");
        assert_eq!(
            dev.wait(consumer, T),
            Err(WaitError::Failed(FenceError::Dependency { producer: f2.id, cause: Cause::Hung }))
        );
        assert_eq!(
            dev.submit(QueueId::COMPUTE, &[f2], |cb| cb.timestamp(0x10_0000)),
            Err(SubmitError::DependencyFailed { fence: f2, error: FenceError::DeviceHung })
        );
        // A new context; the queue goes on.
        assert_eq!(dev.context_status(QueueId::GFX), Ok(ContextStatus::Ok));
        assert_eq!(k.k().live_contexts(), 3);
        let f3 = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x10_0010)).unwrap();
        dev.wait(f3, T).unwrap();
        assert_eq!(dev.stats().resets, 1);
        // The state dump in kernel mode: no ring, the kernel's reset in
        // the kept reports, the failed range on the queue.
        let mut json = String::new();
        dev.dump_state(&mut json, umd_core::engine::dump::DumpFormat::Json).unwrap();
        let j: serde_json::Value = serde_json::from_str(&json).expect(&json);
        assert_eq!(j["device"]["mode"], "kernel", "{json}");
        let gfx = &j["queues"][0];
        assert_eq!((gfx["emitted"].as_u64(), gfx["completed"].as_u64()), (Some(4), Some(4)), "{json}");
        assert_eq!(
            (gfx["failed"][0]["after"].as_u64(), gfx["failed"][0]["upto"].as_u64()),
            (Some(1), Some(3))
        );
        assert!(gfx["ring"].is_null() && gfx["held"] == 0 && gfx["context"] == true, "{json}");
        assert_eq!(j["hangs"]["total"], 1, "{json}");
        assert_eq!(j["hangs"]["reports"][0]["reason"], "reset by the kernel driver", "{json}");
        assert!(j["va"]["used"].as_u64().is_some_and(|u| u > 0), "{json}");
    });
}

#[test]
fn a_fault_names_the_fault_and_innocent_contexts_go_on() {
    with_kernel(Generation::Gen2, |dev, k| {
        // FAULT_STATUS: VALID, KIND translation, ACCESS write, opcode 0x10
        // (docs/refgpu.md 2.2).
        let status = (1 << 31) | 1 | (1 << 4) | (0x10 << 8);
        k.k().fail_next[2] = Some(Guilt::Fault { status, addr: 0xDEAD_0000 });
        let f = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x10_0000)).unwrap();
        let info = FaultInfo::from_regs(status, 0xDEAD_0000).unwrap();
        assert_eq!(dev.wait(f, T), Err(WaitError::Failed(FenceError::Fault(info))));
        // Addresses and opcodes print in hex, as every report writes them.
        assert_eq!(
            format!("{info:?}"),
            "FaultInfo { kind: Translation, access: Write, addr: 0xdead0000, opcode: 0x10 }"
        );
        let report = dev.last_hang().expect("a report");
        assert_eq!(report.fault, Some(info));
        // Another context the kernel marks innocent: no failure.
        let g = dev.submit(QueueId::COMPUTE, &[], |cb| cb.timestamp(0x10_0008)).unwrap();
        let ctx = k.k().jobs.last().unwrap().ctx;
        k.k().contexts[ctx as usize].as_mut().unwrap().innocent = true;
        dev.wait(g, T).unwrap();
        assert_eq!(dev.context_status(QueueId::COMPUTE), Ok(ContextStatus::Innocent));
        assert_eq!(dev.stats().resets, 1);
    });
}

#[test]
fn a_submission_racing_a_reset_is_retried_on_the_new_context() {
    with_kernel(Generation::Gen2, |dev, k| {
        k.k().fail_next[0] = Some(Guilt::Hang);
        let f1 = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x10_0000)).unwrap();
        k.k().run(); // the kernel marks the context guilty; the core has not looked yet
        let f2 = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x10_0008)).unwrap();
        assert_eq!(dev.query(f1), Ok(FenceStatus::Failed(FenceError::DeviceHung)));
        dev.wait(f2, T).unwrap();
        assert_eq!(dev.stats().resets, 1);
    });
}

#[test]
fn foreign_syncs_reach_the_kernel() {
    with_kernel(Generation::Gen2, |dev, k| {
        let foreign = [ForeignSync(7)];
        let s = Submit::on(QueueId::COMPUTE).after_foreign(&foreign);
        let f = dev.submit_with(&s, |cb| cb.timestamp(0x10_0000)).unwrap();
        assert_eq!(k.k().jobs[0].waits, vec![KernelWait::Foreign(ForeignSync(7))]);
        assert_eq!(dev.wait(f, 1_000_000), Err(WaitError::Timeout), "the kernel waits for the foreign sync");
        k.k().foreign_signalled.insert(7);
        dev.wait(f, T).unwrap();
        let five = [ForeignSync(1); 5];
        assert_eq!(
            dev.submit_with(&Submit::on(QueueId::COMPUTE).after_foreign(&five), |cb| cb.timestamp(0x10_0000)),
            Err(SubmitError::TooManyWaits { given: 5 })
        );
    });
}

#[test]
fn device_loss_fails_everything_pending() {
    with_kernel(Generation::Gen2, |dev, k| {
        let f = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x10_0000)).unwrap();
        k.k().jobs.clear();
        k.k().lost = true;
        assert_eq!(dev.wait(f, T), Err(WaitError::Failed(FenceError::DeviceLost)));
        assert!(dev.is_lost());
        assert_eq!(dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x10_0000)), Err(SubmitError::DeviceLost));
    });
}

#[test]
fn a_full_dependency_table_waits_then_refuses_in_kernel_mode_too() {
    let k = FakeKernel::new(Generation::Gen2);
    let mut storage: Box<Storage> = Box::default();
    let c = Config { dep_wait_ns: 2_000_000, ..cfg() };
    let dev = KernelDevice::<FakeKernel, 16>::new(&k, &mut storage, c).unwrap();
    let copy = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x10_0000)).unwrap();
    for _ in 0..umd_core::engine::PENDING_WAITS {
        dev.submit(QueueId::GFX, &[copy], |cb| cb.timestamp(0x10_0008)).unwrap();
    }
    let jobs = k.k().jobs.len();
    let err = dev.submit(QueueId::GFX, &[copy], |cb| cb.timestamp(0x10_0008)).unwrap_err();
    assert_eq!(err, SubmitError::TooManyPending(QueueId::GFX));
    super::names_its_parameter(&err, err.limit(), umd_core::storage::Limit::PendingWaits, "PENDING_WAITS");
    assert_eq!(k.k().jobs.len(), jobs, "nothing reached the kernel");
    k.k().run();
    dev.submit(QueueId::GFX, &[copy], |cb| cb.timestamp(0x10_0008)).unwrap();
}

#[test]
fn bad_inputs() {
    with_kernel(Generation::Gen2, |dev, k| {
        assert_eq!(
            dev.submit(QueueId(5), &[], |cb| cb.timestamp(0)),
            Err(SubmitError::UnknownQueue(QueueId(5)))
        );
        assert_eq!(dev.submit(QueueId::GFX, &[], |_| Ok(())), Err(SubmitError::Empty));
        let future = dev.last_emitted(QueueId::GFX).unwrap().later(9);
        assert_eq!(dev.wait(future, 1), Err(WaitError::NotSubmitted(future)));
        assert_eq!(dev.sync_point(future), Err(WaitError::NotSubmitted(future)));
        assert_eq!(dev.context_status(QueueId(7)), Err(SubmitError::UnknownQueue(QueueId(7))));
        let f = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x10_0000)).unwrap();
        assert_eq!(dev.wait(f, 0), Err(WaitError::Timeout));
        assert_eq!(k.k().jobs.len(), 1);
    });
}

/// The fake kernel and storage of one loss race, on the heap and shared
/// with the race's threads as `'static` (freed only when every thread was
/// joined).
struct RaceRig {
    k: FakeKernel,
    storage: Storage,
}

/// One run of the loss race (`crate::race`) on a fresh kernel-mode
/// device whose fake kernel is lost at the call `seed` chose, below
/// `calls`; accepted submissions yield.
fn loss_race(seed: u64, calls: u64) -> race::Figures {
    let rig = Box::into_raw(Box::new(RaceRig {
        k: FakeKernel::new(Generation::Gen2),
        storage: Storage::default(),
    }));
    // SAFETY: `rig` is a fresh, leaked allocation; it is freed below only
    // after every thread that borrows it was joined and the device dropped.
    let RaceRig { k, storage } = unsafe { &mut *rig };
    let dev = KernelDevice::<'static, FakeKernel, 4>::new(&*k, storage, cfg()).expect("device comes up");
    let dev: &'static KernelDevice<'static, FakeKernel, 4> = Box::leak(Box::new(dev));
    let lose_at = 1 + race::Rng::new(seed).below(calls);
    {
        let mut st = k.k();
        st.submit_yields = true;
        st.calls = 0;
        st.lose_at = Some(lose_at);
    }
    let fig = race::run(dev, seed, &format!("kernel call {lose_at}"), 0x10_0000);
    // SAFETY: every thread that borrowed the device or the rig was joined
    // (`race::run` returns only then); the device goes first (it borrows
    // the rig), each is freed once.
    unsafe {
        drop(Box::from_raw(std::ptr::from_ref(dev).cast_mut()));
        drop(Box::from_raw(rig));
    }
    fig
}

/// The loss race of `recovery.rs` in kernel mode: the fake
/// kernel is lost at a call a seed chooses (submissions, timeline and
/// context reads, waits), and an accepted submission yields the thread
/// between the kernel's answer and the publication of its sequence number.
/// The same promises hold: every fence ends signalled or failed
/// `DeviceLost`, every wait returns, a wait's answer never changes, a
/// submission that begins after the loss is refused.
#[test]
fn a_loss_racing_submissions_and_waits_fails_every_fence_and_ends_every_wait_in_kernel_mode() {
    // The range the loss is drawn from: about the calls of one run without
    // a loss (four threads, 40 rounds each).
    race::seeds("kernel-mode loss race", std::time::Duration::from_secs(6), |seed| loss_race(seed, 3_000));
}

// Needs feature `capture` (the workspace's tests turn it on through
// umd-dump's dev-dependency).
#[cfg(feature = "capture")]
#[test]
fn kernel_mode_submissions_are_captured_with_their_waits_and_ib() {
    use umd_core::debug::capture::{Capture, CaptureRing};
    with_kernel(Generation::Gen2, |dev, _| {
        let ring: &'static mut CaptureRing<8192, 8> = Box::leak(Box::default());
        dev.start_capture(Capture::to_ring(ring));
        let a = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x10_0000)).unwrap();
        let b = dev.submit(QueueId::COPY, &[a], |cb| cb.timestamp(0x10_0100)).unwrap();
        dev.wait(b, T).unwrap();
        let mut seen = Vec::new();
        dev.with_capture(|c| {
            c.unwrap().ring.as_deref().unwrap().summaries(&mut |s| {
                seen.push((
                    s.queue,
                    s.seqno,
                    s.waits.get(..usize::from(s.nwaits)).unwrap().to_vec(),
                    s.flags,
                ));
            })
        });
        assert_eq!(seen, [(QueueId::GFX, a.id.seqno, vec![], 0), (QueueId::COPY, b.id.seqno, vec![a.id], 0)]);
        assert_eq!(dev.capture_stats().recorded, 2);
    });
}
