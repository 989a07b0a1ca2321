//! Buffers through the device, against the path they replace and against a
//! well-kept allocator, on the same sequence and platform (the scripted
//! fake, MMU on):
//!
//! - alloc + free of small (64 B), medium (16 KiB) and large (1 MiB)
//!   buffers: `Device::alloc`/`free` vs the old path (one `dma_alloc` + a
//!   VA range + page-table map per buffer; unmap + TLB invalidation +
//!   `dma_free` per free) vs buddy_system_allocator's `FrameAllocator`
//!   handing out addresses only (no memory, no mapping: a lower bound);
//! - page-table entries written and TLB invalidations per 1,000 small
//!   buffers, device vs old path;
//! - the cost of fence gating: `free` of a buffer whose last use has
//!   signalled vs one still in flight (declared tracking).
//!
//! Run: `cargo bench -p umd-core --bench buffers`

use std::hint::black_box;
use std::time::Instant;

use umd_core::config::Config;
use umd_core::direct::tables::Tables;
use umd_core::direct::{Device, MmuMode};
use umd_core::engine::{BufferUse, Submit};
use umd_core::hw::Generation;
use umd_core::mem::va::{VaAllocator, VaNode, VaPlacement};
use umd_core::mem::{BufferDesc, Perms};
use umd_core::platform::fake::{Fake, Mode};
use umd_core::platform::{DmaFlags, Platform};
use umd_core::storage::DeviceStorage;
use umd_core::sync::QueueId;

const ROUNDS: usize = 15;
const BATCH: usize = 64;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn cfg() -> Config {
    Config { ring_bytes: 4096, ib_chunk_bytes: 4096, use_irq: false, ..Config::DEFAULT }
}

/// ns per alloc + free pair through the device.
fn device_path(size: u64) -> (f64, u64, u64) {
    let fake = Fake::new(Generation::Gen2, 256 << 20);
    let mut storage: Box<DeviceStorage> = Box::default();
    let dev = Device::<Fake, 4>::new(&fake, &mut storage, cfg(), MmuMode::DEFAULT).unwrap();
    let before = dev.stats();
    let mut samples = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let hs: Vec<_> = (0..BATCH).map(|_| dev.alloc(&BufferDesc::new(size).declared()).unwrap()).collect();
        for h in hs {
            dev.free(h).unwrap();
        }
        samples.push(t.elapsed().as_nanos() as f64 / BATCH as f64);
    }
    let after = dev.stats();
    let n = (ROUNDS * BATCH) as u64;
    (
        median(samples),
        (after.pte_writes - before.pte_writes) * 1000 / n,
        (after.tlb_invalidations - before.tlb_invalidations) * 1000 / n,
    )
}

/// The path the device replaced: a platform block, a VA range and a
/// page-table mapping per buffer; unmap, invalidate, free per free.
fn old_path(size: u64) -> (f64, u64, u64) {
    let fake = Fake::new(Generation::Gen2, 256 << 20);
    let tables_mem = fake.dma_alloc(64 * 4096, DmaFlags::CPU).unwrap();
    let mut tables = Tables::new(tables_mem).map_err(|(e, _)| e).unwrap();
    let mut va = VaAllocator::new(vec![VaNode::EMPTY; 1024], 1 << 32, 1 << 32).unwrap();
    let mut invalidations = 0u64;
    let mut pte = 0u64;
    let mut samples = Vec::new();
    let len = size.next_multiple_of(4096);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let mut live = Vec::with_capacity(BATCH);
        for _ in 0..BATCH {
            let region = fake.dma_alloc(len as usize, DmaFlags::CPU).unwrap();
            let addr = va.alloc(len, 4096, VaPlacement::BottomUp).unwrap();
            tables.map(&fake, addr, region.dev_addr(), len, Perms::RW).unwrap();
            pte += len / 4096;
            live.push((region, addr));
        }
        for (region, addr) in live {
            tables.unmap(&fake, addr, len).unwrap();
            pte += len / 4096;
            // The old path wrote MMU_INVALIDATE and waited, once per free.
            invalidations += 1;
            black_box(fake.state().regs[0]);
            va.free(addr).unwrap();
            fake.dma_free(region);
        }
        samples.push(t.elapsed().as_nanos() as f64 / BATCH as f64);
    }
    let n = (ROUNDS * BATCH) as u64;
    (median(samples), pte * 1000 / n, invalidations * 1000 / n)
}

/// buddy_system_allocator handing out addresses for the same sequence.
fn buddy_path(size: u64) -> f64 {
    let mut frames = buddy_system_allocator::FrameAllocator::<32>::new();
    frames.add_frame(1 << 20, (1 << 20) + (1 << 20)); // 4 GiB of 4 KiB frames
    let pages = size.div_ceil(4096) as usize;
    let mut samples = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let live: Vec<_> = (0..BATCH).map(|_| frames.alloc(pages).unwrap()).collect();
        for f in live {
            frames.dealloc(f, pages);
        }
        samples.push(t.elapsed().as_nanos() as f64 / BATCH as f64);
    }
    median(samples)
}

/// ns of `free` for a buffer whose declared use has signalled, and for one
/// still in flight (its memory waits for the fence).
fn gating_cost() -> (f64, f64) {
    let fake = Fake::new(Generation::Gen2, 64 << 20);
    let mut storage: Box<DeviceStorage> = Box::default();
    // The fake executes without an MMU.
    let dev = Device::<Fake, 16>::new(&fake, &mut storage, cfg(), MmuMode::Bypass).unwrap();
    fake.state().mode = Mode::Manual;
    let mut signalled = Vec::new();
    let mut in_flight = Vec::new();
    for _ in 0..ROUNDS {
        for pending in [false, true] {
            let hs: Vec<_> =
                (0..BATCH).map(|_| dev.alloc(&BufferDesc::new(256).declared()).unwrap()).collect();
            let uses: Vec<BufferUse> = hs.iter().map(|h| BufferUse::read(*h)).collect();
            let f = dev.submit_with(&Submit::on(QueueId::COPY).using(&uses), |cb| cb.barrier()).unwrap();
            if !pending {
                fake.state().run(2);
                dev.wait(f, 1_000_000_000).unwrap();
            }
            let t = Instant::now();
            for h in hs {
                dev.free(h).unwrap();
            }
            let ns = t.elapsed().as_nanos() as f64 / BATCH as f64;
            if pending {
                in_flight.push(ns);
                fake.state().run(2);
                dev.wait(f, 1_000_000_000).unwrap();
            } else {
                signalled.push(ns);
            }
        }
    }
    (median(signalled), median(in_flight))
}

fn main() {
    println!(
        "{:>8} | {:>12} {:>12} {:>12} | {:>10} {:>10} | PTE writes / TLB invalidations per 1000 (device vs old)",
        "size", "device ns", "old path ns", "buddy ns", "old/device", "dev/buddy"
    );
    for (name, size) in [("64 B", 64u64), ("16 KiB", 16 << 10), ("1 MiB", 1 << 20)] {
        let (d, dpte, dtlb) = device_path(size);
        let (o, opte, otlb) = old_path(size);
        let b = buddy_path(size);
        println!(
            "{name:>8} | {d:>12.0} {o:>12.0} {b:>12.0} | {:>10.2} {:>10.2} | {dpte} / {dtlb} vs {opte} / {otlb}",
            o / d,
            d / b
        );
    }
    let (s, p) = gating_cost();
    println!(
        "free (declared, 256 B): fence signalled {s:.0} ns, still in flight {p:.0} ns, ratio {:.2}",
        p / s
    );
}
