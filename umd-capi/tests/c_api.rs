//! The C API from C on the host: `tools/install-capi.sh` builds the host
//! library (feature `host`) and installs it with its header and pkg-config
//! file; the system `cc` builds `examples/host.c` (with the example
//! workload, `examples/workload.c`), `tests/c/bad_input.c` and
//! `tests/c/forged_event.c` with the flags of that pkg-config file, and
//! each runs against the in-process model. The captures the host example
//! writes are decoded with `umd-dump`'s reader.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The install prefix, installed once per test run (the nested build has
/// its own target directory: the outer build holds its own).
fn prefix() -> &'static Result<PathBuf, String> {
    static PREFIX: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PREFIX.get_or_init(|| {
        let base = vm_harness::target_base().join("umd-capi");
        let prefix = base.join("prefix");
        let out = Command::new("bash")
            .arg(vm_harness::workspace_root().join("tools/install-capi.sh"))
            .arg(&prefix)
            .env("CARGO_TARGET_DIR", &base)
            .env("UMD_CAPI_PROFILE", "dev")
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("CARGO_BUILD_TARGET")
            .output()
            .map_err(|e| format!("running tools/install-capi.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!("tools/install-capi.sh failed:\n{}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(prefix)
    })
}

/// `pkg-config --cflags --libs --static umd-capi`, read from the installed
/// file (the test needs no pkg-config binary): the Cflags, Libs and
/// Libs.private lines with the file's variables expanded.
fn pkg_config_flags(prefix: &Path) -> Vec<String> {
    let pc =
        std::fs::read_to_string(prefix.join("lib/pkgconfig/umd-capi.pc")).expect("umd-capi.pc installed");
    let mut vars: Vec<(String, String)> = Vec::new();
    let mut flags = Vec::new();
    for line in pc.lines() {
        let expand = |s: &str, vars: &[(String, String)]| {
            vars.iter().fold(s.to_string(), |acc, (k, v)| acc.replace(&format!("${{{k}}}"), v))
        };
        if let Some((k, v)) = line.split_once('=').filter(|(k, _)| !k.contains(':') && !k.contains(' ')) {
            let v = expand(v, &vars);
            vars.push((k.to_string(), v));
        } else if let Some((k, v)) = line.split_once(':') {
            if matches!(k, "Cflags" | "Libs" | "Libs.private") {
                flags.extend(expand(v, &vars).split_whitespace().map(str::to_string));
            }
        }
    }
    flags
}

/// Builds `sources` against the installed library and runs the program
/// with `args`; its stdout, or why it failed.
fn build_and_run(sources: &[PathBuf], args: &[&str]) -> String {
    let source = sources.first().expect("a source");
    let prefix = match prefix() {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = dir.path().join("prog");
    let out = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-o"])
        .arg(&exe)
        .args(sources)
        .args(pkg_config_flags(prefix))
        .output()
        .expect("running cc");
    assert!(
        out.status.success(),
        "cc {} failed:\n{}",
        source.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).args(args).output().expect("running the program");
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(
        run.status.success() && stdout.lines().last() == Some("ok"),
        "{} {args:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        source.display(),
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    stdout
}

#[test]
fn host_example_runs_on_both_generations() {
    for gen in ["1", "2"] {
        let examples = crate_dir().join("examples");
        let dir = tempfile::tempdir().expect("tempdir");
        let rgcs = dir.path().join("host.rgcs");
        let out = build_and_run(
            &[examples.join("host.c"), examples.join("workload.c")],
            &[gen, rgcs.to_str().expect("UTF-8 path")],
        );
        for line in [
            "copy and fill: 65536 bytes checked",
            "dispatch after a cross-queue wait: 1024 words checked",
            "event set by the GPU",
            "shutdown: 1 buffer (4096 bytes) leaked",
            "state dump (text, ",
            "state dump (JSON, ",
            "capture into 65536 bytes: 2 submissions recorded, 0 lost",
            ": 1 submissions recorded, 1 lost",
        ] {
            assert!(out.contains(line), "gen{gen}: no line {line:?} in:\n{out}");
        }
        assert!(out.contains("hang reported"), "gen{gen}: no hang report in:\n{out}");

        // The captures the C program wrote, decoded as `umd-dump` prints
        // them: a FILL on GFX, then a COPY on COPY after the FILL's fence.
        let bytes = std::fs::read(&rgcs).expect("the capture was written");
        let text = umd_dump::capture::render_text(&bytes).unwrap_or_else(|e| panic!("gen{gen}: {e}"));
        let subs: Vec<&str> = text.lines().filter(|l| l.starts_with("submission ")).collect();
        assert_eq!(subs.len(), 2, "gen{gen}:\n{text}");
        assert!(subs[0].starts_with("submission 1: fence q0:") && subs[0].contains("after []"), "{text}");
        let fill_fence = subs[0].split_whitespace().nth(3).expect("the fence");
        assert!(subs[1].starts_with("submission 2: fence q2:"), "{text}");
        assert!(subs[1].contains(&format!("after [{fill_fence}]")), "gen{gen}:\n{text}");
        assert!(text.contains(" FILL ") && text.contains(" DMA_COPY "), "gen{gen}:\n{text}");
        assert!(text.contains(&format!("-- gen{gen}: 2 submissions, 0 dropped or lost")), "{text}");

        let small = std::fs::read(dir.path().join("host.rgcs.small")).expect("the small capture");
        let text = umd_dump::capture::render_text(&small).unwrap_or_else(|e| panic!("gen{gen}: {e}"));
        assert!(text.contains("submission 1: fence q0:") && text.contains(" FILL "), "{text}");
        assert!(!text.contains("submission 2") && !text.contains(" DMA_COPY "), "{text}");
        assert!(text.contains(&format!("-- gen{gen}: 1 submissions, 1 dropped or lost")), "{text}");
    }
}

#[test]
fn bad_input_from_c_gets_typed_statuses_and_changes_nothing() {
    let out = build_and_run(&[crate_dir().join("tests/c/bad_input.c")], &[]);
    let checks = out.lines().filter(|l| l.starts_with("bad-input ") && l.ends_with(": ok")).count();
    assert_eq!(checks, 18, "checks that passed:\n{out}");
}

#[test]
fn a_buffer_handle_forged_for_an_event_is_refused_from_c() {
    let out = build_and_run(&[crate_dir().join("tests/c/forged_event.c")], &[]);
    let checks = out.lines().filter(|l| l.starts_with("forged-event ") && l.ends_with(": ok")).count();
    assert_eq!(checks, 5, "checks that passed:\n{out}");
}
