//! Linux platform for `umd-core`.
//!
//! - [`cosim`]: this process as an ivshmem peer of the `refgpu-sim`
//!   co-simulation server (register page and doorbells over shared memory
//!   and eventfds, system memory from a shared file);
//! - [`inproc`]: the functional model in this process (host tests);
//! - [`config`]: [`umd_core::config::Config`] overridden by `UMD_*`
//!   environment variables, with typed parse errors;
//! - [`selftest`]: bring-up checks for any direct-mode platform;
//! - [`suite`]: the conformance suite on a host (threads, result checks).
//!
//! The DRM backend (kernel-mediated submission) is not written yet.
//! See `platform-linux/README.md` for starting `refgpu-sim` and connecting.

pub mod config;
pub mod cosim;
mod heap;
pub mod inproc;
pub mod selftest;
pub mod suite;
mod sys;

pub use cosim::{Cosim, CosimError, CosimOptions, MemWindow};
pub use inproc::InProcess;
