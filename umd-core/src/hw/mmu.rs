//! The refgpu MMU format (`docs/refgpu.md` section 3): page-table entry bits
//! and the VA split the device walks.
