//! Cortex-M async image (`mps2-an386`): `embassy-executor` (thread mode:
//! the core sleeps in WFE when no task is ready) runs two tasks that
//! submit to different queues (GFX and COPY) and await their fences
//! concurrently through `Device::wait_async`; a third future waits for
//! "any of" two fences. The waits are woken by TIMER0 one-shot ticks at
//! the deadlines of the adaptive schedule (`Wakeups::with_timer`): the
//! binding has no interrupts. Last, a wait that registered in the hub is
//! dropped before its fence signals: its slot must be free at once.
//! Prints `@@ ASYNC ...` lines, exit 0 when every wait succeeded, every
//! word landed, the two tasks' waits overlapped and the dropped wait gave
//! its slot back; 1 otherwise.
#![no_std]
#![no_main]

use core::future::Future;
use core::sync::atomic::{AtomicU32, Ordering};
use core::task::{Context, RawWaker, RawWakerVTable, Waker};

use bm_images::boot_m::{self, Gpu};
use embassy_executor::{Executor, Spawner};
use platform_baremetal::arch::{exit, tick, timer};
use platform_baremetal::{image_main, println};
use static_cell::StaticCell;
use umd_core::config::Config;
use umd_core::direct::MmuMode;
use umd_core::engine::Wakeups;
use umd_core::sync::QueueId;

image_main!(main);

const ROUNDS: u32 = 32;

static DEVICE: boot_m::Slot<8> = boot_m::slot();
static HUB: Wakeups<4> = Wakeups::with_timer(tick::arm_at);
static EXECUTOR: StaticCell<Executor> = StaticCell::new();
/// Waits in flight now, and the most at once.
static IN_FLIGHT: AtomicU32 = AtomicU32::new(0);
static MAX_IN_FLIGHT: AtomicU32 = AtomicU32::new(0);
static DONE: AtomicU32 = AtomicU32::new(0);
static FAILED: AtomicU32 = AtomicU32::new(0);

fn on_tick() {
    if let Some(next) = HUB.on_tick(timer::now_ns()) {
        tick::arm_at(next);
    }
}

fn main() -> ! {
    let dev = boot_m::device("m-async", &DEVICE, Config::DEFAULT, MmuMode::DEFAULT);
    tick::init(on_tick);
    let executor = EXECUTOR.init(Executor::new());
    executor.run(|spawner| start(spawner, dev))
}

fn start(spawner: Spawner, dev: &'static Gpu<8>) {
    for q in [0u8, 2] {
        match worker(dev, q) {
            Ok(t) => spawner.spawn(t),
            Err(e) => {
                println!("@@ FATAL spawn: {e:?}");
                exit::exit(2)
            }
        }
    }
}

fn finish(dev: &'static Gpu<8>) -> ! {
    let failed = FAILED.load(Ordering::Acquire);
    let overlap = MAX_IN_FLIGHT.load(Ordering::Acquire);
    println!(
        "@@ ASYNC overlap max_in_flight={overlap} ticks={} doorbells={}",
        tick::fired(),
        dev.platform().doorbells_rung()
    );
    println!("@@ DONE passed={} failed={failed}", 2 - failed.min(2));
    exit::exit(if failed == 0 && overlap >= 2 { 0 } else { 1 })
}

#[embassy_executor::task(pool_size = 2)]
async fn worker(dev: &'static Gpu<8>, q: u8) {
    let ok = run(dev, QueueId(q)).await;
    match ok {
        Ok(()) => println!("@@ ASYNC worker q{q} rounds={ROUNDS} ok"),
        Err(why) => {
            FAILED.fetch_add(1, Ordering::AcqRel);
            println!("@@ ASYNC worker q{q} FAIL {why}");
        }
    }
    if DONE.fetch_add(1, Ordering::AcqRel) == 1 {
        // The other task is done: the hub holds no waiter but this one's.
        match dropped_wait(dev) {
            Ok(polls) => println!("@@ ASYNC dropped_wait ok polls={polls}"),
            Err(why) => {
                FAILED.fetch_add(1, Ordering::AcqRel);
                println!("@@ ASYNC dropped_wait FAIL {why}");
            }
        }
        finish(dev)
    }
}

/// Wakes of the dropped-wait check's task waker ([`COUNTING`]).
static WAKES: AtomicU32 = AtomicU32::new(0);

/// A waker that only counts its wakes: the task it stands for is gone
/// once its future is dropped, so a wake after the drop is a wake of a
/// dead task.
static COUNTING: RawWakerVTable = RawWakerVTable::new(
    |p| RawWaker::new(p, &COUNTING),
    |_| {
        WAKES.fetch_add(1, Ordering::AcqRel);
    },
    |_| {
        WAKES.fetch_add(1, Ordering::AcqRel);
    },
    |_| {},
);

/// A wait future that registered in the hub and is dropped before its
/// fence signals gives its slot back at once: its waker is never woken
/// after the drop (the hub would otherwise keep a dead task's waker and
/// wake it at the next tick). The poll that registers and the drop run
/// with the tick masked, so the tick cannot empty the slot in between;
/// then the job runs to its end, the ticks of the schedule firing. Returns
/// the polls it took to register.
fn dropped_wait(dev: &'static Gpu<8>) -> Result<u32, &'static str> {
    let buf = dev.alloc_buffer(4096).map_err(|_| "alloc")?;
    let va = dev.va(buf).map_err(|_| "va")?;
    // 64 packets at the model's 20 µs each: still running when dropped.
    let f = dev
        .submit(QueueId::COMPUTE, &[], |cb| {
            (0..64u32).try_for_each(|i| cb.write_data(va + 4 * u64::from(i), &[i]))
        })
        .map_err(|_| "submit")?;
    if HUB.waiting() != 0 {
        return Err("a waiter was left in the hub before the drop");
    }
    // SAFETY: the vtable's functions ignore the data pointer, and cloning
    // hands out the same vtable: the contract of `RawWaker` holds.
    let waker = unsafe { Waker::from_raw(RawWaker::new(core::ptr::null(), &COUNTING)) };
    let mut cx = Context::from_waker(&waker);
    // The future is `Unpin`: it can be polled in place and dropped at a
    // chosen moment (`take`).
    let mut wait = Some(dev.wait_async(&HUB, f));
    let mut polls = 0u32;
    let before = loop {
        if polls == 100_000 {
            return Err("the wait never registered in the hub");
        }
        polls += 1;
        // Poll, and if the wait is registered now, drop it: with the tick
        // masked, so that no tick empties its slot in between.
        let dropped = critical_section::with(|_| {
            let Some(w) = wait.as_mut() else { return Err("no wait") };
            if core::pin::Pin::new(w).poll(&mut cx).is_ready() {
                return Err("the job ended before its wait registered");
            }
            if HUB.waiting() != 1 {
                return Ok(None);
            }
            let before = WAKES.load(Ordering::Acquire);
            drop(wait.take());
            Ok(Some(before))
        })?;
        if let Some(d) = dropped {
            break d;
        }
    };
    if HUB.waiting() != 0 {
        return Err("the dropped wait kept its hub slot");
    }
    dev.wait(f, 1_000_000_000).map_err(|_| "blocking wait")?;
    if WAKES.load(Ordering::Acquire) != before {
        return Err("the dropped wait's task was woken after the drop");
    }
    dev.free(buf).map_err(|_| "free")?;
    Ok(polls)
}

async fn run(dev: &'static Gpu<8>, q: QueueId) -> Result<(), &'static str> {
    let buf = dev.alloc_buffer(4096).map_err(|_| "alloc")?;
    let va = dev.va(buf).map_err(|_| "va")?;
    for i in 0..ROUNDS {
        let f = dev
            .submit(q, &[], |cb| cb.write_data(va + 4 * u64::from(i), &[i ^ 0x5A5A]))
            .map_err(|_| "submit")?;
        let n = IN_FLIGHT.fetch_add(1, Ordering::AcqRel) + 1;
        MAX_IN_FLIGHT.fetch_max(n, Ordering::AcqRel);
        let r = dev.wait_async(&HUB, f).timeout_ns(10_000_000_000).await;
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
        r.map_err(|_| "wait")?;
    }
    // Any of: this queue's fence and one on COMPUTE.
    let a = dev.submit(q, &[], |cb| cb.write_data(va + 0x800, &[1])).map_err(|_| "submit")?;
    let b = dev.submit(QueueId::COMPUTE, &[], |cb| cb.write_data(va + 0x804, &[2])).map_err(|_| "submit")?;
    let list = [a, b];
    let i = dev.wait_any_async(&HUB, &list).timeout_ns(10_000_000_000).await.map_err(|_| "wait_any")?;
    if dev.query(list[i]) != Ok(umd_core::error::FenceStatus::Signalled) {
        return Err("wait_any returned a pending fence");
    }
    let mut out = [0u8; 4 * ROUNDS as usize];
    dev.read(buf, 0, &mut out).map_err(|_| "read")?;
    for (i, c) in out.chunks_exact(4).enumerate() {
        if u32::from_le_bytes([c[0], c[1], c[2], c[3]]) != (i as u32) ^ 0x5A5A {
            return Err("a word did not land");
        }
    }
    dev.wait(b, 1_000_000_000).map_err(|_| "blocking wait")?;
    Ok(())
}
