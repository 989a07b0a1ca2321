//! Host harness for the bare-metal images (`bm-images`) under QEMU.
//!
//! For one run ([`Run`]) it:
//!
//! 1. builds the images once per test process (`cargo build --release
//!    --target aarch64-unknown-none --features image,defmt,validation -p
//!    bm-images`; the Cortex-M images with
//!    `cortex-m-image,defmt,validation`: umd-core's validation mode
//!    compiled in, off unless an image's command line says `validation`;
//!    `image` also compiles umd-core's capture in, with no session unless
//!    an image starts one) and
//!    `refgpu-sim`, in their own target directory
//!    (`$CARGO_TARGET_DIR/qemu-tests` or `target/qemu-tests`) so the nested
//!    cargo never waits on the outer one's lock;
//! 2. makes a temporary directory holding the guest RAM file and the
//!    ivshmem socket, and starts `refgpu-sim --gen N` on them;
//! 3. boots `qemu-system-aarch64 -M virt,gic-version=2` with that RAM file
//!    as `memory-backend-file,share=on` and an `ivshmem-doorbell` device on
//!    the socket, the image as `-kernel`, and the mode (`polling` or `msi`)
//!    on the semihosting command line;
//! 4. collects the console, parses the `@@` result lines
//!    (`bm-images` documents the protocol) and QEMU's exit status (the
//!    image's semihosting exit code);
//! 5. decodes the image's defmt logs ([`defmt_log`]): the images write
//!    defmt frames over semihosting, which QEMU writes to its stdout; the
//!    PL011 text goes to QEMU's stderr so the two never mix. They land in
//!    [`Outcome::logs`] with level, timestamp, arguments and source
//!    location.
//!
//! Everything started is owned by guards: QEMU and the model are killed
//! and reaped, and the temporary directory removed, on every path,
//! including a panicking test. A run that does not finish within
//! [`RUN_TIMEOUT`] (a failure guard, not a performance threshold) kills
//! both and reports the last console and model lines.
//!
//! The Cortex-M board ([`Board::Mps2An386`], [`Run::cortex_m`]) differs
//! in steps 1-3: the `m-*` images are built for `thumbv7em-none-eabihf`
//! ([`m_artifacts`]), the harness creates the RAM file with exactly
//! 16 MiB ([`PSRAM_BYTES`]) and starts `refgpu-sim --shared-ram` on it
//! (waiting for its "attached" line; a model that refuses the file is a
//! [`HarnessError::Setup`] with its message), and boots
//! `qemu-system-arm -M mps2-an386,memory-backend=mem` with the file as
//! the board's PSRAM (no ivshmem device: the GPU is reached through that
//! RAM, polling only).
//!
//! On a fresh machine the harness sets itself up ([`ensure_qemu`],
//! `vm_harness::setup`): a missing Rust target is added with rustup, and a
//! missing QEMU is installed with `.ci/install-qemu.sh` when the tests run
//! as root, once, under a file lock shared by every test binary. Without
//! root a missing QEMU is an error naming the exact command, so the tests
//! fail loudly instead of passing silently.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use vm_harness::{
    collect, collect_output, snapshot, target_base, tool_runs, wait_for_exit, wait_for_model, workspace_root,
    ChildGuard, Exit, Lines,
};

pub mod defmt_log;
pub mod fault_matrix;

pub use defmt_log::LogLine;

/// Failure guard for one QEMU run.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(180);

/// The QEMU binary.
pub const QEMU: &str = "qemu-system-aarch64";

/// What to tell someone without QEMU.
pub const INSTALL_HINT: &str = "qemu-system-aarch64 or qemu-system-arm was not found on PATH (both come with Debian's qemu-system-arm package). Install QEMU 10 from Debian \
     bookworm-backports: run `.ci/install-qemu.sh` (as root: adds bookworm-backports to apt's sources, \
     then `apt-get install -t bookworm-backports qemu-system-arm`; plain bookworm's 7.2 conflicts with \
     the preinstalled qemu-utils 10.0).";

/// How the image waits for the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Fences are polled.
    Polling,
    /// Fence waits sleep on MSI-X interrupts (GICv2m).
    Msi,
}

impl Mode {
    /// The word on the image's command line.
    pub fn arg(self) -> &'static str {
        match self {
            Mode::Polling => "polling",
            Mode::Msi => "msi",
        }
    }
}

/// The QEMU machine an image boots on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Board {
    /// `qemu-system-aarch64 -M virt`, Cortex-A53, the GPU behind
    /// `ivshmem-doorbell` (images of `bm-images`, `aarch64-unknown-none`).
    Virt,
    /// `qemu-system-arm -M mps2-an386`, Cortex-M4, the GPU in the shared
    /// 16 MiB PSRAM (`m-*` images, `thumbv7em-none-eabihf`; polling only).
    Mps2An386,
}

/// QEMU for the Cortex-M board.
pub const QEMU_ARM: &str = "qemu-system-arm";

/// Size of the Cortex-M board's RAM file: QEMU's `mps2-an386` PSRAM,
/// which must be exactly this.
pub const PSRAM_BYTES: u64 = 16 << 20;

/// One boot of an image.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Run {
    /// The machine.
    pub board: Board,
    /// Image (binary of `bm-images`, or an absolute path: the C firmware).
    pub image: &'static str,
    /// GPU generation the model runs (`refgpu-sim --gen`).
    pub generation: u8,
    /// Wait mode.
    pub mode: Mode,
    /// Extra `refgpu-sim` arguments (fault injection).
    pub sim_args: Vec<String>,
    /// Extra words on the image's semihosting command line.
    pub args: Vec<&'static str>,
    /// Kill `refgpu-sim` (SIGKILL, as a crash) when a console line starts
    /// with this text: the device-loss test.
    pub kill_model_on: Option<&'static str>,
    /// Boot without starting the model (the image must say that none is
    /// running; Cortex-M only).
    pub no_model: bool,
    /// Size the harness gives the shared RAM file instead of
    /// [`PSRAM_BYTES`] (a wrong size must be refused; Cortex-M only).
    pub ram_file_bytes: Option<u64>,
}

impl Run {
    /// A plain run of `image` on `generation` in `mode`.
    pub fn new(image: &'static str, generation: u8, mode: Mode) -> Run {
        Run {
            board: Board::Virt,
            image,
            generation,
            mode,
            sim_args: Vec::new(),
            args: Vec::new(),
            kill_model_on: None,
            no_model: false,
            ram_file_bytes: None,
        }
    }

    /// A run of the Cortex-M image `image` on `mps2-an386` (polling).
    pub fn cortex_m(image: &'static str, generation: u8) -> Run {
        Run { board: Board::Mps2An386, ..Run::new(image, generation, Mode::Polling) }
    }
}

pub use vm_harness::Status;

/// What a run produced.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// QEMU's exit code (the image's status), the console and model lines,
    /// the `@@ RESULT` lines in order, and whether the run hit
    /// [`RUN_TIMEOUT`].
    pub boot: vm_harness::Outcome,
    /// Generation from `@@ DEVICE gen=`.
    pub device_gen: Option<u8>,
    /// MSIs the guest took, from `@@ IRQS msi=`.
    pub msis: Option<u32>,
    /// Text blocks between `@@ REPORT <name> BEGIN` and `@@ REPORT END`.
    pub reports: Vec<(String, Vec<String>)>,
    /// The line between `@@ TRACE BEGIN` and `@@ TRACE END` (the Chrome
    /// trace JSON), if any.
    pub trace: Option<String>,
    /// Whether the harness killed the model ([`Run::kill_model_on`]).
    pub model_killed: bool,
    /// The image's defmt logs, decoded (empty for an image built without
    /// defmt).
    pub logs: Vec<LogLine>,
}

/// A line of output as it arrives ([`boot_with`]).
#[derive(Clone, Copy, Debug)]
pub enum Output<'a> {
    /// A console (PL011) line: `@@` protocol lines and plain text.
    Console(&'a str),
    /// A decoded defmt log line.
    Log(&'a LogLine),
}

impl Outcome {
    /// The status of `scenario`, if reported.
    pub fn status(&self, scenario: &str) -> Option<&Status> {
        self.boot.status(scenario)
    }

    /// The address of the fault images' `@@ FAULT_ADDR <hex>` line (the
    /// address they read on purpose), if printed.
    pub fn fault_addr(&self) -> Option<u64> {
        let a = self.boot.console.iter().find_map(|l| l.strip_prefix("@@ FAULT_ADDR "))?;
        u64::from_str_radix(a.trim().trim_start_matches("0x"), 16).ok()
    }

    /// The last `n` console, defmt log and model lines, for failure
    /// messages.
    pub fn tail(&self, n: usize) -> String {
        let c = &self.boot.console[self.boot.console.len().saturating_sub(n)..];
        let l = &self.logs[self.logs.len().saturating_sub(n)..];
        let m = &self.boot.model_log[self.boot.model_log.len().saturating_sub(n)..];
        format!(
            "--- last {} console lines ---\n{}\n--- last {} defmt log lines ---\n{}\n--- last {} model lines ---\n{}",
            c.len(),
            c.join("\n"),
            l.len(),
            l.iter().map(|l| l.to_string()).collect::<Vec<_>>().join("\n"),
            m.len(),
            m.join("\n")
        )
    }

    /// The first defmt log line whose message contains `text`.
    pub fn log(&self, text: &str) -> Option<&LogLine> {
        self.logs.iter().find(|l| l.message.contains(text))
    }
}

/// Why a run could not be made: QEMU missing ([`HarnessError::Missing`]
/// with [`INSTALL_HINT`]), a build or the set-up failed.
pub use vm_harness::HarnessError;

fn target_dir() -> PathBuf {
    target_base().join("qemu-tests")
}

/// Whether `qemu-system-aarch64` and `qemu-system-arm` both run.
pub fn qemu_available() -> bool {
    tool_runs(QEMU, "--version") && tool_runs(QEMU_ARM, "--version")
}

/// QEMU present, or installed now with `.ci/install-qemu.sh` (root only;
/// once, under the set-up lock).
pub fn ensure_qemu() -> Result<(), HarnessError> {
    vm_harness::setup::ensure_installed(
        "QEMU 10 (qemu-system-aarch64 and qemu-system-arm)",
        ".ci/install-qemu.sh",
        qemu_available,
    )
    .map_err(|what| HarnessError::Missing { what, hint: INSTALL_HINT })
}

/// Paths of the built artifacts.
#[derive(Clone, Debug)]
pub struct Artifacts {
    /// Directory of the aarch64 images.
    pub image_dir: PathBuf,
    /// The model server.
    pub sim: PathBuf,
}

fn cargo(args: &[&str], env: &[(&str, &str)]) -> Result<(), HarnessError> {
    vm_harness::cargo(args, env, &target_dir()).map_err(HarnessError::Build)
}

/// Builds the aarch64 images and the model once per process.
pub fn artifacts() -> Result<Artifacts, String> {
    static BUILT: OnceLock<Result<Artifacts, String>> = OnceLock::new();
    BUILT.get_or_init(|| build("aarch64-unknown-none", "image,defmt,validation")).clone()
}

/// Builds the Cortex-M images (`m-*`) and the model once per process,
/// with `bm-images`' extra features from `QEMU_TESTS_M_FEATURES` if set
/// (comma-separated, e.g. `compact-encoder`: the driver's smallest build,
/// whose size-first paths only bare metal compiles).
pub fn m_artifacts() -> Result<Artifacts, String> {
    static BUILT: OnceLock<Result<Artifacts, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let mut features = String::from("cortex-m-image,defmt,validation");
            if let Some(extra) = std::env::var("QEMU_TESTS_M_FEATURES").ok().filter(|e| !e.is_empty()) {
                features.push(',');
                features.push_str(&extra);
            }
            build("thumbv7em-none-eabihf", &features)
        })
        .clone()
}

/// Builds `bm-images` for `target` with `features`, and the model.
fn build(target: &str, features: &str) -> Result<Artifacts, String> {
    cargo(&["build", "--release", "--target", target, "--features", features, "-p", "bm-images"], &IMAGE_ENV)
        .map_err(|e| e.to_string())?;
    cargo(&["build", "--release", "-p", "refgpu-sim", "--bin", "refgpu-sim"], &[])
        .map_err(|e| e.to_string())?;
    let t = target_dir();
    Ok(Artifacts { image_dir: t.join(target).join("release"), sim: t.join("release").join("refgpu-sim") })
}

/// Builds the `umd-dump` tool for the host (release, in the harness's
/// target directory) once per process; its path. The tests run it on a
/// boot's UART output as `docs/debugging.md` does.
pub fn umd_dump() -> Result<PathBuf, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            cargo(&["build", "--release", "-p", "umd-dump", "--bin", "umd-dump"], &[])
                .map_err(|e| e.to_string())?;
            Ok(target_dir().join("release").join("umd-dump"))
        })
        .clone()
}

/// Whether Debian's bare-metal Arm C toolchain and picolibc are installed
/// (what the C firmware is built with).
pub fn arm_c_available() -> bool {
    tool_runs("arm-none-eabi-gcc", "--version")
        && std::path::Path::new("/usr/lib/picolibc/arm-none-eabi/picolibc.specs").exists()
        && tool_runs("make", "--version")
}

/// Builds the C API's Cortex-M4 firmware (`umd-capi/firmware/m4`, C, with
/// `gcc-arm-none-eabi` and picolibc, installed by `.ci/install-arm-c.sh`
/// when missing) against `libumd_capi.a` for `thumbv7em-none-eabihf`, once
/// per process; the ELF's path.
pub fn c_firmware() -> Result<PathBuf, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            vm_harness::setup::ensure_installed(
                "gcc-arm-none-eabi and picolibc-arm-none-eabi",
                ".ci/install-arm-c.sh",
                arm_c_available,
            )?;
            let target = "thumbv7em-none-eabihf";
            cargo(&["build", "--release", "--target", target, "-p", "umd-capi"], &[])
                .map_err(|e| e.to_string())?;
            let lib = target_dir().join(target).join("release").join("libumd_capi.a");
            let out_dir = target_dir().join("c-firmware");
            let out = Command::new("make")
                .arg("-C")
                .arg(workspace_root().join("umd-capi/firmware/m4"))
                .arg(format!("UMD_LIB={}", lib.display()))
                .arg(format!("OUT={}", out_dir.display()))
                .output()
                .map_err(|e| format!("running make: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "building the C firmware failed:\n{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(out_dir.join("m-c-firmware"))
        })
        .clone()
}

/// The defmt log level the images are built with (`DEFMT_LOG`).
pub const DEFMT_LOG: &str = "debug";

/// The images' build environment: defmt keeps only `error` logs unless
/// `DEFMT_LOG` says otherwise (it is read at compile time), and the log
/// statements' locations come from DWARF variable entries, which the
/// release profile's `debug = 1` (line tables only) leaves out.
const IMAGE_ENV: [(&str, &str); 2] = [("DEFMT_LOG", DEFMT_LOG), ("CARGO_PROFILE_RELEASE_DEBUG", "2")];

/// Guest RAM (QEMU `-m`, the shared file, the model's window).
pub const RAM_MB: u32 = 128;

/// Boots `run` once and returns what happened.
pub fn boot(run: &Run) -> Result<Outcome, HarnessError> {
    boot_with(run, |_| {})
}

/// Boots `run` once, handing every console line and decoded defmt log
/// line to `on_line` as it arrives (the demo streams them), and returns
/// what happened. The two streams are read separately, so their relative
/// order is only approximate.
pub fn boot_with(run: &Run, mut on_line: impl FnMut(Output<'_>)) -> Result<Outcome, HarnessError> {
    let qemu = match run.board {
        Board::Virt => QEMU,
        Board::Mps2An386 => QEMU_ARM,
    };
    ensure_qemu()?;
    let art = match run.board {
        Board::Virt => artifacts(),
        Board::Mps2An386 => m_artifacts(),
    }
    .map_err(HarnessError::Build)?;
    let image = art.image_dir.join(run.image);
    if !image.exists() {
        return Err(HarnessError::Build(format!("image {} was not built", image.display())));
    }
    let dir = tempfile::Builder::new()
        .prefix("qemu-tests-")
        .tempdir()
        .map_err(|e| HarnessError::Setup(format!("temp dir: {e}")))?;
    let sock = dir.path().join("ivshmem.sock");
    let decoder = defmt_log::Decoder::for_image(&image, &workspace_root()).map_err(HarnessError::Setup)?;
    let ram = dir.path().join("guest-ram");
    let ram_size = format!("{RAM_MB}M");

    let model_lines: Lines = Arc::default();
    if run.board == Board::Mps2An386 {
        // QEMU maps this file as the PSRAM: it must be exactly 16 MiB; the
        // model attaches to it and refuses any other size.
        let len = run.ram_file_bytes.unwrap_or(PSRAM_BYTES);
        std::fs::File::create(&ram)
            .and_then(|f| f.set_len(len))
            .map_err(|e| HarnessError::Setup(format!("RAM file {}: {e}", ram.display())))?;
    }
    let mut sim_cmd = Command::new(&art.sim);
    match run.board {
        Board::Virt => {
            sim_cmd.arg("--socket").arg(&sock).arg("--mem-file").arg(&ram).args([
                "--mem-size",
                &ram_size,
                "--vectors",
                "4",
            ]);
        }
        Board::Mps2An386 => {
            sim_cmd.arg("--shared-ram").arg(&ram);
        }
    }
    sim_cmd
        .args(["--gen", &run.generation.to_string()])
        .args(&run.sim_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut sim = ChildGuard::new(
        if run.no_model {
            // Something to guard that is not the model: the image must
            // find no model attached.
            Command::new("sleep")
                .arg("3600")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| HarnessError::Setup(format!("starting sleep: {e}")))?
        } else {
            sim_cmd
                .spawn()
                .map_err(|e| HarnessError::Setup(format!("starting {}: {e}", art.sim.display())))?
        },
        true,
    );
    let mut readers = Vec::new();
    collect_output(&mut sim, &model_lines, &mut readers);
    // The model creates the RAM file and then listens; wait for the socket
    // (ivshmem) or for its "attached" line (shared RAM).
    let ready = || match run.board {
        Board::Virt => sock.exists(),
        Board::Mps2An386 => run.no_model || snapshot(&model_lines).iter().any(|l| l.contains("attached to")),
    };
    wait_for_model(&mut sim, &model_lines, &mut readers, "listening or attached", ready)?;

    let console: Lines = Arc::default();
    let mut qemu_cmd = Command::new(qemu);
    match run.board {
        Board::Virt => {
            qemu_cmd.args([
                "-M",
                "virt,gic-version=2,memory-backend=mem",
                "-cpu",
                "cortex-a53",
                "-m",
                &ram_size,
            ]);
        }
        Board::Mps2An386 => {
            qemu_cmd.args(["-M", "mps2-an386,memory-backend=mem"]);
        }
    }
    let psram = format!("{}M", PSRAM_BYTES >> 20);
    qemu_cmd
        // QEMU's stdout: the semihosting `:tt` stream, i.e. the defmt
        // frames alone. The PL011 text goes to QEMU's stderr (with QEMU's
        // own messages, as before).
        .args(["-nographic", "-nic", "none", "-monitor", "none"])
        .args(["-chardev", "file,id=uart,path=/dev/stderr", "-serial", "chardev:uart"])
        .arg("-semihosting-config")
        .arg(format!(
            "enable=on,target=native,arg={},arg={}{}",
            run.image,
            run.mode.arg(),
            run.args.iter().map(|a| format!(",arg={a}")).collect::<String>()
        ))
        .arg("-object")
        .arg(format!(
            "memory-backend-file,id=mem,size={},mem-path={},share=on",
            if run.board == Board::Virt { &ram_size } else { &psram },
            ram.display()
        ));
    if run.board == Board::Virt {
        qemu_cmd
            .arg("-chardev")
            .arg(format!("socket,path={},id=ivs", sock.display()))
            .args(["-device", "ivshmem-doorbell,chardev=ivs,vectors=4"]);
    }
    qemu_cmd.arg("-kernel").arg(&image).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut qemu = ChildGuard::new(
        qemu_cmd.spawn().map_err(|e| HarnessError::Setup(format!("starting {qemu}: {e}")))?,
        false,
    );
    let logs: Arc<Mutex<Vec<LogLine>>> = Arc::default();
    if let Some(o) = qemu.child.stdout.take() {
        match decoder {
            Some(d) => readers.push(d.spawn(o, logs.clone())),
            // An image without defmt prints nothing there.
            None => readers.push(collect(o, console.clone())),
        }
    }
    collect_output(&mut qemu, &console, &mut readers);

    let deadline = Instant::now() + RUN_TIMEOUT;
    let (mut seen, mut logs_seen) = (0, 0);
    let mut model_killed = false;
    let mut pump = |model_killed: &mut bool, sim: &mut ChildGuard| {
        let new: Vec<String> =
            console.lock().map(|v| v.get(seen..).unwrap_or(&[]).to_vec()).unwrap_or_default();
        seen += new.len();
        for l in &new {
            on_line(Output::Console(l));
            if let Some(t) = run.kill_model_on {
                if !*model_killed && l.trim_start().starts_with(t) {
                    // SIGKILL: the model crashes, it does not leave politely.
                    let _ = sim.child.kill();
                    *model_killed = true;
                }
            }
        }
        let new_logs: Vec<LogLine> =
            logs.lock().map(|v| v.get(logs_seen..).unwrap_or(&[]).to_vec()).unwrap_or_default();
        logs_seen += new_logs.len();
        for l in &new_logs {
            on_line(Output::Log(l));
        }
    };
    let end = wait_for_exit(&mut qemu, deadline, Duration::from_millis(10), || {
        pump(&mut model_killed, &mut sim);
        ControlFlow::Continue(())
    });
    qemu.stop();
    sim.stop();
    for r in readers {
        let _ = r.join();
    }
    pump(&mut model_killed, &mut sim);
    drop(dir);

    let console = snapshot(&console);
    let mut out = Outcome {
        boot: vm_harness::Outcome {
            exit_code: end.code(),
            console,
            model_log: snapshot(&model_lines),
            results: Vec::new(),
            timed_out: end == Exit::TimedOut,
        },
        device_gen: None,
        msis: None,
        reports: Vec::new(),
        trace: None,
        model_killed,
        logs: snapshot(&logs),
    };
    let mut block: Option<(String, Vec<String>)> = None;
    let mut in_trace = false;
    for l in &out.boot.console {
        if in_trace {
            if l.trim() == "@@ TRACE END" {
                in_trace = false;
            } else {
                out.trace.get_or_insert_with(String::new).push_str(l.trim_end());
            }
            continue;
        }
        if let Some((_, lines)) = block.as_mut() {
            if l.trim() == "@@ REPORT END" {
                out.reports.extend(block.take());
            } else {
                lines.push(l.clone());
            }
            continue;
        }
        let Some(rest) = l.trim_start().strip_prefix("@@ ") else { continue };
        if rest.trim() == "TRACE BEGIN" {
            in_trace = true;
        } else if let Some(name) = rest.strip_prefix("REPORT ").and_then(|r| r.strip_suffix(" BEGIN")) {
            block = Some((name.to_string(), Vec::new()));
        } else if let Some(r) = rest.strip_prefix("RESULT ") {
            let mut it = r.splitn(3, ' ');
            let (name, st, why) =
                (it.next().unwrap_or(""), it.next().unwrap_or(""), it.next().unwrap_or("").trim());
            let st = match st {
                "PASS" => Status::Pass,
                "SKIP" => Status::Skip(why.to_string()),
                _ => Status::Fail(format!("{st} {why}")),
            };
            out.boot.results.push((name.to_string(), st));
        } else if let Some(m) = rest.strip_prefix("IRQS msi=") {
            out.msis = m.split_whitespace().next().and_then(|n| n.parse().ok());
        } else if let Some(g) = rest.strip_prefix("DEVICE gen=") {
            out.device_gen = g.split_whitespace().next().and_then(|n| n.parse().ok());
        }
    }
    Ok(out)
}

/// Boots each distinct `run` once per test process and shares the outcome
/// between the tests that look at it.
pub fn boot_cached(run: &Run) -> Arc<Result<Outcome, String>> {
    type Cell = Arc<OnceLock<Arc<Result<Outcome, String>>>>;
    static RUNS: OnceLock<Mutex<HashMap<Run, Cell>>> = OnceLock::new();
    let cell = {
        let map = RUNS.get_or_init(Mutex::default);
        let mut m = map.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(run.clone()).or_default().clone()
    };
    cell.get_or_init(|| Arc::new(boot(run).map_err(|e| e.to_string()))).clone()
}

/// The cached outcome of `run`, or a panic with the harness error.
pub fn outcome(run: &Run) -> Arc<Result<Outcome, String>> {
    let out = boot_cached(run);
    if let Err(e) = out.as_ref() {
        panic!("{e}");
    }
    out
}

/// Test body: the scenario must be reported and pass, or the test fails
/// with the reason and the last lines of the run.
pub fn check_scenario(run: &Run, scenario: &str) {
    let out = boot_cached(run);
    let out = match out.as_ref() {
        Ok(o) => o,
        Err(e) => panic!("{e}"),
    };
    match out.status(scenario) {
        Some(Status::Pass) => {}
        Some(Status::Fail(why)) => panic!("{scenario} failed on {run:?}: {why}\n{}", out.tail(30)),
        Some(Status::Skip(why)) => panic!("{scenario} was skipped on {run:?} ({why}): a skip is not a pass"),
        None => panic!(
            "{scenario} was not reported on {run:?} (exit {:?}{})\n{}",
            out.boot.exit_code,
            if out.boot.timed_out { ", timed out: QEMU and the model were killed" } else { "" },
            out.tail(30)
        ),
    }
}

/// Test body: the run as a whole exited 0 on the expected generation.
pub fn check_run(run: &Run) {
    let out = boot_cached(run);
    let out = match out.as_ref() {
        Ok(o) => o,
        Err(e) => panic!("{e}"),
    };
    assert!(!out.boot.timed_out, "run {run:?} timed out; QEMU and the model were killed\n{}", out.tail(30));
    assert_eq!(out.device_gen, Some(run.generation), "device generation\n{}", out.tail(30));
    assert_eq!(out.boot.exit_code, Some(0), "QEMU exit status\n{}", out.tail(30));
    match run.mode {
        Mode::Msi => assert!(
            out.msis.is_some_and(|n| n > 0),
            "MSI mode took no MSI-X interrupt ({:?}): waits did not go through interrupts\n{}",
            out.msis,
            out.tail(30)
        ),
        Mode::Polling => assert_eq!(out.msis, Some(0), "polling mode took MSIs\n{}", out.tail(30)),
    }
}
