//! GPU memory management (issue 3).
//!
//! Everything here is heap-free: capacities are const generics or storage the
//! integrator provides, and every operation has a bounded worst case.
//!
//! - [`va`]: the fixed-arena GPU virtual-address allocator (AVL trees, O(log n));
//! - [`pool`]: size-class pools (small / medium slabs with power-of-two bins,
//!   large ranges straight from the VA allocator) with fence-gated reuse;
//! - [`deferred`]: the FIFO of frees waiting for a fence;
//! - [`pagetable`]: the refgpu page-table builder (4 KiB pages, 2 MiB blocks);
//! - [`buffer`]: generation-counted buffer handles and the leak report;
//! - [`stats`]: the statistics snapshot shared by the above.
//!
//! `docs/memory.md` explains the design.

pub mod va;

pub use va::{Placement, VaAllocator, VaError, VaNode, VaRange, VaStats, MIN_ALIGN};
