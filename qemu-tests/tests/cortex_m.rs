//! The Cortex-M4 under QEMU `mps2-an386`, the GPU in the board's shared
//! PSRAM (`docs/cortex-m.md`): the whole conformance suite on both
//! generations (one boot each) and once more with umd-core's validation
//! mode on (gen2, one boot), the fault image (model killed, CPU fault,
//! a doorbell for an engine that does not exist, a carve-out too small for
//! the pools), no model running, a RAM file of the wrong size, and the
//! porting guide's board (`m-myboard`) running the suite.

use conformance::faults::KNOBS;
use qemu_tests::fault_matrix::cell;
use qemu_tests::{boot, check_run, check_scenario, outcome, HarnessError, Run, Status};

/// Exit status of the fault image after a detected device loss.
const EXIT_DEVICE_LOST: i32 = 4;
/// Exit status after a CPU exception.
const EXIT_EXCEPTION: i32 = 3;
/// Exit status when bring-up failed.
const EXIT_BRINGUP: i32 = 2;

fn suite(generation: u8) -> Run {
    Run::cortex_m("m-conformance", generation)
}

/// Every scenario reported once, in order; the only skips are the ones
/// this board cannot run, each with its reason printed.
fn every_scenario_reported(generation: u8) {
    every_scenario_reported_on(&suite(generation), generation);
}

/// [`every_scenario_reported`] for the run `r` of any suite image.
fn every_scenario_reported_on(r: &Run, generation: u8) {
    let out = outcome(r);
    let Ok(out) = out.as_ref() else { return };
    for (n, s) in &out.boot.results {
        eprintln!("cortex-m gen{generation} {n}: {s:?}");
    }
    let names: Vec<&str> = out.boot.results.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, conformance::SCENARIO_NAMES, "scenarios reported\n{}", out.tail(30));
    let bad: Vec<_> = out
        .boot
        .results
        .iter()
        .filter(|(n, s)| match s {
            Status::Pass => false,
            Status::Skip(why) => {
                !((n == "multi_submitter" && why.contains("no threads"))
                    || (n == "local_memory_eviction" && generation == 1 && why.contains("no local memory")))
            }
            Status::Fail(_) => true,
        })
        .collect();
    assert!(bad.is_empty(), "scenarios not passing on {r:?}: {bad:?}\n{}", out.tail(30));
}

macro_rules! gen_suite {
    ($m:ident, $gen:expr) => {
        mod $m {
            use super::*;

            #[test]
            fn exits_zero_on_the_right_generation_polling() {
                check_run(&suite($gen));
            }
            #[test]
            fn every_scenario_reported_and_passing() {
                every_scenario_reported($gen);
            }
            #[test]
            fn page_fault_report_over_the_uart() {
                let out = outcome(&suite($gen));
                let Ok(out) = out.as_ref() else { return };
                let Some((_, lines)) = out.reports.iter().find(|(n, _)| n == "page_fault_reported") else {
                    panic!("no fault report printed\n{}", out.tail(40))
                };
                let text = lines.join("\n");
                for want in ["Translation fault on Read at 0x1c0000040", "DMA_COPY", "SRC=0x1c0000040"] {
                    assert!(text.contains(want), "fault report lacks {want:?}:\n{text}");
                }
            }
            #[test]
            fn state_dump_after_the_hang() {
                let out = outcome(&suite($gen));
                let Ok(out) = out.as_ref() else { return };
                let Some((_, lines)) =
                    out.reports.iter().find(|(n, _)| n == "state-after-hang_detected_and_recovered")
                else {
                    panic!("no state dump printed after the hang\n{}", out.tail(40))
                };
                let text = lines.join("\n");
                for want in [
                    "queue q1 stuck (platform clock ",
                    "kind: hang",
                    "error: queue hung and was reset",
                    "rptr_seen:",
                ] {
                    assert!(text.contains(want), "state dump lacks {want:?}:\n{text}");
                }
            }
            #[test]
            fn core_scenarios() {
                for s in [
                    "copy_fill_write",
                    "ib_chaining",
                    "ring_wraparound",
                    "pipeline_copy_compute_copy",
                    "hang_detected_and_recovered",
                    "stress_random_dependencies",
                    "events_across_queues",
                ] {
                    check_scenario(&suite($gen), s);
                }
            }
            #[test]
            fn defmt_logs_decoded() {
                let out = outcome(&suite($gen));
                let Ok(out) = out.as_ref() else { return };
                assert!(
                    out.log("shared RAM: model attached").is_some(),
                    "no decoded defmt bring-up log\n{}",
                    out.tail(20)
                );
            }
        }
    };
}

/// The suite with the validation mode on (gen2): the image says so,
/// exits 0, every scenario passes, and the scenarios that check
/// validation see it refuse (`dma_overrun_caught`,
/// `dispatch_on_wrong_queue`).
#[test]
fn gen2_validation_mode_every_scenario_passes() {
    let r = Run { args: vec!["validation"], ..suite(2) };
    let out = outcome(&r);
    let Ok(out) = out.as_ref() else { return };
    assert!(
        out.boot.console.iter().any(|l| l.trim() == "@@ VALIDATION on"),
        "the image did not switch validation on\n{}",
        out.tail(30)
    );
    check_run(&r);
    every_scenario_reported_on(&r, 2);
    for s in ["dma_overrun_caught", "dispatch_on_wrong_queue"] {
        check_scenario(&r, s);
    }
}

gen_suite!(gen1, 1);
gen_suite!(gen2, 2);

/// The porting guide's board (`docs/porting.md` section 2,
/// `footprint/src/board.rs`: an MMIO-style platform behind `extern "C"`
/// board functions) compiled into the `m-myboard` image, which provides
/// those functions over the shared RAM, brings the device up and passes
/// the whole suite on both generations.
#[test]
fn the_guides_board_passes_the_suite() {
    for generation in [1, 2] {
        let r = Run::cortex_m("m-myboard", generation);
        check_run(&r);
        every_scenario_reported_on(&r, generation);
    }
}

#[test]
fn gen2_runs_local_memory_eviction() {
    check_scenario(&suite(2), "local_memory_eviction");
}

/// `refgpu-sim` is SIGKILLed while the guest submits and waits: the guest
/// notices by itself (the heartbeat stops; QEMU exits on its own), prints
/// `@@ DEVICE_LOST`, and exits 4. Before that, a doorbell for engine 3 was
/// refused without ringing anything.
#[test]
fn model_killed_mid_run_and_bad_doorbell() {
    let run = Run {
        args: vec!["device_loss"],
        kill_model_on: Some("@@ KILL_MODEL_NOW"),
        ..Run::cortex_m("m-fault", 1)
    };
    let out = outcome(&run);
    let Ok(out) = out.as_ref() else { return };
    let bad = out
        .boot
        .console
        .iter()
        .find(|l| l.starts_with("@@ BAD_DOORBELL"))
        .unwrap_or_else(|| panic!("{}", out.tail(30)));
    assert!(bad.contains("Unsupported"), "{bad}");
    let (before, after) = (bad.split("before ").nth(1), bad.split("after ").nth(1));
    assert_eq!(
        before.and_then(|s| s.split(',').next()),
        after.map(|s| s.trim_end_matches(')')),
        "the refused doorbell rang something: {bad}"
    );
    assert!(out.model_killed, "the guest never asked for the kill\n{}", out.tail(30));
    assert!(!out.boot.timed_out, "the guest did not notice the model dying\n{}", out.tail(30));
    let line = out
        .boot
        .console
        .iter()
        .find(|l| l.starts_with("@@ DEVICE_LOST detected"))
        .unwrap_or_else(|| panic!("no device-loss report\n{}", out.tail(30)));
    eprintln!("cortex-m: {line}");
    assert!(line.contains("device lost") || line.contains("DeviceLost"), "not a device loss: {line}");
    let ms: u64 = line
        .strip_prefix("@@ DEVICE_LOST detected ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unparsable: {line}"));
    let window: u64 = line
        .split("(hang window ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unparsable: {line}"));
    // Failure guard, not a performance threshold (see tests/faults.rs).
    assert!(ms <= 10 * window, "device loss noticed after {ms} ms with a {window} ms hang window");
    assert_eq!(out.boot.exit_code, Some(EXIT_DEVICE_LOST), "QEMU exit status\n{}", out.tail(30));
}

/// A bus fault on purpose: the HardFault handler prints the stacked
/// registers and the decoded CFSR/HFSR/MMFAR/BFAR, and QEMU exits 3.
#[test]
fn hard_fault_is_decoded_and_exits_non_zero() {
    let out = outcome(&Run { args: vec!["cpu"], ..Run::cortex_m("m-fault", 1) });
    let Ok(out) = out.as_ref() else { return };
    let text = out.boot.console.join("\n");
    let addr = out.fault_addr().unwrap_or_else(|| panic!("no @@ FAULT_ADDR line\n{text}"));
    for want in [
        "@@ EXCEPTION HardFault: PC 0x",
        "BusFault: CFSR 0x00008200 [PRECISERR (precise data bus error), BFARVALID]",
        "HFSR 0x40000000 [FORCED",
        "MMFAR 0x",
        &format!("BFAR {addr:#010x}"),
        &format!("bus fault at address {addr:#010x}"),
        &format!("r0  {addr:#010x}"),
        "r12 0x",
        "lr  0x",
        "xpsr 0x",
    ] {
        assert!(text.contains(want), "HardFault report lacks {want:?}:\n{text}");
    }
    assert!(!text.contains("@@ FATAL"), "the faulting read returned:\n{text}");
    assert_eq!(out.boot.exit_code, Some(EXIT_EXCEPTION), "QEMU exit status\n{text}");
}

/// A firmware whose carve-out is too small for the device's pools gets a
/// typed error naming the pool that did not fit, and exits 2.
#[test]
fn carve_out_too_small_is_named() {
    let out = outcome(&Run { args: vec!["small_carveout"], ..Run::cortex_m("m-fault", 1) });
    let Ok(out) = out.as_ref() else { return };
    let text = out.boot.console.join("\n");
    assert!(
        text.contains("@@ FATAL bring-up: GPU carve-out too small for the configured pools: the page tables (262144 bytes) does not fit: 65536 bytes left of 65536"),
        "{text}"
    );
    assert_eq!(out.boot.exit_code, Some(EXIT_BRINGUP), "{text}");
}

/// No model on the RAM file: the firmware says so after its bounded wait
/// and exits 2 (no hang).
#[test]
fn no_model_running_is_reported() {
    let out = outcome(&Run { no_model: true, ..Run::cortex_m("m-conformance", 1) });
    let Ok(out) = out.as_ref() else { return };
    let text = out.boot.console.join("\n");
    assert!(!out.boot.timed_out, "{text}");
    assert!(text.contains("@@ FATAL bring-up: no model attached to the shared RAM"), "{text}");
    assert_eq!(out.boot.exit_code, Some(EXIT_BRINGUP), "{text}");
}

/// A RAM file that is not exactly 16 MiB: the model refuses it and the
/// harness reports the model's reason (QEMU is not started).
#[test]
fn wrong_size_ram_file_is_a_harness_error() {
    let run = Run { ram_file_bytes: Some(8 << 20), ..Run::cortex_m("m-conformance", 1) };
    match boot(&run) {
        Err(HarnessError::Setup(why)) => {
            assert!(why.contains("must be exactly 16 MiB") && why.contains("0x800000 bytes"), "{why}")
        }
        Err(e) => panic!("{e}"),
        Ok(out) => panic!("booted with an 8 MiB RAM file: exit {:?}\n{}", out.boot.exit_code, out.tail(20)),
    }
}

/// `embassy-executor` on the M4: two tasks submit to GFX and COPY and
/// await their fences concurrently (`wait_async`), plus a wait for "any
/// of" two fences; the waits are woken by TIMER0 one-shot ticks at the
/// adaptive schedule's deadlines (no interrupts on this binding); a wait
/// dropped after it registered gives its hub slot back at once. The
/// model charges 20 µs per packet so the waits really suspend.
#[test]
fn embassy_tasks_await_fences_concurrently() {
    let run = Run { sim_args: vec!["--packet-latency".into(), "20us".into()], ..Run::cortex_m("m-async", 2) };
    let out = outcome(&run);
    let Ok(out) = out.as_ref() else { return };
    let text = out.boot.console.join("\n");
    for q in ["q0", "q2"] {
        assert!(text.contains(&format!("@@ ASYNC worker {q} rounds=32 ok")), "{text}");
    }
    let line = out
        .boot
        .console
        .iter()
        .find_map(|l| l.strip_prefix("@@ ASYNC overlap max_in_flight="))
        .unwrap_or_else(|| panic!("{text}"));
    let mut it = line.split_whitespace();
    let overlap: u32 = it.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    let ticks: u32 =
        it.next().and_then(|t| t.strip_prefix("ticks=")).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert_eq!(overlap, 2, "the two tasks' waits never overlapped: {text}");
    assert!(ticks > 0, "no timer tick woke a wait: {text}");
    assert!(
        out.boot.console.iter().any(|l| l.starts_with("@@ ASYNC dropped_wait ok")),
        "a dropped wait did not give its hub slot back: {text}"
    );
    assert_eq!(out.boot.exit_code, Some(0), "{text}");
}

/// 32-bit correctness on the target: the GPU VA arena at 0x7FFF_0000_0000
/// (48-bit addresses through page tables, packets and buffer handles on a
/// 32-bit `usize`), a copy and fill there checked byte by byte, sizes
/// above 4 GiB refused rather than truncated, a pool plan that saturates.
#[test]
fn addresses_and_sizes_on_the_32_bit_target() {
    let run = Run::cortex_m("m-width", 2);
    let out = outcome(&run);
    let Ok(out) = out.as_ref() else { return };
    for s in ["usize_is_32_bits_no_64_bit_atomics", "high_va_copy_and_fill", "sizes_over_usize_refused"] {
        check_scenario(&run, s);
    }
    assert_eq!(out.boot.exit_code, Some(0), "{}", out.tail(20));
}

/// The fault matrix's Cortex-M column (`docs/reliability.md`): every knob
/// of `refgpu-sim` over the shared RAM, polling (the M images wait by
/// polling), one boot per knob; the accounting printed by `m-fault
/// matrix` must hold.
fn fault_matrix(generation: u8) {
    for k in KNOBS {
        cell(Run::cortex_m("m-fault", generation), k);
    }
}

#[test]
fn fault_matrix_gen1() {
    fault_matrix(1);
}

#[test]
fn fault_matrix_gen2() {
    fault_matrix(2);
}
