//! The whole conformance suite bare-metal: the `conformance` image on both
//! generations, polling and MSI. One test per scenario and configuration
//! (a FAIL or SKIP fails it, and so does a scenario that was never
//! reported), one per configuration for the exit status and the complete
//! listing, the page-fault scenario's decoded report printed over the
//! UART, and the driver's state dump after the fault and after the hang.
//! Once more (one boot, gen2, polling) with umd-core's validation mode
//! on: every scenario passes, the ones that check validation
//! (`dma_overrun_caught`, `dispatch_on_wrong_queue`) see it refuse.

use qemu_tests::{check_run, check_scenario, outcome, Mode, Run, Status};

fn run(generation: u8, mode: Mode) -> Run {
    Run::new("conformance", generation, mode)
}

/// Every scenario of the suite was reported exactly once, in order, and
/// none failed; prints the listing.
fn every_scenario_reported(r: &Run) {
    let out = outcome(r);
    let Ok(out) = out.as_ref() else { return };
    let names: Vec<&str> = out.boot.results.iter().map(|(n, _)| n.as_str()).collect();
    for (n, s) in &out.boot.results {
        eprintln!("gen{} {} {n}: {s:?}", r.generation, r.mode.arg());
    }
    assert_eq!(names, conformance::SCENARIO_NAMES, "scenarios reported\n{}", out.tail(30));
    // One core and no scheduler: the multi-submitter scenario has no
    // threads here and says so; everything else must pass.
    let bad: Vec<_> = out
        .boot
        .results
        .iter()
        .filter(|(n, s)| match s {
            Status::Pass => false,
            Status::Skip(why) => {
                !((n == "multi_submitter" && why.contains("no threads"))
                    || (n == "local_memory_eviction" && r.generation == 1 && why.contains("no local memory")))
            }
            Status::Fail(_) => true,
        })
        .collect();
    assert!(bad.is_empty(), "scenarios not passing on {r:?}: {bad:?}\n{}", out.tail(30));
}

/// The page-fault scenario printed the decoded fault report over the UART:
/// the fault, the ring and the IB around the faulting packet.
fn page_fault_report_printed(r: &Run) {
    let out = outcome(r);
    let Ok(out) = out.as_ref() else { return };
    let Some((_, lines)) = out.reports.iter().find(|(n, _)| n == "page_fault_reported") else {
        panic!("no fault report printed\n{}", out.tail(40))
    };
    let text = lines.join("\n");
    for want in [
        "queue q2 faulted (platform clock ",
        "Translation fault on Read at 0x1c0000040",
        "fault: Translation fault on Read at 0x1c0000040",
        "ring from the read pointer:",
        "INDIRECT_BUFFER",
        "indirect buffer around the current packet:",
        "DMA_COPY",
        "SRC=0x1c0000040",
        "SIZE=0x100",
    ] {
        assert!(text.contains(want), "fault report lacks {want:?}:\n{text}");
    }
    assert!(
        lines.iter().any(|l| l.trim_start().starts_with("=> ") && l.contains("DMA_COPY")),
        "the faulting packet is not marked:\n{text}"
    );
}

/// The driver's state dump printed after the fault and after the hang
/// (`bm_images::suite::print_state`): the failed queue's fences and ring,
/// and the kept reports.
fn state_dumps_printed(r: &Run) {
    let out = outcome(r);
    let Ok(out) = out.as_ref() else { return };
    let dump = |name: &str| match out.reports.iter().find(|(n, _)| n == name) {
        Some((_, lines)) => lines.join("\n"),
        None => panic!("no {name} printed\n{}", out.tail(40)),
    };
    let fault = dump("state-after-page_fault_reported");
    for want in [
        "mode: direct",
        "queue q2 faulted (platform clock ",
        "Translation fault on Read",
        "kind: fault",
        "ib_pool:",
    ] {
        assert!(fault.contains(want), "state after the fault lacks {want:?}:\n{fault}");
    }
    let hang = dump("state-after-hang_detected_and_recovered");
    for want in [
        "queue q1 stuck (platform clock ",
        "no progress",
        "kind: hang",
        "error: queue hung and was reset",
        "rptr_seen:",
        "buffers:",
        "classes:",
        "stats:",
    ] {
        assert!(hang.contains(want), "state after the hang lacks {want:?}:\n{hang}");
    }
    // Both reports kept: the fault's, then the hang's.
    let total =
        hang.lines().find_map(|l| l.trim().strip_prefix("total: ")).and_then(|n| n.parse::<u64>().ok());
    assert!(total.is_some_and(|n| n >= 2), "hang log total {total:?}:\n{hang}");
}

macro_rules! suite {
    ($m:ident, $gen:expr, $mode:expr) => {
        mod $m {
            use super::*;

            #[test]
            fn exits_zero_on_the_right_generation() {
                check_run(&run($gen, $mode));
            }
            #[test]
            fn every_scenario_reported_and_passing() {
                every_scenario_reported(&run($gen, $mode));
            }
            #[test]
            fn page_fault_report_over_the_uart() {
                page_fault_report_printed(&run($gen, $mode));
            }
            #[test]
            fn state_dumps_after_the_fault_and_the_hang() {
                state_dumps_printed(&run($gen, $mode));
            }
            scenarios!(
                $gen,
                $mode,
                copy_fill_write,
                fences_in_order,
                ib_chaining,
                ring_wraparound,
                pipeline_copy_compute_copy,
                deadlock_rejected,
                page_fault_reported,
                hang_detected_and_recovered,
                pool_exhaustion,
                gen2_misaligned_fence,
                stress_random_dependencies,
                free_while_in_flight,
                many_small_buffers,
                failure_propagates,
                failure_history_survives_resets,
                wait_before_signal_is_not_a_hang,
                dma_overrun_caught,
                events_across_queues,
                dispatch_on_wrong_queue
            );
            #[test]
            fn local_memory_eviction() {
                let r = run($gen, $mode);
                if r.generation == 1 {
                    let out = outcome(&r);
                    let Ok(out) = out.as_ref() else { return };
                    match out.status("local_memory_eviction") {
                        Some(Status::Skip(why)) => assert!(why.contains("no local memory"), "{why}"),
                        other => panic!("local memory on gen1: {other:?}"),
                    }
                } else {
                    check_scenario(&r, "local_memory_eviction");
                }
            }
            #[test]
            fn multi_submitter_is_skipped_with_a_reason() {
                let out = outcome(&run($gen, $mode));
                let Ok(out) = out.as_ref() else { return };
                match out.status("multi_submitter") {
                    Some(Status::Skip(why)) => assert!(why.contains("no threads"), "{why}"),
                    other => panic!("multi_submitter on one core: {other:?}"),
                }
            }
        }
    };
}

macro_rules! scenarios {
    ($gen:expr, $mode:expr, $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                check_scenario(&run($gen, $mode), stringify!($name));
            }
        )*
    };
}

/// The validation run: gen2, polling, `validation` on the command line.
fn validation_run() -> Run {
    Run { args: vec!["validation"], ..run(2, Mode::Polling) }
}

/// The suite with the validation mode on: the image says it is on, exits
/// 0, and every scenario is reported and passes (correct work is never
/// refused; the scenarios that fault on purpose switch it off around that
/// submission).
#[test]
fn validation_mode_every_scenario_passes() {
    let r = validation_run();
    let out = outcome(&r);
    let Ok(out) = out.as_ref() else { return };
    assert!(
        out.boot.console.iter().any(|l| l.trim() == "@@ VALIDATION on"),
        "the image did not switch validation on\n{}",
        out.tail(30)
    );
    check_run(&r);
    every_scenario_reported(&r);
}

#[test]
fn validation_mode_refuses_the_overrun_and_the_wrong_engine() {
    for s in ["dma_overrun_caught", "dispatch_on_wrong_queue"] {
        check_scenario(&validation_run(), s);
    }
}

suite!(gen1_polling, 1, Mode::Polling);
suite!(gen2_polling, 2, Mode::Polling);
suite!(gen1_msi, 1, Mode::Msi);
suite!(gen2_msi, 2, Mode::Msi);
