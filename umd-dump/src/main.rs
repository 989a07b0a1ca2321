//! `umd-dump`: decode a refgpu command stream and print one line per
//! packet (or JSON with `--json`).
//!
//! ```text
//! umd-dump [--gen 1|2] [--base ADDR] [--json] FILE
//! ```
//!
//! A `.rgcs` file (`docs/refgpu.md` section 8) names its generation and base
//! address; a raw stream needs `--gen` (and `--base`, default 0). `-` reads
//! standard input.

use std::io::Read;
use std::process::ExitCode;

use umd_core::decode::StreamFile;
use umd_core::hw::Generation;

const USAGE: &str = "usage: umd-dump [--gen 1|2] [--base ADDR] [--json] FILE|-";

struct Args {
    gen: Option<Generation>,
    base: Option<u64>,
    json: bool,
    path: String,
}

fn parse_u64(s: &str) -> Result<u64, String> {
    let s = s.replace('_', "");
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("bad address {s:?}: {e}"))
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let (mut gen, mut base, mut json, mut path) = (None, None, false, None);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--gen" => {
                let v = it.next().ok_or("--gen needs 1 or 2")?;
                let n: u8 = v.parse().map_err(|_| format!("--gen {v:?}: expected 1 or 2"))?;
                gen = Some(Generation::from_number(n).ok_or(format!("--gen {n}: no such generation"))?);
            }
            "--base" => base = Some(parse_u64(&it.next().ok_or("--base needs an address")?)?),
            "--json" => json = true,
            "-h" | "--help" => return Err(USAGE.to_string()),
            _ if path.is_none() && (a == "-" || !a.starts_with('-')) => path = Some(a),
            _ => return Err(format!("unexpected argument {a:?}\n{USAGE}")),
        }
    }
    Ok(Args { gen, base, json, path: path.ok_or(USAGE)? })
}

fn run() -> Result<(), String> {
    let args = parse_args(std::env::args().skip(1))?;
    let mut bytes = Vec::new();
    if args.path == "-" {
        std::io::stdin().read_to_end(&mut bytes).map_err(|e| format!("stdin: {e}"))?;
    } else {
        bytes = std::fs::read(&args.path).map_err(|e| format!("{}: {e}", args.path))?;
    }
    let (gen, base, packets) = if StreamFile::is_stream_file(&bytes) {
        let f = StreamFile::parse(&bytes).map_err(|e| format!("{}: {e}", args.path))?;
        if let Some(g) = args.gen.filter(|g| *g != f.chip.generation) {
            eprintln!("note: --gen {} overrides the file's {}", g.number(), f.chip.generation);
        }
        (args.gen.unwrap_or(f.chip.generation), args.base.unwrap_or(f.base_va), f.packets)
    } else {
        let gen = args.gen.ok_or(format!("{}: a raw stream needs --gen 1|2", args.path))?;
        (gen, args.base.unwrap_or(0), &bytes[..])
    };
    if args.json {
        let doc = umd_dump::render_json(gen, packets, base);
        println!("{}", serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?);
    } else {
        print!("{}", umd_dump::render_text(gen, packets, base));
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("umd-dump: {e}");
            ExitCode::from(2)
        }
    }
}
