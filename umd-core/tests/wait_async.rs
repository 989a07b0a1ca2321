//! Async fence waits (`DeviceCore::wait_async`, `wait_any_async`, `Wakeups`)
//! against the scripted fake, polled by hand with a counting waker, so
//! every step is seen: pending and registered with the adaptive
//! deadline, woken by a tick or an interrupt, ready once the engine ran;
//! the any-of future's index, its errors and bad input; a full hub. (The same futures under a real executor
//! with the in-process model: `platform-linux/tests/async_wait.rs`.)

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::engine::{AnyWaitError, Wakeups};
use umd_core::error::WaitError;
use umd_core::hw::Generation;
use umd_core::platform::fake::{EngineFault, Fake, Mode};
use umd_core::storage::DeviceStorage;
use umd_core::sync::{FenceError, QueueId};

type Storage = DeviceStorage<256, 256, 64, 256>;

struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn waker() -> (Arc<Count>, Waker) {
    let c = Arc::new(Count(AtomicUsize::new(0)));
    (c.clone(), Waker::from(c))
}

fn cfg() -> Config {
    Config { ring_bytes: 4096, ib_chunk_bytes: 4096, use_irq: false, ..Config::DEFAULT }
}

fn with_device(f: impl FnOnce(&Device<'_, Fake, 4>)) {
    let fake = Fake::new(Generation::Gen2, 4 << 20);
    let mut storage: Box<Storage> = Box::default();
    let dev: Device<'_, Fake, 4> = Device::new(&fake, &mut *storage, cfg(), MmuMode::Bypass).unwrap();
    dev.platform().state().mode = Mode::Manual;
    f(&dev);
}

#[test]
fn pending_then_woken_by_tick_then_ready() {
    with_device(|dev| {
        let hub: Wakeups<4> = Wakeups::new();
        let f = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8010_0000)).unwrap();
        let (count, w) = waker();
        let mut cx = Context::from_waker(&w);
        let mut fut = pin!(dev.wait_async(&hub, f));
        // Spin phase of the schedule (first 2 µs): the future wakes itself.
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Pending);
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "woke itself while the schedule spins");
        assert_eq!(hub.waiting(), 0);
        // Past the spin phase: registered with a deadline one interval on.
        dev.platform().state().now += 5_000;
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Pending);
        assert_eq!(hub.waiting(), 1);
        let now = dev.platform().state().now;
        let deadline = hub.next_deadline().unwrap();
        assert!(deadline > now && deadline <= now + 1_100, "1 µs step: {deadline} vs {now}");
        // A tick before the deadline wakes nobody; at the deadline it does.
        assert_eq!(hub.on_tick(deadline - 1), Some(deadline));
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert_eq!(hub.on_tick(deadline), None);
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert_eq!(hub.waiting(), 0);
        // Woken but not done: registers again.
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Pending);
        dev.platform().state().run(0);
        assert_eq!(hub.on_interrupt(), 1, "an interrupt wakes every waiter");
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Ready(Ok(())));
        // The blocking API is unchanged.
        assert_eq!(dev.wait(f, 0), Ok(()));
    });
}

#[test]
fn deadlines_follow_the_adaptive_schedule() {
    with_device(|dev| {
        let hub: Wakeups<4> = Wakeups::new();
        let f = dev.submit(QueueId::COMPUTE, &[], |cb| cb.timestamp(0x8010_0000)).unwrap();
        let (_c, w) = waker();
        let mut cx = Context::from_waker(&w);
        let mut fut = pin!(dev.wait_async(&hub, f));
        assert!(fut.as_mut().poll(&mut cx).is_pending()); // starts the clock
        for (advance, step) in [(200_000u64, 10_000u64), (2_000_000, 100_000)] {
            dev.platform().state().now += advance;
            assert!(fut.as_mut().poll(&mut cx).is_pending());
            let now = dev.platform().state().now;
            let d = hub.next_deadline().unwrap();
            assert!(d > now && d <= now + step + 200, "step {step}: deadline {d}, now {now}");
        }
    });
}

#[test]
fn any_of_reports_the_first_done_and_errors() {
    with_device(|dev| {
        let hub: Wakeups<4> = Wakeups::new();
        let a = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8010_0000)).unwrap();
        let b = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8010_0100)).unwrap();
        let (_c, w) = waker();
        let mut cx = Context::from_waker(&w);
        let list = [a, b];
        let mut fut = pin!(dev.wait_any_async(&hub, &list));
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        dev.platform().state().run(2);
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Ready(Ok(1)), "the COPY fence finished first");

        let mut empty = pin!(dev.wait_any_async(&hub, &[]));
        assert_eq!(empty.as_mut().poll(&mut cx), Poll::Ready(Err(AnyWaitError::Empty)));

        // A fence that was never submitted is refused, with its index.
        let mut future_fence = b;
        for _ in 0..5 {
            future_fence = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8010_0200)).unwrap();
        }
        dev.platform().state().run(2);
        let other = Fake::new(Generation::Gen2, 4 << 20);
        let mut st2: Box<Storage> = Box::default();
        let dev2: Device<'_, Fake, 4> = Device::new(&other, &mut *st2, cfg(), MmuMode::Bypass).unwrap();
        let foreign = dev2.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8010_0000)).unwrap();
        let list = [future_fence, foreign];
        let mut fut = pin!(dev.wait_any_async(&hub, &list));
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Ready(Ok(0)), "the first in list order wins");
        let list = [foreign, future_fence];
        let mut fut = pin!(dev.wait_any_async(&hub, &list));
        assert_eq!(
            fut.as_mut().poll(&mut cx),
            Poll::Ready(Err(AnyWaitError::Fence { index: 0, error: WaitError::ForeignFence(foreign) }))
        );
    });
}

#[test]
fn timeout_and_hang_end_the_future() {
    with_device(|dev| {
        let hub: Wakeups<4> = Wakeups::new();
        dev.platform().state().engines[0].fault = EngineFault::Stuck;
        let f = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8010_0000)).unwrap();
        let (_c, w) = waker();
        let mut cx = Context::from_waker(&w);
        let mut fut = pin!(dev.wait_async(&hub, f).timeout_ns(50_000));
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        dev.platform().state().now += 60_000;
        assert_eq!(fut.as_mut().poll(&mut cx), Poll::Ready(Err(WaitError::Timeout)));
        // Without a timeout, the device's hang check fails the fence.
        let mut fut = pin!(dev.wait_async(&hub, f));
        let mut result = Poll::Pending;
        for _ in 0..100 {
            dev.platform().state().now += 200_000_000;
            result = fut.as_mut().poll(&mut cx);
            if result.is_ready() {
                break;
            }
        }
        match result {
            Poll::Ready(Err(WaitError::Failed(FenceError::DeviceHung))) => {}
            other => panic!("{other:?}"),
        }
    });
}

#[test]
fn a_full_hub_wakes_the_future_itself() {
    with_device(|dev| {
        let hub: Wakeups<1> = Wakeups::new();
        let a = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8010_0000)).unwrap();
        let b = dev.submit(QueueId::COMPUTE, &[], |cb| cb.timestamp(0x8010_0100)).unwrap();
        dev.platform().state().now += 5_000;
        let (ca, wa) = waker();
        let (cb, wb) = waker();
        let mut fa = pin!(dev.wait_async(&hub, a));
        let mut fb = pin!(dev.wait_async(&hub, b));
        assert!(fa.as_mut().poll(&mut Context::from_waker(&wa)).is_pending());
        dev.platform().state().now += 5_000;
        assert!(fa.as_mut().poll(&mut Context::from_waker(&wa)).is_pending());
        assert_eq!(hub.waiting(), 1);
        assert_eq!(ca.0.load(Ordering::SeqCst), 1, "self-woken in the spin phase only, then registered");
        assert!(fb.as_mut().poll(&mut Context::from_waker(&wb)).is_pending());
        dev.platform().state().now += 5_000;
        assert!(fb.as_mut().poll(&mut Context::from_waker(&wb)).is_pending());
        assert_eq!(cb.0.load(Ordering::SeqCst), 2, "no slot: woke itself (spin phase, then full hub)");
    });
    // Ticks wake only what is due; interrupts wake everyone.
    let hub: Wakeups<2> = Wakeups::new();
    let (c1, w1) = waker();
    let (c2, w2) = waker();
    assert!(hub.register(&w1, 100));
    assert!(hub.register(&w2, 300));
    assert!(hub.register(&w1, 200), "the same waker refreshes its slot");
    assert_eq!(hub.waiting(), 2);
    assert_eq!(hub.on_tick(150), Some(200));
    assert_eq!(hub.on_tick(200), Some(300));
    assert_eq!((c1.0.load(Ordering::SeqCst), c2.0.load(Ordering::SeqCst)), (1, 0));
    assert_eq!(hub.on_interrupt(), 1);
    assert_eq!(c2.0.load(Ordering::SeqCst), 1);
    assert_eq!(hub.next_deadline(), None);
}

static ARMED: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

fn arm(deadline: u64) {
    ARMED.lock().unwrap().push(deadline);
}

#[test]
fn a_timer_hub_is_told_every_deadline() {
    let hub: Wakeups<1> = Wakeups::with_timer(arm);
    let (_c1, w1) = waker();
    let (_c2, w2) = waker();
    assert!(hub.register(&w1, 500));
    assert!(!hub.register(&w2, 400), "full: not stored, so no timer");
    assert!(hub.register(&w1, 300));
    assert_eq!(*ARMED.lock().unwrap(), [500, 300]);
}

/// A waker that counts its wakes and the clones of it still alive (the
/// hub's copy among them), so a test sees whether a dropped future left
/// its waker behind.
struct Tracked {
    wakes: AtomicUsize,
}

impl Wake for Tracked {
    fn wake(self: Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
    }
}

fn tracked() -> (Arc<Tracked>, Waker) {
    let t = Arc::new(Tracked { wakes: AtomicUsize::new(0) });
    (t.clone(), Waker::from(t))
}

/// Dropping a pending wait gives its hub slot back at once (its waker
/// too: no later interrupt or tick wakes the dead task), and with a hub of
/// two slots the live wait beside it is not busy-polled: a new wait takes
/// the freed slot instead of waking itself on every poll, and the live one
/// stays registered until the work is done.
#[test]
fn a_dropped_wait_releases_its_slot_at_once() {
    with_device(|dev| {
        let hub: Wakeups<2> = Wakeups::new();
        let a = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8010_0000)).unwrap();
        let b = dev.submit(QueueId::COMPUTE, &[], |cb| cb.timestamp(0x8010_0100)).unwrap();
        let c = dev.submit(QueueId::COPY, &[], |cb| cb.timestamp(0x8010_0200)).unwrap();
        let (live, w_live) = tracked();
        let (dead, w_dead) = tracked();
        let (next, w_next) = tracked();
        let mut fa = Box::pin(dev.wait_async(&hub, a));
        let mut fb = Box::pin(dev.wait_async(&hub, b));
        // The first poll starts the clock (spin phase: each wakes itself
        // once); past the spin phase both register.
        assert!(fa.as_mut().poll(&mut Context::from_waker(&w_live)).is_pending());
        assert!(fb.as_mut().poll(&mut Context::from_waker(&w_dead)).is_pending());
        dev.platform().state().now += 5_000;
        assert!(fa.as_mut().poll(&mut Context::from_waker(&w_live)).is_pending());
        assert!(fb.as_mut().poll(&mut Context::from_waker(&w_dead)).is_pending());
        assert_eq!(hub.waiting(), 2);
        assert_eq!((live.wakes.load(Ordering::SeqCst), dead.wakes.load(Ordering::SeqCst)), (1, 1));
        assert_eq!(Arc::strong_count(&dead), 3, "the test's, the waker's and the hub's copy");
        drop(fb);
        assert_eq!(hub.waiting(), 1, "the dropped wait's slot is free at once");
        assert_eq!(Arc::strong_count(&dead), 2, "and the hub dropped its waker");
        // A new wait takes the freed slot past its spin phase: it does not
        // wake itself.
        let mut fc = Box::pin(dev.wait_async(&hub, c));
        assert!(fc.as_mut().poll(&mut Context::from_waker(&w_next)).is_pending());
        dev.platform().state().now += 5_000;
        assert!(fc.as_mut().poll(&mut Context::from_waker(&w_next)).is_pending());
        assert_eq!(hub.waiting(), 2);
        assert_eq!(next.wakes.load(Ordering::SeqCst), 1, "registered, self-woken in the spin phase only");
        // The live wait re-polled (a spurious poll) keeps its slot and is not
        // woken by itself: no busy polling.
        for _ in 0..10 {
            dev.platform().state().now += 500;
            assert!(fa.as_mut().poll(&mut Context::from_waker(&w_live)).is_pending());
            assert!(fc.as_mut().poll(&mut Context::from_waker(&w_next)).is_pending());
        }
        assert_eq!(hub.waiting(), 2);
        assert_eq!((live.wakes.load(Ordering::SeqCst), next.wakes.load(Ordering::SeqCst)), (1, 1));
        // An interrupt wakes the two live waits, never the dropped one.
        assert_eq!(hub.on_interrupt(), 2);
        assert_eq!(dead.wakes.load(Ordering::SeqCst), 1, "the dropped wait's task was woken");
        assert_eq!((live.wakes.load(Ordering::SeqCst), next.wakes.load(Ordering::SeqCst)), (2, 2));
        dev.platform().state().run(0);
        assert_eq!(fa.as_mut().poll(&mut Context::from_waker(&w_live)), Poll::Ready(Ok(())));
        // A wait that completed holds no slot either, even when it had
        // registered again before its work was done.
        assert!(fc.as_mut().poll(&mut Context::from_waker(&w_next)).is_pending());
        assert_eq!(hub.waiting(), 1);
        dev.platform().state().run(2);
        assert_eq!(fc.as_mut().poll(&mut Context::from_waker(&w_next)), Poll::Ready(Ok(())));
        assert_eq!(hub.waiting(), 0);
        drop((fa, fc));
        assert_eq!(hub.next_deadline(), None);
        assert_eq!(hub.on_tick(u64::MAX), None);
        assert_eq!(dead.wakes.load(Ordering::SeqCst), 1, "only its own spin-phase wake");
    });
}

/// Two waits polled by one task share its waker but not a slot: dropping
/// one (a `select` whose other branch won) leaves the other registered,
/// and a registration the hub already woke does not release the slot its
/// next occupant holds.
#[test]
fn waits_sharing_a_waker_hold_a_slot_each() {
    with_device(|dev| {
        let hub: Wakeups<2> = Wakeups::new();
        let a = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8010_0000)).unwrap();
        let b = dev.submit(QueueId::COMPUTE, &[], |cb| cb.timestamp(0x8010_0100)).unwrap();
        let (task, w) = tracked();
        let mut cx = Context::from_waker(&w);
        let mut fa = Box::pin(dev.wait_async(&hub, a));
        let fb_list = [b];
        let mut fb = Box::pin(dev.wait_any_async(&hub, &fb_list));
        assert!(fa.as_mut().poll(&mut cx).is_pending());
        assert!(fb.as_mut().poll(&mut cx).is_pending());
        dev.platform().state().now += 5_000;
        assert!(fa.as_mut().poll(&mut cx).is_pending());
        assert!(fb.as_mut().poll(&mut cx).is_pending());
        assert_eq!(hub.waiting(), 2);
        assert_eq!(task.wakes.load(Ordering::SeqCst), 2, "the spin phase's wakes only");
        drop(fb);
        assert_eq!(hub.waiting(), 1, "the other wait of the task is still registered");
        assert_eq!(hub.on_interrupt(), 1);
        assert_eq!(task.wakes.load(Ordering::SeqCst), 3);
        // The hub woke `fa` (its slot is empty); another waiter takes it.
        let (other, w_other) = tracked();
        let r = hub.register_slot(&w_other, 1_000, None).unwrap();
        drop(fa);
        assert_eq!(hub.waiting(), 1, "a stale registration released the slot's next occupant");
        assert_eq!(other.wakes.load(Ordering::SeqCst), 0);
        assert!(hub.release(r));
        assert!(!hub.release(r), "released once");
        assert_eq!(hub.waiting(), 0);
    });
}
