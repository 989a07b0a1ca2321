//! The driver (direct mode) on the scripted fake platform of the device
//! tests (`umd-core/tests/support`: virtual time, engines that run only
//! when told), driven by operation sequences from the fuzzer's bytes:
//! alloc, free (also of buffers in flight, and stale handles), submit on
//! any queue (writing a live buffer, declared or not, optionally after
//! another queue's fence), run one engine or all, query and short waits,
//! a stuck engine, an injected fault, time passing with the hang check.
//! Invariants: a new buffer never overlaps the memory of a freed one whose
//! work may still run (no reuse before the fence) nor a live one, and sits
//! at the alignment asked for (128 B by default); an alignment over 2 MiB
//! or not a power of two is refused (`BadAlignment`) with the buffer
//! statistics unchanged; the statistics count exactly the live buffers;
//! bad handles get typed errors; at the end, with the faults cleared, every
//! submitted fence is signalled or failed with a reason (none lost), an
//! answer never changes (signalled stays signalled, a failure keeps its
//! first reason) until a failure history merges ranges, and after that a
//! failure never turns into success; once the engines have drained
//! (poisoned work still runs) every buffer and every DMA page of the
//! platform is back.
#![no_main]

#[allow(dead_code, unused_imports)]
#[path = "../../umd-core/tests/support/mod.rs"]
mod support;

use libfuzzer_sys::fuzz_target;
use support::{EngineFault, Fake, Mode};
use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::engine::{BufferUse, Submit};
use umd_core::hw::Generation;
use umd_core::mem::{AllocError, BufferDesc, BufferHandle};
use umd_core::queue::{FenceStatus, SubmitError, WaitError};
use umd_core::storage::DeviceStorage;
use umd_core::sync::{Fence, FenceError, QueueId};
use std::collections::HashMap;

type Storage = DeviceStorage<256, 256, 64, 256>;

struct Live {
    h: BufferHandle,
    va: u64,
    size: u64,
    /// Fences of work that writes it.
    users: Vec<Fence>,
}

fuzz_target!(|data: &[u8]| {
    let mut it = data.iter().copied();
    let Some(first) = it.next() else { return };
    let gen = if first & 1 == 0 { Generation::Gen1 } else { Generation::Gen2 };
    let fake = Fake::new(gen, 4 << 20);
    let mut storage: Box<Storage> = Box::default();
    let cfg = Config {
        ring_bytes: 4096,
        ib_chunk_bytes: 4096,
        use_irq: false,
        batching: first & 2 != 0,
        ..Config::DEFAULT
    };
    let dev: Device<'_, Fake, 8> =
        Device::new(&fake, &mut storage, cfg, MmuMode::Bypass).expect("device comes up");
    dev.platform().state().mode = Mode::Manual;
    let mut live: Vec<Live> = Vec::new();
    // Freed buffers whose work may still run: (va, size, fences).
    let mut gated: Vec<(u64, u64, Vec<Fence>)> = Vec::new();
    let mut stale: Vec<BufferHandle> = Vec::new();
    let mut fences: Vec<Fence> = Vec::new();
    let mut last: [Option<Fence>; 3] = [None; 3];
    let pending = |f: &Fence| dev.query(*f) == Ok(FenceStatus::Pending);
    // The first final answer each fence gave: Ok(()) or its failure.
    let mut answers: HashMap<Fence, Result<(), FenceError>> = HashMap::new();
    // Answers are exact and final: a queue's failure history never merges
    // ranges (it admits work only while every failure fits,
    // `umd_core::sync::history`), and `history_merges` stays 0.
    let merged = || dev.stats().history_merges > 0;
    let mut answered = |f: Fence, now: Result<(), FenceError>, merged: bool| {
        let first = *answers.entry(f).or_insert(now);
        assert!(!merged, "a failure history merged ranges");
        assert_eq!(first, now, "fence {f} changed its answer");
    };
    while let Some(op) = it.next() {
        let arg = it.next().unwrap_or(0);
        match op % 10 {
            0 | 1 => {
                let size = 4 + u64::from(arg) * 64 * (1 + u64::from(op >> 4));
                // Half the allocations ask for an alignment: 128 B to
                // 4 MiB (over 2 MiB is refused), or not a power of two.
                let align = (op & 0x08 != 0).then(|| {
                    let k = 7 + u32::from(arg % 16);
                    if arg & 0x80 != 0 { 3u64 << k } else { 1u64 << k }
                });
                let before = dev.buffer_stats();
                let r = match align {
                    Some(a) => dev.alloc(&BufferDesc::new(size).align(a)),
                    None => dev.alloc_buffer(size),
                };
                let legal = align.is_none_or(|a| a.is_power_of_two() && a <= 2 << 20);
                if !legal {
                    assert!(
                        matches!(r, Err(AllocError::BadAlignment { .. })),
                        "alignment {align:?} answered {r:?}"
                    );
                    assert_eq!(dev.buffer_stats(), before, "a refused alignment changed the buffer statistics");
                }
                if let Ok(h) = r {
                    let va = dev.va(h).expect("va of a live buffer");
                    let want = align.unwrap_or(128);
                    assert_eq!(va % want, 0, "buffer at {va:#x} not aligned to {want:#x}");
                    gated.retain(|(_, _, fs)| fs.iter().any(pending));
                    for (gva, gsize, _) in &gated {
                        assert!(
                            va + size <= *gva || gva + gsize <= va,
                            "memory of a freed buffer reused before its fence"
                        );
                    }
                    for l in &live {
                        assert!(va + size <= l.va || l.va + l.size <= va, "overlaps a live buffer");
                    }
                    live.push(Live { h, va, size, users: Vec::new() });
                }
                assert_eq!(dev.buffer_stats().live, live.len() as u64, "live buffers counted wrong");
            }
            2 => {
                if !live.is_empty() {
                    let l = live.swap_remove(usize::from(arg) % live.len());
                    dev.free(l.h).expect("free of a live buffer");
                    gated.push((l.va, l.size, l.users));
                    stale.push(l.h);
                    assert_eq!(dev.buffer_stats().live, live.len() as u64, "live buffers counted wrong");
                }
            }
            3 => {
                if let Some(h) = stale.get(usize::from(arg) % stale.len().max(1)) {
                    assert!(dev.free(*h).is_err(), "a stale handle is refused");
                    assert!(dev.va(*h).is_err(), "a stale handle is refused");
                }
            }
            4 | 5 => {
                let q = usize::from(arg % 3);
                let other = usize::from((arg >> 2) % 3);
                let waits: Vec<Fence> =
                    if other != q { last[other].into_iter().collect() } else { Vec::new() };
                let target = if live.is_empty() { None } else { Some(usize::from(arg >> 4) % live.len()) };
                let declared = op & 0x80 != 0;
                let uses: Vec<BufferUse> =
                    target.filter(|_| declared).map(|i| BufferUse::write(live[i].h)).into_iter().collect();
                let dst = target.map(|i| live[i].va);
                let r =
                    dev.submit_with(
                        &Submit::on(QueueId(q as u8)).after(&waits).using(&uses),
                        |cb| match dst {
                            Some(d) => cb.write_data(d, &[u32::from(op)]),
                            None => cb.barrier(),
                        },
                    );
                if let Ok(f) = r {
                    fences.push(f);
                    last[q] = Some(f);
                    if let Some(i) = target {
                        live[i].users.push(f);
                    }
                }
            }
            6 => {
                let e = usize::from(arg % 4);
                let mut st = dev.platform().state();
                if e == 3 {
                    st.run_all();
                } else {
                    st.run(e);
                }
            }
            7 => {
                if let Some(f) = fences.get(usize::from(arg) % fences.len().max(1)) {
                    match dev.wait(*f, u64::from(arg) * 1_000_000) {
                        Ok(()) => answered(*f, Ok(()), merged()),
                        Err(WaitError::Failed(e)) => answered(*f, Err(e), merged()),
                        Err(WaitError::Timeout) => {}
                        Err(e) => panic!("wait on a submitted fence: {e}"),
                    }
                }
            }
            8 => {
                let e = usize::from(arg % 3);
                let mut st = dev.platform().state();
                match arg >> 6 {
                    0 => st.engines[e].fault = EngineFault::Stuck,
                    1 => st.engines[e].fault = EngineFault::None,
                    2 => st.inject_fault(e, 1, 0, 0x1_0000_0000),
                    _ => st.engines[e].fault = EngineFault::Spinning,
                }
            }
            _ => {
                dev.platform().state().now += u64::from(arg) * 50_000_000;
                let _ = dev.service();
            }
        }
    }
    // Heal and resolve everything.
    {
        let mut st = dev.platform().state();
        for e in st.engines.iter_mut() {
            e.fault = EngineFault::None;
        }
        st.mode = Mode::OnDelay;
        st.run_all();
    }
    for f in &fences {
        match dev.wait(*f, 60_000_000_000) {
            Ok(()) => answered(*f, Ok(()), merged()),
            Err(WaitError::Failed(e)) => answered(*f, Err(e), merged()),
            Err(e) => panic!("fence {f} lost: {e}"),
        }
    }
    for l in live.drain(..) {
        dev.free(l.h).expect("free");
    }
    let _ = dev.service();
    // A failed fence is answered at once, but work poisoned through a
    // dependency still runs on the GPU, and the memory it may touch stays
    // out of circulation until it has: let the engines drain (the re-primed
    // fence slots release the waiters; a waiter behind an engine halted
    // again is reset by the hang check once the window has passed), then
    // every free must be released.
    for _ in 0..4 {
        dev.platform().state().run_all();
        dev.platform().state().now += 10_000_000_000;
        let _ = dev.service();
        for q in 0..3u8 {
            if let Some(f) = dev.last_emitted(QueueId(q)) {
                let _ = dev.query(f);
            }
        }
    }
    // Every fence has passed and the service passes above took back every
    // free (completion passes reclaim a bounded number at a time; a
    // service pass takes back the rest without waiting for another
    // completion).
    let stats = dev.buffer_stats();
    assert_eq!((stats.live, stats.waiting), (0, 0), "buffers back once every fence passed");
    // The healed device takes work on every queue (an engine that faulted
    // while idle was reset by the service passes above, not left for this
    // job to find).
    dev.platform().state().mode = Mode::OnDoorbell;
    for q in 0..3u8 {
        // A queue whose history filled up with failures takes work once
        // they are acknowledged (every fence has passed by now).
        let f = match dev.submit(QueueId(q), &[], |cb| cb.barrier()) {
            Err(SubmitError::HistoryFull(_)) => {
                let last = dev.last_emitted(QueueId(q)).expect("a full history has fences");
                dev.acknowledge_failures(last).expect("its own fence");
                dev.submit(QueueId(q), &[], |cb| cb.barrier())
            }
            r => r,
        }
        .expect("the healed device takes work");
        match dev.wait(f, 60_000_000_000) {
            Ok(()) => {}
            Err(e) => panic!("probe on healed q{q}: {e}"),
        }
    }
    for f in &fences {
        match dev.query(*f) {
            Ok(FenceStatus::Signalled) => answered(*f, Ok(()), merged()),
            Ok(FenceStatus::Failed(e)) => answered(*f, Err(e), merged()),
            other => panic!("fence {f} answered before, now {other:?}"),
        }
    }
    let report = dev.shutdown();
    assert_eq!(report.leaked_buffers, 0);
    assert_eq!(fake.state().allocs, 0, "every DMA region back");
});
