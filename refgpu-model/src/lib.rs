//! Functional model of the reference GPU described in `docs/refgpu.md`.
//!
//! Not written yet (issue 5): engines, rings, every packet, the MMU walk,
//! faults, hangs and reset, fault injection, and the ivshmem co-simulation
//! server.
