//! The optional parts of the driver, on and off: `hang-capture`, `trace`,
//! `local-memory` and `mmu`. Each test states what the build it runs in must do,
//! so the same file checks the default build and a lean one (`.ci/run`:
//! `--no-default-features --features gen1,gen2`). Off, every check, typed
//! error, reset and recovery stays; only the captured report, the event
//! ring, the local-memory moves and the page tables go.

mod support;

use support::{EngineFault, Fake, Mode};
use umd_core::config::Config;
use umd_core::debug::hang::WINDOW_DWORDS;
use umd_core::debug::HangReason;
use umd_core::direct::{Device, MmuMode};
use umd_core::error::{FenceStatus, WaitError};
use umd_core::hw::Generation;
use umd_core::mem::BufferDesc;
use umd_core::storage::DeviceStorage;
use umd_core::sync::{FaultKind, FenceError, QueueId};

const CAPTURE: bool = cfg!(feature = "hang-capture");
const TRACE: bool = cfg!(feature = "trace");

type Storage = DeviceStorage<256, 256, 64, 256>;

fn small_cfg() -> Config {
    Config { ring_bytes: 4096, ib_chunk_bytes: 4096, use_irq: false, ..Config::DEFAULT }
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

#[test]
fn the_mmu_is_refused_with_a_typed_error_when_not_built_in() {
    let fake = Fake::new(Generation::Gen2, 4 << 20);
    let mut storage: Box<Storage> = Box::default();
    let mmu = MmuMode::Enabled { va_base: 1 << 32, va_size: 1 << 30, table_pages: 16 };
    let r = Device::<Fake, 4>::new(&fake, &mut storage, small_cfg(), mmu);
    if umd_core::direct::MMU {
        let dev = r.expect("device comes up with the MMU");
        let h = dev.alloc_buffer(4096).unwrap();
        assert!(dev.va(h).unwrap() >= 1 << 32);
        drop(dev);
    } else {
        assert!(matches!(r.err(), Some(umd_core::engine::InitError::BadConfig(_))));
    }
    assert_eq!(fake.state().allocs, 0, "nothing left allocated");
}

#[test]
fn gpu_addresses_come_from_the_va_allocator_only_with_the_mmu() {
    const MEM: u64 = 4 << 20;
    let in_memory = |a: u64| (support::MEM_BASE..support::MEM_BASE + MEM).contains(&a);
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
