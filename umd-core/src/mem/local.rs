//! The device's local memory: where a buffer's memory is ([`Residency`])
//! and the page allocator over local memory (`LocalMem`).
//!
//! Local memory is the driver's to manage, not the platform's
//! (`docs/memory.md`, "Local memory and eviction"): a
//! [`pages::PageAlloc`](super::pages::PageAlloc) over node storage from `DeviceStorage` hands out runs of
//! 4 KiB pages of it, in a time that does not grow with the number of
//! local buffers. The device core wraps a
//! run in a [`crate::platform::DmaRegion`] that says it is local (its
//! residency), so it goes back here and never to the platform's
//! `dma_free`.
//!
//! Without the `local-memory` feature (or without `mmu`: local memory is
//! only used with the GPU MMU) nothing is managed: every check
//! folds to a constant and every request falls back to system memory.

#[cfg(all(feature = "local-memory", feature = "mmu"))]
use super::pages::PageAlloc;
use super::va::VaNode;

/// Where a buffer's (or a region's) memory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residency {
    /// In local memory.
    Local,
    /// In system memory.
    System,
}

/// Bytes of a local-memory page.
pub(crate) const PAGE: u64 = 4096;

/// Whether local memory is used at all (the `local-memory` feature; with
/// the `mmu` feature, as only the MMU moves buffers between local and
/// system memory under one address). The checks on it fold to constants
/// without it, and with them every move and the page allocator.
pub(crate) const ON: bool = cfg!(all(feature = "local-memory", feature = "mmu"));

/// Pages of local memory from [`LocalMem::alloc`]: `len` bytes at the
/// device address `addr`, until [`LocalMem::free`] gives them back.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct LocalPages {
    /// The device address of the first byte.
    pub(crate) addr: u64,
    /// Length in bytes (whole pages).
    pub(crate) len: usize,
}

/// The allocator of activated local memory: a [`pages::PageAlloc`](super::pages::PageAlloc) when local
/// memory is built in ([`ON`]).
#[cfg(all(feature = "local-memory", feature = "mmu"))]
type Pages<'d> = PageAlloc<&'d mut [VaNode]>;
/// Without local memory built in, a type with no value: a device holds no
/// page allocator (about 5 KiB) it could never use.
#[cfg(not(all(feature = "local-memory", feature = "mmu")))]
type Pages<'d> = Unbuilt<'d>;

/// No value exists (an `Infallible` field): local memory is not built in.
/// The borrow is the one a `PageAlloc` would hold.
#[cfg(not(all(feature = "local-memory", feature = "mmu")))]
pub(crate) struct Unbuilt<'d>(core::convert::Infallible, core::marker::PhantomData<&'d mut [VaNode]>);

#[cfg(not(all(feature = "local-memory", feature = "mmu")))]
impl Unbuilt<'_> {
    fn never(&self) -> ! {
        match self.0 {}
    }
    fn pages(&self) -> usize {
        self.never()
    }
    fn used_pages(&self) -> usize {
        self.never()
    }
    fn alloc(&mut self, _: usize) -> Result<usize, super::pages::PagesError> {
        self.never()
    }
    fn free(&mut self, _: usize, _: usize) -> Result<(), super::pages::PagesError> {
        self.never()
    }
}

/// The local-memory page allocator (over caller node storage).
pub(crate) struct LocalMem<'d> {
    /// The node storage, until local memory is activated.
    unset: Option<&'d mut [VaNode]>,
    /// Local memory `[base, base + pages * 4 KiB)` and its allocator, once
    /// activated.
    active: Option<(u64, Pages<'d>)>,
}

impl<'d> LocalMem<'d> {
    /// No local memory, with `nodes` of page-allocator storage for later.
    pub(crate) fn new(nodes: &'d mut [VaNode]) -> Self {
        LocalMem { unset: Some(nodes), active: None }
    }

    /// Uses `[base, base + size)` (whole pages, at most
    /// [`super::pages::MAX_WINDOW_PAGES`] of them). Returns the bytes
    /// managed: 0 without node storage, once active already, or without
    /// the `local-memory` feature.
    pub(crate) fn activate(&mut self, base: u64, size: u64) -> u64 {
        if !ON {
            return 0;
        }
        let most = super::pages::MAX_WINDOW_PAGES.min(usize::MAX as u64);
        let pages = usize::try_from((size / PAGE).min(most)).unwrap_or(0);
        if pages == 0 || self.unset.as_ref().is_none_or(|n| n.is_empty()) {
            return 0;
        }
        let Some(nodes) = self.unset.take() else { return 0 };
        #[cfg(all(feature = "local-memory", feature = "mmu"))]
        match PageAlloc::new(nodes, pages) {
            Ok(p) => {
                self.active = Some((base, p));
                (pages as u64).saturating_mul(PAGE)
            }
            Err(_) => 0,
        }
        #[cfg(not(all(feature = "local-memory", feature = "mmu")))]
        {
            // Not reached (`ON` is false): nothing to manage.
            let _ = (nodes, base);
            0
        }
    }

    /// Whether there is local memory.
    pub(crate) fn is_active(&self) -> bool {
        ON && self.active.is_some()
    }

    /// Bytes managed and bytes in use.
    pub(crate) fn usage(&self) -> (u64, u64) {
        if !ON {
            return (0, 0);
        }
        match &self.active {
            Some((_, pages)) => (
                (pages.pages() as u64).saturating_mul(PAGE),
                (pages.used_pages() as u64).saturating_mul(PAGE),
            ),
            None => (0, 0),
        }
    }

    /// `bytes` (rounded to pages) of local memory, if there is room.
    pub(crate) fn alloc(&mut self, bytes: u64) -> Option<LocalPages> {
        if !ON {
            return None;
        }
        let (base, pages) = self.active.as_mut()?;
        let n = usize::try_from(bytes.div_ceil(PAGE)).ok()?;
        let first = pages.alloc(n).ok()?;
        let addr = base.checked_add((first as u64).checked_mul(PAGE)?)?;
        let len = n.checked_mul(PAGE as usize)?;
        Some(LocalPages { addr, len })
    }

    /// Gives pages from [`LocalMem::alloc`] back.
    pub(crate) fn free(&mut self, p: LocalPages) {
        if !ON {
            return;
        }
        let Some((base, pages)) = self.active.as_mut() else { return };
        let Some(first) = p.addr.checked_sub(*base).and_then(|off| usize::try_from(off / PAGE).ok()) else {
            return;
        };
        let _ = pages.free(first, p.len.div_ceil(PAGE as usize));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With the `local-memory` feature the page allocator takes the
    /// device's local memory and hands out pages of it; without, it takes
    /// none and every request falls back to system memory.
    #[test]
    fn local_memory_is_used_only_when_built_in() {
        let mut nodes = [VaNode::ZEROED; 4];
        let mut local = LocalMem::new(&mut nodes);
        let managed = local.activate(0x4000_0000, 64 * PAGE);
        let r = local.alloc(2 * PAGE);
        if ON {
            assert_eq!(managed, 64 * PAGE);
            assert!(local.is_active());
            let r = r.expect("two local pages");
            assert_eq!(r, LocalPages { addr: 0x4000_0000, len: 2 * PAGE as usize });
            assert_eq!(local.usage(), (64 * PAGE, 2 * PAGE));
            local.free(r);
            assert_eq!(local.usage(), (64 * PAGE, 0));
        } else {
            assert_eq!(managed, 0);
            assert!(!local.is_active());
            assert!(r.is_none());
            assert_eq!(local.usage(), (0, 0));
        }
    }
}
