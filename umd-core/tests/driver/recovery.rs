//! Recovery: hangs (detected, dumped, reset, the queue going on), faults
//! with their address, engine and access, fences poisoned and failures
//! propagated, a failure history over thousands of resets, and device loss
//! (pending work failed, later submissions refused, the loss racing
//! submissions and waits).

use super::{rig, small_cfg, with_device, Storage};
use crate::race;
use umd_core::config::Config;
use umd_core::debug::hang::WINDOW_DWORDS;
use umd_core::debug::HangReason;
use umd_core::direct::{Device, MmuMode};
use umd_core::error::{FenceStatus, SubmitError, WaitError};
use umd_core::hw::Generation;
use umd_core::platform::fake::{EngineFault, Fake, Mode, NonCoherent, Scripted};
use umd_core::sync::{Cause, FaultKind, Fence, FenceError, QueueId};

/// Whether this build captures hang reports (feature `hang-capture`).
const CAPTURE: bool = cfg!(feature = "hang-capture");

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
        let first = format!("queue q0 stuck (platform clock {} ns): ", report.at_ns);
        assert!(text.starts_with(&first), "a hang is stuck, at the platform's time: {text}");
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
fn a_hang_is_detected_reset_and_recovered_with_or_without_its_capture() {
    let fake = Fake::new(Generation::Gen2, 4 << 20);
    let mut storage: Box<Storage> = Box::default();
    let dev: Device<'_, Fake, 4> =
        Device::new(&fake, &mut storage, small_cfg(), MmuMode::Bypass).expect("device comes up");
    dev.platform().state().engines[0].fault = EngineFault::Stuck;
    let buf = dev.alloc_buffer(4096).unwrap();
    let b = dev.va(buf).unwrap();
    let f1 = dev.submit(QueueId::GFX, &[], |cb| cb.write_data(b, &[1])).unwrap();
    let f2 = dev.submit(QueueId::GFX, &[], |cb| cb.write_data(b + 4, &[2])).unwrap();
    assert_eq!(dev.wait(f1, 10_000_000_000), Err(WaitError::Failed(FenceError::DeviceHung)));
    assert_eq!(dev.query(f2), Ok(FenceStatus::Failed(FenceError::DeviceHung)));
    assert_eq!((dev.stats().hangs, dev.stats().resets), (1, 1));
    let report = dev.last_hang().expect("a hang report, captured or not");
    assert_eq!(report.queue, QueueId::GFX);
    assert!(matches!(report.reason, HangReason::NoProgress { .. }));
    assert_eq!((report.emitted.0, report.completed.0), (2, 0));
    let text = report.to_string();
    assert!(text.contains("no progress"), "{text}");
    if CAPTURE {
        assert_eq!(WINDOW_DWORDS, 48);
        assert!(report.ring.len > 0 && report.wptr != 0, "{report:?}");
        assert!(text.contains("INDIRECT_BUFFER") && text.contains("FENCE"), "{text}");
    } else {
        assert_eq!(WINDOW_DWORDS, 0);
        assert_eq!((report.ring.len, report.ib.len, report.wptr, report.status), (0, 0, 0, 0));
        assert!(!text.contains("INDIRECT_BUFFER"), "{text}");
    }
    // The queue works again after the reset.
    dev.platform().state().engines[0].fault = EngineFault::None;
    let f3 = dev.submit(QueueId::GFX, &[], |cb| cb.write_data(b + 12, &[4])).unwrap();
    dev.wait(f3, 1_000_000_000).unwrap();
    assert_eq!(dev.read_u32(buf, 3), Ok(4));
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
    let first = format!("queue q2 faulted (platform clock {} ns): ", report.at_ns);
    assert!(report.to_string().starts_with(&first), "a fault is not called stuck: {report}");
    assert_eq!(dev.stats().faults, 1);
    // Recovered.
    dev.platform().state().mode = Mode::OnDoorbell;
    let g = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    dev.wait(g, 1_000_000_000).unwrap();
}

#[test]
fn a_fault_keeps_its_typed_error_and_its_fault_with_or_without_the_capture() {
    let fake = Fake::new(Generation::Gen1, 4 << 20);
    let mut storage: Box<Storage> = Box::default();
    let dev: Device<'_, Fake, 4> =
        Device::new(&fake, &mut storage, small_cfg(), MmuMode::Bypass).expect("device comes up");
    let buf = dev.alloc_buffer(4096).unwrap();
    let b = dev.va(buf).unwrap();
    dev.platform().state().mode = Mode::Manual;
    let f = dev.submit(QueueId::COPY, &[], |cb| cb.copy(b + 64, b, 64)).unwrap();
    dev.platform().state().inject_fault(2, 1, 0, b + 64);
    let Err(WaitError::Failed(FenceError::Fault(info))) = dev.wait(f, 1_000_000_000) else {
        panic!("a fault")
    };
    assert_eq!((info.kind, info.addr), (FaultKind::Translation, b + 64));
    let report = dev.last_hang().unwrap();
    assert_eq!(report.fault, Some(info));
    assert!(report.to_string().contains("Translation fault on Read"), "{report}");
    // The nearest buffer is part of the capture.
    assert_eq!(report.near.is_some(), CAPTURE, "{report:?}");
    assert_eq!(dev.stats().faults, 1);
    dev.platform().state().mode = Mode::OnDoorbell;
    let g = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(b + 128)).unwrap();
    dev.wait(g, 1_000_000_000).unwrap();
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
fn thousands_of_resets_never_turn_a_cancelled_fence_into_success() {
    with_device::<4>(Generation::Gen1, small_cfg(), MmuMode::Bypass, |dev| {
        dev.platform().state().mode = Mode::Manual;
        let fault = |dev: &Device<'_, Fake, 4>| {
            let f = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
            dev.platform().state().inject_fault(2, 1, 0, 0x1_0000_0000);
            assert!(matches!(dev.wait(f, 1_000_000_000), Err(WaitError::Failed(FenceError::Fault(_)))));
            f
        };
        let first = fault(dev);
        let ok = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
        dev.platform().state().run(2);
        dev.wait(ok, 1_000_000_000).unwrap();
        let mut cancelled = vec![first];
        for i in 0..3000 {
            let f = fault(dev);
            if i % 97 == 0 {
                cancelled.push(f);
            }
        }
        assert_eq!(dev.stats().resets, 3001);
        for f in &cancelled {
            assert!(
                matches!(dev.query(*f), Ok(FenceStatus::Failed(FenceError::Fault(_)))),
                "{f} forgot its failure"
            );
        }
        assert_eq!(dev.query(ok), Ok(FenceStatus::Signalled), "the success between the resets stays one");
        assert_eq!(
            dev.submit(QueueId::GFX, &[first], |cb| cb.barrier()).unwrap_err(),
            SubmitError::DependencyFailed {
                fence: first,
                error: dev
                    .query(first)
                    .map(|s| match s {
                        FenceStatus::Failed(e) => e,
                        _ => FenceError::DeviceLost,
                    })
                    .unwrap()
            }
        );
    });
}

#[test]
fn failures_propagate_through_chains_of_waits() {
    with_device::<8>(Generation::Gen2, small_cfg(), MmuMode::Bypass, |dev| {
        dev.platform().state().mode = Mode::Manual;
        let a = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
        let b = dev.submit(QueueId::COMPUTE, &[a], |cb| cb.timestamp(0x8030_0008)).unwrap();
        let c = dev.submit(QueueId::GFX, &[b], |cb| cb.timestamp(0x8030_0010)).unwrap();
        let unrelated = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0018)).unwrap();
        dev.platform().state().inject_fault(2, 1, 0, 0x1_0000_0000);
        let err = dev.wait(a, 1_000_000_000).unwrap_err();
        let WaitError::Failed(FenceError::Fault(info)) = err else { panic!("{err:?}") };
        dev.platform().state().run_all();
        for f in [b, c] {
            assert_eq!(
                dev.wait(f, 1_000_000_000),
                Err(WaitError::Failed(FenceError::Dependency { producer: a.id, cause: Cause::Fault(info) })),
                "{f}"
            );
        }
        dev.wait(unrelated, 1_000_000_000).unwrap();
        assert_eq!(dev.stats().propagated_failures, 2);
    });
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

/// The fake and storage of one loss race, on the heap and shared with the
/// race's threads as `'static` (a thread that never returns keeps them:
/// they are freed only when every thread was joined).
struct RaceRig {
    fake: Fake,
    storage: Storage,
}

/// One run of the loss race (`crate::race`) on a fresh device whose
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

/// A device loss racing submissions and waits (`crate::race`): four
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

#[test]
fn the_state_dump_after_a_hang_names_the_queue_its_fences_and_the_report() {
    use umd_core::engine::dump::DumpFormat;
    let mut rig_dev = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 4> = rig_dev.device(small_cfg());
    dev.platform().state().engines[0].fault = EngineFault::Stuck;
    let f1 = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    let f2 = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0008)).unwrap();
    // A waiter on the hung queue, still pending when the dump is taken.
    dev.platform().state().mode = Mode::Manual;
    let c = dev.submit(QueueId::COMPUTE, &[f2], |cb| cb.timestamp(0x8030_0010)).unwrap();
    let mut before = String::new();
    dev.dump_state(&mut before, DumpFormat::Json).unwrap();
    let j: serde_json::Value = serde_json::from_str(&before).expect(&before);
    assert_eq!(j["waits"][0]["waiter"], c.id.to_string(), "{before}");
    assert_eq!(j["waits"][0]["on"], f2.id.to_string(), "{before}");
    assert_eq!(j["waits"][0]["signalled"], false, "{before}");
    dev.platform().state().mode = Mode::OnDoorbell;
    assert_eq!(dev.wait(f1, 10_000_000_000), Err(WaitError::Failed(FenceError::DeviceHung)));

    let mut json = String::new();
    dev.dump_state(&mut json, DumpFormat::Json).unwrap();
    let j: serde_json::Value = serde_json::from_str(&json).expect(&json);
    assert_eq!(j["device"]["generation"], 2);
    assert_eq!(j["device"]["mode"], "direct");
    let gfx = &j["queues"][0];
    assert_eq!((gfx["emitted"].as_u64(), gfx["completed"].as_u64()), (Some(2), Some(2)), "{json}");
    assert_eq!(gfx["failed"][0]["after"], 0, "{json}");
    assert_eq!(gfx["failed"][0]["upto"], 2, "{json}");
    assert_eq!(gfx["failed"][0]["error"], FenceError::DeviceHung.to_string(), "{json}");
    // The ring after the reset: both pointers at its start.
    assert_eq!(gfx["ring"]["wptr"], gfx["ring"]["rptr"], "{json}");
    assert_eq!(j["hangs"]["total"], 1, "{json}");
    let r = &j["hangs"]["reports"][0];
    assert_eq!((r["queue"].as_u64(), r["kind"].as_str()), (Some(0), Some("hang")), "{json}");
    assert!(r["reason"].as_str().unwrap().contains("no progress"), "{json}");
    assert_eq!(j["stats"]["hangs"], 1, "{json}");
    assert_eq!(j["stats"]["resets"], 1, "{json}");
    assert_eq!(j["stats"]["submissions"], 3, "{json}");
    assert!(j["buffers"]["classes"].as_array().is_some_and(|c| c.len() == 3), "{json}");
    assert!(j["ib_pool"]["chunks"].as_u64().is_some(), "{json}");

    let mut text = String::new();
    dev.dump_state(&mut text, DumpFormat::Text).unwrap();
    assert!(text.contains("queue q0 stuck (platform clock "), "{text}");
    assert!(text.contains("emitted: 2\n"), "{text}");
    assert!(text.contains("upto: 2\n"), "{text}");
}

/// The state dump lists every live buffer with its range (what
/// `docs/debugging.md` matches a faulting copy's addresses against); a
/// freed buffer leaves the list.
#[test]
fn the_state_dump_lists_every_live_buffer_with_its_range() {
    use umd_core::engine::dump::DumpFormat;
    use umd_core::mem::buffer::BufferDesc;
    let mut rig_dev = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 4> = rig_dev.device(small_cfg());
    let a = dev.alloc(&BufferDesc::new(4096).tag("dst")).unwrap();
    let b = dev.alloc(&BufferDesc::new(100).tag("freed")).unwrap();
    let va = dev.va(a).unwrap();
    dev.free(b).unwrap();
    // A tag that JSON must escape.
    let d = dev.alloc(&BufferDesc::new(8).tag("quoted \"tag\"")).unwrap();
    let c = dev.alloc(&BufferDesc::new(65536).tag("src")).unwrap();
    let vc = dev.va(c).unwrap();
    let mut json = String::new();
    dev.dump_state(&mut json, DumpFormat::Json).unwrap();
    let j: serde_json::Value = serde_json::from_str(&json).expect(&json);
    let list = j["buffers"]["list"].as_array().expect(&json);
    let find = |tag: &str| list.iter().find(|e| e["tag"] == tag);
    let dst = find("dst").expect(&json);
    assert_eq!(
        (dst["va"].as_u64(), dst["size"].as_u64(), dst["end"].as_u64()),
        (Some(va), Some(4096), Some(va + 4096))
    );
    let src = find("src").expect(&json);
    assert_eq!((src["va"].as_u64(), src["end"].as_u64()), (Some(vc), Some(vc + 65536)), "{json}");
    assert!(find("freed").is_none(), "a freed buffer is listed: {json}");
    assert_eq!(find("quoted \"tag\"").and_then(|e| e["size"].as_u64()), Some(8), "{json}");
    assert_eq!(list.len() as u64, j["buffers"]["live"].as_u64().unwrap(), "{json}");
    let mut text = String::new();
    dev.dump_state(&mut text, DumpFormat::Text).unwrap();
    assert!(
        text.contains(&format!(
            "      tag: dst\n      va: {va:#x}\n      size: 4096\n      end: {:#x}\n",
            va + 4096
        )),
        "{text}"
    );
    dev.free(a).unwrap();
    dev.free(d).unwrap();
    dev.free(c).unwrap();
}

#[test]
fn the_hang_log_keeps_the_last_n_reports_and_counts_them_all() {
    let fake = Fake::new(Generation::Gen1, 4 << 20);
    // Two reports kept (the storage's last parameter).
    let mut storage: Box<umd_core::storage::DeviceStorage<256, 256, 64, 256, 64, 2>> = Box::default();
    let dev: Device<'_, Fake, 4> = Device::new(&fake, &mut storage, small_cfg(), MmuMode::Bypass).unwrap();
    let addrs = [0x1_0000_0000u64, 0x2_0000_0000, 0x3_0000_0000];
    for addr in addrs {
        dev.platform().state().mode = Mode::Manual;
        let f = dev.submit(QueueId::COPY, &[], |cb| cb.copy(addr, 0x8030_0000, 64)).unwrap();
        dev.platform().state().inject_fault(2, 1, 0, addr);
        assert!(matches!(dev.wait(f, 1_000_000_000), Err(WaitError::Failed(FenceError::Fault(_)))));
        dev.platform().state().mode = Mode::OnDoorbell;
    }
    let mut kept = Vec::new();
    let total = dev.hang_reports(|r| kept.push(r.fault.map(|f| f.addr)));
    assert_eq!(total, 3);
    assert_eq!(kept, [Some(addrs[1]), Some(addrs[2])], "the oldest was overwritten, order kept");
    assert_eq!(dev.last_hang().and_then(|r| r.fault).map(|f| f.addr), Some(addrs[2]));
    let mut json = String::new();
    dev.dump_state(&mut json, umd_core::engine::dump::DumpFormat::Json).unwrap();
    let j: serde_json::Value = serde_json::from_str(&json).expect(&json);
    assert_eq!((j["hangs"]["total"].as_u64(), j["hangs"]["kept"].as_u64()), (Some(3), Some(2)), "{json}");
    assert_eq!(j["hangs"]["reports"][1]["kind"], "fault", "{json}");
}
