//! Encoding throughput against `memcpy` of the same bytes, in the same run.
//!
//! For each workload the encoder writes N packets into a buffer, and the
//! baseline copies an identical, pre-encoded byte image of the same size
//! with `copy_from_slice` (memcpy). Both are timed over many repetitions;
//! the table reports the median ns per packet, the bytes per packet and the
//! ratio encoder / memcpy (1.0 = as fast as copying the finished bytes).
//!
//! Run: `cargo bench -p umd-core --bench encode`

use std::hint::black_box;
use std::time::Instant;

use umd_core::cmd::{Command, Encoder};
use umd_core::hw::Generation;

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
}
