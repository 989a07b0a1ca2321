//! Rendering of decoded refgpu command streams, for `umd-dump` and for any
//! std tool (hang reports, traces) that wants the same text or JSON; and
//! of captures, every submission in order ([`capture`]); and of the
//! kernel driver's devcoredumps ([`devcoredump`]).
//!
//! The text form is one line per packet: byte offset, GPU address, the
//! packet with its decoded fields (the names come from the generation's
//! description in `umd-core`), and the raw dwords.

pub mod capture;
pub mod devcoredump;
pub mod examples;

use std::fmt::Write as _;

use serde_json::{json, Value};
use umd_core::decode::{Decoder, Item};
use umd_core::hw::Generation;

/// Dwords of raw hex shown per line before eliding.
const HEX_DWORDS: usize = 8;

fn raw_dwords(raw: &[u8]) -> Vec<String> {
    raw.chunks(4)
        .map(|c| match <[u8; 4]>::try_from(c) {
            Ok(b) => format!("{:08x}", u32::from_le_bytes(b)),
            Err(_) => c.iter().map(|b| format!("{b:02x}")).collect(),
        })
        .collect()
}

/// One text line for a decoded item.
pub fn text_line(item: &Item<'_>) -> String {
    let mut line = format!("{:06x}  {:#014x}  ", item.offset, item.va);
    match &item.result {
        Ok(p) => {
            let _ = write!(line, "{p}");
        }
        Err(e) => {
            let _ = write!(line, "!! {e}");
        }
    }
    let words = raw_dwords(item.raw);
    let shown: Vec<&str> = words.iter().take(HEX_DWORDS).map(String::as_str).collect();
    let _ = write!(line, "  | {}", shown.join(" "));
    if words.len() > HEX_DWORDS {
        let _ = write!(line, " …(+{})", words.len() - HEX_DWORDS);
    }
    line
}

/// The whole stream as text, with a closing summary line.
pub fn render_text(gen: Generation, bytes: &[u8], base_va: u64) -> String {
    let mut out = String::new();
    let (mut packets, mut errors, mut violations) = (0, 0, 0);
    for item in Decoder::new(gen, bytes, base_va) {
        match &item.result {
            Ok(p) => {
                packets += 1;
                violations += usize::from(p.violation.is_some());
            }
            Err(_) => errors += 1,
        }
        out.push_str(&text_line(&item));
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "-- {gen}: {} bytes, {packets} packets, {errors} decode errors, {violations} rule violations",
        bytes.len()
    );
    out
}

/// One JSON object for a decoded item.
pub fn json_item(item: &Item<'_>) -> Value {
    let mut v = json!({
        "offset": item.offset,
        "va": item.va,
        "dwords": raw_dwords(item.raw),
    });
    match &item.result {
        Ok(p) => {
            let mut fields = serde_json::Map::new();
            for fd in p.desc.fields {
                fields.insert(fd.field.name().to_string(), json!(p.values.get(fd.field)));
            }
            v["packet"] = json!(p.desc.kind.name());
            v["opcode"] = json!(p.desc.opcode);
            v["ndw"] = json!(p.ndw);
            v["fields"] = Value::Object(fields);
            if let umd_core::cmd::Command::WriteData { data, .. } = p.command {
                v["data"] = json!(data.iter().collect::<Vec<u32>>());
            }
            if let Some(viol) = p.violation {
                v["violation"] = json!(viol.to_string());
            }
        }
        Err(e) => {
            v["error"] = json!(e.to_string());
        }
    }
    v
}

/// The whole stream as a JSON document.
pub fn render_json(gen: Generation, bytes: &[u8], base_va: u64) -> Value {
    let items: Vec<Value> = Decoder::new(gen, bytes, base_va).map(|i| json_item(&i)).collect();
    json!({ "generation": gen.number(), "base_va": base_va, "bytes": bytes.len(), "items": items })
}
