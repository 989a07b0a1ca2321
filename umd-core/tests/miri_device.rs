//! The driver's device paths on the fake platform, small enough for Miri
//! (`cargo +nightly miri test -p umd-core --test miri_device`, in
//! `.ci/run`): bring-up with the MMU on (page tables written as buffers
//! come and go; the fake's engines run only with it bypassed), buffers
//! written through the CPU and copied by an engine, a cross-queue wait,
//! frees behind in-flight work, a hung engine reset by the hang check,
//! and teardown. The same
//! tests run natively with `cargo test`. Miri checks the `unsafe` at the
//! hardware edge (DMA regions, fence slots, page tables, the fake's
//! memory) against the aliasing and provenance rules while they run.

use umd_core::config::{Config, HangConfig};
use umd_core::direct::{Device, MmuMode};
use umd_core::error::{FenceStatus, WaitError};
use umd_core::hw::Generation;
use umd_core::platform::fake::{EngineFault, Fake, Mode};
use umd_core::storage::DeviceStorage;
use umd_core::sync::{FenceError, QueueId};

/// A small device: few handles, nodes and slabs, one-page rings, and a
/// short hang window (every poll of a window is interpreted under Miri).
type Storage = DeviceStorage<16, 32, 8, 16, 1>;

fn cfg() -> Config {
    let hang = HangConfig { window_ns: 5_000_000, ..Config::DEFAULT.hang };
    Config { ring_bytes: 4096, ib_chunk_bytes: 4096, use_irq: false, hang, ..Config::DEFAULT }
}

fn with_device(gen: Generation, mmu: MmuMode, f: impl FnOnce(&Device<'_, Fake, 2>)) {
    let fake = Fake::new(gen, 1 << 20);
    let mut storage: Box<Storage> = Box::default();
    let dev = Device::<Fake, 2>::new(&fake, &mut storage, cfg(), mmu).expect("device comes up");
    f(&dev);
    let report = dev.shutdown();
    assert_eq!(report.leaked_buffers, 0);
    assert_eq!(fake.state().allocs, 0, "teardown gave every block back");
}

#[test]
fn buffers_with_the_mmu_on_are_mapped_written_and_freed() {
    with_device(Generation::Gen2, MmuMode::DEFAULT, |dev| {
        let small = dev.alloc_buffer(100).unwrap();
        let large = dev.alloc_buffer(64 << 10).unwrap();
        dev.write_words(large, 4096, &[1, 2, 3]).unwrap();
        {
            let mut m = dev.map(small).unwrap();
            m.words_mut()[0] = 0xC0DE;
        }
        assert_eq!(dev.read_u32(small, 0), Ok(0xC0DE));
        assert_eq!(dev.read_u32(large, 1025), Ok(2));
        assert_ne!(dev.va(small).unwrap(), dev.va(large).unwrap());
        dev.free(large).unwrap();
        dev.free(small).unwrap();
        let again = dev.alloc_buffer(64 << 10).unwrap();
        assert_eq!(dev.read_u32(again, 1025), Ok(0), "new memory comes zeroed");
        dev.free(again).unwrap();
    });
}

#[test]
fn copy_write_and_cross_queue_wait_land() {
    for gen in [Generation::Gen1, Generation::Gen2] {
        with_device(gen, MmuMode::Bypass, |dev| {
            let src = dev.alloc_buffer(256).unwrap();
            let dst = dev.alloc_buffer(256).unwrap();
            let words: Vec<u32> = (0..64).map(|i| i * 3).collect();
            dev.write_words(src, 0, &words).unwrap();
            let (s, d) = (dev.va(src).unwrap(), dev.va(dst).unwrap());
            let a = dev.submit(QueueId::COPY, &[], |cb| cb.copy(s, d, 128)).unwrap();
            let b = dev.submit(QueueId::GFX, &[a], |cb| cb.write_data(d + 128, &[7, 8])).unwrap();
            dev.free(src).unwrap();
            dev.wait(b, 1_000_000_000).unwrap();
            assert_eq!(dev.query(a), Ok(FenceStatus::Signalled));
            {
                let m = dev.map(dst).unwrap();
                assert_eq!(m.words()[10], 30);
                assert_eq!(m.words()[32..34], [7, 8]);
            }
            dev.free(dst).unwrap();
            dev.service();
            assert_eq!(dev.buffer_stats().waiting, 0);
        });
    }
}

#[test]
fn a_hung_engine_is_reset_and_its_waiter_fails_with_it() {
    with_device(Generation::Gen2, MmuMode::Bypass, |dev| {
        dev.platform().state().engines[0].fault = EngineFault::Stuck;
        let buf = dev.alloc_buffer(64).unwrap();
        let va = dev.va(buf).unwrap();
        let hung = dev.submit(QueueId::GFX, &[], |cb| cb.write_data(va, &[1])).unwrap();
        let waiter = dev.submit(QueueId::COPY, &[hung], |cb| cb.write_data(va + 4, &[2])).unwrap();
        assert_eq!(dev.wait(hung, 1_000_000_000), Err(WaitError::Failed(FenceError::DeviceHung)));
        assert!(matches!(
            dev.wait(waiter, 1_000_000_000),
            Err(WaitError::Failed(FenceError::Dependency { .. }))
        ));
        dev.platform().state().engines[0].fault = EngineFault::None;
        dev.platform().state().mode = Mode::OnDoorbell;
        let after = dev.submit(QueueId::GFX, &[], |cb| cb.write_data(va + 8, &[3])).unwrap();
        dev.wait(after, 1_000_000_000).unwrap();
        assert_eq!(dev.read_u32(buf, 2), Ok(3));
        dev.free(buf).unwrap();
    });
}

#[test]
fn a_device_built_in_its_own_memory_runs_and_gives_everything_back_when_dropped() {
    use core::mem::MaybeUninit;
    use umd_core::direct::{InPlace, InitError};
    let fake = Fake::new(Generation::Gen2, 1 << 20);
    // The slot's type names the storage's borrow: each device here takes
    // storage of its own.
    let (mut refused, mut first, mut second): (Box<Storage>, Box<Storage>, Box<Storage>) =
        (Box::default(), Box::default(), Box::default());
    let mut slot: Box<MaybeUninit<Device<'_, Fake, 2>>> = Box::new_uninit();
    // A refused bring-up leaves nothing behind, in the platform or the slot.
    let bad = Config { ring_bytes: 3000, ..cfg() };
    let e = Device::new_in(&mut slot, &fake, &mut refused, bad, MmuMode::Bypass).err();
    assert!(
        matches!(e, Some(InitError::OutOfRange(r)) if r.key == umd_core::config::Key::RingBytes),
        "{e:?}"
    );
    assert_eq!(fake.state().allocs, 0);
    {
        let dev =
            Device::new_in(&mut slot, &fake, &mut first, cfg(), MmuMode::Bypass).expect("device comes up");
        let (a, b) = (dev.alloc_buffer(256).unwrap(), dev.alloc_buffer(256).unwrap());
        dev.write_words(a, 0, &[5, 6, 7]).unwrap();
        let f =
            dev.submit(QueueId::COPY, &[], |cb| cb.copy(dev.va(a).unwrap(), dev.va(b).unwrap(), 12)).unwrap();
        dev.wait(f, 1_000_000_000).unwrap();
        assert_eq!(dev.read_u32(b, 2), Ok(7));
        dev.free(a).unwrap();
        dev.free(b).unwrap();
        assert!(fake.state().allocs > 0);
        // Dropping the handle drops the device where it lies.
    }
    assert_eq!(fake.state().allocs, 0, "dropping the handle gave every block back");
    // The same memory takes the next device (with the MMU: page tables
    // too); shutdown reports as a `Device`'s does.
    let dev =
        Device::new_in(&mut slot, &fake, &mut second, cfg(), MmuMode::DEFAULT).expect("device comes up");
    dev.alloc_buffer(64).unwrap();
    let report = InPlace::shutdown(dev);
    assert_eq!(report.leaked_buffers, 1);
    assert_eq!(fake.state().allocs, 0);
}
