//! Fault handling bare-metal: the fault matrix's bare-metal column (every
//! fault-injection knob of `refgpu-sim` × both generations × MSI and
//! polling, the `fault` image's `matrix` mode), the model process killed
//! in the middle of a run, a CPU exception in the bare-metal code, and the
//! DMA overrun walked by `docs/debugging.md` (the same boot as the CPU
//! exception): every block of the guide quoting the bare-metal run is
//! checked against this run's output, and its `umd-dump` commands are run
//! on the UART output. (The conformance suite's page-fault report over the
//! UART is checked in `tests/conformance.rs`.)

use std::path::PathBuf;
use std::process::Command;

use conformance::faults::KNOBS;
use qemu_tests::fault_matrix::cell;
use qemu_tests::{outcome, Mode, Outcome, Run};
use vm_harness::guide;

/// Exit status of the fault image after a detected device loss.
const EXIT_DEVICE_LOST: i32 = 4;
/// Exit status after a CPU exception (`platform_baremetal::arch::exceptions`).
const EXIT_EXCEPTION: i32 = 3;

fn device_loss_run(generation: u8, mode: Mode) -> Run {
    Run {
        args: vec!["device_loss"],
        kill_model_on: Some("@@ KILL_MODEL_NOW"),
        ..Run::new("fault", generation, mode)
    }
}

/// `refgpu-sim` is SIGKILLed while the guest submits and waits: the guest
/// detects the loss by itself (QEMU exits on its own, not by the harness
/// timeout), prints `@@ DEVICE_LOST` with the time since the last fence
/// and the hang window, and QEMU exits with status 4.
fn model_killed_mid_run(generation: u8, mode: Mode) {
    let run = device_loss_run(generation, mode);
    let out = outcome(&run);
    let Ok(out) = out.as_ref() else { return };
    assert!(out.model_killed, "the guest never asked for the kill\n{}", out.tail(30));
    assert!(
        !out.boot.timed_out,
        "the guest did not notice the model dying; QEMU was killed by the harness\n{}",
        out.tail(30)
    );
    let line = out
        .boot
        .console
        .iter()
        .find(|l| l.starts_with("@@ DEVICE_LOST detected"))
        .unwrap_or_else(|| panic!("no device-loss report\n{}", out.tail(30)));
    eprintln!("gen{generation} {}: {line}", mode.arg());
    assert!(
        line.contains("device lost") || line.contains("DeviceLost"),
        "the failure is not a device loss: {line}"
    );
    let (ms, window) = parse_loss(line).unwrap_or_else(|| panic!("unparsable: {line}"));
    // Failure guard, not a performance threshold: the loss is detected by
    // the hang check (one window, then a reset handshake of 100 ms that
    // nobody answers) or the transport's heartbeat (one window), so well
    // inside a few windows even on a loaded host.
    assert!(ms <= 10 * window, "device loss noticed after {ms} ms with a {window} ms hang window");
    assert_eq!(out.boot.exit_code, Some(EXIT_DEVICE_LOST), "QEMU exit status\n{}", out.tail(30));
}

/// `(ms, window_ms)` from `@@ DEVICE_LOST detected <ms> ms ... (hang window <w> ms)`.
fn parse_loss(line: &str) -> Option<(u64, u64)> {
    let ms = line.strip_prefix("@@ DEVICE_LOST detected ")?.split_whitespace().next()?.parse().ok()?;
    let w = line.split("(hang window ").nth(1)?.split_whitespace().next()?.parse().ok()?;
    Some((ms, w))
}

#[test]
fn model_killed_mid_run_gen1_polling() {
    model_killed_mid_run(1, Mode::Polling);
}

#[test]
fn model_killed_mid_run_gen2_polling() {
    model_killed_mid_run(2, Mode::Polling);
}

#[test]
fn model_killed_mid_run_gen2_msi() {
    model_killed_mid_run(2, Mode::Msi);
}

/// The fault image's boot that walks the DMA overrun of
/// `docs/debugging.md` (gen2, polling, MMU on), then takes the CPU
/// exception.
fn overrun_then_cpu() -> Run {
    Run { args: vec!["overrun", "cpu"], ..Run::new("fault", 2, Mode::Polling) }
}

/// Where the walk's UART output is kept (`uart.log`).
fn overrun_dir() -> PathBuf {
    vm_harness::target_base().join("qemu-tests").join("overrun")
}

/// The guide, read from the workspace.
fn guide_blocks() -> Vec<guide::Block> {
    let path = vm_harness::workspace_root().join("docs").join("debugging.md");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    guide::blocks(&text)
}

/// The report block `name` of a run, as text.
fn report(out: &Outcome, name: &str) -> String {
    match out.reports.iter().find(|(n, _)| n == name) {
        Some((_, lines)) => lines.join("\n"),
        None => panic!("no {name} report printed\n{}", out.tail(40)),
    }
}

/// Runs a guide's `umd-dump` command (`umd-dump <args>`) in `dir`; its
/// standard output.
fn run_umd_dump(tool: &PathBuf, dir: &std::path::Path, command: &str) -> String {
    let mut words = command.split_whitespace();
    assert_eq!(words.next(), Some("umd-dump"), "the guide's command is not umd-dump: {command}");
    let o = Command::new(tool)
        .args(words)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", tool.display()));
    assert!(o.status.success(), "{command}: {}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `docs/debugging.md`, bare metal: the overrun faults, and every quote of
/// the guide's bare-metal blocks is in this run's output: the UART's
/// result lines (`check=bm-uart`), the driver's log (`check=bm-log`), the
/// fault report (`check=bm-report`), the state dump after the fault
/// (`check=bm-state`) and while a wait blocks (`check=bm-deadlock`), and
/// the capture decoded by the guide's own `umd-dump` commands on the UART
/// output (`check=bm-umd-dump`), saved as `uart.log` in [`overrun_dir`].
#[test]
fn dma_overrun_walk_matches_the_guide() {
    let out = outcome(&overrun_then_cpu());
    let Ok(out) = out.as_ref() else { return };
    let console = out.boot.console.join("\n");
    if let Some(why) = out.boot.console.iter().find(|l| l.starts_with("@@ OVERRUN_FAILED")) {
        panic!("the walk failed: {why}\n{}", out.tail(60));
    }
    let blocks = guide_blocks();
    let logs: Vec<String> = out.logs.iter().map(|l| l.to_string()).collect();
    let outputs = [
        ("bm-uart", console.clone()),
        ("bm-log", logs.join("\n")),
        ("bm-report", report(out, "overrun-fault")),
        ("bm-state", report(out, "state-after-overrun")),
        ("bm-deadlock", report(out, "state-deadlock")),
    ];
    for (name, text) in &outputs {
        for b in guide::named(&blocks, name).unwrap_or_else(|e| panic!("{e}")) {
            if let Err(e) = guide::check(b, text) {
                panic!("{e}");
            }
        }
    }
    // The capture: the UART output saved as the guide names it (kept, for
    // a reader to run the guide's commands on), and the guide's commands
    // run on it there.
    let tool = qemu_tests::umd_dump().unwrap_or_else(|e| panic!("building umd-dump: {e}"));
    let dir = overrun_dir();
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    std::fs::write(dir.join("uart.log"), &console).unwrap_or_else(|e| panic!("uart.log: {e}"));
    let dumps = guide::named(&blocks, "bm-umd-dump").unwrap_or_else(|e| panic!("{e}"));
    for b in dumps {
        let commands = b.commands();
        assert!(!commands.is_empty(), "guide block at line {} runs no command", b.line);
        let text: String = commands.iter().map(|c| run_umd_dump(&tool, &dir, c)).collect();
        if let Err(e) = guide::check(b, &text) {
            panic!("{e}");
        }
    }
}

/// Every checked block of `docs/debugging.md` names an output one of its
/// tests checks (a misspelt name would be checked by none): the `bm-*`
/// blocks by `dma_overrun_walk_matches_the_guide`, the `guest-*` ones by
/// the guest's `dma_overrun_walk`, `demo-report` by `tests/demo.rs`.
#[test]
fn every_block_of_the_guide_has_a_checker() {
    const CHECKED: &[&str] = &[
        "bm-uart",
        "bm-log",
        "bm-report",
        "bm-state",
        "bm-deadlock",
        "bm-umd-dump",
        "guest-run",
        "guest-dmesg",
        "guest-devcoredump",
        "guest-umd-dump",
        "guest-state",
        "demo-report",
    ];
    let blocks = guide_blocks();
    for b in &blocks {
        assert!(
            CHECKED.contains(&b.name.as_str()),
            "guide block check={} (line {}) is checked by no test",
            b.name,
            b.line
        );
    }
    for name in CHECKED {
        assert!(blocks.iter().any(|b| b.name == *name), "the guide has no block check={name}");
    }
}

/// A data abort on purpose: the handler prints the exception class, the
/// fault status, the faulting address (FAR) and ELR, and x0..x18, fp, lr;
/// QEMU exits with status 3.
#[test]
fn cpu_exception_is_reported_and_exits_non_zero() {
    let run = overrun_then_cpu();
    let out = outcome(&run);
    let Ok(out) = out.as_ref() else { return };
    let text = out.boot.console.join("\n");
    let addr = out.fault_addr().unwrap_or_else(|| panic!("no @@ FAULT_ADDR line\n{text}"));
    for want in [
        "@@ EXCEPTION synchronous exception at EL1: ELR_EL1 0x",
        "EC 0x25 (data abort), translation fault, level 1, read",
        &format!("FAR_EL1 {addr:#018x}"),
        "SPSR_EL1 0x",
        "x0 ",
        "x17",
        "x18",
        "fp  0x",
        "lr  0x",
    ] {
        assert!(text.contains(want), "exception report lacks {want:?}:\n{text}");
    }
    assert!(!text.contains("@@ FATAL"), "the faulting read returned:\n{text}");
    assert_eq!(out.boot.exit_code, Some(EXIT_EXCEPTION), "QEMU exit status\n{text}");
}

fn matrix(generation: u8, mode: Mode) {
    for k in KNOBS {
        cell(Run::new("fault", generation, mode), k);
    }
}

#[test]
fn fault_matrix_gen1_polling() {
    matrix(1, Mode::Polling);
}

#[test]
fn fault_matrix_gen1_msi() {
    matrix(1, Mode::Msi);
}

#[test]
fn fault_matrix_gen2_polling() {
    matrix(2, Mode::Polling);
}

#[test]
fn fault_matrix_gen2_msi() {
    matrix(2, Mode::Msi);
}
