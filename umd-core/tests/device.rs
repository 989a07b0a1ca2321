//! The direct-mode device against a scripted fake refgpu: submission, ring
//! wrap-around, IB pool exhaustion and reclaim, cross-queue waits and
//! out-of-order completion, deadlock rejection, hangs and faults with
//! reset and recovery, and bad input to every call.

mod support;

use support::race;

use support::{EngineFault, Fake, Mode, NonCoherent, Scripted};
use umd_core::config::{Config, PoolExhaustion};
use umd_core::debug::HangReason;
use umd_core::direct::{Device, InitError, MmuMode};
use umd_core::engine::Submit;
use umd_core::error::{FenceStatus, SubmitError, WaitError};
use umd_core::hw::Generation;
use umd_core::storage::DeviceStorage;
use umd_core::sync::{FaultKind, Fence, FenceError, QueueId};

fn small_cfg() -> Config {
    Config { ring_bytes: 4096, ib_chunk_bytes: 4096, use_irq: false, ..Config::DEFAULT }
}

/// The storage of the tests' devices.
type Storage = DeviceStorage<256, 256, 64, 256>;

/// A fake and storage for one device.
struct Rig {
    fake: Fake,
    storage: Box<Storage>,
}

fn rig(gen: Generation) -> Rig {
    Rig { fake: Fake::new(gen, 4 << 20), storage: Box::default() }
}

impl Rig {
    fn device<const C: usize>(&mut self, cfg: Config) -> Device<'_, Fake, C> {
        Device::new(&self.fake, &mut self.storage, cfg, MmuMode::Bypass).expect("device comes up")
    }
}

#[test]
fn copy_fill_write_land_and_fences_signal() {
    for gen in [Generation::Gen1, Generation::Gen2] {
        let mut rig_dev = rig(gen);
        let dev: Device<'_, Fake, 4> = rig_dev.device(small_cfg());
        let src = dev.alloc_buffer(4096).unwrap();
        let dst = dev.alloc_buffer(4096).unwrap();
        let words: Vec<u32> = (0..1024).map(|i| i * 3).collect();
        dev.write_words(src, 0, &words).unwrap();
        let (s, d) = (dev.va(src).unwrap(), dev.va(dst).unwrap());
        let f = dev
            .submit(QueueId::COPY, &[], |cb| {
                cb.copy(s, d, 1024)?;
                cb.fill(d + 1024, 256, 0xA5A5_A5A5)?;
                cb.write_data(d + 2048, &[7, 8, 9])
            })
            .unwrap();
        dev.wait(f, 1_000_000_000).unwrap();
        assert_eq!(dev.query(f), Ok(FenceStatus::Signalled));
        assert_eq!(dev.read_u32(dst, 10), Ok(30));
        assert_eq!(dev.read_u32(dst, 256), Ok(0xA5A5_A5A5));
        assert_eq!(dev.read_u32(dst, 512), Ok(7));
        assert_eq!(dev.read_u32(dst, 514), Ok(9));
        assert_eq!(dev.stats().submissions, 1);
        let report = dev.shutdown();
        assert_eq!((report.leaked_buffers, report.leaked_bytes), (2, 8192), "both buffers were leaked");
        assert_eq!(rig_dev.fake.state().allocs, 0, "teardown gave every block back");
    }
}

#[test]
fn fences_signal_in_order() {
    let mut rig_dev = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 4> = rig_dev.device(small_cfg());
    dev.platform().state().mode = Mode::Manual;
    let fences: Vec<Fence> = (0..5)
        .map(|i| dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8010_0000 + 8 * i)).unwrap())
        .collect();
    for f in &fences {
        assert_eq!(dev.query(*f), Ok(FenceStatus::Pending));
    }
    dev.platform().state().run(0);
    for (i, f) in fences.iter().enumerate() {
        assert_eq!(dev.query(*f), Ok(FenceStatus::Signalled), "fence {i}");
        assert_eq!(f.seqno().0, i as u64 + 1);
    }
}

#[test]
fn ring_wraps_at_every_offset() {
    // A 4 KiB ring and 36-byte submissions (IB + FENCE): 9 and 1024 dwords
    // are coprime, so over 1024+ submissions the write pointer takes every
    // dword offset, and each wrap pads the tail with NOPs.
    for gen in [Generation::Gen1, Generation::Gen2] {
        let mut rig_dev = rig(gen);
        let dev: Device<'_, Fake, 4> = rig_dev.device(Config { batching: true, ..small_cfg() });
        let mut seen = std::collections::HashSet::new();
        let mut last = None;
        for i in 0..1200u64 {
            let f = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0000 + 8 * (i % 64))).unwrap();
            seen.insert(dev.platform().state().engines[2].wptr);
            if i % 7 == 0 {
                dev.wait(f, 1_000_000_000).unwrap();
            }
            last = Some(f);
        }
        dev.wait(last.unwrap(), 1_000_000_000).unwrap();
        assert!(dev.stats().ring_wraps >= 10, "{gen}: wrapped {} times", dev.stats().ring_wraps);
        assert!(seen.len() > 100, "{gen}: {} distinct write pointers", seen.len());
        assert_eq!(dev.stats().fences_signalled, 1200, "{gen}: every fence seen");
    }
}

#[test]
fn a_full_ring_behind_a_hung_engine_is_reset_and_the_queue_goes_on() {
    let mut rig_dev = rig(Generation::Gen1);
    let dev: Device<'_, Fake, 16> = rig_dev.device(Config { batching: true, ..small_cfg() });
    dev.platform().state().mode = Mode::Manual;
    dev.platform().state().engines[0].fault = EngineFault::Stuck;
    let first = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    // A 4 KiB ring holds ~110 submissions: the 200th finds it full, the
    // wait for room runs the hang check, and the reset empties the ring.
    for i in 1..200u64 {
        dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000 + 8 * (i % 64))).unwrap();
    }
    assert_eq!(dev.stats().resets, 1);
    assert_eq!(dev.query(first), Ok(FenceStatus::Failed(FenceError::DeviceHung)));
    dev.platform().state().engines[0].fault = EngineFault::None;
    dev.platform().state().run(0);
    let f = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    dev.platform().state().run(0);
    dev.wait(f, 1_000_000_000).unwrap();
}

#[test]
fn a_full_ring_behind_a_wait_before_signal_is_an_error_not_a_hang() {
    let mut rig_dev = rig(Generation::Gen1);
    let dev: Device<'_, Fake, 16> = rig_dev.device(Config { batching: true, ..small_cfg() });
    dev.platform().state().mode = Mode::OnDoorbell;
    // GFX waits for COPY's next fence, which nobody submits yet.
    let future = dev.next_fence(QueueId::COPY).unwrap();
    dev.submit(QueueId::GFX, &[future], |cb| cb.timestamp(0x8030_0000)).unwrap();
    let mut err = None;
    for i in 0..200u64 {
        if let Err(e) = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000 + 8 * (i % 64))) {
            err = Some(e);
            break;
        }
    }
    assert!(matches!(err, Some(SubmitError::RingFull(_))), "{err:?}");
    assert_eq!(dev.stats().resets, 0, "a blocked queue is not hung");
    // The failed submission left nothing behind: once the producer comes,
    // the queue drains and takes work again.
    let p = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0100)).unwrap();
    assert_eq!(p, future);
    dev.platform().state().run_all();
    let f = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    dev.wait(f, 1_000_000_000).unwrap();
}

#[test]
fn pool_exhaustion_errors_or_waits_by_policy() {
    // Two chunks, no batching: the third submission needs a chunk back.
    let cfg = Config { batching: false, pool_exhaustion: PoolExhaustion::Error, ..small_cfg() };
    let mut rig_dev = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 2> = rig_dev.device(cfg);
    dev.platform().state().mode = Mode::Manual;
    let a = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    let _b = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0008)).unwrap();
    assert_eq!(dev.pool_stats().in_flight, 2);
    assert_eq!(dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0010)), Err(SubmitError::PoolEmpty));
    // Reclaim after the fences signal.
    dev.platform().state().run(0);
    dev.wait(a, 1_000_000_000).unwrap();
    assert_eq!(dev.pool_stats().free, 2);
    dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0010)).unwrap();

    // WaitOldest: the recording waits for the oldest fence (the fake runs
    // its engines while the driver sleeps).
    let cfg = Config { batching: false, pool_exhaustion: PoolExhaustion::WaitOldest, ..small_cfg() };
    let mut rig_dev = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 2> = rig_dev.device(cfg);
    dev.platform().state().mode = Mode::OnDelay;
    for i in 0..10u64 {
        dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0000 + 8 * i)).unwrap();
    }
    assert!(dev.stats().pool_waits > 0);
}

#[test]
fn batching_puts_small_submissions_in_one_chunk() {
    let mut rig_on = rig(Generation::Gen2);
    let on: Device<'_, Fake, 4> = rig_on.device(Config { batching: true, ..small_cfg() });
    on.platform().state().mode = Mode::Manual;
    for i in 0..10u64 {
        on.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000 + 8 * i)).unwrap();
    }
    let s = on.pool_stats();
    assert_eq!(s.open + s.in_flight, 1, "one chunk holds all ten: {s:?}");
    let mut rig_off = rig(Generation::Gen2);
    let off: Device<'_, Fake, 4> = rig_off.device(Config { batching: false, ..small_cfg() });
    off.platform().state().mode = Mode::OnDoorbell;
    for i in 0..3u64 {
        let f = off.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000 + 8 * i)).unwrap();
        off.wait(f, 1_000_000_000).unwrap();
    }
}

/// With batching, a submission continues the queue's open chunk only when
/// at least 64 dwords of it are left (IB starts aligned to 16 dwords), also
/// when the previous submission's commit is still waiting in the queue's
/// mailbox: a nearly full chunk goes in flight and a fresh one is taken,
/// even for a packet that would fit what is left.
#[test]
fn batching_leaves_a_nearly_full_chunk() {
    let mut rig_dev = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 4> = rig_dev.device(Config { batching: true, ..small_cfg() });
    dev.platform().state().mode = Mode::Manual;
    // WRITE_DATA of 100 dwords: 103 with its header and address, 112 once
    // aligned; nine of them use 1,008 of the chunk's 1,024 dwords.
    let data = [7u32; 100];
    for _ in 0..9 {
        dev.submit(QueueId::GFX, &[], |cb| cb.write_data(0x8030_0000, &data)).unwrap();
    }
    // 16 dwords left: a 4-dword packet would fit, but the chunk is done
    // (the ninth commit is still in the mailbox: reading the pool's stats
    // here would apply it first).
    dev.submit(QueueId::GFX, &[], |cb| cb.write_data(0x8030_0000, &[1])).unwrap();
    // Nothing completed: two chunks in all, the first nine submissions'
    // (in flight) and the tenth's (open).
    let s = dev.pool_stats();
    assert_eq!((s.open, s.in_flight), (1, 1), "a fresh chunk: {s:?}");
}

#[test]
fn cross_queue_waits_and_out_of_order_completion() {
    let mut rig_dev = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 8> = rig_dev.device(small_cfg());
    dev.platform().state().mode = Mode::Manual;
    let buf = dev.alloc_buffer(4096).unwrap();
    let b = dev.va(buf).unwrap();
    let copy = dev.submit(QueueId::COPY, &[], |cb| cb.write_data(b, &[41])).unwrap();
    let compute = dev.submit(QueueId::COMPUTE, &[copy], |cb| cb.write_data(b + 4, &[42])).unwrap();
    let gfx = dev.submit(QueueId::GFX, &[], |cb| cb.write_data(b + 8, &[43])).unwrap();
    // GFX finishes first; COMPUTE is blocked on COPY.
    dev.platform().state().run(0);
    dev.platform().state().run(1);
    assert_eq!(dev.query(gfx), Ok(FenceStatus::Signalled));
    assert_eq!(dev.query(compute), Ok(FenceStatus::Pending));
    assert_eq!(dev.read_u32(buf, 1), Ok(0), "compute waited on the copy fence");
    dev.platform().state().run(2);
    dev.platform().state().run(1);
    assert_eq!(dev.query(copy), Ok(FenceStatus::Signalled));
    assert_eq!(dev.query(compute), Ok(FenceStatus::Signalled));
    assert_eq!(dev.read_u32(buf, 1), Ok(42));
}

#[test]
fn wait_cycles_are_rejected_before_the_gpu_sees_them() {
    let mut rig_dev = rig(Generation::Gen1);
    let dev: Device<'_, Fake, 8> = rig_dev.device(small_cfg());
    dev.platform().state().mode = Mode::Manual;
    // COMPUTE waits for COPY's *next* fence (wait before signal) ...
    let copy_next = dev.next_fence(QueueId::COPY).unwrap();
    let compute = dev.submit(QueueId::COMPUTE, &[copy_next], |cb| cb.timestamp(0x8030_0000)).unwrap();
    // ... so COPY's next submission may not wait for that COMPUTE work.
    let before = dev.platform().state().doorbells;
    let err = dev.submit(QueueId::COPY, &[compute], |cb| cb.timestamp(0x8030_0008)).unwrap_err();
    let SubmitError::Cycle(c) = err else { panic!("{err:?}") };
    assert_eq!(c.fences().len(), 2, "{c}");
    assert_eq!(c.fences()[0].queue, QueueId::COPY);
    assert_eq!(c.fences()[1].queue, QueueId::COMPUTE);
    assert!(c.to_string().contains("q2:1 waits for q1:1"), "{c}");
    assert_eq!(dev.platform().state().doorbells, before, "nothing reached the GPU");
    // A three-queue cycle: GFX waits COMPUTE's future, COMPUTE (above) waits COPY's future.
    let compute_next = dev.next_fence(QueueId::COMPUTE).unwrap();
    let gfx = dev.submit(QueueId::GFX, &[compute_next], |cb| cb.timestamp(0x8030_0010)).unwrap();
    let compute2 = dev.submit(QueueId::COMPUTE, &[], |cb| cb.timestamp(0x8030_0018)).unwrap();
    assert_eq!(compute2.seqno().0, 2);
    let err = dev.submit(QueueId::COPY, &[gfx], |cb| cb.timestamp(0x8030_0020)).unwrap_err();
    let SubmitError::Cycle(c) = err else { panic!("{err:?}") };
    assert_eq!(c.fences().len(), 3, "{c}");
    // Without the cycle the same submission is fine, and everything runs.
    dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0020)).unwrap();
    dev.platform().state().run_all();
    dev.wait(gfx, 1_000_000_000).unwrap();
}

// Needs feature `hang-capture` (reads the captured ring and IB windows).
#[cfg(feature = "hang-capture")]
#[test]
fn hang_is_detected_dumped_reset_and_the_queue_recovers() {
    for gen in [Generation::Gen1, Generation::Gen2] {
        let mut rig_dev = rig(gen);
        let dev: Device<'_, Fake, 4> = rig_dev.device(small_cfg());
        dev.platform().state().engines[0].fault = EngineFault::Stuck;
        let buf = dev.alloc_buffer(4096).unwrap();
        let b = dev.va(buf).unwrap();
        let f1 = dev.submit(QueueId::GFX, &[], |cb| cb.write_data(b, &[1])).unwrap();
        let f2 = dev.submit(QueueId::GFX, &[], |cb| cb.write_data(b + 4, &[2])).unwrap();
        // A COMPUTE submission waiting on the hung queue is released by the
        // reset, and fails with it: it ran on input that never arrived.
        let c = dev.submit(QueueId::COMPUTE, &[f2], |cb| cb.write_data(b + 8, &[3])).unwrap();
        let err = dev.wait(f1, 10_000_000_000).unwrap_err();
        assert_eq!(err, WaitError::Failed(FenceError::DeviceHung));
        assert_eq!(dev.query(f2), Ok(FenceStatus::Failed(FenceError::DeviceHung)));
        let report = dev.last_hang().expect("a hang report");
        assert_eq!(report.queue, QueueId::GFX);
        assert!(matches!(report.reason, HangReason::NoProgress { .. }));
        assert_eq!((report.emitted.0, report.completed.0), (2, 0));
        let text = report.to_string();
        assert!(text.contains("INDIRECT_BUFFER") && text.contains("FENCE"), "{text}");
        assert!(text.contains("no progress"), "{text}");
        assert_eq!(dev.stats().resets, 1);
        // The engine is usable again; the waiting COMPUTE work ran but
        // reports the producer's failure.
        dev.platform().state().run_all();
        assert_eq!(
            dev.wait(c, 1_000_000_000),
            Err(WaitError::Failed(FenceError::Dependency {
                producer: f2.id,
                cause: umd_core::sync::Cause::Hung
            }))
        );
        assert_eq!(dev.stats().propagated_failures, 1);
        let f3 = dev.submit(QueueId::GFX, &[], |cb| cb.write_data(b + 12, &[4])).unwrap();
        dev.wait(f3, 1_000_000_000).unwrap();
        assert_eq!(dev.read_u32(buf, 3), Ok(4));
        // A fence cancelled by the reset can not be waited on by new work.
        assert_eq!(
            dev.submit(QueueId::COPY, &[f1], |cb| cb.timestamp(0x8030_0000)),
            Err(SubmitError::DependencyFailed { fence: f1, error: FenceError::DeviceHung })
        );
    }
}

#[test]
fn an_engine_still_stalled_after_its_reset_does_not_take_its_waiters_down() {
    for gen in [Generation::Gen1, Generation::Gen2] {
        still_stalled_after_reset(Fake::new(gen, 4 << 20));
        // On a non-coherent system the CPU's write to the reset queue's
        // fence slot reaches the other engines only if it is cleaned from
        // the CPU's cache.
        still_stalled_after_reset(NonCoherent::new(gen, 4 << 20));
    }
}

fn still_stalled_after_reset<P: Scripted>(fake: P) {
    let mut storage: Box<Storage> = Box::default();
    let dev: Device<'_, P, 4> =
        Device::new(&fake, &mut storage, small_cfg(), MmuMode::Bypass).expect("device comes up");
    dev.platform().state().mode = Mode::OnDelay;
    // GFX stops fetching for good: its reset completes, but the engine
    // never runs another packet (not even one that would write its fence
    // slot).
    dev.platform().state().stalled[0] = true;
    let buf = dev.alloc_buffer(4096).unwrap();
    let b = dev.va(buf).unwrap();
    let f1 = dev.submit(QueueId::GFX, &[], |cb| cb.write_data(b, &[1])).unwrap();
    // COMPUTE waits for it on the GPU, then runs independent work.
    let c1 = dev.submit(QueueId::COMPUTE, &[f1], |cb| cb.write_data(b + 4, &[2])).unwrap();
    let c2 = dev.submit(QueueId::COMPUTE, &[], |cb| cb.write_data(b + 8, &[3])).unwrap();
    assert_eq!(dev.wait(f1, 10_000_000_000), Err(WaitError::Failed(FenceError::DeviceHung)));
    let dependency = FenceError::Dependency { producer: f1.id, cause: umd_core::sync::Cause::Hung };
    assert_eq!(dev.query(c1), Ok(FenceStatus::Failed(dependency)));
    // The engines see GFX's slot at f1's value, written by the CPU.
    let slot = dev.fence_slot_va(QueueId::GFX).unwrap();
    assert_eq!(dev.platform().state().fence_slot(slot), f1.id.seqno.0);
    // The reset released COMPUTE's wait although GFX never ran again: its
    // own work signals, COMPUTE is not judged hung.
    dev.wait(c2, 10_000_000_000).unwrap();
    assert_eq!(dev.read_u32(buf, 2), Ok(3));
    assert_eq!(dev.stats().resets, 1, "only the stalled queue was reset");
    // A failed fence keeps the reason it was first answered with.
    assert_eq!(dev.wait(c1, 1_000_000_000), Err(WaitError::Failed(dependency)));
    assert_eq!(dev.query(c1), Ok(FenceStatus::Failed(dependency)));
}

#[test]
fn wait_passed_waits_for_failed_work_that_still_runs() {
    for gen in [Generation::Gen1, Generation::Gen2] {
        let mut rig_dev = rig(gen);
        let dev: Device<'_, Fake, 4> = rig_dev.device(small_cfg());
        // Engines run only when told: COMPUTE's work stays queued.
        dev.platform().state().mode = Mode::Manual;
        dev.platform().state().engines[0].fault = EngineFault::Stuck;
        let buf = dev.alloc_buffer(4096).unwrap();
        let b = dev.va(buf).unwrap();
        let f1 = dev.submit(QueueId::GFX, &[], |cb| cb.write_data(b, &[1])).unwrap();
        let c = dev.submit(QueueId::COMPUTE, &[f1], |cb| cb.write_data(b + 4, &[2])).unwrap();
        assert_eq!(dev.wait(f1, 10_000_000_000), Err(WaitError::Failed(FenceError::DeviceHung)));
        // The hung queue's reset passed its cancelled fence.
        assert_eq!(dev.wait_passed(f1, 0), Ok(()));
        // c failed through its producer and answers at once, but its work
        // has not run: its queue has not passed it.
        let dependency = FenceError::Dependency { producer: f1.id, cause: umd_core::sync::Cause::Hung };
        assert_eq!(dev.wait(c, 0), Err(WaitError::Failed(dependency)));
        let delays = dev.platform().state().delays;
        assert_eq!(dev.wait_passed(c, 0), Err(WaitError::Timeout));
        assert_eq!(dev.platform().state().delays, delays, "a timeout of 0 does not sleep");
        assert_eq!(dev.platform().state().read_u32(b + 4), Some(0));
        // Waiting lets time pass (the engines run when the driver sleeps)
        // until the work ran and COMPUTE passed it.
        dev.platform().state().mode = Mode::OnDelay;
        assert_eq!(dev.wait_passed(c, 1_000_000_000), Ok(()));
        assert!(dev.platform().state().delays > delays);
        assert_eq!(dev.platform().state().read_u32(b + 4), Some(2), "the work ran");
        assert_eq!(dev.wait(c, 0), Err(WaitError::Failed(dependency)), "still failed");
        assert_eq!((dev.stats().hangs, dev.stats().resets), (1, 1));
    }
}

#[test]
fn wait_passed_times_out_checks_the_fence_and_reports_loss() {
    let mut rig_dev = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 4> = rig_dev.device(small_cfg());
    dev.platform().state().mode = Mode::Manual;
    let f = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    // Pending work: a timeout, as `wait` gives.
    assert_eq!(dev.wait_passed(f, 2_000_000), Err(WaitError::Timeout));
    assert_eq!(dev.stats().hangs, 0);
    dev.platform().state().run(0);
    assert_eq!(dev.wait_passed(f, 2_000_000), Ok(()));
    // The fence itself is checked as by `wait`.
    let next = dev.next_fence(QueueId::GFX).unwrap();
    assert_eq!(dev.wait_passed(next, 0), Err(WaitError::NotSubmitted(next)));
    let mut other = f;
    other.id.queue = umd_core::sync::QueueId(3);
    assert_eq!(dev.wait_passed(other, 0), Err(WaitError::UnknownQueue(other.id.queue)));
    // Device loss: the timeline is forced past everything, but nothing
    // passed on the GPU; every answer is the loss, also for a fence that
    // had passed before.
    let g = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0008)).unwrap();
    dev.platform().state().lost = true;
    assert_eq!(dev.wait_passed(g, 1_000_000_000), Err(WaitError::Failed(FenceError::DeviceLost)));
    assert!(dev.is_lost());
    assert_eq!(dev.wait_passed(f, 0), Err(WaitError::Failed(FenceError::DeviceLost)));
}

#[test]
fn a_poisoned_fence_keeps_its_reason_when_its_own_queue_is_reset() {
    let mut rig_dev = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 4> = rig_dev.device(small_cfg());
    dev.platform().state().mode = Mode::OnDelay;
    dev.platform().state().engines[0].fault = EngineFault::Stuck;
    dev.platform().state().engines[1].fault = EngineFault::Stuck;
    let f1 = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    let c1 = dev.submit(QueueId::COMPUTE, &[f1], |cb| cb.timestamp(0x8030_0008)).unwrap();
    assert_eq!(dev.wait(f1, 10_000_000_000), Err(WaitError::Failed(FenceError::DeviceHung)));
    let dependency = FenceError::Dependency { producer: f1.id, cause: umd_core::sync::Cause::Hung };
    assert_eq!(dev.query(c1), Ok(FenceStatus::Failed(dependency)));
    // COMPUTE hangs too: its reset cancels c1 again, which keeps the reason
    // it was first answered with.
    let c2 = dev.submit(QueueId::COMPUTE, &[], |cb| cb.timestamp(0x8030_0010)).unwrap();
    assert_eq!(dev.wait(c2, 10_000_000_000), Err(WaitError::Failed(FenceError::DeviceHung)));
    assert_eq!(dev.stats().resets, 2);
    assert_eq!(dev.query(c1), Ok(FenceStatus::Failed(dependency)));
}

#[test]
fn an_engine_that_faults_while_idle_is_reset_without_blaming_the_next_job() {
    for gen in [Generation::Gen1, Generation::Gen2] {
        let mut rig_dev = rig(gen);
        let dev: Device<'_, Fake, 4> = rig_dev.device(small_cfg());
        let f0 = dev.submit(QueueId::COMPUTE, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
        dev.wait(f0, 1_000_000_000).unwrap();
        // COMPUTE is idle when its engine halts with a fault (no job of
        // ours caused it). The service pass sees the fault interrupt.
        dev.platform().state().inject_fault(1, 1, 0, 0x1_0000_0000);
        let report = dev.service().expect("the idle fault is reported");
        assert_eq!(dev.last_hang(), Some(report), "the report returned is the one kept");
        assert_eq!(dev.service(), None, "a pass that fails nothing reports nothing");
        assert_eq!(report.queue, QueueId::COMPUTE);
        assert!(matches!(report.reason, HangReason::Fault(_)), "{report}");
        assert_eq!(report.emitted, report.completed, "no fence was pending");
        assert_eq!((dev.stats().faults, dev.stats().resets), (1, 1));
        assert_eq!(dev.query(f0), Ok(FenceStatus::Signalled), "finished work stays signalled");
        // The next job runs.
        let f1 = dev.submit(QueueId::COMPUTE, &[], |cb| cb.timestamp(0x8030_0008)).unwrap();
        dev.wait(f1, 1_000_000_000).unwrap();
        assert_eq!(dev.stats().resets, 1);
    }
}

#[test]
fn a_loop_that_moves_but_never_signals_is_a_hang() {
    let mut rig_dev = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 4> = rig_dev.device(small_cfg());
    dev.platform().state().engines[1].fault = EngineFault::Spinning;
    dev.platform().state().mode = Mode::OnDelay;
    let f = dev.submit(QueueId::COMPUTE, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    assert_eq!(dev.wait(f, 60_000_000_000), Err(WaitError::Failed(FenceError::DeviceHung)));
    assert!(matches!(dev.last_hang().unwrap().reason, HangReason::FenceStalled { .. }));
}

#[test]
fn faults_are_reported_with_address_engine_and_access() {
    let mut rig_dev = rig(Generation::Gen1);
    let dev: Device<'_, Fake, 4> = rig_dev.device(small_cfg());
    dev.platform().state().mode = Mode::Manual;
    let f = dev.submit(QueueId::COPY, &[], |cb| cb.copy(0x1_0000_0000, 0x8030_0000, 64)).unwrap();
    dev.platform().state().inject_fault(2, 1, 0, 0x1_0000_0000);
    let err = dev.wait(f, 1_000_000_000).unwrap_err();
    let WaitError::Failed(FenceError::Fault(info)) = err else { panic!("{err:?}") };
    assert_eq!(info.kind, FaultKind::Translation);
    assert_eq!(info.addr, 0x1_0000_0000);
    assert_eq!(info.access, umd_core::sync::Access::Read);
    let report = dev.last_hang().unwrap();
    assert_eq!(report.queue, QueueId::COPY);
    assert!(report.to_string().contains("Translation fault on Read at 0x100000000"), "{report}");
    assert_eq!(dev.stats().faults, 1);
    // Recovered.
    dev.platform().state().mode = Mode::OnDoorbell;
    let g = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    dev.wait(g, 1_000_000_000).unwrap();
}

#[test]
fn timeouts() {
    let mut rig_dev = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 4> = rig_dev.device(small_cfg());
    dev.platform().state().mode = Mode::Manual;
    let f = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    let delays = dev.platform().state().delays;
    // Timeout 0 is a query: no sleeping, no spinning beyond one check.
    assert_eq!(dev.wait(f, 0), Err(WaitError::Timeout));
    assert_eq!(dev.platform().state().delays, delays);
    // A short timeout well inside the hang window.
    assert_eq!(dev.wait(f, 2_000_000), Err(WaitError::Timeout));
    assert!(dev.platform().state().delays > delays);
    assert_eq!(dev.stats().hangs, 0);
    dev.platform().state().run(0);
    dev.wait(f, 2_000_000).unwrap();
}

#[test]
fn wait_schedule_follows_the_config() {
    // With the default steps the driver spins first, then sleeps 1 us, 10
    // us and 100 us. Check the sleeps the fake saw over a 5 ms wait.
    let mut rig_dev = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 4> = rig_dev.device(small_cfg());
    dev.platform().state().mode = Mode::Manual;
    let f = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    let (d0, n0) = {
        let st = dev.platform().state();
        (st.delayed_ns, st.delays)
    };
    let _ = dev.wait(f, 5_000_000);
    let (slept, count) = {
        let st = dev.platform().state();
        (st.delayed_ns - d0, st.delays - n0)
    };
    // ~98 x 1 us + 90 x 10 us + 40 x 100 us: far fewer wake-ups than 1 us polling.
    assert!(count < 400, "{count} wake-ups");
    assert!(slept >= 4_000_000, "{slept} ns slept");
}

#[test]
fn bad_inputs_get_typed_errors() {
    let mut rig_dev = rig(Generation::Gen1);
    let dev: Device<'_, Fake, 4> = rig_dev.device(small_cfg());
    dev.platform().state().mode = Mode::Manual;
    // Unknown queue.
    assert_eq!(
        dev.submit(QueueId(3), &[], |cb| cb.timestamp(0x8030_0000)),
        Err(SubmitError::UnknownQueue(QueueId(3)))
    );
    // Zero-length submission.
    assert_eq!(dev.submit(QueueId::GFX, &[], |_| Ok(())), Err(SubmitError::Empty));
    // A recording error names the command.
    let e = dev.submit(QueueId::GFX, &[], |cb| cb.fence(0x8030_0004, 1, false)).unwrap_err();
    assert!(matches!(e, SubmitError::Encode(_)), "{e:?}");
    // An IB larger than the generation allows (gen1: 262144 dwords).
    assert_eq!(
        dev.submit_ib(&Submit::on(QueueId::GFX), 0x8030_0000, 262_145),
        Err(SubmitError::IbTooLarge { dwords: 262_145, max: 262_144 })
    );
    assert_eq!(dev.submit_ib(&Submit::on(QueueId::GFX), 0x8030_0000, 0), Err(SubmitError::Empty));
    // Waiting on a fence from the future.
    let future = dev.last_emitted(QueueId::GFX).unwrap().later(7);
    assert_eq!(dev.wait(future, 1_000), Err(WaitError::NotSubmitted(future)));
    let unknown = Fence { id: umd_core::sync::FenceId::new(QueueId(9), 1), ..future };
    assert_eq!(dev.wait(unknown, 1), Err(WaitError::UnknownQueue(QueueId(9))));
    // A queue waiting on its own future.
    assert_eq!(
        dev.submit(QueueId::GFX, &[future], |cb| cb.timestamp(0x8030_0000)),
        Err(SubmitError::WaitsOnItself(future))
    );
    // Too many waits.
    let f = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    assert_eq!(
        dev.submit(QueueId::GFX, &[f; 5], |cb| cb.timestamp(0x8030_0000)),
        Err(SubmitError::TooManyWaits { given: 5 })
    );
    // None of that consumed a sequence number or touched the GFX ring.
    assert_eq!(dev.last_emitted(QueueId::GFX).unwrap().seqno().0, 0);
    assert_eq!(dev.platform().state().engines[0].wptr, 0);
}

#[test]
fn init_rejects_bad_config_and_frees_what_it_allocated() {
    let mut storage: Box<Storage> = Box::default();
    let bad = Config { ring_bytes: 3000, ..Config::DEFAULT };
    let fake = Fake::new(Generation::Gen1, 1 << 20);
    let e = Device::<Fake, 4>::new(&fake, &mut storage, bad, MmuMode::Bypass).err().unwrap();
    assert!(matches!(e, InitError::BadConfig(_)));
    assert_eq!(fake.state().allocs, 0);
    let fake = Fake::new(Generation::Gen1, 1 << 20);
    fake.state().regs[0] = 0x1234_0100;
    let e = Device::<Fake, 4>::new(&fake, &mut storage, Config::DEFAULT, MmuMode::Bypass).err().unwrap();
    assert!(matches!(e, InitError::Probe(_)));
    // Out of memory half-way: everything allocated so far is freed.
    let fake = Fake::new(Generation::Gen1, 256 << 10);
    let e = Device::<Fake, 64>::new(&fake, &mut storage, Config::DEFAULT, MmuMode::Bypass).err().unwrap();
    assert!(matches!(e, InitError::Platform(_)));
    assert_eq!(fake.state().allocs, 0);
    // With the MMU: no GPU address for a block (a VA arena too small), or
    // no page table to map it (too few table pages): the block is freed.
    if umd_core::direct::MMU {
        for (va_size, table_pages) in [(16 << 10, 16), (1 << 30, 1)] {
            let fake = Fake::new(Generation::Gen2, 1 << 20);
            let mmu = MmuMode::Enabled { va_base: 1 << 32, va_size, table_pages };
            let e = Device::<Fake, 4>::new(&fake, &mut storage, small_cfg(), mmu).err().unwrap();
            assert!(matches!(e, InitError::Va(_) | InitError::Map), "{e:?}");
            assert_eq!(fake.state().allocs, 0, "{e:?}");
        }
    }
    // A chip with no engines, and one with more than the build drives.
    let fake = Fake::new(Generation::Gen2, 1 << 20);
    fake.state().regs[(umd_core::hw::regs::ENGINE_COUNT / 4) as usize] = 0;
    let e = Device::<Fake, 4>::new(&fake, &mut storage, small_cfg(), MmuMode::Bypass).err().unwrap();
    assert!(matches!(e, InitError::BadConfig(_)));
    let fake = Fake::new(Generation::Gen2, 1 << 20);
    fake.state().regs[(umd_core::hw::regs::ENGINE_COUNT / 4) as usize] = 2;
    let dev = Device::<Fake, 4>::new(&fake, &mut storage, small_cfg(), MmuMode::Bypass).unwrap();
    assert_eq!(dev.queue_count(), 2, "the queue count comes from the chip");
    assert_eq!(
        dev.submit(QueueId::COPY, &[], |cb| cb.barrier()),
        Err(SubmitError::UnknownQueue(QueueId::COPY))
    );
    drop(dev);
    assert_eq!(fake.state().allocs, 0);
}

#[test]
fn device_loss_fails_pending_fences() {
    let mut rig_dev = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 4> = rig_dev.device(small_cfg());
    dev.platform().state().mode = Mode::Manual;
    let f = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    dev.platform().state().lost = true;
    assert_eq!(dev.wait(f, 1_000_000_000), Err(WaitError::Failed(FenceError::DeviceLost)));
    assert!(dev.is_lost());
    assert_eq!(dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)), Err(SubmitError::DeviceLost));
}

/// The ring's free space comes from the read pointer last read: RING_RPTR
/// is read again only when that space is not enough for a submission, about
/// once per lap of the ring, not once per submission.
#[test]
fn the_read_pointer_is_read_only_when_the_ring_looks_full() {
    let mut rig_dev = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 4> = rig_dev.device(small_cfg());
    let buf = dev.alloc_buffer(4096).unwrap();
    let va = dev.va(buf).unwrap();
    let before = dev.platform().state().rptr_reads;
    let mut last = None;
    for i in 0..300u32 {
        last = Some(
            dev.submit(QueueId::GFX, &[], |cb| cb.write_data(va + 4 * u64::from(i % 64), &[i])).unwrap(),
        );
    }
    let reads = dev.platform().state().rptr_reads - before;
    let wraps = dev.stats().ring_wraps;
    assert!(wraps >= 2, "300 submissions lap a 4 KiB ring: {wraps} wraps");
    assert!(reads >= wraps, "each lap needs the engine's progress: {reads} reads, {wraps} wraps");
    assert!(reads <= wraps + 2, "read once per lap, not per submission: {reads} reads, {wraps} wraps");
    dev.wait(last.unwrap(), 1_000_000_000).unwrap();
    assert_eq!(dev.read_u32(buf, 299 % 64), Ok(299));
}

/// A loss that a submission is the first to meet: with the cached free
/// space enough it is seen when the write pointer is published (no
/// RING_RPTR read), with the ring looking full at the read pointer's
/// refresh. Either way the submission is refused `DeviceLost`, nothing is
/// published to the engine, and the pending work fails `DeviceLost`.
#[test]
fn a_loss_met_by_a_submission_refuses_it_and_fails_pending_work() {
    for refresh in [false, true] {
        let mut rig_dev = rig(Generation::Gen2);
        let dev: Device<'_, Fake, 4> = rig_dev.device(small_cfg());
        dev.platform().state().mode = Mode::Manual;
        let job = |dev: &Device<'_, Fake, 4>| dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000));
        // Work in flight on another queue, whose engine never runs.
        let pending = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0008)).unwrap();
        job(&dev).unwrap();
        let step = dev.platform().state().engines[0].wptr;
        if refresh {
            // Fill the ring up to less than two submissions of cached free
            // space, then one more: the next one no longer fits it.
            while 4092 - dev.platform().state().engines[0].wptr >= 2 * step {
                job(&dev).unwrap();
            }
            job(&dev).unwrap();
            dev.platform().state().run(0);
        }
        let (reads, wptr) = {
            let mut st = dev.platform().state();
            st.lost = true;
            (st.rptr_reads, st.engines[0].wptr)
        };
        assert_eq!(job(&dev), Err(SubmitError::DeviceLost), "refresh {refresh}");
        let st = dev.platform().state();
        assert_eq!(st.rptr_reads - reads, u64::from(refresh), "RING_RPTR read only to refresh");
        assert_eq!(st.engines[0].wptr, wptr, "nothing published");
        drop(st);
        assert!(dev.is_lost());
        assert_eq!(dev.wait(pending, 1_000_000_000), Err(WaitError::Failed(FenceError::DeviceLost)));
        assert_eq!(job(&dev), Err(SubmitError::DeviceLost));
    }
}

/// A fence the device wrote before the loss answers signalled, even when
/// no thread had read it before the loss was met: the loss's pass reads
/// every queue's completion before it fails the rest. (Otherwise a thread
/// reading the fence while that pass runs could answer signalled and a
/// later query failed.)
#[test]
fn a_fence_written_before_the_loss_stays_signalled() {
    let mut rig_dev = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 4> = rig_dev.device(small_cfg());
    dev.platform().state().mode = Mode::Manual;
    let done = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    let pending = dev.submit(QueueId::COMPUTE, &[], |cb| cb.timestamp(0x8030_0008)).unwrap();
    {
        let mut st = dev.platform().state();
        st.run(0);
        st.lost = true;
    }
    // The submission meets the loss (its write pointer); nobody read GFX's
    // fence slot since its engine ran.
    assert_eq!(dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0010)), Err(SubmitError::DeviceLost));
    assert_eq!(dev.query(done), Ok(FenceStatus::Signalled));
    assert_eq!(dev.wait(done, u64::MAX), Ok(()));
    assert_eq!(dev.wait(pending, u64::MAX), Err(WaitError::Failed(FenceError::DeviceLost)));
}

/// A read pointer the engine cannot have reported (all ones, as from a
/// device that fell off the bus; one past the write pointer) is not
/// trusted with the free space: the submission that read it is refused
/// `DeviceLost`, nothing is published and the device is lost.
#[test]
fn an_implausible_read_pointer_is_a_lost_device() {
    // All ones; not dword-aligned; ahead of the write pointer.
    let cases: [fn(u32) -> u32; 3] = [|_| u32::MAX, |_| 2, |wptr| wptr + 4];
    for bad in cases {
        let mut rig_dev = rig(Generation::Gen2);
        let dev: Device<'_, Fake, 4> = rig_dev.device(small_cfg());
        dev.platform().state().mode = Mode::Manual;
        let job = |dev: &Device<'_, Fake, 4>| dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000));
        job(&dev).unwrap();
        let step = dev.platform().state().engines[0].wptr;
        // Fill the ring until the cached free space no longer fits one
        // more: the next submission reads RING_RPTR.
        while 4092 - dev.platform().state().engines[0].wptr >= 2 * step {
            job(&dev).unwrap();
        }
        job(&dev).unwrap();
        let (wptr, bad) = {
            let mut st = dev.platform().state();
            let wptr = st.engines[0].wptr;
            st.engines[0].rptr = bad(wptr);
            (wptr, bad(wptr))
        };
        assert_eq!(job(&dev), Err(SubmitError::DeviceLost), "RING_RPTR {bad:#x}, write pointer {wptr:#x}");
        assert_eq!(dev.platform().state().engines[0].wptr, wptr, "nothing published");
        assert!(dev.is_lost());
    }
}

// Needs feature `trace` (the trace ring).
#[cfg(feature = "trace")]
#[test]
fn trace_exports_chrome_json() {
    let mut rig_dev = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 4> = rig_dev.device(small_cfg());
    for i in 0..3u64 {
        let f = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0000 + 8 * i)).unwrap();
        dev.wait(f, 1_000_000_000).unwrap();
    }
    let mut json = String::new();
    dev.trace().write_chrome_json(&mut json).unwrap();
    assert!(json.starts_with("{\"displayTimeUnit\""));
    for name in ["\"submit\"", "\"doorbell\"", "\"fence\"", "\"wait_begin\"", "\"wait_end\"", "\"ph\":\"X\""]
    {
        assert!(json.contains(name), "{name} in {json}");
    }
    let kinds: Vec<_> = dev.trace().iter().map(|e| e.kind).collect();
    assert!(kinds.len() >= 12);
}

// Needs feature `trace` (the trace ring).
/// Submissions reach the trace through their queue's stage, without the
/// trace's lock: with submitters on two queues (more submissions each than
/// a stage holds) and a reader of the trace at the same time, the trace
/// ends with each submission's three events exactly once, in its queue's
/// order, and its submit time noted.
#[cfg(feature = "trace")]
#[test]
fn trace_sees_every_staged_submission_once_in_order() {
    use umd_core::debug::TraceKind;
    let mut rig_dev = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 8> = rig_dev.device(Config { ring_bytes: 64 << 10, ..small_cfg() });
    dev.platform().state().mode = Mode::Manual;
    const EACH: u64 = 40;
    std::thread::scope(|s| {
        for q in [QueueId::GFX, QueueId::COMPUTE] {
            let dev = &dev;
            s.spawn(move || {
                for i in 0..EACH {
                    dev.submit(q, &[], |cb| cb.write_data(0x8030_0000 + 16 * i, &[1])).unwrap();
                }
            });
        }
        s.spawn(|| {
            for _ in 0..50 {
                assert_eq!(dev.trace().dropped(), 0);
                std::thread::yield_now();
            }
        });
    });
    let t = dev.trace();
    assert_eq!(t.dropped(), 0);
    for q in [QueueId::GFX, QueueId::COMPUTE] {
        for kind in [TraceKind::Encode, TraceKind::Submit, TraceKind::Doorbell] {
            let seqnos: Vec<u64> =
                t.iter().filter(|e| e.queue == q.0 && e.kind == kind).map(|e| e.seqno).collect();
            assert_eq!(seqnos, (1..=EACH).collect::<Vec<_>>(), "queue {} {kind:?}", q.0);
        }
        assert!(t.submitted_at(usize::from(q.0), EACH).is_some());
    }
}

// Needs feature `trace` (reads the IB's address from the trace).
#[cfg(feature = "trace")]
#[test]
fn only_the_recorded_commands_are_cleaned_from_the_cache() {
    use umd_core::debug::TraceKind;
    for batching in [true, false] {
        let cfg = Config { batching, ib_chunk_bytes: 16 << 10, ..small_cfg() };
        let mut rig_dev = rig(Generation::Gen2);
        let dev: Device<'_, Fake, 8> = rig_dev.device(cfg);
        let (pool_va, pool_len) = dev.pool_range();
        for round in 0..3u64 {
            dev.platform().state().cleaned.clear();
            let f = dev
                .submit(QueueId::GFX, &[], |cb| cb.write_data(0x8030_0000 + 16 * round, &[1, 2, 3]))
                .unwrap();
            dev.wait(f, 1_000_000_000).unwrap();
            let ev = |k| {
                dev.trace()
                    .iter()
                    .filter(|e| e.kind == k && e.seqno == f.seqno().0)
                    .map(|e| e.arg)
                    .last()
                    .unwrap()
            };
            let (ib_va, ib_dw) = (ev(TraceKind::Submit), ev(TraceKind::Encode));
            let in_pool: Vec<(u64, usize)> = dev
                .platform()
                .state()
                .cleaned
                .iter()
                .copied()
                .filter(|(a, _)| *a >= pool_va && *a < pool_va + pool_len as u64)
                .collect();
            let total: usize = in_pool.iter().map(|(_, l)| l).sum();
            assert!(
                total > 0 && total <= 16 << 10,
                "batching={batching} round {round}: cleaned {total} of a {pool_len}-byte pool"
            );
            let covered = |a: u64| in_pool.iter().any(|(s, l)| a >= *s && a < s + *l as u64);
            for k in 0..ib_dw {
                assert!(
                    covered(ib_va + 4 * k),
                    "batching={batching} round {round}: IB dword {k} not cleaned"
                );
            }
        }
    }
}

// Needs feature `trace` (the trace ring).
#[cfg(feature = "trace")]
#[test]
fn completions_seen_by_any_path_are_traced_and_reclaimed() {
    use umd_core::debug::TraceKind;
    let mut rig_dev = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 4> = rig_dev.device(Config { batching: false, ..small_cfg() });
    dev.platform().state().mode = Mode::Manual;
    let copy = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    dev.platform().state().run(2);
    // The COPY fence is first observed while checking this submission's
    // wait list, not by a wait on it.
    let compute = dev.submit(QueueId::COMPUTE, &[copy], |cb| cb.timestamp(0x8030_0008)).unwrap();
    dev.platform().state().run(1);
    dev.wait(compute, 1_000_000_000).unwrap();
    let span = dev
        .trace()
        .iter()
        .find(|e| e.kind == TraceKind::FenceSignalled && e.queue == 2 && e.seqno == 1)
        .copied();
    let span = span.expect("COPY's fence was traced");
    assert!(span.arg != 0 && span.arg <= span.ts_ns, "with its submit time: {span:?}");
    assert_eq!(dev.stats().fences_signalled, 2);
    assert_eq!(dev.pool_stats().in_flight, 0, "both chunks reclaimed");
}

/// `MemoryPlan` is exactly what `Device::new` takes: a fake with that many
/// bytes is enough, one page less is not, and the plan names the pool
/// that did not fit (the IB pool, allocated last).
// Needs feature `mmu` (brings a device up with the MMU on).
#[cfg(feature = "mmu")]
#[test]
fn memory_plan_is_what_device_new_takes() {
    use umd_core::direct::MemoryPlan;
    for (cfg, mmu) in [(small_cfg(), MmuMode::DEFAULT), (Config::DEFAULT, MmuMode::Bypass)] {
        let plan = MemoryPlan::new(&cfg, mmu, 8, 3);
        let fake = Fake::new(Generation::Gen1, plan.total());
        let mut storage: Box<Storage> = Box::default();
        let dev = Device::<'_, Fake, 8>::new(&fake, &mut *storage, cfg, mmu).unwrap();
        assert_eq!(fake.state().bytes_in_use(), plan.total());
        drop(dev);
        assert_eq!(fake.state().bytes_in_use(), 0);
        let short = plan.total() - 4096;
        let fake = Fake::new(Generation::Gen1, short);
        let mut storage: Box<Storage> = Box::default();
        assert!(Device::<'_, Fake, 8>::new(&fake, &mut *storage, cfg, mmu).is_err());
        assert_eq!(fake.state().bytes_in_use(), 0, "a failed Device::new gives everything back");
        assert_eq!(plan.check(short).unwrap_err().what, "IB pool");
    }
}

/// A second `map` of a mapped buffer is refused, and refusing it must not
/// touch the CPU cache: invalidating there would throw away what the first
/// guard wrote and has not cleaned yet (on a non-coherent platform).
#[test]
fn a_refused_second_map_keeps_the_first_guards_writes() {
    fn check<P: Scripted>(fake: P) {
        let mut storage: Box<Storage> = Box::default();
        let dev: Device<'_, P, 4> =
            Device::new(&fake, &mut storage, small_cfg(), MmuMode::Bypass).expect("device comes up");
        let h = dev.alloc_buffer(256).unwrap();
        {
            let mut m = dev.map(h).unwrap();
            m.words_mut()[5] = 0xC0DE;
            assert!(matches!(dev.map(h), Err(umd_core::mem::BufferError::Mapped)));
        }
        assert_eq!(dev.read_u32(h, 5), Ok(0xC0DE), "the first guard's write survived the refused map");
        dev.free(h).unwrap();
    }
    for gen in [Generation::Gen1, Generation::Gen2] {
        check(Fake::new(gen, 4 << 20));
        check(NonCoherent::new(gen, 4 << 20));
    }
}

/// The fake and storage of one loss race, on the heap and shared with the
/// race's threads as `'static` (a thread that never returns keeps them:
/// they are freed only when every thread was joined).
struct RaceRig {
    fake: Fake,
    storage: Storage,
}

/// One run of the loss race (`support::race`) on a fresh device whose
/// fake is lost at the register access `seed` chose, below `accesses`;
/// doorbells yield.
fn loss_race(seed: u64, accesses: u64) -> race::Figures {
    let rig = Box::into_raw(Box::new(RaceRig {
        fake: Fake::new(Generation::Gen2, 1 << 20),
        storage: Storage::default(),
    }));
    // SAFETY: `rig` is a fresh, leaked allocation; it is freed below only
    // after every thread that borrows it was joined and the device dropped.
    let RaceRig { fake, storage } = unsafe { &mut *rig };
    let dev: Device<'static, Fake, 4> =
        Device::new(&*fake, storage, small_cfg(), MmuMode::Bypass).expect("device comes up");
    let dev: &'static Device<'static, Fake, 4> = Box::leak(Box::new(dev));
    let lose_at = 1 + race::Rng::new(seed).below(accesses);
    {
        let mut st = fake.state();
        st.mode = Mode::OnDelay;
        st.doorbell_yields = true;
        st.reg_accesses = 0;
        st.lose_at = Some(lose_at);
    }
    let fig = race::run(dev, seed, &format!("register access {lose_at}"), 0x8030_0000);
    // SAFETY: every thread that borrowed the device or the rig was joined
    // (`race::run` returns only then); the device goes first (it borrows
    // the rig), each is freed once.
    unsafe {
        drop(Box::from_raw(std::ptr::from_ref(dev).cast_mut()));
        drop(Box::from_raw(rig));
    }
    fig
}

/// A device loss racing submissions and waits (`support::race`): four
/// threads submit to three queues and wait for their fences and for each
/// other's with no timeout (a watchdog fails the test when one does not
/// return), while the fake is lost at a register access a seed chooses; a
/// doorbell yields the thread, so that other threads run, and may meet the
/// loss, between a submission's doorbell and the publication of its
/// sequence number. Whoever meets the loss, every fence ends signalled
/// (before the loss) or failed `DeviceLost`, every wait returns, a wait's
/// answer never changes, a submission that begins after the loss is
/// refused. The threads' interleaving is not the seed's: each seed runs
/// once.
#[test]
fn a_loss_racing_submissions_and_waits_fails_every_fence_and_ends_every_wait() {
    // The range the loss is drawn from: about the register accesses of one
    // run without a loss (four threads, 40 rounds each).
    race::seeds("direct-mode loss race", std::time::Duration::from_secs(10), |seed| loss_race(seed, 4_000));
}

/// With the MMU bypassed a buffer's GPU address is its memory's own, so
/// only the alignment the buffer asks for can be checked; the 2 MiB
/// alignment that lets page tables use 2 MiB entries is no requirement
/// there. Buffers of 2 MiB and more are allocated, written, copied by the
/// GPU and read back, although the fake's first-fit pages are not 2 MiB
/// aligned.
#[test]
fn large_buffers_work_with_the_mmu_bypassed() {
    for gen in [Generation::Gen1, Generation::Gen2] {
        let fake = Fake::new(gen, 48 << 20);
        let mut storage: Box<Storage> = Box::default();
        let dev: Device<'_, Fake, 4> =
            Device::new(&fake, &mut storage, small_cfg(), MmuMode::Bypass).expect("device comes up");
        for (i, size) in [2u64 << 20, 3 << 20, 8 << 20].into_iter().enumerate() {
            let src = dev.alloc_buffer(size).unwrap_or_else(|e| panic!("{gen}: {size} bytes: {e}"));
            let dst = dev.alloc_buffer(size).unwrap_or_else(|e| panic!("{gen}: {size} bytes: {e}"));
            let words: Vec<u32> = (0..size as u32 / 4).map(|w| w ^ (i as u32) << 28).collect();
            dev.write_words(src, 0, &words).unwrap();
            let (s, d) = (dev.va(src).unwrap(), dev.va(dst).unwrap());
            let f = dev.submit(QueueId::COPY, &[], |cb| cb.copy(s, d, size)).unwrap();
            dev.wait(f, 1_000_000_000).unwrap();
            let mut back = vec![0u8; size as usize];
            dev.read(dst, 0, &mut back).unwrap();
            let back: Vec<u32> =
                back.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
            assert!(back == words, "{gen}: {size} bytes copied by the GPU read back different");
            dev.free(src).unwrap();
            dev.free(dst).unwrap();
        }
        assert_eq!(dev.buffer_stats().live, 0);
    }
}

/// A request that can not be met with the MMU bypassed (a 2 MiB alignment
/// where the platform's memory is not 2 MiB aligned) is refused with
/// `Unaligned`, naming the alignment the buffer asked for and the address
/// the platform gave, and changes nothing.
#[test]
fn an_unsatisfiable_alignment_with_the_mmu_bypassed_names_its_cause() {
    use umd_core::mem::{AllocError, BufferDesc};
    let fake = Fake::new(Generation::Gen2, 16 << 20);
    let mut storage: Box<Storage> = Box::default();
    let dev: Device<'_, Fake, 4> =
        Device::new(&fake, &mut storage, small_cfg(), MmuMode::Bypass).expect("device comes up");
    // First fit: the next block starts at the first free page; make sure
    // that is not on a 2 MiB boundary.
    let mut pad = None;
    if fake.state().bytes_in_use() % (2 << 20) == 0 {
        pad = Some(dev.alloc_buffer(68 << 10).unwrap());
    }
    let (stats, pages) = (dev.buffer_stats(), fake.state().bytes_in_use());
    let e = dev.alloc(&BufferDesc::new(3 << 20).align(2 << 20)).unwrap_err();
    let AllocError::Unaligned { align, got } = e else { panic!("refused with {e:?}") };
    assert_eq!(align, 2 << 20, "names the alignment asked for");
    assert_ne!(got % (2 << 20), 0, "names the address the platform gave");
    let text = e.to_string();
    assert!(text.contains("0x200000") && text.contains("bypassed"), "{text}");
    assert_eq!((dev.buffer_stats(), fake.state().bytes_in_use()), (stats, pages), "nothing changed");
    // Without the alignment the same buffer is fine.
    let h = dev.alloc_buffer(3 << 20).unwrap();
    dev.free(h).unwrap();
    if let Some(p) = pad {
        dev.free(p).unwrap();
    }
}

/// With the MMU on, a block of 2 MiB or more still goes on a 2 MiB
/// boundary of the GPU VA space (the page tables' 2 MiB entries), whatever
/// alignment the buffer asked for.
#[cfg(feature = "mmu")]
#[test]
fn large_buffers_get_2_mib_aligned_addresses_with_the_mmu_on() {
    let fake = Fake::new(Generation::Gen2, 16 << 20);
    let mut storage: Box<Storage> = Box::default();
    let dev: Device<'_, Fake, 4> =
        Device::new(&fake, &mut storage, small_cfg(), MmuMode::DEFAULT).expect("device comes up");
    // Large blocks go bottom-up: one of 68 KiB first, so the next free
    // address is not on a 2 MiB boundary.
    let pad = dev.alloc_buffer(68 << 10).unwrap();
    for size in [2u64 << 20, 3 << 20] {
        let h = dev.alloc_buffer(size).unwrap();
        assert_eq!(dev.va(h).unwrap() % (2 << 20), 0, "{size} bytes");
        dev.free(h).unwrap();
    }
    dev.free(pad).unwrap();
}

/// A CPU write that covers part of a cache line must not put the CPU's
/// stale copy of the rest of the line over what the GPU wrote there. On a
/// write-back cache with 64-byte lines written back whole: the CPU writes
/// a buffer, the GPU fills it, then the CPU writes single words and byte
/// runs that start or end inside lines, and reads a word of a line (the
/// read side: a partial read must not leave anything to write back). No
/// dirty line is left behind (nothing for a later eviction to write), and
/// every byte the CPU did not write holds the GPU's fill.
#[test]
fn a_partial_line_cpu_write_keeps_the_gpus_data_in_the_rest_of_the_line() {
    for gen in [Generation::Gen1, Generation::Gen2] {
        for line in [4, 64] {
            let fake = NonCoherent::with_lines(gen, 4 << 20, line);
            let mut storage: Box<Storage> = Box::default();
            let dev: Device<'_, NonCoherent, 4> =
                Device::new(&fake, &mut storage, small_cfg(), MmuMode::Bypass).expect("device comes up");
            let h = dev.alloc_buffer(4096).unwrap();
            let va = dev.va(h).unwrap();
            let stale: Vec<u32> = (0..1024).map(|i| 0xAAAA_0000 | i).collect();
            dev.write_words(h, 0, &stale).unwrap();
            let f = dev.submit(QueueId::COPY, &[], |cb| cb.fill(va, 4096, 0xB0B0_B0B0)).unwrap();
            dev.wait(f, 1_000_000_000).unwrap();
            let mut want = vec![0xB0u8; 4096];
            // A partial read first: the GPU's word, nothing left dirty.
            assert_eq!(dev.read_u32(h, 600), Ok(0xB0B0_B0B0), "{gen} line {line}: partial read");
            assert_eq!(fake.evict_dirty(), 0, "{gen} line {line}: a read left a dirty line");
            // One word inside the first line.
            dev.write_words(h, 4, &[0x1234_5678]).unwrap();
            want[4..8].copy_from_slice(&0x1234_5678u32.to_le_bytes());
            // Bytes inside the second line, neither end on a line boundary.
            dev.write(h, 100, &[0x11; 10]).unwrap();
            want[100..110].fill(0x11);
            // Two words across the boundary of lines 3 and 4.
            dev.write_words(h, 188, &[0x2222_2222, 0x3333_3333]).unwrap();
            want[188..192].copy_from_slice(&0x2222_2222u32.to_le_bytes());
            want[192..196].copy_from_slice(&0x3333_3333u32.to_le_bytes());
            // A run of whole lines with partial ones at both ends.
            dev.write(h, 1000, &[0x44; 300]).unwrap();
            want[1000..1300].fill(0x44);
            assert_eq!(fake.evict_dirty(), 0, "{gen} line {line}: a write left a dirty line");
            let mut got = vec![0u8; 4096];
            dev.read(h, 0, &mut got).unwrap();
            let bad: Vec<usize> = (0..4096).filter(|&i| got[i] != want[i]).collect();
            assert!(
                bad.is_empty(),
                "{gen} line {line}: {} bytes differ, first at {:?}",
                bad.len(),
                bad.first()
            );
            dev.free(h).unwrap();
        }
    }
}

/// A `map` guard covers its whole buffer and invalidates all of it when it
/// is made, the lines at both ends included (the rest of such a line is the
/// buffer's own slot, no other buffer's), so what the CPU writes through it
/// is merged with what the GPU wrote before the map; a line evicted while
/// the guard lives, and the clean when it drops, write that merge. (While a
/// guard lives the GPU must not write the buffer: `docs/memory.md` 3b.)
#[test]
fn a_map_guard_merges_its_writes_with_the_gpus_data() {
    for gen in [Generation::Gen1, Generation::Gen2] {
        for size in [4096u64, 100] {
            let fake = NonCoherent::with_lines(gen, 4 << 20, 64);
            let mut storage: Box<Storage> = Box::default();
            let dev: Device<'_, NonCoherent, 4> =
                Device::new(&fake, &mut storage, small_cfg(), MmuMode::Bypass).expect("device comes up");
            let h = dev.alloc_buffer(size).unwrap();
            let va = dev.va(h).unwrap();
            let n = size as usize / 4;
            let stale: Vec<u32> = (0..n as u32).map(|i| 0xAAAA_0000 | i).collect();
            dev.write_words(h, 0, &stale).unwrap();
            let f = dev.submit(QueueId::COPY, &[], |cb| cb.fill(va, size, 0xB0B0_B0B0)).unwrap();
            dev.wait(f, 1_000_000_000).unwrap();
            {
                let mut m = dev.map(h).unwrap();
                m.words_mut()[1] = 0x1234_5678;
                m.words_mut()[n - 1] = 0x9ABC_DEF0;
                assert_eq!(m.words()[2], 0xB0B0_B0B0, "{gen} {size}: the guard sees the GPU's data");
                assert!(fake.evict_dirty() > 0, "{gen} {size}: the guard's writes are dirty lines");
            }
            assert_eq!(fake.evict_dirty(), 0, "{gen} {size}: the drop cleaned everything");
            let mut want = vec![0xB0B0_B0B0u32; n];
            want[1] = 0x1234_5678;
            want[n - 1] = 0x9ABC_DEF0;
            let got: Vec<u32> = (0..n as u64).map(|i| dev.read_u32(h, i).unwrap()).collect();
            assert_eq!(got, want, "{gen} {size}");
            dev.free(h).unwrap();
        }
    }
}

/// More separate failures on one queue than the history once held (8),
/// with successes between them: every answer stays what it was first
/// (successes signalled, work that waits on them accepted, each failure
/// with its own fault address) and nothing is merged. When the history is
/// full the queue refuses new work with `HistoryFull`, touching nothing,
/// until the application acknowledges: then the acknowledged fences answer
/// `Acknowledged` (never another outcome), later ones keep their answers,
/// and the queue takes work again.
#[test]
fn separate_failures_never_change_an_answer_and_a_full_history_is_acknowledged() {
    let mut rig_dev = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 4> = rig_dev.device(small_cfg());
    let mut answers: Vec<(Fence, FenceStatus)> = Vec::new();
    let mut refused = None;
    for i in 0..200u64 {
        dev.platform().state().mode = Mode::OnDoorbell;
        let ok = match dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0000)) {
            Ok(f) => f,
            Err(e) => {
                refused = Some((i, e));
                break;
            }
        };
        dev.wait(ok, 1_000_000_000).unwrap();
        answers.push((ok, FenceStatus::Signalled));
        dev.platform().state().mode = Mode::Manual;
        let addr = 0x1_0000_0000 + i * 0x1000;
        let bad = match dev.submit(QueueId::COPY, &[], |cb| cb.copy(addr, 0x8030_0000, 64)) {
            Ok(f) => f,
            Err(e) => {
                refused = Some((i, e));
                break;
            }
        };
        dev.platform().state().inject_fault(2, 1, 0, addr);
        let Err(WaitError::Failed(e @ FenceError::Fault(info))) = dev.wait(bad, 1_000_000_000) else {
            panic!("fence {bad} did not fault")
        };
        assert_eq!(info.addr, addr);
        answers.push((bad, FenceStatus::Failed(e)));
        // Every answer so far is still the same.
        for &(f, want) in &answers {
            assert_eq!(dev.query(f), Ok(want), "fence {f} after {} faults", i + 1);
        }
        if i == 9 {
            // Work that waits on the first success is accepted and runs.
            dev.platform().state().mode = Mode::OnDoorbell;
            let dep = dev.submit(QueueId::GFX, &[answers[0].0], |cb| cb.timestamp(0x8030_0010)).unwrap();
            dev.wait(dep, 1_000_000_000).unwrap();
        }
    }
    assert_eq!(dev.stats().history_merges, 0);
    let (faults, err) = refused.expect("the history fills up");
    assert_eq!(err, SubmitError::HistoryFull(QueueId::COPY));
    assert!(faults >= 60, "refused after only {faults} failures");
    let submissions = dev.stats().submissions;
    dev.platform().state().mode = Mode::OnDoorbell;
    assert_eq!(
        dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0000)),
        Err(SubmitError::HistoryFull(QueueId::COPY))
    );
    assert_eq!(dev.stats().submissions, submissions, "a refusal reaches nothing");
    // Other queues are not concerned.
    let g = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0010)).unwrap();
    dev.wait(g, 1_000_000_000).unwrap();
    // The application acknowledges the first half of its fences.
    let half = answers.len() / 2;
    let (upto, _) = answers[half - 1];
    assert_eq!(dev.acknowledge_failures(upto), Ok(upto));
    for &(f, want) in &answers[..half] {
        assert_eq!(dev.query(f), Err(WaitError::Acknowledged(f)));
        assert_eq!(dev.wait(f, 0), Err(WaitError::Acknowledged(f)));
        let _ = want;
    }
    for &(f, want) in &answers[half..] {
        assert_eq!(dev.query(f), Ok(want), "fence {f} after the acknowledgement");
    }
    // The queue takes work again, and work may wait on an acknowledged fence.
    let next = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    dev.wait(next, 1_000_000_000).unwrap();
    let dep = dev.submit(QueueId::GFX, &[answers[1].0], |cb| cb.timestamp(0x8030_0010)).unwrap();
    dev.wait(dep, 1_000_000_000).unwrap();
    // The acknowledged point never moves back, and pending work is never
    // acknowledged.
    assert_eq!(dev.acknowledge_failures(answers[0].0), Ok(upto));
    dev.platform().state().mode = Mode::Manual;
    let pending = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    assert_eq!(dev.acknowledge_failures(pending), Ok(next));
    assert_eq!(dev.query(pending), Ok(FenceStatus::Pending));
    assert_eq!(dev.acknowledge_failures(pending.later(1)), Err(WaitError::NotSubmitted(pending.later(1))));
    assert_eq!(dev.stats().history_merges, 0);
}
