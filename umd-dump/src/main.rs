//! `umd-dump`: decode a refgpu command stream and print one line per
//! packet (or JSON with `--json`).
//!
//! ```text
//! umd-dump [--gen 1|2] [--base ADDR] [--json] [--hex] [--out FILE] FILE|-
//! ```
//!
//! A `.rgcs` file (`docs/refgpu.md` section 8) names its generation and base
//! address; a raw stream needs `--gen` (and `--base`, default 0). A capture
//! (`.rgcs` format version 2, section 8.1) prints every submission in order
//! with its fence and waits, then its packets. A devcoredump of the kernel
//! driver (its first line `refgpu devcoredump`, `docs/linux.md`) prints its
//! header and its ring and IB windows decoded, the packets at RPTR and
//! CUR_ADDR marked `=>`. `--hex` reads the `rgcs:`
//! lines of a UART log instead of bytes; `--out FILE` writes the bytes read
//! (a capture rebuilt from hex lines) instead of printing. `-` reads
//! standard input.

use std::io::Read;
use std::process::ExitCode;

use clap::Parser;
use umd_core::decode::StreamFile;
use umd_core::hw::Generation;

/// The command line (help text from these comments).
#[derive(Parser, Debug)]
#[command(
    name = "umd-dump",
    about = "Decodes a refgpu command stream and prints one line per packet (or JSON)",
    after_help = "A .rgcs file names its generation and base address; a raw stream needs --gen (and --base, \
                  default 0). A devcoredump of the kernel driver (/sys/class/devcoredump/devcdN/data, first \
                  line `refgpu devcoredump`) is recognised and decoded with the generation it names. Exit \
                  status 2 for bad arguments or a file that cannot be read or parsed."
)]
struct Args {
    /// Generation of the stream (overrides a .rgcs file's)
    #[arg(long = "gen", value_name = "1|2", value_parser = generation)]
    gen: Option<Generation>,
    /// Address of the first packet (0x for hex; default: the file's, or 0)
    #[arg(long, value_name = "ADDR", value_parser = parse_u64)]
    base: Option<u64>,
    /// JSON instead of one line per packet
    #[arg(long)]
    json: bool,
    /// The input is text: the `rgcs:` hex lines of a UART log
    #[arg(long)]
    hex: bool,
    /// Write the bytes read to FILE instead of printing (with --hex: the .rgcs capture)
    #[arg(long, value_name = "FILE")]
    out: Option<String>,
    /// The stream, `-` for standard input
    #[arg(value_name = "FILE|-")]
    path: String,
}

fn generation(v: &str) -> Result<Generation, String> {
    let n: u8 = v.parse().map_err(|_| "expected 1 or 2".to_string())?;
    Generation::from_number(n).ok_or_else(|| format!("no generation {n}: expected 1 or 2"))
}

fn parse_u64(s: &str) -> Result<u64, String> {
    let s = s.replace('_', "");
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("bad address {s:?}: {e}"))
}

fn run(args: Args) -> Result<(), String> {
    let mut bytes = Vec::new();
    if args.path == "-" {
        std::io::stdin().read_to_end(&mut bytes).map_err(|e| format!("stdin: {e}"))?;
    } else {
        bytes = std::fs::read(&args.path).map_err(|e| format!("{}: {e}", args.path))?;
    }
    if args.hex {
        let text = String::from_utf8_lossy(&bytes);
        bytes = umd_dump::capture::from_hex_lines(&text).map_err(|e| format!("{}: {e}", args.path))?;
    }
    if let Some(out) = &args.out {
        std::fs::write(out, &bytes).map_err(|e| format!("{out}: {e}"))?;
        eprintln!("umd-dump: wrote {} bytes to {out}", bytes.len());
        return Ok(());
    }
    if umd_dump::devcoredump::is_devcoredump(&bytes) {
        if args.json || args.out.is_some() {
            return Err(format!("{}: a devcoredump prints as text only (no --json or --out)", args.path));
        }
        let d = umd_dump::devcoredump::parse(&bytes).map_err(|e| format!("{}: {e}", args.path))?;
        print!("{}", umd_dump::devcoredump::render_text(&d));
        return Ok(());
    }
    if umd_dump::capture::is_capture(&bytes) {
        let path = &args.path;
        if args.json {
            let doc = umd_dump::capture::render_json(&bytes).map_err(|e| format!("{path}: {e}"))?;
            println!("{}", serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?);
        } else {
            print!("{}", umd_dump::capture::render_text(&bytes).map_err(|e| format!("{path}: {e}"))?);
        }
        return Ok(());
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
    // --help (exit 0) and bad arguments (exit 2) end here, printed by clap.
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("umd-dump: {e}");
            ExitCode::from(2)
        }
    }
}
