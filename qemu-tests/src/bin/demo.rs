//! The demo, in one command: builds the bare-metal images and
//! `refgpu-sim`, starts the model on a shared RAM file, boots the `demo`
//! image in QEMU (`virt`, Cortex-A53, ivshmem-doorbell), streams its
//! report and its defmt logs (decoded on the host, `[defmt]` lines), and
//! writes the driver's timeline as a Chrome / Perfetto trace.
//!
//! ```sh
//! cargo run -p qemu-tests --bin demo                 # gen2, MSI, 8 frames
//! cargo run -p qemu-tests --bin demo -- --gen 1 --polling --frames 16 --trace /tmp/t.json
//! ```
//!
//! On a machine without QEMU it runs `.ci/install-qemu.sh` when root (else
//! it says what to install); a missing `aarch64-unknown-none` target is
//! added with rustup (`vm_harness::setup`). Exit status: the image's (0 =
//! every frame verified).

use std::path::PathBuf;
use std::process::ExitCode;

use qemu_tests::{boot_with, ensure_qemu, Mode, Output, Run};
use vm_harness::target_base;

struct Args {
    generation: u8,
    mode: Mode,
    frames: u32,
    depth: Option<u32>,
    gpu_bound: Option<u32>,
    trace: PathBuf,
}

const USAGE: &str =
    "usage: demo [--gen 1|2] [--polling|--msi] [--frames N] [--depth 2|3] [--gpu-bound[=NS_PER_KIB]] [--trace FILE]";

/// `--gpu-bound`'s default model memory speed: 20 us per KiB, so that a
/// frame's GPU work (~100 KiB moved per engine) outweighs the guest CPU's
/// per-frame work under TCG (~1.5 ms) and the engines, not the CPU, set
/// the pace.
const GPU_BOUND_NS_PER_KIB: u32 = 20_000;

fn parse() -> Result<Args, String> {
    let mut a = Args {
        generation: 2,
        mode: Mode::Msi,
        frames: 8,
        depth: None,
        gpu_bound: None,
        trace: target_base().join("demo-trace.json"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value\n{USAGE}"));
        match arg.as_str() {
            "--gen" => {
                a.generation = match value("--gen")?.as_str() {
                    "1" => 1,
                    "2" => 2,
                    g => return Err(format!("--gen {g}: the model has generations 1 and 2")),
                }
            }
            "--polling" => a.mode = Mode::Polling,
            "--msi" => a.mode = Mode::Msi,
            "--frames" => {
                a.frames = value("--frames")?.parse().map_err(|e| format!("--frames: {e}"))?;
            }
            "--trace" => a.trace = PathBuf::from(value("--trace")?),
            "--depth" => {
                a.depth = match value("--depth")?.as_str() {
                    "2" => Some(2),
                    "3" => Some(3),
                    d => return Err(format!("--depth {d}: 2 or 3 frames in flight")),
                }
            }
            "--gpu-bound" => {
                a.gpu_bound = Some(GPU_BOUND_NS_PER_KIB);
            }
            g if g.starts_with("--gpu-bound=") => {
                let v = &g["--gpu-bound=".len()..];
                let ns: u32 = v.parse().map_err(|e| format!("--gpu-bound={v}: {e}"))?;
                if ns == 0 || ns > 10_000_000 {
                    return Err(format!("--gpu-bound={v}: 1 ..= 10000000 ns per KiB"));
                }
                a.gpu_bound = Some(ns);
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = ensure_qemu() {
        eprintln!("demo: {e}");
        return ExitCode::from(2);
    }
    eprintln!("demo: building the bare-metal images (aarch64-unknown-none) and refgpu-sim (first run: a few minutes)...");
    if let Err(e) = qemu_tests::artifacts() {
        eprintln!("demo: {e}");
        return ExitCode::from(2);
    }
    let frames = format!("frames={}", args.frames);
    // GPU-bound mode: slower model memory, three frames in flight.
    let depth = format!("depth={}", args.depth.unwrap_or(if args.gpu_bound.is_some() { 3 } else { 2 }));
    let sim_args = match args.gpu_bound {
        Some(ns) => vec!["--sys-ns-per-kib".to_string(), ns.to_string()],
        None => Vec::new(),
    };
    let run = Run {
        args: vec![Box::leak(frames.into_boxed_str()), Box::leak(depth.into_boxed_str())],
        sim_args,
        ..Run::new("demo", args.generation, args.mode)
    };
    eprintln!(
        "demo: starting refgpu-sim --gen {} and booting the demo image in qemu-system-aarch64 ({} waits)\n",
        args.generation,
        args.mode.arg()
    );
    let mut in_trace = false;
    let out = boot_with(&run, |o| match o {
        Output::Console(l) => {
            let t = l.trim();
            if t == "@@ TRACE BEGIN" {
                in_trace = true;
            } else if t == "@@ TRACE END" {
                in_trace = false;
            } else if !in_trace && !t.is_empty() {
                println!("{l}");
            }
        }
        // The image's defmt logs, decoded here (`[defmt]` marks them apart
        // from the PL011 console).
        Output::Log(l) => println!("[defmt] {l}"),
    });
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            eprintln!("demo: {e}");
            return ExitCode::from(2);
        }
    };
    if out.boot.timed_out {
        eprintln!("demo: QEMU did not finish; it and the model were killed\n{}", out.tail(20));
        return ExitCode::from(2);
    }
    match &out.trace {
        Some(json) if json.starts_with('{') && json.ends_with('}') => {
            if let Some(dir) = args.trace.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            match std::fs::write(&args.trace, json) {
                Ok(()) => println!(
                    "\ntrace: {} ({} KB): open it in https://ui.perfetto.dev or chrome://tracing",
                    args.trace.display(),
                    json.len().div_ceil(1024)
                ),
                Err(e) => eprintln!("demo: writing {}: {e}", args.trace.display()),
            }
        }
        _ => eprintln!("demo: the image printed no complete trace"),
    }
    let code = out.boot.exit_code.unwrap_or(2);
    println!("QEMU exit status {code} ({})", if code == 0 { "every frame verified" } else { "FAILED" });
    ExitCode::from(u8::try_from(code).unwrap_or(2))
}
