//! The static ring of direct mode (`docs/refgpu.md` section 4.1).
//!
//! A power-of-two ring of dwords in GPU-visible memory. The core writes
//! packets at the write pointer and publishes it; the engine consumes up to
//! it and reports its read pointer. Free space is computed from the last
//! read pointer seen: the ring holds at most `size - 4` bytes so that
//! `rptr == wptr` always means empty. A packet never crosses the end: the
//! tail is padded with NOPs (several when the tail is longer than one NOP
//! can be in this generation) and the packet starts again at offset 0.

use core::fmt;

use crate::cmd::{Command, EncodeError, Encoder};
use crate::platform::DmaRegion;

/// Why packets could not be placed in the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingError {
    /// Not enough free space now (`needed` bytes including padding,
    /// `free` bytes free); waiting for the engine frees more.
    Full {
        /// Bytes needed.
        needed: usize,
        /// Bytes free.
        free: usize,
    },
    /// More than the ring can ever hold.
    TooLarge {
        /// Bytes needed.
        needed: usize,
        /// Ring capacity (size - 4).
        capacity: usize,
    },
    /// A packet did not encode.
    Encode(EncodeError),
    /// A size that is not a power of two from 4 KiB to 4 MiB, or a region
    /// too small for it.
    BadSize {
        /// Bytes requested.
        size: usize,
    },
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::Full { needed, free } => write!(f, "ring full: {needed} bytes needed, {free} free"),
            RingError::TooLarge { needed, capacity } => {
                write!(f, "{needed} bytes never fit a ring of capacity {capacity}")
            }
            RingError::Encode(e) => write!(f, "ring packet: {e}"),
            RingError::BadSize { size } => write!(f, "bad ring size {size}"),
        }
    }
}

impl core::error::Error for RingError {}

/// What one [`Ring::write`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    /// Byte offset where writing started (the old write pointer).
    pub start: usize,
    /// The new write pointer, to publish.
    pub wptr: usize,
    /// Whether the write wrapped (tail padded with NOPs).
    pub wrapped: bool,
    /// Bytes consumed, padding included.
    pub bytes: usize,
}

/// Smallest and largest ring sizes the device accepts.
pub const MIN_RING: usize = 4096;
/// See [`MIN_RING`].
pub const MAX_RING: usize = 4 << 20;

/// A ring in GPU-visible memory.
#[derive(Debug)]
pub struct Ring {
    region: DmaRegion,
    gpu_va: u64,
    size: usize,
    wptr: usize,
}

impl Ring {
    /// A ring of `size` bytes over `region`, mapped at `gpu_va`.
    pub fn new(region: DmaRegion, gpu_va: u64, size: usize) -> Result<Ring, (RingError, DmaRegion)> {
        if !size.is_power_of_two() || !(MIN_RING..=MAX_RING).contains(&size) || region.len() < size {
            return Err((RingError::BadSize { size }, region));
        }
        Ok(Ring { region, gpu_va, size, wptr: 0 })
    }

    /// Gives the memory back (teardown).
    pub fn into_region(self) -> DmaRegion {
        self.region
    }

    /// The memory, for cache maintenance of a [`Written`] range.
    pub fn region(&self) -> &DmaRegion {
        &self.region
    }

    /// The ring's dwords (for hang dumps).
    pub fn region_words(&self) -> &[u32] {
        self.region.words()
    }

    /// GPU address of the ring.
    pub fn gpu_va(&self) -> u64 {
        self.gpu_va
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The write pointer (byte offset).
    pub fn wptr(&self) -> usize {
        self.wptr
    }

    /// Bytes free given the engine's read pointer `rptr`.
    pub fn free(&self, rptr: usize) -> usize {
        let mask = self.size.wrapping_sub(1);
        rptr.wrapping_sub(self.wptr).wrapping_sub(4) & mask
    }

    /// Bytes the engine has not consumed yet.
    pub fn used(&self, rptr: usize) -> usize {
        let mask = self.size.wrapping_sub(1);
        self.wptr.wrapping_sub(rptr) & mask
    }

    /// Back to empty, as after an engine reset (RPTR = WPTR = 0).
    pub fn reset(&mut self) {
        self.wptr = 0;
    }

    /// Dwords `cmds` take when placed from byte offset `at` (padding the
    /// generation requires between them included).
    fn span(&self, enc: &Encoder, cmds: &[Command<'_>], at: usize) -> Result<usize, EncodeError> {
        let mut off = at;
        for c in cmds {
            let va = self.gpu_va.wrapping_add(off as u64);
            let p = enc.placement(c, va)?;
            off = off.saturating_add(p.total().saturating_mul(4));
        }
        Ok(off.saturating_sub(at))
    }

    /// Writes `cmds` contiguously at the write pointer (wrapping with NOP
    /// padding if they do not fit before the end), given the engine's read
    /// pointer `rptr`. Nothing is written on error. The caller publishes
    /// [`Written::wptr`] afterwards.
    pub fn write(&mut self, enc: &Encoder, cmds: &[Command<'_>], rptr: usize) -> Result<Written, RingError> {
        let capacity = self.size.saturating_sub(4);
        let here = self.span(enc, cmds, self.wptr).map_err(RingError::Encode)?;
        let (start, pad, len) = if self.wptr.saturating_add(here) <= self.size {
            (self.wptr, 0, here)
        } else {
            let from_zero = self.span(enc, cmds, 0).map_err(RingError::Encode)?;
            (0, self.size.saturating_sub(self.wptr), from_zero)
        };
        let needed = pad.saturating_add(len);
        if len > capacity {
            return Err(RingError::TooLarge { needed: len, capacity });
        }
        let free = self.free(rptr);
        if needed > free {
            return Err(RingError::Full { needed, free });
        }
        let words = self.region.words_mut();
        if pad > 0 {
            let tail =
                words.get_mut(self.wptr / 4..self.size / 4).ok_or(RingError::BadSize { size: self.size })?;
            let max = (enc.desc().limits.max_ndw as usize).saturating_add(1);
            for nop in tail.chunks_mut(max.max(1)) {
                enc.write_nops(nop).map_err(RingError::Encode)?;
            }
        }
        let ring = words.get_mut(..self.size / 4).ok_or(RingError::BadSize { size: self.size })?;
        let mut pos = start / 4;
        for c in cmds {
            pos = pos.saturating_add(enc.encode(c, ring, pos, self.gpu_va).map_err(RingError::Encode)?);
        }
        let end = pos.saturating_mul(4);
        let wptr = end & self.size.wrapping_sub(1);
        let w = Written { start: self.wptr, wptr, wrapped: pad > 0, bytes: needed };
        self.wptr = wptr;
        Ok(w)
    }
}
