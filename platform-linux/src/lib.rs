//! Linux platform for `umd-core`.
//!
//! - [`cosim`]: this process as an ivshmem peer of the `refgpu-sim`
//!   co-simulation server (register page and doorbells over shared memory
//!   and eventfds, system memory from a shared file);
//! - [`inproc`]: the functional model in this process (host tests),
//!   coherent or behind a modelled write-back CPU cache ([`cache`]);
//! - [`config`]: [`umd_core::config::Config`] overridden by `UMD_*`
//!   environment variables, with typed parse errors;
//! - [`selftest`]: bring-up checks for any direct-mode platform;
//! - [`suite`]: the conformance suite on a host (threads, result checks).
//!
//! The DRM backend (kernel-mediated submission) is not written yet.
//! See `platform-linux/README.md` for starting `refgpu-sim` and connecting.

pub mod cache;
pub mod config;
pub mod cosim;
pub mod inproc;
pub mod selftest;
pub mod suite;
mod sys;

pub use cache::{Cache, CacheControlError, CacheStats};
pub use cosim::{Cosim, CosimError, CosimOptions, MemWindow};
pub use inproc::{InProcess, InProcessOptions};

/// DMA pages of a model's memory window: `umd_core`'s bitmap page
/// allocator over a host vector.
type PageHeap = umd_core::mem::pages::PageBitmap<Vec<u64>>;

/// A page heap of `pages` free pages.
fn page_heap(pages: usize) -> PageHeap {
    PageHeap::new(vec![0; pages.div_ceil(64)], pages).expect("the storage holds one bit per page")
}
