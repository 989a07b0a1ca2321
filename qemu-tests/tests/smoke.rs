//! The smoke image on both generations, polling and MSI: one test per
//! scenario, plus one per run for the exit status and generation.

use qemu_tests::{check_run, check_scenario, Mode, Run};

fn run(generation: u8, mode: Mode) -> Run {
    Run::new("smoke", generation, mode)
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
            fn copy_fill_write_gfx() {
                check_scenario(&run($gen, $mode), "copy_fill_write_gfx");
            }
            #[test]
            fn copy_fill_write_compute() {
                check_scenario(&run($gen, $mode), "copy_fill_write_compute");
            }
            #[test]
            fn copy_fill_write_copy() {
                check_scenario(&run($gen, $mode), "copy_fill_write_copy");
            }
            #[test]
            fn fences_in_order_gfx() {
                check_scenario(&run($gen, $mode), "fences_in_order_gfx");
            }
            #[test]
            fn fences_in_order_compute() {
                check_scenario(&run($gen, $mode), "fences_in_order_compute");
            }
            #[test]
            fn fences_in_order_copy() {
                check_scenario(&run($gen, $mode), "fences_in_order_copy");
            }
            #[test]
            fn cross_queue() {
                check_scenario(&run($gen, $mode), "cross_queue");
            }
        }
    };
}

suite!(gen1_polling, 1, Mode::Polling);
suite!(gen2_polling, 2, Mode::Polling);
suite!(gen1_msi, 1, Mode::Msi);
suite!(gen2_msi, 2, Mode::Msi);

/// The images log through defmt (frames over semihosting): the host
/// decodes them with the ELF's `.defmt` table, arguments, levels,
/// timestamps and source locations included. Checked on the bring-up
/// lines of `platform-baremetal` (PCI, ivshmem) and umd-core's own
/// `Device::new` line.
mod defmt_logs {
    use super::*;
    use qemu_tests::outcome;

    fn check(generation: u8, mode: Mode) {
        let out = outcome(&run(generation, mode));
        let Ok(out) = out.as_ref() else { return };
        let all = || out.tail(40);
        // PCI enumeration: the ivshmem-doorbell function, vendor:device
        // formatted from `{:04x}` arguments on the host.
        let pci = out
            .logs
            .iter()
            .find(|l| l.message.starts_with("pci 00:") && l.message.ends_with(" 1af4:1110"))
            .unwrap_or_else(|| panic!("no decoded PCI line for 1af4:1110 in the defmt logs:\n{}", all()));
        assert_eq!(pci.level, "info");
        // `ivshmem at <dev>.<fn>: peer <n> model peer <n>`, from board.rs,
        // with the device number matching the PCI line's.
        let ivs = out.log("ivshmem at ").unwrap_or_else(|| panic!("no ivshmem bring-up line:\n{}", all()));
        assert_eq!(ivs.level, "info", "{ivs}");
        let dev = &pci.message["pci 00:".len()..]; // "<dev>.<fn> 1af4:1110"
        let dev = dev.split(' ').next().unwrap_or("");
        let words: Vec<&str> = ivs.message.split_whitespace().collect();
        assert_eq!(words.first(), Some(&"ivshmem"), "{ivs}");
        assert_eq!(words.get(2).map(|w| w.trim_end_matches(':')), Some(dev), "{ivs} vs {pci}");
        let peer: Option<u32> = words.get(4).and_then(|w| w.parse().ok());
        let model_peer: Option<u32> = words.get(7).and_then(|w| w.parse().ok());
        assert!(peer.is_some() && model_peer.is_some() && peer != model_peer, "peer ids in {ivs}");
        let loc = ivs.location.as_deref().unwrap_or_else(|| panic!("no location for {ivs}"));
        assert!(loc.starts_with("platform-baremetal/src/arch/board.rs:"), "location {loc}");
        assert!(ivs.timestamp.is_some(), "no timestamp on {ivs}");
        // umd-core's own log (its `defmt` feature), with the generation
        // the model runs.
        let core = out
            .log(&format!("refgpu gen{generation} rev "))
            .unwrap_or_else(|| panic!("no umd-core Device::new log:\n{}", all()));
        assert!(core.location.as_deref().is_some_and(|l| l.starts_with("umd-core/src/")), "{core}");
        // In order: enumeration, then the transport, then the device.
        let pos = |l: &qemu_tests::LogLine| out.logs.iter().position(|x| x == l);
        assert!(pos(pci) < pos(ivs) && pos(ivs) < pos(core), "log order:\n{}", all());
        // Nothing garbled on the way.
        assert!(!out.logs.iter().any(|l| l.message.contains("malformed defmt frame")), "{}", all());
    }

    #[test]
    fn bring_up_logs_decoded_gen2_msi() {
        check(2, Mode::Msi);
    }

    #[test]
    fn bring_up_logs_decoded_gen1_polling() {
        check(1, Mode::Polling);
    }
}

/// The `@@ CONFIG` line of a run: the configuration the device runs with.
fn config_line(out: &qemu_tests::Outcome) -> String {
    out.boot
        .console
        .iter()
        .find_map(|l| l.trim().strip_prefix("@@ CONFIG ").map(str::to_owned))
        .unwrap_or_else(|| panic!("no @@ CONFIG line\n{}", out.tail(30)))
}

/// The driver's configuration on the QEMU command line
/// (`-semihosting-config ...,arg=umd.<key>=<value>`): the device comes up
/// with it, reports it, and the smoke checks pass with the smaller ring.
#[test]
fn config_entries_on_the_command_line_configure_the_device() {
    let r = Run {
        args: vec!["umd.ring_bytes=8K", "umd.hang_window_ns=250000000", "umd.batching=off"],
        ..run(2, Mode::Polling)
    };
    check_run(&r);
    let out = qemu_tests::outcome(&r);
    let Ok(out) = out.as_ref() else { return };
    let cfg = config_line(out);
    for want in ["ring_bytes=8192 ", "hang_window_ns=250000000 ", "batching=off "] {
        assert!(cfg.contains(want), "{want:?} not in effect: {cfg}");
    }
    assert!(!out.boot.console.iter().any(|l| l.contains("@@ CONFIG_ERROR")), "{}", out.tail(30));
}

/// A bad entry (an unknown key) is refused naming the key, and none of the
/// entries applies: the image's own configuration stays in effect.
#[test]
fn a_bad_config_entry_is_named_and_the_defaults_stay() {
    let r = Run { args: vec!["umd.ring_bytes=8K", "umd.ring_size=4K"], ..run(2, Mode::Polling) };
    check_run(&r);
    let out = qemu_tests::outcome(&r);
    let Ok(out) = out.as_ref() else { return };
    let err = out
        .boot
        .console
        .iter()
        .find(|l| l.contains("@@ CONFIG_ERROR"))
        .unwrap_or_else(|| panic!("no @@ CONFIG_ERROR\n{}", out.tail(30)));
    assert!(err.contains("unknown key `ring_size`"), "{err}");
    let cfg = config_line(out);
    assert!(cfg.contains("ring_bytes=65536 "), "the good entry applied without the bad one: {cfg}");
}
