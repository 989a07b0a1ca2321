//! CPU cost of one submission in direct mode, against the scripted fake
//! device (`umd_core::platform::fake`), for 1, 10 and 100 packets per submission, with
//! batching on and off. Baseline, in the same run: encoding the same
//! packets into a plain buffer with `Encoder` (what a submission costs
//! beyond encoding is the ring, the IB pool, fences and bookkeeping).
//! Then throughput with one and two submitting threads on different queues
//! (the fake executes nothing: the engines are left to the bench).
//!
//! Run: `cargo bench -p umd-core --bench submit`; `tools/bench-against.sh
//! REV` runs it at another revision too and prints the ratios.

use std::hint::black_box;
use std::time::Instant;

use umd_core::cmd::{Command, Encoder};
use umd_core::config::Config;
use umd_core::direct::{Device, MmuMode};
use umd_core::hw::Generation;
use umd_core::platform::fake::{Fake, Mode};
use umd_core::storage::DeviceStorage;
use umd_core::sync::QueueId;

const ROUNDS: usize = 31;
const BATCH: usize = 24;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn submit_cost(packets: usize, batching: bool) -> f64 {
    let cfg = Config {
        batching,
        ring_bytes: 64 << 10,
        ib_chunk_bytes: 64 << 10,
        use_irq: false,
        ..Config::DEFAULT
    };
    let fake = Fake::new(Generation::Gen2, 8 << 20);
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, Fake, 32> = Device::new(&fake, &mut storage, cfg, MmuMode::Bypass).unwrap();
    fake.state().mode = Mode::Manual;
    let data = [1u32, 2, 3, 4];
    let mut samples = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let mut last = None;
        for _ in 0..BATCH {
            last = Some(
                dev.submit(QueueId::GFX, &[], |cb| {
                    for i in 0..packets as u64 {
                        cb.write_data(0x8040_0000 + 16 * i, &data)?;
                    }
                    Ok(())
                })
                .unwrap(),
            );
        }
        samples.push(t.elapsed().as_nanos() as f64 / BATCH as f64);
        // Let the fake engine drain the ring (untimed).
        fake.state().run(0);
        dev.wait(last.unwrap(), 1_000_000_000).unwrap();
    }
    median(samples)
}

fn encode_cost(packets: usize) -> f64 {
    let enc = Encoder::new(Generation::Gen2);
    let mut out = vec![0u32; 64 << 10];
    let data = [1u32, 2, 3, 4];
    let mut samples = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for _ in 0..BATCH {
            let mut pos = 0;
            for i in 0..packets as u64 {
                pos += enc
                    .encode(&Command::write_data(0x1_0000_0000 + 16 * i, &data), &mut out, pos, 0x10_0000)
                    .unwrap();
            }
            black_box(pos);
        }
        samples.push(t.elapsed().as_nanos() as f64 / BATCH as f64);
    }
    median(samples)
}

/// Submissions per second with `threads` threads, each on its own queue
/// (1 packet each), the fake draining the rings untimed between rounds.
fn throughput(threads: usize) -> f64 {
    let cfg = Config { ring_bytes: 1 << 20, ib_chunk_bytes: 64 << 10, use_irq: false, ..Config::DEFAULT };
    let fake = Fake::new(Generation::Gen2, 16 << 20);
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, Fake, 32> = Device::new(&fake, &mut storage, cfg, MmuMode::Bypass).unwrap();
    fake.state().mode = Mode::Manual;
    const PER_THREAD: usize = 2000;
    let mut samples = Vec::new();
    for _ in 0..9 {
        let t = Instant::now();
        std::thread::scope(|s| {
            for q in 0..threads {
                let dev = &dev;
                s.spawn(move || {
                    for i in 0..PER_THREAD as u64 {
                        dev.submit(QueueId(q as u8), &[], |cb| {
                            cb.write_data(0x8040_0000 + 16 * (i % 64), &[1])
                        })
                        .unwrap();
                    }
                });
            }
        });
        samples.push((threads * PER_THREAD) as f64 / t.elapsed().as_secs_f64());
        let mut st = fake.state();
        for q in 0..threads {
            st.run(q);
        }
        drop(st);
        dev.service();
    }
    median(samples)
}

/// What the fake's platform calls cost per submission: a direct-mode
/// submission makes five (two cache cleans, the write pointer, the
/// doorbell, one clock read for the trace; the read pointer only when the
/// ring looks full, about once per lap), each through the fake's mutex. Hardware MMIO takes no lock; this is the part of the
/// submit figure that is the test double's, not the driver's.
fn fake_platform_cost() -> f64 {
    use umd_core::hw::regs;
    use umd_core::platform::{DirectIo, Platform};
    let fake = Fake::new(Generation::Gen2, 1 << 20);
    fake.state().mode = Mode::Manual;
    let region = fake.dma_alloc(4096, umd_core::platform::DmaFlags::default()).unwrap();
    let mut samples = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for _ in 0..BATCH {
            fake.cache_clean(&region, 0, 64);
            fake.cache_clean(&region, 64, 64);
            black_box(fake.write_reg(regs::engine_reg(0, regs::engine::RING_WPTR), 0).ok());
            black_box(fake.doorbell(0).ok());
            black_box(fake.now_ns());
        }
        samples.push(t.elapsed().as_nanos() as f64 / BATCH as f64);
    }
    median(samples)
}

/// Submission cost with the validation mode on against off, same device,
/// `packets` WRITE_DATA packets into one buffer (feature `validation`).
#[cfg(feature = "validation")]
fn validation_cost(packets: usize) -> (f64, f64) {
    let cfg = Config { ring_bytes: 64 << 10, ib_chunk_bytes: 64 << 10, use_irq: false, ..Config::DEFAULT };
    let fake = Fake::new(Generation::Gen2, 8 << 20);
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev: Device<'_, Fake, 32> = Device::new(&fake, &mut storage, cfg, MmuMode::Bypass).unwrap();
    fake.state().mode = Mode::Manual;
    // A device with 64 live buffers (the lookup scans the table).
    let bufs: Vec<_> = (0..64).map(|_| dev.alloc_buffer(4096).unwrap()).collect();
    let va = dev.va(bufs[63]).unwrap();
    let run = |on: bool| {
        dev.set_validation(on).unwrap();
        let mut samples = Vec::new();
        for _ in 0..ROUNDS {
            let t = Instant::now();
            let mut last = None;
            for _ in 0..BATCH {
                last = Some(
                    dev.submit(QueueId::GFX, &[], |cb| {
                        for i in 0..packets as u64 {
                            cb.write_data(va + 16 * (i % 256), &[1, 2, 3, 4])?;
                        }
                        Ok(())
                    })
                    .unwrap(),
                );
            }
            samples.push(t.elapsed().as_nanos() as f64 / BATCH as f64);
            fake.state().run(0);
            dev.wait(last.unwrap(), 1_000_000_000).unwrap();
        }
        median(samples)
    };
    let off = run(false);
    let on = run(true);
    (off, on)
}

fn main() {
    println!(
        "{:>8} {:>16} {:>16} {:>16} {:>12} {:>12}",
        "packets", "encode-only ns", "submit ns (on)", "submit ns (off)", "on/encode", "off/encode"
    );
    for packets in [1, 10, 100] {
        let enc = encode_cost(packets);
        let on = submit_cost(packets, true);
        let off = submit_cost(packets, false);
        println!("{packets:>8} {enc:>16.0} {on:>16.0} {off:>16.0} {:>12.2} {:>12.2}", on / enc, off / enc);
    }
    println!("fake platform calls per submission: {:.0} ns", fake_platform_cost());
    #[cfg(feature = "validation")]
    for packets in [1, 10, 100] {
        let (off, on) = validation_cost(packets);
        println!(
            "validation, {packets} packets, 64 live buffers: off {off:.0} ns, on {on:.0} ns, {:.0} ns per packet, ratio {:.2}",
            (on - off) / packets as f64,
            on / off
        );
    }
    let one = throughput(1);
    let two = throughput(2);
    println!("throughput: 1 thread {one:.0}/s, 2 threads on 2 queues {two:.0}/s, ratio {:.2}", two / one);
    use std::mem::size_of;
    println!(
        "size_of Device<Fake, CHUNKS>: 8 chunks {} B, 16 chunks {} B, 32 chunks {} B",
        size_of::<Device<'_, Fake, 8>>(),
        size_of::<Device<'_, Fake, 16>>(),
        size_of::<Device<'_, Fake, 32>>()
    );
    println!(
        "size_of DeviceStorage<BUF, VA, SLABS, TRACE>: default <1024, 1024, 256, 256> {} B, <64, 128, 32, 64> {} B",
        size_of::<DeviceStorage>(),
        size_of::<DeviceStorage<64, 128, 32, 64>>()
    );
}
