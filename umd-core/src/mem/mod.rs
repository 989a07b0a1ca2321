//! GPU memory management (`docs/memory.md`).
//!
//! Everything here is heap-free: capacities are const generics or storage the
//! integrator provides, and every operation has a bounded worst case.
//!
//! - [`va`]: the fixed-arena GPU virtual-address allocator (TLSF-style segregated
//!   hole lists with address links, O(1) except one O(log n) region tree);
//! - [`pool`]: size-class pools (small / medium slabs with power-of-two bins
//!   over blocks mapped once, large blocks of their own) over a [`Backing`];
//! - [`pagetable`]: the refgpu page-table builder (4 KiB pages, 2 MiB blocks);
//! - [`buffer`]: generation-counted, device-stamped buffer handles;
//! - [`manager`]: the device's buffers: handles over the pools, frees gated
//!   on fences, the leak report;
//! - [`local`]: the device's local memory (the page allocator over it,
//!   and [`Residency`]);
//! - [`stats`]: statistics types, all O(1) to read.
//!
//! `docs/memory.md` explains the design.
//!
//! For platforms rather than the device: [`pages`], runs of 4 KiB pages over
//! a caller-provided bitmap, under a `dma_alloc` that carves a fixed window.

pub mod buffer;
pub mod local;
pub mod manager;
pub mod pages;
pub mod pagetable;
pub mod pool;
pub mod stats;
pub mod va;

pub use buffer::{BufferDesc, BufferError, BufferHandle, BufferInfo, LeakEntry, Tracking};
pub use local::Residency;
pub use manager::{AllocError, BufferStats, Buffers};
pub use pagetable::{
    ArrayPageSource, CachePolicy, NoTlb, PageSource, PageTable, Perms, PtError, TlbInvalidate,
};
pub use pool::{
    Backing, BackingError, ClassStats, MemKind, Place, Pool, PoolAlloc, PoolError, PoolStats, SizeClass,
};
pub use stats::VaStats;
pub use va::{VaAllocator, VaError, VaHandle, VaNode, VaPlacement, VaRange, MIN_ALIGN};

/// [`VaPlacement`] under its former name.
#[deprecated(note = "renamed to `VaPlacement`")]
pub type Placement = VaPlacement;
