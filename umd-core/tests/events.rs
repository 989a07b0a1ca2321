//! Events and timestamp queries on the scripted fake: GPU set and wait
//! in ring order, host set/reset/query/wait, timestamps in nanoseconds,
//! and the bad inputs (destroyed, foreign, timeout).

mod support;

use support::{Fake, Mode, NonCoherent, Scripted};
use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::engine::EventError;
use umd_core::hw::Generation;
use umd_core::mem::BufferError;
use umd_core::storage::DeviceStorage;
use umd_core::sync::QueueId;

type Storage = DeviceStorage<64, 128, 32, 64>;

fn cfg() -> Config {
    Config { ring_bytes: 4096, ib_chunk_bytes: 4096, use_irq: false, ..Config::DEFAULT }
}

#[test]
fn set_wait_reset_and_timestamps() {
    let fake = Fake::new(Generation::Gen2, 8 << 20);
    let mut storage: Box<Storage> = Box::default();
    let dev = Device::<Fake, 4>::new(&fake, &mut storage, cfg(), MmuMode::Bypass).unwrap();
    fake.state().mode = Mode::OnDelay;
    let ev = dev.create_event().unwrap();
    let ts = dev.create_timestamp().unwrap();
    assert_eq!(dev.event_is_set(ev), Ok(false));
    assert_eq!(dev.timestamp_ns(ts), Ok(None), "0 until written");
    let f = dev
        .submit(QueueId::COPY, &[], |cb| {
            cb.push(&ts.write())?;
            cb.push(&ev.set())
        })
        .unwrap();
    dev.wait_event(ev, 1_000_000_000).unwrap();
    dev.wait(f, 1_000_000_000).unwrap();
    let t = dev.timestamp_ns(ts).unwrap().expect("written");
    assert!(t > 0);
    dev.reset_event(ev).unwrap();
    assert_eq!(dev.event_is_set(ev), Ok(false));
    assert_eq!(dev.wait_event(ev, 5_000_000), Err(EventError::Timeout));
    dev.set_event(ev).unwrap();
    assert_eq!(dev.wait_event(ev, 0), Ok(()), "already set: no wait needed");
    dev.destroy_event(ev).unwrap();
    assert_eq!(dev.event_is_set(ev), Err(BufferError::Stale));
    assert_eq!(dev.wait_event(ev, 1), Err(EventError::Buffer(BufferError::Stale)));
    assert_eq!(dev.destroy_event(ev), Err(BufferError::Stale));
    dev.destroy_timestamp(ts).unwrap();
}

#[test]
fn an_event_of_another_device_is_refused() {
    let (fa, fb) = (Fake::new(Generation::Gen1, 8 << 20), Fake::new(Generation::Gen1, 8 << 20));
    let (mut sa, mut sb): (Box<Storage>, Box<Storage>) = (Box::default(), Box::default());
    let a = Device::<Fake, 4>::new(&fa, &mut sa, cfg(), MmuMode::Bypass).unwrap();
    let b = Device::<Fake, 4>::new(&fb, &mut sb, cfg(), MmuMode::Bypass).unwrap();
    let ev = a.create_event().unwrap();
    assert!(matches!(b.set_event(ev), Err(BufferError::ForeignDevice { .. })));
    assert!(matches!(b.destroy_event(ev), Err(BufferError::ForeignDevice { .. })));
    assert_eq!(a.event_is_set(ev), Ok(false), "the owner's event is unchanged");
}

/// The event's word moves between the CPU and the GPU in both directions,
/// on a coherent system and on a non-coherent one, where only the driver's
/// clean after the host's store puts the value in the memory the GPU reads,
/// and only its invalidate before the host's load shows the host what the
/// GPU wrote.
#[test]
fn host_and_gpu_see_each_others_event_writes() {
    for gen in [Generation::Gen1, Generation::Gen2] {
        handoff(Fake::new(gen, 8 << 20));
        handoff(NonCoherent::new(gen, 8 << 20));
    }
}

fn handoff<P: Scripted>(fake: P) {
    let mut storage: Box<Storage> = Box::default();
    let dev = Device::<P, 4>::new(&fake, &mut storage, cfg(), MmuMode::Bypass).unwrap();
    dev.platform().state().mode = Mode::OnDelay;
    let ev = dev.create_event().unwrap();
    let on_gpu = || dev.platform().state().read_u32(ev.va()).expect("the event's word is in memory");
    // Host to GPU: set and reset reach device memory.
    dev.set_event(ev).unwrap();
    assert_eq!(on_gpu(), 1, "the host's set did not reach the GPU");
    dev.reset_event(ev).unwrap();
    assert_eq!(on_gpu(), 0, "the host's reset did not reach the GPU");
    // GPU to host: the host sees the GPU's set (its wait and its query)
    // and then the GPU's reset.
    let set = dev.submit(QueueId::COPY, &[], |cb| cb.push(&ev.set())).unwrap();
    dev.wait_event(ev, 1_000_000_000).unwrap();
    dev.wait(set, 1_000_000_000).unwrap();
    assert_eq!(dev.event_is_set(ev), Ok(true));
    let reset = dev.submit(QueueId::COPY, &[], |cb| cb.push(&ev.reset())).unwrap();
    dev.wait(reset, 1_000_000_000).unwrap();
    assert_eq!(dev.event_is_set(ev), Ok(false), "the host did not see the GPU's reset");
}
