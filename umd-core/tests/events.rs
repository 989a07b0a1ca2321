//! Events and timestamp queries on the scripted fake: GPU set and wait
//! in ring order, host set/reset/query/wait, timestamps in nanoseconds,
//! and the bad inputs (destroyed, foreign, timeout).

mod support;

use support::{Fake, Mode};
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
        .submit(QueueId(2), &[], |cb| {
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
