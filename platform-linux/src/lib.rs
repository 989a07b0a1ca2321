//! Linux platform for `umd-core`.
//!
//! - [`cosim`]: this process as an ivshmem peer of the `refgpu-sim`
//!   co-simulation server (register page and doorbells over shared memory
//!   and eventfds, system memory from a shared file);
//! - [`inproc`]: the functional model in this process (host tests),
//!   coherent or behind a modelled write-back CPU cache ([`cache`]);
//! - [`config`]: [`umd_core::config::Config`] from the environment
//!   (`UMD_<KEY>` variables and a `UMD_CONFIG` file, through umd-core's
//!   one `key=value` parser), with typed errors naming the variable; every
//!   platform constructor reads it (`config()`);
//! - [`selftest`]: bring-up checks for any direct-mode platform;
//! - [`suite`]: the conformance suite on a host (threads, result checks);
//! - [`soak`]: the soak's workload (long run, injected hangs and faults,
//!   sampled statistics checked flat; its accounting is the fault
//!   matrix's, [`conformance::faults`]);
//! - `drm` (feature `drm`): kernel-mediated mode over the refgpu DRM driver's render node;
//! - [`lock`]: [`FairLock`], the fair raw lock all three use for the
//!   core's locks.
//!
//! Features: `model` (default: [`inproc`], [`cosim`], [`cache`],
//! [`selftest`]; pulls the model in), `suite` (default), `drm`. A DRM
//! user builds with `default-features = false, features = ["drm"]` and gets
//! neither the model nor the suite. See `platform-linux/README.md` for
//! starting `refgpu-sim` and connecting.

#[cfg(feature = "model")]
pub mod cache;
pub mod config;
#[cfg(feature = "model")]
pub mod cosim;
#[cfg(feature = "drm")]
pub mod drm;
#[cfg(feature = "model")]
pub mod inproc;
pub mod lock;
#[cfg(feature = "model")]
pub mod selftest;
#[cfg(feature = "suite")]
pub mod soak;
#[cfg(feature = "suite")]
pub mod suite;
#[cfg(feature = "model")]
mod sys;

#[cfg(feature = "model")]
pub use cache::{Cache, CacheControlError, CacheStats};
#[cfg(feature = "model")]
pub use cosim::{Cosim, CosimError, CosimOptions, MemWindow};
#[cfg(feature = "drm")]
pub use drm::{Drm, DrmError};
#[cfg(feature = "model")]
pub use inproc::{InProcess, InProcessError, InProcessOptions};
pub use lock::FairLock;

/// DMA pages of a model's memory window: `umd_core`'s page allocator over
/// a host vector of nodes.
#[cfg(feature = "model")]
type PageHeap = umd_core::mem::pages::PageAlloc<Vec<umd_core::mem::va::VaNode>>;

/// A page heap of `pages` free pages; refused for zero pages. One node per
/// page: every block or hole is at least a page, so the node table is
/// never full and only the pages run out (40 B of host memory per page,
/// 640 KiB for the model's default 64 MiB).
#[cfg(feature = "model")]
fn page_heap(pages: usize) -> Result<PageHeap, umd_core::mem::pages::PagesError> {
    PageHeap::new(vec![umd_core::mem::va::VaNode::EMPTY; pages], pages)
}
