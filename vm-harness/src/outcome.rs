//! What a boot produced, in the part both harnesses read the same way: the
//! exit code, the console and model lines, the results the guest reported
//! and whether the harness stopped it. Each harness keeps this as the
//! `boot` field of its own `Outcome`, beside what only it reads.

/// A guest test's or scenario's reported status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// Passed.
    Pass,
    /// Failed, with the reason printed.
    Fail(String),
    /// Cannot run here, with the reason (the bare-metal images report it;
    /// the Linux guest reports only passes and failures).
    Skip(String),
}

/// The part of a boot's outcome that both harnesses read the same way.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// QEMU's exit code; None if killed.
    pub exit_code: Option<i32>,
    /// Every console line.
    pub console: Vec<String>,
    /// The model's log lines.
    pub model_log: Vec<String>,
    /// The results the guest reported, in order (`@@ RESULT` lines of the
    /// bare-metal images, `@@ TEST` lines of the Linux guest).
    pub results: Vec<(String, Status)>,
    /// Whether the harness stopped the boot at its timeout.
    pub timed_out: bool,
}

impl Outcome {
    /// The status reported for `name` (a test or scenario), if any.
    pub fn status(&self, name: &str) -> Option<&Status> {
        self.results.iter().find(|(n, _)| n == name).map(|(_, s)| s)
    }
}
