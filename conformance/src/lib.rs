//! The conformance suite: scenarios written once (`no_std`) and run on every
//! platform (in-process model, Linux co-simulation, bare metal under QEMU).
//!
//! Not written yet (issue 5).
#![no_std]
