//! The decoder, `umd-dump`'s text and JSON renderings, the `.rgcs`
//! reader and the devcoredump reader on arbitrary bytes. Invariants: no
//! panic; the items cover the input exactly (each starts where the
//! previous ended, only a truncated packet ends the walk early and it
//! then covers the rest); every decoded packet without a rule violation
//! re-encodes, at its own address, to the very bytes it came from (NOP
//! payloads aside, which the device ignores); the text dump has one line
//! per item plus the summary, the JSON one item per item; a devcoredump
//! parses or gets an error naming one of its lines.
#![no_main]

use libfuzzer_sys::fuzz_target;
use umd_core::cmd::{Command, Encoder};
use umd_core::decode::{DecodeError, Decoder, StreamFile};
use umd_core::hw::Generation;

fn check(gen: Generation, bytes: &[u8], base_va: u64) {
    let enc = Encoder::new(gen);
    let mut pos = 0usize;
    let mut items = 0usize;
    for item in Decoder::new(gen, bytes, base_va) {
        items += 1;
        assert_eq!(item.offset, pos, "items are contiguous");
        assert_eq!(item.va, base_va.wrapping_add(pos as u64));
        assert!(!item.raw.is_empty(), "every item covers at least one byte");
        pos += item.raw.len();
        match &item.result {
            Err(DecodeError::Truncated { .. }) => {
                assert_eq!(pos, bytes.len(), "a truncated packet covers the rest")
            }
            Err(_) => assert_eq!(item.raw.len() % 4, 0, "an undecodable packet is skipped whole"),
            Ok(p) => {
                assert_eq!(item.raw.len(), 4 * (p.ndw as usize + 1));
                if p.violation.is_none() && !matches!(p.command, Command::Nop { .. }) {
                    let mut out = vec![0u32; item.raw.len() / 4];
                    let n = enc
                        .encode(&p.command, &mut out, 0, item.va)
                        .expect("a valid decoded packet re-encodes");
                    let again: Vec<u8> = out[..n].iter().flat_map(|w| w.to_le_bytes()).collect();
                    assert_eq!(again, item.raw, "re-encoding gives the same bytes");
                }
            }
        }
    }
    assert_eq!(pos, bytes.len(), "the items cover the input");
    let text = umd_dump::render_text(gen, bytes, base_va);
    assert_eq!(text.lines().count(), items + 1, "one text line per item plus the summary");
    let json = umd_dump::render_json(gen, bytes, base_va);
    assert_eq!(json["items"].as_array().map(Vec::len), Some(items), "one JSON item per item");
}

fuzz_target!(|data: &[u8]| {
    // A devcoredump: a parse or a typed error naming a line, never a panic.
    if umd_dump::devcoredump::is_devcoredump(data) {
        match umd_dump::devcoredump::parse(data) {
            Ok(d) => {
                let _ = umd_dump::devcoredump::render_text(&d);
            }
            Err(e) => assert!(e.line >= 1 && e.line <= data.split(|b| *b == b'\n').count() + 1),
        }
        return;
    }
    // A `.rgcs` file, or a raw stream of the generation the first byte picks.
    if StreamFile::is_stream_file(data) {
        if let Ok(f) = StreamFile::parse(data) {
            check(f.chip.generation, f.packets, f.base_va);
        }
        return;
    }
    let Some((&sel, rest)) = data.split_first() else { return };
    let gen = if sel & 1 == 0 { Generation::Gen1 } else { Generation::Gen2 };
    let base_va = u64::from(sel >> 1) << 12;
    check(gen, rest, base_va);
});
