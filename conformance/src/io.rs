//! Buffer contents without an allocator: dwords written and checked in
//! blocks through the device's copy calls (which do the cache maintenance).

use umd_core::engine::{Backend, DeviceCore};
use umd_core::mem::{BufferError, BufferHandle};

/// Dwords moved per device call.
const BLOCK: usize = 256;

/// Writes `n` dwords `f(i)` at the start of `h`.
pub fn write_words<B: Backend, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    h: BufferHandle,
    n: usize,
    f: impl Fn(usize) -> u32,
) -> Result<(), BufferError> {
    let mut block = [0u32; BLOCK];
    let mut i = 0usize;
    while i < n {
        let len = (n - i).min(BLOCK);
        for (k, w) in block.iter_mut().take(len).enumerate() {
            *w = f(i + k);
        }
        dev.write_words(h, (i * 4) as u64, &block[..len])?;
        i += len;
    }
    Ok(())
}

/// The first dword `i < n` of `h` that is not `want(i)`: `(i, got, want)`.
pub fn first_mismatch<B: Backend, const C: usize>(
    dev: &DeviceCore<'_, B, C>,
    h: BufferHandle,
    n: usize,
    want: impl Fn(usize) -> u32,
) -> Result<Option<(usize, u32, u32)>, BufferError> {
    let mut bytes = [0u8; BLOCK * 4];
    let mut i = 0usize;
    while i < n {
        let len = (n - i).min(BLOCK);
        dev.read(h, (i * 4) as u64, &mut bytes[..len * 4])?;
        for k in 0..len {
            let got =
                u32::from_le_bytes([bytes[4 * k], bytes[4 * k + 1], bytes[4 * k + 2], bytes[4 * k + 3]]);
            if got != want(i + k) {
                return Ok(Some((i + k, got, want(i + k))));
            }
        }
        i += len;
    }
    Ok(None)
}
