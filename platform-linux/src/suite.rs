//! Running the `no_std` conformance suite on a host: std threads for the
//! scenarios that need them, every result printed and checked. Used by the
//! in-process, co-simulation and (in the Linux guest) kernel-mode tests.

use conformance::{run_all, Env, Outcome, Parallel, SCENARIO_NAMES};
use umd_core::engine::{Backend, DeviceCore};

/// Threads from `std::thread::scope`.
#[derive(Clone, Copy, Debug, Default)]
pub struct StdThreads;

impl Parallel for StdThreads {
    fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        std::thread::scope(|s| {
            for i in 0..tasks {
                s.spawn(move || task(i));
            }
        });
    }
}

/// Runs every scenario on `dev`, printing each result prefixed with
/// `label`. Returns the failures as text (empty: all passed or skipped with
/// a reason). Panics if a scenario is missing or skipped without a reason:
/// a scenario never passes silently.
pub fn run_suite<B: Backend + Sync, const C: usize>(dev: &DeviceCore<'_, B, C>, label: &str) -> Vec<String> {
    let env = Env { parallel: Some(&StdThreads) };
    let mut failures = Vec::new();
    let mut seen = Vec::new();
    run_all(dev, &env, |r| {
        println!("{label}: {r}");
        seen.push(r.name);
        match r.outcome {
            Outcome::Pass => {}
            Outcome::Skip => assert!(!r.detail.as_str().is_empty(), "{} skipped without a reason", r.name),
            Outcome::Fail => failures.push(r.to_string()),
        }
    });
    assert_eq!(seen, SCENARIO_NAMES, "every scenario reported");
    failures
}
