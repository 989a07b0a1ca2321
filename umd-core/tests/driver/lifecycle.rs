//! Lifecycle: bring-up (bad configurations refused with nothing leaked,
//! the memory plan, the MMU when not built in), handles that can not
//! dangle or cross devices, and the leak report at shutdown.

use super::{small_cfg, Storage};
use umd_core::config::{Config, Key, RangeError};
use umd_core::direct::{Device, InitError, MmuMode};
use umd_core::error::{SubmitError, WaitError};
use umd_core::hw::Generation;
use umd_core::mem::{BufferDesc, BufferError, BufferHandle};
use umd_core::platform::fake::Fake;
use umd_core::sync::QueueId;

#[test]
fn init_rejects_bad_config_and_frees_what_it_allocated() {
    let mut storage: Box<Storage> = Box::default();
    let bad = Config { ring_bytes: 3000, ..Config::DEFAULT };
    let fake = Fake::new(Generation::Gen1, 1 << 20);
    let e = Device::<Fake, 4>::new(&fake, &mut storage, bad, MmuMode::Bypass).err().unwrap();
    assert_eq!(e, InitError::OutOfRange(RangeError { key: Key::RingBytes }));
    assert!(e.to_string().contains("ring_bytes out of range"), "{e}");
    assert_eq!(fake.state().allocs, 0);
    // Every tunable's range is checked at bring-up, not only those that
    // shape the memory: a dependency wait past an hour, a local-memory
    // residency past 1024.
    for (bad, key) in [
        (Config { dep_wait_ns: u64::MAX, ..Config::DEFAULT }, Key::DepWaitNs),
        (Config { local_min_residency: 1025, ..Config::DEFAULT }, Key::LocalMinResidency),
    ] {
        let fake = Fake::new(Generation::Gen1, 1 << 20);
        let e = Device::<Fake, 4>::new(&fake, &mut storage, bad, MmuMode::Bypass).err().unwrap();
        assert_eq!(e, InitError::OutOfRange(RangeError { key }));
        assert_eq!(fake.state().allocs, 0);
    }
    // A batch window over 100 ms, or any window in a build without
    // deferred doorbells.
    let windows: &[u64] = if umd_core::engine::batch::BUILT { &[100_000_001] } else { &[1, 100_000_001] };
    for &batch_window_ns in windows {
        let bad = Config { batch_window_ns, ..Config::DEFAULT };
        let fake = Fake::new(Generation::Gen1, 1 << 20);
        let e = Device::<Fake, 4>::new(&fake, &mut storage, bad, MmuMode::Bypass).err().unwrap();
        assert_eq!(e, InitError::OutOfRange(RangeError { key: Key::BatchWindowNs }));
        assert_eq!(fake.state().allocs, 0);
    }
    let fake = Fake::new(Generation::Gen1, 1 << 20);
    fake.state().regs[0] = 0x1234_0100;
    let e = Device::<Fake, 4>::new(&fake, &mut storage, Config::DEFAULT, MmuMode::Bypass).err().unwrap();
    assert!(matches!(e, InitError::Probe(_)));
    // Out of memory half-way: everything allocated so far is freed.
    let fake = Fake::new(Generation::Gen1, 256 << 10);
    let e = Device::<Fake, 64>::new(&fake, &mut storage, Config::DEFAULT, MmuMode::Bypass).err().unwrap();
    assert_eq!(e, InitError::OutOfMemory { what: "IB pool", len: 64 * 65536 }, "names the pool");
    assert!(e.to_string().contains("for the IB pool (4194304 bytes)"), "{e}");
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
        let e = Device::<'_, Fake, 8>::new(&fake, &mut *storage, cfg, mmu).err().unwrap();
        assert_eq!(fake.state().bytes_in_use(), 0, "a failed Device::new gives everything back");
        assert_eq!(plan.check(short).unwrap_err().what, "IB pool");
        assert_eq!(e, InitError::OutOfMemory { what: "IB pool", len: plan.ib_pool });
    }
    // A 64-page carve-out with the default MMU layout: the 64 table pages
    // take it all, and both the plan and bring-up name the fence slots.
    let plan = MemoryPlan::new(&Config::DEFAULT, MmuMode::DEFAULT, 16, 3);
    assert_eq!(plan.check(64 * 4096).unwrap_err().what, "fence slots");
    let fake = Fake::new(Generation::Gen2, 64 * 4096);
    let mut storage: Box<Storage> = Box::default();
    let e =
        Device::<'_, Fake, 16>::new(&fake, &mut *storage, Config::DEFAULT, MmuMode::DEFAULT).err().unwrap();
    assert_eq!(e, InitError::OutOfMemory { what: "fence slots", len: 4096 });
    assert_eq!(fake.state().bytes_in_use(), 0);
}

#[test]
fn handles_cannot_dangle_or_cross_devices() {
    let (fa, fb) = (Fake::new(Generation::Gen1, 8 << 20), Fake::new(Generation::Gen1, 8 << 20));
    let (mut sa, mut sb): (Box<Storage>, Box<Storage>) = (Box::default(), Box::default());
    let a = Device::<Fake, 4>::new(&fa, &mut sa, small_cfg(), MmuMode::Bypass).unwrap();
    let b = Device::<Fake, 4>::new(&fb, &mut sb, small_cfg(), MmuMode::Bypass).unwrap();
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
fn shutdown_reports_leaks_with_tags() {
    let fake = Fake::new(Generation::Gen2, 8 << 20);
    let mut storage: Box<Storage> = Box::default();
    let dev = Device::<Fake, 4>::new(&fake, &mut storage, small_cfg(), MmuMode::Bypass).unwrap();
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

/// The sizes the guide and the rustdoc quote are the real ones (to the
/// KiB, on a 64-bit host with the default features and neither
/// `validation` nor `size-first`), and so are
/// `docs/perf.md`'s table rows (to 2 %): a change of the device's or the
/// storage's layout that moves them fails here until the text follows.
#[cfg(all(
    target_pointer_width = "64",
    feature = "trace",
    feature = "hang-capture",
    feature = "local-memory",
    feature = "mmu",
    not(feature = "validation"),
    not(feature = "size-first")
))]
#[test]
fn the_documented_sizes_are_the_real_ones() {
    use std::mem::size_of;
    use umd_core::storage::DeviceStorage;
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let read = |f: &str| std::fs::read_to_string(format!("{root}/{f}")).unwrap();
    let (guide, src, perf) =
        (read("docs/porting.md"), read("umd-core/src/direct/mod.rs"), read("docs/perf.md"));
    let kib = |n: usize| (n + 512) / 1024;
    let dev = size_of::<Device<'_, Fake, 16>>();
    let storage = size_of::<DeviceStorage<64, 128, 32, 64>>();
    let flat = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
    let (guide, src) = (flat(&guide), flat(&src));
    assert!(
        guide.contains(&format!("about {} KiB on a 64-bit host", kib(dev))),
        "porting.md: device is {dev} B"
    );
    assert!(
        src.contains(&format!("{} KiB on 64-bit hosts", kib(dev))),
        "Device::new's rustdoc: device is {dev} B"
    );
    assert!(
        guide.contains(&format!("64 trace events: about {} KiB", kib(storage))),
        "porting.md: DeviceStorage<64, 128, 32, 64> is {storage} B"
    );
    // docs/perf.md: "| `Device<Fake, 16>` | 16,168 |".
    let row = |name: &str| -> usize {
        let line = perf.lines().find(|l| l.starts_with(&format!("| `{name}`"))).unwrap();
        line.rsplit('|').nth(1).unwrap().trim().replace(',', "").parse().unwrap()
    };
    for (name, real) in [("Device<Fake, 16>", dev), ("DeviceStorage<64, 128, 32, 64>", storage)] {
        let doc = row(name);
        assert!(doc.abs_diff(real) * 50 <= real, "docs/perf.md says {doc} B for {name}, it is {real} B");
    }
}

/// The fake behind a platform that gives the device wrong addresses: every
/// region's device address is `skew` bytes off (a wrong memory base).
struct WrongBase<'a> {
    fake: &'a Fake,
    skew: u64,
}

// SAFETY: for the test's purpose the device addresses are wrong (that is
// what bring-up must catch); the CPU side is the fake's, valid and owned
// as the fake's `dma_alloc` promises, and given back to it unchanged.
unsafe impl umd_core::platform::Platform for WrongBase<'_> {
    type RawMutex = umd_core::platform::SpinLock;
    fn dma_alloc(
        &self,
        len: usize,
        flags: umd_core::platform::DmaFlags,
    ) -> Result<umd_core::platform::DmaRegion, umd_core::platform::PlatformError> {
        let r = self.fake.dma_alloc(len, flags)?;
        let (cpu, dev, len) = (r.cpu_ptr().unwrap(), r.dev_addr(), r.len());
        // SAFETY: the fake's region, re-labelled (see the impl comment).
        Ok(unsafe { umd_core::platform::DmaRegion::new(cpu, dev.wrapping_add(self.skew), len) })
    }
    fn dma_free(&self, r: umd_core::platform::DmaRegion) {
        let (cpu, dev, len) = (r.cpu_ptr().unwrap(), r.dev_addr(), r.len());
        // SAFETY: the region the fake handed out, with its own address.
        self.fake
            .dma_free(unsafe { umd_core::platform::DmaRegion::new(cpu, dev.wrapping_sub(self.skew), len) });
    }
    fn now_ns(&self) -> u64 {
        self.fake.now_ns()
    }
    fn delay_ns(&self, ns: u64) {
        self.fake.delay_ns(ns)
    }
}

impl umd_core::platform::DirectIo for WrongBase<'_> {
    fn read_reg(&self, off: u32) -> Result<u32, umd_core::platform::PlatformError> {
        self.fake.read_reg(off)
    }
    fn write_reg(&self, off: u32, v: u32) -> Result<(), umd_core::platform::PlatformError> {
        self.fake.write_reg(off, v)
    }
    fn doorbell(&self, e: u32) -> Result<(), umd_core::platform::PlatformError> {
        self.fake.doorbell(e)
    }
}

/// Bring-up's fence round trip catches memory the device does not reach at
/// the addresses it was given (a wrong memory base), with the MMU on and
/// bypassed: `InitError::RoundTrip` names the scratch word's physical
/// address and the driver's memory window, and everything is given back.
/// With the right addresses the same device comes up and the round trip
/// leaves nothing behind (the ring empty, the scratch word 0).
#[test]
fn a_wrong_memory_base_fails_bring_up_with_the_address_and_the_window() {
    use umd_core::platform::DirectIo;
    let modes: &[MmuMode] =
        if umd_core::direct::MMU { &[MmuMode::DEFAULT, MmuMode::Bypass] } else { &[MmuMode::Bypass] };
    for &mmu in modes {
        let fake = Fake::new(Generation::Gen2, 4 << 20);
        let skew = 0x4000_0000;
        let wrong = WrongBase { fake: &fake, skew };
        let mut storage: Box<Storage> = Box::default();
        let Err(e) = Device::<'_, _, 4>::new(&wrong, &mut *storage, small_cfg(), mmu) else {
            panic!("refused")
        };
        let InitError::RoundTrip { queue, phys, window, fault } = e else { panic!("{e:?}") };
        assert_eq!(queue, 0);
        assert!(window.0 >= 0x8000_0000 + skew && phys >= window.0 && phys < window.1, "{e}");
        assert_eq!(fault, None, "the fake drops what it cannot reach");
        let text = e.to_string();
        assert!(
            text.contains(&format!("physical address {phys:#x}")) && text.contains("never reached the CPU"),
            "{text}"
        );
        assert!(text.contains(&format!("[{:#x}, {:#x})", window.0, window.1)), "{text}");
        assert_eq!(fake.state().bytes_in_use(), 0, "a failed bring-up gives everything back");

        let fake = Fake::new(Generation::Gen2, 4 << 20);
        let right = WrongBase { fake: &fake, skew: 0 };
        let dev = Device::<'_, _, 4>::new(&right, &mut *storage, small_cfg(), mmu).expect("comes up");
        assert_eq!(fake.state().doorbells, 3, "one round trip per engine");
        for e in 0..3 {
            let rptr =
                right.read_reg(umd_core::hw::regs::engine_reg(e, umd_core::hw::regs::engine::RING_RPTR));
            assert_eq!(rptr, Ok(0), "engine {e} reset after the round trip");
        }
        let g = dev.submit(QueueId::GFX, &[], |cb| cb.barrier()).unwrap();
        dev.wait(g, 1_000_000_000).unwrap();
        drop(dev);
    }
}

/// `docs/perf.md`, "Capacity and RAM per configuration": the bytes of
/// `DeviceStorage` per unit of each parameter, the fixed part, the
/// totals of the default and the MCU configuration, and the device's bytes
/// per IB chunk are the real ones
/// (exactly, on a 64-bit host with the default features and neither
/// `validation` nor `size-first`).
#[cfg(all(
    target_pointer_width = "64",
    feature = "trace",
    feature = "hang-capture",
    feature = "local-memory",
    feature = "mmu",
    not(feature = "validation"),
    not(feature = "size-first")
))]
#[test]
fn the_capacity_table_is_the_real_one() {
    use std::mem::size_of;
    use umd_core::storage::{DeviceStorage, McuStorage};
    let perf = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/perf.md")).unwrap();
    let section = perf.split("### Capacity and RAM per configuration").nth(1).expect("the section");
    let section = section.split("\n## ").next().unwrap_or(section);
    // The numbers of the row that starts with "| `name`": thousands
    // separators dropped, cells that are not a number skipped.
    let row = |name: &str| -> Vec<usize> {
        let line = section
            .lines()
            .find(|l| l.starts_with(&format!("| {name} ")))
            .unwrap_or_else(|| panic!("docs/perf.md, 'Capacity and RAM per configuration': no row {name}"));
        line.split('|').filter_map(|c| c.trim().replace(',', "").parse().ok()).collect()
    };
    // 64 units more of one parameter, over 64 of every one (the hang log's
    // 4 and 68: its reports are the largest elements).
    type Base = DeviceStorage<64, 64, 64, 64, 64, 4>;
    let base = size_of::<Base>();
    let per = |bigger: usize| {
        let d = bigger - base;
        assert_eq!(d % 64, 0, "{d} B for 64 more units: not linear");
        d / 64
    };
    // (row, bytes per unit, units in `Base`, in the default, in the MCU
    // configuration)
    let units = [
        ("`BUFFERS`", per(size_of::<DeviceStorage<128, 64, 64, 64, 64, 4>>()), 64, 1024, 64),
        ("`VA_NODES`", per(size_of::<DeviceStorage<64, 128, 64, 64, 64, 4>>()), 64, 1024, 0),
        ("`SLABS`", per(size_of::<DeviceStorage<64, 64, 128, 64, 64, 4>>()), 64, 256, 16),
        ("`TRACE`", per(size_of::<DeviceStorage<64, 64, 64, 128, 64, 4>>()), 64, 256, 0),
        ("`LOCAL_NODES`", per(size_of::<DeviceStorage<64, 64, 64, 64, 128, 4>>()), 64, 128, 0),
        ("`HANGS`", per(size_of::<DeviceStorage<64, 64, 64, 64, 64, 68>>()), 4, 4, 1),
    ];
    let fixed = base - units.iter().map(|u| u.1 * u.2).sum::<usize>();
    let (default, mcu) = (size_of::<DeviceStorage>(), size_of::<McuStorage>());
    for (name, bytes, _, d, m) in units {
        assert_eq!(row(name), vec![bytes, d, bytes * d, m, bytes * m], "row {name}");
    }
    assert_eq!(row("fixed"), vec![fixed, fixed, fixed], "the fixed part");
    let sum = |pick: fn(&(&str, usize, usize, usize, usize)) -> usize| {
        fixed + units.iter().map(pick).sum::<usize>()
    };
    assert_eq!(sum(|u| u.1 * u.3), default, "the default total is the parts' sum");
    assert_eq!(sum(|u| u.1 * u.4), mcu, "the MCU total is the parts' sum");
    assert_eq!(row("total"), vec![default, mcu], "the totals");
    // What an IB chunk adds to the device.
    let chunk = (size_of::<Device<'_, Fake, 16>>() - size_of::<Device<'_, Fake, 8>>()) / 8;
    let flat = section.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains(&format!("adds {chunk} B per IB chunk")), "an IB chunk is {chunk} B of the device");
}

/// The MCU configuration's storage has no VA nodes: bring-up with the MMU
/// on is refused, naming the parameter, and leaves nothing allocated; in
/// bypass it comes up.
#[cfg(feature = "mmu")]
#[test]
fn a_storage_without_va_nodes_names_them_with_the_mmu_on() {
    use umd_core::mem::VaError;
    use umd_core::storage::{McuStorage, MCU_CHUNKS};
    let fake = Fake::new(Generation::Gen2, 8 << 20);
    let mut storage: Box<McuStorage> = Box::default();
    let err =
        Device::<Fake, MCU_CHUNKS>::new(&fake, &mut storage, small_cfg(), MmuMode::DEFAULT).unwrap_err();
    assert_eq!(err, InitError::Va(VaError::NodeCapacity));
    assert!(err.to_string().ends_with("raise DeviceStorage's VA_NODES parameter"), "{err}");
    assert_eq!(fake.state().allocs, 0, "nothing left allocated");
    let dev = Device::<Fake, MCU_CHUNKS>::new(&fake, &mut storage, small_cfg(), MmuMode::Bypass).unwrap();
    dev.free(dev.alloc_buffer(64).unwrap()).unwrap();
}
