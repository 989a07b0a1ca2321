//! Encoder <-> decoder for both generations on command sequences built from
//! the fuzzer's bytes (any operand values, valid or not). Invariants: a
//! command the encoder accepts decodes back to itself (the NOPs it inserted
//! for alignment aside) with no rule violation; a command it refuses gets a
//! typed error, and the output buffer is exactly as it was.
#![no_main]

use libfuzzer_sys::fuzz_target;
use umd_core::cmd::{Command, CompareOp, DispatchOp, Encoder, Payload};
use umd_core::decode::Decoder;
use umd_core::hw::Generation;

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        let (v, rest) = self.0.split_first().map_or((0, &[][..]), |(v, r)| (*v, r));
        self.0 = rest;
        v
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
    /// An address: mostly small and aligned, sometimes anything.
    fn addr(&mut self) -> u64 {
        match self.u8() % 4 {
            0 => self.u64(),
            1 => u64::from(self.u32()),
            _ => u64::from(self.u32()) << 6,
        }
    }
    fn size(&mut self) -> u64 {
        match self.u8() % 4 {
            0 => self.u64(),
            1 => 0,
            _ => u64::from(self.u32() >> 8),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes(data);
    let gen = if b.u8() & 1 == 0 { Generation::Gen1 } else { Generation::Gen2 };
    let enc = Encoder::new(gen);
    let base_va = u64::from(b.u32()) << 2;
    let mut out = vec![0xDEAD_BEEFu32; 4096];
    let mut pos = 0usize;
    let mut accepted: Vec<Command<'_>> = Vec::new();
    let words: Vec<u32> = (0..(b.u8() % 64)).map(|i| i as u32 * 0x0101_0101).collect();
    while !b.0.is_empty() {
        let cmd = match b.u8() % 11 {
            0 => Command::Nop { dwords: b.u32() % 64 },
            1 => Command::WriteData {
                dst: b.addr(),
                data: Payload::Words(&words[..(b.u8() as usize % (words.len() + 1))]),
            },
            2 => Command::Copy { src: b.addr(), dst: b.addr(), size: b.size() },
            3 => Command::Fill { dst: b.addr(), size: b.size(), value: b.u32() },
            4 => Command::Fence { addr: b.addr(), value: b.u64(), irq: b.u8() & 1 != 0 },
            5 => {
                let Some(op) = CompareOp::from_bits(u64::from(b.u8() % 8)) else { continue };
                Command::WaitMem {
                    addr: b.addr(),
                    reference: b.u64(),
                    mask: b.u64(),
                    op,
                    wide: b.u8() & 1 != 0,
                }
            }
            6 => Command::Timestamp { addr: b.addr() },
            7 => Command::IndirectBuffer { addr: b.addr(), size_dw: b.u32() },
            8 => Command::Chain { addr: b.addr(), size_dw: b.u32() },
            9 => Command::Barrier { wait_idle: b.u8() & 1 != 0, invalidate: b.u8() & 1 != 0 },
            _ => {
                let Some(op) = DispatchOp::from_bits(u64::from(b.u8() % 4)) else { continue };
                Command::Dispatch {
                    op,
                    a: b.addr(),
                    b: b.addr(),
                    dst: b.addr(),
                    count: b.u32(),
                    scalar_bits: b.u32(),
                }
            }
        };
        let before = out.clone();
        // The per-kind entry points the command buffer uses for its hot
        // packets answer exactly as `encode` does, bytes included.
        let mut kind_out = out.clone();
        let by_kind = match cmd {
            Command::Fence { addr, value, irq } => Some(enc.encode_fence(addr, value, irq, &mut kind_out, pos, base_va)),
            Command::WriteData { dst, data: Payload::Words(data) } => {
                Some(enc.encode_write_data(dst, data, &mut kind_out, pos, base_va))
            }
            Command::Copy { src, dst, size } => Some(enc.encode_copy(src, dst, size, &mut kind_out, pos, base_va)),
            Command::Fill { dst, size, value } => Some(enc.encode_fill(dst, size, value, &mut kind_out, pos, base_va)),
            Command::IndirectBuffer { addr, size_dw } => {
                Some(enc.encode_indirect_buffer(addr, size_dw, &mut kind_out, pos, base_va))
            }
            _ => None,
        };
        let general = enc.encode(&cmd, &mut out, pos, base_va);
        if let Some(k) = by_kind {
            assert_eq!(k, general, "per-kind entry point and encode disagree on {cmd:?}");
            assert_eq!(kind_out, out, "per-kind entry point and encode wrote different bytes for {cmd:?}");
        }
        match general {
            Ok(n) => {
                assert!(n > 0);
                accepted.push(cmd);
                pos += n;
            }
            Err(_) => assert_eq!(out, before, "a refused command leaves the buffer as it was: {cmd:?}"),
        }
    }
    // Decode what was written: the accepted commands in order; anything
    // else must be an alignment NOP.
    let bytes: Vec<u8> = out[..pos].iter().flat_map(|w| w.to_le_bytes()).collect();
    let mut want = accepted.iter().peekable();
    for item in Decoder::new(gen, &bytes, base_va) {
        let p =
            item.result.unwrap_or_else(|e| panic!("encoder output does not decode at {}: {e}", item.offset));
        assert!(p.violation.is_none(), "encoder output breaks a rule at {}: {:?}", item.offset, p.violation);
        if want.peek() == Some(&&p.command) {
            want.next();
        } else {
            assert!(
                matches!(p.command, Command::Nop { .. }),
                "at {}: got {:?}, want {:?}",
                item.offset,
                p.command,
                want.peek()
            );
        }
    }
    assert!(want.next().is_none(), "an accepted command did not decode");
});
