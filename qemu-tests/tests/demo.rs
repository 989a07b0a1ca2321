//! The demo image (the README's main command boots it through
//! `src/bin/demo.rs`): every frame verified, the report printed and a
//! well-formed Chrome trace between the markers, with every job's GPU span
//! on its engine's track and matched to its fence; both generations, MSI
//! and polling, two and three frames in flight; the report's lines that
//! `docs/debugging.md` quotes (its `check=demo-report` block). And the
//! command line of `src/bin/demo.rs` (no QEMU needed: it stops at the
//! arguments).

use std::process::{Command, Output};

use qemu_tests::{outcome, Mode, Run};

fn check_demo(generation: u8, mode: Mode, depth: &'static str) {
    let run = Run { args: vec!["frames=6", depth], ..Run::new("demo", generation, mode) };
    let out = outcome(&run);
    let Ok(out) = out.as_ref() else { return };
    let text =
        out.boot.console.iter().filter(|l| !l.starts_with('{')).cloned().collect::<Vec<_>>().join("\n");
    assert_eq!(out.boot.exit_code, Some(0), "demo exit status\n{}", out.tail(40));
    for want in [
        "6/6 frames verified bit-exact",
        "submissions",
        "engine busy (GPU TIMESTAMPs)",
        "chained",
        "IB pool    : 16 chunks x 4096 B",
        "buffers    :",
        "faults     : 0 faults, 0 hangs, 0 resets",
        &format!("{} frames in flight", &depth["depth=".len()..]),
    ] {
        assert!(text.contains(want), "report lacks {want:?}:\n{text}");
    }
    let path = vm_harness::workspace_root().join("docs").join("debugging.md");
    let guide = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let blocks = vm_harness::guide::blocks(&guide);
    for b in vm_harness::guide::named(&blocks, "demo-report").unwrap_or_else(|e| panic!("{e}")) {
        if let Err(e) = vm_harness::guide::check(b, &text) {
            panic!("{e}");
        }
    }
    let json = out.trace.as_deref().unwrap_or_else(|| panic!("no trace between the markers\n{text}"));
    assert!(json.starts_with("{\"displayTimeUnit\"") && json.ends_with('}'), "trace is not one JSON object");
    assert!(json.contains("\"dropped_events\":0"), "trace dropped events");
    for q in ["\"tid\":0", "\"tid\":1", "\"tid\":2"] {
        assert!(json.contains(&format!("\"ph\":\"X\",\"pid\":1,{q}")), "no job slice on {q}");
    }
    // GPU side: one span per job on each engine's track, each matched to
    // its fence by the report (same queue and seqno).
    assert!(json.contains("\"GPU engines (TIMESTAMPs)\""), "no GPU process in the trace");
    for q in ["\"tid\":0", "\"tid\":1", "\"tid\":2"] {
        let spans = json.matches(&format!("\"ph\":\"X\",\"pid\":2,{q},")).count();
        assert_eq!(spans, 6, "GPU spans on {q}");
    }
    assert_eq!(
        text.matches("(6 jobs timed)").count(),
        3,
        "every job's GPU span matched to its fence:\n{text}"
    );
    let (open, close) = (json.matches('{').count(), json.matches('}').count());
    assert_eq!(open, close, "unbalanced braces in the trace");
}

#[test]
fn demo_gen2_msi() {
    check_demo(2, Mode::Msi, "depth=2");
}

#[test]
fn demo_gen1_polling() {
    check_demo(1, Mode::Polling, "depth=3");
}

fn demo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_demo")).args(args).output().expect("the demo binary runs")
}

#[test]
fn demo_help_and_argument_errors_come_from_clap() {
    let o = demo(&["--help"]);
    assert_eq!(o.status.code(), Some(0));
    let help = String::from_utf8_lossy(&o.stdout);
    for want in [
        "Usage: demo [OPTIONS]",
        "--gen <1|2>",
        "[default: 2]",
        "--polling",
        "--msi",
        "--frames <N>",
        "[default: 8]",
        "--depth <2|3>",
        "--gpu-bound[=<NS_PER_KIB>]",
        "--trace <FILE>",
    ] {
        assert!(help.contains(want), "help lacks {want:?}:\n{help}");
    }
    for (args, want) in [
        (vec!["--gen", "3"], "invalid value '3' for '--gen <1|2>'"),
        (vec!["--depth", "4"], "invalid value '4' for '--depth <2|3>'"),
        (vec!["--frames"], "a value is required for '--frames <N>'"),
        (vec!["--gpu-bound=0"], "invalid value '0' for '--gpu-bound[=<NS_PER_KIB>]'"),
        (vec!["--gpu-bound", "5"], "unexpected argument '5'"),
        (vec!["--bogus"], "unexpected argument '--bogus'"),
    ] {
        let o = demo(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        // clap's message, before anything runs.
        assert!(err.starts_with("error: ") && err.contains(want), "{args:?}: {err}");
    }
}

/// The driver configuration from the environment: a bad `UMD_*` value (or
/// an unreadable `UMD_CONFIG` file) stops the demo, naming the variable,
/// before anything is built or booted.
#[test]
fn demo_refuses_a_bad_environment_naming_the_variable() {
    let run = |var: &str, value: &str| {
        let o =
            Command::new(env!("CARGO_BIN_EXE_demo")).env(var, value).output().expect("the demo binary runs");
        (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let (code, err) = run("UMD_RING_BYTES", "12288");
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(
        err.trim_end(),
        "demo: UMD_RING_BYTES=\"12288\": out of range: expected a power of two from 4 KiB to 4 MiB"
    );
    let (code, err) = run("UMD_CONFIG", "/nonexistent/umd.conf");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.starts_with("demo: /nonexistent/umd.conf (UMD_CONFIG): "), "{err}");
}
