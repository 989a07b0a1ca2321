//! Async fence waits under a std executor (`futures::executor::block_on`
//! over `futures::join!`, one thread) on the in-process model: two tasks
//! submit to different queues and await their fences concurrently, woken
//! by a timer thread that drives the `Wakeups` hub on its adaptive
//! schedule (it sleeps until the next deadline the hub reports). If a
//! wait blocked the executor, one task would finish all its rounds before
//! the other started; the test checks that they interleave.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use platform_linux::InProcess;
use refgpu_model::{FaultInjection, ModelConfig};
use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::engine::{AnyWaitError, Wakeups};
use umd_core::error::WaitError;
use umd_core::platform::Platform;
use umd_core::storage::DeviceStorage;
use umd_core::sync::QueueId;

const ROUNDS: u32 = 40;

#[test]
fn two_tasks_on_two_queues_interleave_on_one_thread() {
    // Every packet takes 100 µs, so no fence is done at its first check:
    // each await really suspends.
    let fault_injection =
        FaultInjection { packet_latency: Duration::from_micros(100), ..FaultInjection::default() };
    let platform = InProcess::new(ModelConfig { fault_injection, ..ModelConfig::default() }).unwrap();
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, InProcess, 16> =
        Device::new(&platform, &mut storage, Config::DEFAULT, MmuMode::DEFAULT).unwrap();
    let hub: Wakeups<8> = Wakeups::new();
    let done = AtomicBool::new(false);
    let log: RefCell<Vec<(u8, u32)>> = RefCell::new(Vec::new());
    let bufs = [dev.alloc_buffer(4096).unwrap(), dev.alloc_buffer(4096).unwrap()];
    let vas = [dev.va(bufs[0]).unwrap(), dev.va(bufs[1]).unwrap()];

    std::thread::scope(|s| {
        // The timer: tick at the hub's next deadline (at most every 1 ms,
        // at least every 1 µs).
        s.spawn(|| {
            while !done.load(Ordering::Acquire) {
                let now = platform.now_ns();
                let next = hub.on_tick(now).unwrap_or(now + 1_000_000);
                std::thread::sleep(Duration::from_nanos(next.saturating_sub(now).clamp(1_000, 1_000_000)));
            }
        });
        let task = |t: u8| {
            let (dev, hub, log) = (&dev, &hub, &log);
            let (q, va) = (QueueId(if t == 0 { 0 } else { 2 }), vas[usize::from(t)]);
            async move {
                for i in 0..ROUNDS {
                    let f = dev.submit(q, &[], |cb| cb.write_data(va + 4 * u64::from(i), &[i])).unwrap();
                    log.borrow_mut().push((t, i));
                    dev.wait_async(hub, f).timeout_ns(10_000_000_000).await.unwrap();
                }
                // "Any of": one fence on this task's queue, one on COMPUTE.
                let a = dev.submit(q, &[], |cb| cb.write_data(va + 0x800, &[1])).unwrap();
                let b = dev.submit(QueueId::COMPUTE, &[], |cb| cb.write_data(va + 0x804, &[2])).unwrap();
                let list = [a, b];
                let i = dev.wait_any_async(hub, &list).await.unwrap();
                assert_eq!(dev.query(list[i]), Ok(umd_core::error::FenceStatus::Signalled));
            }
        };
        futures::executor::block_on(async {
            futures::join!(task(0), task(1));
        });
        done.store(true, Ordering::Release);
    });

    let log = log.into_inner();
    let last_of_0 = log.iter().rposition(|(t, _)| *t == 0).unwrap();
    let first_of_1 = log.iter().position(|(t, _)| *t == 1).unwrap();
    assert!(first_of_1 < last_of_0, "task 1 started only after task 0 was done: the waits blocked {log:?}");
    for (t, b) in bufs.iter().enumerate() {
        let mut out = vec![0u8; 4 * ROUNDS as usize];
        dev.read(*b, 0, &mut out).unwrap();
        let words: Vec<u32> = out.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(words, (0..ROUNDS).collect::<Vec<_>>(), "task {t}'s writes");
    }
    // The blocking API beside it.
    let f = dev.submit(QueueId::COMPUTE, &[], |cb| cb.write_data(vas[0] + 0x900, &[7])).unwrap();
    dev.wait(f, 1_000_000_000).unwrap();
    // Bad input: nothing to wait for.
    let r = futures::executor::block_on(dev.wait_any_async(&hub, &[]));
    assert_eq!(r, Err(AnyWaitError::Empty));
    let r = futures::executor::block_on(dev.wait_async(&hub, f).timeout_ns(0));
    assert!(matches!(r, Ok(()) | Err(WaitError::Timeout)), "{r:?}");
}
