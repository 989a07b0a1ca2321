//! Submission: what a command stream does once it lands (copies, fills,
//! writes, fences in order), the ring and its wrap-around, the IB pool
//! (batching, exhaustion by policy), bad input to `submit`, several
//! threads on several queues, and the trace of submissions.

use super::{names_its_parameter, rig, small_cfg, with_device, Storage};
use umd_core::config::{Config, PoolExhaustion};
use umd_core::direct::{Device, MmuMode};
use umd_core::engine::Submit;
use umd_core::error::{FenceStatus, SubmitError, WaitError};
use umd_core::hw::Generation;
use umd_core::platform::fake::{Fake, Mode};
use umd_core::storage::Limit;
use umd_core::sync::{Fence, FenceId, QueueId};

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
fn pool_exhaustion_errors_or_waits_by_policy() {
    // Two chunks, no batching: the third submission needs a chunk back.
    let cfg = Config { batching: false, pool_exhaustion: PoolExhaustion::Error, ..small_cfg() };
    let mut rig_dev = rig(Generation::Gen2);
    let dev: Device<'_, Fake, 2> = rig_dev.device(cfg);
    dev.platform().state().mode = Mode::Manual;
    let a = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
    let _b = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0008)).unwrap();
    assert_eq!(dev.pool_stats().in_flight, 2);
    let (emitted, pool) = (dev.last_emitted(QueueId::GFX), dev.pool_stats());
    let err = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0010)).unwrap_err();
    assert_eq!(err, SubmitError::PoolEmpty);
    names_its_parameter(&err, err.limit(), Limit::IbChunks, "Device's CHUNKS");
    assert_eq!(
        (dev.last_emitted(QueueId::GFX), dev.pool_stats()),
        (emitted, pool),
        "nothing changed on error"
    );
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

#[test]
fn four_threads_three_queues_no_lost_fence() {
    with_device::<16>(
        Generation::Gen2,
        Config { ib_chunk_bytes: 4096, ring_bytes: 16384, ..small_cfg() },
        MmuMode::Bypass,
        |dev| {
            dev.platform().state().mode = Mode::OnDoorbell;
            let buf = dev.alloc_buffer(4 * 4 * 500).unwrap();
            let b = dev.va(buf).unwrap();
            std::thread::scope(|s| {
                for t in 0..4u64 {
                    s.spawn(move || {
                        let mut last: Option<Fence> = None;
                        for j in 0..500u64 {
                            let q = QueueId(((t + j) % 3) as u8);
                            let waits: Vec<Fence> = last.into_iter().filter(|f| f.queue() != q).collect();
                            let word = t * 500 + j;
                            let f = dev
                                .submit(q, &waits, |cb| cb.write_data(b + 4 * word, &[word as u32 + 1]))
                                .unwrap();
                            last = Some(f);
                            if j % 100 == 0 {
                                dev.wait(f, 10_000_000_000).unwrap();
                            }
                        }
                        dev.wait(last.unwrap(), 10_000_000_000).unwrap();
                    });
                }
            });
            for w in 0..2000u64 {
                assert_eq!(dev.read_u32(buf, w), Ok(w as u32 + 1), "job {w}");
            }
            assert_eq!(dev.stats().submissions, 2000);
            let s = dev.stats();
            assert_eq!(s.fences_signalled, 2000, "every fence seen once");
            assert_eq!((s.hangs, s.resets), (0, 0));
        },
    );
}

#[test]
fn fences_from_before_and_after_work_are_told_apart() {
    with_device::<4>(Generation::Gen1, small_cfg(), MmuMode::Bypass, |dev| {
        let f = dev.submit(QueueId::GFX, &[], |cb| cb.barrier()).unwrap();
        dev.wait(f, 1_000_000_000).unwrap();
        let id = FenceId { queue: QueueId::GFX, seqno: f.seqno() };
        assert_eq!(f.id, id);
        assert_eq!(dev.query(f.later(1)), Err(WaitError::NotSubmitted(f.later(1))));
    });
}

/// Whether this build records the trace (feature `trace`).
const TRACE: bool = cfg!(feature = "trace");

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

#[test]
fn the_trace_records_only_when_built_in() {
    let fake = Fake::new(Generation::Gen2, 4 << 20);
    let mut storage: Box<Storage> = Box::default();
    let dev: Device<'_, Fake, 4> =
        Device::new(&fake, &mut storage, small_cfg(), MmuMode::Bypass).expect("device comes up");
    for i in 0..3u64 {
        let f = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0000 + 8 * i)).unwrap();
        dev.wait(f, 1_000_000_000).unwrap();
    }
    let n = dev.trace().iter().count();
    let mut json = String::new();
    dev.trace().write_chrome_json(&mut json).unwrap();
    assert!(json.starts_with("{\"displayTimeUnit\"") && json.ends_with("}}"), "{json}");
    if TRACE {
        assert!(n >= 12, "{n} events");
        assert!(json.contains("\"submit\""), "{json}");
    } else {
        assert_eq!(n, 0);
        assert!(!json.contains("\"submit\""), "{json}");
    }
    assert_eq!(dev.stats().submissions, 3);
}
