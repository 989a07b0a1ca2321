//! Model throughput: packets per second per engine for a NOP stream, a
//! WRITE_DATA stream and a DMA_COPY stream, then all three engines at once,
//! plus the doorbell-to-fence round trip of an idle engine.
//!
//! Run: `cargo bench -p refgpu-model --bench throughput` (add `-- --quick`
//! for a short run). MMU on, memory identity-mapped with 2 MiB blocks,
//! 4 MiB rings filled once and published with one doorbell; each figure is
//! the best of several runs. The host `memcpy` rate of the same DMA size is
//! printed as the baseline for the DMA rows.

use std::time::{Duration, Instant};

use refgpu_model::regs::{self, eng};
use refgpu_model::{Generation, Model, ModelConfig};

const MEM_BASE: u64 = 0x4000_0000;
const MEM_SIZE: u64 = 128 << 20;
const RING_SIZE: u32 = 4 << 20;
const DATA: u64 = MEM_BASE + (16 << 20);
const DMA_BYTES: u32 = 256;

fn ring_va(e: usize) -> u64 {
    MEM_BASE + (1 << 20) + u64::from(RING_SIZE) * e as u64
}

/// Header from spec 5.1 (independent of umd-core).
fn header(gen: Generation, op1: u8, op2: u8, flags: u8, ndw: u32) -> u32 {
    match gen {
        Generation::Gen1 => (u32::from(op1) << 24) | (u32::from(flags) << 16) | ndw,
        Generation::Gen2 => (7 << 28) | (ndw << 16) | (u32::from(flags) << 8) | u32::from(op2),
    }
}

fn setup(gen: Generation) -> Model {
    let m = Model::new(ModelConfig {
        generation: gen,
        mem_base: MEM_BASE,
        mem_size: MEM_SIZE,
        ..Default::default()
    })
    .expect("model");
    // Page tables at MEM_BASE: L0 -> L1 -> L2 with 2 MiB identity blocks.
    let (l0, l1, l2) = (MEM_BASE, MEM_BASE + 0x1000, MEM_BASE + 0x2000);
    let va = MEM_BASE;
    m.write_u64(l0 + 8 * ((va >> 39) & 0x1FF), l1 | 3).unwrap();
    m.write_u64(l1 + 8 * ((va >> 30) & 0x1FF), l2 | 3).unwrap();
    for b in 0..MEM_SIZE >> 21 {
        let a = MEM_BASE + (b << 21);
        m.write_u64(l2 + 8 * ((a >> 21) & 0x1FF), a | 0b1101).unwrap();
    }
    m.write_reg(regs::MMU_ROOT_LO, l0 as u32);
    m.write_reg(regs::MMU_CTRL, 1);
    for e in 0..3 {
        let b = regs::engine_base(e);
        m.write_reg(b + eng::RING_BASE_LO, ring_va(e) as u32);
        m.write_reg(b + eng::RING_SIZE, RING_SIZE);
        m.write_reg(b + eng::CTRL, regs::CTRL_ENABLE);
    }
    m
}

#[derive(Clone, Copy)]
enum Work {
    Nop,
    WriteData,
    Dma,
}

/// Fills ring `e` with `work`; returns (dwords, counted packets).
fn fill_ring(m: &Model, gen: Generation, e: usize, work: Work) -> (u32, u64) {
    let max_dw = (RING_SIZE / 4 - 1) as usize;
    let mut dw: Vec<u32> = Vec::with_capacity(max_dw);
    let mut packets = 0u64;
    let nop = |n: u32| header(gen, 0x00, 0x00, 0, n);
    loop {
        let p: Vec<u32> = match work {
            Work::Nop => vec![nop(0)],
            Work::WriteData => {
                let dst = DATA + 4 * (packets % 4096);
                vec![header(gen, 0x01, 0x10, 0, 3), dst as u32, (dst >> 32) as u32, packets as u32]
            }
            Work::Dma => {
                let src = DATA + (1 << 20) + u64::from(DMA_BYTES) * (packets % 64);
                let dst = DATA + (2 << 20) + (8 << 20) * e as u64 + u64::from(DMA_BYTES) * (packets % 1024);
                let h = header(gen, 0x02, 0x20, 0, 5);
                match gen {
                    Generation::Gen1 => vec![h, src as u32, 0, dst as u32, 0, DMA_BYTES],
                    // 6 dwords + a 2-dword NOP pad keeps headers 32-byte aligned.
                    Generation::Gen2 => vec![h, DMA_BYTES, src as u32, 0, dst as u32, 0, nop(1), 0],
                }
            }
        };
        if dw.len() + p.len() > max_dw {
            break;
        }
        dw.extend(p);
        packets += 1;
    }
    m.write_dwords(ring_va(e), &dw).unwrap();
    (dw.len() as u32, packets)
}

/// Publishes the filled rings of `engines` and times until all drained.
fn run(m: &Model, engines: &[usize], wptr_dw: &[u32]) -> Duration {
    for &e in engines {
        m.reset_engine(e).unwrap();
    }
    let t0 = Instant::now();
    for (&e, &w) in engines.iter().zip(wptr_dw) {
        let b = regs::engine_base(e);
        m.write_reg(b + eng::RING_WPTR, 4 * w);
        m.write_reg(b + eng::DOORBELL, 1);
    }
    for (&e, &w) in engines.iter().zip(wptr_dw) {
        let b = regs::engine_base(e);
        while m.read_reg(b + eng::RING_RPTR) != 4 * w {
            assert_eq!(m.read_reg(b + eng::STATUS) & regs::STATUS_HALTED, 0, "engine {e} faulted");
            std::thread::sleep(Duration::from_micros(20));
        }
    }
    t0.elapsed()
}

fn best(reps: usize, mut f: impl FnMut() -> Duration) -> Duration {
    (0..reps).map(|_| f()).min().unwrap_or_default()
}

fn fence_round_trip(m: &Model, gen: Generation, n: usize) -> Duration {
    let e = 0;
    m.reset_engine(e).unwrap();
    let b = regs::engine_base(e);
    let f = DATA + 0x10_0000 - 64;
    let mut lat = Vec::with_capacity(n);
    let mut off = 0u32;
    for i in 1..=n as u64 {
        let p = [header(gen, 0x04, 0x30, 0, 4), f as u32, 0, i as u32, 0];
        m.write_dwords(ring_va(e) + u64::from(off), &p).unwrap();
        off += 20;
        let t0 = Instant::now();
        m.write_reg(b + eng::RING_WPTR, off);
        m.write_reg(b + eng::DOORBELL, 1);
        while m.read_u64(f).unwrap() != i {
            std::hint::spin_loop();
        }
        lat.push(t0.elapsed());
        // Let the engine go idle again so every sample includes a wake-up.
        std::thread::sleep(Duration::from_micros(200));
    }
    lat.sort();
    lat[lat.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let reps = if quick { 1 } else { 3 };
    println!("refgpu-model throughput (best of {reps}; MMU on, 2 MiB blocks, 4 MiB rings)");
    println!();
    println!("| gen | workload | engines | packets | time (ms) | Mpackets/s | note |");
    println!("| --- | --- | --- | ---: | ---: | ---: | --- |");
    // Host baseline for the DMA rows: memcpy of the same size.
    let src = vec![1u8; DMA_BYTES as usize];
    let mut dst = vec![0u8; DMA_BYTES as usize];
    let t0 = Instant::now();
    let n = 4_000_000u64;
    for i in 0..n {
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst);
        std::hint::black_box(i);
    }
    let memcpy = n as f64 / t0.elapsed().as_secs_f64() / 1e6;
    for gen in [Generation::Gen1, Generation::Gen2] {
        let m = setup(gen);
        let g = gen.number();
        for (name, work) in
            [("NOP", Work::Nop), ("WRITE_DATA 1 dw", Work::WriteData), ("DMA_COPY 256 B", Work::Dma)]
        {
            for e in 0..3 {
                let (w, packets) = fill_ring(&m, gen, e, work);
                let t = best(reps, || run(&m, &[e], &[w]));
                let rate = packets as f64 / t.as_secs_f64() / 1e6;
                let note = match work {
                    Work::Dma => {
                        format!("{:.0} MB/s; host memcpy {memcpy:.1} M/s", rate * f64::from(DMA_BYTES))
                    }
                    _ => String::new(),
                };
                println!(
                    "| {g} | {name} | {} | {packets} | {:.1} | {rate:.2} | {note} |",
                    ["GFX", "COMPUTE", "COPY"][e],
                    t.as_secs_f64() * 1e3
                );
            }
        }
        // All three engines at once.
        for (name, works) in
            [("NOP x3", [Work::Nop; 3]), ("WRITE_DATA / NOP / DMA", [Work::WriteData, Work::Nop, Work::Dma])]
        {
            let mut w = [0u32; 3];
            let mut total = 0u64;
            for e in 0..3 {
                let (dw, p) = fill_ring(&m, gen, e, works[e]);
                w[e] = dw;
                total += p;
            }
            let t = best(reps, || run(&m, &[0, 1, 2], &w));
            println!(
                "| {g} | {name} | all 3 | {total} | {:.1} | {:.2} | aggregate |",
                t.as_secs_f64() * 1e3,
                total as f64 / t.as_secs_f64() / 1e6
            );
        }
        let rt = fence_round_trip(&m, gen, if quick { 50 } else { 300 });
        println!(
            "| {g} | doorbell -> FENCE visible (idle engine) | GFX | 1 | {:.3} | - | median round trip |",
            rt.as_secs_f64() * 1e3
        );
        m.shutdown();
    }
}
