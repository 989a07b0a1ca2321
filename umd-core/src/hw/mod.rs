//! Per-generation hardware descriptions (being written).

pub mod mmu;
