//! The porting guide's shared-memory example (`examples/shared_ram_port.rs`,
//! `docs/porting.md`, "Shared-memory transports") built and run against a
//! freshly started `refgpu-sim --shared-ram`: the whole conformance suite
//! passes on it, a SIGKILLed model is seen lost through the frozen CLOCK
//! although ATTACH stays set, and the code the guide quotes is the
//! example's, word for word.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

// The example's `main` is its command line; the tests call its functions.
#[allow(dead_code)]
#[path = "../examples/shared_ram_port.rs"]
mod port;

use umd_core::hw::regs;
use umd_core::platform::{DirectIo, Platform, PlatformError};

/// Failure guard for anything that waits (never a performance threshold).
const GUARD: Duration = Duration::from_secs(60);

struct Model {
    child: Child,
    ram: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Model {
    fn start(gen: &str) -> Model {
        let dir = tempfile::tempdir().unwrap();
        let ram = dir.path().join("ram.img");
        std::fs::File::create(&ram).unwrap().set_len(16 << 20).unwrap();
        let log = dir.path().join("sim.log");
        let child = Command::new(env!("CARGO_BIN_EXE_refgpu-sim"))
            .arg("--shared-ram")
            .arg(&ram)
            .args(["--gen", gen])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Model { child, ram, log, _dir: dir }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn suite(gen: &str) {
    let m = Model::start(gen);
    match port::run_suite(&m.ram) {
        Ok((pass, fail, skip)) => {
            assert_eq!(fail, 0, "gen{gen}: {fail} scenarios failed\n{}", m.log_text());
            assert_eq!(pass + skip, conformance::SCENARIOS);
            // What the guide promises (`the_guide_states_the_suites_counts`):
            // gen1 without local memory skips `local_memory_eviction`.
            let skips = if gen == "1" { 1 } else { 0 };
            assert_eq!(skip, skips, "gen{gen}: {skip} skipped, {pass} passed");
        }
        Err(e) => panic!("gen{gen}: {e}\n{}", m.log_text()),
    }
}

/// The guide's counts are the suite's: the number of scenarios and the
/// pass/skip figures the two `suite` tests above check.
#[test]
fn the_guide_states_the_suites_counts() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let guide = std::fs::read_to_string(root.join("docs/porting.md")).unwrap();
    let guide = guide.split_whitespace().collect::<Vec<_>>().join(" ");
    let n = conformance::SCENARIOS;
    for want in [
        format!("{n} scenarios in a fixed order"),
        format!("{n}/{n} on gen2, {} and 1 skip on gen1", n - 1),
        format!("{n} scenarios pass or skip with a reason"),
    ] {
        assert!(guide.contains(&want), "docs/porting.md does not say \"{want}\"");
    }
}

#[test]
fn the_guides_example_passes_the_suite_gen2() {
    suite("2");
}

#[test]
fn the_guides_example_passes_the_suite_gen1() {
    suite("1");
}

#[test]
fn a_killed_model_is_lost_by_its_frozen_clock() {
    let mut m = Model::start("2");
    let board = port::SharedRamBoard::attach(&m.ram, Duration::from_secs(10)).expect("attach");
    assert_eq!(board.read_reg(regs::ID).map(|id| id >> 16), Ok(0x5247));
    m.child.kill().unwrap(); // SIGKILL: ATTACH stays "RGSR"
    m.child.wait().unwrap();
    let start = Instant::now();
    loop {
        board.delay_ns(1_000_000);
        match board.read_reg(regs::ID) {
            Err(PlatformError::DeviceLost) => break,
            r => assert!(start.elapsed() < GUARD, "still {r:?} after the model died"),
        }
    }
    assert_eq!(board.doorbell(0), Err(PlatformError::DeviceLost), "doorbells fail too");
}

/// Every line of the guide's shared-memory example appears in the example
/// program, so the guide shows compiled code.
#[test]
fn the_guide_quotes_the_example() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let guide = std::fs::read_to_string(root.join("docs/porting.md")).unwrap();
    let example = std::fs::read_to_string(root.join("refgpu-sim/examples/shared_ram_port.rs")).unwrap();
    let marker = "<!-- quoted from refgpu-sim/examples/shared_ram_port.rs -->";
    let mut quoted = 0;
    for block in guide.split(marker).skip(1) {
        let code = block.split("```rust\n").nth(1).and_then(|b| b.split("\n```").next()).unwrap();
        for line in code.lines().filter(|l| !l.trim().is_empty() && l.trim() != "// ...") {
            assert!(
                example.lines().any(|e| e == line),
                "docs/porting.md quotes a line the example lacks: {line:?}"
            );
            quoted += 1;
        }
    }
    assert!(quoted > 40, "the guide quotes the example ({quoted} lines)");
}
