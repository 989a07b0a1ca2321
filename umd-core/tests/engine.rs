//! The shared engine's lifecycle rules on the scripted fake (virtual time,
//! so hang windows pass at once): buffers freed under in-flight or hung
//! work, handles that can not dangle or cross devices, every allocation
//! failure named, a failure history that survives thousands of resets,
//! failures that propagate, waits before signal that are not hangs, full
//! dependency tables, page-table cache maintenance, and several threads.

mod support;

#[cfg(feature = "mmu")]
use support::MEM_BASE;
use support::{EngineFault, Fake, Mode};
use umd_core::config::{Config, HangConfig};
use umd_core::debug::HangReason;
use umd_core::direct::{Device, MmuMode};
use umd_core::engine::{BufferUse, Submit};
use umd_core::error::{FenceStatus, SubmitError, WaitError};
use umd_core::hw::Generation;
#[cfg(feature = "mmu")]
use umd_core::mem::SizeClass;
use umd_core::mem::{AllocError, BufferDesc, BufferError, BufferHandle};
use umd_core::storage::DeviceStorage;
use umd_core::sync::{Cause, Fence, FenceError, FenceId, QueueId};

fn cfg() -> Config {
    Config { ring_bytes: 4096, ib_chunk_bytes: 4096, use_irq: false, ..Config::DEFAULT }
}

type Storage = DeviceStorage<256, 256, 64, 256>;

fn with_device<const C: usize>(
    gen: Generation,
    cfg: Config,
    mmu: MmuMode,
    f: impl FnOnce(&Device<'_, Fake, C>),
) {
    let fake = Fake::new(gen, 8 << 20);
    let mut storage: Box<Storage> = Box::default();
    let dev = Device::<Fake, C>::new(&fake, &mut storage, cfg, mmu).expect("device comes up");
    f(&dev);
}

#[test]
fn a_buffer_freed_under_in_flight_work_keeps_its_address_until_the_fence() {
    with_device::<4>(Generation::Gen2, cfg(), MmuMode::Bypass, |dev| {
        dev.platform().state().mode = Mode::Manual;
        let a = dev.alloc_buffer(4096).unwrap();
        let va = dev.va(a).unwrap();
        let f = dev.submit(QueueId::COPY, &[], |cb| cb.copy(va, va + 2048, 64)).unwrap();
        dev.free(a).unwrap();
        assert_eq!(dev.buffer_stats().waiting, 1);
        for _ in 0..8 {
            let b = dev.alloc_buffer(4096).unwrap();
            assert_ne!(dev.va(b).unwrap(), va, "reused under the in-flight copy");
        }
        assert_eq!(dev.frees_waiting_on(QueueId::COPY), 1);
        dev.platform().state().run_all();
        dev.wait(f, 1_000_000_000).unwrap();
        assert_eq!(dev.buffer_stats().waiting, 0, "released once the fence signalled");
    });
}

#[test]
fn declared_use_gates_only_on_the_submissions_that_declared_it() {
    with_device::<4>(Generation::Gen1, cfg(), MmuMode::Bypass, |dev| {
        dev.platform().state().mode = Mode::Manual;
        let busy = dev.alloc(&BufferDesc::new(256).declared()).unwrap();
        let idle = dev.alloc(&BufferDesc::new(256).declared()).unwrap();
        let va = dev.va(busy).unwrap();
        let f = dev
            .submit_with(&Submit::on(QueueId::GFX).using(&[BufferUse::write(busy)]), |cb| {
                cb.write_data(va, &[1])
            })
            .unwrap();
        // `idle` was never declared: freed at once although GFX is busy.
        dev.free(idle).unwrap();
        assert_eq!(dev.buffer_stats().waiting, 0);
        dev.free(busy).unwrap();
        assert_eq!(dev.buffer_stats().waiting, 1);
        dev.platform().state().run(0);
        dev.wait(f, 1_000_000_000).unwrap();
        assert_eq!(dev.buffer_stats().waiting, 0);
        // A stale declared buffer refuses the submission before the GPU.
        let doorbells = dev.platform().state().doorbells;
        assert_eq!(
            dev.submit_with(&Submit::on(QueueId::GFX).using(&[BufferUse::read(busy)]), |cb| cb.barrier()),
            Err(SubmitError::Buffer(BufferError::Stale))
        );
        assert_eq!(dev.platform().state().doorbells, doorbells);
    });
}

#[test]
fn a_free_while_the_queue_is_hung_is_reclaimed_after_the_reset_not_before() {
    with_device::<4>(Generation::Gen2, cfg(), MmuMode::Bypass, |dev| {
        dev.platform().state().engines[1].fault = EngineFault::Stuck;
        let a = dev.alloc(&BufferDesc::new(4096).declared()).unwrap();
        let va = dev.va(a).unwrap();
        let f = dev
            .submit_with(&Submit::on(QueueId::COMPUTE).using(&[BufferUse::read(a)]), |cb| cb.copy(va, va, 64))
            .unwrap();
        dev.free(a).unwrap();
        // Not reclaimed while the queue is stuck (a query does not wait).
        assert_eq!(dev.query(f), Ok(FenceStatus::Pending));
        assert_eq!(dev.buffer_stats().waiting, 1);
        let b = dev.alloc(&BufferDesc::new(4096).declared()).unwrap();
        assert_ne!(dev.va(b).unwrap(), va);
        // The hang check resets the queue; the engine is idle: memory back.
        assert_eq!(dev.wait(f, 10_000_000_000), Err(WaitError::Failed(FenceError::DeviceHung)));
        assert_eq!(dev.buffer_stats().waiting, 0);
    });
}

#[test]
fn device_loss_keeps_freed_memory_until_teardown() {
    let fake = Fake::new(Generation::Gen2, 8 << 20);
    let mut storage: Box<Storage> = Box::default();
    let dev = Device::<Fake, 4>::new(&fake, &mut storage, cfg(), MmuMode::Bypass).unwrap();
    fake.state().mode = Mode::Manual;
    let a = dev.alloc_buffer(8192).unwrap();
    let va = dev.va(a).unwrap();
    let f = dev.submit(QueueId::COPY, &[], |cb| cb.fill(va, 64, 1)).unwrap();
    fake.state().lost = true;
    assert_eq!(dev.wait(f, 1_000_000_000), Err(WaitError::Failed(FenceError::DeviceLost)));
    dev.free(a).unwrap();
    assert_eq!(dev.buffer_stats().waiting, 1, "never reused while the device may still write it");
    assert_eq!(dev.alloc_buffer(8192), Err(AllocError::DeviceLost));
    let report = dev.shutdown();
    assert_eq!(report.released_waiting, 1);
    assert_eq!(fake.state().allocs, 0);
}

#[test]
fn handles_cannot_dangle_or_cross_devices() {
    let (fa, fb) = (Fake::new(Generation::Gen1, 8 << 20), Fake::new(Generation::Gen1, 8 << 20));
    let (mut sa, mut sb): (Box<Storage>, Box<Storage>) = (Box::default(), Box::default());
    let a = Device::<Fake, 4>::new(&fa, &mut sa, cfg(), MmuMode::Bypass).unwrap();
    let b = Device::<Fake, 4>::new(&fb, &mut sb, cfg(), MmuMode::Bypass).unwrap();
    assert_ne!(a.id(), b.id());
    let ha = a.alloc_buffer(256).unwrap();
    let hb = b.alloc_buffer(256).unwrap();
    // A handle of another device: refused, nothing changes on either.
    assert_eq!(b.free(ha), Err(BufferError::ForeignDevice { handle: a.id(), device: b.id() }));
    assert!(matches!(b.read_u32(ha, 0), Err(BufferError::ForeignDevice { .. })));
    assert_eq!(a.buffer_stats().live, 1);
    assert_eq!(b.buffer_stats().live, 1);
    // A fence of another device.
    let fence_a = a.submit(QueueId::GFX, &[], |cb| cb.barrier()).unwrap();
    assert_eq!(
        b.submit(QueueId::GFX, &[fence_a], |cb| cb.barrier()),
        Err(SubmitError::ForeignFence(fence_a))
    );
    assert_eq!(b.wait(fence_a, 0), Err(WaitError::ForeignFence(fence_a)));
    // Forged handles.
    let (dev_id, index, gen) = hb.into_raw();
    assert_eq!(b.free(BufferHandle::from_raw(dev_id, index + 100, 1)), Err(BufferError::Unknown));
    assert_eq!(b.free(BufferHandle::from_raw(dev_id, index, gen + 2)), Err(BufferError::Unknown));
    assert_eq!(b.free(BufferHandle::from_raw(dev_id, index, 0)), Err(BufferError::Unknown));
    // Use after free and double free.
    b.free(hb).unwrap();
    assert_eq!(b.free(hb), Err(BufferError::Stale));
    assert_eq!(b.read_u32(hb, 0), Err(BufferError::Stale));
    assert_eq!(b.write(hb, 0, &[1]), Err(BufferError::Stale));
    assert!(matches!(b.map(hb), Err(BufferError::Stale)));
    // The slot is reused by a new buffer; the old handle still can not
    // reach it.
    let hb2 = b.alloc_buffer(256).unwrap();
    assert_eq!(hb2.into_raw().1, index);
    assert_eq!(b.read_u32(hb, 0), Err(BufferError::Stale));
    b.free(hb2).unwrap();
    a.free(ha).unwrap();
}

#[test]
fn cpu_access_is_checked_and_exclusive_while_mapped() {
    with_device::<4>(Generation::Gen2, cfg(), MmuMode::Bypass, |dev| {
        let h = dev.alloc_buffer(1000).unwrap();
        assert_eq!(dev.read_u32(h, 0), Ok(0), "new memory is zeroed");
        {
            let mut m = dev.map(h).unwrap();
            assert_eq!(m.bytes().len(), 1000);
            m.words_mut()[3] = 0xC0DE;
            assert!(matches!(dev.map(h), Err(BufferError::Mapped)));
            assert_eq!(dev.free(h), Err(BufferError::Mapped));
            assert_eq!(dev.write(h, 0, &[1]), Err(BufferError::Mapped));
        }
        // Dropping the guard cleaned the CPU cache for the GPU.
        assert_eq!(dev.read_u32(h, 3), Ok(0xC0DE));
        assert_eq!(
            dev.read(h, 998, &mut [0u8; 4]),
            Err(BufferError::OutOfRange { offset: 998, len: 4, size: 1000 })
        );
        assert_eq!(
            dev.write(h, u64::MAX, &[1]),
            Err(BufferError::OutOfRange { offset: u64::MAX, len: 1, size: 1000 })
        );
        let dev_only = dev.alloc(&BufferDesc::new(4096).device_only()).unwrap();
        assert!(matches!(dev.map(dev_only), Err(BufferError::NoCpuAccess)));
        assert_eq!(dev.read_u32(dev_only, 0), Err(BufferError::NoCpuAccess));
        dev.free(dev_only).unwrap();
        dev.free(h).unwrap();
    });
}

/// Found by the `driver` fuzz target: an allocation took back the frees
/// whose fences had passed before it looked at the request, so a refused
/// request changed the buffer statistics. A bad request is now refused
/// before anything is touched.
#[test]
fn a_refused_request_leaves_the_buffer_statistics_as_they_were() {
    with_device::<4>(Generation::Gen2, cfg(), MmuMode::Bypass, |dev| {
        dev.platform().state().mode = Mode::Manual;
        let h = dev.alloc_buffer(64).unwrap();
        let va = dev.va(h).unwrap();
        dev.submit(QueueId::GFX, &[], |cb| cb.write_data(va, &[1])).unwrap();
        dev.free(h).unwrap();
        // The fence passes; nothing has looked at it yet.
        dev.platform().state().run_all();
        let before = dev.buffer_stats();
        assert_eq!(before.waiting, 1);
        for bad in [BufferDesc::new(0), BufferDesc::new(64).align(3), BufferDesc::new(64).align(4 << 20)] {
            assert!(dev.alloc(&bad).is_err(), "{bad:?} accepted");
            assert_eq!(dev.buffer_stats(), before, "{bad:?} was refused but changed the statistics");
        }
        // A good request takes the free back first.
        let h = dev.alloc_buffer(64).unwrap();
        assert_eq!(dev.buffer_stats().waiting, 0);
        dev.free(h).unwrap();
    });
}

// The GPU MMU and its VA allocator (feature `mmu`).
#[cfg(feature = "mmu")]
#[test]
fn every_allocation_failure_names_its_cause() {
    // Bad requests.
    with_device::<4>(Generation::Gen2, cfg(), MmuMode::DEFAULT, |dev| {
        assert_eq!(dev.alloc_buffer(0), Err(AllocError::ZeroSize));
        assert_eq!(dev.alloc(&BufferDesc::new(64).align(3)), Err(AllocError::BadAlignment { align: 3 }));
        assert_eq!(
            dev.alloc(&BufferDesc::new(64).align(4 << 20)),
            Err(AllocError::BadAlignment { align: 4 << 20 })
        );
        // Beyond the 4 GiB arena.
        assert_eq!(
            dev.alloc_buffer(8 << 30),
            Err(AllocError::PlatformMemory { class: SizeClass::Large, len: 8 << 30 })
        );
        // Beyond the platform's memory (8 MiB fake).
        assert!(matches!(
            dev.alloc_buffer(16 << 20),
            Err(AllocError::PlatformMemory { class: SizeClass::Large, .. })
        ));
        // Alignment up to 2 MiB works with the MMU on.
        let h = dev.alloc(&BufferDesc::new(4096).align(2 << 20)).unwrap();
        assert_eq!(dev.va(h).unwrap() % (2 << 20), 0);
        dev.free(h).unwrap();
        assert_eq!(dev.buffer_stats().live, 0, "nothing changed on error");
    });
    // The handle table.
    let fake = Fake::new(Generation::Gen2, 8 << 20);
    let mut small: Box<DeviceStorage<4, 256, 64, 16>> = Box::default();
    let dev = Device::<Fake, 4>::new(&fake, &mut small, cfg(), MmuMode::Bypass).unwrap();
    let hs: Vec<_> = (0..4).map(|_| dev.alloc_buffer(64).unwrap()).collect();
    assert_eq!(dev.alloc_buffer(64), Err(AllocError::TableFull { capacity: 4 }));
    hs.into_iter().for_each(|h| dev.free(h).unwrap());
    drop(dev);
    // Slab descriptors of the small and medium classes.
    let mut few_slabs: Box<DeviceStorage<256, 256, 2, 16>> = Box::default();
    let dev = Device::<Fake, 4>::new(&fake, &mut few_slabs, cfg(), MmuMode::Bypass).unwrap();
    let a = dev.alloc_buffer(64).unwrap();
    let b = dev.alloc_buffer(2048).unwrap();
    assert_eq!(dev.alloc_buffer(300), Err(AllocError::SlabCapacity { class: SizeClass::Small }));
    assert_eq!(dev.alloc_buffer(9000), Err(AllocError::SlabCapacity { class: SizeClass::Medium }));
    dev.free(a).unwrap();
    dev.free(b).unwrap();
    drop(dev);
    // GPU VA nodes.
    let mut few_nodes: Box<DeviceStorage<256, 8, 64, 16>> = Box::default();
    let dev = Device::<Fake, 4>::new(&fake, &mut few_nodes, cfg(), MmuMode::DEFAULT).unwrap();
    let mut got = Vec::new();
    let err = loop {
        match dev.alloc_buffer(100_000) {
            Ok(h) => got.push(h),
            Err(e) => break e,
        }
    };
    assert_eq!(err, AllocError::VaNodes);
    assert!(!got.is_empty());
    got.into_iter().for_each(|h| dev.free(h).unwrap());
    drop(dev);
    assert_eq!(fake.state().allocs, 0);
}

// The GPU MMU and its VA allocator (feature `mmu`).
#[cfg(feature = "mmu")]
#[test]
fn small_buffers_share_slabs_mapped_once() {
    with_device::<4>(Generation::Gen2, cfg(), MmuMode::DEFAULT, |dev| {
        let before = dev.stats();
        let mut hs = vec![dev.alloc_buffer(64).unwrap()];
        let first = dev.stats();
        assert!(first.pte_writes > before.pte_writes, "the slab was mapped");
        hs.extend((0..63).map(|_| dev.alloc_buffer(64).unwrap()));
        let after = dev.stats();
        let s = dev.buffer_stats();
        assert_eq!(s.pool.blocks_acquired, 1, "64 small buffers from one slab");
        assert_eq!(after.pte_writes, first.pte_writes, "63 more buffers wrote no page-table entry");
        assert_eq!(after.tlb_invalidations, before.tlb_invalidations, "no invalidation to map");
        hs.into_iter().for_each(|h| dev.free(h).unwrap());
        // The empty slab is kept for the next allocation: no remap.
        let h = dev.alloc_buffer(64).unwrap();
        assert_eq!(dev.stats().pte_writes, after.pte_writes);
        dev.free(h).unwrap();
        assert_eq!(dev.trim(), 8192);
        assert!(dev.stats().tlb_invalidations > before.tlb_invalidations, "unmapping invalidates the TLB");
    });
}

// The GPU MMU and its VA allocator (feature `mmu`).
#[cfg(feature = "mmu")]
#[test]
fn an_allocation_short_of_memory_takes_back_kept_slabs_first() {
    with_device::<4>(Generation::Gen2, cfg(), MmuMode::DEFAULT, |dev| {
        // An empty slab kept for the next small allocation.
        let small = dev.alloc_buffer(64).unwrap();
        dev.free(small).unwrap();
        let mut hs = Vec::new();
        let err = loop {
            match dev.alloc_buffer(256 * 1024) {
                Ok(h) => hs.push(h),
                Err(e) => break e,
            }
        };
        assert!(matches!(err, AllocError::PlatformMemory { .. }), "{err}");
        assert!(!hs.is_empty());
        assert_eq!(dev.trim(), 0, "the kept slab went back before the allocation failed");
        hs.into_iter().for_each(|h| dev.free(h).unwrap());
    });
}

// The GPU MMU and its VA allocator (feature `mmu`).
#[cfg(feature = "mmu")]
#[test]
fn page_table_writes_are_cleaned_before_the_gpu_can_walk_them() {
    let fake = Fake::new(Generation::Gen2, 8 << 20);
    let mut storage: Box<Storage> = Box::default();
    let dev = Device::<Fake, 4>::new(&fake, &mut storage, cfg(), MmuMode::DEFAULT).unwrap();
    fake.state().cleaned.clear();
    let h = dev.alloc_buffer(64 * 1024).unwrap();
    // The root table is the first page of the table region, which starts
    // at the fake's first page: every table page written was cleaned.
    let cleaned = fake.state().cleaned.clone();
    assert!(
        cleaned.iter().any(|(a, l)| *a >= MEM_BASE && *l >= 8),
        "no table entry was cleaned: {cleaned:?}"
    );
    fake.state().cleaned.clear();
    dev.free(h).unwrap();
    dev.trim();
    assert!(!fake.state().cleaned.is_empty(), "unmapped entries not cleaned before the invalidate");
}

#[test]
fn thousands_of_resets_never_turn_a_cancelled_fence_into_success() {
    with_device::<4>(Generation::Gen1, cfg(), MmuMode::Bypass, |dev| {
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
    with_device::<8>(Generation::Gen2, cfg(), MmuMode::Bypass, |dev| {
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

#[test]
fn a_wait_before_signal_is_blocked_not_hung_unless_a_limit_is_set() {
    // Default: no limit. Ten hang windows of virtual time pass.
    with_device::<4>(Generation::Gen2, cfg(), MmuMode::Bypass, |dev| {
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
    with_device::<4>(Generation::Gen2, Config { hang, ..cfg() }, MmuMode::Bypass, |dev| {
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
    let c = Config { dep_wait_ns: 5_000_000, ..cfg() };
    with_device::<16>(Generation::Gen1, c, MmuMode::Bypass, |dev| {
        dev.platform().state().mode = Mode::Manual;
        let copy = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
        let n = umd_core::engine::PENDING_WAITS;
        for _ in 0..n {
            dev.submit(QueueId::GFX, &[copy], |cb| cb.timestamp(0x8030_0008)).unwrap();
        }
        let emitted = dev.last_emitted(QueueId::GFX).unwrap();
        assert_eq!(
            dev.submit(QueueId::GFX, &[copy], |cb| cb.timestamp(0x8030_0010)),
            Err(SubmitError::TooManyPending(QueueId::GFX))
        );
        assert_eq!(dev.last_emitted(QueueId::GFX), Some(emitted), "nothing emitted");
        assert!(dev.stats().dep_waits > 0, "it waited for room first");
        // Room comes back as the work completes, and no edge was dropped.
        dev.platform().state().run_all();
        dev.submit(QueueId::GFX, &[copy], |cb| cb.timestamp(0x8030_0010)).unwrap();
    });
}

#[test]
fn four_threads_three_queues_no_lost_fence() {
    with_device::<16>(
        Generation::Gen2,
        Config { ib_chunk_bytes: 4096, ring_bytes: 16384, ..cfg() },
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
    with_device::<4>(Generation::Gen1, cfg(), MmuMode::Bypass, |dev| {
        let f = dev.submit(QueueId::GFX, &[], |cb| cb.barrier()).unwrap();
        dev.wait(f, 1_000_000_000).unwrap();
        let id = FenceId { queue: QueueId::GFX, seqno: f.seqno() };
        assert_eq!(f.id, id);
        assert_eq!(dev.query(f.later(1)), Err(WaitError::NotSubmitted(f.later(1))));
    });
}

#[test]
fn shutdown_reports_leaks_with_tags() {
    let fake = Fake::new(Generation::Gen2, 8 << 20);
    let mut storage: Box<Storage> = Box::default();
    let dev = Device::<Fake, 4>::new(&fake, &mut storage, cfg(), MmuMode::Bypass).unwrap();
    let a = dev.alloc(&BufferDesc::new(100).tag("vertices")).unwrap();
    let _b = dev.alloc(&BufferDesc::new(70_000).tag("texture")).unwrap();
    dev.free(a).unwrap();
    let mut leaks = Vec::new();
    dev.leak_report(|l| leaks.push((l.info.tag, l.info.size, l.info.serial)));
    assert_eq!(leaks, vec![("texture", 70_000, 2)]);
    let r = dev.shutdown();
    assert_eq!((r.leaked_buffers, r.leaked_bytes), (1, 70_000));
    assert_eq!(fake.state().allocs, 0, "leaked memory is given back at teardown");
}

/// Completion passes take back at most 64 frees each. With more frees than
/// that behind one job and no completion to follow, what is left must not
/// wait for a completion that may never come: one service pass (which
/// every wait on pending work runs) takes back all of it.
#[test]
fn frees_beyond_the_reclaim_budget_come_back_without_another_completion() {
    with_device::<4>(Generation::Gen2, cfg(), MmuMode::Bypass, |dev| {
        dev.platform().state().mode = Mode::Manual;
        let held: Vec<_> = (0..200).map(|_| dev.alloc_buffer(64).unwrap()).collect();
        let f = dev.submit(QueueId::COPY, &[], |cb| cb.barrier()).unwrap();
        for h in held {
            dev.free(h).unwrap();
        }
        assert_eq!(dev.buffer_stats().waiting, 200);
        dev.platform().state().run_all();
        dev.wait(f, 1_000_000_000).unwrap();
        let after_completion = dev.buffer_stats().waiting;
        assert!(after_completion > 0 && after_completion < 200, "{after_completion} waiting");
        dev.service();
        assert_eq!(dev.buffer_stats().waiting, 0, "a service pass takes back every free whose fence passed");
        assert_eq!(dev.frees_waiting_on(QueueId::COPY), 0);
    });
}

/// Frees whose fences have passed are taken back when memory runs out,
/// even when completion processing (which reclaims a bounded number at a
/// time) left some waiting and every queue is idle: the allocation must not
/// wait for a fence that already signalled and then fail.
#[test]
fn memory_pressure_reclaims_frees_whose_fences_passed() {
    with_device::<4>(Generation::Gen2, cfg(), MmuMode::Bypass, |dev| {
        dev.platform().state().mode = Mode::Manual;
        let mut held = Vec::new();
        loop {
            match dev.alloc_buffer(64) {
                Ok(h) => held.push(h),
                Err(AllocError::TableFull { .. } | AllocError::SlabCapacity { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        let n = held.len();
        assert!(n > 100, "only {n} buffers fit");
        let f = dev.submit(QueueId::COPY, &[], |cb| cb.barrier()).unwrap();
        for h in held.drain(..) {
            dev.free(h).unwrap();
        }
        assert_eq!(dev.buffer_stats().waiting, n as u64);
        dev.platform().state().run_all();
        dev.wait(f, 1_000_000_000).unwrap();
        for i in 0..n {
            match dev.alloc_buffer(64) {
                Ok(h) => held.push(h),
                Err(e) => panic!("allocation {i} of {n} failed with every fence passed: {e}"),
            }
        }
        assert_eq!(dev.buffer_stats().waiting, 0);
        for h in held {
            dev.free(h).unwrap();
        }
    });
}

/// Memory that work poisoned through a dependency may still use comes back
/// once that work has stopped running. An allocation waiting for it waits
/// for the work's queue to pass it (with the wait's own schedule and hang
/// check), instead of trying the allocation again every wait interval
/// because the poisoned fence answers at once.
#[test]
fn an_allocation_behind_poisoned_work_waits_for_the_work_instead_of_retrying() {
    with_device::<4>(Generation::Gen2, cfg(), MmuMode::Bypass, |dev| {
        dev.platform().state().mode = Mode::Manual;
        dev.platform().state().engines[0].fault = EngineFault::Stuck;
        let a = dev.submit(QueueId::GFX, &[], |cb| cb.barrier()).unwrap();
        let b = dev.submit(QueueId::COMPUTE, &[a], |cb| cb.barrier()).unwrap();
        let mut held = Vec::new();
        loop {
            match dev.alloc_buffer(1 << 20) {
                Ok(h) => held.push(h),
                Err(AllocError::PlatformMemory { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(!held.is_empty());
        for h in held {
            dev.free(h).unwrap();
        }
        let refused = dev.platform().state().dma_refused;
        let h = dev.alloc_buffer(1 << 20).expect("the memory comes back once the work has stopped");
        let tries = dev.platform().state().dma_refused - refused;
        assert!(tries <= 8, "{tries} refused allocation attempts while the work ran");
        assert!(matches!(dev.query(a), Ok(FenceStatus::Failed(_))));
        assert!(
            matches!(dev.query(b), Ok(FenceStatus::Failed(FenceError::Dependency { .. }))),
            "{:?}",
            dev.query(b)
        );
        dev.free(h).unwrap();
    });
}

/// A buffer at a fixed GPU address (capture/replay): exactly there, a
/// block of its own whatever its size; every bad request is refused with
/// its cause and changes nothing, without waiting.
// The GPU MMU and its VA allocator (feature `mmu`).
#[cfg(feature = "mmu")]
#[test]
fn a_buffer_at_a_fixed_address_is_there_and_bad_addresses_name_their_cause() {
    const BASE: u64 = 1 << 32;
    const SIZE: u64 = 1 << 32;
    with_device::<4>(Generation::Gen2, cfg(), MmuMode::DEFAULT, |dev| {
        let at = BASE + (SIZE / 2);
        let h = dev.alloc_at(&BufferDesc::new(100).tag("replayed"), at).unwrap();
        let info = dev.buffer(h).unwrap();
        assert_eq!((info.va, info.size, info.reserved), (at, 100, 4096));
        assert_eq!((info.class, info.tag), (SizeClass::Large, "replayed"));
        // CPU access works as for any buffer.
        dev.write_words(h, 0, &[0xFEED]).unwrap();
        assert_eq!(dev.read_u32(h, 0), Ok(0xFEED));
        // A range kept by recycling (8 KiB, a block of its own, freed with
        // nothing in flight): a refusal must not flush it.
        let kept = dev.alloc(&BufferDesc::new(8192).align(8192)).unwrap();
        dev.free(kept).unwrap();
        let before = (dev.buffer_stats(), dev.va_stats(), dev.platform().state().delays);
        let refused = [
            (BufferDesc::new(4096), at, AllocError::AddressInUse { at }),
            (BufferDesc::new(8192), at - 4096, AllocError::AddressInUse { at: at - 4096 }),
            (BufferDesc::new(4096), BASE - 4096, AllocError::AddressOutsideArena { at: BASE - 4096 }),
            (
                BufferDesc::new(8192),
                BASE + SIZE - 4096,
                AllocError::AddressOutsideArena { at: BASE + SIZE - 4096 },
            ),
            (BufferDesc::new(64), at + 128, AllocError::AddressUnaligned { at: at + 128 }),
            (BufferDesc::new(64).align(1 << 20), at + 4096, AllocError::AddressUnaligned { at: at + 4096 }),
            (BufferDesc::new(8192), !4095, AllocError::TooLarge { size: 8192 }),
            (BufferDesc::new(0), at, AllocError::ZeroSize),
        ];
        for (desc, va, want) in refused {
            assert_eq!(dev.alloc_at(&desc, va), Err(want), "{desc:?} at {va:#x}");
            let now = (dev.buffer_stats(), dev.va_stats(), dev.platform().state().delays);
            assert_eq!(now, before, "{desc:?} at {va:#x} was refused but changed something, or waited");
        }
        dev.free(h).unwrap();
        // Released at once (nothing in flight): the address can be had again.
        let h = dev.alloc_at(&BufferDesc::new(3 << 20), at + 4096).unwrap();
        assert_eq!(dev.va(h), Ok(at + 4096), "above 2 MiB a fixed block keeps its address");
        dev.free(h).unwrap();
    });
    // With the MMU bypassed a GPU address is the memory's own.
    with_device::<4>(Generation::Gen2, cfg(), MmuMode::Bypass, |dev| {
        let before = (dev.buffer_stats(), dev.platform().state().allocs);
        assert_eq!(dev.alloc_at(&BufferDesc::new(4096), MEM_BASE), Err(AllocError::FixedAddressUnsupported));
        assert_eq!((dev.buffer_stats(), dev.platform().state().allocs), before);
    });
}

/// A fixed address in a slab that still has live slots is refused at once,
/// even while unrelated frees wait for their fences: waiting for those
/// would not free it.
// The GPU MMU and its VA allocator (feature `mmu`).
#[cfg(feature = "mmu")]
#[test]
fn a_fixed_address_in_a_slab_with_live_slots_is_refused_without_waiting() {
    with_device::<4>(Generation::Gen2, cfg(), MmuMode::DEFAULT, |dev| {
        dev.platform().state().mode = Mode::Manual;
        let a = dev.alloc_buffer(128).unwrap();
        let b = dev.alloc_buffer(128).unwrap();
        let page = dev.va(a).unwrap() & !4095;
        dev.free(a).unwrap();
        // An unrelated free that waits for work that does not run.
        let other = dev.alloc_buffer(1 << 20).unwrap();
        let f = dev.submit(QueueId::COPY, &[], |cb| cb.barrier()).unwrap();
        dev.free(other).unwrap();
        assert_eq!(dev.buffer_stats().waiting, 1);
        let slept = dev.platform().state().delays;
        assert_eq!(dev.alloc_at(&BufferDesc::new(128), page), Err(AllocError::AddressInUse { at: page }));
        assert_eq!(dev.platform().state().delays, slept, "waited for unrelated work");
        assert_eq!(dev.query(f), Ok(FenceStatus::Pending));
        dev.free(b).unwrap();
    });
}

/// A fixed address that a freed buffer still holds for in-flight work is
/// given out once that work has stopped: the allocation waits for it and
/// never hands the range out while the work may still use it. A live
/// buffer's range is refused at once. (This fake runs no work through the
/// MMU, so here the work stops by hang recovery; the conformance scenario
/// `fixed_address_reuse` checks the data on platforms that run it.)
// The GPU MMU and its VA allocator (feature `mmu`).
#[cfg(feature = "mmu")]
#[test]
fn a_fixed_address_held_by_a_freed_buffer_is_given_out_after_its_fence() {
    with_device::<4>(Generation::Gen2, cfg(), MmuMode::DEFAULT, |dev| {
        dev.platform().state().mode = Mode::Manual;
        for size in [200 << 10, 64 << 10] {
            // Large (a block of its own), then medium (a slot of a slab,
            // which goes back to the platform only when trimmed).
            let a = dev.alloc_buffer(size).unwrap();
            let va = dev.va(a).unwrap();
            let desc = BufferDesc::new(size);
            let slept = dev.platform().state().delays;
            assert_eq!(dev.alloc_at(&desc, va), Err(AllocError::AddressInUse { at: va }));
            assert_eq!(dev.platform().state().delays, slept, "waited for a live buffer");
            let f = dev.submit(QueueId::COPY, &[], |cb| cb.barrier()).unwrap();
            dev.free(a).unwrap();
            assert_eq!(dev.buffer_stats().waiting, 1);
            assert_eq!(dev.query(f), Ok(FenceStatus::Pending));
            let slept = dev.platform().state().delays;
            let h = dev.alloc_at(&desc, va).unwrap();
            assert!(dev.platform().state().delays > slept, "did not wait");
            assert!(!matches!(dev.query(f), Ok(FenceStatus::Pending)), "given out under in-flight work");
            assert_eq!(dev.va(h), Ok(va));
            assert_eq!(dev.buffer(h).unwrap().class, SizeClass::Large);
            dev.free(h).unwrap();
        }
    });
}

/// The driver's GPU VA allocator recycles: a freed block of up to 8 KiB
/// (here 8 KiB aligned to 8 KiB, a block of its own) is kept for its length
/// instead of being coalesced, counts as free, and is what the next
/// request of that length gets, in O(1). Without recycling the free would
/// change the holes (a new one, or fewer nodes after coalescing).
// The GPU MMU and its VA allocator (feature `mmu`).
#[cfg(feature = "mmu")]
#[test]
fn a_freed_block_of_up_to_8_kib_is_reused_first_by_the_same_length() {
    with_device::<4>(Generation::Gen2, cfg(), MmuMode::DEFAULT, |dev| {
        let desc = BufferDesc::new(8192).align(8192);
        let a = dev.alloc(&desc).unwrap();
        let b = dev.alloc(&desc).unwrap();
        assert_eq!(dev.buffer(a).unwrap().class, SizeClass::Large, "a block of its own");
        let va_a = dev.va(a).unwrap();
        let s0 = dev.va_stats().unwrap();
        dev.free(a).unwrap();
        assert_eq!(dev.buffer_stats().waiting, 0, "nothing in flight: released at once");
        let s1 = dev.va_stats().unwrap();
        assert_eq!(s1.used, s0.used - 8192, "a recycled range counts as free");
        assert_eq!(s1.free, s0.free + 8192);
        assert_eq!(s1.allocations, s0.allocations - 1);
        assert_eq!(
            (s1.holes, s1.nodes_used),
            (s0.holes, s0.nodes_used),
            "kept, not coalesced: {s0:?} {s1:?}"
        );
        let c = dev.alloc(&desc).unwrap();
        assert_eq!(dev.va(c).unwrap(), va_a, "the same length takes the freed range first");
        assert_eq!(dev.va_stats().unwrap(), s0, "as before the free");
        for h in [b, c] {
            dev.free(h).unwrap();
        }
    });
}

/// A VA arena filled up, with freed ranges kept by recycling: a larger
/// request that only the coalesced ranges can hold flushes them and
/// succeeds instead of failing for want of VA space.
// The GPU MMU and its VA allocator (feature `mmu`).
#[cfg(feature = "mmu")]
#[test]
fn a_full_va_arena_with_recycled_ranges_still_holds_a_larger_buffer() {
    let mmu = MmuMode::Enabled { va_base: 1 << 32, va_size: 512 << 10, table_pages: 16 };
    with_device::<4>(Generation::Gen2, cfg(), mmu, |dev| {
        let desc = BufferDesc::new(8192).align(8192);
        let mut held = Vec::new();
        let err = loop {
            match dev.alloc(&desc) {
                Ok(h) => held.push(h),
                Err(e) => break e,
            }
        };
        assert!(matches!(err, AllocError::VaSpace { .. }), "{err}");
        assert!(held.len() >= 16, "only {} blocks fit", held.len());
        // Eight neighbours (one recycling stack's depth) freed: 64 KiB free
        // in one run, but kept for their length, not coalesced.
        let mut run: Vec<_> = held.iter().map(|&h| (dev.va(h).unwrap(), h)).collect();
        run.sort_unstable_by_key(|&(va, _)| va);
        let start =
            run.windows(8).position(|w| w[7].0 - w[0].0 == 7 * 8192).expect("eight neighbouring blocks");
        let run_va = run[start].0;
        let freed: Vec<_> = run.drain(start..start + 8).map(|(_, h)| h).collect();
        for h in freed {
            dev.free(h).unwrap();
        }
        let s = dev.va_stats().unwrap();
        assert!(s.free >= 64 << 10, "{s:?}");
        assert!(s.largest_free < 64 << 10, "the freed ranges are kept, not holes: {s:?}");
        let big = dev.alloc(&BufferDesc::new(64 << 10).align(8192)).expect("the flush makes room");
        assert_eq!(dev.buffer(big).unwrap().class, SizeClass::Large);
        assert_eq!(dev.va(big).unwrap(), run_va, "the eight ranges, coalesced");
        let s = dev.va_stats().unwrap();
        assert!(s.free < 64 << 10, "{s:?}");
        dev.free(big).unwrap();
        for (_, h) in run {
            dev.free(h).unwrap();
        }
    });
}

/// Every kind of block the buffers take from or give back to the platform,
/// with the MMU on (`mmu`) or bypassed: the engine's passes under the
/// memory lock never call `dma_alloc` or `dma_free` (the fake counts the
/// calls made while the calling thread holds any of the engine's locks).
#[test]
fn buffer_memory_is_allocated_and_freed_outside_the_engines_locks() {
    if !support::track_locks() {
        println!("skipped: an optimised build's fake does not count the locks held");
        return;
    }
    let mut modes = vec![MmuMode::Bypass];
    if cfg!(feature = "mmu") {
        modes.push(MmuMode::DEFAULT);
    }
    for mmu in modes {
        with_device::<4>(Generation::Gen2, cfg(), mmu, |dev| {
            dev.platform().state().mode = Mode::Manual;
            let regions = dev.platform().state().allocs;
            let before = dev.buffer_stats().pool;
            // A slab per bin (new slabs), large blocks, kinds kept apart.
            let mut hs: Vec<BufferHandle> =
                (0..10u32).map(|b| dev.alloc_buffer(100u64 << b).unwrap()).collect();
            hs.push(dev.alloc(&BufferDesc::new(1 << 20).device_only()).unwrap());
            hs.push(dev.alloc(&BufferDesc::new(200 << 10).gpu_read_only()).unwrap());
            hs.push(
                dev.alloc(&BufferDesc::new(4096).align(1 << 20))
                    .unwrap_or_else(|_| dev.alloc_buffer(4096).unwrap()),
            );
            // Refused requests take back the memory they were given and
            // change nothing.
            let live = dev.buffer_stats();
            let in_use = dev.platform().state().bytes_in_use();
            assert!(matches!(dev.alloc_buffer(64 << 20), Err(AllocError::PlatformMemory { .. })));
            assert_eq!(dev.buffer_stats(), live, "a refused allocation changed the buffers");
            assert_eq!(dev.platform().state().bytes_in_use(), in_use, "a refused allocation kept memory");
            // Frees at once (blocks released) and under in-flight work
            // (released by the completion pass): more blocks than one pass
            // under the lock releases.
            // (The fake's engines do not translate: work runs with the MMU
            // bypassed only.)
            let large: Vec<BufferHandle> = (0..20).map(|_| dev.alloc_buffer(128 << 10).unwrap()).collect();
            let f =
                (mmu == MmuMode::Bypass).then(|| dev.submit(QueueId::COPY, &[], |cb| cb.barrier()).unwrap());
            for h in large {
                dev.free(h).unwrap();
            }
            if let Some(f) = f {
                assert_eq!(dev.buffer_stats().waiting, 20);
                dev.platform().state().run_all();
                dev.wait(f, 1_000_000_000).unwrap();
            }
            assert_eq!(dev.buffer_stats().waiting, 0, "every free came back");
            for h in hs {
                dev.free(h).unwrap();
            }
            // Ten kept slabs: trimmed in more than one pass.
            let trimmed = dev.trim();
            let after = dev.buffer_stats().pool;
            assert!(trimmed > 0 && after.empty_slabs == 0, "trim gave back {trimmed} bytes");
            assert_eq!(
                after.blocks_acquired - before.blocks_acquired,
                after.blocks_released - before.blocks_released
            );
            let st = dev.platform().state();
            assert_eq!(st.allocs, regions, "every block went back to the platform");
            assert_eq!(st.dma_calls_under_lock, 0, "{mmu:?}: dma_alloc/dma_free under an engine lock");
        });
    }
}

/// Four threads allocating and freeing buffers of every class, so that
/// passes that found no room race frees that make some (the block
/// allocated outside the lock then goes back unused): nothing leaks, no
/// platform memory call runs under an engine lock, every buffer reads as
/// zero when handed out.
#[test]
fn allocations_racing_frees_lose_no_memory() {
    let counting = support::track_locks();
    let mut modes = vec![MmuMode::Bypass];
    if cfg!(feature = "mmu") {
        modes.push(MmuMode::DEFAULT);
    }
    for mmu in modes {
        let fake = Fake::new(Generation::Gen2, 32 << 20);
        let mut storage: Box<Storage> = Box::default();
        let dev = Device::<Fake, 4>::new(&fake, &mut storage, cfg(), mmu).expect("device comes up");
        let regions = fake.state().allocs;
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let dev = &dev;
                s.spawn(move || {
                    let sizes = [64u64, 3000, 40 << 10, 100 << 10, 300 << 10];
                    for j in 0..300u64 {
                        let size = sizes[((t + j) % sizes.len() as u64) as usize];
                        let h = dev.alloc_buffer(size).unwrap();
                        assert_eq!(dev.read_u32(h, size / 4 - 1), Ok(0), "a new buffer is zeroed");
                        dev.write_words(h, 0, &[t as u32 + 1]).unwrap();
                        if j % 7 == 0 {
                            dev.trim();
                        }
                        dev.free(h).unwrap();
                    }
                });
            }
        });
        assert_eq!(dev.buffer_stats().live, 0);
        dev.trim();
        assert_eq!(fake.state().allocs, regions, "{mmu:?}: a block was lost or kept");
        if counting {
            assert_eq!(
                fake.state().dma_calls_under_lock,
                0,
                "{mmu:?}: dma_alloc/dma_free under an engine lock"
            );
        }
    }
}
