//! Fault handling bare-metal: the fault matrix's bare-metal column (every
//! fault-injection knob of `refgpu-sim` × both generations × MSI and
//! polling, the `fault` image's `matrix` mode), the model process killed
//! in the middle of a run, and a CPU exception in the bare-metal code.
//! (The decoded GPU page-fault report over the UART is checked in
//! `tests/conformance.rs`.)

use conformance::faults::KNOBS;
use qemu_tests::fault_matrix::cell;
use qemu_tests::{outcome, Mode, Run};

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

/// A data abort on purpose: the handler prints the exception class, the
/// fault status, the faulting address (FAR) and ELR, and x0..x18, fp, lr;
/// QEMU exits with status 3.
#[test]
fn cpu_exception_is_reported_and_exits_non_zero() {
    let run = Run { args: vec!["cpu"], ..Run::new("fault", 2, Mode::Polling) };
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
