//! Bad input to the encoder and command buffer: typed errors, and the output
//! before the failing packet left intact.

use umd_core::cmd::{
    split_region, ChunkSource, Command, CommandBuffer, EncodeError, Encoder, Payload, SliceChunks,
};
use umd_core::hw::{Field, Generation, MisalignedFence, PacketKind};

const SENTINEL: u32 = 0xCAFE_F00D;

/// Encodes `good` then `bad` into a buffer of `cap` dwords; returns the error
/// and checks the good packet and the untouched tail survived.
fn fails_after_good(gen: Generation, bad: Command<'_>, cap: usize) -> EncodeError {
    let enc = Encoder::new(gen);
    let mut out = vec![SENTINEL; cap];
    let good = Command::Timestamp { addr: 0x8000 };
    let n = enc.encode(&good, &mut out, 0, 0x1000).expect("good packet encodes");
    let before = out.clone();
    let err = enc.encode(&bad, &mut out, n, 0x1000).expect_err("bad packet is refused");
    assert_eq!(out, before, "{gen}: a refused packet writes nothing");
    assert!(out[n..].iter().all(|&d| d == SENTINEL));
    // The per-kind entry point of the same command refuses it the same way.
    if let Some(r) = per_kind(&enc, &bad, &mut out, n, 0x1000) {
        assert_eq!(r, Err(err), "{gen}: the per-kind entry point agrees with encode");
        assert_eq!(out, before, "{gen}: a refused packet writes nothing (per-kind)");
    }
    err
}

/// `cmd` through its per-kind entry point, if it has one.
fn per_kind(
    enc: &Encoder,
    cmd: &Command<'_>,
    out: &mut [u32],
    pos: usize,
    base: u64,
) -> Option<Result<usize, EncodeError>> {
    Some(match *cmd {
        Command::Fence { addr, value, irq } => enc.encode_fence(addr, value, irq, out, pos, base),
        Command::WriteData { dst, data: Payload::Words(w) } => enc.encode_write_data(dst, w, out, pos, base),
        Command::Copy { src, dst, size } => enc.encode_copy(src, dst, size, out, pos, base),
        Command::Fill { dst, size, value } => enc.encode_fill(dst, size, value, out, pos, base),
        Command::IndirectBuffer { addr, size_dw } => {
            enc.encode_indirect_buffer(addr, size_dw, out, pos, base)
        }
        _ => return None,
    })
}

#[test]
fn gen2_misaligned_fence_is_refused_with_the_device_consequence() {
    let e = fails_after_good(Generation::Gen2, Command::Fence { addr: 0x1008, value: 1, irq: true }, 32);
    assert_eq!(e, EncodeError::MisalignedFence { addr: 0x1008, align: 64, device: MisalignedFence::Dropped });
    // 8-byte aligned is fine on gen1, 4-byte is not (and would fault).
    let enc1 = Encoder::new(Generation::Gen1);
    assert!(enc1.check(&Command::Fence { addr: 0x1008, value: 1, irq: false }).is_ok());
    let e = fails_after_good(Generation::Gen1, Command::Fence { addr: 0x1004, value: 1, irq: false }, 32);
    assert_eq!(e, EncodeError::MisalignedFence { addr: 0x1004, align: 8, device: MisalignedFence::Fault });
}

#[test]
fn payload_over_the_limit() {
    let data = vec![7u32; 255];
    // gen1: NDW = 2 + 255 = 257 > 256.
    let e = fails_after_good(Generation::Gen1, Command::write_data(0x2000, &data), 1024);
    assert_eq!(e, EncodeError::PayloadTooLarge { kind: PacketKind::WriteData, ndw: 257, max: 256 });
    // gen2 takes it.
    assert!(Encoder::new(Generation::Gen2).check(&Command::write_data(0x2000, &data)).is_ok());
    let e = fails_after_good(Generation::Gen2, Command::Nop { dwords: 4096 }, 8192);
    assert!(matches!(e, EncodeError::PayloadTooLarge { kind: PacketKind::Nop, ndw: 4096, max: 4095 }));
}

#[test]
fn counts_and_sizes_over_the_limit() {
    let e = fails_after_good(Generation::Gen1, Command::Copy { src: 0, dst: 0x1000, size: 1 << 24 }, 32);
    assert_eq!(
        e,
        EncodeError::LimitExceeded {
            kind: PacketKind::DmaCopy,
            field: Field::Size,
            value: 1 << 24,
            max: 0xFF_FFFF
        }
    );
    let e =
        fails_after_good(Generation::Gen2, Command::Copy { src: 0, dst: 0x1000, size: (1 << 30) + 1 }, 32);
    assert!(matches!(e, EncodeError::LimitExceeded { field: Field::Size, max: 0x4000_0000, .. }));
    let big = Command::Dispatch {
        op: umd_core::cmd::DispatchOp::AddU32,
        a: 0,
        b: 0,
        dst: 0,
        count: 65536,
        scalar_bits: 0,
    };
    let e = fails_after_good(Generation::Gen1, big, 32);
    assert!(matches!(e, EncodeError::LimitExceeded { field: Field::Count, max: 0xFFFF, .. }));
    assert!(Encoder::new(Generation::Gen2).check(&big).is_ok());
    let e =
        fails_after_good(Generation::Gen1, Command::IndirectBuffer { addr: 0x1000, size_dw: 262_145 }, 32);
    assert!(matches!(e, EncodeError::LimitExceeded { kind: PacketKind::IndirectBuffer, .. }));
}

#[test]
fn zero_length_work_is_refused() {
    for gen in [Generation::Gen1, Generation::Gen2] {
        let e = fails_after_good(gen, Command::Copy { src: 0x1000, dst: 0x2000, size: 0 }, 32);
        assert_eq!(e, EncodeError::ZeroSize { kind: PacketKind::DmaCopy });
        let e = fails_after_good(gen, Command::Fill { dst: 0x1000, size: 0, value: 0 }, 32);
        assert_eq!(e, EncodeError::ZeroSize { kind: PacketKind::Fill });
        let e = fails_after_good(gen, Command::write_data(0x1000, &[]), 32);
        assert_eq!(e, EncodeError::ZeroSize { kind: PacketKind::WriteData });
        let e = fails_after_good(gen, Command::IndirectBuffer { addr: 0x1000, size_dw: 0 }, 32);
        assert_eq!(e, EncodeError::ZeroSize { kind: PacketKind::IndirectBuffer });
    }
}

#[test]
fn addresses_and_alignment() {
    let e = fails_after_good(Generation::Gen1, Command::Timestamp { addr: 1 << 40 }, 32);
    assert!(matches!(e, EncodeError::AddressOutOfRange { va_bits: 40, .. }));
    assert!(Encoder::new(Generation::Gen2).check(&Command::Timestamp { addr: 1 << 40 }).is_ok());
    let e = fails_after_good(Generation::Gen2, Command::Copy { src: 1 << 48, dst: 0, size: 4 }, 32);
    assert!(matches!(e, EncodeError::AddressOutOfRange { field: Field::Src, va_bits: 48, .. }));
    let e = fails_after_good(Generation::Gen1, Command::Fill { dst: 0x1000, size: 6, value: 0 }, 32);
    assert!(matches!(e, EncodeError::Misaligned { field: Field::Size, align: 4, .. }));
    let e = fails_after_good(Generation::Gen2, Command::IndirectBuffer { addr: 0x1010, size_dw: 4 }, 32);
    assert!(matches!(e, EncodeError::Misaligned { field: Field::Addr, align: 32, .. }));
    let e = fails_after_good(
        Generation::Gen1,
        Command::WaitMem {
            addr: 0x1000,
            reference: 1 << 32,
            mask: u64::MAX,
            op: umd_core::cmd::CompareOp::Eq,
            wide: false,
        },
        32,
    );
    assert!(matches!(e, EncodeError::InvalidOperand { field: Field::Ref, .. }));
}

#[test]
fn buffer_full_keeps_earlier_packets() {
    // 3 dwords for the timestamp, then a 6-dword copy into 8 dwords total.
    let e = fails_after_good(Generation::Gen1, Command::Copy { src: 0, dst: 0x1000, size: 4 }, 8);
    assert_eq!(e, EncodeError::BufferFull { needed: 6, available: 5 });
    // gen2: padding counts towards the space needed (FILL at 0x100C needs 5 NOP dwords).
    let e = fails_after_good(Generation::Gen2, Command::Fill { dst: 0x1000, size: 4, value: 0 }, 12);
    assert_eq!(e, EncodeError::BufferFull { needed: 5 + 5, available: 9 });
}

#[test]
fn command_buffer_errors_are_sticky() {
    let mut mem = vec![0u32; 64];
    let mut cb =
        CommandBuffer::new(Generation::Gen2, SliceChunks::new(split_region(&mut mem, 0x10_0000, 64)));
    cb.fence(0x2000, 1, false).unwrap();
    let bad = cb.fence(0x2004, 2, false).unwrap_err();
    assert!(matches!(bad, EncodeError::MisalignedFence { .. }));
    // Later good calls report the first error and write nothing.
    assert_eq!(cb.timestamp(0x3000), Err(bad));
    assert_eq!(cb.packets(), 1);
    assert_eq!(cb.finish(), Err(bad));
    assert_eq!(mem[5..].iter().filter(|&&d| d != 0).count(), 0, "nothing after the good fence");
}

/// A bad first packet through each per-kind method (`fence`, `write_data`,
/// `copy`, `fill`) is refused before a chunk is taken, and the error is
/// sticky; a good first packet with no chunk to take fails sticky too.
#[test]
fn bad_first_packet_takes_no_chunk() {
    for name in ["fence", "write_data", "copy", "fill"] {
        let mut mem = vec![0u32; 64];
        let chunks: Vec<_> = split_region(&mut mem, 0x10_0000, 32).collect();
        let mut cb = CommandBuffer::new(Generation::Gen2, SliceChunks::new(chunks.into_iter()));
        let r = match name {
            "fence" => cb.fence(0x2004, 1, false),
            "write_data" => cb.write_data(0x2002, &[1, 2]),
            "copy" => cb.copy(0x2000, 0x3000, 0),
            _ => cb.fill(0x2000, 0, 0),
        };
        let bad = r.expect_err(name);
        assert_eq!(cb.error(), Some(bad), "{name}: sticky");
        assert_eq!(cb.timestamp(0x3000), Err(bad), "{name}: sticky");
        let (r, mut source) = cb.finish_into_source();
        assert_eq!(r, Err(bad), "{name}");
        let first = source.next_chunk().map(|c| c.gpu_va);
        assert_eq!(first, Some(0x10_0000), "{name}: the first chunk was not taken");
    }
    let mut cb = CommandBuffer::new(Generation::Gen2, SliceChunks::new(std::iter::empty()));
    assert_eq!(cb.fence(0x2000, 1, false), Err(EncodeError::ChunkUnavailable));
    assert_eq!(cb.error(), Some(EncodeError::ChunkUnavailable));
}

#[test]
fn command_buffer_bad_chunks() {
    // No chunk at all.
    let mut cb = CommandBuffer::new(Generation::Gen1, SliceChunks::new(std::iter::empty()));
    assert_eq!(cb.timestamp(0x3000), Err(EncodeError::ChunkUnavailable));
    // Misaligned chunk on gen2 (IBs must be 32-byte aligned).
    let mut mem = vec![0u32; 64];
    let mut cb =
        CommandBuffer::new(Generation::Gen2, SliceChunks::new(split_region(&mut mem, 0x10_0004, 64)));
    assert_eq!(cb.timestamp(0x3000), Err(EncodeError::ChunkMisaligned { va: 0x10_0004, align: 32 }));
    // Empty buffer.
    let cb = CommandBuffer::new(Generation::Gen1, SliceChunks::new(std::iter::empty()));
    assert_eq!(cb.finish(), Err(EncodeError::Empty));
    // A packet bigger than a whole chunk.
    let mut mem = vec![0u32; 64];
    let mut cb =
        CommandBuffer::new(Generation::Gen1, SliceChunks::new(split_region(&mut mem, 0x10_0000, 16)));
    let data = [1u32; 20];
    assert!(matches!(cb.write_data(0x2000, &data), Err(EncodeError::PacketTooLargeForChunk { .. })));
    // Running out of chunks mid-stream.
    let mut mem = vec![0u32; 32];
    let mut cb =
        CommandBuffer::new(Generation::Gen1, SliceChunks::new(split_region(&mut mem, 0x10_0000, 16)));
    let mut last = Ok(());
    for i in 0..20 {
        last = cb.timestamp(0x2000 + 8 * i);
        if last.is_err() {
            break;
        }
    }
    assert_eq!(last, Err(EncodeError::ChunkUnavailable));
}
