//! Captures (`.rgcs` files of format version 2, `docs/refgpu.md` section
//! 8.1): the std sink that writes one ([`IoSink`]), the turn of a UART's
//! `rgcs:` hex lines back into one ([`from_hex_lines`]), and its rendering:
//! every submission in order with its fence and waits, then its packets,
//! CHAINs followed ([`render_text`], [`render_json`]).

use std::fmt::Write as _;
use std::io;

use serde_json::{json, Value};
use umd_core::debug::capture::{
    parse_file, CaptureSink, Record, Records, SinkError, CAPTURE_VERSION, HEX_PREFIX,
};
use umd_core::decode::{Decoder, STREAM_MAGIC};
use umd_core::hw::Generation;

/// A capture sink over any [`io::Write`] (a `.rgcs` file on Linux). A
/// write error (a full disk) is the sink's error: the device counts the
/// record as lost and goes on.
#[derive(Debug)]
pub struct IoSink<W: io::Write + Send> {
    out: W,
}

impl<W: io::Write + Send> IoSink<W> {
    /// A sink writing into `out`.
    pub const fn new(out: W) -> Self {
        IoSink { out }
    }

    /// The writer back.
    pub fn into_inner(self) -> W {
        self.out
    }
}

impl<W: io::Write + Send> CaptureSink for IoSink<W> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), SinkError> {
        self.out.write_all(bytes).map_err(|_| SinkError)
    }

    fn end(&mut self) -> Result<(), SinkError> {
        self.out.flush().map_err(|_| SinkError)
    }
}

/// The bytes of the `rgcs:` lines in `text` (a UART log: other lines are
/// skipped, and the prefix may follow other output on its line). A line
/// with an odd number of hex digits or a non-hex character is an error
/// naming its line number.
pub fn from_hex_lines(text: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let Some(at) = line.find(HEX_PREFIX) else { continue };
        let hex = line[at + HEX_PREFIX.len()..].trim_end();
        if hex.len() % 2 != 0 {
            return Err(format!("line {}: odd number of hex digits", n + 1));
        }
        for i in (0..hex.len()).step_by(2) {
            let b = hex
                .get(i..i + 2)
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .ok_or_else(|| format!("line {}: not hex: {hex:?}", n + 1))?;
            out.push(b);
        }
    }
    Ok(out)
}

/// Whether `bytes` are a capture (magic and format version 2).
pub fn is_capture(bytes: &[u8]) -> bool {
    bytes.get(..4) == Some(&STREAM_MAGIC[..]) && bytes.get(4..8) == Some(&CAPTURE_VERSION.to_le_bytes()[..])
}

/// The capture as text: one header line per submission (`q1:7 after
/// [q0:3] ...`), its packets indented below, `lost N` where records were
/// dropped, and a closing summary.
pub fn render_text(bytes: &[u8]) -> Result<String, String> {
    let (chip, records) = parse_file(bytes).map_err(|e| e.to_string())?;
    let gen = chip.generation;
    let mut out = String::new();
    let (mut subs, mut lost) = (0u64, 0u64);
    for r in Records::new(records) {
        match r.map_err(|e| e.to_string())? {
            Record::Lost(n) => {
                lost += n;
                let _ = writeln!(out, "-- {n} earlier submissions dropped or lost");
            }
            Record::Submit(s) => {
                subs += 1;
                let waits: Vec<String> = s.waits().map(|w| w.to_string()).collect();
                let dwords: u64 = s.segments().map(|(_, n, _)| u64::from(n)).sum();
                let n = s.segments().count();
                let _ = writeln!(
                    out,
                    "submission {}: fence {} after [{}], {} dwords in {} segment{}{}",
                    subs,
                    umd_core::sync::FenceId { queue: s.queue, seqno: s.seqno },
                    waits.join(", "),
                    dwords,
                    n,
                    if n == 1 { "" } else { "s" },
                    flags_text(s.flags)
                );
                for (va, ndw, seg) in s.segments() {
                    let _ = writeln!(out, "  segment {va:#x} ({ndw} dwords)");
                    if seg.is_empty() && ndw > 0 {
                        let _ = writeln!(out, "    (memory not readable)");
                    }
                    for line in crate::render_text(gen, seg, va).lines().filter(|l| !l.starts_with("-- ")) {
                        let _ = writeln!(out, "    {line}");
                    }
                }
            }
        }
    }
    let _ = writeln!(out, "-- {gen}: {subs} submissions, {lost} dropped or lost");
    Ok(out)
}

fn flags_text(flags: u32) -> &'static str {
    match flags & 3 {
        0 => "",
        1 => " (a segment was not readable)",
        2 => " (CHAIN walk cut)",
        _ => " (a segment was not readable; CHAIN walk cut)",
    }
}

/// The capture as one JSON document.
pub fn render_json(bytes: &[u8]) -> Result<Value, String> {
    let (chip, records) = parse_file(bytes).map_err(|e| e.to_string())?;
    let gen: Generation = chip.generation;
    let mut items = Vec::new();
    for r in Records::new(records) {
        match r.map_err(|e| e.to_string())? {
            Record::Lost(n) => items.push(json!({ "lost": n })),
            Record::Submit(s) => {
                let segments: Vec<Value> = s
                    .segments()
                    .map(|(va, ndw, seg)| {
                        let packets: Vec<Value> = Decoder::new(gen, seg, va).map(|i| crate::json_item(&i)).collect();
                        json!({ "va": va, "dwords": ndw, "readable": !seg.is_empty() || ndw == 0, "packets": packets })
                    })
                    .collect();
                items.push(json!({
                    "queue": s.queue.0,
                    "fence": s.seqno.0,
                    "waits": s.waits().map(|w| json!({ "queue": w.queue.0, "fence": w.seqno.0 })).collect::<Vec<_>>(),
                    "flags": s.flags,
                    "segments": segments,
                }));
            }
        }
    }
    Ok(json!({ "generation": gen.number(), "submissions": items }))
}
