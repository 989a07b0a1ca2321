//! DISPATCH arithmetic (`docs/refgpu.md` section 6.11).
//!
//! One element at a time: the engine reads `A[i]` and `B[i]`, calls
//! [`element`], and writes `DST[i]` before moving to `i + 1`, so aliasing
//! arrays behave as the spec's "for each `i` in order". SAXPY_F32 is
//! `scalar * a + b` with the product rounded before the sum: Rust never
//! contracts `x * y + z` into a fused multiply-add, so plain `f32`
//! arithmetic is exactly the spec's non-fused, round-to-nearest-even
//! binary32 result.

use crate::packet::DispatchOp;

/// `DST[i]` for the element values `a`, `b` (raw bit patterns).
pub fn element(op: DispatchOp, a: u32, b: u32, scalar: u32) -> u32 {
    match op {
        DispatchOp::AddU32 => a.wrapping_add(b),
        DispatchOp::MulU32 => a.wrapping_mul(b),
        DispatchOp::SaxpyF32 => {
            let product = f32::from_bits(scalar) * f32::from_bits(a);
            (product + f32::from_bits(b)).to_bits()
        }
    }
}
