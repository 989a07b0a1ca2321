//! Wake-up latency and CPU time of the adaptive fence wait against a pure
//! busy-wait, when another thread signals the fence after 10 µs, 1 ms and
//! 10 ms. Both waiters watch the same fence slot in the same run; the
//! device uses its default schedule (spin 2 µs, 1 µs polls to 100 µs,
//! 10 µs polls to 1 ms, then 100 µs) with real time and real sleeps.
//!
//! Three waiters per delay, in the same run: a busy-wait on the slot, the
//! driver polling on its schedule, and the driver waiting for an interrupt
//! (the signalling thread raises it after writing the fence, as the GPU's
//! interrupt would). A fourth line measures what one `sleep` costs in CPU
//! on this machine, the floor under any polling schedule.
//!
//! Run: `cargo bench -p umd-core --bench wait`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::hw::Generation;
use umd_core::platform::fake::{Fake, Mode, MEM_BASE};
use umd_core::platform::{DirectIo, DmaFlags, DmaRegion, IrqWait, Platform, PlatformError};
use umd_core::storage::DeviceStorage;
use umd_core::sync::QueueId;

/// The fake device with real time: `now_ns` from a monotonic clock and
/// `delay_ns` a real sleep (timer slack set to 1 ns so short sleeps are
/// honoured as well as the kernel can). Its own platform around `Fake`
/// rather than `Fake` itself: the fake's time is virtual (a sleep returns
/// at once, `wait_irq` sleeps 50 µs of it), and this bench measures real
/// wake-ups.
struct RealTime {
    fake: Fake,
    start: Instant,
    irq: Option<Arc<Irq>>,
}

/// An interrupt line: a flag and a condition variable.
#[derive(Default)]
struct Irq {
    pending: Mutex<bool>,
    cv: Condvar,
}

impl Irq {
    fn raise(&self) {
        *self.pending.lock().unwrap() = true;
        self.cv.notify_one();
    }
}

// SAFETY: memory and registers are the fake's; time is monotonic.
unsafe impl Platform for RealTime {
    type RawMutex = umd_core::platform::SpinLock;

    fn dma_alloc(&self, len: usize, _flags: DmaFlags) -> Result<DmaRegion, PlatformError> {
        self.fake.dma_alloc(len, _flags)
    }
    fn dma_free(&self, r: DmaRegion) {
        self.fake.dma_free(r)
    }
    fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }
    fn delay_ns(&self, ns: u64) {
        std::thread::sleep(Duration::from_nanos(ns));
    }
    fn wait_irq(&self, timeout_ns: u64) -> IrqWait {
        let Some(irq) = &self.irq else { return IrqWait::Unsupported };
        let guard = irq.pending.lock().unwrap();
        let (mut g, _) = irq.cv.wait_timeout_while(guard, Duration::from_nanos(timeout_ns), |p| !*p).unwrap();
        if std::mem::take(&mut *g) {
            IrqWait::Interrupt
        } else {
            IrqWait::TimedOut
        }
    }
}

impl DirectIo for RealTime {
    fn read_reg(&self, off: u32) -> Result<u32, PlatformError> {
        self.fake.read_reg(off)
    }
    fn write_reg(&self, off: u32, v: u32) -> Result<(), PlatformError> {
        self.fake.write_reg(off, v)
    }
    fn doorbell(&self, e: u32) -> Result<(), PlatformError> {
        self.fake.doorbell(e)
    }
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer; CLOCK_THREAD_CPUTIME_ID is always available on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Signals `slot` with `value` at `at` (spinning the last 50 µs for
/// precision), then raises `irq` if given.
fn signal_at(
    slot: &'static AtomicU64,
    value: u64,
    at: Instant,
    irq: Option<Arc<Irq>>,
) -> std::thread::JoinHandle<Instant> {
    std::thread::spawn(move || {
        let early = at.checked_sub(Duration::from_micros(50)).unwrap_or(at);
        let now = Instant::now();
        if early > now {
            std::thread::sleep(early - now);
        }
        while Instant::now() < at {
            std::hint::spin_loop();
        }
        slot.store(value, Ordering::Release);
        let t = Instant::now();
        if let Some(irq) = irq {
            irq.raise();
        }
        t
    })
}

struct Sample {
    wake_ns: f64,
    cpu_ratio: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn sleep_floor(us: u64) -> f64 {
    let n = 200;
    let (t0, c0) = (Instant::now(), thread_cpu_ns());
    for _ in 0..n {
        std::thread::sleep(Duration::from_micros(us));
    }
    (thread_cpu_ns() - c0) as f64 / t0.elapsed().as_nanos() as f64
}

fn device(irq: Option<Arc<Irq>>) -> Device<'static, RealTime, 8> {
    let fake = Fake::new(Generation::Gen2, 4 << 20);
    fake.state().mode = Mode::Manual;
    let use_irq = irq.is_some();
    let rt: &'static RealTime = Box::leak(Box::new(RealTime { fake, start: Instant::now(), irq }));
    let storage: &'static mut DeviceStorage = Box::leak(Box::default());
    let cfg = Config { use_irq, ring_bytes: 1 << 20, ..Config::DEFAULT };
    Device::new(rt, storage, cfg, MmuMode::Bypass).unwrap()
}

fn slot_of(dev: &Device<'static, RealTime, 8>) -> &'static AtomicU64 {
    let slot_dev = dev.fence_slot_va(QueueId::GFX).unwrap();
    let slot_ptr = dev.platform().fake.state().mem_ptr_at(slot_dev - MEM_BASE);
    // SAFETY: the fence slot is an 8-byte-aligned u64 inside the fake's
    // memory, which lives as long as the device (leaked below for the
    // program's life); all concurrent accesses to it are atomic or volatile.
    unsafe { AtomicU64::from_ptr(slot_ptr.cast()) }
}

fn main() {
    // SAFETY: prctl with PR_SET_TIMERSLACK only changes this thread's slack.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) };
    let poll = device(None);
    let poll_slot = slot_of(&poll);
    let irq = Arc::new(Irq::default());
    let intr = device(Some(irq.clone()));
    let intr_slot = slot_of(&intr);

    println!(
        "CPU/wall of a loop of sleeps on this machine: 1 us {:.3}, 10 us {:.3}, 100 us {:.3}",
        sleep_floor(1),
        sleep_floor(10),
        sleep_floor(100)
    );
    println!(
        "{:>7} | {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9} | {:>10} {:>10} {:>10}",
        "signal",
        "busy wake",
        "poll wake",
        "irq wake",
        "busy cpu",
        "poll cpu",
        "irq cpu",
        "poll total",
        "irq total",
        "(÷ busy)"
    );
    for delay in [Duration::from_micros(10), Duration::from_millis(1), Duration::from_millis(10)] {
        let trials = if delay >= Duration::from_millis(10) { 15 } else { 41 };
        let (mut busy, mut pol, mut int) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..trials {
            // Busy-wait baseline on the polling device's slot.
            let f = poll.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
            let (t0, c0) = (Instant::now(), thread_cpu_ns());
            let h = signal_at(poll_slot, f.seqno().0, t0 + delay, None);
            while poll_slot.load(Ordering::Acquire) < f.seqno().0 {
                std::hint::spin_loop();
            }
            let (t1, c1) = (Instant::now(), thread_cpu_ns());
            let sig = h.join().unwrap();
            busy.push(Sample {
                wake_ns: t1.saturating_duration_since(sig).as_nanos() as f64,
                cpu_ratio: (c1 - c0) as f64 / (t1 - t0).as_nanos() as f64,
            });
            poll.wait(f, 1_000_000_000).unwrap();

            for (dev, slot, irq, out) in
                [(&poll, poll_slot, None, &mut pol), (&intr, intr_slot, Some(irq.clone()), &mut int)]
            {
                let f = dev.submit(QueueId::GFX, &[], |cb| cb.timestamp(0x8030_0000)).unwrap();
                let (t0, c0) = (Instant::now(), thread_cpu_ns());
                let h = signal_at(slot, f.seqno().0, t0 + delay, irq);
                dev.wait(f, 1_000_000_000).unwrap();
                let (t1, c1) = (Instant::now(), thread_cpu_ns());
                let sig = h.join().unwrap();
                out.push(Sample {
                    wake_ns: t1.saturating_duration_since(sig).as_nanos() as f64,
                    cpu_ratio: (c1 - c0) as f64 / (t1 - t0).as_nanos() as f64,
                });
            }
        }
        let m = |v: &Vec<Sample>, f: fn(&Sample) -> f64| median(v.iter().map(f).collect());
        let (bw, pw, iw) = (m(&busy, |s| s.wake_ns), m(&pol, |s| s.wake_ns), m(&int, |s| s.wake_ns));
        let (bc, pc, ic) = (m(&busy, |s| s.cpu_ratio), m(&pol, |s| s.cpu_ratio), m(&int, |s| s.cpu_ratio));
        let d = delay.as_nanos() as f64;
        println!(
            "{:>7?} | {:>9.0} {:>9.0} {:>9.0} | {:>9.3} {:>9.3} {:>9.3} | {:>10.3} {:>10.3}   cpu ÷ busy: poll {:.3}, irq {:.3}",
            delay,
            bw,
            pw,
            iw,
            bc,
            pc,
            ic,
            (d + pw) / (d + bw),
            (d + iw) / (d + bw),
            pc / bc,
            ic / bc
        );
    }
}
