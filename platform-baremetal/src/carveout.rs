//! The static carve-out of RAM that holds GPU-visible memory: runs of 4 KiB
//! pages from `umd_core::mem::pages::PageAlloc` (good fit, a cost that does
//! not grow with the blocks live) over node storage inside this value (no
//! heap), translated to CPU and device addresses.
//!
//! On `virt` the carve-out is a physical range of guest RAM that the MMU
//! maps identity, as normal cacheable memory, so the CPU address and the
//! device (physical) address of a page are the same number. The type keeps
//! them apart anyway (`cpu_base`, `dev_base`) so a board with an offset
//! between the two only changes the constructor.

use core::ptr::NonNull;

use umd_core::mem::pages::{PageAlloc, PagesError};
use umd_core::mem::va::VaNode;
use umd_core::platform::{DmaRegion, PlatformError};

/// Page size of the carve-out.
pub const PAGE: usize = umd_core::mem::pages::PAGE;

/// Most pages one carve-out manages (64 MiB).
pub const MAX_PAGES: usize = 16384;

/// Nodes of the page allocator by default (a [`CarveOut`]'s `N`): one per
/// block handed out or hole between blocks, so at least 511 blocks live
/// whatever the holes (1,023 without holes). A device's blocks are its fixed pools (page tables, fence
/// slots, rings, the IB pool), one per slab of the size-class pools and
/// one per buffer of its own: the default `DeviceStorage` (1,024 buffer
/// handles, 256 slabs) keeps a few hundred at most in practice. 40 KiB of
/// nodes (40 B each), against 2 KiB for a bitmap of the 16,384 pages: a
/// `CarveOut` is 46,216 B on Cortex-M4 and 46,224 B on aarch64 with the
/// allocator itself, in the transport's `static` on bare metal; and
/// one node per 16 pages keeps the allocator's address index a list
/// (O(1) frees, `docs/memory.md`). A request beyond it is refused as
/// [`PagesError::NodeTableFull`] (the platform's `dma_alloc`: out of
/// memory). A firmware with few blocks picks a smaller `N`: the MCU
/// configuration's [`MCU_NODES`] (`docs/memory.md`, "Choosing the
/// capacities").
pub const NODES: usize = 1024;

/// The node count of the MCU configuration's carve-out ([`McuCarveOut`]):
/// a device of `umd_core::storage::McuStorage` (MMU bypassed, the default
/// `Config`) takes 5 blocks at bring-up and one per large buffer, 69 with
/// its 64 buffers all large (slabs are fewer: 64 buffers of the largest
/// slab bin fill 16), so 139 nodes keep them whatever the holes between
/// them. 40 B each.
pub const MCU_NODES: usize = 2 * (5 + 64) + 1;

/// The MCU configuration's carve-out (`docs/memory.md`, "Choosing the
/// capacities").
pub type McuCarveOut = CarveOut<MCU_NODES>;

/// A page allocator over `[cpu_base, cpu_base + pages * PAGE)`, with `N`
/// nodes (40 B each, in this value) for its blocks and holes.
#[derive(Debug)]
pub struct CarveOut<const N: usize = NODES> {
    cpu_base: usize,
    dev_base: u64,
    pages: PageAlloc<[VaNode; N]>,
}

impl CarveOut {
    /// A carve-out of `len` bytes (rounded down to whole pages, at most
    /// [`MAX_PAGES`]) at CPU address `cpu_base` and device address
    /// `dev_base`, with the default [`NODES`]; both must be page aligned
    /// and `len` at least one page (else `None`).
    pub fn new(cpu_base: usize, dev_base: u64, len: usize) -> Option<CarveOut> {
        CarveOut::with_nodes(cpu_base, dev_base, len)
    }
}

impl<const N: usize> CarveOut<N> {
    /// As [`CarveOut::new`], with `N` nodes (`McuCarveOut::with_nodes`).
    pub fn with_nodes(cpu_base: usize, dev_base: u64, len: usize) -> Option<CarveOut<N>> {
        if cpu_base % PAGE != 0 || dev_base % PAGE as u64 != 0 {
            return None;
        }
        let pages = PageAlloc::new([VaNode::ZEROED; N], (len / PAGE).min(MAX_PAGES)).ok()?;
        Some(CarveOut { cpu_base, dev_base, pages })
    }

    /// The CPU address of the first page.
    pub fn cpu_base(&self) -> usize {
        self.cpu_base
    }

    /// The device address of the first page.
    pub fn dev_base(&self) -> u64 {
        self.dev_base
    }

    /// Pages managed.
    pub fn pages(&self) -> usize {
        self.pages.pages()
    }

    /// Pages handed out.
    pub fn used_pages(&self) -> usize {
        self.pages.used_pages()
    }

    /// Takes `len` bytes (rounded up to pages; 0 counts as one page):
    /// returns the CPU address and the device address of the first byte.
    pub fn alloc(&mut self, len: usize) -> Result<(usize, u64), PagesError> {
        let first = self.pages.alloc(len.max(1).div_ceil(PAGE))?;
        Ok((self.cpu_base + first * PAGE, self.dev_base + (first * PAGE) as u64))
    }

    /// Gives back `len` bytes at CPU address `cpu` (from [`CarveOut::alloc`]).
    /// Refused, changing nothing, when the range is not a block handed out
    /// by this carve-out (double free, foreign pointer, part of a block).
    pub fn free(&mut self, cpu: usize, len: usize) -> Result<(), PagesError> {
        let n = len.max(1).div_ceil(PAGE);
        let off = cpu.checked_sub(self.cpu_base).filter(|off| off % PAGE == 0);
        let Some(off) = off else {
            return Err(PagesError::NotAllocated { first: usize::MAX, pages: n });
        };
        self.pages.free(off / PAGE, n)
    }
}

/// A carve-out behind its lock as a platform's DMA memory (the ivshmem and
/// the shared-RAM platforms): regions of whole pages, zeroed and cleaned to
/// memory before they are handed out.
#[derive(Debug)]
pub(crate) struct DmaPages<const N: usize>(spin::Mutex<CarveOut<N>>);

impl<const N: usize> DmaPages<N> {
    /// The DMA memory of `carve`.
    ///
    /// # Safety
    /// The carve-out's pages must be memory used by nothing else, which the
    /// device reaches at the carve-out's device addresses, for the value's
    /// life.
    pub(crate) unsafe fn new(carve: CarveOut<N>) -> DmaPages<N> {
        DmaPages(spin::Mutex::new(carve))
    }

    /// The CPU and device addresses of the carve-out's first page.
    pub(crate) fn bases(&self) -> (usize, u64) {
        let c = self.0.lock();
        (c.cpu_base(), c.dev_base())
    }

    /// A region of at least `len` bytes (whole pages), zeroed, then cleaned
    /// to memory with `clean(cpu address, bytes)`.
    pub(crate) fn alloc(
        &self,
        len: usize,
        clean: impl FnOnce(usize, usize),
    ) -> Result<DmaRegion, PlatformError> {
        let (cpu, dev) = self.0.lock().alloc(len).map_err(|_| PlatformError::OutOfMemory { len })?;
        let len = len.max(1).next_multiple_of(PAGE);
        let Some(p) = NonNull::new(cpu as *mut u8) else {
            // A carve-out at CPU address 0: unusable, give the run back.
            let _ = self.0.lock().free(cpu, len);
            return Err(PlatformError::OutOfMemory { len });
        };
        // SAFETY: the carve-out handed us `len` bytes at `cpu`, used by
        // nothing else (contract of `new`).
        unsafe { core::ptr::write_bytes(p.as_ptr(), 0, len) };
        clean(cpu, len);
        // SAFETY: `len` bytes at `p`, page aligned (`CarveOut::new` takes a
        // page-aligned base and hands out whole pages), ours until
        // `DmaPages::free` below, reached by the device at `dev` (contract
        // of `new`).
        Ok(unsafe { DmaRegion::new(p, dev, len) })
    }

    /// Gives `region`'s pages back; a region this carve-out did not hand
    /// out frees nothing.
    pub(crate) fn free(&self, region: DmaRegion) {
        if let Some(p) = region.cpu_ptr() {
            let _ = self.0.lock().free(p.as_ptr() as usize, region.len());
        }
    }

    /// Pages handed out.
    pub(crate) fn used_pages(&self) -> usize {
        self.0.lock().used_pages()
    }
}

/// The CPU range a cache operation on `len` bytes at `offset` of `region`
/// covers, clamped to the region (`None`: no CPU mapping).
pub(crate) fn cache_span(region: &DmaRegion, offset: usize, len: usize) -> Option<(usize, usize)> {
    let len = len.min(region.len().saturating_sub(offset));
    region.cpu_ptr().map(|p| ((p.as_ptr() as usize).saturating_add(offset), len))
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use std::string::ToString;

    #[test]
    fn alloc_free_good_fit() {
        let mut c = CarveOut::new(0x4100_0000, 0x4100_0000, 16 * PAGE).unwrap();
        let a = c.alloc(PAGE).unwrap();
        let b = c.alloc(3 * PAGE).unwrap();
        assert_eq!(a, (0x4100_0000, 0x4100_0000));
        assert_eq!(b.0, 0x4100_1000);
        assert_eq!(c.used_pages(), 4);
        assert_eq!(c.free(a.0, PAGE), Ok(()));
        assert!(c.free(a.0, PAGE).is_err(), "double free is refused");
        assert_eq!(c.alloc(2 * PAGE).unwrap().0, 0x4100_4000, "the 1-page hole is too small");
        assert_eq!(c.alloc(100).unwrap().0, 0x4100_0000, "the hole is reused");
        assert!(matches!(c.alloc(16 * PAGE), Err(PagesError::Exhausted { .. })));
        assert!(c.free(0x1000, PAGE).is_err(), "foreign pointer");
        assert!(c.free(0x4100_0800, PAGE).is_err(), "not page aligned");
        assert_eq!(c.used_pages(), 6);
    }

    /// [`NODES`] ranges: 1,023 one-page blocks and the hole after them.
    /// Another block would split the hole: refused, nothing changed; a
    /// freed page is taken again without a node.
    #[test]
    fn a_full_node_table_is_refused() {
        let base = 0x4100_0000;
        let mut c = CarveOut::new(base, base as u64, MAX_PAGES * PAGE).unwrap();
        for i in 0..NODES - 1 {
            assert_eq!(c.alloc(PAGE).unwrap().0, base + i * PAGE);
        }
        let err = c.alloc(PAGE).unwrap_err();
        assert_eq!(err, PagesError::NodeTableFull { nodes: NODES });
        assert!(err.to_string().contains("CarveOut's NODES"), "{err}: names the parameter to raise");
        assert_eq!(c.used_pages(), NODES - 1);
        assert_eq!(c.free(base + 5 * PAGE, PAGE), Ok(()));
        assert_eq!(c.alloc(PAGE), Ok((base + 5 * PAGE, (base + 5 * PAGE) as u64)));
    }

    /// The node count is the carve-out's `N`: the MCU configuration's
    /// [`MCU_NODES`] hold `MCU_NODES - 1` one-page blocks.
    #[test]
    fn the_node_count_is_a_parameter() {
        let base = 0x4100_0000;
        let mut c = McuCarveOut::with_nodes(base, base as u64, MAX_PAGES * PAGE).unwrap();
        for _ in 0..MCU_NODES - 1 {
            c.alloc(PAGE).unwrap();
        }
        assert_eq!(c.alloc(PAGE), Err(PagesError::NodeTableFull { nodes: MCU_NODES }));
        assert_eq!(c.used_pages(), MCU_NODES - 1, "nothing changed on error");
    }

    #[test]
    fn device_offset_and_bad_bases() {
        let mut c = CarveOut::new(0x1000, 0x8000_0000, 2 * PAGE).unwrap();
        assert_eq!(c.alloc(1), Ok((0x1000, 0x8000_0000)));
        assert!(CarveOut::new(0x1001, 0, PAGE).is_none());
        assert_eq!(CarveOut::new(0, 0, usize::MAX).unwrap().pages(), MAX_PAGES);
        assert!(CarveOut::new(0x1000, 0x1000, PAGE - 1).is_none(), "no whole page");
    }
}
