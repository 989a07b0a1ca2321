//! Linux platform for `umd-core`: co-simulation against `refgpu-sim` and the
//! DRM backend.
//!
//! Not written yet (issues 4 and 5).
