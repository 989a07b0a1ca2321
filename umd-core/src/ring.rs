//! The static ring of direct mode (`docs/refgpu.md` section 4.1).
//!
//! A power-of-two ring of dwords in GPU-visible memory. The core writes
//! packets at the write pointer and publishes it; the engine consumes up to
//! it and reports its read pointer. Free space is computed from the last
//! read pointer seen: the ring holds at most `size - 4` bytes so that
//! `rptr == wptr` always means empty. The engine only moves its read
//! pointer forward (until a reset puts both back to 0), so the space
//! before a read pointer read earlier is still free: the ring keeps the
//! last one it was given ([`Ring::rptr_seen`]) and its owner reads the
//! register again only when that space is not enough, as amdgpu's ring
//! allocation does. A packet never crosses the end: the
//! tail is padded with NOPs (several when the tail is longer than one NOP
//! can be in this generation) and the packet starts again at offset 0.

use core::fmt;

use crate::cmd::{Command, EncodeError, Encoder};
use crate::hw::IbRef;
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

/// Dwords [`Ring::write`] encodes in its stage before copying them in:
/// a submission's ring packets (up to four WAIT_MEMs, the IB and the
/// fence: 41 dwords on gen2; these packets need no execution-alignment
/// padding) fit; a list that does not fit takes the two passes. The
/// buffer is the ring's own (not cleared per write: only the dwords a
/// write encodes are copied out of it).
#[cfg(not(feature = "size-first"))]
const STAGE_DWORDS: usize = 48;

/// Encodes ring packet `c` at `out[pos..]` (`out[0]` at GPU address
/// `base`): a submission's own two packets, INDIRECT_BUFFER and FENCE,
/// through their per-kind entry points (no call and no dispatch on the
/// command, and with `size-first` not the general walk), the rest
/// through `Encoder::encode`. Same dwords and errors as `encode`.
#[inline(always)]
fn encode_packet(
    enc: &Encoder,
    c: &Command<'_>,
    out: &mut [u32],
    pos: usize,
    base: u64,
) -> Result<usize, EncodeError> {
    match *c {
        Command::IndirectBuffer { addr, size_dw } => {
            enc.encode_indirect_buffer(addr, size_dw, out, pos, base)
        }
        Command::Fence { addr, value, irq } => enc.encode_fence(addr, value, irq, out, pos, base),
        _ => enc.encode(c, out, pos, base),
    }
}

/// A ring in GPU-visible memory.
#[derive(Debug)]
pub struct Ring {
    region: DmaRegion,
    gpu_va: u64,
    size: usize,
    wptr: usize,
    /// The engine's read pointer as last given to [`Ring::write`].
    rptr: usize,
    /// Where [`Ring::write`] encodes a submission's packets before
    /// copying them in.
    #[cfg(not(feature = "size-first"))]
    stage: [u32; STAGE_DWORDS],
}

impl Ring {
    /// A ring of `size` bytes over `region`, mapped at `gpu_va`.
    pub fn new(region: DmaRegion, gpu_va: u64, size: usize) -> Result<Ring, (RingError, DmaRegion)> {
        if !size.is_power_of_two() || !(MIN_RING..=MAX_RING).contains(&size) || region.len() < size {
            return Err((RingError::BadSize { size }, region));
        }
        Ok(Ring {
            region,
            gpu_va,
            size,
            wptr: 0,
            rptr: 0,
            #[cfg(not(feature = "size-first"))]
            stage: [0; STAGE_DWORDS],
        })
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

    /// The engine's read pointer as last given to [`Ring::write`] (0 after
    /// [`Ring::reset`]): a lower bound of its progress, so
    /// `free(rptr_seen())` bytes are free now.
    pub fn rptr_seen(&self) -> usize {
        self.rptr
    }

    /// Whether `rptr`, just read from the engine, can be its read pointer:
    /// dword-aligned, inside the ring, and from the one last seen
    /// ([`Ring::rptr_seen`]) up to the write pointer, since the engine
    /// only moves it forward and never past what was published. Anything
    /// else (all ones from a device that fell off the bus, a reset the
    /// driver did not make) must not be trusted with the free space, or
    /// the ring would be written over packets the engine has not read.
    pub fn rptr_plausible(&self, rptr: usize) -> bool {
        let mask = self.size.wrapping_sub(1);
        rptr & 3 == 0
            && rptr <= mask
            && rptr.wrapping_sub(self.rptr) & mask <= self.wptr.wrapping_sub(self.rptr) & mask
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
        self.rptr = 0;
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

    /// Encodes `cmds` into `stage` as they would lie in the ring from
    /// byte offset `at`: the dwords used, `Ok(None)` when `stage` is too
    /// small for them.
    #[cfg(not(feature = "size-first"))]
    fn stage(
        gpu_va: u64,
        enc: &Encoder,
        cmds: &[Command<'_>],
        at: usize,
        stage: &mut [u32],
    ) -> Result<Option<usize>, EncodeError> {
        let base = gpu_va.wrapping_add(at as u64);
        let mut pos = 0;
        for c in cmds {
            // A submission's own two packets through their inlined entry
            // points (no call and no dispatch on the command per packet).
            match encode_packet(enc, c, stage, pos, base) {
                Ok(n) => pos = pos.saturating_add(n),
                Err(EncodeError::BufferFull { .. }) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        Ok(Some(pos))
    }

    /// Writes `cmds` contiguously at the write pointer (wrapping with NOP
    /// padding if they do not fit before the end), given the engine's read
    /// pointer `rptr` (kept as [`Ring::rptr_seen`]). Nothing is written on
    /// error. The caller publishes [`Written::wptr`] afterwards.
    ///
    /// The packets of a submission (its waits, the IB, the fence) are
    /// encoded once into the ring's stage and copied in: one
    /// validating pass, not a placement pass and then an encoding pass.
    /// Lists too long for that buffer take the two passes. With the
    /// `size-first` feature (code size before speed) every list
    /// takes them: the same dwords, without the staged path's code.
    pub fn write(&mut self, enc: &Encoder, cmds: &[Command<'_>], rptr: usize) -> Result<Written, RingError> {
        self.rptr = rptr;
        #[cfg(feature = "size-first")]
        let written = self.write_unstaged(enc, cmds, rptr);
        #[cfg(not(feature = "size-first"))]
        let written = self.write_staged(enc, cmds, rptr);
        written
    }

    /// [`Ring::write`] of a submission's own two packets, the ring
    /// packets of a submission that waits for nothing: INDIRECT_BUFFER
    /// (`ib`), then FENCE (`fence`: address and
    /// value) with its interrupt. The same dwords, write pointer and
    /// errors as [`Ring::write`] of that two-entry list, encoded through
    /// the two per-kind entry points without the list and the dispatch
    /// on its commands.
    pub fn write_ib_fence(
        &mut self,
        enc: &Encoder,
        ib: IbRef,
        fence: (u64, u64),
        rptr: usize,
    ) -> Result<Written, RingError> {
        // Read only where the stage is not taken (never for these two
        // packets, which fit it).
        let cmds = [
            Command::IndirectBuffer { addr: ib.va.get(), size_dw: ib.dwords },
            Command::Fence { addr: fence.0, value: fence.1, irq: true },
        ];
        self.rptr = rptr;
        #[cfg(feature = "size-first")]
        let written = self.write_unstaged(enc, &cmds, rptr);
        #[cfg(not(feature = "size-first"))]
        let written = {
            let gpu_va = self.gpu_va;
            self.write_staged_by(enc, &cmds, rptr, |at, stage| {
                let base = gpu_va.wrapping_add(at as u64);
                let two = enc.encode_indirect_buffer(ib.va.get(), ib.dwords, stage, 0, base).and_then(|n| {
                    let m = enc.encode_fence(fence.0, fence.1, true, stage, n, base)?;
                    Ok(n.saturating_add(m))
                });
                match two {
                    Ok(n) => Ok(Some(n)),
                    Err(EncodeError::BufferFull { .. }) => Ok(None),
                    Err(e) => Err(e),
                }
            })
        };
        written
    }

    /// [`Ring::write`] through the stage (one encoding pass; the
    /// two passes when the list does not fit it).
    #[cfg(not(feature = "size-first"))]
    fn write_staged(
        &mut self,
        enc: &Encoder,
        cmds: &[Command<'_>],
        rptr: usize,
    ) -> Result<Written, RingError> {
        let gpu_va = self.gpu_va;
        self.write_staged_by(enc, cmds, rptr, |at, stage| Self::stage(gpu_va, enc, cmds, at, stage))
    }

    /// [`Ring::write_staged`] with `stage_at(at, stage)` encoding `cmds`
    /// into the stage as they would lie from byte offset `at` (what
    /// [`Ring::stage`] does for any list).
    #[cfg(not(feature = "size-first"))]
    #[inline(always)]
    fn write_staged_by(
        &mut self,
        enc: &Encoder,
        cmds: &[Command<'_>],
        rptr: usize,
        stage_at: impl Fn(usize, &mut [u32]) -> Result<Option<usize>, EncodeError>,
    ) -> Result<Written, RingError> {
        let Some(here) = stage_at(self.wptr, &mut self.stage).map_err(RingError::Encode)? else {
            return self.write_unstaged(enc, cmds, rptr);
        };
        let (start, pad, len) = match self.at_wptr(here.saturating_mul(4)) {
            Some(placed) => placed,
            // Padding depends on the address: encode again for offset 0.
            None => match stage_at(0, &mut self.stage).map_err(RingError::Encode)? {
                Some(from_zero) => self.at_zero(from_zero.saturating_mul(4)),
                None => return self.write_unstaged(enc, cmds, rptr),
            },
        };
        let size = self.size;
        let wptr = self.reserve(enc, start, pad, len, rptr)?;
        let staged = self.stage.get(..len / 4).ok_or(RingError::BadSize { size })?;
        // Same lengths by construction: no length-mismatch panic path.
        let ring = self.region.words_mut();
        let dst = ring.get_mut(start / 4..).and_then(|r| r.get_mut(..staged.len()));
        dst.ok_or(RingError::BadSize { size })?.copy_from_slice(staged);
        Ok(self.advance(pad, len, wptr))
    }

    /// [`Ring::write`] for packet lists longer than its stage:
    /// places them first (validating), then encodes them in the ring.
    fn write_unstaged(
        &mut self,
        enc: &Encoder,
        cmds: &[Command<'_>],
        rptr: usize,
    ) -> Result<Written, RingError> {
        let here = self.span(enc, cmds, self.wptr).map_err(RingError::Encode)?;
        let (start, pad, len) = match self.at_wptr(here) {
            Some(placed) => placed,
            None => self.at_zero(self.span(enc, cmds, 0).map_err(RingError::Encode)?),
        };
        let (gpu_va, size) = (self.gpu_va, self.size);
        let wptr = self.reserve(enc, start, pad, len, rptr)?;
        let ring = self.region.words_mut().get_mut(..size / 4).ok_or(RingError::BadSize { size })?;
        let mut pos = start / 4;
        for c in cmds {
            pos = pos.saturating_add(encode_packet(enc, c, ring, pos, gpu_va).map_err(RingError::Encode)?);
        }
        Ok(self.advance(pad, len, wptr))
    }

    /// (start, pad, len) of a write of `len` bytes at the write pointer,
    /// if it ends before the ring does.
    #[inline(always)]
    fn at_wptr(&self, len: usize) -> Option<(usize, usize, usize)> {
        (self.wptr.saturating_add(len) <= self.size).then_some((self.wptr, 0, len))
    }

    /// (start, pad, len) of a write of `len` bytes (measured at offset 0)
    /// at offset 0, behind the tail from the write pointer as padding.
    #[inline(always)]
    fn at_zero(&self, len: usize) -> (usize, usize, usize) {
        (0, self.size.saturating_sub(self.wptr), len)
    }

    /// Checks that `len` bytes from byte offset `start`, after `pad` bytes
    /// of tail padding, fit the ring now, and writes the padding: the
    /// write pointer after those bytes.
    fn reserve(
        &mut self,
        enc: &Encoder,
        start: usize,
        pad: usize,
        len: usize,
        rptr: usize,
    ) -> Result<usize, RingError> {
        let capacity = self.size.saturating_sub(4);
        let needed = pad.saturating_add(len);
        if len > capacity {
            return Err(RingError::TooLarge { needed: len, capacity });
        }
        let free = self.free(rptr);
        if needed > free {
            return Err(RingError::Full { needed, free });
        }
        let (size, wptr) = (self.size, self.wptr);
        let words = self.region.words_mut();
        if pad > 0 {
            let tail = words.get_mut(wptr / 4..size / 4).ok_or(RingError::BadSize { size })?;
            let max = (enc.desc().limits.max_ndw as usize).saturating_add(1);
            for nop in tail.chunks_mut(max.max(1)) {
                enc.write_nops(nop).map_err(RingError::Encode)?;
            }
        }
        Ok(start.saturating_add(len) & size.wrapping_sub(1))
    }

    /// Moves the write pointer to `wptr` after a write of `len` bytes
    /// behind `pad` bytes of tail padding.
    fn advance(&mut self, pad: usize, len: usize, wptr: usize) -> Written {
        let w = Written { start: self.wptr, wptr, wrapped: pad > 0, bytes: pad.saturating_add(len) };
        self.wptr = wptr;
        w
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::cmd::CompareOp;
    use crate::hw::Generation;
    use core::ptr::NonNull;
    use std::boxed::Box;
    use std::vec;
    use std::vec::Vec;

    const SIZE: usize = 4096;
    const VA: u64 = 0x1_0000;

    fn ring() -> Ring {
        let mem: &'static mut [u32] = Box::leak(vec![0xdead_beef_u32; SIZE / 4].into_boxed_slice());
        let cpu = NonNull::from(mem).cast::<u8>();
        // SAFETY: `mem` is leaked, 4-byte aligned, `SIZE` bytes, and used
        // by this region alone.
        let region = unsafe { DmaRegion::new(cpu, VA, SIZE) };
        Ring::new(region, VA, SIZE).map_err(|(e, _)| e).unwrap()
    }

    fn gens() -> Vec<Generation> {
        vec![
            #[cfg(feature = "gen1")]
            Generation::Gen1,
            #[cfg(feature = "gen2")]
            Generation::Gen2,
        ]
    }

    fn cmds(waits: usize) -> Vec<Command<'static>> {
        let wait = |q: u64| Command::WaitMem {
            addr: 0x2000 + 64 * q,
            reference: q,
            mask: u64::MAX,
            op: CompareOp::SeqGe,
            wide: true,
        };
        (0..waits as u64)
            .map(wait)
            .chain([
                Command::IndirectBuffer { addr: 0x8000, size_dw: 8 },
                Command::Fence { addr: 0x2000, value: 7, irq: true },
            ])
            .collect()
    }

    /// The staged write (one encoding pass) leaves exactly the bytes and
    /// write pointer of the two-pass write, at every offset and across
    /// wraps; a list longer than the stage takes the two passes.
    #[cfg(not(feature = "size-first"))]
    #[test]
    fn staged_write_matches_two_pass_write() {
        for generation in gens() {
            let enc = Encoder::new(generation);
            for waits in [0, 1, 4, 12] {
                let list = cmds(waits);
                let (mut a, mut b) = (ring(), ring());
                for _ in 0..300 {
                    let (ra, rb) = (a.wptr(), b.wptr());
                    let wa = a.write_staged(&enc, &list, ra).unwrap();
                    let wb = b.write_unstaged(&enc, &list, rb).unwrap();
                    assert_eq!(wa, wb, "{generation:?}, {waits} waits");
                    assert_eq!(a.region_words(), b.region_words(), "{generation:?}, {waits} waits");
                }
            }
        }
    }

    /// The two packets of a submission without waits, written without
    /// the list, leave the bytes, write pointer and errors of the list's
    /// write: at every offset, across wraps, and for operands the encoder
    /// refuses (an empty or too large IB, a misaligned fence, addresses
    /// out of range), which write nothing.
    #[test]
    fn ib_and_fence_without_the_list_match_the_list() {
        for generation in gens() {
            let enc = Encoder::new(generation);
            let max = enc.desc().limits.max_ib_dwords;
            let (mut a, mut b) = (ring(), ring());
            for i in 0..300u64 {
                let (ib, fence) =
                    ((0x8000 + 0x100 * (i % 7), 8 + (i % 5) as u32), (0x2000 + 64 * (i % 3), i));
                let list = [
                    Command::IndirectBuffer { addr: ib.0, size_dw: ib.1 },
                    Command::Fence { addr: fence.0, value: fence.1, irq: true },
                ];
                let (ra, rb) = (a.wptr(), b.wptr());
                let wa = a.write_ib_fence(&enc, IbRef::new(ib.0, ib.1), fence, ra);
                let wb = b.write(&enc, &list, rb);
                assert_eq!(wa, wb, "{generation:?}, write {i}");
                assert_eq!(a.region_words(), b.region_words(), "{generation:?}, write {i}");
                assert_eq!((a.wptr(), a.rptr_seen()), (b.wptr(), b.rptr_seen()));
            }
            let mut refused = 0;
            for (ib, fence) in [
                ((0x8004, 8), (0x2000, 1)),
                ((0x8000, 0), (0x2000, 1)),
                ((0x8000, max.saturating_add(1)), (0x2000, 1)),
                ((0x8000, 8), (0x2008, 1)),
                ((1 << 60, 8), (0x2000, 1)),
                ((0x8000, 8), (1 << 60, 1)),
            ] {
                let list = [
                    Command::IndirectBuffer { addr: ib.0, size_dw: ib.1 },
                    Command::Fence { addr: fence.0, value: fence.1, irq: true },
                ];
                let before: Vec<u32> = a.region_words().to_vec();
                let (wptr, rptr) = (a.wptr(), a.wptr());
                let wa = a.write_ib_fence(&enc, IbRef::new(ib.0, ib.1), fence, rptr);
                let wb = b.write(&enc, &list, rptr);
                assert_eq!(wa, wb, "{generation:?}: {ib:x?} {fence:x?}");
                assert_eq!(a.region_words(), b.region_words(), "{generation:?}: {ib:x?} {fence:x?}");
                if wa.is_err() {
                    refused += 1;
                    assert!(matches!(wa, Err(RingError::Encode(_))), "{generation:?}: {wa:?}");
                    assert_eq!((a.region_words(), a.wptr()), (&before[..], wptr));
                }
            }
            assert!(refused >= 3, "{generation:?}: {refused} refused");
            // Full: the engine has consumed nothing.
            let rptr = a.wptr();
            while a.write_ib_fence(&enc, IbRef::new(0x8000, 8), (0x2000, 1), rptr).is_ok() {}
            let full: Vec<u32> = a.region_words().to_vec();
            let wptr = a.wptr();
            assert!(matches!(
                a.write_ib_fence(&enc, IbRef::new(0x8000, 8), (0x2000, 1), rptr),
                Err(RingError::Full { .. })
            ));
            assert_eq!((a.region_words(), a.wptr()), (&full[..], wptr));
        }
    }

    /// Only a read pointer the engine can have reported is plausible:
    /// aligned, inside the ring, from the last one seen up to the write
    /// pointer, also when that span wraps.
    #[test]
    fn only_a_read_pointer_between_the_last_seen_and_the_write_pointer_is_plausible() {
        for generation in gens() {
            let enc = Encoder::new(generation);
            let list = cmds(0);
            let mut r = ring();
            // The engine keeps up: each write is given the write pointer as
            // the read pointer, up to the write that wraps.
            while !r.write(&enc, &list, r.wptr()).unwrap().wrapped {}
            let (seen, wptr) = (r.rptr_seen(), r.wptr());
            assert!(wptr < seen, "the span from the last seen to the write pointer wraps");
            for ok in [seen, SIZE - 4, 0, (wptr / 2) & !3, wptr] {
                assert!(r.rptr_plausible(ok), "{generation:?}: {ok:#x} (seen {seen:#x}, wptr {wptr:#x})");
            }
            for bad in [wptr + 4, seen - 4, seen + 1, SIZE, u32::MAX as usize, usize::MAX] {
                assert!(!r.rptr_plausible(bad), "{generation:?}: {bad:#x} (seen {seen:#x}, wptr {wptr:#x})");
            }
            r.reset();
            assert!(r.rptr_plausible(0) && !r.rptr_plausible(4), "{generation:?}: after a reset only 0");
        }
    }

    /// A submission's ring packets (the most waits it can carry, the IB
    /// and the fence) fit the ring's stage at every offset, so they take
    /// the one staged pass.
    #[cfg(not(feature = "size-first"))]
    #[test]
    fn a_submission_fits_the_stage() {
        for generation in gens() {
            let enc = Encoder::new(generation);
            let list = cmds(crate::sync::deps::MAX_WAITS);
            let r = ring();
            for at in (0..SIZE).step_by(4) {
                let staged = Ring::stage(r.gpu_va(), &enc, &list, at, &mut [0u32; STAGE_DWORDS]).unwrap();
                assert!(staged.is_some(), "{generation:?} at {at}");
            }
        }
    }

    /// Errors leave the ring as it was.
    #[cfg(feature = "gen2")]
    #[test]
    fn failed_write_touches_nothing() {
        let enc = Encoder::new(Generation::Gen2);
        let mut r = ring();
        let list = cmds(1);
        r.write(&enc, &list, 0).unwrap();
        // A bad packet after good ones (a misaligned fence).
        let before: Vec<u32> = r.region_words().to_vec();
        let (wptr, bad) = (r.wptr(), [list[0], Command::Fence { addr: 0x2008, value: 1, irq: false }]);
        assert!(matches!(r.write(&enc, &bad, wptr), Err(RingError::Encode(_))));
        assert_eq!((r.region_words(), r.wptr()), (&before[..], wptr));
        // Full: the engine has consumed nothing.
        while r.write(&enc, &list, 0).is_ok() {}
        let full: Vec<u32> = r.region_words().to_vec();
        let wptr = r.wptr();
        assert!(matches!(r.write(&enc, &list, 0), Err(RingError::Full { .. })));
        assert_eq!((r.region_words(), r.wptr()), (&full[..], wptr));
    }
}
