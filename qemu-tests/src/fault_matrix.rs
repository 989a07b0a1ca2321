//! The fault matrix's bare-metal cells (`docs/reliability.md`): the check
//! of one cell, booted on either board (`tests/faults.rs`,
//! `tests/cortex_m.rs`), for each knob of the matrix's table
//! (`conformance::faults::KNOBS`, shared with the hosted columns).

use std::collections::BTreeMap;

use conformance::faults::{self, Accounting, Knob};

use crate::{outcome, Board, Mode, Run};

/// The semihosting words of a cell (static: the harness keeps them; a few
/// words leaked per boot).
fn cell_args(k: &Knob, mode: Mode) -> Vec<&'static str> {
    let lasting = String::leak(format!("lasting={}", k.lasting));
    let seed = String::leak(format!("seed={}", faults::seed(mode == Mode::Msi)));
    let mut args = vec!["matrix", &*lasting, &*seed];
    if k.kill {
        args.push("kill");
    }
    args
}

/// One cell: boots `base` (the `fault` or `m-fault` image on its board,
/// generation and mode) in `matrix` mode against a server started with
/// the knob, and checks what it printed: the accounting held (submitted =
/// signalled + failed with a reason, 0 lost, nothing leaked, the device
/// usable afterwards or reported lost), the knob's own expectation, and,
/// where the image shuts its device down (aarch64), every buffer and DMA
/// page back. Returns the accounting's fields.
pub fn cell(base: Run, k: &Knob) -> BTreeMap<String, u64> {
    let (generation, mode, board) = (base.generation, base.mode, base.board);
    let run = Run {
        args: cell_args(k, mode),
        sim_args: k.sim_args.iter().map(|a| a.to_string()).collect(),
        kill_model_on: k.kill.then_some("@@ KILL_MODEL_NOW"),
        ..base
    };
    let t0 = std::time::Instant::now();
    let out = outcome(&run);
    let Ok(out) = out.as_ref() else { unreachable!("outcome panics on a harness error") };
    let secs = t0.elapsed().as_secs_f64();
    let label = format!("{board:?} gen{generation} {} {}", mode.arg(), k.name);
    let text = out.tail(40);
    assert!(!out.boot.timed_out, "{label}: timed out; QEMU and the model were killed\n{text}");
    let line = out
        .boot
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
    let check = out.boot.console.iter().find(|l| l.starts_with("@@ CHECK")).map(String::as_str);
    assert_eq!(check, Some("@@ CHECK ok"), "{label}: {line}\n{text}");
    if board == Board::Virt {
        let shutdown = out.boot.console.iter().find(|l| l.starts_with("@@ SHUTDOWN")).map(String::as_str);
        assert_eq!(shutdown, Some("@@ SHUTDOWN leaked_buffers=0 dma_pages=0"), "{label}\n{text}");
    }
    assert_eq!(out.boot.exit_code, Some(0), "{label}: exit status\n{text}");
    if k.kill {
        assert!(out.model_killed, "{label}: the guest never asked for the kill\n{text}");
    }
    let f = |key: &str| acc.get(key).copied().unwrap_or_else(|| panic!("{label}: no {key} in {line}"));
    // The image checked the sum; check it again against what it printed.
    let failed = f("hung") + f("fault") + f("lost_device") + f("never");
    assert_eq!(f("submitted"), f("signalled") + failed + f("lost"), "{label}: {line}");
    assert_eq!((f("lost"), f("leaked"), f("busy_chunks")), (0, 0, 0), "{label}: {line}");
    let seen = Accounting {
        submitted: f("submitted"),
        signalled: f("signalled"),
        refused: f("refused"),
        failed_hung: f("hung"),
        device_lost: f("device_lost") == 1,
        ..Accounting::default()
    };
    if let Err(e) = k.expect.check(&seen) {
        panic!("{label}: {e}: {line}");
    }
    acc
}

#[cfg(test)]
mod tests {
    use conformance::faults::KNOBS;

    use super::cell_args;
    use crate::Mode;

    #[test]
    fn cell_args_carry_the_knobs_lasting_mask_and_the_hosted_matrices_seeds() {
        let stalled = KNOBS.iter().find(|k| k.lasting == 0b100).expect("a knob with one lasting queue");
        assert_eq!(cell_args(stalled, Mode::Msi), ["matrix", "lasting=4", "seed=64022"]);
        let dropped = KNOBS.iter().find(|k| k.lasting == 0b111).expect("a knob lasting on every queue");
        assert_eq!(cell_args(dropped, Mode::Polling), ["matrix", "lasting=7", "seed=64023"]);
        let killed = KNOBS.iter().find(|k| k.kill).expect("the killed server");
        assert_eq!(cell_args(killed, Mode::Polling), ["matrix", "lasting=0", "seed=64023", "kill"]);
    }
}
