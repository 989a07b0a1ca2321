//! Fault handling bare-metal: the fault matrix's bare-metal column (every
//! fault-injection knob of `refgpu-sim` × both generations × MSI and
//! polling, the `fault` image's `matrix` mode), the model process killed
//! in the middle of a run, and a CPU exception in the bare-metal code.
//! (The decoded GPU page-fault report over the UART is checked in
//! `tests/conformance.rs`.)

use std::collections::BTreeMap;

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
        !out.timed_out,
        "the guest did not notice the model dying; QEMU was killed by the harness\n{}",
        out.tail(30)
    );
    let line = out
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
    assert_eq!(out.exit_code, Some(EXIT_DEVICE_LOST), "QEMU exit status\n{}", out.tail(30));
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
    let text = out.console.join("\n");
    let addr = out
        .console
        .iter()
        .find_map(|l| l.strip_prefix("@@ FAULT_ADDR "))
        .and_then(|a| u64::from_str_radix(a.trim().trim_start_matches("0x"), 16).ok())
        .unwrap_or_else(|| panic!("no @@ FAULT_ADDR line\n{text}"));
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
    assert_eq!(out.exit_code, Some(EXIT_EXCEPTION), "QEMU exit status\n{text}");
}

/// A knob of the matrix: name, `refgpu-sim` arguments, queues (mask)
/// whose fault outlives the run, whether the server is killed halfway.
/// The same knobs as the co-simulation matrix (`refgpu-sim/tests/fault_matrix.rs`).
struct Knob {
    name: &'static str,
    args: &'static [&'static str],
    lasting: u8,
    kill: bool,
}

const KNOBS: &[Knob] = &[
    Knob { name: "none", args: &[], lasting: 0, kill: false },
    Knob { name: "packet_latency 200us", args: &["--packet-latency", "200us"], lasting: 0, kill: false },
    Knob { name: "drop_fence_nth 3", args: &["--drop-fence-nth", "3"], lasting: 0b111, kill: false },
    Knob {
        name: "drop_fence_prob 0.25",
        args: &["--drop-fence-prob", "0.25", "--seed", "7"],
        lasting: 0b111,
        kill: false,
    },
    Knob { name: "stalled COPY", args: &["--stall-engines", "0x4"], lasting: 0b100, kill: false },
    Knob { name: "irq_delay 2ms", args: &["--irq-delay", "2ms"], lasting: 0, kill: false },
    Knob { name: "server killed", args: &[], lasting: 0, kill: true },
];

/// The semihosting words of a cell (static: the harness keeps them).
fn cell_args(k: &Knob, mode: Mode) -> Vec<&'static str> {
    let lasting: &'static str = match k.lasting {
        0 => "lasting=0",
        0b100 => "lasting=4",
        _ => "lasting=7",
    };
    // The hosted matrices' seeds: polling 0xFA17, interrupts 0xFA16.
    let seed = if mode == Mode::Msi { "seed=64022" } else { "seed=64023" };
    let mut args = vec!["matrix", lasting, seed];
    if k.kill {
        args.push("kill");
    }
    args
}

/// One cell: boots the `fault` image in `matrix` mode against a server
/// started with the knob, and checks what it printed: the accounting held
/// (submitted = signalled + failed with a reason, 0 lost, nothing leaked,
/// the device usable afterwards or reported lost) and the shutdown gave
/// every buffer and DMA page back. Returns the accounting's fields.
fn cell(generation: u8, mode: Mode, k: &Knob) -> BTreeMap<String, u64> {
    let run = Run {
        args: cell_args(k, mode),
        sim_args: k.args.iter().map(|a| a.to_string()).collect(),
        kill_model_on: k.kill.then_some("@@ KILL_MODEL_NOW"),
        ..Run::new("fault", generation, mode)
    };
    let t0 = std::time::Instant::now();
    let out = outcome(&run);
    let Ok(out) = out.as_ref() else { unreachable!("outcome panics on a harness error") };
    let secs = t0.elapsed().as_secs_f64();
    let label = format!("bare metal gen{generation} {} {}", mode.arg(), k.name);
    let text = out.tail(40);
    assert!(!out.timed_out, "{label}: timed out; QEMU and the model were killed\n{text}");
    let line = out
        .console
        .iter()
        .find_map(|l| l.strip_prefix("@@ ACCOUNTING "))
        .unwrap_or_else(|| panic!("{label}: no accounting printed\n{text}"));
    println!("{label} ({secs:.1} s with the boot): {line}");
    let acc: BTreeMap<String, u64> = line
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(key, v)| {
            (key.to_string(), v.parse().unwrap_or_else(|_| panic!("{label}: bad field {key}={v}")))
        })
        .collect();
    let check = out.console.iter().find(|l| l.starts_with("@@ CHECK")).map(String::as_str);
    assert_eq!(check, Some("@@ CHECK ok"), "{label}: {line}\n{text}");
    let shutdown = out.console.iter().find(|l| l.starts_with("@@ SHUTDOWN")).map(String::as_str);
    assert_eq!(shutdown, Some("@@ SHUTDOWN leaked_buffers=0 dma_pages=0"), "{label}\n{text}");
    assert_eq!(out.exit_code, Some(0), "{label}: exit status\n{text}");
    if k.kill {
        assert!(out.model_killed, "{label}: the guest never asked for the kill\n{text}");
    }
    let f = |key: &str| acc.get(key).copied().unwrap_or_else(|| panic!("{label}: no {key} in {line}"));
    // The image checked the sum; check it again against what it printed.
    let failed = f("hung") + f("fault") + f("lost_device") + f("never");
    assert_eq!(f("submitted"), f("signalled") + failed + f("lost"), "{label}: {line}");
    assert_eq!((f("lost"), f("leaked"), f("busy_chunks")), (0, 0, 0), "{label}: {line}");
    if matches!(k.name, "none" | "packet_latency 200us" | "irq_delay 2ms") {
        assert_eq!((f("signalled"), f("refused")), (f("submitted"), 0), "{label}: {line}");
    }
    if k.name == "stalled COPY" {
        assert!(f("hung") > 0, "{label}: no hang reported: {line}");
    }
    if k.kill {
        assert_eq!(f("device_lost"), 1, "{label}: the device did not report itself lost: {line}");
    }
    acc
}

fn matrix(generation: u8, mode: Mode) {
    for k in KNOBS {
        cell(generation, mode, k);
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
