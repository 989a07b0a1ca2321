//! The example streams shipped in `examples/streams/`: the specification's
//! worked examples (`docs/refgpu.md` section 7) packed into `.rgcs` files,
//! plus a stream with the mistakes a dump is for. `cargo run -p umd-dump
//! --example make_streams` rewrites them; a test checks they are current.

use umd_core::cmd::{Command, CompareOp, Encoder};
use umd_core::decode::StreamFile;
use umd_core::hw::{ChipId, Generation};

const D: u64 = 0x12_3456_7800;
const S: u64 = 0x12_3456_9000;
const F: u64 = 0x12_3456_7840;
const DATA: [u32; 2] = [0xDEAD_BEEF, 0x0123_4567];
/// GPU address the example streams are placed at.
pub const BASE: u64 = 0x10_0000;

/// The worked-example commands of section 7, in table order.
pub fn worked_examples() -> Vec<Command<'static>> {
    vec![
        Command::Nop { dwords: 0 },
        Command::Nop { dwords: 1 },
        Command::write_data(D, &DATA),
        Command::Copy { src: S, dst: D, size: 0x1000 },
        Command::Fill { dst: D, size: 64, value: 0xA5A5_A5A5 },
        Command::Fence { addr: F, value: 0x1_0000_0002, irq: true },
        Command::WaitMem { addr: F, reference: 5, mask: u64::MAX, op: CompareOp::SeqGe, wide: true },
        Command::Timestamp { addr: D },
        Command::IndirectBuffer { addr: S, size_dw: 64 },
        Command::Chain { addr: S, size_dw: 16 },
        Command::Barrier { wait_idle: true, invalidate: true },
        Command::saxpy(S, D, D + 0x1000, 256, 2.0),
    ]
}

fn stream(gen: Generation, cmds: &[Command<'_>]) -> Vec<u8> {
    let enc = Encoder::new(gen);
    let mut dw = vec![0u32; 1024];
    let mut pos = 0;
    for c in cmds {
        // The worked examples are valid on both generations by construction.
        pos += enc.encode(c, &mut dw, pos, BASE).unwrap_or(0);
    }
    let mut out = StreamFile::header(ChipId { generation: gen, revision: 0 }, BASE).to_vec();
    out.extend(dw[..pos].iter().flat_map(|d| d.to_le_bytes()));
    out
}

/// Every shipped example: file name and contents.
pub fn all() -> Vec<(&'static str, Vec<u8>)> {
    let mut broken = stream(Generation::Gen2, &[Command::Timestamp { addr: D }]);
    // A gen2 FENCE at a misaligned address (the device drops it silently),
    // a FILL that is not 32-byte aligned (the device faults), a reserved
    // opcode, and a WRITE_DATA whose length runs past the end.
    for d in [
        0x7004_0030u32,
        0x3456_7808,
        0x12,
        1,
        0,           // FENCE 8 bytes past a 64-byte boundary
        0x7000_0000, // NOP, so that the FILL lands at offset 36
        0x7004_0021,
        64,
        0x3456_7800,
        0x12,
        0,           // FILL not 32-byte aligned
        0x7000_00EE, // reserved opcode 0xEE
        0x7010_0010,
        0x3456_7800, // WRITE_DATA claiming 16 dwords
    ] {
        broken.extend_from_slice(&d.to_le_bytes());
    }
    vec![
        ("gen1-worked-examples.rgcs", stream(Generation::Gen1, &worked_examples())),
        ("gen2-worked-examples.rgcs", stream(Generation::Gen2, &worked_examples())),
        ("gen2-broken.rgcs", broken),
    ]
}
