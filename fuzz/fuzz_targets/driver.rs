//! The driver (direct mode) on the scripted fake platform of the device
//! tests (`umd_core::platform::fake`: virtual time, engines that run only
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
//!
//! A first byte with bits 3 and 4 both set (no input of the mode above in
//! the seed corpus has them) selects the concurrent mode instead
//! (`concurrent`): two or three threads share one device, with the MMU on
//! and, on gen2, local memory, so residency moves race declared work.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;
use std::sync::Mutex;
use umd_core::platform::fake::{EngineFault, Fake, Mode};
use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::engine::MoveError;
use umd_core::engine::{BufferUse, Submit};
use umd_core::error::{FenceStatus, SubmitError, WaitError};
use umd_core::hw::Generation;
use umd_core::mem::{AllocError, BufferDesc, BufferHandle};
use umd_core::storage::DeviceStorage;
use umd_core::sync::{Fence, FenceError, QueueId};

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
    if first & 0x18 == 0x18 {
        concurrent(first, &data[1..]);
        return;
    }
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
                    if arg & 0x80 != 0 {
                        3u64 << k
                    } else {
                        1u64 << k
                    }
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
                    assert_eq!(
                        dev.buffer_stats(),
                        before,
                        "a refused alignment changed the buffer statistics"
                    );
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

/// Local memory of the concurrent mode's fake (gen2): room for a few of
/// its local buffers (4-64 KiB), so allocations and restores evict.
const LOCAL_BYTES: usize = 256 << 10;

/// Buffers a thread of the concurrent mode holds at most.
const OWN_MAX: usize = 12;

/// A buffer of one thread of the concurrent mode: only its owner writes,
/// copies and frees it (others may move it, if local).
struct Own {
    h: BufferHandle,
    va: u64,
    size: u64,
    local: bool,
    /// What its first word holds once every job that touched it has run
    /// (`None`: not written yet, or copied from such a buffer).
    value: Option<u32>,
    /// The jobs that touched it, with the owner's submission counter.
    users: Vec<(u64, Fence)>,
}

/// The shadow of memory the concurrent mode's threads share: live
/// buffers (GPU address, size) and freed ones with the fences of their
/// work.
#[derive(Default)]
struct Shadow {
    live: Vec<(BufferHandle, u64, u64)>,
    gated: Vec<(u64, u64, Vec<Fence>)>,
}

/// What the threads share besides the device.
struct Shared<'a, 'd> {
    dev: &'a Device<'d, Fake, 8>,
    shadow: Mutex<Shadow>,
    /// Local buffers any thread may move (their owners free them).
    movable: Mutex<Vec<BufferHandle>>,
    /// Each queue's last fence, for waits across threads.
    last: Mutex<[Option<Fence>; 3]>,
    /// The first final answer each fence gave.
    answers: Mutex<HashMap<Fence, Result<(), FenceError>>>,
}

impl Shared<'_, '_> {
    fn answered(&self, f: Fence, now: Result<(), FenceError>) {
        let mut a = self.answers.lock().unwrap();
        let first = *a.entry(f).or_insert(now);
        assert_eq!(first, now, "fence {f} changed its answer");
        assert_eq!(now, Ok(()), "fence {f} failed with no fault injected");
    }
}

/// Whether a submission of the concurrent mode may be refused so: for
/// want of room (IB chunks, ring, pending or wait slots), or a local
/// working set that does not fit. Nothing fails in this mode, so a
/// refusal for a failure (`DependencyFailed`, `HistoryFull`, `DeviceLost`)
/// or a stale buffer is a finding.
fn refusal_allowed(e: &SubmitError) -> bool {
    matches!(
        e,
        SubmitError::PoolEmpty
            | SubmitError::RingFull(_)
            | SubmitError::TooManyPending(_)
            | SubmitError::TooManyWaits { .. }
            | SubmitError::WorkingSetTooLarge { .. }
            | SubmitError::Platform(_)
    )
}

/// The concurrent mode: after the first byte, each pair of bytes (an
/// operation and its argument) goes to thread `i % n` (n = 2, or 3 with
/// bit 2 of the first byte), and the threads run their scripts at once on
/// one device (MMU on; on gen2 256 KiB of local memory; engines that run
/// when the driver sleeps, a doorbell yields the thread). Bit 0 picks the
/// generation, bit 1 batching, bits 5-7 the minimum residency window.
/// Operations (`op & 7`; queue `(op >> 3) & 3` mod 3; flag `op & 0x20`):
/// alloc (local with the flag: 4-64 KiB, else 4 B to 4 KiB, declared
/// tracking), free (also in flight), write a unique value to its first
/// word on a queue (declared; after the buffer's jobs on other queues,
/// and with the flag after another queue's last fence, whichever thread
/// emitted it), copy that word between two of the thread's buffers,
/// evict (flag) or restore any thread's local buffer, run the engines or
/// wait for one of its fences a short while. No fault is injected and
/// time passes only when the driver sleeps, so every submission the
/// driver takes must signal.
///
/// Checks, each independent of how the threads interleave: a new buffer
/// overlaps no live buffer and no freed one whose work may still run; no
/// submission refused for anything but room; no move fails for a copy
/// (`MoveError::Copy`); every fence signals and its answer never changes;
/// every buffer's first word holds, at the end, the value of the last job
/// that wrote it (read by the CPU, or for local buffers copied out by the
/// GPU first): a write lost to a move, or a job run on memory being
/// moved, shows there; no engine access met an unmapped address; then
/// every buffer, local page and DMA region is back.
fn concurrent(first: u8, script: &[u8]) {
    let gen = if first & 1 == 0 { Generation::Gen1 } else { Generation::Gen2 };
    let threads = if first & 4 == 0 { 2 } else { 3 };
    let fake = Fake::with_local_memory(gen, 4 << 20, LOCAL_BYTES);
    let mut storage: Box<Storage> = Box::default();
    let cfg = Config {
        ring_bytes: 4096,
        ib_chunk_bytes: 4096,
        use_irq: false,
        batching: first & 2 != 0,
        local_min_residency: u32::from(first >> 5),
        ..Config::DEFAULT
    };
    let mmu = MmuMode::Enabled { va_base: 1 << 32, va_size: 1 << 30, table_pages: 32 };
    let dev: Device<'_, Fake, 8> = Device::new(&fake, &mut storage, cfg, mmu).expect("device comes up");
    {
        let mut st = dev.platform().state();
        st.mode = Mode::OnDelay;
        st.doorbell_yields = true;
    }
    assert_eq!(dev.local_memory().is_some(), gen == Generation::Gen2, "local memory on gen2 only");
    let shared = Shared {
        dev: &dev,
        shadow: Mutex::new(Shadow::default()),
        movable: Mutex::new(Vec::new()),
        last: Mutex::new([None; 3]),
        answers: Mutex::new(HashMap::new()),
    };
    let pairs: Vec<(u8, u8)> = script.chunks(2).map(|c| (c[0], c.get(1).copied().unwrap_or(0))).collect();
    let results: Vec<(Vec<Own>, Vec<Fence>)> = std::thread::scope(|t| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let ops: Vec<(u8, u8)> = pairs.iter().skip(i).step_by(threads).copied().collect();
                let shared = &shared;
                t.spawn(move || worker(shared, i as u32, &ops))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a thread panicked")).collect()
    });
    // Every fence signals (the engines run whenever the driver sleeps).
    for (_, fences) in &results {
        for f in fences {
            match dev.wait(*f, 60_000_000_000) {
                Ok(()) => shared.answered(*f, Ok(())),
                Err(WaitError::Failed(e)) => shared.answered(*f, Err(e)),
                Err(e) => panic!("fence {f} lost: {e}"),
            }
        }
    }
    // Every buffer holds what its last writer wrote.
    let back = dev.alloc(&BufferDesc::new(4096).declared()).expect("read-back buffer");
    let back_va = dev.va(back).expect("va");
    for (owned, _) in &results {
        for o in owned {
            let Some(want) = o.value else { continue };
            let got = if o.local {
                let uses = [BufferUse::read(o.h), BufferUse::write(back)];
                let f = dev
                    .submit_with(&Submit::on(QueueId::GFX).using(&uses), |cb| cb.copy(o.va, back_va, 4))
                    .expect("copy-out");
                dev.wait(f, 60_000_000_000).expect("copy-out signals");
                dev.read_u32(back, 0).expect("read back")
            } else {
                dev.read_u32(o.h, 0).expect("read")
            };
            let r = if o.local { dev.residency(o.h).ok() } else { None };
            assert_eq!(
                got, want,
                "buffer at {:#x} ({} B, local {}, now {r:?}) lost its last write",
                o.va, o.size, o.local
            );
        }
    }
    let faults = fake.state().translation_faults.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(faults, 0, "an engine met an unmapped address");
    if std::env::var_os("DRIVER_FUZZ_STATS").is_some() {
        let s = dev.stats();
        eprintln!(
            "concurrent gen{} threads {threads}: {} fences, evictions {} restores {} deferred {} fallbacks {}",
            if gen == Generation::Gen1 { 1 } else { 2 },
            results.iter().map(|r| r.1.len()).sum::<usize>(),
            s.evictions,
            s.restores,
            s.restores_deferred,
            s.local_fallbacks
        );
    }
    dev.free(back).expect("free");
    for (owned, _) in results {
        for o in owned {
            dev.free(o.h).expect("free of a live buffer");
        }
    }
    for _ in 0..2 {
        dev.platform().state().run_all();
        let _ = dev.service();
    }
    let stats = dev.buffer_stats();
    assert_eq!((stats.live, stats.waiting), (0, 0), "buffers back once every fence passed");
    if let Some(lm) = dev.local_memory() {
        assert_eq!(lm.used, 0, "every local page back");
    }
    let report = dev.shutdown();
    assert_eq!(report.leaked_buffers, 0);
    assert_eq!(fake.state().allocs, 0, "every DMA region back");
}

/// One thread of the concurrent mode; returns its live buffers and the
/// fences of its submissions.
fn worker(sh: &Shared<'_, '_>, id: u32, ops: &[(u8, u8)]) -> (Vec<Own>, Vec<Fence>) {
    let dev = sh.dev;
    let mut own: Vec<Own> = Vec::new();
    let mut fences: Vec<Fence> = Vec::new();
    let mut counter = 0u64;
    let pending = |f: &Fence| dev.query(*f) == Ok(FenceStatus::Pending);
    for &(op, arg) in ops {
        let q = usize::from((op >> 3) & 3) % 3;
        let flag = op & 0x20 != 0;
        match op & 7 {
            0 | 1 => {
                if own.len() >= OWN_MAX {
                    continue;
                }
                let local = flag;
                let desc = if local {
                    BufferDesc::new(4096 * (1 + u64::from(arg % 16))).local()
                } else {
                    BufferDesc::new(4 + u64::from(arg) * 16).declared()
                };
                let Ok(h) = dev.alloc(&desc) else { continue };
                let va = dev.va(h).expect("va of a live buffer");
                let size = desc.size;
                {
                    let mut s = sh.shadow.lock().unwrap();
                    s.gated.retain(|(_, _, fs)| fs.iter().any(pending));
                    for (gva, gsize, _) in &s.gated {
                        assert!(
                            va + size <= *gva || gva + gsize <= va,
                            "memory of a freed buffer reused before its fence"
                        );
                    }
                    for (_, lva, lsize) in &s.live {
                        assert!(va + size <= *lva || lva + lsize <= va, "overlaps a live buffer");
                    }
                    s.live.push((h, va, size));
                }
                if local {
                    sh.movable.lock().unwrap().push(h);
                }
                own.push(Own { h, va, size, local, value: None, users: Vec::new() });
            }
            2 => {
                if own.is_empty() {
                    continue;
                }
                let o = own.swap_remove(usize::from(arg) % own.len());
                // Out of the shadow before the driver can hand the memory
                // out again.
                {
                    let mut s = sh.shadow.lock().unwrap();
                    s.live.retain(|(h, _, _)| *h != o.h);
                    s.gated.push((o.va, o.size, o.users.iter().map(|u| u.1).collect()));
                }
                sh.movable.lock().unwrap().retain(|h| *h != o.h);
                dev.free(o.h).expect("free of a live buffer");
            }
            3..=5 => {
                if own.is_empty() {
                    continue;
                }
                let dst = usize::from(arg) % own.len();
                // 5: a copy of another buffer's first word.
                let src = (op & 7 == 5).then(|| usize::from(arg >> 4) % own.len()).filter(|s| *s != dst);
                if op & 7 == 5 && src.is_none() {
                    continue;
                }
                // After the latest job on each other queue that touched
                // either buffer (the same queue runs in order).
                let mut latest: [Option<(u64, Fence)>; 3] = [None; 3];
                for i in [Some(dst), src].into_iter().flatten() {
                    for &(n, f) in &own[i].users {
                        let fq = usize::from(f.id.queue.0);
                        if fq != q && latest[fq].is_none_or(|(m, _)| n > m) {
                            latest[fq] = Some((n, f));
                        }
                    }
                }
                let mut waits: Vec<Fence> = latest.iter().flatten().map(|l| l.1).collect();
                if flag {
                    let other = (q + 1 + usize::from(arg & 1)) % 3;
                    if let Some(f) = sh.last.lock().unwrap()[other] {
                        waits.push(f);
                    }
                }
                counter += 1;
                let value = (id + 1) << 24 | (counter as u32 & 0xFF_FFFF);
                let mut uses = vec![BufferUse::write(own[dst].h)];
                if let Some(s) = src {
                    uses.push(BufferUse::read(own[s].h));
                }
                let dva = own[dst].va;
                let sva = src.map(|s| own[s].va);
                let r =
                    dev.submit_with(
                        &Submit::on(QueueId(q as u8)).after(&waits).using(&uses),
                        |cb| match sva {
                            Some(s) => cb.copy(s, dva, 4),
                            None => cb.write_data(dva, &[value]),
                        },
                    );
                match r {
                    Ok(f) => {
                        fences.push(f);
                        sh.last.lock().unwrap()[q] = Some(f);
                        own[dst].value = match src {
                            Some(s) => own[s].value,
                            None => Some(value),
                        };
                        own[dst].users.push((counter, f));
                        if let Some(s) = src {
                            own[s].users.push((counter, f));
                        }
                    }
                    Err(e) => assert!(refusal_allowed(&e), "submission refused: {e}"),
                }
            }
            6 => {
                let h = {
                    let m = sh.movable.lock().unwrap();
                    if m.is_empty() {
                        continue;
                    }
                    m[usize::from(arg) % m.len()]
                };
                let r = if flag { dev.evict(h) } else { dev.make_resident(h) };
                // Busy, not where the move starts, no room, freed by its
                // owner meanwhile, or no memory for the move: all fine.
                if let Err(MoveError::Copy(e)) = r {
                    panic!("a move's copy failed with no fault injected: {e}");
                }
            }
            _ => match arg & 3 {
                0 => dev.platform().state().run_all(),
                1 => dev.platform().state().run(usize::from(arg >> 2) % 3),
                _ => {
                    if let Some(f) = fences.get(usize::from(arg >> 2) % fences.len().max(1)) {
                        match dev.wait(*f, u64::from(arg) * 100_000) {
                            Ok(()) => sh.answered(*f, Ok(())),
                            Err(WaitError::Failed(e)) => sh.answered(*f, Err(e)),
                            Err(WaitError::Timeout) => {}
                            Err(e) => panic!("wait on a submitted fence: {e}"),
                        }
                    }
                }
            },
        }
    }
    (own, fences)
}
