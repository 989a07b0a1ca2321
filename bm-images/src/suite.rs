//! The conformance images' run (aarch64 `conformance`, Cortex-M
//! `m-conformance`): every scenario of the suite with its result line and
//! guest time, the page-fault scenario's decoded report, and the driver's
//! state dump after the fault and after the hang.

use conformance::{Env, Outcome, ScenarioResult};
use core::fmt::{self, Write};
use platform_baremetal::arch::timer;
use platform_baremetal::println;

use umd_core::engine::dump::DumpFormat;
use umd_core::engine::{Backend, DeviceCore};

/// Scenario counts of a run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counts {
    /// Passed.
    pub passed: u32,
    /// Failed.
    pub failed: u32,
    /// Skipped (cannot run on this platform).
    pub skipped: u32,
}

/// Runs every scenario on `dev`: prints `@@ RESULT` ([`report_line`]) and
/// the guest time of each, and after `page_fault_reported` the device's
/// last hang report between `@@ REPORT <scenario> BEGIN` and
/// `@@ REPORT END`; after `page_fault_reported` and
/// `hang_detected_and_recovered` the state dump ([`print_state`], named
/// `state-after-<scenario>`).
pub fn run<B: Backend + Sync, const C: usize>(dev: &DeviceCore<'_, B, C>, env: &Env<'_>) -> Counts {
    let mut n = Counts::default();
    for s in conformance::scenarios() {
        let t0 = timer::now_ns();
        let r = s.run(dev, env);
        let ms = timer::now_ns().saturating_sub(t0) / 1_000_000;
        match r.outcome {
            Outcome::Pass => n.passed += 1,
            Outcome::Fail => n.failed += 1,
            Outcome::Skip => n.skipped += 1,
        }
        report_line(&r);
        println!("   ({} ms guest time)", ms);
        if r.name == "page_fault_reported" {
            if let Some(h) = dev.last_hang() {
                println!("@@ REPORT {} BEGIN", r.name);
                println!("{h}");
                println!("@@ REPORT END");
            }
        }
        if matches!(r.name, "page_fault_reported" | "hang_detected_and_recovered") {
            print_state(dev, "state-after-", r.name);
        }
    }
    n
}

/// Switches the validation mode on when `on` (the command line said
/// `validation`) and prints `@@ VALIDATION on|off`; exits with status 2
/// (after `@@ FATAL`) when it is asked for and not compiled in.
pub fn validation_from_args<B: Backend, const C: usize>(dev: &DeviceCore<'_, B, C>, on: bool) {
    if on && dev.set_validation(true).is_err() {
        println!("@@ FATAL validation asked for; the image was built without the validation feature");
        platform_baremetal::arch::exit::exit(2)
    }
    println!("@@ VALIDATION {}", if dev.validation() { "on" } else { "off" });
}

/// The console as a [`core::fmt::Write`], for output streamed in pieces
/// (the state dump).
pub struct Console;

impl Write for Console {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        platform_baremetal::arch::console::write_fmt(format_args!("{s}"));
        Ok(())
    }
}

/// Prints the driver's whole state ([`DeviceCore::dump_state`], text)
/// between `@@ REPORT <prefix><name> BEGIN` and `@@ REPORT END`.
pub fn print_state<B: Backend, const C: usize>(dev: &DeviceCore<'_, B, C>, prefix: &str, name: &str) {
    println!("@@ REPORT {prefix}{name} BEGIN");
    if dev.dump_state(&mut Console, DumpFormat::Text).is_err() {
        println!("(state dump cut short)");
    }
    println!("@@ REPORT END");
}

/// Prints a conformance result as `@@ RESULT <name> PASS|FAIL|SKIP <detail>`.
pub fn report_line(r: &ScenarioResult) {
    let tag = match r.outcome {
        Outcome::Pass => "PASS",
        Outcome::Fail => "FAIL",
        Outcome::Skip => "SKIP",
    };
    println!("@@ RESULT {} {tag} {}", r.name, r.detail);
}
