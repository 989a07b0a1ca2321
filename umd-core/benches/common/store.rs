//! The store limit of the encoder benchmarks (`benches/encode.rs`, and
//! `benches/icount.rs` for instruction counts): hand-written code storing
//! the dwords of a command for one generation, with header constants and
//! field positions typed in from `docs/refgpu.md`, gen2's NOP padding, no
//! validation and no description tables. Both benchmarks check that it
//! writes exactly the encoder's bytes.

use umd_core::cmd::{Command, Payload};
use umd_core::hw::Generation;

/// Hand-written store of one command for `gen`: the limit an encoder can
/// reach (no validation, no description lookups). Only the packets of the
/// store-limit workloads are handled.
#[inline(always)]
pub fn store(gen: Generation, cmd: &Command<'_>, out: &mut [u32], pos: usize, base_va: u64) -> usize {
    let g2 = gen == Generation::Gen2;
    let hdr = |op1: u32, op2: u32, flags: u32, ndw: u32| {
        if g2 {
            0x7000_0000 | (ndw << 16) | (flags << 8) | op2
        } else {
            (op1 << 24) | (flags << 16) | ndw
        }
    };
    let lo = |v: u64| v as u32;
    let hi = |v: u64| (v >> 32) as u32;
    // gen2: DMA_COPY / FILL headers 32-byte aligned, padded with one NOP.
    let pad = |out: &mut [u32], pos: usize| -> usize {
        if !g2 {
            return 0;
        }
        let va = base_va + pos as u64 * 4;
        let n = ((32 - (va % 32)) % 32 / 4) as usize;
        if n > 0 {
            out[pos] = hdr(0, 0, 0, n as u32 - 1);
            out[pos + 1..pos + n].fill(0);
        }
        n
    };
    match *cmd {
        Command::Fence { addr, value, irq } => {
            let o = &mut out[pos..pos + 5];
            o[0] = hdr(0x04, 0x30, irq as u32, 4);
            o[1] = lo(addr);
            o[2] = hi(addr);
            o[3] = lo(value);
            o[4] = hi(value);
            5
        }
        Command::WriteData { dst, data: Payload::Words(w) } => {
            let n = w.len();
            let o = &mut out[pos..pos + 3 + n];
            o[0] = hdr(0x01, 0x10, 0, 2 + n as u32);
            o[1] = lo(dst);
            o[2] = hi(dst);
            o[3..].copy_from_slice(w);
            3 + n
        }
        Command::Copy { src, dst, size } => {
            let p = pad(out, pos);
            let o = &mut out[pos + p..pos + p + 6];
            o[0] = hdr(0x02, 0x20, 0, 5);
            if g2 {
                o[1] = size as u32;
                o[2] = lo(src);
                o[3] = hi(src);
                o[4] = lo(dst);
                o[5] = hi(dst);
            } else {
                o[1] = lo(src);
                o[2] = hi(src);
                o[3] = lo(dst);
                o[4] = hi(dst);
                o[5] = size as u32;
            }
            p + 6
        }
        Command::Fill { dst, size, value } => {
            let p = pad(out, pos);
            let o = &mut out[pos + p..pos + p + 5];
            o[0] = hdr(0x03, 0x21, 0, 4);
            if g2 {
                o[1] = size as u32;
                o[2] = lo(dst);
                o[3] = hi(dst);
            } else {
                o[1] = lo(dst);
                o[2] = hi(dst);
                o[3] = size as u32;
            }
            o[4] = value;
            p + 5
        }
        _ => unreachable!("not a store-limit workload"),
    }
}
