//! One thread's buffer calls against three threads looping alloc/free:
//! the latency distribution (p50, p99, max) of a "victim" thread's
//! `alloc` and `free`, alone and with three "hammer" threads allocating
//! and freeing buffers of the same size as fast as they can, as ratios to
//! the uncontended cost of the same call in the same run (its median
//! alone: the `x` columns are busy p50, p99 and max over it). Each workload runs with the
//! Linux platforms' lock (`platform_linux::FairLock`, a ticket lock) and,
//! for comparison in the same run, with spin's unfair lock
//! (`umd_core::platform::SpinLock`) behind the same platform.
//!
//! Sizes: 1 MiB (a large buffer: every alloc takes zeroed memory from the
//! platform, maps it and every free unmaps it, invalidates the GPU TLB
//! and gives it back) and 256 B (a slab slot: bookkeeping only).
//!
//! Run: `cargo bench -p platform-linux --bench contention`
//! (`UMD_CONTENTION_ROUNDS`: victim rounds per case, default 2000; a case
//! stops after 20 s of victim time whatever the rounds.)

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use platform_linux::{FairLock, InProcess};
use refgpu_model::{Generation, ModelConfig};
use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::mem::BufferDesc;
use umd_core::platform::{DirectIo, DmaFlags, DmaRegion, IrqWait, Platform, PlatformError, SpinLock};
use umd_core::storage::DeviceStorage;

/// The in-process platform with the core's locks of type `L`. Not the
/// scripted fake (`umd_core::platform::fake`): this bench measures the
/// Linux platforms' lock and allocator under contention, so it runs on the
/// in-process platform, only its lock type swapped.
struct WithLock<L>(InProcess, PhantomData<fn() -> L>);

// SAFETY: every call goes to the in-process platform, which upholds the
// trait's contract; only the lock type differs.
unsafe impl<L: lock_api::RawMutex + Send + Sync> Platform for WithLock<L> {
    type RawMutex = L;
    fn dma_alloc(&self, len: usize, flags: DmaFlags) -> Result<DmaRegion, PlatformError> {
        self.0.dma_alloc(len, flags)
    }
    fn dma_free(&self, region: DmaRegion) {
        self.0.dma_free(region)
    }
    fn cache_clean(&self, region: &DmaRegion, offset: usize, len: usize) {
        self.0.cache_clean(region, offset, len)
    }
    fn cache_invalidate(&self, region: &DmaRegion, offset: usize, len: usize) {
        self.0.cache_invalidate(region, offset, len)
    }
    fn now_ns(&self) -> u64 {
        self.0.now_ns()
    }
    fn delay_ns(&self, ns: u64) {
        self.0.delay_ns(ns)
    }
    fn wait_irq(&self, timeout_ns: u64) -> IrqWait {
        self.0.wait_irq(timeout_ns)
    }
}

impl<L: lock_api::RawMutex + Send + Sync> DirectIo for WithLock<L> {
    fn read_reg(&self, offset: u32) -> Result<u32, PlatformError> {
        self.0.read_reg(offset)
    }
    fn write_reg(&self, offset: u32, value: u32) -> Result<(), PlatformError> {
        self.0.write_reg(offset, value)
    }
    fn doorbell(&self, engine: u32) -> Result<(), PlatformError> {
        self.0.doorbell(engine)
    }
    fn control_doorbell(&self) -> Result<(), PlatformError> {
        self.0.control_doorbell()
    }
}

/// p50, p99 and max of `v` (ns).
fn dist(mut v: Vec<u64>) -> [u64; 3] {
    v.sort_unstable();
    let at = |q: f64| v[((v.len() as f64 - 1.0) * q) as usize];
    [at(0.5), at(0.99), *v.last().unwrap_or(&0)]
}

/// The victim's loop: `rounds` alloc/free pairs (or 20 s), each call
/// timed. Returns the alloc and free latencies (ns).
fn victim<P: DirectIo>(dev: &Device<'_, P, 16>, size: u64, rounds: usize) -> (Vec<u64>, Vec<u64>) {
    let (mut a, mut f) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    let start = Instant::now();
    for _ in 0..rounds {
        let t = Instant::now();
        let h = dev.alloc(&BufferDesc::new(size)).unwrap();
        a.push(t.elapsed().as_nanos() as u64);
        let t = Instant::now();
        dev.free(h).unwrap();
        f.push(t.elapsed().as_nanos() as u64);
        if start.elapsed() > Duration::from_secs(20) {
            break;
        }
    }
    (a, f)
}

struct Case {
    lock: &'static str,
    size: u64,
    alone: ([u64; 3], [u64; 3]),
    busy: ([u64; 3], [u64; 3]),
    victim_rounds: usize,
    hammer_rounds: u64,
    busy_s: f64,
}

fn run<L: lock_api::RawMutex + Send + Sync>(lock: &'static str, size: u64, rounds: usize) -> Case {
    let p = WithLock::<L>(
        InProcess::new(ModelConfig {
            generation: Generation::Gen2,
            mem_size: 256 << 20,
            ..ModelConfig::default()
        })
        .unwrap(),
        PhantomData,
    );
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, WithLock<L>, 16> =
        Device::new(&p, &mut storage, Config::DEFAULT, MmuMode::DEFAULT).unwrap();
    // Warm up (slabs made, pages touched), then alone.
    victim(&dev, size, rounds / 10 + 1);
    let (a, f) = victim(&dev, size, rounds);
    let alone = (dist(a), dist(f));
    let stop = AtomicBool::new(false);
    let hammered = AtomicU64::new(0);
    let (busy, victim_rounds, busy_s) = std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let h = dev.alloc(&BufferDesc::new(size)).unwrap();
                    dev.free(h).unwrap();
                    hammered.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        // Let the hammers get going.
        std::thread::sleep(Duration::from_millis(20));
        let t = Instant::now();
        let (a, f) = victim(&dev, size, rounds);
        let s = t.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let n = a.len();
        ((dist(a), dist(f)), n, s)
    });
    Case { lock, size, alone, busy, victim_rounds, hammer_rounds: hammered.into_inner(), busy_s }
}

fn main() {
    let rounds: usize =
        std::env::var("UMD_CONTENTION_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    println!(
        "one thread's alloc/free, alone and against 3 threads looping alloc/free of the same size \
         ({rounds} victim rounds; in-process gen2, MMU on)"
    );
    println!(
        "{:>6} {:>7} {:>5} | {:>9} {:>9} {:>9} | {:>9} {:>9} {:>9} | {:>7} {:>7} {:>7} | {:>6} {:>9}",
        "lock",
        "size",
        "call",
        "alone p50",
        "p99",
        "max",
        "busy p50",
        "p99",
        "max",
        "x p50",
        "x p99",
        "x max",
        "rounds",
        "hammer/v"
    );
    let mut cases = Vec::new();
    for size in [1u64 << 20, 256] {
        cases.push(run::<FairLock>("fair", size, rounds));
        cases.push(run::<SpinLock>("spin", size, rounds));
    }
    for c in &cases {
        for (call, alone, busy) in [("alloc", c.alone.0, c.busy.0), ("free", c.alone.1, c.busy.1)] {
            let us = |ns: u64| ns as f64 / 1e3;
            // Against the uncontended cost: the median alone.
            let x = |i: usize| busy[i] as f64 / alone[0].max(1) as f64;
            println!(
                "{:>6} {:>7} {:>5} | {:>8.1}u {:>8.1}u {:>8.1}u | {:>8.1}u {:>8.1}u {:>8.1}u | {:>7.1} {:>7.1} {:>7.1} | {:>6} {:>9.1}",
                c.lock,
                if c.size >= 1 << 20 { format!("{}M", c.size >> 20) } else { format!("{}", c.size) },
                call,
                us(alone[0]),
                us(alone[1]),
                us(alone[2]),
                us(busy[0]),
                us(busy[1]),
                us(busy[2]),
                x(0),
                x(1),
                x(2),
                c.victim_rounds,
                c.hammer_rounds as f64 / c.victim_rounds.max(1) as f64,
            );
        }
        println!(
            "{:>6} {:>7}       victim: {} rounds in {:.2} s against {} hammer rounds",
            c.lock, c.size, c.victim_rounds, c.busy_s, c.hammer_rounds
        );
    }
}
