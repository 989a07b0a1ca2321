//! Statistics shared by the memory modules.
//!
//! Every figure here is maintained incrementally as counters, so reading it
//! is O(1), with one exception: [`VaStats::largest_free`] is found by walking
//! the VA allocator's largest non-empty size class (holes within ~6 % of each
//! other in size, usually a single one). Statistics are cheap to read at any
//! time but are not part of any allocation path.

/// Allocator statistics (see the module documentation for their cost).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct VaStats {
    /// Arena size in bytes.
    pub arena: u64,
    /// Bytes in live and retired allocations.
    pub used: u64,
    /// Bytes not in allocations: holes, and the freed ranges a recycling
    /// allocator ([`crate::mem::va::VaAllocator::new_recycling`], the
    /// driver's) keeps for their length.
    pub free: u64,
    /// Length of the largest hole (exact). Ranges kept by recycling are
    /// not holes until an allocation that needs them flushes them, so with
    /// recycling this (and [`VaStats::fragmentation_ppm`]) may understate
    /// what a large request can get.
    pub largest_free: u64,
    /// Highest `used` ever seen.
    pub high_water: u64,
    /// Number of live and retired allocations.
    pub allocations: u64,
    /// Number of holes (ranges kept by recycling are not holes).
    pub holes: u64,
    /// Nodes in use (holes + allocations + ranges kept by recycling).
    pub nodes_used: u64,
    /// Highest `nodes_used` ever seen.
    pub nodes_high_water: u64,
    /// Size of the node storage.
    pub nodes_capacity: u64,
}

impl VaStats {
    /// External fragmentation `1 - largest_free / free` in parts per million
    /// (0 when nothing or everything is free in one hole).
    pub fn fragmentation_ppm(&self) -> u32 {
        fragmentation_ppm(self.largest_free, self.free)
    }

    /// External fragmentation `1 - largest_free / free` as a fraction.
    pub fn fragmentation(&self) -> f64 {
        f64::from(self.fragmentation_ppm()) / 1e6
    }

    /// Bytes of node storage in use (out-of-band metadata).
    pub fn metadata_bytes(&self) -> u64 {
        self.nodes_used.saturating_mul(core::mem::size_of::<crate::mem::va::VaNode>() as u64)
    }
}

/// `1 - largest / free` in parts per million, 0 when `free` is 0.
pub fn fragmentation_ppm(largest: u64, free: u64) -> u32 {
    if free == 0 || largest >= free {
        return 0;
    }
    let lost = u128::from(free.saturating_sub(largest));
    let ppm = lost.saturating_mul(1_000_000).checked_div(u128::from(free)).unwrap_or(0);
    u32::try_from(ppm).unwrap_or(1_000_000)
}
