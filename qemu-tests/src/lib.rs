//! Host harness that builds the bare-metal images, starts the model and boots
//! QEMU.
//!
//! Not written yet (issue 6).
