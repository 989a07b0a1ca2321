//! Linux platform for `umd-core`.
//!
//! - [`cosim`]: this process as an ivshmem peer of the `refgpu-sim`
//!   co-simulation server (register page and doorbells over shared memory
//!   and eventfds, system memory from a shared file);
//! - [`inproc`]: the functional model in this process (host tests),
//!   coherent or behind a modelled write-back CPU cache ([`cache`]);
//! - [`config`]: [`umd_core::config::Config`] overridden by `UMD_*`
//!   environment variables, with typed parse errors;
//! - [`selftest`]: bring-up checks for any direct-mode platform.
//!
//! The DRM backend (kernel-mediated submission) is not written yet.
//! See `platform-linux/README.md` for starting `refgpu-sim` and connecting.

pub mod cache;
pub mod config;
pub mod cosim;
mod heap;
pub mod inproc;
pub mod selftest;
mod sys;

pub use cache::{Cache, CacheControlError, CacheStats};
pub use cosim::{Cosim, CosimError, CosimOptions, MemWindow};
pub use inproc::{InProcess, InProcessOptions};
