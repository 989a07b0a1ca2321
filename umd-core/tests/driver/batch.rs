//! Deferred doorbells (`Config::batch_window_ns`): submissions within the
//! window share one write-pointer update and one doorbell; a wait, a
//! status query or another queue's wait on a held fence hands it over at
//! once; the window's expiry is seen on the next driver call (the fake's
//! virtual clock moves it, no wall clock); the held-count limit and a full
//! ring publish; shutdown publishes; a window of 0 rings once per
//! submission as before.

use super::{rig, small_cfg};
use umd_core::config::{Config, HangConfig};
use umd_core::direct::Device;
use umd_core::engine::dump::DumpFormat;
use umd_core::engine::MAX_HELD;
use umd_core::error::{FenceStatus, SubmitError, WaitError};
use umd_core::hw::Generation;
use umd_core::platform::fake::{EngineFault, Fake, Mode};
use umd_core::sync::{Fence, FenceError, QueueId};

/// 1 ms: far longer than the virtual time a few submissions take (the
/// fake's clock moves 100 ns per read), far shorter than a wait's timeout.
const WINDOW: u64 = 1_000_000;
/// A wait's timeout (virtual time).
const SECOND: u64 = 1_000_000_000;

fn cfg(window: u64) -> Config {
    Config { batch_window_ns: window, ..small_cfg() }
}

/// A tiny submission on `q` (a timestamp into a scratch word).
fn tiny(dev: &Device<'_, Fake, 4>, q: QueueId, i: u64) -> Fence {
    dev.submit(q, &[], |cb| cb.timestamp(0x8030_0000 + 8 * (i % 64))).unwrap()
}

fn doorbells(dev: &Device<'_, Fake, 4>) -> u64 {
    dev.platform().state().doorbells
}

/// RING_WPTR of engine `q` as the fake last saw it written.
fn hw_wptr(dev: &Device<'_, Fake, 4>, q: QueueId) -> u32 {
    dev.platform().state().engines[usize::from(q.0)].wptr
}

/// The `batch_held` count of queue `q` in the JSON state dump.
fn held_in_dump(dev: &Device<'_, Fake, 4>, q: QueueId) -> u64 {
    let mut dump = String::new();
    dev.dump_state(&mut dump, DumpFormat::Json).unwrap();
    let entry = format!("\"queue\":{},\"emitted\"", q.0);
    let rest = dump.split(&entry).nth(1).unwrap_or_else(|| panic!("no entry for {q:?}: {dump}"));
    let held = rest.split("\"batch_held\":").nth(1).unwrap_or_else(|| panic!("no batch_held: {dump}"));
    held.split(',').next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("bad batch_held: {dump}"))
}

#[test]
fn submissions_within_the_window_ring_once() {
    for gen in [Generation::Gen1, Generation::Gen2] {
        let mut r = rig(gen);
        let dev: Device<'_, Fake, 4> = r.device(cfg(WINDOW));
        dev.platform().state().mode = Mode::OnDoorbell;
        let (d0, w0) = (doorbells(&dev), hw_wptr(&dev, QueueId::COPY));
        let fences: Vec<Fence> = (0..8).map(|i| tiny(&dev, QueueId::COPY, i)).collect();
        assert_eq!(doorbells(&dev), d0, "{gen}: held submissions rang");
        assert_eq!(hw_wptr(&dev, QueueId::COPY), w0, "{gen}: held submissions published RING_WPTR");
        assert_eq!(held_in_dump(&dev, QueueId::COPY), 8, "{gen}: the dump shows 8 held");
        dev.flush(QueueId::COPY).unwrap();
        assert_eq!(doorbells(&dev), d0 + 1, "{gen}: one doorbell for 8 submissions");
        assert_ne!(hw_wptr(&dev, QueueId::COPY), w0, "{gen}: the flush published RING_WPTR");
        for f in &fences {
            dev.wait(*f, SECOND).unwrap();
        }
        assert_eq!(doorbells(&dev), d0 + 1, "{gen}: waits on published work ring nothing");
        // Nothing held: another flush rings nothing.
        dev.flush_all().unwrap();
        assert_eq!(doorbells(&dev), d0 + 1, "{gen}: an empty flush rang");
        assert_eq!(dev.stats().doorbells, 1, "{gen}: the statistics count the one doorbell");
        assert_eq!(dev.flush(QueueId(7)), Err(SubmitError::UnknownQueue(QueueId(7))));
    }
}

#[test]
fn window_off_rings_once_per_submission() {
    let mut r = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 4> = r.device(cfg(0));
    let d0 = doorbells(&dev);
    let last = (0..5).map(|i| tiny(&dev, QueueId::COPY, i)).last().unwrap();
    assert_eq!(doorbells(&dev), d0 + 5, "one doorbell per submission with the window off");
    assert_eq!(dev.stats().doorbells, 5, "the statistics count every doorbell");
    dev.flush(QueueId::COPY).unwrap();
    assert_eq!(doorbells(&dev), d0 + 5, "a flush with the window off rings nothing");
    dev.wait(last, SECOND).unwrap();
}

#[test]
fn a_wait_on_a_held_fence_hands_it_over_and_completes() {
    for gen in [Generation::Gen1, Generation::Gen2] {
        let mut r = rig(gen);
        // The window is longer than the wait's timeout: only the flush at
        // the wait's start lets it complete (the engines run when the
        // driver sleeps, up to the published write pointer).
        let dev: Device<'_, Fake, 4> = r.device(cfg(100_000_000));
        dev.platform().state().mode = Mode::OnDelay;
        let d0 = doorbells(&dev);
        let fences: Vec<Fence> = (0..3).map(|i| tiny(&dev, QueueId::GFX, i)).collect();
        assert_eq!(doorbells(&dev), d0);
        dev.wait(fences[2], 10_000_000).unwrap();
        assert_eq!(doorbells(&dev), d0 + 1, "{gen}: the wait flushed the three at once");
        assert_eq!(dev.query(fences[0]), Ok(FenceStatus::Signalled));
    }
}

#[test]
fn a_status_query_on_a_held_fence_hands_it_over() {
    let mut r = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 4> = r.device(cfg(WINDOW));
    dev.platform().state().mode = Mode::Manual;
    let d0 = doorbells(&dev);
    let f = tiny(&dev, QueueId::COMPUTE, 0);
    let g = tiny(&dev, QueueId::COMPUTE, 1);
    assert_eq!(doorbells(&dev), d0);
    assert_eq!(dev.query(f), Ok(FenceStatus::Pending));
    assert_eq!(doorbells(&dev), d0 + 1, "the query published the held work");
    dev.platform().state().run(usize::from(QueueId::COMPUTE.0));
    assert_eq!(dev.query(g), Ok(FenceStatus::Signalled), "both were handed over");
    assert_eq!(doorbells(&dev), d0 + 1);
}

#[test]
fn the_window_expires_on_the_next_driver_call() {
    let mut r = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 4> = r.device(cfg(WINDOW));
    dev.platform().state().mode = Mode::Manual;
    let d0 = doorbells(&dev);
    // Nothing moves without a call, however long it takes.
    tiny(&dev, QueueId::COPY, 0);
    dev.platform().state().now += 10 * WINDOW;
    assert_eq!(doorbells(&dev), d0);
    // A service pass sees the expired window.
    dev.service();
    assert_eq!(doorbells(&dev), d0 + 1, "the service pass published the expired work");
    // A submission to the queue sees it too (the older one's window
    // passed: both go with one doorbell).
    tiny(&dev, QueueId::COPY, 1);
    assert_eq!(doorbells(&dev), d0 + 1, "a fresh window holds");
    dev.platform().state().now += WINDOW;
    let last = tiny(&dev, QueueId::COPY, 2);
    assert_eq!(doorbells(&dev), d0 + 2, "the submission after the window published both");
    // A query on an older, published fence of a queue whose window
    // passed hands that queue's held work over.
    let first = dev.last_emitted(QueueId::COMPUTE).unwrap();
    let c = tiny(&dev, QueueId::COMPUTE, 3);
    assert_eq!(doorbells(&dev), d0 + 2, "COMPUTE's submission is held");
    dev.platform().state().now += WINDOW;
    assert_eq!(dev.query(first), Ok(FenceStatus::Signalled));
    assert_eq!(doorbells(&dev), d0 + 3, "the query published the expired work");
    dev.platform().state().run_all();
    assert_eq!(dev.query(last), Ok(FenceStatus::Signalled));
    assert_eq!(dev.query(c), Ok(FenceStatus::Signalled));
    assert_eq!(doorbells(&dev), d0 + 3);
}

#[test]
fn a_cross_queue_wait_hands_the_producer_over() {
    let mut r = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 4> = r.device(cfg(100_000_000));
    dev.platform().state().mode = Mode::OnDelay;
    let w0 = hw_wptr(&dev, QueueId::COPY);
    let d0 = doorbells(&dev);
    let producer = tiny(&dev, QueueId::COPY, 0);
    assert_eq!(hw_wptr(&dev, QueueId::COPY), w0, "the producer is held");
    let consumer = dev.submit(QueueId::GFX, &[producer], |cb| cb.timestamp(0x8031_0000)).unwrap();
    assert_ne!(hw_wptr(&dev, QueueId::COPY), w0, "the consumer's submission published the producer");
    assert_eq!(doorbells(&dev), d0 + 1, "the consumer itself is held");
    dev.wait(consumer, 10_000_000).unwrap();
    assert_eq!(dev.query(producer), Ok(FenceStatus::Signalled));
    assert_eq!(doorbells(&dev), d0 + 2);
}

#[test]
fn the_held_limit_publishes() {
    let mut r = rig(Generation::Gen1);
    let dev: Device<'_, Fake, 4> = r.device(cfg(100_000_000));
    dev.platform().state().mode = Mode::Manual;
    let d0 = doorbells(&dev);
    for i in 0..MAX_HELD - 1 {
        tiny(&dev, QueueId::COPY, i);
    }
    assert_eq!(doorbells(&dev), d0);
    tiny(&dev, QueueId::COPY, MAX_HELD);
    assert_eq!(doorbells(&dev), d0 + 1, "the {MAX_HELD}th held submission published them all");
}

#[test]
fn a_full_ring_of_held_work_is_handed_over() {
    // Gen2 submissions that wait on four fences of another queue take 41
    // ring dwords: a 4 KiB ring holds 24 of them, fewer than the held
    // limit. The hang window (1 ms) is far shorter than the batch window
    // (100 ms): unless the full ring publishes the held work the engine
    // can never free room, and the submission fails with RingFull.
    let mut r = rig(Generation::Gen2);
    let hang = HangConfig { window_ns: 1_000_000, ..Config::DEFAULT.hang };
    let dev: Device<'_, Fake, 4> = r.device(Config { hang, ..cfg(100_000_000) });
    dev.platform().state().mode = Mode::OnDelay;
    let g = tiny(&dev, QueueId::GFX, 0);
    dev.flush(QueueId::GFX).unwrap();
    let waits = [g, g, g, g];
    let fences: Vec<Fence> = (0..30u64)
        .map(|i| {
            dev.submit(QueueId::COPY, &waits, |cb| cb.timestamp(0x8032_0000 + 8 * i))
                .unwrap_or_else(|e| panic!("submission {i}: {e:?}"))
        })
        .collect();
    for f in &fences {
        dev.wait(*f, SECOND).unwrap();
    }
}

#[test]
fn shutdown_hands_held_work_over() {
    let mut r = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 4> = r.device(cfg(WINDOW));
    dev.platform().state().mode = Mode::Manual;
    let (d0, w0) = (doorbells(&dev), hw_wptr(&dev, QueueId::COPY));
    tiny(&dev, QueueId::COPY, 0);
    tiny(&dev, QueueId::COPY, 1);
    assert_eq!(doorbells(&dev), d0);
    let report = dev.shutdown();
    assert_eq!(report.leaked_buffers, 0);
    let st = r.fake.state();
    assert_eq!(st.doorbells, d0 + 1, "shutdown published the held work with one doorbell");
    assert_ne!(st.engines[usize::from(QueueId::COPY.0)].wptr, w0);
    assert_eq!(st.allocs, 0, "teardown gave every block back");
}

#[test]
fn a_hang_check_does_not_count_held_work_as_stuck() {
    // Held work the engine never saw, for many hang windows of virtual
    // time with service passes: no hang (the batch window is longer than
    // all of it, so nothing is published).
    let mut r = rig(Generation::Gen2);
    let hang = HangConfig { window_ns: 1_000_000, ..Config::DEFAULT.hang };
    let dev: Device<'_, Fake, 4> = r.device(Config { hang, ..cfg(100_000_000) });
    dev.platform().state().mode = Mode::Manual;
    let f = tiny(&dev, QueueId::COPY, 0);
    for _ in 0..20 {
        dev.platform().state().now += 2_000_000;
        assert!(dev.service().is_none(), "held work was judged hung");
    }
    assert_eq!(dev.stats().hangs, 0);
    dev.platform().state().mode = Mode::OnDelay;
    dev.wait(f, SECOND).unwrap();
}

#[test]
fn a_reset_cancels_held_work_and_the_queue_holds_again() {
    let mut r = rig(Generation::Gen2);
    let hang = HangConfig { window_ns: 1_000_000, ..Config::DEFAULT.hang };
    let dev: Device<'_, Fake, 4> = r.device(Config { hang, ..cfg(100_000_000) });
    dev.platform().state().engines[0].fault = EngineFault::Stuck;
    let f1 = tiny(&dev, QueueId::GFX, 0);
    dev.flush(QueueId::GFX).unwrap();
    let held = [tiny(&dev, QueueId::GFX, 1), tiny(&dev, QueueId::GFX, 2)];
    // The published one hangs; the held ones are cancelled with it.
    assert_eq!(dev.wait(f1, SECOND), Err(WaitError::Failed(FenceError::DeviceHung)));
    assert_eq!(held_in_dump(&dev, QueueId::GFX), 0, "the cancelled work is not held any more");
    for f in held {
        assert_eq!(dev.query(f), Ok(FenceStatus::Failed(FenceError::DeviceHung)));
    }
    // The queue holds again, from an empty ring.
    dev.platform().state().engines[0].fault = EngineFault::None;
    dev.platform().state().mode = Mode::OnDelay;
    let d0 = doorbells(&dev);
    let f4 = tiny(&dev, QueueId::GFX, 3);
    assert_eq!(doorbells(&dev), d0, "the first submission after the reset is held");
    dev.wait(f4, SECOND).unwrap();
    assert_eq!(doorbells(&dev), d0 + 1);
}

/// A random schedule of submissions (some waiting on another queue's
/// fence), clock jumps, queries, waits, flushes and engine runs, checked
/// against a shadow of what must hold whatever the order: a query or a
/// wait on a fence hands it to the hardware (the engines, run by hand,
/// then signal it); no queue ever holds `MAX_HELD` submissions after a
/// call returns; no more doorbells than submissions; every fence signals
/// once everything is flushed and run; the hang check never fires on
/// held work (the clock jumps past many batch windows, and past the
/// hang window, while work is held).
#[test]
fn random_schedules_keep_the_flush_rules() {
    for seed in 1..=8u64 {
        let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let gen = if seed % 2 == 0 { Generation::Gen1 } else { Generation::Gen2 };
        let mut r = rig(gen);
        let dev: Device<'_, Fake, 4> = r.device(cfg(WINDOW));
        // The engines run when the test says so, and when the driver
        // sleeps (waiting for an IB chunk), up to what was published.
        dev.platform().state().mode = Mode::OnDelay;
        let queues = [QueueId::GFX, QueueId::COMPUTE, QueueId::COPY];
        let mut fences: Vec<Fence> = Vec::new();
        for step in 0..300u64 {
            let q = queues[next(3) as usize];
            match next(10) {
                0..=4 => {
                    // A submission, a third of them after another queue's
                    // fence.
                    let waits: Vec<Fence> = match fences.len() {
                        n if n > 0 && next(3) == 0 => {
                            let w = fences[next(n as u64) as usize];
                            if w.queue() == q {
                                vec![]
                            } else {
                                vec![w]
                            }
                        }
                        _ => vec![],
                    };
                    let f = dev.submit(q, &waits, |cb| cb.timestamp(0x8030_0000 + 8 * (step % 64))).unwrap();
                    fences.push(f);
                }
                5 => dev.platform().state().now += next(3 * WINDOW),
                6 if !fences.is_empty() => {
                    let f = fences[next(fences.len() as u64) as usize];
                    let _ = dev.query(f).unwrap();
                    dev.platform().state().run_all();
                    // Run once more: a producer on another queue, handed
                    // over by the consumer's submission, may run after it.
                    dev.platform().state().run_all();
                    assert_eq!(dev.query(f), Ok(FenceStatus::Signalled), "seed {seed} step {step}: {f:?}");
                }
                7 => dev.flush(q).unwrap(),
                8 => {
                    // The engines run first: published work the test never
                    // runs would be an engine stuck for the hang check.
                    dev.platform().state().run_all();
                    dev.platform().state().run_all();
                    assert!(dev.service().is_none(), "seed {seed} step {step}: a hang");
                }
                _ => dev.platform().state().run_all(),
            }
            for q in queues {
                assert!(held_in_dump(&dev, q) < MAX_HELD, "seed {seed} step {step}: {q:?} over the limit");
            }
            let s = dev.stats();
            assert!(
                s.doorbells <= s.submissions,
                "seed {seed}: {} doorbells, {} submissions",
                s.doorbells,
                s.submissions
            );
        }
        dev.flush_all().unwrap();
        for _ in 0..3 {
            dev.platform().state().run_all();
        }
        for f in &fences {
            assert_eq!(dev.query(*f), Ok(FenceStatus::Signalled), "seed {seed}: {f:?} after flush_all");
        }
        assert_eq!(dev.stats().hangs, 0);
    }
}
