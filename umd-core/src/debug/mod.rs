//! Bring-up aids: the trace ring of submission events and the hang report.

pub mod hang;
pub mod trace;

pub use hang::{HangReason, HangReport, NearBuffer, Window};
pub use trace::{TraceEvent, TraceKind, TraceRing};
