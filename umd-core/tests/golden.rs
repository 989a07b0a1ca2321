//! Golden bytes from `docs/refgpu.md` section 7: the test reads the worked
//! examples out of the specification itself, so the document and the
//! encoder can not drift apart. Each row is checked three ways: its byte
//! column is its dword column in little-endian order, the encoder produces
//! exactly those bytes, and the decoder turns them back into the command.

use umd_core::cmd::{Command, CompareOp, DispatchOp, Encoder};
use umd_core::decode::Decoder;
use umd_core::hw::Generation;

const D: u64 = 0x12_3456_7800;
const S: u64 = 0x12_3456_9000;
const F: u64 = 0x12_3456_7840;
const DATA: [u32; 2] = [0xDEAD_BEEF, 0x0123_4567];

/// The command each example row (keyed by its `<!-- KEY -->` marker) shows.
fn command_for(key: &str) -> Command<'static> {
    match key {
        "NOP" => Command::Nop { dwords: 0 },
        "NOP_1" => Command::Nop { dwords: 1 },
        "WRITE_DATA" => Command::write_data(D, &DATA),
        "DMA_COPY" => Command::Copy { src: S, dst: D, size: 0x1000 },
        "FILL" => Command::Fill { dst: D, size: 64, value: 0xA5A5_A5A5 },
        "FENCE" => Command::Fence { addr: F, value: 0x1_0000_0002, irq: true },
        "WAIT_MEM" => {
            Command::WaitMem { addr: F, reference: 5, mask: u64::MAX, op: CompareOp::SeqGe, wide: true }
        }
        "TIMESTAMP" => Command::Timestamp { addr: D },
        "INDIRECT_BUFFER" => Command::IndirectBuffer { addr: S, size_dw: 64 },
        "CHAIN" => Command::Chain { addr: S, size_dw: 16 },
        "BARRIER" => Command::Barrier { wait_idle: true, invalidate: true },
        "DISPATCH" => Command::saxpy(S, D, D + 0x1000, 256, 2.0),
        other => panic!("spec example {other} has no command in this test"),
    }
}

struct Example {
    key: String,
    dwords: Vec<u32>,
    bytes: Vec<u8>,
}

/// The example rows of the section whose heading starts with `heading`.
fn examples(heading: &str) -> Vec<Example> {
    let spec = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/refgpu.md"))
        .expect("docs/refgpu.md is readable");
    let start = spec.find(heading).unwrap_or_else(|| panic!("section {heading} in the spec"));
    let section = &spec[start..];
    let section = &section[..section[4..].find("\n### ").map_or(section.len(), |e| e + 4)];
    let mut out = Vec::new();
    for line in section.lines().filter(|l| l.contains("<!--")) {
        let key = line.split("<!--").nth(1).unwrap().split("-->").next().unwrap().trim().to_string();
        let cols: Vec<&str> = line.split('`').collect();
        // cols: [.., label.., dwords, " | ", bytes, " |"]; the last two code spans.
        let code: Vec<&str> = cols.iter().enumerate().filter(|(i, _)| i % 2 == 1).map(|(_, c)| *c).collect();
        let dwords = code[code.len() - 2]
            .split_whitespace()
            .map(|d| u32::from_str_radix(d, 16).expect("hex dword"))
            .collect();
        let bytes = code[code.len() - 1]
            .split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).expect("hex byte"))
            .collect();
        out.push(Example { key, dwords, bytes });
    }
    out
}

fn check_generation(gen: Generation, heading: &str) {
    let rows = examples(heading);
    assert_eq!(rows.len(), 12, "{gen}: every packet has a worked example");
    let enc = Encoder::new(gen);
    for ex in rows {
        let le: Vec<u8> = ex.dwords.iter().flat_map(|d| d.to_le_bytes()).collect();
        assert_eq!(le, ex.bytes, "{gen} {}: the spec's byte column is its dwords in LE", ex.key);

        let cmd = command_for(&ex.key);
        // Base 0x1000 is aligned for every rule, so no padding is expected.
        let mut out = vec![0xFFFF_FFFFu32; 16];
        let n = enc.encode(&cmd, &mut out, 0, 0x1000).unwrap_or_else(|e| panic!("{gen} {}: {e}", ex.key));
        let got: Vec<u8> = out[..n].iter().flat_map(|d| d.to_le_bytes()).collect();
        assert_eq!(got, ex.bytes, "{gen} {}: encoder output matches the spec", ex.key);
        assert!(
            out[n..].iter().all(|&d| d == 0xFFFF_FFFF),
            "{gen} {}: nothing written past the packet",
            ex.key
        );

        let items: Vec<_> = Decoder::new(gen, &ex.bytes, 0x1000).collect();
        assert_eq!(items.len(), 1, "{gen} {}: one packet", ex.key);
        let p = items[0].result.as_ref().unwrap_or_else(|e| panic!("{gen} {}: {e}", ex.key));
        assert_eq!(p.command, cmd, "{gen} {}: decodes to the command", ex.key);
        assert_eq!(p.violation, None, "{gen} {}: a spec example breaks no rule", ex.key);
    }
}

#[test]
fn gen1_worked_examples() {
    check_generation(Generation::Gen1, "### 7.1 Generation 1");
}

#[test]
fn gen2_worked_examples() {
    check_generation(Generation::Gen2, "### 7.2 Generation 2");
}

/// Section 7.3: FENCE at offset 0 (20 bytes), then FILL must start at 32,
/// with a NOP of NDW = 2 (`0x70020000`) at offset 20.
#[test]
fn gen2_padding_example() {
    let enc = Encoder::new(Generation::Gen2);
    let mut out = [0u32; 16];
    let mut pos = enc.encode(&Command::Fence { addr: F, value: 1, irq: false }, &mut out, 0, 0x1000).unwrap();
    assert_eq!(pos, 5);
    pos += enc.encode(&Command::Fill { dst: D, size: 64, value: 0 }, &mut out, pos, 0x1000).unwrap();
    assert_eq!(out[5], 0x7002_0000, "NOP header with NDW = 2");
    assert_eq!(&out[6..8], &[0, 0], "NOP payload");
    assert_eq!(out[8], 0x7004_0021, "FILL header at byte offset 32");
    assert_eq!(pos, 8 + 5);
}

/// The same FILL on gen1 needs no padding (4-byte packet alignment).
#[test]
fn gen1_needs_no_padding() {
    let enc = Encoder::new(Generation::Gen1);
    let mut out = [0u32; 16];
    let pos = enc.encode(&Command::Fence { addr: F, value: 1, irq: false }, &mut out, 0, 0x1000).unwrap();
    let n = enc.encode(&Command::Fill { dst: D, size: 64, value: 0 }, &mut out, pos, 0x1000).unwrap();
    assert_eq!(n, 5);
    assert_eq!(out[5], 0x0300_0004);
}

/// Unused-op sanity: DispatchOp and CompareOp encodings follow the spec.
#[test]
fn op_encodings_follow_spec() {
    assert_eq!(DispatchOp::SaxpyF32 as u32, 2);
    assert_eq!(CompareOp::SeqGe as u32, 6);
    assert_eq!(CompareOp::from_bits(7), None);
    assert_eq!(DispatchOp::from_bits(3), None);
}
