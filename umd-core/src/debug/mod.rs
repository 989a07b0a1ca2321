//! Bring-up aids: the trace ring of submission events, the hang reports and
//! the command-stream capture.

pub mod capture;
pub mod hang;
pub mod trace;

pub use hang::{HangLog, HangReason, HangReport, NearBuffer, Window, HANG_REPORTS};
pub use trace::{TraceEvent, TraceKind, TraceRing};
