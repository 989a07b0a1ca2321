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
//! The driver's configuration comes from the environment as on every
//! Linux platform (`UMD_<KEY>` variables, a `UMD_CONFIG` file:
//! `platform_linux::config`), applied over the demo image's own
//! (`bm_images::demo::CONFIG`): a bad value stops the demo with an error
//! naming the variable; the entries that change something are handed to
//! the image as `umd.<key>=<value>` boot arguments, and the image prints
//! the configuration in effect (`@@ CONFIG`).
//!
//! On a machine without QEMU it runs `.ci/install-qemu.sh` when root (else
//! it says what to install); a missing `aarch64-unknown-none` target is
//! added with rustup (`vm_harness::setup`). Exit status: the image's (0 =
//! every frame verified).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use qemu_tests::{boot_with, ensure_qemu, Mode, Output, Run};
use umd_core::config::Config;
use vm_harness::target_base;

/// The command line (help text from these comments).
#[derive(Parser, Debug)]
#[command(
    name = "demo",
    about = "Builds the bare-metal images and refgpu-sim, boots the demo image in QEMU, prints its report and \
             writes the driver's timeline as a Chrome / Perfetto trace",
    after_help = "Exit status: the image's (0 = every frame verified); 2 for bad arguments or a harness failure."
)]
struct Args {
    /// GPU generation the model runs
    #[arg(long = "gen", value_name = "1|2", default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=2))]
    generation: u8,
    /// Fences are polled
    #[arg(long, overrides_with = "msi")]
    polling: bool,
    /// Fence waits sleep on MSI-X interrupts (the default)
    #[arg(long, overrides_with = "polling")]
    msi: bool,
    /// Frames to render and verify
    #[arg(long, value_name = "N", default_value_t = 8)]
    frames: u32,
    /// Frames in flight (default: 2, or 3 with --gpu-bound)
    #[arg(long, value_name = "2|3", value_parser = clap::value_parser!(u32).range(2..=3))]
    depth: Option<u32>,
    /// Slower model memory, so that the engines, not the guest CPU, set the
    /// pace (default 20000 ns per KiB)
    #[arg(
        long,
        value_name = "NS_PER_KIB",
        num_args = 0..=1,
        require_equals = true,
        value_parser = clap::value_parser!(u32).range(1..=10_000_000)
    )]
    gpu_bound: Option<Option<u32>>,
    /// Where the trace goes (default: demo-trace.json in the target
    /// directory)
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
}

/// The `UMD_*` environment over the image's configuration `base`, as the
/// `umd.<key>=<value>` boot arguments of the entries that differ from it.
fn knob_args(base: Config) -> Result<Vec<String>, String> {
    let cfg = platform_linux::config::from_env_over(base).map_err(|e| e.to_string())?;
    let (theirs, ours) = (base.text().to_string(), cfg.text().to_string());
    let args: Vec<String> = ours
        .split(' ')
        .zip(theirs.split(' '))
        .filter(|(o, t)| o != t)
        .map(|(o, _)| format!("{}{o}", bm_images::knobs::PREFIX))
        .collect();
    if !args.is_empty() {
        eprintln!("demo: configuration from the environment: {}", args.join(" "));
    }
    Ok(args)
}

/// `--gpu-bound`'s default model memory speed: 20 us per KiB, so that a
/// frame's GPU work (~100 KiB moved per engine) outweighs the guest CPU's
/// per-frame work under TCG (~1.5 ms) and the engines, not the CPU, set
/// the pace.
const GPU_BOUND_NS_PER_KIB: u32 = 20_000;

fn main() -> ExitCode {
    // --help (exit 0) and bad arguments (exit 2) end here, printed by clap.
    let args = Args::parse();
    let mode = if args.polling { Mode::Polling } else { Mode::Msi };
    let gpu_bound = args.gpu_bound.map(|ns| ns.unwrap_or(GPU_BOUND_NS_PER_KIB));
    let trace = args.trace.unwrap_or_else(|| target_base().join("demo-trace.json"));
    // A bad UMD_* value stops the demo before anything is built.
    let knobs = match knob_args(bm_images::demo::CONFIG) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("demo: {e}");
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
    let depth = format!("depth={}", args.depth.unwrap_or(if gpu_bound.is_some() { 3 } else { 2 }));
    let sim_args = match gpu_bound {
        Some(ns) => vec!["--sys-ns-per-kib".to_string(), ns.to_string()],
        None => Vec::new(),
    };
    let mut image_args: Vec<&'static str> =
        vec![Box::leak(frames.into_boxed_str()), Box::leak(depth.into_boxed_str())];
    image_args.extend(knobs.into_iter().map(|k| &*Box::leak(k.into_boxed_str())));
    let run = Run { args: image_args, sim_args, ..Run::new("demo", args.generation, mode) };
    eprintln!(
        "demo: starting refgpu-sim --gen {} and booting the demo image in qemu-system-aarch64 ({} waits)\n",
        args.generation,
        mode.arg()
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
            if let Some(dir) = trace.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            match std::fs::write(&trace, json) {
                Ok(()) => println!(
                    "\ntrace: {} ({} KB): open it in https://ui.perfetto.dev or chrome://tracing",
                    trace.display(),
                    json.len().div_ceil(1024)
                ),
                Err(e) => eprintln!("demo: writing {}: {e}", trace.display()),
            }
        }
        _ => eprintln!("demo: the image printed no complete trace"),
    }
    let code = out.boot.exit_code.unwrap_or(2);
    println!("QEMU exit status {code} ({})", if code == 0 { "every frame verified" } else { "FAILED" });
    ExitCode::from(u8::try_from(code).unwrap_or(2))
}
