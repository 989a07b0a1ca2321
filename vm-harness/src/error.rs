//! Why a harness could not make a boot: the error both harnesses return.

use std::fmt;

/// Why a boot could not be made.
#[derive(Debug)]
pub enum HarnessError {
    /// A tool or package the boot needs is missing and was not installed.
    Missing {
        /// What is missing, and why it was not installed.
        what: String,
        /// The harness's install instructions.
        hint: &'static str,
    },
    /// Building an artifact (image, module, guest, model) failed.
    Build(String),
    /// Starting a process or preparing files failed.
    Setup(String),
}

impl fmt::Display for HarnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HarnessError::Missing { what, hint } => write!(f, "{what}\n{hint}"),
            HarnessError::Build(s) => write!(f, "build failed: {s}"),
            HarnessError::Setup(s) => write!(f, "setup failed: {s}"),
        }
    }
}

impl std::error::Error for HarnessError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_says_what_failed() {
        let m = HarnessError::Missing { what: "qemu not found".into(), hint: "install it" };
        assert_eq!(m.to_string(), "qemu not found\ninstall it");
        assert_eq!(HarnessError::Build("x".into()).to_string(), "build failed: x");
        assert_eq!(HarnessError::Setup("y".into()).to_string(), "setup failed: y");
    }
}
