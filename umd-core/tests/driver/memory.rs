//! Memory: buffers allocated, mapped, freed under in-flight, hung or lost
//! work and reclaimed after their fences; every allocation failure named;
//! slabs, the VA allocator, fixed addresses, large buffers with and
//! without the MMU, page-table cache maintenance, CPU access on a
//! non-coherent system, and allocations racing frees.

use super::{small_cfg, with_device, Storage};
use umd_core::direct::{Device, MmuMode};
use umd_core::engine::{BufferUse, Submit};
use umd_core::error::{FenceStatus, SubmitError, WaitError};
use umd_core::hw::Generation;
#[cfg(feature = "mmu")]
use umd_core::mem::SizeClass;
use umd_core::mem::{AllocError, BufferDesc, BufferError, BufferHandle};
use umd_core::platform::fake;
#[cfg(feature = "mmu")]
use umd_core::platform::fake::MEM_BASE;
use umd_core::platform::fake::{EngineFault, Fake, Mode, NonCoherent, Scripted};
#[cfg(feature = "mmu")]
use umd_core::storage::DeviceStorage;
use umd_core::sync::{FenceError, QueueId};

#[test]
fn a_buffer_freed_under_in_flight_work_keeps_its_address_until_the_fence() {
    with_device::<4>(Generation::Gen2, small_cfg(), MmuMode::Bypass, |dev| {
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
    with_device::<4>(Generation::Gen1, small_cfg(), MmuMode::Bypass, |dev| {
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
    with_device::<4>(Generation::Gen2, small_cfg(), MmuMode::Bypass, |dev| {
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
    let dev = Device::<Fake, 4>::new(&fake, &mut storage, small_cfg(), MmuMode::Bypass).unwrap();
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
fn cpu_access_is_checked_and_exclusive_while_mapped() {
    with_device::<4>(Generation::Gen2, small_cfg(), MmuMode::Bypass, |dev| {
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

/// Found by the `driver` fuzz target: an allocation took back the frees
/// whose fences had passed before it looked at the request, so a refused
/// request changed the buffer statistics. A bad request is now refused
/// before anything is touched.
#[test]
fn a_refused_request_leaves_the_buffer_statistics_as_they_were() {
    with_device::<4>(Generation::Gen2, small_cfg(), MmuMode::Bypass, |dev| {
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
    use super::names_its_parameter;
    use umd_core::storage::Limit;
    // Bad requests.
    with_device::<4>(Generation::Gen2, small_cfg(), MmuMode::DEFAULT, |dev| {
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
    let dev = Device::<Fake, 4>::new(&fake, &mut small, small_cfg(), MmuMode::Bypass).unwrap();
    let hs: Vec<_> = (0..4).map(|_| dev.alloc_buffer(64).unwrap()).collect();
    let before = (dev.buffer_stats(), dev.va_stats());
    let err = dev.alloc_buffer(64).unwrap_err();
    assert_eq!(err, AllocError::TableFull { capacity: 4 });
    names_its_parameter(&err, err.limit(), Limit::Buffers, "DeviceStorage's BUFFERS");
    assert_eq!((dev.buffer_stats(), dev.va_stats()), before, "nothing changed on error");
    hs.into_iter().for_each(|h| dev.free(h).unwrap());
    drop(dev);
    // Slab descriptors of the small and medium classes.
    let mut few_slabs: Box<DeviceStorage<256, 256, 2, 16>> = Box::default();
    let dev = Device::<Fake, 4>::new(&fake, &mut few_slabs, small_cfg(), MmuMode::Bypass).unwrap();
    let a = dev.alloc_buffer(64).unwrap();
    let b = dev.alloc_buffer(2048).unwrap();
    let before = (dev.buffer_stats(), dev.va_stats());
    for (size, class) in [(300, SizeClass::Small), (9000, SizeClass::Medium)] {
        let err = dev.alloc_buffer(size).unwrap_err();
        assert_eq!(err, AllocError::SlabCapacity { class });
        names_its_parameter(&err, err.limit(), Limit::Slabs, "DeviceStorage's SLABS");
        assert_eq!((dev.buffer_stats(), dev.va_stats()), before, "nothing changed on error");
    }
    dev.free(a).unwrap();
    dev.free(b).unwrap();
    drop(dev);
    // GPU VA nodes.
    let mut few_nodes: Box<DeviceStorage<256, 8, 64, 16>> = Box::default();
    let dev = Device::<Fake, 4>::new(&fake, &mut few_nodes, small_cfg(), MmuMode::DEFAULT).unwrap();
    let mut got = Vec::new();
    let (err, before) = loop {
        let before = (dev.buffer_stats(), dev.va_stats());
        match dev.alloc_buffer(100_000) {
            Ok(h) => got.push(h),
            Err(e) => break (e, before),
        }
    };
    assert_eq!(err, AllocError::VaNodes);
    names_its_parameter(&err, err.limit(), Limit::VaNodes, "DeviceStorage's VA_NODES");
    assert_eq!((dev.buffer_stats(), dev.va_stats()), before, "nothing changed on error");
    assert!(!got.is_empty());
    got.into_iter().for_each(|h| dev.free(h).unwrap());
    drop(dev);
    assert_eq!(fake.state().allocs, 0);
}

// The GPU MMU and its VA allocator (feature `mmu`).
#[cfg(feature = "mmu")]
#[test]
fn small_buffers_share_slabs_mapped_once() {
    with_device::<4>(Generation::Gen2, small_cfg(), MmuMode::DEFAULT, |dev| {
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
    with_device::<4>(Generation::Gen2, small_cfg(), MmuMode::DEFAULT, |dev| {
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
    let dev = Device::<Fake, 4>::new(&fake, &mut storage, small_cfg(), MmuMode::DEFAULT).unwrap();
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

/// Completion passes take back at most 64 frees each. With more frees than
/// that behind one job and no completion to follow, what is left must not
/// wait for a completion that may never come: one service pass (which
/// every wait on pending work runs) takes back all of it.
#[test]
fn frees_beyond_the_reclaim_budget_come_back_without_another_completion() {
    with_device::<4>(Generation::Gen2, small_cfg(), MmuMode::Bypass, |dev| {
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
    with_device::<4>(Generation::Gen2, small_cfg(), MmuMode::Bypass, |dev| {
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
    with_device::<4>(Generation::Gen2, small_cfg(), MmuMode::Bypass, |dev| {
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
    with_device::<4>(Generation::Gen2, small_cfg(), MmuMode::DEFAULT, |dev| {
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
    with_device::<4>(Generation::Gen2, small_cfg(), MmuMode::Bypass, |dev| {
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
    with_device::<4>(Generation::Gen2, small_cfg(), MmuMode::DEFAULT, |dev| {
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
    with_device::<4>(Generation::Gen2, small_cfg(), MmuMode::DEFAULT, |dev| {
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
    with_device::<4>(Generation::Gen2, small_cfg(), MmuMode::DEFAULT, |dev| {
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
    with_device::<4>(Generation::Gen2, small_cfg(), mmu, |dev| {
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
    if !fake::track_locks() {
        println!("skipped: an optimised build's fake does not count the locks held");
        return;
    }
    let mut modes = vec![MmuMode::Bypass];
    if cfg!(feature = "mmu") {
        modes.push(MmuMode::DEFAULT);
    }
    for mmu in modes {
        with_device::<4>(Generation::Gen2, small_cfg(), mmu, |dev| {
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
    let counting = fake::track_locks();
    let mut modes = vec![MmuMode::Bypass];
    if cfg!(feature = "mmu") {
        modes.push(MmuMode::DEFAULT);
    }
    for mmu in modes {
        let fake = Fake::new(Generation::Gen2, 32 << 20);
        let mut storage: Box<Storage> = Box::default();
        let dev = Device::<Fake, 4>::new(&fake, &mut storage, small_cfg(), mmu).expect("device comes up");
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

#[test]
fn gpu_addresses_come_from_the_va_allocator_only_with_the_mmu() {
    const MEM: u64 = 4 << 20;
    let in_memory = |a: u64| (fake::MEM_BASE..fake::MEM_BASE + MEM).contains(&a);
    // MMU bypassed (every build): no allocator; an address is the memory's
    // own device address.
    let fake = Fake::new(Generation::Gen2, MEM as usize);
    let mut storage: Box<Storage> = Box::default();
    let dev =
        Device::<Fake, 4>::new(&fake, &mut storage, small_cfg(), MmuMode::Bypass).expect("bypass comes up");
    assert!(!dev.mmu_enabled());
    assert!(dev.va_stats().is_none());
    let small = dev.alloc_buffer(256).unwrap();
    let large = dev.alloc_buffer(256 << 10).unwrap();
    assert!(in_memory(dev.va(small).unwrap()) && in_memory(dev.va(large).unwrap()));
    assert!(in_memory(dev.pool_range().0));
    dev.free(large).unwrap();
    dev.free(small).unwrap();
    drop(dev);
    assert_eq!(fake.state().allocs, 0, "nothing left allocated");
    if !umd_core::direct::MMU {
        return;
    }
    // MMU on (only when built in): the allocator chooses every address
    // from the arena and counts them.
    let (base, size) = (1u64 << 32, 1u64 << 30);
    let mut storage: Box<Storage> = Box::default();
    let mmu = MmuMode::Enabled { va_base: base, va_size: size, table_pages: 16 };
    let dev = Device::<Fake, 4>::new(&fake, &mut storage, small_cfg(), mmu).expect("MMU comes up");
    assert!(dev.mmu_enabled());
    let in_arena = |a: u64| (base..base + size).contains(&a);
    let before = dev.va_stats().expect("an allocator with the MMU");
    assert!(before.allocations > 0 && before.used > 0, "rings, fence slots and IB pool: {before:?}");
    let large = dev.alloc_buffer(256 << 10).unwrap();
    assert!(in_arena(dev.va(large).unwrap()) && in_arena(dev.pool_range().0));
    assert_eq!(dev.va_stats().unwrap().allocations, before.allocations + 1);
    dev.free(large).unwrap();
    drop(dev);
    assert_eq!(fake.state().allocs, 0, "nothing left allocated");
}

/// An eviction whose copy fails (the device is lost) gives the system
/// memory it took for the copy back to the platform, and the buffer stays
/// in local memory.
#[test]
fn a_failed_eviction_frees_the_memory_it_took() {
    let fake = Fake::with_local_memory(Generation::Gen2, 4 << 20, 1 << 20);
    fake.state().mode = Mode::OnDoorbell;
    let mut storage: Box<Storage> = Box::default();
    let mmu = MmuMode::Enabled { va_base: 1 << 32, va_size: 1 << 30, table_pages: 16 };
    let r = Device::<Fake, 4>::new(&fake, &mut storage, small_cfg(), mmu);
    if !umd_core::direct::MMU {
        // Built without the `mmu` feature: refused, and so no local memory.
        assert!(matches!(r.err(), Some(umd_core::engine::InitError::BadConfig(_))));
        return;
    }
    let dev = r.expect("the device comes up with the MMU");
    if dev.local_memory().is_none() {
        // Built without the `local-memory` feature: nothing moves.
        return;
    }
    let h = dev.alloc(&BufferDesc::new(4096).local()).unwrap();
    assert_eq!(dev.residency(h), Ok(umd_core::engine::Residency::Local));
    let regions = fake.state().allocs;
    fake.state().lost = true;
    assert!(dev.evict(h).is_err());
    assert_eq!(fake.state().allocs, regions, "the copy's destination went back");
    assert_eq!(dev.residency(h), Ok(umd_core::engine::Residency::Local));
}

#[test]
fn a_local_preferring_buffer_works_without_local_memory() {
    // The fake has no local memory: such a buffer lives in system memory
    // in every build, and cannot be moved.
    let fake = Fake::new(Generation::Gen2, 4 << 20);
    let mut storage: Box<Storage> = Box::default();
    let dev: Device<'_, Fake, 4> =
        Device::new(&fake, &mut storage, small_cfg(), MmuMode::Bypass).expect("device comes up");
    assert_eq!(dev.local_memory(), None);
    let h = dev.alloc(&BufferDesc::new(4096).local()).unwrap();
    assert_eq!(dev.residency(h), Ok(umd_core::engine::Residency::System));
    assert_eq!(dev.evict(h), Err(umd_core::engine::MoveError::NotLocal));
    assert_eq!(dev.make_resident(h), Err(umd_core::engine::MoveError::NotLocal));
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
