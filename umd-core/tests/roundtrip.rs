//! Property tests: arbitrary valid command sequences survive encode ->
//! decode unchanged (padding aside); arbitrary bytes never make the decoder
//! panic or read out of bounds; command buffers chained over many chunks
//! execute, when followed CHAIN by CHAIN, exactly the commands pushed; the
//! encoder's per-kind entry points agree with `Encoder::encode` on any
//! operands.

use proptest::prelude::*;
use umd_core::cmd::{
    split_region, Command, CommandBuffer, CompareOp, DispatchOp, Encoder, Payload, SliceChunks,
};
use umd_core::decode::{DecodeError, Decoder};
use umd_core::hw::{Generation, PacketKind};

/// An owned command (WRITE_DATA data as a Vec) for proptest.
#[derive(Clone, Debug)]
enum Owned {
    Cmd(Command<'static>),
    Write { dst: u64, data: Vec<u32> },
}

impl Owned {
    fn command(&self) -> Command<'_> {
        match self {
            Owned::Cmd(c) => *c,
            Owned::Write { dst, data } => Command::WriteData { dst: *dst, data: Payload::Words(data) },
        }
    }
}

fn gen_strategy() -> impl Strategy<Value = Generation> {
    prop_oneof![Just(Generation::Gen1), Just(Generation::Gen2)]
}

/// Commands valid on both generations (addresses < 2^40, sizes within gen1
/// limits, fences 64-byte aligned, IBs 32-byte aligned).
fn command_strategy() -> impl Strategy<Value = Owned> {
    let addr4 = (0u64..(1 << 38)).prop_map(|a| a * 4);
    let addr8 = (0u64..(1 << 37)).prop_map(|a| a * 8);
    let addr32 = (0u64..(1 << 35)).prop_map(|a| a * 32);
    let addr64 = (0u64..(1 << 34)).prop_map(|a| a * 64);
    let op = (0u64..7).prop_map(|v| CompareOp::from_bits(v).unwrap());
    let dop = (0u64..3).prop_map(|v| DispatchOp::from_bits(v).unwrap());
    prop_oneof![
        (0u32..16).prop_map(|dwords| Owned::Cmd(Command::Nop { dwords })),
        (addr4.clone(), prop::collection::vec(any::<u32>(), 1..40))
            .prop_map(|(dst, data)| Owned::Write { dst, data }),
        (0u64..(1 << 40), 0u64..(1 << 40), 1u64..0x00FF_FFFF)
            .prop_map(|(src, dst, size)| Owned::Cmd(Command::Copy { src, dst, size })),
        (addr4.clone(), 1u64..0x3F_FFFF, any::<u32>())
            .prop_map(|(dst, n, value)| Owned::Cmd(Command::Fill { dst, size: n * 4, value })),
        (addr64, any::<u64>(), any::<bool>()).prop_map(|(addr, value, irq)| Owned::Cmd(Command::Fence {
            addr,
            value,
            irq
        })),
        (addr8.clone(), any::<u64>(), any::<u64>(), op, any::<bool>()).prop_map(|(addr, r, m, op, wide)| {
            let (reference, mask) = if wide { (r, m) } else { (r & 0xFFFF_FFFF, m & 0xFFFF_FFFF) };
            Owned::Cmd(Command::WaitMem { addr, reference, mask, op, wide })
        }),
        addr8.prop_map(|addr| Owned::Cmd(Command::Timestamp { addr })),
        (addr32.clone(), 1u32..262_144)
            .prop_map(|(addr, size_dw)| Owned::Cmd(Command::IndirectBuffer { addr, size_dw })),
        (addr32, 1u32..262_144).prop_map(|(addr, size_dw)| Owned::Cmd(Command::Chain { addr, size_dw })),
        (any::<bool>(), any::<bool>())
            .prop_map(|(wait_idle, invalidate)| Owned::Cmd(Command::Barrier { wait_idle, invalidate })),
        (dop, addr4.clone(), addr4.clone(), addr4, 1u32..0xFFFF, any::<u32>()).prop_map(
            |(op, a, b, dst, count, scalar_bits)| Owned::Cmd(Command::Dispatch {
                op,
                a,
                b,
                dst,
                count,
                scalar_bits
            })
        ),
    ]
}

proptest! {
    // No failure-persistence file: it needs the working directory, which
    // Miri's isolation forbids (shrunk failures still print in full).
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 8 } else { 2000 },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn encode_then_decode_gives_the_same_commands(
        gen in gen_strategy(),
        cmds in prop::collection::vec(command_strategy(), 1..40),
        base in (0u64..1024).prop_map(|b| 0x10_0000 + b * 32),
    ) {
        let enc = Encoder::new(gen);
        let mut out = vec![0u32; 8192];
        let mut pos = 0;
        for c in &cmds {
            pos += enc.encode(&c.command(), &mut out, pos, base).expect("valid command encodes");
        }
        let bytes: Vec<u8> = out[..pos].iter().flat_map(|d| d.to_le_bytes()).collect();
        let mut decoded = Vec::new();
        for item in Decoder::new(gen, &bytes, base) {
            let p = item.result.expect("encoder output decodes");
            prop_assert_eq!(p.violation, None);
            decoded.push(p.command);
        }
        // Padding NOPs are the only extra packets: drop NOPs the encoder
        // inserted (those not in the input) by matching in order.
        let mut it = decoded.iter();
        for c in &cmds {
            let want = c.command();
            let got = it.by_ref().find(|d| **d == want || d.kind() != PacketKind::Nop);
            prop_assert_eq!(got, Some(&want));
        }
        prop_assert!(it.all(|d| d.kind() == PacketKind::Nop));
    }

    #[test]
    fn per_kind_entry_points_agree_with_encode(
        gen in gen_strategy(),
        kind in 0u8..5,
        a in prop_oneof![any::<u64>(), (0u64..(1 << 34)).prop_map(|a| a * 4), (0u64..(1 << 30)).prop_map(|a| a * 64)],
        b in prop_oneof![any::<u64>(), (0u64..(1 << 34)).prop_map(|a| a * 4)],
        size in prop_oneof![Just(0u64), 0u64..0x100, (0u64..(1 << 29)).prop_map(|s| s * 4), any::<u64>()],
        value in any::<u64>(),
        data in prop::collection::vec(any::<u32>(), 0..300),
        cap in 0usize..400,
        pos in 0usize..40,
        base in (0u64..1024).prop_map(|b| 0x10_0000 + b * 4),
    ) {
        // Valid and invalid operands alike, into buffers that may be too
        // small: the per-kind entry point returns what `encode` returns and
        // leaves the buffer as `encode` does (untouched on error).
        let enc = Encoder::new(gen);
        let cmd = match kind {
            0 => Command::Fence { addr: a, value, irq: value & 1 != 0 },
            1 => Command::write_data(a, &data),
            2 => Command::Copy { src: b, dst: a, size },
            3 => Command::IndirectBuffer { addr: a, size_dw: size as u32 },
            _ => Command::Fill { dst: a, size, value: value as u32 },
        };
        let mut want = vec![0x5A5A_5A5Au32; cap];
        let mut got = want.clone();
        let r = enc.encode(&cmd, &mut want, pos, base);
        let k = match cmd {
            Command::Fence { addr, value, irq } => enc.encode_fence(addr, value, irq, &mut got, pos, base),
            Command::WriteData { dst, .. } => enc.encode_write_data(dst, &data, &mut got, pos, base),
            Command::Copy { src, dst, size } => enc.encode_copy(src, dst, size, &mut got, pos, base),
            Command::Fill { dst, size, value } => enc.encode_fill(dst, size, value, &mut got, pos, base),
            Command::IndirectBuffer { addr, size_dw } => {
                enc.encode_indirect_buffer(addr, size_dw, &mut got, pos, base)
            }
            _ => unreachable!(),
        };
        prop_assert_eq!(k, r);
        prop_assert_eq!(&got, &want);
        if r.is_err() {
            prop_assert!(got.iter().all(|&d| d == 0x5A5A_5A5A));
        }
    }

    #[test]
    fn decoder_survives_random_bytes(
        gen in gen_strategy(),
        bytes in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let mut covered = 0usize;
        let mut count = 0usize;
        for item in Decoder::new(gen, &bytes, 0x4000) {
            prop_assert_eq!(item.offset, covered);
            prop_assert!(!item.raw.is_empty());
            covered += item.raw.len();
            count += 1;
            prop_assert!(count <= bytes.len() / 4 + 1);
        }
        prop_assert!(covered <= bytes.len());
    }
}

/// 100k random byte vectors through both decoders, in
/// one test with a cheap inline generator so it runs in about a second.
#[test]
fn decoder_survives_100k_random_streams() {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let cases = if cfg!(miri) { 50 } else { 100_000 };
    let mut errors = 0usize;
    let mut packets = 0usize;
    for i in 0..cases {
        let len = (next() % 96) as usize;
        // Bias the first byte towards valid headers so deep paths are hit.
        let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        let gen = if i % 2 == 0 { Generation::Gen1 } else { Generation::Gen2 };
        if len >= 4 && i % 3 == 0 {
            let op =
                [0x00u8, 0x01, 0x02, 0x04, 0x05, 0x0A, 0x10, 0x20, 0x30, 0x31, 0x60][(next() % 11) as usize];
            let ndw = (next() % 10) as u32;
            let h = match gen {
                Generation::Gen1 => (u32::from(op) << 24) | ndw,
                Generation::Gen2 => 0x7000_0000 | (ndw << 16) | u32::from(op),
            };
            bytes[..4].copy_from_slice(&h.to_le_bytes());
        }
        for item in Decoder::new(gen, &bytes, 0) {
            match item.result {
                Ok(_) => packets += 1,
                Err(_) => errors += 1,
            }
        }
    }
    assert!(packets > 0 && errors > 0, "the generator reaches both outcomes");
}

#[test]
fn decoder_reports_each_kind_of_garbage() {
    // Truncated header.
    let items: Vec<_> = Decoder::new(Generation::Gen1, &[1, 2], 0).collect();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].result.unwrap_err(), DecodeError::Truncated { needed: 4, available: 2 });
    // Count pointing past the end: a WRITE_DATA claiming 200 dwords in 12 bytes.
    let mut s = Vec::new();
    for d in [0x0100_00C8u32, 0x1000, 0] {
        s.extend_from_slice(&d.to_le_bytes());
    }
    let items: Vec<_> = Decoder::new(Generation::Gen1, &s, 0).collect();
    assert_eq!(items[0].result.unwrap_err(), DecodeError::Truncated { needed: 804, available: 12 });
    // Reserved opcode, then decoding resumes after its NDW.
    let mut s = Vec::new();
    for d in [0x7F00_0001u32, 0xFFFF_FFFF, 0x0000_0000] {
        s.extend_from_slice(&d.to_le_bytes());
    }
    let items: Vec<_> = Decoder::new(Generation::Gen1, &s, 0).collect();
    assert_eq!(items.len(), 2);
    assert!(matches!(items[0].result.unwrap_err(), DecodeError::UnknownOpcode { opcode: 0x7F, .. }));
    assert!(items[1].result.is_ok(), "the NOP after it decodes");
    // Gen2 bad TYPE.
    let zero = 0u32.to_le_bytes();
    let items: Vec<_> = Decoder::new(Generation::Gen2, &zero, 0).collect();
    assert!(matches!(items[0].result.unwrap_err(), DecodeError::BadTag { .. }));
    // Wrong fixed length: gen1 FENCE with NDW 3.
    let mut s = Vec::new();
    for d in [0x0400_0003u32, 0, 0, 0] {
        s.extend_from_slice(&d.to_le_bytes());
    }
    let items: Vec<_> = Decoder::new(Generation::Gen1, &s, 0).collect();
    assert_eq!(
        items[0].result.unwrap_err(),
        DecodeError::BadLength { kind: PacketKind::Fence, ndw: 3, min: 4, max: 4 }
    );
    // Reserved bits: gen1 DMA_COPY with SIZE[31:24] set; gen1 FENCE with FLAGS bit 1.
    let mut s = Vec::new();
    for d in [0x0200_0005u32, 0, 0, 0, 0, 0x0100_0004] {
        s.extend_from_slice(&d.to_le_bytes());
    }
    let items: Vec<_> = Decoder::new(Generation::Gen1, &s, 0).collect();
    assert_eq!(
        items[0].result.unwrap_err(),
        DecodeError::ReservedBits { kind: PacketKind::DmaCopy, dword: Some(4), bits: 0x0100_0000 }
    );
    let mut s = Vec::new();
    for d in [0x0402_0004u32, 0x40, 0, 1, 0] {
        s.extend_from_slice(&d.to_le_bytes());
    }
    let items: Vec<_> = Decoder::new(Generation::Gen1, &s, 0).collect();
    assert_eq!(
        items[0].result.unwrap_err(),
        DecodeError::ReservedBits { kind: PacketKind::Fence, dword: None, bits: 2 }
    );
    // Reserved compare op 7 (gen1 FLAGS[2:0]).
    let mut s = Vec::new();
    for d in [0x0507_0006u32, 0x40, 0, 0, 0, 0, 0] {
        s.extend_from_slice(&d.to_le_bytes());
    }
    let items: Vec<_> = Decoder::new(Generation::Gen1, &s, 0).collect();
    assert_eq!(items[0].result.unwrap_err(), DecodeError::ReservedOp { kind: PacketKind::WaitMem, value: 7 });
}

#[test]
fn decoder_flags_rule_violations() {
    use umd_core::decode::Violation;
    // A gen2 FENCE at a misaligned address decodes but is flagged: the
    // device would drop it silently.
    let mut s = Vec::new();
    for d in [0x7004_0030u32, 0x1008, 0, 1, 0] {
        s.extend_from_slice(&d.to_le_bytes());
    }
    let items: Vec<_> = Decoder::new(Generation::Gen2, &s, 0).collect();
    let p = items[0].result.unwrap();
    assert!(matches!(
        p.violation,
        Some(Violation::Operand(umd_core::cmd::EncodeError::MisalignedFence { .. }))
    ));
    // A gen2 FILL at byte offset 4 is flagged as a misaligned packet.
    let mut s = Vec::new();
    for d in [0x7000_0000u32, 0x7004_0021, 4, 0x1000, 0, 0] {
        s.extend_from_slice(&d.to_le_bytes());
    }
    let items: Vec<_> = Decoder::new(Generation::Gen2, &s, 0).collect();
    assert_eq!(items[1].result.unwrap().violation, Some(Violation::PacketMisaligned { align: 32 }));
}

/// Follows a chained command stream the way the device does (section 4.2)
/// over a memory image, returning the non-NOP commands executed.
fn execute_chain(gen: Generation, mem: &[u32], mem_va: u64, va: u64, size_dw: u32) -> Vec<String> {
    let bytes: Vec<u8> = mem.iter().flat_map(|d| d.to_le_bytes()).collect();
    let mut out = Vec::new();
    let (mut va, mut size) = (va, size_dw);
    for _hop in 0..1000 {
        let start = (va - mem_va) as usize;
        let ib = &bytes[start..start + size as usize * 4];
        let mut next = None;
        for item in Decoder::new(gen, ib, va) {
            let p = item.result.expect("chained stream decodes");
            assert_eq!(p.violation, None);
            match p.command {
                Command::Chain { addr, size_dw } => {
                    next = Some((addr, size_dw));
                    break;
                }
                Command::Nop { .. } => {}
                c => out.push(format!("{c:?}")),
            }
        }
        match next {
            Some((a, s)) => (va, size) = (a, s),
            None => return out,
        }
    }
    panic!("chain does not end");
}

#[test]
fn command_buffer_chains_across_chunks() {
    for gen in [Generation::Gen1, Generation::Gen2] {
        for chunk_dw in [16usize, 24, 64, 1000] {
            let mut mem = vec![0u32; 4096];
            let mem_va = 0x20_0000u64;
            let mut cb = CommandBuffer::new(gen, SliceChunks::new(split_region(&mut mem, mem_va, chunk_dw)));
            let mut want = Vec::new();
            let data = [1u32, 2, 3];
            for i in 0..100u64 {
                let c = match i % 4 {
                    0 => Command::Fence { addr: 0x1000 + 64 * i, value: i, irq: i % 8 == 0 },
                    1 => Command::Fill { dst: 0x8000, size: 4 * i + 4, value: i as u32 },
                    2 => Command::write_data(0x9000 + 4 * i, &data),
                    _ => Command::Copy { src: 0x1000, dst: 0x2000 + i, size: i + 1 },
                };
                cb.push(&c).unwrap();
                want.push(format!("{c:?}"));
            }
            let fin = cb.finish().unwrap();
            assert_eq!(fin.packets, 100);
            assert!(fin.chunks > 1 || chunk_dw == 1000);
            assert!(fin.size_dw as usize <= chunk_dw);
            let got = execute_chain(gen, &mem, mem_va, fin.gpu_va, fin.size_dw);
            assert_eq!(got, want, "{gen}, chunks of {chunk_dw} dwords");
        }
    }
}

/// The command buffer's `fence`, `fill`, `write_data` and `copy` (the
/// encoder's per-kind entry points on their common path) write exactly what
/// `push` of the same commands writes, across chunk changes, and fail the
/// same way (sticky error, nothing written) on a bad command.
#[test]
fn command_buffer_methods_write_what_push_writes() {
    for gen in [Generation::Gen1, Generation::Gen2] {
        for chunk_dw in [16usize, 24, 64, 1000] {
            for bad_at in [None, Some(0u64), Some(36)] {
                let mut a = vec![0u32; 4096];
                let mut b = vec![0u32; 4096];
                let mem_va = 0x20_0000u64;
                let mut pushed =
                    CommandBuffer::new(gen, SliceChunks::new(split_region(&mut a, mem_va, chunk_dw)));
                let mut called =
                    CommandBuffer::new(gen, SliceChunks::new(split_region(&mut b, mem_va, chunk_dw)));
                let data = [1u32, 2, 3];
                for i in 0..100u64 {
                    // A misaligned FENCE at `bad_at` (refused on both generations).
                    let addr = if Some(i) == bad_at { 0x1004 } else { 0x1000 + 64 * i };
                    let c = match i % 4 {
                        0 => Command::Fence { addr, value: i, irq: i % 8 == 0 },
                        1 => Command::Fill { dst: 0x8000, size: 4 * i + 4, value: i as u32 },
                        2 => Command::write_data(0x9000 + 4 * i, &data),
                        _ => Command::Copy { src: 0x1000, dst: 0x2000 + i, size: i + 1 },
                    };
                    let want = pushed.push(&c);
                    let got = match c {
                        Command::Fence { addr, value, irq } => called.fence(addr, value, irq),
                        Command::Fill { dst, size, value } => called.fill(dst, size, value),
                        Command::WriteData { dst, .. } => called.write_data(dst, &data),
                        Command::Copy { src, dst, size } => called.copy(src, dst, size),
                        _ => unreachable!(),
                    };
                    assert_eq!(got, want, "{gen}, chunks of {chunk_dw}, packet {i}");
                }
                assert_eq!(called.packets(), pushed.packets());
                assert_eq!(called.error().is_some(), bad_at.is_some());
                assert_eq!(called.finish(), pushed.finish());
                assert_eq!(a, b, "{gen}, chunks of {chunk_dw}, bad at {bad_at:?}");
            }
        }
    }
}
