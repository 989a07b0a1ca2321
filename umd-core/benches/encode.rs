//! Encoding throughput against `memcpy` of the same bytes, in the same run.
//!
//! For each workload the encoder writes N packets into a buffer, and the
//! baseline copies an identical, pre-encoded byte image of the same size
//! with `copy_from_slice` (memcpy). Both are timed over many repetitions;
//! the table reports the median ns per packet, the bytes per packet and the
//! ratio encoder / memcpy (1.0 = as fast as copying the finished bytes).
//!
//! A second table compares the encoder with the store limit: hand-written
//! code that stores the same dwords for the same commands (header constants
//! and field positions typed in from `docs/refgpu.md`, NOP padding, no
//! validation, no tables), checked to produce the encoder's exact bytes;
//! it times both `Encoder::encode` and the per-kind entry points
//! (`Encoder::encode_fence` and friends, what the command buffer calls).
//!
//! Run: `cargo bench -p umd-core --bench encode`

use std::hint::black_box;
use std::time::Instant;

use umd_core::cmd::{Command, Encoder, Payload};
use umd_core::hw::Generation;

#[path = "common/store.rs"]
mod store_limit;
use store_limit::store;

const REPS: usize = 301;

fn median_ns(mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..REPS)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_nanos() as f64
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    t[REPS / 2]
}

struct Row {
    name: String,
    packets: usize,
    dwords: usize,
    enc_ns: f64,
    memcpy_ns: f64,
}

fn encode_all(enc: &Encoder, cmds: &[Command<'_>], out: &mut [u32]) -> usize {
    let mut pos = 0;
    for c in cmds {
        pos += enc.encode(c, out, pos, 0x10_0000).expect("bench commands are valid");
    }
    pos
}

fn measure(name: &str, gen: Generation, cmds: &[Command<'_>]) -> Row {
    let enc = Encoder::new(gen);
    let mut out = vec![0u32; 1 << 22];
    let dwords = encode_all(&enc, cmds, &mut out);
    let image = out[..dwords].to_vec();
    let mut dst = vec![0u32; dwords];
    // Warm both paths.
    for _ in 0..10 {
        encode_all(&enc, black_box(cmds), &mut out);
        dst.copy_from_slice(black_box(&image));
    }
    let enc_ns = median_ns(|| {
        black_box(encode_all(&enc, black_box(cmds), black_box(&mut out)));
    });
    let memcpy_ns = median_ns(|| {
        black_box(&mut dst).copy_from_slice(black_box(&image));
    });
    Row { name: format!("{gen} {name}"), packets: cmds.len(), dwords, enc_ns, memcpy_ns }
}

/// The encoder's per-kind entry points (what `CommandBuffer::fence`,
/// `write_data`, `copy` and `fill` call), dispatched on the command the
/// way `store` is.
fn encode_kinds(enc: &Encoder, cmds: &[Command<'_>], out: &mut [u32]) -> usize {
    let mut pos = 0;
    for c in cmds {
        let base = 0x10_0000;
        let r = match *c {
            Command::Fence { addr, value, irq } => enc.encode_fence(addr, value, irq, out, pos, base),
            Command::WriteData { dst, data: Payload::Words(w) } => {
                enc.encode_write_data(dst, w, out, pos, base)
            }
            Command::Copy { src, dst, size } => enc.encode_copy(src, dst, size, out, pos, base),
            Command::Fill { dst, size, value } => enc.encode_fill(dst, size, value, out, pos, base),
            _ => unreachable!("not a store-limit workload"),
        };
        pos += r.expect("bench commands are valid");
    }
    pos
}

fn store_all(gen: Generation, cmds: &[Command<'_>], out: &mut [u32]) -> usize {
    let mut pos = 0;
    for c in cmds {
        pos += store(gen, c, out, pos, 0x10_0000);
    }
    pos
}

struct StoreRow {
    name: String,
    packets: usize,
    enc_ns: f64,
    kind_ns: f64,
    store_ns: f64,
}

/// Encoder against the hand-written stores of the same commands.
fn measure_store(name: &str, gen: Generation, cmds: &[Command<'_>]) -> StoreRow {
    let enc = Encoder::new(gen);
    let mut a = vec![0u32; 1 << 20];
    let mut b = vec![0xdead_beefu32; 1 << 20];
    let na = encode_all(&enc, cmds, &mut a);
    let nb = store_all(gen, cmds, &mut b);
    assert_eq!(a[..na], b[..nb], "{gen} {name}: the store baseline must write the encoder's bytes");
    let mut k = vec![0x5555_5555u32; 1 << 20];
    let nk = encode_kinds(&enc, cmds, &mut k);
    assert_eq!(a[..na], k[..nk], "{gen} {name}: the per-kind entry points must write encode's bytes");
    for _ in 0..10 {
        encode_all(&enc, black_box(cmds), &mut a);
        encode_kinds(&enc, black_box(cmds), &mut k);
        store_all(gen, black_box(cmds), &mut b);
    }
    let enc_ns = median_ns(|| {
        black_box(encode_all(&enc, black_box(cmds), black_box(&mut a)));
    });
    let kind_ns = median_ns(|| {
        black_box(encode_kinds(black_box(&enc), black_box(cmds), black_box(&mut k)));
    });
    let store_ns = median_ns(|| {
        black_box(store_all(black_box(gen), black_box(cmds), black_box(&mut b)));
    });
    StoreRow { name: format!("{gen} {name}"), packets: cmds.len(), enc_ns, kind_ns, store_ns }
}

fn store_limit() {
    const N: u64 = 3000;
    let data: Vec<u32> = (0..16).collect();
    let mut rows = Vec::new();
    for gen in [Generation::Gen1, Generation::Gen2] {
        let fence: Vec<Command<'_>> =
            (0..N).map(|i| Command::Fence { addr: 0x50_0000 + 64 * i, value: i, irq: i % 2 == 0 }).collect();
        rows.push(measure_store("FENCE", gen, &fence));
        for n in [1usize, 4, 16] {
            let wd: Vec<Command<'_>> =
                (0..N).map(|i| Command::write_data(0x20_0000 + 64 * i, &data[..n])).collect();
            rows.push(measure_store(&format!("WRITE_DATA({n})"), gen, &wd));
        }
        let copy: Vec<Command<'_>> =
            (0..N).map(|i| Command::Copy { src: 0x30_0000, dst: 0x40_0000 + i * 8, size: 4096 }).collect();
        rows.push(measure_store("DMA_COPY", gen, &copy));
        let fill: Vec<Command<'_>> =
            (0..N).map(|i| Command::Fill { dst: 0x60_0000 + 16 * i, size: 256, value: i as u32 }).collect();
        rows.push(measure_store("FILL", gen, &fill));
    }
    println!();
    println!("store limit: encoder against hand-written stores of the same dwords");
    println!(
        "(encode: Encoder::encode(&Command); per-kind: Encoder::encode_fence / _write_data / _copy / _fill)"
    );
    println!(
        "{:<30} {:>8} {:>11} {:>13} {:>13} {:>9} {:>11}",
        "workload", "packets", "encode ns", "per-kind ns", "store ns", "encode/st", "per-kind/st"
    );
    for r in rows {
        let n = r.packets as f64;
        println!(
            "{:<30} {:>8} {:>11.2} {:>13.2} {:>13.2} {:>9.2} {:>11.2}",
            r.name,
            r.packets,
            r.enc_ns / n,
            r.kind_ns / n,
            r.store_ns / n,
            r.enc_ns / r.store_ns,
            r.kind_ns / r.store_ns
        );
    }
}

fn main() {
    let data_small: Vec<u32> = (0..16).collect();
    let data_gen1: Vec<u32> = (0..254).collect();
    let data_gen2: Vec<u32> = (0..4000).collect();
    let mut rows = Vec::new();
    for gen in [Generation::Gen1, Generation::Gen2] {
        // Mixed stream: WRITE_DATA(16) / DMA_COPY / FENCE, 3000 packets.
        let mixed: Vec<Command<'_>> = (0..3000u64)
            .map(|i| match i % 3 {
                0 => Command::write_data(0x20_0000 + 64 * i, &data_small),
                1 => Command::Copy { src: 0x30_0000, dst: 0x40_0000 + i * 8, size: 4096 },
                _ => Command::Fence { addr: 0x50_0000 + 64 * i, value: i, irq: false },
            })
            .collect();
        rows.push(measure("mixed WRITE_DATA(16)/DMA_COPY/FENCE", gen, &mixed));
        // Large packets: WRITE_DATA at the generation's payload limit.
        let big = if gen == Generation::Gen1 { &data_gen1 } else { &data_gen2 };
        let large: Vec<Command<'_>> = (0..if gen == Generation::Gen1 { 400 } else { 25 })
            .map(|i| Command::write_data(0x20_0000 + 0x4000 * i as u64, big))
            .collect();
        rows.push(measure(&format!("large WRITE_DATA({})", big.len()), gen, &large));
        // Small fixed packets only.
        let fences: Vec<Command<'_>> =
            (0..3000u64).map(|i| Command::Fence { addr: 0x50_0000 + 64 * i, value: i, irq: true }).collect();
        rows.push(measure("FENCE only", gen, &fences));
        // NOP-heavy: FENCE (5 dw) then FILL: gen2 pads 3 NOP dwords each time.
        let padded: Vec<Command<'_>> = (0..3000u64)
            .map(|i| {
                if i % 2 == 0 {
                    Command::Fence { addr: 0x50_0000 + 64 * i, value: i, irq: false }
                } else {
                    Command::Fill { dst: 0x60_0000, size: 256, value: i as u32 }
                }
            })
            .collect();
        rows.push(measure("FENCE/FILL (gen2: NOP padding)", gen, &padded));
    }
    println!(
        "{:<46} {:>8} {:>10} {:>12} {:>12} {:>8}",
        "workload", "packets", "bytes/pkt", "enc ns/pkt", "memcpy ns/pkt", "ratio"
    );
    for r in rows {
        let n = r.packets as f64;
        println!(
            "{:<46} {:>8} {:>10.1} {:>12.2} {:>12.2} {:>8.2}",
            r.name,
            r.packets,
            (r.dwords * 4) as f64 / n,
            r.enc_ns / n,
            r.memcpy_ns / n,
            r.enc_ns / r.memcpy_ns
        );
    }
    store_limit();
}
