//! Waits and dependencies: cross-queue waits and out-of-order completion,
//! wait cycles refused, timeouts and the polling schedule, waits on failed
//! work, waits before signal, full dependency tables, and events (GPU and
//! host set, reset, wait; timestamps).

use super::{names_its_parameter, rig, small_cfg, with_device};
use umd_core::config::{Config, HangConfig};
use umd_core::debug::HangReason;
use umd_core::direct::{Device, MmuMode};
use umd_core::engine::{BufferUse, EventError, Submit};
use umd_core::error::{FenceStatus, SubmitError, WaitError};
use umd_core::hw::Generation;
use umd_core::mem::{BufferError, BufferHandle};
use umd_core::platform::fake::{EngineFault, Fake, Mode, NonCoherent, Scripted};
use umd_core::storage::{DeviceStorage, Limit};
use umd_core::sync::{FenceError, QueueId};

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
fn a_wait_before_signal_is_blocked_not_hung_unless_a_limit_is_set() {
    // Default: no limit. Ten hang windows of virtual time pass.
    with_device::<4>(Generation::Gen2, small_cfg(), MmuMode::Bypass, |dev| {
        dev.platform().state().mode = Mode::OnDoorbell;
        let future = dev.next_fence(QueueId::COPY).unwrap();
        let f = dev.submit(QueueId::GFX, &[future], |cb| cb.timestamp(0x8030_0000)).unwrap();
        assert_eq!(dev.wait(f, 10 * dev.hang_config().window_ns), Err(WaitError::Timeout));
        assert_eq!(dev.stats().resets, 0);
        dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0008)).unwrap();
        dev.platform().state().run_all();
        dev.wait(f, 1_000_000_000).unwrap();
    });
    // With a limit: the blocked queue is reset once it passes.
    let hang = HangConfig { unsubmitted_wait_ns: Some(2_000_000_000), ..Config::DEFAULT.hang };
    with_device::<4>(Generation::Gen2, Config { hang, ..small_cfg() }, MmuMode::Bypass, |dev| {
        dev.platform().state().mode = Mode::OnDoorbell;
        let future = dev.next_fence(QueueId::COPY).unwrap();
        let f = dev.submit(QueueId::GFX, &[future], |cb| cb.timestamp(0x8030_0000)).unwrap();
        assert_eq!(
            dev.wait(f, 60_000_000_000),
            Err(WaitError::Failed(FenceError::NeverSignalled { producer: future.id }))
        );
        let r = dev.last_hang().unwrap();
        assert_eq!(r.reason, HangReason::NeverSignalled { producer: future.id });
        // The queue works again.
        let g = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
        dev.wait(g, 1_000_000_000).unwrap();
    });
}

#[test]
fn a_full_dependency_table_waits_then_refuses() {
    let c = Config { dep_wait_ns: 5_000_000, ..small_cfg() };
    with_device::<16>(Generation::Gen1, c, MmuMode::Bypass, |dev| {
        dev.platform().state().mode = Mode::Manual;
        let copy = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
        let n = umd_core::engine::PENDING_WAITS;
        for _ in 0..n {
            dev.submit(QueueId::GFX, &[copy], |cb| cb.timestamp(0x8030_0008)).unwrap();
        }
        let emitted = dev.last_emitted(QueueId::GFX).unwrap();
        let err = dev.submit(QueueId::GFX, &[copy], |cb| cb.timestamp(0x8030_0010)).unwrap_err();
        assert_eq!(err, SubmitError::TooManyPending(QueueId::GFX));
        names_its_parameter(&err, err.limit(), Limit::PendingWaits, "PENDING_WAITS");
        assert_eq!(dev.last_emitted(QueueId::GFX), Some(emitted), "nothing emitted");
        assert!(dev.stats().dep_waits > 0, "it waited for room first");
        // Room comes back as the work completes, and no edge was dropped.
        dev.platform().state().run_all();
        dev.submit(QueueId::GFX, &[copy], |cb| cb.timestamp(0x8030_0010)).unwrap();
    });
}

/// The storage of the events tests' devices.
type SmallStorage = DeviceStorage<64, 128, 32, 64>;

#[test]
fn set_wait_reset_and_timestamps() {
    let fake = Fake::new(Generation::Gen2, 8 << 20);
    let mut storage: Box<SmallStorage> = Box::default();
    let dev = Device::<Fake, 4>::new(&fake, &mut storage, small_cfg(), MmuMode::Bypass).unwrap();
    fake.state().mode = Mode::OnDelay;
    let ev = dev.create_event().unwrap();
    let ts = dev.create_timestamp().unwrap();
    assert_eq!(dev.event_is_set(ev), Ok(false));
    assert_eq!(dev.timestamp_ns(ts), Ok(None), "0 until written");
    let f = dev
        .submit(QueueId::COPY, &[], |cb| {
            cb.push(&ts.write())?;
            cb.push(&ev.set())
        })
        .unwrap();
    dev.wait_event(ev, 1_000_000_000).unwrap();
    dev.wait(f, 1_000_000_000).unwrap();
    let t = dev.timestamp_ns(ts).unwrap().expect("written");
    assert!(t > 0);
    dev.reset_event(ev).unwrap();
    assert_eq!(dev.event_is_set(ev), Ok(false));
    assert_eq!(dev.wait_event(ev, 5_000_000), Err(EventError::Timeout));
    dev.set_event(ev).unwrap();
    assert_eq!(dev.wait_event(ev, 0), Ok(()), "already set: no wait needed");
    dev.destroy_event(ev).unwrap();
    assert_eq!(dev.event_is_set(ev), Err(BufferError::Stale));
    assert_eq!(dev.wait_event(ev, 1), Err(EventError::Buffer(BufferError::Stale)));
    assert_eq!(dev.destroy_event(ev), Err(BufferError::Stale));
    dev.destroy_timestamp(ts).unwrap();
}

#[test]
fn an_event_of_another_device_is_refused() {
    let (fa, fb) = (Fake::new(Generation::Gen1, 8 << 20), Fake::new(Generation::Gen1, 8 << 20));
    let (mut sa, mut sb): (Box<SmallStorage>, Box<SmallStorage>) = (Box::default(), Box::default());
    let a = Device::<Fake, 4>::new(&fa, &mut sa, small_cfg(), MmuMode::Bypass).unwrap();
    let b = Device::<Fake, 4>::new(&fb, &mut sb, small_cfg(), MmuMode::Bypass).unwrap();
    let ev = a.create_event().unwrap();
    assert!(matches!(b.set_event(ev), Err(BufferError::ForeignDevice { .. })));
    assert!(matches!(b.destroy_event(ev), Err(BufferError::ForeignDevice { .. })));
    assert_eq!(a.event_is_set(ev), Ok(false), "the owner's event is unchanged");
}

/// A buffer handle forged from the slot and generation of an event's (or a
/// timestamp's) buffer reaches nothing: every buffer operation refuses it
/// as unknown, and the event and the timestamp go on working.
#[test]
fn forged_handles_to_event_and_timestamp_buffers_are_refused() {
    let fake = Fake::new(Generation::Gen1, 8 << 20);
    let mut storage: Box<SmallStorage> = Box::default();
    let dev = Device::<Fake, 4>::new(&fake, &mut storage, small_cfg(), MmuMode::Bypass).unwrap();
    fake.state().mode = Mode::OnDelay;
    // A freed slot is the next one handed out, one generation on (two
    // steps: live generations are odd).
    let forge_next = || {
        let b = dev.alloc_buffer(64).unwrap();
        let (id, index, gen) = b.into_raw();
        dev.free(b).unwrap();
        BufferHandle::from_raw(id, index, gen + 2)
    };
    let forged_ev = forge_next();
    let ev = dev.create_event().unwrap();
    let forged_ts = forge_next();
    let ts = dev.create_timestamp().unwrap();
    let live = dev.buffer_stats().live;
    for forged in [forged_ev, forged_ts] {
        let mut out = [0u8; 4];
        assert_eq!(dev.write(forged, 0, &[1, 0, 0, 0]), Err(BufferError::Unknown));
        assert_eq!(dev.read(forged, 0, &mut out), Err(BufferError::Unknown));
        assert_eq!(dev.buffer(forged), Err(BufferError::Unknown));
        assert_eq!(dev.va(forged), Err(BufferError::Unknown));
        assert_eq!(dev.map(forged).err(), Some(BufferError::Unknown));
        let declared =
            dev.submit_with(&Submit::on(QueueId::COPY).using(&[BufferUse::write(forged)]), |cb| cb.barrier());
        assert_eq!(declared.err(), Some(SubmitError::Buffer(BufferError::Unknown)));
        assert_eq!(dev.free(forged), Err(BufferError::Unknown));
    }
    assert_eq!(dev.buffer_stats().live, live, "nothing was freed");
    // The event and the timestamp are untouched and still work.
    assert_eq!(dev.event_is_set(ev), Ok(false));
    assert_eq!(dev.timestamp_ns(ts), Ok(None));
    let f = dev
        .submit(QueueId::COPY, &[], |cb| {
            cb.push(&ts.write())?;
            cb.push(&ev.set())
        })
        .unwrap();
    dev.wait_event(ev, 1_000_000_000).unwrap();
    dev.wait(f, 1_000_000_000).unwrap();
    assert!(dev.timestamp_ns(ts).unwrap().is_some());
    dev.destroy_event(ev).unwrap();
    dev.destroy_timestamp(ts).unwrap();
    // Once the slot is the user's again, its handle works.
    let b = dev.alloc_buffer(64).unwrap();
    dev.write(b, 0, &[1, 2, 3, 4]).unwrap();
    dev.free(b).unwrap();
}

/// The event's word moves between the CPU and the GPU in both directions,
/// on a coherent system and on a non-coherent one, where only the driver's
/// clean after the host's store puts the value in the memory the GPU reads,
/// and only its invalidate before the host's load shows the host what the
/// GPU wrote.
#[test]
fn host_and_gpu_see_each_others_event_writes() {
    for gen in [Generation::Gen1, Generation::Gen2] {
        handoff(Fake::new(gen, 8 << 20));
        handoff(NonCoherent::new(gen, 8 << 20));
    }
}

fn handoff<P: Scripted>(fake: P) {
    let mut storage: Box<SmallStorage> = Box::default();
    let dev = Device::<P, 4>::new(&fake, &mut storage, small_cfg(), MmuMode::Bypass).unwrap();
    dev.platform().state().mode = Mode::OnDelay;
    let ev = dev.create_event().unwrap();
    let on_gpu = || dev.platform().state().read_u32(ev.va()).expect("the event's word is in memory");
    // Host to GPU: set and reset reach device memory.
    dev.set_event(ev).unwrap();
    assert_eq!(on_gpu(), 1, "the host's set did not reach the GPU");
    dev.reset_event(ev).unwrap();
    assert_eq!(on_gpu(), 0, "the host's reset did not reach the GPU");
    // GPU to host: the host sees the GPU's set (its wait and its query)
    // and then the GPU's reset.
    let set = dev.submit(QueueId::COPY, &[], |cb| cb.push(&ev.set())).unwrap();
    dev.wait_event(ev, 1_000_000_000).unwrap();
    dev.wait(set, 1_000_000_000).unwrap();
    assert_eq!(dev.event_is_set(ev), Ok(true));
    let reset = dev.submit(QueueId::COPY, &[], |cb| cb.push(&ev.reset())).unwrap();
    dev.wait(reset, 1_000_000_000).unwrap();
    assert_eq!(dev.event_is_set(ev), Ok(false), "the host did not see the GPU's reset");
}
